//! The tree of agents a run called (`spec/agents.md`), from its events: `aplc runs show`
//! prints it under the run's summary.

use std::io::Write;

use aplc_vm::text::escape_control;
use serde_json::Value as Json;

/// The agent calls seen so far, in the order they started.
#[derive(Debug, Default)]
pub(crate) struct AgentTree {
    calls: Vec<Call>,
}

/// One child run: where it was called from and how it ended.
#[derive(Debug)]
struct Call {
    /// Its own path: the caller's path, then its name.
    path: String,
    depth: usize,
    step: String,
    call_id: Option<String>,
    /// `None` while it runs.
    outcome: Option<String>,
    steps: Option<u64>,
    error: Option<String>,
}

impl AgentTree {
    /// Takes one event's JSON form; only `agent_started` and `agent_finished` count.
    pub(crate) fn see(&mut self, event: &Json) {
        let caller = event.get("path").and_then(Json::as_str);
        let text = |key: &str| event.get(key).and_then(Json::as_str).map(str::to_owned);
        let agent = text("agent").unwrap_or_default();
        let path = match caller {
            Some(caller) => format!("{caller}/{agent}"),
            None => agent,
        };
        match event.get("type").and_then(Json::as_str) {
            Some("agent_started") => self.calls.push(Call {
                depth: path.matches('/').count(),
                path,
                step: text("step").unwrap_or_default(),
                call_id: text("call_id"),
                outcome: None,
                steps: None,
                error: None,
            }),
            Some("agent_finished") => {
                // The latest call of that path still running: calls of one path never
                // overlap.
                if let Some(call) = self
                    .calls
                    .iter_mut()
                    .rev()
                    .find(|c| c.path == path && c.outcome.is_none())
                {
                    call.outcome = text("outcome");
                    call.steps = event.pointer("/totals/steps").and_then(Json::as_u64);
                    call.error = event
                        .pointer("/error/message")
                        .and_then(Json::as_str)
                        .map(str::to_owned);
                }
            }
            _ => {}
        }
    }

    /// Writes the tree, one call per line, indented by depth; nothing if there was none.
    pub(crate) fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        if self.calls.is_empty() {
            return Ok(());
        }
        writeln!(out, "agents:")?;
        for call in &self.calls {
            let name = call.path.rsplit('/').next().unwrap_or("");
            let mut line = format!(
                "{:indent$}- {} (step `{}`",
                "",
                escape_control(name),
                escape_control(&call.step),
                indent = 2 + 2 * call.depth,
            );
            if let Some(id) = &call.call_id {
                line.push_str(&format!(", tool call {}", escape_control(id)));
            }
            line.push_str("): ");
            match (&call.outcome, call.steps) {
                (Some(outcome), Some(steps)) => {
                    line.push_str(&format!("{}, {steps} steps", escape_control(outcome)));
                }
                (Some(outcome), None) => line.push_str(&escape_control(outcome)),
                (None, _) => line.push_str("running"),
            }
            // One line per call: a message's first line.
            if let Some(error) = call.error.as_deref().and_then(|e| e.lines().next()) {
                line.push_str(&format!(": {}", escape_control(error)));
            }
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_calls_are_indented_and_a_running_one_says_so() {
        let mut tree = AgentTree::default();
        for event in [
            json!({"type": "agent_started", "step": "root", "agent": "mid"}),
            json!({"type": "agent_started", "step": "mid", "agent": "leaf", "path": "mid"}),
            json!({"type": "agent_finished", "step": "mid", "agent": "leaf", "path": "mid",
                   "outcome": "failed", "error": {"kind": "timeout", "message": "late\u{1b}[2J\nmore"},
                   "totals": {"steps": 2}}),
            json!({"type": "agent_finished", "step": "root", "agent": "mid",
                   "outcome": "completed", "totals": {"steps": 4}}),
            json!({"type": "agent_started", "step": "again", "agent": "mid", "call_id": "c1"}),
        ] {
            tree.see(&event);
        }
        let mut out = Vec::new();
        tree.write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "agents:\n  - mid (step `root`): completed, 4 steps\n    - leaf (step `mid`): \
             failed, 2 steps: late\\u{1b}[2J\n  - mid (step `again`, tool call c1): running\n"
        );
        let mut none = Vec::new();
        AgentTree::default().write(&mut none).unwrap();
        assert!(none.is_empty());
    }
}
