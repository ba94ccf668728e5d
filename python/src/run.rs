//! Runs: a loaded program, and one run of it driven from the caller's event loop.
//!
//! The facade (`_runtime.py`) drives a [`NativeRun`]: it asks for the next action,
//! performs it (awaits a Python provider or tool, or a Rust provider's awaitable), and
//! hands the answer back, which also polls the machine to the next action. The machine
//! runs on the loop's own thread with the GIL released, and answers and contexts cross
//! as Python objects ([`crate::convert`]): no thread hop, channel or JSON text per step.
//! Models without a Python provider (the `base_url` HTTP provider, the `providers`
//! router) still run in Rust, on pyo3-async-runtimes' tokio runtime, one awaitable per
//! call; their streamed deltas reach the loop with `call_soon_threadsafe`. The run's
//! timeout holds mid-render through the runtime's watchdog, and at a call through the
//! facade's timer (`handle_timeout`). Cancelling the awaiting task cancels the run's
//! [`Interrupt`] and drops a Rust call in flight.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aplc_runtime::driver::{BoxFuture, CallContext, DeltaSink, Provider, Toolbox};
use aplc_runtime::equip::{Builder, ProcessEnvironment, Source};
use aplc_runtime::session::{DeltaStamp, Next, RunSession, Timebase, relay_deltas};
use aplc_runtime::{DeltaRedactor, Redactor, Secrets};
use aplc_vm::tools::{ToolRegistry, ToolSpec};
use aplc_vm::{
    Action, Completion, Event, Interrupt, Machine, Program, ProviderError, ProviderErrorKind,
    ProviderRequest, RunOptions, RunOutcome,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3_async_runtimes::TaskLocals;
use serde_json::Value as Json;

use crate::check::{Report, SOURCE_NAME, dialect_named, report};
use crate::convert::{json_to_py, py_to_json, value_to_py};

/// A loaded program: compiled once, run any number of times, from any thread.
#[pyclass(frozen, name = "NativeProgram", module = "aplc._aplc")]
pub(crate) struct NativeProgram {
    pub(crate) program: Arc<Program>,
}

/// What the facade passes to [`NativeProgram::begin`]: the options, already checked
/// (a dict with exactly these keys).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct RunConfig {
    /// `with_context`: a dict of JSON values.
    context: Py<PyAny>,
    timeout_ms: u64,
    max_runs: Option<u64>,
    max_steps: u64,
    /// The models the facade answers for (`with_providers`' keys).
    models: Vec<String>,
    /// `(descriptor, with_context)` for each tool of `with_tools`.
    tools: Vec<(Py<PyAny>, bool)>,
    /// Whether the facade wants the run's events (`on_event` or `debug`).
    events: bool,
    /// `(event) -> None`, called on the loop for each streamed delta of a Rust provider
    /// (the other events come back with each action).
    on_delta: Option<Py<PyAny>>,
    base_url: Option<String>,
    api_key: Option<String>,
    /// A providers config (spec/providers.md), as JSON.
    providers_json: Option<String>,
    /// A tool manifest (spec/tools.md, spec/mcp.md) run by Rust: `("file", path)` or
    /// `("json", text)` (`with_tools` as a path, or the manifest's parsed object).
    manifest: Option<(String, String)>,
    /// The facade has an `on_input` callback: a run that asks a person hands its
    /// requests to it (`spec/human.md` §4.3); without one such a run fails.
    on_input: bool,
    /// `agents`: the programs the run may call by a name its bundle does not link
    /// (`spec/agents.md` §2).
    agents: Vec<(String, Py<NativeProgram>)>,
    max_agent_depth: u32,
}

#[pymethods]
impl NativeProgram {
    /// Loads bundle bytes, checking them before trusting them.
    #[staticmethod]
    fn load(py: Python<'_>, data: &[u8], dialect: &str) -> PyResult<NativeProgram> {
        let dialect = dialect_named(dialect)?;
        if !aplc_vm::bundle::is_bundle(data) {
            return Err(PyValueError::new_err(
                "invalid bundle: the bytes do not start with an aplc bundle header",
            ));
        }
        let program = py
            .detach(|| Program::load_in(data, dialect))
            .map_err(|e| PyValueError::new_err(format!("invalid bundle: {e}")))?;
        Ok(NativeProgram {
            program: Arc::new(program),
        })
    }

    /// Compiles source for running (an unknown jump target fails the run when reached,
    /// as in `aplc run`): the program, or `None` with the errors in the report.
    #[staticmethod]
    fn compile(
        py: Python<'_>,
        source: &str,
        relaxed: bool,
        inputs: Vec<String>,
        dialect: &str,
    ) -> PyResult<(Option<NativeProgram>, Report)> {
        let dialect = dialect_named(dialect)?;
        let (program, report) = py.detach(|| {
            let mut options = aplc_compiler::Options::for_run(relaxed);
            options.inputs = inputs;
            options.dialect = dialect;
            let compilation = aplc_compiler::compile(source, SOURCE_NAME, &options);
            let report = report(&compilation.diagnostics, source);
            let program = compilation
                .bundle
                .map(|bundle| Program::from_bundle_in(bundle, aplc_vm::Limits::default(), dialect));
            (program, report)
        });
        let program = program
            .transpose()
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .map(|program| NativeProgram {
                program: Arc::new(program),
            });
        Ok((program, report))
    }

    /// The dialect the program runs in (`spec/dialects.md`).
    #[getter]
    fn dialect(&self) -> &'static str {
        self.program.dialect().as_str()
    }

    /// Starts a run: the machine, its clock and watchdog; the facade drives it with
    /// [`NativeRun::advance`] and [`NativeRun::answer`]. With a manifest that declares
    /// MCP servers, an awaitable instead: the servers start (on the module's tokio
    /// runtime, which runs their calls), then it gives the run. They stop when the run
    /// ends (spec/python.md, "Tool manifests").
    fn begin<'py>(&self, py: Python<'py>, config: RunConfig) -> PyResult<Bound<'py, PyAny>> {
        let mut prepared = Prepared::new(py, config)?;
        let program = self.program.clone();
        if prepared.toolbox.pending_mcp_servers().is_empty() {
            return Ok(Bound::new(py, prepared.finish(program)?)?.into_any());
        }
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            prepared.start_mcp().await?;
            prepared.finish(program)
        })
    }
}

/// One run, driven by the facade on its event loop. `frozen`: every method takes the
/// lock, which only the facade's single coroutine ever contends for.
#[pyclass(frozen, name = "NativeRun", module = "aplc._aplc")]
pub(crate) struct NativeRun {
    state: Mutex<State>,
    /// The run's cancel flag (a clone of the machine's).
    interrupt: Interrupt,
}

/// A run in progress.
struct State {
    /// `None` once the run has finished and its outcome was handed over.
    session: Option<RunSession<'static>>,
    /// The events the session made since the facade last took them (redacted JSON);
    /// `None` when nobody listens.
    events: Option<Arc<Mutex<Vec<Json>>>>,
    /// What [`NativeRun::answer`] answers.
    waiting: Waiting,
    /// The models with a Python provider.
    models: HashSet<String>,
    fallback: Fallback,
    /// Every secret the run knows: the final context, errors, events and tool results
    /// are redacted with it.
    redactor: Redactor,
    on_delta: Option<Py<PyAny>>,
    /// The manifest's tools (command, HTTP, MCP), run in Rust; `None` without a manifest
    /// and once the run has ended (its MCP servers stop then).
    toolbox: Option<Arc<Toolbox>>,
    /// The facade answers requests for a person (`on_input`).
    on_input: bool,
}

/// The action the facade is performing.
enum Waiting {
    Nothing,
    /// A Python provider: the answer is `("ok", response)` or `(kind, message)`.
    Provider,
    /// A Python tool: the answer is `("ok", result)` or `(kind, message)`.
    Tool,
    /// A Rust provider: the answer is `("rust", RustAnswer)`.
    Rust,
    /// A tool of the manifest: the answer is `("rust", RustToolAnswer)`.
    RustTool,
    /// A person, through `on_input`: the answers come to [`NativeRun::answer_input`].
    Input,
}

/// How many deltas of a Rust provider wait for the loop before the provider waits.
const DELTA_QUEUE: usize = 32;

/// A run built but not started: what [`NativeRun`] (or a durable run, `crate::durable`)
/// needs, once the manifest's MCP servers (if any) have started.
pub(crate) struct Prepared {
    /// The options; `tools` holds `with_tools`' descriptors.
    pub(crate) options: RunOptions,
    /// The manifest's tools.
    pub(crate) toolbox: Toolbox,
    events: bool,
    pub(crate) models: Vec<String>,
    pub(crate) fallback: Fallback,
    pub(crate) redactor: Redactor,
    /// `on_event` (when someone listens).
    pub(crate) on_delta: Option<Py<PyAny>>,
    pub(crate) on_input: bool,
}

impl Prepared {
    pub(crate) fn new(py: Python<'_>, config: RunConfig) -> PyResult<Prepared> {
        let context = py_to_json(config.context.bind(py)).map_err(|e| {
            PyTypeError::new_err(format!("with_context must hold JSON values only: {e}"))
        })?;
        let Json::Object(context) = context else {
            return Err(PyTypeError::new_err("with_context must be a dict"));
        };
        if config.max_steps == 0 {
            return Err(PyValueError::new_err("max_steps must be at least 1"));
        }
        let mut tools = ToolRegistry::new();
        for (descriptor, with_context) in &config.tools {
            let descriptor = py_to_json(descriptor.bind(py))
                .map_err(|e| PyValueError::new_err(format!("tool descriptor: {e}")))?;
            let spec = ToolSpec::new(descriptor)
                .map_err(|e| PyValueError::new_err(e.to_string()))?
                .with_context(*with_context);
            tools
                .register(spec)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        let options = RunOptions {
            timeout: Duration::from_millis(config.timeout_ms),
            max_runs: config.max_runs,
            max_steps: config.max_steps,
            tools: Arc::new(tools),
            events: config.events,
            agents: Arc::new(
                (config.agents.iter())
                    .map(|(name, program)| (name.clone(), program.get().program.clone()))
                    .collect(),
            ),
            max_agent_depth: config.max_agent_depth,
            ..RunOptions::default()
        }
        .with_context_json(&context);

        // The one list of secrets (spec/limits.md, "Secrets and redaction"), plus the
        // `api_key` argument, the variables a providers file reads and the manifest's
        // MCP secrets. Lazy: most runs with Python providers never need the HTTP
        // provider or its client.
        let mut builder = Builder::new(Secrets::from_env())
            .providers(config.providers_json.map(|text| Source::Text {
                name: "providers".into(),
                text,
            }))
            .base_url(config.base_url)
            .api_key(config.api_key)
            .lazy(true)
            // `begin` starts them, for this run.
            .mcp(true);
        builder = match config.manifest {
            Some((kind, path)) if kind == "file" => builder.tools(Some(path.into())),
            // The parsed manifest: a relative `cwd` is relative to the working directory.
            Some((_, text)) => builder.tools_text("with_tools".into(), text, ".".into()),
            None => builder,
        };
        let equipment = builder
            .build(&ProcessEnvironment)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Prepared {
            options,
            toolbox: equipment.toolbox,
            events: config.events,
            models: config.models,
            fallback: Fallback(equipment.provider),
            redactor: equipment.redactor,
            on_delta: config.on_delta,
            on_input: config.on_input,
        })
    }

    /// Starts the manifest's MCP servers, on the module's tokio runtime (which runs
    /// their calls).
    pub(crate) async fn start_mcp(&mut self) -> PyResult<()> {
        let started = self.toolbox.start_mcp().await;
        started.map_err(|e| PyValueError::new_err(self.redactor.redact(&e.to_string())))
    }

    /// The run of `program`, with the manifest's tools offered after `with_tools`' own.
    fn finish(mut self, program: Arc<Program>) -> PyResult<NativeRun> {
        let registry = self.toolbox.registry();
        let tools = Arc::make_mut(&mut self.options.tools);
        for name in registry.names() {
            let Some(spec) = registry.get(name) else {
                continue;
            };
            if tools.get(name).is_some() {
                return Err(duplicate_tool(name));
            }
            tools
                .register(spec.clone())
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        let toolbox = (!self.toolbox.is_empty()).then(|| Arc::new(self.toolbox));
        let redactor = self.redactor;
        let interrupt = self.options.interrupt.clone();
        let machine = Machine::new(program, self.options);
        // The session hands its events to the buffer, redacted; `next` turns them into
        // Python objects with each action.
        let events = self.events.then(|| Arc::new(Mutex::new(Vec::new())));
        let observer = events.clone().map(|buffer| {
            let redactor = redactor.clone();
            Box::new(move |event: &Event| {
                let json = redactor.redact_json(event.to_json());
                buffer.lock().unwrap_or_else(|e| e.into_inner()).push(json);
            }) as aplc_runtime::session::Observer<'static>
        });
        Ok(NativeRun {
            state: Mutex::new(State {
                session: Some(RunSession::new(machine, observer)),
                events,
                waiting: Waiting::Nothing,
                models: self.models.into_iter().collect(),
                fallback: self.fallback,
                redactor,
                on_delta: self.on_delta,
                toolbox,
                on_input: self.on_input,
            }),
            interrupt,
        })
    }
}

/// Two tools with one name: one of `with_tools`, one of the manifest.
pub(crate) fn duplicate_tool(name: &str) -> PyErr {
    PyValueError::new_err(format!(
        "two tools are named `{name}`: one in with_tools, one in the manifest"
    ))
}

impl NativeRun {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl NativeRun {
    /// Runs to the next action: `("provider", events, model, context)`,
    /// `("tool", events, name, arguments, context)`, `("rust", events, awaitable)` or
    /// `("done", events, context, error)`. `events` is a list of event dicts, or `None`
    /// when nobody listens; `error` is `(kind, message, step)` or `None`.
    fn advance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.lock().next(py)
    }

    /// Hands the run the answer to its last action, then runs to the next one (as
    /// [`NativeRun::advance`]). `kind` is `"ok"` (with the response or result),
    /// `"invalid"` or `"raised"` (with a message), or `"rust"` (with the awaitable's
    /// result).
    fn answer<'py>(
        &self,
        py: Python<'py>,
        kind: &str,
        payload: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let waiting = std::mem::replace(&mut state.waiting, Waiting::Nothing);
        let Some(session) = state.session.as_mut() else {
            return Err(finished());
        };
        match waiting {
            Waiting::Provider => {
                let result = provider_result(kind, payload, &state.redactor)?;
                session.answer_provider(result);
            }
            Waiting::Tool => {
                let result = tool_result(kind, payload, &state.redactor)?;
                session.answer_tool(result);
            }
            Waiting::Rust => {
                let answer = payload.cast::<RustAnswer>()?;
                let result = answer
                    .get()
                    .0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .flatten();
                match result {
                    Some(result) => session.answer_provider(result),
                    None => session.time_out(),
                }
            }
            Waiting::RustTool => {
                let answer = payload.cast::<RustToolAnswer>()?;
                let result = answer
                    .get()
                    .0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                session
                    .answer_tool(result.unwrap_or_else(|| Err("the tool gave no answer".into())));
            }
            Waiting::Nothing | Waiting::Input => {
                return Err(PyRuntimeError::new_err(
                    "the run is not waiting for an answer",
                ));
            }
        }
        state.next(py)
    }

    /// Hands the run a person's answers (`on_input`'s): `(request id, reply)` pairs, the
    /// reply `{"approve", "reason"?}` or `{"value"}`; then runs to the next action. An
    /// answer that does not fit its request (a wrong kind, a schema violation) is a
    /// `ValueError` naming the request, and the run takes none of them. No answers: a
    /// request was left for later (`aplc.LATER`), and the run fails as one without
    /// `on_input` (an in-memory run has nowhere to wait).
    fn answer_input<'py>(
        &self,
        py: Python<'py>,
        answers: Vec<(String, Bound<'py, PyAny>)>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if !matches!(state.waiting, Waiting::Input) {
            return Err(PyRuntimeError::new_err("the run is not waiting for input"));
        }
        let session = state.session.as_mut().ok_or_else(finished)?;
        if answers.is_empty() {
            // `on_input` left a request for later: an in-memory run cannot wait.
            state.waiting = Waiting::Nothing;
            abandon_input(session);
            return state.next(py);
        }
        let mut checked = Vec::new();
        for (id, reply) in answers {
            let reply = py_to_json(&reply)
                .map_err(|e| PyValueError::new_err(format!("the answer to `{id}`: {e}")))?;
            let reply = aplc_runtime::human::reply_from_json(&reply)
                .map_err(|e| PyValueError::new_err(format!("the answer to `{id}`: {e}")))?;
            let answer = aplc_vm::human::HumanAnswer {
                id,
                reply,
                by: "python".into(),
                answered_at_ms: aplc_runtime::human::now_ms(),
            };
            // The message names the request.
            (session.machine().check_answer(&answer))
                .map_err(|e| PyValueError::new_err(format!("on_input: {e}")))?;
            checked.push(answer);
        }
        state.waiting = Waiting::Nothing;
        for answer in checked {
            session.answer_person(answer);
        }
        state.next(py)
    }

    /// The run's deadline passed while the facade performed the last action; runs to
    /// the next action (the end).
    fn timed_out<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let mut guard = self.lock();
        let state = &mut *guard;
        state.waiting = Waiting::Nothing;
        state.session.as_mut().ok_or_else(finished)?.time_out();
        state.next(py)
    }

    /// Seconds until the run's deadline (0 when it has passed).
    fn remaining(&self) -> f64 {
        let state = self.lock();
        state
            .session
            .as_ref()
            .map_or(0.0, |session| session.clock().remaining().as_secs_f64())
    }

    /// Cancels the run: it stops at its next instruction.
    fn cancel(&self) {
        self.interrupt.cancel();
    }
}

impl Drop for NativeRun {
    fn drop(&mut self) {
        self.interrupt.cancel();
    }
}

/// Ends a run that asks with nobody to answer: the error a run without a store gets
/// (spec/human.md §4.1).
fn abandon_input(session: &mut RunSession<'static>) {
    let pending: Vec<aplc_runtime::human::Pending> = session
        .machine()
        .pending_requests()
        .into_iter()
        .map(|request| aplc_runtime::human::Pending {
            request: request.clone(),
            requested_at_ms: aplc_runtime::human::now_ms(),
        })
        .collect();
    session.abandon_input(aplc_runtime::human::nobody_message(&pending));
}

/// True if a Python provider answers for `model`: its own, or `"*"`, which answers for
/// every model without one, as in a routing config.
pub(crate) fn answers_for(models: &HashSet<String>, model: &str) -> bool {
    models.contains(model) || models.contains("*")
}

/// The context a Python provider receives: the request's variables, as Python objects.
pub(crate) fn provider_context<'py>(
    py: Python<'py>,
    request: &ProviderRequest,
) -> PyResult<Bound<'py, PyDict>> {
    let context = PyDict::new(py);
    let plain = Redactor::default();
    for (name, value) in request.context.iter() {
        context.set_item(name, value_to_py(py, value, &plain)?)?;
    }
    Ok(context)
}

/// Calls `callback` with `event` on the loop of `locals` (`call_soon_threadsafe`: in
/// the order of the calls, and before a result the loop gets after it).
pub(crate) fn schedule(py: Python<'_>, locals: &TaskLocals, callback: &Py<PyAny>, event: &Json) {
    let sent = json_to_py(py, event).and_then(|event| {
        locals
            .event_loop(py)
            .call_method1("call_soon_threadsafe", (callback.bind(py), event))
    });
    // The loop is closed: nobody is left to tell.
    drop(sent);
}

fn finished() -> PyErr {
    PyRuntimeError::new_err("the run has finished")
}

impl State {
    /// Polls the machine to the next action the facade must perform.
    fn next<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let list = self.events.is_some().then(|| PyList::empty(py));
        loop {
            let Some(session) = self.session.as_mut() else {
                return Err(finished());
            };
            let Next { action, .. } = py.detach(|| session.next_action());
            if let (Some(list), Some(buffer)) = (&list, &self.events) {
                let events = std::mem::take(&mut *buffer.lock().unwrap_or_else(|e| e.into_inner()));
                for event in &events {
                    list.append(json_to_py(py, event)?)?;
                }
            }
            let events = || -> Bound<'py, PyAny> {
                match &list {
                    Some(list) => list.clone().into_any(),
                    None => py.None().into_bound(py),
                }
            };
            match action {
                Action::Continue => continue,
                Action::AwaitInput if self.on_input => {
                    let requests: Vec<Json> = session
                        .machine()
                        .pending_requests()
                        .into_iter()
                        .map(|request| serde_json::to_value(request).unwrap_or(Json::Null))
                        .collect();
                    self.waiting = Waiting::Input;
                    return PyTuple::new(
                        py,
                        [
                            PyString::new(py, "input").into_any(),
                            events(),
                            json_to_py(py, &Json::Array(requests))?,
                        ],
                    );
                }
                Action::AwaitInput => {
                    abandon_input(session);
                    continue;
                }
                Action::Done => {
                    let Some(session) = self.session.take() else {
                        return Err(finished());
                    };
                    let (outcome, _) = session.finish();
                    // The run is over: its MCP servers stop (their process groups killed).
                    self.toolbox = None;
                    let context = outcome_to_py(py, &outcome, &self.redactor)?;
                    let error = error_to_py(py, &outcome, &self.redactor)?;
                    return PyTuple::new(
                        py,
                        [
                            PyString::new(py, "done").into_any(),
                            events(),
                            context,
                            error,
                        ],
                    );
                }
                Action::CallProvider(request) => {
                    // `"*"` answers for every model without a provider of its own, as
                    // in a routing config.
                    if answers_for(&self.models, &request.model) {
                        let context = provider_context(py, &request)?;
                        self.waiting = Waiting::Provider;
                        return PyTuple::new(
                            py,
                            [
                                PyString::new(py, "provider").into_any(),
                                events(),
                                PyString::new(py, &request.model).into_any(),
                                context.into_any(),
                            ],
                        );
                    }
                    match self.fallback.provider() {
                        Ok(provider) => match self.rust_call(py, provider, request)? {
                            RustCall::Pending(awaitable) => {
                                self.waiting = Waiting::Rust;
                                return PyTuple::new(
                                    py,
                                    [PyString::new(py, "rust").into_any(), events(), awaitable],
                                );
                            }
                            RustCall::Ready(result, deltas) => {
                                if let Some(list) = &list {
                                    for event in &deltas {
                                        list.append(json_to_py(py, event)?)?;
                                    }
                                }
                                self.handle_rust(*result);
                            }
                        },
                        Err(error) => self.handle_rust(Some(Err(error))),
                    }
                }
                Action::CallTool(invocation)
                    if self
                        .toolbox
                        .as_ref()
                        .is_some_and(|t| t.registry().get(&invocation.name).is_some()) =>
                {
                    let awaitable = self.manifest_tool(py, invocation)?;
                    self.waiting = Waiting::RustTool;
                    return PyTuple::new(
                        py,
                        [PyString::new(py, "rust").into_any(), events(), awaitable],
                    );
                }
                Action::CallTool(invocation) => {
                    let arguments = json_to_py(py, &invocation.arguments)?;
                    let context = match &invocation.context {
                        Some(context) => json_to_py(py, context)?,
                        None => py.None().into_bound(py),
                    };
                    self.waiting = Waiting::Tool;
                    return PyTuple::new(
                        py,
                        [
                            PyString::new(py, "tool").into_any(),
                            events(),
                            PyString::new(py, &invocation.name).into_any(),
                            arguments,
                            context,
                        ],
                    );
                }
            }
        }
    }

    /// Calls a tool of the manifest on the module's tokio runtime: an awaitable whose
    /// result is a [`RustToolAnswer`] (the result, redacted by the toolbox).
    fn manifest_tool<'py>(
        &self,
        py: Python<'py>,
        invocation: aplc_vm::tools::ToolInvocation,
    ) -> PyResult<Bound<'py, PyAny>> {
        let toolbox = self.toolbox.clone().ok_or_else(finished)?;
        let locals = pyo3_async_runtimes::tokio::get_current_locals(py)?;
        pyo3_async_runtimes::tokio::future_into_py_with_locals(py, locals, async move {
            let result = toolbox.call(&invocation).await;
            Ok(RustToolAnswer(Mutex::new(Some(result))))
        })
    }

    /// Hands the machine a Rust provider's result (`None`: the deadline came first).
    fn handle_rust(&mut self, result: Option<Result<Completion, ProviderError>>) {
        if let Some(session) = self.session.as_mut() {
            match result {
                Some(result) => session.answer_provider(result),
                None => session.time_out(),
            }
        }
    }

    /// Calls `provider` until the run's deadline, its streamed deltas going to
    /// `on_delta`. The call is polled once here, on the loop's thread: a provider that
    /// answers at once (a `mock` route) costs no trip to the tokio runtime. One that
    /// waits (HTTP) goes on on the runtime, as an awaitable whose result is a
    /// [`RustAnswer`].
    fn rust_call<'py>(
        &self,
        py: Python<'py>,
        provider: Arc<dyn Provider>,
        request: Box<ProviderRequest>,
    ) -> PyResult<RustCall<'py>> {
        let session = self.session.as_ref().ok_or_else(finished)?;
        let deadline = session.clock().deadline();
        let relay = match (&self.on_delta, &self.events) {
            (Some(callback), Some(_)) => Some(Arc::new(Relay {
                sink: Mutex::new(RelaySink::Buffer(Vec::new())),
                callback: callback.clone_ref(py),
                stamp: session.stamp().clone(),
                redactor: self.redactor.clone(),
                time: session.clock().timebase(),
            })),
            _ => None,
        };
        let relayed = relay.clone();
        let mut call: BoxFuture<'static, Option<Result<Completion, ProviderError>>> =
            Box::pin(async move { complete(&*provider, &request, deadline, relayed).await });
        let first = py.detach(|| {
            // Timers and sockets made during the poll belong to the runtime that goes on
            // with the call.
            let _runtime = pyo3_async_runtimes::tokio::get_runtime().enter();
            let mut context = std::task::Context::from_waker(std::task::Waker::noop());
            call.as_mut().poll(&mut context)
        });
        let buffered = |relay: &Option<Arc<Relay>>| match relay {
            Some(relay) => relay.take_buffer(),
            None => Vec::new(),
        };
        if let std::task::Poll::Ready(result) = first {
            return Ok(RustCall::Ready(Box::new(result), buffered(&relay)));
        }
        let locals = pyo3_async_runtimes::tokio::get_current_locals(py)?;
        if let Some(relay) = &relay {
            // From now on deltas cross threads: what the first poll sent goes first.
            for event in relay.take_buffer() {
                relay.schedule(py, &locals, &event);
            }
            *relay.lock() = RelaySink::Loop(locals.clone());
        }
        let awaitable =
            pyo3_async_runtimes::tokio::future_into_py_with_locals(py, locals, async move {
                Ok(RustAnswer(Mutex::new(Some(call.await))))
            })?;
        Ok(RustCall::Pending(awaitable))
    }
}

/// A Rust provider call after its first poll.
enum RustCall<'py> {
    /// It answered at once (`None`: the deadline came first), with the delta events it
    /// sent meanwhile, as JSON.
    Ready(Box<Option<Result<Completion, ProviderError>>>, Vec<Json>),
    /// It goes on on the tokio runtime: await this.
    Pending(Bound<'py, PyAny>),
}

/// The result of a Rust provider's call, for [`NativeRun::answer`]: `None` inside if the
/// deadline came first.
#[pyclass(frozen, name = "RustAnswer", module = "aplc._aplc")]
pub(crate) struct RustAnswer(Mutex<Option<Option<Result<Completion, ProviderError>>>>);

/// The result of a manifest tool's call, for [`NativeRun::answer`].
#[pyclass(frozen, name = "RustToolAnswer", module = "aplc._aplc")]
pub(crate) struct RustToolAnswer(Mutex<Option<Result<Json, String>>>);

/// Where a Rust provider's deltas go: `provider_delta` events, redacted across deltas,
/// to the facade.
struct Relay {
    sink: Mutex<RelaySink>,
    callback: Py<PyAny>,
    /// The provider call the deltas belong to.
    stamp: DeltaStamp,
    redactor: Redactor,
    time: Timebase,
}

/// Where a [`Relay`] sends events.
enum RelaySink {
    /// Kept, while the call is polled on the loop's thread: they go out with the next
    /// action, in order.
    Buffer(Vec<Json>),
    /// To the facade's callback on the loop (`call_soon_threadsafe`), once the call
    /// goes on on the tokio runtime.
    Loop(TaskLocals),
}

impl Relay {
    fn lock(&self) -> std::sync::MutexGuard<'_, RelaySink> {
        self.sink.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_buffer(&self) -> Vec<Json> {
        match &mut *self.lock() {
            RelaySink::Buffer(events) => std::mem::take(events),
            RelaySink::Loop(_) => Vec::new(),
        }
    }

    fn send(&self, event: &Event) {
        let json = self.redactor.redact_json(event.to_json());
        let locals = match &mut *self.lock() {
            RelaySink::Buffer(events) => {
                events.push(json);
                return;
            }
            RelaySink::Loop(locals) => locals.clone(),
        };
        Python::attach(|py| self.schedule(py, &locals, &json));
    }

    /// Calls the facade's callback with `event` on the loop of `locals`.
    fn schedule(&self, py: Python<'_>, locals: &TaskLocals, event: &Json) {
        schedule(py, locals, &self.callback, event);
    }
}

/// Calls `provider` until `deadline` (`None` if it came first), relaying its deltas.
async fn complete(
    provider: &dyn Provider,
    request: &ProviderRequest,
    deadline: Instant,
    relay: Option<Arc<Relay>>,
) -> Option<Result<Completion, ProviderError>> {
    let timer = tokio::time::Instant::from_std(deadline);
    let Some(relay) = relay else {
        let call = CallContext::new(deadline);
        return tokio::time::timeout_at(timer, provider.complete(request, &call))
            .await
            .ok();
    };
    let (sink, mut receiver) = DeltaSink::channel(DELTA_QUEUE);
    let call = CallContext::new(deadline).with_deltas(sink);
    // A call's deltas are redacted as one text: a key cut across two is caught too.
    let mut deltas = DeltaRedactor::new(relay.redactor.clone());
    let mut index = 0u64;
    let emit = |text: String| {
        let event = relay.stamp.event(relay.time.now(), index, text);
        index += 1;
        deltas.on_event(&event, |event| relay.send(event));
    };
    let answer = tokio::time::timeout_at(timer, provider.complete(request, &call));
    let result = relay_deltas(answer, &mut receiver, emit).await.ok();
    deltas.finish(|event| relay.send(event));
    result
}

/// A Python provider's answer as the machine takes it.
pub(crate) fn provider_result(
    kind: &str,
    payload: &Bound<'_, PyAny>,
    redactor: &Redactor,
) -> PyResult<Result<Completion, ProviderError>> {
    let failed = |kind, message: &str| ProviderError::new(kind, redactor.redact(message));
    Ok(match kind {
        "ok" => match py_to_json(payload) {
            Ok(response) => aplc_vm::wire::openai::decode_value(&response),
            Err(e) => Err(failed(
                ProviderErrorKind::InvalidResponse,
                &format!("invalid provider response: not JSON-serialisable: {e}"),
            )),
        },
        "invalid" => Err(failed(
            ProviderErrorKind::InvalidResponse,
            &payload.extract::<String>()?,
        )),
        _ => Err(failed(
            ProviderErrorKind::Other,
            &payload.extract::<String>()?,
        )),
    })
}

/// A Python tool's answer as the machine takes it, redacted.
pub(crate) fn tool_result(
    kind: &str,
    payload: &Bound<'_, PyAny>,
    redactor: &Redactor,
) -> PyResult<Result<Json, String>> {
    Ok(match kind {
        "ok" => match py_to_json(payload) {
            Ok(result) => Ok(redactor.redact_json(result)),
            Err(e) => Err(format!("the tool's result is not JSON-serialisable: {e}")),
        },
        _ => Err(redactor.redact(&payload.extract::<String>()?)),
    })
}

/// The final context, as `RunOutcome::context_json` has it: every variable and
/// `context_history`, keys sorted, every string redacted.
pub(crate) fn outcome_to_py<'py>(
    py: Python<'py>,
    outcome: &RunOutcome,
    redactor: &Redactor,
) -> PyResult<Bound<'py, PyAny>> {
    const HISTORY: &str = "context_history";
    let dict = PyDict::new(py);
    let history = || -> PyResult<Bound<'py, PyAny>> {
        let list = PyList::empty(py);
        for entry in outcome.history.iter() {
            list.append(value_to_py(py, entry, redactor)?)?;
        }
        Ok(list.into_any())
    };
    let mut history_set = false;
    for (name, value) in outcome.vars.iter() {
        if !history_set && name >= HISTORY {
            dict.set_item(HISTORY, history()?)?;
            history_set = true;
        }
        if name != HISTORY {
            dict.set_item(redactor.redact(name), value_to_py(py, value, redactor)?)?;
        }
    }
    if !history_set {
        dict.set_item(HISTORY, history()?)?;
    }
    Ok(dict.into_any())
}

/// The run's error as the facade raises it: `(kind, message, step)`, or `None`.
pub(crate) fn error_to_py<'py>(
    py: Python<'py>,
    outcome: &RunOutcome,
    redactor: &Redactor,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match &outcome.error {
        Some(error) => (
            error.kind.as_str(),
            redactor.redact(&error.message),
            error.step.clone(),
        )
            .into_pyobject(py)?
            .into_any(),
        None => py.None().into_bound(py),
    })
}

/// The provider for models without a Python callable: the `providers` router, or the
/// OpenAI-compatible HTTP provider (`base_url`, `api_key`), built on its first call.
pub(crate) struct Fallback(Arc<dyn Provider>);

impl Fallback {
    pub(crate) fn provider(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(self.0.clone())
    }
}
