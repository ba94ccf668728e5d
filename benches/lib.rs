//! Shared helpers for the criterion benchmarks in `benches/benches/`.

use std::path::PathBuf;

/// The workspace's `fixtures/` directory.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}
