//! `aplc lsp` over stdio, driven as a client would (spec/lsp.md): the same diagnostics
//! as `aplc check`, debounced and cleared when fixed; hover, definition, references,
//! rename, completion, symbols, folding, code actions and semantic tokens on a fixture,
//! snapshotted; a panic in a request is an error answer; hostile input is survived.

mod lsp_client;

use std::path::Path;
use std::process::Command;

use lsp_client::{Client, at, position, uri};
use serde_json::{Value, json};

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `aplc check --format json FILE`: code, severity, message and range of each
/// diagnostic, the range converted to UTF-16 positions by the test itself.
fn check_diagnostics(path: &Path, text: &str) -> Vec<Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(["check", "--format", "json"])
        .arg(path)
        .output()
        .expect("aplc check");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|d| d.get("code").is_some())
        .map(|d| {
            let span = |k: &str| d[k].as_u64().map(|n| n as usize);
            let primary = d["labels"]
                .as_array()
                .and_then(|ls| ls.iter().find(|l| l["primary"] == true))
                .cloned()
                .unwrap_or_default();
            let (start, end) = (
                primary["start"]
                    .as_u64()
                    .map(|n| n as usize)
                    .or(span("start"))
                    .unwrap_or(0),
                primary["end"]
                    .as_u64()
                    .map(|n| n as usize)
                    .or(span("end"))
                    .unwrap_or(0),
            );
            json!({
                "code": d["code"],
                "severity": if d["severity"] == "error" { 1 } else { 2 },
                "message": d["message"],
                "range": {"start": position(text, start), "end": position(text, end)},
            })
        })
        .collect()
}

/// The fields `aplc check` also has.
fn comparable(d: &Value) -> Value {
    json!({"code": d["code"], "severity": d["severity"], "message": d["message"], "range": d["range"]})
}

#[test]
fn diagnostics_are_those_of_aplc_check_for_every_check_fixture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/check");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures/check")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "apl"))
        // Options files change how `aplc check` compiles; the server uses its defaults.
        .filter(|p| !p.with_extension("options.json").exists())
        .collect();
    files.sort();
    let lsp_fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/lsp");
    files.push(lsp_fixtures.join("unknown_step.apl"));
    files.push(lsp_fixtures.join("triage.apl"));
    let mut client = Client::start(&[]);
    let mut compared = 0;
    for (i, path) in files.iter().enumerate() {
        let text = std::fs::read_to_string(path).expect("read fixture");
        let expected = check_diagnostics(path, &text);
        // `aplc check` also links the agents a file calls (APL0026-APL0030); the server
        // compiles the one file only (spec/lsp.md).
        if expected
            .iter()
            .any(|d| d["code"].as_str().is_some_and(|c| c >= "APL0026"))
        {
            continue;
        }
        let name = format!("check{i}.apl");
        client.open(&uri(&name), &text);
        let got: Vec<Value> = client
            .diagnostics(&uri(&name), 1)
            .iter()
            .map(comparable)
            .collect();
        assert_eq!(got, expected, "{}", path.display());
        compared += 1;
    }
    assert!(compared > 20, "only {compared} fixtures compared");
    client.shutdown();
}

#[test]
fn diagnostics_follow_edits_on_non_ascii_lines_and_clear_when_fixed() {
    let text = fixture("lsp/unknown_step.apl");
    let doc = uri("unknown_step.apl");
    let mut client = Client::start(&[]);
    client.open(&doc, &text);
    let diagnostics = client.diagnostics(&doc, 1);
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    let d = &diagnostics[0];
    assert_eq!(d["code"], "APL0014");
    assert_eq!(d["message"], "Unknown step: fni");
    // After `Étape 🚀 {{ `: 6 + 2 (a surrogate pair) + 4 UTF-16 units.
    let call = at(&text, "set_context('next_step'", 0, 0);
    assert_eq!(call["character"], 12);
    assert_eq!(d["range"]["start"], call);
    let related: Vec<&str> = d["relatedInformation"]
        .as_array()
        .expect("related information")
        .iter()
        .filter_map(|r| r["message"].as_str())
        .collect();
    assert!(
        related.contains(&"help: did you mean `fin`?"),
        "{related:?}"
    );

    // Two quick edits (one keystroke each), then the fix: the name `fni` → `fin`.
    let name = at(&text, "'fni'", 0, 1);
    let edit = |start: &Value, end: &Value, new: &str| json!({"range": {"start": start, "end": end}, "text": new});
    let mut after = name.clone();
    after["character"] = json!(name["character"].as_u64().unwrap() + 3);
    client.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": doc, "version": 2}, "contentChanges": [edit(&name, &after, "fi")]}),
    );
    let mut end = name.clone();
    end["character"] = json!(name["character"].as_u64().unwrap() + 2);
    client.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": doc, "version": 3}, "contentChanges": [edit(&end, &end, "n")]}),
    );
    assert_eq!(
        client.diagnostics(&doc, 3),
        Vec::<Value>::new(),
        "fixed: cleared"
    );
    // The burst was debounced: version 2 got no diagnostics of its own.
    assert!(
        !client.pending_has(|m| m["params"]["version"] == 2),
        "diagnostics were published for an intermediate version"
    );
    client.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": doc}}),
    );
    client.shutdown();
}

#[test]
fn features_on_a_fixture() {
    let text = fixture("lsp/triage.apl");
    let doc = uri("triage.apl");
    let mut client = Client::start(&[]);
    client.open(&doc, &text);
    assert_eq!(client.diagnostics(&doc, 1), Vec::<Value>::new());
    let td = json!({"uri": doc});
    let pos = |p: Value| json!({"textDocument": td, "position": p});
    let mut out = serde_json::Map::new();
    let mut record = |key: &str, value: Value| {
        out.insert(key.to_string(), value);
    };

    let hovers = [
        ("hover builtin result_text", at(&text, "result_text", 0, 3)),
        ("hover builtin runs", at(&text, "runs", 0, 1)),
        ("hover user variable attempts", at(&text, "attempts", 1, 2)),
        ("hover input ticket", at(&text, "ticket", 2, 0)),
        ("hover helper set_context", at(&text, "set_context", 0, 4)),
        ("hover filter tojson", at(&text, "tojson", 0, 2)),
        ("hover step in next_step", at(&text, "'escalate'", 0, 3)),
        ("hover step heading", at(&text, "# prompt: triage", 0, 11)),
        ("hover prose", at(&text, "trieur", 0, 2)),
    ];
    for (key, p) in hovers {
        record(key, client.result("textDocument/hover", pos(p)));
    }
    record(
        "definition of a next_step target",
        client.result("textDocument/definition", pos(at(&text, "'reply'", 0, 2))),
    );
    record(
        "definition of a user variable",
        client.result("textDocument/definition", pos(at(&text, "attempts", 1, 0))),
    );
    let mut refs = pos(at(&text, "'reply'", 1, 1));
    refs["context"] = json!({"includeDeclaration": true});
    record(
        "references of reply",
        client.result("textDocument/references", refs),
    );
    record(
        "prepareRename on a step",
        client.result(
            "textDocument/prepareRename",
            pos(at(&text, "escalate", 1, 0)),
        ),
    );
    let mut rename = pos(at(&text, "'escalate'", 0, 2));
    rename["newName"] = json!("urgent_reply");
    record(
        "rename escalate",
        client.result("textDocument/rename", rename.clone()),
    );
    for bad in ["reply", "not valid", "return"] {
        rename["newName"] = json!(bad);
        let answer = client.request("textDocument/rename", rename.clone());
        record(
            &format!("rename to {bad:?}"),
            answer["error"]["message"].clone(),
        );
    }
    record(
        "symbols",
        client.result("textDocument/documentSymbol", json!({"textDocument": td})),
    );
    record(
        "folding",
        client.result("textDocument/foldingRange", json!({"textDocument": td})),
    );
    record(
        "semantic tokens",
        client.result(
            "textDocument/semanticTokens/full",
            json!({"textDocument": td}),
        ),
    );
    let snapshot = Value::Object(out);
    insta::assert_json_snapshot!("lsp_features", snapshot);
    client.shutdown();
}

/// Completion in each context, on text typed into the fixture.
#[test]
fn completion_in_each_context() {
    let text = fixture("lsp/triage.apl");
    let doc = uri("triage.apl");
    let mut client = Client::start(&[]);
    client.open(&doc, &text);
    client.diagnostics(&doc, 1);
    let labels = |client: &mut Client, line: &str| -> Vec<String> {
        // The line is typed at the end of the file, as version 2, 3, …
        let end = position(&text, text.len());
        let version = client.next_version();
        client.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": doc, "version": version},
                   "contentChanges": [{"text": format!("{text}{line}")}]}),
        );
        let mut p = end.clone();
        p["character"] = json!(line.encode_utf16().count());
        let answer = client.result(
            "textDocument/completion",
            json!({"textDocument": {"uri": doc}, "position": p}),
        );
        let mut labels: Vec<String> = answer
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["label"].as_str().map(String::from))
            .collect();
        labels.sort();
        labels
    };
    assert_eq!(
        labels(&mut client, "# pr"),
        ["# post: ", "# pre: ", "# prompt: "]
    );
    let roles = labels(&mut client, "## ");
    assert!(roles.contains(&"## system".to_string()), "{roles:?}");
    assert_eq!(
        labels(&mut client, "{{ set_context('next_step', 'es"),
        ["escalate", "reply", "return", "triage"]
    );
    let vars = labels(&mut client, "é {{ res");
    for v in [
        "result_text",
        "attempts",
        "ticket",
        "set_context",
        "get_json_path",
    ] {
        assert!(vars.contains(&v.to_string()), "{v} in {vars:?}");
    }
    let filters = labels(&mut client, "{{ ticket | to");
    assert!(filters.contains(&"tojson".to_string()), "{filters:?}");
    assert!(!filters.contains(&"result_text".to_string()));
    assert!(labels(&mut client, "plain prose").is_empty());
    client.shutdown();
}

#[test]
fn code_action_creates_an_unknown_step() {
    let text = fixture("lsp/unknown_step.apl");
    let doc = uri("unknown_step.apl");
    let mut client = Client::start(&[]);
    client.open(&doc, &text);
    client.diagnostics(&doc, 1);
    let p = at(&text, "'fni'", 0, 2);
    let actions = client.result(
        "textDocument/codeAction",
        json!({"textDocument": {"uri": doc}, "range": {"start": p, "end": p},
               "context": {"diagnostics": []}}),
    );
    // `fni` is also one edit from `fin`: that fix is offered too, and preferred.
    let titles: Vec<&Value> = actions
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| &a["title"])
        .collect();
    assert_eq!(
        titles,
        ["Replace `fni` with `fin`", "Create step `fni`"],
        "{actions}"
    );
    let edit = &actions[1]["edit"]["changes"][&doc][0];
    assert_eq!(edit["newText"], "\n# prompt: fni\n\n");
    assert_eq!(edit["range"]["start"], position(&text, text.len()));
    client.shutdown();
}

/// Each diagnostic's did-you-mean is a preferred quick fix; applied as a client applies
/// it (a `didChange` with the edit's UTF-16 range, on non-ASCII lines), one after the
/// other, they leave no diagnostic.
#[test]
fn did_you_mean_quick_fixes_apply_until_no_diagnostic_is_left() {
    let mut text = fixture("lsp/did_you_mean.apl");
    let doc = uri("did_you_mean.apl");
    let mut client = Client::start(&[]);
    client.open(&doc, &text);
    let mut diagnostics = client.diagnostics(&doc, 1);
    assert_eq!(diagnostics.len(), 4, "{diagnostics:?}");
    let mut applied = Vec::new();
    while let Some(d) = diagnostics.first() {
        assert!(applied.len() < 8, "the fixes do not converge: {applied:?}");
        let actions = client.result(
            "textDocument/codeAction",
            json!({"textDocument": {"uri": doc}, "range": d["range"],
                   "context": {"diagnostics": [d]}}),
        );
        let fix = actions
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["isPreferred"] == true)
            .unwrap_or_else(|| panic!("no preferred fix for {d}: {actions}"))
            .clone();
        assert_eq!(fix["kind"], "quickfix");
        assert_eq!(
            fix["diagnostics"],
            json!([d]),
            "the fix names its diagnostic"
        );
        let edits = fix["edit"]["changes"][&doc].as_array().expect("edits");
        assert_eq!(edits.len(), 1, "{fix}");
        let edit = &edits[0];
        text = lsp_client::apply(&text, edit);
        let version = client.next_version();
        client.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": doc, "version": version},
                   "contentChanges": [{"range": edit["range"], "text": edit["newText"]}]}),
        );
        applied.push(json!({"code": d["code"], "title": fix["title"], "edit": edit}));
        diagnostics = client.diagnostics(&doc, version);
    }
    insta::assert_json_snapshot!(
        "lsp_did_you_mean",
        json!({"applied": applied, "fixed": text})
    );
    client.shutdown();
}

#[test]
fn a_panic_in_a_request_is_an_error_and_the_server_goes_on() {
    let text = fixture("lsp/triage.apl");
    let doc = uri("triage.apl");
    let mut client = Client::start(&[("APLC_LSP_TEST_PANIC", "1")]);
    client.open(&doc, &text);
    client.diagnostics(&doc, 1);
    let answer = client.request("aplc/panic", json!({}));
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    let hover = client.result(
        "textDocument/hover",
        json!({"textDocument": {"uri": doc}, "position": at(&text, "runs", 0, 1)}),
    );
    assert!(
        hover["contents"]["value"]
            .as_str()
            .unwrap()
            .contains("runs")
    );
    client.shutdown();
}

#[test]
fn hostile_messages_are_survived() {
    let text = fixture("lsp/triage.apl");
    let doc = uri("triage.apl");
    let mut client = Client::start(&[]);
    // A change and requests for a document that was never opened.
    client.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": doc, "version": 5}, "contentChanges": [{"text": "x"}]}),
    );
    let none = client.result(
        "textDocument/hover",
        json!({"textDocument": {"uri": doc}, "position": {"line": 0, "character": 0}}),
    );
    assert_eq!(none, Value::Null);
    client.open(&doc, &text);
    client.diagnostics(&doc, 1);
    // Positions far past the end, and inside a surrogate pair.
    let far = json!({"line": 4_000_000_000u32, "character": 4_000_000_000u32});
    for method in [
        "textDocument/hover",
        "textDocument/definition",
        "textDocument/completion",
    ] {
        client.result(
            method,
            json!({"textDocument": {"uri": doc}, "position": far}),
        );
    }
    let emoji = at(&text, "😀", 0, 0);
    let mut inside = emoji.clone();
    inside["character"] = json!(emoji["character"].as_u64().unwrap() + 1);
    client.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": doc, "version": 2},
               "contentChanges": [{"range": {"start": inside, "end": far}, "text": "{{ x"}]}),
    );
    client.diagnostics(&doc, 2);
    // Invalid parameters, an unknown method, a frame that is not JSON.
    let bad = client.request("textDocument/hover", json!({"nope": 1}));
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    let unknown = client.request("aplc/nothing", json!({}));
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    client.write_raw(b"Content-Length: 9\r\n\r\nnot json!");
    client.write_raw(b"X-Nothing: 1\r\n\r\n");
    client.shutdown();
}
