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

use aplc_vm::{Completion, ProviderError, ProviderErrorKind, ProviderRequest, ScriptedProvider};

use crate::driver::{BoxFuture, CallContext, Provider, Scripted, Toolbox};
use crate::http::{HttpClient, HttpClientError};
use crate::manifest::ManifestError;
use crate::openai::{ConfigError, OpenAiConfig, OpenAiProvider};
use crate::redact::Redactor;
use crate::routing::{ProvidersConfig, RoutingError};
use crate::secrets::Secrets;

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
    #[error("{name}: {message}")]
    Mock {
        /// The file.
        name: String,
        /// What is wrong (`mock entry 3: …`).
        message: String,
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
/// api.openai.com) with the API key, else `OPENAI_API_KEY`.
#[derive(Debug, Default)]
pub struct Builder {
    secrets: Secrets,
    providers: Option<Source>,
    mock: Option<Source>,
    base_url: Option<String>,
    api_key: Option<String>,
    tools: Option<PathBuf>,
    stream: bool,
    lazy: bool,
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

    /// Builds the equipment, reading variables and files through `env`.
    pub fn build(self, env: &dyn Environment) -> Result<Equipment, EquipError> {
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
        let mut secrets = self.secrets.clone();
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
        let toolbox = self.toolbox(env, http.as_ref(), &secrets)?;
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
                .map_err(|message| EquipError::Mock { name, message })?;
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
        secrets: &Secrets,
    ) -> Result<Toolbox, EquipError> {
        let mut toolbox = match &self.tools {
            Some(path) => {
                let text = env.read(path).map_err(EquipError::Read)?;
                let base = path.parent().unwrap_or(Path::new("."));
                let hidden = secrets.variables();
                match http {
                    Some(http) => crate::manifest::toolbox_from_manifest_with_client(
                        &text, base, http, hidden,
                    ),
                    None => crate::manifest::toolbox_from_manifest(&text, base, hidden),
                }
                .map_err(|error| EquipError::Tools {
                    name: path.display().to_string(),
                    error: Box::new(error),
                })?
            }
            None => Toolbox::new(),
        };
        toolbox.redact_with(secrets.redactor());
        Ok(toolbox)
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
