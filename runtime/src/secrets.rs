//! The one list of what aplc treats as a secret (`spec/limits.md`, "Secrets and
//! redaction"; `spec/tools.md`, "Tools and secrets").
//!
//! A [`Secrets`] holds the environment variables that hold secrets and the secret values
//! themselves. Command tools run without any of those variables ([`Secrets::variables`],
//! for [`crate::manifest::toolbox_from_manifest`]), and every value is redacted
//! ([`Secrets::redactor`]) from tool results and errors, events, journals, API answers and
//! spans. The CLI, `aplc serve` and the Python package all start from
//! [`Secrets::from_env`] and add what their flags and files name: `--api-key`, serve
//! tokens, a `--store` URL, the variables a providers file reads (recorded by
//! [`crate::equip::Builder`], the one place that reads them), and later the
//! `env`/`headers_env` values of MCP servers ([`Secrets::variable`]).

use crate::redact::Redactor;
use crate::store::url_secrets;

/// The variables that hold a secret whatever this process does with them: a tool never
/// inherits them, and their values (as [`Secrets::from_lookup`] splits them) are redacted.
pub const SECRET_VARIABLES: &[&str] = &[
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "APLC_SERVE_TOKENS",
    "APLC_STORE",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
];

/// Secret variables and values. `Debug` names the variables and counts the values.
#[derive(Clone, Default)]
pub struct Secrets {
    variables: Vec<String>,
    values: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("variables", &self.variables)
            .field("values", &self.values.len())
            .finish()
    }
}

impl Secrets {
    /// [`SECRET_VARIABLES`] and their values in this process's environment.
    pub fn from_env() -> Secrets {
        Secrets::from_lookup(&|name| std::env::var(name).ok())
    }

    /// [`SECRET_VARIABLES`] and their values from `env`. Each value is split into what it
    /// carries: the tokens of `APLC_SERVE_TOKENS`, the password of an `APLC_STORE` URL,
    /// each header value of the OTLP header lists; a key is secret whole.
    pub fn from_lookup(env: &dyn Fn(&str) -> Option<String>) -> Secrets {
        let mut secrets = Secrets::default();
        for &name in SECRET_VARIABLES {
            secrets.hide(name);
            let Some(value) = env(name) else { continue };
            match name {
                "APLC_SERVE_TOKENS" => secrets.values(value.split(',')),
                "APLC_STORE" => secrets.store_url(&value),
                "OPENAI_API_KEY" | "ANTHROPIC_API_KEY" => secrets.value(&value),
                _ => secrets.header_list(&value),
            }
        }
        secrets
    }

    /// A variable that holds (or would hold) a secret, and its value if it is set: a
    /// providers file's `api_key_env` and `headers_env`, an MCP server's `headers_env`.
    pub fn variable(&mut self, name: &str, value: Option<String>) {
        self.hide(name);
        if let Some(value) = value {
            self.value(&value);
        }
    }

    /// A secret value that no variable of ours holds (`--api-key`, a token file's token).
    pub fn value(&mut self, value: &str) {
        let value = value.trim();
        if !value.is_empty() && !self.values.iter().any(|v| v == value) {
            self.values.push(value.to_owned());
        }
    }

    /// Each of `values`, as by [`Secrets::value`].
    pub fn values<'a>(&mut self, values: impl IntoIterator<Item = &'a str>) {
        values.into_iter().for_each(|v| self.value(v));
    }

    /// The password of a store URL (`postgres://user:PASS@…` or `?password=PASS`), as
    /// written and percent-decoded; a `sqlite:` path holds none.
    pub fn store_url(&mut self, url: &str) {
        if url.trim_start().starts_with("sqlite:") {
            return;
        }
        for secret in url_secrets(url) {
            self.value(&secret);
        }
    }

    /// The variables command tools must not inherit.
    pub fn variables(&self) -> &[String] {
        &self.variables
    }

    /// A redactor for every value.
    pub fn redactor(&self) -> Redactor {
        Redactor::new(self.values.iter().map(String::as_str))
    }

    fn hide(&mut self, name: &str) {
        if !self.variables.iter().any(|v| v == name) {
            self.variables.push(name.to_owned());
        }
    }

    /// The values of an OTLP header list `k=v,k2=v2`, as written and percent-decoded (as
    /// sent). Malformed entries count whole: telemetry refuses them, but they may still be
    /// secrets.
    fn header_list(&mut self, list: &str) {
        for entry in list.split(',') {
            let value = entry.split_once('=').map_or(entry, |(_, value)| value);
            self.value(value);
            self.value(&crate::store::percent_decode(value.trim()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_secret_variable_is_hidden_and_its_values_redacted() {
        let env = |name: &str| {
            Some(match name {
                "OPENAI_API_KEY" => "sk-openai-0123456789".to_owned(),
                "APLC_SERVE_TOKENS" => "token-one-abcdef, token-two-ghijkl".to_owned(),
                "APLC_STORE" => "postgres://u:hunter2hunter2@127.0.0.1/x".to_owned(),
                "OTEL_EXPORTER_OTLP_HEADERS" => {
                    "x-tenant=acme,authorization=Bearer%20sekrit-otlp-42".to_owned()
                }
                _ => return None,
            })
        };
        let secrets = Secrets::from_lookup(&env);
        assert_eq!(secrets.variables(), SECRET_VARIABLES);
        let text = "sk-openai-0123456789 token-one-abcdef token-two-ghijkl hunter2hunter2 \
                    sekrit-otlp-42 x-tenant=acme u@127.0.0.1";
        assert_eq!(
            secrets.redactor().redact(text),
            "<redacted> <redacted> <redacted> <redacted> <redacted> x-tenant=acme u@127.0.0.1"
        );
        assert!(!format!("{secrets:?}").contains("hunter2"));
    }

    #[test]
    fn a_sqlite_store_and_flags_add_what_they_hold() {
        let mut secrets = Secrets::from_lookup(&|_| None);
        secrets.store_url("sqlite:/tmp/a:b@c/runs.db");
        assert!(secrets.redactor().is_empty());
        secrets.store_url("postgresql://me@db/x?sslmode=require&password=p%40ssword-99");
        secrets.variable("MCP_TOKEN", Some("mcp-token-value-1".into()));
        let redactor = secrets.redactor();
        assert_eq!(
            redactor.redact("p@ssword-99 p%40ssword-99 mcp-token-value-1"),
            "<redacted> <redacted> <redacted>"
        );
        assert!(secrets.variables().iter().any(|v| v == "MCP_TOKEN"));
    }
}
