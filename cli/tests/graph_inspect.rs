//! The binary's analysis commands, black box: `aplc graph`, `aplc inspect`,
//! `check --format json` and `--deny-warnings`, and the unknown-step policy of
//! `check` versus `run`.
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

/// A scratch directory unique to one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aplc-graph-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Builds `source` (relative to `fixtures/`) into `dir` and returns the bundle's path.
fn build(source: &str, dir: &Path, extra: &[&str]) -> String {
    let out = dir
        .join(
            Path::new(source)
                .with_extension("aplb")
                .file_name()
                .unwrap(),
        )
        .to_string_lossy()
        .into_owned();
    let mut args = vec!["build", source, "-o", &out];
    args.extend(extra);
    let o = aplc(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    out
}

const GRAPH_FIXTURES: &[&str] = &[
    "run/spec_7_5_iterate.apl",
    "run/prev_step_chain.apl",
    "run/error_lifecycle.apl",
    "check/graph_exits.apl",
    "check/dynamic_jump.apl",
];

#[test]
fn graph_dot_and_mermaid() {
    for fixture in GRAPH_FIXTURES {
        let name = Path::new(fixture).file_stem().unwrap().to_string_lossy();
        let dot = aplc(&["graph", fixture]);
        assert_eq!(dot.status.code(), Some(0), "{}", stderr(&dot));
        assert!(stderr(&dot).is_empty(), "{}", stderr(&dot));
        let explicit = aplc(&["graph", fixture, "--format", "dot"]);
        assert_eq!(stdout(&dot), stdout(&explicit), "dot is the default");
        insta::assert_snapshot!(format!("graph_dot_{name}"), stdout(&dot));

        let mermaid = aplc(&["graph", fixture, "--format", "mermaid"]);
        assert_eq!(mermaid.status.code(), Some(0), "{}", stderr(&mermaid));
        insta::assert_snapshot!(format!("graph_mermaid_{name}"), stdout(&mermaid));
    }
}

#[test]
fn graph_of_a_relaxed_file() {
    let o = aplc(&["graph", "run/relaxed_greet.apl", "--relaxed"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    insta::assert_snapshot!(stdout(&o));
}

#[test]
fn graph_of_a_bundle_is_the_graph_of_its_source() {
    let dir = scratch("bundle");
    for fixture in GRAPH_FIXTURES {
        let bundle = build(fixture, &dir, &[]);
        for format in ["dot", "mermaid"] {
            let from_source = aplc(&["graph", fixture, "--format", format]);
            let from_bundle = aplc(&["graph", &bundle, "--format", format]);
            assert_eq!(
                from_bundle.status.code(),
                Some(0),
                "{}",
                stderr(&from_bundle)
            );
            assert_eq!(
                stdout(&from_source),
                stdout(&from_bundle),
                "{fixture} {format}"
            );
        }
    }
}

#[test]
fn graph_refuses_a_file_with_errors() {
    let o = aplc(&["graph", "check/err_unknown_step.apl"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stdout(&o).is_empty());
    assert!(stderr(&o).contains("[APL0014] Error: Unknown step: reveiw"));
}

#[test]
fn inspect_lists_a_bundle() {
    let dir = scratch("inspect");
    for fixture in ["run/spec_7_5_iterate.apl", "run/prev_step_chain.apl"] {
        let bundle = build(fixture, &dir, &[]);
        let o = aplc(&["inspect", &bundle]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stderr(&o).is_empty());
        let name = Path::new(fixture).file_stem().unwrap().to_string_lossy();
        insta::assert_snapshot!(format!("inspect_{name}"), stdout(&o));
    }
    let bundle = build("check/graph_exits.apl", &dir, &[]);
    let o = aplc(&["inspect", &bundle]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let flow = &text[text.find("\nflow:\n").expect("a flow section")..];
    insta::assert_snapshot!("inspect_graph_exits_flow", flow);
}

#[test]
fn inspect_rejects_bad_input_with_a_clear_error() {
    let dir = scratch("corrupt");
    let bundle = build("run/spec_7_5_iterate.apl", &dir, &[]);
    let bytes = std::fs::read(&bundle).unwrap();
    let write = |name: &str, contents: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path.to_string_lossy().into_owned()
    };
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    let mut future = bytes.clone();
    future[8] = 9;
    let cases = [
        (write("empty.aplb", b""), "bad magic bytes"),
        (write("truncated.aplb", &bytes[..16]), "header truncated"),
        (write("short.aplb", &bytes[..bytes.len() - 3]), "truncated"),
        (write("flipped.aplb", &flipped), "checksum mismatch"),
        (
            write("future.aplb", &future),
            "unsupported bundle format version 9",
        ),
        (
            fixtures()
                .join("run/spec_7_5_iterate.apl")
                .to_string_lossy()
                .into_owned(),
            "for .apl source use `aplc check` or `aplc graph`",
        ),
    ];
    for (path, expected) in cases {
        let o = aplc(&["inspect", &path]);
        assert_eq!(o.status.code(), Some(1), "{path}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.starts_with("error: "), "{path}: {err}");
        assert!(err.contains("unreadable bundle"), "{path}: {err}");
        assert!(
            err.contains(expected),
            "{path}: expected {expected:?} in {err}"
        );
        assert!(stdout(&o).is_empty());
    }
    let missing = aplc(&["inspect", "no/such/file.aplb"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr(&missing).contains("cannot read"));
}

const JSON_FIXTURES: &[&str] = &[
    "check/err_unknown_step.apl",
    "check/err_multiple_errors.apl",
    "check/warn_cycle_two_steps.apl",
    "check/warn_undefined_variable.apl",
];

#[test]
fn check_format_json_prints_json_lines_on_stdout() {
    for fixture in JSON_FIXTURES {
        let o = aplc(&["check", fixture, "--format", "json"]);
        let expected_code = if fixture.contains("/err_") { 2 } else { 0 };
        assert_eq!(o.status.code(), Some(expected_code), "{fixture}");
        assert!(stderr(&o).is_empty(), "{fixture}: {}", stderr(&o));
        let out = stdout(&o);
        for line in out.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("one object per line");
            for key in [
                "code",
                "severity",
                "message",
                "file",
                "line",
                "column",
                "labels",
                "notes",
                "help",
                "suggestion",
            ] {
                assert!(v.get(key).is_some(), "{fixture}: no `{key}` in {line}");
            }
            assert_eq!(v["file"], *fixture);
            let labels = v["labels"].as_array().unwrap();
            assert_eq!(labels.iter().filter(|l| l["primary"] == true).count(), 1);
            assert_eq!(labels[0]["primary"], true, "the primary label comes first");
            assert_eq!(labels[0]["line"], v["line"]);
            assert_eq!(labels[0]["column"], v["column"]);
        }
        let name = Path::new(fixture).file_stem().unwrap().to_string_lossy();
        insta::assert_snapshot!(format!("json_{name}"), out);
    }
}

#[test]
fn json_columns_count_characters_and_offsets_count_bytes() {
    let dir = scratch("unicode");
    let file = dir.join("unicode.apl");
    std::fs::write(&file, "# prompt: ä\nÜber {{ wert }}\n").unwrap();
    let o = aplc(&["check", &file.to_string_lossy(), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["code"], "APL0018");
    assert_eq!(
        (v["line"].as_u64(), v["column"].as_u64()),
        (Some(2), Some(9))
    );
    assert_eq!(v["end_column"].as_u64(), Some(13));
    let label = &v["labels"][0];
    // "# prompt: ä\n" is 13 bytes; "Über {{ " is 9 more.
    assert_eq!(
        (label["start"].as_u64(), label["end"].as_u64()),
        (Some(22), Some(26))
    );
}

/// Each did-you-mean carries its edit: the bytes `start..end` are the misspelt name,
/// columns count characters, and the replacement is the name the help names.
#[test]
fn json_suggestions_replace_the_misspelt_name() {
    let o = aplc(&["check", "lsp/did_you_mean.apl", "--format", "json"]);
    let source = std::fs::read_to_string(fixtures().join("lsp/did_you_mean.apl")).unwrap();
    let mut fixes = Vec::new();
    for line in stdout(&o).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("one object per line");
        let s = &v["suggestion"];
        let (start, end) = (s["start"].as_u64().unwrap(), s["end"].as_u64().unwrap());
        let old = &source[start as usize..end as usize];
        let replacement = s["replacement"].as_str().unwrap();
        let help = v["help"].as_str().unwrap_or_default();
        assert!(
            help.starts_with("did you mean") && help.contains(replacement),
            "{help}"
        );
        let line_text = source.lines().nth(s["line"].as_u64().unwrap() as usize - 1);
        let column = s["column"].as_u64().unwrap() as usize;
        let at: String = line_text.unwrap().chars().skip(column - 1).collect();
        assert!(at.starts_with(old), "{at:?} {old:?}");
        assert_eq!(
            s["end_column"].as_u64(),
            Some((column + old.chars().count()) as u64)
        );
        fixes.push(format!(
            "{}: {old} -> {replacement}",
            v["code"].as_str().unwrap()
        ));
    }
    assert_eq!(
        fixes,
        [
            "APL0006: sytem -> system",
            "APL0023: uppper -> upper",
            "APL0014: fni -> fin",
            "APL0022: rnage -> range",
        ]
    );
}

#[test]
fn build_format_json_reports_and_still_builds() {
    let dir = scratch("build-json");
    let out = dir.join("w.aplb").to_string_lossy().into_owned();
    let o = aplc(&[
        "build",
        "check/warn_unreachable_step.apl",
        "-o",
        &out,
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(Path::new(&out).exists());
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["code"], "APL0016");
    assert_eq!(v["severity"], "warning");
}

#[test]
fn deny_warnings_turns_warnings_into_errors() {
    let file = "check/warn_unreachable_step.apl";
    assert_eq!(aplc(&["check", file]).status.code(), Some(0));
    let denied = aplc(&["check", file, "--deny-warnings"]);
    assert_eq!(denied.status.code(), Some(2));
    assert!(stderr(&denied).contains("[APL0016] Error: Unreachable step: orphan"));
    assert!(stderr(&denied).contains("--deny-warnings"));

    let json = aplc(&["check", file, "--deny-warnings", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&json).trim()).unwrap();
    assert_eq!(v["severity"], "error");

    let dir = scratch("deny");
    let out = dir.join("w.aplb");
    let o = aplc(&[
        "build",
        file,
        "-o",
        &out.to_string_lossy(),
        "--deny-warnings",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!out.exists(), "no bundle when warnings are denied");

    // A clean file is unaffected.
    let clean = aplc(&["check", "check/spec_7_patterns.apl", "--deny-warnings"]);
    assert_eq!(clean.status.code(), Some(0), "{}", stderr(&clean));
}

#[test]
fn unknown_step_is_a_check_error_but_a_run_time_failure() {
    let file = "run/unknown_step.apl";
    let check = aplc(&["check", file]);
    assert_eq!(check.status.code(), Some(2));
    assert!(stderr(&check).contains("[APL0014] Error: Unknown step: finish"));
    assert!(stderr(&check).contains("did you mean `Finish`?"));

    let run = aplc(&["run", file, "--mock", "run/unknown_step.mock.json"]);
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    let err = stderr(&run);
    assert!(
        err.contains("[APL0014] Warning: Unknown step: finish"),
        "{err}"
    );
    assert!(err.contains("error: Unknown step: finish"), "{err}");
}
