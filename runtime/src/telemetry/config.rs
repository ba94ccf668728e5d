//! Telemetry configuration from the standard OpenTelemetry environment variables and the
//! CLI's flags (spec/telemetry.md, "Configuration").
//!
//! Not in here: reading the process environment. The caller passes a lookup in, as
//! `HttpClient::with_env` and the providers file do, so tests never touch the real one.

use std::fmt;

use super::TelemetryError;

/// Where and how a process exports its runs' telemetry.
#[derive(Clone)]
pub struct TelemetryConfig {
    /// The full URL spans are POSTed to (`…/v1/traces`).
    pub traces_endpoint: String,
    /// The full URL metrics are POSTed to (`…/v1/metrics`); `None` with
    /// `OTEL_METRICS_EXPORTER=none` (for a backend that takes only traces).
    pub metrics_endpoint: Option<String>,
    /// Headers sent with every export (`OTEL_EXPORTER_OTLP_HEADERS`). The values are
    /// secrets (collector tokens): `Debug` never shows them, and no message names them.
    pub headers: Vec<(String, String)>,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Record prompts and completions on the `chat` spans (opt-in).
    pub capture_content: bool,
}

impl fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("TelemetryConfig")
            .field("traces_endpoint", &self.traces_endpoint)
            .field("metrics_endpoint", &self.metrics_endpoint)
            .field("header_names", &header_names)
            .field("service_name", &self.service_name)
            .field("capture_content", &self.capture_content)
            .finish()
    }
}

/// The OTLP/HTTP endpoint when none is configured (the OTLP specification's default).
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";
/// The `service.name` when `OTEL_SERVICE_NAME` is unset.
pub const DEFAULT_SERVICE_NAME: &str = "aplc";

/// The switches a command line adds to the environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct TelemetryFlags {
    /// Export even without an endpoint variable (to [`DEFAULT_ENDPOINT`]).
    pub otel: bool,
    /// Record message content, as `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.
    pub capture_content: bool,
}

/// What the environment and the flags ask for: a configuration (`None`: export is off)
/// and warnings about values that were ignored, for the caller to print.
#[derive(Debug)]
pub struct Resolved {
    /// The configuration; `None` when export is off.
    pub config: Option<TelemetryConfig>,
    /// Ignored settings, one sentence each; never a header value.
    pub warnings: Vec<String>,
}

impl TelemetryConfig {
    /// Reads the configuration: export is on when `flags.otel` is set or an endpoint
    /// variable is, unless `OTEL_SDK_DISABLED=true`. A malformed endpoint or header list
    /// is an error naming the variable (never a header's value).
    pub fn resolve(
        env: &dyn Fn(&str) -> Option<String>,
        flags: TelemetryFlags,
    ) -> Result<Resolved, TelemetryError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let mut warnings = Vec::new();
        let endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT");
        let traces = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let metrics = var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
        let wanted = flags.otel || endpoint.is_some() || traces.is_some();
        if truthy(
            var("OTEL_SDK_DISABLED").as_deref(),
            "OTEL_SDK_DISABLED",
            &mut warnings,
        ) {
            if flags.otel {
                warnings.push("--otel is ignored: OTEL_SDK_DISABLED is true".to_owned());
            }
            return Ok(Resolved {
                config: None,
                warnings,
            });
        }
        if !wanted {
            return Ok(Resolved {
                config: None,
                warnings,
            });
        }
        if let Some(protocol) = var("OTEL_EXPORTER_OTLP_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
            .filter(|p| p.trim() != "http/protobuf")
        {
            warnings.push(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL `{}` is not supported; exporting over http/protobuf",
                protocol.trim()
            ));
        }
        let base = match &endpoint {
            Some(url) => checked_url("OTEL_EXPORTER_OTLP_ENDPOINT", url)?,
            None => DEFAULT_ENDPOINT.to_owned(),
        };
        let base = base.trim_end_matches('/');
        let traces_endpoint = match &traces {
            Some(url) => checked_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)?,
            None => format!("{base}/v1/traces"),
        };
        let metrics_endpoint = match (
            var("OTEL_METRICS_EXPORTER").as_deref().map(str::trim),
            &metrics,
        ) {
            (Some("none"), _) => None,
            (Some("otlp") | None, Some(url)) => {
                Some(checked_url("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", url)?)
            }
            (Some("otlp") | None, None) => Some(format!("{base}/v1/metrics")),
            (Some(other), _) => {
                return Err(TelemetryError::Variable {
                    variable: "OTEL_METRICS_EXPORTER",
                    problem: format!(
                        "is `{other}`: aplc exports metrics with `otlp` or not at all (`none`)"
                    ),
                });
            }
        };
        let headers = match var("OTEL_EXPORTER_OTLP_HEADERS") {
            Some(list) => parse_headers("OTEL_EXPORTER_OTLP_HEADERS", &list)?,
            None => Vec::new(),
        };
        let service_name = var("OTEL_SERVICE_NAME")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
        let capture_content = flags.capture_content
            || truthy(
                var("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT").as_deref(),
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
                &mut warnings,
            );
        Ok(Resolved {
            config: Some(TelemetryConfig {
                traces_endpoint,
                metrics_endpoint,
                headers,
                service_name,
                capture_content,
            }),
            warnings,
        })
    }
}

/// `true`/`false` in any case; anything else is false, with a warning.
fn truthy(value: Option<&str>, name: &str, warnings: &mut Vec<String>) -> bool {
    match value.map(str::trim) {
        None => false,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(v) => {
            warnings.push(format!(
                "{name} is `{v}`, not `true` or `false`; taking it as false"
            ));
            false
        }
    }
}

/// `url`, trimmed, if it is an absolute `http` or `https` URL with a host. The message
/// names the variable but not the value: a URL may carry credentials.
fn checked_url(name: &'static str, url: &str) -> Result<String, TelemetryError> {
    let bad = |problem: String| TelemetryError::Variable {
        variable: name,
        problem,
    };
    let url = url.trim();
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(format!("is not a valid URL ({e})")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(format!(
            "must be an http:// or https:// URL (OTLP over HTTP), not {}://",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("has no host".into()));
    }
    Ok(url.to_owned())
}

/// The W3C Baggage-style list `k=v,k2=v2` of `OTEL_EXPORTER_OTLP_HEADERS`, percent-decoded.
/// Errors name the entry by position and its key, never a value.
fn parse_headers(name: &'static str, list: &str) -> Result<Vec<(String, String)>, TelemetryError> {
    let mut headers = Vec::new();
    for (index, entry) in list.split(',').enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let position = index + 1;
        let bad = |problem: String| TelemetryError::HeaderEntry {
            variable: name,
            entry: position,
            problem,
        };
        let Some((key, value)) = entry.split_once('=') else {
            return Err(bad(format!("entry {position} is not `key=value`")));
        };
        let key = percent_decode(key.trim())
            .ok_or_else(|| bad(format!("entry {position} has a malformed %-escape")))?;
        let value = percent_decode(value.trim()).ok_or_else(|| {
            bad(format!(
                "the value of `{key}` (entry {position}) has a malformed %-escape"
            ))
        })?;
        if http::HeaderName::from_bytes(key.as_bytes()).is_err() {
            return Err(bad(format!(
                "entry {position} does not have a valid header name"
            )));
        }
        if http::HeaderValue::from_str(&value).is_err() {
            return Err(bad(format!(
                "the value of `{key}` (entry {position}) is not a valid header value"
            )));
        }
        headers.push((key, value));
    }
    Ok(headers)
}

/// Decodes `%XX` escapes; `None` for a `%` not followed by two hex digits, or bytes that
/// are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    fn resolve(pairs: &'static [(&'static str, &'static str)], otel: bool) -> Resolved {
        let flags = TelemetryFlags {
            otel,
            capture_content: false,
        };
        match TelemetryConfig::resolve(&env_of(pairs), flags) {
            Ok(resolved) => resolved,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    #[test]
    fn off_without_a_flag_or_an_endpoint() {
        assert!(
            resolve(&[("OTEL_SERVICE_NAME", "x")], false)
                .config
                .is_none()
        );
    }

    #[test]
    fn the_flag_alone_exports_to_the_default_endpoint() {
        let config = resolve(&[], true).config.unwrap();
        assert_eq!(config.traces_endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(
            config.metrics_endpoint.as_deref(),
            Some("http://localhost:4318/v1/metrics")
        );
        assert_eq!(config.service_name, "aplc");
        assert!(!config.capture_content);
    }

    #[test]
    fn the_general_endpoint_gets_paths_and_the_signal_one_is_used_as_is() {
        let config = resolve(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/custom"),
                ("OTEL_SERVICE_NAME", "svc"),
                ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "TRUE"),
            ],
            false,
        )
        .config
        .unwrap();
        assert_eq!(config.traces_endpoint, "http://t:1/custom");
        assert_eq!(
            config.metrics_endpoint.as_deref(),
            Some("http://collector:4318/v1/metrics")
        );
        assert_eq!(config.service_name, "svc");
        assert!(config.capture_content);
    }

    #[test]
    fn metrics_can_be_turned_off() {
        let config = resolve(&[("OTEL_METRICS_EXPORTER", "none")], true)
            .config
            .unwrap();
        assert!(config.metrics_endpoint.is_none());
        let env = |name: &str| (name == "OTEL_METRICS_EXPORTER").then(|| "prometheus".to_owned());
        let flags = TelemetryFlags {
            otel: true,
            capture_content: false,
        };
        assert!(TelemetryConfig::resolve(&env, flags).is_err());
    }

    #[test]
    fn disabled_wins_over_everything() {
        let resolved = resolve(
            &[
                ("OTEL_SDK_DISABLED", "true"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ],
            true,
        );
        assert!(resolved.config.is_none());
        assert_eq!(resolved.warnings.len(), 1);
    }

    #[test]
    fn headers_are_decoded_and_their_values_never_named() {
        let config = resolve(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s%3Dcret, x-b = two "),
            ],
            false,
        )
        .config
        .unwrap();
        assert_eq!(
            config.headers,
            vec![
                ("api-key".to_owned(), "s=cret".to_owned()),
                ("x-b".to_owned(), "two".to_owned())
            ]
        );
        assert!(!format!("{config:?}").contains("s=cret"));
        for bad in ["novalue", "k=%zz", "bad key=v", "k=a\nb"] {
            let env = move |name: &str| match name {
                "OTEL_EXPORTER_OTLP_HEADERS" => Some(format!("ok=fine,{bad}")),
                _ => None,
            };
            let flags = TelemetryFlags {
                otel: true,
                capture_content: false,
            };
            let error = TelemetryConfig::resolve(&env, flags)
                .unwrap_err()
                .to_string();
            assert!(error.contains("entry 2"), "{error}");
            assert!(!error.contains("fine"), "{error}");
        }
    }

    #[test]
    fn bad_endpoints_and_values_are_reported() {
        for url in ["not a url", "ftp://c:21", "grpc://c:4317"] {
            let env =
                move |name: &str| (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| url.to_owned());
            let error = TelemetryConfig::resolve(&env, TelemetryFlags::default())
                .unwrap_err()
                .to_string();
            assert!(error.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT"), "{error}");
        }
        let resolved = resolve(
            &[
                ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "yes"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            true,
        );
        assert!(!resolved.config.unwrap().capture_content);
        assert_eq!(resolved.warnings.len(), 2, "{:?}", resolved.warnings);
    }
}
