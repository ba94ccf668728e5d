//! An OTLP/HTTP receiver on 127.0.0.1 for the telemetry tests: it decodes the protobuf
//! export requests (`/v1/traces`, `/v1/metrics`) with opentelemetry-proto's prost types.
//!
//! Plain threads and blocking sockets: the exporter sends from threads of its own, and
//! the receiver must keep answering while a test's runtime blocks in a flush. HTTP/1.1
//! with `Content-Length` bodies and keep-alive, which is all the exporter sends.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request's path (`/v1/traces`, `/v1/metrics`).
    pub path: String,
    /// Its headers, names in lower case.
    pub headers: HashMap<String, String>,
    /// Its body.
    pub body: Vec<u8>,
}

/// The receiver; it stops accepting when the test process ends.
pub struct Receiver {
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    /// Listens on a free port; answers every request `status`.
    pub fn start(status: u16) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let log = log.clone();
                std::thread::spawn(move || serve(stream, &log, status));
            }
        });
        Receiver { port, received }
    }

    /// `http://127.0.0.1:{port}`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Every span received so far, from every `/v1/traces` request.
    pub fn spans(&self) -> Vec<Span> {
        self.requests()
            .iter()
            .filter(|r| r.path == "/v1/traces")
            .flat_map(|r| {
                let request = ExportTraceServiceRequest::decode(r.body.as_slice()).unwrap();
                request
                    .resource_spans
                    .into_iter()
                    .flat_map(|rs| rs.scope_spans)
                    .flat_map(|ss| ss.spans)
            })
            .collect()
    }

    /// The `service.name` of the first traces request's resource.
    pub fn service_name(&self) -> Option<String> {
        let requests = self.requests();
        let request = requests.iter().find(|r| r.path == "/v1/traces")?;
        let request = ExportTraceServiceRequest::decode(request.body.as_slice()).ok()?;
        let resource = request.resource_spans.first()?.resource.clone()?;
        string_of(&resource.attributes, "service.name")
    }

    /// The names of the metrics received, with their units.
    pub fn metrics(&self) -> Vec<(String, String)> {
        self.requests()
            .iter()
            .filter(|r| r.path == "/v1/metrics")
            .flat_map(|r| {
                let request = ExportMetricsServiceRequest::decode(r.body.as_slice()).unwrap();
                request
                    .resource_metrics
                    .into_iter()
                    .flat_map(|rm| rm.scope_metrics)
                    .flat_map(|sm| sm.metrics)
                    .map(|m| (m.name, m.unit))
            })
            .collect()
    }
}

/// The attribute `key` of a span, if it is there.
pub fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

/// The string attribute `key`.
pub fn string(span: &Span, key: &str) -> Option<String> {
    string_of(&span.attributes, key)
}

/// The integer attribute `key`.
pub fn int(span: &Span, key: &str) -> Option<i64> {
    match attribute(span, key)? {
        any_value::Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

fn string_of(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value: &AnyValue = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    match value.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn serve(stream: TcpStream, log: &Mutex<Vec<Received>>, status: u16) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let mut headers = HashMap::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
            }
        }
        let length: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        log.lock().unwrap().push(Received {
            path,
            headers,
            body,
        });
        let answer = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
        );
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}
