//! The Jinja2 built-ins that neither minijinja nor minijinja-contrib provide, with
//! Jinja2 3.1's names, parameters, defaults and output; Python's printf-style `%`
//! formatting ([`percent_format`]); and the run-time hint for list and dict mutation.
//!
//! * Filters: `forceescape`, `random`, `urlencode`, `urlize`, `wordwrap`, `xmlattr`;
//!   the test `callable`; the global `lipsum`; and Jinja2's `indent`, which replaces
//!   minijinja's. Together with minijinja's built-ins and
//!   `helpers.rs` they make every name of Jinja2's `FILTERS`, `TESTS` and default
//!   globals available; a test below holds the complete lists and is the guard.
//! * APL has no auto-escaping, so each filter returns what Jinja2 returns with
//!   `autoescape=False`: `urlize` and `xmlattr` still HTML-escape their text (Jinja2
//!   does so either way) and `forceescape` escapes, which is its point.
//! * `random` and `lipsum` are deterministic: the VM is sans-IO and a run is replayed
//!   from its journal, so nothing here reads OS randomness. See [`RenderRng`].
//! * Every argument that sizes output is capped ([`MAX_WIDTH`], [`LIPSUM_MAX_PARAGRAPHS`],
//!   [`LIPSUM_MAX_WORDS`], [`MAX_RESULT_BYTES`]); beyond a cap the call is a template
//!   error naming the limit, so one call can never allocate gigabytes.
//!
//! Not in here: the APL helpers and the filters that replace minijinja's own
//! (`helpers.rs`), the printing of values (`env.rs`).

mod percent;
mod textwrap;

use std::sync::LazyLock;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

use crate::template::caps::{MAX_WIDTH, limit_error};
use crate::template::helpers::{bind, count_arg, invalid, text};
use crate::template::python::{py_repr, py_str, py_type_name};

pub use percent::percent_format;

/// Jinja2 3.1's built-in filters (`jinja2.filters.FILTERS`). All of them exist in the
/// template environment (a test checks it); the compiler suggests from this list.
pub const JINJA2_FILTERS: &[&str] = &[
    "abs",
    "attr",
    "batch",
    "capitalize",
    "center",
    "count",
    "d",
    "default",
    "dictsort",
    "e",
    "escape",
    "filesizeformat",
    "first",
    "float",
    "forceescape",
    "format",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "random",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "string",
    "striptags",
    "sum",
    "title",
    "tojson",
    "trim",
    "truncate",
    "unique",
    "upper",
    "urlencode",
    "urlize",
    "wordcount",
    "wordwrap",
    "xmlattr",
];
/// Jinja2 3.1's built-in tests (`jinja2.tests.TESTS`), operator spellings included.
pub const JINJA2_TESTS: &[&str] = &[
    "!=",
    "<",
    "<=",
    "==",
    ">",
    ">=",
    "boolean",
    "callable",
    "defined",
    "divisibleby",
    "eq",
    "equalto",
    "escaped",
    "even",
    "false",
    "filter",
    "float",
    "ge",
    "greaterthan",
    "gt",
    "in",
    "integer",
    "iterable",
    "le",
    "lessthan",
    "lower",
    "lt",
    "mapping",
    "ne",
    "none",
    "number",
    "odd",
    "sameas",
    "sequence",
    "string",
    "test",
    "true",
    "undefined",
    "upper",
];
/// Jinja2 3.1's default globals (`jinja2.defaults.DEFAULT_NAMESPACE`).
pub const JINJA2_GLOBALS: &[&str] = &["range", "dict", "lipsum", "cycler", "joiner", "namespace"];

/// The largest string `wordwrap` and `percent_format` build (4 MiB, the default render
/// output cap), since their output can be larger than their input.
pub(crate) const MAX_RESULT_BYTES: usize = 4 * 1024 * 1024;
/// The most paragraphs one `lipsum()` call generates (its `n`).
pub(crate) const LIPSUM_MAX_PARAGRAPHS: i64 = 100;
/// The largest `max` (words per paragraph) `lipsum()` accepts.
pub(crate) const LIPSUM_MAX_WORDS: i64 = 1_000;

/// Registers the Jinja2 built-ins of this module on `env`, and the unknown-method
/// callback that turns `items.append(x)` into a hint.
pub(crate) fn register(env: &mut Environment<'static>) {
    env.add_filter("forceescape", forceescape);
    // minijinja's `indent` takes no string width, splits on `\n` only, and allocates
    // any width it is given.
    env.add_filter("indent", indent);
    env.add_filter("random", random);
    env.add_filter("urlencode", urlencode);
    env.add_filter("urlize", urlize);
    env.add_filter("wordwrap", wordwrap);
    env.add_filter("xmlattr", xmlattr);
    env.add_test("callable", is_callable);
    env.add_function("lipsum", lipsum);
    // `unknown_method_callback` is installed by `env.rs` behind its size checks.
}

/// pycompat's Python methods (`.lower()`, `.get()`, ...), and for the methods that
/// would mutate a list or a dict, an error that says how to do it in APL.
///
/// Values are immutable (they are shared with the run's snapshots), so
/// `items.append(x)` cannot work; the fix is to build a new value and store it.
pub(crate) fn unknown_method_callback(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    let result = minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args);
    match result {
        Err(err) if err.kind() == ErrorKind::UnknownMethod => {
            match mutation_hint(value.kind(), method) {
                Some(hint) => Err(Error::new(
                    ErrorKind::UnknownMethod,
                    format!(
                        "{} has no method {method}(): values are immutable in APL; {hint}",
                        py_type_name(value)
                    ),
                )),
                None => Err(err),
            }
        }
        other => other,
    }
}

/// How to get the effect of the mutating method `method` of a list or dict.
fn mutation_hint(kind: ValueKind, method: &str) -> Option<&'static str> {
    Some(match (kind, method) {
        (ValueKind::Seq, "append") => {
            "build a new list and store it: {{ set_context('items', items + [x]) }}"
        }
        (ValueKind::Seq, "extend") => {
            "build a new list and store it: {{ set_context('items', items + more) }}"
        }
        (ValueKind::Seq, "insert") => {
            "build a new list and store it: {{ set_context('items', items[:i] + [x] + items[i:]) }}"
        }
        (ValueKind::Seq, "pop") => {
            "read the item with items[-1] and store the rest: {{ set_context('items', items[:-1]) }}"
        }
        (ValueKind::Seq, "remove") => {
            "build a new list and store it: {{ set_context('items', items | reject('equalto', x) | list) }}"
        }
        (ValueKind::Seq, "clear") => "store an empty list: {{ set_context('items', []) }}",
        (ValueKind::Map, "update") => {
            "build a new dict and store it: {{ set_context('d', dict(d, key=value)) }}"
        }
        (ValueKind::Map, "setdefault") => {
            "build a new dict and store it: {% if k not in d %}{{ set_context('d', dict(d, k=v)) }}{% endif %}"
        }
        (ValueKind::Map, "pop") => {
            "read the value with d.get(k) and store a new dict without the key with set_context('d', ...)"
        }
        (ValueKind::Map, "clear") => "store an empty dict: {{ set_context('d', {}) }}",
        _ => return None,
    })
}

/// Jinja2's `forceescape(value)`: HTML-escapes `str(value)`, even a safe string.
fn forceescape(value: &Value) -> Result<Value, Error> {
    let s = text("forceescape", value)?;
    Ok(Value::from_safe_string(html_escape(&s)))
}

/// Jinja2's `indent(s, width=4, first=False, blank=False)`: `width` is a number of
/// spaces or the indentation string itself; lines are split like Python's
/// `str.splitlines()`.
fn indent(args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = "indent";
    let [s, width, first, blank] = bind(F, ["s", "width", "first", "blank"], 1, args, &kwargs)?;
    let s = text(F, &s)?;
    let indention = match width.kind() {
        ValueKind::Undefined => "    ".to_string(),
        ValueKind::String => width.as_str().unwrap_or_default().to_string(),
        _ => {
            let n = int_arg(F, "width", &width, 4)?;
            if n > MAX_WIDTH as i64 {
                return Err(limit_error(format!(
                    "{F}(): width {n} exceeds the limit of {MAX_WIDTH}"
                )));
            }
            " ".repeat(n.max(0) as usize)
        }
    };
    // Jinja2 appends a newline first, so a trailing newline yields a last, empty line.
    let s = format!("{s}\n");
    let lines = textwrap::splitlines(&s);
    let size = s.len().saturating_add(
        lines
            .len()
            .saturating_add(1)
            .saturating_mul(indention.len()),
    );
    if size > MAX_RESULT_BYTES {
        return Err(result_too_large(F));
    }
    let mut out = if flag(&first, false) {
        indention.clone()
    } else {
        String::new()
    };
    if flag(&blank, false) {
        out.push_str(&lines.join(&format!("\n{indention}")));
    } else {
        let mut lines = lines.into_iter();
        out.push_str(lines.next().unwrap_or_default());
        for line in lines {
            out.push('\n');
            if !line.is_empty() {
                out.push_str(&indention);
            }
            out.push_str(line);
        }
    }
    Ok(Value::from(out))
}

/// Jinja2's `random(seq)`: an item of a list or tuple, or a character of a string,
/// chosen by the render's [`RenderRng`]. An empty sequence gives an undefined value,
/// as in Jinja2.
fn random(state: &mut State, value: &Value) -> Result<Value, Error> {
    const F: &str = "random";
    let items: Vec<Value> = match value.kind() {
        ValueKind::String => value
            .as_str()
            .unwrap_or_default()
            .chars()
            .map(Value::from)
            .collect(),
        ValueKind::Seq | ValueKind::Iterable => value.try_iter()?.collect(),
        _ => {
            return Err(invalid(format!(
                "{F}(): cannot choose from a value of type {}",
                py_type_name(value)
            )));
        }
    };
    if items.is_empty() {
        return Ok(Value::UNDEFINED);
    }
    let idx = RenderRng::of(state).below(items.len() as u64) as usize;
    Ok(items[idx].clone())
}

/// Jinja2's `urlencode(value)`: a string (or any non-iterable) is percent-encoded with
/// `/` kept; a dict, or a list of pairs, becomes a query string (`k=v&k2=v2`) with
/// spaces as `+`.
fn urlencode(value: &Value) -> Result<Value, Error> {
    const F: &str = "urlencode";
    let pairs: Vec<(Value, Value)> = match value.kind() {
        ValueKind::Map => value
            .try_iter()?
            .map(|key| {
                let item = value.get_item(&key).unwrap_or(Value::UNDEFINED);
                (key, item)
            })
            .collect(),
        ValueKind::Seq | ValueKind::Iterable => {
            let mut pairs = Vec::new();
            for item in value.try_iter()? {
                let parts: Vec<Value> = match item.kind() {
                    ValueKind::Seq => item.try_iter()?.collect(),
                    _ => Vec::new(),
                };
                let [key, value] = <[Value; 2]>::try_from(parts).map_err(|_| {
                    invalid(format!(
                        "{F}(): expected a dict or a list of (key, value) pairs, got an item {}",
                        py_repr(&item).unwrap_or_default()
                    ))
                })?;
                pairs.push((key, value));
            }
            pairs
        }
        ValueKind::Bytes => {
            return Ok(Value::from(url_quote(
                value.as_bytes().unwrap_or_default(),
                false,
            )));
        }
        _ => return Ok(Value::from(url_quote(text(F, value)?.as_bytes(), false))),
    };
    let mut out = String::new();
    for (idx, (key, item)) in pairs.iter().enumerate() {
        if idx > 0 {
            out.push('&');
        }
        out.push_str(&url_quote(py_str(key)?.as_bytes(), true));
        out.push('=');
        out.push_str(&url_quote(py_str(item)?.as_bytes(), true));
    }
    Ok(Value::from(out))
}

/// Jinja2's `urlize(value, trim_url_limit=None, nofollow=False, target=None, rel=None,
/// extra_schemes=None)` with Jinja2's default policies (`rel="noopener"`).
fn urlize(args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = "urlize";
    let [value, trim_url_limit, nofollow, target, rel, extra_schemes] = bind(
        F,
        [
            "value",
            "trim_url_limit",
            "nofollow",
            "target",
            "rel",
            "extra_schemes",
        ],
        1,
        args,
        &kwargs,
    )?;
    let value = text(F, &value)?;
    let trim = if is_missing(&trim_url_limit) {
        None
    } else {
        Some(count_arg(F, "trim_url_limit", &trim_url_limit, 0)?)
    };
    let mut rel_parts: Vec<String> = if is_missing(&rel) {
        Vec::new()
    } else {
        text(F, &rel)?
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    if nofollow.is_true() {
        rel_parts.push("nofollow".to_string());
    }
    // Jinja2's `urlize.rel` policy.
    rel_parts.push("noopener".to_string());
    rel_parts.sort();
    rel_parts.dedup();
    let target = if is_missing(&target) {
        None
    } else {
        Some(text(F, &target)?)
    };
    let mut schemes = Vec::new();
    if !is_missing(&extra_schemes) {
        for scheme in extra_schemes.try_iter()? {
            let scheme = text(F, &scheme)?;
            if !URI_SCHEME_RE.is_match(&scheme) {
                return Err(invalid(format!(
                    "{F}(): {} is not a valid URI scheme prefix",
                    py_repr(&Value::from(scheme.as_str()))?
                )));
            }
            schemes.push(scheme);
        }
    }
    let options = UrlizeOptions {
        trim,
        rel: rel_parts.join(" "),
        target,
        extra_schemes: schemes,
    };
    Ok(Value::from(urlize_text(&value, &options)))
}

/// Jinja2's `wordwrap(s, width=79, break_long_words=True, wrapstring=None,
/// break_on_hyphens=True)`: each line of `s` wrapped by Python's `textwrap.wrap`, joined
/// with `wrapstring` (a newline by default).
fn wordwrap(args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = "wordwrap";
    let [s, width, break_long_words, wrapstring, break_on_hyphens] = bind(
        F,
        [
            "s",
            "width",
            "break_long_words",
            "wrapstring",
            "break_on_hyphens",
        ],
        1,
        args,
        &kwargs,
    )?;
    let s = text(F, &s)?;
    let width = count_arg(F, "width", &width, 79)?;
    if width == 0 {
        return Err(invalid(format!("{F}(): invalid width 0 (must be > 0)")));
    }
    if width > MAX_WIDTH {
        return Err(limit_error(format!(
            "{F}(): width {width} exceeds the limit of {MAX_WIDTH}"
        )));
    }
    let wrapstring = if is_missing(&wrapstring) {
        "\n".to_string()
    } else {
        text(F, &wrapstring)?
    };
    let options = textwrap::Options {
        width,
        break_long_words: flag(&break_long_words, true),
        break_on_hyphens: flag(&break_on_hyphens, true),
    };
    // `wrapstring.join(wrapstring.join(wrap(line)) for line in s.splitlines())`.
    let mut paragraphs = Vec::new();
    let mut size = 0usize;
    for line in textwrap::splitlines(&s) {
        let paragraph = textwrap::wrap(line, &options).join(&wrapstring);
        size = size
            .saturating_add(paragraph.len())
            .saturating_add(wrapstring.len());
        if size > MAX_RESULT_BYTES {
            return Err(result_too_large(F));
        }
        paragraphs.push(paragraph);
    }
    let out = paragraphs.join(&wrapstring);
    Ok(Value::from(out))
}

/// Jinja2's `xmlattr(d, autospace=True)`: ` key="value"` pairs, HTML-escaped, for the
/// items whose value is not none or undefined.
fn xmlattr(args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = "xmlattr";
    let [d, autospace] = bind(F, ["d", "autospace"], 1, args, &kwargs)?;
    if d.kind() != ValueKind::Map {
        return Err(invalid(format!(
            "{F}(): expected a dict, got {}",
            py_type_name(&d)
        )));
    }
    let mut items = Vec::new();
    for key in d.try_iter()? {
        let value = d.get_item(&key).unwrap_or(Value::UNDEFINED);
        if value.is_none() || value.is_undefined() {
            continue;
        }
        let key = py_str(&key)?;
        // Characters that would end an attribute name in HTML (Jinja2's `_attr_key_re`).
        if key.chars().any(|c| {
            matches!(
                c,
                ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c' | '/' | '>' | '='
            )
        }) {
            return Err(invalid(format!(
                "{F}(): invalid character in attribute name: {}",
                py_repr(&Value::from(key))?
            )));
        }
        items.push(format!(
            "{}=\"{}\"",
            html_escape(&key),
            html_escape(&py_str(&value)?)
        ));
    }
    let mut out = items.join(" ");
    if flag(&autospace, true) && !out.is_empty() {
        out.insert(0, ' ');
    }
    Ok(Value::from(out))
}

/// Jinja2's `callable` test: true for functions, macros and `joiner()` objects.
///
/// minijinja has no "is callable" query and its function and macro types are private,
/// so the test goes by kind: every plain object in an APL template is a function or a
/// joiner except a `cycler()`, and the only map-like callable is a macro. The `Debug`
/// forms it reads are pinned by the unit tests (minijinja is pinned exactly).
fn is_callable(value: &Value) -> bool {
    if value.as_object().is_none() {
        return false;
    }
    match value.kind() {
        ValueKind::Plain => !format!("{value:?}").starts_with("Cycler"),
        ValueKind::Map => format!("{value:?}").starts_with("<macro "),
        _ => false,
    }
}

/// Jinja2's `lipsum(n=5, html=True, min=20, max=100)`: `n` paragraphs of lorem ipsum of
/// `min` to `max - 1` words, as `<p>` elements joined by newlines, or as plain
/// paragraphs separated by blank lines when `html` is false. The words come from the
/// render's [`RenderRng`], so the text differs from Python's but is the same on every
/// replay of a run.
fn lipsum(state: &mut State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = "lipsum";
    let [n, html, min, max] = bind(F, ["n", "html", "min", "max"], 0, args, &kwargs)?;
    let n = int_arg(F, "n", &n, 5)?;
    let html = flag(&html, true);
    let min = int_arg(F, "min", &min, 20)?;
    let max = int_arg(F, "max", &max, 100)?;
    if n > LIPSUM_MAX_PARAGRAPHS {
        return Err(limit_error(format!(
            "{F}(): n={n} exceeds the limit of {LIPSUM_MAX_PARAGRAPHS} paragraphs"
        )));
    }
    if max > LIPSUM_MAX_WORDS {
        return Err(limit_error(format!(
            "{F}(): max={max} exceeds the limit of {LIPSUM_MAX_WORDS} words"
        )));
    }
    if n > 0 && min >= max {
        return Err(invalid(format!(
            "{F}(): empty range for the number of words (min={min}, max={max})"
        )));
    }
    let rng = RenderRng::of(state);
    let paragraphs: Vec<String> = (0..n.max(0))
        .map(|_| lipsum_paragraph(rng, min, max))
        .collect();
    Ok(if html {
        Value::from_safe_string(
            paragraphs
                .iter()
                .map(|p| format!("<p>{}</p>", html_escape(p)))
                .collect::<Vec<_>>()
                .join("\n"),
        )
    } else {
        Value::from(paragraphs.join("\n\n"))
    })
}

/// One paragraph of [`lipsum`], by Jinja2's `generate_lorem_ipsum` rules.
fn lipsum_paragraph(rng: &mut RenderRng, min: i64, max: i64) -> String {
    let words: Vec<&str> = LOREM_IPSUM_WORDS.split_whitespace().collect();
    let count = rng.range(min, max);
    let mut next_capitalized = true;
    let (mut last_comma, mut last_fullstop) = (0i64, 0i64);
    let mut last: Option<&str> = None;
    let mut p: Vec<String> = Vec::new();
    for idx in 0..count.max(0) {
        let word = loop {
            let word = words[rng.below(words.len() as u64) as usize];
            if Some(word) != last {
                last = Some(word);
                break word;
            }
        };
        let mut word = if next_capitalized {
            next_capitalized = false;
            capitalize(word)
        } else {
            word.to_string()
        };
        if idx - rng.range(3, 8) > last_comma {
            last_comma = idx;
            last_fullstop += 2;
            word.push(',');
        }
        if idx - rng.range(10, 20) > last_fullstop {
            last_comma = idx;
            last_fullstop = idx;
            word.push('.');
            next_capitalized = true;
        }
        p.push(word);
    }
    let mut p = p.join(" ");
    if p.ends_with(',') {
        p.pop();
        p.push('.');
    } else if !p.ends_with('.') {
        p.push('.');
    }
    p
}

/// The pseudo-random numbers of one render, for `random` and `lipsum`.
///
/// A SplitMix64 generator, created on first use in a render and seeded from:
/// * the run's `seed` variable (§2.5) when it is set and not none, else a fixed seed;
/// * the template's name, so different phases and steps draw differently;
/// * `global_runs`, so a step that runs again (a loop, a retry) draws afresh.
///
/// All three come from the run's inputs, so a replayed run draws the same numbers; OS
/// randomness is never read. Within one render, successive calls continue the sequence.
struct RenderRng(u64);

impl RenderRng {
    /// The render's generator, seeded on first use.
    fn of<'a>(state: &'a mut State) -> &'a mut RenderRng {
        if state.get_extension::<RenderRng>().is_none() {
            let rng = RenderRng::seeded(state);
            state.get_or_insert_extension(rng);
        }
        state.get_or_insert_extension_with(|| RenderRng(0))
    }

    fn seeded(state: &State) -> RenderRng {
        let seed = match state.lookup(crate::names::SEED) {
            Some(seed) if !seed.is_none() && !seed.is_undefined() => {
                py_repr(&seed).unwrap_or_default()
            }
            _ => "aplc".to_string(),
        };
        let runs = state
            .lookup(crate::names::GLOBAL_RUNS)
            .and_then(|runs| i64::try_from(runs).ok())
            .unwrap_or(0);
        let mut key = seed.into_bytes();
        key.push(0);
        key.extend_from_slice(state.name().as_bytes());
        key.push(0);
        key.extend_from_slice(&runs.to_le_bytes());
        RenderRng(xxhash_rust::xxh3::xxh3_64(&key))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`), by multiply-shift; the bias is below 2^-40 for the
    /// sizes used here.
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Python's `randrange(lo, hi)` for `lo < hi`.
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        let span = hi.saturating_sub(lo).max(1) as u64;
        lo + self.below(span) as i64
    }
}

/// What `urlize` needs besides the text.
struct UrlizeOptions {
    trim: Option<usize>,
    rel: String,
    target: Option<String>,
    extra_schemes: Vec<String>,
}

/// Jinja2's `utils.urlize` (3.1): the text is HTML-escaped, split on whitespace, and
/// each word that looks like a URL or an email address becomes a link.
fn urlize_text(text: &str, options: &UrlizeOptions) -> String {
    let escaped = html_escape(text);
    let rel_attr = if options.rel.is_empty() {
        String::new()
    } else {
        format!(" rel=\"{}\"", html_escape(&options.rel))
    };
    let target_attr = match &options.target {
        Some(target) if !target.is_empty() => format!(" target=\"{}\"", html_escape(target)),
        _ => String::new(),
    };
    let trim_url = |x: &str| -> String {
        match options.trim {
            Some(limit) if x.chars().count() > limit => {
                format!("{}...", x.chars().take(limit).collect::<String>())
            }
            _ => x.to_string(),
        }
    };
    let mut out = String::with_capacity(escaped.len());
    for (is_space, word) in split_whitespace_runs(&escaped) {
        if is_space {
            out.push_str(word);
            continue;
        }
        let (head, rest) = split_head(word);
        let (mut middle, mut tail) = split_tail(rest);
        balance(&mut middle, &mut tail);
        let linked = if HTTP_RE.is_match(&middle) {
            let href = if middle.starts_with("https://") || middle.starts_with("http://") {
                middle.clone()
            } else {
                format!("https://{middle}")
            };
            format!(
                "<a href=\"{href}\"{rel_attr}{target_attr}>{}</a>",
                trim_url(&middle)
            )
        } else if let Some(address) = middle
            .strip_prefix("mailto:")
            .filter(|rest| EMAIL_RE.is_match(rest))
        {
            format!("<a href=\"{middle}\">{address}</a>")
        } else if middle.contains('@')
            && !middle.starts_with("www.")
            && !middle.starts_with('@')
            && !middle.contains(':')
            && EMAIL_RE.is_match(&middle)
        {
            format!("<a href=\"mailto:{middle}\">{middle}</a>")
        } else {
            let mut linked = middle.clone();
            for scheme in &options.extra_schemes {
                if linked != *scheme && linked.starts_with(scheme.as_str()) {
                    linked = format!("<a href=\"{linked}\"{rel_attr}{target_attr}>{linked}</a>");
                }
            }
            linked
        };
        out.push_str(head);
        out.push_str(&linked);
        out.push_str(&tail);
    }
    out
}

/// `re.split(r"(\s+)", text)`: alternating runs of non-space and space, flagged.
fn split_whitespace_runs(text: &str) -> impl Iterator<Item = (bool, &str)> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let first = rest.chars().next()?;
        let space = first.is_whitespace();
        let end = rest
            .char_indices()
            .find(|(_, c)| c.is_whitespace() != space)
            .map_or(rest.len(), |(idx, _)| idx);
        let (run, after) = rest.split_at(end);
        rest = after;
        Some((space, run))
    })
}

/// Splits off the leading `(`, `<` and `&lt;` of a word (`^([(<]|&lt;)+`).
fn split_head(word: &str) -> (&str, &str) {
    let mut idx = 0;
    loop {
        let rest = &word[idx..];
        if rest.starts_with('(') || rest.starts_with('<') {
            idx += 1;
        } else if rest.starts_with("&lt;") {
            idx += 4;
        } else {
            return word.split_at(idx);
        }
    }
}

/// Splits off the trailing `)`, `>`, `.`, `,`, newlines and `&gt;` of a word
/// (`([)>.,\n]|&gt;)+$`).
fn split_tail(word: &str) -> (String, String) {
    let mut end = word.len();
    loop {
        let rest = &word[..end];
        if rest.ends_with("&gt;") {
            end -= 4;
        } else if rest.ends_with([')', '>', '.', ',', '\n']) {
            end -= 1;
        } else {
            return (word[..end].to_string(), word[end..].to_string());
        }
    }
}

/// Moves closing brackets back from the tail while the middle has more opening ones,
/// as Jinja2 does to keep `(see http://x.org/a_(b))` whole.
fn balance(middle: &mut String, tail: &mut String) {
    for (start, end) in [("(", ")"), ("<", ">"), ("&lt;", "&gt;")] {
        let start_count = middle.matches(start).count();
        if start_count <= middle.matches(end).count() {
            continue;
        }
        for _ in 0..start_count.min(tail.matches(end).count()) {
            let Some(idx) = tail.find(end) else { break };
            let end_index = idx + end.len();
            middle.push_str(&tail[..end_index]);
            *tail = tail[end_index..].to_string();
        }
    }
}

/// Jinja2's `_http_re`.
static HTTP_RE: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(concat!(
        r"(?i)^(",
        r"(https?://|www\.)(([\w%-]+\.)+)?([a-z]{2,63}|xn--[\w%]{2,59})",
        r"|([\w%-]{2,63}\.)+(com|net|int|edu|gov|org|info|mil)",
        r"|(https?://)((([\d]{1,3})(\.[\d]{1,3}){3})|(\[([\da-f]{0,4}:){2}([\da-f]{0,4}:?){1,6}\]))",
        r")(:[\d]{1,5})?([/?#]\S*)?$",
    ))
    .unwrap_or_else(|err| unreachable!("a constant regex: {err}"))
});

/// Jinja2's `_email_re`.
static EMAIL_RE: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^\S+@\w[\w.-]*\.\w+$")
        .unwrap_or_else(|err| unreachable!("a constant regex: {err}"))
});

/// Jinja2's `_uri_scheme_re`, for `extra_schemes`.
static URI_SCHEME_RE: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^[\w.+-]{2,}:/{0,2}$")
        .unwrap_or_else(|err| unreachable!("a constant regex: {err}"))
});

/// Jinja2's `LOREM_IPSUM_WORDS`.
const LOREM_IPSUM_WORDS: &str = "a ac accumsan ad adipiscing aenean aliquam aliquet amet \
ante aptent arcu at auctor augue bibendum blandit class commodo condimentum congue \
consectetuer consequat conubia convallis cras cubilia cum curabitur curae cursus dapibus \
diam dictum dictumst dignissim dis dolor donec dui duis egestas eget eleifend elementum \
elit enim erat eros est et etiam eu euismod facilisi facilisis fames faucibus felis \
fermentum feugiat fringilla fusce gravida habitant habitasse hac hendrerit hymenaeos \
iaculis id imperdiet in inceptos integer interdum ipsum justo lacinia lacus laoreet \
lectus leo libero ligula litora lobortis lorem luctus maecenas magna magnis malesuada \
massa mattis mauris metus mi molestie mollis montes morbi mus nam nascetur natoque nec \
neque netus nibh nisi nisl non nonummy nostra nulla nullam nunc odio orci ornare \
parturient pede pellentesque penatibus per pharetra phasellus placerat platea porta \
porttitor posuere potenti praesent pretium primis proin pulvinar purus quam quis quisque \
rhoncus ridiculus risus rutrum sagittis sapien scelerisque sed sem semper senectus sit \
sociis sociosqu sodales sollicitudin suscipit suspendisse taciti tellus tempor tempus \
tincidunt torquent tortor tristique turpis ullamcorper ultrices ultricies urna ut varius \
vehicula vel velit venenatis vestibulum vitae vivamus viverra volutpat vulputate";

/// markupsafe's `escape`: `&`, `<`, `>`, `"` and `'`.
pub(crate) fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Python's `urllib.parse.quote_from_bytes`, as Jinja2's `url_quote` calls it: letters,
/// digits and `_.-~` are kept, and `/` too unless `for_qs`, which also writes spaces as
/// `+`.
fn url_quote(bytes: &[u8], for_qs: bool) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' | b'~' => {
                out.push(b as char)
            }
            b'/' if !for_qs => out.push('/'),
            b' ' if for_qs => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Python's `str.capitalize`.
fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

/// True for an argument that was not given or is none.
fn is_missing(value: &Value) -> bool {
    value.is_undefined() || value.is_none()
}

/// A boolean argument: its truth, or `default` when not given.
fn flag(value: &Value, default: bool) -> bool {
    if value.is_undefined() {
        default
    } else {
        value.is_true()
    }
}

/// An integer argument (a bool counts, as in Python), or `default` when not given.
fn int_arg(func: &str, param: &str, value: &Value, default: i64) -> Result<i64, Error> {
    if value.is_undefined() {
        return Ok(default);
    }
    if value.kind() == ValueKind::Bool {
        return Ok(i64::from(value.is_true()));
    }
    if value.is_integer()
        && let Ok(n) = i64::try_from(value.clone())
    {
        return Ok(n);
    }
    Err(invalid(format!(
        "{func}(): {param} must be an integer, got {}",
        py_repr(value).unwrap_or_else(|_| py_type_name(value).to_string())
    )))
}

#[cold]
fn result_too_large(func: &str) -> Error {
    limit_error(format!(
        "{func}(): the result exceeds the limit of {MAX_RESULT_BYTES} bytes"
    ))
}

#[cfg(test)]
mod tests;
