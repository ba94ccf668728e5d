//! The agents a program calls by name: what the compiler finds in its templates
//! (`spec/agents.md` §2). The linker (`link.rs`) resolves them; `aplc graph` draws them.

use crate::diagnostic::Span;

/// The agent a `set_context('call_agent', {…})` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentName {
    /// A string literal: the linker resolves it at build time.
    Literal(String),
    /// Computed at run time (or the value is no dict literal): the run resolves it.
    Dynamic,
}

/// A static reference to an agent: one `set_context('call_agent', …)` in a phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCall {
    /// The agent named.
    pub name: AgentName,
    /// The string literal naming the agent, or the whole call for a computed name, in
    /// the `.apl` source.
    pub span: Span,
    /// The keys of the call's `'context'` dict literal (empty without a `'context'`);
    /// `None` when they are not all known at build time.
    pub keys: Option<Vec<String>>,
    /// The step whose phase makes the call.
    pub step: String,
}
