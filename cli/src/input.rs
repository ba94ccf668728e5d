//! Reading input files and printing diagnostics, shared by every command.

use std::io::{IsTerminal, Read};
use std::path::Path;

use std::borrow::Cow;

use aplc_compiler::{Diagnostic, render};
use aplc_vm::text::escape_control;

use crate::Failure;

/// The largest input file aplc reads.
const MAX_INPUT_LEN: u64 = 64 * 1024 * 1024;

pub(crate) fn print_diagnostics(diagnostics: &[Diagnostic], file: &Path, source: &str) {
    if diagnostics.is_empty() {
        return;
    }
    let color = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let name = display_name(file);
    // Source text, file names and messages may hold escape sequences. The plain report is
    // escaped as a whole; colour (which is made of escape sequences) is only used when
    // there was nothing to escape.
    let plain = render(diagnostics, &name, source, false);
    match escape_control(&plain) {
        Cow::Borrowed(_) if color => eprint!("{}", render(diagnostics, &name, source, true)),
        escaped => eprint!("{escaped}"),
    }
}

pub(crate) fn display_name(file: &Path) -> String {
    file.display().to_string()
}

/// Reads a whole input file, refusing files over [`MAX_INPUT_LEN`] bytes.
///
/// The limit is enforced while reading, not after: `/dev/zero`, a FIFO or a growing file
/// report no useful length up front and would otherwise be read into memory without
/// bound. (A FIFO that nobody writes to still blocks; that is the OS.)
pub(crate) fn read_bytes(file: &Path) -> Result<Vec<u8>, Failure> {
    let too_large = |size: String| {
        Failure::usage(format!(
            "{}: {size}; aplc reads files of at most {MAX_INPUT_LEN} bytes",
            file.display()
        ))
    };
    let cannot_read =
        |e: std::io::Error| Failure::usage(format!("cannot read {}: {e}", file.display()));
    let opened = std::fs::File::open(file).map_err(cannot_read)?;
    // A regular file says its size: refuse a large one before reading any of it.
    if let Ok(meta) = opened.metadata()
        && meta.len() > MAX_INPUT_LEN
    {
        return Err(too_large(format!("the file is {} bytes", meta.len())));
    }
    let mut bytes = Vec::new();
    opened
        .take(MAX_INPUT_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot_read)?;
    if bytes.len() as u64 > MAX_INPUT_LEN {
        return Err(too_large(format!(
            "the input is longer than {MAX_INPUT_LEN} bytes"
        )));
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
