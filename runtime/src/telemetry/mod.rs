//! OpenTelemetry for runs: spans per the GenAI semantic conventions and the two GenAI
//! client metrics, built from the run events and exported over OTLP/HTTP
//! (spec/telemetry.md).
//!
//! [`Telemetry`] is the process's exporter pipeline, built once; [`Telemetry::run`] gives
//! each run a [`RunTrace`], whose [`RunTrace::on_event`] is (part of) the run's listener
//! and whose [`RunTrace::provider`] wraps the run's provider. When telemetry is off none
//! of this is built: no listener, no wrapper, no thread.

mod config;
mod export;
mod spans;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{Histogram, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};

pub use config::{
    DEFAULT_ENDPOINT, DEFAULT_SERVICE_NAME, Resolved, TelemetryConfig, TelemetryFlags,
};
pub use spans::{Parent, RunDetails, RunTrace, Traced};

/// Why telemetry could not be configured, set up, joined or flushed. A variable is
/// named, never a header's value or a URL (which may carry credentials).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// An `OTEL_*` variable is malformed.
    #[error("{variable} {problem}")]
    Variable {
        /// The variable.
        variable: &'static str,
        /// What is wrong ("has no host").
        problem: String,
    },
    /// An entry of an OTLP header list is malformed.
    #[error("{variable}: {problem}")]
    HeaderEntry {
        /// The variable.
        variable: &'static str,
        /// The entry's position, from 1.
        entry: usize,
        /// What is wrong, naming the entry and its key, never its value.
        problem: String,
    },
    /// The HTTP client for the exporters could not be built.
    #[error(transparent)]
    Client(#[from] crate::http::HttpClientError),
    /// An exporter or the export runtime could not be set up.
    #[error("cannot set up the {what}: {message}")]
    Setup {
        /// "span exporter", "metric exporter", "telemetry export runtime".
        what: &'static str,
        /// Why.
        message: String,
    },
    /// A `traceparent` is malformed.
    #[error("malformed traceparent: {0}")]
    Traceparent(&'static str),
    /// An export failed (the first failure).
    #[error("could not export telemetry: {0}")]
    Export(String),
    /// The spans were not all flushed.
    #[error("telemetry for {endpoint} was not all sent: {message}")]
    Unsent {
        /// The traces endpoint.
        endpoint: String,
        /// Why.
        message: String,
    },
    /// The metrics were not all flushed.
    #[error("metrics for {endpoint}'s collector were not all sent")]
    MetricsUnsent {
        /// The traces endpoint.
        endpoint: String,
    },
}

/// Spans that may wait for export; more are dropped (the SDK counts them). About 1 KiB
/// each.
const MAX_QUEUED_SPANS: usize = 16_384;

/// `gen_ai.client.operation.duration`'s bucket boundaries, in seconds, as the
/// conventions recommend.
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// `gen_ai.client.token.usage`'s bucket boundaries, as the conventions recommend.
const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// The process's telemetry pipeline: a tracer and a meter whose batches go to an OTLP
/// collector. Build it once, give each run a [`RunTrace`], and [`Telemetry::shutdown`]
/// before the process exits so the last batches are sent.
pub struct Telemetry {
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
    tracer: SdkTracer,
    instruments: Arc<Instruments>,
    capture_content: bool,
    /// The first export failure, for the one warning `shutdown` gives.
    failure: Arc<Mutex<Option<String>>>,
    traces_endpoint: String,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("traces_endpoint", &self.traces_endpoint)
            .field("capture_content", &self.capture_content)
            .finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Builds the exporters for `config` (proxies from `env`, as the providers' client
    /// reads them). Nothing is sent until a run ends a span; an unreachable collector is
    /// found out then, and reported once by [`Telemetry::shutdown`].
    pub fn start(
        config: &TelemetryConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Telemetry, TelemetryError> {
        let client = export::OtlpClient::new(env)?;
        let failure = client.failures();
        let headers: HashMap<String, String> = config.headers.iter().cloned().collect();
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.traces_endpoint.clone())
            .with_headers(headers.clone())
            .with_timeout(export::REQUEST_TIMEOUT)
            .build()
            .map_err(|e| TelemetryError::Setup {
                what: "span exporter",
                message: e.to_string(),
            })?;
        let metrics = match &config.metrics_endpoint {
            Some(endpoint) => Some(
                opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(endpoint.clone())
                    .with_headers(headers)
                    .with_timeout(export::REQUEST_TIMEOUT)
                    .build()
                    .map_err(|e| TelemetryError::Setup {
                        what: "metric exporter",
                        message: e.to_string(),
                    })?,
            ),
            None => None,
        };
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();
        // The SDK's default queue (2,048 spans) drops spans of a long run (a 1,000-step
        // loop makes 2,000) before its 5 s export tick; OTEL_BSP_MAX_QUEUE_SIZE still wins.
        let mut batch = BatchConfigBuilder::default();
        if env("OTEL_BSP_MAX_QUEUE_SIZE").is_none() {
            batch = batch.with_max_queue_size(MAX_QUEUED_SPANS);
        }
        let processor = BatchSpanProcessor::builder(spans)
            .with_batch_config(batch.build())
            .build();
        let tracer_provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.clone())
            .build();
        // Without an exporter the meter has no reader, and recording costs next to nothing.
        let mut meter_provider = SdkMeterProvider::builder().with_resource(resource);
        if let Some(metrics) = metrics {
            meter_provider = meter_provider.with_periodic_exporter(metrics);
        }
        let meter_provider = meter_provider.build();
        Ok(Telemetry::assemble(
            tracer_provider,
            meter_provider,
            config.capture_content,
            failure,
            config.traces_endpoint.clone(),
        ))
    }

    fn assemble(
        tracer_provider: SdkTracerProvider,
        meter_provider: SdkMeterProvider,
        capture_content: bool,
        failure: Arc<Mutex<Option<String>>>,
        traces_endpoint: String,
    ) -> Telemetry {
        let scope = InstrumentationScope::builder("aplc")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = tracer_provider.tracer_with_scope(scope.clone());
        let meter = meter_provider.meter_with_scope(scope);
        let instruments = Arc::new(Instruments {
            duration: meter
                .f64_histogram("gen_ai.client.operation.duration")
                .with_unit("s")
                .with_description("GenAI operation duration")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build(),
            tokens: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Number of input and output tokens used")
                .with_boundaries(TOKEN_BUCKETS.to_vec())
                .build(),
        });
        Telemetry {
            tracer_provider,
            meter_provider,
            tracer,
            instruments,
            capture_content,
            failure,
            traces_endpoint,
        }
    }

    /// The spans of a new run. Hand its events to [`RunTrace::on_event`] and run it with
    /// [`RunTrace::provider`] around the provider.
    pub fn run(&self, details: RunDetails) -> RunTrace {
        RunTrace::new(
            self.tracer.clone(),
            self.instruments.clone(),
            self.capture_content,
            details,
        )
    }

    /// True when prompts and completions are recorded.
    pub fn captures_content(&self) -> bool {
        self.capture_content
    }

    /// Sends what is still batched and stops the exporters, waiting at most about
    /// `timeout` (spans and metrics are flushed side by side). The error is the one
    /// warning to give: the first export failure, or a flush that did not finish. It
    /// never names a header value.
    ///
    /// It takes `&self` so that a server can hold the pipeline in an `Arc`; spans ended
    /// after it are not exported.
    pub fn shutdown(&self, timeout: Duration) -> Result<(), TelemetryError> {
        let traces_endpoint = &self.traces_endpoint;
        let (spans, metrics) = std::thread::scope(|scope| {
            let metrics = scope.spawn(|| self.meter_provider.shutdown_with_timeout(timeout));
            let spans = self.tracer_provider.shutdown_with_timeout(timeout);
            (spans, metrics.join())
        });
        let first = self
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let metrics_failed = !matches!(metrics, Ok(Ok(())));
        match (first, spans) {
            (Some(failure), _) => Err(TelemetryError::Export(failure)),
            (None, Err(e)) => Err(TelemetryError::Unsent {
                endpoint: traces_endpoint.clone(),
                message: e.to_string(),
            }),
            (None, Ok(())) if metrics_failed => Err(TelemetryError::MetricsUnsent {
                endpoint: traces_endpoint.clone(),
            }),
            (None, Ok(())) => Ok(()),
        }
    }
}

/// The GenAI client metrics.
pub(crate) struct Instruments {
    duration: Histogram<f64>,
    tokens: Histogram<u64>,
}

impl Instruments {
    fn record_duration(&self, latency_ms: f64, attributes: &[KeyValue]) {
        self.duration.record(latency_ms / 1000.0, attributes);
    }

    fn record_tokens(&self, usage: aplc_vm::TokenUsage, attributes: &[KeyValue]) {
        for (kind, tokens) in [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
        ] {
            let mut with_type = attributes.to_vec();
            with_type.push(KeyValue::new("gen_ai.token.type", kind));
            self.tokens.record(tokens, &with_type);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server shares one pipeline between its requests' tasks.
    #[test]
    fn the_pipeline_and_a_run_trace_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Telemetry>();
        shared::<RunTrace>();
        shared::<Traced<'static>>();
    }
}
