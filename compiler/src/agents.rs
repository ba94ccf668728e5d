//! The agents a program calls by name: what the compiler finds in its templates
//! (`spec/agents.md` §2). The linker (`link.rs`) resolves them; `aplc graph` draws them.

use crate::diagnostic::Span;

/// The agent a `set_context('call_agent', {…})` names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

/// The agents each step of `bundle` names in a `call_agent` write of any of its phases:
/// `(step index, name)`, sorted, each pair once. For `aplc graph` and `aplc
/// inspect`, which see a bundle, not its source. A bundle is untrusted: a template too
/// deep to analyse names nothing here (the VM refuses to load it anyway).
pub fn bundle_agent_calls(bundle: &aplc_vm::bundle::Bundle) -> Vec<(usize, AgentName)> {
    let mut calls = std::collections::BTreeSet::new();
    for t in &bundle.templates {
        let Some(facts) = aplc_vm::check_depth(&t.source)
            .ok()
            .and_then(|()| crate::analyze::analyze(&t.source).ok())
        else {
            continue;
        };
        for call in facts.agent_calls {
            let name = call.name.map_or(AgentName::Dynamic, AgentName::Literal);
            calls.insert((t.step.index(), name));
        }
    }
    calls.into_iter().collect()
}
