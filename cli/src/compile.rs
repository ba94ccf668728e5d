//! `aplc check` and `aplc build`.

use std::path::Path;
use std::process::ExitCode;

use aplc_compiler::Options;

use crate::input::{display_name, print_diagnostics, read_source};
use crate::{CompileArgs, Failure};

pub(crate) fn check(file: &Path, args: &CompileArgs) -> Result<ExitCode, Failure> {
    let source = read_source(file)?;
    let compilation = aplc_compiler::compile(&source, &display_name(file), &compile_options(args));
    print_diagnostics(&compilation.diagnostics, file, &source);
    Ok(if compilation.has_errors() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

pub(crate) fn build(file: &Path, output: &Path, args: &CompileArgs) -> Result<ExitCode, Failure> {
    let source = read_source(file)?;
    let (bytes, diagnostics) =
        aplc_compiler::build(&source, &display_name(file), &compile_options(args));
    print_diagnostics(&diagnostics, file, &source);
    let Some(bytes) = bytes else {
        return Ok(ExitCode::from(2));
    };
    std::fs::write(output, bytes)
        .map_err(|e| Failure::run(format!("cannot write {}: {e}", output.display())))?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn compile_options(args: &CompileArgs) -> Options {
    Options {
        relaxed: args.relaxed,
    }
}
