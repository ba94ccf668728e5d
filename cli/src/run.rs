//! Running an agent from the command line: loading or compiling it, its provider and
//! tools (`WithArgs`), what it prints and records (`OutputArgs`), and the in-memory run
//! of `aplc run` (`run_command.rs`). `aplc resume` and `run --store` (`durable.rs`) share
//! all but the in-memory run; this module imports neither of them.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use aplc_runtime::Secrets;
use aplc_runtime::driver::{self, Scripted};
use aplc_runtime::equip::{self, EquipError, Source, Warning};
use aplc_runtime::telemetry::RunTrace;
use aplc_vm::text::escape_control;
use aplc_vm::{Program, RunError, RunErrorKind, RunOptions, RunOutcome};
use clap::Args;

use crate::compile::{compile_linked, compile_options};
use crate::events::Sinks;
use crate::input::{into_text, print_linked, read_bytes, read_json};
use crate::record::Recorder;
use crate::{CompileArgs, Failure};

/// The provider and the tools of a run: shared by `aplc run` and `aplc resume`.
#[derive(Args, Debug)]
pub(crate) struct WithArgs {
    /// Use the scripted provider with these responses (a JSON array, one entry per call).
    #[arg(long, value_name = "RESPONSES.json")]
    pub(crate) mock: Option<PathBuf>,
    /// Tool manifest: a JSON object from tool name to `{"command": [...]}` or `{"url": ...}`
    /// with its OpenAI function `descriptor` (see spec/tools.md).
    #[arg(long, value_name = "TOOLS.json")]
    pub(crate) tools: Option<PathBuf>,
    /// Route models to providers with this JSON file (see spec/providers.md).
    #[arg(long, value_name = "PROVIDERS.json")]
    providers: Option<PathBuf>,
    /// API key for the OpenAI-compatible provider; defaults to $OPENAI_API_KEY. Prefer
    /// the variable: command lines are visible to other users of the machine.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Base URL of an OpenAI-compatible server (default https://api.openai.com; a
    /// trailing /v1 is fine).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// Stream each provider call's text to stdout as it arrives, calls separated by a
    /// newline; the final `result_text` is not printed again (`--json` still prints the
    /// context). `--mock` sends each answer's text whole.
    #[arg(long)]
    pub(crate) stream: bool,
}

/// What a run prints and records: shared by `aplc run` and `aplc resume`.
#[derive(Args, Debug)]
pub(crate) struct OutputArgs {
    /// Print the final context as one JSON object instead of `result_text`.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write the provider's responses of this run, in order, to this file: a JSON array
    /// that `--mock` and a test's `responses = { file = "…" }` replay (spec/testing.md).
    #[arg(long, value_name = "RESPONSES.json")]
    pub(crate) record: Option<PathBuf>,
    /// Write the run's events to this file as JSON Lines, one object per line
    /// (spec/events.md). `/dev/stderr` works.
    #[arg(long, value_name = "FILE")]
    pub(crate) events: Option<PathBuf>,
    /// No progress line on stderr (it is shown only when stderr is a terminal).
    #[arg(long, short = 'q')]
    pub(crate) quiet: bool,
    /// Print each step, provider call, tool call and error on stderr as it happens, with
    /// the time since the run started (instead of the progress line).
    #[arg(long, short = 'v')]
    pub(crate) verbose: bool,
    #[command(flatten)]
    pub(crate) telemetry: crate::telemetry::TelemetryArgs,
}

/// A run's provider (wrapped for `--record`), tools and secrets, from its flags.
pub(crate) struct Equipment {
    pub(crate) provider: Recorder,
    pub(crate) toolbox: driver::Toolbox,
    pub(crate) secrets: Secrets,
    /// The HTTP provider has no key for api.openai.com: warn once the agent loaded.
    pub(crate) no_key: bool,
    /// The `--mock` provider, which a resumed run advances past the calls it replayed.
    pub(crate) scripted: Option<Arc<Scripted>>,
    /// `--stream`: the providers stream, and the text goes to stdout as it arrives.
    pub(crate) stream: bool,
}

impl WithArgs {
    /// Builds the provider and the toolbox. `store` is the run's store URL, whose
    /// password is a secret.
    pub(crate) fn equip(&self, recording: bool, store: Option<&str>) -> Result<Equipment, Failure> {
        // Every secret aplc knows of (spec/limits.md, "Secrets and redaction"), whichever
        // this run uses: tools see none of their variables, and no output shows a value.
        let mut secrets = Secrets::from_env();
        if let Some(url) = store {
            secrets.store_url(url);
        }
        let equipment = equip::Builder::new(secrets)
            .mock(self.mock.clone().map(Source::File))
            .providers(self.providers.clone().map(Source::File))
            .base_url(self.base_url.clone())
            .api_key(self.api_key.clone())
            .tools(self.tools.clone())
            // `start_mcp` starts them on the run's runtime.
            .mcp(true)
            .stream(self.stream)
            .build(&Flags)
            .map_err(|e| match e {
                EquipError::MockAndProviders => Failure::usage(
                    "--mock and --providers both choose the provider; pass one of them",
                ),
                e => Failure::usage(e.to_string()),
            })?;
        Ok(Equipment {
            provider: Recorder::new(Box::new(equipment.provider), recording),
            toolbox: equipment.toolbox,
            secrets: equipment.secrets,
            no_key: equipment.no_key,
            scripted: equipment.scripted,
            stream: self.stream,
        })
    }
}

/// The command line's environment: the process's variables, input files read as every
/// JSON input is (bounded, UTF-8, no key twice), warnings on stderr in the flags' words.
struct Flags;

impl equip::Environment for Flags {
    fn var(&self, name: &str) -> Result<String, std::env::VarError> {
        std::env::var(name)
    }

    fn read(&self, path: &Path) -> std::io::Result<String> {
        read_json(path).map_err(|failure| std::io::Error::other(failure.message))
    }

    fn warn(&self, warning: Warning) {
        let message = match warning {
            Warning::HttpSettingsWithMock => "--api-key and --base-url are not used with --mock",
            Warning::HttpSettingsWithProviders => {
                "--api-key and --base-url are not used with --providers; each route names its \
                 own base_url and api_key_env"
            }
            Warning::KeyNotUnicode => "OPENAI_API_KEY is not valid UTF-8; ignoring it",
            _ => return,
        };
        eprintln!("warning: {message}");
    }
}

/// The warning for an HTTP provider without a key, once it is certain the run calls it.
pub(crate) fn warn_no_key(no_key: bool) {
    if no_key {
        eprintln!(
            "warning: no API key: set OPENAI_API_KEY or pass --api-key \
             (or --mock RESPONSES.json to run without a model)"
        );
    }
}

/// The async runtime a run is driven on.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::run(format!("cannot start the async runtime: {e}")))
}

/// Starts the MCP servers of the tools manifest on `runtime`, the one the run is driven
/// on, before any provider call (`spec/mcp.md`): a server that fails to start, initialize
/// or list is exit 1 naming it; a manifest problem found in the listing (two tools with
/// one name) is exit 2.
pub(crate) fn start_mcp(
    runtime: &tokio::runtime::Runtime,
    toolbox: &mut driver::Toolbox,
) -> Result<(), Failure> {
    // SIGINT or SIGTERM while a server starts drops the start, which kills its group.
    let started = runtime
        .block_on(crate::signals::unless_interrupted(toolbox.start_mcp()))
        .map_err(|e| Failure::run(e.to_string()))?
        .map_err(|signal| signal.failure())?;
    started.map_err(|e| {
        let message = escape_control(&e.to_string()).into_owned();
        if e.is_manifest_error() {
            Failure::usage(message)
        } else {
            Failure::run(message)
        }
    })
}

/// Runs the agent in memory (`aplc run` without `--store`), printing and recording what
/// `output` asks for.
pub(crate) fn in_memory(
    output: &OutputArgs,
    program: Arc<Program>,
    options: RunOptions,
    equipment: Equipment,
    exporting: Option<&crate::telemetry::Exporting>,
    answerer: &dyn aplc_runtime::human::Answerer,
) -> Result<ExitCode, Failure> {
    let Equipment {
        provider,
        mut toolbox,
        secrets,
        stream,
        ..
    } = equipment;

    let runtime = runtime()?;
    start_mcp(&runtime, &mut toolbox)?;
    // The progress line would redraw over the streamed text on a terminal.
    let progress = !output.quiet && !stream && std::io::stderr().is_terminal();
    let trace =
        exporting.and_then(|e| e.run(secrets.redactor(), None, &program.bundle().source_name));
    let mut sinks = Sinks::open(
        output.events.as_deref(),
        progress,
        output.verbose,
        secrets.redactor(),
    )?
    .streaming(stream)
    .with_trace(trace.clone());
    let calls = &RunTrace::provider_of(trace.as_ref(), &provider);
    let outcome = if sinks.listening() {
        let mut listener = |event: &aplc_vm::Event| sinks.on_event(event);
        let run = driver::run_with_answerer(
            program.clone(),
            options,
            calls,
            &toolbox,
            Some(&mut listener),
            answerer,
        );
        runtime.block_on(crate::signals::unless_interrupted(run))
    } else {
        let run =
            driver::run_with_answerer(program.clone(), options, calls, &toolbox, None, answerer);
        runtime.block_on(crate::signals::unless_interrupted(run))
    };
    // Flushed and cleared before anything else is printed, on every path out.
    let written = sinks.finish();
    let outcome = outcome
        .map_err(|e| Failure::run(e.to_string()))?
        .map_err(|signal| signal.failure())?;
    written?;
    let result = report(&program, &outcome, output.json, stream);
    match &output.record {
        Some(path) => provider.write_after(path, result),
        None => result,
    }
}

/// Writes `value` as pretty JSON, like `serde_json::to_writer_pretty`, except that the
/// indentation stops growing after [`MAX_INDENT_LEVELS`] levels: with ever deeper
/// indentation the output grows with the square of the depth (400 MB for a value
/// 10,000 deep, issue #9 F3); with this it stays linear in the value's size.
fn write_json(out: &mut impl Write, value: &serde_json::Value) -> std::io::Result<()> {
    use serde::Serialize;
    let mut ser = serde_json::Serializer::with_formatter(
        std::io::BufWriter::new(out),
        ShallowPretty::default(),
    );
    value.serialize(&mut ser).map_err(std::io::Error::other)?;
    ser.into_inner().flush()
}

/// Levels of nesting that are indented; deeper levels line up with the last one.
const MAX_INDENT_LEVELS: usize = 32;

/// serde_json's `PrettyFormatter` (two spaces per level), with bounded indentation.
#[derive(Default)]
struct ShallowPretty {
    level: usize,
    has_value: bool,
}

impl ShallowPretty {
    fn indent<W: ?Sized + Write>(&self, w: &mut W) -> std::io::Result<()> {
        for _ in 0..self.level.min(MAX_INDENT_LEVELS) {
            w.write_all(b"  ")?;
        }
        Ok(())
    }

    fn open<W: ?Sized + Write>(&mut self, w: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + Write>(&mut self, w: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_value {
            w.write_all(b"\n")?;
            self.indent(w)?;
        }
        w.write_all(bracket)
    }

    fn item<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        w.write_all(if first { b"\n" } else { b",\n" })?;
        self.indent(w)
    }
}

impl serde_json::ser::Formatter for ShallowPretty {
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// Prints a run's output and picks the exit code.
/// With `streamed` (`--stream`), the calls' text is on stdout already: plain output
/// adds nothing, `json` the context.
pub(crate) fn report(
    program: &Program,
    outcome: &RunOutcome,
    json: bool,
    streamed: bool,
) -> Result<ExitCode, Failure> {
    let mut stdout = std::io::stdout().lock();
    let printed = if json {
        write_json(&mut stdout, &outcome.context_json()).and_then(|_| writeln!(stdout))
    } else if outcome.error.is_none() && !streamed {
        // `result_text` is the agent's output: piped, it stays byte for byte; on a
        // terminal, what the model wrote must not drive the terminal.
        let text = outcome.result_text();
        if stdout.is_terminal() {
            writeln!(stdout, "{}", escape_control(&text))
        } else {
            writeln!(stdout, "{text}")
        }
    } else {
        Ok(())
    };
    // A closed stdout (e.g. `aplc run … | head`) is not a run failure.
    let _ = printed.and_then(|_| stdout.flush());

    if let Some(error) = &outcome.error {
        return Err(run_failure(program, error));
    }
    if !outcome.last_step_errors.is_empty() {
        eprintln!("the last step ended with errors:");
        for e in &outcome.last_step_errors {
            eprintln!("  - {}", escape_control(e));
        }
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses `options` for `program` as a run of them would end, before any run starts:
/// an input that is missing or cannot be set (`aplc bench`, which would otherwise start
/// every run only to see each fail the same way).
pub(crate) fn check_options(program: &Program, options: &RunOptions) -> Result<(), Failure> {
    match aplc_vm::options_error(program, options) {
        Some(error) => Err(run_failure(program, &error)),
        None => Ok(()),
    }
}

/// The failure a run error makes: its message (with the step and where it is in the
/// source) and the exit code.
fn run_failure(program: &Program, error: &RunError) -> Failure {
    let mut message = error.message.clone();
    if let Some(step) = &error.step {
        message.push_str(&format!("\n  in step `{step}`"));
        if let Some(span) = error.span {
            message.push_str(&format!(
                " ({}:{}:{})",
                program.bundle().source_name,
                span.line,
                span.col
            ));
        }
    }
    // Bad options and missing inputs are the caller's mistake, found before any
    // provider call: usage errors, like a bad flag.
    let code = match error.kind {
        RunErrorKind::InvalidOptions => 2,
        RunErrorKind::MissingInput => {
            message
                .push_str("\n  pass the agent's inputs in a JSON object with --context FILE.json");
            2
        }
        _ => 1,
    };
    Failure { code, message }
}

/// Adds the variables of a `--context` file to `options`.
pub(crate) fn context_options(
    options: RunOptions,
    path: Option<&Path>,
) -> Result<RunOptions, Failure> {
    let Some(path) = path else { return Ok(options) };
    let text = read_json(path)?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Failure::usage(format!("{}: invalid JSON: {e}", path.display())))?;
    let serde_json::Value::Object(object) = value else {
        return Err(Failure::usage(format!(
            "{}: expected a JSON object of variables",
            path.display()
        )));
    };
    Ok(options.with_context_json(&object))
}

/// The agents a run of `program` may call by a name computed at run time
/// (`spec/agents.md` §2.5): every agent of the `--agents` directories that its bundle does
/// not link, the first directory's first, a source over a bundle. None without
/// `--agents`, or when no template calls an agent and no tool runs one. An agent that
/// does not load is left out with a warning: the run goes on, and a call of it fails as
/// an unknown agent's.
pub(crate) fn agents_by_name(
    program: &Program,
    args: &CompileArgs,
    has_agent_tools: bool,
) -> std::sync::Arc<aplc_vm::AgentTable> {
    let mut table = aplc_vm::AgentTable::new();
    if args.agents.is_empty() || !(program.may_call_agents() || has_agent_tools) {
        return std::sync::Arc::new(table);
    }
    let options = compile_options(args);
    for dir in &args.agents {
        let Ok(entries) = std::fs::read_dir(dir) else {
            eprintln!(
                "warning: --agents {}: not a readable directory",
                dir.display()
            );
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.path().file_stem()?.to_str().map(str::to_owned))
            .filter(|name| aplc_vm::names::is_agent_name(name))
            .collect();
        names.sort();
        names.dedup();
        let files = aplc_runtime::link::AgentDirs::new(vec![dir.clone()]);
        for name in names {
            if table.len() >= aplc_vm::bundle::MAX_LINKED_AGENTS {
                eprintln!(
                    "warning: --agents: more than {} agents; the rest are left out",
                    aplc_vm::bundle::MAX_LINKED_AGENTS
                );
                return std::sync::Arc::new(table);
            }
            if table.contains_key(&name) || program.agent(&name).is_some() {
                continue;
            }
            match load_agent(&files, &name, &options, args) {
                Ok(Some(agent)) => {
                    table.insert(name, std::sync::Arc::new(agent));
                }
                Ok(None) => {}
                Err(message) => eprintln!(
                    "warning: agent `{}` is left out of the run: {}",
                    escape_control(&name),
                    escape_control(&message)
                ),
            }
        }
    }
    std::sync::Arc::new(table)
}

/// The agent `name` of `files`, compiled and linked if it is source.
fn load_agent(
    files: &aplc_runtime::link::AgentDirs,
    name: &str,
    options: &aplc_compiler::Options,
    args: &CompileArgs,
) -> Result<Option<Program>, String> {
    let bundle = match files.read(name)? {
        None => return Ok(None),
        Some(aplc_runtime::link::AgentFile::Bundle { bundle, .. }) => *bundle,
        Some(aplc_runtime::link::AgentFile::Source { source, file_name }) => {
            let path = Path::new(&file_name);
            let linked = compile_linked(path, &source, options, args, Vec::new());
            linked
                .bundle
                .ok_or_else(|| format!("{file_name} has errors (`aplc check {file_name}`)"))?
        }
    };
    Program::from_bundle_in(bundle, aplc_vm::Limits::default(), args.dialect)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Loads a bundle, or compiles source in memory with its agents linked.
///
/// `inputs` are the `with_context` variables the run will have: the compiler treats them
/// as declared inputs, so reading them is not an undefined variable.
pub(crate) fn load_program(
    file: &Path,
    args: &CompileArgs,
    inputs: &RunOptions,
) -> Result<Program, Failure> {
    load_program_with_tools(file, args, inputs, None)
}

/// [`load_program`], linking also the agents the tool manifest `tools` names with
/// `{"agent": …}` (spec/agents.md §2).
pub(crate) fn load_program_with_tools(
    file: &Path,
    args: &CompileArgs,
    inputs: &RunOptions,
    tools: Option<&Path>,
) -> Result<Program, Failure> {
    let bytes = read_bytes(file)?;
    if aplc_vm::bundle::is_bundle(&bytes) {
        if args.relaxed {
            eprintln!(
                "warning: --relaxed has no effect on a bundle: it was fixed when the bundle was built"
            );
        }
        return Program::load_in(&bytes, args.dialect)
            .map_err(|e| Failure::run(format!("{}: unreadable bundle: {e}", file.display())));
    }
    let source = into_text(file, bytes)?;
    let mut options = compile_options(args);
    options
        .inputs
        .extend(inputs.with_context.iter().map(|(name, _)| name.clone()));
    let extra_names = match tools {
        Some(path) => aplc_runtime::link::manifest_agent_names(&read_json(path)?),
        None => Vec::new(),
    };
    let linked = compile_linked(file, &source, &options, args, extra_names);
    print_linked(&linked, file, &source);
    let bundle = linked.bundle.ok_or_else(|| Failure {
        code: 2,
        message: format!("{} has errors; not running it", file.display()),
    })?;
    Program::from_bundle_in(bundle, aplc_vm::Limits::default(), args.dialect)
        .map_err(|e| Failure::run(format!("{}: {e}", file.display())))
}
