//! Python's `textwrap.wrap` with the settings Jinja2's `wordwrap` filter uses
//! (`expand_tabs=False`, `replace_whitespace=False`, `drop_whitespace=True`, no
//! indents), and `str.splitlines`.
//!
//! The text is cut into chunks the way `TextWrapper.wordsep_re` (or
//! `wordsep_simple_re` without `break_on_hyphens`) splits it, then the chunks are
//! packed into lines by `TextWrapper._wrap_chunks`. Python's regular expression uses
//! look-behind, which the `regex` crate lacks, so the split is written out by hand;
//! the unit tests compare it with Python's output. Lengths are counted in characters
//! (code points), as Python counts them.

/// The `TextWrapper` settings `wordwrap` passes on.
pub(super) struct Options {
    pub width: usize,
    pub break_long_words: bool,
    pub break_on_hyphens: bool,
}

/// Python's `str.splitlines()`: lines without their terminators, no trailing empty line.
pub(super) fn splitlines(s: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((idx, c)) = chars.next() {
        let is_break = matches!(
            c,
            '\n' | '\r'
                | '\x0b'
                | '\x0c'
                | '\x1c'
                | '\x1d'
                | '\x1e'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if !is_break {
            continue;
        }
        lines.push(&s[start..idx]);
        let mut end = idx + c.len_utf8();
        if c == '\r'
            && let Some((_, '\n')) = chars.peek()
        {
            chars.next();
            end += 1;
        }
        start = end;
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

/// `textwrap.wrap(line, width, ...)`: the lines, without line breaks.
pub(super) fn wrap(line: &str, options: &Options) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let chunks = if options.break_on_hyphens {
        split_words(&chars)
    } else {
        split_simple(&chars)
    };
    let chunks: Vec<Vec<char>> = chunks
        .into_iter()
        .map(|(start, end)| chars[start..end].to_vec())
        .collect();
    wrap_chunks(chunks, options)
}

/// `TextWrapper._wrap_chunks`.
fn wrap_chunks(mut chunks: Vec<Vec<char>>, options: &Options) -> Vec<String> {
    let width = options.width;
    let mut lines: Vec<String> = Vec::new();
    chunks.reverse();
    while !chunks.is_empty() {
        let mut cur_line: Vec<Vec<char>> = Vec::new();
        let mut cur_len = 0usize;
        // A line never starts with whitespace, except the very first one.
        if !lines.is_empty() && chunks.last().is_some_and(|chunk| is_blank(chunk)) {
            chunks.pop();
        }
        while let Some(chunk) = chunks.last() {
            if cur_len + chunk.len() <= width {
                cur_len += chunk.len();
                cur_line.extend(chunks.pop());
            } else {
                break;
            }
        }
        if chunks.last().is_some_and(|chunk| chunk.len() > width) {
            handle_long_word(&mut chunks, &mut cur_line, cur_len, options);
        }
        if cur_line.last().is_some_and(|chunk| is_blank(chunk)) {
            cur_line.pop();
        }
        if !cur_line.is_empty() {
            lines.push(cur_line.iter().flatten().collect());
        }
    }
    lines
}

/// `TextWrapper._handle_long_word`: a chunk longer than a whole line.
fn handle_long_word(
    chunks: &mut Vec<Vec<char>>,
    cur_line: &mut Vec<Vec<char>>,
    cur_len: usize,
    options: &Options,
) {
    let space_left = if options.width < 1 {
        1
    } else {
        options.width - cur_len
    };
    if options.break_long_words {
        let Some(chunk) = chunks.last_mut() else {
            return;
        };
        let mut end = space_left.min(chunk.len());
        if options.break_on_hyphens && chunk.len() > space_left {
            // Break after the last hyphen, if there are non-hyphens before it.
            if let Some(hyphen) = chunk[..space_left].iter().rposition(|c| *c == '-')
                && hyphen > 0
                && chunk[..hyphen].iter().any(|c| *c != '-')
            {
                end = hyphen + 1;
            }
        }
        let rest = chunk.split_off(end);
        cur_line.push(std::mem::replace(chunk, rest));
    } else if cur_line.is_empty() {
        cur_line.extend(chunks.pop());
    }
}

/// `chunk.strip() == ''`.
fn is_blank(chunk: &[char]) -> bool {
    chunk.iter().all(|c| is_py_space(*c))
}

/// `str.isspace` for one character.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\x1c'..='\x1f')
}

/// `textwrap`'s `_whitespace`: ASCII whitespace only.
fn is_ws(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\x0b' | '\x0c' | '\r' | ' ')
}

/// `\w`.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `word_punct`: `[\w!"'&.,?]`.
fn is_word_punct(c: char) -> bool {
    is_word(c) || matches!(c, '!' | '"' | '\'' | '&' | '.' | ',' | '?')
}

/// `letter`: `[^\d\W]`.
fn is_letter(c: char) -> bool {
    is_word(c) && !c.is_numeric()
}

/// `wordsep_simple_re.split`: runs of whitespace and runs of anything else.
fn split_simple(chars: &[char]) -> Vec<(usize, usize)> {
    let mut chunks = Vec::new();
    let mut start = 0;
    while start < chars.len() {
        let space = is_ws(chars[start]);
        let mut end = start + 1;
        while end < chars.len() && is_ws(chars[end]) == space {
            end += 1;
        }
        chunks.push((start, end));
        start = end;
    }
    chunks
}

/// `wordsep_re.split`: whitespace runs, em-dashes (`--`) between words, and words split
/// after the hyphens of hyphenated words (`long-term` gives `long-`, `term`).
fn split_words(c: &[char]) -> Vec<(usize, usize)> {
    let n = c.len();
    let at = |i: usize| c.get(i).copied();
    let letter_at = |i: usize| at(i).is_some_and(is_letter);
    // `-{2,}` at `i` followed by `\w`: the end of the dashes.
    let dashes = |i: usize| {
        let mut j = i;
        while at(j) == Some('-') {
            j += 1;
        }
        (j - i >= 2 && at(j).is_some_and(is_word)).then_some(j)
    };
    let mut chunks = Vec::new();
    let mut i = 0;
    while i < n {
        // Any whitespace.
        if is_ws(c[i]) {
            let mut j = i + 1;
            while j < n && is_ws(c[j]) {
                j += 1;
            }
            chunks.push((i, j));
            i = j;
            continue;
        }
        // An em-dash between words.
        if c[i] == '-'
            && i > 0
            && is_word_punct(c[i - 1])
            && let Some(j) = dashes(i)
        {
            chunks.push((i, j));
            i = j;
            continue;
        }
        // A word: the shortest run of non-whitespace followed by a hyphenation point, the
        // end of the word, or an em-dash.
        let mut k = i + 1;
        let end = loop {
            if k >= n || is_ws(c[k]) {
                break k;
            }
            if c[k] == '-' {
                let behind = (k >= 2 && letter_at(k - 2) && letter_at(k - 1))
                    || (k >= 3 && letter_at(k - 3) && at(k - 2) == Some('-') && letter_at(k - 1));
                let ahead = letter_at(k + 1)
                    && (letter_at(k + 2) || (at(k + 2) == Some('-') && letter_at(k + 3)));
                if behind && ahead {
                    break k + 1;
                }
                if is_word_punct(c[k - 1]) && dashes(k).is_some() {
                    break k;
                }
            }
            k += 1;
        };
        chunks.push((i, end));
        i = end;
    }
    chunks
}
