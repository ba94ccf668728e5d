//! `aplc test`: runs the cases of `*.test.toml` files against their agents with scripted
//! responses and checks `expect` / `expect_error` on each final context.
//!
//! `file.rs` finds and loads test files (every static problem is found there, exit 2);
//! this file runs the cases and judges them; `report.rs` prints the results, the
//! `cargo test` way or as JSON Lines. The format and the semantics are in
//! `spec/testing.md`.

mod file;
mod report;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use aplc_runtime::driver::{self, Scripted};
use aplc_vm::minijinja::value::Value;
use aplc_vm::minijinja::{Environment, Expression};
use aplc_vm::{DEFAULT_MAX_STEPS, Limits, RunOptions, RunOutcome, template_env};
use clap::{Args, ValueEnum};

use crate::Failure;
use file::{Case, TestFile};

#[derive(Args, Debug)]
pub(crate) struct TestArgs {
    /// Test files and directories (searched recursively for `*.test.toml`). Default: the
    /// current directory.
    paths: Vec<PathBuf>,
    /// `human`: one line per case like `cargo test`, failures after, then `N passed, M
    /// failed`. `json`: one JSON object per case on stdout (JSON Lines).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = TestFormat::Human)]
    format: TestFormat,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TestFormat {
    /// Lines like `cargo test`.
    Human,
    /// JSON Lines, one object per case.
    Json,
}

/// What one case came to.
pub(crate) struct CaseResult {
    pub file: String,
    pub name: String,
    pub duration: Duration,
    pub failures: Vec<CaseFailure>,
    pub result_text: String,
}

/// One reason a case failed.
pub(crate) struct CaseFailure {
    /// `run_error`, `expect_error`, `assertion` or `evaluation_error`.
    pub kind: &'static str,
    pub message: String,
    /// The `expect` entry, for `assertion` and `evaluation_error`.
    pub expression: Option<String>,
    /// The variables the expression reads, with their values as JSON text.
    pub variables: Vec<(String, String)>,
}

/// Runs `aplc test`. Exit 0: every case passed; 1: a case failed; 2: a test file is
/// invalid (its cases do not run; the other files' cases still do).
pub(crate) fn test(args: &TestArgs) -> Result<ExitCode, Failure> {
    let paths = file::discover(&args.paths)
        .map_err(|e| Failure::usage(format!("{}: {}", e.file, e.message)))?;
    // One environment for every expression: the VM's own, so `expect` has exactly the
    // filters, tests and helpers the agent's templates have.
    let env = template_env(&Limits::default());
    let mut files = Vec::new();
    let mut invalid = 0;
    for path in &paths {
        match file::load(path, &env) {
            Ok(loaded) => files.push(loaded),
            Err(e) => {
                eprintln!("error: {}: {}", e.file, e.message);
                invalid += 1;
            }
        }
    }
    if paths.is_empty() {
        eprintln!("warning: no {} files found", file::SUFFIX);
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::run(format!("cannot start the async runtime: {e}")))?;
    let mut reporter = report::Reporter::new(args.format);
    reporter.start(files.iter().map(|f| f.cases.len()).sum());
    for test_file in &files {
        for case in &test_file.cases {
            let result = run_case(&runtime, &env, test_file, case);
            reporter.case(&result);
        }
    }
    let failed = reporter.finish();
    Ok(if invalid > 0 {
        ExitCode::from(2)
    } else if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn run_case(
    runtime: &tokio::runtime::Runtime,
    env: &Environment<'static>,
    test_file: &TestFile<'_>,
    case: &Case<'_>,
) -> CaseResult {
    let options = RunOptions {
        timeout: case.timeout,
        max_runs: case.max_runs,
        max_steps: case.max_steps.unwrap_or(DEFAULT_MAX_STEPS),
        ..RunOptions::default()
    }
    .with_context_json(&case.context);
    let provider = Scripted::new(case.responses.clone());
    let started = Instant::now();
    let outcome = runtime.block_on(driver::run_with_tools(
        test_file.program.clone(),
        options,
        &provider,
        &case.toolbox,
    ));
    let duration = started.elapsed();

    let mut failures = Vec::new();
    judge_error(case, &outcome, &mut failures);
    for (source, expression) in &case.expect {
        // A fresh root per entry (O(1)): an entry that calls `set_context` cannot change
        // what the next one sees.
        let root = outcome.template_root();
        if let Some(failure) = check_expectation(env, source, expression, &root) {
            failures.push(failure);
        }
    }
    CaseResult {
        file: test_file.display.clone(),
        name: case.name.clone(),
        duration,
        failures,
        result_text: outcome.result_text(),
    }
}

/// Compares how the run ended with `expect_error`: a run error must be expected, and an
/// expected error must happen, as the run error or (for a run that completed) as one of
/// the last step's `errors`.
fn judge_error(case: &Case<'_>, outcome: &RunOutcome, failures: &mut Vec<CaseFailure>) {
    let plain = |kind, message| CaseFailure {
        kind,
        message,
        expression: None,
        variables: Vec::new(),
    };
    match (&case.expect_error, &outcome.error) {
        (None, None) => {}
        (None, Some(error)) => {
            failures.push(plain(
                "run_error",
                format!("the run failed: {}", error.message),
            ));
        }
        (Some(expected), Some(error)) => {
            if !error.message.contains(expected.as_str()) {
                failures.push(plain(
                    "expect_error",
                    format!(
                        "expected the run to fail with `{expected}`, but it failed with: {}",
                        error.message
                    ),
                ));
            }
        }
        (Some(expected), None) => {
            let in_last_step = outcome
                .last_step_errors
                .iter()
                .any(|e| e.contains(expected.as_str()));
            if !in_last_step {
                let detail = if outcome.last_step_errors.is_empty() {
                    "it completed without errors".to_string()
                } else {
                    format!(
                        "it completed; the last step's errors were: {}",
                        outcome.last_step_errors.join("; ")
                    )
                };
                failures.push(plain(
                    "expect_error",
                    format!("expected the run to fail with `{expected}`, but {detail}"),
                ));
            }
        }
    }
}

/// Evaluates one `expect` entry over the final context; `None` when it holds.
fn check_expectation(
    env: &Environment<'static>,
    source: &str,
    expression: &Expression<'_, 'static>,
    root: &Value,
) -> Option<CaseFailure> {
    let (kind, message) = match expression.eval(root.clone()) {
        Ok(value) if value.is_true() => return None,
        Ok(value) => (
            "assertion",
            format!("expect `{source}` is {}", describe(&value)),
        ),
        Err(error) => (
            "evaluation_error",
            format!("expect `{source}` could not be evaluated: {error}"),
        ),
    };
    Some(CaseFailure {
        kind,
        message,
        expression: Some(source.to_string()),
        variables: variables_read(env, expression, root),
    })
}

/// The variables `expression` reads, with their values: each name minijinja finds
/// undeclared in it (with `a.b` attribute paths and their roots), evaluated on its own.
/// Names that are not in the context but are globals of the environment (the helpers,
/// `range`, …) are left out.
fn variables_read(
    env: &Environment<'static>,
    expression: &Expression<'_, 'static>,
    root: &Value,
) -> Vec<(String, String)> {
    let mut paths = BTreeSet::new();
    for path in expression.undeclared_variables(true) {
        let mut prefix = String::new();
        for part in path.split('.') {
            if !prefix.is_empty() {
                prefix.push('.');
            }
            prefix.push_str(part);
            paths.insert(prefix.clone());
        }
    }
    let globals: BTreeSet<&str> = env.globals().map(|(name, _)| name).collect();
    paths
        .into_iter()
        .filter_map(|path| {
            let root_name = path.split('.').next().unwrap_or(&path);
            let in_context = root
                .get_attr(root_name)
                .is_ok_and(|value| !value.is_undefined());
            if !in_context && globals.contains(root_name) {
                return None;
            }
            let shown = match env
                .compile_expression(&path)
                .and_then(|e| e.eval(root.clone()))
            {
                Ok(value) => describe(&value),
                Err(error) => format!("<error: {error}>"),
            };
            Some((path, shown))
        })
        .collect()
}

/// A value for a failure message: JSON where it has a JSON form, cut at 500 characters.
fn describe(value: &Value) -> String {
    const MAX: usize = 500;
    let text = if value.is_undefined() {
        "undefined".to_string()
    } else {
        serde_json::to_string(value).unwrap_or_else(|_| value.to_string())
    };
    if text.chars().count() > MAX {
        let cut: String = text.chars().take(MAX).collect();
        format!("{cut}… ({} characters)", text.chars().count())
    } else {
        text
    }
}
