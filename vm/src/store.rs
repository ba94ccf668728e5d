//! The live context of one run: every variable, shared by all phases and steps.
//!
//! The store is a minijinja [`Object`] used as the root of every render, so a lookup of
//! `foo` in a template reads the store *at that moment*: a value written by `set_context`
//! is visible to the very next expression of the same template (§2.3, §7.4).
//!
//! Variables live in a persistent map (`imbl::OrdMap`), so the end-of-step snapshot that
//! goes into `context_history` is an O(1) clone that shares structure with the live map,
//! and `context_history` itself is a persistent vector. Nothing is deep-copied.
//!
//! Not in here: what the variables *mean* (that is the machine's job) and template
//! helpers (`helpers.rs`), which reach the store through [`Store::from_state`].

use std::sync::{Arc, Mutex, MutexGuard};

use imbl::{OrdMap, Vector};
use minijinja::State;
use minijinja::value::{Enumerator, Object, ObjectRepr, Value};

/// The name of the variable holding the union view of the context.
pub const CONTEXT: &str = "context";
/// The name of the variable holding the snapshots of finished steps.
pub const CONTEXT_HISTORY: &str = "context_history";

/// The hidden root key under which helpers find the store. It is never enumerated.
const STORE_KEY: &str = "__aplc_store__";

/// A persistent map of variables; cloning it is O(1).
pub type Vars = OrdMap<Arc<str>, Value>;

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

    /// Finds the store of the render `state` belongs to.
    pub fn from_state(state: &State) -> Option<Arc<Store>> {
        state
            .lookup(STORE_KEY)
            .and_then(|v| v.downcast_object::<Store>())
    }

    /// Reads a variable (not the `context`/`context_history` views).
    pub fn get(&self, name: &str) -> Option<Value> {
        self.lock().vars.get(name).cloned()
    }

    /// Writes a variable.
    pub fn set(&self, name: &str, value: Value) {
        let mut inner = self.lock();
        // Overwriting in place needs no new key (most writes are to existing variables),
        // and imbl copies a node only while a snapshot still shares it.
        match inner.vars.get_mut(name) {
            Some(slot) => *slot = value,
            None => {
                inner.vars.insert(Arc::from(name), value);
            }
        }
    }

    /// Appends `message` to the `errors` list.
    pub fn push_error(&self, message: String) {
        let mut inner = self.lock();
        // A template may have overwritten `errors` with anything; keep what it holds.
        let mut errors: Vec<Value> = match inner.vars.get("errors") {
            Some(v) if v.kind() == minijinja::value::ValueKind::Seq => {
                v.try_iter().map(|it| it.collect()).unwrap_or_default()
            }
            Some(v) if v.is_none() || v.is_undefined() => Vec::new(),
            Some(v) => vec![v.clone()],
            None => Vec::new(),
        };
        errors.push(Value::from(message));
        inner.vars.insert(Arc::from("errors"), Value::from(errors));
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
        let mut keys: Vec<Value> = self
            .0
            .lock()
            .vars
            .keys()
            .map(|k| Value::from(k.clone()))
            .collect();
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
        Enumerator::Values(self.0.keys().map(|k| Value::from(k.clone())).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// `context_history`: a persistent list of [`Snapshot`]s.
#[derive(Debug)]
struct History(Vector<Value>);

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
