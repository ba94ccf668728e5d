//! Hostile input: a JSON key given twice, in every JSON file aplc reads (issue #9 F20
//! follow-up). Each is refused with the file, the key, its line and column, instead of
//! silently keeping the last value. See `spec/limits.md`, "Files and terminal output".

use std::path::Path;

use crate::harness::{Caps, aplc, scratch, write};

const AGENT: &str = "# pre: p\n{{ set_context('allowed_tools', ['t']) }}\n\n# prompt: p\nhi\n";

/// Runs `aplc ARGS` and checks it refused `file` for key `key` at `line`.
#[track_caller]
fn assert_refused(args: &[&str], file: &str, key: &str, line: usize) {
    let out = aplc(args, Caps::default());
    out.assert_clean_exit();
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let wanted = format!("duplicate key `{key}`");
    assert!(
        out.stderr.contains(file) && out.stderr.contains(&wanted),
        "expected `{file}` and {wanted}:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!("line {line} column ")),
        "expected line {line}:\n{}",
        out.stderr
    );
}

fn agent(dir: &Path) -> String {
    write(dir, "agent.apl", AGENT)
}

const TOOL: &str = r#"{"command": ["true"], "descriptor": {"parameters": {"type": "object"}}}"#;

#[test]
fn duplicate_keys_in_a_mock_file_are_refused() {
    let dir = scratch("dup-mock");
    let agent = agent(&dir);
    // Nested: the last `content` would silently win.
    let mock = write(
        &dir,
        "mock.json",
        "[{\"choices\": [{\"message\": {\"role\": \"assistant\",\n\"content\": \"a\", \"content\": \"b\"}}]}]",
    );
    assert_refused(&["run", &agent, "--mock", &mock], "mock.json", "content", 2);
    assert_refused(
        &["bench", &agent, "--mock", &mock],
        "mock.json",
        "content",
        2,
    );
}

#[test]
fn duplicate_keys_in_a_tool_manifest_are_refused() {
    let dir = scratch("dup-tools");
    let agent = agent(&dir);
    let mock = write(&dir, "mock.json", r#"["ok"]"#);
    // The same tool twice: the first definition would vanish.
    let tools = write(
        &dir,
        "tools.json",
        format!("{{\"t\": {TOOL},\n\"t\": {TOOL}}}"),
    );
    let args = ["run", &agent, "--mock", &mock, "--tools", &tools];
    assert_refused(&args, "tools.json", "t", 2);
    // A setting twice inside an entry.
    let tools = write(
        &dir,
        "tools2.json",
        r#"{"t": {"command": ["true"], "timeout_ms": 1, "timeout_ms": 9, "descriptor": {}}}"#,
    );
    let args = ["run", &agent, "--mock", &mock, "--tools", &tools];
    assert_refused(&args, "tools2.json", "timeout_ms", 1);
}

#[test]
fn duplicate_keys_in_a_providers_file_are_refused() {
    let dir = scratch("dup-providers");
    let agent = agent(&dir);
    let providers = write(
        &dir,
        "providers.json",
        "{\"routes\": [\n{\"model\": \"*\", \"kind\": \"mock\", \"kind\": \"openai\", \"responses\": []}]}",
    );
    assert_refused(
        &["run", &agent, "--providers", &providers],
        "providers.json",
        "kind",
        2,
    );
}

#[test]
fn duplicate_keys_in_a_test_files_responses_and_tools_are_refused() {
    let dir = scratch("dup-test");
    agent(&dir);
    write(&dir, "mock.json", "[\n{\"choices\": [], \"choices\": []}]");
    write(&dir, "tools.json", format!("{{\"t\": {TOOL}}}"));
    let test = write(
        &dir,
        "a.test.toml",
        "agent = \"agent.apl\"\n\n[[case]]\nname = \"c\"\ntools = \"tools.json\"\n\
         responses = { file = \"mock.json\" }\nexpect = [\"true\"]\n",
    );
    let out = aplc(&["test", &test], Caps::default());
    out.assert_clean_exit();
    let all = format!("{}{}", out.stdout, out.stderr);
    assert_ne!(out.code, Some(0), "{all}");
    assert!(
        all.contains("mock.json")
            && all.contains("duplicate key `choices`")
            && all.contains("line 2 column "),
        "{all}"
    );

    write(&dir, "mock.json", r#"["ok"]"#);
    write(
        &dir,
        "tools.json",
        format!("{{\"t\": {TOOL}, \"t\": {TOOL}}}"),
    );
    let out = aplc(&["test", &test], Caps::default());
    out.assert_clean_exit();
    let all = format!("{}{}", out.stdout, out.stderr);
    assert_ne!(out.code, Some(0), "{all}");
    assert!(
        all.contains("tools.json")
            && all.contains("duplicate key `t`")
            && all.contains("line 1 column "),
        "{all}"
    );
}
