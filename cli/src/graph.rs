//! `aplc graph`: the step graph of an agent as Graphviz DOT or a Mermaid flowchart.
//!
//! Steps are nodes, in source order. The entry step is marked (DOT: an arrow from a
//! point node `start`; Mermaid: a `start` circle), and so is every step after which the
//! run can end (DOT: a double border; Mermaid: the `ends` class, a thick border):
//! a step without a post phase, a post phase that may leave `next_step` unset, or one
//! that can set `return` or a computed target. Literal jumps are solid edges; a jump to
//! `return` is a solid edge to the `return` node; a computed target is a dashed edge to
//! the `*` node ("any step"); a literal naming no step is a dotted edge to a node
//! `unknown: <name>` (only a bundle compiled with `Options::for_run` can have one:
//! `build` and `graph` reject such source). `spec/graph.md` documents the output.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use aplc_compiler::AgentName;
use aplc_compiler::graph::{Jump, StepGraph};
use aplc_vm::bundle::{self, Bundle};
use aplc_vm::text::escape_control;
use clap::{Args, ValueEnum};

use crate::compile::{check_options, compile_linked};
use crate::input::{into_text, print_linked, read_bytes};
use crate::{CompileArgs, Failure};

#[derive(Args, Debug)]
pub(crate) struct GraphArgs {
    /// The agent: .apl source or a bundle (recognised by its magic bytes).
    file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = GraphFormat::Dot)]
    format: GraphFormat,
    #[command(flatten)]
    compile: CompileArgs,
}

/// The formats of `aplc graph`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GraphFormat {
    /// Graphviz DOT (`dot -Tsvg`).
    Dot,
    /// A Mermaid flowchart.
    Mermaid,
}

pub(crate) fn graph(args: &GraphArgs) -> Result<ExitCode, Failure> {
    let bundle = load(&args.file, &args.compile)?;
    let Some(bundle) = bundle else {
        return Ok(ExitCode::from(2));
    };
    let graph = StepGraph::from_bundle(&bundle);
    let text = match args.format {
        GraphFormat::Dot => dot(&bundle, &graph),
        GraphFormat::Mermaid => mermaid(&bundle, &graph),
    };
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (`aplc graph … | head`) is not a failure.
    // Labels drop control characters already; this also catches bidirectional overrides.
    let text = escape_control(&text);
    let _ = std::io::Write::write_all(&mut stdout, text.as_bytes())
        .and_then(|_| std::io::Write::flush(&mut stdout));
    Ok(ExitCode::SUCCESS)
}

/// A bundle from a file, or `None` when the source has errors (already printed).
fn load(file: &Path, args: &CompileArgs) -> Result<Option<Bundle>, Failure> {
    let bytes = read_bytes(file)?;
    if bundle::is_bundle(&bytes) {
        if args.relaxed {
            eprintln!(
                "warning: --relaxed has no effect on a bundle: it was fixed when the bundle was built"
            );
        }
        return bundle::decode(&bytes)
            .map(Some)
            .map_err(|e| Failure::run(format!("{}: unreadable bundle: {e}", file.display())));
    }
    let source = into_text(file, bytes)?;
    let linked = compile_linked(file, &source, &check_options(args, false), args, Vec::new());
    print_linked(&linked, file, &source);
    Ok(linked.bundle)
}

/// Graphviz DOT. Node ids are `s0`, `s1`, … so that any step name is safe; names are
/// labels. Each linked agent is a `cluster_<k>` subgraph labelled with its name, its
/// node ids prefixed `a<k>_`; a `call_agent` is a bold edge from the calling step to
/// the agent's entry step, or a dashed one to `agent_any` when the name is computed.
pub(crate) fn dot(bundle: &Bundle, graph: &StepGraph) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", dot_string(&bundle.source_name));
    let _ = writeln!(out, "  rankdir=LR;");
    let _ = writeln!(out, "  node [shape=box];");
    dot_steps(&mut out, graph, "", "  ");
    for (k, agent) in bundle.agents.iter().enumerate() {
        let _ = writeln!(out, "  subgraph cluster_{k} {{");
        let _ = writeln!(out, "    label={};", dot_string(&agent.name));
        dot_steps(
            &mut out,
            &StepGraph::from_bundle(&agent.bundle),
            &format!("a{k}_"),
            "    ",
        );
        out.push_str("  }\n");
    }
    let calls = agent_calls(bundle);
    if calls.iter().any(|c| c.to.is_none()) {
        let _ = writeln!(
            out,
            "  agent_any [label=\"agent *\", shape=component, style=dashed, tooltip=\"an agent named at run time\"];"
        );
    }
    for call in &calls {
        let _ = match &call.to {
            Some(to) => writeln!(
                out,
                "  {} -> {to} [style=bold, label=\"call_agent\"];",
                call.from
            ),
            None => writeln!(out, "  {} -> agent_any [style=dashed];", call.from),
        };
    }
    out.push_str("}\n");
    out
}

/// The nodes and edges of one program's step graph, ids prefixed with `p`.
fn dot_steps(out: &mut String, graph: &StepGraph, p: &str, indent: &str) {
    if let Some(entry) = graph.entry() {
        let _ = writeln!(out, "{indent}{p}start [shape=point];");
        let _ = writeln!(out, "{indent}{p}start -> {p}s{entry};");
    }
    for (i, step) in graph.steps.iter().enumerate() {
        let ends = if step.ends.is_empty() {
            ""
        } else {
            ", peripheries=2"
        };
        let _ = writeln!(
            out,
            "{indent}{p}s{i} [label={}{ends}];",
            dot_string(&step.name)
        );
    }
    let jumps = || graph.steps.iter().flat_map(|s| &s.jumps);
    if jumps().any(|j| *j == Jump::Return) {
        let _ = writeln!(
            out,
            "{indent}{p}return [label=\"return\", shape=doublecircle];"
        );
    }
    if jumps().any(|j| *j == Jump::Dynamic) {
        let _ = writeln!(
            out,
            "{indent}{p}any [label=\"*\", shape=circle, style=dashed, tooltip=\"a computed next_step: any step\"];"
        );
    }
    let unknown = unknown_targets(graph);
    let unknown_id = |name: &str| unknown.get(name).copied().unwrap_or(0);
    for (name, k) in &unknown {
        let _ = writeln!(
            out,
            "{indent}{p}u{k} [label={}, shape=octagon, color=red];",
            dot_string(&format!("unknown: {name}"))
        );
    }
    for (i, step) in graph.steps.iter().enumerate() {
        for jump in &step.jumps {
            let _ = match jump {
                Jump::Step(t) => writeln!(out, "{indent}{p}s{i} -> {p}s{t};"),
                Jump::Return => writeln!(out, "{indent}{p}s{i} -> {p}return;"),
                Jump::Dynamic => writeln!(out, "{indent}{p}s{i} -> {p}any [style=dashed];"),
                Jump::Unknown(name) => writeln!(
                    out,
                    "{indent}{p}s{i} -> {p}u{} [style=dotted, color=red];",
                    unknown_id(name)
                ),
            };
        }
    }
}

/// A `call_agent` edge: node ids of the calling step and of the called agent's entry
/// step (`None`: the name is computed, or names no linked agent).
struct CallEdge {
    from: String,
    to: Option<String>,
}

/// Every `call_agent` of the root and of each linked agent, as edges between node ids.
fn agent_calls(bundle: &Bundle) -> Vec<CallEdge> {
    let entry_of = |name: &str| {
        let k = bundle
            .agents
            .binary_search_by(|a| a.name.as_str().cmp(name))
            .ok()?;
        (!bundle.agents[k].bundle.steps.is_empty()).then(|| format!("a{k}_s0"))
    };
    let programs = std::iter::once((String::new(), bundle)).chain(
        bundle
            .agents
            .iter()
            .enumerate()
            .map(|(k, a)| (format!("a{k}_"), &a.bundle)),
    );
    let mut edges = Vec::new();
    for (prefix, program) in programs {
        for (step, name) in aplc_compiler::bundle_agent_calls(program) {
            let to = match name {
                AgentName::Literal(name) => entry_of(&name),
                AgentName::Dynamic => None,
            };
            edges.push(CallEdge {
                from: format!("{prefix}s{step}"),
                to,
            });
        }
    }
    edges
}

/// A Mermaid flowchart, with the same nodes and edges as [`dot`]; each linked agent is
/// a `subgraph`.
pub(crate) fn mermaid(bundle: &Bundle, graph: &StepGraph) -> String {
    let mut out = String::from("flowchart LR\n");
    let mut ends = mermaid_steps(&mut out, graph, "");
    for (k, agent) in bundle.agents.iter().enumerate() {
        let _ = writeln!(out, "  subgraph a{k}[{}]", mermaid_string(&agent.name));
        let graph = StepGraph::from_bundle(&agent.bundle);
        ends.extend(mermaid_steps(&mut out, &graph, &format!("a{k}_")));
        out.push_str("  end\n");
    }
    let calls = agent_calls(bundle);
    if calls.iter().any(|c| c.to.is_none()) {
        let _ = writeln!(out, "  agent_any[[\"agent *\"]]");
    }
    for call in &calls {
        let _ = match &call.to {
            Some(to) => writeln!(out, "  {} == call_agent ==> {to}", call.from),
            None => writeln!(out, "  {} -.-> agent_any", call.from),
        };
    }
    if !ends.is_empty() {
        let _ = writeln!(out, "  classDef ends stroke-width:4px,stroke-dasharray:0");
        let _ = writeln!(out, "  class {} ends", ends.join(","));
    }
    out
}

/// The nodes and edges of one program's step graph, ids prefixed with `p`; returns the
/// ids of the steps after which the run can end.
fn mermaid_steps(out: &mut String, graph: &StepGraph, p: &str) -> Vec<String> {
    if let Some(entry) = graph.entry() {
        let _ = writeln!(out, "  {p}start(( )) --> {p}s{entry}");
    }
    for (i, step) in graph.steps.iter().enumerate() {
        let _ = writeln!(out, "  {p}s{i}[{}]", mermaid_string(&step.name));
    }
    let jumps = || graph.steps.iter().flat_map(|s| &s.jumps);
    if jumps().any(|j| *j == Jump::Return) {
        let _ = writeln!(out, "  {p}ret((return))");
    }
    if jumps().any(|j| *j == Jump::Dynamic) {
        let _ = writeln!(out, "  {p}any((\"*\"))");
    }
    let unknown = unknown_targets(graph);
    let unknown_id = |name: &str| unknown.get(name).copied().unwrap_or(0);
    for (name, k) in &unknown {
        let _ = writeln!(
            out,
            "  {p}u{k}{{{{{}}}}}",
            mermaid_string(&format!("unknown: {name}"))
        );
    }
    for (i, step) in graph.steps.iter().enumerate() {
        for jump in &step.jumps {
            let _ = match jump {
                Jump::Step(t) => writeln!(out, "  {p}s{i} --> {p}s{t}"),
                Jump::Return => writeln!(out, "  {p}s{i} --> {p}ret"),
                Jump::Dynamic => writeln!(out, "  {p}s{i} -.-> {p}any"),
                Jump::Unknown(name) => {
                    writeln!(out, "  {p}s{i} -. unknown .-> {p}u{}", unknown_id(name))
                }
            };
        }
    }
    graph
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.ends.is_empty())
        .map(|(i, _)| format!("{p}s{i}"))
        .collect()
}

/// A DOT string literal.
fn dot_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A quoted Mermaid label; quotes and markup characters become entity codes.
fn mermaid_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("#quot;"),
            '#' => out.push_str("#35;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The names of unknown jump targets, sorted, each once, with their node numbers: one
/// node per name in both formats. A map, so that looking a name up stays cheap however
/// many there are.
fn unknown_targets(graph: &StepGraph) -> BTreeMap<&str, usize> {
    let names: BTreeSet<&str> = graph
        .steps
        .iter()
        .flat_map(|s| &s.jumps)
        .filter_map(|j| match j {
            Jump::Unknown(name) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    names.into_iter().enumerate().map(|(k, n)| (n, k)).collect()
}
