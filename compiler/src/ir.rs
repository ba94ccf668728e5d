//! The intermediate representation: steps with their templates, and the step graph.
//!
//! Produced by `lower.rs` once every §1 rule has been checked; consumed by `codegen.rs`.

use aplc_vm::bundle::{Role, TemplateKind};

use crate::agents::AgentCall;
use crate::analyze::Facts;
use crate::diagnostic::Span;
use crate::relaxed::TemplateMap;

/// A checked program.
#[derive(Debug)]
pub(crate) struct Ir {
    /// The inputs declared with `{# inputs: … #}`, each once, in declaration order.
    pub inputs: Vec<String>,
    /// The agent's description: the first preamble comment that declares no inputs.
    pub description: Option<String>,
    /// Steps in source order; index 0 is the entry step.
    pub steps: Vec<Step>,
    /// Every template; steps refer to them by index.
    pub templates: Vec<Template>,
    /// Literal and dynamic `next_step` edges out of post phases.
    pub edges: Vec<Edge>,
    /// Every `set_context('call_agent', …)` of any phase, in template order.
    pub agent_calls: Vec<AgentCall>,
}

/// One step.
#[derive(Debug)]
pub(crate) struct Step {
    pub name: String,
    /// The step's first heading.
    pub span: Span,
    /// The prompt phase heading.
    pub prompt_span: Span,
    pub pre: Option<usize>,
    /// (role, template) pairs in template order.
    pub messages: Vec<(Role, usize)>,
    pub post: Option<usize>,
}

/// One template: a phase body or a role section.
#[derive(Debug)]
pub(crate) struct Template {
    /// The Jinja text (after relaxed desugaring).
    pub source: String,
    pub step: usize,
    pub kind: TemplateKind,
    /// The body's region in the `.apl` source.
    pub span: Span,
    /// Maps offsets in `source` back to the `.apl` source.
    pub map: TemplateMap,
    pub facts: Facts,
}

/// An edge of the step graph.
#[derive(Debug)]
pub(crate) struct Edge {
    pub from: usize,
    pub to: EdgeTo,
    /// The `set_context` call, in the `.apl` source.
    pub span: Span,
}

/// Where an edge goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EdgeTo {
    Step(usize),
    Return,
    Dynamic,
}
