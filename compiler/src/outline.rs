//! What an editor needs to know about a file: its steps and phases with their spans,
//! every `next_step` write, the variables each template reads and writes, the helpers
//! and filters it uses, and the step graph.
//!
//! Built by [`compile_with_outline`](crate::compile_with_outline) from the very syntax
//! tree and IR that [`compile`](crate::compile) checks, so a language server sees the
//! file exactly as the compiler does and never parses it with rules of its own. A file
//! with errors still has an outline: every phase heading that parsed, and every template
//! that did.
//!
//! Not in here: anything about the editor protocol (positions in UTF-16, requests);
//! `aplc-lsp` does that.

use aplc_vm::bundle::{Role, TemplateKind};

use crate::analyze::{TSpan, Target};
use crate::ast::File;
use crate::diagnostic::Span;
use crate::graph::{self, Flow, StepGraph};
use crate::ir::Ir;
use crate::relaxed::TemplateMap;

/// A file as an editor sees it. Spans are byte ranges in the source.
#[derive(Debug, Clone, Default)]
pub struct Outline {
    /// The steps in file order, as the phase headings group them (a step ends at the
    /// first phase heading whose identifier differs), duplicates included.
    pub steps: Vec<StepOutline>,
    /// Every template (phase body or role section) that the compiler kept.
    pub templates: Vec<TemplateOutline>,
    /// Every `next_step` write of every template, in template order.
    pub jumps: Vec<JumpSite>,
    /// The step graph of the steps the compiler kept (duplicates and steps without a
    /// prompt phase are not in it).
    pub graph: StepGraph,
    /// The inputs the file declares with `{# inputs: … #}`.
    pub inputs: Vec<String>,
}

/// One step: adjacent phase headings with the same identifier.
#[derive(Debug, Clone)]
pub struct StepOutline {
    /// The identifier (`default` when the heading has none).
    pub name: String,
    /// The identifier in the first heading (the whole heading when it has none).
    pub name_span: Span,
    /// From the first heading to the end of the last phase's body.
    pub span: Span,
    /// The phases in file order.
    pub phases: Vec<PhaseOutline>,
}

/// One phase of a step.
#[derive(Debug, Clone)]
pub struct PhaseOutline {
    /// `pre`, `prompt` or `post`.
    pub kind: &'static str,
    /// The heading line.
    pub heading: Span,
    /// The identifier in the heading (the whole heading when it has none).
    pub name_span: Span,
    /// From the heading to the end of the body.
    pub span: Span,
    /// The `##` lines of the phase and their sections.
    pub sections: Vec<SectionOutline>,
}

/// A `##` line and the lines up to the next one.
#[derive(Debug, Clone)]
pub struct SectionOutline {
    /// The heading line's text.
    pub text: String,
    /// The role it names, if it names one.
    pub role: Option<Role>,
    /// The heading line.
    pub heading: Span,
    /// From the heading to the end of the section.
    pub span: Span,
}

/// One template and the names it uses.
#[derive(Debug, Clone)]
pub struct TemplateOutline {
    /// The step it belongs to.
    pub step: String,
    /// The phase (and role) it renders.
    pub kind: TemplateKind,
    /// Its text in the source.
    pub span: Span,
    /// Variables it reads from the run's context, where.
    pub reads: Vec<(String, Span)>,
    /// Variables a helper writes under a literal name: the name's string literal.
    pub writes: Vec<(String, Span)>,
    /// Functions it calls (helpers and globals), the whole call.
    pub calls: Vec<(String, Span)>,
    /// Filters it applies, where.
    pub filters: Vec<(String, Span)>,
}

/// A `set_context('next_step', …)` (or a dialect's `next(…)`) call.
#[derive(Debug, Clone)]
pub struct JumpSite {
    /// The step whose template makes the call.
    pub step: String,
    /// True in a post phase, the only one whose `next_step` decides the jump.
    pub post: bool,
    /// The step named by a string literal (`return` included); `None` when computed or
    /// empty.
    pub target: Option<String>,
    /// The whole call.
    pub call: Span,
    /// The value's expression: the string literal, quotes included, for a literal.
    pub value: Option<Span>,
}

/// Builds the outline from the syntax tree and the IR of one compilation.
pub(crate) fn build(file: &File<'_>, ir: &Ir) -> Outline {
    let step_name = |i: usize| ir.steps.get(i).map_or("", |s| s.name.as_str());
    let mut templates = Vec::with_capacity(ir.templates.len());
    let mut jumps = Vec::new();
    for t in &ir.templates {
        // A template of a step the compiler dropped (no prompt phase) has no step entry;
        // it still gets an outline under the name of the heading above it.
        let step = match ir.steps.get(t.step) {
            Some(s) => s.name.clone(),
            None => step_at(file, t.span.start).unwrap_or_default(),
        };
        let map = |spans: &[(String, TSpan)]| mapped(&t.map, spans);
        templates.push(TemplateOutline {
            step: step.clone(),
            kind: t.kind,
            span: t.span,
            reads: map(&t.facts.reads),
            writes: map(&t.facts.write_sites),
            calls: map(&t.facts.calls),
            filters: map(&t.facts.filters),
        });
        for n in &t.facts.next_steps {
            jumps.push(JumpSite {
                step: step.clone(),
                post: t.kind == TemplateKind::Post,
                target: match &n.target {
                    Target::Literal(name) => Some(name.clone()),
                    Target::End | Target::Dynamic => None,
                },
                call: t.map.span(n.span.0, n.span.1),
                value: n.value.map(|(s, e)| t.map.span(s, e)),
            });
        }
    }
    Outline {
        steps: steps(file),
        templates,
        jumps,
        graph: step_graph(ir, &step_name),
        inputs: ir.inputs.clone(),
    }
}

/// Maps template-relative spans to the source.
fn mapped(map: &TemplateMap, spans: &[(String, TSpan)]) -> Vec<(String, Span)> {
    spans
        .iter()
        .map(|(name, (s, e))| (name.clone(), map.span(*s, *e)))
        .collect()
}

/// The graph of the IR's steps, by the same flows the graph checks use.
fn step_graph<'a>(ir: &'a Ir, step_name: &dyn Fn(usize) -> &'a str) -> StepGraph {
    let index = graph::name_index(ir.steps.iter().map(|s| s.name.as_str()));
    let steps = ir
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let flow = match step.post.and_then(|p| ir.templates.get(p)) {
                None => Flow::default(),
                Some(t) => Flow::of_post(&t.facts, &index, |(s, e)| t.map.span(s, e)),
            };
            flow.graph_step(step_name(i))
        })
        .collect();
    StepGraph { steps }
}

/// The identifier of the last phase heading at or before `offset`.
fn step_at(file: &File<'_>, offset: usize) -> Option<String> {
    file.phases
        .iter()
        .take_while(|p| p.heading.span.start <= offset)
        .filter_map(|p| p.heading.parsed)
        .last()
        .map(|h| h.name.map_or("default", |(n, _)| n).to_string())
}

/// Groups the parsed phase headings into steps, as `lower.rs` does: a step ends at the
/// first phase heading whose identifier differs. Invalid headings belong to no step.
fn steps(file: &File<'_>) -> Vec<StepOutline> {
    let mut steps: Vec<StepOutline> = Vec::new();
    for phase in &file.phases {
        let Some(header) = phase.heading.parsed else {
            continue;
        };
        let (name, name_span) = header
            .name
            .map_or(("default", phase.heading.span), |(n, s)| (n, s));
        let span = Span::new(phase.heading.span.start, phase.body.end);
        let sections = phase
            .sections
            .iter()
            .filter_map(|s| {
                let h = s.heading?;
                Some(SectionOutline {
                    text: h.text.to_string(),
                    role: h.role,
                    heading: h.span,
                    span: Span::new(h.span.start, s.body.end),
                })
            })
            .collect();
        let outline = PhaseOutline {
            kind: header.kind.as_str(),
            heading: phase.heading.span,
            name_span,
            span,
            sections,
        };
        match steps.last_mut().filter(|s| s.name == name) {
            Some(step) => {
                step.span = step.span.cover(span);
                step.phases.push(outline);
            }
            None => steps.push(StepOutline {
                name: name.to_string(),
                name_span,
                span,
                phases: vec![outline],
            }),
        }
    }
    steps
}
