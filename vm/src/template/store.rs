//! The live context of one run: every variable, shared by all phases and steps.
//!
//! The store is a minijinja [`Object`] used as the root of every render, so a lookup of
//! `foo` in a template reads the store *at that moment*: a value written by `set_context`
//! is visible to the very next expression of the same template (§2.3, §7.4).
//!
//! Variables live in [`Vars`]: the names the executor maintains or defaults (§2.4, §2.5;
//! the table in `names.rs`) in fixed slots, every other variable in a persistent map
//! (`imbl::OrdMap`). The end-of-step snapshot that goes into `context_history` copies the
//! slots (reference counts, not data) and clones the map in O(1), sharing its structure; `context_history`
//! itself is a persistent vector. Nothing is deep-copied, and a snapshot costs the same at
//! step 10 and at step 10,000.
//!
//! Not in here: what the variables *mean* (that is the machine's job) and template
//! helpers (`helpers.rs`), which reach the store through [`Store::from_state`].

use std::sync::{Arc, Mutex, MutexGuard};

use imbl::{OrdMap, Vector};
use minijinja::State;
use minijinja::value::{Enumerator, Object, ObjectRepr, Value};

// The views' names live in the name table with every other name; the store serves them.
pub(crate) use crate::names::{CONTEXT, CONTEXT_HISTORY};
use crate::names::{ERRORS, SLOTS, SLOTS_BY_NAME, VARIABLES, slot};

/// The hidden root key under which helpers find the store. It is never enumerated.
const STORE_KEY: &str = "__aplc_store__";

/// The variables of a run. Cloning is O(1): the slots are shared until the next write
/// copies them (one reference count per slot), and the map shares its structure.
///
/// Every variable of §2.4 and §2.5 has a fixed slot: its index in
/// [`VARIABLES`](crate::names::VARIABLES).
///
/// A slot holding `Value::UNDEFINED` is unset; no variable can hold undefined, because
/// `set_context` refuses it.
#[derive(Clone, Default)]
pub struct Vars {
    slots: Arc<[Value; SLOTS]>,
    others: OrdMap<Arc<str>, Value>,
}

impl Vars {
    /// No variables.
    pub fn new() -> Vars {
        Vars::default()
    }

    /// The value of `name`, if it is set.
    pub fn get(&self, name: &str) -> Option<&Value> {
        match slot(name) {
            Some(i) => Some(&self.slots[i]).filter(|v| !v.is_undefined()),
            None => self.others.get(name),
        }
    }

    /// Sets `name`.
    #[inline]
    pub fn insert(&mut self, name: impl AsRef<str>, value: Value) {
        let name = name.as_ref();
        match slot(name) {
            Some(i) => Arc::make_mut(&mut self.slots)[i] = value,
            // Overwriting in place needs no new key, and imbl copies a node only while a
            // snapshot still shares it.
            None => match self.others.get_mut(name) {
                Some(v) => *v = value,
                None => {
                    self.others.insert(Arc::from(name), value);
                }
            },
        }
    }

    /// Sets the variable in slot `i` (from [`slot_of!`](crate::names::slot_of)):
    /// the executor's hot paths write about 30 variables a step, and skip matching the
    /// name for each.
    #[inline]
    pub(crate) fn set_slot(&mut self, i: usize, value: Value) {
        Arc::make_mut(&mut self.slots)[i] = value;
    }

    /// The value in slot `i` (`Value::UNDEFINED` when unset).
    #[inline]
    pub(crate) fn slot(&self, i: usize) -> &Value {
        &self.slots[i]
    }

    /// Every set variable, in name order (the slots, taken in name order, and the map
    /// are both sorted; this merges them).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        let mut slots = SLOTS_BY_NAME
            .iter()
            .map(|&i| (VARIABLES[i].name, &self.slots[i]))
            .filter(|(_, v)| !v.is_undefined())
            .peekable();
        let mut others = self.others.iter().map(|(k, v)| (&**k, v)).peekable();
        std::iter::from_fn(move || match (slots.peek(), others.peek()) {
            (Some((a, _)), Some((b, _))) if b < a => others.next(),
            (Some(_), _) => slots.next(),
            (None, _) => others.next(),
        })
    }

    /// The names of every set variable.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.iter().map(|(k, _)| k)
    }

    /// Number of set variables.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|v| !v.is_undefined()).count() + self.others.len()
    }

    /// True when no variable is set.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for Vars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a Vars {
    type Item = (&'a str, &'a Value);
    type IntoIter = Box<dyn Iterator<Item = (&'a str, &'a Value)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// The live variable store of one run.
#[derive(Debug, Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default, Clone)]
struct Inner {
    vars: Vars,
    history: Vector<Value>,
}

impl Store {
    /// Creates a store holding `vars` and an empty history.
    pub fn new(vars: Vars) -> Arc<Store> {
        Arc::new(Store {
            inner: Mutex::new(Inner {
                vars,
                history: Vector::new(),
            }),
        })
    }

    /// Creates a store holding `vars` and `history`, e.g. to evaluate expressions over the
    /// final context of a finished run ([`RunOutcome::template_root`](crate::RunOutcome::template_root)).
    pub fn from_parts(vars: Vars, history: Vector<Value>) -> Arc<Store> {
        Arc::new(Store {
            inner: Mutex::new(Inner { vars, history }),
        })
    }

    /// Finds the store of the render `state` belongs to.
    pub fn from_state(state: &State) -> Option<Arc<Store>> {
        state
            .lookup(STORE_KEY)
            .and_then(|v| v.downcast_object::<Store>())
    }

    /// How many entries `errors` holds, if it is a list: read in place, for a run that
    /// counts its events (`Recorder::errors`) at every instruction.
    pub(crate) fn errors_len(&self) -> Option<usize> {
        let inner = self.lock();
        let errors = &inner.vars.slots[crate::names::slot_of!(ERRORS)];
        (errors.kind() == minijinja::value::ValueKind::Seq).then(|| errors.len().unwrap_or(0))
    }

    /// Reads a variable (not the `context`/`context_history` views).
    pub fn get(&self, name: &str) -> Option<Value> {
        self.lock().vars.get(name).cloned()
    }

    /// Writes a variable.
    #[inline]
    pub fn set(&self, name: &str, value: Value) {
        self.lock().vars.insert(name, value);
    }

    /// Runs `f` on the variables under one lock, so that the executor's several writes
    /// of one phase take the lock once.
    #[inline]
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut Vars) -> R) -> R {
        f(&mut self.lock().vars)
    }

    /// Appends `message` to the `errors` list.
    pub fn push_error(&self, message: String) {
        let mut inner = self.lock();
        // A template may have overwritten `errors` with anything; keep what it holds.
        let mut errors: Vec<Value> = match inner.vars.get(ERRORS) {
            Some(v) if v.kind() == minijinja::value::ValueKind::Seq => {
                v.try_iter().map(|it| it.collect()).unwrap_or_default()
            }
            Some(v) if v.is_none() || v.is_undefined() => Vec::new(),
            Some(v) => vec![v.clone()],
            None => Vec::new(),
        };
        errors.push(Value::from(message));
        inner.vars.insert(ERRORS, Value::from(errors));
    }

    /// An O(1) copy of the current variables.
    pub fn vars(&self) -> Vars {
        self.lock().vars.clone()
    }

    /// Appends an O(1) snapshot of the variables to `context_history`.
    pub fn snapshot(&self) {
        let mut inner = self.lock();
        let snap = Value::from_object(Snapshot(inner.vars.clone()));
        inner.history.push_back(snap);
    }

    /// The `context_history` list as a template value (O(1)).
    pub fn history(&self) -> Value {
        Value::from_object(History(self.lock().history.clone()))
    }

    /// The variables and the history, for building the final context.
    pub fn parts(&self) -> (Vars, Vector<Value>) {
        let inner = self.lock();
        (inner.vars.clone(), inner.history.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while the lock is held cannot leave the map half-written (imbl
        // operations are atomic from our point of view), so a poisoned lock is safe to use.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Object for Store {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let key = key.as_str()?;
        match key {
            CONTEXT => Some(Value::from_object(ContextView(self.clone()))),
            CONTEXT_HISTORY => Some(self.history()),
            STORE_KEY => Some(Value::from_dyn_object(self.clone())),
            _ => self.get(key),
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        ContextView(self.clone()).keys()
    }
}

/// `context`: a live, read-only union view of every variable, `context_history` included.
#[derive(Debug)]
struct ContextView(Arc<Store>);

impl ContextView {
    fn keys(&self) -> Enumerator {
        let mut keys: Vec<Value> = self.0.lock().vars.keys().map(Value::from).collect();
        keys.push(Value::from(CONTEXT_HISTORY));
        Enumerator::Values(keys)
    }
}

impl Object for ContextView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            CONTEXT_HISTORY => Some(self.0.history()),
            CONTEXT | STORE_KEY => None,
            name => self.0.get(name),
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.keys()
    }
}

/// What a helper may store for `value` when it holds the live `context` view: the view
/// itself becomes a frozen [`Snapshot`] of the variables; a view nested inside another
/// value is refused (`Err` names the problem).
///
/// Storing a live view would make the store contain itself: every walk of the context
/// (`tojson`, `--json`, printing) would then recurse without end.
pub(crate) fn freeze_views(value: Value, max_depth: usize) -> Result<Value, &'static str> {
    if let Some(view) = value.downcast_object_ref::<ContextView>() {
        return Ok(Value::from_object(Snapshot(view.0.vars())));
    }
    if value.downcast_object_ref::<Store>().is_some() {
        return Ok(Value::from_object(Snapshot(
            value
                .downcast_object::<Store>()
                .map(|store| store.vars())
                .unwrap_or_default(),
        )));
    }
    if holds_view(&value, max_depth) {
        return Err("a value holding the live `context` view cannot be stored");
    }
    Ok(value)
}

/// True if a container inside `value` (within `budget` levels) is a live view.
fn holds_view(value: &Value, budget: usize) -> bool {
    use minijinja::value::ValueKind;
    if budget == 0 || !matches!(value.kind(), ValueKind::Seq | ValueKind::Map) {
        return false;
    }
    let nested = |item: &Value| {
        item.downcast_object_ref::<ContextView>().is_some()
            || item.downcast_object_ref::<Store>().is_some()
            || holds_view(item, budget - 1)
    };
    if value.kind() == ValueKind::Map {
        return value
            .as_object()
            .and_then(|o| o.try_iter_pairs())
            .is_some_and(|mut pairs| pairs.any(|(k, v)| nested(&k) || nested(&v)));
    }
    value
        .try_iter()
        .is_ok_and(|mut items| items.any(|item| nested(&item)))
}

/// One frozen entry of `context_history`: the variables at the end of a step.
#[derive(Debug)]
pub struct Snapshot(pub Vars);

impl Object for Snapshot {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.get(key.as_str()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.keys().map(Value::from).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// `context_history`: a persistent list of [`Snapshot`]s.
#[derive(Debug)]
pub(crate) struct History(pub(crate) Vector<Value>);

impl Object for History {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let index = key.as_i64()?;
        let index = if index < 0 {
            self.0.len().checked_sub(index.unsigned_abs() as usize)?
        } else {
            usize::try_from(index).ok()?
        };
        self.0.get(index).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.0.len())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// Converts JSON (from a provider, a mock file or `--context`) to a template value.
///
/// This deserializes straight from the JSON tree: no text round-trip.
pub fn value_from_json(json: &serde_json::Value) -> Value {
    use serde::Deserialize;
    // Deserializing a JSON tree into a Value cannot fail: every JSON value has a Value.
    Value::deserialize(json).unwrap_or_else(|_| Value::from(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vars_behave_like_a_map() {
        let mut v = Vars::new();
        assert!(v.is_empty());
        v.insert("model", Value::from("m"));
        v.insert("custom", Value::from(1));
        v.insert("custom", Value::from(2));
        assert_eq!(v.get("model"), Some(&Value::from("m")));
        assert_eq!(v.get("custom"), Some(&Value::from(2)));
        assert_eq!(v.get("runs"), None, "an unset slot is absent");
        assert_eq!(v.get("nope"), None);
        assert_eq!(v.len(), 2);
        v.insert("aaa", Value::from(0));
        v.insert("zzz", Value::from(0));
        let keys: Vec<&str> = v.keys().collect();
        assert_eq!(
            keys,
            ["aaa", "custom", "model", "zzz"],
            "merged in name order"
        );
        v.insert("aaa", Value::from(()));

        // A clone is a snapshot: later writes do not reach it.
        let snap = v.clone();
        v.insert("model", Value::from("other"));
        v.insert("custom", Value::from(3));
        assert_eq!(snap.get("model"), Some(&Value::from("m")));
        assert_eq!(snap.get("custom"), Some(&Value::from(2)));
    }
}
