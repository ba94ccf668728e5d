//! Agents that call agents under `aplc serve` (`spec/agents.md`): a three-level tree
//! (`fixtures/agents/tree/`: root → mid → leaf) served from one directory, the names
//! resolved from it; SIGKILLed while the grandchild's provider call is in flight, then
//! restarted, on SQLite and on PostgreSQL: the run resumes inside the grandchild, and no
//! journaled call is asked again at any depth.

mod serving;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aplc_test_support::pg;
use serde_json::{Value as Json, json};
use serving::{Client, Model, Server, root, scratch};

/// The scratch directory of `name` with the tree's three agents served.
fn tree_dir(name: &str, model: &Model) -> PathBuf {
    let dir = scratch(name, model);
    for agent in ["root", "mid", "leaf"] {
        std::fs::copy(
            root().join(format!("fixtures/agents/tree/{agent}.apl")),
            dir.join(format!("agents/{agent}.apl")),
        )
        .expect("agent");
    }
    dir
}

/// The prompts the uninterrupted tree asks, in order: its calls across every depth.
fn expected_prompts() -> Vec<String> {
    let leaf = |turn: u64| format!("Leaf turn {turn} on refunds (detail)");
    vec![
        "Root asks about refunds".to_string(),
        "Mid asks about refunds".to_string(),
        leaf(0),
        leaf(1),
        leaf(2),
        format!("Mid done: answer to: {}", leaf(2)),
        "Root done: answer to: Mid done: answer to: Leaf turn 2 on refunds (detail) \
         (completed)"
            .to_string(),
    ]
}

async fn submit(client: &Client) -> String {
    let (status, accepted) = client
        .post(
            "/v1/agents/root/runs",
            &json!({"context": {"topic": "refunds"}}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    accepted["run_id"].as_str().unwrap().to_string()
}

fn check_finished(run: &Json) {
    assert_eq!(run["status"], "completed", "{run}");
    let result = &run["context"]["agent_result"];
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(
        result["result_text"],
        "answer to: Mid done: answer to: Leaf turn 2 on refunds (detail)"
    );
    assert_eq!(result["agent_result"]["status"], "completed", "{result}");
    // The whole tree's steps: root 2, mid 2, leaf 3.
    assert_eq!(run["totals"]["steps"], 7, "{run}");
}

async fn crash_in_the_grandchild(dir: &Path, model: &Model, store: &str) {
    model.delay(400);
    let mut server = Server::start_on(dir, store, &[]);
    let client = Client::new(&server);
    let id = submit(&client).await;
    // The leaf's second call is in flight: kill the server while it waits.
    let second_leaf_call = "Leaf turn 1 on refunds (detail)";
    client
        .until(&id, |_| {
            model.prompts().iter().any(|p| p == second_leaf_call)
        })
        .await;
    server.kill();
    let before = model.prompts();

    model.delay(0);
    let server = Server::start_on(dir, store, &[]);
    let client = Client::new(&server);
    let run = client.until_final(&id).await;
    check_finished(&run);
    // Every call was asked; only the one in flight at the kill was asked twice.
    let prompts = model.prompts();
    serving::check_asked_again(
        &prompts,
        &before,
        &expected_prompts(),
        "Root asks about refunds",
    );
    // The resumed events go on in one sequence, inside the grandchild too.
    let events = client.events(&id, None).await;
    let seqs: Vec<u64> = events.iter().filter_map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    let leaf_calls = events
        .iter()
        .filter(|(_, e)| e["type"] == "provider_call" && e["path"] == "mid/leaf")
        .count();
    assert_eq!(leaf_calls, 3);
    let started: Vec<&str> = events
        .iter()
        .filter(|(_, e)| e["type"] == "agent_started")
        .filter_map(|(_, e)| e["agent"].as_str())
        .collect();
    assert_eq!(started, ["mid", "leaf"]);
}

#[tokio::test]
async fn sqlite_a_kill_inside_a_grandchild_resumes_there() {
    let model = Model::start();
    let dir = tree_dir("agents-sqlite", &model);
    crash_in_the_grandchild(&dir, &model, "sqlite:runs.db").await;
}

#[tokio::test]
async fn postgres_a_kill_inside_a_grandchild_resumes_there() {
    let model = Model::start();
    let dir = tree_dir("agents-postgres", &model);
    let url = pg::shared().database("serve_agents");
    crash_in_the_grandchild(&dir, &model, &url).await;
}

/// A name computed at run time that the served directory does not have fails the call,
/// not the run; an agent added to the directory later is found by the runs submitted
/// after it.
#[tokio::test]
async fn a_computed_name_resolves_to_the_directorys_agents() {
    let model = Model::start();
    let dir = scratch("agents-computed", &model);
    std::fs::write(
        dir.join("agents/pick.apl"),
        "{# inputs: pick, topic #}\n# prompt: ask\n## user\nPick {{ pick }}\n\n# post: ask\n\
         {{ set_context('call_agent', {'agent': pick, 'context': {'topic': topic}}) }}\n",
    )
    .unwrap();
    let server = Server::start(&dir, &[]);
    let client = Client::new(&server);
    let submit = || async {
        let (status, run) = client
            .post(
                "/v1/agents/pick/runs?wait=true",
                &json!({"context": {"pick": "leaf", "topic": "x"}}),
            )
            .await;
        assert_eq!(status, 200, "{run}");
        run
    };
    let run = submit().await;
    assert_eq!(run["status"], "completed", "{run}");
    let result = &run["context"]["agent_result"];
    assert_eq!(result["status"], "failed", "{result}");
    assert!(
        result["error"]
            .as_str()
            .unwrap_or("")
            .contains("unknown agent `leaf`"),
        "{result}"
    );
    std::fs::copy(
        root().join("fixtures/agents/tree/leaf.apl"),
        dir.join("agents/leaf.apl"),
    )
    .unwrap();
    let started = Instant::now();
    loop {
        let (_, agents) = client.get("/v1/agents").await;
        if agents["agents"].to_string().contains("\"leaf\"") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "not reloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = submit().await;
    assert_eq!(
        run["context"]["agent_result"]["status"], "completed",
        "{run}"
    );
}
