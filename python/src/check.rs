//! Checking and building: `aplc.check`, `aplc.compile` and the schema check behind
//! `aplc.validate_schema`.

use aplc_compiler::{Diagnostic, LineIndex, Options};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The file name diagnostics and bundles carry for source that came from Python.
pub(crate) const SOURCE_NAME: &str = "<agent>";

/// One diagnostic as the facade turns it into a dict: code, severity, message, line and
/// column (both 1-based).
pub(crate) type DiagnosticRow = (String, String, String, usize, usize);

/// A compilation's diagnostics: the rows, and the same rendered as `aplc check` prints
/// them (without colour).
pub(crate) type Report = (Vec<DiagnosticRow>, String);

/// Checks `source` as `aplc check` does; `inputs` are variables the caller will inject.
/// Returns whether it has errors, and the report.
#[pyfunction]
pub(crate) fn check_source(
    py: Python<'_>,
    source: &str,
    relaxed: bool,
    inputs: Vec<String>,
    dialect: &str,
) -> PyResult<(bool, Report)> {
    let dialect = dialect_named(dialect)?;
    Ok(py.detach(|| {
        let options = Options {
            relaxed,
            inputs,
            dialect,
            ..Options::default()
        };
        let compilation = aplc_compiler::compile(source, SOURCE_NAME, &options);
        (
            compilation.has_errors(),
            report(&compilation.diagnostics, source),
        )
    }))
}

/// Builds the bundle of `source` as `aplc build` does: its bytes, or `None` with the
/// errors in the report.
#[pyfunction]
pub(crate) fn build_bundle<'py>(
    py: Python<'py>,
    source: &str,
    relaxed: bool,
    dialect: &str,
) -> PyResult<(Option<Bound<'py, PyBytes>>, Report)> {
    let dialect = dialect_named(dialect)?;
    let (bytes, diagnostics) = py.detach(|| {
        let options = Options {
            relaxed,
            dialect,
            ..Options::default()
        };
        aplc_compiler::build(source, SOURCE_NAME, &options)
    });
    let bytes = bytes.map(|bytes| PyBytes::new(py, &bytes));
    Ok((bytes, report(&diagnostics, source)))
}

/// The dialect called `name`, or a `ValueError` listing the known ones.
pub(crate) fn dialect_named(name: &str) -> PyResult<aplc_vm::Dialect> {
    aplc_vm::Dialect::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = aplc_vm::Dialect::ALL.iter().map(|d| d.as_str()).collect();
        pyo3::exceptions::PyValueError::new_err(format!(
            "unknown dialect {name:?}; known: {}",
            known.join(", ")
        ))
    })
}

/// The ways `instance_json` fails the JSON Schema `schema_json`, one message each; an
/// empty list when it conforms. A schema that is not valid is one message.
#[pyfunction]
pub(crate) fn schema_errors(instance_json: &str, schema_json: &str) -> PyResult<Vec<String>> {
    let parse = |what: &str, text: &str| {
        serde_json::from_str::<serde_json::Value>(text).map_err(|e| {
            pyo3::exceptions::PyValueError::new_err(format!("{what} is not valid JSON: {e}"))
        })
    };
    let instance = parse("the value", instance_json)?;
    let schema = parse("the schema", schema_json)?;
    if !schema.is_object() {
        return Ok(vec![
            "invalid output_structure: expected a JSON Schema object".into(),
        ]);
    }
    let validator = match jsonschema::validator_for(&schema) {
        Ok(validator) => validator,
        Err(e) => return Ok(vec![format!("invalid output_structure: {e}")]),
    };
    Ok(validator
        .iter_errors(&instance)
        .map(|error| {
            let path = error.instance_path().as_str();
            let at = if path.is_empty() { "the root" } else { path };
            format!("schema validation failed: at {at}: {error}")
        })
        .collect())
}

/// The rows and rendered text of `diagnostics` on `source`.
pub(crate) fn report(diagnostics: &[Diagnostic], source: &str) -> Report {
    let index = LineIndex::new(source);
    let rows = diagnostics
        .iter()
        .map(|d| {
            let (line, column) = index.line_col(source, d.span().start);
            (
                d.code.as_str().to_owned(),
                d.severity.to_string(),
                d.message.clone(),
                line,
                column,
            )
        })
        .collect();
    let rendered = aplc_compiler::render(diagnostics, SOURCE_NAME, source, false);
    (rows, rendered)
}
