//! Agents that call agents from the command line (`spec/agents.md`): `aplc build` links
//! the tree (`fixtures/agents/tree/`: root → mid → leaf) into one bundle, `aplc run` runs
//! it with `--mock` answers taken in call order across the tree, the PPE seed's chain
//! runs from source, budgets and the depth limit hold across levels, and a durable run
//! SIGKILLed inside the grandchild resumes there on SQLite and on PostgreSQL without
//! asking a journaled call again.

mod serving;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use aplc_test_support::pg;
use aplc_test_support::process::{final_context, kill9, succeed, wait_for};
use aplc_test_support::{aplc, scratch_in};
use serde_json::{Value as Json, json};
use serving::{Model, root};

fn scratch(name: &str) -> PathBuf {
    scratch_in!("agents", name)
}

/// `dir/root.aplb`: the tree, linked by `aplc build`, and the context it needs.
fn build_tree(dir: &Path) -> PathBuf {
    let source = root().join("fixtures/agents/tree/root.apl");
    let bundle = dir.join("root.aplb");
    succeed(&mut aplc!(
        dir,
        &[
            "build",
            source.to_str().unwrap(),
            "-o",
            bundle.to_str().unwrap()
        ],
    ));
    std::fs::write(
        dir.join("context.json"),
        json!({"topic": "refunds"}).to_string(),
    )
    .unwrap();
    bundle
}

/// The prompts of the tree's calls, in call order across its three levels.
fn tree_prompts() -> Vec<String> {
    let leaf = |turn: u64| format!("Leaf turn {turn} on refunds (detail)");
    vec![
        "Root asks about refunds".into(),
        "Mid asks about refunds".into(),
        leaf(0),
        leaf(1),
        leaf(2),
        format!("Mid done: answer to: {}", leaf(2)),
        format!(
            "Root done: answer to: Mid done: answer to: {} (completed)",
            leaf(2)
        ),
    ]
}

fn read_events(path: &Path) -> Vec<Json> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn a_linked_tree_runs_with_mock_answers_in_call_order() {
    let dir = scratch("tree-mock");
    let bundle = build_tree(&dir);
    // Each mock answer names its place, so the context shows which call took which.
    let answers: Vec<String> = (1..=7).map(|n| format!("answer {n}")).collect();
    std::fs::write(dir.join("mock.json"), json!(answers).to_string()).unwrap();
    let output = succeed(&mut aplc!(
        &dir,
        &[
            "run",
            bundle.to_str().unwrap(),
            "--context",
            "context.json",
            "--mock",
            "mock.json",
            "--json",
            "--events",
            "events.jsonl",
        ],
    ));
    let context = final_context(&output);
    assert_eq!(context["result_text"], "answer 7");
    let mid = &context["agent_result"];
    assert_eq!(mid["status"], "completed", "{mid}");
    assert_eq!(mid["result_text"], "answer 6");
    assert_eq!(mid["agent_result"]["result_text"], "answer 5");
    let prompts: Vec<String> = context["context_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|snapshot| {
            snapshot["prompts"][0]["content"]
                .as_str()
                .unwrap()
                .trim()
                .to_string()
        })
        .collect();
    assert_eq!(prompts[0], "Root asks about refunds");
    assert_eq!(prompts[1], "Root done: answer 6 (completed)");
    let events = read_events(&dir.join("events.jsonl"));
    let calls: Vec<Option<&str>> = events
        .iter()
        .filter(|e| e["type"] == "provider_call")
        .map(|e| e["path"].as_str())
        .collect();
    assert_eq!(
        calls,
        [
            None,
            Some("mid"),
            Some("mid/leaf"),
            Some("mid/leaf"),
            Some("mid/leaf"),
            Some("mid"),
            None
        ]
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["totals"]["steps"], 7);
    assert_eq!(last["totals"]["provider_calls"], 7);
}

#[test]
fn the_ppe_chain_runs_from_source() {
    let dir = scratch("ppe");
    let agent = root().join("fixtures/agents/ppe/list-expression.apl");
    let mock = root().join("fixtures/agents/ppe/list-expression.mock.json");
    let output = succeed(&mut aplc!(
        &dir,
        &[
            "run",
            agent.to_str().unwrap(),
            "--mock",
            mock.to_str().unwrap(),
            "--json"
        ],
    ));
    let context = final_context(&output);
    assert_eq!(
        context["agent_result"]["result_json"]["result"], 8,
        "{context}"
    );
    assert_eq!(context["agent_result"]["content"], "3 + 5");
    assert_eq!(context["result_text"], "A total of 8 pieces of candy.");
    let last_prompt = context["prompts"][0]["content"].as_str().unwrap();
    assert!(last_prompt.contains("A total of 8 pieces"), "{last_prompt}");
}

#[test]
fn budgets_and_the_depth_limit_hold_across_levels() {
    let dir = scratch("budgets");
    let bundle = build_tree(&dir);
    let answers: Vec<String> = (1..=7).map(|n| format!("answer {n}")).collect();
    std::fs::write(dir.join("mock.json"), json!(answers).to_string()).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            bundle.to_str().unwrap(),
            "--context",
            "context.json",
            "--mock",
            "mock.json",
            "--json",
        ];
        args.extend_from_slice(extra);
        aplc!(&dir, &args).output().unwrap()
    };
    // Depth 1 may run `mid`, not its `leaf`: mid goes on with the failure.
    let output = run(&["--max-agent-depth", "1"]);
    let context = final_context(&output);
    let leaf = &context["agent_result"]["agent_result"];
    assert_eq!(leaf["status"], "failed", "{context}");
    assert!(
        leaf["error"]
            .as_str()
            .unwrap()
            .contains("past the limit of 1"),
        "{leaf}"
    );
    // The tree needs 7 steps: with 5, the leaf spends the last and fails, and so does
    // every level above it when it would enter its next step.
    let output = run(&["--max-steps", "5"]);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Step budget exceeded"), "{stderr}");
}

// ---------------------------------------------------------------------------------------
// Durable: a SIGKILL inside the grandchild.

fn run_durable(dir: &Path, bundle: &Path, model: &Model, store: &str) -> std::process::Command {
    aplc!(
        dir,
        &[
            "run",
            bundle.to_str().unwrap(),
            "--context",
            "context.json",
            "--json",
            "--quiet",
            "--base-url",
            &model.url,
            "--store",
            store,
            "--run-id",
            "tree",
            // Commits as often as the store allows: non-idempotent effects wait for
            // theirs; a provider's answer never does (`spec/durability.md`).
            "--max-uncommitted",
            "0",
        ],
    )
}

fn crash_inside_the_grandchild(name: &str, store: &str) {
    let dir = scratch(name);
    let bundle = build_tree(&dir);
    let model = Model::start();
    model.delay(400);
    let child = run_durable(&dir, &bundle, &model, store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn aplc");
    let in_flight = "Leaf turn 1 on refunds (detail)";
    wait_for("the leaf's second call", Duration::from_secs(60), || {
        model.prompts().iter().any(|p| p == in_flight)
    });
    kill9(child);
    let before = model.prompts();
    model.delay(0);
    let output = succeed(&mut aplc!(
        &dir,
        &[
            "resume",
            "tree",
            "--store",
            store,
            "--json",
            "--quiet",
            "--base-url",
            &model.url
        ],
    ));
    let resumed = final_context(&output);
    assert_eq!(resumed["agent_result"]["status"], "completed", "{resumed}");
    assert_eq!(
        resumed["result_text"],
        format!("answer to: {}", tree_prompts()[6])
    );
    // Every call asked, each once, but the one in flight at the kill.
    // The call in flight was asked again, and maybe answers not yet durable before it:
    // a provider call's answer is not waited for, even with a window of 0.
    let prompts = model.prompts();
    serving::check_asked_again(
        &prompts,
        &before,
        &tree_prompts(),
        "Root asks about refunds",
    );
    assert!(
        prompts.iter().filter(|p| *p == in_flight).count() == 2,
        "{prompts:?}"
    );

    // `aplc runs show` shows the tree.
    let show = succeed(&mut aplc!(
        &dir,
        &["runs", "show", "tree", "--store", store]
    ));
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(show.contains("status:   completed"), "{show}");
    assert!(
        show.contains("agents:\n  - mid (step `root`): completed, 5 steps\n    - leaf (step `mid`): completed, 3 steps\n"),
        "{show}"
    );
}

#[test]
fn sqlite_a_kill_inside_the_grandchild_resumes_there() {
    let store = format!(
        "sqlite:{}",
        scratch("tree-sqlite-db").join("runs.db").display()
    );
    crash_inside_the_grandchild("tree-sqlite", &store);
}

#[test]
fn postgres_a_kill_inside_the_grandchild_resumes_there() {
    let store = pg::shared().database("cli_agents");
    crash_inside_the_grandchild("tree-postgres", &store);
}

/// A name computed at run time resolves to `--agents DIR`'s agents; without the flag the
/// call fails as an unknown agent's and the run goes on. A durable run keeps the agents
/// it started with in its store: the resume needs no `--agents`.
#[test]
fn a_computed_name_resolves_from_agents_dirs() {
    let dir = scratch("computed");
    std::fs::write(
        dir.join("pick.apl"),
        "{# inputs: pick, topic #}\n# prompt: ask\n## user\nPick {{ pick }}\n\n# post: ask\n\
         {{ set_context('call_agent', {'agent': pick, 'context': {'topic': topic}}) }}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("context.json"),
        json!({"pick": "leaf", "topic": "tea"}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("mock.json"),
        json!(["a", "b", "c", "d"]).to_string(),
    )
    .unwrap();
    let tree = root().join("fixtures/agents/tree");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "pick.apl",
            "--context",
            "context.json",
            "--mock",
            "mock.json",
            "--json",
        ];
        args.extend_from_slice(extra);
        aplc!(&dir, &args).output().unwrap()
    };
    // The call fails, and so the run ends with errors: exit 3.
    let output = run(&[]);
    assert_eq!(output.status.code(), Some(3));
    let without = final_context(&output);
    let error = without["agent_result"]["error"].as_str().unwrap();
    assert!(error.contains("unknown agent `leaf`"), "{error}");

    let output = run(&["--agents", tree.to_str().unwrap()]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let with = final_context(&output);
    assert_eq!(with["agent_result"]["status"], "completed", "{with}");
    assert_eq!(with["agent_result"]["result_text"], "d");

    let store = format!("sqlite:{}", dir.join("runs.db").display());
    let output = run(&[
        "--agents",
        tree.to_str().unwrap(),
        "--store",
        &store,
        "--run-id",
        "computed",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let show = succeed(&mut aplc!(
        &dir,
        &["runs", "show", "computed", "--store", &store, "--json"]
    ));
    let shown = final_context(&show);
    assert_eq!(shown["agent_result"]["result_text"], "d", "{shown}");
}
