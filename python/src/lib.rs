//! `aplc._aplc`, the native half of the `aplc` Python package: the compiler's checks and
//! bundles, and runs of the VM driven from the caller's event loop with Python providers
//! and tools.
//!
//! The Python facade (`python/aplc/`) owns the public API, option parsing, descriptor
//! inference and the exception classes; this module moves data across the boundary as
//! Python objects built directly (`convert`), and polls the machine with the GIL
//! released, on the loop's thread (`run`); durable runs go through the runtime's durable
//! driver on the module's tokio runtime (`durable`).

use pyo3::prelude::*;

mod check;
mod convert;
mod durable;
mod run;

/// The module: functions for the facade, never called by users directly.
#[pymodule]
fn _aplc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check::check_source, m)?)?;
    m.add_function(wrap_pyfunction!(check::build_bundle, m)?)?;
    m.add_function(wrap_pyfunction!(check::schema_errors, m)?)?;
    m.add_function(wrap_pyfunction!(durable::start_durable, m)?)?;
    m.add_function(wrap_pyfunction!(durable::resume_durable, m)?)?;
    m.add_function(wrap_pyfunction!(durable::answer_request, m)?)?;
    m.add_class::<run::NativeProgram>()?;
    m.add_class::<run::NativeRun>()?;
    m.add_class::<run::RustAnswer>()?;
    m.add_class::<run::RustToolAnswer>()?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_MAX_STEPS", aplc_vm::DEFAULT_MAX_STEPS)?;
    m.add("DEFAULT_MAX_AGENT_DEPTH", aplc_vm::DEFAULT_MAX_AGENT_DEPTH)?;
    m.add(
        "DEFAULT_TIMEOUT_MS",
        u64::try_from(aplc_vm::DEFAULT_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
    )?;
    Ok(())
}
