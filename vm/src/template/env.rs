//! The template environment shared by the compiler (build-time checks) and the VM.
//!
//! APL templates are Jinja2 templates (spec §7), and they are run on minijinja. This file
//! configures the one [`Environment`] both sides use so that the idioms of §7 behave as
//! they do in Python Jinja2:
//!
//! * undefined values follow [`UndefinedBehavior::SemiStrict`]: printing or iterating an
//!   undefined variable is an error, while `{% if maybe %}`, `maybe is defined`,
//!   `maybe is none` and `maybe | default(..)` are fine;
//! * no auto-escaping, a trailing newline of a template is dropped (Jinja2's default),
//!   errors carry line information;
//! * every render has a fuel budget, a recursion limit and an output cap ([`Limits`]);
//! * values print like Python's `str()` (`python.rs`): `None`, `True`, `False`, `1.0`,
//!   `1e+16`, `[1, 'a']`, `{'k': 'v'}`, `(1,)`; strings print as they are;
//! * Python string and dict methods (`.lower()`, `.strip()`, `.split()`,
//!   `.startswith()`, `.get()`, `.items()`, ...) come from minijinja-contrib's `pycompat`;
//! * the filters `truncate`, `join`, `string`, `pprint`, `int`, `float`, `center`,
//!   `wordcount`, `filesizeformat`, `striptags` and the globals `cycler` and `joiner`
//!   behave as in Jinja2 (see `helpers.rs`), and so do the APL helpers of §6.3 and §7.4;
//! * every other Jinja2 built-in minijinja lacks (`forceescape`, `random`, `urlencode`,
//!   `urlize`, `wordwrap`, `xmlattr`, `callable`, `lipsum`) is in `jinja2.rs`, whose
//!   tests list all of Jinja2's filters, tests and globals.
//!
//! # Known differences from Python Jinja2
//!
//! These remain, and are documented in `spec/language.md`:
//!
//! * **Undefined values are semi-strict**, where Python APL uses Jinja2's lenient default:
//!   `{{ missing }}`, `{% for x in missing %}`, `missing.attr` and `missing | length`
//!   are errors rather than empty. Use `get_context('x', default)`, `x | default(..)` or
//!   `{% if x is defined %}`.
//! * **Values are immutable.** `list.append()`, `dict.update()` and friends do not exist;
//!   build a new value (`xs + [x]`) and store it with `set_context`, or use `add_context`.
//!   Calling one is an error whose message says so (`jinja2::unknown_method_callback`).
//! * **Only `{{ }}` and the filters listed above print the Python way.** The `~`
//!   operator and the `format` filter / `str.format` use minijinja's own rendering,
//!   which differs for floats outside `1e-4..1e16` (`'a' ~ 1e20` is
//!   `a100000000000000000000.0`, Python gives `a1e+20`).
//! * **Integers are 128-bit**: arithmetic that overflows is an error, not a big integer.
//! * **`%` on a string is Python's printf-style formatting** (`'%s and %d' % (a, b)`,
//!   `'%(name)s' % d`), through [`crate::percent_format`]; widths and precisions are
//!   capped (spec/limits.md). On numbers it is the remainder, as in Jinja2.
//! * **`tojson` keeps insertion order** of keys where Jinja2 sorts them.
//! * **`random` and `lipsum` are deterministic**: seeded per render from the `seed`
//!   variable (or a fixed seed), the template's name and `global_runs`, never from the
//!   OS, so a replayed run draws the same; the draws differ from Python's.
//! * **`callable`** is true for functions, macros and `joiner()` objects only.
//! * No Jinja2 built-in filter, test or global is missing. minijinja adds a few of its own (`split`, `lines`, `bool`, `chain`, `zip` filters
//!   and the `debug()` global); they are available but are not portable to Jinja2.
//! * Python's `repr` of strings escapes non-printable characters; here the control
//!   characters, the space separators other than ` `, the format characters and the
//!   private-use characters are escaped, but unassigned code points are printed as-is.
//! * Text written by `{% set x %}...{% endset %}`, `{% filter %}` and macro calls is
//!   buffered in memory before the output cap sees it; the string limit
//!   ([`Limits::max_string_bytes`]) bounds how much can pile up.

use std::io;

use minijinja::value::Value;
use minijinja::value::limits::{self, ValueLimits};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior};

/// Limits applied to every render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// minijinja fuel per render (roughly, instructions executed).
    pub fuel: u64,
    /// Maximum nesting depth of template recursion (macros, includes), in minijinja's
    /// units: a block or loop costs 1 and a macro call about 6, so 200 allows about thirty
    /// nested macro calls.
    pub recursion: usize,
    /// Maximum size of one render's output, in bytes.
    pub max_output_bytes: usize,
    /// Maximum length of any one string a template builds, in bytes (operators, filters,
    /// functions and methods fail before they would build a longer one).
    pub max_string_bytes: usize,
    /// Maximum number of items of any one list, tuple or map a template builds.
    pub max_items: usize,
    /// Maximum nesting of lists, tuples and maps in a value a template builds or stores
    /// (`[1]` is 1 deep). Every consumer that recurses (printing, `tojson`, equality,
    /// serialization, drop) then stays within a bounded stack.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: 5_000_000,
            recursion: 200,
            max_output_bytes: 4 * 1024 * 1024,
            max_string_bytes: 16 * 1024 * 1024,
            max_items: 1_000_000,
            max_depth: 256,
        }
    }
}

impl Limits {
    /// The value limits in minijinja's terms.
    pub(crate) fn value_limits(&self) -> ValueLimits {
        ValueLimits {
            max_string_bytes: self.max_string_bytes,
            max_items: self.max_items,
            max_depth: self.max_depth,
        }
    }
}

/// Builds the environment every APL template is compiled and rendered in.
///
/// The compiler checks templates with it at build time and the VM renders them with it,
/// so a template that compiles uses only filters, tests and functions the VM has. Every
/// render's root context must be the run's `Store` (see `store.rs`); the helpers of
/// §6.3 and §7.4 find it there and fail with a clear error without it.
pub fn template_env(limits: &Limits) -> Environment<'static> {
    template_env_for(limits, crate::Dialect::Spec)
}

/// [`template_env`] with `dialect`'s helpers too (`spec/dialects.md`).
pub fn template_env_for(limits: &Limits, dialect: crate::Dialect) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
    env.set_fuel(Some(limits.fuel));
    env.set_recursion_limit(limits.recursion);
    env.set_value_limits(limits.value_limits());
    // The run's interrupt flag, if the render runs inside a run (see `interrupt.rs`).
    env.set_interrupt_callback(crate::interrupt::render_interrupted);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_debug(true);
    // minijinja's default syntax already drops a template's trailing newline, like
    // Jinja2's `keep_trailing_newline=False`; a test below pins that down.
    env.set_unknown_method_callback(checked_method);
    env.set_string_format_callback(crate::template::jinja2::percent_format);
    env.set_formatter(|out, _state, value| {
        // Only the "silent" undefined of `{{ x if cond }}` without an else reaches the
        // formatter: SemiStrict rejects every other undefined before. Jinja2 prints it
        // as an empty string.
        if value.is_undefined() {
            return Ok(());
        }
        crate::template::python::write_py_str(out, value)
    });
    crate::template::helpers::register(&mut env);
    crate::template::jinja2::register(&mut env);
    crate::template::dialect::register(&mut env, dialect);
    env
}

/// Renders the template `name` with `root` as its context, failing once the output
/// exceeds `max_output_bytes`.
pub(crate) fn render(
    env: &Environment<'static>,
    name: &str,
    root: Value,
    max_output_bytes: usize,
) -> Result<String, Error> {
    let template = env.get_template(name)?;
    let mut out = CappedWriter {
        buf: Vec::new(),
        limit: max_output_bytes,
        exceeded: false,
    };
    match template.render_captured_to(root, &mut out) {
        Ok(_) => {}
        Err(_) if out.exceeded => return Err(output_limit_error(max_output_bytes)),
        Err(err) => return Err(err),
    }
    // Only whole `&str`s are ever written, so the buffer is valid UTF-8.
    String::from_utf8(out.buf).map_err(|_| {
        Error::new(
            ErrorKind::WriteFailure,
            "template output is not valid UTF-8",
        )
    })
}

/// minijinja-contrib's Python methods, with the size of the result checked before the
/// methods that can multiply their input build it (the engine checks every result
/// afterwards, which bounds the others).
fn checked_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    match (method, value.as_str()) {
        ("replace", Some(s)) => {
            let old = args.first().and_then(Value::as_str).unwrap_or_default();
            let new = args.get(1).and_then(Value::as_str).unwrap_or_default();
            let count = args
                .get(2)
                .and_then(|c| i64::try_from(c.clone()).ok())
                .and_then(|c| usize::try_from(c).ok());
            limits::check_string_bytes(limits::replaced_len(s, old, new, count))?;
        }
        ("join", Some(sep)) => {
            if let Some(items) = args.first() {
                joined_len_within_limit(sep, items)?;
            }
        }
        _ => {}
    }
    // Then pycompat's methods, with a hint for the ones that would mutate a value.
    crate::template::jinja2::unknown_method_callback(state, value, method, args)
}

/// Fails if `sep.join(items)` would exceed the string limit, before building it.
pub(crate) fn joined_len_within_limit(sep: &str, items: &Value) -> Result<(), Error> {
    let Ok(iter) = items.try_iter() else {
        // Not iterable: the method itself reports that.
        return Ok(());
    };
    let mut total = 0usize;
    for (idx, item) in iter.enumerate() {
        if idx > 0 {
            total = total.saturating_add(sep.len());
        }
        total = total.saturating_add(match item.as_str() {
            Some(s) => s.len(),
            // Other items print at most about as long as their own text; a string
            // would be the common case.
            None => limits::to_string_capped(&item)?.len(),
        });
        limits::check_string_bytes(total)?;
    }
    Ok(())
}

/// An `io::Write` that collects output and refuses to grow past `limit` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.limit {
            self.exceeded = true;
            return Err(io::Error::other(format!(
                "template output exceeds the limit of {} bytes",
                self.limit
            )));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cold]
fn output_limit_error(limit: usize) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("template output exceeds the limit of {limit} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use minijinja::value::Value;

    use super::*;
    use crate::template::store::{Store, Vars};

    /// Renders `source` with a fresh store holding `vars` (a JSON object).
    fn run(source: &str, vars: serde_json::Value) -> Result<String, Error> {
        run_with(source, store_from_json(vars)).map(|(out, _)| out)
    }

    fn run_with(source: &str, store: Arc<Store>) -> Result<(String, Arc<Store>), Error> {
        run_limited(source, store, &Limits::default())
    }

    fn run_limited(
        source: &str,
        store: Arc<Store>,
        limits: &Limits,
    ) -> Result<(String, Arc<Store>), Error> {
        let mut env = template_env(limits);
        env.add_template_owned("t", source.to_string())?;
        let out = render(
            &env,
            "t",
            Value::from_dyn_object(store.clone()),
            limits.max_output_bytes,
        )?;
        Ok((out, store))
    }

    fn store_from_json(vars: serde_json::Value) -> Arc<Store> {
        let mut map = Vars::new();
        if let serde_json::Value::Object(obj) = vars {
            for (k, v) in obj {
                let value: Value = serde_json::from_value(v).unwrap();
                map.insert(Arc::from(k.as_str()), value);
            }
        }
        Store::new(map)
    }

    fn ok(source: &str, vars: serde_json::Value) -> String {
        match run(source, vars) {
            Ok(s) => s,
            Err(err) => panic!("{source:?} failed: {err:#}"),
        }
    }

    fn err(source: &str, vars: serde_json::Value) -> String {
        match run(source, vars) {
            Ok(s) => panic!("{source:?} should fail, rendered {s:?}"),
            Err(err) => format!("{err:#}"),
        }
    }

    fn squash(s: &str) -> String {
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    use serde_json::json;

    #[test]
    fn env_prints_scalars_like_python() {
        let cases = [
            ("{{ none }}", "None"),
            ("{{ true }} {{ false }}", "True False"),
            ("{{ 1 }} {{ -7 }}", "1 -7"),
            ("{{ 1.0 }} {{ 0.5 }} {{ 2.5e-3 }}", "1.0 0.5 0.0025"),
            (
                "{{ 1e20 }} {{ 1e16 }} {{ 1e15 }}",
                "1e+20 1e+16 1000000000000000.0",
            ),
            (
                "{{ 0.0001 }} {{ 0.00001 }} {{ 1.5e-7 }}",
                "0.0001 1e-05 1.5e-07",
            ),
            ("{{ -0.0 }} {{ 0.1 + 0.2 }}", "-0.0 0.30000000000000004"),
            (
                "{{ 123456789.125 }} {{ 1.7976931348623157e308 }}",
                "123456789.125 1.7976931348623157e+308",
            ),
            ("{{ 10 / 4 }} {{ 10 // 4 }}", "2.5 2"),
            ("{{ 'plain' }}", "plain"),
        ];
        for (source, expected) in cases {
            assert_eq!(ok(source, json!({})), expected, "{source}");
        }
        assert_eq!(ok("{{ x }}", json!({"x": 0.7})), "0.7");
        assert_eq!(ok("{{ x }}", json!({"x": 3.0})), "3.0");
    }

    #[test]
    fn env_prints_containers_like_python() {
        let cases = [
            ("{{ [1, 'a'] }}", "[1, 'a']"),
            ("{{ [] }} {{ {} }}", "[] {}"),
            (
                "{{ {'k': 'v', 'n': [1.5, none, true]} }}",
                "{'k': 'v', 'n': [1.5, None, True]}",
            ),
            ("{{ (1, 2) }} {{ (1,) }}", "(1, 2) (1,)"),
            (
                "{{ [[1, [2]], {'a': {'b': 'c'}}] }}",
                "[[1, [2]], {'a': {'b': 'c'}}]",
            ),
            (r#"{{ ["it's"] }}"#, r#"["it's"]"#),
            (
                r#"{{ ['say "hi"', "both ' \""] }}"#,
                r#"['say "hi"', 'both \' "']"#,
            ),
            (r#"{{ ["a\nb\tc\\d"] }}"#, r"['a\nb\tc\\d']"),
            ("{{ [1, 2] + [3] }}", "[1, 2, 3]"),
            ("{{ {'a': 1}.items() }}", "[('a', 1)]"),
            ("{{ [1, 2, 3] | map('string') | list }}", "['1', '2', '3']"),
        ];
        for (source, expected) in cases {
            assert_eq!(ok(source, json!({})), expected, "{source}");
        }
        assert_eq!(
            ok(
                "{{ x }}",
                json!({"x": ["\u{7}", "\u{a0}é", "\u{200b}", "日本"]})
            ),
            r"['\x07', '\xa0é', '\u200b', '日本']"
        );
        assert_eq!(
            ok(
                "{{ user }}",
                json!({"user": {"name": "Aron", "tags": ["a"], "age": 3}})
            ),
            "{'name': 'Aron', 'tags': ['a'], 'age': 3}"
        );
    }

    #[test]
    fn env_prints_store_views_like_dicts() {
        let store = store_from_json(json!({"a": 1}));
        store.snapshot();
        store.set("b", Value::from("x"));
        let (out, _) = run_with("{{ context_history }}|{{ context }}", store).unwrap();
        assert_eq!(
            out,
            "[{'a': 1}]|{'a': 1, 'b': 'x', 'context_history': [{'a': 1}]}"
        );
    }

    #[test]
    fn env_semi_strict_undefined() {
        let e = err("{{ missing }}", json!({}));
        assert!(e.contains("undefined"), "{e}");
        assert_eq!(
            ok("{% if missing %}yes{% else %}no{% endif %}", json!({})),
            "no"
        );
        assert_eq!(ok("{{ missing | default('x') }}", json!({})), "x");
        assert_eq!(
            ok("{{ missing is defined }} {{ none is none }}", json!({})),
            "False True"
        );
        assert_eq!(ok("{{ 'a' if missing }}|", json!({})), "|");
        assert!(err("{% for x in missing %}{% endfor %}", json!({})).contains("undefined"));
        assert!(err("{{ missing.attr }}", json!({})).contains("undefined"));
        // A missing key of a defined dict is undefined, and falsy.
        assert_eq!(
            ok("{% if d.nope %}y{% else %}n{% endif %}", json!({"d": {}})),
            "n"
        );
        // Like StrictUndefined, whose repr() works and whose str() fails.
        assert_eq!(ok("{{ [missing] }}", json!({})), "[Undefined]");
        assert!(ok("{% for i in [1] %}{{ loop }}{% endfor %}", json!({})).contains("'index': 1"));
    }

    #[test]
    fn env_errors_carry_line_numbers() {
        let mut env = template_env(&Limits::default());
        env.add_template("t", "line one\n{{ missing }}").unwrap();
        let store = Store::new(Vars::new());
        let e = render(&env, "t", Value::from_dyn_object(store), 1024).unwrap_err();
        assert_eq!(e.line(), Some(2));
    }

    #[test]
    fn env_whitespace_and_escaping_follow_jinja2() {
        assert_eq!(ok("a\n", json!({})), "a");
        assert_eq!(ok("a\n\n", json!({})), "a\n");
        assert_eq!(ok("{{ '<b>&' }}", json!({})), "<b>&");
        let mut env = template_env(&Limits::default());
        env.add_template("x.html", "{{ '<b>' }}").unwrap();
        let store = Store::new(Vars::new());
        assert_eq!(
            render(&env, "x.html", Value::from_dyn_object(store), 1024).unwrap(),
            "<b>"
        );
    }

    #[test]
    fn env_python_methods() {
        let vars = json!({"result_text": "  Good Morning  ", "d": {"a": 1}});
        assert_eq!(
            ok("{{ result_text.lower() }}", vars.clone()),
            "  good morning  "
        );
        assert_eq!(
            ok("{{ result_text.strip() }}", vars.clone()),
            "Good Morning"
        );
        assert_eq!(
            ok("{{ result_text.split() }}", vars.clone()),
            "['Good', 'Morning']"
        );
        assert_eq!(
            ok("{{ result_text.strip().startswith('Good') }}", vars.clone()),
            "True"
        );
        assert_eq!(
            ok(
                "{{ d.get('a') }} {{ d.get('b', 2) }} {{ d.get('c') }}",
                vars.clone()
            ),
            "1 2 None"
        );
        assert_eq!(
            ok(
                "{% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}",
                vars.clone()
            ),
            "a=1"
        );
        assert_eq!(ok("{{ '{} and {}'.format(1, 'x') }}", vars), "1 and x");
    }

    #[test]
    fn env_output_cap() {
        let limits = Limits {
            max_output_bytes: 10,
            ..Limits::default()
        };
        let store = Store::new(Vars::new());
        let (out, _) = run_limited("0123456789", store.clone(), &limits).unwrap();
        assert_eq!(out, "0123456789");
        let e = run_limited("0123456789x", store.clone(), &limits).unwrap_err();
        assert!(
            e.to_string()
                .contains("template output exceeds the limit of 10 bytes"),
            "{e}"
        );
        let e = run_limited(
            "{% for i in range(100) %}{{ i }}{% endfor %}",
            store.clone(),
            &limits,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("exceeds the limit of 10 bytes"),
            "{e}"
        );
        let e = run_limited("{{ range(100) | list }}", store, &limits).unwrap_err();
        assert!(
            e.to_string().contains("exceeds the limit of 10 bytes"),
            "{e}"
        );
    }

    /// Small limits, so that every way of building a big value is quick to try.
    fn small_limits() -> Limits {
        Limits {
            max_string_bytes: 1000,
            max_items: 100,
            max_depth: 8,
            ..Limits::default()
        }
    }

    fn limited_err(source: &str) -> Error {
        match run_limited(source, Store::new(Vars::new()), &small_limits()) {
            Ok((out, _)) => panic!("{source:?} should fail, rendered {} bytes", out.len()),
            Err(err) => err,
        }
    }

    #[test]
    fn env_value_limits_stop_every_multiplying_expression() {
        let cases = [
            "{{ 'x'|center(2000) }}",
            "{% set n = 2000 %}{{ 'x' * n }}",
            "{% set n = 1000 %}{{ 'x' ~ ('y' * n) }}",
            "{% set n = 600 %}{{ ('x' * n) ~ ('y' * n) }}",
            "{% set n = 600 %}{{ ('x' * n) + ('y' * n) }}",
            "{% set n = 600 %}{{ [('x' * n)] ~ ('y' * n) }}",
            "{% set n = 200 %}{{ [1] * n }}",
            "{% set n = 60 %}{{ ([1] * n) + ([1] * n) }}",
            "{% set n = 200 %}{{ (1,) * n }}",
            "{{ range(10)|batch(200, 0)|list }}",
            "{{ range(10)|slice(200)|list }}",
            "{{ '%2000s'|format('x') }}",
            "{{ '%.2000f'|format(1.5) }}",
            "{{ '{:>2000}'.format('x') }}",
            "{{ ('a\n' * 10)|indent(200) }}",
            "{{ ('x' * 100)|replace('x', 'y' * 20) }}",
            "{{ ('x' * 100).replace('x', 'y' * 20) }}",
            "{{ (['x' * 100] * 50)|join }}",
            "{{ ''.join(['x' * 100] * 50) }}",
            "{{ (['x' * 100] * 50)|tojson }}",
            "{{ (['x' * 100] * 50)|string }}",
            "{{ (['x' * 100] * 50)|safe }}",
            "{{ (['x' * 100] * 50)|pprint }}",
            "{% set n = 600 %}{{ 'x' * n ~ ['y' * n] }}",
            "{{ range(1000)|list }}",
            "{% set x %}{% for i in range(100) %}{{ 'y' * 100 }}{% endfor %}{% endset %}",
            "{% macro m() %}{% for i in range(100) %}{{ 'y' * 100 }}{% endfor %}{% endmacro %}{% set x = m() %}",
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        ];
        for source in cases {
            let err = limited_err(source);
            assert_eq!(err.kind(), ErrorKind::ValueTooLarge, "{source}: {err:#}");
            let detail = err.detail().unwrap_or_default();
            assert!(
                detail.contains("exceeds the limit of"),
                "{source}: {detail}"
            );
        }
        // At the limit is fine. (Constant expressions are folded at compile time, under
        // limits of their own: the cases above compute their sizes at render time.)
        let (out, _) = run_limited(
            "{% set n = 1000 %}{{ 'x' * n }}",
            Store::new(Vars::new()),
            &small_limits(),
        )
        .unwrap();
        assert_eq!(out.len(), 1000);
        // Widths have a cap of their own, below the string limit.
        assert_eq!(
            limited_err("{{ 'x'|center(10**10) }}").detail(),
            Some("center(): width 10000000000 exceeds the limit of 10000")
        );
        assert_eq!(
            limited_err("{{ 'x'|center(5000) }}").detail(),
            Some("a string of 5000 bytes exceeds the limit of 1000 bytes")
        );
        // A constant too big to fold at compile time is computed, and refused, at render
        // time.
        let err = run_limited(
            "{{ 'x' * 100000 }}",
            Store::new(Vars::new()),
            &Limits::default(),
        );
        assert_eq!(err.map(|(out, _)| out.len()).ok(), Some(100_000));
        let err = limited_err("{{ 'x' * 100000 }}");
        assert_eq!(err.kind(), ErrorKind::ValueTooLarge);
    }

    #[test]
    fn env_value_limits_stop_deep_nesting() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let (out, _) = run_limited(
            &format!("{{{{ {} }}}}", deep(8)),
            Store::new(Vars::new()),
            &small_limits(),
        )
        .unwrap();
        assert_eq!(out, deep(8));
        let cases = [
            format!("{{{{ {} }}}}", deep(9)),
            format!("{{{{ {{'a': {}}} }}}}", deep(8)),
            format!("{{{{ ({},) }}}}", deep(8)),
            "{% set ns = namespace(v=[]) %}{% for i in range(100) %}{% set ns.v = [ns.v] %}{% endfor %}".into(),
            "{% set ns = namespace(v=[1]) %}{% for i in range(100) %}{% set ns.v = ns.v|batch(1)|list %}{% endfor %}".into(),
            "{% set ns = namespace(v={'a': 1}) %}{% for i in range(100) %}{% set ns.v = dict(a=ns.v) %}{% endfor %}".into(),
            "{% set ns = namespace(v=[]) %}{% for i in range(100) %}{% set ns.v = [ns.v] + [] %}{% endfor %}".into(),
            "{% set ns = namespace(v=[]) %}{% for i in range(100) %}{% set ns.v = [ns.v]|list %}{% endfor %}".into(),
            "{% set ns = namespace(v=[]) %}{% for i in range(100) %}{{ set_context('v', [get_context('v', [])]) }}{% endfor %}".into(),
        ];
        for source in &cases {
            let err = limited_err(source);
            assert_eq!(err.kind(), ErrorKind::ValueTooLarge, "{source}: {err:#}");
            assert!(
                err.detail().unwrap_or_default().contains("8 levels"),
                "{source}: {err:#}"
            );
        }
    }

    #[test]
    fn env_values_cannot_form_cycles() {
        let cases = [
            "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
            "{% set ns = namespace() %}{% set ns.l = [ns] %}{{ ns }}",
            "{% set ns = namespace() %}{{ [ns] }}",
            "{% set a = namespace() %}{% set b = namespace() %}{% set a.b = b %}{% set b.a = a %}{{ a }}",
        ];
        for source in cases {
            let err = limited_err(source);
            assert!(
                format!("{err:#}").contains("namespace() cannot be stored"),
                "{source}: {err:#}"
            );
        }
        // The live `context` view is frozen when stored on its own, refused inside
        // another value, so the store never holds itself.
        let store = Store::new(Vars::new());
        let (out, _) = run_limited(
            "{{ set_context('saved', context) }}{{ set_context('n', 1) }}{{ saved.n is defined }}",
            store.clone(),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(out, "False");
        let err = run_limited(
            "{{ set_context('saved', [context]) }}",
            store,
            &Limits::default(),
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("live `context` view"),
            "{err:#}"
        );
    }

    #[test]
    fn env_fuel_stops_runaway_loops() {
        let source =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let e = run(source, json!({})).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfFuel, "{e}");
        // range() on its own refuses absurd sizes.
        assert!(run("{% for i in range(100000000) %}{% endfor %}", json!({})).is_err());
        // A small budget applies per render.
        let limits = Limits {
            fuel: 50,
            ..Limits::default()
        };
        let store = Store::new(Vars::new());
        let e = run_limited("{% for i in range(1000) %}{% endfor %}", store, &limits).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfFuel);
    }

    #[test]
    fn env_recursion_limit() {
        let source = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        let e = run(source, json!({})).unwrap_err();
        assert!(e.to_string().contains("recursion limit exceeded"), "{e}");
        // The limit counts in minijinja's units: a macro call costs about 6, so the
        // default of 200 allows about 30 nested calls.
        let nested = |n: usize| {
            format!(
                "{{% macro f(n) %}}{{% if n > 0 %}}{{{{ f(n - 1) }}}}{{% else %}}done{{% endif %}}\
                 {{% endmacro %}}{{{{ f({n}) }}}}"
            )
        };
        assert_eq!(ok(&nested(25), json!({})), "done");
        assert!(run(&nested(40), json!({})).is_err());
        let limits = Limits {
            recursion: 500,
            ..Limits::default()
        };
        let (out, _) = run_limited(&nested(50), Store::new(Vars::new()), &limits).unwrap();
        assert_eq!(out, "done");
    }

    #[test]
    fn env_jinja2_idioms() {
        let vars = json!({
            "items": [{"name": "a", "ok": true}, {"name": "b", "ok": false}],
            "errors": ["e1", "schema validation failed"],
        });
        let cases = [
            ("{{ items | selectattr('ok') | list | length }}", "1"),
            (
                "{{ items | rejectattr('ok') | map(attribute='name') | join(',') }}",
                "b",
            ),
            (
                "{{ errors | join(' | ') }}",
                "e1 | schema validation failed",
            ),
            (
                "{% for e in errors %}{{ loop.index }}:{{ e | length }} {% endfor %}",
                "1:2 2:24 ",
            ),
            (
                "{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}",
                "1",
            ),
            (
                "{% for i in [1, 2, 3] %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}",
                "13",
            ),
            ("{{ 'schema validation' in errors[1] }}", "True"),
            (
                "{{ 'x' in items[0] }} {{ 'name' in items[0] }}",
                "False True",
            ),
            (
                "{{ [1, 2] | sum }} {{ [[1], [2, 3]] | map('length') | sum }}",
                "3 3",
            ),
            ("{{ items | map(attribute='name') | list }}", "['a', 'b']"),
            (
                "{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
                "3",
            ),
            (
                "{{ (items | first).name }} {{ (items | last).name }}",
                "a b",
            ),
            (
                "{{ [3, 1, 2] | sort }} {{ {'b': 1, 'a': 2} | dictsort }}",
                "[1, 2, 3] [('a', 2), ('b', 1)]",
            ),
            ("{{ 'Hello World' | truncate(8) }}", "Hello World"),
            (
                "{{ 3.14159 | round(2) }} {{ 7 | float }} {{ '42' | int + 1 }}",
                "3.14 7.0 43",
            ),
            ("{{ '%s-%d' | format('a', 3) }}", "a-3"),
            ("{{ [1, none, true] | join(', ') }}", "1, None, True"),
            ("{{ [1.0, 1e20] | join(' ') }}", "1.0 1e+20"),
            ("{{ none | string }} {{ [1] | string }}", "None [1]"),
            (
                "{{ {'a': 'b'} | pprint }} {{ 'x' | pprint }}",
                "{'a': 'b'} 'x'",
            ),
            ("{{ items[-1].name }} {{ 'abcdef'[1:3] }}", "b bc"),
        ];
        for (source, expected) in cases {
            assert_eq!(ok(source, vars.clone()), expected, "{source}");
        }
    }

    /// The §7 patterns of the spec, each rendered against a store that makes its
    /// branches do something.
    fn spec_store() -> Arc<Store> {
        store_from_json(json!({
            "result_tool_calls": [
                {"tool_call_id": "calc_1", "content": "{\"score\": 0.9, \"user\": {\"id\": 7}, \"items\": [1, 2], \"count\": 2}", "with_error": false},
                {"tool_call_id": "api_call_1", "content": "{\"status\": \"ok\", \"data\": {\"items\": [{\"name\": \"first\"}]}}", "with_error": false},
                {"tool_call_id": "api_2", "content": "boom", "with_error": true},
                {"tool_call_id": "process_item_1", "content": "{\"status\": \"failed\", \"item_id\": 11}", "with_error": false},
                {"tool_call_id": "calculate_score", "content": "{\"score\": 0.6}", "with_error": false},
            ],
            "errors": ["schema validation: bad", "tool execution: failed", "provider: 500"],
            "context_history": [],
            "prev_step": "validation",
            "result_text": "an error happened",
            "runs": 1,
            "global_runs": 4,
            "time_elapsed": 10.5,
            "time_elapsed_global": 100.0,
        }))
    }

    fn spec_store_with_history() -> Arc<Store> {
        let store = spec_store();
        store.snapshot();
        store.set("prev_step", Value::from("calc_step"));
        store.set("result_text", Value::from("42"));
        store.snapshot();
        store.set("prev_step", Value::from("validation"));
        store.set("result_text", Value::from("an error happened"));
        store
    }

    fn spec(source: &str) -> (String, Arc<Store>) {
        match run_with(source, spec_store_with_history()) {
            Ok((out, store)) => (squash(&out), store),
            Err(err) => panic!("{source} failed: {err:#}"),
        }
    }

    #[test]
    fn env_spec_7_1_tool_results() {
        let (out, store) = spec(
            r#"{# Iterate over all tool call results #}
{% for tool_call in result_tool_calls %}
  Tool {{ tool_call.tool_call_id }}: {{ tool_call.content }}
  {% if tool_call.with_error %}(ERROR){% endif %}
{% endfor %}

{# Filter successful results #}
{% for tool_call in result_tool_calls if not tool_call.with_error %}
  Success: {{ tool_call.content }}
{% endfor %}

{# Check if any tools failed #}
{% if result_tool_calls | selectattr('with_error') | list %}
  Some tools failed!
{% endif %}

{# Get first result from a specific tool by name #}
{% for tool_call in result_tool_calls %}
  {% if "calc" in tool_call.tool_call_id %}
    First calc result: {{ tool_call.content }}
    {% break %}
  {% endif %}
{% endfor %}

{# Count tool calls by type #}
{{ set_context('api_call_count', 0) }}
{% for tool_call in result_tool_calls %}
  {% if "api" in tool_call.tool_call_id %}
    {{ set_context('api_call_count', api_call_count + 1) }}
  {% endif %}
{% endfor %}
{% if api_call_count > 3 %}
  Too many API calls: {{ api_call_count }}
{% endif %}"#,
        );
        assert!(out.contains("Tool api_2: boom (ERROR)"), "{out}");
        assert_eq!(out.matches("Success:").count(), 4, "{out}");
        assert!(out.contains("Some tools failed!"), "{out}");
        assert_eq!(out.matches("First calc result:").count(), 1, "{out}");
        assert_eq!(store.get("api_call_count"), Some(Value::from(2)));
        assert!(!out.contains("Too many"), "{out}");
    }

    #[test]
    fn env_spec_7_2_error_handling() {
        let (out, store) = spec(
            r#"{# Check for errors #}
{% if errors %}
  {{ set_context('next_step', 'error_handler') }}
  Error details: {{ errors | join(" | ") }}
{% endif %}

{# Check for specific error types #}
{% for error in errors %}
  {% if "schema validation" in error %}
    Schema error: {{ error }}
  {% elif "tool execution" in error %}
    Tool error: {{ error }}
  {% elif "provider" in error %}
    Provider error: {{ error }}
  {% endif %}
{% endfor %}

{# Count total errors across workflow #}
{{ set_context('total_errors', context_history | map(attribute='errors') | map('length') | sum) }}
{% if total_errors > 5 %}
  Too many errors: {{ total_errors }}
{% endif %}"#,
        );
        assert!(
            out.contains(
                "Error details: schema validation: bad | tool execution: failed | provider: 500"
            ),
            "{out}"
        );
        assert!(out.contains("Schema error: schema validation: bad Tool error: tool execution: failed Provider error: provider: 500"), "{out}");
        assert!(out.contains("Too many errors: 6"), "{out}");
        assert_eq!(store.get("next_step"), Some(Value::from("error_handler")));
    }

    #[test]
    fn env_spec_7_3_previous_step() {
        let (out, _) = spec(
            r#"{# Check if a specific step was the previous one #}
{% if prev_step == "validation" %}
  Validation step was completed.
{% endif %}

{# Get data from a specific previous step #}
{% for step_context in context_history %}
  {% if step_context.prev_step == "calc_step" %}
    Previous calc result: {{ step_context.result_text }}
    {% break %}
  {% endif %}
{% endfor %}

{# Get execution count for current step #}
Current step retries: {{ runs }}
Total workflow runs: {{ global_runs }}"#,
        );
        assert_eq!(
            out,
            "Validation step was completed. Previous calc result: 42 Current step retries: 1 Total workflow runs: 4"
        );
    }

    #[test]
    fn env_spec_7_4_1_set_context() {
        let (out, store) = spec(
            r#"{# Set variables using set_context function #}
{{ set_context('model', 'gpt-4o') }}
{{ set_context('temperature', 0.7) }}
{{ set_context('customer_name', 'Aron Homberg') }}

{# Works with conditional logic #}
{% if "error" in result_text %}
{{ set_context('next_step', 'error_handler') }}
{% else %}
{{ set_context('next_step', 'continue_processing') }}
{% endif %}

{# Works with computed values #}
{{ set_context('retry_count', runs + 1) }}
{{ set_context('total_errors', context_history | map(attribute='errors') | map('length') | sum) }}"#,
        );
        assert_eq!(out, "");
        assert_eq!(store.get("model"), Some(Value::from("gpt-4o")));
        assert_eq!(store.get("temperature"), Some(Value::from(0.7)));
        assert_eq!(
            store.get("customer_name"),
            Some(Value::from("Aron Homberg"))
        );
        assert_eq!(store.get("next_step"), Some(Value::from("error_handler")));
        assert_eq!(store.get("retry_count"), Some(Value::from(2)));
        assert_eq!(store.get("total_errors"), Some(Value::from(6)));
    }

    #[test]
    fn env_spec_7_4_2_get_context() {
        let store = spec_store();
        store.set("current_user", Value::from("ann"));
        store.set("current_score", Value::from(5));
        store.set("items", Value::from(vec!["x", "y"]));
        let (out, store) = run_with(
            r#"{# Access variables set earlier with safe defaults #}
{{ get_context('user_name', 'Guest') }}
{{ get_context('retry_count', 0) }}

{# Use in calculations and conditionals #}
{{ set_context('total_retries', get_context('retry_count', 0) + 1) }}
{% if get_context('error_count', 0) > 3 %}
  {{ set_context('next_step', 'error_handler') }}
{% endif %}

{# Build complex data structures #}
{{ set_context('user_list', get_context('user_list', []) + [get_context('current_user', 'unknown')]) }}
{{ set_context('score_total', get_context('score_total', 0) + get_context('current_score', 0)) }}

{# Safe access prevents undefined variable errors #}
{% for item in get_context('items', []) %}
  Processing: {{ item }}
{% endfor %}
{{ user_list[0] }}"#,
            store,
        )
        .unwrap();
        assert_eq!(squash(&out), "Guest 0 Processing: x Processing: y ann");
        assert_eq!(store.get("total_retries"), Some(Value::from(1)));
        assert_eq!(store.get("next_step"), None);
        assert_eq!(store.get("user_list"), Some(Value::from(vec!["ann"])));
        assert_eq!(store.get("score_total"), Some(Value::from(5)));
    }

    #[test]
    fn env_spec_7_4_3_accumulators() {
        let (out, store) = spec(
            r#"{# Increment a counter (defaults to 0 if variable doesn't exist) #}
{{ inc_context('counter') }}
{{ inc_context('retry_count') }}

{# Add values to variables with default initialization #}
{{ add_context('total', 10) }}        {# total starts at 0, becomes 10 #}
{{ add_context('total', 5) }}         {# total becomes 15 #}

{# String concatenation #}
{{ add_context('message', 'Hello', '') }}  {# Initialize with empty string #}
{{ add_context('message', ' World') }}      {# message becomes "Hello World" #}

{# List accumulation #}
{{ add_context('items', [1, 2], []) }}     {# Initialize with empty list #}
{{ add_context('items', [3, 4]) }}         {# items becomes [1, 2, 3, 4] #}

{# Use in loops for sum calculations #}
{% for number in [10, 20, 30, 40, 50] %}
  {{ add_context('sum', number) }}
{% endfor %}
{# sum will be 150 #}
{{ sum }} {{ items }} {{ message }} {{ total }} {{ counter }}"#,
        );
        assert_eq!(out, "150 [1, 2, 3, 4] Hello World 15 1");
        assert_eq!(store.get("sum"), Some(Value::from(150)));
        assert_eq!(store.get("items"), Some(Value::from(vec![1, 2, 3, 4])));
        assert_eq!(store.get("retry_count"), Some(Value::from(1)));
    }

    #[test]
    fn env_spec_7_4_3_process_loop() {
        let pre = r#"{% if get_context('items') is none %}
{{ set_context('items', [1, 2, 3, 4, 5]) }}
{{ set_context('index', 0) }}
{% endif %}
{{ inc_context('processed_count') }}
{{ add_context('running_total', get_context('items', [])[get_context('index', 0)]) }}
{{ inc_context('index') }}"#;
        let post = r#"{% if get_context('index', 0) < get_context('items', [])|length %}
{{ set_context('next_step', 'process_loop') }}
{% endif %}"#;
        let store = Store::new(Vars::new());
        let mut rounds = 0;
        loop {
            rounds += 1;
            store.set("next_step", Value::from("return"));
            run_with(pre, store.clone()).unwrap();
            run_with(post, store.clone()).unwrap();
            if store.get("next_step") != Some(Value::from("process_loop")) || rounds > 10 {
                break;
            }
        }
        assert_eq!(rounds, 5);
        assert_eq!(store.get("running_total"), Some(Value::from(15)));
        assert_eq!(store.get("processed_count"), Some(Value::from(5)));
    }

    #[test]
    fn env_spec_7_4_4_json_paths() {
        let (out, store) = spec(
            r#"{# Set up test data and extract values #}
{{ set_context('test_data', {"user": {"name": "Alice", "items": [1, 2, 3]}}) }}
{{ set_context('user_id', get_json_path(test_data, "user.id", "unknown")) }}
{{ set_context('items', get_json_path(test_data, "items")) }}
{{ set_context('count', get_json_path(test_data, "count", 0)) }}
{{ user_id }} {{ items }} {{ count }} {{ get_json_path(test_data, "user.items.1") }}

{# Extract data from tool results #}
{% for tool_call in result_tool_calls if not tool_call.with_error %}
  {{ set_context('user_id', get_json_path(tool_call.content, "user.id", "unknown")) }}
  {{ set_context('items', get_json_path(tool_call.content, "items")) }}
  {{ set_context('count', get_json_path(tool_call.content, "count", 0)) }}
  
  User: {{ user_id }}, Items: {{ items | length if items is not none else 0 }}, Count: {{ count }}
{% endfor %}

{# Extract data from specific tool results #}
{% for tool_call in result_tool_calls %}
  {% if "api_call" in tool_call.tool_call_id and not tool_call.with_error %}
    {{ set_context('status', get_json_path(tool_call.content, "status")) }}
    {{ set_context('data', get_json_path(tool_call.content, "data.items.0.name")) }}
    API Status: {{ status }}, First Item: {{ data }}
  {% endif %}
{% endfor %}"#,
        );
        assert!(out.starts_with("unknown None 0 2 "), "{out}");
        assert!(out.contains("User: 7, Items: 2, Count: 2"), "{out}");
        assert!(out.contains("User: unknown, Items: 0, Count: 0"), "{out}");
        assert!(out.contains("API Status: ok, First Item: first"), "{out}");
        assert_eq!(store.get("data"), Some(Value::from("first")));
    }

    #[test]
    fn env_spec_7_4_4_verbatim_items_length() {
        // Verbatim, the snippet prints `items | length` for every successful tool call;
        // with a result that has no `items` that is `None | length`, an error in Jinja2
        // too. With `items` everywhere it renders.
        let store = store_from_json(json!({
            "result_tool_calls": [
                {"tool_call_id": "a", "content": {"user": {"id": 1}, "items": [1], "count": 3}, "with_error": false},
            ],
        }));
        let (out, _) = run_with(
            r#"{% for tool_call in result_tool_calls if not tool_call.with_error %}
  {{ set_context('user_id', get_json_path(tool_call.content, "user.id", "unknown")) }}
  {{ set_context('items', get_json_path(tool_call.content, "items")) }}
  {{ set_context('count', get_json_path(tool_call.content, "count", 0)) }}
  
  User: {{ user_id }}, Items: {{ items | length }}, Count: {{ count }}
{% endfor %}"#,
            store,
        )
        .unwrap();
        assert_eq!(squash(&out), "User: 1, Items: 1, Count: 3");
    }

    #[test]
    fn env_spec_7_5_control_flow() {
        let (out, store) = spec(
            r#"{# Error-first decision making #}
{% if errors %}
  {{ set_context('next_step', 'error_handler') }}
{% elif time_elapsed > 5000 %}
  {{ set_context('next_step', 'timeout_handler') }}
{% elif runs > 3 %}
  {{ set_context('next_step', 'retry_limit_reached') }}
{% else %}
  {{ set_context('next_step', 'continue_processing') }}
{% endif %}

{# Complex scoring logic using tool results #}
{% for tool_call in result_tool_calls %}
  {% if "calculate_score" in tool_call.tool_call_id and not tool_call.with_error %}
    {{ set_context('score', get_json_path(tool_call.content, "score", 0)) }}
    {% if score > 0.8 %}
      {{ set_context('next_step', 'finalize') }}
    {% elif score > 0.5 and runs < 3 %}
      {{ set_context('next_step', 'refine') }}
    {% else %}
      {{ set_context('next_step', 'manual_review') }}
    {% endif %}
    {% break %}
  {% endif %}
{% endfor %}

{# Circuit breaker with global error tracking #}
{{ set_context('global_errors', context_history | map(attribute='errors') | map('length') | sum) }}
{% if global_errors > 10 %}
  Global error threshold exceeded: {{ global_errors }}
  {{ set_context('next_step', 'return') }}
{% elif time_elapsed_global > 30000 %}
  Workflow timeout exceeded
  {{ set_context('next_step', 'return') }}
{% endif %}

{# Batch processing with JSON extraction #}
{{ set_context('failed_items', []) }}
{% for tool_call in result_tool_calls %}
  {% if "process_item" in tool_call.tool_call_id %}
    {{ set_context('status', get_json_path(tool_call.content, "status")) }}
    {{ set_context('item_id', get_json_path(tool_call.content, "item_id")) }}
    {% if status == "failed" %}
      {{ set_context('failed_items', failed_items + [item_id]) }}
    {% endif %}
  {% endif %}
{% endfor %}

{% if failed_items | length > 0 %}
  {{ set_context('next_step', 'retry_failed') }}
  {{ set_context('retry_items', failed_items) }}
{% else %}
  {{ set_context('next_step', 'summary') }}
{% endif %}"#,
        );
        assert_eq!(out, "");
        assert_eq!(store.get("score"), Some(Value::from(0.6)));
        assert_eq!(store.get("global_errors"), Some(Value::from(6)));
        assert_eq!(store.get("next_step"), Some(Value::from("retry_failed")));
        assert_eq!(store.get("retry_items"), Some(Value::from(vec![11])));
    }

    #[test]
    fn env_spec_7_5_iterations() {
        let pre = r#"{% if get_context('counter') is none %}
  {{ set_context('counter', 0) }}
  {{ set_context('max_iterations', 3) }}
{% endif %}"#;
        let prompt = "Iteration {{ get_context('counter', 0) + 1 }}";
        let post = r#"{{ set_context('counter', get_context('counter', 0) + 1) }}
{% if get_context('counter', 0) < get_context('max_iterations', 3) %}
  {{ set_context('next_step', 'iterate') }}
{% else %}
  {{ set_context('next_step', 'complete') }}
{% endif %}"#;
        let complete = "Completed {{ get_context('counter', 0) }} iterations";
        let store = Store::new(Vars::new());
        let mut prompts = Vec::new();
        for _ in 0..10 {
            run_with(pre, store.clone()).unwrap();
            prompts.push(run_with(prompt, store.clone()).unwrap().0);
            run_with(post, store.clone()).unwrap();
            if store.get("next_step") != Some(Value::from("iterate")) {
                break;
            }
        }
        assert_eq!(prompts, ["Iteration 1", "Iteration 2", "Iteration 3"]);
        assert_eq!(store.get("next_step"), Some(Value::from("complete")));
        assert_eq!(
            run_with(complete, store).unwrap().0,
            "Completed 3 iterations"
        );
    }
}
