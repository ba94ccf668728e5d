//! Provider routing by model name: §4's `with_providers`.
//!
//! A [`Router`] is a [`Provider`] that hands each call to the first route whose model
//! pattern matches the request's model. Patterns are exact names or globs (`*` matches
//! any run of characters, `?` one character). Routes come from Rust
//! ([`Router::with_provider`]) or from a JSON configuration file
//! ([`Router::from_config_json`]); `spec/providers.md` specifies the file.
//!
//! The file's format and its checks are in `config.rs` ([`ProvidersConfig`]).
//!
//! Not in here: HTTP (that is [`crate::openai`]) and reading files or the process
//! environment: the caller passes the text and an environment lookup in, so tests never
//! touch the real environment.

use std::fmt;
use std::sync::Arc;

use serde_json::Value as Json;

use crate::future::BoxFuture;
use crate::provider::{CallContext, Provider};
use aplc_vm::{Completion, ProviderError, ProviderErrorKind, ProviderRequest};

mod config;

pub use config::{ProvidersConfig, RouteError, RoutingError};

/// Routes provider calls to providers by model name; first match wins.
#[derive(Default, Clone)]
pub struct Router {
    routes: Vec<Route>,
}

/// One pattern and the provider it routes to.
#[derive(Clone)]
struct Route {
    pattern: String,
    provider: Arc<dyn Provider>,
    /// What the provider is, for `Debug`: never a key or a header value.
    description: String,
}

impl Router {
    /// A router without routes: every call fails with "no provider for model …".
    pub fn new() -> Router {
        Router::default()
    }

    /// A router that sends every model to `provider` (pattern `*`).
    pub fn single(provider: Arc<dyn Provider>) -> Router {
        Router::new().with_provider("*", provider)
    }

    /// Adds a route after the existing ones: models matching `pattern` go to `provider`
    /// unless an earlier route matched.
    pub fn with_provider(
        mut self,
        pattern: impl Into<String>,
        provider: Arc<dyn Provider>,
    ) -> Router {
        self.push(pattern, provider);
        self
    }

    /// Adds a route after the existing ones (the `&mut` form of [`Router::with_provider`]).
    pub fn push(&mut self, pattern: impl Into<String>, provider: Arc<dyn Provider>) {
        self.routes.push(Route {
            pattern: pattern.into(),
            provider,
            description: "custom".into(),
        });
    }

    /// Reads a routing configuration (JSON; `spec/providers.md`): [`ProvidersConfig`]
    /// read and connected in one go.
    ///
    /// `env` looks up environment variables (`api_key_env`, `headers_env`); pass
    /// `&|name| std::env::var(name).ok()` for the real environment. Errors name the
    /// route, the key and, for a missing variable, the variable; never a value.
    pub fn from_config_json(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Router, RoutingError> {
        ProvidersConfig::from_json_text(text)?.router(env, None)
    }

    /// Reads an already-parsed routing configuration (see [`Router::from_config_json`]).
    pub fn from_config(
        config: &Json,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Router, RoutingError> {
        ProvidersConfig::from_json(config)?.router(env, None)
    }

    /// The provider for `model`: the first route whose pattern matches.
    pub fn route(&self, model: &str) -> Option<&Arc<dyn Provider>> {
        self.routes
            .iter()
            .find(|r| glob_match(&r.pattern, model))
            .map(|r| &r.provider)
    }

    /// The patterns, in the order they are tried.
    pub fn patterns(&self) -> impl Iterator<Item = &str> {
        self.routes.iter().map(|r| r.pattern.as_str())
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// True without routes.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

impl Provider for Router {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        match self.route(&request.model) {
            Some(provider) => provider.complete(request, call),
            None => {
                let message = if self.routes.is_empty() {
                    format!(
                        "no provider for model `{}` (no routes are configured)",
                        request.model
                    )
                } else {
                    let patterns: Vec<String> = self.patterns().map(|p| format!("`{p}`")).collect();
                    format!(
                        "no provider for model `{}` (routes: {})",
                        request.model,
                        patterns.join(", ")
                    )
                };
                // No provider can take the request as it is: the model names no route.
                let error = ProviderError::new(ProviderErrorKind::InvalidRequest, message);
                Box::pin(std::future::ready(Err(error)))
            }
        }
    }

    /// The name the route for `model` gives, if a route matches.
    fn provider_name(&self, model: &str) -> Option<&'static str> {
        self.route(model)?.provider_name(model)
    }
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.routes.iter().map(|r| (&r.pattern, &r.description)))
            .finish()
    }
}

/// Whether `model` matches `pattern`: `*` matches any run of characters (also none),
/// `?` exactly one; everything else matches itself, case-sensitively.
pub fn glob_match(pattern: &str, model: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let model: Vec<char> = model.chars().collect();
    let (mut p, mut m) = (0, 0);
    // Where the last `*` was, and where in the model its current match ends.
    let mut star: Option<(usize, usize)> = None;
    while m < model.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, m));
                p += 1;
            }
            Some(&c) if c == '?' || c == model[m] => {
                p += 1;
                m += 1;
            }
            _ => match star {
                // Let the last `*` swallow one more character and try again from there.
                Some((star_p, star_m)) => {
                    star = Some((star_p, star_m + 1));
                    p = star_p + 1;
                    m = star_m + 1;
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let yes = [
            ("gpt-4o", "gpt-4o"),
            ("gpt-*", "gpt-4o"),
            ("gpt-*", "gpt-"),
            ("*", ""),
            ("*", "anything"),
            ("?pt-4?", "gpt-4o"),
            ("*-mini", "gpt-4o-mini"),
            ("a*b*c", "aXXbYYc"),
            ("a*b*c", "abbbc"),
            ("*a*", "banana"),
            ("llama-??b", "llama-70b"),
            ("ünï*", "ünïcode"),
            ("**", "x"),
        ];
        for (pattern, model) in yes {
            assert!(glob_match(pattern, model), "{pattern} should match {model}");
        }
        let no = [
            ("gpt-4o", "gpt-4o-mini"),
            ("gpt-*", "GPT-4o"),
            ("gpt-*", "chatgpt-4o"),
            ("?", ""),
            ("?", "ab"),
            ("a*b*c", "aXXbYY"),
            ("llama-??b", "llama-7b"),
            ("", "x"),
        ];
        for (pattern, model) in no {
            assert!(
                !glob_match(pattern, model),
                "{pattern} should not match {model}"
            );
        }
    }
}
