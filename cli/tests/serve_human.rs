//! People in the loop through `aplc serve` (spec/human.md §4.2): a run that asks waits in
//! the store with no worker holding it, is answered through `POST /v1/runs/{id}/input`,
//! survives a SIGKILL of the server while it waits, and ends as a run answered at once,
//! with the fake model's log proving that no provider call was sent twice.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aplc_test_support::pg;
use serde_json::{Value as Json, json};

mod serving;
use serving::*;

/// A scratch directory with the `pay` agent (fixtures/human/pay.apl), the `turns` agent,
/// a manifest whose `refund` needs approval (with `approval_timeout_ms` when given), and
/// a model that asks for one refund in a `pay` step, and answers in words otherwise.
fn setup(name: &str, approval_timeout_ms: Option<u64>) -> (Model, PathBuf) {
    let model = Model::answering(|body| {
        // Asks for the refund once, in the `pay` step; answers in words otherwise.
        if body.contains("c1: ") || !last_user_message(body).starts_with("Refund") {
            json!({"role": "assistant", "content": "done"})
        } else {
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "refund", "arguments": "{\"order\": \"A-17\", \"amount\": 20}"}
            }]})
        }
    });
    let dir = serving::scratch(&format!("human-{name}"), &model);
    let human = serving::root().join("fixtures/human");
    std::fs::copy(human.join("pay.apl"), dir.join("agents/pay.apl")).unwrap();
    let mut manifest: Json =
        serde_json::from_str(&std::fs::read_to_string(human.join("tools.json")).unwrap()).unwrap();
    let refund = &mut manifest["refund"];
    refund["cwd"] = json!(human.to_string_lossy());
    match approval_timeout_ms {
        Some(ms) => refund["approval_timeout_ms"] = json!(ms),
        None => {
            refund
                .as_object_mut()
                .unwrap()
                .remove("approval_timeout_ms");
        }
    }
    let tools = json!({"refund": manifest["refund"].clone()});
    std::fs::write(dir.join("tools.json"), tools.to_string()).unwrap();
    (model, dir)
}

/// `aplc serve` on `store` with the manifest, its tools logging each run to `tools.log`.
fn serve(dir: &Path, store: &str, extra: &[&str]) -> Server {
    let log = dir.join("tools.log");
    let mut args = vec!["--tools", "tools.json"];
    args.extend_from_slice(extra);
    Server::start_with(
        dir,
        store,
        &args,
        &[("APLC_TOOL_LOG", log.to_str().unwrap())],
    )
}

/// How many times the refund tool ran for order `order`.
fn refunds(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("tools.log"))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

impl Client {
    async fn submit_pay(&self, tag: &str) -> String {
        let (status, accepted) = self
            .post(
                "/v1/agents/pay/runs",
                &json!({"context": {"tag": tag, "amount": 20}}),
            )
            .await;
        assert_eq!(status, 202, "{accepted}");
        accepted["run_id"].as_str().unwrap().to_string()
    }

    /// Polls until the run waits on request `request`; returns the run.
    async fn until_waiting_on(&self, id: &str, request: &str) -> Json {
        self.until(id, |run| {
            run["status"] == "waiting"
                && run["pending"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|r| r["id"] == request))
        })
        .await
    }

    async fn answer(&self, id: &str, body: Json) -> (u16, Json) {
        self.post(&format!("/v1/runs/{id}/input"), &body).await
    }
}

/// The final context without what differs between two runs of one agent answered the
/// same way: the tag (and the last prompt, which names it), and the time fields.
fn comparable(run: &Json) -> Json {
    fn strip(value: &mut Json) {
        match value {
            Json::Object(map) => {
                for key in ["time_elapsed", "time_elapsed_global", "tag", "prompts"] {
                    map.remove(key);
                }
                map.values_mut().for_each(strip);
            }
            Json::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut context = run["context"].clone();
    strip(&mut context);
    context
}

/// The requests the fake model got for run `tag`.
fn calls_of(model: &Model, tag: &str) -> Vec<String> {
    let needle = format!("run {tag}");
    model
        .prompts()
        .into_iter()
        .filter(|p| p.contains(&needle))
        .collect()
}

/// The "done when": a run that waits, is killed (`aplc serve` SIGKILLed while it
/// waits, twice), is answered through the API on a new server (on PostgreSQL, a second
/// server takes the run up), and ends with the same context as a run answered at once.
async fn waits_is_killed_and_is_answered(store: &str, second: bool, dir: &Path, model: &Model) {
    let mut server = serve(dir, store, &[]);
    let client = Client::new(&server);

    // Answered at once.
    let before = model.requests().len();
    let reference = client.submit_pay("at-once").await;
    let run = client.until_waiting_on(&reference, "1-1").await;
    assert_eq!(run["pending"][0]["kind"], "approval", "{run}");
    assert_eq!(
        run["pending"][0]["arguments"],
        json!({"order": "A-17", "amount": 20})
    );
    assert!(run["pending"][0]["requested_at"].is_string(), "{run}");
    assert!(run["pending"][0].get("requested_at_ms").is_none(), "{run}");
    let (status, body) = client
        .answer(&reference, json!({"id": "1-1", "approve": true}))
        .await;
    assert_eq!((status, &body["pending"]), (200, &json!([])), "{body}");
    client.until_waiting_on(&reference, "2-0").await;
    let (status, body) = client
        .answer(&reference, json!({"id": "2-0", "value": true}))
        .await;
    assert_eq!(status, 200, "{body}");
    let reference = client.until_final(&reference).await;
    assert_eq!(reference["status"], "completed", "{reference}");
    assert_eq!(reference["context"]["human_input"], json!(true));
    let once = model.requests().len() - before;

    // Killed while it waits, twice; answered on the next server each time.
    let before = model.requests().len();
    let id = client.submit_pay("killed").await;
    client.until_waiting_on(&id, "1-1").await;
    let asked = model.requests().len() - before;
    server.kill();
    let mut server = serve(dir, store, &[]);
    let client = Client::new(&server);
    let (status, body) = client
        .answer(&id, json!({"id": "1-1", "approve": true}))
        .await;
    assert_eq!(status, 200, "{body}");
    client.until_waiting_on(&id, "2-0").await;
    server.kill();
    let mut servers = vec![serve(dir, store, &[])];
    if second {
        // Another worker of the same store: either may take the run up.
        servers.push(serve(dir, store, &[]));
    }
    let client = Client::new(&servers[0]);
    let (status, body) = client
        .answer(&id, json!({"id": "2-0", "value": true}))
        .await;
    assert_eq!(status, 200, "{body}");
    let run = client.until_final(&id).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(comparable(&run), comparable(&reference));

    // The model's log: the reference's calls and the killed run's are the same three
    // (two turns of `pay`, one of `confirm`), each once: nothing asked before a pause was
    // asked again.
    let killed = model.requests().len() - before;
    eprintln!(
        "provider calls: answered at once {once}, killed twice while waiting {killed} \
         ({asked} before the first kill)"
    );
    assert_eq!((once, killed), (3, 3));
    assert_eq!(run["context"]["global_runs"], json!(3));
    let prompts = calls_of(model, "killed");
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    // The approved refund ran once per run.
    assert_eq!(refunds(dir), 2);
    // The answers are in the run's events, with who gave them.
    let events = client.events(&id, None).await;
    let received: Vec<&Json> = events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e["type"] == "input_received")
        .collect();
    assert_eq!(received.len(), 2, "{events:?}");
    assert!(
        received
            .iter()
            .all(|e| e["by"].as_str().is_some_and(|by| by.len() == 8))
    );
    server.kill();
}

#[tokio::test]
async fn a_waiting_run_survives_sigkill_and_is_answered_through_the_api_on_sqlite() {
    let (model, dir) = setup("kill-sqlite", None);
    waits_is_killed_and_is_answered("sqlite:runs.db", false, &dir, &model).await;
}

#[tokio::test]
async fn a_waiting_run_survives_sigkill_and_a_second_worker_takes_it_on_postgres() {
    let (model, dir) = setup("kill-postgres", None);
    let url = pg::shared().database("serve_human");
    waits_is_killed_and_is_answered(&url, true, &dir, &model).await;
}

#[tokio::test]
async fn concurrent_answers_to_one_request_one_wins_and_bad_answers_change_nothing() {
    let (_model, dir) = setup("answers", None);
    let server = serve(&dir, "sqlite:runs.db", &[]);
    let client = Client::new(&server);
    let id = client.submit_pay("answers").await;
    client.until_waiting_on(&id, "1-1").await;

    // Bad answers first: each refused with its status, none stored.
    let cases = [
        (
            "/v1/runs/no-such-run/input",
            json!({"id": "1-1", "approve": true}),
            404,
        ),
        (
            &*format!("/v1/runs/{id}/input"),
            json!({"id": "9-9", "approve": true}),
            404,
        ),
        (
            &*format!("/v1/runs/{id}/input"),
            json!({"id": "1-1", "value": 3}),
            422,
        ),
        (&*format!("/v1/runs/{id}/input"), json!({"id": "1-1"}), 400),
        (
            &*format!("/v1/runs/{id}/input"),
            json!({"id": "1-1", "approve": "yes"}),
            400,
        ),
        (
            &*format!("/v1/runs/{id}/input"),
            json!({"id": "1-1", "approve": true, "x": 1}),
            400,
        ),
    ];
    for (path, body, expected) in cases {
        let (status, answer) = client.post(path, &body).await;
        assert_eq!(status, expected, "{body} → {answer}");
    }
    let (status, _) = client.get(&format!("/v1/runs/{id}")).await;
    assert_eq!(status, 200);

    // Sixteen answers at once: exactly one is taken.
    let mut tasks = Vec::new();
    for n in 0..16 {
        let client = Client::new(&server);
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            client
                .answer(
                    &id,
                    json!({"id": "1-1", "approve": n % 2 == 0, "reason": format!("reviewer {n}")}),
                )
                .await
                .0
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses.sort_unstable();
    eprintln!("16 concurrent answers: {statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        15,
        "{statuses:?}"
    );

    // The await_input's schema is checked; the run then ends and takes nothing more.
    let run = client.until_waiting_on(&id, "2-0").await;
    assert_eq!(run["pending"][0]["schema"], json!({"type": "boolean"}));
    let (status, body) = client
        .answer(&id, json!({"id": "2-0", "value": "yes"}))
        .await;
    assert_eq!(status, 422, "{body}");
    let (status, _) = client
        .answer(&id, json!({"id": "2-0", "approve": true}))
        .await;
    assert_eq!(status, 422);
    let (status, _) = client
        .answer(&id, json!({"id": "2-0", "value": false}))
        .await;
    assert_eq!(status, 200);
    let run = client.until_final(&id).await;
    assert_eq!(run["context"]["human_input"], json!(false));
    let (status, body) = client
        .answer(&id, json!({"id": "2-0", "value": true}))
        .await;
    assert_eq!(status, 409, "{body}");
    let (status, _) = client
        .answer(&id, json!({"id": "1-1", "approve": true}))
        .await;
    assert_eq!(status, 409);
}

#[tokio::test]
async fn waiting_runs_hold_no_slot_and_the_stream_shows_requests_and_answers() {
    let (model, dir) = setup("slots", None);
    let server = serve(&dir, "sqlite:runs.db", &["--max-concurrent-runs", "1"]);
    let client = Client::new(&server);
    let mut waiting = Vec::new();
    for n in 0..10 {
        let id = client.submit_pay(&format!("w{n}")).await;
        client.until_waiting_on(&id, "1-1").await;
        waiting.push(id);
    }
    // One slot, ten waiting runs: an eleventh run that asks nothing still runs.
    let (status, run) = client.submit("free", 2, true).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["status"], "completed", "{run}");
    let (_, metrics) = client.get("/metrics").await;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(metrics.contains("status=\"waiting\"} 10"), "{metrics}");

    // The stream of a waiting run: its request now, its answer and the rest later.
    let id = waiting[0].clone();
    let stream = {
        let client = Client::new(&server);
        let id = id.clone();
        tokio::spawn(async move { client.events(&id, None).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    client
        .answer(&id, json!({"id": "1-1", "approve": false, "reason": "no"}))
        .await;
    client.until_waiting_on(&id, "2-0").await;
    client
        .answer(&id, json!({"id": "2-0", "value": true}))
        .await;
    let events = tokio::time::timeout(Duration::from_secs(60), stream)
        .await
        .expect("the stream ends with the run")
        .unwrap();
    let types: Vec<&str> = events
        .iter()
        .filter_map(|(_, e)| e["type"].as_str())
        .collect();
    let requested = types.iter().position(|t| *t == "input_requested").unwrap();
    let received = types.iter().position(|t| *t == "input_received").unwrap();
    assert!(requested < received, "{types:?}");
    assert_eq!(types.last(), Some(&"run_finished"));
    // The denial reached the model's next prompt.
    let prompts = calls_of(&model, "w0");
    assert!(
        prompts.iter().any(|p| p.contains("denied by reviewer: no")) || {
            let run = client.until_final(&id).await;
            run["context"]["transcript"]
                .to_string()
                .contains("denied by reviewer: no")
        },
        "{prompts:?}"
    );
}

#[tokio::test]
async fn a_request_times_out_as_a_denial_and_a_waiting_run_can_be_cancelled() {
    let (_model, dir) = setup("timeout", Some(1500));
    let server = serve(&dir, "sqlite:runs.db", &["--store-poll-ms", "200"]);
    let client = Client::new(&server);
    let id = client.submit_pay("timeout").await;
    client.until_waiting_on(&id, "1-1").await;
    let started = Instant::now();
    // Nobody answers the approval: the run wakes at its timeout and goes on, denied.
    let run = client.until_waiting_on(&id, "2-0").await;
    assert!(started.elapsed() >= Duration::from_millis(500), "{run}");
    assert_eq!(refunds(&dir), 0);

    // Cancelled while it waits for the `await_input`: it ends cancelled, unanswered.
    let (status, _) = client
        .post(&format!("/v1/runs/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 202);
    let run = client.until_final(&id).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    let events = client.events(&id, None).await;
    let timed_out: Vec<&Json> = events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e["type"] == "input_received")
        .collect();
    assert_eq!(timed_out.len(), 1, "{events:?}");
    assert_eq!(timed_out[0]["timed_out"], true);
    assert_eq!(timed_out[0]["approved"], false);
    assert_eq!(timed_out[0]["by"], "timeout");
}
