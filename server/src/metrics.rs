//! `/metrics`: Prometheus text format, written by hand (a few counters and one histogram
//! need no crate).
//!
//! Runs by status and the queue depth come from the store, so they count every process's
//! runs; steps, provider calls, latencies and tokens are counted from the events of the
//! runs this process executes (a resumed run counts only what it does after the resume).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aplc_runtime::mcp::ServerHealth;
use aplc_runtime::store::{JournalTimings, QueueCounts, QueueStatus};
use aplc_vm::{Event, EventKind};

/// Upper bounds of the provider latency histogram, in seconds.
const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// This process's counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    steps: AtomicU64,
    provider_calls: AtomicU64,
    provider_errors: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    tool_calls: AtomicU64,
    /// Counts per bucket (not cumulative), then the +Inf bucket.
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    latency_sum_us: AtomicU64,
    pub(crate) runs_in_flight: AtomicU64,
    pub(crate) runs_started: AtomicU64,
    /// Journal appends of this process's runs (each one commit of the run's store), and
    /// the time the runs waited for them.
    journal_commits: AtomicU64,
    journal_commit_us: AtomicU64,
}

impl Metrics {
    /// Counts what an event (its JSON form, spec/events.md) says.
    pub(crate) fn on_event(&self, event: &Event) {
        match &event.kind {
            EventKind::StepStarted { .. } => {
                self.steps.fetch_add(1, Ordering::Relaxed);
            }
            EventKind::ToolCall { .. } => {
                self.tool_calls.fetch_add(1, Ordering::Relaxed);
            }
            EventKind::ProviderResult {
                usage,
                latency_ms,
                error,
                ..
            } => {
                self.provider_calls.fetch_add(1, Ordering::Relaxed);
                if error.is_some() {
                    self.provider_errors.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(usage) = usage {
                    self.input_tokens
                        .fetch_add(usage.input_tokens, Ordering::Relaxed);
                    self.output_tokens
                        .fetch_add(usage.output_tokens, Ordering::Relaxed);
                }
                let seconds = latency_ms / 1000.0;
                let bucket = LATENCY_BUCKETS
                    .iter()
                    .position(|bound| seconds <= *bound)
                    .unwrap_or(LATENCY_BUCKETS.len());
                self.latency_buckets[bucket].fetch_add(1, Ordering::Relaxed);
                // Microseconds, so that an atomic integer keeps the sum.
                self.latency_sum_us
                    .fetch_add((latency_ms * 1000.0) as u64, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// The exposition text, with the store's counts (`None`: the store did not answer,
    /// and those series are left out rather than shown as zero).
    pub(crate) fn render(&self, queue: Option<&QueueCounts>) -> String {
        let mut out = String::new();
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        if let Some(queue) = queue {
            header(
                &mut out,
                "aplc_runs",
                "gauge",
                "Runs in the store's queue, by status.",
            );
            for status in QueueStatus::ALL {
                let _ = writeln!(
                    out,
                    "aplc_runs{{status=\"{}\"}} {}",
                    status.as_str(),
                    queue.get(status)
                );
            }
            header(
                &mut out,
                "aplc_queue_depth",
                "gauge",
                "Runs waiting for a worker.",
            );
            let _ = writeln!(out, "aplc_queue_depth {}", queue.get(QueueStatus::Queued));
        }
        let counters = [
            (
                "aplc_runs_in_flight",
                "gauge",
                "Runs this process executes now.",
                load(&self.runs_in_flight),
            ),
            (
                "aplc_runs_started_total",
                "counter",
                "Runs this process started or resumed.",
                load(&self.runs_started),
            ),
            (
                "aplc_steps_total",
                "counter",
                "Steps entered by this process's runs.",
                load(&self.steps),
            ),
            (
                "aplc_provider_calls_total",
                "counter",
                "Provider calls answered (or failed).",
                load(&self.provider_calls),
            ),
            (
                "aplc_provider_errors_total",
                "counter",
                "Provider calls that failed.",
                load(&self.provider_errors),
            ),
            (
                "aplc_tool_calls_total",
                "counter",
                "Tool calls started.",
                load(&self.tool_calls),
            ),
            (
                "aplc_journal_commits_total",
                "counter",
                "Journal appends (commits) of this process's runs.",
                load(&self.journal_commits),
            ),
        ];
        for (name, kind, help, value) in counters {
            header(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {value}");
        }
        header(
            &mut out,
            "aplc_tokens_total",
            "counter",
            "Tokens the providers reported.",
        );
        let _ = writeln!(
            out,
            "aplc_tokens_total{{direction=\"input\"}} {}",
            load(&self.input_tokens)
        );
        let _ = writeln!(
            out,
            "aplc_tokens_total{{direction=\"output\"}} {}",
            load(&self.output_tokens)
        );
        header(
            &mut out,
            "aplc_provider_latency_seconds",
            "histogram",
            "Provider call latency.",
        );
        let mut cumulative = 0;
        for (bound, count) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            cumulative += load(count);
            let _ = writeln!(
                out,
                "aplc_provider_latency_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += load(&self.latency_buckets[LATENCY_BUCKETS.len()]);
        let _ = writeln!(
            out,
            "aplc_provider_latency_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let sum = load(&self.latency_sum_us) as f64 / 1_000_000.0;
        let _ = writeln!(out, "aplc_provider_latency_seconds_sum {sum}");
        let _ = writeln!(out, "aplc_provider_latency_seconds_count {cumulative}");
        header(
            &mut out,
            "aplc_journal_commit_seconds_total",
            "counter",
            "Time this process's runs spent waiting for their journal appends.",
        );
        let commit_seconds = load(&self.journal_commit_us) as f64 / 1_000_000.0;
        let _ = writeln!(out, "aplc_journal_commit_seconds_total {commit_seconds}");
        out
    }
}

/// The service's runs count their journal's appends (commits) into the metrics: how many
/// commits a run costs, seen from outside (`aplc_journal_commits_total` over the runs
/// finished), through a [`TimedJournal`](aplc_runtime::store::TimedJournal).
impl JournalTimings for Metrics {
    fn appended(&self, took: Duration) {
        self.journal_commits.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.journal_commit_us.fetch_add(micros, Ordering::Relaxed);
    }
}

/// The MCP servers' series (none without servers): whether each is up, and its
/// restarts (spec/serve.md, spec/mcp.md).
pub(crate) fn render_mcp(out: &mut String, servers: &[ServerHealth]) {
    if servers.is_empty() {
        return;
    }
    header(
        out,
        "aplc_mcp_server_up",
        "gauge",
        "Whether the MCP server's session is up (0 while it restarts).",
    );
    for server in servers {
        let name = label(&server.server);
        let _ = writeln!(
            out,
            "aplc_mcp_server_up{{server=\"{name}\"}} {}",
            u8::from(server.up)
        );
    }
    header(
        out,
        "aplc_mcp_server_restarts_total",
        "counter",
        "Times the MCP server was restarted after its session ended.",
    );
    for server in servers {
        let name = label(&server.server);
        let _ = writeln!(
            out,
            "aplc_mcp_server_restarts_total{{server=\"{name}\"}} {}",
            server.restarts
        );
    }
}

/// A label value as the text format writes it: backslash, quote and newline escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_provider_results_into_the_histogram() {
        let metrics = Metrics::default();
        let event =
            |json: serde_json::Value| -> Event { serde_json::from_value(json).expect("an event") };
        metrics.on_event(&event(
            json!({"seq": 1, "t_ms": 0.0, "type": "step_started", "step": "a", "runs": 0}),
        ));
        metrics.on_event(&event(json!({
            "seq": 2, "t_ms": 1.0, "type": "provider_result", "step": "a",
            "latency_ms": 30.5, "error": null, "finish_reason": "stop",
            "usage": {"input_tokens": 7, "output_tokens": 3}
        })));
        metrics.on_event(&event(json!({
            "seq": 3, "t_ms": 2.0, "type": "provider_result", "step": "a", "usage": null,
            "finish_reason": null, "latency_ms": 60000.0,
            "error": {"kind": "server", "message": "down"}
        })));
        let mut queue = QueueCounts::default();
        queue.by_status.push((QueueStatus::Queued, 4));
        let text = metrics.render(Some(&queue));
        for line in [
            "aplc_runs{status=\"queued\"} 4",
            "aplc_runs{status=\"failed\"} 0",
            "aplc_queue_depth 4",
            "aplc_steps_total 1",
            "aplc_provider_calls_total 2",
            "aplc_provider_errors_total 1",
            "aplc_tokens_total{direction=\"input\"} 7",
            "aplc_provider_latency_seconds_bucket{le=\"0.025\"} 0",
            "aplc_provider_latency_seconds_bucket{le=\"0.05\"} 1",
            "aplc_provider_latency_seconds_bucket{le=\"30\"} 1",
            "aplc_provider_latency_seconds_bucket{le=\"+Inf\"} 2",
            "aplc_provider_latency_seconds_count 2",
            "aplc_journal_commits_total 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
    }

    #[test]
    fn mcp_servers_show_up_and_restarts_with_escaped_names() {
        let mut text = String::new();
        render_mcp(&mut text, &[]);
        assert_eq!(text, "", "no series without servers");
        let health = |server: &str, up, restarts| {
            let mut health = ServerHealth::default();
            health.server = server.into();
            health.up = up;
            health.restarts = restarts;
            health
        };
        render_mcp(
            &mut text,
            &[health("a", true, 0), health("q\"b\\", false, 3)],
        );
        for line in [
            "aplc_mcp_server_up{server=\"a\"} 1",
            "aplc_mcp_server_up{server=\"q\\\"b\\\\\"} 0",
            "aplc_mcp_server_restarts_total{server=\"q\\\"b\\\\\"} 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
    }
}
