//! Stage 1: split the source into classified lines.
//!
//! APL's structure is line-based: headings count only at column 0 and outside fenced code
//! blocks (§1.3). The logos lexer produces one token per line (every token ends with its
//! newline, so every token starts at column 0); a second pass then turns every line inside
//! a fenced code block into plain text, so the parser never sees a heading there.

use logos::Logos;

use crate::diagnostic::{Code, Diagnostic, Span};
use crate::heading::indented_phase_heading;

/// The kind of one source line.
#[derive(Logos, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LineKind {
    /// A line starting with exactly one `#`: a phase heading.
    #[regex(r"#[^#\r\n][^\r\n]*\r?\n?", priority = 10, allow_greedy = true)]
    #[regex(r"#\r?\n?", priority = 10)]
    PhaseHeading,
    /// A line starting with exactly `##`: a role heading inside a prompt phase.
    #[regex(r"##[^#\r\n][^\r\n]*\r?\n?", priority = 10, allow_greedy = true)]
    #[regex(r"##\r?\n?", priority = 10)]
    RoleHeading,
    /// A code fence delimiter (up to three spaces, then three or more backticks or tildes).
    #[regex(r" {0,3}(```|~~~)[^\r\n]*\r?\n?", priority = 20, allow_greedy = true)]
    Fence,
    /// Anything else.
    #[regex(r"[^\r\n]*\r?\n", priority = 1, allow_greedy = true)]
    #[regex(r"[^\r\n]+", priority = 1, allow_greedy = true)]
    #[regex(r"\r", priority = 1)]
    Text,
}

/// One classified line. `span` includes the line break; `text` does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Line<'src> {
    pub kind: LineKind,
    pub span: Span,
    pub text: &'src str,
}

impl std::fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            LineKind::PhaseHeading => write!(f, "phase heading `{}`", self.text),
            LineKind::RoleHeading => write!(f, "role heading `{}`", self.text),
            LineKind::Fence => write!(f, "code fence `{}`", self.text),
            LineKind::Text => f.write_str("text line"),
        }
    }
}

/// U+FEFF, which some editors put at the start of a UTF-8 file.
const BYTE_ORDER_MARK: char = '\u{feff}';

/// Splits `source` into lines and classifies them, fences resolved.
///
/// One leading UTF-8 byte-order mark is skipped: editors on Windows write one, and it
/// would otherwise hide the first heading. It belongs to no line, so every span still
/// counts bytes from the start of the file.
pub(crate) fn lex(source: &str) -> (Vec<Line<'_>>, Vec<Diagnostic>) {
    let base = if source.starts_with(BYTE_ORDER_MARK) {
        BYTE_ORDER_MARK.len_utf8()
    } else {
        0
    };
    let mut lines = Vec::new();
    let mut lexer = LineKind::lexer(&source[base..]);
    while let Some(token) = lexer.next() {
        let range = lexer.span();
        let range = base + range.start..base + range.end;
        // Every byte sequence is some kind of line, so the lexer cannot fail; treat a
        // failure as text all the same rather than trusting that.
        let kind = token.unwrap_or(LineKind::Text);
        let raw = &source[range.clone()];
        let text = raw.trim_end_matches(['\n', '\r']);
        lines.push(Line {
            kind,
            span: Span::new(range.start, range.end),
            text,
        });
    }
    let diagnostics = resolve_fences(&mut lines);
    (lines, diagnostics)
}

/// Turns every line inside a fenced code block (the fences included) into text.
///
/// A fence closes with the same character repeated at least as often as it opened, and
/// nothing but whitespace after it (CommonMark). An unclosed fence runs to the end of the
/// file, which hides every heading after it, so it gets a warning.
fn resolve_fences(lines: &mut [Line<'_>]) -> Vec<Diagnostic> {
    let mut open: Option<(char, usize, Span)> = None;
    let mut indented = Vec::new();
    for line in lines.iter_mut() {
        if line.kind != LineKind::Fence {
            if open.is_some() {
                line.kind = LineKind::Text;
            } else if let Some((kind, name)) = indented_phase_heading(line.text) {
                indented.push(indented_heading(line, kind.as_str(), name));
            }
            continue;
        }
        let (ch, len, rest) = fence_parts(line.text);
        line.kind = LineKind::Text;
        match open {
            None => open = Some((ch, len, line.span)),
            Some((och, olen, _)) if ch == och && len >= olen && rest.trim().is_empty() => {
                open = None;
            }
            Some(_) => {}
        }
    }
    if let Some((_, _, span)) = open {
        indented.push(
            Diagnostic::warning(Code::UnclosedFence, "code fence is never closed", span)
                .with_label_message("this fence runs to the end of the file")
                .with_note("headings inside a code fence are text, so no step heading after this line counts")
                .with_help("close the fence with a matching line of backticks or tildes"),
        );
    }
    indented
}

/// APL0021: `  # prompt: answer` looks like a heading but is text of the phase above.
fn indented_heading(line: &Line<'_>, kind: &str, name: &str) -> Diagnostic {
    let lead = line.text.len() - line.text.trim_start().len();
    let start = line.span.start + lead;
    let span = Span::new(start, start + line.text.trim().len());
    let step = if name.is_empty() {
        String::new()
    } else {
        format!(" of step `{name}`")
    };
    Diagnostic::warning(
        Code::IndentedHeading,
        format!("indented `{kind}` heading{step} is text, not a heading"),
        span,
    )
    .with_label_message("this line is text of the phase above")
    .with_note("a heading counts only at column 0 (§1.3)")
    .with_help("remove the indentation to start the phase; to show the line as text on purpose, indent it by four spaces or put it in a code fence")
}

/// The fence character, its run length and what follows the run.
fn fence_parts(text: &str) -> (char, usize, &str) {
    let trimmed = text.trim_start_matches(' ');
    let ch = trimmed.chars().next().unwrap_or('`');
    let len = trimmed.chars().take_while(|&c| c == ch).count();
    (ch, len, &trimmed[len * ch.len_utf8()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(source: &str) -> Vec<LineKind> {
        lex(source).0.into_iter().map(|l| l.kind).collect()
    }

    #[test]
    fn classifies_lines() {
        use LineKind::*;
        assert_eq!(
            kinds("# prompt: a\n## user\nhi\n### three\n #indented\n#\n"),
            vec![PhaseHeading, RoleHeading, Text, Text, Text, PhaseHeading]
        );
    }

    #[test]
    fn lines_cover_the_source() {
        let src = "# pre: a\r\n\r\ntext\n\nlast";
        let (lines, _) = lex(src);
        let joined: String = lines.iter().map(|l| &src[l.span.range()]).collect();
        assert_eq!(joined, src);
        assert_eq!(lines[0].text, "# pre: a");
    }

    #[test]
    fn headings_inside_fences_are_text() {
        use LineKind::*;
        let src = "# prompt: a\n```md\n# pre: b\n~~~\n## user\n```\n# post: a\n";
        assert_eq!(
            kinds(src),
            vec![PhaseHeading, Text, Text, Text, Text, Text, PhaseHeading]
        );
    }

    #[test]
    fn longer_fence_needs_longer_close() {
        use LineKind::*;
        let src = "````\n```\n# pre: x\n````\n# pre: y\n";
        assert_eq!(kinds(src), vec![Text, Text, Text, Text, PhaseHeading]);
    }

    #[test]
    fn a_byte_order_mark_is_skipped_and_spans_count_it() {
        use LineKind::*;
        let src = "\u{feff}# prompt: a\nhi\n";
        let (lines, _) = lex(src);
        assert_eq!(
            lines.iter().map(|l| l.kind).collect::<Vec<_>>(),
            [PhaseHeading, Text]
        );
        assert_eq!(lines[0].span.start, 3);
        assert_eq!(&src[lines[1].span.range()], "hi\n");
        // Only a leading one: anywhere else it is text.
        assert_eq!(kinds("\u{feff}\u{feff}# prompt: a\n"), [Text]);
    }

    #[test]
    fn unclosed_fence_warns() {
        let (_, diags) = lex("# prompt: a\n```\n# post: a\n");
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].code, Code::UnclosedFence);
    }
}

/// defuss-apl reads a `#` line as a phase heading only when a word and a colon follow
/// (`# pre: a`, and `# setup: a`, which it refuses); any other `#` line
/// (`# Email validation`) is text of the phase it is in. In its dialect such lines are
/// text (`spec/dialects.md`); in the spec's they are invalid headings (APL0001).
pub(crate) fn titles_as_text(lines: &mut [Line<'_>]) {
    for line in lines.iter_mut() {
        if line.kind == LineKind::PhaseHeading && !names_a_phase(line.text) {
            line.kind = LineKind::Text;
        }
    }
}

/// True for `#`, optional blanks, a word, optional blanks and a colon.
fn names_a_phase(text: &str) -> bool {
    let rest = text.strip_prefix('#').unwrap_or(text).trim_start();
    let word_len = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    word_len > 0 && rest[word_len..].trim_start().starts_with(':')
}

#[cfg(test)]
mod dialect_tests {
    use super::names_a_phase;

    #[test]
    fn only_a_word_and_a_colon_name_a_phase() {
        assert!(names_a_phase("# pre: a"));
        assert!(names_a_phase("#setup : a"));
        assert!(!names_a_phase("# Email validation"));
        assert!(!names_a_phase("# prompt"));
        assert!(!names_a_phase("#"));
    }
}
