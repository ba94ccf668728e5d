//! `human_input` read where no answer can have arrived yet (APL0025).
//!
//! A run stores a person's answer in `human_input` at the end of a step whose phases set
//! `await_input` (`spec/human.md` §1.3): the step *asks*, and the answer is there from
//! the next step on. So a read of `human_input` can see an answer only in a step that a
//! chain of one or more `next_step` jumps leads to from an asking step; a read in the
//! asking step itself sees one only when the step can come round again.
//!
//! Like the other file-level checks, it guesses towards silence: it says nothing when
//! `human_input` comes from elsewhere (a declared input, a template writing it), when any
//! variable is written under a computed name (it may be `await_input`), or when a
//! computed jump out of an asking step, or out of a step reached from one, may lead
//! anywhere.

use aplc_vm::names::{AWAIT_INPUT, HUMAN_INPUT};

use crate::diagnostic::{Code, Diagnostic, Span};
use crate::graph::{CheckedStep, To};
use crate::ir::Template;

/// How many asking steps a note names before it counts the rest.
const MAX_NAMED: usize = 3;

/// Warns once per step that reads `human_input` where no answer can have arrived, at
/// its first read. `inputs` are the variables the caller gives (`{# inputs: … #}`,
/// `Options::inputs`).
pub(crate) fn check(
    steps: &[CheckedStep<'_>],
    templates: &[Template],
    inputs: &[String],
    diags: &mut Vec<Diagnostic>,
) {
    let writes = |name: &str| {
        templates
            .iter()
            .any(|t| t.facts.writes.iter().any(|w| w == name))
    };
    let given = |name: &str| inputs.iter().any(|i| i == name);
    if given(HUMAN_INPUT) || writes(HUMAN_INPUT) || templates.iter().any(|t| t.facts.dynamic_writes)
    {
        return;
    }
    let mut asks = vec![false; steps.len()];
    for t in templates.iter().filter(|t| writes_await_input(t)) {
        if let Some(slot) = asks.get_mut(t.step) {
            *slot = true;
        }
    }
    // An `await_input` passed in by the caller makes the entry step ask when it ends.
    if given(AWAIT_INPUT)
        && let Some(entry) = asks.first_mut()
    {
        *entry = true;
    }
    let Some(answered) = answered(steps, &asks) else {
        return;
    };
    for (step, span) in first_reads(steps.len(), templates) {
        if !answered[step] {
            diags.push(diagnostic(steps, &asks, step, span));
        }
    }
}

fn writes_await_input(template: &Template) -> bool {
    template.facts.writes.iter().any(|w| w == AWAIT_INPUT)
}

/// For each step, whether one or more jumps lead to it from an asking step; `None` when
/// a computed jump on the way may lead to any step.
fn answered(steps: &[CheckedStep<'_>], asks: &[bool]) -> Option<Vec<bool>> {
    let mut reached = vec![false; steps.len()];
    // Steps whose jumps are still to follow: the askers, then each step reached. An
    // asker reached from another is followed twice, which changes nothing.
    let mut stack: Vec<usize> = (0..steps.len()).filter(|&s| asks[s]).collect();
    while let Some(s) = stack.pop() {
        for jump in &steps[s].flow.jumps {
            match jump.to {
                To::Dynamic => return None,
                To::Step(t) if !reached[t] => {
                    reached[t] = true;
                    stack.push(t);
                }
                // `return`, an unknown step (the run fails there), a step seen already.
                _ => {}
            }
        }
    }
    Some(reached)
}

/// The first read of `human_input` in each step that has one: (step, where), in step
/// order. Templates are in source order, so the first found is the first in the file.
fn first_reads(count: usize, templates: &[Template]) -> Vec<(usize, Span)> {
    let mut first: Vec<Option<Span>> = vec![None; count];
    for t in templates {
        let read = t.facts.reads.iter().find(|(name, _)| name == HUMAN_INPUT);
        if let Some((_, (start, end))) = read
            && let Some(slot @ None) = first.get_mut(t.step)
        {
            *slot = Some(t.map.span(*start, *end));
        }
    }
    first
        .into_iter()
        .enumerate()
        .filter_map(|(step, span)| Some((step, span?)))
        .collect()
}

fn diagnostic(steps: &[CheckedStep<'_>], asks: &[bool], step: usize, span: Span) -> Diagnostic {
    let name = steps[step].name;
    let askers: Vec<&str> = (0..steps.len())
        .filter(|&s| asks[s])
        .map(|s| steps[s].name)
        .collect();
    let why = if askers.is_empty() {
        "no phase of the file sets `await_input`, so no step ever asks a person".to_string()
    } else if asks[step] {
        format!(
            "step `{name}` sets `await_input`, but the answer arrives only when the step ends, \
             and no chain of `next_step` jumps leads back to `{name}`"
        )
    } else {
        format!(
            "`await_input` is set in {}, but no chain of `next_step` jumps leads from there to `{name}`",
            named_steps(&askers)
        )
    };
    Diagnostic::warning(
        Code::HumanInputWithoutAwait,
        format!(
            "`human_input` is read in step `{name}`, but no step that sets `await_input` can run before it"
        ),
        span,
    )
    .with_label_message("no answer can have arrived when this runs")
    .with_note(why)
    .with_note(
        "`human_input` holds the answer to the last `await_input` and is undefined until a \
         person answers; printing it, iterating it or reading its attributes fails the render",
    )
    .with_help(
        "set `await_input` in the post phase of a step that jumps here, e.g. \
         `{{ set_context('await_input', 'Approve?') }}` (see spec/human.md); \
         or test it first: `{% if human_input is defined %}`",
    )
}

/// "step `a`", "steps `a`, `b` and `c`", "steps `a`, `b`, `c` and 2 more".
fn named_steps(names: &[&str]) -> String {
    let quoted: Vec<String> = names
        .iter()
        .take(MAX_NAMED)
        .map(|n| format!("`{n}`"))
        .collect();
    let more = names.len().saturating_sub(MAX_NAMED);
    match (quoted.as_slice(), more) {
        ([one], 0) => format!("step {one}"),
        ([rest @ .., last], 0) => format!("steps {} and {last}", rest.join(", ")),
        (all, more) => format!("steps {} and {more} more", all.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::named_steps;
    use crate::{Code, Options, compile};

    /// The messages of the APL0025 warnings of `source`, which must have no errors.
    fn warnings(source: &str, options: &Options) -> Vec<String> {
        let c = compile(source, "a.apl", options);
        assert!(!c.has_errors(), "{:?}", c.diagnostics);
        c.diagnostics
            .iter()
            .filter(|d| d.code == Code::HumanInputWithoutAwait)
            .map(|d| d.message.clone())
            .collect()
    }

    fn count(source: &str) -> usize {
        warnings(source, &Options::default()).len()
    }

    const READ_FIRST: &str = "# prompt: a\n{{ human_input }}\n";

    #[test]
    fn a_read_no_asker_precedes_is_warned_once_per_step() {
        assert_eq!(
            warnings(
                "# prompt: a\n{{ human_input }} {{ human_input }}\n",
                &Options::default()
            ),
            [
                "`human_input` is read in step `a`, but no step that sets `await_input` can run before it"
            ]
        );
        // Tests and guarded reads are not reads.
        assert_eq!(
            count("# prompt: a\n{% if human_input is defined %}{{ human_input }}{% endif %}\n"),
            0
        );
    }

    #[test]
    fn human_input_from_elsewhere_is_never_warned() {
        assert_eq!(
            count(&format!("{{# inputs: human_input #}}\n{READ_FIRST}")),
            0
        );
        let options = Options {
            inputs: vec!["human_input".into()],
            ..Options::default()
        };
        assert!(warnings(READ_FIRST, &options).is_empty());
        // A template writes it.
        assert_eq!(
            count(
                "# pre: a\n{{ set_context('human_input', 1) }}\n# prompt: a\n{{ human_input }}\n"
            ),
            0
        );
        // Any variable written under a computed name may be `await_input`.
        assert_eq!(
            count("# pre: a\n{{ set_context(result_text, 1) }}\n# prompt: a\n{{ human_input }}\n"),
            0
        );
    }

    #[test]
    fn await_input_given_by_the_caller_makes_the_entry_step_ask() {
        let source = "{# inputs: await_input #}\n# prompt: a\nx\n# post: a\n{{ set_context('next_step', 'b') }}\n# prompt: b\n{{ human_input }}\n";
        assert_eq!(count(source), 0);
        // … but the entry step itself still reads before its own answer.
        let source = "{# inputs: await_input #}\n# prompt: a\n{{ human_input }}\n";
        assert_eq!(count(source), 1);
    }

    #[test]
    fn an_ask_in_any_phase_counts() {
        // The machine asks at the end of the step whichever phase set `await_input`.
        let source = "# pre: a\n{{ set_context('await_input', 'q') }}\n# prompt: a\nx\n# post: a\n{{ set_context('next_step', 'b') }}\n# prompt: b\n{{ human_input }}\n";
        assert_eq!(count(source), 0);
    }

    #[test]
    fn a_computed_jump_reached_from_an_asker_silences_the_check() {
        let dynamic = "# prompt: a\nx\n# post: a\n{{ set_context('await_input', 'q') }}{{ set_context('next_step', 'b') }}\n# prompt: b\nx\n# post: b\n{{ set_context('next_step', result_text) }}\n# prompt: c\n{{ human_input }}\n";
        assert_eq!(count(dynamic), 0);
        // A computed jump no asker can reach decides nothing.
        let unrelated = "# prompt: a\n{{ human_input }}\n# post: a\n{{ set_context('next_step', result_text) }}\n# prompt: b\nx\n# post: b\n{{ set_context('await_input', 'q') }}\n";
        assert_eq!(count(unrelated), 1);
    }

    #[test]
    fn the_asker_itself_is_answered_only_if_it_loops() {
        let once =
            "# prompt: a\n{{ human_input }}\n# post: a\n{{ set_context('await_input', 'q') }}\n";
        let why = compile(once, "a.apl", &Options::default()).diagnostics;
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].notes[0].contains("no chain of `next_step` jumps leads back to `a`"));
        let looped = "# prompt: a\n{{ human_input }}\n# post: a\n{{ set_context('await_input', 'q') }}\n{% if runs < 3 %}{{ set_context('next_step', 'a') }}{% endif %}\n";
        assert_eq!(count(looped), 0);
    }

    #[test]
    fn a_defuss_jump_set_before_post_silences_the_check() {
        // defuss-1.1 keeps this jump from `a` to `b`; the step graph does not see it.
        let source = "# pre: a\n{{ set_context('next_step', 'b') }}\n# prompt: a\nx\n# post: a\n{{ set_context('await_input', 'q') }}\n# prompt: b\n{{ human_input }}\n";
        let defuss = Options {
            dialect: aplc_vm::Dialect::Defuss11,
            ..Options::default()
        };
        assert!(warnings(source, &defuss).is_empty());
        let without_jump = source.replacen("next_step", "x", 1);
        assert_eq!(warnings(&without_jump, &defuss).len(), 1);
    }

    #[test]
    fn names_are_listed_briefly() {
        assert_eq!(named_steps(&["a"]), "step `a`");
        assert_eq!(named_steps(&["a", "b"]), "steps `a` and `b`");
        assert_eq!(named_steps(&["a", "b", "c"]), "steps `a`, `b` and `c`");
        assert_eq!(
            named_steps(&["a", "b", "c", "d", "e"]),
            "steps `a`, `b`, `c` and 2 more"
        );
    }
}
