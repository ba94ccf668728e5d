//! Bearer tokens: where they come from, and the check every route but `/healthz` passes.
//!
//! Tokens are compared in constant time (`subtle`), against every configured token
//! whatever the first comparisons gave, so the time taken says nothing about how much of
//! a token matched or which one. They are never logged: `Tokens`' `Debug` shows a count.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// The tokens a server accepts.
#[derive(Clone, Default)]
pub struct Tokens(Vec<Vec<u8>>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.0.len())
    }
}

impl Tokens {
    /// Adds tokens.
    pub fn extend(&mut self, tokens: impl IntoIterator<Item = String>) {
        self.0.extend(tokens.into_iter().map(String::into_bytes));
    }

    /// No token is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The tokens, for the server's secrets: tools never see them and no output shows
    /// them.
    pub(crate) fn values(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|t| std::str::from_utf8(t).ok())
    }

    /// True if `presented` is one of the tokens, compared in constant time.
    fn accepts(&self, presented: &[u8]) -> bool {
        let mut found = subtle::Choice::from(0);
        for token in &self.0 {
            found |= token.as_slice().ct_eq(presented);
        }
        found.into()
    }
}

/// A token that could not be sent in a header as written. The token itself is not in
/// the error: it is a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token {position} has whitespace or control characters inside")]
pub struct TokenError {
    /// The token's position in the file or list, from 1.
    pub position: usize,
}

/// Tokens from a tokens file (one per line; blank lines and `#` comments ignored) or
/// from `APLC_SERVE_TOKENS` (comma-separated). A token with whitespace or control
/// characters inside is refused: it could not be sent in a header as written.
pub fn parse_tokens(text: &str, separator: char) -> Result<Vec<String>, TokenError> {
    let mut tokens = Vec::new();
    for (index, item) in text.split(separator).enumerate() {
        let item = item.trim();
        if item.is_empty() || (separator == '\n' && item.starts_with('#')) {
            continue;
        }
        if item.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TokenError {
                position: index + 1,
            });
        }
        tokens.push(item.to_string());
    }
    Ok(tokens)
}

/// The middleware: a request without an accepted `Authorization: Bearer TOKEN` gets 401.
pub(crate) async fn require_token(
    State(tokens): State<Arc<Tokens>>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| bearer_credentials(value.as_bytes()));
    match presented {
        Some(token) if !token.is_empty() && tokens.accepts(token) => next.run(request).await,
        Some(_) => ApiError::unauthorized("the bearer token is not accepted").into_response(),
        None => ApiError::unauthorized("missing `Authorization: Bearer TOKEN`").into_response(),
    }
}

/// The credentials of an `Authorization` value whose scheme is `Bearer`. The scheme is
/// case-insensitive (RFC 7235 §2.1: `bearer`, `BEARER` and `Bearer` are one scheme) and
/// may be followed by more than one space.
fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, credentials) = value.split_at(space);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| credentials.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_variables() {
        let file = "# ops\n\n  alpha  \nbeta\n";
        assert_eq!(parse_tokens(file, '\n').unwrap(), ["alpha", "beta"]);
        assert_eq!(parse_tokens("a, b,,", ',').unwrap(), ["a", "b"]);
        let err = parse_tokens("good\nbad token\n", '\n').unwrap_err();
        assert_eq!(err, TokenError { position: 2 });
        assert!(!err.to_string().contains("bad token"), "{err}");
    }

    #[test]
    fn the_scheme_is_case_insensitive() {
        for value in ["Bearer t", "bearer t", "BEARER t", "bEaReR   t "] {
            assert_eq!(
                bearer_credentials(value.as_bytes()),
                Some(&b"t"[..]),
                "{value}"
            );
        }
        for value in ["Basic t", "Bearert", "Bearer", "Bearer-x t"] {
            assert_eq!(bearer_credentials(value.as_bytes()), None, "{value}");
        }
    }

    #[test]
    fn accepts_only_configured_tokens() {
        let mut tokens = Tokens::default();
        tokens.extend(["alpha".to_string(), "beta".to_string()]);
        assert!(tokens.accepts(b"alpha"));
        assert!(tokens.accepts(b"beta"));
        assert!(!tokens.accepts(b"alph"));
        assert!(!tokens.accepts(b"alphax"));
        assert!(!tokens.accepts(b""));
        assert_eq!(format!("{tokens:?}"), "Tokens(2 configured)");
    }
}
