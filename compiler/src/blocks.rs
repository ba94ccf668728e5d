//! Unclosed Jinja blocks: which block a template forgot to close, and where it opened.
//!
//! minijinja reports an unclosed `{% if %}` as "unexpected end of input, expected end
//! of block" at the end of the template, or, when an outer block's end tag comes first,
//! as "unknown statement endif". Neither names the missing `{% endif %}` nor points at
//! the opening tag, which is what the user has to find. This pass re-reads the template
//! with minijinja's own tokenizer, keeps a stack of open block tags, and says which one
//! is left open.

use minijinja::machinery::{Token, tokenize};
use minijinja::syntax::SyntaxConfig;

use crate::analyze::TSpan;

/// Block tags that need an `end…` tag.
const BLOCKS: &[&str] = &[
    "if",
    "for",
    "macro",
    "call",
    "filter",
    "with",
    "autoescape",
    "block",
    "set",
];

/// A block left open.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unclosed {
    /// The block keyword: `if`, `for`, …
    pub keyword: String,
    /// The opening tag, `{%` to `%}`.
    pub open: TSpan,
    /// The end tag of an enclosing block met while this one was still open; `None` when
    /// the template ended first.
    pub closed_by: Option<(String, TSpan)>,
}

/// The innermost block `source` leaves open, if the tokens show one.
pub(crate) fn unclosed(source: &str) -> Option<Unclosed> {
    let mut stack: Vec<(String, TSpan)> = Vec::new();
    let mut tokens = tokenize(source, false, SyntaxConfig::default());
    while let Some(Ok((token, span))) = tokens.next() {
        if !matches!(token, Token::BlockStart) {
            continue;
        }
        let start = span.start_offset as usize;
        let Some(Ok((Token::Ident(keyword), _))) = tokens.next() else {
            continue;
        };
        // The rest of the tag: is it a block `set` (no `=`), and where does it end?
        let mut assigns = false;
        let mut end = source.len();
        for item in tokens.by_ref() {
            let Ok((token, span)) = item else { return None };
            match token {
                Token::Assign => assigns = true,
                Token::BlockEnd => {
                    end = span.end_offset as usize;
                    break;
                }
                _ => {}
            }
        }
        let tag = (start, end);
        if BLOCKS.contains(&keyword) {
            if keyword == "set" && assigns {
                continue;
            }
            stack.push((keyword.to_string(), tag));
        } else if let Some(closes) = keyword.strip_prefix("end") {
            match stack.last() {
                Some((open, _)) if open == closes => {
                    stack.pop();
                }
                // `{% endif %}` while a `{% for %}` inside the `if` is open.
                Some(_) if stack.iter().any(|(open, _)| open == closes) => {
                    let (inner, open) = stack.pop()?;
                    return Some(Unclosed {
                        keyword: inner,
                        open,
                        closed_by: Some((keyword.to_string(), tag)),
                    });
                }
                _ => return None,
            }
        }
    }
    let (keyword, open) = stack.pop()?;
    Some(Unclosed {
        keyword,
        open,
        closed_by: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(src: &str, span: TSpan) -> &str {
        &src[span.0..span.1]
    }

    #[test]
    fn finds_the_open_block() {
        let src = "a\n{% if x %}\nb";
        let u = unclosed(src).unwrap();
        assert_eq!(u.keyword, "if");
        assert_eq!(at(src, u.open), "{% if x %}");
        assert_eq!(u.closed_by, None);

        let src = "{% if x %}{% for i in y %}{{ i }}{% endif %}";
        let u = unclosed(src).unwrap();
        assert_eq!(u.keyword, "for");
        assert_eq!(at(src, u.open), "{% for i in y %}");
        let (end, span) = u.closed_by.unwrap();
        assert_eq!((end.as_str(), at(src, span)), ("endif", "{% endif %}"));

        let src = "{% set x = 1 %}{% set y %}text";
        assert_eq!(unclosed(src).unwrap().keyword, "set");
        let src = "{%- macro m() -%}x";
        assert_eq!(at(src, unclosed(src).unwrap().open), "{%- macro m() -%}");
    }

    #[test]
    fn closed_blocks_are_fine() {
        assert_eq!(
            unclosed("{% if x %}{% elif y %}{% else %}{% endif %}"),
            None
        );
        assert_eq!(unclosed("{% raw %}{% if %}{% endraw %}"), None);
        assert_eq!(unclosed("{% set x = 1 %}"), None);
        assert_eq!(unclosed("{% endif %}"), None);
    }
}
