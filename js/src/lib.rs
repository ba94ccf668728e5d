//! The npm package's WebAssembly module (`spec/js.md`): the compiler and the sans-IO VM
//! bound to JavaScript with wasm-bindgen.
//!
//! Everything here is synchronous and does no I/O, like the crates it wraps. The
//! package's JavaScript (`js/core.js`) plays the runtime's part: it drives a [`Run`] to its
//! next action, performs it (a JavaScript provider or tool, `fetch`), and hands the answer
//! back, with the time read from the host's clock. Values cross as JSON text: one
//! `JSON.parse` per crossing, and exactly the JSON forms the CLI prints (events, final
//! context), with no second converter to keep in step.
//!
//! Only `aplc-compiler` and `aplc-vm` are linked: no tokio, HTTP, stores or telemetry
//! (`.ci/check-layering.py` keeps the VM free of them).

mod report;
mod run;

use aplc_compiler::Options;
use wasm_bindgen::prelude::*;

pub use report::{GraphJson, check_report, graph_json};
pub use run::{Program, Run, Script, Stream};

/// The file name diagnostics and bundles carry when the caller names none.
pub const SOURCE_NAME: &str = "agent.apl";

/// What JavaScript passes to [`check`], [`build`] and [`compile_for_run`], as JSON:
/// `{"relaxed": bool, "dialect": "spec" | "defuss-1.1", "fileName": string, "inputs":
/// [names], "denyWarnings": bool}`, every key optional.
#[derive(Debug, Clone, Default)]
pub struct CompileOptions {
    /// Relaxed syntax (§6.1.1.3).
    pub relaxed: bool,
    /// The template dialect.
    pub dialect: aplc_vm::Dialect,
    /// The name recorded in the bundle and shown in messages.
    pub file_name: String,
    /// Variables the caller injects (declared inputs for the checks).
    pub inputs: Vec<String>,
    /// Every warning an error (`--deny-warnings`).
    pub deny_warnings: bool,
}

impl CompileOptions {
    /// Reads the options JSON; an unknown dialect or a value of the wrong type is an
    /// error naming the key.
    pub fn parse(text: &str) -> Result<CompileOptions, String> {
        let value: serde_json::Value = if text.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(text).map_err(|e| format!("options are not JSON: {e}"))?
        };
        let mut options = CompileOptions {
            file_name: SOURCE_NAME.to_owned(),
            ..CompileOptions::default()
        };
        let serde_json::Value::Object(map) = value else {
            return Ok(options);
        };
        for (key, value) in &map {
            match (key.as_str(), value) {
                (_, serde_json::Value::Null) => {}
                ("relaxed", serde_json::Value::Bool(b)) => options.relaxed = *b,
                ("denyWarnings", serde_json::Value::Bool(b)) => options.deny_warnings = *b,
                ("fileName", serde_json::Value::String(s)) => options.file_name = s.clone(),
                ("dialect", serde_json::Value::String(s)) => {
                    options.dialect = aplc_vm::Dialect::from_name(s).ok_or_else(|| {
                        let known: Vec<&str> =
                            aplc_vm::Dialect::ALL.iter().map(|d| d.as_str()).collect();
                        format!("unknown dialect {s:?}; known: {}", known.join(", "))
                    })?;
                }
                ("inputs", serde_json::Value::Array(names)) => {
                    options.inputs = names
                        .iter()
                        .filter_map(|n| n.as_str().map(str::to_owned))
                        .collect();
                }
                (key, _) => return Err(format!("invalid compile option `{key}`")),
            }
        }
        Ok(options)
    }

    /// The compiler's options as `aplc check` and `aplc build` use them (an unknown
    /// `next_step` target is an error).
    pub fn for_check(&self) -> Options {
        Options {
            relaxed: self.relaxed,
            deny_warnings: self.deny_warnings,
            dialect: self.dialect,
            inputs: self.inputs.clone(),
            ..Options::default()
        }
    }

    /// The compiler's options as `aplc run` uses them on source (an unknown target is a
    /// warning: the run fails at the jump, §2.1).
    pub fn for_run(&self) -> Options {
        Options {
            dialect: self.dialect,
            inputs: self.inputs.clone(),
            ..Options::for_run(self.relaxed)
        }
    }
}

fn js_error(message: impl std::fmt::Display) -> JsError {
    JsError::new(&message.to_string())
}

/// Checks `source` as `aplc check` does: `{"ok": bool, "diagnostics": [...]}` as JSON.
#[wasm_bindgen]
pub fn check(source: &str, options: &str) -> Result<String, JsError> {
    let options = CompileOptions::parse(options).map_err(js_error)?;
    let compilation = aplc_compiler::compile(source, &options.file_name, &options.for_check());
    Ok(check_report(source, &options.file_name, &compilation.diagnostics).to_string())
}

/// A bundle built as `aplc build` builds it, or the diagnostics that stopped it.
#[wasm_bindgen]
pub struct Built {
    bytes: Option<Vec<u8>>,
    report: String,
}

#[wasm_bindgen]
impl Built {
    /// The bundle's bytes (`undefined` when the source has errors).
    pub fn bytes(&self) -> Option<Vec<u8>> {
        self.bytes.clone()
    }

    /// `{"ok", "diagnostics"}` as JSON, as [`check`] gives it.
    pub fn report(&self) -> String {
        self.report.clone()
    }
}

/// Builds the bundle of `source` as `aplc build` does: the same bytes for the same
/// source and file name.
#[wasm_bindgen]
pub fn build(source: &str, options: &str) -> Result<Built, JsError> {
    let options = CompileOptions::parse(options).map_err(js_error)?;
    let (bytes, diagnostics) =
        aplc_compiler::build(source, &options.file_name, &options.for_check());
    let report = check_report(source, &options.file_name, &diagnostics).to_string();
    Ok(Built { bytes, report })
}

/// The step graph of `source` (compiled as `aplc graph` does), as JSON: see
/// [`GraphJson`]. Source with errors has no graph: `{"steps": null, ...}` with the report.
#[wasm_bindgen]
pub fn graph(source: &str, options: &str) -> Result<String, JsError> {
    let options = CompileOptions::parse(options).map_err(js_error)?;
    let compilation = aplc_compiler::compile(source, &options.file_name, &options.for_check());
    Ok(graph_json(source, &options.file_name, &compilation).to_string())
}

/// A program compiled for a run, or the diagnostics that stopped it.
#[wasm_bindgen]
pub struct Compiled {
    program: Option<Program>,
    report: String,
}

#[wasm_bindgen]
impl Compiled {
    /// The program, once (`undefined` when the source has errors).
    pub fn take_program(&mut self) -> Option<Program> {
        self.program.take()
    }

    /// `{"ok", "diagnostics"}` as JSON.
    pub fn report(&self) -> String {
        self.report.clone()
    }
}

/// Compiles `source` as `aplc run` does on source (options' `inputs` are the context's
/// keys), ready to run.
#[wasm_bindgen]
pub fn compile_for_run(source: &str, options: &str) -> Result<Compiled, JsError> {
    let options = CompileOptions::parse(options).map_err(js_error)?;
    let compilation = aplc_compiler::compile(source, &options.file_name, &options.for_run());
    let report = check_report(source, &options.file_name, &compilation.diagnostics).to_string();
    let program = match compilation.bundle {
        Some(bundle) => Some(Program::from_bundle(bundle, options.dialect).map_err(js_error)?),
        None => None,
    };
    Ok(Compiled { program, report })
}
