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
use aplc_vm::journal::{Checkpoint, Input, JournalError};
use aplc_vm::tools::{Idempotency, IdempotencyKey, ToolRegistry, ToolSpec};
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

fn read_json(path: &Path) -> Option<Json> {
    let text = std::fs::read_to_string(path).ok()?;
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
        registry.register(spec).unwrap();
    }
    registry
}

fn load(path: &Path, tools: Option<&Json>) -> Case {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let source = std::fs::read_to_string(path).unwrap();
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
    let mock = std::fs::read_to_string(path.with_extension("mock.json")).unwrap();
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
fn apply(machine: &mut Machine, input: &Input) -> Option<Action> {
    match input.clone() {
        Input::Poll { at } => Some(machine.poll(at)),
        Input::Provider { at, result } => {
            machine.handle_provider_response(at, result);
            None
        }
        Input::Tool { at, result } => {
            machine.handle_tool_result(at, result);
            None
        }
        Input::Timeout { at } => {
            machine.handle_timeout(at);
            None
        }
    }
}

/// One uninterrupted run: its inputs, the events after creation and after each input,
/// and how it ended.
struct Recording {
    inputs: Vec<Input>,
    start_events: Vec<Json>,
    events: Vec<Vec<Json>>,
    summary: Summary,
}

fn record(case: &Case) -> Recording {
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
    let mut events = Vec::new();
    loop {
        assert!(inputs.len() < 100_000, "{}: runaway run", case.name);
        let poll = Input::Poll { at: clock() };
        let action = apply(&mut machine, &poll);
        inputs.push(poll);
        events.push(drain(&mut machine));
        let answer = match action {
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
            Some(Action::Continue) => continue,
            Some(Action::Done) | None => break,
        };
        apply(&mut machine, &answer);
        inputs.push(answer);
        events.push(drain(&mut machine));
    }
    Recording {
        inputs,
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
            let decoded = Input::decode(&input.encode()).unwrap();
            assert_eq!(&decoded, input, "{}: input {i}", case.name);
            let _ = apply(&mut machine, &decoded);
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
            match machine.checkpoint(0) {
                Ok(whole) => {
                    assert!(matches!(input, Input::Poll { .. }), "{}: {i}", case.name);
                    resume_and_compare(&case, &recording, std::slice::from_ref(&whole), i);
                    chain.push(machine.checkpoint(covered).unwrap());
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
