//! `aplc worker --tls…` against a real TLS frontend (spec/temporal.md §1, "Temporal
//! Cloud, TLS"): `temporal server start-dev` has no TLS, so a small TLS proxy stands before
//! its gRPC port, as a load balancer or Temporal Cloud's frontend does, with the
//! certificates of `fixtures/tls/` (made once by its `make.sh`: no certificate library in
//! the build, no network in the test).

use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

use super::{DevServer, Model, Worker, assert_completed_as_aplc_run, exiting_worker, scratch};

/// A file of `fixtures/tls/`.
fn fixture(name: &str) -> String {
    super::serving::root()
        .join("fixtures/tls")
        .join(name)
        .display()
        .to_string()
}

/// A TLS frontend on 127.0.0.1 before `upstream`, a plain gRPC port: it takes TLS with
/// `server.pem` (for `temporal.test`, `localhost` and 127.0.0.1, signed by `ca.pem`),
/// offers HTTP/2 by ALPN as gRPC needs, and pipes each connection's bytes to `upstream`.
/// With `mutual`, it requires a client certificate signed by `ca.pem`. It runs on a thread
/// of its own until the test process ends.
struct TlsFrontend {
    address: String,
    /// Why each refused handshake failed, as rustls says it.
    refused: Arc<Mutex<Vec<String>>>,
}

impl TlsFrontend {
    fn start(upstream: &str, mutual: bool) -> TlsFrontend {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(mutual)));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.set_nonblocking(true).expect("non-blocking");
        let address = listener.local_addr().expect("address").to_string();
        let refused = Arc::new(Mutex::new(Vec::new()));
        let (log, upstream) = (refused.clone(), upstream.to_owned());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let (acceptor, upstream, log) =
                        (acceptor.clone(), upstream.clone(), log.clone());
                    tokio::spawn(async move {
                        let mut tls = match acceptor.accept(tcp).await {
                            Ok(tls) => tls,
                            Err(e) => return log.lock().unwrap().push(e.to_string()),
                        };
                        let Ok(mut plain) = tokio::net::TcpStream::connect(&upstream).await else {
                            return;
                        };
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    });
                }
            });
        });
        TlsFrontend { address, refused }
    }

    fn refused(&self) -> Vec<String> {
        self.refused.lock().unwrap().clone()
    }
}

/// The frontend's TLS: `server.pem`, HTTP/2, a client certificate of `ca.pem` if `mutual`.
fn server_config(mutual: bool) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pem = |name: &str| std::fs::read(fixture(name)).expect("a fixture PEM");
    let certificates = |name: &str| -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(&pem(name))
            .collect::<Result<_, _>>()
            .expect("certificates")
    };
    let key = PrivateKeyDer::from_pem_slice(&pem("server.key")).expect("the server's key");
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions");
    let builder = if mutual {
        let mut roots = rustls::RootCertStore::empty();
        for ca in certificates("ca.pem") {
            roots.add(ca).expect("the CA");
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("a client verifier");
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(certificates("server.pem"), key)
        .expect("the server's certificate");
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// TLS with the frontend's CA and name: a worker with `--tls --tls-ca --tls-domain`
/// polls through the frontend and finishes a workflow started on the plain port. A worker
/// that trusts another CA, or expects another name, fails at once: exit 1, "cannot reach
/// Temporal", the certificate named as the reason.
#[test]
fn a_worker_finishes_a_run_through_a_tls_frontend() {
    let model = Model::start();
    let dir = scratch("tls_frontend", &model);
    let server = DevServer::start();
    let frontend = TlsFrontend::start(&server.address, false);
    let ca = fixture("ca.pem");
    let tls = ["--tls", "--tls-ca", &ca, "--tls-domain", "temporal.test"];
    let _worker = Worker::start_at(&frontend.address, &dir, "tls", &tls, &[]);
    let context = json!({"turns": 2, "tag": "tls"});
    server.start_run(
        "tls",
        "tls-1",
        &json!({"agent": "turns", "context": context}),
    );
    assert_completed_as_aplc_run(&server.result("tls-1"), &dir, &context);

    let other = fixture("other-ca.pem");
    let (code, text) = exiting_worker(
        &dir,
        &frontend.address,
        &["--tls-ca", &other, "--tls-domain", "temporal.test"],
        "warn",
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("cannot reach Temporal"), "{text}");
    assert!(text.contains("UnknownIssuer"), "not the CA's fault: {text}");
    let (code, text) = exiting_worker(
        &dir,
        &frontend.address,
        &["--tls-ca", &ca, "--tls-domain", "elsewhere.test"],
        "warn",
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("cannot reach Temporal"), "{text}");
    assert!(
        text.contains("NotValidForName"),
        "not the name's fault: {text}"
    );
}

/// Mutual TLS: a frontend that requires a client certificate takes a worker with
/// `--tls-cert` and `--tls-key`, which finishes a workflow; a worker without them fails at
/// once (exit 1, "cannot reach Temporal"), the frontend having refused its handshake for
/// want of a certificate.
#[test]
fn mutual_tls_needs_the_workers_certificate() {
    let model = Model::start();
    let dir = scratch("tls_mutual", &model);
    let server = DevServer::start();
    let frontend = TlsFrontend::start(&server.address, true);
    let (ca, cert, key) = (
        fixture("ca.pem"),
        fixture("client.pem"),
        fixture("client.key"),
    );
    let tls = [
        "--tls-ca",
        &ca,
        "--tls-domain",
        "temporal.test",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    let _worker = Worker::start_at(&frontend.address, &dir, "mtls", &tls, &[]);
    let context = json!({"turns": 2, "tag": "mtls"});
    server.start_run(
        "mtls",
        "mtls-1",
        &json!({"agent": "turns", "context": context}),
    );
    assert_completed_as_aplc_run(&server.result("mtls-1"), &dir, &context);
    assert!(frontend.refused().is_empty(), "{:?}", frontend.refused());

    let (code, text) = exiting_worker(
        &dir,
        &frontend.address,
        &["--tls-ca", &ca, "--tls-domain", "temporal.test"],
        "warn",
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("cannot reach Temporal"), "{text}");
    // What the worker is told varies: in TLS 1.3 its side of the handshake is done before
    // the frontend checks for a certificate, so the frontend's alert (`CertificateRequired`)
    // may reach it, or only the closed connection. The frontend's own record says why.
    let refused = frontend.refused();
    assert!(
        refused.iter().any(|why| why.contains("no certificates")),
        "the frontend did not refuse it for want of a certificate: {refused:?}\n{text}"
    );
}
