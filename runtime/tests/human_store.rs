//! The run stores' part of people in the loop (`spec/human.md`, spec/durability.md
//! "Stores"), on SQLite and on a real PostgreSQL (a throwaway cluster: the tests fail,
//! never skip, without one): a run's pending requests, the inbox of answers where the
//! first per request wins, and the queue that hands no waiting run to a worker until its
//! answers are in, its first open timeout passes or it is cancelled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aplc_runtime::store::{
    self, Answered, Batch, NewRun, QueueStatus, QueuedRun, RunStore, StoreError, StoreUrl,
};
use aplc_test_support::pg;
use serde_json::{Value as Json, json};

/// A store under test: its URL, and what keeps its file alive.
struct Backend {
    url: String,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    /// SQLite in a fresh file, PostgreSQL in a fresh database.
    fn both(name: &str) -> [Backend; 2] {
        let dir = tempfile::tempdir().expect("temp dir");
        let sqlite = Backend {
            url: format!("sqlite:{}", dir.path().join("runs.db").display()),
            _dir: Some(dir),
        };
        let postgres = Backend {
            url: pg::shared().database(name),
            _dir: None,
        };
        [sqlite, postgres]
    }

    fn is_sqlite(&self) -> bool {
        self.url.starts_with("sqlite:")
    }

    async fn open(&self) -> Arc<dyn RunStore> {
        let url = StoreUrl::parse(&self.url).expect("store URL");
        store::open(&url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"))
    }

    /// Runs `sql` on the store's database directly, beside the store.
    fn exec(&self, sql: &str) {
        if let Some(path) = self.url.strip_prefix("sqlite:") {
            let conn = rusqlite::Connection::open(path).expect("sqlite");
            conn.execute_batch(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        } else {
            let db = self.url.rsplit('/').next().expect("database");
            pg::shared().psql(db, sql).expect("psql");
        }
    }
}

/// A request as the runtime stores it (`spec/human.md` §2), timing out at `expires`.
fn request(id: &str, expires: Option<i64>) -> Json {
    let mut request = json!({"id": id, "kind": "approval", "prompt": "Approve?", "step": "act",
                             "tool": "refund", "arguments": {"amount": 20}});
    if let Some(at) = expires {
        request["expires_at_ms"] = json!(at);
    }
    request
}

/// An answer as the runtime stores it: the reply, who gave it and when.
fn answer(by: &str) -> Json {
    json!({"approve": true, "reason": "fine", "by": by, "answered_at_ms": 1_700_000_000_000_i64})
}

fn new_run(id: &str) -> NewRun {
    NewRun {
        id: id.into(),
        agent: "pay.apl".into(),
        bundle_hash: "h".into(),
        bundle: vec![1, 2, 3],
        options: json!({}),
        started_at_ms: 1,
    }
}

/// A batch that replaces the run's pending requests (and journals one input, as a real
/// pause does: the tool call that asked).
fn pausing(first_input: u64, pending: Vec<Json>) -> Batch {
    Batch {
        first_input,
        inputs: vec![vec![first_input as u8]],
        events: vec![format!("{{\"e\":{first_input}}}")],
        steps: 1,
        pending: Some(pending),
        ..Batch::default()
    }
}

/// A run queued for a service, claimed by a worker, paused with `requests`, and let go.
async fn queued_and_paused(store: &Arc<dyn RunStore>, id: &str, requests: Vec<Json>) {
    store
        .enqueue(QueuedRun {
            run: new_run(id),
            agent: "pay".into(),
            idempotency_key: None,
            traceparent: None,
        })
        .await
        .expect("enqueue");
    let claim = store.claim().await.expect("claim").expect("the new run");
    assert_eq!(claim.lease.run_id(), id);
    store
        .append(claim.lease.as_ref(), pausing(0, requests))
        .await
        .expect("pause");
}

/// Nothing is claimable: two claims find nothing (each runs both scans, new runs and
/// taken ones, after the store's own dropped leases are released).
async fn assert_none_claimed(store: &Arc<dyn RunStore>, why: &str) {
    for _ in 0..2 {
        if let Some(claim) = store.claim().await.expect("claim") {
            panic!("{why}: `{}` was claimed", claim.lease.run_id());
        }
    }
}

/// Claims until a run comes, within a generous deadline (a dropped lease is released in
/// the background), and returns it with its lease.
async fn next_claim(store: &Arc<dyn RunStore>) -> store::Claim {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(claim) = store.claim().await.expect("claim") {
            return claim;
        }
        assert!(Instant::now() < deadline, "no run became claimable");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Claims the next run and ends it as its worker would (its requests cleared, its
/// outcome stored); its id.
async fn claim_and_end(store: &Arc<dyn RunStore>) -> String {
    let claim = next_claim(store).await;
    let id = claim.lease.run_id().to_owned();
    let loaded = store.load(&id).await.expect("load");
    let done = Batch {
        first_input: loaded.summary.inputs,
        outcome: Some(json!({"status": "completed", "error": null})),
        pending: Some(Vec::new()),
        ..Batch::default()
    };
    store
        .append(claim.lease.as_ref(), done)
        .await
        .expect("finish");
    id
}

#[tokio::test]
async fn pending_requests_round_trip_through_append_summary_load_and_list() {
    for backend in Backend::both("pending") {
        let store = backend.open().await;
        let lease = store.create(new_run("p")).await.expect("create");
        let requests = vec![request("1-1", Some(99)), request("1-2", None)];
        store
            .append(lease.as_ref(), pausing(0, requests.clone()))
            .await
            .expect("pause");
        let summary = store.summary("p").await.expect("summary");
        assert_eq!(summary.pending, requests, "{}", backend.url);
        assert_eq!(QueueStatus::of_summary(&summary), QueueStatus::Waiting);
        assert_eq!(
            store.load("p").await.expect("load").summary.pending,
            requests
        );
        let listed = store.list().await.expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].pending, requests);

        // `None` leaves them; `Some(empty)` clears them: the run goes on.
        let plain = Batch {
            made: Default::default(),
            pending: None,
            ..pausing(1, Vec::new())
        };
        store.append(lease.as_ref(), plain).await.expect("append");
        assert_eq!(store.summary("p").await.expect("summary").pending, requests);
        store
            .append(lease.as_ref(), pausing(2, Vec::new()))
            .await
            .expect("clear");
        let summary = store.summary("p").await.expect("summary");
        assert!(summary.pending.is_empty());
        assert_eq!(QueueStatus::of_summary(&summary), QueueStatus::Running);
        drop(lease);

        // A queued run that waits: its entry and the counts say `waiting`.
        queued_and_paused(&store, "q", vec![request("1-1", None)]).await;
        let entry = store.queue_entry("q").await.expect("entry");
        assert_eq!(entry.status, QueueStatus::Waiting);
        assert_eq!(entry.summary.pending, vec![request("1-1", None)]);
        let counts = store.queue_counts().await.expect("counts");
        assert_eq!(counts.get(QueueStatus::Waiting), 1);
        assert_eq!(counts.get(QueueStatus::Running), 0);
    }
}

#[tokio::test]
async fn an_answer_is_accepted_once_and_every_other_outcome_changes_nothing() {
    for backend in Backend::both("outcomes") {
        let store = backend.open().await;
        let lease = store.create(new_run("a")).await.expect("create");
        let requests = vec![request("1-1", None), request("1-2", None)];
        store
            .append(lease.as_ref(), pausing(0, requests))
            .await
            .expect("pause");
        let answered = |run: &'static str, id: &'static str| {
            let store = store.clone();
            async move { store.answer(run, id, answer("cli")).await.expect("answer") }
        };
        assert_eq!(answered("nope", "1-1").await, Answered::UnknownRun);
        assert_eq!(answered("a", "9-9").await, Answered::UnknownRequest);
        let big = json!({ "value": "x".repeat(store::MAX_ANSWER_BYTES) });
        match store.answer("a", "1-1", big).await {
            Err(e @ StoreError::TooLarge(_)) => {
                assert!(e.to_string().contains("at most 1048576"), "{e}")
            }
            other => panic!("a 1 MiB answer was not refused: {other:?}"),
        }
        assert_eq!(
            answered("a", "1-2").await,
            Answered::Accepted {
                unanswered: vec!["1-1".into()]
            }
        );
        assert_eq!(answered("a", "1-2").await, Answered::AlreadyAnswered);
        assert_eq!(
            answered("a", "1-1").await,
            Answered::Accepted {
                unanswered: Vec::new()
            }
        );
        assert_eq!(store.answers("a").await.expect("answers").len(), 2);

        // The run took its answers and waits on a new request: the old ones are still
        // answered (409 forever), and no longer pending.
        store
            .append(lease.as_ref(), pausing(1, vec![request("2-1", None)]))
            .await
            .expect("pause again");
        assert_eq!(answered("a", "1-1").await, Answered::AlreadyAnswered);
        assert_eq!(store.answers("a").await.expect("answers"), Vec::new());

        let done = Batch {
            first_input: 2,
            outcome: Some(json!({"status": "completed", "error": null})),
            pending: Some(Vec::new()),
            ..Batch::default()
        };
        store.append(lease.as_ref(), done).await.expect("finish");
        assert_eq!(answered("a", "2-1").await, Answered::Finished);
        assert_eq!(answered("a", "1-1").await, Answered::Finished);
        assert_eq!(store.answers("a").await.expect("answers"), Vec::new());
    }
}

#[tokio::test]
async fn of_sixteen_concurrent_answers_to_one_request_exactly_one_is_accepted() {
    for backend in Backend::both("concurrent") {
        let store = backend.open().await;
        let lease = store.create(new_run("c")).await.expect("create");
        let requests = vec![request("1-1", None), request("1-2", None)];
        store
            .append(lease.as_ref(), pausing(0, requests))
            .await
            .expect("pause");
        // A store each: its own connections (on SQLite its own writer), as separate
        // processes would answer.
        let mut stores = Vec::new();
        for _ in 0..16 {
            stores.push(backend.open().await);
        }
        let tasks: Vec<_> = stores
            .into_iter()
            .enumerate()
            .map(|(n, store)| {
                tokio::spawn(async move {
                    let answer = answer(&format!("answerer-{n}"));
                    (n, store.answer("c", "1-1", answer).await.expect("answer"))
                })
            })
            .collect();
        let mut accepted = Vec::new();
        for task in tasks {
            let (n, result) = task.await.expect("task");
            match result {
                Answered::Accepted { unanswered } => {
                    assert_eq!(unanswered, ["1-2"]);
                    accepted.push(n);
                }
                Answered::AlreadyAnswered => {}
                other => panic!("{}: answer {n}: {other:?}", backend.url),
            }
        }
        assert_eq!(accepted.len(), 1, "{}: {accepted:?}", backend.url);
        let stored = store.answers("c").await.expect("answers");
        assert_eq!(
            stored,
            vec![(
                "1-1".to_owned(),
                answer(&format!("answerer-{}", accepted[0]))
            )],
            "the stored answer is the accepted one"
        );
    }
}

#[tokio::test]
async fn answers_are_those_of_the_current_requests_in_the_order_stored() {
    for backend in Backend::both("inbox") {
        let store = backend.open().await;
        let lease = store.create(new_run("i")).await.expect("create");
        let requests = vec![
            request("1-1", None),
            request("1-2", None),
            request("1-3", None),
        ];
        store
            .append(lease.as_ref(), pausing(0, requests))
            .await
            .expect("pause");
        assert_eq!(store.answers("i").await.expect("answers"), Vec::new());
        for id in ["1-3", "1-1"] {
            store.answer("i", id, answer(id)).await.expect("answer");
        }
        assert_eq!(
            store.answers("i").await.expect("answers"),
            vec![
                ("1-3".to_owned(), answer("1-3")),
                ("1-1".to_owned(), answer("1-1"))
            ]
        );
        // The run paused again on one of them and a new one: only theirs are current.
        store
            .append(
                lease.as_ref(),
                pausing(1, vec![request("1-1", None), request("2-1", None)]),
            )
            .await
            .expect("pause again");
        store
            .answer("i", "2-1", answer("2-1"))
            .await
            .expect("answer");
        assert_eq!(
            store.answers("i").await.expect("answers"),
            vec![
                ("1-1".to_owned(), answer("1-1")),
                ("2-1".to_owned(), answer("2-1"))
            ]
        );
        assert!(matches!(
            store.answers("nope").await,
            Err(StoreError::NotFound(_))
        ));
    }
}

#[tokio::test]
async fn a_waiting_run_is_claimed_after_its_last_answer_its_timeout_or_a_cancel() {
    for backend in Backend::both("claims") {
        let store = backend.open().await;
        queued_and_paused(
            &store,
            "w",
            vec![request("1-1", None), request("1-2", None)],
        )
        .await;
        assert_none_claimed(&store, "a waiting run holds no worker").await;
        store.answer("w", "1-1", answer("a")).await.expect("answer");
        assert_none_claimed(&store, "one request is still open").await;
        store.answer("w", "1-2", answer("b")).await.expect("answer");
        assert_eq!(claim_and_end(&store).await, "w");

        // A timeout that passed wakes the run (its worker applies it).
        queued_and_paused(&store, "t", vec![request("1-1", Some(1))]).await;
        assert_eq!(claim_and_end(&store).await, "t");

        // A cancel wakes it: a worker ends it cancelled.
        queued_and_paused(&store, "c", vec![request("1-1", None)]).await;
        assert_none_claimed(&store, "no answer yet").await;
        store.request_cancel("c").await.expect("cancel");
        assert_eq!(claim_and_end(&store).await, "c");

        // A new run behind runs that wait is claimed all the same.
        queued_and_paused(&store, "x", vec![request("1-1", None)]).await;
        store
            .enqueue(QueuedRun {
                run: new_run("n"),
                agent: "pay".into(),
                idempotency_key: None,
                traceparent: None,
            })
            .await
            .expect("enqueue");
        assert_eq!(claim_and_end(&store).await, "n");
        assert_none_claimed(&store, "`x` still waits").await;
        assert_eq!(
            store.queue_entry("x").await.expect("entry").status,
            QueueStatus::Waiting
        );
    }
}

/// A request answered before its timeout no longer wakes the run: were it counted, the
/// run would be claimed, find nothing to do, pause again with the same wake-up and be
/// claimed again, over and over, until its other requests were answered.
#[tokio::test]
async fn an_answered_requests_timeout_wakes_no_one() {
    for backend in Backend::both("wake") {
        let store = backend.open().await;
        let requests = vec![request("1-1", Some(1)), request("1-2", None)];
        queued_and_paused(&store, "w", requests.clone()).await;
        store.answer("w", "1-1", answer("a")).await.expect("answer");
        assert_none_claimed(&store, "the answered request's timeout is no wake-up").await;

        // The same once the run was woken for it and paused again on both requests.
        let claim = {
            // Wake it as its timeout would have before the answer came.
            backend.exec("UPDATE run_queue SET waiting = FALSE WHERE run_id = 'w'");
            next_claim(&store).await
        };
        store
            .append(claim.lease.as_ref(), pausing(1, requests))
            .await
            .expect("pause again");
        drop(claim);
        assert_none_claimed(&store, "paused again on an answered request").await;
        store.answer("w", "1-2", answer("b")).await.expect("answer");
        assert_eq!(claim_and_end(&store).await, "w");
    }
}

/// A run that pauses again on requests whose answers are all stored (the last came
/// while its worker was between reading the answers and committing the pause) is not
/// left waiting for answers that already came: it is claimable.
#[tokio::test]
async fn a_run_paused_on_requests_all_answered_stays_claimable() {
    for backend in Backend::both("raced") {
        let store = backend.open().await;
        queued_and_paused(&store, "r", vec![request("1-1", None)]).await;
        store.answer("r", "1-1", answer("a")).await.expect("answer");
        let claim = next_claim(&store).await;
        assert_eq!(claim.lease.run_id(), "r");
        store
            .append(claim.lease.as_ref(), pausing(1, vec![request("1-1", None)]))
            .await
            .expect("pause again");
        drop(claim);
        assert_eq!(claim_and_end(&store).await, "r");
    }
}

/// A store of schema version 3 (before people in the loop; made here by undoing version
/// 4 with SQL) reads its runs as waiting on nothing, read-only on SQLite (not migrated),
/// and is migrated when opened: its runs then pause and take answers.
#[tokio::test]
async fn a_version_3_store_reads_and_migrates() {
    for backend in Backend::both("migrate") {
        let store = backend.open().await;
        let lease = store.create(new_run("old")).await.expect("create");
        store
            .append(
                lease.as_ref(),
                Batch {
                    made: Default::default(),
                    pending: None,
                    ..pausing(0, Vec::new())
                },
            )
            .await
            .expect("append");
        drop(lease);
        drop(store);
        let mut downgrade = String::from(
            "DROP INDEX run_queue_ready; DROP INDEX run_queue_wake; DROP TABLE answers;
             ALTER TABLE runs DROP COLUMN pending;
             ALTER TABLE run_queue DROP COLUMN waiting;
             ALTER TABLE run_queue DROP COLUMN wake_at_ms;
             UPDATE aplc_meta SET value = '3' WHERE key = 'schema_version';",
        );
        if backend.is_sqlite() {
            downgrade.push_str("PRAGMA user_version = 3;");
        }
        backend.exec(&downgrade);

        if backend.is_sqlite() {
            let url = StoreUrl::parse(&backend.url).expect("url");
            let read_only = store::open_read_only(&url).await.expect("read-only");
            let summary = read_only.summary("old").await.expect("summary");
            assert!(summary.pending.is_empty());
            assert_eq!(QueueStatus::of_summary(&summary), QueueStatus::Running);
            assert_eq!(read_only.list().await.expect("list").len(), 1);
            assert_eq!(read_only.answers("old").await.expect("answers"), Vec::new());
            drop(read_only);
            let conn = rusqlite::Connection::open(backend.url.trim_start_matches("sqlite:"))
                .expect("sqlite");
            let version: i64 = conn
                .query_row("PRAGMA user_version", [], |row| row.get(0))
                .expect("version");
            assert_eq!(version, 3, "read-only does not migrate");
        }

        let store = backend.open().await;
        assert!(
            store
                .summary("old")
                .await
                .expect("summary")
                .pending
                .is_empty()
        );
        let lease = store.acquire("old").await.expect("acquire");
        store
            .append(lease.as_ref(), pausing(1, vec![request("1-1", None)]))
            .await
            .expect("pause");
        assert_eq!(
            store
                .answer("old", "1-1", answer("a"))
                .await
                .expect("answer"),
            Answered::Accepted {
                unanswered: Vec::new()
            }
        );
        drop(lease);
        queued_and_paused(&store, "new", vec![request("1-1", None)]).await;
        assert_none_claimed(&store, "a waiting run in a migrated store").await;
    }
}
