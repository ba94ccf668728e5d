//! Runs: a loaded program, and one run of it driven by `aplc-runtime`'s tokio driver with
//! Python providers and tools.
//!
//! The run is a tokio task (pyo3-async-runtimes' runtime) that never holds the GIL while
//! the VM works. A Python provider or tool call is a coroutine scheduled on the caller's
//! event loop (`into_future_with_locals`); its answer comes back as a `(kind, payload)`
//! pair, the payload JSON text, so the facade's wrappers decide what is an error and this
//! side never branches on message text. Events go to the loop too, in order, with
//! `call_soon_threadsafe`. Cancelling the awaiting task drops the run's future, which
//! cancels the run's [`Interrupt`] on the way out.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aplc_runtime::driver::{self, BoxFuture, CallContext, Provider, Tool, Toolbox};
use aplc_runtime::openai::{OpenAiConfig, OpenAiProvider};
use aplc_runtime::routing::Router;
use aplc_runtime::{DeltaRedactor, Redactor};
use aplc_vm::tools::{ToolInvocation, ToolSpec};
use aplc_vm::{
    Completion, Event, Interrupt, Program, ProviderError, ProviderErrorKind, ProviderRequest,
    RunOptions, RunOutcome,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3_async_runtimes::TaskLocals;
use serde_json::Value as Json;

use crate::check::{Report, SOURCE_NAME, dialect_named, report};

/// A loaded program: compiled once, run any number of times, from any thread.
#[pyclass(frozen, name = "NativeProgram", module = "aplc._aplc")]
pub(crate) struct NativeProgram {
    program: Arc<Program>,
}

/// What the facade passes to [`NativeProgram::run`]: the options, already checked and
/// turned into plain values (a dict with exactly these keys).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct RunConfig {
    /// `with_context`, as a JSON object.
    context_json: String,
    timeout_ms: u64,
    max_runs: Option<u64>,
    max_steps: u64,
    /// The models `call_provider` answers for (`with_providers`' keys).
    models: Vec<String>,
    /// `async (model, context_json) -> (kind, payload)`.
    call_provider: Py<PyAny>,
    /// `(descriptor_json, with_context)` for each tool of `with_tools`.
    tools: Vec<(String, bool)>,
    /// `async (name, arguments_json, context_json | None) -> (kind, payload)`.
    call_tool: Py<PyAny>,
    /// `(event_json) -> None`, called on the event loop; `None` when nobody listens.
    on_event: Option<Py<PyAny>>,
    base_url: Option<String>,
    api_key: Option<String>,
    /// A providers config (spec/providers.md), as JSON.
    providers_json: Option<String>,
}

/// How a run ends, for the facade: the final context as JSON, and the failure if any as
/// `(kind, message, step)`.
type Finished = (String, Option<(String, String, Option<String>)>);

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

    /// Starts a run on the caller's event loop: an awaitable of [`Finished`].
    fn run<'py>(&self, py: Python<'py>, config: RunConfig) -> PyResult<Bound<'py, PyAny>> {
        let locals = pyo3_async_runtimes::tokio::get_current_locals(py)?;
        let setup = Setup::new(py, &locals, config)?;
        let program = self.program.clone();
        pyo3_async_runtimes::tokio::future_into_py_with_locals(py, locals, async move {
            Ok(setup.run(program).await)
        })
    }
}

/// Everything a run needs, built on the caller's thread so bad options fail at once.
struct Setup {
    options: RunOptions,
    provider: PythonProviders,
    toolbox: Toolbox,
    on_event: Option<(TaskLocals, Py<PyAny>)>,
    redactor: Redactor,
}

impl Setup {
    fn new(py: Python<'_>, locals: &TaskLocals, config: RunConfig) -> PyResult<Setup> {
        let context: Json = serde_json::from_str(&config.context_json)
            .map_err(|e| PyTypeError::new_err(format!("with_context: {e}")))?;
        let Json::Object(context) = context else {
            return Err(PyTypeError::new_err("with_context must be a dict"));
        };
        if config.max_steps == 0 {
            return Err(PyValueError::new_err("max_steps must be at least 1"));
        }
        let options = RunOptions {
            timeout: Duration::from_millis(config.timeout_ms),
            max_runs: config.max_runs,
            max_steps: config.max_steps,
            ..RunOptions::default()
        }
        .with_context_json(&context);

        let mut secrets: Vec<String> = config.api_key.iter().cloned().collect();
        let env_key = std::env::var("OPENAI_API_KEY").ok();
        secrets.extend(env_key.clone());
        let fallback = match &config.providers_json {
            Some(text) => {
                let read = std::cell::RefCell::new(Vec::new());
                let env = |name: &str| {
                    let value = std::env::var(name).ok();
                    read.borrow_mut().extend(value.clone());
                    value
                };
                let router = Router::from_config_json(text, &env)
                    .map_err(|e| PyValueError::new_err(format!("providers: {e}")))?;
                secrets.extend(read.into_inner());
                Fallback::Ready(Arc::new(router))
            }
            None => Fallback::Http {
                base_url: config.base_url,
                api_key: config.api_key.or(env_key),
                built: OnceLock::new(),
            },
        };
        let redactor = Redactor::new(secrets.iter().map(String::as_str));

        let mut toolbox = Toolbox::new();
        for (descriptor, with_context) in config.tools {
            let descriptor: Json = serde_json::from_str(&descriptor)
                .map_err(|e| PyValueError::new_err(format!("tool descriptor: {e}")))?;
            let spec = ToolSpec::new(descriptor)
                .map_err(PyValueError::new_err)?
                .with_context(with_context);
            let tool = PythonTool {
                name: spec.name().to_owned(),
                locals: locals.clone(),
                call: config.call_tool.clone_ref(py),
            };
            toolbox
                .register(spec, Arc::new(tool))
                .map_err(PyValueError::new_err)?;
        }
        toolbox.redact_with(redactor.clone());

        Ok(Setup {
            options,
            provider: PythonProviders {
                models: config.models.into_iter().collect(),
                call: config.call_provider,
                locals: locals.clone(),
                fallback,
                redactor: redactor.clone(),
            },
            toolbox,
            on_event: config.on_event.map(|f| (locals.clone(), f)),
            redactor,
        })
    }

    /// Runs `program` to the end.
    async fn run(self, program: Arc<Program>) -> Finished {
        let Setup {
            options,
            provider,
            toolbox,
            on_event,
            redactor,
        } = self;
        // Dropped when the run ends or when its future is dropped (the awaiting task was
        // cancelled): either way the machine stops at its next instruction.
        let _cancel = CancelOnDrop(options.interrupt.clone());
        let outcome = match on_event {
            Some((locals, callback)) => {
                let send = |event: &Event| {
                    let json = redactor.redact_json(event.to_json()).to_string();
                    Python::attach(|py| {
                        let sent = locals
                            .event_loop(py)
                            .call_method1("call_soon_threadsafe", (callback.bind(py), json));
                        // The loop is closed: nobody is left to tell.
                        drop(sent);
                    });
                };
                // A call's deltas are redacted as one text: a key cut across two is
                // caught too.
                let mut deltas = DeltaRedactor::new(redactor.clone());
                let mut listener = |event: &Event| deltas.on_event(event, send);
                let outcome =
                    driver::run_with_listener(program, options, &provider, &toolbox, &mut listener)
                        .await;
                deltas.finish(send);
                outcome
            }
            None => driver::run_with_tools(program, options, &provider, &toolbox).await,
        };
        finished(&outcome, &redactor)
    }
}

/// The facade's view of `outcome`, with every secret redacted.
fn finished(outcome: &RunOutcome, redactor: &Redactor) -> Finished {
    let context = redactor.redact_json(outcome.context_json()).to_string();
    let error = outcome.error.as_ref().map(|error| {
        (
            error.kind.as_str().to_owned(),
            redactor.redact(&error.message),
            error.step.clone(),
        )
    });
    (context, error)
}

/// Cancels a run's interrupt when dropped.
struct CancelOnDrop(Interrupt);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The provider of a run: the Python callables of `with_providers` by model name, and
/// for every other model the HTTP provider (`base_url`, `api_key`) or the `providers`
/// router.
struct PythonProviders {
    models: HashSet<String>,
    call: Py<PyAny>,
    locals: TaskLocals,
    fallback: Fallback,
    /// A Python provider's error message may quote the key it was given.
    redactor: Redactor,
}

/// The provider for models without a Python callable.
enum Fallback {
    /// A router from the `providers` option.
    Ready(Arc<dyn Provider>),
    /// The OpenAI-compatible HTTP provider, built on first use: most runs with Python
    /// providers never need its HTTP client.
    Http {
        base_url: Option<String>,
        api_key: Option<String>,
        built: OnceLock<Result<Arc<dyn Provider>, String>>,
    },
}

impl Fallback {
    fn provider(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        match self {
            Fallback::Ready(provider) => Ok(provider.clone()),
            Fallback::Http {
                base_url,
                api_key,
                built,
            } => built
                .get_or_init(|| {
                    let mut config = OpenAiConfig::new();
                    if let Some(url) = base_url {
                        config = config.base_url(url.clone());
                    }
                    if let Some(key) = api_key.as_ref().filter(|k| !k.trim().is_empty()) {
                        config = config.api_key(key.clone());
                    }
                    OpenAiProvider::new(config).map(|p| Arc::new(p) as Arc<dyn Provider>)
                })
                .clone()
                .map_err(|e| ProviderError::new(ProviderErrorKind::InvalidRequest, e)),
        }
    }
}

impl Provider for PythonProviders {
    fn complete<'a>(
        &'a self,
        request: &'a ProviderRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            if !self.models.contains(&request.model) {
                return self.fallback.provider()?.complete(request, call).await;
            }
            let context = context_json(request);
            let failed =
                |kind, message: String| ProviderError::new(kind, self.redactor.redact(&message));
            let answer = call_python(&self.locals, &self.call, (request.model.as_str(), context))
                .await
                .map_err(|message| failed(ProviderErrorKind::Other, message))?;
            match answer {
                Answer::Ok(payload) => {
                    let value: Json = serde_json::from_str(&payload).map_err(|e| {
                        ProviderError::new(
                            ProviderErrorKind::InvalidResponse,
                            format!("invalid provider response: {e}"),
                        )
                    })?;
                    aplc_vm::wire::openai::decode_value(&value)
                }
                Answer::Invalid(message) => {
                    Err(failed(ProviderErrorKind::InvalidResponse, message))
                }
                Answer::Raised(message) => Err(failed(ProviderErrorKind::Other, message)),
            }
        })
    }
}

/// A tool of `with_tools`: the facade's `call_tool` with the tool's name.
struct PythonTool {
    name: String,
    locals: TaskLocals,
    call: Py<PyAny>,
}

impl Tool for PythonTool {
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        Box::pin(async move {
            let arguments = invocation.arguments.to_string();
            let context = invocation.context.as_ref().map(Json::to_string);
            let args = (self.name.as_str(), arguments, context);
            match call_python(&self.locals, &self.call, args).await? {
                Answer::Ok(payload) => serde_json::from_str(&payload)
                    .map_err(|e| format!("the tool's result is not JSON: {e}")),
                Answer::Invalid(message) | Answer::Raised(message) => Err(message),
            }
        })
    }
}

/// What a facade wrapper answered.
enum Answer {
    /// JSON text of the result.
    Ok(String),
    /// The callable returned something that is not a valid result.
    Invalid(String),
    /// The callable raised.
    Raised(String),
}

/// Calls `function(*args)` on the loop of `locals` and awaits the coroutine it returns,
/// without holding the GIL while waiting. An error is the reason in words.
async fn call_python<A>(
    locals: &TaskLocals,
    function: &Py<PyAny>,
    args: A,
) -> Result<Answer, String>
where
    A: for<'py> pyo3::call::PyCallArgs<'py>,
{
    let pending = Python::attach(|py| {
        let coroutine = function.bind(py).call1(args)?;
        pyo3_async_runtimes::into_future_with_locals(locals, coroutine)
    })
    .map_err(|e| e.to_string())?;
    let answer = pending.await.map_err(|e| e.to_string())?;
    let (kind, payload): (String, String) =
        Python::attach(|py| answer.extract(py)).map_err(|e: PyErr| e.to_string())?;
    Ok(match kind.as_str() {
        "ok" => Answer::Ok(payload),
        "invalid" => Answer::Invalid(payload),
        _ => Answer::Raised(payload),
    })
}

/// The context a Python provider receives (§4), as JSON text: every variable of the
/// request's snapshot.
fn context_json(request: &ProviderRequest) -> String {
    let map: serde_json::Map<String, Json> = request
        .context
        .iter()
        .map(|(name, value)| {
            let json =
                serde_json::to_value(value).unwrap_or_else(|_| Json::from(value.to_string()));
            (name.to_owned(), json)
        })
        .collect();
    Json::Object(map).to_string()
}
