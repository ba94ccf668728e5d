//! Byte offsets in a document to LSP positions and back.
//!
//! LSP counts columns in UTF-16 code units (the default `positionEncoding`, the only one
//! every client supports); the compiler counts bytes. A position from the client may be
//! anything: past the end of a line or of the file, or inside a surrogate pair. It is
//! clamped to the nearest character boundary, never trusted.

use aplc_compiler::Span;
use lsp_types::{Position, Range};

/// The line starts of one text, for converting positions.
#[derive(Debug, Clone)]
pub(crate) struct Lines {
    /// Byte offset of the start of each line; the first is 0.
    starts: Vec<usize>,
}

impl Lines {
    pub(crate) fn new(text: &str) -> Lines {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Lines { starts }
    }

    /// The position of byte `offset` (clamped to the text and to a character boundary).
    pub(crate) fn position(&self, text: &str, offset: usize) -> Position {
        let offset = floor_boundary(text, offset.min(text.len()));
        let line = self.starts.partition_point(|&s| s <= offset) - 1;
        let start = self.starts[line];
        let character = text[start..offset].encode_utf16().count();
        Position::new(as_u32(line), as_u32(character))
    }

    /// The range of `span`.
    pub(crate) fn range(&self, text: &str, span: Span) -> Range {
        Range::new(
            self.position(text, span.start),
            self.position(text, span.end),
        )
    }

    /// The byte offset of `position`: a line past the end is the end of the text, a
    /// column past the end of its line is the line's end (before its line break), and a
    /// column inside a surrogate pair is the start of that character.
    pub(crate) fn offset(&self, text: &str, position: Position) -> usize {
        let Some(&start) = self.starts.get(position.line as usize) else {
            return text.len();
        };
        let end = self
            .starts
            .get(position.line as usize + 1)
            .map_or(text.len(), |&next| next - 1);
        let line = text[start..end].trim_end_matches('\r');
        let mut units = 0usize;
        for (i, c) in line.char_indices() {
            units += c.len_utf16();
            if units > position.character as usize {
                return start + i;
            }
        }
        start + line.len()
    }

    /// The byte span of `range`, start before end.
    pub(crate) fn span(&self, text: &str, range: Range) -> Span {
        let (a, b) = (self.offset(text, range.start), self.offset(text, range.end));
        Span::new(a.min(b), a.max(b))
    }
}

fn floor_boundary(text: &str, mut offset: usize) -> usize {
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

/// Documents are at most the compiler's source limit (8 MiB), far below `u32::MAX`.
fn as_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_columns_on_non_ascii_lines() {
        let text = "# prompt: é\nx 😀 y\n";
        let lines = Lines::new(text);
        let y = text.find('y').unwrap();
        assert_eq!(lines.position(text, y), Position::new(1, 5));
        assert_eq!(lines.offset(text, Position::new(1, 5)), y);
        // Inside the surrogate pair of 😀: the start of the character.
        assert_eq!(
            lines.offset(text, Position::new(1, 3)),
            text.find('😀').unwrap()
        );
        // Past the line's end, past the last line.
        assert_eq!(
            lines.offset(text, Position::new(0, 99)),
            text.find('\n').unwrap()
        );
        assert_eq!(lines.offset(text, Position::new(99, 0)), text.len());
        // An offset inside a character counts from its start.
        let e = text.find('é').unwrap();
        assert_eq!(lines.position(text, e + 1), Position::new(0, 10));
    }

    #[test]
    fn crlf_line_ends() {
        let text = "ab\r\ncd";
        let lines = Lines::new(text);
        assert_eq!(lines.offset(text, Position::new(0, 9)), 2);
        assert_eq!(lines.position(text, 4), Position::new(1, 0));
    }
}
