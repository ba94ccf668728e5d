//! People in the loop, durable (`spec/human.md`): a run that asks pauses with its
//! requests committed, its process lets it go, answers arrive in the store (a few at a
//! time), and a resume (a new lease, as another process would take) goes on from the
//! pause without repeating a provider call or a tool, and ends as a run answered at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aplc_runtime::Redactor;
use aplc_runtime::driver::{BoxFuture, CallContext, Provider, Toolbox};
use aplc_runtime::durable::{self, DurableOptions, Ended};
use aplc_runtime::human::{Answerer, Pending, answer_json};
use aplc_runtime::store::{self, Answered, Batch, NewRun, QueuedRun, RunStore, StoreUrl};
use aplc_test_support::pg;
use aplc_vm::human::{HumanAnswer, Reply, RequestKind};
use aplc_vm::tools::{Approval, ToolSpec};
use aplc_vm::{Completion, Program, ProviderError, ProviderRequest, RunOptions, ToolCall};
use serde_json::{Value as Json, json};

const AGENT: &str = "\
# prompt: act
## user
Pay.
## tool_result
{% for call in result_tool_calls or [] %}{{ call.tool_call_id }}: {{ call.content }}
{% endfor %}

# post: act
{% if runs < 2 %}{{ set_context('next_step', 'act') }}{% else %}
{{ set_context('await_input', {'prompt': 'Done?', 'schema': {'type': 'boolean'}}) }}
{{ set_context('next_step', 'end') }}{% endif %}

# prompt: end
## user
Confirmed: {{ human_input }}
";

fn program() -> Arc<Program> {
    let compiled = aplc_compiler::compile(AGENT, "pay.apl", &Default::default());
    Arc::new(Program::from_bundle(compiled.bundle.expect("compiles"), Default::default()).unwrap())
}

/// Turn 1 pays twice (two calls needing approval), then plain answers; counts calls.
struct Model {
    calls: AtomicU64,
}

impl Provider for Model {
    fn complete<'a>(
        &'a self,
        _request: &'a ProviderRequest,
        _call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let mut completion = Completion::text(format!("answer {n}"));
            if n == 0 {
                completion.tool_calls = vec![
                    ToolCall::new("p1", "pay", json!({"amount": 5})),
                    ToolCall::new("p2", "pay", json!({"amount": 500})),
                ];
            }
            Ok(completion)
        })
    }
}

/// `pay` needs approval; it counts its executions.
fn toolbox(executions: Arc<AtomicU64>) -> Toolbox {
    let spec = ToolSpec::new(json!({"name": "pay", "parameters": {"type": "object"}}))
        .unwrap()
        .requires_approval(Approval::default());
    let mut toolbox = Toolbox::new();
    toolbox
        .register_fn(spec, move |args, _| {
            executions.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"paid": args["amount"]}))
        })
        .unwrap();
    toolbox
}

/// A store of each kind: SQLite in a fresh file, PostgreSQL in a fresh database.
async fn stores(name: &str) -> Vec<Arc<dyn RunStore>> {
    let url = StoreUrl::parse(&pg::shared().database(name)).unwrap();
    vec![sqlite(name).await, store::open(&url).await.unwrap()]
}

async fn sqlite(name: &str) -> Arc<dyn RunStore> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("human-runtime");
    std::fs::create_dir_all(&dir).unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(format!("{name}.db{suffix}")));
    }
    store::open(&StoreUrl::Sqlite(dir.join(format!("{name}.db"))))
        .await
        .unwrap()
}

fn approve(id: &str, approved: bool) -> Json {
    answer_json(&HumanAnswer {
        id: id.into(),
        reply: Reply::Approve {
            approved,
            reason: (!approved).then(|| "too much".into()),
        },
        by: "test".into(),
        answered_at_ms: 1,
    })
}

/// Answers everything at once, in this process.
#[derive(Debug)]
struct AtOnce;

impl Answerer for AtOnce {
    fn answer<'a>(&'a self, pending: &'a [Pending]) -> BoxFuture<'a, Vec<HumanAnswer>> {
        Box::pin(async move {
            pending
                .iter()
                .map(|p| HumanAnswer {
                    id: p.request.id.clone(),
                    reply: match p.request.kind {
                        RequestKind::Approval => Reply::Approve {
                            approved: p.request.id == "1-1",
                            reason: (p.request.id != "1-1").then(|| "too much".into()),
                        },
                        _ => Reply::Value(json!(true)),
                    },
                    by: "test".into(),
                    answered_at_ms: 1,
                })
                .collect()
        })
    }
}

fn without_times(mut context: Json) -> Json {
    fn strip(value: &mut Json) {
        match value {
            Json::Object(map) => {
                map.remove("time_elapsed");
                map.remove("time_elapsed_global");
                map.values_mut().for_each(strip);
            }
            Json::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut context);
    context
}

fn waiting(ended: Ended) -> Vec<String> {
    match ended {
        Ended::Waiting(waiting) => waiting
            .pending
            .iter()
            .map(|p| p.request.id.clone())
            .collect(),
        Ended::Finished(finished) => panic!("finished: {:?}", finished.outcome.error),
    }
}

#[tokio::test]
async fn a_paused_run_resumes_from_its_answers_without_repeating_anything() {
    for store in stores("paused").await {
        paused_run_resumes(store).await;
    }
}

async fn paused_run_resumes(paused: Arc<dyn RunStore>) {
    // The reference: the same run, answered at once in its process.
    let store = sqlite("at-once").await;
    let model = Model {
        calls: AtomicU64::new(0),
    };
    let executions = Arc::new(AtomicU64::new(0));
    let tools = toolbox(executions.clone());
    let config = DurableOptions::default().with_answerer(Arc::new(AtOnce));
    let run = |id: &str| durable::NewDurableRun {
        id: id.into(),
        program: program(),
        options: RunOptions::default(),
    };
    let ended = durable::start(store.as_ref(), run("r"), &model, &tools, None, &config)
        .await
        .unwrap();
    let reference = ended.finished().expect("answered at once, it finishes");
    assert!(
        reference.outcome.error.is_none(),
        "{:?}",
        reference.outcome.error
    );
    let expected = without_times(reference.outcome.context_json());
    assert_eq!(model.calls.load(Ordering::SeqCst), 3);
    assert_eq!(executions.load(Ordering::SeqCst), 1);

    // The same run with nobody to ask: it pauses, and each resume is a new process.
    let store = paused;
    let model = Model {
        calls: AtomicU64::new(0),
    };
    let executions = Arc::new(AtomicU64::new(0));
    let tools = toolbox(executions.clone());
    let config = DurableOptions::default();
    let ended = durable::start(store.as_ref(), run("p"), &model, &tools, None, &config)
        .await
        .unwrap();
    assert_eq!(waiting(ended), ["1-1", "1-2"]);
    let summary = store.summary("p").await.unwrap();
    assert_eq!(summary.pending.len(), 2, "the requests are committed");
    assert_eq!(model.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        executions.load(Ordering::SeqCst),
        0,
        "nothing runs unapproved"
    );

    // One answer: the run stays waiting on the other.
    let accepted = store
        .answer("p", "1-1", approve("1-1", true))
        .await
        .unwrap();
    assert_eq!(
        accepted,
        Answered::Accepted {
            unanswered: vec!["1-2".into()]
        }
    );
    let again = store
        .answer("p", "1-1", approve("1-1", false))
        .await
        .unwrap();
    assert_eq!(again, Answered::AlreadyAnswered);
    let ended = durable::resume(store.as_ref(), "p", None, &model, &tools, None, &config)
        .await
        .unwrap();
    assert_eq!(waiting(ended), ["1-2"]);
    assert_eq!(model.calls.load(Ordering::SeqCst), 1);
    assert_eq!(executions.load(Ordering::SeqCst), 0);

    // The second: the round runs (one approved, one denied), then `await_input` asks.
    store
        .answer("p", "1-2", approve("1-2", false))
        .await
        .unwrap();
    let ended = durable::resume(store.as_ref(), "p", None, &model, &tools, None, &config)
        .await
        .unwrap();
    assert_eq!(waiting(ended), ["2-0"]);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    assert_eq!(model.calls.load(Ordering::SeqCst), 2);

    let value = answer_json(&HumanAnswer {
        id: "2-0".into(),
        reply: Reply::Value(json!(true)),
        by: "test".into(),
        answered_at_ms: 1,
    });
    store.answer("p", "2-0", value).await.unwrap();
    let finished = durable::resume(store.as_ref(), "p", None, &model, &tools, None, &config)
        .await
        .unwrap()
        .finished()
        .expect("every request answered");
    assert!(
        finished.outcome.error.is_none(),
        "{:?}",
        finished.outcome.error
    );
    assert_eq!(without_times(finished.outcome.context_json()), expected);
    // No provider call and no tool was repeated across the three restarts.
    assert_eq!(model.calls.load(Ordering::SeqCst), 3);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    let summary = store.summary("p").await.unwrap();
    assert!(summary.pending.is_empty());
    // The audit: every answer is an event with who gave it.
    let events = durable::EventReader::new("p", 0, Redactor::default())
        .all(store.as_ref())
        .await
        .unwrap();
    let received = events
        .iter()
        .filter(|e| e.contains("\"input_received\""))
        .count();
    assert_eq!(received, 3);
}

#[tokio::test]
async fn a_request_whose_timeout_passed_is_answered_by_it_on_resume() {
    for store in stores("timeout").await {
        timeout_on_resume(store).await;
    }
}

async fn timeout_on_resume(store: Arc<dyn RunStore>) {
    let model = Model {
        calls: AtomicU64::new(0),
    };
    let executions = Arc::new(AtomicU64::new(0));
    let spec = ToolSpec::new(json!({"name": "pay", "parameters": {"type": "object"}}))
        .unwrap()
        .requires_approval(Approval {
            timeout: Some(Duration::from_millis(2000)),
        });
    let mut tools = Toolbox::new();
    let counted = executions.clone();
    tools
        .register_fn(spec, move |_, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(json!("paid"))
        })
        .unwrap();
    let config = DurableOptions::default();
    let run = durable::NewDurableRun {
        id: "t".into(),
        program: program(),
        options: RunOptions::default(),
    };
    let ended = durable::start(store.as_ref(), run, &model, &tools, None, &config)
        .await
        .unwrap();
    assert_eq!(waiting(ended), ["1-1", "1-2"]);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let ended = durable::resume(store.as_ref(), "t", None, &model, &tools, None, &config)
        .await
        .unwrap();
    // Both approvals timed out (denied); the run went on to `await_input`, which has none.
    assert_eq!(waiting(ended), ["2-0"]);
    assert_eq!(executions.load(Ordering::SeqCst), 0);
    let events = durable::EventReader::new("t", 0, Redactor::default())
        .all(store.as_ref())
        .await
        .unwrap()
        .join("\n");
    assert!(events.contains("\"timed_out\":true"), "{events}");
    assert!(
        events.contains("denied: no answer within 2000 ms"),
        "{events}"
    );
}

/// A run queued for a service, claimed, then paused with `requests` by its worker,
/// which lets it go.
async fn queued_and_paused(store: &Arc<dyn RunStore>, id: &str, requests: Vec<Json>) {
    let run = NewRun {
        id: id.into(),
        agent: "pay.apl".into(),
        bundle_hash: "h".into(),
        bundle: vec![1, 2, 3],
        options: json!({}),
        started_at_ms: 1,
    };
    store
        .enqueue(QueuedRun {
            run,
            agent: "pay".into(),
            idempotency_key: None,
            traceparent: None,
        })
        .await
        .unwrap();
    let claim = store
        .claim()
        .await
        .unwrap()
        .expect("the new run is claimed");
    let batch = Batch {
        pending: Some(requests),
        ..Batch::default()
    };
    store.append(claim.lease.as_ref(), batch).await.unwrap();
    drop(claim);
}

/// Claims until one comes (a dropped lease is released in the background), or gives up
/// after a few seconds: `None`. A run claimed is ended, as its worker would.
async fn claimed(store: &Arc<dyn RunStore>) -> Option<String> {
    for _ in 0..40 {
        if let Some(claim) = store.claim().await.unwrap() {
            let id = claim.lease.run_id().to_owned();
            let done = Batch {
                outcome: Some(json!({"status": "completed", "error": null})),
                pending: Some(Vec::new()),
                ..Batch::default()
            };
            store.append(claim.lease.as_ref(), done).await.unwrap();
            return Some(id);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test]
async fn a_waiting_run_is_not_claimed_until_answered_woken_or_cancelled() {
    for store in stores("claims").await {
        let request = |id: &str| json!({"id": id, "kind": "approval", "prompt": "?", "step": "s"});
        queued_and_paused(&store, "w", vec![request("1-1"), request("1-2")]).await;
        let summary = store.summary("w").await.unwrap();
        assert_eq!(
            store::QueueStatus::of_summary(&summary),
            store::QueueStatus::Waiting
        );
        let counts = store.queue_counts().await.unwrap();
        assert_eq!(counts.get(store::QueueStatus::Waiting), 1);
        assert_eq!(claimed(&store).await, None, "a waiting run holds no worker");
        store
            .answer("w", "1-1", approve("1-1", true))
            .await
            .unwrap();
        assert_eq!(claimed(&store).await, None, "one request is still open");
        store
            .answer("w", "1-2", approve("1-2", true))
            .await
            .unwrap();
        assert_eq!(claimed(&store).await.as_deref(), Some("w"));

        // A timeout that passed wakes a run; so does a cancel.
        let expired = json!({"id": "1-1", "kind": "input", "prompt": "?", "step": "s",
                             "expires_at_ms": 1});
        queued_and_paused(&store, "t", vec![expired]).await;
        assert_eq!(claimed(&store).await.as_deref(), Some("t"));
        queued_and_paused(&store, "c", vec![request("1-1")]).await;
        assert_eq!(claimed(&store).await, None);
        store.request_cancel("c").await.unwrap();
        assert_eq!(claimed(&store).await.as_deref(), Some("c"));
    }
}

#[tokio::test]
async fn answers_are_checked_and_the_first_one_wins_under_concurrency() {
    for store in stores("answers").await {
        let request = |id: &str| json!({"id": id, "kind": "input", "prompt": "?", "step": "s"});
        queued_and_paused(&store, "a", vec![request("1-0"), request("1-1")]).await;
        assert_eq!(
            store
                .answer("nope", "1-0", json!({"value": 1}))
                .await
                .unwrap(),
            Answered::UnknownRun
        );
        assert_eq!(
            store.answer("a", "9-9", json!({"value": 1})).await.unwrap(),
            Answered::UnknownRequest
        );
        let big = json!({ "value": "x".repeat(aplc_runtime::store::MAX_ANSWER_BYTES) });
        assert!(store.answer("a", "1-0", big).await.is_err());
        let tasks: Vec<_> = (0..16)
            .map(|n| {
                let store = store.clone();
                tokio::spawn(async move { store.answer("a", "1-0", json!({ "value": n })).await })
            })
            .collect();
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap().unwrap());
        }
        let accepted: Vec<&Answered> = results
            .iter()
            .filter(|r| matches!(r, Answered::Accepted { .. }))
            .collect();
        assert_eq!(accepted.len(), 1, "{results:?}");
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Answered::Accepted { .. } | Answered::AlreadyAnswered))
        );
        assert_eq!(
            accepted[0],
            &Answered::Accepted {
                unanswered: vec!["1-1".into()]
            }
        );
        let stored = store.answers("a").await.unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].0, "1-0");
    }
}
