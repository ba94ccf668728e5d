//! Unknown functions (APL0022), filters and tests (APL0023): names a template uses that
//! the template environment does not have, so the render would fail when it gets there.
//!
//! What is known is what the shared environment (`aplc_vm::template_env`) registers, the
//! one the VM renders with. minijinja has no public list of an environment's filters and
//! tests, so a name is looked up by rendering a one-expression probe with that
//! environment: only an unknown name fails with `UnknownFilter` / `UnknownTest`.
//! Did-you-mean candidates are Jinja2's built-in names that pass the same probe, so a
//! name is never suggested unless the environment has it.

use std::collections::HashMap;

use aplc_vm::minijinja::{self, ErrorKind};
use aplc_vm::names::{HELPERS, VIEWS, helper};

use crate::diagnostic::{Code, Diagnostic, Span};
use crate::ir::Template;
use crate::parser::suggest;

/// minijinja's filters beyond Jinja2's (`aplc_vm::JINJA2_FILTERS`): suggestion candidates
/// too. Only names the environment has are ever suggested.
const MINIJINJA_FILTERS: &[&str] = &["bool", "lines", "split"];

/// minijinja's tests beyond Jinja2's (`aplc_vm::JINJA2_TESTS`).
const MINIJINJA_TESTS: &[&str] = &["containing", "endingwith", "safe", "startingwith"];

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Filter,
    Test,
}

/// Looks names up in the environment, remembering the answers.
struct Known<'e> {
    env: &'e minijinja::Environment<'static>,
    cache: HashMap<(Kind, String), bool>,
}

impl Known<'_> {
    fn has(&mut self, kind: Kind, name: &str) -> bool {
        if let Some(&known) = self.cache.get(&(kind, name.to_string())) {
            return known;
        }
        // Names come from minijinja's parser, so they are identifiers: the probe parses.
        let (probe, unknown) = match kind {
            Kind::Filter => (format!("{{{{ none | {name} }}}}"), ErrorKind::UnknownFilter),
            Kind::Test => (format!("{{{{ none is {name} }}}}"), ErrorKind::UnknownTest),
        };
        let known = match self.env.render_str(&probe, ()) {
            Ok(_) => true,
            Err(err) => err.kind() != unknown,
        };
        self.cache.insert((kind, name.to_string()), known);
        known
    }

    fn suggestion(&mut self, kind: Kind, name: &str) -> Option<&'static str> {
        let (jinja2, minijinja) = match kind {
            Kind::Filter => (aplc_vm::JINJA2_FILTERS, MINIJINJA_FILTERS),
            Kind::Test => (aplc_vm::JINJA2_TESTS, MINIJINJA_TESTS),
        };
        // Jinja2's operator spellings of tests (`==`, `<`) are no names a typo is near.
        let mut known: Vec<&'static str> = jinja2
            .iter()
            .chain(minijinja)
            .copied()
            .filter(|c| c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_'))
            .filter(|c| self.has(kind, c))
            .collect();
        // Alphabetical, so a tie between two candidates is broken the same way always.
        known.sort_unstable();
        suggest(name, known.into_iter())
    }
}

/// Reports every unknown function, filter and test.
///
/// `globals` are the environment's global names; `defined` the context variables the
/// file defines (written by a helper, declared inputs): a call of one of those is left
/// alone, as is every call when a helper writes a computed name.
pub(crate) fn check(
    env: &minijinja::Environment<'static>,
    templates: &[Template],
    globals: &[String],
    defined: &[&str],
    diags: &mut Vec<Diagnostic>,
) {
    let mut known = Known {
        env,
        cache: HashMap::new(),
    };
    let any_name = templates.iter().any(|t| t.facts.dynamic_writes);
    for t in templates {
        if !any_name {
            for (name, (start, end)) in &t.facts.calls {
                if globals.iter().any(|g| g == name) || defined.contains(&name.as_str()) {
                    continue;
                }
                // The call starts with the function's name: the edit replaces that.
                let name_end = start + name.len();
                let name_span = (t.source.get(*start..name_end) == Some(name.as_str()))
                    .then(|| t.map.span(*start, name_end));
                let span = t.map.span(*start, *end);
                diags.push(unknown_function(name, span, name_span, globals));
            }
        }
        for (kind, uses) in [
            (Kind::Filter, &t.facts.filters),
            (Kind::Test, &t.facts.tests),
        ] {
            for (name, (start, end)) in uses {
                if known.has(kind, name) {
                    continue;
                }
                let (start, end) = name_span(&t.source, (*start, *end), name, kind);
                let span = t.map.span(start, end);
                let suggestion = known.suggestion(kind, name);
                // The edit only where the span is the name itself, not the fallback of
                // the whole expression.
                let exact = t.source.get(start..end) == Some(name.as_str());
                diags.push(unknown_filter(kind, name, span, suggestion, exact));
            }
        }
    }
}

fn unknown_function(
    name: &str,
    span: Span,
    name_span: Option<Span>,
    globals: &[String],
) -> Diagnostic {
    let diag = Diagnostic::error(
        Code::UnknownFunction,
        format!("Unknown function: {name}"),
        span,
    )
    .with_label_message(format!(
        "no function `{name}` exists, so this call fails when it runs"
    ));
    // The two names newcomers reach for first: Jinja's `{% set %}` statement and a
    // dictionary-style `get`.
    match name {
        "set" => diag
            .with_note("`{% set x = … %}` is a statement, not a function, and what it assigns is local to this phase")
            .with_help("to keep a value for later phases and steps, call `set_context('name', value)`"),
        "get" => diag.with_help(
            "to read a context variable that may be unset, call `get_context('name', default)`",
        ),
        _ => match suggest(name, globals.iter().map(String::as_str)) {
            Some(s) => did_you_mean(diag, s, name_span),
            None => diag.with_note(format!(
                "the functions are the helpers {}, Jinja's globals ({}), and macros defined in the same template",
                backticked(HELPERS.iter().map(|h| h.name)),
                backticked(
                    globals
                        .iter()
                        .map(String::as_str)
                        .filter(|g| helper(g).is_none() && !VIEWS.contains(g))
                ),
            )),
        },
    }
}

/// "did you mean `s`?", with the edit that writes `s` at `at` when the name's own span
/// is known.
fn did_you_mean(diag: Diagnostic, s: &str, at: Option<Span>) -> Diagnostic {
    match at {
        Some(at) => diag.with_did_you_mean(s, at, s),
        None => diag.with_help(format!("did you mean `{s}`?")),
    }
}

/// `a`, `b`, `c`: names as the notes list them.
fn backticked<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown_filter(
    kind: Kind,
    name: &str,
    span: Span,
    suggestion: Option<&str>,
    exact: bool,
) -> Diagnostic {
    let what = match kind {
        Kind::Filter => "filter",
        Kind::Test => "test",
    };
    let diag = Diagnostic::error(Code::UnknownFilter, format!("Unknown {what}: {name}"), span)
        .with_label_message(format!(
            "no {what} `{name}` exists, so the render fails when it gets here"
        ));
    match suggestion {
        Some(s) => did_you_mean(diag, s, exact.then_some(span)),
        None => diag.with_note(format!(
            "APL templates have Jinja2's built-in {what}s; extensions such as Ansible's are not available"
        )),
    }
}

/// The span of `name` inside the filter or test expression at `span`: its first
/// occurrence as a whole word after `|` (filter), `filter` (a filter block) or `is`
/// (test). The whole expression when it cannot be found.
fn name_span(source: &str, span: (usize, usize), name: &str, kind: Kind) -> (usize, usize) {
    let Some(text) = source.get(span.0..span.1) else {
        return span;
    };
    let word = |c: char| c.is_alphanumeric() || c == '_';
    for (i, _) in text.match_indices(name) {
        let before = text[..i].trim_end();
        let after = &text[i + name.len()..];
        let fits = match kind {
            Kind::Filter => before.ends_with('|') || before.ends_with("filter"),
            Kind::Test => before.ends_with("is") || before.ends_with("not"),
        };
        if fits && !after.starts_with(word) {
            return (span.0 + i, span.0 + i + name.len());
        }
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use aplc_vm::{Limits, template_env};

    #[test]
    fn probes_follow_the_environment() {
        let env = template_env(&Limits::default());
        let mut known = Known {
            env: &env,
            cache: HashMap::new(),
        };
        for name in ["upper", "truncate", "default", "center", "tojson"] {
            assert!(known.has(Kind::Filter, name), "{name}");
        }
        assert!(!known.has(Kind::Filter, "regex_replace"));
        assert!(known.has(Kind::Test, "defined"));
        assert!(!known.has(Kind::Test, "regex"));
        assert_eq!(known.suggestion(Kind::Filter, "uppper"), Some("upper"));
    }

    #[test]
    fn name_spans() {
        let src = "{{ x | trim | foo(1) }}";
        let (s, e) = name_span(src, (3, 20), "foo", Kind::Filter);
        assert_eq!(&src[s..e], "foo");
        let src = "{{ x is not foo }}";
        let (s, e) = name_span(src, (3, 15), "foo", Kind::Test);
        assert_eq!(&src[s..e], "foo");
    }
}
