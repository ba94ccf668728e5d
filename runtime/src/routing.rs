//! Provider routing by model name: §4's `with_providers`.
//!
//! A [`Router`] is a [`Provider`] that hands each call to the first route whose model
//! pattern matches the request's model. Patterns are exact names or globs (`*` matches
//! any run of characters, `?` one character). Routes come from Rust
//! ([`Router::with_provider`]) or from a JSON configuration file
//! ([`Router::from_config_json`]); `spec/providers.md` specifies the file.
//!
//! Not in here: HTTP (that is [`crate::openai`]) and reading files or the process
//! environment: the caller passes the text and an environment lookup in, so tests never
//! touch the real environment.

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use crate::future::BoxFuture;
use crate::provider::{CallContext, Provider, Scripted};
use aplc_vm::text::json_kind as kind;
use aplc_vm::{Completion, ProviderError, ProviderErrorKind, ProviderRequest, ScriptedProvider};

use crate::http::HttpClient;

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

    /// Reads a routing configuration (JSON; `spec/providers.md`).
    ///
    /// `env` looks up environment variables (`api_key_env`, `headers_env`); pass
    /// `&|name| std::env::var(name).ok()` for the real environment. Errors name the
    /// route, the key and, for a missing variable, the variable; never a value.
    pub fn from_config_json(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Router, String> {
        let json: Json = serde_json::from_str(text)
            .map_err(|e| format!("providers config is not valid JSON: {e}"))?;
        Router::from_config(&json, env)
    }

    /// Reads an already-parsed routing configuration (see [`Router::from_config_json`]).
    pub fn from_config(
        config: &Json,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Router, String> {
        Router::configured(config, env, None)
    }

    /// [`Router::from_config_json`], with every `openai` route sending through `client`
    /// (shared with HTTP tools, say) instead of a client of its own.
    pub fn from_config_json_with_client(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        client: &crate::http::HttpClient,
    ) -> Result<Router, String> {
        let json: Json = serde_json::from_str(text)
            .map_err(|e| format!("providers config is not valid JSON: {e}"))?;
        Router::configured(&json, env, Some(client))
    }

    /// [`Router::from_config`], with every HTTP route sending through `client`.
    pub fn from_config_with_client(
        config: &Json,
        env: &dyn Fn(&str) -> Option<String>,
        client: &HttpClient,
    ) -> Result<Router, String> {
        Router::configured(config, env, Some(client))
    }

    fn configured(
        config: &Json,
        env: &dyn Fn(&str) -> Option<String>,
        client: Option<&HttpClient>,
    ) -> Result<Router, String> {
        let fail = |message: String| format!("providers config: {message}");
        let Json::Object(top) = config else {
            return Err(fail(format!("expected an object, found {}", kind(config))));
        };
        check_keys(top, &["routes"], "").map_err(fail)?;
        let routes = match top.get("routes") {
            Some(Json::Array(routes)) => routes,
            Some(other) => {
                return Err(fail(format!(
                    "expected `routes` to be an array, found {}",
                    kind(other)
                )));
            }
            None => return Err(fail("missing `routes`".into())),
        };
        let mut router = Router::new();
        for (index, route) in routes.iter().enumerate() {
            let at = format!("routes[{index}]");
            let (patterns, provider, description) =
                configured_route(route, env, client).map_err(|e| fail(format!("{at}: {e}")))?;
            for pattern in patterns {
                router.routes.push(Route {
                    pattern,
                    provider: provider.clone(),
                    description: description.clone(),
                });
            }
        }
        Ok(router)
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

// ---------------------------------------------------------------------------------------
// The configuration file.

/// The keys every route has.
const COMMON_KEYS: [&str; 2] = ["model", "kind"];
/// The keys of an `openai` route besides the common ones.
const OPENAI_KEYS: [&str; 8] = [
    "base_url",
    "api_key_env",
    "headers",
    "headers_env",
    "timeout_ms",
    "max_retries",
    "retry_base_delay_ms",
    "stream",
];
/// The keys of an `anthropic` route besides the common ones.
const ANTHROPIC_KEYS: [&str; 9] = [
    "base_url",
    "api_key_env",
    "headers",
    "headers_env",
    "timeout_ms",
    "max_retries",
    "retry_base_delay_ms",
    "anthropic_version",
    "stream",
];
/// The keys of a `mock` route besides the common ones.
const MOCK_KEYS: [&str; 3] = ["responses", "latency_ms", "stream"];

/// The longest `timeout_ms`, `latency_ms` or `retry_base_delay_ms` accepted: one day.
const MAX_MILLIS: u64 = 86_400_000;
/// The most retries a route may ask for.
const MAX_RETRIES: u64 = 10;

/// A configured route: its patterns, its provider, and a description for `Debug`.
type Configured = (Vec<String>, Arc<dyn Provider>, String);

/// Reads one entry of `routes`.
fn configured_route(
    route: &Json,
    env: &dyn Fn(&str) -> Option<String>,
    client: Option<&HttpClient>,
) -> Result<Configured, String> {
    let Json::Object(route) = route else {
        return Err(format!("expected an object, found {}", kind(route)));
    };
    let patterns = match route.get("model") {
        Some(Json::String(pattern)) => vec![pattern.clone()],
        Some(Json::Array(patterns)) if !patterns.is_empty() => patterns
            .iter()
            .map(|p| match p {
                Json::String(p) => Ok(p.clone()),
                other => Err(format!(
                    "expected every `model` pattern to be a string, found {}",
                    kind(other)
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(Json::Array(_)) => return Err("`model` is an empty list".into()),
        Some(other) => {
            return Err(format!(
                "expected `model` to be a string or a list of strings, found {}",
                kind(other)
            ));
        }
        None => return Err("missing `model` (a model name or pattern such as `gpt-*`)".into()),
    };
    match route.get("kind") {
        Some(Json::String(k)) if k == "openai" => {
            check_keys(
                route,
                &[&COMMON_KEYS[..], &OPENAI_KEYS[..]].concat(),
                "openai",
            )?;
            let (provider, description) = openai_route(route, env, client)?;
            Ok((patterns, provider, description))
        }
        Some(Json::String(k)) if k == "anthropic" => {
            let config = anthropic_config(route, env, client)?;
            let provider = crate::anthropic::AnthropicProvider::new(config)?;
            let description = format!("anthropic {}", provider.endpoint());
            Ok((patterns, Arc::new(provider), description))
        }
        Some(Json::String(k)) if k == "mock" => {
            check_keys(route, &[&COMMON_KEYS[..], &MOCK_KEYS[..]].concat(), "mock")?;
            let (provider, description) = mock_route(route)?;
            Ok((patterns, provider, description))
        }
        Some(Json::String(other)) => Err(format!(
            "unknown `kind` `{other}` (expected `openai`, `anthropic` or `mock`)"
        )),
        Some(other) => Err(format!(
            "expected `kind` to be a string, found {}",
            kind(other)
        )),
        None => Err("missing `kind` (`openai`, `anthropic` or `mock`)".into()),
    }
}

/// Rejects keys not in `allowed`, with a hint for the likely mistakes.
fn check_keys(object: &Map<String, Json>, allowed: &[&str], what: &str) -> Result<(), String> {
    let Some(unknown) = object.keys().find(|k| !allowed.contains(&k.as_str())) else {
        return Ok(());
    };
    if unknown == "api_key" {
        return Err(
            "unknown key `api_key`: keys are not written in the config file; name the \
                    environment variable that holds it with `api_key_env`"
                .into(),
        );
    }
    let expected: Vec<String> = allowed.iter().map(|k| format!("`{k}`")).collect();
    let route = if what.is_empty() {
        String::new()
    } else {
        format!(" for kind `{what}`")
    };
    Err(format!(
        "unknown key `{unknown}`{route} (expected {})",
        expected.join(", ")
    ))
}

/// An optional non-negative integer no greater than `max`.
fn integer(route: &Map<String, Json>, key: &str, max: u64) -> Result<Option<u64>, String> {
    match route.get(key) {
        None => Ok(None),
        Some(Json::Number(n)) => match n.as_u64() {
            Some(v) if v <= max => Ok(Some(v)),
            _ => Err(format!(
                "expected `{key}` to be an integer from 0 to {max}, found {n}"
            )),
        },
        Some(other) => Err(format!(
            "expected `{key}` to be an integer, found {}",
            kind(other)
        )),
    }
}

/// An optional string.
fn string<'a>(route: &'a Map<String, Json>, key: &str) -> Result<Option<&'a str>, String> {
    match route.get(key) {
        None => Ok(None),
        Some(Json::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!(
            "expected `{key}` to be a string, found {}",
            kind(other)
        )),
    }
}

/// An optional object of strings, in file order.
fn string_map<'a>(
    route: &'a Map<String, Json>,
    key: &str,
) -> Result<Vec<(&'a str, &'a str)>, String> {
    match route.get(key) {
        None => Ok(Vec::new()),
        Some(Json::Object(map)) => map
            .iter()
            .map(|(name, value)| match value {
                Json::String(v) => Ok((name.as_str(), v.as_str())),
                other => Err(format!(
                    "expected `{key}.{name}` to be a string, found {}",
                    kind(other)
                )),
            })
            .collect(),
        Some(other) => Err(format!(
            "expected `{key}` to be an object, found {}",
            kind(other)
        )),
    }
}

/// Looks up `variable`; a missing or empty one is an error naming it (never a value).
fn env_value(
    env: &dyn Fn(&str) -> Option<String>,
    variable: &str,
    key: &str,
) -> Result<String, String> {
    if variable.is_empty() {
        return Err(format!("`{key}` names no environment variable"));
    }
    match env(variable) {
        Some(value) if !value.trim().is_empty() => Ok(value),
        Some(_) => Err(format!(
            "environment variable `{variable}` (from `{key}`) is empty"
        )),
        None => Err(format!(
            "environment variable `{variable}` (from `{key}`) is not set"
        )),
    }
}

/// The builder methods every HTTP provider's configuration has, so one function reads
/// the keys `openai` and `anthropic` routes share.
trait HttpRouteConfig: Sized {
    fn base_url(self, url: String) -> Self;
    fn api_key(self, key: String) -> Self;
    fn header(self, name: String, value: String) -> Self;
    fn request_timeout(self, timeout: std::time::Duration) -> Self;
    fn max_retries(self, retries: u32) -> Self;
    fn retry_delays(self, base: std::time::Duration, max: std::time::Duration) -> Self;
    fn http_client(self, client: HttpClient) -> Self;
    fn stream(self, stream: bool) -> Self;
}

macro_rules! http_route_config {
    ($config:ty) => {
        impl HttpRouteConfig for $config {
            fn base_url(self, url: String) -> Self {
                <$config>::base_url(self, url)
            }
            fn api_key(self, key: String) -> Self {
                <$config>::api_key(self, key)
            }
            fn header(self, name: String, value: String) -> Self {
                <$config>::header(self, name, value)
            }
            fn request_timeout(self, timeout: std::time::Duration) -> Self {
                <$config>::request_timeout(self, timeout)
            }
            fn max_retries(self, retries: u32) -> Self {
                <$config>::max_retries(self, retries)
            }
            fn retry_delays(self, base: std::time::Duration, max: std::time::Duration) -> Self {
                <$config>::retry_delays(self, base, max)
            }
            fn http_client(self, client: HttpClient) -> Self {
                <$config>::http_client(self, client)
            }
            fn stream(self, stream: bool) -> Self {
                <$config>::stream(self, stream)
            }
        }
    };
}

http_route_config!(crate::openai::OpenAiConfig);
http_route_config!(crate::anthropic::AnthropicConfig);

/// Applies the keys every HTTP route has (`base_url`, `api_key_env`, `headers`,
/// `headers_env`, `timeout_ms`, `max_retries`, `retry_base_delay_ms`) and the shared
/// client to `config`.
fn http_route<C: HttpRouteConfig>(
    mut config: C,
    route: &Map<String, Json>,
    env: &dyn Fn(&str) -> Option<String>,
    client: Option<&HttpClient>,
) -> Result<C, String> {
    use std::time::Duration;

    use crate::openai::DEFAULT_RETRY_MAX_DELAY;

    if let Some(url) = string(route, "base_url")? {
        config = config.base_url(url.to_owned());
    }
    if let Some(variable) = string(route, "api_key_env")? {
        config = config.api_key(env_value(env, variable, "api_key_env")?);
    }
    for (name, value) in string_map(route, "headers")? {
        config = config.header(name.to_owned(), value.to_owned());
    }
    for (name, variable) in string_map(route, "headers_env")? {
        let value = env_value(env, variable, &format!("headers_env.{name}"))?;
        config = config.header(name.to_owned(), value);
    }
    if let Some(ms) = integer(route, "timeout_ms", MAX_MILLIS)? {
        config = config.request_timeout(Duration::from_millis(ms));
    }
    if let Some(retries) = integer(route, "max_retries", MAX_RETRIES)? {
        config = config.max_retries(retries as u32);
    }
    if let Some(ms) = integer(route, "retry_base_delay_ms", MAX_MILLIS)? {
        let base = Duration::from_millis(ms);
        config = config.retry_delays(base, DEFAULT_RETRY_MAX_DELAY.max(base));
    }
    if let Some(client) = client {
        config = config.http_client(client.clone());
    }
    if let Some(stream) = boolean(route, "stream")? {
        config = config.stream(stream);
    }
    Ok(config)
}

fn openai_route(
    route: &Map<String, Json>,
    env: &dyn Fn(&str) -> Option<String>,
    client: Option<&HttpClient>,
) -> Result<(Arc<dyn Provider>, String), String> {
    use crate::openai::{OpenAiConfig, OpenAiProvider};

    let config = http_route(OpenAiConfig::new(), route, env, client)?;
    let provider = OpenAiProvider::new(config)?;
    let description = format!("openai {}", provider.endpoint());
    Ok((Arc::new(provider), description))
}

/// Reads an `anthropic` route (`spec/providers.md` §5.1): the keys of an `openai` route,
/// plus `anthropic_version`, with the same checks. The key comes from `api_key_env`
/// through `env`; every `anthropic` route sends through `client` when one is given.
pub fn anthropic_config(
    route: &Map<String, Json>,
    env: &dyn Fn(&str) -> Option<String>,
    client: Option<&HttpClient>,
) -> Result<crate::anthropic::AnthropicConfig, String> {
    check_keys(
        route,
        &[&COMMON_KEYS[..], &ANTHROPIC_KEYS[..]].concat(),
        "anthropic",
    )?;
    let mut config = http_route(crate::anthropic::AnthropicConfig::new(), route, env, client)?;
    if let Some(version) = string(route, "anthropic_version")? {
        config = config.api_version(version);
    }
    Ok(config)
}

fn mock_route(route: &Map<String, Json>) -> Result<(Arc<dyn Provider>, String), String> {
    let responses = match route.get("responses") {
        Some(Json::Array(responses)) => responses.clone(),
        Some(other) => {
            return Err(format!(
                "expected `responses` to be an array, found {}",
                kind(other)
            ));
        }
        None => return Err("missing `responses` (the mock's scripted answers)".into()),
    };
    let script = ScriptedProvider::from_entries(responses)?;
    let description = format!("mock ({} responses)", script.len());
    let mut provider = Scripted::new(script);
    if let Some(ms) = integer(route, "latency_ms", MAX_MILLIS)? {
        provider = provider.with_latency(std::time::Duration::from_millis(ms));
    }
    if let Some(stream) = boolean(route, "stream")? {
        provider = provider.streaming(stream);
    }
    Ok((Arc::new(provider), description))
}

/// `key` as a bool, if present.
fn boolean(route: &Map<String, Json>, key: &str) -> Result<Option<bool>, String> {
    match route.get(key) {
        None => Ok(None),
        Some(Json::Bool(value)) => Ok(Some(*value)),
        Some(other) => Err(format!(
            "expected `{key}` to be true or false, found {}",
            kind(other)
        )),
    }
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

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn error(config: &str) -> String {
        Router::from_config_json(config, &no_env).unwrap_err()
    }

    #[test]
    fn config_errors_are_precise() {
        let cases = [
            ("[]", "providers config: expected an object, found an array"),
            ("{}", "providers config: missing `routes`"),
            (
                r#"{"routes": [], "extra": 1}"#,
                "providers config: unknown key `extra` (expected `routes`)",
            ),
            (
                r#"{"routes": {}}"#,
                "providers config: expected `routes` to be an array, found an object",
            ),
            (
                r#"{"routes": [3]}"#,
                "providers config: routes[0]: expected an object, found a number",
            ),
            (
                r#"{"routes": [{"kind": "mock", "responses": []}]}"#,
                "providers config: routes[0]: missing `model` (a model name or pattern such as `gpt-*`)",
            ),
            (
                r#"{"routes": [{"model": [], "kind": "mock", "responses": []}]}"#,
                "providers config: routes[0]: `model` is an empty list",
            ),
            (
                r#"{"routes": [{"model": "*"}]}"#,
                "providers config: routes[0]: missing `kind` (`openai`, `anthropic` or `mock`)",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "gemini"}]}"#,
                "providers config: routes[0]: unknown `kind` `gemini` (expected `openai`, `anthropic` or `mock`)",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "mock"}]}"#,
                "providers config: routes[0]: missing `responses` (the mock's scripted answers)",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "mock", "responses": [], "base_url": "x"}]}"#,
                "providers config: routes[0]: unknown key `base_url` for kind `mock` \
                 (expected `model`, `kind`, `responses`, `latency_ms`, `stream`)",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "mock", "responses": [3]}]}"#,
                "providers config: routes[0]: mock entry 0: expected a string, an assistant \
                 message, a full response or {\"error\": …}, found a number",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "mock", "responses": [], "latency_ms": -1}]}"#,
                "providers config: routes[0]: expected `latency_ms` to be an integer from 0 to \
                 86400000, found -1",
            ),
        ];
        for (config, expected) in cases {
            assert_eq!(error(config), expected, "{config}");
        }
        assert!(error("{").starts_with("providers config is not valid JSON: "));
    }

    fn anthropic(route: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
        let Json::Object(route) = serde_json::from_str(route).unwrap() else {
            panic!("a route is an object");
        };
        let config = anthropic_config(&route, env, None)?;
        let debug = format!("{config:?}");
        let provider = crate::anthropic::AnthropicProvider::new(config)?;
        Ok(format!("{} {debug}", provider.endpoint()))
    }

    #[test]
    fn anthropic_routes() {
        let env = |name: &str| match name {
            "ANTHROPIC_API_KEY" => Some("sk-ant-secret-from-env-123456".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let read = anthropic(
            r#"{"model": "claude-*", "kind": "anthropic", "api_key_env": "ANTHROPIC_API_KEY",
                "base_url": "http://127.0.0.1:1", "anthropic_version": "2024-01-01",
                "headers": {"anthropic-beta": "b"}, "timeout_ms": 100, "max_retries": 0,
                "retry_base_delay_ms": 10}"#,
            &env,
        )
        .unwrap();
        assert_eq!(
            read,
            "http://127.0.0.1:1/v1/messages AnthropicConfig { base_url: \"http://127.0.0.1:1\", \
             api_key: Some(<redacted>), api_version: \"2024-01-01\", headers: \
             {\"anthropic-beta\": <redacted>}, request_timeout: 100ms, max_retries: 0, \
             retry_base_delay: 10ms, retry_max_delay: 8s, stream: false }"
        );
        let minimal = anthropic(r#"{"model": "*", "kind": "anthropic"}"#, &env).unwrap();
        assert!(
            minimal.starts_with("https://api.anthropic.com/v1/messages "),
            "{minimal}"
        );
        let cases = [
            (
                r#"{"model": "*", "kind": "anthropic", "api_key": "sk-1"}"#,
                "unknown key `api_key`: keys are not written in the config file; name the \
                 environment variable that holds it with `api_key_env`",
            ),
            (
                r#"{"model": "*", "kind": "anthropic", "responses": []}"#,
                "unknown key `responses` for kind `anthropic` (expected `model`, `kind`, \
                 `base_url`, `api_key_env`, `headers`, `headers_env`, `timeout_ms`, \
                 `max_retries`, `retry_base_delay_ms`, `anthropic_version`, `stream`)",
            ),
            (
                r#"{"model": "*", "kind": "anthropic", "api_key_env": "EMPTY"}"#,
                "environment variable `EMPTY` (from `api_key_env`) is empty",
            ),
            (
                r#"{"model": "*", "kind": "anthropic", "api_key_env": "MISSING"}"#,
                "environment variable `MISSING` (from `api_key_env`) is not set",
            ),
            (
                r#"{"model": "*", "kind": "anthropic", "anthropic_version": 1}"#,
                "expected `anthropic_version` to be a string, found a number",
            ),
            (
                r#"{"model": "*", "kind": "anthropic", "stream": "yes"}"#,
                "expected `stream` to be true or false, found a string",
            ),
            (
                r#"{"model": "*", "kind": "anthropic", "max_retries": 11}"#,
                "expected `max_retries` to be an integer from 0 to 10, found 11",
            ),
            (
                r#"{"model": "*", "kind": "anthropic", "timeout_ms": 0}"#,
                "the request timeout must be greater than zero",
            ),
            (
                r#"{"model": "*", "kind": "anthropic", "base_url": "ftp://h"}"#,
                "invalid base URL `ftp://h`: expected an http:// or https:// URL",
            ),
        ];
        for (route, expected) in cases {
            assert_eq!(anthropic(route, &env).unwrap_err(), expected, "{route}");
        }
    }

    #[test]
    fn openai_config_errors_name_variables_not_values() {
        let env = |name: &str| match name {
            "EMPTY" => Some(" ".to_string()),
            "KEY" => Some("sk-secret-from-env-123456".to_string()),
            _ => None,
        };
        let cases = [
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "api_key": "sk-1"}]}"#,
                "providers config: routes[0]: unknown key `api_key`: keys are not written in the \
                 config file; name the environment variable that holds it with `api_key_env`",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "api_key_env": "MISSING"}]}"#,
                "providers config: routes[0]: environment variable `MISSING` (from \
                 `api_key_env`) is not set",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "api_key_env": "EMPTY"}]}"#,
                "providers config: routes[0]: environment variable `EMPTY` (from \
                 `api_key_env`) is empty",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "headers_env": {"api-key": "NOPE"}}]}"#,
                "providers config: routes[0]: environment variable `NOPE` (from \
                 `headers_env.api-key`) is not set",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "headers": {"x": 1}}]}"#,
                "providers config: routes[0]: expected `headers.x` to be a string, found a number",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "timeout_ms": "5"}]}"#,
                "providers config: routes[0]: expected `timeout_ms` to be an integer, found a string",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "max_retries": 11}]}"#,
                "providers config: routes[0]: expected `max_retries` to be an integer from 0 to \
                 10, found 11",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "base_url": "localhost"}]}"#,
                "providers config: routes[0]: invalid base URL `localhost`: relative URL without a base",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "timeout_ms": 0}]}"#,
                "providers config: routes[0]: the request timeout must be greater than zero",
            ),
        ];
        for (config, expected) in cases {
            assert_eq!(
                Router::from_config_json(config, &env).unwrap_err(),
                expected
            );
        }
        let router = Router::from_config_json(
            r#"{"routes": [
                {"model": ["gpt-*", "o?"], "kind": "openai", "api_key_env": "KEY",
                 "headers_env": {"api-key": "KEY"}, "headers": {"OpenAI-Organization": "org-1"},
                 "base_url": "http://127.0.0.1:1/v1", "timeout_ms": 100, "max_retries": 0},
                {"model": "*", "kind": "mock", "responses": ["hi"]}
            ]}"#,
            &env,
        )
        .unwrap();
        assert_eq!(router.patterns().collect::<Vec<_>>(), ["gpt-*", "o?", "*"]);
        let debug = format!("{router:?}");
        assert_eq!(
            debug,
            r#"{"gpt-*": "openai http://127.0.0.1:1/v1/chat/completions", "o?": "openai http://127.0.0.1:1/v1/chat/completions", "*": "mock (1 responses)"}"#
        );
    }
}
