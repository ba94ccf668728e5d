//! Durable runs in process: a run "crashes" at every provider and tool call in turn (its
//! future is dropped mid-call, which drops its lease, as a dead process's would be), is
//! resumed, and must end exactly as the uninterrupted run did, without a journaled call
//! repeated or a non-idempotent tool run twice. SQLite, with checkpoints every 1, 2 and
//! 1,000 steps (always, sometimes and never restoring from one).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aplc_runtime::Redactor;
use aplc_runtime::driver::{BoxFuture, CallContext, Provider, Toolbox};
use aplc_runtime::durable::{self, DurableOptions, INTERRUPTED_TOOL};
use aplc_runtime::store::{
    self, Batch, Lease, LoadedRun, NewRun, RunJournal, RunStore, RunSummary, StoreError, StoreUrl,
};
use aplc_vm::tools::ToolSpec;
use aplc_vm::{
    Completion, Content, Event, EventKind, Part, Program, ProviderError, ProviderRequest, Role,
    RunErrorKind, RunOptions, ToolCall,
};
use serde_json::{Value as Json, json};

const AGENT: &str = "\
# pre: work
{{ inc_context('turn') }}

# prompt: work
## user
Turn {{ turn }} of {{ turns }}.
## tool_result
{% for call in result_tool_calls or [] %}
{{ call.tool_call_id }}: {{ call.content }}
{% endfor %}

# post: work
{% if turn < turns %}
{{ set_context('next_step', 'work') }}
{% endif %}
";

const TURNS: u64 = 5;

fn program() -> Arc<Program> {
    let compiled = aplc_compiler::compile(AGENT, "crash.apl", &Default::default());
    let bundle = compiled.bundle.expect("the agent compiles");
    Arc::new(Program::from_bundle(bundle, Default::default()).expect("loads"))
}

fn options() -> RunOptions {
    let mut context = serde_json::Map::new();
    context.insert("turns".into(), json!(TURNS));
    RunOptions::default().with_context_json(&context)
}

/// Answers each request with a call of `count` for the turn its user message names.
/// Counts the calls it answers; with `hang_at = Some(n)`, the n-th call (from 0) never
/// answers, so the test can drop the run there. Given a delta sink, it streams its text
/// first (a call that hangs streams, then hangs).
struct Model {
    calls: AtomicU64,
    hang_at: Option<u64>,
}

impl Provider for Model {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let turn = request
                .messages
                .iter()
                .filter(|m| m.role == Role::User)
                .filter_map(|m| match &m.content {
                    Content::Text(text) => Some(text.clone()),
                    Content::Parts(parts) => parts.iter().find_map(|p| match p {
                        Part::Text(text) => Some(text.clone()),
                        _ => None,
                    }),
                })
                .filter_map(|t| t.trim().strip_prefix("Turn ").map(str::to_owned))
                .filter_map(|t| t.split_whitespace().next()?.parse::<u64>().ok())
                .next_back()
                .unwrap_or(0);
            if let Some(sink) = &call.deltas {
                sink.send(format!("turn {turn}")).await;
            }
            if self.hang_at == Some(n) {
                std::future::pending::<()>().await;
            }
            let mut completion = Completion::text(format!("turn {turn}"));
            completion.tool_calls = vec![ToolCall::new(
                format!("call-{turn}"),
                "count",
                json!({"key": format!("t{turn}")}),
            )];
            Ok(completion)
        })
    }
}

/// The `count` tool: counts its executions; hangs on the `hang_at`-th (from 0).
fn toolbox(executions: Arc<AtomicU64>, hang_at: Option<u64>, idempotent: bool) -> Toolbox {
    let descriptor = json!({
        "name": "count",
        "description": "Count a turn",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    });
    let mut spec = ToolSpec::new(descriptor).unwrap();
    if idempotent {
        spec = spec.idempotent(aplc_vm::tools::Idempotency {
            key: aplc_vm::tools::IdempotencyKey::Auto,
            ttl: None,
        });
    }
    let mut toolbox = Toolbox::new();
    toolbox
        .register_async(spec, move |args, _| {
            let executions = executions.clone();
            async move {
                let n = executions.fetch_add(1, Ordering::SeqCst);
                if hang_at == Some(n) {
                    std::future::pending::<()>().await;
                }
                Ok(json!({"counted": args["key"]}))
            }
        })
        .unwrap();
    toolbox
}

fn without_times(mut json: Json) -> Json {
    fn strip(json: &mut Json) {
        match json {
            Json::Object(map) => {
                map.remove("time_elapsed");
                map.remove("time_elapsed_global");
                map.values_mut().for_each(strip);
            }
            Json::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut json);
    json
}

async fn sqlite(name: &str) -> Arc<dyn RunStore> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("durable-runtime");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.db"));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(dir.join(format!("{name}.db-wal")));
    let _ = std::fs::remove_file(dir.join(format!("{name}.db-shm")));
    store::open(&StoreUrl::Sqlite(path))
        .await
        .expect("open the store")
}

fn config(checkpoint_every: u64) -> DurableOptions {
    let mut config = DurableOptions::default();
    config.checkpoint_every = checkpoint_every;
    config
}

/// Crashes at every provider call, for each checkpoint interval: the resumed run ends as
/// the uninterrupted one, no journaled call is sent again, each tool runs once per call.
#[tokio::test(flavor = "current_thread")]
async fn a_crash_at_any_provider_call_resumes_to_the_same_end() {
    let executions = Arc::new(AtomicU64::new(0));
    let model = Model {
        calls: AtomicU64::new(0),
        hang_at: None,
    };
    let expected = aplc_runtime::driver::run_with_tools(
        program(),
        options(),
        &model,
        &toolbox(executions.clone(), None, false),
    )
    .await;
    assert!(expected.error.is_none(), "{:?}", expected.error);
    let expected_context = without_times(expected.context_json());
    assert_eq!(model.calls.load(Ordering::SeqCst), TURNS);

    for every in [1, 2, 1_000] {
        for crash_at in 0..TURNS {
            let store = sqlite(&format!("provider-{every}-{crash_at}")).await;
            let id = format!("run-{every}-{crash_at}");
            let executions = Arc::new(AtomicU64::new(0));
            let hanging = Model {
                calls: AtomicU64::new(0),
                hang_at: Some(crash_at),
            };
            let tools = toolbox(executions.clone(), None, false);
            let cfg = config(every);
            let run = durable::start(
                store.as_ref(),
                durable::NewDurableRun {
                    id: id.clone(),
                    program: program(),
                    options: options(),
                },
                &hanging,
                &tools,
                None,
                &cfg,
            );
            // The run waits forever on call `crash_at`: drop it there.
            let dropped = tokio::time::timeout(Duration::from_millis(200), run).await;
            assert!(dropped.is_err(), "the run should hang at call {crash_at}");

            let model = Model {
                calls: AtomicU64::new(0),
                hang_at: None,
            };
            let finished = durable::resume(
                store.as_ref(),
                &id,
                None,
                &model,
                &tools,
                None,
                &config(every),
            )
            .await
            .expect("resume")
            .finished()
            .expect("finished");
            let context = without_times(finished.outcome.context_json());
            assert_eq!(
                context, expected_context,
                "every={every} crash_at={crash_at}"
            );
            assert_eq!(
                finished.replayed_provider_calls, crash_at,
                "the journaled answers are replayed, not asked again"
            );
            assert_eq!(
                model.calls.load(Ordering::SeqCst),
                TURNS - crash_at,
                "only the call in flight and the later ones are sent"
            );
            assert_eq!(
                executions.load(Ordering::SeqCst),
                TURNS,
                "each tool call ran once"
            );
            let summary = store.summary(&id).await.unwrap();
            assert_eq!(summary.steps, TURNS);
        }
    }
}

/// Crashes while the tool runs: a non-idempotent tool is not run again and resolves as
/// failed; an idempotent one runs again and the run ends as the uninterrupted one.
#[tokio::test(flavor = "current_thread")]
async fn a_crash_during_a_tool_call_reruns_it_only_if_idempotent() {
    for idempotent in [false, true] {
        for crash_at in 0..TURNS {
            let store = sqlite(&format!("tool-{idempotent}-{crash_at}")).await;
            let id = format!("tool-{crash_at}");
            let model = Model {
                calls: AtomicU64::new(0),
                hang_at: None,
            };
            let executions = Arc::new(AtomicU64::new(0));
            let tools = toolbox(executions.clone(), Some(crash_at), idempotent);
            let cfg = config(2);
            let run = durable::start(
                store.as_ref(),
                durable::NewDurableRun {
                    id: id.clone(),
                    program: program(),
                    options: options(),
                },
                &model,
                &tools,
                None,
                &cfg,
            );
            assert!(
                tokio::time::timeout(Duration::from_millis(200), run)
                    .await
                    .is_err()
            );
            assert_eq!(executions.load(Ordering::SeqCst), crash_at + 1);

            let executions = Arc::new(AtomicU64::new(0));
            let tools = toolbox(executions.clone(), None, idempotent);
            let finished =
                durable::resume(store.as_ref(), &id, None, &model, &tools, None, &config(2))
                    .await
                    .expect("resume")
                    .finished()
                    .expect("finished");
            assert!(finished.outcome.error.is_none());
            let context = finished.outcome.context_json();
            let history = context["context_history"].as_array().unwrap();
            let call = &history[crash_at as usize]["result_tool_calls"][0];
            if idempotent {
                assert_eq!(executions.load(Ordering::SeqCst), TURNS - crash_at);
                assert_eq!(call["with_error"], false, "{call}");
            } else {
                assert_eq!(executions.load(Ordering::SeqCst), TURNS - crash_at - 1);
                assert_eq!(call["with_error"], true, "{call}");
                assert!(
                    call["content"].as_str().unwrap().contains(INTERRUPTED_TOOL),
                    "{call}"
                );
            }
            assert_eq!(context["turn"], json!(TURNS));
        }
    }
}

/// A second taker of a run is refused while the first holds it; a finished run is not
/// resumed; a resume with other tools or another bundle is refused.
#[tokio::test(flavor = "current_thread")]
async fn one_writer_finished_runs_and_mismatches() {
    let store = sqlite("one-writer").await;
    let model = Model {
        calls: AtomicU64::new(0),
        hang_at: Some(1),
    };
    let executions = Arc::new(AtomicU64::new(0));
    let tools = toolbox(executions, None, false);
    let cfg = config(100);
    let mut run = Box::pin(durable::start(
        store.as_ref(),
        durable::NewDurableRun {
            id: "held".into(),
            program: program(),
            options: options(),
        },
        &model,
        &tools,
        None,
        &cfg,
    ));
    // Drive the run until it hangs on its second call, holding the lease.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut run)
            .await
            .is_err()
    );
    let second = durable::reopen(store.as_ref(), "held", None, &tools, &cfg).await;
    assert!(
        matches!(
            second,
            Err(durable::DurableError::Store(StoreError::Locked(_)))
        ),
        "{second:?}"
    );
    drop(run);

    let other_tools = toolbox(Arc::new(AtomicU64::new(0)), None, true);
    let mismatch = durable::reopen(store.as_ref(), "held", None, &other_tools, &cfg).await;
    assert!(
        matches!(mismatch, Err(durable::DurableError::Mismatch { .. })),
        "{mismatch:?}"
    );

    let other = aplc_compiler::compile("# prompt: x\nhello\n", "other.apl", &Default::default());
    let other = Program::from_bundle(other.bundle.unwrap(), Default::default()).unwrap();
    let wrong = durable::reopen(store.as_ref(), "held", Some(&other), &tools, &cfg).await;
    let message = wrong.as_ref().map(|_| ()).unwrap_err().to_string();
    assert!(message.contains("can only resume on it"), "{message}");

    let model = Model {
        calls: AtomicU64::new(0),
        hang_at: None,
    };
    durable::resume(
        store.as_ref(),
        "held",
        Some(&program()),
        &model,
        &tools,
        None,
        &cfg,
    )
    .await
    .expect("resume with the same bundle")
    .finished()
    .expect("finished");
    let again = durable::reopen(store.as_ref(), "held", None, &tools, &cfg).await;
    assert!(
        matches!(
            again,
            Err(durable::DurableError::Store(StoreError::Finished(_)))
        ),
        "{again:?}"
    );
}

/// Streamed text reaches a durable run's listener as `provider_delta` events, also for
/// the call in flight at a crash, and is never journaled: the stored events are the
/// machine's alone, numbered without gaps.
#[tokio::test(flavor = "current_thread")]
async fn deltas_reach_the_listener_and_are_never_journaled() {
    let store = sqlite("deltas").await;
    let id = "deltas".to_owned();
    let executions = Arc::new(AtomicU64::new(0));
    let tools = toolbox(executions, None, false);
    let cfg = config(1);
    let hanging = Model {
        calls: AtomicU64::new(0),
        hang_at: Some(2),
    };
    let mut before = Vec::new();
    let mut listener = |e: &Event| before.push(e.clone());
    let run = durable::start(
        store.as_ref(),
        durable::NewDurableRun {
            id: id.clone(),
            program: program(),
            options: options(),
        },
        &hanging,
        &tools,
        Some(&mut listener),
        &cfg,
    );
    let dropped = tokio::time::timeout(Duration::from_millis(300), run).await;
    assert!(dropped.is_err(), "the run should hang at call 2");
    let deltas = |events: &[Event]| -> Vec<(u64, String)> {
        events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ProviderDelta { text, index, .. } => {
                    assert_eq!(*index, 0);
                    Some((e.seq, text.clone()))
                }
                _ => None,
            })
            .collect()
    };
    let calls = |events: &[Event]| -> Vec<u64> {
        events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ProviderCall { .. }))
            .map(|e| e.seq)
            .collect()
    };
    let streamed = deltas(&before);
    let texts: Vec<&str> = streamed.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, ["turn 1", "turn 2", "turn 3"]);
    let seqs: Vec<u64> = streamed.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, calls(&before));

    let model = Model {
        calls: AtomicU64::new(0),
        hang_at: None,
    };
    let mut after = Vec::new();
    let mut listener = |e: &Event| after.push(e.clone());
    let finished = durable::resume(
        store.as_ref(),
        &id,
        None,
        &model,
        &tools,
        Some(&mut listener),
        &cfg,
    )
    .await
    .expect("resume")
    .finished()
    .expect("finished");
    assert!(finished.outcome.error.is_none());
    // The call in flight is asked again; its delta carries its `provider_call`'s seq,
    // which this listener never saw (it was journaled before the crash).
    let resumed = deltas(&after);
    assert_eq!(
        resumed[0],
        (*calls(&before).last().unwrap(), "turn 3".to_owned())
    );
    assert_eq!(resumed.len() as u64, TURNS - 2);

    let stored = durable::EventReader::new(&id, 0, Redactor::default())
        .all(store.as_ref())
        .await
        .expect("events");
    for (n, line) in stored.iter().enumerate() {
        let event: Json = serde_json::from_str(line).unwrap();
        assert_ne!(event["type"], "provider_delta", "{line}");
        assert_eq!(event["seq"], json!(n), "{line}");
    }
}

// ---------------------------------------------------------------------------------------
// Group commit (issue #24): a run goes on while its commit lands, within a window.

/// A store whose appends never land: the first hangs, and so does every later one.
#[derive(Debug)]
struct Stalled {
    inner: Arc<dyn RunStore>,
}

impl RunJournal for Stalled {
    fn create<'a>(&'a self, run: NewRun) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        self.inner.create(run)
    }
    fn acquire<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Box<dyn Lease>, StoreError>> {
        self.inner.acquire(id)
    }
    fn append<'a>(&'a self, _: &'a dyn Lease, _: Batch) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::pending())
    }
    fn load<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<LoadedRun, StoreError>> {
        self.inner.load(id)
    }
    fn list<'a>(&'a self) -> BoxFuture<'a, Result<Vec<RunSummary>, StoreError>> {
        self.inner.list()
    }
    fn summary<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<RunSummary, StoreError>> {
        self.inner.summary(id)
    }
    fn events<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.events(id, from, limit)
    }
    fn inputs<'a>(
        &'a self,
        id: &'a str,
        from: u64,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<Vec<u8>>, StoreError>> {
        self.inner.inputs(id, from, limit)
    }
    fn run_bytes<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.run_bytes(id)
    }
    fn answer<'a>(
        &'a self,
        run_id: &'a str,
        request_id: &'a str,
        answer: Json,
    ) -> BoxFuture<'a, Result<store::Answered, StoreError>> {
        self.inner.answer(run_id, request_id, answer)
    }
    fn answers<'a>(
        &'a self,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, Json)>, StoreError>> {
        self.inner.answers(run_id)
    }
}

/// Answers at once, counting the calls.
struct Instant(AtomicU64);

impl Provider for Instant {
    fn complete<'a>(
        &'a self,
        _request: &'a ProviderRequest,
        _call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(Completion::text("ok")) })
    }
}

/// With its first commit stuck in the store, a run of instant answers goes on ahead of
/// it (more than one call: it does not wait for the commit at every call), but no further
/// than its window lets it: it holds at most `max_uncommitted_inputs` inputs (each call
/// adds at least one, its answer), then waits for the commit, here forever.
#[tokio::test(flavor = "current_thread")]
async fn a_run_goes_on_while_its_commit_lands_but_not_past_its_window() {
    const WINDOW: usize = 30;
    let store = Stalled {
        inner: sqlite("stalled").await,
    };
    let compiled = aplc_compiler::compile(
        "# pre: loop\n{{ set_context('i', get_context('i', 0) + 1) }}\n\n# prompt: loop\n\
         Iteration {{ i }}\n\n# post: loop\n{% if i < 1000 %}{{ set_context('next_step', \
         'loop') }}{% endif %}\n",
        "loop.apl",
        &Default::default(),
    );
    let program = Program::from_bundle(compiled.bundle.expect("compiles"), Default::default());
    let options = RunOptions {
        max_steps: 5_000,
        ..RunOptions::default()
    };
    let mut config = DurableOptions::default();
    config.max_uncommitted_inputs = WINDOW;
    let provider = Instant(AtomicU64::new(0));
    let toolbox = Toolbox::new();
    let run = durable::start(
        &store,
        durable::NewDurableRun {
            id: "stalled".into(),
            program: Arc::new(program.expect("loads")),
            options,
        },
        &provider,
        &toolbox,
        None,
        &config,
    );
    // It never ends: its commit never lands. Give it ample time to get as far as it can.
    let stalled = tokio::time::timeout(Duration::from_secs(2), run).await;
    assert!(stalled.is_err(), "the run cannot end without its commits");
    let calls = provider.0.load(Ordering::SeqCst);
    assert!(
        calls > 2,
        "the run waited for its first commit: {calls} calls"
    );
    assert!(
        calls <= WINDOW as u64 + 2,
        "the run went past its window: {calls} calls"
    );
}

/// A new run's row is created by its first commit, which goes out while its first
/// provider call is out (issue #24): the run is in the store, resumable, while that call
/// hangs. And an id the store holds already fails the run with `Exists`, leaving the
/// stored run as it was.
#[tokio::test(flavor = "current_thread")]
async fn a_new_run_is_stored_while_its_first_call_is_out_and_a_taken_id_fails() {
    let store = sqlite("created-during-call").await;
    let tools = toolbox(Arc::new(AtomicU64::new(0)), None, false);
    let cfg = config(100);
    let start = |id: &str, model| {
        durable::start(
            store.as_ref(),
            durable::NewDurableRun {
                id: id.into(),
                program: program(),
                options: options(),
            },
            model,
            &tools,
            None,
            &cfg,
        )
    };
    let hanging = Model {
        calls: AtomicU64::new(0),
        hang_at: Some(0),
    };
    let mut run = Box::pin(start("hangs", &hanging));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let summary = loop {
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut run)
                .await
                .is_err(),
            "the run cannot finish: its first call hangs"
        );
        match store.summary("hangs").await {
            Ok(summary) => break summary,
            Err(StoreError::NotFound(_)) if std::time::Instant::now() < deadline => continue,
            Err(e) => panic!("the run was not stored while its first call was out: {e}"),
        }
    };
    assert_eq!(summary.state, aplc_runtime::store::RunState::Running);
    assert_eq!(hanging.calls.load(Ordering::SeqCst), 1);
    drop(run);

    let model = Model {
        calls: AtomicU64::new(0),
        hang_at: None,
    };
    let done = (start("done", &model).await.expect("a new id runs"))
        .finished()
        .expect("finished");
    let calls = model.calls.load(Ordering::SeqCst);
    let again = start("done", &model).await;
    assert!(
        matches!(again, Err(durable::DurableError::Store(StoreError::Exists(ref id))) if id == "done"),
        "{:?}",
        again.map(|_| ())
    );
    // The first call may have gone out before the creation was refused; nothing else.
    assert!(model.calls.load(Ordering::SeqCst) <= calls + 1);
    let stored = store.summary("done").await.expect("still stored");
    assert_eq!(stored.steps, done.outcome.steps);
    assert_eq!(stored.state, aplc_runtime::store::RunState::Finished);
}

/// Answers after 3 ms (time for the store's writer to keep up with the run), or never
/// at call `hang_at` (from 0).
struct HangsAt {
    calls: AtomicU64,
    hang_at: Option<u64>,
}

impl Provider for HangsAt {
    fn complete<'a>(
        &'a self,
        _request: &'a ProviderRequest,
        _call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let hang = self.hang_at == Some(n);
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
            Ok(Completion::text("ok"))
        })
    }
}

/// A checkpoint's history segment is written by the store's writer (issue #24). One
/// whose entries hold a namespace the checkpoint's state did not (set at the end of step
/// 1, let go of at the start of step 2, before the checkpoint of step 2) is refused
/// there: that batch goes without its checkpoint, and the run writes its next one whole
/// from the same start. So the segments stay a chain without a gap, and a crash at any
/// call resumes to the same end.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_history_segment_is_written_whole_next_and_the_run_resumes() {
    const STEPS: u64 = 40;
    const SOURCE: &str = "\
# pre: a
{{ set_context('held', runs) }}

# prompt: a
{{ runs }}

# post: a
{% if runs == 1 and global_runs == 1 %}{% set ns = namespace(n=1) %}{{ set_context('held', ns) }}{% endif %}
{% if global_runs < 40 %}{{ set_context('next_step', 'a') }}{% endif %}
";
    let program = || {
        let compiled = aplc_compiler::compile(SOURCE, "held.apl", &Default::default());
        let bundle = compiled.bundle.expect("the agent compiles");
        Arc::new(Program::from_bundle(bundle, Default::default()).expect("loads"))
    };
    let tools = Toolbox::new();
    let expected = aplc_runtime::driver::run_with_tools(
        program(),
        RunOptions::default(),
        &Instant(AtomicU64::new(0)),
        &tools,
    )
    .await;
    assert!(expected.error.is_none(), "{:?}", expected.error);
    assert_eq!(expected.steps, STEPS);
    let expected = without_times(expected.context_json());
    // Checkpoints every step, but the run goes on ahead of its commits: a segment is
    // written (or refused) some steps after it is taken. Crashes well after the refusal
    // (step 2's checkpoint) resume from checkpoints taken after it.
    for crash_at in [2, 20, 30, 39] {
        let store = sqlite(&format!("held-{crash_at}")).await;
        let id = format!("held-{crash_at}");
        let hanging = HangsAt {
            calls: AtomicU64::new(0),
            hang_at: Some(crash_at),
        };
        let cfg = config(1);
        let run = durable::start(
            store.as_ref(),
            durable::NewDurableRun {
                id: id.clone(),
                program: program(),
                options: RunOptions::default(),
            },
            &hanging,
            &tools,
            None,
            &cfg,
        );
        let dropped = tokio::time::timeout(Duration::from_secs(2), run).await;
        assert!(dropped.is_err(), "the run should hang at call {crash_at}");
        let finished = durable::resume(
            store.as_ref(),
            &id,
            None,
            &HangsAt {
                calls: AtomicU64::new(0),
                hang_at: None,
            },
            &tools,
            None,
            &config(1),
        )
        .await
        .expect("resume")
        .finished()
        .expect("finished");
        assert_eq!(
            without_times(finished.outcome.context_json()),
            expected,
            "crash_at={crash_at}"
        );
        let rebuilt = durable::inspect(store.as_ref(), &id)
            .await
            .expect("inspect");
        assert_eq!(without_times(rebuilt.context_json()), expected);
    }
}

/// A run's events with what depends on the wall clock taken out.
fn shapes(events: &[String]) -> Vec<Json> {
    events
        .iter()
        .map(|text| {
            let mut event: Json = serde_json::from_str(text).expect("an event is JSON");
            let map = event.as_object_mut().expect("an event is an object");
            for key in ["t_ms", "duration_ms", "latency_ms"] {
                map.remove(key);
            }
            if let Some(totals) = map.get_mut("totals").and_then(Json::as_object_mut) {
                totals.remove("elapsed_ms");
            }
            event
        })
        .collect()
}

async fn read_events(store: &dyn RunStore, id: &str) -> Vec<String> {
    durable::EventReader::new(id, 0, Redactor::default())
        .all(store)
        .await
        .expect("events")
}

/// Starts run `id` (with `listen`, a listener), drops it at provider call `crash_at` if
/// given, and resumes it (with `listen_after`) to its end.
async fn crash_and_resume(
    store: &dyn RunStore,
    id: &str,
    crash_at: Option<u64>,
    listen: bool,
    listen_after: bool,
) {
    let tools = toolbox(Arc::new(AtomicU64::new(0)), None, false);
    let cfg = config(2);
    let model = Model {
        calls: AtomicU64::new(0),
        hang_at: crash_at,
    };
    let mut heard = Vec::new();
    let mut listener = |e: &Event| heard.push(e.seq);
    let run = durable::start(
        store,
        durable::NewDurableRun {
            id: id.to_owned(),
            program: program(),
            options: options(),
        },
        &model,
        &tools,
        listen.then_some(&mut listener as _),
        &cfg,
    );
    match crash_at {
        None => {
            let ended = run.await.expect("the run ends");
            assert!(ended.finished().expect("finished").outcome.error.is_none());
            return;
        }
        Some(_) => {
            let dropped = tokio::time::timeout(Duration::from_millis(200), run).await;
            assert!(dropped.is_err(), "the run should hang");
        }
    }
    let model = Model {
        calls: AtomicU64::new(0),
        hang_at: None,
    };
    let mut listener = |_: &Event| {};
    let finished = durable::resume(
        store,
        id,
        None,
        &model,
        &tools,
        listen_after.then_some(&mut listener as _),
        &cfg,
    )
    .await
    .expect("resume")
    .finished()
    .expect("finished");
    assert!(finished.outcome.error.is_none());
}

/// A durable run nobody listens to stores no event: its events are made again by
/// replaying its journal, the same as a listened run stores, however it was crashed and
/// resumed, and whoever listened to which part (`spec/durability.md`, "Events").
#[tokio::test(flavor = "current_thread")]
async fn the_events_of_a_run_nobody_listens_to_are_its_journals_replay() {
    let store = sqlite("replayed-events").await;
    let store = store.as_ref();
    crash_and_resume(store, "listened", None, true, true).await;
    let stored = store.events("listened", 0, 10_000).await.unwrap();
    assert!(stored.len() > 20);
    assert_eq!(read_events(store, "listened").await, stored);
    let expected = shapes(&stored);
    for (seq, event) in expected.iter().enumerate() {
        assert_eq!(event["seq"], json!(seq));
    }

    crash_and_resume(store, "quiet", None, false, false).await;
    assert_eq!(store.summary("quiet").await.unwrap().events, 0);
    assert_eq!(shapes(&read_events(store, "quiet").await), expected);

    for crash_at in [0, 2, TURNS - 1] {
        for (listen, listen_after) in [(false, false), (false, true), (true, false)] {
            let id = format!("crash-{crash_at}-{listen}-{listen_after}");
            crash_and_resume(store, &id, Some(crash_at), listen, listen_after).await;
            let events = read_events(store, &id).await;
            assert_eq!(shapes(&events), expected, "{id}");
            let stored = store.summary(&id).await.unwrap().events;
            match (listen, listen_after) {
                // Nothing stored: all replayed.
                (false, false) => assert_eq!(stored, 0, "{id}"),
                // Stored from the resume on, replayed before it.
                (false, true) => assert!(stored > 0 && stored < events.len() as u64, "{id}"),
                // Stored from the start, and on after the resume without a listener.
                _ => assert_eq!(stored, events.len() as u64, "{id}"),
            }
            // Read in pages, from the middle on, as `aplc serve`'s streams do.
            let mut reader = durable::EventReader::new(&id, 5, Redactor::default());
            let mut paged = Vec::new();
            loop {
                let page = reader.page(store, 3).await.unwrap();
                if page.is_empty() {
                    break;
                }
                paged.extend(page);
            }
            assert_eq!(paged, events[5..], "{id}");
        }
    }
}

/// A run nobody listens to that is cancelled stores the events it made from the cancel
/// on (no journal says when the flag was seen); the rest are replayed before them.
#[tokio::test(flavor = "current_thread")]
async fn a_cancelled_run_nobody_listens_to_stores_its_last_events() {
    let store = sqlite("cancelled-events").await;
    let store = store.as_ref();
    let mut ends = Vec::new();
    for (id, listen) in [("cancelled-listened", true), ("cancelled-quiet", false)] {
        let tools = toolbox(Arc::new(AtomicU64::new(0)), None, false);
        let model = Model {
            calls: AtomicU64::new(0),
            hang_at: Some(2),
        };
        let mut options = options();
        let cancel = options.interrupt.clone();
        options.interrupt = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            cancel.cancel();
        });
        let mut listener = |_: &Event| {};
        let finished = durable::start(
            store,
            durable::NewDurableRun {
                id: id.to_owned(),
                program: program(),
                options,
            },
            &model,
            &tools,
            listen.then_some(&mut listener as _),
            &config(2),
        )
        .await
        .expect("the run ends")
        .finished()
        .expect("finished");
        let error = finished.outcome.error.expect("cancelled");
        assert_eq!(error.kind, RunErrorKind::Cancelled);
        ends.push(read_events(store, id).await);
    }
    let (listened, quiet) = (shapes(&ends[0]), shapes(&ends[1]));
    assert_eq!(quiet, listened);
    assert_eq!(quiet.last().unwrap()["outcome"], "cancelled");
    let stored = store.summary("cancelled-quiet").await.unwrap().events;
    assert!(
        stored > 0 && stored < 5,
        "only the last events are stored: {stored}"
    );
}

/// A run a service queued and a worker with no listener claimed stores no event, not
/// even the `run_started` its machine made before the claim: all are made on read.
#[tokio::test(flavor = "current_thread")]
async fn a_queued_run_claimed_without_a_listener_stores_no_event() {
    let store = sqlite("queued-quiet").await;
    let tools = toolbox(Arc::new(AtomicU64::new(0)), None, false);
    let cfg = config(2);
    let run = durable::NewDurableRun {
        id: "queued".into(),
        program: program(),
        options: options(),
    };
    let record = durable::new_run_record(&run, &tools, &cfg).unwrap();
    store
        .enqueue(store::QueuedRun {
            run: record,
            agent: "crash".into(),
            idempotency_key: None,
            traceparent: None,
        })
        .await
        .unwrap();
    let claim = store.claim().await.unwrap().expect("claimed");
    let model = Model {
        calls: AtomicU64::new(0),
        hang_at: None,
    };
    let reopened = durable::reopen_claimed(
        store.as_ref(),
        claim.lease,
        claim.loaded,
        &tools,
        &cfg,
        aplc_vm::Interrupt::new(),
    )
    .await
    .unwrap();
    let finished = reopened.run(&model, &tools, None).await.unwrap();
    assert!(finished.finished().unwrap().outcome.error.is_none());
    assert_eq!(store.summary("queued").await.unwrap().events, 0);
    crash_and_resume(store.as_ref(), "listened", None, true, true).await;
    let expected = shapes(&read_events(store.as_ref(), "listened").await);
    assert_eq!(
        shapes(&read_events(store.as_ref(), "queued").await),
        expected
    );
}
