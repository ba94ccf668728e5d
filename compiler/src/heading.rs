//! A heading line's own grammar (one chumsky parser over its characters) and the phase
//! keywords: shared by the lexer (an indented heading stays text, with APL0021), the
//! parser (a heading at column 0) and the lowering (the same hint), so that neither of
//! the first two imports the other.

use chumsky::prelude::*;

use crate::ast::PhaseKind;

/// What a heading line says, before any rule about its meaning is applied.
pub(crate) struct RawHeading<'a> {
    /// The keyword word and its span within the line.
    pub(crate) keyword: Option<(&'a str, SimpleSpan)>,
    /// The text after the colon and its span within the line.
    pub(crate) name: Option<(&'a str, SimpleSpan)>,
}

/// `heading := '#' ws* word? ws* (':' any*)? end`
pub(crate) fn heading_grammar<'a>()
-> impl Parser<'a, &'a str, RawHeading<'a>, extra::Err<Rich<'a, char>>> {
    let ws = one_of(" \t").repeated();
    let word = any()
        .filter(|c: &char| c.is_alphanumeric() || *c == '_')
        .repeated()
        .at_least(1)
        .to_slice()
        .map_with(|w, e| (w, e.span()));
    let name = just(':').ignore_then(any().repeated().to_slice().map_with(|s, e| (s, e.span())));
    just('#')
        .ignore_then(ws)
        .ignore_then(word.or_not())
        .then_ignore(ws)
        .then(name.or_not())
        .then_ignore(end())
        .map(|(keyword, name)| RawHeading { keyword, name })
}

pub(crate) const PHASES: [(&str, PhaseKind); 3] = [
    ("pre", PhaseKind::Pre),
    ("prompt", PhaseKind::Prompt),
    ("post", PhaseKind::Post),
];

/// The phase keyword and step name of a line that would be a valid phase heading were it
/// not indented by one to three spaces (`  # prompt: answer`), for APL0021. Four spaces
/// or a tab make a Markdown code block: clearly text on purpose.
pub(crate) fn indented_phase_heading(text: &str) -> Option<(PhaseKind, &str)> {
    let trimmed = text.trim_start_matches(' ');
    let indent = text.len() - trimmed.len();
    if !(1..=3).contains(&indent) || !trimmed.starts_with('#') || trimmed.starts_with("##") {
        return None;
    }
    let raw = heading_grammar().parse(trimmed).into_output()?;
    let (word, _) = raw.keyword?;
    let kind = PHASES
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(word))
        .map(|&(_, kind)| kind)?;
    let name = raw.name.map_or("", |(n, _)| n.trim());
    Some((kind, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indented_phase_headings() {
        assert_eq!(
            indented_phase_heading("  # prompt: answer"),
            Some((PhaseKind::Prompt, "answer"))
        );
        assert_eq!(
            indented_phase_heading(" #POST:x "),
            Some((PhaseKind::Post, "x"))
        );
        for text in [
            "# prompt: a",
            "    # prompt: code block",
            "\t# prompt: tab",
            "  # A title",
            "  ## user",
            "  # promptly: x",
        ] {
            assert_eq!(indented_phase_heading(text), None, "{text}");
        }
    }
}
