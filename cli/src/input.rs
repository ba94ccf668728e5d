//! Reading input files and printing diagnostics, shared by every command.

use std::io::IsTerminal;
use std::path::Path;

use aplc_compiler::{Diagnostic, render};

use crate::Failure;

/// The largest input file aplc reads.
const MAX_INPUT_LEN: u64 = 64 * 1024 * 1024;

pub(crate) fn print_diagnostics(diagnostics: &[Diagnostic], file: &Path, source: &str) {
    if diagnostics.is_empty() {
        return;
    }
    let color = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    eprint!(
        "{}",
        render(diagnostics, &display_name(file), source, color)
    );
}

pub(crate) fn display_name(file: &Path) -> String {
    file.display().to_string()
}

pub(crate) fn read_bytes(file: &Path) -> Result<Vec<u8>, Failure> {
    let too_large = |len: u64| {
        Failure::usage(format!(
            "{}: the file is {len} bytes; aplc reads files of at most {MAX_INPUT_LEN} bytes",
            file.display()
        ))
    };
    let meta = std::fs::metadata(file)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", file.display())))?;
    if meta.len() > MAX_INPUT_LEN {
        return Err(too_large(meta.len()));
    }
    let bytes = std::fs::read(file)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", file.display())))?;
    if bytes.len() as u64 > MAX_INPUT_LEN {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

pub(crate) fn into_text(file: &Path, bytes: Vec<u8>) -> Result<String, Failure> {
    String::from_utf8(bytes).map_err(|e| {
        Failure::usage(format!(
            "{}: not valid UTF-8 (invalid byte at offset {})",
            file.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

pub(crate) fn read_text(file: &Path) -> Result<String, Failure> {
    into_text(file, read_bytes(file)?)
}
