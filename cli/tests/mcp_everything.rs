//! The reference MCP server, npm's `@modelcontextprotocol/server-everything`, over stdio
//! through the `aplc` binary (spec/mcp.md), and the ready-to-run example
//! `fixtures/mcp/everything/`.
//!
//! `.ci/run` installs the server from `fixtures/mcp/package-lock.json` and sets
//! `APLC_MCP_EVERYTHING` to its binary; without it these tests fail:
//! `(cd fixtures/mcp && npm ci) && APLC_MCP_EVERYTHING=$PWD/fixtures/mcp/node_modules/.bin/mcp-server-everything cargo test -p aplc --test mcp_everything`.

use std::process::Output;

use aplc_test_support::mcp::{calls, context, everything, failed_with, results, run_args};
use aplc_test_support::process::{root, succeed};
use aplc_test_support::{aplc, scratch_in};
use serde_json::{Value as Json, json};

const AGENT: &str = "# prompt: go\nUse the tools.\n";

/// The server as a manifest entry, its tools prefixed `e_`.
fn manifest() -> Json {
    json!({"mcpServers": {"everything": {
        "command": everything(), "prefix": "e_", "startup_timeout_ms": 60000,
    }}})
}

fn run(name: &str, mock: Json) -> Output {
    let dir = scratch_in!("mcp_everything", name);
    let args = run_args(&dir, AGENT, &mock, &manifest());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = aplc!(&dir, &args).output().expect("aplc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

#[test]
fn its_tools_are_listed_with_their_schemas() {
    let context = context(&run("list", calls(&[])));
    let tools = context["tools"].as_array().cloned().unwrap_or_default();
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t["function"]["name"] == json!(name))
            .unwrap_or_else(|| panic!("no {name} in {tools:?}"))
            .clone()
    };
    for name in ["e_echo", "e_get-sum", "e_get-tiny-image"] {
        tool(name);
    }
    let weather = tool("e_get-structured-content");
    let parameters = &weather["function"]["parameters"];
    assert_eq!(parameters["required"], json!(["location"]), "{weather}");
    assert_eq!(
        parameters["properties"]["location"]["enum"],
        json!(["New York", "Chicago", "Los Angeles"]),
        "{weather}"
    );
    assert!(
        weather["function"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("structured content")),
        "{weather}"
    );
}

#[test]
fn calls_map_structured_text_and_image_results_and_refuse_schema_violations() {
    let mock = calls(&[
        ("e_get-structured-content", json!({"location": "Chicago"})),
        ("e_echo", json!({"message": "hello"})),
        ("e_get-sum", json!({"a": 2, "b": 3})),
        ("e_get-tiny-image", json!({})),
        ("e_get-structured-content", json!({"location": "Paris"})),
    ]);
    let results = results(&context(&run("calls", mock)));
    assert_eq!(
        results[0],
        (
            json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82}),
            false
        )
    );
    assert_eq!(results[1], (json!("Echo: hello"), false));
    assert_eq!(results[2], (json!("The sum of 2 and 3 is 5."), false));
    // An image is a small descriptor with its MIME type, never its data.
    let image = results[3].0.as_array().cloned().unwrap_or_default();
    assert!(
        image
            .iter()
            .any(|item| item == &json!({"type": "image", "mimeType": "image/png"})),
        "{results:?}"
    );
    assert!(results[3].0.to_string().len() < 1000, "{results:?}");
    // Not in the `enum` of its `inputSchema`: refused before the call.
    assert!(
        failed_with(&results[4], "`e_get-structured-content`: invalid arguments"),
        "{results:?}"
    );
}

#[test]
fn the_example_runs_as_written_with_the_installed_server() {
    let dir = scratch_in!("mcp_everything", "example");
    let example = root().join("fixtures/mcp/everything");
    let text = std::fs::read_to_string(example.join("tools.json")).expect("tools.json");
    let mut tools: Json = serde_json::from_str(&text).expect("tools.json is JSON");
    // The example starts the server with `npx -y`; CI has it installed, offline.
    let server = &mut tools["mcpServers"]["everything"];
    assert_eq!(server["command"], json!("npx"), "{server}");
    server["command"] = json!(everything());
    server["args"] = json!([]);
    std::fs::write(dir.join("tools.json"), tools.to_string()).expect("write tools.json");
    let p = |path: std::path::PathBuf| path.to_string_lossy().into_owned();
    let (agent, mock, tools) = (
        p(example.join("agent.apl")),
        p(example.join("mock.json")),
        p(dir.join("tools.json")),
    );
    let out = succeed(&mut aplc!(
        &dir,
        &["run", &agent, "--mock", &mock, "--tools", &tools, "--json"]
    ));
    let context: Json = serde_json::from_slice(&out.stdout).expect("the final context");
    assert_eq!(
        context["weather"],
        json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82})
    );
    assert_eq!(context["sum"], json!("The sum of 2 and 3 is 5."));
    assert_eq!(
        context["result_text"],
        json!("Chicago has light rain at 36 degrees, and 2 + 3 is 5.")
    );
}
