//! One equipment builder: the provider, the tools and the secrets of a run, from what a
//! host was given. `aplc run`/`resume`, `aplc serve` and the Python package each build
//! their [`Equipment`] here, so a flag, a file or a secret means the same in all three.
//!
//! What a host gives: a providers file (`spec/providers.md`), a base URL and an API key
//! for the OpenAI-compatible provider, mock answers (the scripted provider), a tools
//! manifest (`spec/tools.md`), whether to stream, and an [`Environment`]: where
//! variables and files come from and where warnings go. Every variable the builder reads
//! through it (`OPENAI_API_KEY`, a route's `api_key_env` and `headers_env`) is recorded as
//! a secret, here and nowhere else: tools do not inherit it and its value is redacted.
//!
//! Not in here: the secrets a host knows of its own (serve tokens, a store's password:
//! the host passes its [`Secrets`] in), and what a run does with the equipment.

use std::cell::RefCell;
use std::env::VarError;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use aplc_vm::{
    Completion, ProviderError, ProviderErrorKind, ProviderRequest, ScriptError, ScriptedProvider,
};

use crate::future::BoxFuture;
use crate::http::{HttpClient, HttpClientError};
use crate::manifest::ManifestError;
use crate::openai::{ConfigError, OpenAiConfig, OpenAiProvider};
use crate::provider::{CallContext, Provider, Scripted};
use crate::redact::Redactor;
use crate::routing::{ProvidersConfig, RoutingError};
use crate::secrets::Secrets;
use crate::tool::Toolbox;

/// Where the builder's variables and files come from, and where its warnings go.
pub trait Environment {
    /// The variable `name`, as [`std::env::var`] reads it.
    fn var(&self, name: &str) -> Result<String, VarError>;

    /// The text of the file `path` (a providers file, a tools manifest, mock answers).
    /// The error's message names the file.
    fn read(&self, path: &Path) -> std::io::Result<String>;

    /// Something the host may tell its user; by default nothing.
    fn warn(&self, warning: Warning) {
        let _ = warning;
    }
}

/// This process's variables, and files read with [`crate::files::read_text`] (bounded,
/// UTF-8); warnings are dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Result<String, VarError> {
        std::env::var(name)
    }

    fn read(&self, path: &Path) -> std::io::Result<String> {
        crate::files::read_text(path).map_err(std::io::Error::other)
    }
}

/// What the builder tells the host about settings it does not use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// A base URL or an API key was given with mock answers, which call no server.
    HttpSettingsWithMock,
    /// A base URL or an API key was given with a providers file, whose routes name their
    /// own `base_url` and `api_key_env`.
    HttpSettingsWithProviders,
    /// `OPENAI_API_KEY` is set but not Unicode: it is ignored.
    KeyNotUnicode,
}

/// Where a providers file or mock answers come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A file, read through [`Environment::read`]; errors name its path.
    File(PathBuf),
    /// Text the host already has; errors start with `name`.
    Text {
        /// What errors call it (`providers`).
        name: String,
        /// The JSON text.
        text: String,
    },
}

/// Why the equipment could not be built. Messages name the file and, within it, the
/// route or tool and the key; never a secret's value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EquipError {
    /// Mock answers and a providers file were both given.
    #[error("mock answers and a providers file both choose the provider; give one of them")]
    MockAndProviders,
    /// A file could not be read (the message names it).
    #[error("{0}")]
    Read(#[source] std::io::Error),
    /// The mock answers are not a valid script.
    #[error("{name}: {error}")]
    Mock {
        /// The file.
        name: String,
        /// What is wrong (`mock entry 3: …`).
        error: ScriptError,
    },
    /// The providers file is refused.
    #[error("{name}: {error}")]
    Providers {
        /// The file.
        name: String,
        /// What is wrong (boxed: errors stay small on the happy path's stack).
        error: Box<RoutingError>,
    },
    /// The tools manifest is refused.
    #[error("{name}: {error}")]
    Tools {
        /// The file.
        name: String,
        /// What is wrong (boxed, as above).
        error: Box<ManifestError>,
    },
    /// The tools manifest declares MCP servers, and this host does not start them yet.
    #[error("{name}: `mcpServers`: MCP servers are not supported here yet (spec/mcp.md)")]
    McpNotStarted {
        /// The file.
        name: String,
    },
    /// The shared HTTP client could not be built.
    #[error(transparent)]
    Http(HttpClientError),
    /// The OpenAI-compatible provider refused its configuration (its base URL, say).
    #[error(transparent)]
    Provider(ConfigError),
}

/// What a run is equipped with.
pub struct Equipment {
    /// The provider every call goes to.
    pub provider: Arc<dyn Provider>,
    /// The tools, redacting their results with [`Equipment::redactor`].
    pub toolbox: Toolbox,
    /// Every secret: the host's, the API key, the variables read. Command tools do not
    /// inherit [`Secrets::variables`].
    pub secrets: Secrets,
    /// A redactor of every secret value.
    pub redactor: Redactor,
    /// The mock provider, shared, when mock answers were given: a resumed run advances
    /// it past the calls it replayed.
    pub scripted: Option<Arc<Scripted>>,
    /// The OpenAI-compatible provider has neither a key nor a base URL: its calls to
    /// api.openai.com will fail, and the host may say so.
    pub no_key: bool,
}

impl std::fmt::Debug for Equipment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Equipment")
            .field("toolbox", &self.toolbox)
            .field("secrets", &self.secrets)
            .field("no_key", &self.no_key)
            .finish_non_exhaustive()
    }
}

/// What to build [`Equipment`] from. Without mock answers or a providers file, the
/// provider is the OpenAI-compatible HTTP provider at the base URL (default
/// api.openai.com) with the API key, else `OPENAI_API_KEY`. `Debug` never shows the key.
#[derive(Default)]
pub struct Builder {
    secrets: Secrets,
    providers: Option<Source>,
    mock: Option<Source>,
    base_url: Option<String>,
    api_key: Option<String>,
    tools: Option<PathBuf>,
    /// A manifest the host already has: `(name, text, base folder)`.
    tools_text: Option<(String, String, PathBuf)>,
    stream: bool,
    lazy: bool,
    /// The host starts MCP servers (`Toolbox::start_mcp`); otherwise a manifest that
    /// declares some is refused rather than run without their tools.
    mcp: bool,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("secrets", &self.secrets)
            .field("providers", &self.providers)
            .field("mock", &self.mock)
            // A URL may carry credentials or a `?key=`: shown as errors show it.
            .field(
                "base_url",
                &self
                    .base_url
                    .as_deref()
                    .map(crate::transport::printable_url),
            )
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("tools", &self.tools)
            .field(
                "tools_text",
                &self.tools_text.as_ref().map(|(name, ..)| name),
            )
            .field("stream", &self.stream)
            .field("lazy", &self.lazy)
            .field("mcp", &self.mcp)
            .finish()
    }
}

impl Builder {
    /// Starts from the host's `secrets` ([`Secrets::from_env`] and whatever else the
    /// host holds: tokens, a store URL's password).
    pub fn new(secrets: Secrets) -> Builder {
        Builder {
            secrets,
            ..Builder::default()
        }
    }

    /// Routes models with this providers file.
    pub fn providers(mut self, source: Option<Source>) -> Builder {
        self.providers = source;
        self
    }

    /// Answers every call from this script (a JSON array, as `--mock` files).
    pub fn mock(mut self, source: Option<Source>) -> Builder {
        self.mock = source;
        self
    }

    /// The OpenAI-compatible provider's base URL.
    pub fn base_url(mut self, url: Option<String>) -> Builder {
        self.base_url = url;
        self
    }

    /// The OpenAI-compatible provider's key (before `OPENAI_API_KEY`). It is a secret
    /// even when that provider is not used.
    pub fn api_key(mut self, key: Option<String>) -> Builder {
        self.api_key = key;
        self
    }

    /// The tools of this manifest; a relative `cwd` in it is relative to its folder.
    pub fn tools(mut self, manifest: Option<PathBuf>) -> Builder {
        self.tools = manifest;
        self
    }

    /// The tools of this manifest text (the host read or built it: Python's parsed
    /// manifest); errors start with `name`, a relative `cwd` is relative to `base`.
    /// [`Builder::tools`] wins over it.
    pub fn tools_text(mut self, name: String, text: String, base: PathBuf) -> Builder {
        self.tools_text = Some((name, text, base));
        self
    }

    /// Every provider streams its answers (every route of a providers file too).
    pub fn stream(mut self, stream: bool) -> Builder {
        self.stream = stream;
        self
    }

    /// Builds nothing a run may never use: no shared HTTP client, and the
    /// OpenAI-compatible provider on its first call (a configuration it refuses fails
    /// that call). For hosts whose runs mostly use providers of their own (Python).
    pub fn lazy(mut self, lazy: bool) -> Builder {
        self.lazy = lazy;
        self
    }

    /// Whether the host starts the manifest's MCP servers (`mcpServers`) with
    /// [`Toolbox::start_mcp`] before its runs (`aplc run` and `aplc resume` do). Without
    /// it, a manifest that declares servers is refused ([`EquipError::McpNotStarted`]),
    /// never run without their tools. Default: false.
    pub fn mcp(mut self, starts_servers: bool) -> Builder {
        self.mcp = starts_servers;
        self
    }

    /// Builds the equipment, reading variables and files through `env`.
    pub fn build(mut self, env: &dyn Environment) -> Result<Equipment, EquipError> {
        if self.mock.is_some() && self.providers.is_some() {
            return Err(EquipError::MockAndProviders);
        }
        // One HTTP client for the provider and HTTP tools: one set of redirect, proxy and
        // body-size rules, one connection pool. Not built for a mock run without tools.
        let http = if !self.lazy && (self.mock.is_none() || self.tools.is_some()) {
            Some(HttpClient::new().map_err(EquipError::Http)?)
        } else {
            None
        };
        let mut secrets = std::mem::take(&mut self.secrets);
        // Even when the key's provider is not used (mock answers), it is the user's key.
        if let Some(key) = &self.api_key {
            secrets.value(key);
        }
        let reading = Reading {
            env,
            seen: RefCell::default(),
        };
        let chosen = self.provider(&reading, http.as_ref());
        reading.record(&mut secrets);
        let Chosen {
            provider,
            scripted,
            no_key,
        } = chosen?;
        let toolbox = self.toolbox(env, http.as_ref(), &mut secrets)?;
        let redactor = secrets.redactor();
        Ok(Equipment {
            provider,
            toolbox,
            secrets,
            redactor,
            scripted,
            no_key,
        })
    }

    /// The provider, the shared mock provider if it is one, and whether it lacks a key.
    fn provider(
        &self,
        reading: &Reading<'_>,
        http: Option<&HttpClient>,
    ) -> Result<Chosen, EquipError> {
        let http_settings = self.api_key.is_some() || self.base_url.is_some();
        if let Some(source) = &self.mock {
            let (name, text) = read(reading.env, source)?;
            let script = ScriptedProvider::from_json(&text)
                .map_err(|error| EquipError::Mock { name, error })?;
            if http_settings {
                reading.env.warn(Warning::HttpSettingsWithMock);
            }
            let scripted = Arc::new(Scripted::new(script).streaming(self.stream));
            return Ok(Chosen {
                provider: scripted.clone(),
                scripted: Some(scripted),
                no_key: false,
            });
        }
        if let Some(source) = &self.providers {
            if http_settings {
                reading.env.warn(Warning::HttpSettingsWithProviders);
            }
            let (name, text) = read(reading.env, source)?;
            let router = ProvidersConfig::from_json_text(&text)
                .and_then(|mut config| {
                    if self.stream {
                        config.stream_every_route();
                    }
                    config.router(&|variable| reading.var(variable).ok(), http)
                })
                .map_err(|error| EquipError::Providers {
                    name,
                    error: Box::new(error),
                })?;
            return Ok(Chosen {
                provider: Arc::new(router),
                scripted: None,
                no_key: false,
            });
        }
        let key = self
            .api_key
            .clone()
            .or_else(|| match reading.var("OPENAI_API_KEY") {
                Ok(key) => Some(key),
                Err(VarError::NotUnicode(_)) => {
                    reading.env.warn(Warning::KeyNotUnicode);
                    None
                }
                Err(VarError::NotPresent) => None,
            });
        let key = key.filter(|k| !k.trim().is_empty());
        let no_key = key.is_none() && self.base_url.is_none();
        let provider: Arc<dyn Provider> = if self.lazy {
            Arc::new(LazyHttp {
                base_url: self.base_url.clone(),
                api_key: key,
                built: OnceLock::new(),
            })
        } else {
            let mut config = http_config(self.base_url.clone(), key).stream(self.stream);
            if let Some(http) = http {
                config = config.http_client(http.clone());
            }
            Arc::new(OpenAiProvider::new(config).map_err(EquipError::Provider)?)
        };
        Ok(Chosen {
            provider,
            scripted: None,
            no_key,
        })
    }

    /// The tools of the manifest, redacting with every secret.
    fn toolbox(
        &self,
        env: &dyn Environment,
        http: Option<&HttpClient>,
        secrets: &mut Secrets,
    ) -> Result<Toolbox, EquipError> {
        let manifest = match (&self.tools, &self.tools_text) {
            (Some(path), _) => Some((
                path.display().to_string(),
                env.read(path).map_err(EquipError::Read)?,
                path.parent().unwrap_or(Path::new(".")).to_owned(),
            )),
            (None, Some(given)) => Some(given.clone()),
            (None, None) => None,
        };
        let mut toolbox = match manifest {
            Some((name, text, base)) => {
                // MCP servers' `env` values and `headers_env` variables are secrets
                // (spec/mcp.md): recorded before any child's environment is decided.
                let servers =
                    crate::manifest::mcp_servers(&text).map_err(|error| EquipError::Tools {
                        name: name.clone(),
                        error: Box::new(error),
                    })?;
                if !servers.is_empty() && !self.mcp {
                    return Err(EquipError::McpNotStarted { name });
                }
                for server in &servers {
                    record_mcp_secrets(server, env, secrets);
                }
                let hidden = secrets.variables();
                match http {
                    Some(http) => crate::manifest::toolbox_from_manifest_with_client(
                        &text, &base, http, hidden,
                    ),
                    None => crate::manifest::toolbox_from_manifest(&text, &base, hidden),
                }
                .map_err(|error| EquipError::Tools {
                    name,
                    error: Box::new(error),
                })?
            }
            None => Toolbox::new(),
        };
        toolbox.redact_with(secrets.redactor());
        Ok(toolbox)
    }
}

/// Records the secrets an MCP server names: the literal values of its `env` (redacted,
/// since users paste API keys there; their names stay visible to other children, which
/// inherit aplc's own value of such a variable, never this one) and the variables of its
/// `headers_env`, hidden and with their values redacted.
fn record_mcp_secrets(
    server: &crate::mcp::McpServer,
    env: &dyn Environment,
    secrets: &mut Secrets,
) {
    match &server.transport {
        crate::mcp::McpTransport::Stdio { env: literal, .. } => {
            secrets.values(literal.iter().map(|(_, value)| value.as_str()));
        }
        crate::mcp::McpTransport::Http { headers_env, .. } => {
            for (_, variable) in headers_env {
                secrets.variable(variable, env.var(variable).ok());
            }
        }
    }
}

/// The provider [`Builder::provider`] chose: see the fields of [`Equipment`].
struct Chosen {
    provider: Arc<dyn Provider>,
    scripted: Option<Arc<Scripted>>,
    no_key: bool,
}

/// An [`Environment`] whose every variable read is remembered, to be recorded as a
/// secret once the reading is done.
struct Reading<'e> {
    env: &'e dyn Environment,
    seen: RefCell<Vec<(String, Option<String>)>>,
}

impl Reading<'_> {
    fn var(&self, name: &str) -> Result<String, VarError> {
        let value = self.env.var(name);
        self.seen
            .borrow_mut()
            .push((name.to_owned(), value.as_ref().ok().cloned()));
        value
    }

    /// Adds every variable read, and its value, to `secrets`.
    fn record(self, secrets: &mut Secrets) {
        for (name, value) in self.seen.into_inner() {
            secrets.variable(&name, value);
        }
    }
}

/// The name errors give `source` and its text.
fn read(env: &dyn Environment, source: &Source) -> Result<(String, String), EquipError> {
    match source {
        Source::File(path) => {
            let text = env.read(path).map_err(EquipError::Read)?;
            Ok((path.display().to_string(), text))
        }
        Source::Text { name, text } => Ok((name.clone(), text.clone())),
    }
}

/// The OpenAI-compatible provider's configuration at `base_url` with `key`.
fn http_config(base_url: Option<String>, key: Option<String>) -> OpenAiConfig {
    let mut config = OpenAiConfig::new();
    if let Some(url) = base_url {
        config = config.base_url(url);
    }
    if let Some(key) = key {
        config = config.api_key(key);
    }
    config
}

/// The OpenAI-compatible provider, built on its first call ([`Builder::lazy`]).
struct LazyHttp {
    base_url: Option<String>,
    api_key: Option<String>,
    built: OnceLock<Result<Arc<dyn Provider>, ProviderError>>,
}

impl LazyHttp {
    fn provider(&self) -> &Result<Arc<dyn Provider>, ProviderError> {
        self.built.get_or_init(|| {
            let config = http_config(self.base_url.clone(), self.api_key.clone());
            match OpenAiProvider::new(config) {
                Ok(provider) => Ok(Arc::new(provider)),
                // The configuration cannot make a request: the call's request is invalid.
                Err(e) => Err(ProviderError::new(
                    ProviderErrorKind::InvalidRequest,
                    e.to_string(),
                )),
            }
        })
    }
}

impl Provider for LazyHttp {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        match self.provider() {
            Ok(provider) => provider.complete(request, call),
            Err(error) => Box::pin(std::future::ready(Err(error.clone()))),
        }
    }

    fn provider_name(&self, model: &str) -> Option<&'static str> {
        self.provider().as_ref().ok()?.provider_name(model)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::ffi::OsString;
    use std::time::{Duration, Instant};

    use aplc_vm::{Message, Role};

    use super::*;

    /// Variables and files from maps; warnings kept. Never the real environment.
    #[derive(Default)]
    struct Fake {
        vars: HashMap<&'static str, &'static str>,
        files: HashMap<&'static str, &'static str>,
        not_unicode: Vec<&'static str>,
        warnings: RefCell<Vec<Warning>>,
    }

    impl Environment for Fake {
        fn var(&self, name: &str) -> Result<String, VarError> {
            if self.not_unicode.contains(&name) {
                return Err(VarError::NotUnicode(OsString::from("x")));
            }
            self.vars
                .get(name)
                .map(|v| v.to_string())
                .ok_or(VarError::NotPresent)
        }

        fn read(&self, path: &Path) -> std::io::Result<String> {
            let name = path.to_string_lossy();
            match self.files.get(name.as_ref()) {
                Some(text) => Ok(text.to_string()),
                None => Err(std::io::Error::other(format!("cannot read {name}"))),
            }
        }

        fn warn(&self, warning: Warning) {
            self.warnings.borrow_mut().push(warning);
        }
    }

    fn file(path: &str) -> Option<Source> {
        Some(Source::File(PathBuf::from(path)))
    }

    #[test]
    fn mcp_servers_are_refused_unless_the_host_starts_them_and_their_secrets_recorded() {
        let manifest = r#"{"mcpServers": {
            "local": {"command": "srv", "env": {"LOCAL_TOKEN": "local-token-0123456789abcdef"}},
            "remote": {"url": "http://127.0.0.1:9/mcp", "headers_env": {"Authorization": "REMOTE_AUTH"}}
        }}"#;
        let env = Fake {
            vars: HashMap::from([("REMOTE_AUTH", "Bearer remote-secret-0123456789abcdef")]),
            files: HashMap::from([("tools.json", manifest)]),
            ..Fake::default()
        };
        let builder = || {
            Builder::new(Secrets::default())
                .mock(Some(Source::Text {
                    name: "mock".into(),
                    text: "[]".into(),
                }))
                .tools(Some(PathBuf::from("tools.json")))
        };
        let refused = builder().build(&env).err().map(|e| e.to_string());
        assert_eq!(
            refused.as_deref(),
            Some("tools.json: `mcpServers`: MCP servers are not supported here yet (spec/mcp.md)")
        );
        let equipment = builder()
            .mcp(true)
            .build(&env)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(equipment.toolbox.pending_mcp_servers().len(), 2);
        let hidden = equipment.secrets.variables();
        // A server's literal `env` hides nothing from the other children (a `PATH` there
        // must not take aplc's own `PATH` from command tools); its value is redacted.
        assert!(!hidden.iter().any(|v| v == "LOCAL_TOKEN"), "{hidden:?}");
        assert!(hidden.iter().any(|v| v == "REMOTE_AUTH"), "{hidden:?}");
        let text = "local-token-0123456789abcdef and Bearer remote-secret-0123456789abcdef";
        let redacted = equipment.redactor.redact(text);
        assert!(!redacted.contains("0123456789abcdef"), "{redacted}");
    }

    const PROVIDERS: &str = r#"{"routes": [
        {"model": "gpt-*", "kind": "openai", "api_key_env": "ROUTE_KEY",
         "headers_env": {"x-gateway": "GATEWAY_TOKEN"}, "base_url": "http://127.0.0.1:9"},
        {"model": "*", "kind": "mock", "responses": ["hi"]}
    ]}"#;

    #[test]
    fn every_variable_read_is_a_secret() {
        let env = Fake {
            vars: HashMap::from([
                ("ROUTE_KEY", "sk-route-key-0123456789"),
                ("GATEWAY_TOKEN", "gateway-token-9876543210"),
            ]),
            files: HashMap::from([
                ("providers.json", PROVIDERS),
                (
                    "dir/tools.json",
                    r#"{"t": {"command": ["true"], "descriptor": {}}}"#,
                ),
            ]),
            ..Fake::default()
        };
        let equipment = Builder::new(Secrets::default())
            .providers(file("providers.json"))
            .api_key(Some("sk-flag-key-abcdefghij".into()))
            .tools(Some(PathBuf::from("dir/tools.json")))
            .build(&env)
            .unwrap();
        let variables = equipment.secrets.variables();
        assert!(variables.iter().any(|v| v == "ROUTE_KEY"), "{variables:?}");
        assert!(
            variables.iter().any(|v| v == "GATEWAY_TOKEN"),
            "{variables:?}"
        );
        let text = "sk-route-key-0123456789 gateway-token-9876543210 sk-flag-key-abcdefghij";
        assert_eq!(
            equipment.redactor.redact(text),
            "<redacted> <redacted> <redacted>"
        );
        assert_eq!(
            equipment.toolbox.registry().names().collect::<Vec<_>>(),
            ["t"]
        );
        assert!(!equipment.no_key && equipment.scripted.is_none());
        // The key flag goes unused with a providers file: the host hears of it.
        assert_eq!(*env.warnings.borrow(), [Warning::HttpSettingsWithProviders]);
    }

    #[test]
    fn errors_name_the_file_the_route_and_the_key() {
        let env = Fake {
            files: HashMap::from([("providers.json", PROVIDERS), ("mock.json", "[3]")]),
            ..Fake::default()
        };
        let error = Builder::default()
            .providers(file("providers.json"))
            .build(&env)
            .unwrap_err();
        let EquipError::Providers { name, error } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(name, "providers.json");
        assert!(
            matches!(
                &**error,
                RoutingError::Route {
                    index: 0,
                    error: crate::routing::RouteError::VariableNotSet { variable, key },
                } if variable == "ROUTE_KEY" && key == "api_key_env"
            ),
            "{error:?}"
        );
        let both = Builder::default()
            .providers(file("providers.json"))
            .mock(file("mock.json"))
            .build(&env);
        assert!(matches!(both, Err(EquipError::MockAndProviders)));
        let mock = Builder::default().mock(file("mock.json")).build(&env);
        let message = mock.map(|_| ()).unwrap_err().to_string();
        assert!(
            message.starts_with("mock.json: mock entry 0: "),
            "{message}"
        );
        let missing = Builder::default()
            .tools(Some("nope.json".into()))
            .build(&env);
        assert_eq!(
            missing.map(|_| ()).unwrap_err().to_string(),
            "cannot read nope.json"
        );
    }

    #[test]
    fn the_http_provider_takes_the_flag_key_else_the_variable() {
        let with = |vars: &[(&'static str, &'static str)], key: Option<&str>, url: Option<&str>| {
            let env = Fake {
                vars: vars.iter().copied().collect(),
                ..Fake::default()
            };
            let equipment = Builder::default()
                .api_key(key.map(str::to_owned))
                .base_url(url.map(str::to_owned))
                .build(&env)
                .unwrap();
            equipment.no_key
        };
        let variable = [("OPENAI_API_KEY", "sk-env-0123456789")];
        assert!(with(&[], None, None), "no key anywhere");
        assert!(!with(&variable, None, None));
        assert!(!with(&[], Some("sk-flag"), None));
        // A blank flag is no key, and does not fall back to the variable.
        assert!(with(&variable, Some("  "), None));
        // A base URL (a local server) needs no key.
        assert!(!with(&[], None, Some("http://127.0.0.1:9")));

        let env = Fake {
            not_unicode: vec!["OPENAI_API_KEY"],
            ..Fake::default()
        };
        let equipment = Builder::default().build(&env).unwrap();
        assert!(equipment.no_key);
        assert_eq!(*env.warnings.borrow(), [Warning::KeyNotUnicode]);
    }

    #[test]
    fn the_builder_never_shows_the_key() {
        let builder = Builder::default()
            .api_key(Some("sk-debug-0123456789".into()))
            .base_url(Some("http://127.0.0.1:9/v1?key=sk-url-0123456789".into()));
        let debug = format!("{builder:?}");
        assert!(!debug.contains("sk-debug"), "{debug}");
        assert!(!debug.contains("sk-url"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn mock_answers_are_shared_and_stream_on_request() {
        let env = Fake {
            files: HashMap::from([("mock.json", r#"["one", "two"]"#)]),
            ..Fake::default()
        };
        let equipment = Builder::default()
            .mock(file("mock.json"))
            .base_url(Some("http://127.0.0.1:9".into()))
            .stream(true)
            .build(&env)
            .unwrap();
        assert!(equipment.scripted.is_some());
        assert!(!equipment.no_key);
        assert_eq!(*env.warnings.borrow(), [Warning::HttpSettingsWithMock]);
    }

    #[tokio::test]
    async fn a_lazy_http_provider_fails_its_first_call_not_the_build() {
        let env = Fake::default();
        let eager = Builder::default()
            .base_url(Some("ftp://h".into()))
            .build(&env);
        assert!(
            matches!(
                eager,
                Err(EquipError::Provider(ConfigError::BaseUrl { .. }))
            ),
            "{eager:?}"
        );
        let lazy = Builder::default()
            .base_url(Some("ftp://h".into()))
            .lazy(true)
            .build(&env)
            .unwrap();
        let request = ProviderRequest::new("gpt-4o", vec![Message::text(Role::User, "hi")]);
        let call = CallContext::new(Instant::now() + Duration::from_secs(60));
        let error = lazy.provider.complete(&request, &call).await.unwrap_err();
        assert_eq!(error.kind, ProviderErrorKind::InvalidRequest);
        assert_eq!(
            error.message,
            "invalid base URL `ftp://h`: expected an http:// or https:// URL"
        );
    }
}
