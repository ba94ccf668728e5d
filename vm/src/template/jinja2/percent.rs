//! Python's printf-style string formatting, `format % args`, as a pure function.
//!
//! Jinja2 templates can write `'%s and %d' % (a, b)`, `'%(name)s' % d` and
//! `'%5.2f' % x`, because Jinja2 evaluates `%` with Python's operator. minijinja's `%` is
//! arithmetic only; [`percent_format`] gives the string case Python's semantics so the
//! operator can be routed to it. Every width and precision is capped at
//! [`MAX_WIDTH`](crate::template::caps::MAX_WIDTH) and the result at
//! [`MAX_RESULT_BYTES`](super::MAX_RESULT_BYTES).

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::MAX_RESULT_BYTES;
use crate::template::caps::{MAX_WIDTH, limit_error};
use crate::template::python::{py_repr, py_str, py_type_name};

/// `format % args` with Python's semantics (CPython's `PyUnicode_Format`).
///
/// * A tuple supplies the positional arguments; a dict (or a list, which Python also
///   treats as a mapping) supplies `%(key)s` and can itself be the one argument of a
///   `%s`; any other value is the single argument.
/// * Conversions: `s` (Python's `str()`), `r` (`repr()`), `a` (`ascii()`), `d` `i` `u`,
///   `o` `x` `X`, `e` `E` `f` `F` `g` `G`, `c` and `%%`; flags `-`, `+`, space, `0`,
///   `#`; a width and a precision, either of which may be `*` (taken from the
///   arguments); the length modifiers `h`, `l` and `L` are accepted and ignored.
/// * The errors are Python's: "not all arguments converted during string formatting",
///   "not enough arguments for format string", "format requires a mapping",
///   "unsupported format character ...", "%d format: a real number is required, not
///   str", and so on; a width or precision above [`MAX_WIDTH`](crate::template::caps::MAX_WIDTH) and a
///   result above [`MAX_RESULT_BYTES`](super::MAX_RESULT_BYTES) are errors too.
///
/// The result is always a string.
pub fn percent_format(format: &str, args: &Value) -> Result<Value, Error> {
    let mut ctx = Formatter::new(args);
    let chars: Vec<char> = format.chars().collect();
    let mut out = String::with_capacity(format.len());
    let mut pos = 0;
    while pos < chars.len() {
        if chars[pos] != '%' {
            out.push(chars[pos]);
            pos += 1;
            continue;
        }
        pos += 1;
        pos = ctx.format_one(&chars, pos, &mut out)?;
        if out.len() > MAX_RESULT_BYTES {
            return Err(limit_error(format!(
                "'%' formatting: the result exceeds the limit of {MAX_RESULT_BYTES} bytes"
            )));
        }
    }
    if ctx.argidx < ctx.arglen && ctx.dict.is_none() {
        return Err(fail("not all arguments converted during string formatting"));
    }
    Ok(Value::from(out))
}

/// The argument state of one formatting, as CPython keeps it: with a tuple, `arglen` is
/// its length and `argidx` the next index; with a single value, `arglen` is -1 and
/// `argidx` is -2 until the value has been used.
struct Formatter {
    args: Vec<Value>,
    single: Value,
    arglen: isize,
    argidx: isize,
    dict: Option<Value>,
}

/// One conversion specifier's flags, width and precision.
#[derive(Default)]
struct Spec {
    left: bool,
    sign: bool,
    blank: bool,
    alt: bool,
    zero: bool,
    width: usize,
    prec: Option<usize>,
}

impl Formatter {
    fn new(args: &Value) -> Formatter {
        let dict = match args.kind() {
            ValueKind::Map => Some(args.clone()),
            ValueKind::Seq if !args.is_tuple() => Some(args.clone()),
            _ => None,
        };
        if args.kind() == ValueKind::Seq && args.is_tuple() {
            let items: Vec<Value> = args.try_iter().map(|it| it.collect()).unwrap_or_default();
            Formatter {
                arglen: items.len() as isize,
                args: items,
                single: Value::UNDEFINED,
                argidx: 0,
                dict,
            }
        } else {
            Formatter {
                args: Vec::new(),
                single: args.clone(),
                arglen: -1,
                argidx: -2,
                dict,
            }
        }
    }

    fn next_arg(&mut self) -> Result<Value, Error> {
        if self.argidx < self.arglen {
            let idx = self.argidx;
            self.argidx += 1;
            if self.arglen < 0 {
                return Ok(self.single.clone());
            }
            return Ok(self.args[idx as usize].clone());
        }
        Err(fail("not enough arguments for format string"))
    }

    /// Formats the specifier that starts at `chars[pos]` (after the `%`); returns the
    /// position after it.
    fn format_one(
        &mut self,
        chars: &[char],
        mut pos: usize,
        out: &mut String,
    ) -> Result<usize, Error> {
        let at = |pos: usize| chars.get(pos).copied();
        if at(pos) == Some('%') {
            out.push('%');
            return Ok(pos + 1);
        }
        if at(pos) == Some('(') {
            let Some(dict) = self.dict.clone() else {
                return Err(fail("format requires a mapping"));
            };
            let mut depth = 1;
            let start = pos + 1;
            pos += 1;
            while depth > 0 {
                match at(pos) {
                    None => return Err(fail("incomplete format key")),
                    Some('(') => depth += 1,
                    Some(')') => depth -= 1,
                    Some(_) => {}
                }
                pos += 1;
            }
            let key: String = chars[start..pos - 1].iter().collect();
            self.single = lookup(&dict, &key)?;
            self.arglen = -1;
            self.argidx = -2;
        }
        let mut spec = Spec::default();
        while let Some(c) = at(pos) {
            match c {
                '-' => spec.left = true,
                '+' => spec.sign = true,
                ' ' => spec.blank = true,
                '#' => spec.alt = true,
                '0' => spec.zero = true,
                _ => break,
            }
            pos += 1;
        }
        if at(pos) == Some('*') {
            let width = star_arg(&self.next_arg()?)?;
            if width < 0 {
                spec.left = true;
            }
            spec.width = capped("width", width.unsigned_abs())?;
            pos += 1;
        } else {
            let (width, next) = digits(chars, pos, "width")?;
            spec.width = width.unwrap_or(0);
            pos = next;
        }
        if at(pos) == Some('.') {
            pos += 1;
            if at(pos) == Some('*') {
                let prec = star_arg(&self.next_arg()?)?;
                spec.prec = Some(capped("precision", prec.max(0).unsigned_abs())?);
                pos += 1;
            } else {
                let (prec, next) = digits(chars, pos, "precision")?;
                spec.prec = Some(prec.unwrap_or(0));
                pos = next;
            }
        }
        while matches!(at(pos), Some('h' | 'l' | 'L')) {
            pos += 1;
        }
        let Some(conversion) = at(pos) else {
            return Err(fail("incomplete format"));
        };
        if conversion == '%' {
            out.push('%');
            return Ok(pos + 1);
        }
        let arg = self.next_arg()?;
        let (sign, prefix, body) = convert(conversion, &arg, &spec, pos)?;
        pad(out, &spec, is_numeric(conversion), sign, prefix, &body);
        Ok(pos + 1)
    }
}

/// Formats `arg` by `conversion`: the sign, the `0x`-style prefix and the digits or text.
fn convert(
    conversion: char,
    arg: &Value,
    spec: &Spec,
    pos: usize,
) -> Result<(&'static str, &'static str, String), Error> {
    match conversion {
        's' | 'r' | 'a' => {
            let mut s = match conversion {
                's' => py_str(arg)?,
                'r' => py_repr(arg)?,
                _ => ascii(&py_repr(arg)?),
            };
            if let Some(prec) = spec.prec
                && let Some((idx, _)) = s.char_indices().nth(prec)
            {
                s.truncate(idx);
            }
            Ok(("", "", s))
        }
        'd' | 'i' | 'u' | 'o' | 'x' | 'X' => {
            let n = integer(conversion, arg)?;
            let mut digits = match conversion {
                'o' => format!("{:o}", n.unsigned_abs()),
                'x' => format!("{:x}", n.unsigned_abs()),
                'X' => format!("{:X}", n.unsigned_abs()),
                _ => n.unsigned_abs().to_string(),
            };
            if let Some(prec) = spec.prec
                && digits.len() < prec
            {
                digits.insert_str(0, &"0".repeat(prec - digits.len()));
            }
            let prefix = match (spec.alt, conversion) {
                (true, 'o') => "0o",
                (true, 'x') => "0x",
                (true, 'X') => "0X",
                _ => "",
            };
            Ok((sign_of(n < 0, spec), prefix, digits))
        }
        'e' | 'E' | 'f' | 'F' | 'g' | 'G' => {
            let x = real(conversion, arg)?;
            let body = format_float(x.abs(), conversion, spec.prec.unwrap_or(6), spec.alt);
            let negative = x.is_sign_negative() && !x.is_nan();
            Ok((sign_of(negative, spec), "", body))
        }
        'c' => Ok(("", "", character(arg)?.to_string())),
        other => Err(fail(format!(
            "unsupported format character '{other}' (0x{:x}) at index {pos}",
            other as u32
        ))),
    }
}

/// Writes `sign prefix body` padded to the width: spaces on the left (or the right with
/// `-`), or zeros between the prefix and the body with `0` for numbers.
fn pad(out: &mut String, spec: &Spec, numeric: bool, sign: &str, prefix: &str, body: &str) {
    let len = sign.len() + prefix.len() + body.chars().count();
    let fill = spec.width.saturating_sub(len);
    if spec.left {
        out.push_str(sign);
        out.push_str(prefix);
        out.push_str(body);
        out.extend(std::iter::repeat_n(' ', fill));
    } else if spec.zero && numeric {
        out.push_str(sign);
        out.push_str(prefix);
        out.extend(std::iter::repeat_n('0', fill));
        out.push_str(body);
    } else {
        out.extend(std::iter::repeat_n(' ', fill));
        out.push_str(sign);
        out.push_str(prefix);
        out.push_str(body);
    }
}

fn is_numeric(conversion: char) -> bool {
    matches!(
        conversion,
        'd' | 'i' | 'u' | 'o' | 'x' | 'X' | 'e' | 'E' | 'f' | 'F' | 'g' | 'G'
    )
}

fn sign_of(negative: bool, spec: &Spec) -> &'static str {
    if negative {
        "-"
    } else if spec.sign {
        "+"
    } else if spec.blank {
        " "
    } else {
        ""
    }
}

/// The integer a `%d`-style conversion formats: `%d` `%i` `%u` truncate floats, the
/// others take integers (and bools) only.
fn integer(conversion: char, arg: &Value) -> Result<i128, Error> {
    if arg.kind() == ValueKind::Bool {
        return Ok(i128::from(arg.is_true()));
    }
    if arg.kind() == ValueKind::Number {
        if arg.is_integer() {
            if let Ok(n) = i128::try_from(arg.clone()) {
                return Ok(n);
            }
        } else if matches!(conversion, 'd' | 'i' | 'u')
            && let Ok(x) = f64::try_from(arg.clone())
        {
            if x.is_nan() {
                return Err(fail("cannot convert float NaN to integer"));
            }
            if x.is_infinite() {
                return Err(fail("cannot convert float infinity to integer"));
            }
            let t = x.trunc();
            // Every finite f64 below 2^127 in magnitude fits in an i128.
            if t.abs() < 1.7e38 {
                return Ok(t as i128);
            }
            return Err(fail(format!("%{conversion} format: {x} is too large")));
        }
    }
    let needs = if matches!(conversion, 'd' | 'i' | 'u') {
        "a real number"
    } else {
        "an integer"
    };
    Err(fail(format!(
        "%{conversion} format: {needs} is required, not {}",
        py_type_name(arg)
    )))
}

/// The float a `%f`-style conversion formats.
fn real(conversion: char, arg: &Value) -> Result<f64, Error> {
    match arg.kind() {
        ValueKind::Bool => Ok(if arg.is_true() { 1.0 } else { 0.0 }),
        ValueKind::Number => f64::try_from(arg.clone()).map_err(|_| {
            fail(format!(
                "%{conversion} format: the number does not fit a float"
            ))
        }),
        _ => Err(fail(format!(
            "must be real number, not {}",
            py_type_name(arg)
        ))),
    }
}

/// The character of `%c`: a code point, or a one-character string.
fn character(arg: &Value) -> Result<char, Error> {
    if let Some(s) = arg.as_str()
        && arg.kind() == ValueKind::String
    {
        let mut chars = s.chars();
        if let (Some(c), None) = (chars.next(), chars.next()) {
            return Ok(c);
        }
        return Err(fail("%c requires int or char"));
    }
    if arg.is_integer() || arg.kind() == ValueKind::Bool {
        let n = i128::try_from(arg.clone()).unwrap_or(-1);
        return u32::try_from(n)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| fail("%c arg not in range(0x110000)"));
    }
    Err(fail("%c requires int or char"))
}

/// A `*` width or precision: an integer argument.
fn star_arg(arg: &Value) -> Result<i64, Error> {
    if arg.is_integer()
        && let Ok(n) = i64::try_from(arg.clone())
    {
        return Ok(n);
    }
    if arg.kind() == ValueKind::Bool {
        return Ok(i64::from(arg.is_true()));
    }
    Err(fail("* wants int"))
}

/// A run of decimal digits at `pos` (none gives `None`), capped at [`MAX_WIDTH`].
fn digits(chars: &[char], mut pos: usize, what: &str) -> Result<(Option<usize>, usize), Error> {
    let mut value: Option<u64> = None;
    while let Some(d) = chars.get(pos).and_then(|c| c.to_digit(10)) {
        let v = value
            .unwrap_or(0)
            .saturating_mul(10)
            .saturating_add(u64::from(d));
        value = Some(v);
        pos += 1;
    }
    match value {
        Some(v) => Ok((Some(capped(what, v)?), pos)),
        None => Ok((None, pos)),
    }
}

fn capped(what: &str, value: u64) -> Result<usize, Error> {
    match usize::try_from(value) {
        Ok(v) if v <= MAX_WIDTH => Ok(v),
        _ => Err(limit_error(format!(
            "'%' formatting: {what} {value} exceeds the limit of {MAX_WIDTH}"
        ))),
    }
}

/// The value of `%(key)s`.
fn lookup(dict: &Value, key: &str) -> Result<Value, Error> {
    if dict.kind() != ValueKind::Map {
        return Err(fail(format!(
            "{} indices must be integers or slices, not str",
            py_type_name(dict)
        )));
    }
    match dict.get_item(&Value::from(key)) {
        Ok(value) if !value.is_undefined() => Ok(value),
        _ => Err(fail(format!(
            "'%' formatting: key {} is not in the dict",
            py_repr(&Value::from(key))?
        ))),
    }
}

/// `ascii()` of a `repr()`: the non-ASCII characters escaped.
fn ascii(repr: &str) -> String {
    let mut out = String::with_capacity(repr.len());
    for c in repr.chars() {
        let cp = c as u32;
        match cp {
            0..=0x7f => out.push(c),
            0x80..=0xff => out.push_str(&format!("\\x{cp:02x}")),
            0x100..=0xffff => out.push_str(&format!("\\u{cp:04x}")),
            _ => out.push_str(&format!("\\U{cp:08x}")),
        }
    }
    out
}

/// Formats the non-negative (or NaN) `x` like Python's `%e`, `%f` and `%g`.
fn format_float(x: f64, conversion: char, prec: usize, alt: bool) -> String {
    let upper = conversion.is_ascii_uppercase();
    if !x.is_finite() {
        let s = if x.is_nan() { "nan" } else { "inf" };
        return if upper {
            s.to_uppercase()
        } else {
            s.to_string()
        };
    }
    let s = match conversion.to_ascii_lowercase() {
        'f' => {
            let mut s = format!("{x:.prec$}");
            if alt && prec == 0 {
                s.push('.');
            }
            s
        }
        'e' => exponent_form(x, prec, alt),
        _ => {
            let p = prec.max(1);
            let exp = decimal_exponent(x, p);
            let mut s = if exp >= -4 && exp < p as i32 {
                let decimals = (p as i32 - 1 - exp).max(0) as usize;
                let mut s = format!("{x:.decimals$}");
                if alt && !s.contains('.') {
                    s.push('.');
                }
                s
            } else {
                exponent_form(x, p - 1, alt)
            };
            if !alt {
                s = strip_zeros(&s);
            }
            s
        }
    };
    if upper { s.to_uppercase() } else { s }
}

/// `x` as `d.ddde±XX` with `prec` decimals.
fn exponent_form(x: f64, prec: usize, alt: bool) -> String {
    let s = format!("{x:.prec$e}");
    let (mantissa, exp) = s.split_once('e').unwrap_or((s.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let dot = if alt && prec == 0 { "." } else { "" };
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}{dot}e{sign}{:02}", exp.unsigned_abs())
}

/// The decimal exponent of `x` once rounded to `p` significant digits.
fn decimal_exponent(x: f64, p: usize) -> i32 {
    let digits = p - 1;
    let s = format!("{x:.digits$e}");
    s.split_once('e')
        .and_then(|(_, exp)| exp.parse().ok())
        .unwrap_or(0)
}

/// `%g` without `#`: no trailing zeros in the fraction, and no bare point.
fn strip_zeros(s: &str) -> String {
    let (mantissa, exp) = match s.find('e') {
        Some(idx) => s.split_at(idx),
        None => (s, ""),
    };
    let mantissa = if mantissa.contains('.') {
        mantissa.trim_end_matches('0').trim_end_matches('.')
    } else {
        mantissa
    };
    format!("{mantissa}{exp}")
}

/// Python raises `TypeError`, `ValueError`, `KeyError` or `OverflowError` here; a
/// template error has no such kinds, so every one is an invalid operation whose message
/// is Python's.
#[cold]
fn fail(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}
