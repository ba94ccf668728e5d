//! A measurement, not a test: what a run store's commit costs, in time and bytes.
//!
//! `cargo run --release -p aplc-runtime --example store_cost -- [STORE_URL ...]`
//!
//! With no URL it measures a SQLite store in a temporary directory. For each store:
//! sequential appends of one run (the latency a step waits for at a provider or tool
//! boundary), then 100 runs appending at once (what group commit buys), and the bytes
//! stored per append. Then SQLite's `synchronous` settings compared on bare one-row
//! commits in WAL mode, FULL (the store's) against NORMAL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aplc_runtime::store::{self, Batch, NewRun, RunStore, StoreUrl};

/// Appends per run in each measurement.
const APPENDS: u64 = 200;
/// Runs appending at once.
const CONCURRENT_RUNS: u64 = 100;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        urls.push(format!("sqlite:{}", dir.path().join("cost.db").display()));
    }
    for url in &urls {
        let url = StoreUrl::parse(url)?;
        println!("== {url}");
        runtime.block_on(measure(&url))?;
    }
    println!("== SQLite bare one-row commits, WAL");
    for mode in ["FULL", "NORMAL"] {
        let per_commit = bare_commits(&dir.path().join(format!("bare-{mode}.db")), mode)?;
        println!(
            "synchronous={mode:<6}  {:>8.1} µs/commit",
            micros(per_commit)
        );
    }
    Ok(())
}

async fn measure(url: &StoreUrl) -> Result<(), Box<dyn std::error::Error>> {
    let store = store::open(url).await?;
    let tag = std::process::id();

    // One run, one append at a time: each waits for its own commit.
    let id = format!("seq-{tag}");
    let lease = store.create(new_run(&id)).await?;
    let start = Instant::now();
    for i in 0..APPENDS {
        store.append(&*lease, step(i)).await?;
    }
    let elapsed = start.elapsed();
    let bytes = store.run_bytes(&id).await?;
    println!(
        "sequential: {:>8.1} µs/commit, {} B/append ({} input B + {} event B each)",
        micros(elapsed / APPENDS as u32),
        bytes / APPENDS,
        INPUT_BYTES,
        EVENT.len(),
    );

    // Many runs at once: their appends share commits.
    let start = Instant::now();
    let mut tasks = Vec::new();
    for r in 0..CONCURRENT_RUNS {
        let store: Arc<dyn RunStore> = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let lease = store.create(new_run(&format!("par-{tag}-{r}"))).await?;
            for i in 0..APPENDS {
                store.append(&*lease, step(i)).await?;
            }
            Ok::<_, store::StoreError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = start.elapsed();
    let appends = CONCURRENT_RUNS * APPENDS;
    println!(
        "{CONCURRENT_RUNS} runs at once: {appends} appends in {:.2} s, {:.0} appends/s, {:>6.1} µs/append",
        elapsed.as_secs_f64(),
        appends as f64 / elapsed.as_secs_f64(),
        micros(elapsed / appends as u32),
    );
    if let StoreUrl::Sqlite(path) = url {
        drop(store);
        let file = std::fs::metadata(path)?.len();
        let runs = CONCURRENT_RUNS + 1;
        println!(
            "file: {file} B for {} appends ({} B/append with indexes and pages)",
            runs * APPENDS,
            file / (runs * APPENDS)
        );
    }
    Ok(())
}

/// An input about the size of a short completion.
const INPUT_BYTES: usize = 300;
/// An event about the size of a `step_entered`.
const EVENT: &str =
    r#"{"type":"step_entered","seq":12,"step":"analyze","at_ms":1234,"iteration":3}"#;

fn step(i: u64) -> Batch {
    Batch {
        made: Default::default(),
        first_input: i,
        inputs: vec![vec![b'x'; INPUT_BYTES]],
        events: vec![EVENT.to_string()],
        checkpoint: None,
        steps: i,
        outcome: None,
        pending: None,
    }
}

fn new_run(id: &str) -> NewRun {
    NewRun {
        id: id.to_string(),
        agent: "cost.apl".to_string(),
        bundle_hash: "cost".to_string(),
        bundle: vec![0; 4096],
        options: serde_json::json!({}),
        started_at_ms: 0,
    }
}

/// The mean time of a one-row commit with `synchronous = mode`.
fn bare_commits(path: &std::path::Path, mode: &str) -> Result<Duration, rusqlite::Error> {
    let conn = rusqlite::Connection::open(path)?;
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", mode)?;
    conn.execute_batch("CREATE TABLE t (seq INTEGER PRIMARY KEY, bytes BLOB NOT NULL)")?;
    let payload = vec![b'x'; INPUT_BYTES];
    let start = Instant::now();
    for i in 0..APPENDS {
        conn.execute(
            "INSERT INTO t (seq, bytes) VALUES (?1, ?2)",
            rusqlite::params![i as i64, payload],
        )?;
    }
    Ok(start.elapsed() / APPENDS as u32)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
