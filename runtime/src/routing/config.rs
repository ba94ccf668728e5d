//! The providers file (`spec/providers.md` §5): its serde types, its checks, and the
//! routes it builds.
//!
//! Reading is two steps. [`ProvidersConfig::from_json`] checks the shape (every key,
//! type and range) without the environment; [`ProvidersConfig::router`] then looks up the
//! variables the routes name and builds the providers. Between the two, a caller may
//! change what the file asked for ([`ProvidersConfig::stream_every_route`]).
//!
//! A route is an enum by its `kind`, each variant a `deny_unknown_fields` struct. It is
//! not read with serde's `#[serde(tag = "kind")]`: an internally tagged enum buffers its
//! fields before it reads them, and its errors lose the key they are about ("invalid
//! type: string, expected u64", but for which key?). So `kind` is taken out by hand and
//! the rest is read with `serde_path_to_error`, whose errors name the key
//! (`timeout_ms`, `headers.x-api-key`). The files accepted are exactly those of the
//! format: a `null` is not an absent key.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;

use super::{Route, Router};
use crate::http::HttpClient;
use crate::provider::{Provider, Scripted};
use aplc_vm::ScriptedProvider;
use aplc_vm::text::json_kind as kind;

/// The longest `timeout_ms`, `latency_ms` or `retry_base_delay_ms` accepted: one day.
const MAX_MILLIS: u64 = 86_400_000;
/// The most retries a route may ask for.
const MAX_RETRIES: u64 = 10;
/// The kinds, as the file spells them.
const KINDS: &str = "`openai`, `anthropic` or `mock`";

/// Why a providers file was refused. The message starts with `providers config`, names
/// the route by index and the key; for a variable, the variable, never its value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoutingError {
    /// The text is not JSON.
    #[error("providers config is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The top level is not an object.
    #[error("providers config: expected an object, found {found}")]
    NotAnObject {
        /// What it is ("an array").
        found: &'static str,
    },
    /// The top level is not `{"routes": [...]}`.
    #[error("providers config: {0}")]
    Shape(Invalid),
    /// One route is wrong.
    #[error("providers config: routes[{index}]: {error}")]
    Route {
        /// The route's index in `routes`.
        index: usize,
        /// What is wrong with it.
        error: RouteError,
    },
}

/// What is wrong with one route.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The route is not a JSON object.
    #[error("expected an object, found {found}")]
    NotAnObject {
        /// What it is ("a number").
        found: &'static str,
    },
    /// A key is written in the file, where it would be read by anyone who reads the file.
    #[error(
        "unknown key `api_key`: keys are not written in the config file; name the \
         environment variable that holds it with `api_key_env`"
    )]
    KeyInFile,
    /// No `kind`.
    #[error("missing `kind` ({KINDS})")]
    MissingKind,
    /// `kind` is not one of the kinds.
    #[error("unknown `kind` {found} (expected {KINDS})")]
    UnknownKind {
        /// The `kind` as written: `` `gemini` ``, or a JSON value that is not a string.
        found: String,
    },
    /// A key is unknown, missing, or of the wrong type.
    #[error("{0}")]
    Invalid(Invalid),
    /// An integer is larger than the key allows.
    #[error("expected `{key}` to be an integer from 0 to {max}, found {found}")]
    OutOfRange {
        /// The key.
        key: &'static str,
        /// The largest value allowed.
        max: u64,
        /// The value found.
        found: u64,
    },
    /// `api_key_env` or a `headers_env` entry names the empty variable.
    #[error("`{key}` names no environment variable")]
    NoVariable {
        /// The key (`api_key_env`, `headers_env.NAME`).
        key: String,
    },
    /// The variable a key names is not set.
    #[error("environment variable `{variable}` (from `{key}`) is not set")]
    VariableNotSet {
        /// The variable.
        variable: String,
        /// The key that names it.
        key: String,
    },
    /// The variable a key names is empty or blank.
    #[error("environment variable `{variable}` (from `{key}`) is empty")]
    VariableEmpty {
        /// The variable.
        variable: String,
        /// The key that names it.
        key: String,
    },
    /// The provider refused its configuration (a bad base URL or header, a zero timeout);
    /// the message names no value of a secret.
    #[error(transparent)]
    Provider(crate::openai::ConfigError),
    /// A `mock` route's `responses` are not a valid script (`mock entry 3: …`).
    #[error(transparent)]
    Responses(aplc_vm::ScriptError),
}

/// A key that is unknown, missing or of the wrong type, as serde says it, with the key
/// it is about when serde's message does not name it.
#[derive(Debug)]
pub struct Invalid {
    /// The path of the key (`timeout_ms`, `headers.x-api-key`), if the error is about a
    /// value; an unknown or missing key is named in the message.
    pub key: Option<String>,
    /// What serde found wrong.
    pub message: String,
    /// The route's `kind`, if known.
    pub kind: Option<&'static str>,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.key, self.kind) {
            (Some(key), _) => write!(f, "`{key}`: {}", self.message),
            (None, Some(kind)) => write!(f, "{} (kind `{kind}`)", self.message),
            (None, None) => write!(f, "{}", self.message),
        }
    }
}

impl std::error::Error for Invalid {}

/// A providers file, checked but not connected: no variable read, no provider built.
#[derive(Debug, Clone)]
pub struct ProvidersConfig {
    routes: Vec<RouteConfig>,
}

/// The top level, as written. Routes are read one by one, so an error names the index.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object with `routes`")]
struct File {
    routes: Vec<Json>,
}

/// One route, by its `kind` (see the module's docs for why it is not a serde tag).
#[derive(Debug, Clone)]
enum RouteConfig {
    OpenAi(HttpRoute),
    Anthropic(HttpRoute),
    Mock(MockRoute),
}

/// An `openai` or `anthropic` route. `anthropic_version` is refused on `openai` routes
/// after reading ([`RouteConfig::read`]): one struct keeps the shared keys in one place.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpRoute {
    model: Patterns,
    #[serde(default, deserialize_with = "present")]
    base_url: Option<String>,
    #[serde(default, deserialize_with = "present")]
    api_key_env: Option<String>,
    #[serde(default)]
    headers: Strings,
    #[serde(default)]
    headers_env: Strings,
    #[serde(default, deserialize_with = "present")]
    timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    max_retries: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    retry_base_delay_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    anthropic_version: Option<String>,
    #[serde(default, deserialize_with = "present")]
    stream: Option<bool>,
}

/// The keys of an `openai` route, for the error that refuses `anthropic_version`.
const OPENAI_KEYS: &[&str] = &[
    "model",
    "base_url",
    "api_key_env",
    "headers",
    "headers_env",
    "timeout_ms",
    "max_retries",
    "retry_base_delay_ms",
    "stream",
];

/// A `mock` route.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct MockRoute {
    model: Patterns,
    responses: Vec<Json>,
    #[serde(default, deserialize_with = "present")]
    latency_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    stream: Option<bool>,
}

/// `model`: one pattern or a non-empty list of them.
#[derive(Debug, Clone)]
struct Patterns(Vec<String>);

/// An object of strings, in file order (`headers`, `headers_env`).
#[derive(Debug, Clone, Default)]
struct Strings(Vec<(String, String)>);

impl ProvidersConfig {
    /// Reads a providers file's text.
    pub fn from_json_text(text: &str) -> Result<ProvidersConfig, RoutingError> {
        let json: Json = serde_json::from_str(text).map_err(RoutingError::NotJson)?;
        ProvidersConfig::from_json(&json)
    }

    /// Reads an already-parsed providers file.
    pub fn from_json(json: &Json) -> Result<ProvidersConfig, RoutingError> {
        if !json.is_object() {
            return Err(RoutingError::NotAnObject { found: kind(json) });
        }
        let file: File = keyed(json.clone(), None).map_err(RoutingError::Shape)?;
        let routes = file
            .routes
            .into_iter()
            .enumerate()
            .map(|(index, route)| {
                RouteConfig::read(route).map_err(|error| RoutingError::Route { index, error })
            })
            .collect::<Result<_, _>>()?;
        Ok(ProvidersConfig { routes })
    }

    /// Makes every route stream its answers (`"stream": true`), whatever the file says:
    /// `aplc run --stream`.
    pub fn stream_every_route(&mut self) {
        for route in &mut self.routes {
            match route {
                RouteConfig::OpenAi(http) | RouteConfig::Anthropic(http) => {
                    http.stream = Some(true)
                }
                RouteConfig::Mock(mock) => mock.stream = Some(true),
            }
        }
    }

    /// The router: looks up the variables the routes name in `env` and builds each
    /// provider, every HTTP route sending through `client` when one is given (shared with
    /// HTTP tools, say) instead of a client of its own.
    pub fn router(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        client: Option<&HttpClient>,
    ) -> Result<Router, RoutingError> {
        let mut router = Router::new();
        for (index, route) in self.routes.iter().enumerate() {
            let (provider, description) = route
                .provider(env, client)
                .map_err(|error| RoutingError::Route { index, error })?;
            for pattern in &route.patterns().0 {
                router.routes.push(Route {
                    pattern: pattern.clone(),
                    provider: provider.clone(),
                    description: description.clone(),
                });
            }
        }
        Ok(router)
    }
}

impl RouteConfig {
    /// Reads one entry of `routes`.
    fn read(route: Json) -> Result<RouteConfig, RouteError> {
        let Json::Object(mut route) = route else {
            return Err(RouteError::NotAnObject {
                found: kind(&route),
            });
        };
        if route.contains_key("api_key") {
            return Err(RouteError::KeyInFile);
        }
        match route.remove("kind") {
            Some(Json::String(k)) if k == "openai" => {
                let http: HttpRoute =
                    keyed(Json::Object(route), Some("openai")).map_err(RouteError::Invalid)?;
                if http.anthropic_version.is_some() {
                    let error: serde_json::Error =
                        de::Error::unknown_field("anthropic_version", OPENAI_KEYS);
                    return Err(RouteError::Invalid(Invalid {
                        key: None,
                        message: error.to_string(),
                        kind: Some("openai"),
                    }));
                }
                Ok(RouteConfig::OpenAi(http))
            }
            Some(Json::String(k)) if k == "anthropic" => {
                keyed(Json::Object(route), Some("anthropic"))
                    .map(RouteConfig::Anthropic)
                    .map_err(RouteError::Invalid)
            }
            Some(Json::String(k)) if k == "mock" => keyed(Json::Object(route), Some("mock"))
                .map(RouteConfig::Mock)
                .map_err(RouteError::Invalid),
            Some(Json::String(other)) => Err(RouteError::UnknownKind {
                found: format!("`{other}`"),
            }),
            Some(other) => Err(RouteError::UnknownKind {
                found: other.to_string(),
            }),
            None => Err(RouteError::MissingKind),
        }
    }

    fn patterns(&self) -> &Patterns {
        match self {
            RouteConfig::OpenAi(http) | RouteConfig::Anthropic(http) => &http.model,
            RouteConfig::Mock(mock) => &mock.model,
        }
    }

    /// The route's provider and its description for `Debug` (never a key or a header).
    fn provider(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        client: Option<&HttpClient>,
    ) -> Result<(Arc<dyn Provider>, String), RouteError> {
        match self {
            RouteConfig::OpenAi(http) => {
                let config = http.apply(crate::openai::OpenAiConfig::new(), env, client)?;
                let provider =
                    crate::openai::OpenAiProvider::new(config).map_err(RouteError::Provider)?;
                let description = format!("openai {}", provider.endpoint());
                Ok((Arc::new(provider), description))
            }
            RouteConfig::Anthropic(http) => {
                let config = anthropic_config(http, env, client)?;
                let provider = crate::anthropic::AnthropicProvider::new(config)
                    .map_err(RouteError::Provider)?;
                let description = format!("anthropic {}", provider.endpoint());
                Ok((Arc::new(provider), description))
            }
            RouteConfig::Mock(mock) => mock.provider(),
        }
    }
}

/// Reads an `anthropic` route's configuration (`spec/providers.md` §5.1): the keys of an
/// `openai` route plus `anthropic_version`.
fn anthropic_config(
    http: &HttpRoute,
    env: &dyn Fn(&str) -> Option<String>,
    client: Option<&HttpClient>,
) -> Result<crate::anthropic::AnthropicConfig, RouteError> {
    let mut config = http.apply(crate::anthropic::AnthropicConfig::new(), env, client)?;
    if let Some(version) = &http.anthropic_version {
        config = config.api_version(version);
    }
    Ok(config)
}

impl HttpRoute {
    /// Applies the keys every HTTP route has and the shared client to `config`.
    fn apply<C: HttpRouteConfig>(
        &self,
        mut config: C,
        env: &dyn Fn(&str) -> Option<String>,
        client: Option<&HttpClient>,
    ) -> Result<C, RouteError> {
        use crate::openai::DEFAULT_RETRY_MAX_DELAY;

        if let Some(url) = &self.base_url {
            config = config.base_url(url.clone());
        }
        if let Some(variable) = &self.api_key_env {
            config = config.api_key(env_value(env, variable, "api_key_env")?);
        }
        for (name, value) in &self.headers.0 {
            config = config.header(name.clone(), value.clone());
        }
        for (name, variable) in &self.headers_env.0 {
            let value = env_value(env, variable, &format!("headers_env.{name}"))?;
            config = config.header(name.clone(), value);
        }
        if let Some(ms) = in_range("timeout_ms", self.timeout_ms, MAX_MILLIS)? {
            config = config.request_timeout(Duration::from_millis(ms));
        }
        if let Some(retries) = in_range("max_retries", self.max_retries, MAX_RETRIES)? {
            config = config.max_retries(retries as u32);
        }
        if let Some(ms) = in_range("retry_base_delay_ms", self.retry_base_delay_ms, MAX_MILLIS)? {
            let base = Duration::from_millis(ms);
            config = config.retry_delays(base, DEFAULT_RETRY_MAX_DELAY.max(base));
        }
        if let Some(client) = client {
            config = config.http_client(client.clone());
        }
        if let Some(stream) = self.stream {
            config = config.stream(stream);
        }
        Ok(config)
    }
}

impl MockRoute {
    fn provider(&self) -> Result<(Arc<dyn Provider>, String), RouteError> {
        let script = ScriptedProvider::from_entries(self.responses.clone())
            .map_err(RouteError::Responses)?;
        let description = format!("mock ({} responses)", script.len());
        let mut provider = Scripted::new(script);
        if let Some(ms) = in_range("latency_ms", self.latency_ms, MAX_MILLIS)? {
            provider = provider.with_latency(Duration::from_millis(ms));
        }
        if let Some(stream) = self.stream {
            provider = provider.streaming(stream);
        }
        Ok((Arc::new(provider), description))
    }
}

/// `value` if it is no greater than `max`.
fn in_range(key: &'static str, value: Option<u64>, max: u64) -> Result<Option<u64>, RouteError> {
    match value {
        Some(found) if found > max => Err(RouteError::OutOfRange { key, max, found }),
        _ => Ok(value),
    }
}

/// Looks up `variable`; a missing or empty one is an error naming it (never a value).
fn env_value(
    env: &dyn Fn(&str) -> Option<String>,
    variable: &str,
    key: &str,
) -> Result<String, RouteError> {
    let (variable, key) = (variable.to_owned(), key.to_owned());
    if variable.is_empty() {
        return Err(RouteError::NoVariable { key });
    }
    match env(&variable) {
        Some(value) if !value.trim().is_empty() => Ok(value),
        Some(_) => Err(RouteError::VariableEmpty { variable, key }),
        None => Err(RouteError::VariableNotSet { variable, key }),
    }
}

/// Deserializes `json`, naming the key of a value that is wrong.
fn keyed<T: DeserializeOwned>(json: Json, kind: Option<&'static str>) -> Result<T, Invalid> {
    serde_path_to_error::deserialize(json).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // serde's "unknown field `x`" names its key already; only a value's error needs
        // the path (`headers.x-api-key`). This only shapes the text, never a decision.
        let named = message.contains(&format!("field `{path}`"));
        Invalid {
            key: (path != "." && !named).then_some(path),
            message,
            kind,
        }
    })
}

/// A key that is present: `null` is not an absent key, but a value of the wrong type.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl<'de> Deserialize<'de> for Patterns {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PatternsVisitor;

        impl<'de> Visitor<'de> for PatternsVisitor {
            type Value = Patterns;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a model name or pattern such as `gpt-*`, or a list of them")
            }

            fn visit_str<E: de::Error>(self, pattern: &str) -> Result<Patterns, E> {
                Ok(Patterns(vec![pattern.to_owned()]))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Patterns, A::Error> {
                let mut patterns = Vec::new();
                while let Some(pattern) = seq.next_element::<String>()? {
                    patterns.push(pattern);
                }
                if patterns.is_empty() {
                    return Err(de::Error::invalid_length(0, &"at least one pattern"));
                }
                Ok(Patterns(patterns))
            }
        }

        deserializer.deserialize_any(PatternsVisitor)
    }
}

impl<'de> Deserialize<'de> for Strings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StringsVisitor;

        impl<'de> Visitor<'de> for StringsVisitor {
            type Value = Strings;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of strings")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strings, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, String>()? {
                    entries.push(entry);
                }
                Ok(Strings(entries))
            }
        }

        deserializer.deserialize_map(StringsVisitor)
    }
}

/// The builder methods every HTTP provider's configuration has, so one function reads
/// the keys `openai` and `anthropic` routes share.
trait HttpRouteConfig: Sized {
    fn base_url(self, url: String) -> Self;
    fn api_key(self, key: String) -> Self;
    fn header(self, name: String, value: String) -> Self;
    fn request_timeout(self, timeout: Duration) -> Self;
    fn max_retries(self, retries: u32) -> Self;
    fn retry_delays(self, base: Duration, max: Duration) -> Self;
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
            fn request_timeout(self, timeout: Duration) -> Self {
                <$config>::request_timeout(self, timeout)
            }
            fn max_retries(self, retries: u32) -> Self {
                <$config>::max_retries(self, retries)
            }
            fn retry_delays(self, base: Duration, max: Duration) -> Self {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn error(config: &str) -> String {
        Router::from_config_json(config, &no_env)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn config_errors_are_precise() {
        let cases = [
            ("[]", "providers config: expected an object, found an array"),
            ("{}", "providers config: missing field `routes`"),
            (
                r#"{"routes": [], "extra": 1}"#,
                "providers config: unknown field `extra`, expected `routes`",
            ),
            (
                r#"{"routes": {}}"#,
                "providers config: `routes`: invalid type: map, expected a sequence",
            ),
            (
                r#"{"routes": [3]}"#,
                "providers config: routes[0]: expected an object, found a number",
            ),
            (
                r#"{"routes": [{"kind": "mock", "responses": []}]}"#,
                "providers config: routes[0]: missing field `model` (kind `mock`)",
            ),
            (
                r#"{"routes": [{"model": [], "kind": "mock", "responses": []}]}"#,
                "providers config: routes[0]: `model`: invalid length 0, expected at least one \
                 pattern",
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
                "providers config: routes[0]: missing field `responses` (kind `mock`)",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "mock", "responses": [], "base_url": "x"}]}"#,
                "providers config: routes[0]: unknown field `base_url`, expected one of `model`, \
                 `responses`, `latency_ms`, `stream` (kind `mock`)",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "mock", "responses": [3]}]}"#,
                "providers config: routes[0]: mock entry 0: expected a string, an assistant \
                 message, a full response or {\"error\": …}, found a number",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "mock", "responses": [], "latency_ms": -1}]}"#,
                "providers config: routes[0]: `latency_ms`: invalid value: integer `-1`, \
                 expected u64",
            ),
        ];
        for (config, expected) in cases {
            assert_eq!(error(config), expected, "{config}");
        }
        assert!(error("{").starts_with("providers config is not valid JSON: "));
    }

    fn anthropic(route: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
        let route = RouteConfig::read(serde_json::from_str(route).unwrap());
        let Ok(RouteConfig::Anthropic(http)) = route else {
            return Err(route.unwrap_err().to_string());
        };
        let config = anthropic_config(&http, env, None).map_err(|e| e.to_string())?;
        let debug = format!("{config:?}");
        let provider =
            crate::anthropic::AnthropicProvider::new(config).map_err(|e| e.to_string())?;
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
                "unknown field `responses`, expected one of `model`, `base_url`, \
                 `api_key_env`, `headers`, `headers_env`, `timeout_ms`, `max_retries`, \
                 `retry_base_delay_ms`, `anthropic_version`, `stream` (kind `anthropic`)",
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
                "`anthropic_version`: invalid type: integer `1`, expected a string",
            ),
            (
                r#"{"model": "*", "kind": "anthropic", "stream": "yes"}"#,
                "`stream`: invalid type: string \"yes\", expected a boolean",
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
                "providers config: routes[0]: `headers.x`: invalid type: integer `1`, expected a \
                 string",
            ),
            (
                r#"{"routes": [{"model": "*", "kind": "openai", "timeout_ms": "5"}]}"#,
                "providers config: routes[0]: `timeout_ms`: invalid type: string \"5\", expected \
                 u64",
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
            let error = Router::from_config_json(config, &env).unwrap_err();
            assert_eq!(error.to_string(), expected, "{config}");
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

    #[test]
    fn errors_are_typed_with_the_route_index_and_the_key() {
        let config = r#"{"routes": [
            {"model": "*", "kind": "mock", "responses": []},
            {"model": "*", "kind": "openai", "headers_env": {"api-key": "NOPE"}}
        ]}"#;
        let error = Router::from_config_json(config, &no_env).unwrap_err();
        assert!(
            matches!(
                &error,
                RoutingError::Route {
                    index: 1,
                    error: RouteError::VariableNotSet { variable, key },
                } if variable == "NOPE" && key == "headers_env.api-key"
            ),
            "{error:?}"
        );
        let error = ProvidersConfig::from_json_text(
            r#"{"routes": [{"model": "*", "kind": "openai", "max_retries": "3"}]}"#,
        )
        .unwrap_err();
        assert!(
            matches!(
                &error,
                RoutingError::Route {
                    index: 0,
                    error: RouteError::Invalid(Invalid { key: Some(key), .. }),
                } if key == "max_retries"
            ),
            "{error:?}"
        );
    }

    #[test]
    fn the_files_accepted_are_those_of_the_format() {
        let cases = [
            // A null is a value of the wrong type, not an absent key.
            (
                r#"{"model": "*", "kind": "openai", "base_url": null}"#,
                "`base_url`: invalid type: null, expected a string",
            ),
            (
                r#"{"model": "*", "kind": "mock", "responses": [], "stream": null}"#,
                "`stream`: invalid type: null, expected a boolean",
            ),
            (
                r#"{"model": "*", "kind": "openai", "anthropic_version": "2023-06-01"}"#,
                "unknown field `anthropic_version`, expected one of `model`, `base_url`, \
                 `api_key_env`, `headers`, `headers_env`, `timeout_ms`, `max_retries`, \
                 `retry_base_delay_ms`, `stream` (kind `openai`)",
            ),
            (
                r#"{"model": ["a", 3], "kind": "mock", "responses": []}"#,
                "`model[1]`: invalid type: integer `3`, expected a string",
            ),
            (
                r#"{"model": "*", "kind": 3}"#,
                "unknown `kind` 3 (expected `openai`, `anthropic` or `mock`)",
            ),
        ];
        for (route, expected) in cases {
            let error = RouteConfig::read(serde_json::from_str(route).unwrap()).unwrap_err();
            assert_eq!(error.to_string(), expected, "{route}");
        }
    }

    #[test]
    fn streaming_every_route_overrides_the_file() {
        let mut config = ProvidersConfig::from_json_text(
            r#"{"routes": [
                {"model": "a", "kind": "mock", "responses": [], "stream": false},
                {"model": "b", "kind": "openai"},
                {"model": "c", "kind": "anthropic", "stream": false}
            ]}"#,
        )
        .unwrap();
        config.stream_every_route();
        for route in &config.routes {
            let stream = match route {
                RouteConfig::OpenAi(http) | RouteConfig::Anthropic(http) => http.stream,
                RouteConfig::Mock(mock) => mock.stream,
            };
            assert_eq!(stream, Some(true), "{route:?}");
        }
    }
}
