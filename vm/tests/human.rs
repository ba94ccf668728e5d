//! People in the loop in the machine (`spec/human.md`): requests, answers, and what
//! they do to the run, with a scripted provider and answers handed in by hand.

use std::sync::Arc;
use std::time::Duration;

use aplc_compiler::{Options, compile};
use aplc_vm::human::{HumanAnswer, InputRequest, Reply, RequestKind};
use aplc_vm::journal::Input;
use aplc_vm::tools::{Approval, HumanTool, ToolRegistry, ToolSpec};
use aplc_vm::{Action, Machine, Program, RunErrorKind, RunOptions, ScriptedProvider};
use serde_json::{Value as Json, json};

fn program(source: &str) -> Arc<Program> {
    let bundle = compile(source, "t.apl", &Options::for_run(false))
        .bundle
        .expect("compiles");
    Arc::new(Program::from_bundle(bundle, Default::default()).unwrap())
}

fn tools() -> Arc<ToolRegistry> {
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let mut registry = ToolRegistry::new();
    let refund = ToolSpec::new(json!({"name": "refund", "parameters": schema}))
        .unwrap()
        .requires_approval(Approval {
            timeout: Some(Duration::from_secs(60)),
        });
    registry.register(refund).unwrap();
    let ask = ToolSpec::new(json!({"name": "ask", "parameters": {"type": "object"}}))
        .unwrap()
        .human(HumanTool {
            prompt: "Answer the model".into(),
            result_schema: Some(json!({"type": "string"})),
            timeout: None,
        })
        .unwrap();
    registry.register(ask).unwrap();
    Arc::new(registry)
}

/// A run driven by hand: the provider is scripted, tools echo, and `person` answers
/// every request (`None`: nobody answers, the run is abandoned).
fn run(
    source: &str,
    script: Json,
    mut person: impl FnMut(&InputRequest) -> Option<Reply>,
) -> (aplc_vm::RunOutcome, Vec<Json>) {
    let options = RunOptions {
        tools: tools(),
        events: true,
        ..RunOptions::default()
    };
    let mut machine = Machine::new(program(source), options);
    let mut provider = ScriptedProvider::from_json(&script.to_string()).unwrap();
    let mut events = Vec::new();
    let at = Duration::from_millis(1);
    loop {
        let action = machine.apply(Input::Poll { at });
        events.extend(machine.drain_events().map(|e| e.to_json()));
        match action {
            Action::CallProvider(_) => {
                let result = provider.next_response();
                let _ = machine.apply(Input::Provider { at, result });
            }
            Action::CallTool(call) => {
                let result = Ok(json!({"ran": call.name, "with": call.arguments}));
                let _ = machine.apply(Input::Tool { at, result });
            }
            Action::AwaitInput => {
                let pending: Vec<InputRequest> =
                    machine.pending_requests().into_iter().cloned().collect();
                for request in pending {
                    let Some(reply) = person(&request) else {
                        machine.abandon_input("nobody answers".into());
                        break;
                    };
                    let answer = HumanAnswer {
                        id: request.id.clone(),
                        reply,
                        by: "test".into(),
                        answered_at_ms: 7,
                    };
                    assert_eq!(machine.check_answer(&answer), Ok(()));
                    let _ = machine.apply(Input::Answer { at, answer });
                }
            }
            Action::Continue => {}
            Action::Done => return (machine.into_outcome(), events),
        }
        events.extend(machine.drain_events().map(|e| e.to_json()));
    }
}

const TOOLS_AGENT: &str = "# prompt: a\n## user\ngo\n\n# post: a\n{% if runs < 2 %}{{ set_context('next_step', 'a') }}{% endif %}\n";

fn calls(calls: &[(&str, &str, Json)]) -> Json {
    let calls: Vec<Json> = calls
        .iter()
        .map(|(id, name, args)| {
            json!({"id": id, "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    json!({ "tool_calls": calls })
}

#[test]
fn approvals_are_asked_together_and_a_denial_reaches_the_model() {
    let script = json!([
        calls(&[
            ("c1", "refund", json!({"n": 1})),
            ("c2", "refund", json!({"n": "bad"})),
            ("c3", "refund", json!({"n": 3})),
        ]),
        "done"
    ]);
    let mut asked = Vec::new();
    let (outcome, events) = run(TOOLS_AGENT, script, |request| {
        asked.push(request.clone());
        Some(Reply::Approve {
            approved: request.id == "1-1",
            reason: (request.id == "1-3").then(|| "over the limit".to_string()),
        })
    });
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    // The call with invalid arguments is refused by the checks, never asked about.
    let ids: Vec<&str> = asked.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["1-1", "1-3"]);
    assert_eq!(asked[0].kind, RequestKind::Approval);
    assert_eq!(asked[0].arguments, Some(json!({"n": 1})));
    assert_eq!(asked[0].timeout_ms, Some(60_000));
    let context = outcome.context_json();
    let history = context["context_history"].as_array().unwrap();
    let results = &history[0]["result_tool_calls"];
    assert_eq!(results[0]["with_error"], json!(false));
    assert_eq!(results[0]["content"]["ran"], json!("refund"));
    assert_eq!(results[2]["with_error"], json!(true));
    assert_eq!(
        results[2]["content"],
        json!("tool execution failed: `refund`: denied by reviewer: over the limit")
    );
    // The second step's prompt sees the denial in `prompts`' tool results and `errors`.
    let errors = history[0]["errors"].to_string();
    assert!(
        errors.contains("denied by reviewer: over the limit"),
        "{errors}"
    );
    // Both requests were asked before anything ran, and answered before the first call.
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let first_tool = kinds.iter().position(|k| *k == "tool_call").unwrap();
    let requested: Vec<usize> = (0..kinds.len())
        .filter(|&i| kinds[i] == "input_requested")
        .collect();
    assert_eq!(requested.len(), 2);
    assert!(requested.iter().all(|&i| i < first_tool));
    let received = events
        .iter()
        .find(|e| e["type"] == "input_received")
        .unwrap();
    assert_eq!(received["by"], json!("test"));
    assert_eq!(received["approved"], json!(true));
}

#[test]
fn a_human_tool_gives_the_call_its_result_and_a_timeout_fails_it() {
    let script = json!([
        calls(&[("c1", "ask", json!({"q": "why?"}))]),
        calls(&[("c2", "ask", json!({}))]),
        "done"
    ]);
    let (outcome, _) = run(TOOLS_AGENT, script, |request| {
        assert_eq!(request.kind, RequestKind::Tool);
        assert_eq!(request.prompt, "Answer the model");
        Some(if request.id == "1-1" {
            Reply::Value(json!("because"))
        } else {
            Reply::TimedOut
        })
    });
    let context = outcome.context_json();
    let history = context["context_history"].as_array().unwrap();
    assert_eq!(
        history[0]["result_tool_calls"][0]["content"],
        json!("because")
    );
    assert_eq!(
        history[1]["result_tool_calls"][0]["content"],
        json!("tool execution failed: `ask`: no answer within 0 ms")
    );
}

#[test]
fn await_input_pauses_after_the_post_phase_and_fills_human_input() {
    let source = "# prompt: a\n## user\ngo\n\n# post: a\n{{ set_context('await_input', {'prompt': 'Sure?', 'schema': {'type': 'boolean'}}) }}{{ set_context('next_step', 'b') }}\n\n# pre: b\n{{ set_context('seen', human_input) }}\n# prompt: b\n## user\nok\n";
    let mut asked = None;
    let (outcome, _) = run(source, json!(["x", "y"]), |request| {
        asked = Some(request.clone());
        Some(Reply::Value(json!(true)))
    });
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    let request = asked.unwrap();
    assert_eq!(
        (request.id.as_str(), request.kind),
        ("1-0", RequestKind::Input)
    );
    assert_eq!(request.step, "a");
    assert_eq!(request.schema, Some(json!({"type": "boolean"})));
    let context = outcome.context_json();
    assert_eq!(context["seen"], json!(true));
    assert_eq!(context["await_input"], Json::Null);
    // The asking step's snapshot has the answer.
    assert_eq!(context["context_history"][0]["human_input"], json!(true));
}

#[test]
fn a_wrong_answer_is_refused_before_it_reaches_the_run() {
    let source = "# pre: a\n{{ set_context('await_input', {'prompt': 'n?', 'schema': {'type': 'integer'}}) }}\n# prompt: a\n## user\nhi\n";
    let mut machine = Machine::new(program(source), RunOptions::default());
    let mut provider = ScriptedProvider::from_json("[\"x\"]").unwrap();
    loop {
        match machine.poll(Duration::ZERO) {
            Action::AwaitInput => break,
            Action::CallProvider(_) => {
                machine.handle_provider_response(Duration::ZERO, provider.next_response())
            }
            Action::Continue => {}
            other => panic!("{other:?}"),
        }
    }
    let answer = |id: &str, reply: Reply| HumanAnswer {
        id: id.into(),
        reply,
        by: "t".into(),
        answered_at_ms: 0,
    };
    let wrong_kind = machine.check_answer(&answer(
        "1-0",
        Reply::Approve {
            approved: true,
            reason: None,
        },
    ));
    assert!(wrong_kind.unwrap_err().contains("not an approval"));
    let wrong_value = machine.check_answer(&answer("1-0", Reply::Value(json!("x"))));
    assert!(
        wrong_value
            .unwrap_err()
            .contains("does not match its schema")
    );
    let wrong_id = machine.check_answer(&answer("9-9", Reply::Value(json!(1))));
    assert!(wrong_id.unwrap_err().contains("no request `9-9`"));
    assert_eq!(
        machine.check_answer(&answer("1-0", Reply::Value(json!(1)))),
        Ok(())
    );
}

#[test]
fn invalid_await_input_is_an_error_and_nobody_answering_ends_the_run() {
    let (outcome, _) = run(
        "# pre: a\n{{ set_context('await_input', 42) }}\n# prompt: a\n## user\nhi\n",
        json!(["x"]),
        |_| None,
    );
    assert!(outcome.error.is_none());
    let errors = outcome.context_json()["errors"].to_string();
    assert!(errors.contains("invalid await_input"), "{errors}");
    let (outcome, _) = run(
        "# pre: a\n{{ set_context('await_input', 'hi?') }}\n# prompt: a\n## user\nhi\n",
        json!(["x"]),
        |_| None,
    );
    assert_eq!(outcome.error.unwrap().kind, RunErrorKind::InputUnavailable);
}
