//! Relaxed syntax (§6.1.1): Jinja without delimiters in `pre` and `post` phases.
//!
//! The rewrite is line by line and keeps the line count, so a template line maps to the
//! same source line; [`TemplateMap`] maps offsets in the rewritten text back to the
//! source for diagnostics. Prompt phases are never rewritten.

use aplc_vm::Dialect;

use crate::diagnostic::Span;

/// Statement keywords that start a `{% … %}` line. The spec lists the first ten; the rest
/// are the other minijinja block statements, which would otherwise be wrapped in `{{ }}`
/// and fail to parse.
const KEYWORDS: &[&str] = &[
    "if",
    "elif",
    "else",
    "endif",
    "for",
    "endfor",
    "set",
    "endset",
    "with",
    "endwith",
    "break",
    "continue",
    "macro",
    "endmacro",
    "call",
    "endcall",
    "filter",
    "endfilter",
    "do",
];

/// Maps offsets in a template's text back to the `.apl` source.
#[derive(Debug, Clone)]
pub(crate) enum TemplateMap {
    /// The template is a verbatim slice of the source starting at this offset.
    Verbatim(usize),
    /// A relaxed rewrite: one entry per line.
    Lines(Vec<LineMap>),
}

/// Where one rewritten line came from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LineMap {
    /// Offset of the line in the rewritten text.
    template_start: usize,
    /// Offset of the line in the source.
    source_start: usize,
    /// Length of the source line without its line break.
    source_len: usize,
    /// Leading whitespace kept before the inserted delimiter.
    indent: usize,
    /// Bytes inserted after the indentation (`{{ ` or `{% `), 0 when kept verbatim.
    inserted: usize,
}

impl TemplateMap {
    /// Maps a byte offset in the template text to a byte offset in the source.
    pub(crate) fn to_source(&self, offset: usize) -> usize {
        match self {
            TemplateMap::Verbatim(base) => base + offset,
            TemplateMap::Lines(lines) => {
                let i = lines
                    .partition_point(|l| l.template_start <= offset)
                    .saturating_sub(1);
                let Some(line) = lines.get(i) else { return 0 };
                let col = offset - line.template_start.min(offset);
                let col = if col <= line.indent {
                    col
                } else {
                    col.saturating_sub(line.inserted).max(line.indent)
                };
                line.source_start + col.min(line.source_len)
            }
        }
    }

    /// Maps a span in the template text to a span in the source.
    pub(crate) fn span(&self, start: usize, end: usize) -> Span {
        Span::new(self.to_source(start), self.to_source(end))
    }
}

/// Rewrites a relaxed-syntax phase body (`body`, found at `base` in the source).
/// `dialect`'s helpers are calls: `set('a', 1)` in `defuss-1.1` is `{{ set('a', 1) }}`,
/// not a `{% set %}` statement.
pub(crate) fn desugar(body: &str, base: usize, dialect: Dialect) -> (String, TemplateMap) {
    let mut out = String::with_capacity(body.len() + body.len() / 4);
    let mut map = Vec::new();
    let mut open = None;
    let mut source_start = base;
    for raw in body.split_inclusive('\n') {
        let content = raw.trim_end_matches(['\n', '\r']);
        let ending = &raw[content.len()..];
        let trimmed = content.trim();
        let indent = content.len() - content.trim_start().len();
        let template_start = out.len();
        let mut inserted = 0;

        let verbatim = open.is_some()
            || trimmed.is_empty()
            || trimmed.starts_with('#')
            || trimmed.starts_with("<!--")
            || ["{{", "{%", "{#"].iter().any(|d| trimmed.contains(d));
        if verbatim {
            out.push_str(content);
        } else {
            let (open, close) = if is_statement(trimmed, dialect) {
                ("{% ", " %}")
            } else {
                ("{{ ", " }}")
            };
            out.push_str(&content[..indent]);
            out.push_str(open);
            out.push_str(trimmed);
            out.push_str(close);
            inserted = open.len();
        }
        out.push_str(ending);
        open = open_after(open, content);
        map.push(LineMap {
            template_start,
            source_start,
            source_len: content.len(),
            indent,
            inserted,
        });
        source_start += raw.len();
    }
    (out, TemplateMap::Lines(map))
}

/// True when the line's first word is a statement keyword, and not a call of a helper
/// of `dialect` with the same name (`set(` right after the word).
fn is_statement(line: &str, dialect: Dialect) -> bool {
    let word_len = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(line.len());
    let (word, rest) = line.split_at(word_len);
    let helper_call = rest.starts_with('(') && dialect.helpers().iter().any(|h| h.name == word);
    KEYWORDS.contains(&word) && !helper_call
}

/// A `{{ … }}`, `{% … %}` or `{# … #}` that is still open at the end of a line.
#[derive(Debug, Clone, Copy)]
struct Open {
    /// The delimiter that closes it.
    close: &'static str,
    /// Brackets open inside it: `}}` within `{"a": {"b": 1}}` closes a map, not the
    /// expression (as in Jinja's lexer).
    depth: u32,
    /// The quote of a string literal open inside it.
    quote: Option<char>,
}

/// What is still open after `line`, given what was open before it. Lines inside an
/// open expression, such as the rows of a map literal written over several lines, are
/// kept verbatim.
fn open_after(mut open: Option<Open>, line: &str) -> Option<Open> {
    let mut chars = line.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let rest = &line[i..];
        let Some(o) = open.as_mut() else {
            open = [("{{", "}}"), ("{%", "%}"), ("{#", "#}")]
                .into_iter()
                .find(|(start, _)| rest.starts_with(start))
                .map(|(_, close)| Open {
                    close,
                    depth: 0,
                    quote: None,
                });
            if open.is_some() {
                chars.next();
            }
            continue;
        };
        let in_code = o.close != "#}";
        match o.quote {
            Some(_) if c == '\\' => {
                chars.next();
            }
            Some(q) if c == q => o.quote = None,
            Some(_) => {}
            None if in_code && (c == '"' || c == '\'') => o.quote = Some(c),
            None if o.depth == 0 && rest.starts_with(o.close) => {
                open = None;
                chars.next();
            }
            None if in_code && matches!(c, '(' | '[' | '{') => o.depth += 1,
            None if in_code && matches!(c, ')' | ']' | '}') => o.depth = o.depth.saturating_sub(1),
            None => {}
        }
    }
    open
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example() {
        let body = "if global_runs < 2 and not result_text\n    set_context('next_step', 'greet')\nelse\n    set_context('next_step', 'return')\nendif\n";
        let (out, _) = desugar(body, 0, Dialect::Spec);
        assert_eq!(
            out,
            "{% if global_runs < 2 and not result_text %}\n    {{ set_context('next_step', 'greet') }}\n{% else %}\n    {{ set_context('next_step', 'return') }}\n{% endif %}\n"
        );
    }

    #[test]
    fn mixed_and_comments_are_kept() {
        let body =
            "{% if x %}\n  set_context('a', 1)\n{# multi\nline comment #}\n\n  # note\nendif";
        let (out, _) = desugar(body, 0, Dialect::Spec);
        assert_eq!(
            out,
            "{% if x %}\n  {{ set_context('a', 1) }}\n{# multi\nline comment #}\n\n  # note\n{% endif %}"
        );
    }

    #[test]
    fn keywords_are_whole_words() {
        assert!(is_statement("for x in y", Dialect::Spec));
        assert!(is_statement("else", Dialect::Spec));
        assert!(!is_statement("set_context('a', 1)", Dialect::Spec));
        assert!(!is_statement("format(x)", Dialect::Spec));
    }

    #[test]
    fn a_dialect_helper_named_like_a_keyword_is_a_call() {
        let body = "set('a', 1)\nset b = 2\nset (c, d) = (1, 2)\n";
        let (out, _) = desugar(body, 0, Dialect::Defuss11);
        assert_eq!(
            out,
            "{{ set('a', 1) }}\n{% set b = 2 %}\n{% set (c, d) = (1, 2) %}\n"
        );
        // The spec has no `set` function: there the line stays a statement.
        assert!(is_statement("set('a', 1)", Dialect::Spec));
    }

    #[test]
    fn lines_inside_a_multi_line_expression_are_kept() {
        let body = "{{ set_context('d', {\n  \"a\": 1,\n  \"b\": {\"c\": 2}\n}) }}\nx\n";
        let (out, _) = desugar(body, 0, Dialect::Spec);
        assert_eq!(
            out,
            "{{ set_context('d', {\n  \"a\": 1,\n  \"b\": {\"c\": 2}\n}) }}\n{{ x }}\n"
        );
    }

    #[test]
    fn braces_and_strings_inside_an_expression_do_not_close_it() {
        let body = "{{ set_context('r', [\n  {\"c\": {\"d\": 42}},\n  \"}}\"\n]) }}\nx\n";
        let (out, _) = desugar(body, 0, Dialect::Spec);
        assert_eq!(
            out,
            "{{ set_context('r', [\n  {\"c\": {\"d\": 42}},\n  \"}}\"\n]) }}\n{{ x }}\n"
        );
    }

    #[test]
    fn offsets_map_back() {
        let body = "a\n  b + c\r\n";
        let (out, map) = desugar(body, 100, Dialect::Spec);
        assert_eq!(out, "{{ a }}\n  {{ b + c }}\r\n");
        // `a` in the template is at 3; in the source at 100.
        assert_eq!(map.to_source(3), 100);
        // `c` on line 2: template offset of "c".
        let c = out.find('c').unwrap();
        assert_eq!(map.to_source(c), 100 + body.find('c').unwrap());
        // Inside the inserted `{{ ` maps to the indentation end.
        assert_eq!(map.to_source(8 + 2), 100 + 2 + 2);
    }
}
