//! aplc patch: limits on the size and nesting of the values a render builds.
//!
//! Not part of upstream minijinja; see `APLC-PATCH.md`.  The limits are set on the
//! [`Environment`](crate::Environment) with `set_value_limits` and made visible to the
//! operators, filters and methods of one render through a thread-local, so that code
//! without access to the [`State`](crate::State) (the operators in `ops.rs`, the format
//! machinery) can check a size *before* it allocates.
use std::cell::Cell;
use std::fmt;

use crate::error::{Error, ErrorKind};
use crate::value::namespace_object::Namespace;
use crate::value::{ObjectRepr, Value, ValueKind};

/// Bounds on any one value a render builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueLimits {
    /// The longest string, in bytes.
    pub max_string_bytes: usize,
    /// The most items of one list, tuple or map.
    pub max_items: usize,
    /// The deepest nesting of lists, tuples and maps (a scalar is depth 0, `[1]` depth 1).
    pub max_depth: usize,
}

impl ValueLimits {
    /// No limits: upstream minijinja's behaviour.
    pub const UNLIMITED: ValueLimits = ValueLimits {
        max_string_bytes: usize::MAX,
        max_items: usize::MAX,
        max_depth: usize::MAX,
    };
}

/// The limits constant folding runs under (`Expr::as_const`): folded values are built at
/// compile time, outside any render, so they are kept small; a bigger constant
/// expression is left to the render.
pub(crate) const FOLDING: ValueLimits = ValueLimits {
    max_string_bytes: 64 * 1024,
    max_items: 4096,
    max_depth: 32,
};

thread_local! {
    static CURRENT: Cell<ValueLimits> = const { Cell::new(ValueLimits::UNLIMITED) };
    /// The last write a `CappedString` refused (bytes wanted, limit), so that the
    /// `fmt::Error` it had to return can become an error that names the limit.
    static OVERFLOW: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// The error for the last write a [`CappedString`] refused on this thread, if any.
pub(crate) fn take_overflow() -> Option<Error> {
    OVERFLOW
        .with(|o| o.take())
        .map(|(wanted, limit)| string_too_large(wanted as u128, limit))
}

/// The limits of the render running on this thread ([`ValueLimits::UNLIMITED`] outside
/// a render).
pub fn current() -> ValueLimits {
    CURRENT.with(|c| c.get())
}

/// Makes `limits` current until the guard drops (renders nest: macros, blocks).
pub(crate) fn enter(limits: ValueLimits) -> LimitsGuard {
    LimitsGuard(CURRENT.with(|c| c.replace(limits)))
}

pub(crate) struct LimitsGuard(ValueLimits);

impl Drop for LimitsGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// Fails unless a string of `bytes` bytes is within the current limit.
pub fn check_string_bytes(bytes: usize) -> Result<(), Error> {
    let limit = current().max_string_bytes;
    if bytes > limit {
        return Err(string_too_large(bytes as u128, limit));
    }
    Ok(())
}

/// Like [`check_string_bytes`] for a size computed as `unit * count`, which may overflow.
pub fn check_string_product(unit: usize, count: u128) -> Result<(), Error> {
    let bytes = (unit as u128).saturating_mul(count);
    let limit = current().max_string_bytes;
    if bytes > limit as u128 {
        return Err(string_too_large(bytes, limit));
    }
    Ok(())
}

/// Fails unless a list, tuple or map of `items` items is within the current limit.
pub fn check_items(items: u128) -> Result<(), Error> {
    let limit = current().max_items;
    if items > limit as u128 {
        return Err(Error::new(
            ErrorKind::ValueTooLarge,
            format!("a list or map of {items} items exceeds the limit of {limit} items"),
        ));
    }
    Ok(())
}

/// Checks the size of `value` itself (not of its items): the length of a string, the
/// number of items of a sized list, tuple or map.  O(1).
pub fn check_size(value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String | ValueKind::Bytes => check_string_bytes(value.len().unwrap_or(0)),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => match value.len() {
            Some(len) => check_items(len as u128),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Fails if `value` nests lists, tuples and maps deeper than the current limit, or holds
/// a `namespace()` inside a list, map or namespace.
///
/// The walk stops as soon as it passes the limit, so it recurses at most `max_depth`
/// levels whatever the value.  Namespaces are the only mutable values, and the only way
/// to build a cycle (`ns.x = [ns]`) or to deepen a value after it was checked; keeping
/// them out of containers keeps every value a finite tree checked where it is built.
pub fn check_depth(value: &Value) -> Result<(), Error> {
    let limit = current().max_depth;
    match walk(value, limit, false) {
        Walk::Fine => Ok(()),
        problem => Err(problem.into_error(limit)),
    }
}

/// Checks the items of a container about to be built from `items`: their count, that
/// none is already at the nesting limit, and that none is or holds a namespace.
pub fn check_new_container<'a>(items: impl IntoIterator<Item = &'a Value>) -> Result<(), Error> {
    let limit = current().max_depth;
    let mut count = 0u128;
    for item in items {
        count += 1;
        match walk(item, limit.saturating_sub(1), true) {
            Walk::Fine => {}
            problem => return Err(problem.into_error(limit)),
        }
    }
    check_items(count)
}

enum Walk {
    Fine,
    TooDeep,
    NestedNamespace,
}

impl Walk {
    fn into_error(self, limit: usize) -> Error {
        match self {
            Walk::NestedNamespace => Error::new(
                ErrorKind::InvalidOperation,
                "a namespace() cannot be stored inside a list, a map or another namespace",
            ),
            _ => Error::new(
                ErrorKind::ValueTooLarge,
                format!("a value nested more than {limit} levels deep exceeds the limit of {limit} levels"),
            ),
        }
    }
}

/// Lists, tuples, maps and lazy sequences; a `namespace()` is a map too.
fn is_container(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
    )
}

/// Walks `value`, allowing `budget` more levels of containers.  `nested` says `value`
/// sits inside a container.
fn walk(value: &Value, budget: usize, nested: bool) -> Walk {
    if !is_container(value) {
        return Walk::Fine;
    }
    let Some(obj) = value.as_object() else {
        return Walk::Fine;
    };
    if nested && value.downcast_object_ref::<Namespace>().is_some() {
        return Walk::NestedNamespace;
    }
    if budget == 0 {
        return Walk::TooDeep;
    }
    if matches!(obj.repr(), ObjectRepr::Map) {
        if let Some(pairs) = obj.try_iter_pairs() {
            for (key, item) in pairs {
                for part in [key, item] {
                    match walk(&part, budget - 1, true) {
                        Walk::Fine => {}
                        problem => return problem,
                    }
                }
            }
        }
        return Walk::Fine;
    }
    if let Some(iter) = obj.try_iter() {
        for item in iter {
            match walk(&item, budget - 1, true) {
                Walk::Fine => {}
                problem => return problem,
            }
        }
    }
    Walk::Fine
}

/// The length of `s` with (at most `max_count`) occurrences of `from` replaced by `to`,
/// saturating, computed without building it.
pub fn replaced_len(s: &str, from: &str, to: &str, max_count: Option<usize>) -> usize {
    let found = if from.is_empty() {
        // An empty pattern matches before every character and at the end.
        s.chars().count() + 1
    } else {
        s.matches(from).count()
    };
    let found = max_count.map_or(found, |max| found.min(max));
    let removed = found.saturating_mul(from.len());
    s.len()
        .saturating_sub(removed)
        .saturating_add(found.saturating_mul(to.len()))
}

#[cold]
fn string_too_large(bytes: u128, limit: usize) -> Error {
    Error::new(
        ErrorKind::ValueTooLarge,
        format!("a string of {bytes} bytes exceeds the limit of {limit} bytes"),
    )
}

/// A `fmt::Write` into a `String` that refuses to grow past the current string limit.
///
/// Turning a value into text (`~`, `|string`, `|tojson`, `|format`) can produce far more
/// bytes than the value holds (one long string shared by a million list items), so such
/// conversions write through this instead of `format!`.
pub struct CappedString {
    buf: String,
    limit: usize,
    /// How many bytes were asked for in all, once the limit was passed.
    wanted: Option<usize>,
}

impl CappedString {
    /// An empty buffer with the current limit.
    pub fn new() -> CappedString {
        CappedString {
            buf: String::new(),
            limit: current().max_string_bytes,
            wanted: None,
        }
    }

    /// The text, or the error that names the limit.
    pub fn finish(self) -> Result<String, Error> {
        if self.wanted.is_some() {
            // Reported here: the thread-local must not label a later, unrelated error.
            OVERFLOW.with(|o| o.set(None));
        }
        match self.wanted {
            Some(wanted) => Err(string_too_large(wanted as u128, self.limit)),
            None => Ok(self.buf),
        }
    }

    /// The text so far (a capture that ended without passing the limit).
    pub(crate) fn into_string(self) -> String {
        self.buf
    }

    /// The limit error, if the limit was passed (for callers whose writer error was
    /// turned into another error on the way).
    pub fn overflow(&self) -> Option<Error> {
        if self.wanted.is_some() {
            OVERFLOW.with(|o| o.set(None));
        }
        self.wanted
            .map(|wanted| string_too_large(wanted as u128, self.limit))
    }
}

impl Default for CappedString {
    fn default() -> Self {
        CappedString::new()
    }
}

impl fmt::Write for CappedString {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let wanted = self.buf.len().saturating_add(s.len());
        if wanted > self.limit {
            self.wanted = Some(wanted);
            OVERFLOW.with(|o| o.set(Some((wanted, self.limit))));
            return Err(fmt::Error);
        }
        self.buf.push_str(s);
        Ok(())
    }
}

/// `format!("{value}")`, within the current string limit.
pub fn to_string_capped(value: &dyn fmt::Display) -> Result<String, Error> {
    let mut out = CappedString::new();
    if fmt::write(&mut out, format_args!("{value}")).is_err() {
        if let Some(err) = out.overflow() {
            return Err(err);
        }
        return Err(Error::new(ErrorKind::WriteFailure, "formatting failed"));
    }
    out.finish()
}
