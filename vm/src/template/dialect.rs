//! The opt-in dialects' template helpers (`spec/dialects.md`); what a dialect is, its
//! names and its bundle flags are in `bundle/dialect.rs`.

use minijinja::value::limits;
use minijinja::value::{Kwargs, Object, Value, ValueKind};
use minijinja::{Environment, Error, State};

use crate::bundle::dialect::{
    ADD, DEC, Dialect, GET, INC, NEXT, PREV, REM, RESULT, SET, SET_JSON_PATH,
};
use crate::names::{NEXT_STEP, PREV_STEP};
use crate::template::helpers::{
    bind, invalid, none_if_undefined, parse_path, py_add, py_sub, step, storable, store,
    variable_name, writable_name,
};
use crate::template::python::py_type_name;

/// Registers `dialect`'s helpers on `env`.
pub(crate) fn register(env: &mut Environment<'static>, dialect: Dialect) {
    match dialect {
        Dialect::Spec => {}
        Dialect::Defuss11 => {
            env.add_function(SET, set);
            env.add_function(GET, get);
            env.add_function(ADD, add);
            env.add_function(INC, inc);
            env.add_function(DEC, dec);
            env.add_function(REM, rem);
            env.add_function(NEXT, next);
            env.add_function(PREV, prev);
            env.add_function(RESULT, result);
            env.add_function(SET_JSON_PATH, set_json_path);
        }
    }
}

/// `set(path, value)`: writes `value` at `path` (`"a"`, `"a.b.c"`, `"items.0"`),
/// creating maps on the way.
fn set(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let [path, value] = bind(SET, ["var_name_or_path", "value"], 2, args, &kwargs)?;
    write_path(SET, state, &path, value)?;
    Ok(Value::from(""))
}

/// `get(path, default=None)`: the value at `path`, or `default`.
fn get(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let [path, default] = bind(GET, ["var_name_or_path", "default"], 1, args, &kwargs)?;
    Ok(read_path(GET, state, &path)?.unwrap_or_else(|| none_if_undefined(default)))
}

/// `add(path, value, default=0)`: `path = (path or default) + value`.
fn add(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let [path, value, default] = bind(ADD, ["var_name", "value", "default"], 2, args, &kwargs)?;
    accumulate(ADD, state, &path, default, |current| {
        py_add(current, &value)
    })
}

/// `inc(path, default=0)`: `path = (path or default) + 1`.
fn inc(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let [path, default] = bind(INC, ["var_name", "default"], 1, args, &kwargs)?;
    accumulate(INC, state, &path, default, |current| {
        py_add(current, &Value::from(1))
    })
}

/// `dec(path, default=0)`: `path = (path or default) - 1`.
fn dec(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let [path, default] = bind(DEC, ["var_name", "default"], 1, args, &kwargs)?;
    accumulate(DEC, state, &path, default, |current| {
        py_sub(current, &Value::from(1))
    })
}

/// `rem(path, value, default=0)`: `path = (path or default) - value`.
fn rem(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let [path, value, default] = bind(REM, ["var_name", "value", "default"], 2, args, &kwargs)?;
    accumulate(REM, state, &path, default, |current| {
        py_sub(current, &value)
    })
}

/// `next(step)`: `set_context('next_step', step)`.
fn next(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let [target] = bind(NEXT, ["step_name"], 1, args, &kwargs)?;
    if target.kind() != ValueKind::String {
        return Err(invalid(format!(
            "{NEXT}(): the step name must be a string, got {}",
            py_type_name(&target)
        )));
    }
    store(NEXT, state)?.set(NEXT_STEP, target);
    Ok(Value::from(""))
}

/// `prev()`: the step that ran before this one (`prev_step`).
fn prev(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let [] = bind(PREV, [], 0, args, &kwargs)?;
    Ok(store(PREV, state)?
        .get(PREV_STEP)
        .map(none_if_undefined)
        .unwrap_or(Value::from(())))
}

/// `result(kind=None)`: `result_text`, or `result_json`, `result_tool_calls`, ... for
/// `kind` `"json"`, `"tool_calls"`, `"image_urls"`, `"audio_inputs"`, `"files"`,
/// `"role"` (`"text"` is `result_text`).
fn result(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    const KINDS: [&str; 7] = [
        "text",
        "json",
        "tool_calls",
        "image_urls",
        "audio_inputs",
        "files",
        "role",
    ];
    let [kind] = bind(RESULT, ["result_type"], 0, args, &kwargs)?;
    let kind = match kind.kind() {
        ValueKind::Undefined | ValueKind::None => "text",
        _ => match kind.as_str() {
            Some(k) if KINDS.contains(&k) => k,
            _ => {
                return Err(invalid(format!(
                    "{RESULT}(): unknown result type {kind}; expected one of {}",
                    KINDS.join(", ")
                )));
            }
        },
    };
    let value = store(RESULT, state)?.get(&format!("result_{kind}"));
    Ok(value.map(none_if_undefined).unwrap_or(Value::from(())))
}

/// `set_json_path(data, path, value)`: `true` once `value` is at the dotted `path`
/// inside `data`, `false` (and nothing changed) when it cannot be: `data` is not a map
/// or a list, `path` is not a string, or the path goes through a value that is neither,
/// or into a list with a segment that is not an index in it.
///
/// defuss-apl mutates `data` in place, so the variable that holds it changes. aplc's
/// values are immutable: the new value is written into every variable of the context
/// that holds that very object (`data`, or a map or list inside a variable, found by
/// identity), which is what the mutation is seen as. A map or list that is not in the
/// context (a literal) changes nowhere, as in defuss-apl.
fn set_json_path(state: &State, args: &[Value], kwargs: Kwargs) -> Result<Value, Error> {
    let [data, path, value] = bind(SET_JSON_PATH, ["data", "path", "value"], 3, args, &kwargs)?;
    let (Some(path), ValueKind::Map | ValueKind::Seq) = (path.as_str(), data.kind()) else {
        return Ok(Value::from(false));
    };
    if value.is_undefined() {
        return Ok(Value::from(false));
    }
    let value = storable(SET_JSON_PATH, path, value)?;
    let segments: Vec<&str> = path.split('.').collect();
    let Some(updated) = set_in(&data, &segments, value)? else {
        return Ok(Value::from(false));
    };
    let store = store(SET_JSON_PATH, state)?;
    let vars = store.vars();
    let mut budget = IDENTITY_SEARCH_BUDGET;
    for (name, root) in vars.iter() {
        if writable_name(SET_JSON_PATH, &Value::from(name)).is_err() {
            continue;
        }
        let mut places = Vec::new();
        find_object(root, &data, &mut Vec::new(), &mut places, &mut budget);
        if places.is_empty() {
            continue;
        }
        let mut new_root = root.clone();
        for place in places {
            new_root = put_at(&new_root, &place, updated.clone())?;
        }
        store.set(name, storable(SET_JSON_PATH, name, new_root)?);
    }
    Ok(Value::from(true))
}

/// How many values `set_json_path` looks at, all variables together, to find where its
/// `data` is: a bound on a huge context, far above what agents hold.
const IDENTITY_SEARCH_BUDGET: usize = 100_000;

/// One step into a container: a map's key or a list's index.
enum Place {
    Key(Value),
    Index(usize),
}

/// Appends to `found` the path of every place inside `value` (itself included) that
/// holds `target` itself.
fn find_object(
    value: &Value,
    target: &Value,
    path: &mut Vec<Place>,
    found: &mut Vec<Vec<Place>>,
    budget: &mut usize,
) {
    if *budget == 0 || path.len() > 64 {
        return;
    }
    *budget -= 1;
    if value.is_same_object(target) {
        found.push(path.iter().map(Place::copy).collect());
        return;
    }
    match value.kind() {
        ValueKind::Map => {
            let Ok(keys) = value.try_iter() else {
                return;
            };
            for key in keys {
                if let Ok(item) = value.get_item(&key) {
                    path.push(Place::Key(key));
                    find_object(&item, target, path, found, budget);
                    path.pop();
                }
            }
        }
        ValueKind::Seq => {
            let Ok(items) = value.try_iter() else {
                return;
            };
            for (index, item) in items.enumerate() {
                path.push(Place::Index(index));
                find_object(&item, target, path, found, budget);
                path.pop();
            }
        }
        _ => {}
    }
}

impl Place {
    fn copy(&self) -> Place {
        match self {
            Place::Key(key) => Place::Key(key.clone()),
            Place::Index(index) => Place::Index(*index),
        }
    }
}

/// `root` with the value at `place` replaced by `value` (the containers on the way
/// rebuilt).
fn put_at(root: &Value, place: &[Place], value: Value) -> Result<Value, Error> {
    let Some((first, rest)) = place.split_first() else {
        return Ok(value);
    };
    match first {
        Place::Key(key) => {
            let mut pairs = pairs_of(root)?;
            for (k, v) in &mut pairs {
                if k == key {
                    *v = put_at(v, rest, value)?;
                    break;
                }
            }
            Ok(map_of(pairs))
        }
        Place::Index(index) => {
            let mut items: Vec<Value> = root.try_iter()?.collect();
            if let Some(item) = items.get_mut(*index) {
                *item = put_at(item, rest, value)?;
            }
            Ok(Value::from(items))
        }
    }
}

/// A map's entries, in order.
fn pairs_of(map: &Value) -> Result<Vec<(Value, Value)>, Error> {
    Ok(map
        .try_iter()?
        .map(|k| {
            let v = map.get_item(&k).unwrap_or_default();
            (k, v)
        })
        .collect())
}

/// `current` with `value` at `path`, as defuss-apl's `set_json_path` writes it: a
/// missing step becomes a list if the next segment is an index, else a map; an index
/// past a list's end grows it with `None`. `None` where that runtime answers `false`.
fn set_in(current: &Value, path: &[&str], value: Value) -> Result<Option<Value>, Error> {
    let Some((segment, rest)) = path.split_first() else {
        return Ok(Some(value));
    };
    let index = segment
        .parse::<usize>()
        .ok()
        .filter(|_| !segment.starts_with('+'));
    let fresh = |next: Option<&&str>| match next.map(|s| s.parse::<usize>()) {
        Some(Ok(_)) => Value::from(Vec::<Value>::new()),
        _ => map_of(Vec::new()),
    };
    match current.kind() {
        ValueKind::Map => {
            let key = Value::from(*segment);
            let mut pairs = pairs_of(current)?;
            let position = pairs.iter().position(|(k, _)| *k == key);
            let inner = match position {
                Some(at) if !rest.is_empty() => pairs[at].1.clone(),
                _ => fresh(rest.first()),
            };
            let Some(inner) = set_in(&inner, rest, value)? else {
                return Ok(None);
            };
            match position {
                Some(at) => pairs[at].1 = inner,
                None => pairs.push((key, inner)),
            }
            limits::check_new_container(pairs.iter().map(|(_, v)| v))?;
            Ok(Some(map_of(pairs)))
        }
        ValueKind::Seq => {
            let Some(index) = index else {
                return Ok(None);
            };
            let mut items: Vec<Value> = current.try_iter()?.collect();
            let grown = index >= items.len();
            if grown {
                limits::check_items((index as u128).saturating_add(1))?;
                items.resize(index + 1, Value::from(()));
            }
            let inner = if grown {
                fresh(rest.first())
            } else {
                items[index].clone()
            };
            let Some(inner) = set_in(&inner, rest, value)? else {
                return Ok(None);
            };
            items[index] = inner;
            Ok(Some(Value::from(items)))
        }
        _ => Ok(None),
    }
}

/// The value at `path`, or `None` if something on the way is missing.
fn read_path(func: &str, state: &State, path: &Value) -> Result<Option<Value>, Error> {
    let text = variable_name(func, path)?;
    let segments = parse_path(text).map_err(|msg| invalid(format!("{func}(): {msg}")))?;
    let Some((root, rest)) = segments.split_first() else {
        return Ok(None);
    };
    let store = store(func, state)?;
    let Some(mut current) = store
        .get_value(&Value::from(root.as_str()))
        .filter(|v| !v.is_undefined())
    else {
        return Ok(None);
    };
    for segment in rest {
        match step(&current, segment) {
            Some(next) => current = next,
            None => return Ok(None),
        }
    }
    Ok(Some(current))
}

/// Writes `value` at `path`.
fn write_path(func: &str, state: &State, path: &Value, value: Value) -> Result<(), Error> {
    let text = variable_name(func, path)?;
    let segments = parse_path(text).map_err(|msg| invalid(format!("{func}(): {msg}")))?;
    let Some((root, rest)) = segments.split_first() else {
        return Err(invalid(format!("{func}(): the path must not be empty")));
    };
    let root_value = Value::from(root.as_str());
    let root = writable_name(func, &root_value)?;
    let value = storable(func, text, value)?;
    let store = store(func, state)?;
    // A variable that is unset or `None` starts as a map, whatever the path's next
    // segment (defuss-apl: `set('b.0', 1)` on nothing gives `{"0": 1}`).
    let current = (store.get(root))
        .filter(|v| !v.is_undefined() && !v.is_none())
        .unwrap_or_else(|| map_of(Vec::new()));
    let updated = replace_at(func, Some(current), rest, value)?;
    store.set(root, storable(func, root, updated)?);
    Ok(())
}

/// `current` with the value at `path` replaced by `value`. Where nothing is, a list is
/// created for an index segment (`None` up to it) and a map for any other, as
/// defuss-apl's `set` does. Values are immutable, so every container on the path is
/// rebuilt.
fn replace_at(
    func: &str,
    current: Option<Value>,
    path: &[String],
    value: Value,
) -> Result<Value, Error> {
    let Some((segment, rest)) = path.split_first() else {
        return Ok(value);
    };
    let current = current.filter(|v| !v.is_undefined() && !v.is_none());
    match current {
        None => {
            let inner = replace_at(func, None, rest, value)?;
            match segment
                .parse::<usize>()
                .ok()
                .filter(|_| !segment.starts_with('+'))
            {
                Some(index) => {
                    limits::check_items((index as u128).saturating_add(1))?;
                    let mut items = vec![Value::from(()); index + 1];
                    items[index] = inner;
                    Ok(Value::from(items))
                }
                None => Ok(map_of(vec![(Value::from(segment.as_str()), inner)])),
            }
        }
        Some(map) if map.kind() == ValueKind::Map => {
            let key = Value::from(segment.as_str());
            let mut pairs: Vec<(Value, Value)> = map
                .try_iter()?
                .map(|k| {
                    let v = map.get_item(&k).unwrap_or_default();
                    (k, v)
                })
                .collect();
            match pairs.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => *v = replace_at(func, Some(v.clone()), rest, value)?,
                None => pairs.push((key, replace_at(func, None, rest, value)?)),
            }
            Ok(map_of(pairs))
        }
        Some(list) if list.kind() == ValueKind::Seq => {
            let mut items: Vec<Value> = list.try_iter()?.collect();
            // An index past the end grows the list with `None`, as in defuss-apl.
            if let Some(wanted) = segment.parse::<usize>().ok().filter(|i| *i >= items.len()) {
                limits::check_items((wanted as u128).saturating_add(1))?;
                items.resize(wanted + 1, Value::from(()));
            }
            let index = segment
                .parse::<i64>()
                .ok()
                .and_then(|i| {
                    if i < 0 {
                        items
                            .len()
                            .checked_sub(usize::try_from(i.unsigned_abs()).ok()?)
                    } else {
                        usize::try_from(i).ok()
                    }
                })
                .filter(|i| *i < items.len())
                .ok_or_else(|| {
                    invalid(format!(
                        "{func}(): list index {segment} out of range (the list has {} items)",
                        items.len()
                    ))
                })?;
            items[index] = replace_at(func, Some(items[index].clone()), rest, value)?;
            Ok(Value::from(items))
        }
        Some(other) => Err(invalid(format!(
            "{func}(): cannot set '{segment}' inside a value of type {}",
            py_type_name(&other)
        ))),
    }
}

/// A map with `pairs` in their order.
fn map_of(pairs: Vec<(Value, Value)>) -> Value {
    Value::from_pairs(pairs)
}

/// `path = op(path or default)`.
fn accumulate(
    func: &str,
    state: &State,
    path: &Value,
    default: Value,
    op: impl FnOnce(&Value) -> Result<Value, String>,
) -> Result<Value, Error> {
    let current = match read_path(func, state, path)? {
        Some(current) if !current.is_none() => current,
        _ if default.is_undefined() => Value::from(0),
        _ => default,
    };
    let name = path.as_str().unwrap_or_default();
    let updated = op(&current).map_err(|msg| invalid(format!("{func}('{name}', ...): {msg}")))?;
    write_path(func, state, path, updated)?;
    Ok(Value::from(""))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::template::env::{Limits, template_env_for};
    use crate::template::store::Store;

    use super::*;

    fn render(store: &Arc<Store>, source: &str) -> Result<String, Error> {
        let env = template_env_for(&Limits::default(), Dialect::Defuss11);
        env.render_str(source, Value::from_dyn_object(store.clone()))
    }

    fn json(store: &Arc<Store>, name: &str) -> serde_json::Value {
        serde_json::to_value(store.get(name).unwrap_or_default()).unwrap_or_default()
    }

    #[test]
    fn set_and_get_follow_dotted_paths() {
        let store = Store::new(Default::default());
        let out = render(
            &store,
            "{{ set('a', 1) }}{{ set('b.c.d', 2) }}{{ set('l', [0, 1]) }}{{ set('l.1', 9) }}\
             {{ [get('a'), get('b.c.d'), get('zz'), get('zz', 'dflt'), get('b.c.x', 5), get('l.-1')] }}",
        )
        .unwrap();
        assert_eq!(out, "[1, 2, None, 'dflt', 5, 9]");
        assert_eq!(json(&store, "b"), serde_json::json!({"c": {"d": 2}}));
        assert_eq!(json(&store, "l"), serde_json::json!([0, 9]));
    }

    #[test]
    fn set_creates_lists_for_index_segments_and_grows_them() {
        let store = Store::new(Default::default());
        render(
            &store,
            "{{ set('d', {}) }}{{ set('d.items.0.name', 'a') }}{{ set('d.items.2.name', 'c') }}\
             {{ set('top.0', 1) }}{{ set('l', [1]) }}{{ set('l.3', 4) }}",
        )
        .unwrap();
        assert_eq!(
            json(&store, "d"),
            serde_json::json!({"items": [{"name": "a"}, null, {"name": "c"}]})
        );
        // The variable itself starts as a map, as in defuss-apl.
        assert_eq!(json(&store, "top"), serde_json::json!({"0": 1}));
        assert_eq!(json(&store, "l"), serde_json::json!([1, null, null, 4]));
        // A huge index is refused by the item limit, not allocated.
        let err = render(&store, "{{ set('l.99999999999', 1) }}").unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
    }

    #[test]
    fn accumulators_start_from_the_default() {
        let store = Store::new(Default::default());
        render(
            &store,
            "{{ set('a', 1) }}{{ add('a', 5) }}{{ inc('b') }}{{ inc('b') }}{{ dec('c') }}\
             {{ inc('d', 5) }}{{ rem('e', 2) }}{{ set('s', 'x') }}{{ add('s', 'y') }}\
             {{ add('n.count', 2) }}",
        )
        .unwrap();
        let got: Vec<_> = ["a", "b", "c", "d", "e", "s", "n"]
            .iter()
            .map(|n| json(&store, n))
            .collect();
        assert_eq!(
            got,
            serde_json::json!([6, 2, -1, 6, -2, "xy", {"count": 2}])
                .as_array()
                .cloned()
                .unwrap()
        );
    }

    #[test]
    fn type_errors_name_the_helper() {
        let store = Store::new(Default::default());
        let err = render(&store, "{{ set('d', [1]) }}{{ add('d', 3) }}").unwrap_err();
        assert!(err.to_string().contains("add('d', ...)"), "{err}");
        let err = render(&store, "{{ rem('d', 1) }}").unwrap_err();
        assert!(err.to_string().contains("rem('d', ...)"), "{err}");
        let err = render(&store, "{{ set('q', 1) }}{{ set('q.x', 1) }}").unwrap_err();
        assert!(err.to_string().contains("cannot set 'x'"), "{err}");
    }

    #[test]
    fn set_json_path_writes_where_the_context_holds_data() {
        let store = Store::new(Default::default());
        render(
            &store,
            "{{ set('data', {'a': {'b': [1, 2]}, 's': 'str'}) }}{{ set('other', [1, [2, 3]]) }}",
        )
        .unwrap();
        let out = render(
            &store,
            "{{ [set_json_path(data, 'a.b.1', 9), set_json_path(data, 'a.c', 'x'), \
             set_json_path(data, 'new.0.x', 1), set_json_path(data, 'a.b.4', 5), \
             set_json_path(data.a, 'z', 1), set_json_path(other, '1.0', 9), \
             set_json_path(data, 'a.b.-1', 5), set_json_path(data, 'a.b.x', 5), \
             set_json_path(data, 's.x', 5), set_json_path(3, 'a', 5), \
             set_json_path(data, 5, 1), set_json_path({'lit': 1}, 'lit', 2)] }}",
        )
        .unwrap();
        assert_eq!(
            out,
            "[True, True, True, True, True, True, False, False, False, False, False, True]"
        );
        assert_eq!(
            json(&store, "data"),
            serde_json::json!({"a": {"b": [1, 9, null, null, 5], "c": "x", "z": 1},
                               "s": "str", "new": [{"x": 1}]})
        );
        assert_eq!(json(&store, "other"), serde_json::json!([1, [9, 3]]));
        // Two variables holding the same object both see the write, as in defuss-apl.
        render(&store, "{{ set('m', {'k': 1}) }}").unwrap();
        render(&store, "{{ set('n', m) }}{{ set_json_path(m, 'k', 2) }}").unwrap();
        assert_eq!(json(&store, "n"), serde_json::json!({"k": 2}));
        // A list cannot grow past the item limit through an index.
        let err = render(&store, "{{ set_json_path(other, '99999999999', 1) }}").unwrap_err();
        assert!(err.to_string().contains("items"), "{err}");
    }

    #[test]
    fn next_prev_and_result() {
        let store = Store::new(Default::default());
        store.set(PREV_STEP, Value::from("first"));
        store.set("result_text", Value::from("hello"));
        let out = render(
            &store,
            "{{ next('t') }}{{ prev() }} {{ result() }} {{ result('json') }}",
        )
        .unwrap();
        assert_eq!(out, "first hello None");
        assert_eq!(json(&store, NEXT_STEP), serde_json::json!("t"));
        assert!(render(&store, "{{ result('nope') }}").is_err());
    }

    #[test]
    fn names_round_trip() {
        for d in Dialect::ALL {
            assert_eq!(Dialect::from_name(d.as_str()), Some(d));
        }
        assert_eq!(Dialect::from_name("jinja"), None);
    }
}
