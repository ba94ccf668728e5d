//! Undefined variables (APL0018): reads of context variables that nothing defines.
//!
//! A variable is defined when the executor maintains it (§2.4), it is user-settable
//! (§2.5), it is a helper or a Jinja global (`range`, `namespace`, …), it is declared as
//! a `with_context` input (`{# inputs: … #}` or [`Options::inputs`](crate::Options)),
//! or any template of the file writes it with `set_context`, `add_context` or
//! `inc_context` under a literal name. The order of steps does not matter: a run can
//! visit them in any order. Template-local names (`{% set %}`, loop variables, macro
//! arguments) never reach this check: `analyze.rs` resolves them.
//!
//! When a helper writes a variable under a computed name, any name may be defined, and
//! the check says nothing.

use std::collections::{BTreeMap, HashSet};

use aplc_vm::names::{AGENT_VARIABLES, PAUSE_VARIABLES, RESERVED_VARIABLES, VARIABLES, VIEWS};

use crate::diagnostic::{Code, Diagnostic, Span};
use crate::ir::Template;
use crate::parser::suggest;

/// How many further reads of one variable get a label of their own.
const MAX_SECONDARY: usize = 3;

/// Warns once per undefined variable, at its first read.
///
/// `globals` are the template environment's global names; `inputs` the declared
/// `with_context` variables.
pub(crate) fn check(
    templates: &[Template],
    inputs: &[String],
    globals: &[String],
    diags: &mut Vec<Diagnostic>,
) {
    if templates.iter().any(|t| t.facts.dynamic_writes) {
        return;
    }
    let written: Vec<&str> = templates
        .iter()
        .flat_map(|t| t.facts.writes.iter().map(String::as_str))
        .collect();
    let mut known: HashSet<&str> = HashSet::new();
    known.extend(VARIABLES.iter().map(|v| v.name));
    known.extend(VIEWS);
    known.extend(PAUSE_VARIABLES);
    known.extend(AGENT_VARIABLES);
    known.extend(globals.iter().map(String::as_str));
    known.extend(inputs.iter().map(String::as_str));
    known.extend(written.iter().copied());

    // Name → every read, in source order (templates are in source order).
    let mut undefined: BTreeMap<&str, Vec<Span>> = BTreeMap::new();
    for t in templates {
        for (name, (start, end)) in &t.facts.reads {
            if known.contains(name.as_str()) || RESERVED_VARIABLES.contains(&name.as_str()) {
                continue;
            }
            undefined
                .entry(name.as_str())
                .or_default()
                .push(t.map.span(*start, *end));
        }
    }

    // Suggestions come from the names a user would mean: variables, not functions.
    let candidates: Vec<&str> = VARIABLES
        .iter()
        .map(|v| v.name)
        .chain(VIEWS)
        .chain(PAUSE_VARIABLES)
        .chain(AGENT_VARIABLES)
        .chain(inputs.iter().map(String::as_str))
        .chain(written.iter().copied())
        .collect();
    for (name, spans) in undefined {
        let mut diag = Diagnostic::warning(
            Code::UndefinedVariable,
            format!("Undefined variable: {name}"),
            spans[0],
        )
        .with_label_message(format!("`{name}` is read here, but nothing defines it"));
        for span in spans.iter().skip(1).take(MAX_SECONDARY) {
            diag = diag.with_secondary(*span, "also read here");
        }
        if spans.len() > MAX_SECONDARY + 1 {
            diag = diag.with_note(format!(
                "`{name}` is read {} more times",
                spans.len() - MAX_SECONDARY - 1
            ));
        }
        diag = diag.with_note(
            "no template writes it with `set_context`, `add_context` or `inc_context`, and it is \
             neither an executor variable nor a declared input; printing it, iterating it or \
             reading its attributes fails the render",
        );
        // `{% set x %}` in one phase, `{{ x }}` in another: the newcomer's mistake.
        let set_elsewhere = templates
            .iter()
            .any(|t| t.facts.sets.iter().any(|s| s == name));
        if set_elsewhere {
            diag = diag.with_note(format!(
                "`{{% set {name} = … %}}` is local to the phase that runs it: the variable is gone when that phase ends"
            ));
        }
        diag = match suggest(name, candidates.iter().copied()) {
            _ if set_elsewhere => diag.with_help(format!(
                "to keep the value for later phases and steps, write it with `set_context('{name}', …)`, then read it as `{{{{ {name} }}}}`"
            )),
            // The edit renames the first read, where the warning is.
            Some(s) => diag.with_did_you_mean(s, spans[0], s),
            None => diag.with_help(format!(
                "if `{name}` is passed in with `with_context`, declare it before the first step: `{{# inputs: {name} #}}`; to test whether it is set, use `{name} is defined` or `{name} | default(…)`"
            )),
        };
        diags.push(diag);
    }
}
