use serde_json::json;

use super::*;
use crate::manifest::{ManifestError, mcp_servers, toolbox_from_manifest};

fn one(server: Json) -> Result<McpServer, String> {
    parse_servers(json!({ "s": server }))
        .map(|mut servers| servers.remove(0))
        .map_err(|(name, error)| format!("{name:?}: {error}"))
}

fn error(server: Json) -> String {
    one(server).err().unwrap_or_else(|| "accepted".into())
}

#[test]
fn a_stdio_server_with_defaults() {
    let server = one(json!({"command": "python3", "args": ["-m", "x"], "env": {"X": "1"}}));
    assert_eq!(
        server,
        Ok(McpServer {
            name: "s".into(),
            transport: McpTransport::Stdio {
                command: "python3".into(),
                args: vec!["-m".into(), "x".into()],
                env: vec![("X".into(), "1".into())],
            },
            tools: None,
            prefix: String::new(),
            timeout: DEFAULT_CALL_TIMEOUT,
            idempotent: IdempotentTools::FromAnnotations,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            approval: ApprovalTools::None,
            approval_timeout: None,
        })
    );
}

#[test]
fn approval_takes_required_or_tool_names() {
    let all = one(json!({"command": "x", "approval": "required", "approval_timeout_ms": 5}));
    let all = all.map(|s| (s.approval, s.approval_timeout));
    assert_eq!(
        all,
        Ok((
            ApprovalTools::All,
            Some(std::time::Duration::from_millis(5))
        ))
    );
    let listed = one(json!({"command": "x", "approval": ["rm"]})).map(|s| s.approval);
    assert_eq!(listed, Ok(ApprovalTools::Listed(vec!["rm".into()])));
    for bad in [
        json!({"command": "x", "approval": "always"}),
        json!({"command": "x", "approval_timeout_ms": 5}),
        json!({"command": "x", "approval": "required", "approval_timeout_ms": 0}),
    ] {
        assert!(one(bad).is_err());
    }
}

#[test]
fn every_optional_key() {
    let server = one(json!({
        "url": "http://127.0.0.1:9000/mcp", "headers_env": {"Authorization": "REMOTE_AUTH"},
        "tools": ["a"], "prefix": "r_", "timeout_ms": 5, "idempotent": ["a"],
        "startup_timeout_ms": 7,
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        server.transport,
        McpTransport::Http {
            url: "http://127.0.0.1:9000/mcp".into(),
            headers_env: vec![("Authorization".into(), "REMOTE_AUTH".into())],
        }
    );
    assert_eq!(server.tools, Some(vec!["a".to_string()]));
    assert_eq!(server.prefix, "r_");
    assert_eq!(server.timeout, Duration::from_millis(5));
    assert_eq!(server.startup_timeout, Duration::from_millis(7));
    assert_eq!(server.idempotent, IdempotentTools::Listed(vec!["a".into()]));
    let all = one(json!({"command": "x", "idempotent": true})).map(|s| s.idempotent);
    assert_eq!(all, Ok(IdempotentTools::All));
    let none = one(json!({"command": "x", "idempotent": false})).map(|s| s.idempotent);
    assert_eq!(none, Ok(IdempotentTools::None));
}

#[test]
fn every_error_names_the_server_and_the_key() {
    let cases = [
        (json!({"command": "x", "argz": []}), "unknown field `argz`"),
        (json!({"args": []}), "exactly one of `command`"),
        (
            json!({"command": "x", "url": "http://a"}),
            "exactly one of `command`",
        ),
        (json!({"command": ""}), "`command` must name a program"),
        (json!({"command": ["x"]}), "invalid type"),
        (
            json!({"command": "x", "headers_env": {}}),
            "`headers_env` applies to `url`",
        ),
        (
            json!({"url": "http://a", "args": []}),
            "`args` applies to `command`",
        ),
        (
            json!({"url": "http://a", "env": {}}),
            "`env` applies to `command`",
        ),
        (json!({"url": "not a url"}), "invalid `url`"),
        (
            json!({"url": "ftp://a"}),
            "must be http or https, found ftp",
        ),
        (
            json!({"command": "x", "timeout_ms": 0}),
            "`timeout_ms` must be at least 1",
        ),
        (
            json!({"command": "x", "startup_timeout_ms": 0}),
            "`startup_timeout_ms`",
        ),
        (json!({"command": "x", "timeout_ms": -1}), "invalid value"),
        (
            json!({"command": "x", "idempotent": "yes"}),
            "did not match any variant",
        ),
        (
            json!({"command": "x", "env": {"A=B": "1"}}),
            "`env` has an invalid name \"A=B\"",
        ),
        (
            json!({"url": "http://a", "headers_env": {"Bad Header": "V"}}),
            "invalid name",
        ),
        (
            json!({"url": "http://a", "headers_env": {"X": ""}}),
            "invalid name",
        ),
        (json!({"command": "x", "tools": "a"}), "invalid type"),
    ];
    for (server, expected) in cases {
        let message = error(server.clone());
        assert!(message.starts_with("Some(\"s\")"), "{server}: {message}");
        assert!(message.contains(expected), "{server}: {message}");
    }
}

#[test]
fn manifest_errors_name_the_server() {
    let text = r#"{"mcpServers": {"time": {"command": "x", "bogus": 1}}}"#;
    let message = toolbox_from_manifest(text, Path::new("."), &[])
        .err()
        .map(|e| e.to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.starts_with("MCP server `time`: unknown field `bogus`")),
        "{message:?}"
    );
    let text = r#"{"mcpServers": []}"#;
    let error = mcp_servers(text).err();
    assert!(
        matches!(&error, Some(ManifestError::McpServer { server: None, .. })),
        "{error:?}"
    );
    let text = r#"{"mcpServers": {"": {"command": "x"}}}"#;
    assert!(mcp_servers(text).is_err());
}

#[test]
fn servers_wait_in_the_toolbox_until_started() {
    let text = r#"{
        "mcpServers": {"a": {"command": "x"}, "b": {"url": "http://127.0.0.1:1/mcp"}},
        "calc": {"command": ["true"], "descriptor": {"parameters": {"type": "object"}}}
    }"#;
    let toolbox = toolbox_from_manifest(text, Path::new("."), &[]);
    let toolbox = toolbox.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(toolbox.len(), 1);
    let names: Vec<&str> = toolbox
        .pending_mcp_servers()
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(mcp_servers(text).map(|s| s.len()).ok(), Some(2));
    assert_eq!(mcp_servers("{}").map(|s| s.len()).ok(), Some(0));
}

#[test]
fn idempotency_from_annotations() {
    let from = IdempotentTools::FromAnnotations;
    let yes = json!({"idempotentHint": true});
    let destructive = json!({"idempotentHint": true, "destructiveHint": true});
    assert!(from.includes("t", Some(&yes)));
    assert!(!from.includes("t", Some(&destructive)));
    assert!(!from.includes("t", Some(&json!({"idempotentHint": false}))));
    assert!(!from.includes("t", None));
    assert!(IdempotentTools::Listed(vec!["t".into()]).includes("t", None));
    assert!(!IdempotentTools::Listed(vec!["u".into()]).includes("t", Some(&yes)));
    assert!(!IdempotentTools::None.includes("t", Some(&yes)));
}

#[cfg(feature = "mcp")]
#[test]
fn results_map_to_structured_text_descriptors_or_errors() {
    use super::client::map_result;
    let text = json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
    assert_eq!(map_result(&text), Ok(json!("a\nb")));
    let structured = json!({"content": [{"type": "text", "text": "{}"}],
                            "structuredContent": {"n": 1}});
    assert_eq!(map_result(&structured), Ok(json!({"n": 1})));
    let failed = json!({"content": [{"type": "text", "text": "boom"}], "isError": true,
                        "structuredContent": {"n": 1}});
    assert_eq!(map_result(&failed), Err("boom".into()));
    let silent = json!({"content": [], "isError": true});
    assert!(map_result(&silent).is_err_and(|m| m.contains("without a message")));
    let image = json!({"content": [{"type": "text", "text": "see"},
        {"type": "image", "data": "AAAA", "mimeType": "image/png"},
        {"type": "resource", "resource": {"uri": "file:///x", "mimeType": "text/plain", "text": "big"}}]});
    assert_eq!(
        map_result(&image),
        Ok(json!([{"type": "text", "text": "see"},
                  {"type": "image", "mimeType": "image/png"},
                  {"type": "resource", "mimeType": "text/plain", "uri": "file:///x"}]))
    );
    assert_eq!(map_result(&json!({})), Ok(json!("")));
}

use std::path::Path;
