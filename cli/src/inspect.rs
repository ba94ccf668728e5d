//! `aplc inspect`: what a bundle will do, without its source.
//!
//! The listing comes from the VM (`Bundle::listing_with_header`: header fields, step
//! table, instructions, messages, templates with their source spans, edges); the
//! `flow` section after it comes from the compiler's analysis of the post templates
//! (`StepGraph`): the entry step, where each step can jump, and why the run can end
//! after it. Bytes that are not a valid bundle get the decoder's error and exit 1.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use aplc_compiler::graph::{Jump, StepGraph};
use aplc_vm::bundle::{self, Bundle};
use aplc_vm::text::escape_control;
use clap::Args;

use crate::Failure;
use crate::input::read_bytes;

#[derive(Args, Debug)]
pub(crate) struct InspectArgs {
    /// The bundle (built with `aplc build`).
    bundle: PathBuf,
    /// Print a JSON summary instead of the listing: the program's source, hash, inputs
    /// and steps, and the same for each linked agent (spec/agents.md §2.4).
    #[arg(long)]
    json: bool,
}

pub(crate) fn inspect(args: &InspectArgs) -> Result<ExitCode, Failure> {
    let bytes = read_bytes(&args.bundle)?;
    let unreadable = |e: bundle::BundleError| {
        let hint = if bundle::is_bundle(&bytes) {
            ""
        } else {
            " (aplc inspect reads bundles; for .apl source use `aplc check` or `aplc graph`)"
        };
        Failure::run(format!(
            "{}: unreadable bundle: {e}{hint}",
            args.bundle.display()
        ))
    };
    let bundle = bundle::decode(&bytes).map_err(unreadable)?;
    let header = Bundle::read_header(&bytes).map_err(unreadable)?;
    let text = if args.json {
        let mut summary = program_json(&bundle);
        summary["agents"] = bundle
            .agents
            .iter()
            .map(|a| {
                let mut agent = program_json(&a.bundle);
                agent["name"] = a.name.clone().into();
                agent
            })
            .collect();
        format!("{summary:#}\n")
    } else {
        let mut text = bundle.listing_with_header(&header);
        text.push_str(&flow(&StepGraph::from_bundle(&bundle)));
        text.push_str(&agents(&bundle));
        text
    };
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (`aplc inspect … | head`) is not a failure.
    // Step names and template text come from the bundle: escape control characters.
    let text = escape_control(&text);
    let _ = std::io::Write::write_all(&mut stdout, text.as_bytes())
        .and_then(|_| std::io::Write::flush(&mut stdout));
    Ok(ExitCode::SUCCESS)
}

/// The `agents` section: one line per linked agent, with its source, hash, inputs and
/// steps (none when the bundle links no agent).
fn agents(bundle: &Bundle) -> String {
    if bundle.agents.is_empty() {
        return String::new();
    }
    let mut out = format!("\nagents: {} linked\n", bundle.agents.len());
    for agent in &bundle.agents {
        let b = &agent.bundle;
        let steps: Vec<&str> = b.steps.iter().map(|s| s.name.as_str()).collect();
        let _ = writeln!(
            out,
            "  {}  ({}, sha256 {})",
            agent.name,
            b.source_name,
            b.source_hash_hex()
        );
        if !b.inputs.is_empty() {
            let _ = writeln!(out, "        inputs    {}", b.inputs.join(", "));
        }
        let _ = writeln!(out, "        steps     {}", steps.join(", "));
    }
    out
}

/// One program's summary for `--json`.
fn program_json(b: &Bundle) -> serde_json::Value {
    serde_json::json!({
        "source": b.source_name,
        "sha256": b.source_hash_hex(),
        "compiler": b.compiler_version,
        "inputs": b.inputs,
        "steps": b.steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
    })
}

/// The `flow` section: one line per step.
pub(crate) fn flow(graph: &StepGraph) -> String {
    let mut out = String::from("\nflow:\n");
    for (i, step) in graph.steps.iter().enumerate() {
        let jumps: Vec<String> = step
            .jumps
            .iter()
            .map(|j| match j {
                Jump::Step(t) => graph
                    .steps
                    .get(*t)
                    .map_or_else(|| "?".to_string(), |s| s.name.clone()),
                Jump::Return => "return".to_string(),
                Jump::Dynamic => "* (computed)".to_string(),
                Jump::Unknown(name) => format!("{name} (unknown step)"),
            })
            .collect();
        let entry = if graph.entry() == Some(i) {
            " (entry)"
        } else {
            ""
        };
        let _ = writeln!(out, "  s{i:<3} {}{entry}", step.name);
        if !jumps.is_empty() {
            let _ = writeln!(out, "        jumps to  {}", jumps.join(", "));
        }
        if !step.ends.is_empty() {
            let reasons: Vec<&str> = step.ends.iter().map(|e| e.describe()).collect();
            let _ = writeln!(out, "        may end   {}", reasons.join("; "));
        }
    }
    out
}
