//! Durable runs from Python (`spec/python.md`, "Durable runs"; `spec/human.md` §4.3):
//! `aplc.start(…, {"store": URL})`, `aplc.resume` and `aplc.answer`.
//!
//! The runtime's durable driver does the run ([`durable::start`], [`durable::resume`]),
//! on the module's tokio runtime: it journals every input, pauses on requests nobody
//! answers, and replays without repeating a call. What Python provides reaches it
//! through the runtime's traits, each a call into the facade's coroutines on the
//! caller's event loop ([`Bridge`]): the Python providers ([`PyProvider`], with the
//! fallback provider for the other models), the Python tools ([`PyTool`], in one
//! toolbox with the manifest's), `on_input` ([`PyAnswerer`]) and `on_event`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use aplc_runtime::Redactor;
use aplc_runtime::driver::{BoxFuture, CallContext, Provider, Tool, Toolbox};
use aplc_runtime::durable::{self, DurableError, DurableOptions, Ended, NewDurableRun};
use aplc_runtime::human::{Answerer, Pending, answer_json, now_ms, reply_from_json};
use aplc_runtime::store::{self, Answered, RunJournal, RunState, RunStore, StoreError, StoreUrl};
use aplc_vm::human::HumanAnswer;
use aplc_vm::text::escape_control;
use aplc_vm::tools::ToolInvocation;
use aplc_vm::{Completion, Event, ProviderError, ProviderErrorKind, ProviderRequest};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict, PyTuple};
use pyo3_async_runtimes::TaskLocals;
use serde_json::Value as Json;

use crate::convert::{json_to_py, py_to_json};
use crate::run::{
    Fallback, NativeProgram, Prepared, RunConfig, answers_for, duplicate_tool, error_to_py,
    outcome_to_py, provider_context, provider_result, schedule, tool_result,
};

/// Starts a durable run of `program` in the store at `store` (`run_id`, or a new id): an
/// awaitable whose result is `("done", context, error, dialect)` or `("waiting",
/// run_id, pending, error)` (`error`: what `on_input` raised, or why its answer did not
/// fit; the run waits in its store all the same).
#[pyfunction]
pub(crate) fn start_durable<'py>(
    py: Python<'py>,
    program: PyRef<'py, NativeProgram>,
    config: RunConfig,
    store: &str,
    run_id: Option<String>,
    facade: Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let setup = Setup::new(py, config, store, facade)?;
    let program = program.program.clone();
    let id = run_id.unwrap_or_else(durable::new_run_id);
    let locals = setup.bridge.locals.clone();
    pyo3_async_runtimes::tokio::future_into_py_with_locals(py, locals, async move {
        let mut run = setup.equip().await?;
        // An id in use is refused before the run's first call, not at its first commit.
        match run.store.summary(&id).await {
            Err(StoreError::NotFound(_)) => {}
            Ok(_) => return Err(store_error(StoreError::Exists(id))),
            Err(error) => return Err(store_error(error)),
        }
        let options = std::mem::take(&mut run.options);
        run.run(How::Start(NewDurableRun {
            id,
            program,
            options,
        }))
        .await
    })
}

/// Resumes the durable run `run_id` from the store at `store`, with `config`'s
/// providers, tools, `on_input` and `on_event`: an awaitable, as [`start_durable`]'s.
#[pyfunction]
pub(crate) fn resume_durable<'py>(
    py: Python<'py>,
    config: RunConfig,
    store: &str,
    run_id: String,
    facade: Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let setup = Setup::new(py, config, store, facade)?;
    let locals = setup.bridge.locals.clone();
    pyo3_async_runtimes::tokio::future_into_py_with_locals(py, locals, async move {
        setup.equip().await?.run(How::Resume(run_id)).await
    })
}

/// Stores `answer` to request `request_id` of the waiting run `run_id`, checked first
/// against the request the store holds (its kind and schema): `reply(request, answer)`
/// (the facade's conversion) makes it a reply. Returns the ids of the requests still
/// unanswered. Anything wrong is a `ValueError`, and nothing is stored.
#[pyfunction]
pub(crate) fn answer_request(
    py: Python<'_>,
    store: &str,
    run_id: String,
    request_id: String,
    answer: Bound<'_, PyAny>,
    by: String,
    reply: Bound<'_, PyAny>,
) -> PyResult<Vec<String>> {
    let url = StoreUrl::parse(store).map_err(store_error)?;
    let runtime = pyo3_async_runtimes::tokio::get_runtime();
    let (store, summary, stored) = py
        .detach(|| {
            runtime.block_on(async {
                let store = store::open(&url).await?;
                let summary = store.summary(&run_id).await?;
                let stored = store.answers(&run_id).await?;
                Ok((store, summary, stored))
            })
        })
        .map_err(store_error)?;
    let (run, request) = (shown_id(&run_id), shown_id(&request_id));
    if summary.state == RunState::Finished {
        return Err(finished(&run));
    }
    if stored.iter().any(|(id, _)| *id == request_id) {
        return Err(already_answered(&run, &request));
    }
    let asked = pending_request(&summary.pending, &run, &request_id)?;
    let given = reply.call1((json_to_py(py, &shown(&asked))?, answer))?;
    let given = py_to_json(&given).map_err(|e| bad_answer(&request, e))?;
    let given = reply_from_json(&given).map_err(|e| bad_answer(&request, e))?;
    asked.request.check(&given).map_err(PyValueError::new_err)?;
    let answer = HumanAnswer {
        id: request_id,
        reply: given,
        by,
        answered_at_ms: now_ms(),
    };
    let answered = py
        .detach(|| runtime.block_on(store.answer(&run_id, &answer.id, answer_json(&answer))))
        .map_err(store_error)?;
    match answered {
        Answered::Accepted { unanswered } => Ok(unanswered),
        Answered::UnknownRun => Err(store_error(StoreError::NotFound(run_id))),
        Answered::UnknownRequest => Err(PyValueError::new_err(format!(
            "run `{run}` waits for no request `{request}`"
        ))),
        Answered::AlreadyAnswered => Err(already_answered(&run, &request)),
        Answered::Finished => Err(finished(&run)),
    }
}

/// An id for a message (a control character shown escaped).
fn shown_id(id: &str) -> String {
    escape_control(id).into_owned()
}

/// The request `id` among a stored run's `pending` ones.
fn pending_request(pending: &[Json], run: &str, id: &str) -> PyResult<Pending> {
    let pending: Vec<Pending> = pending.iter().filter_map(Pending::from_json).collect();
    if let Some(asked) = pending.iter().find(|p| p.request.id == id) {
        return Ok(asked.clone());
    }
    let ids: Vec<String> = pending.iter().map(|p| shown_id(&p.request.id)).collect();
    let waits = match ids.is_empty() {
        true => "it waits for none".to_owned(),
        false => format!("it waits for {}", ids.join(", ")),
    };
    Err(PyValueError::new_err(format!(
        "run `{run}` waits for no request `{}` (answered already, or never asked); {waits}",
        shown_id(id)
    )))
}

fn finished(run: &str) -> PyErr {
    PyValueError::new_err(format!("run `{run}` is finished: it takes no more answers"))
}

fn already_answered(run: &str, request: &str) -> PyErr {
    PyValueError::new_err(format!(
        "request `{request}` of run `{run}` is already answered"
    ))
}

fn bad_answer(request: &str, error: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("the answer to `{request}`: {error}"))
}

/// A request as hosts show it (`spec/human.md` §2): without the store's own fields.
fn shown(pending: &Pending) -> Json {
    let mut json = pending.to_json();
    if let Json::Object(map) = &mut json {
        map.remove("requested_at_ms");
        map.remove("expires_at_ms");
    }
    json
}

/// A store's error for Python, with `message`: what the caller can fix (a URL, a run
/// id, a run in use or finished) is a `ValueError`.
fn store_error_with(error: &StoreError, message: String) -> PyErr {
    match error {
        StoreError::Url(_)
        | StoreError::NotFound(_)
        | StoreError::Exists(_)
        | StoreError::Finished(_)
        | StoreError::Locked(_)
        | StoreError::Foreign(_)
        | StoreError::TooLarge(_) => PyValueError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

fn store_error(error: StoreError) -> PyErr {
    store_error_with(&error, error.to_string())
}

/// The durable driver's error for Python, redacted.
fn durable_error(error: DurableError, redactor: &Redactor) -> PyErr {
    match error {
        DurableError::Store(error) => store_error_with(&error, redactor.redact(&error.to_string())),
        DurableError::Mismatch { id, message } if message.starts_with("the tools differ") => {
            PyValueError::new_err(format!(
                "run `{id}` cannot resume with these tools: they differ from the ones it \
                 started with (pass the same with_tools: its Python tools and manifest)"
            ))
        }
        DurableError::Mismatch { .. } => PyValueError::new_err(redactor.redact(&error.to_string())),
        DurableError::Journal { .. } => {
            PyRuntimeError::new_err(redactor.redact(&error.to_string()))
        }
    }
}

/// The caller's event loop and the facade's run object (`_Run`), which performs what
/// Python provides: each call is one of its coroutines, run on the loop.
struct Bridge {
    locals: TaskLocals,
    facade: Py<PyAny>,
    redactor: Redactor,
}

impl Bridge {
    /// Runs the coroutine `make` returns (given the facade) on the loop, in a copy of the
    /// caller's context (its contextvars), and waits for its result. Dropping the wait
    /// (the run's deadline, a cancelled run) cancels the coroutine's task.
    async fn call(
        &self,
        make: impl FnOnce(Python<'_>, &Bound<'_, PyAny>) -> PyResult<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let task = Python::attach(|py| -> PyResult<Py<PyAny>> {
            let coroutine = make(py, self.facade.bind(py))?;
            let submit = py.import("asyncio")?.getattr("run_coroutine_threadsafe")?;
            let context = self.locals.context(py).call_method0("copy")?;
            let task =
                context.call_method1("run", (submit, coroutine, self.locals.event_loop(py)))?;
            let sender = Mutex::new(Some(sender));
            let done = PyCFunction::new_closure(
                py,
                None,
                None,
                move |args: &Bound<'_, PyTuple>, _: Option<&Bound<'_, PyDict>>| -> PyResult<()> {
                    let result = args.get_item(0)?.call_method0("result").map(Bound::unbind);
                    let sender = sender.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some(sender) = sender {
                        // The run stopped waiting: nobody wants the result.
                        drop(sender.send(result));
                    }
                    Ok(())
                },
            )?;
            task.call_method1("add_done_callback", (done,))?;
            Ok(task.unbind())
        })?;
        let mut guard = CancelOnDrop(Some(task));
        let result = receiver
            .await
            .unwrap_or_else(|_| Err(PyRuntimeError::new_err("the event loop stopped")));
        guard.0 = None;
        result
    }

    /// A Python provider's answer, `(kind, payload)`, as the machine takes it.
    fn provider_answer(&self, answer: PyResult<Py<PyAny>>) -> Result<Completion, ProviderError> {
        Python::attach(|py| {
            let converted = answer.and_then(|pair| {
                let (kind, payload): (String, Bound<'_, PyAny>) = pair.bind(py).extract()?;
                provider_result(&kind, &payload, &self.redactor)
            });
            converted.unwrap_or_else(|e| {
                Err(ProviderError::new(
                    ProviderErrorKind::Other,
                    self.redactor.redact(&e.to_string()),
                ))
            })
        })
    }

    /// A Python tool's answer, `(kind, payload)`, as the machine takes it.
    fn tool_answer(&self, answer: PyResult<Py<PyAny>>) -> Result<Json, String> {
        Python::attach(|py| {
            let converted = answer.and_then(|pair| {
                let (kind, payload): (String, Bound<'_, PyAny>) = pair.bind(py).extract()?;
                tool_result(&kind, &payload, &self.redactor)
            });
            converted.unwrap_or_else(|e| Err(self.redactor.redact(&e.to_string())))
        })
    }
}

/// Cancels a coroutine's task on the loop unless it finished (`None`).
struct CancelOnDrop(Option<Py<PyAny>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            // A concurrent future: its cancel reaches the task on the loop. (Nothing to
            // cancel once the interpreter is shutting down.)
            Python::try_attach(|py| drop(task.bind(py).call_method0("cancel")));
        }
    }
}

/// The run's provider: the facade's `call_provider` for models with a Python provider,
/// the fallback (`providers`, `base_url`) for the others.
struct PyProvider {
    bridge: Arc<Bridge>,
    models: HashSet<String>,
    fallback: Fallback,
}

impl Provider for PyProvider {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        if !answers_for(&self.models, &request.model) {
            return Box::pin(async move {
                match self.fallback.provider() {
                    Ok(provider) => provider.complete(request, call).await,
                    Err(error) => Err(error),
                }
            });
        }
        Box::pin(async move {
            let answer = self
                .bridge
                .call(|py, facade| {
                    let context = provider_context(py, request)?;
                    let call = facade.call_method1("call_provider", (&request.model, context))?;
                    Ok(call.unbind())
                })
                .await;
            self.bridge.provider_answer(answer)
        })
    }
}

/// The `with_tools` functions: the facade's `call_tool`.
struct PyTool(Arc<Bridge>);

impl Tool for PyTool {
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(async move {
            let answer = self
                .0
                .call(|py, facade| {
                    let arguments = json_to_py(py, &invocation.arguments)?;
                    let context = match &invocation.context {
                        Some(context) => json_to_py(py, context)?,
                        None => py.None().into_bound(py),
                    };
                    let call =
                        facade.call_method1("call_tool", (&invocation.name, arguments, context))?;
                    Ok(call.unbind())
                })
                .await;
            self.0.tool_answer(answer)
        })
    }
}

/// A tool of the manifest (command, HTTP, MCP), run by its own toolbox, which holds its
/// MCP servers while the run lasts.
struct ManifestTool(Arc<Toolbox>);

impl Tool for ManifestTool {
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(self.0.call(invocation))
    }
}

/// `on_input`, through the facade's `_answers`: `(id, reply)` for each request, the
/// reply `None` for one left for later (`aplc.LATER`). A request left for later is not
/// asked again in this process: the run pauses on it. What `on_input` raises, or an
/// answer that does not fit its request, is kept for the caller, and the run takes none
/// of this round's answers (it pauses, unchanged).
struct PyAnswerer {
    bridge: Arc<Bridge>,
    later: Mutex<HashSet<String>>,
    error: Mutex<Option<PyErr>>,
}

impl std::fmt::Debug for PyAnswerer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyAnswerer").finish_non_exhaustive()
    }
}

impl PyAnswerer {
    fn take_error(&self) -> Option<PyErr> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The answers in `replies` to `asked`, checked.
    fn read(
        &self,
        py: Python<'_>,
        asked: &[&Pending],
        replies: PyResult<Py<PyAny>>,
    ) -> PyResult<Vec<HumanAnswer>> {
        let replies: Vec<(String, Option<Bound<'_, PyAny>>)> = replies?.bind(py).extract()?;
        let mut answers = Vec::new();
        for (id, reply) in replies {
            let Some(reply) = reply else {
                self.later
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id);
                continue;
            };
            let Some(request) = asked.iter().find(|p| p.request.id == id) else {
                continue;
            };
            let on_input = |e: String| PyValueError::new_err(format!("on_input: {e}"));
            let reply = py_to_json(&reply).map_err(|e| on_input(e.to_string()))?;
            let reply = reply_from_json(&reply).map_err(on_input)?;
            request.request.check(&reply).map_err(on_input)?;
            answers.push(HumanAnswer {
                id,
                reply,
                by: "python".into(),
                answered_at_ms: now_ms(),
            });
        }
        Ok(answers)
    }
}

impl Answerer for PyAnswerer {
    fn answer<'a>(&'a self, pending: &'a [Pending]) -> BoxFuture<'a, Vec<HumanAnswer>> {
        Box::pin(async move {
            let asked: Vec<&Pending> = {
                let later = self.later.lock().unwrap_or_else(|e| e.into_inner());
                (pending.iter())
                    .filter(|p| !later.contains(&p.request.id))
                    .collect()
            };
            if asked.is_empty() || self.error.lock().is_ok_and(|e| e.is_some()) {
                return Vec::new();
            }
            let requests = Json::Array(asked.iter().map(|p| shown(p)).collect());
            let replies = self
                .bridge
                .call(|py, facade| {
                    let call = facade.call_method1("_answers", (json_to_py(py, &requests)?,))?;
                    Ok(call.unbind())
                })
                .await;
            match Python::attach(|py| self.read(py, &asked, replies)) {
                Ok(answers) => answers,
                Err(error) => {
                    *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
                    Vec::new()
                }
            }
        })
    }
}

/// What a durable run is built from, on the loop's thread.
struct Setup {
    url: StoreUrl,
    prepared: Prepared,
    bridge: Arc<Bridge>,
}

impl Setup {
    fn new(py: Python<'_>, config: RunConfig, store: &str, facade: Py<PyAny>) -> PyResult<Setup> {
        let url = StoreUrl::parse(store).map_err(store_error)?;
        let prepared = Prepared::new(py, config)?;
        let bridge = Arc::new(Bridge {
            locals: pyo3_async_runtimes::tokio::get_current_locals(py)?,
            facade,
            redactor: prepared.redactor.clone(),
        });
        Ok(Setup {
            url,
            prepared,
            bridge,
        })
    }

    /// Starts the manifest's MCP servers, opens the store and builds the run's provider,
    /// toolbox and answerer.
    async fn equip(mut self) -> PyResult<Equipped> {
        self.prepared.start_mcp().await?;
        let store = store::open(&self.url).await.map_err(store_error)?;
        let Prepared {
            mut options,
            toolbox: manifest,
            models,
            fallback,
            redactor,
            on_delta,
            on_input,
            ..
        } = self.prepared;
        let toolbox = toolbox(&options, manifest, &self.bridge, &redactor)?;
        options.tools = toolbox.registry();
        let answerer = on_input.then(|| {
            Arc::new(PyAnswerer {
                bridge: self.bridge.clone(),
                later: Mutex::default(),
                error: Mutex::default(),
            })
        });
        let mut config = DurableOptions::default();
        config.redactor = redactor.clone();
        if let Some(answerer) = &answerer {
            config = config.with_answerer(answerer.clone());
        }
        Ok(Equipped {
            store,
            options,
            provider: PyProvider {
                bridge: self.bridge.clone(),
                models: models.into_iter().collect(),
                fallback,
            },
            toolbox,
            config,
            answerer,
            on_event: on_delta,
            bridge: self.bridge,
            redactor,
        })
    }
}

/// One toolbox: `with_tools`' Python tools, then the manifest's (as the in-memory run
/// offers them), two with one name refused.
fn toolbox(
    options: &aplc_vm::RunOptions,
    manifest: Toolbox,
    bridge: &Arc<Bridge>,
    redactor: &Redactor,
) -> PyResult<Toolbox> {
    let mut toolbox = Toolbox::new();
    let python: Arc<dyn Tool> = Arc::new(PyTool(bridge.clone()));
    let spec_error = |e: aplc_vm::tools::ToolSpecError| PyValueError::new_err(e.to_string());
    for name in options.tools.names() {
        if let Some(spec) = options.tools.get(name) {
            toolbox
                .register(spec.clone(), python.clone())
                .map_err(spec_error)?;
        }
    }
    let registry = manifest.registry();
    let manifest: Arc<dyn Tool> = Arc::new(ManifestTool(Arc::new(manifest)));
    for name in registry.names() {
        let Some(spec) = registry.get(name) else {
            continue;
        };
        if toolbox.registry().get(name).is_some() {
            return Err(duplicate_tool(name));
        }
        toolbox
            .register(spec.clone(), manifest.clone())
            .map_err(spec_error)?;
    }
    toolbox.redact_with(redactor.clone());
    Ok(toolbox)
}

/// A new run, or one to resume.
enum How {
    Start(NewDurableRun),
    Resume(String),
}

/// A durable run ready to go, on the tokio runtime.
struct Equipped {
    store: Arc<dyn RunStore>,
    options: aplc_vm::RunOptions,
    provider: PyProvider,
    toolbox: Toolbox,
    config: DurableOptions,
    answerer: Option<Arc<PyAnswerer>>,
    /// `on_event` (through the facade), when someone listens.
    on_event: Option<Py<PyAny>>,
    bridge: Arc<Bridge>,
    redactor: Redactor,
}

impl Equipped {
    /// Drives the run with the durable driver until it ends or waits.
    async fn run(self, how: How) -> PyResult<Py<PyAny>> {
        let bridge = self.bridge.clone();
        // Every event, redacted, to `on_event` on the loop, in order (and before the
        // run's result, which reaches the loop the same way after them).
        let mut sink = self.on_event.map(|callback| {
            move |event: &Event| {
                let json = bridge.redactor.redact_json(event.to_json());
                Python::attach(|py| schedule(py, &bridge.locals, &callback, &json));
            }
        });
        let listener = sink
            .as_mut()
            .map(|sink| sink as &mut (dyn FnMut(&Event) + Send));
        let store: &dyn RunJournal = self.store.as_ref();
        let (id, ended) = match how {
            How::Start(run) => {
                let id = run.id.clone();
                let ended = durable::start(
                    store,
                    run,
                    &self.provider,
                    &self.toolbox,
                    listener,
                    &self.config,
                )
                .await;
                (id, ended)
            }
            How::Resume(id) => {
                let ended = durable::resume(
                    store,
                    &id,
                    None,
                    &self.provider,
                    &self.toolbox,
                    listener,
                    &self.config,
                )
                .await;
                (id, ended)
            }
        };
        let ended = ended.map_err(|e| durable_error(e, &self.redactor))?;
        let error = self.answerer.and_then(|answerer| answerer.take_error());
        Python::attach(|py| ended_to_py(py, ended, &id, error, &self.redactor))
    }
}

/// How the run stopped, for the facade.
fn ended_to_py(
    py: Python<'_>,
    ended: Ended,
    id: &str,
    error: Option<PyErr>,
    redactor: &Redactor,
) -> PyResult<Py<PyAny>> {
    let tuple = match ended {
        Ended::Finished(finished) => PyTuple::new(
            py,
            [
                "done".into_pyobject(py)?.into_any(),
                outcome_to_py(py, &finished.outcome, redactor)?,
                error_to_py(py, &finished.outcome, redactor)?,
                finished
                    .program
                    .dialect()
                    .as_str()
                    .into_pyobject(py)?
                    .into_any(),
            ],
        )?,
        Ended::Waiting(waiting) => {
            let pending = Json::Array(waiting.pending.iter().map(shown).collect());
            let error = match error {
                Some(error) => error.into_value(py).into_any().into_bound(py),
                None => py.None().into_bound(py),
            };
            PyTuple::new(
                py,
                [
                    "waiting".into_pyobject(py)?.into_any(),
                    id.into_pyobject(py)?.into_any(),
                    json_to_py(py, &redactor.redact_json(pending))?,
                    error,
                ],
            )?
        }
    };
    Ok(tuple.into_any().unbind())
}
