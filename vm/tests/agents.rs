//! Agents that call agents in the machine (`spec/agents.md`): a child run inside its
//! parent's machine, by `call_agent` and by an agent tool, with a scripted provider whose
//! answers are taken in call order across the tree.

use std::sync::Arc;
use std::time::Duration;

use aplc_compiler::{Options, compile};
use aplc_vm::bundle::{Bundle, LinkedAgent};
use aplc_vm::human::{HumanAnswer, Reply};
use aplc_vm::journal::{Input, JournalError};
use aplc_vm::tools::{ToolRegistry, ToolSpec};
use aplc_vm::{Action, Machine, Program, RunErrorKind, RunOptions, ScriptedProvider};
use serde_json::{Value as Json, json};

fn bundle(source: &str, name: &str) -> Bundle {
    let compiled = compile(source, name, &Options::for_run(false));
    let diagnostics: Vec<String> = compiled
        .diagnostics
        .iter()
        .map(|d| d.message.clone())
        .collect();
    compiled
        .bundle
        .unwrap_or_else(|| panic!("{name}: {diagnostics:?}"))
}

/// `root` with `children` (name, source) linked into its bundle.
fn linked(root: &str, children: &[(&str, &str)]) -> Arc<Program> {
    let mut root = bundle(root, "root.apl");
    let mut agents: Vec<LinkedAgent> = children
        .iter()
        .map(|(name, source)| LinkedAgent {
            name: (*name).to_owned(),
            bundle: bundle(source, &format!("{name}.apl")),
        })
        .collect();
    agents.sort_by(|a, b| a.name.cmp(&b.name));
    root.agents = agents;
    // Through the bytes, as a shipped bundle is loaded.
    let bytes = aplc_vm::bundle::encode(&root).unwrap();
    Arc::new(Program::load(&bytes).unwrap())
}

/// What a run took and made: every input, in order, with the position after it.
struct Ran {
    outcome: aplc_vm::RunOutcome,
    events: Vec<Json>,
    inputs: Vec<(Input, aplc_vm::journal::Position)>,
}

/// Drives `program` by hand: the provider is scripted, tools echo, and every request a
/// person would get is answered with `"yes"`.
fn drive(program: Arc<Program>, options: RunOptions, script: Json) -> Ran {
    let mut machine = Machine::new(program, options);
    let mut provider = ScriptedProvider::from_json(&script.to_string()).unwrap();
    let mut events = Vec::new();
    let mut inputs = Vec::new();
    let mut t = 0;
    loop {
        t += 1;
        let at = Duration::from_millis(t);
        let mut give = |machine: &mut Machine, input: Input| {
            let action = machine.apply(input.clone());
            inputs.push((input, machine.position()));
            action
        };
        let action = give(&mut machine, Input::Poll { at });
        events.extend(machine.drain_events().map(|e| e.to_json()));
        match action {
            Action::CallProvider(_) => {
                let result = provider.next_response();
                let _ = give(&mut machine, Input::Provider { at, result });
            }
            Action::CallTool(call) => {
                let result = Ok(json!({"ran": call.name, "with": call.arguments}));
                let _ = give(&mut machine, Input::Tool { at, result });
            }
            Action::AwaitInput => {
                let ids: Vec<String> = machine
                    .pending_requests()
                    .iter()
                    .map(|r| r.id.clone())
                    .collect();
                for id in ids {
                    let answer = HumanAnswer {
                        id,
                        reply: Reply::Value(json!("yes")),
                        by: "test".into(),
                        answered_at_ms: 1,
                    };
                    assert_eq!(machine.check_answer(&answer), Ok(()));
                    let _ = give(&mut machine, Input::Answer { at, answer });
                }
            }
            Action::Continue => {}
            Action::Done => {
                return Ran {
                    outcome: machine.into_outcome(),
                    events,
                    inputs,
                };
            }
        }
        events.extend(machine.drain_events().map(|e| e.to_json()));
    }
}

fn events_on() -> RunOptions {
    RunOptions {
        events: true,
        ..RunOptions::default()
    }
}

const TRANSLATOR: &str = "{# inputs: content, target_lang #}\n\
# prompt: translate\n## user\nTranslate {{ content }} into {{ target_lang }}.\n";

const DELEGATES: &str = "# prompt: write\n## user\nWrite a line.\n\n\
# post: write\n{{ set_context('call_agent', {'agent': 'translator', \
'context': {'content': result_text, 'target_lang': 'Portuguese'}}) }}\
{{ set_context('next_step', 'report') }}\n\n\
# prompt: report\n## user\nTranslated: {{ agent_result.result_text }} \
({{ agent_result.status }})\n";

#[test]
fn a_step_delegates_and_the_parent_goes_on_with_agent_result() {
    let program = linked(DELEGATES, &[("translator", TRANSLATOR)]);
    let ran = drive(program, events_on(), json!(["hello", "olá", "done"]));
    let outcome = &ran.outcome;
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    let context = outcome.context_json();
    let result = &context["agent_result"];
    assert_eq!(result["status"], "completed");
    assert_eq!(result["result_text"], "olá");
    assert_eq!(result["content"], "hello");
    assert!(result.get("context_history").is_none(), "{result}");
    assert!(result.get("error").is_none(), "{result}");
    // `call_agent` ran once and was reset.
    assert_eq!(context["call_agent"], Json::Null);
    // The third answer went to the parent's second step, which saw the child's result.
    assert_eq!(context["result_text"], "done");
    let prompt = context["prompts"].to_string();
    assert!(prompt.contains("Translated: olá (completed)"), "{prompt}");
    // Steps of the whole tree: write, translate, report.
    assert_eq!(outcome.steps, 3);

    // The child's events join the sequence with their path, between agent_started and
    // agent_finished; seq has no gap; totals count the child's call.
    let seqs: Vec<u64> = ran
        .events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    let kinds: Vec<&str> = ran
        .events
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    let started = kinds.iter().position(|k| *k == "agent_started").unwrap();
    let finished = kinds.iter().position(|k| *k == "agent_finished").unwrap();
    assert_eq!(ran.events[started]["agent"], "translator");
    assert_eq!(ran.events[started]["step"], "write");
    assert!(ran.events[started].get("path").is_none());
    let inside = &ran.events[started + 1..finished];
    assert!(!inside.is_empty());
    assert!(
        inside.iter().all(|e| e["path"] == "translator"),
        "{inside:?}"
    );
    assert!(inside.iter().any(|e| e["type"] == "provider_call"));
    assert!(
        !inside
            .iter()
            .any(|e| e["type"] == "run_started" || e["type"] == "run_finished")
    );
    assert_eq!(ran.events[finished]["outcome"], "completed");
    assert_eq!(ran.events[finished]["totals"]["provider_calls"], 1);
    let last = ran.events.last().unwrap();
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["totals"]["provider_calls"], 3);
    assert_eq!(last["totals"]["steps"], 3);
}

#[test]
fn a_failed_child_does_not_abort_the_parent() {
    // The call leaves out the child's declared input `target_lang`.
    let parent = DELEGATES.replace(", 'target_lang': 'Portuguese'", "");
    let program = linked(&parent, &[("translator", TRANSLATOR)]);
    let ran = drive(program, events_on(), json!(["hello", "done"]));
    assert!(ran.outcome.error.is_none(), "{:?}", ran.outcome.error);
    let context = ran.outcome.context_json();
    let result = &context["agent_result"];
    assert_eq!(result["status"], "failed");
    assert_eq!(result["error"], "missing input: target_lang");
    // The next step saw it in `errors` (its snapshot has them), and the run ends with
    // them (completed with errors).
    let history = context["context_history"].as_array().unwrap();
    assert_eq!(history[0]["errors"], json!([]));
    let errors = history[1]["errors"].to_string();
    assert!(
        errors.contains("agent `translator` failed: missing input: target_lang"),
        "{errors}"
    );
    let finished = ran
        .events
        .iter()
        .find(|e| e["type"] == "agent_finished")
        .unwrap();
    assert_eq!(finished["outcome"], "failed");
    assert_eq!(finished["error"]["kind"], "missing_input");
    assert_eq!(
        ran.events.last().unwrap()["outcome"],
        "completed_with_errors"
    );
}

#[test]
fn an_unknown_agent_or_a_bad_value_fails_the_call_not_the_run() {
    for (value, says) in [
        ("{'agent': 'nobody'}", "unknown agent `nobody`"),
        ("'translator'", "expected a mapping"),
        ("{'context': {}}", "`agent` is missing"),
        (
            "{'agent': 'translator', 'context': 3}",
            "`context` must be a mapping",
        ),
    ] {
        let source = format!(
            "# prompt: a\n## user\ngo\n\n# post: a\n{{{{ set_context('call_agent', {value}) }}}}\
             {{{{ set_context('next_step', 'b') }}}}\n\n# prompt: b\n## user\ngo\n\n\
             # post: b\n{{{{ set_context('seen', errors) }}}}\n"
        );
        let program = linked(&source, &[("translator", TRANSLATOR)]);
        let ran = drive(program, events_on(), json!(["ok", "ok"]));
        assert!(
            ran.outcome.error.is_none(),
            "{value}: {:?}",
            ran.outcome.error
        );
        let context = ran.outcome.context_json();
        assert_eq!(context["agent_result"]["status"], "failed", "{value}");
        let seen = context["seen"].to_string();
        assert!(seen.contains(says), "{value}: {seen}");
    }
}

#[test]
fn the_model_picks_an_agent_tool_and_gets_its_result() {
    let program = linked(
        "# prompt: a\n## user\nTranslate something.\n\n\
         # post: a\n{% if runs < 2 %}{{ set_context('next_step', 'a') }}{% endif %}\n",
        &[("translator", TRANSLATOR)],
    );
    let mut registry = ToolRegistry::new();
    let tool = ToolSpec::new(json!({"name": "translate", "parameters": {"type": "object"}}))
        .unwrap()
        .agent("translator");
    registry.register(tool).unwrap();
    let options = RunOptions {
        tools: Arc::new(registry),
        ..events_on()
    };
    let call = json!({"tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "translate",
        "arguments": json!({"content": "hi", "target_lang": "French"}).to_string()}}]});
    let bad = json!({"tool_calls": [{"id": "c2", "type": "function", "function": {
        "name": "translate", "arguments": json!({"content": "hi"}).to_string()}}]});
    let ran = drive(program, options, json!([call, "salut", bad]));
    assert!(ran.outcome.error.is_none(), "{:?}", ran.outcome.error);
    let context = ran.outcome.context_json();
    let history = context["context_history"].as_array().unwrap();
    let first = &history[0]["result_tool_calls"][0];
    assert_eq!(first["with_error"], false, "{first}");
    assert_eq!(first["content"], "salut");
    // A child that fails is a failed call.
    let second = &context["result_tool_calls"][0];
    assert_eq!(second["with_error"], true, "{second}");
    assert_eq!(
        second["content"],
        "tool execution failed: `translate`: agent `translator` failed: missing input: \
         target_lang"
    );
    let started = ran
        .events
        .iter()
        .find(|e| e["type"] == "agent_started")
        .unwrap();
    assert_eq!(started["call_id"], "c1");
}

#[test]
fn a_child_with_result_json_returns_it_to_the_tool_call() {
    let child = "# prompt: count\n## user\nCount.\n\n# post: count\n\
                 {{ set_context('result_json', {'n': 3}) }}\n";
    let program = linked("# prompt: a\n## user\ngo\n", &[("counter", child)]);
    let mut registry = ToolRegistry::new();
    let tool = ToolSpec::new(json!({"name": "count", "parameters": {"type": "object"}}))
        .unwrap()
        .agent("counter");
    registry.register(tool).unwrap();
    let options = RunOptions {
        tools: Arc::new(registry),
        ..RunOptions::default()
    };
    let call = json!({"tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "count", "arguments": "{}"}}]});
    let ran = drive(program, options, json!([call, "three"]));
    let context = ran.outcome.context_json();
    assert_eq!(context["result_tool_calls"][0]["content"], json!({"n": 3}));
}

/// An agent that calls itself `levels` times deep, through its own linked copy.
const RECURSES: &str = "# prompt: r\n## user\ngo\n\n# post: r\n{% if (level | default(0)) < 20 %}\
{{ set_context('call_agent', {'agent': 'rec', 'context': {'level': (level | default(0)) + 1}}) }}\
{% endif %}\n";

#[test]
fn recursion_stops_at_the_depth_limit() {
    let program = linked(RECURSES, &[("rec", RECURSES)]);
    let options = RunOptions {
        max_agent_depth: 3,
        ..events_on()
    };
    let ran = drive(program, options, json!(["ok", "ok", "ok", "ok"]));
    assert!(ran.outcome.error.is_none(), "{:?}", ran.outcome.error);
    let context = ran.outcome.context_json();
    // Depth 1 ran depth 2, which ran depth 3, whose own call was refused.
    let mut result = &context["agent_result"];
    for _ in 0..2 {
        assert_eq!(result["status"], "completed", "{result}");
        result = &result["agent_result"];
    }
    assert_eq!(result["status"], "completed", "{result}");
    let refused = result["agent_result"]["error"].as_str().unwrap();
    assert!(refused.contains("past the limit of 3"), "{refused}");
    let paths: Vec<&str> = ran
        .events
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert!(paths.contains(&"rec/rec/rec"), "{paths:?}");
}

#[test]
fn a_childs_steps_count_towards_the_parents_budget() {
    let child =
        "# prompt: loop\n## user\ngo\n\n# post: loop\n{{ set_context('next_step', 'loop') }}\n";
    let parent = "# prompt: a\n## user\ngo\n\n# post: a\n\
                  {{ set_context('call_agent', {'agent': 'spin'}) }}\
                  {{ set_context('next_step', 'b') }}\n\n# prompt: b\n## user\ngo\n";
    let program = linked(parent, &[("spin", child)]);
    let options = RunOptions {
        max_steps: 10,
        ..RunOptions::default()
    };
    let ran = drive(program, options, json!(vec!["ok"; 12]));
    // The child spends the budget (9 steps after the parent's first) and fails; the
    // parent cannot enter `b`.
    let context = ran.outcome.context_json();
    assert_eq!(context["agent_result"]["status"], "failed");
    let error = ran.outcome.error.expect("the parent fails too");
    assert_eq!(error.kind, RunErrorKind::StepBudgetExceeded);
    assert_eq!(ran.outcome.steps, 10);
}

#[test]
fn a_child_that_asks_pauses_the_whole_run_and_says_who_asked() {
    let child = "# prompt: ask\n## user\ngo\n\n\
                 # post: ask\n{{ set_context('await_input', {'prompt': 'OK?'}) }}\n";
    let parent = "# prompt: a\n## user\ngo\n\n\
                  # post: a\n{{ set_context('call_agent', {'agent': 'asker'}) }}\n";
    let program = linked(parent, &[("asker", child)]);
    let mut machine = Machine::new(program.clone(), events_on());
    let mut provider = ScriptedProvider::from_json(r#"["ok", "ok"]"#).unwrap();
    let at = Duration::from_millis(1);
    let action = loop {
        match machine.apply(Input::Poll { at }) {
            Action::Continue => {}
            Action::CallProvider(_) => {
                let result = provider.next_response();
                let _ = machine.apply(Input::Provider { at, result });
            }
            other => break other,
        }
    };
    assert!(matches!(action, Action::AwaitInput), "{action:?}");
    let pending = machine.pending_requests();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, "asker/1-0");
    assert_eq!(pending[0].agent.as_deref(), Some("asker"));
    assert_eq!(pending[0].step, "ask");
    // No checkpoint while a child runs: a resume replays the child.
    assert!(matches!(
        machine.checkpoint(0),
        Err(JournalError::NotAtRest(_))
    ));
    // Nobody to ask ends the whole run, not only the child.
    machine.abandon_input("nobody answers".into());
    assert!(matches!(machine.apply(Input::Poll { at }), Action::Done));
    let outcome = machine.into_outcome();
    assert_eq!(
        outcome.error.map(|e| e.kind),
        Some(RunErrorKind::InputUnavailable)
    );

    // Answered, the child goes on and the parent gets its result.
    let ran = drive(program, events_on(), json!(["ok", "ok"]));
    let context = ran.outcome.context_json();
    assert_eq!(context["agent_result"]["human_input"], "yes");
}

#[test]
fn a_replay_of_the_inputs_rebuilds_the_tree() {
    let program = linked(DELEGATES, &[("translator", TRANSLATOR)]);
    let live = drive(
        program.clone(),
        events_on(),
        json!(["hello", "olá", "done"]),
    );
    // Every recorded position is checked on the way (inside the child included), and
    // the replay makes the same events and the same end.
    let mut machine = Machine::new(program, events_on());
    let mut events = Vec::new();
    for (index, (input, position)) in live.inputs.iter().enumerate() {
        let _ = machine
            .replay(index as u64, input.clone(), Some(*position))
            .unwrap_or_else(|e| panic!("input {index}: {e}"));
        events.extend(machine.drain_events().map(|e| e.to_json()));
    }
    assert_eq!(events, live.events);
    assert_eq!(
        machine.into_outcome().context_json(),
        live.outcome.context_json()
    );
}

/// Runs a run of `DELEGATES` into its child's provider call (the parent's answered).
fn to_the_childs_call(machine: &mut Machine, at: Duration) {
    let mut answered = false;
    loop {
        match machine.apply(Input::Poll { at }) {
            Action::CallProvider(_) if !answered => {
                answered = true;
                let result = Ok(aplc_vm::Completion::text("hello"));
                let _ = machine.apply(Input::Provider { at, result });
            }
            Action::CallProvider(_) => return,
            Action::Continue => {}
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_child_cannot_outlive_its_parent() {
    let program = linked(DELEGATES, &[("translator", TRANSLATOR)]);
    let options = events_on();
    let cancel = options.interrupt.clone();
    let mut machine = Machine::new(program, options);
    let at = Duration::from_millis(1);
    to_the_childs_call(&mut machine, at);
    assert!(machine.pending_requests().is_empty());
    // Cancelled while the child waits for its provider: the driver drops the call and
    // polls, and the child and then its parent end cancelled.
    cancel.cancel();
    assert!(matches!(machine.apply(Input::Poll { at }), Action::Done));
    let events: Vec<Json> = machine.drain_events().map(|e| e.to_json()).collect();
    let finished = events
        .iter()
        .find(|e| e["type"] == "agent_finished")
        .unwrap();
    assert_eq!(finished["outcome"], "cancelled", "{finished}");
    let outcome = machine.into_outcome();
    assert_eq!(outcome.error.map(|e| e.kind), Some(RunErrorKind::Cancelled));

    // Past the parent's deadline while the child waits: a timeout for both.
    let program = linked(DELEGATES, &[("translator", TRANSLATOR)]);
    let options = RunOptions {
        timeout: Duration::from_millis(100),
        ..events_on()
    };
    let mut machine = Machine::new(program, options);
    to_the_childs_call(&mut machine, at);
    let late = Duration::from_millis(150);
    let _ = machine.apply(Input::Timeout { at: late });
    assert!(matches!(
        machine.apply(Input::Poll { at: late }),
        Action::Done
    ));
    let outcome = machine.into_outcome();
    assert_eq!(outcome.error.map(|e| e.kind), Some(RunErrorKind::Timeout));
    let result = &outcome.vars.get("agent_result").unwrap();
    assert_eq!(result.get_attr("status").unwrap().as_str(), Some("failed"));
}

/// A journaled tree without events (a durable run nobody listens to) takes the same
/// inputs to the same positions as with events on, the child's events counted into the
/// parent's sequence, and a replay of its journal with events on makes the live events.
#[test]
fn a_journaled_tree_without_events_counts_its_childs() {
    let program = linked(DELEGATES, &[("translator", TRANSLATOR)]);
    let script = json!(["hello", "olá", "done"]);
    let live = drive(program.clone(), events_on(), script.clone());
    let counted = RunOptions {
        journaled: true,
        ..RunOptions::default()
    };
    let quiet = drive(program.clone(), counted, script);
    assert!(quiet.events.is_empty());
    assert_eq!(quiet.inputs, live.inputs);
    let mut machine = Machine::new(program, events_on());
    let mut events = Vec::new();
    for (index, (input, position)) in quiet.inputs.iter().enumerate() {
        let _ = machine
            .replay(index as u64, input.clone(), Some(*position))
            .unwrap_or_else(|e| panic!("input {index}: {e}"));
        events.extend(machine.drain_events().map(|e| e.to_json()));
    }
    assert_eq!(events, live.events);
    let finished = events.last().unwrap();
    assert_eq!(finished["totals"]["provider_calls"], 3, "{finished}");
}
