//! Templates: the one minijinja environment every render uses, the live context it
//! renders against, and everything registered on it (the spec's helpers, the dialects'
//! helpers, the Jinja2 built-ins minijinja lacks, Python-style `str()`/`repr()`), and the
//! checks a template passes before it is compiled.
//!
//! The lowest of the three folders: it uses only the crate's leaf modules (`names`,
//! `interrupt`, `bundle`'s `Dialect`), never `provider/` or `run/`.

pub(crate) mod caps;
pub(crate) mod check;
pub(crate) mod dialect;
pub(crate) mod env;
pub(crate) mod helpers;
pub(crate) mod jinja2;
pub(crate) mod python;
pub(crate) mod store;
