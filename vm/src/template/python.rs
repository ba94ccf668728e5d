//! Values printed and named the way Python prints and names them: `str()`, `repr()` and
//! `type(x).__name__`, so that template output and error messages read as Jinja2's do.
//!
//! A leaf: the environment (`env.rs`), the helpers and the Jinja2 built-ins all print
//! through it, and it imports none of them.

use std::fmt;

use minijinja::value::limits::CappedString;
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Writes `value` the way Python's `str()` prints it: strings as they are, everything
/// else like [`py_repr`].
///
/// An undefined value is an error, as Jinja2's `StrictUndefined` makes it.
pub(crate) fn write_py_str(out: &mut dyn fmt::Write, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => Err(Error::new(
            ErrorKind::UndefinedError,
            "cannot print an undefined value",
        )),
        ValueKind::String => Ok(out.write_str(value.as_str().unwrap_or_default())?),
        _ => write_repr(out, value, 0),
    }
}

/// `str(value)` as a `String`, within the value limits; see [`write_py_str`].
pub(crate) fn py_str(value: &Value) -> Result<String, Error> {
    let mut s = CappedString::new();
    match write_py_str(&mut s, value) {
        Ok(()) => s.finish(),
        Err(err) => Err(s.overflow().unwrap_or(err)),
    }
}

/// `repr(value)` as a `String`: like [`py_str`], but strings are quoted and escaped,
/// and an undefined value is `Undefined`.
pub(crate) fn py_repr(value: &Value) -> Result<String, Error> {
    let mut s = CappedString::new();
    match write_repr(&mut s, value, 0) {
        Ok(()) => s.finish(),
        Err(err) => Err(s.overflow().unwrap_or(err)),
    }
}

/// The name Python would give the type of `value`, for error messages.
pub(crate) fn py_type_name(value: &Value) -> &'static str {
    match value.kind() {
        ValueKind::Undefined => "Undefined",
        ValueKind::None => "NoneType",
        ValueKind::Bool => "bool",
        ValueKind::Number if value.is_integer() => "int",
        ValueKind::Number => "float",
        ValueKind::String => "str",
        ValueKind::Bytes => "bytes",
        ValueKind::Seq if value.is_tuple() => "tuple",
        ValueKind::Seq => "list",
        ValueKind::Map => "dict",
        ValueKind::Iterable => "iterator",
        _ => "object",
    }
}

/// How deeply nested containers are printed before Python's `...` placeholder is used.
/// Values cannot be cyclic, but objects handed in by an embedder could be arbitrarily
/// deep, and printing recurses.
const MAX_REPR_DEPTH: usize = 100;

fn write_repr(out: &mut dyn fmt::Write, value: &Value, depth: usize) -> Result<(), Error> {
    match value.kind() {
        // Inside a container, Jinja2's `StrictUndefined` has a repr (it is only `str()`
        // that fails); loop objects, for one, hold undefined `previtem`/`nextitem`.
        ValueKind::Undefined => Ok(out.write_str("Undefined")?),
        ValueKind::None => Ok(out.write_str("None")?),
        ValueKind::Bool => Ok(out.write_str(if value.is_true() { "True" } else { "False" })?),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => Ok(write_str_repr(out, value.as_str().unwrap_or_default())?),
        ValueKind::Bytes => Ok(write_bytes_repr(out, value.as_bytes().unwrap_or_default())?),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map if depth >= MAX_REPR_DEPTH => {
            Ok(out.write_str("...")?)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let tuple = value.is_tuple();
            out.write_char(if tuple { '(' } else { '[' })?;
            let mut count = 0;
            for item in value.try_iter()? {
                if count > 0 {
                    out.write_str(", ")?;
                }
                write_repr(out, &item, depth + 1)?;
                count += 1;
            }
            if tuple && count == 1 {
                out.write_char(',')?;
            }
            Ok(out.write_char(if tuple { ')' } else { ']' })?)
        }
        ValueKind::Map => match value.as_object().and_then(|obj| obj.try_iter_pairs()) {
            Some(pairs) => {
                out.write_char('{')?;
                for (idx, (key, item)) in pairs.enumerate() {
                    if idx > 0 {
                        out.write_str(", ")?;
                    }
                    write_repr(out, &key, depth + 1)?;
                    out.write_str(": ")?;
                    write_repr(out, &item, depth + 1)?;
                }
                Ok(out.write_char('}')?)
            }
            None => Ok(write!(out, "{value}")?),
        },
        // Macros, loop objects, cyclers and the like have no Python literal form; their
        // own rendering (`<macro f>`, ...) is what Jinja2 prints too, give or take.
        _ => Ok(write!(out, "{value}")?),
    }
}

fn write_number(out: &mut dyn fmt::Write, value: &Value) -> Result<(), Error> {
    if value.is_integer() {
        return Ok(write!(out, "{value}")?);
    }
    match f64::try_from(value.clone()) {
        Ok(x) => Ok(write_py_float(out, x)?),
        Err(_) => Ok(write!(out, "{value}")?),
    }
}

/// Writes `x` like Python's `repr(float)`: the shortest digits that round-trip, in
/// positional notation when the decimal exponent is in `-4..16`, else scientific.
fn write_py_float(out: &mut dyn fmt::Write, x: f64) -> fmt::Result {
    if x.is_nan() {
        return out.write_str("nan");
    }
    if x.is_infinite() {
        return out.write_str(if x < 0.0 { "-inf" } else { "inf" });
    }
    if x == 0.0 {
        return out.write_str(if x.is_sign_negative() { "-0.0" } else { "0.0" });
    }
    // Rust's `{:e}` gives the same shortest round-trip digits Python uses, as
    // `d.ddde±x`; only the layout differs.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if x < 0.0 {
        out.write_char('-')?;
    }
    // `decpt` is where the decimal point goes relative to the digits: 0.DIGITS × 10^decpt.
    let decpt = exp + 1;
    if decpt > -4 && decpt <= 16 {
        let n = digits.len() as i32;
        if decpt <= 0 {
            out.write_str("0.")?;
            for _ in 0..-decpt {
                out.write_char('0')?;
            }
            out.write_str(&digits)
        } else if decpt >= n {
            out.write_str(&digits)?;
            for _ in 0..decpt - n {
                out.write_char('0')?;
            }
            out.write_str(".0")
        } else {
            let (int, frac) = digits.split_at(decpt as usize);
            write!(out, "{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        out.write_str(first)?;
        if !rest.is_empty() {
            write!(out, ".{rest}")?;
        }
        let sign = if exp < 0 { '-' } else { '+' };
        write!(out, "e{sign}{:02}", exp.unsigned_abs())
    }
}

/// Writes `s` like Python's `repr(str)`.
fn write_str_repr(out: &mut dyn fmt::Write, s: &str) -> fmt::Result {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.write_char(quote)?;
    for c in s.chars() {
        match c {
            '\\' => out.write_str("\\\\")?,
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c if c == quote => write!(out, "\\{c}")?,
            c if is_py_printable(c) => out.write_char(c)?,
            c if (c as u32) <= 0xff => write!(out, "\\x{:02x}", c as u32)?,
            c if (c as u32) <= 0xffff => write!(out, "\\u{:04x}", c as u32)?,
            c => write!(out, "\\U{:08x}", c as u32)?,
        }
    }
    out.write_char(quote)
}

/// Writes `b` like Python's `repr(bytes)`.
fn write_bytes_repr(out: &mut dyn fmt::Write, b: &[u8]) -> fmt::Result {
    let quote = if b.contains(&b'\'') && !b.contains(&b'"') {
        b'"'
    } else {
        b'\''
    };
    out.write_char('b')?;
    out.write_char(quote as char)?;
    for &byte in b {
        match byte {
            b'\\' => out.write_str("\\\\")?,
            b'\n' => out.write_str("\\n")?,
            b'\r' => out.write_str("\\r")?,
            b'\t' => out.write_str("\\t")?,
            byte if byte == quote => write!(out, "\\{}", byte as char)?,
            0x20..=0x7e => out.write_char(byte as char)?,
            byte => write!(out, "\\x{byte:02x}")?,
        }
    }
    out.write_char(quote as char)
}

/// An approximation of Python's `str.isprintable` for one character: false for the
/// categories Cc, Cf, Co, Zl, Zp and Zs (except the space). Unassigned code points (Cn),
/// which Python also escapes, would need Unicode tables and are treated as printable.
fn is_py_printable(c: char) -> bool {
    let cp = c as u32;
    let not_printable = c.is_control()
        || matches!(
            cp,
            // Zs other than the space, Zl, Zp.
            0xa0 | 0x1680 | 0x2000..=0x200a | 0x2028 | 0x2029 | 0x202f | 0x205f | 0x3000
            // Cf.
            | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2 | 0x180e
            | 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x2064 | 0x2066..=0x206f
            | 0xfeff | 0xfff9..=0xfffb | 0x110bd | 0x110cd | 0x13430..=0x1343f
            | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a | 0xe0001 | 0xe0020..=0xe007f
            // Co.
            | 0xe000..=0xf8ff | 0xf0000..=0xffffd | 0x100000..=0x10fffd
        );
    !not_printable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_edge_cases() {
        let cases = [
            (1.0, "1.0"),
            (100.0, "100.0"),
            (1e16, "1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (-2.5, "-2.5"),
            (-1e-10, "-1e-10"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
            (0.001, "0.001"),
            (12345.678, "12345.678"),
        ];
        for (x, expected) in cases {
            let mut s = String::new();
            write_py_float(&mut s, x).unwrap();
            assert_eq!(s, expected, "{x:?}");
        }
    }

    #[test]
    fn str_repr_and_type_names() {
        assert_eq!(py_repr(&Value::from("a'b")).unwrap(), "\"a'b\"");
        assert_eq!(py_str(&Value::from("a'b")).unwrap(), "a'b");
        assert_eq!(
            py_repr(&Value::from_bytes(b"a'\x00".to_vec())).unwrap(),
            "b\"a'\\x00\""
        );
        assert_eq!(py_type_name(&Value::from(1)), "int");
        assert_eq!(py_type_name(&Value::from(1.5)), "float");
        assert_eq!(py_type_name(&Value::from(())), "NoneType");
        assert_eq!(py_type_name(&Value::from(vec![1])), "list");
        assert!(py_str(&Value::UNDEFINED).is_err());
    }
}
