//! The server's provider and tools, from its own files and environment: a request can set
//! neither.
//!
//! A providers file (spec/providers.md) routes models to providers, reading each route's
//! key from the variable it names; without one, the OpenAI API with `OPENAI_API_KEY`.
//! Every variable read for a key is a secret, as are the tokens, the store's password and
//! the environment's secrets ([`Secrets`]): their values are redacted from what runs
//! journal (errors, events, outcomes) and command tools do not inherit the variables.

use std::path::Path;
use std::sync::Arc;

use aplc_runtime::Secrets;
use aplc_runtime::driver::{Provider, Toolbox};
use aplc_runtime::durable::DurableOptions;
use aplc_runtime::http::HttpClient;
use aplc_runtime::openai::{OpenAiConfig, OpenAiProvider};
use aplc_runtime::routing::Router;

use crate::ServeError;

/// What every run of the server uses.
pub(crate) struct Equipment {
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) toolbox: Arc<Toolbox>,
    /// Journaling options, with the redactor of every secret.
    pub(crate) durable: DurableOptions,
}

impl Equipment {
    /// The provider and tools of `providers` and `tools`. `secrets` holds every secret the
    /// server knows besides those (the environment's, the tokens, the store's password);
    /// the variables the providers file reads are added to it.
    pub(crate) fn load(
        providers: Option<&Path>,
        tools: Option<&Path>,
        mut secrets: Secrets,
    ) -> Result<Self, ServeError> {
        let config = |message: String| ServeError::Config(message);
        let http = HttpClient::new().map_err(config)?;
        let provider: Arc<dyn Provider> = match providers {
            Some(path) => {
                let text = read(path)?;
                let router = secrets
                    .reading(|env| Router::from_config_json_with_client(&text, env, &http))
                    .map_err(|e| config(format!("{}: {e}", path.display())))?;
                Arc::new(router)
            }
            None => {
                let mut openai = OpenAiConfig::new().http_client(http.clone());
                if let Some(key) = std::env::var("OPENAI_API_KEY")
                    .ok()
                    .filter(|k| !k.trim().is_empty())
                {
                    openai = openai.api_key(key);
                } else {
                    tracing::warn!(
                        "no OPENAI_API_KEY and no --providers file: provider calls will fail"
                    );
                }
                Arc::new(OpenAiProvider::new(openai).map_err(config)?)
            }
        };
        let redactor = secrets.redactor();
        let mut toolbox = match tools {
            Some(path) => {
                let text = read(path)?;
                let base = path.parent().unwrap_or(Path::new("."));
                aplc_runtime::manifest::toolbox_from_manifest_with_client(
                    &text,
                    base,
                    &http,
                    secrets.variables(),
                )
                .map_err(|e| config(format!("{}: {e}", path.display())))?
            }
            None => Toolbox::new(),
        };
        toolbox.redact_with(redactor.clone());
        let mut durable = DurableOptions::default();
        durable.redactor = redactor;
        Ok(Equipment {
            provider,
            toolbox: Arc::new(toolbox),
            durable,
        })
    }
}

/// The CLI's bounded reader: a providers or tools file is config, never gigabytes.
fn read(path: &Path) -> Result<String, ServeError> {
    aplc_runtime::files::read_text(path).map_err(ServeError::Config)
}
