//! `*.test.toml` files: discovery, the TOML format, and loading a file into runnable cases.
//!
//! Everything that can be wrong with a test file is found here, before any case runs:
//! bad TOML, an unknown key, a missing agent or responses file, an agent that does not
//! compile, an `expect` expression that does not parse. Each is an [`InvalidFile`]
//! (exit 2), never a silently skipped assertion. The format is documented in
//! `spec/testing.md`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aplc_compiler::MAX_SOURCE_LEN;
use aplc_runtime::driver::Toolbox;
use aplc_vm::minijinja::{Environment, Expression};
use aplc_vm::text::{escape_control, truncate_chars};
use aplc_vm::{DEFAULT_TIMEOUT, Program, RunOptions, ScriptedProvider};
use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::CompileArgs;
use crate::input::{into_text, read_at_most, read_json};
use crate::run::load_program;

/// The suffix that marks a test file during discovery.
pub(crate) const SUFFIX: &str = ".test.toml";

/// A test file that cannot be run: where, and why.
#[derive(Debug)]
pub(crate) struct InvalidFile {
    pub file: String,
    pub message: String,
}

/// A loaded test file: its agent, compiled once, and its cases.
pub(crate) struct TestFile<'env> {
    /// The path as the user sees it (relative to the current directory when discovered).
    pub display: String,
    pub program: Arc<Program>,
    pub cases: Vec<Case<'env>>,
}

/// One `[[case]]`, ready to run.
pub(crate) struct Case<'env> {
    pub name: String,
    pub context: Map<String, Json>,
    pub responses: ScriptedProvider,
    /// Each `expect` entry with its expression, compiled once.
    pub expect: Vec<(String, Expression<'env, 'static>)>,
    pub expect_error: Option<String>,
    pub max_runs: Option<u64>,
    pub timeout: Duration,
    pub toolbox: Toolbox,
    /// The run's step budget; `None` is the default (`DEFAULT_MAX_STEPS`).
    pub max_steps: Option<u64>,
}

/// The test files named by `paths`: files as given, directories searched recursively.
/// With no path, the current directory is searched.
///
/// The search skips hidden directories (`.git`) and directories named `target` (Cargo's
/// build output), does not follow symbolic links to directories, and returns the files
/// sorted so the order of a run is stable.
pub(crate) fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InvalidFile> {
    if paths.is_empty() {
        let mut found = Vec::new();
        walk(Path::new("."), &mut found)?;
        found.sort();
        return Ok(found
            .into_iter()
            .map(|p| p.strip_prefix(".").map(Path::to_path_buf).unwrap_or(p))
            .collect());
    }
    let mut files = Vec::new();
    for path in paths {
        let invalid = |message: String| InvalidFile {
            file: path.display().to_string(),
            message,
        };
        let metadata = std::fs::metadata(path).map_err(|e| invalid(format!("cannot read: {e}")))?;
        if metadata.is_dir() {
            let mut found = Vec::new();
            walk(path, &mut found)?;
            found.sort();
            files.extend(found);
        } else if metadata.is_file() {
            files.push(path.clone());
        } else {
            // Opening a FIFO waits for a writer, maybe forever; a device may never end.
            return Err(invalid(
                "not a regular file (a FIFO, socket or device): a test file must be a file".into(),
            ));
        }
    }
    Ok(files)
}

fn walk(dir: &Path, found: &mut Vec<PathBuf>) -> Result<(), InvalidFile> {
    let unreadable = |e: std::io::Error| InvalidFile {
        file: dir.display().to_string(),
        message: format!("cannot read directory: {e}"),
    };
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // `DirEntry::file_type` does not follow symbolic links, so a link cycle cannot
        // make the search loop.
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            if !name.starts_with('.') && name != "target" {
                walk(&entry.path(), found)?;
            }
        } else if name.ends_with(SUFFIX) && is_regular_file(&entry.path()) {
            found.push(entry.path());
        }
    }
    Ok(())
}

/// True for a regular file, through a symbolic link too. A FIFO, socket or device named
/// like a test file is skipped: opening a FIFO waits for a writer, maybe forever.
fn is_regular_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// The file as written: `deny_unknown_fields` everywhere, so a misspelt key (`expects`,
/// `[[cases]]`) is an error and never a silently skipped assertion.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    agent: String,
    /// Compile `.apl` source with relaxed syntax (`aplc run --relaxed`); a bundle keeps
    /// the mode it was built with.
    #[serde(default)]
    relaxed: bool,
    #[serde(default, rename = "case")]
    cases: Vec<RawCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    #[serde(default)]
    context: toml::Table,
    /// An array of scripted entries, or `{ file = "FILE" }`; interpreted by hand so the
    /// error names both forms.
    responses: Option<toml::Value>,
    #[serde(default)]
    expect: Vec<String>,
    expect_error: Option<String>,
    max_runs: Option<u64>,
    timeout_ms: Option<u64>,
    tools: Option<String>,
    max_steps: Option<u64>,
}

/// Reads, checks and compiles one test file. Expressions are compiled in `env`.
pub(crate) fn load<'env>(
    path: &Path,
    env: &'env Environment<'static>,
) -> Result<TestFile<'env>, InvalidFile> {
    let display = path.display().to_string();
    let invalid = |message: String| InvalidFile {
        file: display.clone(),
        message,
    };
    // Parsed TOML costs many times its size in memory: a test file gets the limit of an
    // agent's source, checked before a byte is read.
    let bytes =
        read_at_most(path, MAX_SOURCE_LEN as u64, "test files").map_err(|f| invalid(f.message))?;
    let text = into_text(path, bytes).map_err(|f| invalid(f.message))?;
    let raw: RawFile = toml::from_str(&text).map_err(|e| invalid(toml_error(&text, &e)))?;
    if raw.cases.is_empty() {
        return Err(invalid(
            "no test cases: add at least one `[[case]]` table".into(),
        ));
    }
    let base = path.parent().unwrap_or(Path::new("."));

    let mut cases = Vec::with_capacity(raw.cases.len());
    let mut names = BTreeSet::new();
    for raw_case in raw.cases {
        if !names.insert(raw_case.name.clone()) {
            return Err(invalid(format!("duplicate case name `{}`", raw_case.name)));
        }
        let name = raw_case.name.clone();
        let case = load_case(raw_case, base, env)
            .map_err(|message| invalid(format!("case `{name}`: {message}")))?;
        cases.push(case);
    }

    // The agent is compiled once for every case, with the names of every case's context
    // as declared inputs, as `aplc run --context` would.
    let mut inputs = Map::new();
    for case in &cases {
        inputs.extend(case.context.clone());
    }
    let agent = base.join(&raw.agent);
    let inputs = RunOptions::default().with_context_json(&inputs);
    let compile = CompileArgs {
        relaxed: raw.relaxed,
        dialect: aplc_vm::Dialect::Spec,
        agents: Vec::new(),
    };
    let program = load_program(&agent, &compile, &inputs)
        .map_err(|f| invalid(format!("agent `{}`: {}", raw.agent, f.message)))?;
    Ok(TestFile {
        display,
        program: Arc::new(program),
        cases,
    })
}

/// How many characters of the offending line a TOML error shows on each side of the
/// error, and of the parser's message: a one-line file of megabytes must not print
/// megabytes (toml's own `Display` prints the whole line).
const EXCERPT_CHARS: usize = 80;
const MESSAGE_CHARS: usize = 400;

/// `error` as `line L, column C: MESSAGE` and the offending line, clipped around the
/// column, with a caret under it; control characters escaped.
fn toml_error(text: &str, error: &toml::de::Error) -> String {
    let message = truncate_chars(error.message().trim(), MESSAGE_CHARS);
    let Some(at) = error.span().map(|span| span.start.min(text.len())) else {
        return format!("TOML parse error: {}", escape_control(&message));
    };
    let at = (0..=at)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let line = text[..at].matches('\n').count() + 1;
    let before = &text[line_start..at];
    let column = before.chars().count() + 1;
    let shown_before: String = {
        let mut tail: Vec<char> = before.chars().rev().take(EXCERPT_CHARS).collect();
        tail.reverse();
        tail.into_iter().collect()
    };
    let cut_before = if shown_before.len() < before.len() {
        "…"
    } else {
        ""
    };
    let after = truncate_chars(&text[at..line_end], EXCERPT_CHARS);
    let excerpt = format!("{cut_before}{shown_before}{after}");
    let caret = " ".repeat(cut_before.chars().count() + shown_before.chars().count());
    format!(
        "TOML parse error at line {line}, column {column}: {}\n  | {}\n  | {caret}^",
        escape_control(&message),
        escape_control(excerpt.trim_end_matches('\r')),
    )
}

fn load_case<'env>(
    raw: RawCase,
    base: &Path,
    env: &'env Environment<'static>,
) -> Result<Case<'env>, String> {
    let context = match serde_json::to_value(&raw.context) {
        Ok(Json::Object(map)) => map,
        Ok(_) | Err(_) => return Err("`context` must be a table of variables".into()),
    };
    let responses = match raw.responses {
        None => ScriptedProvider::default(),
        Some(value) => responses(value, base)?,
    };
    let mut expect = Vec::with_capacity(raw.expect.len());
    for source in raw.expect {
        let expression = env
            .compile_expression_owned(source.clone())
            .map_err(|e| format!("expect `{source}` is not a valid expression: {e}"))?;
        expect.push((source, expression));
    }
    if raw.expect_error.as_deref() == Some("") {
        return Err("`expect_error` is empty: it would match any failure".into());
    }
    let timeout = match raw.timeout_ms {
        Some(0) => return Err("`timeout_ms` must be at least 1".into()),
        Some(ms) => Duration::from_millis(ms),
        None => DEFAULT_TIMEOUT,
    };
    if raw.max_steps == Some(0) {
        return Err("`max_steps` must be at least 1".into());
    }
    let toolbox = match &raw.tools {
        None => Toolbox::new(),
        Some(manifest) => {
            let path = base.join(manifest);
            let text = read_json(&path).map_err(|f| f.message)?;
            let dir = path.parent().unwrap_or(Path::new("."));
            // Tests run with mocks, but secrets may be set: tools do not get them.
            let secrets = aplc_runtime::Secrets::from_env();
            let mut toolbox =
                aplc_runtime::manifest::toolbox_from_manifest(&text, dir, secrets.variables())
                    .map_err(|e| format!("tools `{manifest}`: {e}"))?;
            if !toolbox.pending_mcp_servers().is_empty() {
                return Err(format!(
                    "tools `{manifest}`: `mcpServers`: MCP servers are not supported by \
                     `aplc test` yet (spec/mcp.md)"
                ));
            }
            toolbox.redact_with(secrets.redactor());
            toolbox
        }
    };
    Ok(Case {
        name: raw.name,
        context,
        responses,
        expect,
        expect_error: raw.expect_error,
        max_runs: raw.max_runs,
        timeout,
        toolbox,
        max_steps: raw.max_steps,
    })
}

/// `responses`: an inline array of entries, or `{ file = "FILE" }` (a JSON array, the
/// form `--mock` reads and `aplc run --record` writes), relative to the test file.
fn responses(value: toml::Value, base: &Path) -> Result<ScriptedProvider, String> {
    match value {
        toml::Value::Array(entries) => {
            let entries = entries
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<Vec<Json>, _>>()
                .map_err(|e| format!("responses: {e}"))?;
            ScriptedProvider::from_entries(entries).map_err(|e| format!("responses: {e}"))
        }
        toml::Value::Table(table) if table.len() == 1 => match table.get("file") {
            Some(toml::Value::String(file)) => {
                let path = base.join(file);
                let text = read_json(&path).map_err(|f| format!("responses: {}", f.message))?;
                ScriptedProvider::from_json(&text)
                    .map_err(|e| format!("responses file `{file}`: {e}"))
            }
            _ => Err(RESPONSES_FORMS.into()),
        },
        _ => Err(RESPONSES_FORMS.into()),
    }
}

const RESPONSES_FORMS: &str =
    "`responses` must be an array of scripted entries or `{ file = \"FILE\" }`";
