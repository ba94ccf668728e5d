//! Stand-ins for the backends this build left out (cargo features `sqlite`,
//! `postgres`): opening their URLs is a clear error, not a compile error for callers of
//! [`super::open`].

use super::StoreError;

/// The error of opening a store whose backend `feature` is compiled out.
fn compiled_out(feature: &str) -> StoreError {
    StoreError::Open(format!(
        "this aplc was built without the `{feature}` feature"
    ))
}

/// Without the `sqlite` feature.
#[cfg(not(feature = "sqlite"))]
pub(super) mod sqlite {
    use std::path::Path;
    use std::sync::Arc;

    use super::super::{RunStore, StoreError};

    /// Refuses: no SQLite in this build.
    pub(in super::super) async fn open(_path: &Path) -> Result<Arc<dyn RunStore>, StoreError> {
        Err(super::compiled_out("sqlite"))
    }

    /// Refuses: no SQLite in this build.
    pub(in super::super) async fn open_read_only(
        _path: &Path,
    ) -> Result<Arc<dyn RunStore>, StoreError> {
        Err(super::compiled_out("sqlite"))
    }
}

/// Without the `postgres` feature.
#[cfg(not(feature = "postgres"))]
pub(super) mod postgres {
    use std::sync::Arc;

    use super::super::{RunStore, StoreError};

    /// Refuses: no PostgreSQL in this build.
    pub(in super::super) async fn open(_url: &str) -> Result<Arc<dyn RunStore>, StoreError> {
        Err(super::compiled_out("postgres"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{StoreUrl, open, open_read_only};

    /// Opens `url` every way a caller can, and returns the errors' texts.
    fn refusals(url: &str) -> Vec<String> {
        let url = StoreUrl::parse(url).expect("the URL parses in every build");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        [
            runtime.block_on(open(&url)).map(drop),
            runtime.block_on(open_read_only(&url)).map(drop),
        ]
        .into_iter()
        .map(|opened| opened.expect_err("the backend is compiled out").to_string())
        .collect()
    }

    #[cfg(not(feature = "sqlite"))]
    #[test]
    fn a_sqlite_url_names_the_missing_feature() {
        for text in refusals("sqlite:runs.db") {
            assert_eq!(
                text,
                "cannot open the store: this aplc was built without the `sqlite` feature"
            );
        }
    }

    #[cfg(not(feature = "postgres"))]
    #[test]
    fn a_postgres_url_names_the_missing_feature_and_hides_its_password() {
        for text in refusals("postgres://me:hunter2@127.0.0.1:1/db") {
            assert_eq!(
                text,
                "cannot open the store: this aplc was built without the `postgres` feature"
            );
        }
    }
}
