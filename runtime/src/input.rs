//! Reading an input file with a size limit: the one limit every reader of a user's file
//! applies (`aplc run`, `compile`, `test`, and the agents directory of `aplc serve`).

use std::io::Read;
use std::path::Path;

/// The largest input file aplc reads.
pub const MAX_INPUT_LEN: u64 = 64 * 1024 * 1024;

/// Why an input file was not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// The file says it is larger than [`MAX_INPUT_LEN`]; none of it was read.
    #[error("the file is {0} bytes; aplc reads files of at most {MAX_INPUT_LEN} bytes")]
    TooLarge(u64),
    /// More than [`MAX_INPUT_LEN`] bytes came out of it (a device, a FIFO, a growing file).
    #[error(
        "the input is longer than {MAX_INPUT_LEN} bytes; aplc reads files of at most {MAX_INPUT_LEN} bytes"
    )]
    TooLong,
    /// It could not be opened or read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads a whole input file, refusing files over [`MAX_INPUT_LEN`] bytes.
///
/// The limit is enforced while reading, not after: `/dev/zero`, a FIFO or a growing file
/// report no useful length up front and would otherwise be read into memory without
/// bound. (A FIFO that nobody writes to still blocks; that is the OS.)
pub fn read_input(file: &Path) -> Result<Vec<u8>, InputError> {
    let opened = std::fs::File::open(file)?;
    // A regular file says its size: refuse a large one before reading any of it.
    if let Ok(meta) = opened.metadata()
        && meta.len() > MAX_INPUT_LEN
    {
        return Err(InputError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::new();
    opened.take(MAX_INPUT_LEN + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_INPUT_LEN {
        return Err(InputError::TooLong);
    }
    Ok(bytes)
}
