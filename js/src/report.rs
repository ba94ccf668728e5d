//! Diagnostics and the step graph as the JSON the package hands JavaScript: pure
//! functions, tested natively.
//!
//! Diagnostics carry the fields of `aplc check --format json` in JavaScript's spelling
//! (`endLine`, `endColumn`), lines and columns 1-based, columns in characters.

use aplc_compiler::graph::{Jump, StepGraph};
use aplc_compiler::{Compilation, Diagnostic, LineIndex};
use serde_json::{Value as Json, json};

/// `{"ok", "diagnostics", "rendered"}`: `ok` when no diagnostic is an error;
/// `rendered` is the report `aplc check` prints, without colour.
pub fn check_report(source: &str, file_name: &str, diagnostics: &[Diagnostic]) -> Json {
    let lines = LineIndex::new(source);
    let rows: Vec<Json> = diagnostics.iter().map(|d| row(&lines, source, d)).collect();
    json!({
        "ok": !diagnostics.iter().any(Diagnostic::is_error),
        "diagnostics": rows,
        "rendered": aplc_compiler::render(diagnostics, file_name, source, false),
    })
}

fn row(lines: &LineIndex, source: &str, d: &Diagnostic) -> Json {
    let position = |offset: usize| lines.line_col(source, offset);
    let span = d.span();
    let (line, column) = position(span.start);
    let (end_line, end_column) = position(span.end);
    let labels: Vec<Json> = d
        .labels
        .iter()
        .map(|l| {
            let (line, column) = position(l.span.start);
            let (end_line, end_column) = position(l.span.end);
            json!({
                "primary": l.primary, "message": l.message, "line": line, "column": column,
                "endLine": end_line, "endColumn": end_column,
            })
        })
        .collect();
    json!({
        "code": d.code.as_str(),
        "severity": d.severity.to_string(),
        "message": d.message,
        "line": line,
        "column": column,
        "endLine": end_line,
        "endColumn": end_column,
        "labels": labels,
        "notes": d.notes,
        "help": d.help,
        "suggestion": d.suggestion.as_ref().map(|s| {
            let (line, column) = position(s.span.start);
            let (end_line, end_column) = position(s.span.end);
            json!({
                "replacement": s.replacement, "line": line, "column": column,
                "endLine": end_line, "endColumn": end_column,
            })
        }),
    })
}

/// The JSON form of a step graph, for drawing (`spec/js.md`, "graph"):
///
/// ```json
/// {"ok": true, "diagnostics": [...], "entry": 0,
///  "steps": [{"name": "a", "reachable": true, "ends": ["no post phase"],
///             "jumps": [{"to": 1}, {"to": "return"}, {"to": "*"}, {"unknown": "x"}]}]}
/// ```
///
/// `steps` is `null` when the source has errors (no bundle, so no graph).
pub type GraphJson = Json;

/// The step graph of a compilation (see [`GraphJson`]), from its bundle, as `aplc graph`
/// builds it (`StepGraph::from_bundle`).
pub fn graph_json(source: &str, file_name: &str, compilation: &Compilation) -> GraphJson {
    let mut out = check_report(source, file_name, &compilation.diagnostics);
    let steps = compilation.bundle.as_ref().map(|bundle| {
        let graph = StepGraph::from_bundle(bundle);
        let reachable = reachable(&graph);
        graph
            .steps
            .iter()
            .zip(reachable)
            .map(|(step, reachable)| {
                let jumps: Vec<Json> = step.jumps.iter().map(jump_json).collect();
                let ends: Vec<&str> = step.ends.iter().map(|e| e.describe()).collect();
                json!({"name": step.name, "reachable": reachable, "jumps": jumps, "ends": ends})
            })
            .collect::<Vec<Json>>()
    });
    if let Json::Object(map) = &mut out {
        map.insert(
            "entry".into(),
            json!(compilation.bundle.as_ref().map(|_| 0)),
        );
        map.insert("steps".into(), json!(steps));
    }
    out
}

fn jump_json(jump: &Jump) -> Json {
    match jump {
        Jump::Step(index) => json!({"to": index}),
        Jump::Return => json!({"to": "return"}),
        Jump::Dynamic => json!({"to": "*"}),
        Jump::Unknown(name) => json!({"unknown": name}),
    }
}

/// Which steps a run can enter: those reached from the entry step along literal jumps;
/// every step once a reached step jumps to a computed target (as the compiler's APL0016
/// reasons: reachability cannot be decided then).
pub fn reachable(graph: &StepGraph) -> Vec<bool> {
    let mut seen = vec![false; graph.steps.len()];
    let mut stack: Vec<usize> = graph.entry().into_iter().collect();
    while let Some(at) = stack.pop() {
        if std::mem::replace(&mut seen[at], true) {
            continue;
        }
        for jump in &graph.steps[at].jumps {
            match jump {
                Jump::Step(to) if *to < seen.len() => stack.push(*to),
                Jump::Dynamic => return vec![true; graph.steps.len()],
                _ => {}
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use aplc_compiler::{Options, compile};

    #[test]
    fn diagnostics_carry_their_span_in_lines_and_columns() {
        let source = "# prompt: a\n## user\nhi\n\n# post: a\n{{ set_context('next_step', 'b') }}\n";
        let c = compile(source, "x.apl", &Options::default());
        let report = check_report(source, "x.apl", &c.diagnostics);
        assert_eq!(report["ok"], false);
        let first = &report["diagnostics"][0];
        assert_eq!(first["code"], "APL0014", "{report}");
        assert_eq!(first["severity"], "error");
        assert!(first["line"].as_u64().unwrap() >= 5, "{first}");
        assert!(first["endColumn"].as_u64().is_some(), "{first}");
        assert!(report["rendered"].as_str().unwrap().contains("x.apl"));
    }

    #[test]
    fn a_did_you_mean_carries_its_edit() {
        let source =
            "# prompt: fin\n## user\nhi\n\n# post: fin\n{{ set_context('next_step', 'fni') }}\n";
        let c = compile(source, "x.apl", &Options::default());
        let report = check_report(source, "x.apl", &c.diagnostics);
        let suggestion = &report["diagnostics"][0]["suggestion"];
        assert_eq!(suggestion["replacement"], "fin", "{report}");
        // `fni` inside the quotes of line 6.
        assert_eq!(suggestion["line"], 6, "{suggestion}");
        assert_eq!(suggestion["column"], 30, "{suggestion}");
        assert_eq!(suggestion["endColumn"], 33, "{suggestion}");
    }

    #[test]
    fn the_graph_marks_unreachable_steps_and_jumps() {
        let source = "# prompt: a\n## user\nhi\n\n# post: a\n{{ set_context('next_step', 'c') }}\n\n\
                      # prompt: b\n## user\nyo\n\n# prompt: c\n## user\nbye\n";
        let c = compile(source, "x.apl", &Options::default());
        let graph = graph_json(source, "x.apl", &c);
        assert_eq!(graph["entry"], 0, "{graph}");
        let steps = graph["steps"].as_array().unwrap();
        let names: Vec<&str> = steps.iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(steps[0]["jumps"][0]["to"], 2);
        let reach: Vec<bool> = steps.iter().map(|s| s["reachable"] == true).collect();
        assert_eq!(reach, [true, false, true]);
    }

    #[test]
    fn source_with_errors_has_no_graph() {
        let c = compile("no heading\n", "x.apl", &Options::default());
        let graph = graph_json("no heading\n", "x.apl", &c);
        assert!(
            graph["steps"].is_null() && graph["entry"].is_null(),
            "{graph}"
        );
        assert_eq!(graph["ok"], false);
    }
}
