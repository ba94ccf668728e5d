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
use aplc_runtime::equip::{Builder, ProcessEnvironment, Source};

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
        secrets: Secrets,
    ) -> Result<Self, ServeError> {
        let equipment = Builder::new(secrets)
            .providers(providers.map(|path| Source::File(path.to_owned())))
            .tools(tools.map(Path::to_owned))
            .build(&ProcessEnvironment)
            .map_err(|e| ServeError::Config(e.to_string()))?;
        if equipment.no_key {
            tracing::warn!("no OPENAI_API_KEY and no --providers file: provider calls will fail");
        }
        let mut durable = DurableOptions::default();
        durable.redactor = equipment.redactor;
        Ok(Equipment {
            provider: equipment.provider,
            toolbox: Arc::new(equipment.toolbox),
            durable,
        })
    }
}
