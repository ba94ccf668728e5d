//! Stage 2: build the syntax tree from classified lines.
//!
//! Two chumsky parsers: one over the line tokens for the file's structure (preamble,
//! phases, sections), and one over the characters of a heading line. Parsing never fails:
//! an invalid heading is kept in the tree (with `parsed: None`) next to its diagnostic, so
//! later stages still see every phase.

use aplc_vm::bundle::Role;
use chumsky::input::{Input as _, Stream};
use chumsky::prelude::*;

use crate::ast::{File, Heading, Phase, PhaseHeader, RoleLine, Section};
use crate::diagnostic::{Code, Diagnostic, Span};
use crate::heading::{PHASES, heading_grammar};
use crate::lexer::{Line, LineKind};

/// Parses classified lines into a [`File`].
pub(crate) fn parse<'src>(
    source: &'src str,
    lines: Vec<Line<'src>>,
) -> (File<'src>, Vec<Diagnostic>) {
    let mut lines = lines;
    let mut diagnostics = roles_before_first_phase(&mut lines);
    let eoi = SimpleSpan::from(source.len()..source.len());
    let tokens = Stream::from_iter(lines.into_iter().map(|l| {
        let span = SimpleSpan::from(l.span.range());
        (l, span)
    }))
    .map(eoi, |(l, s): (Line<'src>, SimpleSpan)| (l, s));

    let (raw, errors) = structure().parse(tokens).into_output_errors();
    diagnostics.extend(errors.into_iter().map(|e| {
        // The structure grammar accepts every sequence of lines; this is a safety net.
        Diagnostic::error(
            Code::InvalidStepHeading,
            e.to_string(),
            Span::new(e.span().start, e.span().end),
        )
    }));

    let Some((preamble, raw_phases)) = raw else {
        return (
            File {
                preamble: Span::new(0, source.len()),
                phases: Vec::new(),
            },
            diagnostics,
        );
    };

    let mut phases = Vec::with_capacity(raw_phases.len());
    for (heading_line, first, rest) in raw_phases {
        let heading = phase_heading(heading_line, &mut diagnostics);
        let body_start = heading_line.span.end;
        let mut sections = vec![Section {
            heading: None,
            body: lines_span(&first, body_start),
        }];
        let mut body_end = sections[0].body.end;
        for (role_line, body) in rest {
            let section = Section {
                heading: Some(RoleLine {
                    span: Span::new(
                        role_line.span.start,
                        role_line.span.start + role_line.text.len(),
                    ),
                    text: role_line.text,
                    role: role_heading(role_line.text),
                }),
                body: lines_span(&body, role_line.span.end),
            };
            body_end = section.body.end;
            sections.push(section);
        }
        phases.push(Phase {
            heading,
            body: Span::new(body_start, body_end),
            sections,
        });
    }
    (
        File {
            preamble: lines_span(&preamble, 0),
            phases,
        },
        diagnostics,
    )
}

type RawSection<'src> = (Line<'src>, Vec<Line<'src>>);
type RawPhase<'src> = (Line<'src>, Vec<Line<'src>>, Vec<RawSection<'src>>);
type RawFile<'src> = (Vec<Line<'src>>, Vec<RawPhase<'src>>);

/// `file := text* (phase_heading text* (role_heading text*)*)*`
fn structure<'src, I>() -> impl Parser<'src, I, RawFile<'src>, extra::Err<Rich<'src, Line<'src>>>>
where
    I: chumsky::input::ValueInput<'src, Token = Line<'src>, Span = SimpleSpan>,
{
    let text = select! { l @ Line { kind: LineKind::Text, .. } => l };
    let phase_line = select! { l @ Line { kind: LineKind::PhaseHeading, .. } => l };
    let role_line = select! { l @ Line { kind: LineKind::RoleHeading, .. } => l };
    let lines = text.repeated().collect::<Vec<_>>();
    let section = role_line.then(lines);
    let phase = phase_line
        .then(lines)
        .then(section.repeated().collect::<Vec<_>>())
        .map(|((h, first), rest)| (h, first, rest));
    lines
        .then(phase.repeated().collect::<Vec<_>>())
        .then_ignore(end())
}

/// A role heading before the first phase heading (`## system` in a file that forgot its
/// `# prompt:` line) belongs to no phase. One error at the first such line says so
/// (APL0020); every such line becomes text, so the structure parses and no parser
/// internals reach the user. `lib.rs` drops the follow-on "text before the first step"
/// and "no steps" errors.
fn roles_before_first_phase(lines: &mut [Line<'_>]) -> Vec<Diagnostic> {
    let mut first = None;
    for line in lines.iter_mut() {
        match line.kind {
            LineKind::PhaseHeading => break,
            LineKind::RoleHeading => {
                first.get_or_insert((line.text, line.span.start));
                line.kind = LineKind::Text;
            }
            _ => {}
        }
    }
    let Some((text, start)) = first else {
        return Vec::new();
    };
    let heading = text.trim_end();
    let span = Span::new(start, start + heading.len());
    let message = match role_heading(text) {
        Some(role) => format!("role heading `## {}` outside any phase", role.as_str()),
        None => format!("`{heading}` before the first phase heading"),
    };
    vec![
        Diagnostic::error(Code::RoleHeadingBeforePhase, message, span)
            .with_label_message("role sections belong inside a `# prompt:` phase")
            .with_note("an APL file is a list of steps; each starts with a phase heading such as `# prompt: answer`, and the prompt's `## system` / `## user` sections go below it")
            .with_help("add a phase heading above this line, e.g. `# prompt: answer`"),
    ]
}

/// The span covered by `lines`, or an empty span at `at` when there are none.
fn lines_span(lines: &[Line<'_>], at: usize) -> Span {
    match (lines.first(), lines.last()) {
        (Some(first), Some(last)) => Span::new(first.span.start, last.span.end),
        _ => Span::new(at, at),
    }
}

/// Parses and checks a phase heading line, reporting what is wrong with it.
fn phase_heading<'src>(line: Line<'src>, diagnostics: &mut Vec<Diagnostic>) -> Heading<'src> {
    let text = line.text;
    let base = line.span.start;
    let span = Span::new(base, base + text.len());
    let invalid = |reason: &str, at: Span| {
        Diagnostic::error(
            Code::InvalidStepHeading,
            format!("Invalid step heading: {}", text.trim_end()),
            at,
        )
        .with_label_message(reason.to_string())
    };
    let heading = |parsed| Heading { span, parsed };

    if let Some(pos) = find_jinja(text) {
        // Underline the whole Jinja construct when it is closed on this line.
        let close = match &text[pos..pos + 2] {
            "{{" => "}}",
            "{%" => "%}",
            _ => "#}",
        };
        let end = text[pos + 2..]
            .find(close)
            .map(|i| pos + 2 + i + 2)
            .unwrap_or(pos + 2);
        let at = Span::new(base + pos, base + end);
        diagnostics.push(
            invalid("headings cannot contain Jinja", at)
                .with_note("step identifiers are fixed at build time; set `next_step` in a post phase to choose steps at run time"),
        );
        return heading(None);
    }

    let raw = match heading_grammar().parse(text).into_result() {
        Ok(raw) => raw,
        Err(errors) => {
            let at = errors
                .first()
                .map(|e| {
                    Span::new(
                        base + e.span().start,
                        base + e.span().end.max(e.span().start + 1),
                    )
                })
                .unwrap_or(span);
            if !starts_with_phase_keyword(text) {
                diagnostics.push(not_a_phase(text, span, invalid));
                return heading(None);
            }
            diagnostics.push(
                invalid(
                    "expected `:` after the phase keyword",
                    at.cover(Span::new(at.start, at.start + 1)),
                )
                .with_help(
                    "write the heading as `# <phase>: <step name>`, e.g. `# prompt: summarize`",
                ),
            );
            return heading(None);
        }
    };

    let Some((word, word_span)) = raw.keyword else {
        diagnostics
            .push(invalid("expected `pre`, `prompt` or `post`", span).with_help(LITERAL_HELP));
        return heading(None);
    };
    let word_span = Span::new(base + word_span.start, base + word_span.end);
    let Some(kind) = PHASES
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(word))
        .map(|&(_, kind)| kind)
    else {
        let mut diag = invalid(
            &format!("expected `pre`, `prompt` or `post`, found `{word}`"),
            word_span,
        );
        diag = match suggest(word, PHASES.iter().map(|(k, _)| *k)) {
            Some(s) => diag.with_did_you_mean(s, word_span, s),
            // Not a typo of a phase: most likely a Markdown title such as `# Introduction`.
            None => not_a_phase(text, span, invalid),
        };
        diagnostics.push(diag);
        return heading(None);
    };

    let name = match raw.name {
        None => None,
        Some((rest, rest_span)) => {
            let trimmed = rest.trim();
            if trimmed.is_empty() {
                None
            } else {
                let lead = rest.len() - rest.trim_start().len();
                let start = base + rest_span.start + lead;
                let name_span = Span::new(start, start + trimmed.len());
                if let Some(bad) = trimmed
                    .chars()
                    .find(|c| matches!(c, '#' | ':') || c.is_control())
                {
                    let what = match bad {
                        '#' => "`#`".to_string(),
                        ':' => "`:`".to_string(),
                        c => format!("the control character U+{:04X}", c as u32),
                    };
                    diagnostics.push(invalid(
                        &format!("step identifiers cannot contain {what}"),
                        name_span,
                    ));
                    return heading(None);
                }
                Some((trimmed, name_span))
            }
        }
    };
    heading(Some(PhaseHeader { kind, name }))
}

/// True when the first word after `#` is `pre`, `prompt` or `post` (any case).
fn starts_with_phase_keyword(text: &str) -> bool {
    let word: String = text
        .trim_start_matches('#')
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    PHASES.iter().any(|(k, _)| k.eq_ignore_ascii_case(&word))
}

/// A level-1 line that is no phase heading at all, such as a Markdown title
/// (`# Support agent`): say what a phase heading is, and how to keep a title (§1.3).
fn not_a_phase(text: &str, span: Span, invalid: impl Fn(&str, Span) -> Diagnostic) -> Diagnostic {
    let title = text.trim_start_matches('#').trim();
    invalid("this is not a phase heading", span)
        .with_note("a `#` at the start of a line begins a phase: `# pre: <step>`, `# prompt: <step>` or `# post: <step>`")
        .with_help(format!(
            "for a title or a comment, write `{{# {title} #}}`, or indent the line so that it stays text (§1.3)"
        ))
}

const LITERAL_HELP: &str = "a `#` at column 0 starts a phase; to keep this line as text, indent it or put it in a code fence";

/// The role a `##` line names, if it is `## <role>` with optional trailing colons and spaces.
fn role_heading(text: &str) -> Option<Role> {
    let rest = text.strip_prefix("##")?;
    let word = rest
        .trim()
        .trim_end_matches(|c: char| c == ':' || c.is_whitespace());
    Role::ALL
        .into_iter()
        .find(|r| r.as_str().eq_ignore_ascii_case(word))
}

/// The byte offset of the first Jinja delimiter in `text`.
pub(crate) fn find_jinja(text: &str) -> Option<usize> {
    ["{{", "{%", "{#"].iter().filter_map(|d| text.find(d)).min()
}

/// The candidate closest to `word`, if it is close enough to be a likely typo.
pub(crate) fn suggest<'a>(
    word: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    // Case-insensitive, so that `finish` suggests `Finish` (distance 0).
    let lower = word.to_lowercase();
    candidates
        .filter(|&c| c != word)
        .map(|c| (strsim::damerau_levenshtein(&lower, &c.to_lowercase()), c))
        .filter(|&(d, c)| d <= 2.min(c.len() / 2).max(1))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::PhaseKind;
    use crate::lexer::lex;

    fn parse_src(src: &str) -> (File<'_>, Vec<Diagnostic>) {
        let (lines, _) = lex(src);
        parse(src, lines)
    }

    fn header(src: &str) -> Option<(PhaseKind, Option<String>)> {
        let (file, _) = parse_src(src);
        let h = file.phases[0].heading.parsed?;
        Some((h.kind, h.name.map(|(n, _)| n.to_string())))
    }

    #[test]
    fn heading_variants() {
        assert_eq!(
            header("# prompt: a\n"),
            Some((PhaseKind::Prompt, Some("a".into())))
        );
        assert_eq!(
            header("#PROMPT :  x y \n"),
            Some((PhaseKind::Prompt, Some("x y".into())))
        );
        assert_eq!(header("#  Pre:x"), Some((PhaseKind::Pre, Some("x".into()))));
        assert_eq!(header("# post:"), Some((PhaseKind::Post, None)));
        assert_eq!(header("# prompt"), Some((PhaseKind::Prompt, None)));
        assert_eq!(header("# prompt:   \n"), Some((PhaseKind::Prompt, None)));
    }

    #[test]
    fn invalid_headings() {
        for src in [
            "# prompt: {{ x }}\n",
            "# promt: a\n",
            "# Introduction\n",
            "# prompt: a:b\n",
            "# prompt: a # b\n",
            "# prompt foo\n",
            "#\n",
        ] {
            let (file, diags) = parse_src(src);
            assert!(file.phases[0].heading.parsed.is_none(), "{src}");
            assert_eq!(diags.len(), 1, "{src}");
            assert!(
                diags[0].message.starts_with("Invalid step heading: "),
                "{src}"
            );
        }
    }

    #[test]
    fn typo_gets_a_suggestion() {
        let (_, diags) = parse_src("# promt: a\n");
        assert_eq!(diags[0].help.as_deref(), Some("did you mean `prompt`?"));
    }

    #[test]
    fn role_heading_before_any_phase_is_one_error() {
        let (file, diags) = parse_src("## system\nbe kind\n## user\nhi\n");
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].code, Code::RoleHeadingBeforePhase);
        assert_eq!(diags[0].span(), Span::new(0, 9));
        assert!(file.phases.is_empty());
        let (_, diags) = parse_src("# prompt: a\n## system\nx\n");
        assert!(diags.is_empty());
    }

    #[test]
    fn titles_are_not_phase_headings() {
        for src in ["# Support agent\n", "# Introduction\n"] {
            let (_, diags) = parse_src(src);
            assert_eq!(
                diags[0].labels[0].message, "this is not a phase heading",
                "{src}"
            );
            assert!(
                diags[0].help.as_deref().unwrap_or("").contains("{#"),
                "{src}"
            );
        }
        // A phase keyword without its colon keeps the precise message.
        let (_, diags) = parse_src("# prompt foo\n");
        assert_eq!(
            diags[0].labels[0].message,
            "expected `:` after the phase keyword"
        );
    }

    #[test]
    fn sections_split_at_role_lines() {
        let src = "intro\n# prompt: a\nfirst\n## System:\nsys\n## nope\nx\n# post: a\n";
        let (file, diags) = parse_src(src);
        assert!(diags.is_empty());
        assert_eq!(&src[file.preamble.range()], "intro\n");
        let p = &file.phases[0];
        assert_eq!(p.sections.len(), 3);
        assert_eq!(&src[p.sections[0].body.range()], "first\n");
        assert_eq!(p.sections[1].heading.unwrap().role, Some(Role::System));
        assert_eq!(&src[p.sections[1].body.range()], "sys\n");
        assert_eq!(p.sections[2].heading.unwrap().role, None);
        assert_eq!(&src[p.body.range()], "first\n## System:\nsys\n## nope\nx\n");
        assert_eq!(file.phases[1].body, Span::new(src.len(), src.len()));
    }
}
