//! Durable runs, machine side (`spec/durability.md`): replaying a run's journaled inputs
//! rebuilds it exactly, and a checkpoint taken at any rest point, restored into a new
//! machine, goes on exactly as the original did: same final context, same events.
//!
//! Every `fixtures/run` and `fixtures/tools` agent with a mock is driven with events on,
//! a simulated clock and a deterministic fake tool (it echoes its call), and every input
//! is recorded as an [`Input`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aplc_compiler::{Options, compile};
use aplc_vm::human::{HumanAnswer, Reply, RequestKind};
use aplc_vm::journal::{Checkpoint, Input, JournalError, Position};
use aplc_vm::tools::{Approval, HumanTool, Idempotency, IdempotencyKey, ToolRegistry, ToolSpec};
use aplc_vm::{Action, Limits, Machine, Program, RunError, RunOptions, ScriptedProvider};
use serde_json::{Value as Json, json};

struct Case {
    name: String,
    program: Arc<Program>,
    options: RunOptions,
    script: ScriptedProvider,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The fixtures are files; the crate itself reads none.
#[allow(
    clippy::disallowed_methods,
    reason = "the test reads fixture files; the crate itself does no I/O"
)]
fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn read_json(path: &Path) -> Option<Json> {
    let text = read(path)?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The registry of a `tools.json` manifest: descriptors and idempotency, no commands.
fn registry(manifest: &Json) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    for (name, entry) in manifest.as_object().unwrap() {
        let mut descriptor = entry["descriptor"].clone();
        descriptor
            .as_object_mut()
            .unwrap()
            .entry("name")
            .or_insert(json!(name));
        let mut spec = ToolSpec::new(descriptor)
            .unwrap()
            .with_context(entry.get("with_context").and_then(Json::as_bool) == Some(true));
        if let Some(idem) = entry.get("idempotent") {
            let key = match &idem["key"] {
                Json::Array(params) => IdempotencyKey::Params(
                    params
                        .iter()
                        .map(|p| p.as_str().unwrap().to_string())
                        .collect(),
                ),
                _ => IdempotencyKey::Auto,
            };
            let ttl = idem
                .get("ttl_ms")
                .and_then(Json::as_u64)
                .map(Duration::from_millis);
            spec = spec.idempotent(Idempotency { key, ttl });
        }
        if entry.get("approval").and_then(Json::as_str) == Some("required") {
            let timeout = entry
                .get("approval_timeout_ms")
                .and_then(Json::as_u64)
                .map(Duration::from_millis);
            spec = spec.requires_approval(Approval { timeout });
        }
        if let Some(human) = entry.get("human") {
            spec = spec
                .human(HumanTool {
                    prompt: human["prompt"].as_str().unwrap().to_owned(),
                    result_schema: human.get("result_schema").cloned(),
                    timeout: None,
                })
                .unwrap();
        }
        registry.register(spec).unwrap();
    }
    registry
}

fn load(path: &Path, tools: Option<&Json>) -> Case {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let source = read(path).unwrap();
    let opts = read_json(&path.with_extension("options.json")).unwrap_or(json!({}));
    let context = read_json(&path.with_extension("context.json"));
    let mut compile_options =
        Options::for_run(opts.get("relaxed").and_then(Json::as_bool) == Some(true));
    if let Some(Json::Object(map)) = &context {
        compile_options.inputs = map.keys().cloned().collect();
    }
    let bundle = compile(&source, &name, &compile_options)
        .bundle
        .unwrap_or_else(|| panic!("{name} does not compile"));
    let program = Arc::new(Program::from_bundle(bundle, Limits::default()).unwrap());
    let mut options = RunOptions {
        max_runs: opts.get("max_runs").and_then(Json::as_u64),
        events: true,
        ..RunOptions::default()
    };
    if let Some(steps) = opts.get("max_steps").and_then(Json::as_u64) {
        options.max_steps = steps;
    }
    if let Some(ms) = opts.get("timeout_ms").and_then(Json::as_u64) {
        options.timeout = Duration::from_millis(ms);
    }
    if let Some(Json::Object(map)) = &context {
        options = options.with_context_json(map);
    }
    if let Some(tools) = tools {
        options.tools = Arc::new(registry(tools));
    }
    let mock = read(&path.with_extension("mock.json")).unwrap();
    Case {
        name,
        program,
        options,
        script: ScriptedProvider::from_json(&mock).unwrap(),
    }
}

/// Every fixture agent with a mock.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (dir, manifest) in [
        ("fixtures/run", None),
        ("fixtures/tools", Some("tools.json")),
        ("fixtures/human", Some("tools.json")),
    ] {
        let dir = root().join(dir);
        let tools = manifest.and_then(|m| read_json(&dir.join(m)));
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "apl"))
            .filter(|p| p.with_extension("mock.json").exists())
            .collect();
        paths.sort();
        cases.extend(paths.iter().map(|p| load(p, tools.as_ref())));
    }
    assert!(cases.len() > 30, "found only {} fixtures", cases.len());
    cases
}

/// What a run ended with: the final context (times included: they come from the
/// inputs), the error, the last step's errors and the steps.
type Summary = (Json, Option<RunError>, Vec<String>, u64);

fn summary(machine: Machine) -> Summary {
    let outcome = machine.into_outcome();
    (
        outcome.context_json(),
        outcome.error.clone(),
        outcome.last_step_errors.clone(),
        outcome.steps,
    )
}

fn drain(machine: &mut Machine) -> Vec<Json> {
    machine.drain_events().map(|e| e.to_json()).collect()
}

/// Hands `input` to the machine; the action for a `poll`.
/// Hands `input` to the machine through its one door: the action, for a poll.
fn apply(machine: &mut Machine, input: &Input) -> Option<Action> {
    let poll = matches!(input, Input::Poll { .. });
    let action = machine.apply(input.clone());
    poll.then_some(action)
}

/// A deterministic person: approves the first call of a round and denies the others
/// (with a reason for the second), answers a human tool with its request's id, and
/// an `await_input` with `true`.
fn answers(machine: &Machine, at: Duration) -> Vec<Input> {
    machine
        .pending_requests()
        .into_iter()
        .map(|request| {
            let reply = match request.kind {
                RequestKind::Approval if request.id.ends_with("-2") => Reply::Approve {
                    approved: true,
                    reason: None,
                },
                RequestKind::Approval if request.id.ends_with("-3") => Reply::Approve {
                    approved: false,
                    reason: Some("too much".into()),
                },
                RequestKind::Approval => Reply::TimedOut,
                RequestKind::Tool => Reply::Value(json!(request.id)),
                RequestKind::Input => Reply::Value(json!(true)),
            };
            Input::Answer {
                at,
                answer: HumanAnswer {
                    id: request.id.clone(),
                    reply,
                    by: "test".into(),
                    answered_at_ms: 1,
                },
            }
        })
        .collect()
}

/// One uninterrupted run: its inputs, the events after creation and after each input,
/// and how it ended.
struct Recording {
    inputs: Vec<Input>,
    /// Where the run was after each input, as a journal records it.
    positions: Vec<Position>,
    start_events: Vec<Json>,
    events: Vec<Vec<Json>>,
    summary: Summary,
}

fn record(case: &Case) -> Recording {
    record_with(case, None)
}

/// [`record`], with the `n`th provider call (from 0) left unanswered past the deadline:
/// the driver hands the machine a `Timeout` instead.
fn record_with(case: &Case, timeout_at_call: Option<usize>) -> Recording {
    let mut calls = 0;
    let mut script = case.script.clone();
    script.rewind();
    let mut ticks = 0u64;
    let mut clock = move || {
        ticks += 1;
        Duration::from_millis(ticks)
    };
    let mut machine = Machine::new(case.program.clone(), case.options.clone());
    let start_events = drain(&mut machine);
    let mut inputs = Vec::new();
    let mut positions = Vec::new();
    let mut events = Vec::new();
    loop {
        assert!(inputs.len() < 100_000, "{}: runaway run", case.name);
        let poll = Input::Poll { at: clock() };
        let action = apply(&mut machine, &poll);
        inputs.push(poll);
        positions.push(machine.position());
        events.push(drain(&mut machine));
        let answer = match action {
            Some(Action::CallProvider(_)) if Some(calls) == timeout_at_call => Input::Timeout {
                at: machine.deadline() + Duration::from_millis(1),
            },
            Some(Action::CallProvider(_)) => Input::Provider {
                at: clock(),
                // As journaled: `Completion::raw` is not kept.
                result: script.next_response().map(|mut completion| {
                    completion.raw = None;
                    completion
                }),
            },
            Some(Action::CallTool(invocation)) => Input::Tool {
                at: clock(),
                // A deterministic fake tool: it echoes its call; `fail` fails.
                result: if invocation.name == "fail" {
                    Err("the tool failed".into())
                } else {
                    Ok(json!({"tool": invocation.name, "arguments": invocation.arguments}))
                },
            },
            Some(Action::AwaitInput) => {
                // A person answers every request, one input each, before the next poll.
                for answer in answers(&machine, clock()) {
                    apply(&mut machine, &answer);
                    inputs.push(answer);
                    positions.push(machine.position());
                    events.push(drain(&mut machine));
                }
                continue;
            }
            Some(Action::Continue) => continue,
            Some(Action::Done) | None => break,
        };
        if matches!(answer, Input::Provider { .. } | Input::Timeout { .. }) {
            calls += 1;
        }
        apply(&mut machine, &answer);
        inputs.push(answer);
        positions.push(machine.position());
        events.push(drain(&mut machine));
    }
    Recording {
        inputs,
        positions,
        start_events,
        events,
        summary: summary(machine),
    }
}

#[test]
fn replaying_the_journaled_inputs_rebuilds_the_run() {
    for case in cases() {
        let recording = record(&case);
        let mut machine = Machine::new(case.program.clone(), case.options.clone());
        assert_eq!(drain(&mut machine), recording.start_events, "{}", case.name);
        for (i, input) in recording.inputs.iter().enumerate() {
            let entry = input.encode(recording.positions[i]);
            let (decoded, after) = Input::decode_entry(&entry).unwrap();
            assert_eq!(&decoded, input, "{}: input {i}", case.name);
            if let Err(e) = machine.replay(i as u64, decoded, after) {
                panic!("{}: input {i}: {e}", case.name);
            }
            assert_eq!(
                drain(&mut machine),
                recording.events[i],
                "{}: events after input {i}",
                case.name
            );
        }
        assert_eq!(summary(machine), recording.summary, "{}", case.name);
    }
}

/// Restores `checkpoints` (oldest first; the newest's state) and runs the inputs from
/// `from` on, checking the events and the outcome against the recording.
fn resume_and_compare(case: &Case, recording: &Recording, checkpoints: &[Checkpoint], from: usize) {
    let segments: Vec<(u64, &[u8])> = checkpoints
        .iter()
        .map(|c| (c.history_start, c.history.as_slice()))
        .collect();
    let newest = checkpoints.last().unwrap();
    let mut machine = Machine::restore(
        case.program.clone(),
        case.options.clone(),
        &segments,
        &newest.state,
    )
    .unwrap_or_else(|e| panic!("{}: restore before input {from}: {e}", case.name));
    assert!(drain(&mut machine).is_empty());
    // A checkpoint of the restored machine is the checkpoint it came from.
    let again = machine.checkpoint(newest.history_start).unwrap();
    assert_eq!(&again, newest, "{}: checkpoint after restore", case.name);
    for (i, input) in recording.inputs.iter().enumerate().skip(from) {
        let _ = apply(&mut machine, input);
        assert_eq!(
            drain(&mut machine),
            recording.events[i],
            "{}: restored before input {from}, events after input {i}",
            case.name
        );
    }
    assert_eq!(
        summary(machine),
        recording.summary,
        "{}: restored before input {from}",
        case.name
    );
}

#[test]
fn a_checkpoint_at_any_rest_point_resumes_the_run_exactly() {
    let mut restored = 0;
    for case in cases() {
        let recording = record(&case);
        let mut machine = Machine::new(case.program.clone(), case.options.clone());
        let _ = drain(&mut machine);
        // A chain of checkpoints, each holding the history since the one before.
        let mut chain: Vec<Checkpoint> = Vec::new();
        let mut covered = 0;
        for (i, input) in recording.inputs.iter().enumerate() {
            // Taken first: its state is the machine's now, before any other checkpoint
            // fills the namespace table.
            let deferred = machine.checkpoint_deferred(covered);
            match machine.checkpoint(0) {
                Ok(whole) => {
                    assert!(matches!(input, Input::Poll { .. }), "{}: {i}", case.name);
                    resume_and_compare(&case, &recording, std::slice::from_ref(&whole), i);
                    let link = machine.checkpoint(covered).unwrap();
                    assert_deferred_is(deferred, &link, &format!("{}: {i}", case.name));
                    chain.push(link);
                    covered = machine.history_len();
                    resume_and_compare(&case, &recording, &chain, i);
                    restored += 1;
                }
                Err(JournalError::NotAtRest(_)) => {
                    assert!(!matches!(input, Input::Poll { .. }), "{}: {i}", case.name);
                }
                Err(e) => panic!("{}: checkpoint before input {i}: {e}", case.name),
            }
            let _ = apply(&mut machine, input);
            let _ = drain(&mut machine);
        }
    }
    assert!(restored > 100, "only {restored} rest points");
}

/// A checkpoint whose history segment is written later (`checkpoint_deferred`, what a
/// durable run does off its own thread) is the checkpoint written whole: the same state,
/// the same segment. [`a_checkpoint_at_any_rest_point_resumes_the_run_exactly`] checks
/// it at every rest point of every case, chained as a durable run chains them.
fn assert_deferred_is(
    deferred: Result<aplc_vm::DeferredCheckpoint, JournalError>,
    whole: &Checkpoint,
    at: &str,
) {
    let deferred = deferred.unwrap_or_else(|e| panic!("{at}: a deferred checkpoint: {e}"));
    let history =
        (deferred.history.encode()).unwrap_or_else(|e| panic!("{at}: the deferred segment: {e}"));
    assert_eq!(deferred.state, whole.state, "{at}");
    assert_eq!(history, whole.history, "{at}");
    assert_eq!(deferred.history_start, whole.history_start, "{at}");
}

/// A namespace that only an older `context_history` entry still holds (the variable
/// moved on) was not in the state's table when the state was written: its segment is
/// refused later rather than written naming a namespace the state cannot give back, and
/// the checkpoint written whole has it.
#[test]
fn a_deferred_segment_naming_a_namespace_the_state_lacks_is_refused() {
    let source = r#"
# pre: a
{% if runs == 0 %}{% set ns = namespace(n=1) %}{{ set_context('held', ns) }}{% else %}{{ set_context('held', 0) }}{% endif %}

# prompt: a
{{ runs }}

# post: a
{% if runs < 2 %}{{ set_context('next_step', 'a') }}{% endif %}
"#;
    let case = case_from_source(
        "namespace_in_history.apl",
        source,
        vec![json!("one"), json!("two"), json!("three")],
        RunOptions::default(),
    );
    let recording = record(&case);
    assert!(recording.summary.1.is_none(), "{:?}", recording.summary.1);
    let mut machine = Machine::new(case.program.clone(), case.options.clone());
    let _ = drain(&mut machine);
    let mut refused = 0;
    for (i, input) in recording.inputs.iter().enumerate() {
        // Only once `held` moved on: before, the state's table would hold the namespace.
        let moved_on = machine.vars().get("held") == Some(&minijinja::Value::from(0));
        if moved_on && let Ok(deferred) = machine.checkpoint_deferred(0) {
            match deferred.history.encode() {
                Ok(history) => {
                    let checkpoint = Checkpoint {
                        history_start: 0,
                        history,
                        state: deferred.state,
                    };
                    resume_and_compare(&case, &recording, &[checkpoint], i);
                }
                Err(JournalError::NotAtRest(_)) => {
                    refused += 1;
                    // Written whole, it is a checkpoint the run resumes from exactly.
                    let whole = machine.checkpoint(0).unwrap();
                    resume_and_compare(&case, &recording, &[whole], i);
                }
                Err(e) => panic!("{i}: {e}"),
            }
        }
        let _ = apply(&mut machine, input);
        let _ = drain(&mut machine);
    }
    assert!(refused > 0, "no segment was refused");
}

/// A case from source, with `answers` as the mock and `options` (events on).
fn case_from_source(name: &str, source: &str, answers: Vec<Json>, options: RunOptions) -> Case {
    let compiled = compile(source, name, &Options::for_run(false));
    let bundle = compiled
        .bundle
        .unwrap_or_else(|| panic!("{name} does not compile: {:?}", compiled.diagnostics));
    Case {
        name: name.into(),
        program: Arc::new(Program::from_bundle(bundle, Limits::default()).unwrap()),
        options: RunOptions {
            events: true,
            ..options
        },
        script: ScriptedProvider::from_entries(answers).unwrap(),
    }
}

/// Values whose representation a lossy copy would change: a namespace mutated after
/// the restore, a tuple, a map with non-string keys in insertion order, integer and
/// float kinds, safe strings, a frozen `context` snapshot.
#[test]
fn exotic_values_survive_a_restore_and_namespaces_stay_mutable() {
    let source = r#"
# pre: a
{% if get_context('frozen') is none %}{{ set_context('frozen', context) }}{% endif %}
{% if get_context('ns') is none %}{% set ns = namespace(n=1, l=[1]) %}{{ set_context('ns', ns) }}{% endif %}
{{ set_context('t', (1, (2.0, 'x'))) }}
{{ set_context('m', {2: 'two', 'k': [1.0, 1], none: (1,)}) }}
{{ set_context('s', '<b>'|safe) }}
{{ set_context('big', 2 ** 62 * 4) }}

# prompt: a
n is {{ ns.n }}, {{ t }}, {{ m }}, {{ s }}, {{ big }}, {{ 1 if m[2] == 'two' }}

# post: a
{% set ns = get_context('ns') %}{% set ns.n = ns.n + 1 %}
{{ set_context('seen', [ns.n, t[1][0] is float, m | list, s ~ '', frozen.global_runs, big]) }}
{% if ns.n < 4 %}{{ set_context('next_step', 'a') }}{% endif %}
"#;
    let case = case_from_source(
        "exotic.apl",
        source,
        vec![json!("one"), json!("two"), json!("three")],
        RunOptions::default(),
    );
    let recording = record(&case);
    assert!(recording.summary.1.is_none(), "{:?}", recording.summary.1);
    assert_eq!(
        recording.summary.0["ns"]["n"],
        json!(4),
        "{:#}",
        recording.summary.0
    );
    let mut machine = Machine::new(case.program.clone(), case.options.clone());
    let _ = drain(&mut machine);
    let mut restored = 0;
    for (i, input) in recording.inputs.iter().enumerate() {
        if let Ok(checkpoint) = machine.checkpoint(0) {
            resume_and_compare(&case, &recording, &[checkpoint], i);
            restored += 1;
        }
        let _ = apply(&mut machine, input);
        let _ = drain(&mut machine);
    }
    assert!(restored > 5);
}

fn first_unencodable(case: &Case) -> JournalError {
    let recording = record(case);
    let mut machine = Machine::new(case.program.clone(), case.options.clone());
    for input in &recording.inputs {
        match machine.checkpoint(0) {
            Ok(_) | Err(JournalError::NotAtRest(_)) => {}
            Err(e) => return e,
        }
        let _ = apply(&mut machine, input);
    }
    panic!("{}: every checkpoint succeeded", case.name)
}

#[test]
fn values_without_a_durable_form_are_refused() {
    let source = "# pre: a\n{% macro greet() %}hi{% endmacro %}{{ set_context('greeter', greet) }}\n\n# prompt: a\nhi\n";
    let case = case_from_source(
        "macro.apl",
        source,
        vec![json!("ok")],
        RunOptions::default(),
    );
    assert_eq!(
        first_unencodable(&case),
        JournalError::Unencodable {
            name: "greeter".into(),
            kind: "macro".into()
        }
    );
    let source = "# pre: a\n{% for i in [1] %}{{ set_context('lp', loop) }}{% endfor %}\n\n# prompt: a\nhi\n";
    let case = case_from_source("loop.apl", source, vec![json!("ok")], RunOptions::default());
    assert!(matches!(
        first_unencodable(&case),
        JournalError::Unencodable { name, .. } if name == "lp"
    ));
    // Inside a list, in the history too: the variable is named.
    let source = "# pre: a\n{% macro greet() %}hi{% endmacro %}{{ set_context('xs', [1, [greet]]) }}\n\n# prompt: a\nhi\n";
    let case = case_from_source(
        "nested.apl",
        source,
        vec![json!("ok")],
        RunOptions::default(),
    );
    assert!(matches!(
        first_unencodable(&case),
        JournalError::Unencodable { name, .. } if name == "xs"
    ));
}

/// A checkpoint in the middle of a run with a tool round, history and events.
fn some_checkpoint() -> (Case, Vec<Checkpoint>) {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "weather_loop.apl")
        .unwrap();
    let recording = record(&case);
    let mut machine = Machine::new(case.program.clone(), case.options.clone());
    let mut chain = Vec::new();
    let mut covered = 0;
    for input in &recording.inputs {
        // Only where the history grew: every segment holds at least one entry.
        if machine.history_len() > covered
            && let Ok(checkpoint) = machine.checkpoint(covered)
        {
            covered = machine.history_len();
            chain.push(checkpoint);
        }
        let _ = apply(&mut machine, input);
    }
    assert!(chain.len() >= 2, "{} checkpoints", chain.len());
    (case, chain)
}

fn restore(case: &Case, chain: &[Checkpoint], state: &[u8]) -> Result<Machine, JournalError> {
    let segments: Vec<(u64, &[u8])> = chain
        .iter()
        .map(|c| (c.history_start, c.history.as_slice()))
        .collect();
    Machine::restore(case.program.clone(), case.options.clone(), &segments, state)
}

#[test]
fn truncated_or_mismatched_checkpoints_are_errors() {
    let (case, chain) = some_checkpoint();
    let newest = chain.last().unwrap();
    assert!(newest.history_start > 0, "the chain splits the history");
    restore(&case, &chain, &newest.state).unwrap();
    for len in 0..newest.state.len() {
        assert!(
            matches!(
                restore(&case, &chain, &newest.state[..len]),
                Err(JournalError::Corrupt(_) | JournalError::Mismatch(_))
            ),
            "state truncated to {len}"
        );
    }
    let mut long = newest.state.clone();
    long.push(0);
    assert!(matches!(
        restore(&case, &chain, &long),
        Err(JournalError::Corrupt(_))
    ));
    // A segment missing, out of order, or a history cut short.
    let missing: Vec<Checkpoint> = chain.iter().skip(1).cloned().collect();
    assert!(matches!(
        restore(&case, &missing, &newest.state),
        Err(JournalError::Mismatch(_))
    ));
    let mut swapped = chain.clone();
    swapped.swap(0, 1);
    assert!(matches!(
        restore(&case, &swapped, &newest.state),
        Err(JournalError::Mismatch(_))
    ));
    let short = &chain[..chain.len() - 1];
    assert!(matches!(
        restore(&case, short, &newest.state),
        Err(JournalError::Mismatch(_))
    ));
    for segment in &chain {
        let history = &segment.history;
        for len in 0..history.len() {
            let mut cut = chain.clone();
            let i = chain.iter().position(|c| c == segment).unwrap();
            cut[i].history = history[..len].to_vec();
            assert!(restore(&case, &cut, &newest.state).is_err());
        }
    }
    // Another program.
    let other = cases().into_iter().find(|c| c.name == "calc.apl").unwrap();
    assert!(matches!(
        restore(&other, &chain, &newest.state),
        Err(JournalError::Mismatch(_))
    ));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    #[test]
    fn corrupt_checkpoints_never_panic(
        which in 0usize..64,
        flips in proptest::collection::vec((0usize..1 << 16, 0u8..8), 1..4),
        in_history in proptest::bool::ANY,
    ) {
        let (case, chain) = CHECKPOINT.with(|c| c.clone());
        let mut chain = chain;
        let at = which % chain.len();
        let target = if in_history { &mut chain[at].history } else { &mut chain[at].state };
        for (index, bit) in flips {
            let len = target.len();
            target[index % len] ^= 1 << bit;
        }
        let newest = chain[at].state.clone();
        // Any answer but a panic; a restored machine must also run without one.
        if let Ok(mut machine) = restore(&case, &chain[..=at], &newest) {
            for i in 0..64 {
                match machine.poll(Duration::from_secs(1000 + i)) {
                    Action::Done => break,
                    Action::CallProvider(_) => machine
                        .handle_provider_response(Duration::from_secs(1000 + i), Ok(aplc_vm::Completion::text("x"))),
                    Action::CallTool(_) => machine.handle_tool_result(Duration::from_secs(1000 + i), Ok(json!(1))),
                    Action::AwaitInput => machine.abandon_input("nobody".into()),
                    Action::Continue => {}
                }
            }
        }
    }

    #[test]
    fn random_bytes_are_not_a_checkpoint(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
        let (case, chain) = CHECKPOINT.with(|c| c.clone());
        let mut state = b"APLS\x01".to_vec();
        state.extend_from_slice(&bytes);
        proptest::prop_assert!(restore(&case, &chain, &state).is_err());
        let mut segment = b"APLH\x01".to_vec();
        segment.extend_from_slice(&bytes);
        let _ = restore(&case, &[Checkpoint { history_start: 0, history: segment, state: vec![] }], &chain.last().unwrap().state);
    }
}

thread_local! {
    static CHECKPOINT: (Arc<Case>, Vec<Checkpoint>) = {
        let (case, chain) = some_checkpoint();
        (Arc::new(case), chain)
    };
}

/// Bytes journaled per step on `benches/agents/self_loop.apl`: the encoded inputs plus
/// the history segments of a checkpoint every 100 steps. Returns (per step, last state).
fn self_loop_bytes_per_step(steps: u64) -> (f64, usize) {
    let path = root().join("benches/agents/self_loop.apl");
    let mut case = load(&path, None);
    case.options = RunOptions {
        events: false,
        max_steps: steps + 1,
        ..case.options
    }
    .with_context_json(json!({"limit": steps}).as_object().unwrap());
    case.script = ScriptedProvider::from_entries(vec![json!("ok"); steps as usize]).unwrap();
    let recording = record(&case);
    assert!(recording.summary.1.is_none(), "{:?}", recording.summary.1);
    assert_eq!(recording.summary.3, steps);
    let mut machine = Machine::new(case.program.clone(), case.options.clone());
    let mut input_bytes = 0;
    let mut segment_bytes = 0;
    let mut covered = 0;
    let mut state = 0;
    for input in &recording.inputs {
        if machine.history_len() >= covered + 100
            && let Ok(checkpoint) = machine.checkpoint(covered)
        {
            covered = machine.history_len();
            segment_bytes += checkpoint.history.len();
            state = checkpoint.state.len();
        }
        input_bytes += input.encode(machine.position()).len();
        let _ = apply(&mut machine, input);
    }
    let per_step = (input_bytes + segment_bytes) as f64 / steps as f64;
    println!(
        "self_loop, {steps} steps: {input_bytes} bytes of inputs + {segment_bytes} of history \
         segments = {per_step:.1} bytes/step; last checkpoint state {state} bytes"
    );
    (per_step, state)
}

#[test]
fn storage_per_step_stays_flat() {
    let (small, small_state) = self_loop_bytes_per_step(1_000);
    let (large, large_state) = self_loop_bytes_per_step(10_000);
    assert!(
        large <= small * 1.2,
        "{large:.1} bytes/step at 10,000 steps vs {small:.1} at 1,000"
    );
    // The state holds the variables, not the history: it does not grow with the steps.
    assert!(
        large_state <= small_state + 64,
        "{large_state} vs {small_state}"
    );
}

/// A run that times out waiting for its provider: the `Timeout` input replays, and the
/// checkpoints before it resume to the same failure.
#[test]
fn a_timeout_replays_and_resumes_the_same() {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "weather_loop.apl")
        .unwrap();
    let recording = record_with(&case, Some(1));
    assert!(
        recording
            .inputs
            .iter()
            .any(|i| matches!(i, Input::Timeout { .. })),
        "no timeout"
    );
    let error = recording.summary.1.clone().expect("the run times out");
    assert_eq!(error.kind, aplc_vm::RunErrorKind::Timeout);
    let mut replay = Machine::new(case.program.clone(), case.options.clone());
    let _ = drain(&mut replay);
    let mut machine = Machine::new(case.program.clone(), case.options.clone());
    let _ = drain(&mut machine);
    for (i, input) in recording.inputs.iter().enumerate() {
        if let Ok(checkpoint) = machine.checkpoint(0) {
            resume_and_compare(&case, &recording, &[checkpoint], i);
        }
        let _ = apply(&mut machine, input);
        let _ = drain(&mut machine);
        let (input, after) = Input::decode_entry(&input.encode(recording.positions[i])).unwrap();
        let _ = replay.replay(i as u64, input, after).unwrap();
        assert_eq!(
            drain(&mut replay),
            recording.events[i],
            "events after input {i}"
        );
    }
    assert_eq!(summary(replay), recording.summary);
}

/// Replaying checks every input against the journal: an input the machine does not wait
/// for, or a position other than the recorded one, is refused at that input, with the
/// step named, instead of making a different run (Restate's journal-mismatch check).
#[test]
fn a_journal_that_went_another_way_is_refused_where_it_diverges() {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "weather_loop.apl")
        .unwrap();
    let recording = record(&case);
    let tool = recording
        .inputs
        .iter()
        .position(|i| matches!(i, Input::Tool { .. }))
        .expect("the agent calls a tool");
    let replay_until = |inputs: &[Input], positions: &[Position]| {
        let mut machine = Machine::new(case.program.clone(), case.options.clone());
        for (i, (input, after)) in inputs.iter().zip(positions).enumerate() {
            let _ = machine.replay(i as u64, input.clone(), Some(*after))?;
        }
        Ok::<_, JournalError>(())
    };
    replay_until(&recording.inputs, &recording.positions).expect("the journal replays");

    // A provider answer where the run had a tool result.
    let mut inputs = recording.inputs.clone();
    inputs[tool] = Input::Provider {
        at: inputs[tool].at(),
        result: Ok(aplc_vm::Completion::text("hi")),
    };
    let error = replay_until(&inputs, &recording.positions).unwrap_err();
    let JournalError::Diverged(message) = error else {
        panic!("{error:?}")
    };
    assert!(
        message.starts_with(&format!(
            "input {tool} is a provider answer but the machine waits for a tool result (step `"
        )),
        "{message}"
    );

    // The same inputs, but the journal recorded another position after one of them.
    let mut positions = recording.positions.clone();
    positions[tool].events += 1;
    let error = replay_until(&recording.inputs, &positions).unwrap_err();
    assert!(
        matches!(&error, JournalError::Diverged(m) if m.starts_with(&format!("after input {tool} ("))),
        "{error:?}"
    );
}

/// `case` with its events off and journaled: a durable run nobody listens to.
fn counting(case: &Case) -> Case {
    Case {
        name: case.name.clone(),
        program: case.program.clone(),
        options: RunOptions {
            events: false,
            journaled: true,
            ..case.options.clone()
        },
        script: case.script.clone(),
    }
}

/// A journaled run with its events off takes the same inputs (times included: it yields
/// at the same points), stands at the same positions and ends the same as with them on,
/// and builds none: so its events are the replay's (`spec/durability.md`, "Events").
#[test]
fn a_journaled_run_without_events_journals_what_it_would_with_them() {
    for case in cases() {
        let on = record(&case);
        let off = record(&counting(&case));
        assert_eq!(off.inputs, on.inputs, "{}", case.name);
        assert_eq!(off.positions, on.positions, "{}", case.name);
        assert_eq!(off.summary, on.summary, "{}", case.name);
        assert!(off.start_events.is_empty(), "{}", case.name);
        assert!(off.events.iter().all(Vec::is_empty), "{}", case.name);
        // Its checkpoints are the same too: a resume with events on goes on from them.
        let (with, without) = (run_to_rest(&case), run_to_rest(&counting(&case)));
        assert_eq!(with, without, "{}: checkpoints", case.name);

        // Without phase times, the same again; and the polls are those of a run with
        // events off that is not journaled (no poll waits for a phase's end).
        let untimed = |events: bool, journaled: bool| Case {
            options: RunOptions {
                events,
                journaled,
                phase_times: false,
                ..case.options.clone()
            },
            ..counting(&case)
        };
        let on = record(&untimed(true, false));
        let off = record(&untimed(false, true));
        let plain = record(&untimed(false, false));
        assert_eq!(off.inputs, on.inputs, "{}: untimed", case.name);
        assert_eq!(off.positions, on.positions, "{}: untimed", case.name);
        assert_eq!(off.summary, on.summary, "{}: untimed", case.name);
        assert!(off.events.iter().all(Vec::is_empty), "{}", case.name);
        assert_eq!(plain.inputs, off.inputs, "{}: untimed", case.name);
        assert_eq!(plain.summary, off.summary, "{}: untimed", case.name);
        // Every phase still has its `phase_finished`.
        let count = |recording: &Recording, kind: &str| {
            (recording.start_events.iter())
                .chain(recording.events.iter().flatten())
                .filter(|e| e["type"] == kind)
                .count()
        };
        let timed = record(&case);
        assert_eq!(
            count(&on, "phase_finished"),
            count(&timed, "phase_finished"),
            "{}",
            case.name
        );
    }
}

/// The state of `case`'s run checkpointed at its first rest point after a provider
/// answer, if it has one.
fn run_to_rest(case: &Case) -> Option<Vec<u8>> {
    let recording = record(case);
    let mut machine = Machine::new(case.program.clone(), case.options.clone());
    let _ = drain(&mut machine);
    for (i, input) in recording.inputs.iter().enumerate() {
        let _ = machine
            .replay(i as u64, input.clone(), Some(recording.positions[i]))
            .unwrap();
        let _ = drain(&mut machine);
        if matches!(input, Input::Provider { .. })
            && let Ok(checkpoint) = machine.checkpoint(0)
        {
            return Some(checkpoint.state);
        }
    }
    None
}

/// A journaled run without events that is cancelled builds the events from the cancel
/// on (no journal says when a flag was seen, so they are journaled as made): they are
/// the last events a run with events on makes, at the same position.
#[test]
fn a_cancelled_journaled_run_builds_its_last_events() {
    let mut checked = 0;
    for case in cases() {
        let recording = record(&case);
        let Some(cut) = (recording.inputs.iter()).position(|i| matches!(i, Input::Provider { .. }))
        else {
            continue;
        };
        let end = |options: RunOptions| {
            let cancel = aplc_vm::Interrupt::new();
            let options = RunOptions {
                interrupt: cancel.clone(),
                ..options
            };
            let mut machine = Machine::new(case.program.clone(), options);
            let mut before = drain(&mut machine);
            for input in &recording.inputs[..=cut] {
                let _ = machine.apply(input.clone());
                before.extend(drain(&mut machine));
            }
            cancel.cancel();
            let poll = Input::Poll {
                at: Duration::from_secs(1),
            };
            assert!(matches!(machine.apply(poll), Action::Done), "{}", case.name);
            (before, drain(&mut machine), machine.position())
        };
        let (on_before, on_last, on_at) = end(case.options.clone());
        let (off_before, off_last, off_at) = end(counting(&case).options);
        assert!(
            !on_before.is_empty() && off_before.is_empty(),
            "{}",
            case.name
        );
        assert_eq!(off_last, on_last, "{}", case.name);
        assert_eq!(off_at, on_at, "{}", case.name);
        let last = off_last.last().expect("run_finished");
        assert_eq!(last["outcome"], "cancelled", "{}: {last}", case.name);
        checked += 1;
    }
    assert!(checked > 10, "only {checked} cases call a provider");
}
