//! `aplc serve` end to end (issue #14 §5): the binary on a free port of 127.0.0.1 with a
//! SQLite store, a fake OpenAI-compatible model on 127.0.0.1, and real HTTP requests.
//!
//! The agent (`fixtures/serve/turns.apl`) makes `turns` provider calls, each prompt naming
//! the run's `tag` and the turn: the fake model counts the requests per `(tag, turn)`, so a
//! test can tell whether a journaled call was sent twice.

use aplc_test_support::{otlp, pg};

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

mod serving;
use serving::*;

// ---------------------------------------------------------------------------------------
// The tests.

#[tokio::test]
async fn submit_then_wait_and_submit_then_poll() {
    let model = Model::start();
    let dir = scratch("submit", &model);
    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);

    let (status, run) = client.submit("w", 2, true).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["agent"], "turns");
    assert_eq!(run["context"]["turn"], 2, "{run}");
    assert_eq!(
        run["context"]["result_text"],
        "answer to: V1 run w turn 2 of 2."
    );
    assert_eq!(run["totals"]["steps"], 2);
    assert!(run["error"].is_null(), "{run}");

    let (status, accepted) = client.submit("p", 3, false).await;
    assert_eq!(status, 202, "{accepted}");
    // The status is the store's when the answer is made: on a loaded machine the worker
    // can finish the run's three fast calls first, so `completed` is a right answer too.
    assert!(
        ["queued", "running", "completed"].contains(&accepted["status"].as_str().unwrap()),
        "{accepted}"
    );
    let id = accepted["run_id"].as_str().expect("run id");
    let run = client.until_final(id).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["context"]["turn"], 3);
    assert_eq!(model.prompts_of("p").len(), 3);

    // The log has a line per request and per run start and end, with the run id, and
    // never the token.
    let log = server.log();
    assert!(log.contains(&format!("run_id={id}")), "{log}");
    assert!(
        log.contains("run started") && log.contains("run finished"),
        "{log}"
    );
    assert!(log.contains("route=/v1/agents/{name}/runs"), "{log}");
    assert!(!log.contains(TOKEN), "{log}");

    // Metrics count the runs by status, from the store.
    let (status, metrics) = client.get("/metrics").await;
    assert_eq!(status, 200);
    let metrics = metrics.as_str().expect("text").to_string();
    assert!(
        metrics.contains("aplc_runs{status=\"completed\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("aplc_queue_depth 0"), "{metrics}");
    assert!(metrics.contains("aplc_provider_calls_total 5"), "{metrics}");
    assert!(
        metrics.contains("aplc_provider_latency_seconds_count 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("aplc_tokens_total{direction=\"input\"} 50"),
        "{metrics}"
    );
    // Every run commits its journal at least once (its outcome), and each commit counts.
    let commits: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("aplc_journal_commits_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_default();
    assert!(commits >= 2, "{metrics}");
}

#[tokio::test]
async fn agents_openapi_and_a_broken_agent() {
    let model = Model::start();
    let dir = scratch("agents", &model);
    std::fs::copy(
        root().join("fixtures/serve/broken.apl"),
        dir.join("agents/broken.apl"),
    )
    .expect("broken agent");
    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);
    let (status, agents) = client.get("/v1/agents").await;
    assert_eq!(status, 200);
    let agents = agents["agents"].as_array().expect("agents").clone();
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert_eq!(agents[0]["name"], "turns");
    assert_eq!(agents[0]["inputs"], json!(["turns", "tag"]));
    assert_eq!(agents[0]["steps"], json!(["work"]));
    let description = agents[0]["description"].as_str().unwrap_or_default();
    assert!(
        description.starts_with("An agent for `aplc serve`'s tests"),
        "{description:?}"
    );
    assert_eq!(agents[0]["bundle_hash"].as_str().map(str::len), Some(32));
    let log = server.log();
    assert!(
        log.contains("broken.apl") && log.contains("does not compile"),
        "{log}"
    );

    let (status, doc) = client.get("/openapi.json").await;
    assert_eq!(status, 200);
    assert!(
        doc["openapi"].as_str().unwrap_or("").starts_with("3."),
        "{doc}"
    );
    for path in [
        "/v1/agents",
        "/v1/agents/{name}/runs",
        "/v1/runs/{id}",
        "/v1/runs/{id}/events",
        "/v1/runs/{id}/cancel",
        "/healthz",
        "/metrics",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing");
    }
    assert!(doc["components"]["schemas"].get("RunRequest").is_some());
}

#[tokio::test]
async fn auth_and_errors() {
    let model = Model::start();
    let dir = scratch("errors", &model);
    let server = Server::start(&dir, &["--max-body-bytes", "1024"]);
    let client = Client::new(&server);
    let http = http();

    // /healthz needs no token; everything else does.
    let health = http
        .get(format!("{}/healthz", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    for path in ["/v1/agents", "/metrics", "/openapi.json", "/v1/runs/x"] {
        let response = http
            .get(format!("{}{path}", server.url))
            .send()
            .await
            .unwrap();
        let (status, body) = status_json(response).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized");
        let response = http
            .get(format!("{}{path}", server.url))
            .bearer_auth("test-token-4f1e")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 401, "{path}");
    }

    // 404: unknown agent, run and route.
    let (status, body) = client.submit_to("nope", &json!({"context": {}})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    assert!(body["error"]["message"].as_str().unwrap().contains("nope"));
    assert_eq!(client.get("/v1/runs/0000-none").await.0, 404);
    assert_eq!(client.get("/v1/runs/0000-none/events").await.0, 404);
    assert_eq!(
        client.post("/v1/runs/0000-none/cancel", &json!({})).await.0,
        404
    );
    assert_eq!(client.get("/v2/else").await.0, 404);

    // 400: not JSON, an unknown field, a context that is not an object.
    for body in [
        json!("not an object"),
        json!({"contxt": {}}),
        json!({"context": [1]}),
    ] {
        let (status, answer) = client.submit_to("turns", &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_body");
    }
    let raw = http
        .post(format!("{}/v1/agents/turns/runs", server.url))
        .bearer_auth(TOKEN)
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status().as_u16(), 400);

    // 413: a body over --max-body-bytes.
    let big = json!({"context": {"turns": 1, "tag": "x".repeat(4096)}});
    let (status, answer) = client.submit_to("turns", &big).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["error"]["code"], "body_too_large");

    // 422: missing declared inputs, named.
    let (status, answer) = client
        .submit_to("turns", &json!({"context": {"turns": 1}}))
        .await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "missing_inputs");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tag") && !message.contains("turns,"),
        "{message}"
    );
    assert!(model.prompts().is_empty());
}

impl Client {
    async fn submit_to(&self, agent: &str, body: &Json) -> (u16, Json) {
        self.post(&format!("/v1/agents/{agent}/runs"), body).await
    }
}

#[tokio::test]
async fn idempotency_keys_return_the_existing_run() {
    let model = Model::start();
    let dir = scratch("idempotency", &model);
    let server = Server::start(&dir, &["--log-format", "json"]);
    let client = Client::new(&server);
    let body = json!({"context": {"turns": 1, "tag": "i"}, "idempotency_key": "order-17"});
    let (status, first) = client.submit_to("turns", &body).await;
    assert_eq!(status, 202, "{first}");
    let (status, second) = client.submit_to("turns", &body).await;
    assert_eq!(status, 202, "{second}");
    assert_eq!(first["run_id"], second["run_id"]);
    let other = json!({"context": {"turns": 1, "tag": "j"}, "idempotency_key": "order-18"});
    let (_, third) = client.submit_to("turns", &other).await;
    assert_ne!(first["run_id"], third["run_id"]);
    let id = first["run_id"].as_str().unwrap();
    client.until_final(id).await;
    client.until_final(third["run_id"].as_str().unwrap()).await;
    // Once finished, the key still answers with the run, now completed.
    let (status, again) = client.post("/v1/agents/turns/runs?wait=true", &body).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["run_id"], first["run_id"]);
    assert_eq!(again["status"], "completed");
    assert_eq!(model.prompts_of("i").len(), 1);

    // `--log-format json`: one object per line, the run id a field.
    let log = server.log();
    let lines: Vec<Json> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "run finished" && l["run_id"] == *id)
    );
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "request" && l["status"] == 202)
    );
}

#[tokio::test]
async fn events_from_the_start_after_an_id_and_live() {
    let model = Model::start();
    let dir = scratch("events", &model);
    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);

    let (_, run) = client.submit("e", 2, true).await;
    let id = run["run_id"].as_str().unwrap().to_string();
    let events = client.events(&id, None).await;
    assert_eq!(
        events.len() as u64,
        run["totals"]["events"].as_u64().unwrap()
    );
    for (i, (seq, event)) in events.iter().enumerate() {
        assert_eq!(*seq, Some(i as u64));
        assert_eq!(event["seq"], i as u64);
    }
    assert_eq!(events[0].1["type"], "run_started");
    assert_eq!(events.last().unwrap().1["type"], "run_finished");

    let after = client.events(&id, Some(3)).await;
    assert_eq!(after.len(), events.len() - 4);
    assert_eq!(after[0].0, Some(4));
    assert_eq!(after[0].1, events[4].1);

    // Live: the stream opened while the run is queued follows it to its end.
    model.delay(150);
    let (status, accepted) = client.submit("live", 4, false).await;
    assert_eq!(status, 202);
    let id = accepted["run_id"].as_str().unwrap().to_string();
    let live = client.events(&id, None).await;
    let seqs: Vec<u64> = live.iter().filter_map(|(seq, _)| *seq).collect();
    assert_eq!(
        seqs,
        (0..seqs.len() as u64).collect::<Vec<_>>(),
        "in order, once each"
    );
    assert_eq!(live.last().unwrap().1["type"], "run_finished");
    let run = client.until_final(&id).await;
    assert_eq!(seqs.len() as u64, run["totals"]["events"].as_u64().unwrap());

    // A bad Last-Event-ID is the caller's mistake.
    let response = http()
        .get(format!("{}/v1/runs/{id}/events", server.url))
        .bearer_auth(TOKEN)
        .header("Last-Event-ID", "soon")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
}

#[tokio::test]
async fn cancel_stops_a_running_run_and_a_queued_one() {
    let model = Model::start();
    model.delay(200);
    let dir = scratch("cancel", &model);
    // One run at a time: the second run waits in the queue.
    let server = Server::start(&dir, &["--max-concurrent-runs", "1"]);
    let client = Client::new(&server);
    let (_, accepted) = client.submit("c", 50, false).await;
    let id = accepted["run_id"].as_str().unwrap().to_string();
    client
        .until(&id, |run| run["totals"]["steps"].as_u64() >= Some(2))
        .await;
    let (_, queued) = client.submit("q", 3, false).await;
    let queued_id = queued["run_id"].as_str().unwrap().to_string();
    assert_eq!(queued["status"], "queued", "{queued}");

    let (status, answer) = client
        .post(&format!("/v1/runs/{queued_id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        answer["status"], "queued",
        "it ends when a worker claims it"
    );
    let (status, answer) = client
        .post(&format!("/v1/runs/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 202, "{answer}");

    let run = client.until_final(&id).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    assert_eq!(run["cancel_requested"], true);
    assert_eq!(run["error"]["kind"], "Cancelled", "{run}");
    assert!(run["totals"]["steps"].as_u64().unwrap() < 50);
    let run = client.until_final(&queued_id).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    assert!(
        model.prompts_of("q").is_empty(),
        "{:?}",
        model.prompts_of("q")
    );

    // Cancelling a finished run changes nothing.
    let (status, answer) = client
        .post(&format!("/v1/runs/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 202);
    assert_eq!(answer["status"], "cancelled");
}

/// Issue #22 R5: a cancel drops the provider call in flight. The fake model takes the
/// request and does not answer for an hour; the run's timeout is ten minutes; the run
/// must end `cancelled` long before either, and free its only slot for the next run.
#[tokio::test]
async fn cancel_drops_a_provider_call_in_flight() {
    let model = Model::start();
    model.delay(3_600_000);
    let dir = scratch("cancel_in_flight", &model);
    let server = Server::start(&dir, &["--max-concurrent-runs", "1"]);
    let client = Client::new(&server);
    let body = json!({"context": {"turns": 1, "tag": "hung"}, "timeout_ms": 600_000});
    let (status, accepted) = client.post("/v1/agents/turns/runs", &body).await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["run_id"].as_str().unwrap().to_string();
    let started = Instant::now();
    while model.prompts_of("hung").is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the call never reached the model"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    model.delay(0);
    let (status, answer) = client
        .post(&format!("/v1/runs/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 202, "{answer}");

    // `until_final` gives up after a minute: far below the run's timeout.
    let run = client.until_final(&id).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    assert_eq!(run["error"]["kind"], "Cancelled", "{run}");
    let events = client.events(&id, None).await;
    let result = events
        .iter()
        .map(|(_, event)| event)
        .find(|event| event["type"] == "provider_result")
        .expect("a provider_result for the dropped call");
    assert_eq!(result["error"]["kind"], "cancelled", "{result}");
    let (_, finished) = events.last().expect("events");
    assert_eq!(finished["type"], "run_finished", "{finished}");
    assert_eq!(
        finished["outcome"], "cancelled",
        "one vocabulary: {finished}"
    );

    // The slot is free: the next run is claimed and completes.
    let (status, next) = client.submit("after", 1, true).await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["status"], "completed", "{next}");
}

#[tokio::test]
async fn a_reload_serves_new_runs_and_running_runs_keep_their_version() {
    let model = Model::start();
    model.delay(150);
    let dir = scratch("reload", &model);
    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);
    let (_, agents) = client.get("/v1/agents").await;
    let old_hash = agents["agents"][0]["bundle_hash"].clone();

    let (_, accepted) = client.submit("old", 6, false).await;
    let old = accepted["run_id"].as_str().unwrap().to_string();
    client.until(&old, |run| run["status"] == "running").await;

    // A new version of the agent, written while the run goes on.
    let source = std::fs::read_to_string(dir.join("agents/turns.apl")).unwrap();
    std::fs::write(
        dir.join("agents/turns.apl"),
        source.replace("V1 run", "V2 run"),
    )
    .unwrap();
    let started = Instant::now();
    loop {
        let (_, agents) = client.get("/v1/agents").await;
        if agents["agents"][0]["bundle_hash"] != old_hash {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "not reloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, new) = client.submit("new", 2, true).await;
    assert_eq!(status, 200, "{new}");
    assert_ne!(new["bundle_hash"], old_hash);
    let old_run = client.until_final(&old).await;
    assert_eq!(old_run["status"], "completed", "{old_run}");
    assert_eq!(old_run["bundle_hash"], old_hash);
    let old_prompts = model.prompts_of("old");
    assert_eq!(old_prompts.len(), 6);
    assert!(
        old_prompts.iter().all(|p| p.starts_with("V1")),
        "{old_prompts:?}"
    );
    let new_prompts = model.prompts_of("new");
    assert!(
        new_prompts.iter().all(|p| p.starts_with("V2")),
        "{new_prompts:?}"
    );
    assert!(server.log().contains("agent reloaded"));
}

#[tokio::test]
async fn a_restart_resumes_unfinished_runs_from_the_journal() {
    let model = Model::start();
    model.delay(300);
    let dir = scratch("restart", &model);
    let mut server = Server::start(&dir, &[]);
    let client = Client::new(&server);
    let (_, accepted) = client.submit("r", 6, false).await;
    let id = accepted["run_id"].as_str().unwrap().to_string();
    client
        .until(&id, |run| run["totals"]["steps"].as_u64() >= Some(3))
        .await;
    server.kill();
    let before = model.prompts_of("r");

    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);
    let run = client.until_final(&id).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["context"]["turn"], 6);
    // Every turn was asked for; only the call in flight at the kill may have been asked
    // twice (provider calls are at least once); every journaled answer was reused.
    let prompts = model.prompts_of("r");
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for prompt in &prompts {
        *counts.entry(prompt.as_str()).or_default() += 1;
    }
    assert_eq!(counts.len(), 6, "{prompts:?}");
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.len() <= 1, "{repeated:?}");
    if let Some((prompt, _)) = repeated.first() {
        assert_eq!(
            Some(**prompt),
            before.last().map(String::as_str),
            "{prompts:?}"
        );
    }
    let events = client.events(&id, None).await;
    let seqs: Vec<u64> = events.iter().filter_map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(events.last().unwrap().1["type"], "run_finished");
}

#[tokio::test]
async fn sigterm_drains_and_exits_zero() {
    let model = Model::start();
    model.delay(100);
    let dir = scratch("sigterm", &model);
    let server = Server::start(&dir, &["--drain-timeout-ms", "20000"]);
    let client = Client::new(&server);
    let (_, accepted) = client.submit("t", 3, false).await;
    let id = accepted["run_id"].as_str().unwrap().to_string();
    client.until(&id, |run| run["status"] == "running").await;
    assert_eq!(server.terminate(), Some(0));
    // The drain let the run finish.
    let server = Server::start(&dir, &[]);
    let run = Client::new(&server).until_final(&id).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(model.prompts_of("t").len(), 3);
}

#[test]
fn no_tokens_no_server() {
    let model = Model::start();
    let dir = scratch("no-tokens", &model);
    let output = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .current_dir(&dir)
        .args(["serve", "--agents", "agents", "--listen", "127.0.0.1:0"])
        .env_remove("APLC_SERVE_TOKENS")
        .output()
        .expect("run aplc serve");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("APLC_SERVE_TOKENS"), "{stderr}");
}

/// Scale-out on PostgreSQL (issue #14 §5): two `aplc serve` processes share one store and
/// 200 runs against a model with 100 ms latency; one is SIGKILLed mid-way. Every run
/// completes exactly once, none is lost, and the only requests the model sees twice are
/// calls that were in flight at the kill (their answers were not journaled).
#[tokio::test]
async fn failover_between_two_processes_on_postgres() {
    const RUNS: usize = 200;
    const TURNS: u64 = 2;
    let model = Model::start();
    model.delay(100);
    let dir = scratch("failover", &model);
    let url = pg::shared().database("serve_failover");
    let mut a = Server::start_on(&dir, &url, &[]);
    let b = Server::start_on(&dir, &url, &[]);
    let (client_a, client_b) = (Client::new(&a), Client::new(&b));

    let mut ids = Vec::new();
    for i in 0..RUNS {
        let client = if i % 2 == 0 { &client_a } else { &client_b };
        let (status, accepted) = client.submit(&format!("f{i}"), TURNS, false).await;
        assert_eq!(status, 202, "{accepted}");
        ids.push(accepted["run_id"].as_str().unwrap().to_string());
    }
    // Mid-way: a third of the runs done.
    let started = Instant::now();
    loop {
        let (_, metrics) = client_b.get("/metrics").await;
        let metrics = metrics.as_str().unwrap_or("").to_string();
        let completed = metrics
            .lines()
            .find_map(|l| l.strip_prefix("aplc_runs{status=\"completed\"} "))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        if completed >= RUNS / 3 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.kill();
    let killed_at = Instant::now();
    let log_a = a.log();

    for id in &ids {
        let run = client_b.until_final(id).await;
        assert_eq!(run["status"], "completed", "{run}");
        assert_eq!(run["context"]["turn"], TURNS, "{run}");
    }
    let log_b = b.log();
    // Exactly once: each run's journal holds one end. (Not the logs: A can be killed
    // after a run's last commit and before its "run finished" line.)
    let database = url.rsplit('/').next().expect("a database name");
    let ends = pg::shared()
        .psql(
            database,
            // A row holds several events, a line each (spec/durability.md, "Stores").
            "SELECT run_id || ' ' || count(*)
             FROM events, regexp_split_to_table(json, E'\\n') AS event
             WHERE event LIKE '%\"type\":\"run_finished\"%' GROUP BY run_id",
        )
        .expect("read the journal");
    let ends: HashMap<&str, &str> = ends.lines().filter_map(|l| l.split_once(' ')).collect();
    for id in &ids {
        assert_eq!(ends.get(id.as_str()), Some(&"1"), "run {id}: {ends:?}");
    }
    assert_eq!(ends.len(), RUNS);
    let finished_in = |log: &str| log.lines().filter(|l| l.contains("run finished")).count();
    assert!(finished_in(&log_a) > 0, "A did some of the work");
    // Only the runs A had in hand (16 running, 16 finishing) may miss their line.
    assert!(finished_in(&log_a) + finished_in(&log_b) >= RUNS - 32);

    // No journaled request was sent twice. Each journaled answer names the request it
    // answered (`answer_tag`); the journal holds one answer per call, and it answers the
    // last request of that call: a request whose answer was journaled is never asked again.
    // A call asked twice was in flight in A at the kill (A died before journaling its
    // answer, B asked again): its first request came before the kill.
    let requests = model.requests();
    let journal = pg::shared()
        .psql(database, "SELECT encode(bytes, 'escape') FROM inputs")
        .expect("read the journal");
    let journaled: Vec<usize> = journal
        .split("fake<")
        .skip(1)
        .filter_map(|rest| rest.split_once('>'))
        .filter_map(|(number, _)| number.parse().ok())
        .collect();
    assert_eq!(
        journaled.len(),
        RUNS * TURNS as usize,
        "one answer per call"
    );
    let mut by_prompt: HashMap<&str, Vec<&Request>> = HashMap::new();
    for request in &requests {
        by_prompt.entry(&request.prompt).or_default().push(request);
    }
    assert_eq!(by_prompt.len(), RUNS * TURNS as usize);
    let mut answered: HashMap<&str, usize> = HashMap::new();
    for number in &journaled {
        let request = requests
            .get(*number)
            .expect("a journaled answer names a request");
        *answered.entry(&request.prompt).or_default() += 1;
        let last = by_prompt[request.prompt.as_str()].last().expect("asked");
        assert_eq!(
            last.number, *number,
            "{}: its journaled answer (request {number}) was asked again",
            request.prompt
        );
    }
    assert!(answered.values().all(|n| *n == 1), "{answered:?}");
    let mut repeated = 0;
    for (prompt, asked) in &by_prompt {
        assert!(asked.len() <= 2, "{prompt}: asked {} times", asked.len());
        if let [first, _] = asked.as_slice() {
            repeated += 1;
            assert!(
                first.at < killed_at,
                "{prompt}: asked twice, the first time after the kill"
            );
        }
    }
    eprintln!(
        "failover: {RUNS} runs, {} requests, {repeated} asked twice (in flight at the kill), A finished {}",
        requests.len(),
        finished_in(&log_a)
    );
}

/// Issue #22 R2: a tool of `aplc serve` inherits no secret variable (`APLC_SERVE_TOKENS`
/// here), and a token it prints anyway (read from a file) is redacted from the API answer,
/// the events and the log.
#[tokio::test]
async fn a_tool_never_sees_or_shows_the_serve_tokens() {
    const FILE_TOKEN: &str = "file-token-5e6f7a8b";
    // Calls the tool until the request carries its result, then answers.
    let model = Model::answering(|body| {
        if body.contains("\"role\":\"tool\"") {
            return json!({"role": "assistant", "content": "done"});
        }
        let call = json!({"id": "c1", "type": "function", "function": {"name": "envdump", "arguments": "{}"}});
        json!({"role": "assistant", "content": null, "tool_calls": [call]})
    });
    let dir = scratch("tool-secrets", &model);
    let agent = "# pre: go\n{{ set_context('allowed_tools', ['envdump']) }}\n\n# prompt: go\n## user\nDump.\n";
    std::fs::write(dir.join("agents/envdump.apl"), agent).unwrap();
    let tool = json!({"envdump": {"command": ["sh", "-c", "env; cat leak.txt"], "cwd": ".",
                                  "descriptor": {"name": "envdump"}}});
    std::fs::write(dir.join("tools.json"), tool.to_string()).unwrap();
    std::fs::write(dir.join("tokens.txt"), format!("{FILE_TOKEN}\n")).unwrap();
    std::fs::write(dir.join("leak.txt"), format!("{TOKEN} {FILE_TOKEN}")).unwrap();
    let server = Server::start(&dir, &["--tools", "tools.json", "--tokens", "tokens.txt"]);
    let client = Client::new(&server);

    let (status, run) = client
        .post("/v1/agents/envdump/runs?wait=true", &json!({"context": {}}))
        .await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["status"], "completed", "{run}");
    let content = run["context"]["result_tool_calls"][0]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("the tool's output: {run}"))
        .to_string();
    assert!(content.contains("PATH="), "{content}");
    assert!(!content.contains("APLC_SERVE_TOKENS="), "{content}");
    assert_eq!(content.matches("<redacted>").count(), 2, "{content}");
    let id = run["run_id"].as_str().expect("run id");
    let events = format!("{:?}", client.events(id, None).await);
    for (what, text) in [
        ("answer", run.to_string()),
        ("events", events),
        ("log", server.log()),
    ] {
        for token in [TOKEN, FILE_TOKEN] {
            assert!(!text.contains(token), "{token} is in the {what}: {text}");
        }
    }
}

/// A run queued with tools the restarted server no longer has cannot replay: it ends as
/// failed (error kind `Resume`) instead of being claimed forever.
#[tokio::test]
async fn a_run_whose_tools_are_gone_ends_failed_at_restart() {
    let model = Model::start();
    model.delay(300);
    let dir = scratch("tools-gone", &model);
    std::fs::copy(
        root().join("fixtures/tools/tools.json"),
        dir.join("tools.json"),
    )
    .unwrap();
    let mut server = Server::start(&dir, &["--tools", "tools.json"]);
    let client = Client::new(&server);
    let (_, accepted) = client.submit("g", 6, false).await;
    let id = accepted["run_id"].as_str().unwrap().to_string();
    client
        .until(&id, |run| run["totals"]["steps"].as_u64() >= Some(1))
        .await;
    server.kill();

    let server = Server::start(&dir, &[]);
    let run = Client::new(&server).until_final(&id).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["kind"], "Resume", "{run}");
    let message = run["error"]["message"].as_str().unwrap();
    assert!(message.contains("tools differ"), "{message}");
    assert!(server.log().contains("cannot resume the run"));
}

/// Adds to `dir/runs.db` a queued run copied from run `from`, with `set` applied to its
/// row (SQL assignments): a row damaged the way a disk or a hand might damage it.
fn queue_damaged_copy(dir: &Path, from: &str, id: &str, set: &str) {
    let conn = rusqlite::Connection::open(dir.join("runs.db")).unwrap();
    conn.execute(
        "INSERT INTO runs SELECT ?2, agent, bundle_hash, 'running', 0, started_at_ms,
                updated_at_ms, options, NULL, 0, 0, NULL FROM runs WHERE id = ?1",
        [from, id],
    )
    .unwrap();
    conn.execute(&format!("UPDATE runs SET {set} WHERE id = ?1"), [id])
        .unwrap();
    conn.execute(
        "INSERT INTO run_queue (run_id, agent, enqueued_at_ms) VALUES (?1, 'turns', 0)",
        [id],
    )
    .unwrap();
}

/// R4: a run whose row does not read (its options are not JSON, its bundle is not a
/// bundle) ends `failed` at its first claim, once, and the runs queued behind it run.
#[tokio::test]
async fn a_corrupt_run_row_ends_failed_once() {
    let model = Model::start();
    let dir = scratch("corrupt-row", &model);
    let server = Server::start(&dir, &[]);
    let (_, done) = Client::new(&server).submit("c", 1, true).await;
    let from = done["run_id"].as_str().unwrap().to_string();
    server.terminate();
    let bad_options = "000000000001-0bad0001";
    let bad_bundle = "000000000001-0bad0002";
    queue_damaged_copy(&dir, &from, bad_options, "options = 'not JSON {'");
    {
        let conn = rusqlite::Connection::open(dir.join("runs.db")).unwrap();
        conn.execute(
            "INSERT INTO bundles (hash, bytes) VALUES ('feed', x'00010203')",
            [],
        )
        .unwrap();
    }
    queue_damaged_copy(&dir, &from, bad_bundle, "bundle_hash = 'feed'");

    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);
    for (id, says) in [(bad_options, "not JSON"), (bad_bundle, "bundle")] {
        let run = client.until_final(id).await;
        assert_eq!(run["status"], "failed", "{run}");
        let message = run["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{run}");
    }
    // The queue goes on behind them.
    let (_, after) = client.submit("d", 1, true).await;
    assert_eq!(after["status"], "completed", "{after}");
    // Long enough for a few takeover scans: a failed run is never claimed again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = server.log();
    for id in [bad_options, bad_bundle] {
        let claims = log
            .lines()
            .filter(|l| l.contains("run started") && l.contains(id))
            .count();
        assert_eq!(claims, 1, "run {id} was claimed {claims} times:\n{log}");
    }
}

/// A tmpfs of `size` at `dir`, unmounted when dropped. Mounting needs root (as CI and
/// the developers' machines run); elsewhere the test fails loudly rather than skip.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("`mount` runs");
        assert!(
            output.status.success(),
            "this test mounts a small tmpfs to fill a disk, which needs root: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        SmallDisk(dir.to_path_buf())
    }

    /// Writes a file until the disk is full; its path.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        while file
            .write_all(&chunk)
            .and_then(|()| file.sync_all())
            .is_ok()
        {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// R3: runs stopped by a full disk (a run whose append failed, and a claim whose commit
/// failed) go on by themselves once the disk has room again: no restart.
#[tokio::test]
async fn runs_stopped_by_a_full_disk_go_on_once_it_has_room() {
    let model = Model::start();
    model.delay(300);
    let dir = scratch("full-disk", &model);
    let disk = SmallDisk::mount(&dir.join("disk"), "2m");
    let server = Server::start_on(&dir, "sqlite:disk/runs.db", &["--max-concurrent-runs", "1"]);
    let client = Client::new(&server);
    let (_, first) = client.submit("f1", 6, false).await;
    let (_, second) = client.submit("f2", 2, false).await;
    let first = first["run_id"].as_str().unwrap().to_string();
    let second = second["run_id"].as_str().unwrap().to_string();
    client
        .until(&first, |run| run["totals"]["steps"].as_u64() >= Some(1))
        .await;
    let filler = disk.fill();
    // The first run's next commit fails, and so does the second's claim.
    let started = Instant::now();
    while !(server.log().contains("run stopped") && server.log().contains("cannot claim")) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the full disk stopped nothing:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::remove_file(filler).unwrap();
    for id in [&first, &second] {
        let run = client.until_final(id).await;
        assert_eq!(run["status"], "completed", "{run}\n{}", server.log());
    }
    drop(server);
}

#[tokio::test]
async fn runs_join_their_requests_trace_and_stream_deltas_live() {
    const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
    const PARENT: &str = "b7ad6b7169203331";
    let receiver = otlp::Receiver::start(200);
    let endpoint = receiver.endpoint();
    let model = Model::start();
    let dir = scratch("otel", &model);
    // Every route streams. The fake model answers with a whole JSON body, which a
    // streaming provider reads as one delta per call.
    let providers = json!({"routes": [{"model": "*", "kind": "openai", "base_url": model.url, "stream": true}]});
    std::fs::write(dir.join("providers.json"), providers.to_string()).expect("providers");
    let server = Server::start_with(
        &dir,
        "sqlite:runs.db",
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    );
    let client = Client::new(&server);
    // Slow calls: the event stream is open before the first delta.
    model.delay(600);
    let response = client
        .http
        .post(format!("{}/v1/agents/turns/runs", client.base))
        .bearer_auth(TOKEN)
        .header("traceparent", format!("00-{TRACE_ID}-{PARENT}-01"))
        .header("content-type", "application/json")
        .body(json!({"context": {"turns": 2, "tag": "traced"}}).to_string())
        .send()
        .await
        .expect("POST");
    let (status, accepted) = status_json(response).await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["run_id"].as_str().unwrap().to_string();
    let live = client.events(&id, None).await;
    // Each call's deltas (its text, maybe in two: the server's tokens are secrets, so
    // the redactor holds a tail back until the call ends) come before the call's result.
    let mut calls: Vec<String> = Vec::new();
    let mut open = false;
    for (sse_id, event) in &live {
        match event["type"].as_str() {
            Some("provider_call") => {
                calls.push(String::new());
                open = true;
            }
            Some("provider_result") => open = false,
            Some("provider_delta") => {
                assert!(open, "a delta outside its call: {live:?}");
                assert_eq!(*sse_id, None, "a delta is not journaled: no id");
                calls
                    .last_mut()
                    .unwrap()
                    .push_str(event["text"].as_str().unwrap());
            }
            _ => {}
        }
    }
    assert_eq!(calls.len(), 2, "{live:?}");
    for (turn, text) in calls.iter().enumerate() {
        assert_eq!(
            text,
            &format!("answer to: V1 run traced turn {} of 2.", turn + 1)
        );
    }
    let seqs: Vec<u64> = live.iter().filter_map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    client.until_final(&id).await;

    // SIGTERM flushes the spans: the run joined the request's trace.
    assert_eq!(server.terminate(), Some(0));
    let spans = receiver.spans();
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let run = spans
        .iter()
        .find(|span| span.name.starts_with("invoke_workflow "))
        .unwrap_or_else(|| {
            panic!(
                "no run span: {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        });
    assert_eq!(hex(&run.trace_id), TRACE_ID);
    assert_eq!(hex(&run.parent_span_id), PARENT);
    assert_eq!(
        otlp::string(run, "aplc.run.id").as_deref(),
        Some(id.as_str())
    );
    let chats = spans.iter().filter(|s| s.name.starts_with("chat ")).count();
    assert_eq!(chats, 2);
    assert!(spans.iter().all(|s| hex(&s.trace_id) == TRACE_ID));
}

// ---------------------------------------------------------------------------------------
// Hardening, round 2 (issue #22): request shapes, the auth scheme, connections that stall,
// agent files that are too large or symlinked.

/// R8: a JSON array (or any non-object) is 400, as spec/serve.md says; a name a run cannot
/// set (a view, a reserved variable) in `context` is 422 and nothing is queued.
/// R9: the `Bearer` scheme is case-insensitive.
#[tokio::test]
async fn non_object_bodies_reserved_names_and_the_scheme_case() {
    let model = Model::start();
    let dir = scratch("shapes", &model);
    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);

    for body in [json!([]), json!([{"context": {}}]), json!(1), json!(null)] {
        let (status, answer) = client.submit_to("turns", &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_body", "{body}");
    }
    for name in ["context_history", "context", "memory"] {
        let body = json!({"context": {"turns": 1, "tag": "x", name: 1}});
        let (status, answer) = client.submit_to("turns", &body).await;
        assert_eq!(status, 422, "{name}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_context");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("`{name}`")), "{message}");
    }
    let (_, counts) = client.get("/v1/agents").await;
    assert_eq!(counts["agents"][0]["name"], "turns");
    assert!(model.prompts().is_empty());

    for scheme in ["bearer", "BEARER", "Bearer", "bEaReR"] {
        let response = http()
            .get(format!("{}/v1/agents", server.url))
            .header("authorization", format!("{scheme}  {TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{scheme}");
    }
    let response = http()
        .get(format!("{}/v1/agents", server.url))
        .header("authorization", format!("bearer {TOKEN}x"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
}

/// R1: connections that send half a request head and stall fill the server's open files
/// (the child's limit is lowered to 128, soft and hard, so it cannot be raised); over the
/// connection cap the oldest stalled one is closed for each new one, so `/healthz` and an
/// authenticated request still answer. The header timeout is long here, so that only the
/// cap can explain the answers.
#[tokio::test]
async fn stalled_connections_over_the_cap_never_lock_out_clients() {
    use std::os::unix::process::CommandExt as _;
    let model = Model::start();
    let dir = scratch("slowloris-cap", &model);
    let mut command = Server::command(&dir, "sqlite:runs.db", &["--header-timeout-ms", "600000"]);
    // SAFETY: only async-signal-safe `setrlimit` runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 128,
                rlim_max: 128,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let server = Server::launch(command);
    let address = server.url.trim_start_matches("http://").to_string();
    let mut stalled = Vec::new();
    for _ in 0..200 {
        let mut stream = std::net::TcpStream::connect(&address).expect("connect");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: stalled\r\n")
            .expect("half a head");
        stalled.push(stream);
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let health = http
        .get(format!("{}/healthz", server.url))
        .send()
        .await
        .expect("/healthz answers while stalled connections fill the server");
    assert_eq!(health.status().as_u16(), 200);
    let agents = http
        .get(format!("{}/v1/agents", server.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("an authenticated request answers too");
    assert_eq!(agents.status().as_u16(), 200);
    assert!(
        server.log().contains("connection cap is reached"),
        "{}",
        server.log()
    );
    drop(stalled);
}

/// R1: a connection that stalls in its head is closed after the header timeout, a
/// kept-alive one after the idle timeout, and a body that trickles gets 408.
#[tokio::test]
async fn stalled_heads_idle_connections_and_slow_bodies_time_out() {
    use std::io::Read as _;
    let model = Model::start();
    let dir = scratch("slowloris-timeouts", &model);
    let server = Server::start(
        &dir,
        &[
            "--header-timeout-ms",
            "1000",
            "--idle-timeout-ms",
            "1500",
            "--body-timeout-ms",
            "1000",
        ],
    );
    let address = server.url.trim_start_matches("http://").to_string();
    let connect = |first: &[u8]| {
        let mut stream = std::net::TcpStream::connect(&address).expect("connect");
        // Bounds every read below: a server that never closes fails the test.
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        stream.write_all(first).expect("write");
        stream
    };
    // Everything the server sends until it closes the connection.
    let until_closed = |stream: &mut std::net::TcpStream| -> String {
        let mut answer = Vec::new();
        match stream.read_to_end(&mut answer) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
        String::from_utf8_lossy(&answer).into_owned()
    };

    let mut head = connect(b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
    assert_eq!(until_closed(&mut head), "", "no answer to half a head");

    let mut idle = connect(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let answer = until_closed(&mut idle);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let request = format!(
        "POST /v1/agents/turns/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"context\""
    );
    let mut body = connect(request.as_bytes());
    let answer = until_closed(&mut body);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert!(model.prompts().is_empty());
}

/// R6: an agent file over the CLI's input limit (a sparse file, so the test writes
/// nothing) is skipped from its size with one short log line, the other agents are
/// served, and SIGTERM stops the server.
#[tokio::test]
async fn an_oversized_agent_file_is_skipped_and_sigterm_still_works() {
    let model = Model::start();
    let dir = scratch("oversized", &model);
    let big = std::fs::File::create(dir.join("agents/big.apl")).expect("big.apl");
    big.set_len(100 * 1024 * 1024)
        .expect("a sparse 100 MiB file");
    drop(big);
    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);
    let (status, agents) = client.get("/v1/agents").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert_eq!(names, ["turns"]);
    let (status, run) = client.submit("ok", 1, true).await;
    assert_eq!(status, 200, "{run}");
    let log = server.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("big.apl")).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("at most"), "{}", lines[0]);
    assert!(log.len() < 64 * 1024, "the log has {} bytes", log.len());
    assert_eq!(server.terminate(), Some(0));
}

/// R7: symlinked agents as a Kubernetes ConfigMap mounts them (`cm.apl -> ..data/cm.apl`,
/// `..data -> ..2026_01`), a file symlink out of the directory, and a symlink loop that is
/// skipped without hanging; re-pointing `..data` (the ConfigMap update) reloads the agent
/// even when the new file has the old one's size and modification time.
#[tokio::test]
async fn symlinked_agents_are_served_and_a_configmap_swap_reloads_them() {
    use std::os::unix::fs::symlink;
    let model = Model::start();
    let dir = scratch("symlinks", &model);
    let agents = dir.join("agents");
    let source = std::fs::read_to_string(agents.join("turns.apl")).unwrap();
    std::fs::create_dir(agents.join("..2026_01")).unwrap();
    std::fs::write(agents.join("..2026_01/cm.apl"), &source).unwrap();
    symlink("..2026_01", agents.join("..data")).unwrap();
    symlink("..data/cm.apl", agents.join("cm.apl")).unwrap();
    std::fs::write(dir.join("outside.apl"), &source).unwrap();
    symlink("../outside.apl", agents.join("linked.apl")).unwrap();
    symlink("loop-b.apl", agents.join("loop-a.apl")).unwrap();
    symlink("loop-a.apl", agents.join("loop-b.apl")).unwrap();

    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);
    let hashes = || async {
        let (_, agents) = client.get("/v1/agents").await;
        agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let name = a["name"].as_str().unwrap().to_string();
                (name, a["bundle_hash"].as_str().unwrap().to_string())
            })
            .collect::<Vec<_>>()
    };
    let before = hashes().await;
    let names: Vec<&str> = before.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["cm", "linked", "turns"]);

    // The update: a new directory, then `..data` re-pointed by an atomic rename.
    std::fs::create_dir(agents.join("..2026_02")).unwrap();
    let new = agents.join("..2026_02/cm.apl");
    std::fs::write(&new, source.replace("V1 run", "V2 run")).unwrap();
    let old_modified = std::fs::metadata(agents.join("..2026_01/cm.apl"))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::File::options()
        .write(true)
        .open(&new)
        .unwrap()
        .set_modified(old_modified)
        .unwrap();
    symlink("..2026_02", agents.join("..data_tmp")).unwrap();
    std::fs::rename(agents.join("..data_tmp"), agents.join("..data")).unwrap();
    let started = Instant::now();
    loop {
        let now = hashes().await;
        if now[0] != before[0] {
            assert_eq!(now[1..], before[1..]);
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "not reloaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, run) = client
        .submit_to("cm", &json!({"context": {"turns": 1, "tag": "cm"}}))
        .await;
    assert_eq!(status, 202, "{run}");
    let id = run["run_id"].as_str().unwrap();
    let run = client.until_final(id).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert!(model.prompts_of("cm").iter().all(|p| p.starts_with("V2")));
    // The loop is reported once per file, not at every scan.
    let log = server.log();
    let reports = log.lines().filter(|l| l.contains("loop-a.apl")).count();
    assert_eq!(reports, 1, "{log}");
}

/// Issue #24: a run queued here is claimed on its submit's wake-up and its `?wait=true`
/// answered on its own end, never left for a poll of the store: with the polls an hour
/// away, clients that each wait for their run and submit the next at once all get their
/// runs back finished. Before, a claim that found nothing just before a submit could put
/// the dispatcher to sleep after that submit's wake-up was spent on another claim; the
/// run then waited for the next submit, and the last runs for the poll.
#[tokio::test]
async fn waiting_clients_get_their_runs_without_polls_of_the_store() {
    let model = Model::start();
    let dir = scratch("waiting_clients", &model);
    let server = Server::start(
        &dir,
        &[
            "--max-concurrent-runs",
            "32",
            "--store-poll-ms",
            "3600000",
            "--wait-timeout-ms",
            "60000",
        ],
    );
    let clients: Vec<_> = (0..24)
        .map(|c| {
            let client = Client::new(&server);
            tokio::spawn(async move {
                for r in 0..20 {
                    let (status, run) = client.submit(&format!("c{c}r{r}"), 1, true).await;
                    assert_eq!(status, 200, "client {c}, run {r}: {run}");
                    assert_eq!(run["status"], "completed", "{run}");
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("a client");
    }
    assert_eq!(model.requests().len(), 24 * 20);
}

/// `--playground DIR` serves the built page's files at `/playground/` without a token,
/// only plain names directly in DIR, read at each request; without the flag there is no
/// such route (spec/js.md, "The playground").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_playground_is_served_from_its_directory() {
    let model = Model::start();
    let dir = scratch("playground", &model);
    let page = dir.join("page");
    std::fs::create_dir_all(&page).unwrap();
    std::fs::write(page.join("index.html"), "<!doctype html><title>p</title>").unwrap();
    std::fs::write(page.join("playground.js"), "console.log(1)").unwrap();
    std::fs::write(page.join(".secret"), "no").unwrap();
    std::fs::write(dir.join("outside.txt"), "no").unwrap();
    let server = Server::start(&dir, &["--playground", "page"]);
    let http = http();
    let get = |path: &str| http.get(format!("{}{path}", server.url)).send();

    let index = get("/playground/").await.unwrap();
    assert_eq!(index.status().as_u16(), 200);
    assert_eq!(index.headers()["content-type"], "text/html; charset=utf-8");
    assert!(index.text().await.unwrap().contains("<title>p</title>"));
    let script = get("/playground/playground.js").await.unwrap();
    assert_eq!(
        script.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    // A rebuilt page is served at once.
    std::fs::write(page.join("playground.js"), "console.log(2)").unwrap();
    let script = get("/playground/playground.js").await.unwrap();
    assert_eq!(script.text().await.unwrap(), "console.log(2)");
    let bare = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{}/playground", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status().as_u16(), 308);
    for path in [
        "/playground/.secret",
        "/playground/..%2foutside.txt",
        "/playground/../outside.txt",
        "/playground/missing.js",
    ] {
        let response = get(path).await.unwrap();
        assert_eq!(response.status().as_u16(), 404, "{path}");
    }

    let without = Server::start(&dir, &[]);
    let response = http
        .get(format!("{}/playground/", without.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
}
