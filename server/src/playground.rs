//! `aplc serve --playground DIR`: the playground's static files (spec/js.md,
//! "The playground"), read from the built directory (`playground/dist`, built by
//! `node playground/build.mjs`) at each request, so a rebuilt page needs no restart and
//! the binary carries no copy of it.
//!
//! Only the page's own files are served: a name of letters, digits, `.`, `-` and `_`
//! directly in the directory, never a dotfile or a path; no bearer token (the page is
//! static, and calls nothing of the service).

use std::path::{Path, PathBuf};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

/// The largest file served: the page's script inlines the WebAssembly module (a few MB).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// The playground's routes: `/playground` (redirected to `/playground/`, so the page's
/// relative links resolve), `/playground/` (its `index.html`) and `/playground/{file}`.
pub(crate) fn routes<S>(dir: PathBuf) -> Router<S> {
    Router::new()
        .route(
            "/playground",
            get(|| async { Redirect::permanent("/playground/") }),
        )
        .route("/playground/", get(index))
        .route("/playground/{file}", get(file))
        .with_state(dir)
}

async fn index(State(dir): State<PathBuf>) -> Response {
    serve(&dir, "index.html").await
}

async fn file(State(dir): State<PathBuf>, UrlPath(name): UrlPath<String>) -> Response {
    serve(&dir, &name).await
}

/// True for the names the page's files have: no path, no dotfile.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

fn content_type(name: &str) -> &'static str {
    match Path::new(name).extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("png") => "image/png",
        Some("svg") => "image/svg+xml",
        _ => "text/plain; charset=utf-8",
    }
}

async fn serve(dir: &Path, name: &str) -> Response {
    if !plain_name(name) {
        return (StatusCode::NOT_FOUND, "no such file").into_response();
    }
    let path = dir.join(name);
    let fits = tokio::fs::metadata(&path)
        .await
        .is_ok_and(|m| m.is_file() && m.len() <= MAX_FILE_BYTES);
    if !fits {
        return (StatusCode::NOT_FOUND, "no such file").into_response();
    }
    match tokio::fs::read(&path).await {
        Ok(bytes) => (
            [
                (header::CONTENT_TYPE, content_type(name)),
                (header::CACHE_CONTROL, "no-cache"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            bytes,
        )
            .into_response(),
        Err(_) => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pages_own_names_are_served() {
        for ok in ["index.html", "playground.js", "style.css", "a-b_c.txt"] {
            assert!(plain_name(ok), "{ok}");
        }
        for bad in ["", ".env", "..", "../x", "a/b", "a\\b", "%2e%2e", "x y"] {
            assert!(!plain_name(bad), "{bad}");
        }
        assert_eq!(
            content_type("playground.js"),
            "text/javascript; charset=utf-8"
        );
    }
}
