//! Built-in template helpers (§6.3, §7.4) and the filters that make minijinja's
//! built-ins behave like Jinja2's.
//!
//! The helpers are plain functions that reach the run's variables through
//! [`Store::from_state`]: the store is the root context of every render, so a value
//! written by `set_context` is visible to the very next expression of the same template.
//! Helpers that change the context return an empty string, so `{{ set_context(..) }}`
//! prints nothing.
//!
//! Arguments bind like a Python call: `get_context('x', 3)` and
//! `get_context('x', default=3)` are the same, and an unknown or doubled keyword is an
//! error naming the helper.
//!
//! Not in here: the environment's settings and the Python-style printing of values
//! (`env.rs`).

use minijinja::value::limits;
use minijinja::value::{Kwargs, Object, Rest, Tuple, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

use crate::names::{
    ADD_CONTEXT, CONTEXT, CONTEXT_HISTORY, GET_CONTEXT, GET_JSON_PATH, INC_CONTEXT, SET_CONTEXT,
    Unsettable, check_settable,
};
use crate::template::caps::{MAX_WIDTH, limit_error};
use crate::template::python::{py_repr, py_str, py_type_name};
use crate::template::store::{Store, freeze_views};

/// Registers the helpers and the Jinja2-compatible filters and globals on `env`. The
/// Jinja2 built-ins minijinja lacks are `jinja2.rs`'s, which uses this file's argument
/// binding, so `env.rs` registers them itself rather than through here.
pub(crate) fn register(env: &mut Environment<'static>) {
    env.add_function(SET_CONTEXT, set_context);
    env.add_function(GET_CONTEXT, get_context);
    env.add_function(ADD_CONTEXT, add_context);
    env.add_function(INC_CONTEXT, inc_context);
    env.add_function(GET_JSON_PATH, get_json_path);

    // minijinja's versions of these print values its own way or lack Jinja2's
    // positional parameters.
    env.add_filter("truncate", truncate);
    env.add_filter("join", join);
    env.add_filter("string", string);
    env.add_filter("pprint", pprint);
    env.add_filter("int", int);
    env.add_filter("float", float);
    // Jinja2 built-ins that core minijinja lacks.
    env.add_filter("center", center);
    env.add_filter("wordcount", wordcount);
    env.add_filter("filesizeformat", minijinja_contrib::filters::filesizeformat);
    env.add_filter("striptags", minijinja_contrib::filters::striptags);
    env.add_function("cycler", cycler);
    env.add_function("joiner", minijinja_contrib::globals::joiner);
}

/// `set_context(name, value)`: writes the variable `name`.
fn set_context(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = SET_CONTEXT;
    let [name, value] = bind(F, ["name", "value"], 2, args, &kwargs)?;
    let name = writable_name(F, &name)?;
    let value = storable(F, name, value)?;
    store(F, state)?.set(name, value);
    Ok(Value::from(""))
}

/// `get_context(name, default=None)`: the variable's value, or `default` when unset.
fn get_context(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = GET_CONTEXT;
    let [name, default] = bind(F, ["name", "default"], 1, args, &kwargs)?;
    let name = variable_name(F, &name)?;
    let store = store(F, state)?;
    let value = match name {
        // The views live in the store object, not among the variables.
        CONTEXT | CONTEXT_HISTORY => store.get_value(&Value::from(name)),
        _ => store.get(name),
    };
    Ok(match value {
        Some(value) if !value.is_undefined() => value,
        _ => none_if_undefined(default),
    })
}

/// `add_context(name, value, default=0)`: `name = (name or default) + value`.
fn add_context(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = ADD_CONTEXT;
    let [name, value, default] = bind(F, ["name", "value", "default"], 2, args, &kwargs)?;
    accumulate(F, state, &name, value, default)
}

/// `inc_context(name, default=0)`: `add_context(name, 1, default)`.
fn inc_context(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = INC_CONTEXT;
    let [name, default] = bind(F, ["name", "default"], 1, args, &kwargs)?;
    accumulate(F, state, &name, Value::from(1), default)
}

/// `get_json_path(obj, path, default=None)`: the value at `path` inside `obj`.
///
/// * `path` is dot-separated (`"user.profile.name"`); a segment indexes a list when it
///   is an integer (`"items.0.title"`), and `[0]` or `['key']` brackets work too
///   (`"items[0].title"`, `"headers['content-type']"`).
/// * Negative indexes count from the end of a list, as in Python (`"items.-1"`).
/// * A map is looked up by the segment as a string key, then as an integer key.
/// * If `obj` is a string it is parsed as JSON first, because tool results usually
///   arrive as JSON text; a string that is not JSON has no paths. Strings met further
///   down the path are not parsed.
/// * Any missing step gives `default`. A value that is present but `none` is returned
///   as `none`. The empty path returns `obj` itself.
/// * A malformed path (`"a..b"`, `"a[0"`) is an error.
///
/// This helper is pure: unlike the others it needs no running program.
fn get_json_path(args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = GET_JSON_PATH;
    let [obj, path, default] = bind(F, ["obj", "path", "default"], 2, args, &kwargs)?;
    let Some(path) = path.as_str() else {
        return Err(invalid(format!(
            "{F}(): the path must be a string, got {}",
            py_type_name(&path)
        )));
    };
    let segments = parse_path(path).map_err(|msg| invalid(format!("{F}(): {msg}")))?;
    let default = none_if_undefined(default);
    let mut current = match obj.as_str() {
        Some(text) if obj.kind() == ValueKind::String => {
            match serde_json::from_str::<Value>(text) {
                Ok(parsed) => parsed,
                Err(_) => return Ok(default),
            }
        }
        _ => obj,
    };
    if current.is_undefined() {
        return Ok(default);
    }
    for segment in &segments {
        match step(&current, segment) {
            Some(next) => current = next,
            None => return Ok(default),
        }
    }
    Ok(current)
}

/// Jinja2's `truncate(s, length=255, killwords=False, end='...', leeway=None)`.
///
/// `leeway` defaults to 5, Jinja2's `truncate.leeway` policy. Non-strings are
/// truncated as their `str()`.
fn truncate(args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = "truncate";
    let [s, length, killwords, end, leeway] = bind(
        F,
        ["s", "length", "killwords", "end", "leeway"],
        1,
        args,
        &kwargs,
    )?;
    let s = text(F, &s)?;
    let length = count_arg(F, "length", &length, 255)?;
    let killwords = !killwords.is_undefined() && killwords.is_true();
    let end = if end.is_undefined() {
        "...".to_string()
    } else {
        text(F, &end)?
    };
    let leeway = count_arg(F, "leeway", &leeway, 5)?;
    let end_len = end.chars().count();
    if length < end_len {
        return Err(invalid(format!(
            "{F}(): expected length >= {end_len}, got {length}"
        )));
    }
    if s.chars().count() <= length.saturating_add(leeway) {
        return Ok(Value::from(s));
    }
    let head: String = s.chars().take(length - end_len).collect();
    let mut result = if killwords {
        head
    } else {
        // Python's `head.rsplit(" ", 1)[0]`.
        match head.rfind(' ') {
            Some(idx) => head[..idx].to_string(),
            None => head,
        }
    };
    result.push_str(&end);
    Ok(Value::from(result))
}

/// Jinja2's `join(value, d='', attribute=None)`; items print as Python's `str()`.
fn join(args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = "join";
    let [value, d, attribute] = bind(F, ["value", "d", "attribute"], 1, args, &kwargs)?;
    let separator = if d.is_undefined() {
        String::new()
    } else {
        text(F, &d)?
    };
    let attribute = if attribute.is_undefined() || attribute.is_none() {
        None
    } else {
        Some(text(F, &attribute)?)
    };
    let mut out = String::new();
    for (idx, item) in items(F, &value)?.into_iter().enumerate() {
        if idx > 0 {
            out.push_str(&separator);
        }
        let item = match &attribute {
            Some(path) => attribute_path(F, &item, path)?,
            None => item,
        };
        out.push_str(&py_str(&item)?);
        // Every item may be within the limit and the whole far beyond it (one long
        // string repeated): check as the text grows.
        limits::check_string_bytes(out.len())?;
    }
    Ok(Value::from(out))
}

/// Jinja2's `string(value)`: Python's `str()`.
fn string(value: &Value) -> Result<Value, Error> {
    if value.kind() == ValueKind::String {
        return Ok(value.clone());
    }
    py_str(value).map(Value::from)
}

/// Jinja2's `pprint(value)`: Python's `repr()` (without `pprint`'s line wrapping).
fn pprint(value: &Value) -> Result<Value, Error> {
    py_repr(value).map(Value::from)
}

/// Jinja2's `int(value, default=0, base=10)`: a value that does not convert gives
/// `default` (minijinja's own `int` fails unless a default is passed).
fn int(
    state: &State,
    value: &Value,
    default: Option<Value>,
    base: Option<u32>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let default = match default {
        Some(default) => default,
        None => kwargs
            .get::<Option<Value>>("default")?
            .unwrap_or(Value::from(0)),
    };
    minijinja::filters::int(state, value, Some(default), base, kwargs)
}

/// Jinja2's `float(value, default=0.0)`; see [`int`].
fn float(
    state: &State,
    value: &Value,
    default: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let default = match default {
        Some(default) => default,
        None => kwargs
            .get::<Option<Value>>("default")?
            .unwrap_or(Value::from(0.0)),
    };
    minijinja::filters::float(state, value, Some(default), kwargs)
}

/// Jinja2's `center(value, width=80)`, with Python's rule for odd padding.
fn center(args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const F: &str = "center";
    let [value, width] = bind(F, ["value", "width"], 1, args, &kwargs)?;
    let s = text(F, &value)?;
    let width = count_arg(F, "width", &width, 80)?;
    let len = s.chars().count();
    if len >= width {
        return Ok(Value::from(s));
    }
    // The padding is an allocation of `width` characters.
    if width > MAX_WIDTH {
        return Err(limit_error(format!(
            "{F}(): width {width} exceeds the limit of {MAX_WIDTH}"
        )));
    }
    let margin = width - len;
    limits::check_string_bytes(s.len().saturating_add(margin))?;
    let left = margin / 2 + (margin & width & 1);
    let right = margin - left;
    Ok(Value::from(format!(
        "{}{s}{}",
        " ".repeat(left),
        " ".repeat(right)
    )))
}

/// Jinja2's `wordcount(s)`: the number of runs of word characters (`\w+`).
fn wordcount(value: &Value) -> Result<Value, Error> {
    let s = text("wordcount", value)?;
    let mut count = 0usize;
    let mut in_word = false;
    for c in s.chars() {
        let word_char = c.is_alphanumeric() || c == '_';
        if word_char && !in_word {
            count += 1;
        }
        in_word = word_char;
    }
    Ok(Value::from(count))
}

/// Jinja2's `cycler(*items)`. minijinja-contrib's takes one list instead; its cycler
/// has `next()` but not Jinja2's `current` and `reset()`.
fn cycler(items: Rest<Value>) -> Result<Value, Error> {
    minijinja_contrib::globals::cycler(items.0)
}

/// Binds positional `args` and `kwargs` to `params` the way Python binds a call.
///
/// The first `required` parameters must be given; a parameter that was not given is
/// [`Value::UNDEFINED`] in the result.
pub(crate) fn bind<const N: usize>(
    func: &str,
    params: [&str; N],
    required: usize,
    args: &[Value],
    kwargs: &Kwargs,
) -> Result<[Value; N], Error> {
    if args.len() > N {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            format!(
                "{func}() takes at most {N} arguments ({} given)",
                args.len()
            ),
        ));
    }
    let mut bound: [Option<Value>; N] = std::array::from_fn(|idx| args.get(idx).cloned());
    for key in kwargs.args() {
        let Some(idx) = params.iter().position(|param| *param == key) else {
            return Err(Error::new(
                ErrorKind::TooManyArguments,
                format!("{func}() got an unexpected keyword argument '{key}'"),
            ));
        };
        if bound[idx].is_some() {
            return Err(Error::new(
                ErrorKind::TooManyArguments,
                format!("{func}() got multiple values for argument '{key}'"),
            ));
        }
        bound[idx] = Some(kwargs.get::<Value>(key)?);
    }
    if let Some(idx) = (0..required.min(N)).find(|idx| bound[*idx].is_none()) {
        return Err(Error::new(
            ErrorKind::MissingArgument,
            format!("{func}() missing required argument '{}'", params[idx]),
        ));
    }
    Ok(bound.map(|value| value.unwrap_or(Value::UNDEFINED)))
}

/// The store of the running program, or an error naming `func`.
pub(crate) fn store(func: &str, state: &State) -> Result<std::sync::Arc<Store>, Error> {
    Store::from_state(state).ok_or_else(|| {
        invalid(format!(
            "{func} can only be called while an APL program runs"
        ))
    })
}

pub(crate) fn variable_name<'a>(func: &str, name: &'a Value) -> Result<&'a str, Error> {
    match name.as_str() {
        Some(s) if name.kind() == ValueKind::String && !s.is_empty() => Ok(s),
        Some(_) if name.kind() == ValueKind::String => Err(invalid(format!(
            "{func}(): the variable name must not be empty"
        ))),
        _ => Err(invalid(format!(
            "{func}(): the variable name must be a string, got {}",
            py_type_name(name)
        ))),
    }
}

/// A name the helpers may write: not one of the executor's views, and not a helper's
/// own name (the root context is looked up before globals, so a variable named
/// `set_context` would hide the helper from then on).
pub(crate) fn writable_name<'a>(func: &str, name: &'a Value) -> Result<&'a str, Error> {
    let name = variable_name(func, name)?;
    match check_settable(name) {
        Ok(()) => Ok(name),
        Err(Unsettable::View) => Err(invalid(format!(
            "{func}('{name}', ...): `{name}` is maintained by the executor and cannot be set"
        ))),
        Err(Unsettable::Helper) => Err(invalid(format!(
            "{func}('{name}', ...): `{name}` is a helper function and cannot be used as a variable name"
        ))),
        Err(Unsettable::Reserved) => Err(invalid(format!("Reserved variable: {name}"))),
        // `variable_name` refused the empty name already.
        Err(Unsettable::Empty) => Err(invalid(format!(
            "{func}(): the variable name must not be empty"
        ))),
    }
}

/// `value` as it should be stored: never undefined, and lazy sequences (the result of
/// `list + list`, `dict.items()`, one-shot iterators) turned into plain lists, so that
/// a stored value can be read any number of times and does not grow a chain of lazy
/// concatenations step after step.
///
/// A stored value outlives the render and is read by every later step, `--json` and
/// `with_context` tools, so it gets the nesting check here too, and the live `context`
/// view is frozen (see [`freeze_views`]).
pub(crate) fn storable(func: &str, name: &str, value: Value) -> Result<Value, Error> {
    let value = match value.kind() {
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::UndefinedError,
                format!("{func}('{name}', ...): the value is undefined"),
            ));
        }
        ValueKind::Iterable => {
            let items = value.try_iter()?.collect::<Vec<_>>();
            limits::check_new_container(&items)?;
            Value::from(items)
        }
        _ => value,
    };
    limits::check_depth(&value)?;
    freeze_views(value, limits::current().max_depth)
        .map_err(|problem| invalid(format!("{func}('{name}', ...): {problem}")))
}

fn accumulate(
    func: &str,
    state: &State,
    name: &Value,
    value: Value,
    default: Value,
) -> Result<Value, Error> {
    let name = writable_name(func, name)?;
    let value = storable(func, name, value)?;
    let store = store(func, state)?;
    let current = match store.get(name) {
        Some(current) if !current.is_undefined() => current,
        _ if default.is_undefined() => Value::from(0),
        _ => default,
    };
    let sum =
        py_add(&current, &value).map_err(|msg| invalid(format!("{func}('{name}', ...): {msg}")))?;
    store.set(name, sum);
    Ok(Value::from(""))
}

/// `a + b` with Python's meaning for numbers (bools count as 0 and 1), strings, lists
/// and tuples. Integers are 128-bit: overflow is an error, not a big integer.
pub(crate) fn py_add(a: &Value, b: &Value) -> Result<Value, String> {
    let unsupported = || {
        format!(
            "unsupported operand types for +: '{}' and '{}'",
            py_type_name(a),
            py_type_name(b)
        )
    };
    match (a.kind(), b.kind()) {
        (ValueKind::Number | ValueKind::Bool, ValueKind::Number | ValueKind::Bool)
            if as_int(a).is_some() && as_int(b).is_some() =>
        {
            let x = as_int(a).ok_or_else(unsupported)?;
            let y = as_int(b).ok_or_else(unsupported)?;
            let sum = x
                .checked_add(y)
                .ok_or_else(|| format!("integer overflow adding {y} to {x}"))?;
            Ok(match i64::try_from(sum) {
                Ok(small) => Value::from(small),
                Err(_) => Value::from(sum),
            })
        }
        (ValueKind::Number | ValueKind::Bool, ValueKind::Number | ValueKind::Bool) => {
            let x = as_float(a).ok_or_else(unsupported)?;
            let y = as_float(b).ok_or_else(unsupported)?;
            Ok(Value::from(x + y))
        }
        (ValueKind::String, ValueKind::String) => {
            let (x, y) = (
                a.as_str().unwrap_or_default(),
                b.as_str().unwrap_or_default(),
            );
            limits::check_string_bytes(x.len().saturating_add(y.len()))
                .map_err(|err| limit_message(&err))?;
            Ok(Value::from(format!("{x}{y}")))
        }
        (ValueKind::Seq | ValueKind::Iterable, ValueKind::Seq | ValueKind::Iterable)
            if a.is_tuple() == b.is_tuple() =>
        {
            let mut items: Vec<Value> = Vec::new();
            for value in [a, b] {
                items.extend(value.try_iter().map_err(|err| err.to_string())?);
                limits::check_items(items.len() as u128).map_err(|err| limit_message(&err))?;
            }
            Ok(if a.is_tuple() {
                Value::from(Tuple::from(items))
            } else {
                Value::from(items)
            })
        }
        _ => Err(unsupported()),
    }
}

/// `a - b` with Python's meaning for numbers (bools count as 0 and 1); no other type
/// subtracts. Integers are 128-bit: overflow is an error.
pub(crate) fn py_sub(a: &Value, b: &Value) -> Result<Value, String> {
    if let (Some(x), Some(y)) = (as_int(a), as_int(b))
        && a.kind() != ValueKind::String
        && b.kind() != ValueKind::String
    {
        return x
            .checked_sub(y)
            .map(Value::from)
            .ok_or_else(|| format!("integer overflow subtracting {y} from {x}"));
    }
    match (as_float(a), as_float(b)) {
        (Some(x), Some(y)) => Ok(Value::from(x - y)),
        _ => Err(format!(
            "unsupported operand types for -: '{}' and '{}'",
            py_type_name(a),
            py_type_name(b)
        )),
    }
}

/// A value-limit error as the message `accumulate` wraps.
fn limit_message(err: &Error) -> String {
    format!(
        "{}: {} (spec/limits.md)",
        err.kind(),
        err.detail().unwrap_or_default()
    )
}

/// An integer (or a bool, which Python counts as one) as `i128`.
fn as_int(value: &Value) -> Option<i128> {
    match value.kind() {
        ValueKind::Bool => Some(i128::from(value.is_true())),
        ValueKind::Number if value.is_integer() => i128::try_from(value.clone()).ok(),
        _ => None,
    }
}

/// A number (or a bool) as `f64`.
fn as_float(value: &Value) -> Option<f64> {
    match value.kind() {
        ValueKind::Bool => Some(if value.is_true() { 1.0 } else { 0.0 }),
        ValueKind::Number => f64::try_from(value.clone()).ok(),
        _ => None,
    }
}

/// One segment of a `get_json_path` path: a key, or an index given as text.
type Segment = String;

pub(crate) fn parse_path(path: &str) -> Result<Vec<Segment>, String> {
    let malformed = |why: &str| format!("malformed path '{path}': {why}");
    let bytes = path.as_bytes();
    let mut segments = Vec::new();
    let mut pos = 0;
    if path.is_empty() {
        return Ok(segments);
    }
    loop {
        if bytes.get(pos) == Some(&b'[') {
            let rest = &path[pos + 1..];
            let (segment, used) = match rest.as_bytes().first() {
                Some(&quote @ (b'\'' | b'"')) => {
                    let close = rest[1..]
                        .find(quote as char)
                        .ok_or_else(|| malformed("unclosed quote"))?;
                    if rest.as_bytes().get(close + 2) != Some(&b']') {
                        return Err(malformed("expected ']' after the quoted key"));
                    }
                    (rest[1..close + 1].to_string(), close + 3)
                }
                _ => {
                    let close = rest.find(']').ok_or_else(|| malformed("unclosed '['"))?;
                    let index = rest[..close].trim();
                    if index.parse::<i64>().is_err() {
                        return Err(malformed("brackets hold an integer index or a quoted key"));
                    }
                    (index.to_string(), close + 1)
                }
            };
            segments.push(segment);
            pos += 1 + used;
        } else {
            let end = path[pos..]
                .find(['.', '['])
                .map_or(path.len(), |idx| pos + idx);
            if end == pos {
                return Err(malformed("empty segment"));
            }
            segments.push(path[pos..end].to_string());
            pos = end;
        }
        match bytes.get(pos) {
            None => return Ok(segments),
            Some(b'.') => {
                pos += 1;
                if pos == bytes.len() || bytes[pos] == b'[' {
                    return Err(malformed("empty segment"));
                }
            }
            Some(b'[') => {}
            Some(_) => return Err(malformed("expected '.' or '[' after ']'")),
        }
    }
}

/// Follows one path segment from `current`, or `None` if there is nothing there.
pub(crate) fn step(current: &Value, segment: &str) -> Option<Value> {
    let found = |value: Value| (!value.is_undefined()).then_some(value);
    match current.kind() {
        ValueKind::Map => current
            .get_item(&Value::from(segment))
            .ok()
            .and_then(found)
            .or_else(|| {
                let index = segment.parse::<i64>().ok()?;
                current.get_item(&Value::from(index)).ok().and_then(found)
            }),
        ValueKind::Seq | ValueKind::Iterable => {
            let index = segment.parse::<i64>().ok()?;
            let len = current.len()?;
            let index = if index < 0 {
                len.checked_sub(usize::try_from(index.unsigned_abs()).ok()?)?
            } else {
                usize::try_from(index).ok()?
            };
            if index >= len {
                return None;
            }
            current.get_item_by_index(index).ok().and_then(found)
        }
        _ => None,
    }
}

/// The items a filter iterates: a string's characters, a map's keys, a list's items.
fn items(func: &str, value: &Value) -> Result<Vec<Value>, Error> {
    match value.kind() {
        ValueKind::Undefined => Err(Error::new(
            ErrorKind::UndefinedError,
            format!("{func}(): the value is undefined"),
        )),
        ValueKind::String => Ok(value
            .as_str()
            .unwrap_or_default()
            .chars()
            .map(Value::from)
            .collect()),
        _ => match value.try_iter() {
            Ok(iter) => Ok(iter.collect()),
            Err(_) => Err(invalid(format!(
                "{func}(): cannot iterate over a value of type {}",
                py_type_name(value)
            ))),
        },
    }
}

/// Jinja2's attribute getter: a dotted path whose integer parts index lists.
fn attribute_path(func: &str, item: &Value, path: &str) -> Result<Value, Error> {
    let mut current = item.clone();
    for part in path.split('.') {
        let next = match part.parse::<i64>() {
            Ok(index) => current.get_item(&Value::from(index)),
            Err(_) => current.get_attr(part),
        };
        current = match next {
            Ok(value) if !value.is_undefined() => value,
            _ => {
                return Err(Error::new(
                    ErrorKind::UndefinedError,
                    format!(
                        "{func}(): a {} has no attribute '{path}'",
                        py_type_name(item)
                    ),
                ));
            }
        };
    }
    Ok(current)
}

/// A string argument, or the `str()` of another value.
pub(crate) fn text(func: &str, value: &Value) -> Result<String, Error> {
    if value.is_undefined() {
        return Err(Error::new(
            ErrorKind::UndefinedError,
            format!("{func}(): the value is undefined"),
        ));
    }
    py_str(value)
}

/// A non-negative integer argument, `default` when not given (or `none`).
pub(crate) fn count_arg(
    func: &str,
    param: &str,
    value: &Value,
    default: usize,
) -> Result<usize, Error> {
    if value.is_undefined() || value.is_none() {
        return Ok(default);
    }
    if value.is_integer()
        && let Ok(n) = usize::try_from(value.clone())
    {
        return Ok(n);
    }
    Err(invalid(format!(
        "{func}(): {param} must be a non-negative integer, got {}",
        py_repr(value).unwrap_or_else(|_| py_type_name(value).to_string())
    )))
}

pub(crate) fn none_if_undefined(value: Value) -> Value {
    if value.is_undefined() {
        Value::from(())
    } else {
        value
    }
}

#[cold]
pub(crate) fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use minijinja::value::Value;
    use serde_json::json;

    use super::*;
    use crate::template::env::{Limits, template_env};
    use crate::template::store::Vars;

    fn store() -> Arc<Store> {
        Store::new(Vars::new())
    }

    fn render_in(store: &Arc<Store>, source: &str) -> Result<String, Error> {
        let env = template_env(&Limits::default());
        env.render_str(source, Value::from_dyn_object(store.clone()))
    }

    fn ok(store: &Arc<Store>, source: &str) -> String {
        match render_in(store, source) {
            Ok(out) => out,
            Err(err) => panic!("{source:?} failed: {err:#}"),
        }
    }

    fn err(store: &Arc<Store>, source: &str) -> String {
        match render_in(store, source) {
            Ok(out) => panic!("{source:?} should fail, rendered {out:?}"),
            Err(err) => err.to_string(),
        }
    }

    fn json_value(v: serde_json::Value) -> Value {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn helpers_set_context_refuses_reserved_names() {
        let s = store();
        let err = err(&s, "{{ set_context('mem' ~ 'ory', 1) }}");
        assert!(err.contains("Reserved variable: memory"), "{err}");
        assert_eq!(s.get("memory"), None);
    }

    #[test]
    fn helpers_set_context_is_live_within_one_template() {
        let s = store();
        assert_eq!(ok(&s, "{{ set_context('a', 1) }}{{ a + 1 }}"), "2");
        assert_eq!(s.get("a"), Some(Value::from(1)));
        assert_eq!(ok(&s, "{{ set_context(name='b', value='x') }}{{ b }}"), "x");
        assert_eq!(
            ok(&s, "{{ set_context('a', 5) }}{{ get_context('a') }}"),
            "5"
        );
    }

    #[test]
    fn helpers_set_context_materializes_lazy_lists() {
        let s = store();
        ok(
            &s,
            "{{ set_context('xs', [1] + [2]) }}{{ set_context('xs', xs + [3]) }}",
        );
        assert_eq!(s.get("xs"), Some(Value::from(vec![1, 2, 3])));
        assert_eq!(ok(&s, "{{ xs[2] }}"), "3");
        ok(&s, "{{ set_context('kv', {'a': 1}.items()) }}");
        assert_eq!(ok(&s, "{{ kv[0] }}"), "('a', 1)");
    }

    #[test]
    fn helpers_set_context_errors() {
        let s = store();
        assert!(err(&s, "{{ set_context('context', 1) }}").contains("maintained by the executor"));
        assert!(
            err(&s, "{{ set_context('context_history', []) }}")
                .contains("maintained by the executor")
        );
        for helper in crate::names::HELPERS.iter().map(|h| h.name) {
            let e = err(&s, &format!("{{{{ set_context('{helper}', 1) }}}}"));
            assert!(e.contains("is a helper function"), "{e}");
        }
        assert!(err(&s, "{{ set_context(1, 1) }}").contains("must be a string, got int"));
        assert!(err(&s, "{{ set_context('', 1) }}").contains("must not be empty"));
        assert!(err(&s, "{{ set_context('x') }}").contains("missing required argument 'value'"));
        assert!(err(&s, "{{ set_context('x', 1, 2) }}").contains("takes at most 2 arguments"));
        assert!(
            err(&s, "{{ set_context('x', 1, name='y') }}")
                .contains("multiple values for argument 'name'")
        );
        assert!(
            err(&s, "{{ set_context('x', valu=1) }}")
                .contains("unexpected keyword argument 'valu'")
        );
        assert!(err(&s, "{{ set_context('x', missing) }}").contains("the value is undefined"));
        assert!(s.vars().is_empty());
    }

    #[test]
    fn every_helper_of_the_name_table_is_registered() {
        let env = template_env(&Limits::default());
        for helper in crate::names::HELPERS {
            assert!(
                env.globals().any(|(name, _)| name == helper.name),
                "{}",
                helper.name
            );
        }
    }

    #[test]
    fn helpers_need_a_running_program() {
        let env = template_env(&Limits::default());
        for (helper, call) in [
            ("set_context", "set_context('a', 1)"),
            ("get_context", "get_context('a')"),
            ("add_context", "add_context('a', 1)"),
            ("inc_context", "inc_context('a')"),
        ] {
            let e = env
                .render_str(&format!("{{{{ {call} }}}}"), ())
                .unwrap_err();
            assert!(
                e.to_string().contains(&format!(
                    "{helper} can only be called while an APL program runs"
                )),
                "{e}"
            );
        }
        // get_json_path is pure.
        assert_eq!(
            env.render_str("{{ get_json_path({'a': 1}, 'a') }}", ())
                .unwrap(),
            "1"
        );
    }

    #[test]
    fn helpers_get_context() {
        let s = store();
        s.set("x", Value::from(3));
        s.set("n", Value::from(()));
        assert_eq!(ok(&s, "{{ get_context('x') }}"), "3");
        assert_eq!(ok(&s, "{{ get_context('nope') }}"), "None");
        assert_eq!(ok(&s, "{{ get_context('nope') is none }}"), "True");
        assert_eq!(ok(&s, "{{ get_context('nope', 'Guest') }}"), "Guest");
        assert_eq!(ok(&s, "{{ get_context('nope', default=3) }}"), "3");
        assert_eq!(ok(&s, "{{ get_context(name='x', default=7) }}"), "3");
        // A variable that is set to none is set.
        assert_eq!(ok(&s, "{{ get_context('n', 1) }}"), "None");
        assert_eq!(ok(&s, "{{ get_context('context').x }}"), "3");
        assert_eq!(ok(&s, "{{ get_context('context_history') | length }}"), "0");
        assert!(err(&s, "{{ get_context() }}").contains("missing required argument 'name'"));
        assert!(err(&s, "{{ get_context(none) }}").contains("must be a string, got NoneType"));
        assert!(err(&s, "{{ get_context('x', 1, 2) }}").contains("takes at most 2"));
    }

    #[test]
    fn helpers_add_and_inc_context() {
        let s = store();
        ok(&s, "{{ add_context('i', 2) }}{{ add_context('i', 3) }}");
        assert_eq!(s.get("i"), Some(Value::from(5)));
        ok(&s, "{{ add_context('f', 0.5) }}{{ add_context('f', 1) }}");
        assert_eq!(s.get("f"), Some(Value::from(1.5)));
        ok(&s, "{{ add_context('g', 1, default=0.25) }}");
        assert_eq!(s.get("g"), Some(Value::from(1.25)));
        ok(
            &s,
            "{{ add_context('s', 'a', '') }}{{ add_context('s', 'b') }}",
        );
        assert_eq!(s.get("s"), Some(Value::from("ab")));
        ok(
            &s,
            "{{ add_context('l', [1], []) }}{{ add_context('l', [2, 3]) }}",
        );
        assert_eq!(s.get("l"), Some(Value::from(vec![1, 2, 3])));
        ok(&s, "{{ add_context('t', (2,), default=(1,)) }}");
        assert_eq!(ok(&s, "{{ t }}"), "(1, 2)");
        assert_eq!(
            ok(&s, "{{ inc_context('c') }}{{ inc_context('c') }}{{ c }}"),
            "2"
        );
        assert_eq!(
            ok(
                &s,
                "{{ inc_context('d', 10) }}{{ inc_context('d', default=99) }}{{ d }}"
            ),
            "12"
        );
        assert_eq!(ok(&s, "{{ add_context('i', 1) }}{{ i }}"), "6");

        let e = err(&s, "{{ add_context('i', 'x') }}");
        assert!(
            e.contains("add_context('i', ...): unsupported operand types for +: 'int' and 'str'"),
            "{e}"
        );
        let e = err(&s, "{{ add_context('new', [1]) }}");
        assert!(e.contains("'int' and 'list'"), "{e}");
        let e = err(&s, "{{ add_context('s', {'a': 1}) }}");
        assert!(e.contains("'str' and 'dict'"), "{e}");
        ok(
            &s,
            "{{ add_context('b', true, 1) }}{{ add_context('b', 0.5) }}",
        );
        assert_eq!(s.get("b"), Some(Value::from(2.5)));
        let e = err(&s, "{{ add_context('b', 'x') }}");
        assert!(e.contains("'float' and 'str'"), "{e}");
        s.set("n", Value::from(()));
        assert!(err(&s, "{{ inc_context('n') }}").contains("'NoneType' and 'int'"));
        s.set("big", Value::from(i128::MAX));
        let e = err(&s, "{{ inc_context('big') }}");
        assert!(e.contains("integer overflow"), "{e}");
        assert_eq!(s.get("big"), Some(Value::from(i128::MAX)));
        assert!(err(&s, "{{ add_context('x') }}").contains("missing required argument 'value'"));
        assert!(err(&s, "{{ inc_context('context') }}").contains("maintained by the executor"));
        assert!(err(&s, "{{ add_context('inc_context', 1) }}").contains("helper function"));
        assert!(err(&s, "{{ add_context('x', missing) }}").contains("undefined"));
    }

    #[test]
    fn helpers_accumulator_example() {
        let s = store();
        let out = ok(
            &s,
            "{% for number in [10, 20, 30, 40, 50] %}{{ add_context('sum', number) }}{% endfor %}\
             {{ add_context('items', [1, 2], []) }}{{ add_context('items', [3, 4]) }}{{ sum }} {{ items }}",
        );
        assert_eq!(out, "150 [1, 2, 3, 4]");
        assert_eq!(s.get("sum"), Some(Value::from(150)));
        assert_eq!(s.get("items"), Some(Value::from(vec![1, 2, 3, 4])));
    }

    #[test]
    fn helpers_get_json_path() {
        let data = json_value(json!({
            "user": {"profile": {"name": "Ann"}, "id": 0},
            "items": [{"title": "first"}, {"title": "second"}],
            "nested": {"array": [10, {"property": "p"}]},
            "dotted.key": 1,
            "nothing": null,
            "0": "zero",
        }));
        let call = |path: &str| {
            get_json_path(
                &[data.clone(), Value::from(path)],
                Kwargs::from_iter(Vec::<(&str, Value)>::new()),
            )
            .unwrap()
        };
        assert_eq!(call("user.profile.name"), Value::from("Ann"));
        assert_eq!(call("user.id"), Value::from(0));
        assert_eq!(call("items.0.title"), Value::from("first"));
        assert_eq!(call("items[1].title"), Value::from("second"));
        assert_eq!(call("items.-1.title"), Value::from("second"));
        assert_eq!(call("items[-2].title"), Value::from("first"));
        assert_eq!(call("nested.array.1.property"), Value::from("p"));
        assert_eq!(call("['dotted.key']"), Value::from(1));
        assert_eq!(call("nothing"), Value::from(()));
        assert_eq!(call("0"), Value::from("zero"));
        assert_eq!(call(""), data);
        for missing in [
            "user.email",
            "items.2",
            "items.-3",
            "items.x",
            "user.profile.name.first",
            "nested.array.0.x",
        ] {
            assert_eq!(call(missing), Value::from(()), "{missing}");
        }

        let s = store();
        s.set("data", data);
        s.set(
            "text",
            Value::from(r#"{"status": "ok", "data": {"items": [{"name": "n"}]}}"#),
        );
        assert_eq!(
            ok(&s, "{{ get_json_path(data, 'user.email', 'fallback') }}"),
            "fallback"
        );
        assert_eq!(
            ok(&s, "{{ get_json_path(data, 'user.email', default=0) }}"),
            "0"
        );
        assert_eq!(
            ok(&s, "{{ get_json_path(obj=data, path='items[0]') }}"),
            "{'title': 'first'}"
        );
        assert_eq!(
            ok(&s, "{{ get_json_path(text, 'data.items.0.name') }}"),
            "n"
        );
        assert_eq!(ok(&s, "{{ get_json_path(text, 'status') }}"), "ok");
        assert_eq!(ok(&s, "{{ get_json_path('not json', 'a', 'd') }}"), "d");
        assert_eq!(ok(&s, "{{ get_json_path(missing, 'a', 'd') }}"), "d");
        assert_eq!(ok(&s, "{{ get_json_path(none, 'a', 'd') }}"), "d");
        assert_eq!(ok(&s, "{{ get_json_path(context, 'data.user.id') }}"), "0");
        assert_eq!(ok(&s, "{{ get_json_path({'l': [1] + [2]}, 'l.1') }}"), "2");

        for bad in [
            "a..b", "a.", ".a", "a[0", "a[x]", "a['k'", "a['k'x", "a[0]b",
        ] {
            let e = err(&s, &format!("{{{{ get_json_path(data, \"{bad}\") }}}}"));
            assert!(e.contains("malformed path"), "{bad}: {e}");
        }
        assert!(err(&s, "{{ get_json_path(data, 1) }}").contains("path must be a string"));
        assert!(err(&s, "{{ get_json_path(data) }}").contains("missing required argument 'path'"));
    }

    #[test]
    fn helpers_truncate_like_jinja2() {
        let s = store();
        s.set(
            "long",
            Value::from("The quick brown fox jumps over the lazy dog"),
        );
        let cases = [
            ("{{ long | truncate(20) }}", "The quick brown..."),
            ("{{ long | truncate(20, true) }}", "The quick brown f..."),
            (
                "{{ long | truncate(20, killwords=true) }}",
                "The quick brown f...",
            ),
            ("{{ long | truncate(20, false, '!') }}", "The quick brown!"),
            (
                "{{ long | truncate(length=20, end=' >>') }}",
                "The quick brown >>",
            ),
            (
                "{{ long | truncate(40) }}",
                "The quick brown fox jumps over the lazy dog",
            ),
            (
                "{{ long | truncate(40, leeway=0) }}",
                "The quick brown fox jumps over the...",
            ),
            ("{{ long | truncate(10, true, '', 0) }}", "The quick "),
            (
                "{{ long | truncate }}",
                "The quick brown fox jumps over the lazy dog",
            ),
            ("{{ 'abcdefghijklmnop' | truncate(5, leeway=0) }}", "ab..."),
            ("{{ 12345678901 | truncate(5, leeway=0) }}", "12..."),
            ("{{ 'été à la plage' | truncate(9, leeway=0) }}", "été à..."),
        ];
        for (source, expected) in cases {
            assert_eq!(ok(&s, source), expected, "{source}");
        }
        assert!(err(&s, "{{ long | truncate(2) }}").contains("expected length >= 3, got 2"));
        assert!(
            err(&s, "{{ long | truncate(-1) }}").contains("length must be a non-negative integer")
        );
        assert!(
            err(&s, "{{ long | truncate(20, lenght=3) }}")
                .contains("unexpected keyword argument 'lenght'")
        );
        assert!(
            err(&s, "{{ long | truncate(20, length=3) }}")
                .contains("multiple values for argument 'length'")
        );
        assert!(err(&s, "{{ missing | truncate(20) }}").contains("undefined"));
    }

    #[test]
    fn helpers_compat_filters() {
        let s = store();
        s.set(
            "users",
            json_value(json!([{"name": "a", "tags": ["x"]}, {"name": "b", "tags": ["y"]}])),
        );
        let cases = [
            ("{{ [1, 2.5, none, 'x'] | join(', ') }}", "1, 2.5, None, x"),
            ("{{ 'abc' | join('-') }}", "a-b-c"),
            ("{{ [1, 2] | join }}", "12"),
            ("{{ users | join(', ', attribute='name') }}", "a, b"),
            ("{{ users | join(d='/', attribute='tags.0') }}", "x/y"),
            ("{{ {'a': 1, 'b': 2} | join(',') }}", "a,b"),
            ("{{ [[1, 'a']] | join }}", "[1, 'a']"),
            (
                "{{ 1.5e20 | string }} {{ 'x' | string }} {{ true | string }}",
                "1.5e+20 x True",
            ),
            ("{{ [1, 'a'] | pprint }}", "[1, 'a']"),
            ("[{{ 'ab' | center(6) }}]", "[  ab  ]"),
            ("[{{ 'abc' | center(6) }}]", "[ abc  ]"),
            ("[{{ 'abc' | center(width=7) }}]", "[  abc  ]"),
            ("[{{ 'abcdefg' | center(3) }}]", "[abcdefg]"),
            ("{{ ('x' | center) | length }}", "80"),
            ("{{ 'Hello, big_world! 42 times' | wordcount }}", "4"),
            (
                "{{ 'abc' | int }} {{ 'abc' | int(7) }} {{ '3.5' | int }} {{ '0x1f' | int(base=16) }}",
                "0 7 3 31",
            ),
            (
                "{{ 'x' | float }} {{ 'x' | float(default=1.5) }} {{ '2' | float }} {{ none | int }}",
                "0.0 1.5 2.0 0",
            ),
            (
                "{{ 1000 | filesizeformat }} {{ 1024 | filesizeformat(true) }}",
                "1.0 kB 1.0 KiB",
            ),
            ("{{ '<b>bold</b> &amp; more' | striptags }}", "bold & more"),
            (
                "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}",
                "aba",
            ),
            ("{% set j = joiner('|') %}{{ j() }}x{{ j() }}y", "x|y"),
        ];
        for (source, expected) in cases {
            assert_eq!(ok(&s, source), expected, "{source}");
        }
        assert!(
            err(&s, "{{ users | join(',', attribute='nope') }}")
                .contains("has no attribute 'nope'")
        );
        assert!(err(&s, "{{ missing | join(',') }}").contains("undefined"));
        assert!(err(&s, "{{ 3 | join(',') }}").contains("cannot iterate"));
        assert!(err(&s, "{{ missing | string }}").contains("undefined"));
        assert!(err(&s, "{{ missing | int }}").contains("undefined"));
        assert!(err(&s, "{{ '1' | int(0, 10, 3) }}").contains("too many arguments"));
    }

    #[test]
    fn helpers_bind_rules() {
        let kwargs = |pairs: Vec<(&str, Value)>| Kwargs::from_iter(pairs);
        let [a, b] = bind("f", ["a", "b"], 1, &[Value::from(1)], &kwargs(vec![])).unwrap();
        assert_eq!(a, Value::from(1));
        assert!(b.is_undefined());
        let [a, b] = bind(
            "f",
            ["a", "b"],
            1,
            &[],
            &kwargs(vec![("b", Value::from(2)), ("a", Value::from(1))]),
        )
        .unwrap();
        assert_eq!((a, b), (Value::from(1), Value::from(2)));
        let e = bind("f", ["a", "b"], 2, &[Value::from(1)], &kwargs(vec![])).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingArgument);
    }
}
