//! Size caps of spec/limits.md shared by the APL helpers (`helpers.rs`) and the Jinja2
//! built-ins (`jinja2.rs`), and the error a cap raises.
//!
//! A leaf module: `jinja2.rs` binds its arguments with `helpers.rs`'s functions, and
//! `helpers.rs`'s `center` checks the same width cap, so the cap lives apart from both
//! (no import cycle).

use minijinja::{Error, ErrorKind};

/// The largest width or precision a filter or a `%` conversion accepts (`wordwrap`,
/// `center`, `'%*d'`, `'%.*f'`): wider text is never useful in a prompt, and a width is
/// an allocation.
pub(crate) const MAX_WIDTH: usize = 10_000;

/// A size limit of spec/limits.md refused a value: the same error kind as minijinja's
/// own value limits, so the run's error message points at spec/limits.md.
#[cold]
pub(crate) fn limit_error(message: String) -> Error {
    Error::new(ErrorKind::ValueTooLarge, message)
}
