//! Printing `aplc test` results: `cargo test`-style lines, or JSON Lines.
//!
//! Human output: `running N tests`, one `test FILE::CASE ... ok|FAILED` line per case as
//! it finishes, the details of every failure, then the summary `N passed, M failed` alone
//! on the last line (CI reads that form). JSON output: one object per case on stdout and
//! the summary on stderr, so stdout stays pure JSON Lines.

use std::io::Write;

use serde_json::json;

use super::{CaseResult, TestFormat};

/// Collects results as they come and prints them in the chosen format.
pub(crate) struct Reporter {
    format: TestFormat,
    passed: usize,
    /// Failure details, printed after every case line (human format).
    failed: Vec<String>,
}

impl Reporter {
    pub fn new(format: TestFormat) -> Reporter {
        Reporter {
            format,
            passed: 0,
            failed: Vec::new(),
        }
    }

    /// Announces how many cases will run.
    pub fn start(&mut self, cases: usize) {
        if self.format == TestFormat::Human {
            let plural = if cases == 1 { "" } else { "s" };
            print_line(&format!("\nrunning {cases} test{plural}"));
        }
    }

    /// Reports one finished case.
    pub fn case(&mut self, result: &CaseResult) {
        let ok = result.failures.is_empty();
        if ok {
            self.passed += 1;
        }
        match self.format {
            TestFormat::Human => {
                let verdict = if ok { "ok" } else { "FAILED" };
                print_line(&format!(
                    "test {}::{} ... {verdict}",
                    result.file, result.name
                ));
                if !ok {
                    self.failed.push(details(result));
                }
            }
            TestFormat::Json => {
                if !ok {
                    // Counted only; the object carries the details.
                    self.failed.push(String::new());
                }
                print_line(&to_json(result).to_string());
            }
        }
    }

    /// Prints the failures and the summary; returns the number of failed cases.
    pub fn finish(self) -> usize {
        let failed = self.failed.len();
        let summary = format!("{} passed, {failed} failed", self.passed);
        match self.format {
            TestFormat::Human => {
                let mut text = String::new();
                if failed > 0 {
                    text.push_str("\nfailures:\n");
                    for detail in &self.failed {
                        text.push('\n');
                        text.push_str(detail);
                    }
                }
                text.push('\n');
                text.push_str(&summary);
                print_line(&text);
            }
            TestFormat::Json => eprintln!("{summary}"),
        }
        failed
    }
}

/// The failure block of one case.
fn details(result: &CaseResult) -> String {
    let mut text = format!("---- {}::{} ----\n", result.file, result.name);
    for failure in &result.failures {
        text.push_str(&failure.message);
        text.push('\n');
        for (name, value) in &failure.variables {
            text.push_str(&format!("    {name} = {value}\n"));
        }
    }
    text.push_str(&format!(
        "result_text: {}\n",
        serde_json::Value::String(result.result_text.clone())
    ));
    text
}

fn to_json(result: &CaseResult) -> serde_json::Value {
    let failures: Vec<serde_json::Value> = result
        .failures
        .iter()
        .map(|f| {
            let variables: serde_json::Map<String, serde_json::Value> = f
                .variables
                .iter()
                .map(|(name, value)| (name.clone(), json!(value)))
                .collect();
            json!({
                "kind": f.kind,
                "message": f.message,
                "expression": f.expression,
                "variables": variables,
            })
        })
        .collect();
    json!({
        "file": result.file,
        "name": result.name,
        "outcome": if result.failures.is_empty() { "ok" } else { "failed" },
        "duration_ms": result.duration.as_secs_f64() * 1000.0,
        "failures": failures,
        "result_text": result.result_text,
    })
}

/// Prints a line on stdout; a closed stdout (`aplc test | head`) is not a test failure.
fn print_line(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}").and_then(|_| stdout.flush());
}
