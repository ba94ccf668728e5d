//! Linking agents at build time, black box (`spec/agents.md` §2): `aplc build` links
//! the agents a file names into one bundle, `aplc inspect` and `aplc graph` show them,
//! `--agents DIR` and `--tools` widen what is linked, and a linking error fails `check`,
//! `build` and `run` with exit 2.
//!
//! Commands run inside `fixtures/` with relative paths, so the file names they print
//! (and the snapshots) do not depend on where the repository is checked out.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn aplc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(args)
        .current_dir(fixtures())
        .env("NO_COLOR", "1")
        .output()
        .expect("aplc runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Builds `agents/chain.apl` into a fresh directory and returns the bundle's path.
fn build_chain(dir: &tempfile::TempDir) -> String {
    let out = path(&dir.path().join("chain.aplb"));
    let o = aplc(&["build", "agents/chain.apl", "-o", &out]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    out
}

#[test]
fn build_links_the_agents_and_inspect_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = build_chain(&dir);
    let o = aplc(&["inspect", &bundle]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let agents = &text[text.find("\nagents:").expect("an agents section")..];
    insta::assert_snapshot!("inspect_linked_agents", agents);

    let o = aplc(&["inspect", &bundle, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    insta::assert_snapshot!("inspect_linked_agents_json", format!("{json:#}"));

    // `check` says what it linked.
    let o = aplc(&["check", "agents/chain.apl"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("1 agent linked"), "{}", stderr(&o));
}

#[test]
fn the_linked_bundle_round_trips_and_its_checksum_covers_the_agents() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(build_chain(&dir)).unwrap();
    let bundle = aplc_vm::bundle::decode(&bytes).expect("decodes");
    assert_eq!(bundle.agents.len(), 1);
    assert_eq!(aplc_vm::bundle::encode(&bundle).unwrap(), bytes);
    // A byte of the child's own template text, far past the root's payload.
    let needle = b"You are a translator.";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the child's text is in the bundle");
    let mut flipped = bytes.clone();
    flipped[at] ^= 0x01;
    let err = aplc_vm::bundle::decode(&flipped).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
}

#[test]
fn graph_draws_each_linked_agent_as_a_subgraph() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = build_chain(&dir);
    for format in ["dot", "mermaid"] {
        let o = aplc(&["graph", "agents/chain.apl", "--format", format]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        insta::assert_snapshot!(format!("graph_linked_{format}"), stdout(&o));
        let from_bundle = aplc(&["graph", &bundle, "--format", format]);
        assert_eq!(stdout(&from_bundle), stdout(&o), "{format}");
    }
    // A name computed at run time is a dashed edge to `agent *`.
    let o = aplc(&["graph", "agents/dynamic.apl"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("s0 -> agent_any [style=dashed];"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn agents_dir_and_tools_manifests_widen_what_is_linked() {
    let dir = tempfile::tempdir().unwrap();
    let chain = dir.path().join("chain.apl");
    std::fs::copy(fixtures().join("agents/chain.apl"), &chain).unwrap();
    let out = path(&dir.path().join("chain.aplb"));
    // Alone in its directory, `translator` is missing, and the note says where aplc looked.
    let o = aplc(&["build", &path(&chain), "-o", &out]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("[APL0027] Error: Unknown agent: translator"),
        "{err}"
    );
    assert!(
        err.contains("looked for `translator.apl` and `translator.aplb`"),
        "{err}"
    );
    assert!(!Path::new(&out).exists());
    let mock = dir.path().join("mock.json");
    std::fs::write(&mock, "[]").unwrap();
    let o = aplc(&["run", &path(&chain), "--mock", &path(&mock)]);
    assert!(stderr(&o).contains("[APL0027]"), "{}", stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // With `--agents`, it is found there.
    let o = aplc(&["build", &path(&chain), "-o", &out, "--agents", "agents"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // A manifest's `{"agent": …}` is linked though no `call_agent` names it; its other
    // entries are not the linker's business.
    let tools = dir.path().join("tools.json");
    std::fs::write(
        &tools,
        r#"{"echo": {"command": ["echo"]}, "translate": {"agent": "translator"}}"#,
    )
    .unwrap();
    let out = path(&dir.path().join("simple.aplb"));
    let args = [
        "build",
        "check/spec_1_2_2_simple.apl",
        "-o",
        &out,
        "--agents",
        "agents",
    ];
    let o = aplc(&[&args[..], &["--tools", &path(&tools)]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let bundle = aplc_vm::bundle::decode(&std::fs::read(&out).unwrap()).unwrap();
    let names: Vec<&str> = bundle.agents.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["translator"]);
    // Without `--agents`, the manifest's agent is missing: an error at the file's start.
    let o = aplc(&[
        "build",
        "check/spec_1_2_2_simple.apl",
        "-o",
        &out,
        "--tools",
        &path(&tools),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("named by a tool manifest"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn json_diagnostics_name_the_file_that_holds_them() {
    let o = aplc(&["check", "agents/err_broken_caller.apl", "--format", "json"]);
    assert_eq!(o.status.code(), Some(2));
    let files: Vec<(String, String)> = stdout(&o)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["code"].as_str().unwrap().into(),
                v["file"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        files,
        [
            (
                "APL0028".to_string(),
                "agents/err_broken_caller.apl".to_string()
            ),
            ("APL0004".to_string(), "agents/err_broken.apl".to_string()),
        ]
    );
}
