//! Hover: what a step, variable, helper or filter is.

use aplc_compiler::Options;
use aplc_compiler::graph::{Ending, Jump};
use lsp_types::{Hover, HoverContents, HoverParams, MarkupContent, MarkupKind, Uri};

use super::{View, with_view};
use crate::docs;
use crate::document::{Document, Target};

pub(crate) fn hover(
    p: &HoverParams,
    _: &Uri,
    doc: &mut Document,
    options: &Options,
) -> Result<Option<Hover>, String> {
    let position = p.text_document_position_params.position;
    Ok(with_view(doc, options, |v| {
        let target = v.analysis.at(v.text, v.offset(position))?;
        let (text, span) = match &target {
            Target::Step(name, span) => (step(&v, name), *span),
            Target::Variable(name, span) => (variable(&v, name), *span),
            Target::Function(name, span) => (function(name)?, *span),
            Target::Filter(name, span) => (filter(name)?, *span),
        };
        Some(Hover {
            contents: HoverContents::Markup(MarkupContent {
                kind: MarkupKind::Markdown,
                value: text,
            }),
            range: Some(v.range(span)),
        })
    }))
}

/// A step: its phases, and its edges in the step graph.
fn step(v: &View<'_>, name: &str) -> String {
    let mut out = format!("**step** `{name}`");
    let Some(step) = v.analysis.step(name) else {
        return out + "\n\nno step has this name";
    };
    let phases: Vec<&str> = step.phases.iter().map(|p| p.kind).collect();
    out += &format!("\n\nphases: {}", phases.join(", "));
    let graph = &v.analysis.outline.graph;
    let Some(index) = graph.steps.iter().position(|s| s.name == name) else {
        return out;
    };
    let from: Vec<String> = graph
        .steps
        .iter()
        .filter(|s| s.jumps.contains(&Jump::Step(index)))
        .map(|s| format!("`{}`", s.name))
        .collect();
    let entry = if index == 0 { "the entry step; " } else { "" };
    out += &format!(
        "\n\n{entry}reached from: {}",
        if from.is_empty() {
            "no literal jump".to_string()
        } else {
            from.join(", ")
        }
    );
    let graph_step = &graph.steps[index];
    let to: Vec<String> = graph_step
        .jumps
        .iter()
        .map(|j| match j {
            Jump::Step(s) => format!("`{}`", graph.steps.get(*s).map_or("?", |s| &s.name)),
            Jump::Return => "`return`".to_string(),
            Jump::Dynamic => "a computed step".to_string(),
            Jump::Unknown(n) => format!("`{n}` (no such step)"),
        })
        .collect();
    out += &format!(
        "\n\ngoes to: {}",
        if to.is_empty() {
            "nowhere".to_string()
        } else {
            to.join(", ")
        }
    );
    let ends: Vec<&str> = graph_step
        .ends
        .iter()
        .map(|e: &Ending| e.describe())
        .collect();
    if !ends.is_empty() {
        out += &format!("\n\nthe run can end here: {}", ends.join("; "));
    }
    out
}

/// A variable: a built-in's type and meaning, or where a user variable is first set.
fn variable(v: &View<'_>, name: &str) -> String {
    if let Some((ty, meaning)) = docs::variable(name) {
        return format!("**built-in** `{name}`: {ty}\n\n{meaning}");
    }
    if v.analysis.outline.inputs.iter().any(|i| i == name) {
        return format!("**input** `{name}`: declared by `{{# inputs: … #}}`");
    }
    match v.analysis.first_write(name) {
        Some(span) => {
            let line = v.range(span).start.line + 1;
            format!("**variable** `{name}`: first set on line {line}")
        }
        None => format!("**variable** `{name}`: nothing in this file sets it"),
    }
}

fn function(name: &str) -> Option<String> {
    let (signature, doc) = docs::helper(name)?;
    Some(format!("```jinja\n{signature}\n```\n{doc}"))
}

fn filter(name: &str) -> Option<String> {
    Some(format!("**filter** `{name}`\n\n{}", docs::filter(name)?))
}
