//! `--otel`: exporting a run's spans and metrics over OTLP/HTTP (spec/telemetry.md).
//!
//! Off unless `--otel` is given or an OTLP endpoint variable is set: then nothing is
//! built, and the run has no telemetry listener and no provider wrapper.

use std::time::Duration;

use aplc_runtime::Redactor;
use aplc_runtime::telemetry::{
    Parent, RunDetails, RunTrace, Telemetry, TelemetryConfig, TelemetryFlags,
};
use clap::Args;

use crate::Failure;

/// How long `aplc run` waits at exit for the last spans and metrics to be sent.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The telemetry flags of `aplc run` and `aplc resume`.
#[derive(Args, Debug)]
pub(crate) struct TelemetryArgs {
    /// Export the run's spans and metrics over OTLP/HTTP to $OTEL_EXPORTER_OTLP_ENDPOINT
    /// (default http://localhost:4318). Without the flag, export is on when that variable
    /// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set.
    #[arg(long)]
    otel: bool,
    /// Record prompts and completions on the exported spans, redacted (as
    /// OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true does).
    #[arg(long)]
    otel_content: bool,
}

impl TelemetryArgs {
    /// The exporter pipeline, if export is on. Configuration errors fail the command
    /// (exit 2); ignored settings are warnings.
    pub(crate) fn start(&self) -> Result<Option<Exporting>, Failure> {
        Ok(self.pipeline()?.map(|telemetry| Exporting {
            telemetry: Some(telemetry),
        }))
    }

    /// The exporter pipeline alone, if export is on: `aplc serve` shares it between its
    /// runs and shuts it down itself, with [`shut_down`].
    pub(crate) fn pipeline(&self) -> Result<Option<Telemetry>, Failure> {
        let env = |name: &str| std::env::var(name).ok();
        let flags = TelemetryFlags {
            otel: self.otel,
            capture_content: self.otel_content,
        };
        let resolved =
            TelemetryConfig::resolve(&env, flags).map_err(|e| Failure::usage(e.to_string()))?;
        for warning in &resolved.warnings {
            eprintln!("warning: {warning}");
        }
        let Some(config) = resolved.config else {
            if self.otel_content {
                eprintln!("warning: --otel-content has no effect without --otel");
            }
            return Ok(None);
        };
        Telemetry::start(&config, &env)
            .map(Some)
            .map_err(|e| Failure::usage(e.to_string()))
    }
}

/// Export in progress. Dropping it flushes (at most [`FLUSH_TIMEOUT`]) and prints one
/// warning if export failed: every way out of `aplc run` (success, failure, Ctrl-C)
/// passes through that drop.
pub(crate) struct Exporting {
    telemetry: Option<Telemetry>,
}

impl Exporting {
    /// The spans of one run, joining the trace of `TRACEPARENT` (and `TRACESTATE`) when
    /// the environment carries one, as a process started by a traced parent does.
    pub(crate) fn run(
        &self,
        redactor: Redactor,
        run_id: Option<String>,
        agent: &str,
    ) -> Option<RunTrace> {
        let telemetry = self.telemetry.as_ref()?;
        let parent = std::env::var("TRACEPARENT").ok().and_then(|traceparent| {
            let tracestate = std::env::var("TRACESTATE").ok();
            match Parent::parse(&traceparent, tracestate.as_deref()) {
                Ok((parent, warning)) => {
                    if let Some(warning) = warning {
                        eprintln!("warning: TRACESTATE: {warning}");
                    }
                    Some(parent)
                }
                Err(e) => {
                    eprintln!("warning: TRACEPARENT ignored: {e}");
                    None
                }
            }
        });
        Some(telemetry.run(RunDetails {
            parent,
            run_id,
            agent: Some(agent.to_owned()),
            redactor,
        }))
    }
}

impl Drop for Exporting {
    fn drop(&mut self) {
        if let Some(telemetry) = self.telemetry.take() {
            shut_down(&telemetry);
        }
    }
}

/// Sends what is still batched (waiting at most [`FLUSH_TIMEOUT`]) and stops the
/// exporters; a failed export is one warning on stderr.
pub(crate) fn shut_down(telemetry: &Telemetry) {
    if let Err(warning) = telemetry.shutdown(FLUSH_TIMEOUT) {
        eprintln!("warning: {warning}");
    }
}
