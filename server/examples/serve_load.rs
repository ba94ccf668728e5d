//! The load benchmark of `aplc serve` (issue #14 §5; figures in benches/README.md).
//!
//! ```sh
//! cargo build --release -p aplc
//! cargo run --release -p aplc-server --example serve_load -- target/release/aplc \
//!     [--runs 1000] [--turns 2] [--latency-ms 20] [--max-concurrent-runs 16] \
//!     [--store sqlite|postgres://…] [--workers 1] [--clients N]
//! # issue #24's shape: 300 runs × 20 calls of 20 ms, 50 at once, 50 clients waiting
//! cargo run --release -p aplc-server --example serve_load -- target/release/aplc --scenario issue24
//! ```
//!
//! Starts a fake OpenAI-compatible model on 127.0.0.1 in a process of its own (this
//! example, run again with `--fake-model MS`) that answers every call after `latency-ms`,
//! starts `workers` `aplc serve` processes on one store (SQLite for one worker; a
//! PostgreSQL URL for more), and submits `runs` runs of a `turns`-call agent over HTTP:
//!
//! * without `--clients`, all at once (`POST …/runs`), then waits until every run has
//!   completed;
//! * with `--clients N`, as N users would: N clients, each submitting with `?wait=true`
//!   and sending its next run when the answer (the finished run) arrives, so N requests
//!   are in flight until the last runs.
//!
//! Prints:
//!
//! * throughput, and the latency bound at the concurrency limit: with C runs at once per
//!   worker, each needing `turns` calls of `latency-ms`, no server can finish more than
//!   `workers × C / (turns × latency)` runs per second;
//! * p50 and p99 submit latency (the POST, seen by the client) and run latency (enqueue
//!   to the run's last commit, from the store's timestamps);
//! * memory per in-flight run: the servers' peak resident memory above their idle
//!   resident memory, divided by the runs they executed at once;
//! * where a run's time went, from its journaled events (means and p50 per run): in the
//!   queue and being claimed (created to the machine's start, and the last commit),
//!   running (the machine's `elapsed_ms`), of which waiting for the model (the
//!   `latency_ms` of its calls) and the rest (executor, journal, HTTP client); with
//!   `--clients`, the client's wait beyond the run's stored end (the answer's way back);
//!   and journal commits per run (`aplc_journal_commits_total`, when the server has it).
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
    /// Clients submitting with `?wait=true`, one run at a time each; 0: all at once.
    clients: usize,
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
        clients: 0,
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
            "--clients" => options.clients = value().parse().expect("--clients N"),
            "--scenario" => match value().as_str() {
                // Issue #24: users each waiting for their run, 50 at once, runs of 20
                // calls; the latency bound is 50 / (20 × 20 ms) = 125 runs/s.
                "issue24" => {
                    options.runs = 300;
                    options.turns = 20;
                    options.latency_ms = 20;
                    options.max_concurrent = 50;
                    options.clients = 50;
                }
                other => panic!("unknown scenario `{other}` (known: issue24)"),
            },
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
    // The fake model's own process: this example, run again.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--fake-model") {
        let latency = args.get(2).and_then(|ms| ms.parse().ok()).unwrap_or(20);
        return serve_model(latency).await;
    }
    let options = options();
    let model = Model::start(options.latency_ms);
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
    let urls: Vec<String> = servers.iter().map(|s| s.1.clone()).collect();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(2048)
        .build()
        .expect("client");
    // Warm up (one run per server) so idle memory includes a run's one-time costs.
    for url in &urls {
        submit(&http, url, options.turns, true).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle: Vec<u64> = servers.iter().map(|s| rss_kib(s.0.id(), "VmRSS")).collect();
    let cpu_before: Vec<f64> = servers.iter().map(|s| cpu_ms(s.0.id())).collect();
    let own_cpu_before = cpu_ms(std::process::id());
    let model_cpu_before = cpu_ms(model.child.id());
    let served_before = model.served(&http).await;
    let commits_before = journal_commits(&http, &urls).await;

    let machine_before = machine_ticks();
    let started = Instant::now();
    let submitted = if options.clients > 0 {
        closed_loop(&http, &urls, &options).await
    } else {
        open_loop(&http, &urls, &options, started).await
    };
    let elapsed = started.elapsed();
    let machine = machine_busy(&machine_before);
    let peak: Vec<u64> = servers.iter().map(|s| rss_kib(s.0.id(), "VmHWM")).collect();
    let server_cpu: f64 = servers
        .iter()
        .zip(&cpu_before)
        .map(|(s, before)| cpu_ms(s.0.id()) - before)
        .sum();
    let own_cpu = cpu_ms(std::process::id()) - own_cpu_before;
    let model_cpu = cpu_ms(model.child.id()) - model_cpu_before;
    let (calls, mean_latency) = model.served_since(&http, served_before).await;
    let commits = journal_commits(&http, &urls)
        .await
        .zip(commits_before)
        .map(|(after, before)| after - before);
    let runs = read_runs(&http, &urls[0], &submitted).await;
    drop(servers);

    let runs_f = options.runs as f64;
    let throughput = runs_f / elapsed.as_secs_f64();
    let bound = (options.workers * options.max_concurrent) as f64
        / (options.turns as f64 * options.latency_ms as f64 / 1000.0);
    let in_flight = (options.workers * options.max_concurrent) as f64;
    let grown: u64 = peak
        .iter()
        .zip(&idle)
        .map(|(p, i)| p.saturating_sub(*i))
        .sum();
    println!(
        "{} runs × {} calls of {} ms, {} worker(s) × {} at once, store {}, {}",
        options.runs,
        options.turns,
        options.latency_ms,
        options.workers,
        options.max_concurrent,
        if options.store == "sqlite" {
            "sqlite"
        } else {
            "postgres"
        },
        if options.clients > 0 {
            format!(
                "{} clients each waiting for its run (?wait=true)",
                options.clients
            )
        } else {
            "all submitted at once".to_string()
        }
    );
    println!(
        "throughput {throughput:.1} runs/s; latency bound {bound:.1} runs/s; {:.1} % of the bound",
        100.0 * throughput / bound
    );
    print_steady(&runs, bound);
    println!(
        "all submitted in {:.0} ms; all completed in {:.0} ms",
        submitted.all_sent.as_secs_f64() * 1000.0,
        elapsed.as_secs_f64() * 1000.0
    );
    let mut submit_latency = submitted.latency.clone();
    let mut run_latency: Vec<f64> = runs.iter().map(|r| r.stored_ms).collect();
    println!(
        "{} latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; run latency (queued to done) p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        if options.clients > 0 {
            "request (submit to finished run)"
        } else {
            "submit"
        },
        percentile(&mut submit_latency, 0.50),
        percentile(&mut submit_latency, 0.99),
        percentile(&mut submit_latency, 1.0),
        percentile(&mut run_latency, 0.50),
        percentile(&mut run_latency, 0.99),
        percentile(&mut run_latency, 1.0),
    );
    print_breakdown(&runs, &submitted, options.clients > 0, commits, runs_f);
    println!(
        "memory: idle {} KiB, peak {} KiB (per server); {:.0} KiB per in-flight run",
        idle.iter().sum::<u64>() / idle.len() as u64,
        peak.iter().sum::<u64>() / peak.len() as u64,
        grown as f64 / in_flight
    );
    println!(
        "cpu per run: servers {:.2} ms; fake model {:.2} ms; this client {:.2} ms",
        server_cpu / runs_f,
        model_cpu / runs_f,
        own_cpu / runs_f
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

/// What the client saw of the runs it submitted, in submit order.
struct Submitted {
    ids: Vec<String>,
    /// Per run, in ms: the POST (without `--clients`), or the POST until its answer, the
    /// finished run (with).
    latency: Vec<f64>,
    /// From the first submit to the last one's answer.
    all_sent: Duration,
}

/// Submits every run at once, then polls the metrics until all have completed.
async fn open_loop(
    http: &reqwest::Client,
    urls: &[String],
    options: &Options,
    started: Instant,
) -> Submitted {
    // A store used before holds other runs: count from here.
    let baseline = completed_runs(http, &urls[0]).await;
    let submits: Vec<_> = (0..options.runs)
        .map(|i| {
            let http = http.clone();
            let url = urls[i % urls.len()].clone();
            let turns = options.turns;
            tokio::spawn(async move {
                let at = Instant::now();
                let id = submit(&http, &url, turns, false).await;
                (id, at.elapsed())
            })
        })
        .collect();
    let mut submitted = Submitted {
        ids: Vec::new(),
        latency: Vec::new(),
        all_sent: Duration::ZERO,
    };
    for task in submits {
        let (id, latency) = task.await.expect("submit task");
        submitted.ids.push(id);
        submitted.latency.push(latency.as_secs_f64() * 1000.0);
    }
    submitted.all_sent = started.elapsed();
    loop {
        let completed = completed_runs(http, &urls[0]).await;
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
    submitted
}

/// `options.clients` clients, each submitting with `?wait=true` and sending its next
/// run when the finished run comes back, until `options.runs` are done.
async fn closed_loop(http: &reqwest::Client, urls: &[String], options: &Options) -> Submitted {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..options.clients)
        .map(|client| {
            let (http, next) = (http.clone(), next.clone());
            let url = urls[client % urls.len()].clone();
            let (turns, runs) = (options.turns, options.runs as u64);
            tokio::spawn(async move {
                let mut done = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < runs {
                    let at = Instant::now();
                    let id = submit(&http, &url, turns, true).await;
                    done.push((id, at.elapsed().as_secs_f64() * 1000.0));
                }
                done
            })
        })
        .collect();
    let mut submitted = Submitted {
        ids: Vec::new(),
        latency: Vec::new(),
        all_sent: Duration::ZERO,
    };
    for client in clients {
        for (id, latency) in client.await.expect("client task") {
            submitted.ids.push(id);
            submitted.latency.push(latency);
        }
    }
    submitted.all_sent = started.elapsed();
    submitted
}

/// A finished run as the store and its journaled events tell it, in ms.
struct RunTimes {
    /// Created (the submit) to its last commit: `updated_at_ms - created_at_ms`.
    stored_ms: f64,
    /// Its last commit, on the store's clock (ms since the epoch).
    end_ms: i64,
    /// The machine's time from its start (after the claim) to its end.
    running_ms: f64,
    /// The provider calls' `latency_ms`, summed.
    model_ms: f64,
}

/// Every submitted run's times, after checking it completed.
async fn read_runs(http: &reqwest::Client, url: &str, submitted: &Submitted) -> Vec<RunTimes> {
    let mut runs = Vec::new();
    for id in &submitted.ids {
        let run: Json = get(http, &format!("{url}/v1/runs/{id}"))
            .await
            .json()
            .await
            .expect("run JSON");
        assert_eq!(run["status"], "completed", "{run}");
        let created = run["created_at_ms"].as_i64().unwrap_or(0);
        let updated = run["updated_at_ms"].as_i64().unwrap_or(0);
        let events = get(http, &format!("{url}/v1/runs/{id}/events"))
            .await
            .text()
            .await
            .expect("events");
        let (mut running_ms, mut model_ms) = (0.0, 0.0);
        for event in events.lines().filter_map(|l| l.strip_prefix("data: ")) {
            let event: Json = serde_json::from_str(event).expect("event JSON");
            match event["type"].as_str() {
                Some("provider_result") => model_ms += event["latency_ms"].as_f64().unwrap_or(0.0),
                Some("run_finished") => {
                    running_ms = event["totals"]["elapsed_ms"].as_f64().unwrap_or(0.0)
                }
                _ => {}
            }
        }
        runs.push(RunTimes {
            stored_ms: (updated - created) as f64,
            end_ms: updated,
            running_ms,
            model_ms,
        });
    }
    runs
}

async fn get(http: &reqwest::Client, url: &str) -> reqwest::Response {
    http.get(url).bearer_auth(TOKEN).send().await.expect("GET")
}

/// The rate between the 10th and the 90th percentile of the runs' ends (the store's
/// timestamps): the rate once every slot is busy, without the start (the submits and the
/// first claims share the cores) and the last runs' drain.
fn print_steady(runs: &[RunTimes], bound: f64) {
    let mut ends: Vec<i64> = runs.iter().map(|r| r.end_ms).collect();
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
}

/// Where a run's time went: mean and p50 of each part.
fn print_breakdown(
    runs: &[RunTimes],
    submitted: &Submitted,
    waited: bool,
    commits: Option<u64>,
    runs_f: f64,
) {
    let part = |f: &dyn Fn(&RunTimes) -> f64| {
        let mut values: Vec<f64> = runs.iter().map(f).collect();
        let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
        format!("{mean:.1} / {:.1}", percentile(&mut values, 0.5))
    };
    println!(
        "per run, mean / p50 ms: queued, claimed and last commit {}; running {} \
         (waiting for the model {}, the rest {})",
        part(&|r| r.stored_ms - r.running_ms),
        part(&|r| r.running_ms),
        part(&|r| r.model_ms),
        part(&|r| r.running_ms - r.model_ms),
    );
    if waited {
        let mut beyond: Vec<f64> = runs
            .iter()
            .zip(&submitted.latency)
            .map(|(run, latency)| latency - run.stored_ms)
            .collect();
        let mean = beyond.iter().sum::<f64>() / beyond.len().max(1) as f64;
        println!(
            "per request, mean / p50 ms: the client's wait beyond the run's stored life \
             (the POST, its enqueue, the wake-up of ?wait=true, the answer) {mean:.1} / {:.1}",
            percentile(&mut beyond, 0.5)
        );
    }
    match commits {
        Some(commits) => println!(
            "journal commits per run: {:.1} (aplc_journal_commits_total)",
            commits as f64 / runs_f
        ),
        None => {
            println!("journal commits per run: n/a (the server has no aplc_journal_commits_total)")
        }
    }
}

/// The servers' `aplc_journal_commits_total`, summed; `None` if one lacks it.
async fn journal_commits(http: &reqwest::Client, urls: &[String]) -> Option<u64> {
    let mut total = 0;
    for url in urls {
        total += metric(http, url, "aplc_journal_commits_total ").await? as u64;
    }
    Some(total)
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
    metric(http, url, "aplc_runs{status=\"completed\"} ")
        .await
        .unwrap_or(0.0) as usize
}

/// The value of the metrics line starting with `prefix`, if the server has it.
async fn metric(http: &reqwest::Client, url: &str, prefix: &str) -> Option<f64> {
    let response = http
        .get(format!("{url}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .ok()?;
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|n| n.trim().parse().ok())
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

/// The fake OpenAI-compatible model, in a process of its own (so that its work competes
/// with the server's as another program's would, and its CPU time is counted apart),
/// killed when dropped.
struct Model {
    child: Child,
    url: String,
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Model {
    /// Runs this example again as the model; its URL is the first line it prints.
    fn start(latency_ms: u64) -> Model {
        let mut child = Command::new(std::env::current_exe().expect("this example"))
            .args(["--fake-model", &latency_ms.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the fake model");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("the model's address");
        let url = line.trim().to_string();
        assert!(
            url.starts_with("http://"),
            "the fake model did not start: {line:?}"
        );
        Model { child, url }
    }

    /// Calls answered so far, and the sum of their latencies in µs.
    async fn served(&self, http: &reqwest::Client) -> (u64, u64) {
        let stats: Json = get(http, &format!("{}/stats", self.url))
            .await
            .json()
            .await
            .expect("the model's stats");
        let field = |name: &str| stats[name].as_u64().unwrap_or(0);
        (field("calls"), field("micros"))
    }

    /// Calls answered since `before` (a [`Model::served`]), and their mean latency in ms.
    async fn served_since(&self, http: &reqwest::Client, before: (u64, u64)) -> (u64, f64) {
        let (calls, micros) = self.served(http).await;
        let (calls, micros) = (calls - before.0, micros - before.1);
        (calls, micros as f64 / 1000.0 / calls.max(1) as f64)
    }
}

/// The fake model's process (`--fake-model MS`): every completion after `latency_ms`,
/// and `GET /stats` (calls answered, the sum of their latencies in µs). Prints its URL.
///
/// The wait is a blocking thread's sleep, not a tokio timer: tokio's timer wheel has a
/// resolution of 1 ms and rounds up, which made the model's 20 ms about 21 and charged the
/// server for the model's lateness. The mean latency it really had is printed.
async fn serve_model(latency_ms: u64) {
    let latency = Duration::from_millis(latency_ms);
    let served = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let counters = served.clone();
    let app = Router::new()
        .route(
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
        )
        .route(
            "/stats",
            axum::routing::get(move || async move {
                axum::Json(json!({
                    "calls": served.0.load(Ordering::Relaxed),
                    "micros": served.1.load(Ordering::Relaxed),
                }))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    println!("http://{}", listener.local_addr().expect("address"));
    // As a model server would: no Nagle delay on the answers.
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream| {
        let _ = stream.set_nodelay(true);
    });
    let _ = axum::serve(listener, app).await;
}
