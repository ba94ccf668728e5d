//! Values across the boundary as Python objects, built directly: the run's template
//! values and JSON become dicts, lists, strs, ints, floats, bools and `None`, and a
//! provider's or tool's answer becomes JSON, with no JSON text and no `json` module on
//! the way (a 20-step run's final context is about 18 kB of JSON text: printing it and
//! parsing it back cost more than the run's VM work).
//!
//! The shapes are exactly those of the JSON the VM writes (`RunOutcome::context_json`,
//! `Event::to_json`): what the facade returned when it parsed that text.

use aplc_runtime::Redactor;
use minijinja::value::{ObjectRepr, Value, ValueKind};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::Value as Json;

/// How deeply a template value may nest to be handed over; deeper ones are left out
/// whole, as `RunOutcome::context_json` leaves them out (conversion recurses).
const MAX_VALUE_DEPTH: usize = 512;

/// How deeply a Python answer may nest: serde_json's own limit when it parsed the
/// answer's JSON text. It also stops a list that contains itself.
const MAX_ANSWER_DEPTH: usize = 128;

/// A value nested deeper than allowed.
struct TooDeep;

/// `value` as a Python object, every string redacted with `redactor`. A value nested
/// more than [`MAX_VALUE_DEPTH`] levels becomes the same placeholder text the JSON
/// context has.
pub(crate) fn value_to_py<'py>(
    py: Python<'py>,
    value: &Value,
    redactor: &Redactor,
) -> PyResult<Bound<'py, PyAny>> {
    match value_at(py, value, redactor, 0) {
        Ok(object) => object,
        Err(TooDeep) => Ok(PyString::new(
            py,
            &format!("<left out: nested more than {MAX_VALUE_DEPTH} levels deep>"),
        )
        .into_any()),
    }
}

fn text<'py>(py: Python<'py>, s: &str, redactor: &Redactor) -> Bound<'py, PyAny> {
    if redactor.is_empty() {
        PyString::new(py, s).into_any()
    } else {
        PyString::new(py, &redactor.redact(s)).into_any()
    }
}

fn value_at<'py>(
    py: Python<'py>,
    value: &Value,
    redactor: &Redactor,
    depth: usize,
) -> Result<PyResult<Bound<'py, PyAny>>, TooDeep> {
    let none = || Ok(Ok(py.None().into_bound(py)));
    match value.kind() {
        ValueKind::Undefined | ValueKind::None | ValueKind::Invalid => none(),
        ValueKind::Bool => Ok(Ok(PyBool::new(py, value.is_true()).to_owned().into_any())),
        ValueKind::Number => {
            if let Some(i) = value.as_i64() {
                return Ok(Ok(i
                    .into_pyobject(py)
                    .map(Bound::into_any)
                    .unwrap_or_else(|never| match never {})));
            }
            if !value.is_integer() {
                // As serde_json writes them: a float that is not finite is `null`.
                return match f64::try_from(value.clone()) {
                    Ok(f) if f.is_finite() => Ok(Ok(PyFloat::new(py, f).into_any())),
                    _ => none(),
                };
            }
            Ok(via_json(py, value, redactor))
        }
        ValueKind::String => Ok(Ok(text(py, value.as_str().unwrap_or_default(), redactor))),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
            if depth >= MAX_VALUE_DEPTH {
                return Err(TooDeep);
            }
            let Some(object) = value.as_object() else {
                return Ok(via_json(py, value, redactor));
            };
            if object.repr() == ObjectRepr::Map {
                let dict = PyDict::new(py);
                if let Some(pairs) = object.try_iter_pairs() {
                    for (key, item) in pairs {
                        let Some(key) = key.as_str() else {
                            // A key JSON cannot hold as it is: serde's rules decide.
                            return Ok(via_json(py, value, redactor));
                        };
                        let item = match value_at(py, &item, redactor, depth + 1)? {
                            Ok(item) => item,
                            Err(e) => return Ok(Err(e)),
                        };
                        if let Err(e) = dict.set_item(text(py, key, redactor), item) {
                            return Ok(Err(e));
                        }
                    }
                }
                return Ok(Ok(dict.into_any()));
            }
            let list = PyList::empty(py);
            if let Some(items) = object.try_iter() {
                for item in items {
                    let item = match value_at(py, &item, redactor, depth + 1)? {
                        Ok(item) => item,
                        Err(e) => return Ok(Err(e)),
                    };
                    if let Err(e) = list.append(item) {
                        return Ok(Err(e));
                    }
                }
            }
            Ok(Ok(list.into_any()))
        }
        // Bytes, big integers, plain objects (functions, macros): as serde writes them.
        _ => Ok(via_json(py, value, redactor)),
    }
}

/// `value` through its JSON form, for the rare kinds the direct walk leaves to serde.
fn via_json<'py>(
    py: Python<'py>,
    value: &Value,
    redactor: &Redactor,
) -> PyResult<Bound<'py, PyAny>> {
    let json = serde_json::to_value(value).unwrap_or_else(|_| Json::String(value.to_string()));
    json_to_py(py, &redactor.redact_json(json))
}

/// `json` as a Python object (a JSON document is at most 128 levels deep when parsed by
/// serde_json; the VM's own values are checked by [`value_to_py`]).
pub(crate) fn json_to_py<'py>(py: Python<'py>, json: &Json) -> PyResult<Bound<'py, PyAny>> {
    Ok(match json {
        Json::Null => py.None().into_bound(py),
        Json::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                PyFloat::new(py, n.as_f64().unwrap_or(f64::NAN)).into_any()
            }
        }
        Json::String(s) => PyString::new(py, s).into_any(),
        Json::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Json::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(PyString::new(py, key), json_to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// A provider's or tool's answer as JSON, with the rules of `json.dumps`: dicts (keys
/// str, int, float, bool or None), lists, tuples, str, int, float, bool and None. The
/// error says what is not JSON, and where.
pub(crate) fn py_to_json(object: &Bound<'_, PyAny>) -> Result<Json, String> {
    answer_at(object, 0)
}

fn answer_at(object: &Bound<'_, PyAny>, depth: usize) -> Result<Json, String> {
    if object.is_none() {
        return Ok(Json::Null);
    }
    if let Ok(s) = object.cast::<PyString>() {
        return s
            .to_cow()
            .map(|s| Json::String(s.into_owned()))
            .map_err(|e| e.to_string());
    }
    if let Ok(b) = object.cast::<PyBool>() {
        return Ok(Json::Bool(b.is_true()));
    }
    if object.cast::<PyInt>().is_ok() {
        if let Ok(i) = object.extract::<i64>() {
            return Ok(Json::from(i));
        }
        if let Ok(u) = object.extract::<u64>() {
            return Ok(Json::from(u));
        }
        // serde_json read an integer past 64 bits as a float.
        let f: f64 = object.extract().map_err(|e: PyErr| e.to_string())?;
        return finite(f);
    }
    if let Ok(f) = object.cast::<PyFloat>() {
        return finite(f.value());
    }
    if depth >= MAX_ANSWER_DEPTH {
        return Err(format!("nested more than {MAX_ANSWER_DEPTH} levels deep"));
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        let mut map = serde_json::Map::with_capacity(dict.len());
        for (key, item) in dict.iter() {
            let key = key_text(&key)?;
            map.insert(key, answer_at(&item, depth + 1)?);
        }
        return Ok(Json::Object(map));
    }
    if let Ok(list) = object.cast::<PyList>() {
        return list
            .iter()
            .map(|item| answer_at(&item, depth + 1))
            .collect::<Result<_, _>>()
            .map(Json::Array);
    }
    if let Ok(tuple) = object.cast::<PyTuple>() {
        return tuple
            .iter()
            .map(|item| answer_at(&item, depth + 1))
            .collect::<Result<_, _>>()
            .map(Json::Array);
    }
    Err(format!(
        "Object of type {} is not JSON serializable",
        type_name(object)
    ))
}

/// A dict key as `json.dumps` writes it.
fn key_text(key: &Bound<'_, PyAny>) -> Result<String, String> {
    if let Ok(s) = key.cast::<PyString>() {
        return s
            .to_cow()
            .map(|s| s.into_owned())
            .map_err(|e| e.to_string());
    }
    if key.is_none() {
        return Ok("null".to_owned());
    }
    if let Ok(b) = key.cast::<PyBool>() {
        return Ok(if b.is_true() { "true" } else { "false" }.to_owned());
    }
    if key.cast::<PyInt>().is_ok() || key.cast::<PyFloat>().is_ok() {
        return key
            .str()
            .and_then(|s| s.to_cow().map(|s| s.into_owned()))
            .map_err(|e| e.to_string());
    }
    Err(format!(
        "keys must be str, int, float, bool or None, not {}",
        type_name(key)
    ))
}

fn finite(f: f64) -> Result<Json, String> {
    serde_json::Number::from_f64(f)
        .map(Json::Number)
        .ok_or_else(|| format!("Out of range float values are not JSON compliant: {f}"))
}

fn type_name(object: &Bound<'_, PyAny>) -> String {
    object
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_owned())
}
