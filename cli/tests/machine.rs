//! The machine's sans-IO contract, driven by hand with simulated time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aplc_compiler::{Options, compile};
use aplc_runtime::driver::{self, Scripted, Toolbox};
use aplc_vm::tools::{ToolRegistry, ToolSpec};
use aplc_vm::{Action, Limits, Machine, Program, RunErrorKind, RunOptions, ScriptedProvider};

fn program(source: &str) -> Arc<Program> {
    let c = compile(source, "test.apl", &Options::default());
    let bundle = c.bundle.unwrap_or_else(|| panic!("{:?}", c.diagnostics));
    Arc::new(Program::from_bundle(bundle, Limits::default()).unwrap())
}

fn reply(text: &str) -> Result<aplc_vm::Completion, aplc_vm::ProviderError> {
    Ok(aplc_vm::Completion::text(text))
}

const LOOP: &str = "# prompt: a\nhi\n# post: a\n{{ set_context('next_step', 'a') }}\n";

#[test]
fn poll_returns_at_every_step_end_so_a_providerless_loop_times_out() {
    // The prompt never renders, so no provider call is ever made: only `poll` returning
    // at each step end lets the driver's clock advance.
    let p = program("# prompt: a\n{{ missing }}\n# post: a\n{{ set_context('next_step', 'a') }}\n");
    let start = Duration::ZERO;
    let options = RunOptions {
        timeout: Duration::from_millis(100),
        ..RunOptions::default()
    };
    let mut m = Machine::new(p, options);
    let mut polls = 0u64;
    loop {
        polls += 1;
        let now = start + Duration::from_millis(polls);
        match m.poll(now) {
            Action::Continue => {}
            Action::Done | Action::AwaitInput => break,
            Action::CallProvider(_) | Action::CallTool(_) => {
                panic!("the prompt failed; no provider or tool call expected")
            }
        }
        assert!(polls < 1_000, "the run did not time out");
    }
    let outcome = m.into_outcome();
    let error = outcome.error.expect("timed out");
    assert_eq!(error.kind, RunErrorKind::Timeout);
    assert!(
        error.message.contains("timeout of 100 ms"),
        "{}",
        error.message
    );
    // Poll k enters step k at k ms; poll 100 finds the deadline passed.
    assert_eq!(outcome.steps, 99);
}

#[test]
fn deadline_passing_during_a_provider_call() {
    let start = Duration::ZERO;
    let options = RunOptions {
        timeout: Duration::from_millis(50),
        ..RunOptions::default()
    };
    let mut m = Machine::new(program(LOOP), options);
    assert!(matches!(m.poll(start), Action::CallProvider(_)));
    assert_eq!(m.deadline(), start + Duration::from_millis(50));
    // Too early: nothing happens.
    m.handle_timeout(start + Duration::from_millis(10));
    m.handle_timeout(start + Duration::from_millis(50));
    assert!(matches!(
        m.poll(start + Duration::from_millis(51)),
        Action::Done
    ));
    assert_eq!(m.into_outcome().error.unwrap().kind, RunErrorKind::Timeout);
}

#[test]
fn a_response_arriving_after_the_deadline_times_out() {
    let start = Duration::ZERO;
    let options = RunOptions {
        timeout: Duration::from_millis(50),
        ..RunOptions::default()
    };
    let mut m = Machine::new(program(LOOP), options);
    assert!(matches!(m.poll(start), Action::CallProvider(_)));
    m.handle_provider_response(start + Duration::from_millis(60), reply("late"));
    assert!(matches!(
        m.poll(start + Duration::from_millis(61)),
        Action::Done
    ));
    let outcome = m.into_outcome();
    assert_eq!(outcome.result_text(), "", "a late response is not applied");
    assert_eq!(outcome.error.unwrap().kind, RunErrorKind::Timeout);
}

#[test]
fn misuse_is_a_protocol_error_not_a_panic() {
    let start = Duration::ZERO;
    let mut m = Machine::new(program(LOOP), RunOptions::default());
    m.handle_provider_response(start, reply("unasked"));
    assert!(matches!(m.poll(start), Action::Done));
    assert_eq!(m.into_outcome().error.unwrap().kind, RunErrorKind::Protocol);

    let mut m = Machine::new(program(LOOP), RunOptions::default());
    assert!(matches!(m.poll(start), Action::CallProvider(_)));
    assert!(
        matches!(m.poll(start), Action::Done),
        "poll while a call is outstanding"
    );
    assert_eq!(m.into_outcome().error.unwrap().kind, RunErrorKind::Protocol);

    let m = Machine::new(program(LOOP), RunOptions::default());
    assert_eq!(m.into_outcome().error.unwrap().kind, RunErrorKind::Protocol);
}

#[test]
fn the_budget_is_checked_before_each_call() {
    let start = Duration::ZERO;
    let options = RunOptions {
        max_runs: Some(2),
        ..RunOptions::default()
    };
    let mut m = Machine::new(program(LOOP), options);
    let mut calls = 0;
    loop {
        match m.poll(start) {
            Action::CallProvider(request) => {
                calls += 1;
                assert_eq!(request.model, "gpt-4o");
                m.handle_provider_response(start, reply("ok"));
            }
            Action::CallTool(_) => panic!("no tools in this program"),
            Action::Continue => {}
            Action::Done | Action::AwaitInput => break,
        }
    }
    assert_eq!(calls, 2);
    let outcome = m.into_outcome();
    let error = outcome.error.unwrap();
    assert_eq!(
        (error.kind, error.message.as_str()),
        (RunErrorKind::BudgetExceeded, "Run budget exceeded")
    );
    assert_eq!(error.step.as_deref(), Some("a"));
    assert_eq!(
        outcome.history.len(),
        2,
        "the aborted visit adds no snapshot"
    );
}

#[test]
fn with_context_refuses_views_and_reserved_names() {
    for name in ["context", "context_history", "memory", "set_context"] {
        let options = RunOptions::default()
            .with_context_json(serde_json::json!({ name: 1 }).as_object().unwrap());
        let mut m = Machine::new(program(LOOP), options);
        assert!(matches!(m.poll(Duration::ZERO), Action::Done));
        assert_eq!(
            m.into_outcome().error.unwrap().kind,
            RunErrorKind::InvalidOptions,
            "{name}"
        );
    }
}

/// On real time (no paused clock: tokio's `test-util` would put a mutex on the clock of
/// the binary's build too, or make the README's two commands build tokio twice): calls
/// end at 1 s and 2 s, the third would at 3 s; half a second of slack either way.
#[tokio::test]
async fn the_tokio_driver_enforces_the_timeout_on_a_slow_provider() {
    let script = ScriptedProvider::from_json(r#"["a", "b", "c"]"#).unwrap();
    let provider = Scripted::new(script).with_latency(Duration::from_secs(1));
    let options = RunOptions {
        timeout: Duration::from_millis(2500),
        ..RunOptions::default()
    };
    let outcome = driver::run(program(LOOP), options, &provider).await;
    assert_eq!(
        outcome.history.len(),
        2,
        "two calls fit in 2.5 s, the third does not"
    );
    assert_eq!(outcome.error.unwrap().kind, RunErrorKind::Timeout);
}

fn tool_call_reply(name: &str, args: &str) -> Result<aplc_vm::Completion, aplc_vm::ProviderError> {
    aplc_vm::wire::openai::decode_value(
        &serde_json::json!({"choices": [{"message": {"role": "assistant", "content": null,
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": name, "arguments": args}}]}}]}),
    )
}

#[test]
fn no_tool_runs_once_the_deadline_has_passed() {
    let mut registry = ToolRegistry::new();
    registry
        .register(ToolSpec::new(serde_json::json!({"name": "t"})).unwrap())
        .unwrap();
    let options = RunOptions {
        timeout: Duration::from_millis(50),
        tools: Arc::new(registry),
        ..RunOptions::default()
    };
    let start = Duration::ZERO;
    let mut m = Machine::new(program("# prompt: a\nhi\n"), options);
    assert!(matches!(m.poll(start), Action::CallProvider(_)));
    m.handle_provider_response(
        start + Duration::from_millis(10),
        tool_call_reply("t", "{}"),
    );
    // The response was in time; the tool would start after the deadline.
    match m.poll(start + Duration::from_millis(50)) {
        Action::Done => {}
        other => panic!("expected the run to time out, got {other:?}"),
    }
    assert_eq!(m.into_outcome().error.unwrap().kind, RunErrorKind::Timeout);
}

#[tokio::test]
async fn embedders_register_closures_as_tools() {
    let mut toolbox = Toolbox::new();
    let spec = ToolSpec::new(serde_json::json!({
        "name": "add",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                       "required": ["x", "y"]}
    }))
    .unwrap();
    toolbox
        .register_fn(spec, |args, _ctx| {
            Ok(serde_json::json!(
                args["x"].as_i64().unwrap_or(0) + args["y"].as_i64().unwrap_or(0)
            ))
        })
        .unwrap();
    let spec = ToolSpec::new(serde_json::json!({"name": "model"}))
        .unwrap()
        .with_context(true);
    toolbox
        .register_async(spec, |_args, ctx| async move {
            Ok(ctx.map(|c| c["model"].clone()).unwrap_or_default())
        })
        .unwrap();
    let script = ScriptedProvider::from_json(
        r#"[{"tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "add", "arguments": "{\"x\": 40, \"y\": 2}"}},
            {"id": "2", "type": "function", "function": {"name": "model", "arguments": "{}"}}
        ]}]"#,
    )
    .unwrap();
    let outcome = driver::run_with_tools(
        program("# prompt: a\nhi\n"),
        RunOptions::default(),
        &Scripted::new(script),
        &toolbox,
    )
    .await;
    assert!(outcome.error.is_none());
    let json = outcome.context_json();
    assert_eq!(json["result_tool_calls"][0]["content"], 42);
    assert_eq!(json["result_tool_calls"][1]["content"], "gpt-4o");
    assert_eq!(json["tools"].as_array().unwrap().len(), 2);
}

/// Declared inputs travel in the bundle, and every way of starting a run checks them in
/// `Machine::new`: the machine by hand, `run_scripted` and the tokio driver all end the
/// run before any provider call, with one `missing input: <name>` line per input.
#[tokio::test]
async fn declared_inputs_are_required_by_every_runner() {
    let p = program("{# inputs: customer, topic #}\n# prompt: a\n{{ customer }} {{ topic }}\n");
    assert_eq!(p.bundle().inputs, ["customer", "topic"]);
    let check = |outcome: aplc_vm::RunOutcome, expected: &str| {
        let error = outcome.error.expect("the run fails");
        assert_eq!(error.kind, RunErrorKind::MissingInput);
        assert_eq!(error.message, expected);
        assert_eq!(outcome.steps, 0);
        assert_eq!(outcome.history.len(), 0);
    };
    let both = "missing input: customer\nmissing input: topic";
    let start = Duration::ZERO;

    let mut m = Machine::new(p.clone(), RunOptions::default());
    assert!(matches!(m.poll(start), Action::Done));
    check(m.into_outcome(), both);

    let topic_only = RunOptions::default()
        .with_context_json(serde_json::json!({"topic": "refunds"}).as_object().unwrap());
    let mut script = ScriptedProvider::from_json(r#"["never used"]"#).unwrap();
    let outcome = aplc_vm::run_scripted(p.clone(), topic_only, &mut script, || start);
    check(outcome, "missing input: customer");

    let provider = Scripted::new(ScriptedProvider::from_json(r#"["never used"]"#).unwrap());
    let outcome =
        driver::run_with_tools(p.clone(), RunOptions::default(), &provider, &Toolbox::new()).await;
    check(outcome, both);

    // With every input given, the run goes ahead.
    let all = RunOptions::default().with_context_json(
        serde_json::json!({"customer": "Ada", "topic": "refunds"})
            .as_object()
            .unwrap(),
    );
    let mut script = ScriptedProvider::from_json(r#"["done"]"#).unwrap();
    let outcome = aplc_vm::run_scripted(p, all, &mut script, || start);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(outcome.result_text(), "done");
}

/// Issue #9, runaway loops: a post phase that retries on errors against a provider that
/// fails for good never counts towards `max_runs`; the step budget ends it, and the
/// failure says what the step kept failing on.
#[test]
fn a_retry_loop_against_a_failing_provider_ends_at_the_step_budget() {
    let start = Duration::ZERO;
    let mut m = Machine::new(program(LOOP), RunOptions::default());
    let mut calls = 0u64;
    loop {
        match m.poll(start) {
            Action::CallProvider(_) => {
                calls += 1;
                let error = aplc_vm::ProviderError::new(
                    aplc_vm::ProviderErrorKind::Auth,
                    "HTTP 401: invalid api key \u{1b}[2J",
                );
                m.handle_provider_response(start, Err(error));
            }
            Action::CallTool(_) => panic!("no tools in this program"),
            Action::Continue => {}
            Action::Done | Action::AwaitInput => break,
        }
        assert!(
            calls <= aplc_vm::DEFAULT_MAX_STEPS,
            "the loop ran past the budget"
        );
    }
    let outcome = m.into_outcome();
    assert_eq!(outcome.steps, aplc_vm::DEFAULT_MAX_STEPS);
    assert_eq!(calls, aplc_vm::DEFAULT_MAX_STEPS);
    let error = outcome.error.expect("the budget ends the run");
    assert_eq!(error.kind, RunErrorKind::StepBudgetExceeded);
    assert!(
        error
            .message
            .starts_with("Step budget exceeded: 1000 steps"),
        "{}",
        error.message
    );
    assert!(
        error
            .message
            .contains("(last errors in step `a`: provider error: HTTP 401: invalid api key"),
        "{}",
        error.message
    );
    assert!(!error.message.contains('\u{1b}'), "{}", error.message);
}

#[test]
fn the_step_budget_is_an_option_and_counts_steps_entered() {
    let start = Duration::ZERO;
    let options = RunOptions {
        max_steps: 3,
        ..RunOptions::default()
    };
    let mut m = Machine::new(program(LOOP), options);
    loop {
        match m.poll(start) {
            Action::CallProvider(_) => m.handle_provider_response(start, reply("ok")),
            Action::CallTool(_) => panic!("no tools in this program"),
            Action::Continue => {}
            Action::Done | Action::AwaitInput => break,
        }
    }
    let outcome = m.into_outcome();
    assert_eq!(outcome.steps, 3);
    assert_eq!(outcome.history.len(), 3);
    let error = outcome.error.unwrap();
    // Successful steps have no errors to show: the message is exactly the spec's.
    assert_eq!(error.message, "Step budget exceeded: 3 steps");

    // A run that needs more steps than the default raises the budget.
    let options = RunOptions {
        max_steps: 2_500,
        max_runs: Some(2_200),
        ..RunOptions::default()
    };
    let mut m = Machine::new(program(LOOP), options);
    loop {
        match m.poll(start) {
            Action::CallProvider(_) => m.handle_provider_response(start, reply("ok")),
            Action::CallTool(_) => panic!("no tools in this program"),
            Action::Continue => {}
            Action::Done | Action::AwaitInput => break,
        }
    }
    let outcome = m.into_outcome();
    assert_eq!(outcome.error.unwrap().kind, RunErrorKind::BudgetExceeded);
    assert_eq!(outcome.history.len(), 2_200);
}

/// Issue #9, F14: a timeout in the middle of a batch of tool calls keeps the results of
/// the calls that already ran (they may have had side effects) and gives the running and
/// the unstarted calls a failed entry each.
#[test]
fn a_timeout_during_a_tool_batch_keeps_the_finished_calls() {
    let mut registry = ToolRegistry::new();
    registry
        .register(ToolSpec::new(serde_json::json!({"name": "t"})).unwrap())
        .unwrap();
    let options = RunOptions {
        timeout: Duration::from_millis(50),
        tools: Arc::new(registry),
        ..RunOptions::default()
    };
    let call = |id: &str| serde_json::json!({"id": id, "type": "function", "function": {"name": "t", "arguments": "{}"}});
    let response = serde_json::json!({"choices": [{"message": {"role": "assistant",
        "content": null, "tool_calls": [call("1"), call("2"), call("3"), call("4")]}}]});
    let at = Duration::from_millis;
    let start = Duration::ZERO;
    let mut m = Machine::new(program("# prompt: a\nhi\n"), options);
    assert!(matches!(m.poll(start), Action::CallProvider(_)));
    m.handle_provider_response(start, aplc_vm::wire::openai::decode_value(&response));
    assert!(matches!(m.poll(start), Action::CallTool(_)));
    m.handle_tool_result(start, Ok(serde_json::json!("done 1")));
    assert!(matches!(m.poll(start), Action::CallTool(_)));
    m.handle_tool_result(start, Err("exit status 3".into()));
    // The third call is running when the deadline passes.
    assert!(matches!(m.poll(start), Action::CallTool(_)));
    m.handle_timeout(at(60).max(start + Duration::from_millis(50)));
    assert!(matches!(m.poll(at(61)), Action::Done));
    let outcome = m.into_outcome();
    let error = outcome.error.clone().unwrap();
    assert_eq!(error.kind, RunErrorKind::Timeout);
    assert!(error.message.contains("exit status 3"), "{}", error.message);
    // The message quotes what went wrong before the timeout, not the entries it added.
    assert!(
        !error.message.contains("the run ended"),
        "{}",
        error.message
    );
    let json = outcome.context_json();
    let results = json["result_tool_calls"].as_array().unwrap();
    assert_eq!(results.len(), 4, "{results:?}");
    assert_eq!(results[0]["content"], "done 1");
    assert_eq!(results[0]["with_error"], false);
    for (i, want) in [
        (1, "exit status 3"),
        (2, "while the tool was running"),
        (3, "before the call"),
    ] {
        assert_eq!(results[i]["with_error"], true, "{results:?}");
        let content = results[i]["content"].as_str().unwrap();
        assert!(content.contains(want), "{content}");
    }
    assert_eq!(json["errors"].as_array().unwrap().len(), 3);
}

/// A pre phase that runs for minutes within its fuel: each iteration copies 8 MB.
const SLOW_RENDER: &str = "# pre: a\n{% set s = 'x' * 4000000 %}{% for i in range(100000) %}{% set t = s ~ s %}{% endfor %}\n# prompt: a\nhi\n";

#[test]
fn an_interrupt_stops_a_render_midway_and_cancels_the_run() {
    let options = RunOptions::default();
    let interrupt = options.interrupt.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        interrupt.cancel();
    });
    let started = Instant::now();
    let mut provider = ScriptedProvider::from_json(r#"["never"]"#).unwrap();
    let outcome = aplc_vm::run_scripted(program(SLOW_RENDER), options, &mut provider, move || {
        started.elapsed()
    });
    canceller.join().unwrap();
    let error = outcome.error.expect("cancelled");
    assert_eq!(error.kind, RunErrorKind::Cancelled, "{}", error.message);
    assert_eq!(error.message, "Run cancelled");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(outcome.history.is_empty(), "the step did not finish");
}

#[tokio::test]
async fn the_tokio_driver_stops_a_slow_render_at_the_deadline() {
    // A current-thread runtime, as the CLI's: no tokio timer can fire during the render,
    // only the watchdog thread.
    let provider = Scripted::new(ScriptedProvider::from_json(r#"["never"]"#).unwrap());
    let options = RunOptions {
        timeout: Duration::from_millis(300),
        ..RunOptions::default()
    };
    let started = Instant::now();
    let outcome = driver::run(program(SLOW_RENDER), options, &provider).await;
    let error = outcome.error.expect("timed out");
    assert_eq!(error.kind, RunErrorKind::Timeout, "{}", error.message);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// A toolbox given a redactor scrubs its tools' results and error messages before the
/// run records them (the CLI gives it the run's provider secrets).
#[tokio::test]
async fn a_toolbox_redacts_tool_results_and_errors() {
    let key = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789";
    let mut toolbox = Toolbox::new();
    let spec = |name: &str| ToolSpec::new(serde_json::json!({"name": name})).unwrap();
    toolbox
        .register_fn(spec("ok"), move |_, _| Ok(serde_json::json!({"echo": key})))
        .unwrap();
    toolbox
        .register_fn(spec("fail"), move |_, _| Err(format!("bad key {key}")))
        .unwrap();
    toolbox.redact_with(aplc_runtime::Redactor::new([key]));
    let script = ScriptedProvider::from_json(
        r#"[{"tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "ok", "arguments": "{}"}},
            {"id": "2", "type": "function", "function": {"name": "fail", "arguments": "{}"}}
        ]}]"#,
    )
    .unwrap();
    let outcome = driver::run_with_tools(
        program("# pre: a\n{{ set_context('allowed_tools', ['ok', 'fail']) }}\n# prompt: a\nhi\n"),
        RunOptions::default(),
        &Scripted::new(script),
        &toolbox,
    )
    .await;
    let json = outcome.context_json();
    assert_eq!(
        json["result_tool_calls"][0]["content"]["echo"],
        "<redacted>"
    );
    let text = json.to_string();
    assert!(!text.contains(&key[..16]), "{text}");
    assert!(text.contains("bad key <redacted>"), "{text}");
}

/// A request no provider could encode is never handed to one: the machine reports it as
/// the step's provider error and goes on, and the script is not consumed.
#[test]
fn an_unbuildable_request_skips_the_call_whatever_the_provider() {
    let p = program(
        "# pre: a\n{{ set_context('output_mode', 'structured_output') }}\
         {{ set_context('output_structure', '{not json') }}\n# prompt: a\nhi\n",
    );
    let mut script = ScriptedProvider::from_json(r#"["never sent"]"#).unwrap();
    let outcome = aplc_vm::run_scripted(p, RunOptions::default(), &mut script, || Duration::ZERO);
    assert_eq!(script.remaining(), 1, "no call was made");
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(
        outcome.last_step_errors,
        [
            "provider error: `output_structure` is not valid JSON: key must be a string at line 1 column 2"
        ]
    );
    assert_eq!(outcome.result_text(), "");
}
