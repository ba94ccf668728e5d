//! aplc patch: what a checkpoint needs to copy a value exactly.
//!
//! Not part of upstream minijinja; see `APLC-PATCH.md`. aplc's checkpoints
//! (`vm/src/run/machine/checkpoint.rs`) write a run's values to bytes and rebuild them
//! exactly: `1` stays an integer and `1.0` a float, a namespace stays a mutable
//! namespace, a map built by a template stays the engine's own ordered map. The types
//! and representations that tell these apart are private to the crate; these functions
//! expose only what the copy needs.
use std::sync::Arc;

use crate::value::namespace_object::Namespace;
use crate::value::{UndefinedOrigin, UndefinedType, Value, ValueMap, ValueRepr};

/// A number, in the representation the value holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An unsigned 64-bit integer.
    U64(u64),
    /// A signed 64-bit integer.
    I64(i64),
    /// A float.
    F64(f64),
    /// An unsigned 128-bit integer.
    U128(u128),
    /// A signed 128-bit integer.
    I128(i128),
}

/// The number `value` holds, in its own representation; `None` if it is not a number.
pub fn number(value: &Value) -> Option<Number> {
    match value.0 {
        ValueRepr::U64(v) => Some(Number::U64(v)),
        ValueRepr::I64(v) => Some(Number::I64(v)),
        ValueRepr::F64(v) => Some(Number::F64(v)),
        ValueRepr::U128(v) => Some(Number::U128(v.0)),
        ValueRepr::I128(v) => Some(Number::I128(v.0)),
        _ => None,
    }
}

/// A value holding `number` in that representation.
pub fn from_number(number: Number) -> Value {
    match number {
        Number::U64(v) => Value::from(v),
        Number::I64(v) => Value::from(v),
        Number::F64(v) => Value::from(v),
        Number::U128(v) => Value::from(v),
        Number::I128(v) => Value::from(v),
    }
}

/// True if `value` is a silent undefined (`{{ x if false }}`), which chains and prints
/// nothing even where the default undefined fails.
pub fn is_silent_undefined(value: &Value) -> bool {
    matches!(value.0, ValueRepr::Undefined(UndefinedType::Silent, _))
}

/// A silent undefined (see [`is_silent_undefined`]).
pub fn silent_undefined() -> Value {
    Value(ValueRepr::Undefined(
        UndefinedType::Silent,
        UndefinedOrigin::NONE,
    ))
}

/// True if `value` is a `namespace()` object.
pub fn is_namespace(value: &Value) -> bool {
    value.downcast_object_ref::<Namespace>().is_some()
}

/// The identity of a namespace: the address of its shared data, equal for every value
/// that holds the same namespace (and unique while it is alive). `None` if `value` is
/// not a namespace.
pub fn namespace_identity(value: &Value) -> Option<usize> {
    value
        .downcast_object::<Namespace>()
        .map(|namespace| Arc::as_ptr(&namespace) as usize)
}

/// A new namespace holding `pairs`.
pub fn namespace_from_pairs(pairs: impl IntoIterator<Item = (Arc<str>, Value)>) -> Value {
    let namespace = Namespace::default();
    for (key, value) in pairs {
        namespace.set_value(&key, value);
    }
    Value::from_object(namespace)
}

/// True if `value` is the engine's own map: a map literal, `dict()`,
/// [`Value::from_pairs`], a deserialized object. Its keys may be any value, in order.
pub fn is_value_map(value: &Value) -> bool {
    value.downcast_object_ref::<ValueMap>().is_some()
}
