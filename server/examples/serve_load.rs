//! The load benchmark of `aplc serve` (issue #14 §5; figures in benches/README.md).
//!
//! ```sh
//! cargo build --release -p aplc
//! cargo run --release -p aplc-server --example serve_load -- target/release/aplc \
//!     [--runs 1000] [--turns 2] [--latency-ms 20] [--max-concurrent-runs 16] \
//!     [--store sqlite|postgres://…] [--workers 1]
//! ```
//!
//! Starts a fake OpenAI-compatible model on 127.0.0.1 that answers every call after
//! `latency-ms`, starts `workers` `aplc serve` processes on one store (SQLite for one
//! worker; a PostgreSQL URL for more), submits `runs` runs of a `turns`-call agent all
//! at once over HTTP, and waits until every run has completed. Prints:
//!
//! * throughput, and the latency bound at the concurrency limit: with C runs at once per
//!   worker, each needing `turns` calls of `latency-ms`, no server can finish more than
//!   `workers × C / (turns × latency)` runs per second;
//! * p50 and p99 submit latency (the POST, seen by the client) and run latency (enqueue
//!   to the run's last commit, from the store's timestamps);
//! * memory per in-flight run: the servers' peak resident memory above their idle
//!   resident memory, divided by the runs they executed at once.
//!
//! Not a test: it asserts nothing but that every run completed.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use serde_json::{Value as Json, json};

const TOKEN: &str = "bench-token";

struct Options {
    aplc: String,
    runs: usize,
    turns: u64,
    latency_ms: u64,
    max_concurrent: usize,
    store: String,
    workers: usize,
}

fn options() -> Options {
    let mut args = std::env::args().skip(1);
    let mut options = Options {
        aplc: String::new(),
        runs: 1000,
        turns: 2,
        latency_ms: 20,
        max_concurrent: 16,
        store: "sqlite".into(),
        workers: 1,
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--runs" => options.runs = value().parse().expect("--runs N"),
            "--turns" => options.turns = value().parse().expect("--turns N"),
            "--latency-ms" => options.latency_ms = value().parse().expect("--latency-ms N"),
            "--max-concurrent-runs" => {
                options.max_concurrent = value().parse().expect("--max-concurrent-runs N")
            }
            "--store" => options.store = value(),
            "--workers" => options.workers = value().parse().expect("--workers N"),
            _ => options.aplc = arg,
        }
    }
    assert!(
        !options.aplc.is_empty(),
        "usage: serve_load PATH/TO/aplc [options]"
    );
    // The servers run in a scratch directory.
    options.aplc = std::fs::canonicalize(&options.aplc)
        .expect("the aplc binary")
        .display()
        .to_string();
    options
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let options = options();
    let model = start_model(options.latency_ms).await;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("agents")).expect("agents dir");
    std::fs::write(
        dir.path().join("agents/load.apl"),
        "{# inputs: turns #}\n# pre: work\n{{ inc_context('turn') }}\n\n# prompt: work\n## user\n\
         Turn {{ turn }}.\n\n# post: work\n{% if turn < turns %}{{ set_context('next_step', \
         'work') }}{% endif %}\n",
    )
    .expect("agent");
    let providers = json!({"routes": [{"model": "*", "kind": "openai", "base_url": model.url}]});
    std::fs::write(dir.path().join("providers.json"), providers.to_string()).expect("providers");
    let store = if options.store == "sqlite" {
        "sqlite:runs.db".to_string()
    } else {
        options.store.clone()
    };
    let servers: Vec<Server> = (0..options.workers)
        .map(|_| start_server(&options, dir.path(), &store))
        .collect();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(2048)
        .build()
        .expect("client");
    // Warm up (one run per server) so idle memory includes a run's one-time costs.
    for Server(_, url) in &servers {
        submit(&http, url, options.turns, true).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle: Vec<u64> = servers.iter().map(|s| rss_kib(s.0.id(), "VmRSS")).collect();
    let cpu_before: Vec<f64> = servers.iter().map(|s| cpu_ms(s.0.id())).collect();
    let own_cpu_before = cpu_ms(std::process::id());
    let served_before = model.served();
    // A store used before holds other runs: count from here.
    let baseline = completed_runs(&http, &servers[0].1).await;

    let machine_before = machine_ticks();
    let started = Instant::now();
    let submits: Vec<_> = (0..options.runs)
        .map(|i| {
            let http = http.clone();
            let url = servers[i % servers.len()].1.clone();
            let turns = options.turns;
            tokio::spawn(async move {
                let at = Instant::now();
                let id = submit(&http, &url, turns, false).await;
                (id, at.elapsed())
            })
        })
        .collect();
    let mut ids = Vec::new();
    let mut submit_latency = Vec::new();
    for task in submits {
        let (id, latency) = task.await.expect("submit task");
        ids.push(id);
        submit_latency.push(latency.as_secs_f64() * 1000.0);
    }
    let submitted = started.elapsed();
    let url = servers[0].1.clone();
    loop {
        let completed = completed_runs(&http, &url).await;
        if completed >= baseline + options.runs {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "only {completed} completed"
        );
        // Every poll costs the server a count of its queue: poll seldom until the last
        // runs, then often, so the end is seen at most 2 ms late.
        let left = (baseline + options.runs).saturating_sub(completed);
        let pause = if left > 2 * options.workers * options.max_concurrent {
            50
        } else {
            2
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    let elapsed = started.elapsed();
    let machine = machine_busy(&machine_before);
    let peak: Vec<u64> = servers.iter().map(|s| rss_kib(s.0.id(), "VmHWM")).collect();
    let server_cpu: f64 = servers
        .iter()
        .zip(&cpu_before)
        .map(|(s, before)| cpu_ms(s.0.id()) - before)
        .sum();
    let own_cpu = cpu_ms(std::process::id()) - own_cpu_before;
    let (calls, mean_latency) = model.served_since(served_before);
    let mut run_latency = Vec::new();
    let mut ends = Vec::new();
    for id in &ids {
        let run: Json = http
            .get(format!("{url}/v1/runs/{id}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("GET run")
            .json()
            .await
            .expect("run JSON");
        assert_eq!(run["status"], "completed", "{run}");
        let created = run["created_at_ms"].as_i64().unwrap_or(0);
        let updated = run["updated_at_ms"].as_i64().unwrap_or(0);
        run_latency.push((updated - created) as f64);
        ends.push(updated);
    }
    drop(servers);

    let throughput = options.runs as f64 / elapsed.as_secs_f64();
    let bound = (options.workers * options.max_concurrent) as f64
        / (options.turns as f64 * options.latency_ms as f64 / 1000.0);
    let in_flight = (options.workers * options.max_concurrent) as f64;
    let grown: u64 = peak
        .iter()
        .zip(&idle)
        .map(|(p, i)| p.saturating_sub(*i))
        .sum();
    println!(
        "{} runs × {} calls of {} ms, {} worker(s) × {} at once, store {}",
        options.runs,
        options.turns,
        options.latency_ms,
        options.workers,
        options.max_concurrent,
        if options.store == "sqlite" {
            "sqlite"
        } else {
            "postgres"
        }
    );
    println!(
        "throughput {throughput:.1} runs/s; latency bound {bound:.1} runs/s; {:.1} % of the bound",
        100.0 * throughput / bound
    );
    // The same between the 10th and the 90th percentile of the runs' ends (the store's
    // timestamps): the rate once every slot is busy, without the start (the submits
    // and the first claims share the cores) and the last runs' drain.
    ends.sort_unstable();
    let (first, last) = (ends.len() / 10, ends.len() * 9 / 10);
    if let (Some(from), Some(to)) = (ends.get(first), ends.get(last))
        && to > from
    {
        let steady = (last - first) as f64 / ((to - from) as f64 / 1000.0);
        println!(
            "steady state (10th to 90th percentile of the ends): {steady:.1} runs/s; {:.1} % of the bound",
            100.0 * steady / bound
        );
    }
    println!(
        "all submitted in {:.0} ms; all completed in {:.0} ms",
        submitted.as_secs_f64() * 1000.0,
        elapsed.as_secs_f64() * 1000.0
    );
    println!(
        "submit latency p50 {:.1} ms, p99 {:.1} ms; run latency (queued to done) p50 {:.0} ms, p99 {:.0} ms",
        percentile(&mut submit_latency, 0.50),
        percentile(&mut submit_latency, 0.99),
        percentile(&mut run_latency, 0.50),
        percentile(&mut run_latency, 0.99),
    );
    println!(
        "memory: idle {} KiB, peak {} KiB (per server); {:.0} KiB per in-flight run",
        idle.iter().sum::<u64>() / idle.len() as u64,
        peak.iter().sum::<u64>() / peak.len() as u64,
        grown as f64 / in_flight
    );
    println!(
        "cpu: servers {:.2} ms per run; this harness (client and fake model) {:.2} ms per run",
        server_cpu / options.runs as f64,
        own_cpu / options.runs as f64
    );
    println!(
        "fake model: {calls} calls, mean {mean_latency:.2} ms from request to answer (nominal {} ms)",
        options.latency_ms
    );
    println!(
        "machine: {:.0} % of its {} cores busy from the first submit to the last run's end \
         (servers, store, this harness and anything else running)",
        machine.0 * 100.0,
        machine.1
    );
}

/// The `cpu` line of /proc/stat: busy and total ticks, and the number of cores.
fn machine_ticks() -> (u64, u64, usize) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cores = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let total: u64 = ticks.iter().sum();
    // idle and iowait are the fourth and fifth.
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (total - idle, total, cores)
}

/// The share of the machine's CPU time that was busy since `before`, and its cores.
fn machine_busy(before: &(u64, u64, usize)) -> (f64, usize) {
    let now = machine_ticks();
    let busy = now.0.saturating_sub(before.0) as f64;
    let total = now.1.saturating_sub(before.1).max(1) as f64;
    (busy / total, now.2)
}

/// The CPU time (user + system) process `pid` has used so far, in ms.
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; in
    // clock ticks, 100 per second on Linux.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks * 10.0
}

/// Submits one run; its id.
async fn submit(http: &reqwest::Client, url: &str, turns: u64, wait: bool) -> String {
    let path = if wait { "?wait=true" } else { "" };
    let response = http
        .post(format!("{url}/v1/agents/load/runs{path}"))
        .bearer_auth(TOKEN)
        .json(&json!({"context": {"turns": turns}}))
        .send()
        .await
        .expect("POST");
    let status = response.status();
    let body: Json = response.json().await.expect("JSON");
    assert!(status.is_success(), "{status} {body}");
    body["run_id"].as_str().expect("run_id").to_string()
}

/// `aplc_runs{status="completed"}` from the server's metrics.
async fn completed_runs(http: &reqwest::Client, url: &str) -> usize {
    let Ok(response) = http
        .get(format!("{url}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
    else {
        return 0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("aplc_runs{status=\"completed\"} "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A running `aplc serve` and its URL, killed when dropped (a panic included).
struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(options: &Options, dir: &std::path::Path, store: &str) -> Server {
    let mut child = Command::new(&options.aplc)
        .current_dir(dir)
        .args(["serve", "--agents", "agents", "--store", store])
        .args(["--listen", "127.0.0.1:0", "--providers", "providers.json"])
        .args(["--max-concurrent-runs", &options.max_concurrent.to_string()])
        .args(["--wait-timeout-ms", "600000"])
        .env("APLC_SERVE_TOKENS", TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn aplc serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("address");
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("aplc serve did not start: {line:?}"))
        .to_string();
    Server(child, url)
}

/// A line of /proc/PID/status, in KiB.
fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    values.get(index).copied().unwrap_or(0.0)
}

/// A fake OpenAI-compatible model on 127.0.0.1.
struct Model {
    url: String,
    /// Calls answered, and the sum of their latencies in µs.
    served: Arc<(AtomicU64, AtomicU64)>,
}

impl Model {
    fn served(&self) -> (u64, u64) {
        (
            self.served.0.load(Ordering::Relaxed),
            self.served.1.load(Ordering::Relaxed),
        )
    }

    /// Calls answered since `before` (a [`Model::served`]), and their mean latency in ms.
    fn served_since(&self, before: (u64, u64)) -> (u64, f64) {
        let (calls, micros) = self.served();
        let (calls, micros) = (calls - before.0, micros - before.1);
        (calls, micros as f64 / 1000.0 / calls.max(1) as f64)
    }
}

/// A fake OpenAI-compatible model: every completion after `latency_ms`.
///
/// The wait is a blocking thread's sleep, not a tokio timer: tokio's timer wheel has a
/// resolution of 1 ms and rounds up, which made the model's 20 ms about 21 and charged the
/// server for the model's lateness. The mean latency it really had is printed.
async fn start_model(latency_ms: u64) -> Model {
    let latency = Duration::from_millis(latency_ms);
    let served = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let counters = served.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let counters = counters.clone();
            async move {
                let at = Instant::now();
                let _ = tokio::task::spawn_blocking(move || {
                    std::thread::sleep(latency.saturating_sub(at.elapsed()))
                })
                .await;
                counters.0.fetch_add(1, Ordering::Relaxed);
                counters
                    .1
                    .fetch_add(at.elapsed().as_micros() as u64, Ordering::Relaxed);
                axum::Json(json!({
                    "id": "cmpl",
                    "object": "chat.completion",
                    "model": "fake",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "ok"}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    // As a model server would: no Nagle delay on the answers.
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream| {
        let _ = stream.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Model { url, served }
}
