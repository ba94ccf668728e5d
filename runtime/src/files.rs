//! Reading a whole input file with a size bound: the one reader of every file the CLI and
//! `aplc serve` take in whole (sources, bundles, test files, `--context`, `--mock`,
//! tool manifests, providers files, token files). Streamed inputs (an events file in
//! `aplc trace`) are read a bounded line at a time instead and do not come here.

use std::io::Read;
use std::path::Path;

/// The largest input file aplc reads whole (spec/limits.md, "Input files").
pub const MAX_INPUT_LEN: u64 = 64 * 1024 * 1024;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Opening or reading failed.
    #[error("cannot read {file}: {source}")]
    Io {
        /// The file as given.
        file: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is larger than the limit; `size` says how that was found.
    #[error("{file}: {size}; aplc reads {what} of at most {limit} bytes")]
    TooLarge {
        /// The file as given.
        file: String,
        /// "the file is N bytes" (known before reading) or "the input is longer than N
        /// bytes" (a device, FIFO or growing file, cut at the limit).
        size: String,
        /// What kind of file the limit is for ("files", "test files").
        what: &'static str,
        /// The limit in bytes.
        limit: u64,
    },
    /// The file is not UTF-8 text.
    #[error("{file}: not valid UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 {
        /// The file as given.
        file: String,
        /// Where the first invalid byte is.
        offset: usize,
    },
}

/// Reads `file` whole, refusing one over `limit` bytes; `what` names the kind of file in
/// the error ("files", "test files").
///
/// The limit is enforced before reading where the file says its size (a regular file:
/// nothing of a large one is read) and while reading otherwise: `/dev/zero`, a FIFO or a
/// growing file report no useful length up front and would otherwise be read into memory
/// without bound. (A FIFO that nobody writes to still blocks; that is the OS. Callers
/// that must not wait refuse non-regular files first.)
pub fn read_at_most(file: &Path, limit: u64, what: &'static str) -> Result<Vec<u8>, ReadError> {
    let name = || file.display().to_string();
    let cannot_read = |source: std::io::Error| ReadError::Io {
        file: name(),
        source,
    };
    let too_large = |size: String| ReadError::TooLarge {
        file: name(),
        size,
        what,
        limit,
    };
    let opened = std::fs::File::open(file).map_err(cannot_read)?;
    if let Ok(meta) = opened.metadata()
        && meta.is_file()
        && meta.len() > limit
    {
        return Err(too_large(format!("the file is {} bytes", meta.len())));
    }
    let mut bytes = Vec::new();
    opened
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(cannot_read)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(format!("the input is longer than {limit} bytes")));
    }
    Ok(bytes)
}

/// [`read_at_most`] with [`MAX_INPUT_LEN`], as UTF-8 text.
pub fn read_text(file: &Path) -> Result<String, ReadError> {
    let bytes = read_at_most(file, MAX_INPUT_LEN, "files")?;
    into_text(file, bytes)
}

/// `bytes` read from `file` as UTF-8 text, or an error naming the first invalid byte.
pub fn into_text(file: &Path, bytes: Vec<u8>) -> Result<String, ReadError> {
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8 {
        file: file.display().to_string(),
        offset: e.utf8_error().valid_up_to(),
    })
}
