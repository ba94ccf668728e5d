//! The reference runtime's words in diagnostics, for programs compiled in its dialect
//! (`spec/dialects.md`). Code written for defuss-apl matches on its validation messages
//! (`"missing required prompt phase" in str(e)`); in the `defuss-1.1` dialect the
//! message of each diagnostic it has a phrase for goes on with that phrase, and the
//! code, spans, labels, notes and help stay aplc's.

use aplc_vm::Dialect;

use crate::diagnostic::{Code, Diagnostic};

/// Adds `dialect`'s phrase to each diagnostic that has one.
pub(crate) fn add(diagnostics: &mut [Diagnostic], source: &str, dialect: Dialect) {
    if dialect != Dialect::Defuss11 {
        return;
    }
    for d in diagnostics.iter_mut() {
        if let Some(phrase) = defuss_phrase(d, source) {
            d.message = format!("{} (defuss-apl: {phrase})", d.message);
        }
    }
}

/// What defuss-apl 1.1.0 says for the problem `d` reports, if it refuses it too.
fn defuss_phrase(d: &Diagnostic, source: &str) -> Option<String> {
    match d.code {
        Code::MissingPrompt => {
            let step = between_backticks(&d.message)?;
            Some(format!("Step '{step}' missing required prompt phase"))
        }
        Code::InvalidStepHeading => heading_phrase(line_at(source, d.span().start)),
        // `# pre: a` twice: defuss-apl sees a second step of the same name.
        Code::PhaseOrder if d.message.contains("more than one `pre` phase") => {
            let step = between_backticks(&d.message)?;
            Some(format!("Duplicate step identifier: {step}"))
        }
        _ => None,
    }
}

/// defuss-apl's phrase for an invalid level-1 heading `# <word>: <name>`: an unknown
/// phase word, or a step name with `#`, `:` or a control character in it. Other
/// invalid headings (Jinja in them, no colon) keep aplc's message alone.
fn heading_phrase(line: &str) -> Option<String> {
    let rest = line.strip_prefix('#')?.trim_start();
    let word_len = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let (word, after) = rest.split_at(word_len);
    let name = after.trim_start().strip_prefix(':')?.trim();
    if word.is_empty() {
        return None;
    }
    let word = word.to_lowercase();
    if !matches!(word.as_str(), "pre" | "prompt" | "post") {
        return Some(format!("Invalid phase: {word}"));
    }
    let invalid_name = name
        .chars()
        .any(|c| matches!(c, '#' | ':') || c.is_control());
    invalid_name.then(|| format!("Invalid step identifier: {name}"))
}

/// The first text in backticks in `message`.
fn between_backticks(message: &str) -> Option<&str> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(&message[start..start + len])
}

/// The line of `source` that holds byte `at`, without its line break.
fn line_at(source: &str, at: usize) -> &str {
    let at = at.min(source.len());
    let start = source[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = source[at..].find('\n').map_or(source.len(), |i| at + i);
    source[start..end].trim_end_matches('\r')
}

#[cfg(test)]
mod tests {
    use super::heading_phrase;

    #[test]
    fn heading_phrases_name_defuss_apl_s_reason() {
        assert_eq!(
            heading_phrase("# setup: a").as_deref(),
            Some("Invalid phase: setup")
        );
        assert_eq!(
            heading_phrase("# prompt: test:invalid").as_deref(),
            Some("Invalid step identifier: test:invalid")
        );
        assert_eq!(heading_phrase("# Introduction"), None);
        assert_eq!(heading_phrase("# prompt: {{ x }}"), None);
        assert_eq!(heading_phrase("#: x"), None);
    }
}
