//! The streamable-HTTP transport (feature `mcp`): connecting to a server declared with
//! `url`, sending the headers `headers_env` names, and initializing the session. The rest
//! is the stdio servers' own: listing in `listing.rs`; offering, calling, mapping results
//! and stopping in `client.rs`.
//!
//! Header values are secrets (`spec/mcp.md`): they are read from their variables here,
//! when the server starts, marked sensitive for the HTTP stack, and never formatted into a
//! message; every message is redacted with the run's redactor, which knows them
//! (`equip.rs` records them when the manifest is read).

use std::collections::HashMap;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::service::{ClientInitializeError, ServiceError};
use rmcp::transport::DynamicTransportError;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use serde_json::Value as Json;

use super::progress::Service;
use super::{McpError, McpServer};
use crate::http::HttpClient;
use crate::redact::Redactor;

/// Connects to the server at `url` with the headers of `headers_env`, initializes the
/// session and lists its tools, all within the server's `startup_timeout`. A variable
/// that is not set (or not a header value) is an error naming the server, the header and
/// the variable.
pub(super) async fn connect(
    server: &McpServer,
    url: &str,
    headers_env: &[(String, String)],
    redactor: &Redactor,
) -> Result<(Service, Vec<Json>), McpError> {
    let fail = |message: String| McpError::Start {
        server: server.name.clone(),
        message: redactor.redact(&message),
    };
    let headers = headers(server, headers_env, &|name| std::env::var_os(name))?;
    let client = HttpClient::for_mcp().map_err(|e| fail(e.to_string()))?;
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    let transport = StreamableHttpClientTransport::with_client(client, config);
    let startup = async {
        let service = super::progress::Client::default()
            .serve(transport)
            .await
            .map_err(|e| format!("did not initialize: {}", initialize_error(&e)))?;
        let tools = super::listing::list_tools(&service).await?;
        Ok::<_, String>((service, tools))
    };
    // Dropping the unfinished handshake drops the transport: its worker ends, and with it
    // the session's requests.
    match tokio::time::timeout(server.startup_timeout, startup).await {
        Ok(Ok(started)) => Ok(started),
        Ok(Err(message)) => Err(fail(message)),
        Err(_) => Err(fail(format!(
            "did not initialize and list its tools within {} ms (`startup_timeout_ms`)",
            server.startup_timeout.as_millis()
        ))),
    }
}

/// Why the handshake failed, readable (see [`transport_error`]).
fn initialize_error(error: &ClientInitializeError) -> String {
    match error {
        ClientInitializeError::TransportError { error, .. } => transport_error(error),
        error => error.to_string(),
    }
}

/// Why a call failed, readable: a transport's error as [`transport_error`] says it.
pub(super) fn call_error(error: &ServiceError) -> String {
    match error {
        ServiceError::TransportSend(error) => transport_error(error),
        error => error.to_string(),
    }
}

/// A transport's error with its causes (`Auth required`, `could not connect: …:
/// Connection refused`), in place of rmcp's message, which names the transport's Rust
/// type.
fn transport_error(error: &DynamicTransportError) -> String {
    // reqwest's error is kept by rmcp without being its source: its causes come from our
    // own reading of it.
    if let Some(StreamableHttpError::Client(e)) = error
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        return crate::http::error_text(e);
    }
    let mut text = error.error.to_string();
    let mut cause = std::error::Error::source(&*error.error);
    while let Some(current) = cause {
        let more = current.to_string();
        if !more.is_empty() && !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = current.source();
    }
    text
}

/// The headers of `headers_env`, each value read from its variable through `var`, marked
/// sensitive (HTTP/2 never indexes it; `Debug` hides it).
pub(super) fn headers(
    server: &McpServer,
    headers_env: &[(String, String)],
    var: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<HashMap<HeaderName, HeaderValue>, McpError> {
    let problem = |header: &str, variable: &str, problem: &'static str| McpError::Header {
        server: server.name.clone(),
        header: header.to_owned(),
        variable: variable.to_owned(),
        problem,
    };
    let mut headers = HashMap::new();
    for (header, variable) in headers_env {
        let value = var(variable).ok_or_else(|| problem(header, variable, "is not set"))?;
        let value = value
            .into_string()
            .map_err(|_| problem(header, variable, "is not valid Unicode"))?;
        let mut value = HeaderValue::from_str(value.trim()).map_err(|_| {
            problem(
                header,
                variable,
                "is not a valid HTTP header value (it holds a line break or another control \
                 character)",
            )
        })?;
        value.set_sensitive(true);
        // The manifest's check made sure the name is one (`parse_server`).
        let name = HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| problem(header, variable, "is for an invalid header name"))?;
        headers.insert(name, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn remote() -> McpServer {
        let manifest = r#"{"mcpServers": {"remote": {"url": "http://127.0.0.1:9/mcp",
            "headers_env": {"Authorization": "REMOTE_AUTH", "x-team": "TEAM"}}}}"#;
        crate::manifest::mcp_servers(manifest)
            .ok()
            .and_then(|mut servers| servers.pop())
            .unwrap_or_else(|| panic!("the manifest parses"))
    }

    fn headers_from(env: &[(&str, &[u8])]) -> Result<HashMap<HeaderName, HeaderValue>, McpError> {
        let server = remote();
        let super::super::McpTransport::Http { headers_env, .. } = &server.transport else {
            panic!("an HTTP server");
        };
        let lookup = |name: &str| {
            env.iter().find(|(n, _)| *n == name).map(|(_, value)| {
                use std::os::unix::ffi::OsStringExt;
                OsString::from_vec(value.to_vec())
            })
        };
        headers(&server, headers_env, &lookup)
    }

    #[test]
    #[cfg(unix)]
    fn header_values_come_from_their_variables_and_are_sensitive() {
        let secret = "Bearer tok-0123456789abcdef";
        let headers = headers_from(&[("REMOTE_AUTH", secret.as_bytes()), ("TEAM", b"blue")])
            .unwrap_or_else(|e| panic!("{e}"));
        let auth = &headers[&HeaderName::from_static("authorization")];
        assert_eq!(auth.as_bytes(), secret.as_bytes());
        assert!(auth.is_sensitive());
        assert!(!format!("{headers:?}").contains("tok-0123"));
        assert_eq!(headers[&HeaderName::from_static("x-team")], "blue");
    }

    #[test]
    #[cfg(unix)]
    fn a_missing_or_unusable_variable_is_named_never_its_value() {
        let message = |env: &[(&str, &[u8])]| match headers_from(env) {
            Ok(_) => "accepted".to_string(),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            message(&[("TEAM", b"blue")]),
            "MCP server `remote`: `headers_env`: the variable `REMOTE_AUTH` (header \
             `Authorization`) is not set"
        );
        let broken = message(&[("REMOTE_AUTH", b"Bearer sekrit-123456\nx"), ("TEAM", b"b")]);
        assert!(broken.contains("`REMOTE_AUTH`"), "{broken}");
        assert!(broken.contains("not a valid HTTP header value"), "{broken}");
        assert!(!broken.contains("sekrit"), "{broken}");
        let binary = message(&[("REMOTE_AUTH", b"\xff\xfe"), ("TEAM", b"b")]);
        assert!(binary.ends_with("is not valid Unicode"), "{binary}");
        // A variable's problem is the manifest's (exit 2), as a provider's missing key.
        assert!(headers_from(&[]).is_err_and(|e| e.is_manifest_error()));
    }
}
