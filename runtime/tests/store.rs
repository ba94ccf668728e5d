//! The run stores, SQLite and PostgreSQL, through one set of generic checks, plus each
//! backend's bad stores (spec/durability.md, "Stores").
//!
//! PostgreSQL tests share one throwaway cluster per test binary (`support/pg.rs`) and get
//! a database each. A killed lease holder is a child process: this binary re-run with
//! `APLC_STORE_LEASE_HOLDER` set and filtered to `lease_holder_child`.

use aplc_test_support::pg;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aplc_runtime::store::{
    self, Batch, Enqueued, NewRun, QueueStatus, QueuedRun, RunState, RunStore, StoreError,
    StoreUrl, StoredCheckpoint,
};
use serde_json::json;

/// The environment variable that turns `lease_holder_child` into a lease holder:
/// `STORE_URL RUN_ID`.
const HOLDER_ENV: &str = "APLC_STORE_LEASE_HOLDER";

/// A store under test: its URL and what keeps its files alive.
struct Backend {
    url: String,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    fn sqlite() -> Backend {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite:{}", dir.path().join("runs.db").display());
        Backend {
            url,
            _dir: Some(dir),
        }
    }

    fn postgres() -> Backend {
        Backend {
            url: pg::shared().database("store"),
            _dir: None,
        }
    }

    /// Runs `sql` on the store's database directly; the first column of each row, a
    /// line each.
    fn sql(&self, sql: &str) -> String {
        if let Some(path) = self.url.strip_prefix("sqlite:") {
            let conn = rusqlite::Connection::open(path).expect("sqlite");
            let mut stmt = conn.prepare(sql).expect("prepare");
            let mut rows = stmt.query([]).expect("query");
            let mut out = String::new();
            while let Some(row) = rows.next().expect("row") {
                let value: rusqlite::types::Value = row.get(0).expect("column");
                out.push_str(&format!("{value:?}\n"));
            }
            out
        } else {
            let db = self.url.rsplit('/').next().expect("database");
            pg::shared().psql(db, sql).expect("psql")
        }
    }

    /// Runs several statements on the store's database directly.
    fn exec(&self, sql: &str) {
        if let Some(path) = self.url.strip_prefix("sqlite:") {
            let conn = rusqlite::Connection::open(path).expect("sqlite");
            conn.execute_batch(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        } else {
            self.sql(sql);
        }
    }

    /// `bytes` as a literal of the store's SQL.
    fn blob(&self, bytes: &[u8]) -> String {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        if self.url.starts_with("sqlite:") {
            format!("X'{hex}'")
        } else {
            format!("decode('{hex}', 'hex')")
        }
    }

    async fn open(&self) -> Arc<dyn RunStore> {
        let url = StoreUrl::parse(&self.url).expect("store URL");
        store::open(&url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"))
    }
}

fn new_run(id: &str, started_at_ms: i64) -> NewRun {
    NewRun {
        id: id.to_string(),
        agent: "agent.apl".to_string(),
        bundle_hash: "b1".to_string(),
        bundle: vec![1, 2, 3, 4],
        options: json!({"with_context": {"k": 1}, "limits": {"max_steps": 10}}),
        started_at_ms,
    }
}

fn inputs(range: std::ops::Range<u8>) -> Vec<Vec<u8>> {
    range.map(|i| vec![i; 3]).collect()
}

fn batch(first_input: u64, inputs: Vec<Vec<u8>>, events: &[&str], steps: u64) -> Batch {
    Batch {
        made: Default::default(),
        first_input,
        inputs,
        events: events.iter().map(|e| e.to_string()).collect(),
        checkpoint: None,
        steps,
        outcome: None,
        pending: None,
    }
}

async fn round_trip(backend: Backend) {
    let store = backend.open().await;
    let lease = store.create(new_run("r1", 1_000)).await.expect("create");
    assert_eq!(lease.run_id(), "r1");
    store
        .append(&*lease, batch(0, inputs(0..2), &[r#"{"e":0}"#], 1))
        .await
        .expect("append 1");
    store
        .append(
            &*lease,
            batch(2, inputs(2..3), &[r#"{"e":1}"#, r#"{"e":2}"#], 2),
        )
        .await
        .expect("append 2");
    let loaded = store.load("r1").await.expect("load");
    assert_eq!(loaded.bundle, vec![1, 2, 3, 4]);
    assert_eq!(loaded.options, new_run("r1", 0).options);
    assert_eq!(loaded.inputs, inputs(0..3));
    assert!(loaded.checkpoints.is_empty());
    assert_eq!(loaded.events, 3);
    let summary = &loaded.summary;
    assert_eq!(
        (summary.id.as_str(), summary.agent.as_str()),
        ("r1", "agent.apl")
    );
    assert_eq!(
        (summary.state, summary.steps, summary.inputs, summary.events),
        (RunState::Running, 2, 3, 3)
    );
    assert_eq!(summary.started_at_ms, 1_000);
    assert!(summary.updated_at_ms >= 1_000);
    assert_eq!(summary.outcome, None);
    assert_eq!(&store.summary("r1").await.expect("summary"), summary);
    assert_eq!(store.run_bytes("r1").await.expect("bytes"), 3 * 3 + 3 * 7);
    // A second open of the same store sees the same run.
    drop(lease);
    let again = backend.open().await;
    assert_eq!(again.load("r1").await.expect("reload").inputs, inputs(0..3));
    assert!(matches!(store.load("nope").await, Err(StoreError::NotFound(id)) if id == "nope"));
    assert!(matches!(
        store.summary("nope").await,
        Err(StoreError::NotFound(_))
    ));
}

async fn sequence_gaps_are_refused(backend: Backend) {
    let store = backend.open().await;
    let lease = store.create(new_run("r", 0)).await.expect("create");
    store
        .append(&*lease, batch(0, inputs(0..2), &["{}"], 1))
        .await
        .expect("append");
    for first in [0, 1, 3] {
        let err = store
            .append(&*lease, batch(first, inputs(0..1), &["{}"], 9))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Sequence { ref id, expected: 2, got } if id == "r" && got == first),
            "{err}"
        );
    }
    // Nothing of a refused batch was kept.
    let summary = store.summary("r").await.expect("summary");
    assert_eq!((summary.inputs, summary.events, summary.steps), (2, 1, 1));
}

async fn checkpoints_supersede_and_trim_the_replay(backend: Backend) {
    let store = backend.open().await;
    let lease = store.create(new_run("r", 0)).await.expect("create");
    let checkpoint = |inputs: u64, start: u64, tag: u8| StoredCheckpoint {
        inputs,
        history_start: start,
        history: vec![tag; 5],
        state: Some(vec![tag; 7]),
    };
    let mut first = batch(0, inputs(0..2), &[], 1);
    first.checkpoint = Some(checkpoint(2, 0, 0xA));
    store
        .append(&*lease, first)
        .await
        .expect("first checkpoint");
    let loaded = store.load("r").await.expect("load");
    assert_eq!(loaded.checkpoints, vec![checkpoint(2, 0, 0xA)]);
    assert!(loaded.inputs.is_empty(), "no input after the checkpoint");

    store
        .append(&*lease, batch(2, inputs(2..4), &[], 2))
        .await
        .expect("plain");
    let mut second = batch(4, inputs(4..5), &[], 3);
    second.checkpoint = Some(checkpoint(4, 3, 0xB));
    store
        .append(&*lease, second)
        .await
        .expect("second checkpoint");
    let loaded = store.load("r").await.expect("load");
    let mut superseded = checkpoint(2, 0, 0xA);
    superseded.state = None;
    assert_eq!(loaded.checkpoints, vec![superseded, checkpoint(4, 3, 0xB)]);
    // Only the inputs after the newest checkpoint: number 4 onwards.
    assert_eq!(loaded.inputs, inputs(4..5));
    assert_eq!(loaded.summary.inputs, 5);
    // Inputs 0..5, two histories of 5 bytes, one state of 7.
    assert_eq!(
        store.run_bytes("r").await.expect("bytes"),
        5 * 3 + 2 * 5 + 7
    );
}

async fn listing_and_event_paging(backend: Backend) {
    let store = backend.open().await;
    for (id, at) in [("a", 1), ("b", 3), ("c", 2)] {
        drop(store.create(new_run(id, at)).await.expect("create"));
    }
    let ids: Vec<String> = store
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["b", "c", "a"], "newest first");

    let lease = store.acquire("a").await.expect("acquire");
    let events: Vec<String> = (0..10).map(|i| format!(r#"{{"seq":{i}}}"#)).collect();
    let refs: Vec<&str> = events.iter().map(String::as_str).collect();
    store
        .append(&*lease, batch(0, inputs(0..6), &refs[..6], 1))
        .await
        .expect("append");
    store
        .append(&*lease, batch(6, inputs(6..10), &refs[6..], 2))
        .await
        .expect("append");
    // The journal from any input on, across the rows of both batches.
    assert_eq!(store.inputs("a", 0, 100).await.expect("all"), inputs(0..10));
    assert_eq!(store.inputs("a", 3, 4).await.expect("page"), inputs(3..7));
    assert_eq!(store.inputs("a", 8, 4).await.expect("tail"), inputs(8..10));
    assert!(store.inputs("a", 10, 4).await.expect("end").is_empty());
    assert!(store.inputs("b", 0, 4).await.expect("none").is_empty());
    assert!(matches!(
        store.inputs("zz", 0, 4).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(store.events("a", 0, 100).await.expect("all"), events);
    assert_eq!(store.events("a", 3, 4).await.expect("page"), events[3..7]);
    assert_eq!(store.events("a", 8, 4).await.expect("tail"), events[8..]);
    assert!(
        store
            .events("a", 10, 4)
            .await
            .expect("past the end")
            .is_empty()
    );
    assert!(store.events("b", 0, 4).await.expect("none").is_empty());
    assert!(matches!(
        store.events("zz", 0, 4).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn finished_runs_refuse_acquire(backend: Backend) {
    let store = backend.open().await;
    let lease = store.create(new_run("r", 0)).await.expect("create");
    let mut last = batch(0, inputs(0..1), &["{}"], 4);
    last.outcome = Some(json!({"status": "completed", "context": {"z": 1, "a": 2}}));
    store.append(&*lease, last).await.expect("finish");
    let summary = store.summary("r").await.expect("summary");
    assert_eq!(summary.state, RunState::Finished);
    assert_eq!(
        summary.outcome,
        Some(json!({"status": "completed", "context": {"z": 1, "a": 2}}))
    );
    // Key order is kept (the outcome is stored as written).
    let keys: Vec<&String> = summary.outcome.as_ref().unwrap()["context"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(keys, ["z", "a"]);
    assert!(matches!(
        store.append(&*lease, batch(1, vec![], &[], 5)).await,
        Err(StoreError::Finished(_))
    ));
    drop(lease);
    assert!(matches!(store.acquire("r").await, Err(StoreError::Finished(id)) if id == "r"));
    assert!(matches!(
        store.acquire("nope").await,
        Err(StoreError::NotFound(_))
    ));
}

async fn leases_are_exclusive(backend: Backend) {
    let store = backend.open().await;
    let other = backend.open().await;
    let lease = store.create(new_run("r", 0)).await.expect("create");
    assert!(matches!(store.acquire("r").await, Err(StoreError::Locked(id)) if id == "r"));
    assert!(matches!(
        other.acquire("r").await,
        Err(StoreError::Locked(_))
    ));
    // Creating an existing id while it is held is refused too.
    assert!(matches!(
        other.create(new_run("r", 0)).await,
        Err(StoreError::Locked(_))
    ));
    // A refused attempt does not release the holder's lease.
    assert!(matches!(
        other.acquire("r").await,
        Err(StoreError::Locked(_))
    ));
    drop(lease);
    // The same store takes it again at once.
    drop(
        store
            .acquire("r")
            .await
            .expect("released on drop, in the same store"),
    );
    // Another store (process) sees the release as soon as the unlock reaches the server
    // (PostgreSQL's is queued by the lease's Drop, which cannot wait).
    let lease = acquire_soon(&*other, "r").await;
    assert!(matches!(
        store.acquire("r").await,
        Err(StoreError::Locked(_))
    ));
    // Still held once every queued unlock has run: none of the refused attempts above
    // undid the lock `other` took after them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(
        store.acquire("r").await,
        Err(StoreError::Locked(_))
    ));
    drop(lease);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.create(new_run("r", 0)).await {
            Err(StoreError::Exists(id)) if id == "r" => break,
            Err(StoreError::Locked(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("create of an existing run: {other:?}"),
        }
    }
}

/// Acquires `id`, retrying while it is locked for up to 10 s.
async fn acquire_soon(store: &dyn RunStore, id: &str) -> Box<dyn store::Lease> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.acquire(id).await {
            Ok(lease) => return lease,
            Err(StoreError::Locked(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("acquire {id}: {e}"),
        }
    }
}

async fn a_killed_holder_releases(backend: Backend) {
    let store = backend.open().await;
    drop(store.create(new_run("held", 0)).await.expect("create"));
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "lease_holder_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER_ENV, format!("{} held", backend.url))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the lease holder");
    let stdout = child.stdout.take().expect("piped stdout");
    let waited = tokio::task::spawn_blocking(move || {
        // The harness prints "test lease_holder_child ... " on the same line.
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.trim_end().ends_with("lease held"))
    });
    let held = tokio::time::timeout(Duration::from_secs(60), waited).await;
    if !matches!(held, Ok(Ok(true))) {
        let _ = child.kill();
        panic!("the child never reported holding the lease");
    }
    assert!(matches!(
        store.acquire("held").await,
        Err(StoreError::Locked(_))
    ));
    child.kill().expect("kill -9 the holder");
    child.wait().expect("reap the holder");
    // No expiry to wait for: the OS (SQLite) or the server (PostgreSQL, on the closed
    // socket) releases the lease as the process dies. A short retry covers the server's
    // backend noticing the close.
    drop(acquire_soon(&*store, "held").await);
}

async fn concurrent_appends(backend: Backend) {
    let store = backend.open().await;
    let runs = 40;
    let mut tasks = Vec::new();
    for r in 0..runs {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let id = format!("run-{r}");
            let lease = store.create(new_run(&id, r)).await?;
            for i in 0..5u8 {
                // A batch out of sequence, among everyone's good ones: refused alone
                // (the group it lands in commits the others).
                if i == 2 {
                    let wrong = store
                        .append(&*lease, batch(99, vec![vec![0]], &["{}"], 0))
                        .await;
                    assert!(
                        matches!(
                            wrong,
                            Err(StoreError::Sequence {
                                expected: 2,
                                got: 99,
                                ..
                            })
                        ),
                        "{wrong:?}"
                    );
                }
                let mut good = batch(u64::from(i), vec![vec![i]], &["{}"], u64::from(i));
                if i == 3 {
                    good.checkpoint = Some(StoredCheckpoint {
                        inputs: 4,
                        history_start: 0,
                        history: vec![r as u8],
                        state: Some(vec![i]),
                    });
                }
                if i == 4 && r % 2 == 0 {
                    good.outcome = Some(json!({"status": "succeeded", "run": r}));
                }
                store.append(&*lease, good).await?;
            }
            if r % 2 == 0 {
                let late = store.append(&*lease, batch(5, vec![], &[], 5)).await;
                assert!(matches!(late, Err(StoreError::Finished(_))), "{late:?}");
            }
            Ok::<_, StoreError>(())
        }));
    }
    for task in tasks {
        task.await.expect("task").expect("appends");
    }
    let list = store.list().await.expect("list");
    assert_eq!(list.len(), runs as usize);
    assert!(
        list.iter()
            .all(|s| s.inputs == 5 && s.events == 5 && s.steps == 4)
    );
    let finished = list
        .iter()
        .filter(|s| s.state == RunState::Finished)
        .count();
    assert_eq!(finished, runs as usize / 2);
    let loaded = store.load("run-6").await.expect("load");
    assert_eq!(loaded.checkpoints.len(), 1);
    assert_eq!(loaded.checkpoints[0].history, vec![6]);
    assert_eq!(loaded.checkpoints[0].state, Some(vec![3]));
    assert_eq!(
        loaded.inputs,
        vec![vec![4]],
        "only the input after the checkpoint"
    );
    // The bundle is stored once and shared.
    assert_eq!(
        store.load("run-7").await.expect("load").bundle,
        vec![1, 2, 3, 4]
    );
}

async fn concurrent_opens_migrate_once(backend: Backend) {
    // Several processes opening a new store at once: one migrates, the others wait for it
    // and find the schema there (SQLite `BEGIN IMMEDIATE`, PostgreSQL an advisory lock).
    let url = StoreUrl::parse(&backend.url).expect("url");
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { store::open(&url).await.map(drop) })
        })
        .collect();
    for open in opens {
        open.await.expect("task").expect("concurrent open");
    }
    let store = backend.open().await;
    drop(store.create(new_run("r", 0)).await.expect("create"));
    assert_eq!(store.list().await.expect("list").len(), 1);
}

fn queued(id: &str, agent: &str, at: i64, key: Option<&str>) -> QueuedRun {
    QueuedRun {
        run: new_run(id, at),
        agent: agent.to_string(),
        idempotency_key: key.map(str::to_string),
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
    }
}

/// The service's queue: enqueue with idempotency keys, claims in order that never hand
/// out a held run, takeover of a released one, cancel flags, statuses and counts.
async fn queue_claims_cancel_and_idempotency(backend: Backend) {
    let store = backend.open().await;
    let first = store
        .enqueue(queued("a", "greet", 1, Some("k1")))
        .await
        .expect("enqueue a");
    assert_eq!(first, Enqueued::New("a".into()));
    // The same key for the same agent: the run it started, nothing stored.
    let again = store
        .enqueue(queued("a2", "greet", 2, Some("k1")))
        .await
        .expect("enqueue again");
    assert_eq!(again, Enqueued::Existing("a".into()));
    assert!(matches!(
        store.summary("a2").await,
        Err(StoreError::NotFound(_))
    ));
    // The same key for another agent is another run.
    let other = store
        .enqueue(queued("b", "other", 2, Some("k1")))
        .await
        .expect("enqueue b");
    assert_eq!(other, Enqueued::New("b".into()));
    store
        .enqueue(queued("c", "greet", 3, None))
        .await
        .expect("enqueue c");
    assert!(matches!(
        store.enqueue(queued("c", "greet", 4, None)).await,
        Err(StoreError::Exists(_))
    ));

    let entry = store.queue_entry("a").await.expect("entry");
    assert_eq!(entry.status, QueueStatus::Queued);
    assert_eq!(entry.agent, "greet");
    assert!(!entry.cancel_requested);
    assert!(entry.traceparent.is_some());
    assert_eq!(entry.summary.inputs, 0);
    assert_eq!(
        store
            .queue_counts()
            .await
            .expect("counts")
            .get(QueueStatus::Queued),
        3
    );

    // Claims go oldest first and never hand out a run a live lease holds.
    let a = store.claim().await.expect("claim").expect("a");
    assert_eq!(a.lease.run_id(), "a");
    // The claim carries the queue's row.
    assert_eq!(a.agent, "greet");
    assert!(!a.cancel_requested);
    assert!(a.traceparent.is_some());
    let a = a.lease;
    assert_eq!(
        store.queue_entry("a").await.unwrap().status,
        QueueStatus::Running
    );
    let b = store.claim().await.expect("claim").expect("b").lease;
    assert_eq!(b.run_id(), "b");
    let c = store.claim().await.expect("claim").expect("c").lease;
    assert_eq!(c.run_id(), "c");
    assert!(store.claim().await.expect("claim").is_none());
    // Another store (another process, for PostgreSQL) finds nothing to claim either.
    let second = backend.open().await;
    assert!(second.claim().await.expect("claim").is_none());
    // A released lease (a worker gone) is claimed again, by anyone.
    drop(b);
    let b = acquire_claim(&*second, "b").await;
    // A claimed run with an empty journal loads: it starts from the beginning.
    let loaded = second.load("b").await.expect("load");
    assert!(loaded.inputs.is_empty() && loaded.checkpoints.is_empty());

    // A finished run leaves the queue with its status.
    let outcome = json!({"status": "succeeded", "error": null});
    store
        .append(
            &*a,
            Batch {
                made: Default::default(),
                outcome: Some(outcome),
                ..batch(0, Vec::new(), &["{}"], 1)
            },
        )
        .await
        .expect("finish a");
    assert_eq!(
        store.queue_entry("a").await.unwrap().status,
        QueueStatus::Completed
    );
    let cancelled =
        json!({"status": "failed", "error": {"kind": "Cancelled", "message": "cancelled"}});
    second
        .append(
            &*b,
            Batch {
                made: Default::default(),
                outcome: Some(cancelled),
                ..batch(0, Vec::new(), &[], 0)
            },
        )
        .await
        .expect("finish b");
    assert_eq!(
        store.queue_entry("b").await.unwrap().status,
        QueueStatus::Cancelled
    );

    // Cancel flags.
    store.request_cancel("c").await.expect("cancel c");
    assert!(second.queue_entry("c").await.unwrap().cancel_requested);
    assert!(matches!(
        store.request_cancel("nope").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.queue_entry("nope").await,
        Err(StoreError::NotFound(_))
    ));

    let counts = store.queue_counts().await.expect("counts");
    assert_eq!(counts.get(QueueStatus::Completed), 1);
    assert_eq!(counts.get(QueueStatus::Cancelled), 1);
    assert_eq!(counts.get(QueueStatus::Running), 1);
    assert_eq!(counts.get(QueueStatus::Queued), 0);
    drop(c);
}

/// Claims until `id` comes (a released lease frees the run a moment later on
/// PostgreSQL, whose unlock is queued).
async fn acquire_claim(store: &dyn RunStore, id: &str) -> Box<dyn store::Lease> {
    let started = Instant::now();
    loop {
        if let Some(claim) = store.claim().await.expect("claim") {
            assert_eq!(claim.lease.run_id(), id);
            return claim.lease;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{id} never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A store of schema version 1 (before the queue) is migrated on open.
#[tokio::test]
async fn sqlite_migrates_a_version_1_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("runs.db");
    let url = format!("sqlite:{}", path.display());
    let store = store::open(&StoreUrl::parse(&url).expect("url"))
        .await
        .expect("create");
    drop(store.create(new_run("old", 1)).await.expect("create run"));
    drop(store);
    let conn = rusqlite::Connection::open(&path).expect("sqlite");
    conn.execute_batch(
        "DROP TABLE run_queue; DROP TABLE idempotency_keys; DROP TABLE answers;
         ALTER TABLE runs DROP COLUMN pending;
         ALTER TABLE inputs DROP COLUMN n; ALTER TABLE events DROP COLUMN n;
         UPDATE aplc_meta SET value = '1' WHERE key = 'schema_version';
         PRAGMA user_version = 1;",
    )
    .expect("downgrade");
    drop(conn);
    let store = store::open(&StoreUrl::parse(&url).expect("url"))
        .await
        .expect("migrate");
    assert_eq!(store.list().await.expect("list").len(), 1);
    store
        .enqueue(queued("new", "greet", 2, None))
        .await
        .expect("enqueue");
    // A run `create` made is not in the queue.
    assert!(matches!(
        store.queue_entry("old").await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(
        store
            .claim()
            .await
            .expect("claim")
            .expect("new")
            .lease
            .run_id(),
        "new"
    );
}

/// A burst of concurrent enqueues (the server's 1,000 submits at once): each gets its
/// own answer, an existing id is refused without losing the others of its group, and two
/// submits with one idempotency key start one run.
async fn concurrent_enqueues(backend: Backend) {
    let store = backend.open().await;
    store
        .enqueue(queued("taken", "greet", 1, None))
        .await
        .expect("enqueue taken");
    let mut submits = Vec::new();
    for i in 0..60 {
        let store = store.clone();
        submits.push(tokio::spawn(async move {
            let run = match i {
                // An id that exists: refused alone.
                7 => queued("taken", "greet", 2, None),
                // Two submits with one key: one run.
                20 | 21 => queued(&format!("keyed-{i}"), "greet", 2, Some("same")),
                // Two submits of one new id: one is stored, the other refused.
                30 | 31 => queued("twice", "greet", 2, None),
                _ => queued(&format!("run-{i}"), "greet", 2, None),
            };
            (i, store.enqueue(run).await)
        }));
    }
    let mut keyed = Vec::new();
    let mut twice = Vec::new();
    for submit in submits {
        let (i, result) = submit.await.expect("task");
        match i {
            7 => assert!(matches!(result, Err(StoreError::Exists(_))), "{result:?}"),
            20 | 21 => keyed.push(result.expect("keyed")),
            30 | 31 => twice.push(result),
            _ => assert_eq!(result.expect("enqueue"), Enqueued::New(format!("run-{i}"))),
        }
    }
    let ids: Vec<&str> = keyed.iter().map(Enqueued::id).collect();
    assert_eq!(ids[0], ids[1], "one key, one run: {keyed:?}");
    assert_eq!(
        keyed
            .iter()
            .filter(|e| matches!(e, Enqueued::New(_)))
            .count(),
        1,
        "{keyed:?}"
    );
    assert!(
        matches!(
            twice.as_slice(),
            [Ok(Enqueued::New(_)), Err(StoreError::Exists(_))]
                | [Err(StoreError::Exists(_)), Ok(Enqueued::New(_))]
        ),
        "{twice:?}"
    );
    // Every new run is in the store, queued: the taken one, 55 plain ones, the keyed one
    // and the one submitted twice.
    assert_eq!(store.list().await.expect("list").len(), 58);
    let counts = store.queue_counts().await.expect("counts");
    assert_eq!(counts.get(QueueStatus::Queued), 58);
}

/// Idempotency keys older than the window are deleted by the first enqueue of a store
/// (then once an hour); keys still in the window stay.
async fn expired_idempotency_keys_are_purged(backend: Backend) {
    let store = backend.open().await;
    for (id, key) in [("a", "old-key"), ("b", "fresh-key")] {
        store
            .enqueue(queued(id, "greet", 1, Some(key)))
            .await
            .expect("enqueue");
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let day_ago = now_ms - 25 * 60 * 60 * 1000;
    backend.sql(&format!(
        "UPDATE idempotency_keys SET created_at_ms = {day_ago} WHERE key = 'old-key'"
    ));
    assert_eq!(
        backend
            .sql("SELECT key FROM idempotency_keys ORDER BY key")
            .lines()
            .count(),
        2
    );
    // This store purged at its first enqueue, before the key aged: not due again.
    store
        .enqueue(queued("c", "greet", 2, None))
        .await
        .expect("enqueue");
    assert_eq!(
        backend
            .sql("SELECT key FROM idempotency_keys")
            .lines()
            .count(),
        2
    );
    let restarted = backend.open().await;
    restarted
        .enqueue(queued("d", "greet", 3, None))
        .await
        .expect("enqueue");
    let keys = backend.sql("SELECT key FROM idempotency_keys");
    assert_eq!(keys.lines().count(), 1, "{keys}");
    assert!(keys.contains("fresh-key"), "{keys}");
}

/// A claim never hands out a queued run that a lease holds, this store's own included
/// (on PostgreSQL a session may take an advisory lock twice).
async fn claims_pass_over_held_runs(backend: Backend) {
    let store = backend.open().await;
    for (at, id) in [(1, "held"), (2, "free")] {
        store
            .enqueue(queued(id, "greet", at, None))
            .await
            .expect("enqueue");
    }
    let held = store.acquire("held").await.expect("acquire");
    let free = store.claim().await.expect("claim").expect("free");
    assert_eq!(free.lease.run_id(), "free");
    assert!(store.claim().await.expect("claim").is_none());
    let other = backend.open().await;
    assert!(other.claim().await.expect("claim").is_none());
    // Still held here: a second lease is refused.
    assert!(matches!(
        store.acquire("held").await,
        Err(StoreError::Locked(_))
    ));
    drop(held);
    let taken = acquire_claim(&*other, "held").await;
    drop((free, taken));
}

/// A dead worker's run is taken over even while new runs wait: a store's first claim,
/// and then one claim per `TAKEOVER_SCAN`, looks for abandoned runs before new ones;
/// a claim that finds no new run looks for them too.
async fn takeover_comes_before_a_backlog(backend: Backend) {
    let worker = backend.open().await;
    for (at, id) in [(1, "old"), (2, "new-1"), (3, "new-2")] {
        worker
            .enqueue(queued(id, "greet", at, None))
            .await
            .expect("enqueue");
    }
    let old = worker.claim().await.expect("claim").expect("old");
    assert_eq!(old.lease.run_id(), "old");
    // The worker dies: its store and lease go.
    drop(old);
    drop(worker);

    let other = backend.open().await;
    // PostgreSQL frees the dead worker's lock once it sees the connection close: wait
    // for that (this store's own unlock runs before its next lock).
    let started = Instant::now();
    while other.acquire("old").await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "old never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = other.claim().await.expect("claim").expect("old");
    assert_eq!(first.lease.run_id(), "old");
    // A run taken over is loaded by its new worker, not by the claim.
    assert!(first.loaded.is_none());
    let first = first.lease;
    // New runs next, oldest first; then none. A new run comes loaded: what `load` gives.
    let second = other.claim().await.expect("claim").expect("new-1");
    assert_eq!(second.lease.run_id(), "new-1");
    let loaded = second.loaded.as_ref().expect("a new run comes loaded");
    let stored = other.load("new-1").await.expect("load");
    assert_eq!(loaded.summary, stored.summary);
    assert_eq!(loaded.bundle, stored.bundle);
    assert_eq!(loaded.options, stored.options);
    assert!(loaded.inputs.is_empty() && loaded.checkpoints.is_empty() && loaded.events == 0);
    let third = other.claim().await.expect("claim").expect("new-2");
    assert_eq!(third.lease.run_id(), "new-2");
    assert!(other.claim().await.expect("claim").is_none());

    // Not due for a scan, a claim that finds no new run still looks for abandoned ones.
    drop(third);
    let again = acquire_claim(&*other, "new-2").await;
    drop((first, again));
}

/// Events `from..to` as distinct JSON texts.
fn events_json(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|i| format!(r#"{{"seq":{i}}}"#)).collect()
}

/// Every event of run `id`, read in pages of `page`.
async fn paged(store: &dyn RunStore, id: &str, page: u64) -> Vec<String> {
    let mut all = Vec::new();
    loop {
        let got = store
            .events(id, all.len() as u64, page)
            .await
            .expect("page");
        assert!(got.len() as u64 <= page, "a page holds at most its limit");
        if got.is_empty() {
            return all;
        }
        all.extend(got);
        assert!(all.len() < 1_000, "pages that never end");
    }
}

/// A group of steps is a few rows (several inputs, several events each), and reads slice
/// them: a checkpoint whose input count falls inside a row, event pages that start inside
/// a row or span rows.
async fn packed_rows_load_resume_and_page(backend: Backend) {
    let store = backend.open().await;
    let lease = store.create(new_run("r", 0)).await.expect("create");
    let events = events_json(0..12);
    let refs: Vec<&str> = events.iter().map(String::as_str).collect();
    // One group: inputs 0..10, events 0..7, and a checkpoint taken after input 4.
    let mut group = batch(0, inputs(0..10), &refs[..7], 5);
    group.checkpoint = Some(StoredCheckpoint {
        inputs: 4,
        history_start: 0,
        history: vec![1; 5],
        state: Some(vec![2; 7]),
    });
    store.append(&*lease, group).await.expect("append");
    assert_eq!(
        backend.sql("SELECT count(*) FROM inputs"),
        backend.sql("SELECT 1"),
        "one row for the group's inputs"
    );
    assert_eq!(
        backend.sql("SELECT count(*) FROM events"),
        backend.sql("SELECT 1")
    );
    let loaded = store.load("r").await.expect("load");
    assert_eq!(loaded.inputs, inputs(4..10), "sliced at the checkpoint");
    assert_eq!(loaded.events, 7);

    // Resumed in another store: the next group follows on.
    // The release lands on the first store's writer while the second one asks.
    drop(lease);
    let again = backend.open().await;
    let lease = acquire_soon(again.as_ref(), "r").await;
    let resumed = again.load("r").await.expect("load");
    assert_eq!(resumed.inputs, loaded.inputs);
    assert_eq!(resumed.checkpoints, loaded.checkpoints);
    again
        .append(&*lease, batch(10, inputs(10..13), &refs[7..], 6))
        .await
        .expect("append after resume");
    let loaded = again.load("r").await.expect("load");
    assert_eq!(loaded.inputs, inputs(4..13));
    assert_eq!((loaded.summary.inputs, loaded.summary.events), (13, 12));

    assert_eq!(again.events("r", 0, 100).await.expect("all"), events);
    assert_eq!(again.events("r", 2, 3).await.expect("inside"), events[2..5]);
    assert_eq!(again.events("r", 5, 4).await.expect("across"), events[5..9]);
    assert_eq!(
        again.events("r", 6, 1).await.expect("last of a row"),
        events[6..7]
    );
    assert_eq!(
        again.events("r", 7, 1).await.expect("first of a row"),
        events[7..8]
    );
    assert!(again.events("r", 12, 5).await.expect("past").is_empty());
    assert!(again.events("r", 99, 5).await.expect("far past").is_empty());
    for page in [1, 2, 3, 5] {
        assert_eq!(paged(&*again, "r", page).await, events, "pages of {page}");
    }
    // The entries' bytes, not the rows' framing: 13 inputs of 3 bytes, the events, the
    // checkpoint's history and state.
    let event_bytes: usize = events.iter().map(String::len).sum();
    assert_eq!(
        again.run_bytes("r").await.expect("bytes"),
        (13 * 3 + event_bytes + 5 + 7) as u64
    );
}

/// A store written before schema version 3, one row per entry (written here with SQL as
/// that version did), reads as it did: read-only (SQLite's `aplc runs`, not migrated), and
/// once opened (migrated), where the run resumes and its new rows follow the old ones.
async fn one_entry_rows_of_an_older_store_still_read(backend: Backend) {
    let store = backend.open().await;
    drop(store.create(new_run("old", 0)).await.expect("create"));
    drop(store);
    let events = events_json(0..9);
    let mut old = String::from(
        "ALTER TABLE inputs DROP COLUMN n; ALTER TABLE events DROP COLUMN n;
         DROP INDEX run_queue_ready; DROP INDEX run_queue_wake;
         DROP TABLE answers; ALTER TABLE runs DROP COLUMN pending;
         ALTER TABLE run_queue DROP COLUMN waiting; ALTER TABLE run_queue DROP COLUMN wake_at_ms;
         UPDATE aplc_meta SET value = '2' WHERE key = 'schema_version';",
    );
    if backend.url.starts_with("sqlite:") {
        old.push_str("PRAGMA user_version = 2;");
    }
    for (seq, bytes) in inputs(0..5).iter().enumerate() {
        let blob = backend.blob(bytes);
        old.push_str(&format!(
            "INSERT INTO inputs (run_id, seq, bytes) VALUES ('old', {seq}, {blob});"
        ));
    }
    for (seq, json) in events[..4].iter().enumerate() {
        old.push_str(&format!(
            "INSERT INTO events (run_id, seq, json) VALUES ('old', {seq}, '{json}');"
        ));
    }
    let (history, state) = (backend.blob(&[1; 5]), backend.blob(&[2; 7]));
    old.push_str(&format!(
        "INSERT INTO checkpoints (run_id, seq, inputs, history_start, history, state)
         VALUES ('old', 0, 2, 0, {history}, {state});
         UPDATE runs SET input_count = 5, event_count = 4, steps = 3 WHERE id = 'old';"
    ));
    backend.exec(&old);

    let check = |store: Arc<dyn RunStore>, inputs_after: Vec<Vec<u8>>, events: Vec<String>| async move {
        let loaded = store.load("old").await.expect("load");
        assert_eq!(loaded.inputs, inputs_after);
        assert_eq!(loaded.events, events.len() as u64);
        assert_eq!(store.events("old", 0, 100).await.expect("events"), events);
        assert_eq!(paged(&*store, "old", 2).await, events);
        assert_eq!(store.events("old", 1, 2).await.expect("page"), events[1..3]);
    };
    if backend.url.starts_with("sqlite:") {
        let url = StoreUrl::parse(&backend.url).expect("url");
        let read_only = store::open_read_only(&url).await.expect("read-only");
        check(read_only, inputs(2..5), events[..4].to_vec()).await;
        assert_eq!(
            backend.sql("SELECT value FROM aplc_meta WHERE key = 'schema_version'"),
            "Text(\"2\")\n",
            "read-only does not migrate"
        );
    }
    let store = backend.open().await;
    check(store.clone(), inputs(2..5), events[..4].to_vec()).await;
    let lease = store.acquire("old").await.expect("acquire");
    let refs: Vec<&str> = events[4..].iter().map(String::as_str).collect();
    let mut group = batch(5, inputs(5..9), &refs, 4);
    group.checkpoint = Some(StoredCheckpoint {
        inputs: 7,
        history_start: 1,
        history: vec![3; 2],
        state: Some(vec![4; 3]),
    });
    store.append(&*lease, group).await.expect("resume");
    check(store.clone(), inputs(7..9), events.clone()).await;
    assert_eq!(
        store.events("old", 3, 3).await.expect("across"),
        events[3..6]
    );
}

/// A journal row that does not decode to what it says, or rows that leave a gap: a clear
/// `Corrupt` error, never a panic.
async fn corrupt_rows_are_errors(backend: Backend) {
    let store = backend.open().await;
    let lease = store.create(new_run("r", 0)).await.expect("create");
    let events = events_json(0..6);
    let refs: Vec<&str> = events.iter().map(String::as_str).collect();
    store
        .append(&*lease, batch(0, inputs(0..4), &refs[..3], 1))
        .await
        .expect("append");
    store
        .append(&*lease, batch(4, inputs(4..8), &refs[3..], 2))
        .await
        .expect("append");
    drop(lease);
    let corrupt = |what: &str, result: Result<(), StoreError>| match result {
        Err(StoreError::Corrupt(message)) => message,
        other => panic!("{what}: {other:?}"),
    };
    let load = |store: Arc<dyn RunStore>| async move { store.load("r").await.map(drop) };
    let events_of =
        |store: Arc<dyn RunStore>| async move { store.events("r", 1, 10).await.map(drop) };
    for (what, damage, undo) in [
        (
            "a truncated input row",
            "UPDATE inputs SET bytes = substr(bytes, 1, length(bytes) - 1) WHERE seq = 0",
            None,
        ),
        (
            "an input count past its data",
            "UPDATE inputs SET n = 5 WHERE seq = 0",
            Some("UPDATE inputs SET n = 4 WHERE seq = 0"),
        ),
        (
            "a missing input row",
            "DELETE FROM inputs WHERE seq = 0",
            None,
        ),
    ] {
        backend.exec(damage);
        let message = corrupt(what, load(store.clone()).await);
        assert!(message.contains("input"), "{what}: {message}");
        if let Some(undo) = undo {
            backend.exec(undo);
        }
    }
    for (what, damage) in [
        (
            "an event count the row does not hold",
            "UPDATE events SET n = 4 WHERE seq = 0",
        ),
        (
            "a row count of zero",
            "UPDATE events SET n = 0 WHERE seq = 0",
        ),
    ] {
        backend.exec(damage);
        let message = corrupt(what, events_of(store.clone()).await);
        assert!(message.contains("event row 0"), "{what}: {message}");
    }
}

/// Each generic check, once per backend.
macro_rules! both_backends {
    ($($check:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $check() {
                    super::$check(super::Backend::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $check() {
                    super::$check(super::Backend::postgres()).await;
                }
            )*
        }
    };
}

both_backends!(
    expired_idempotency_keys_are_purged,
    claims_pass_over_held_runs,
    takeover_comes_before_a_backlog,
    round_trip,
    sequence_gaps_are_refused,
    checkpoints_supersede_and_trim_the_replay,
    listing_and_event_paging,
    finished_runs_refuse_acquire,
    leases_are_exclusive,
    a_killed_holder_releases,
    concurrent_appends,
    concurrent_opens_migrate_once,
    queue_claims_cancel_and_idempotency,
    concurrent_enqueues,
    packed_rows_load_resume_and_page,
    one_entry_rows_of_an_older_store_still_read,
    corrupt_rows_are_errors,
);

/// Not a check: with `APLC_STORE_LEASE_HOLDER` set, takes that run's lease, says so on
/// stdout and waits to be killed. Without it, does nothing.
#[tokio::test]
async fn lease_holder_child() {
    let Ok(spec) = std::env::var(HOLDER_ENV) else {
        return;
    };
    let (url, id) = spec.rsplit_once(' ').expect("URL and run id");
    let store = store::open(&StoreUrl::parse(url).expect("url"))
        .await
        .expect("open");
    let _lease = store.acquire(id).await.expect("acquire");
    println!("lease held");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

// Bad stores: never a panic, always the variant that says what is wrong.

async fn open_err(url: &str) -> StoreError {
    match store::open(&StoreUrl::parse(url).expect("url")).await {
        Ok(store) => panic!("{url} opened: {store:?}"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn sqlite_refuses_a_file_that_is_not_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notes.txt");
    std::fs::write(
        &path,
        "these are not the runs you are looking for\n".repeat(200),
    )
    .expect("write");
    let err = open_err(&format!("sqlite:{}", path.display())).await;
    assert!(matches!(err, StoreError::Foreign(_)), "{err:?}");
}

#[tokio::test]
async fn sqlite_refuses_a_database_of_another_application() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("other.db");
    let conn = rusqlite::Connection::open(&path).expect("sqlite");
    conn.execute_batch("CREATE TABLE runs (x INTEGER); CREATE TABLE songs (title TEXT);")
        .expect("tables");
    drop(conn);
    let err = open_err(&format!("sqlite:{}", path.display())).await;
    assert!(
        matches!(err, StoreError::Foreign(ref m) if m.contains("songs")),
        "{err:?}"
    );
    // Another application's id, even with no tables.
    let path = dir.path().join("app.db");
    let conn = rusqlite::Connection::open(&path).expect("sqlite");
    conn.pragma_update(None, "application_id", 42)
        .expect("pragma");
    drop(conn);
    let err = open_err(&format!("sqlite:{}", path.display())).await;
    assert!(matches!(err, StoreError::Foreign(_)), "{err:?}");
}

#[tokio::test]
async fn sqlite_refuses_a_newer_schema() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("runs.db");
    let url = format!("sqlite:{}", path.display());
    drop(
        store::open(&StoreUrl::parse(&url).expect("url"))
            .await
            .expect("create"),
    );
    let conn = rusqlite::Connection::open(&path).expect("sqlite");
    conn.pragma_update(None, "user_version", 99)
        .expect("pragma");
    drop(conn);
    let err = open_err(&url).await;
    assert!(
        matches!(
            err,
            StoreError::NewerSchema {
                found: 99,
                supported: 4
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade aplc"), "{err}");
}

#[tokio::test]
async fn sqlite_reports_a_truncated_or_corrupt_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("runs.db");
    let url = format!("sqlite:{}", path.display());
    {
        let store = store::open(&StoreUrl::parse(&url).expect("url"))
            .await
            .expect("create");
        let lease = store.create(new_run("r", 0)).await.expect("create");
        for i in 0..50u64 {
            let big = vec![vec![7u8; 2_000]];
            store
                .append(&*lease, batch(i, big, &["{}"], i))
                .await
                .expect("append");
        }
    }
    let bytes = std::fs::read(&path).expect("read");
    assert!(
        bytes.len() > 50_000,
        "the WAL was checkpointed into the file on close"
    );

    // Truncated: the header promises pages that are gone.
    let truncated = dir.path().join("truncated.db");
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).expect("write");
    let err = read_everything(&format!("sqlite:{}", truncated.display())).await;
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");

    // Garbage over the pages after the first (the header and schema page intact).
    let mut garbled = bytes.clone();
    for b in &mut garbled[4096..] {
        *b = 0xA5;
    }
    let corrupt = dir.path().join("corrupt.db");
    std::fs::write(&corrupt, &garbled).expect("write");
    let err = read_everything(&format!("sqlite:{}", corrupt.display())).await;
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");

    // A damaged header: not recognizable as SQLite at all.
    let mut headless = bytes;
    headless[..16].copy_from_slice(b"0123456789abcdef");
    let broken = dir.path().join("broken.db");
    std::fs::write(&broken, &headless).expect("write");
    let err = read_everything(&format!("sqlite:{}", broken.display())).await;
    assert!(matches!(err, StoreError::Foreign(_)), "{err:?}");
}

/// Opens a store and reads all of run `r`, returning the first error.
async fn read_everything(url: &str) -> StoreError {
    let store = match store::open(&StoreUrl::parse(url).expect("url")).await {
        Ok(store) => store,
        Err(e) => return e,
    };
    let result = async {
        store.list().await?;
        store.load("r").await?;
        store.events("r", 0, 1000).await?;
        store.run_bytes("r").await
    }
    .await;
    match result {
        Ok(_) => panic!("{url}: read without an error"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn sqlite_reports_a_missing_directory() {
    let err = open_err("sqlite:/nonexistent-aplc-dir/sub/runs.db").await;
    assert!(matches!(err, StoreError::Open(_)), "{err:?}");
}

#[tokio::test]
async fn postgres_refuses_foreign_tables_of_the_same_names() {
    let cluster = pg::shared();
    let url = cluster.database("foreign");
    let db = url.rsplit('/').next().expect("db name");
    cluster
        .psql(db, "CREATE TABLE runs (id INTEGER, note TEXT)")
        .expect("psql");
    let err = open_err(&url).await;
    assert!(
        matches!(err, StoreError::Foreign(ref m) if m.contains("runs")),
        "{err:?}"
    );

    // An `aplc_meta` that is someone else's.
    let url = cluster.database("foreign_meta");
    let db = url.rsplit('/').next().expect("db name");
    cluster.psql(db, "CREATE TABLE aplc_meta (key TEXT, value TEXT); INSERT INTO aplc_meta VALUES ('magic', 'nope')").expect("psql");
    let err = open_err(&url).await;
    assert!(matches!(err, StoreError::Foreign(_)), "{err:?}");
    let url = cluster.database("foreign_shape");
    let db = url.rsplit('/').next().expect("db name");
    cluster
        .psql(db, "CREATE TABLE aplc_meta (id INTEGER)")
        .expect("psql");
    let err = open_err(&url).await;
    assert!(matches!(err, StoreError::Foreign(_)), "{err:?}");
}

#[tokio::test]
async fn postgres_refuses_a_newer_schema() {
    let cluster = pg::shared();
    let url = cluster.database("newer");
    drop(
        store::open(&StoreUrl::parse(&url).expect("url"))
            .await
            .expect("create"),
    );
    // Opening again is a no-op migration.
    drop(
        store::open(&StoreUrl::parse(&url).expect("url"))
            .await
            .expect("reopen"),
    );
    let db = url.rsplit('/').next().expect("db name");
    cluster
        .psql(
            db,
            "UPDATE aplc_meta SET value = '7' WHERE key = 'schema_version'",
        )
        .expect("psql");
    let err = open_err(&url).await;
    assert!(
        matches!(
            err,
            StoreError::NewerSchema {
                found: 7,
                supported: 4
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn postgres_unreachable_is_an_open_error_without_the_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    // Nothing listens on `port` now: connection refused.
    let url = format!("postgres://aplc:hunter2-secret@127.0.0.1:{port}/db?connect_timeout=5");
    let err = open_err(&url).await;
    assert!(matches!(err, StoreError::Open(_)), "{err:?}");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains("hunter2"), "{text}");
    }
    let parsed = StoreUrl::parse(&url).expect("url");
    for text in [parsed.to_string(), format!("{parsed:?}")] {
        assert!(!text.contains("hunter2"), "{text}");
    }

    // A live server that refuses the database: the password is not echoed either.
    let cluster = pg::shared();
    let url = format!(
        "postgres://aplc:hunter2-secret@127.0.0.1:{}/no_such_db",
        cluster.port()
    );
    let err = open_err(&url).await;
    assert!(
        matches!(err, StoreError::Open(ref m) if m.contains("no_such_db")),
        "{err:?}"
    );
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains("hunter2"), "{text}");
    }
    // And an open store's Debug shows no password.
    let url = cluster
        .database("secret")
        .replacen("aplc@", "aplc:hunter2-secret@", 1);
    let store = store::open(&StoreUrl::parse(&url).expect("url"))
        .await
        .expect("open");
    let shown = format!("{store:?}");
    assert!(
        !shown.contains("hunter2") && shown.contains("***"),
        "{shown}"
    );
}
