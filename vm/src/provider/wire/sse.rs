//! An incremental Server-Sent Events decoder: bytes in, events out, no I/O.
//!
//! It follows the WHATWG "event stream interpretation" rules: lines end in `\n`, `\r\n`
//! or `\r` (a `\r\n` split between two chunks is one line end), a line starting with `:`
//! is a comment, `data:` lines of one event are joined with `\n`, `event:` names the
//! event, one space after the colon is dropped, a blank line dispatches the event, and an
//! event without data is no event. `id:` and `retry:` only matter to a reconnecting
//! browser and are ignored, as are unknown fields.
//!
//! Memory is bounded: a line or an event's data past the decoder's limit is an error,
//! not a growing buffer. Input that is not UTF-8 is an error too (the streams decoded
//! here carry JSON, where a replacement character would silently change a value).

/// The default limit on one line and on one event's data: 8 MiB, far past any real
/// chunk, well under the runtime's body cap.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 8 << 20;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty when the event had none (a `message`).
    pub event: String,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// The decoder's state between chunks.
#[derive(Debug)]
pub struct SseDecoder {
    max: usize,
    /// The bytes of the line not yet ended.
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a `\n` starting this one ends no line.
    after_cr: bool,
    /// No line was read yet (a byte-order mark may start it).
    first_line: bool,
    event: String,
    data: String,
    has_data: bool,
}

impl SseDecoder {
    /// A decoder refusing lines and event data longer than `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> SseDecoder {
        SseDecoder {
            max: max_event_bytes,
            line: Vec::new(),
            after_cr: false,
            first_line: true,
            event: String::new(),
            data: String::new(),
            has_data: false,
        }
    }

    /// Reads `chunk`, appending every event it completes to `out`. An error is final:
    /// the stream is not an event stream (or passes the limit).
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), String> {
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        while !chunk.is_empty() {
            let Some(end) = chunk.iter().position(|b| *b == b'\n' || *b == b'\r') else {
                self.append(chunk)?;
                return Ok(());
            };
            self.append(&chunk[..end])?;
            let line = std::mem::take(&mut self.line);
            self.line_ended(&line, out)?;
            self.line = line;
            self.line.clear();
            let crlf = chunk[end] == b'\r' && chunk.get(end + 1) == Some(&b'\n');
            if chunk[end] == b'\r' && end + 1 == chunk.len() {
                self.after_cr = true;
            }
            chunk = &chunk[end + if crlf { 2 } else { 1 }..];
        }
        Ok(())
    }

    /// The stream ended: a last line without its line end is read, and an event still
    /// waiting for its blank line is dispatched (servers that close right after the last
    /// `data:` line lose nothing).
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), String> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_ended(&line, out)?;
        }
        self.line_ended(b"", out)
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.line.len() + bytes.len() > self.max {
            return Err(format!(
                "a line of the event stream is longer than {} bytes",
                self.max
            ));
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn line_ended(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), String> {
        let mut line =
            std::str::from_utf8(line).map_err(|_| "the event stream is not UTF-8".to_owned())?;
        if std::mem::take(&mut self.first_line) {
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            if std::mem::take(&mut self.has_data) {
                out.push(SseEvent {
                    event: std::mem::take(&mut self.event),
                    data: std::mem::take(&mut self.data),
                });
            } else {
                self.event.clear();
            }
            return Ok(());
        }
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.data.len() + value.len() + 1 > self.max {
                    return Err(format!(
                        "an event of the event stream is longer than {} bytes",
                        self.max
                    ));
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => {
                self.event.clear();
                self.event.push_str(value);
            }
            _ => {}
        }
        Ok(())
    }
}

impl Default for SseDecoder {
    fn default() -> Self {
        SseDecoder::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
        }
    }

    /// Decodes `input` cut into chunks at every position in `cuts`.
    fn decode_cut(input: &[u8], cuts: &[usize]) -> Result<Vec<SseEvent>, String> {
        let mut decoder = SseDecoder::new(64);
        let mut out = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            decoder.feed(&input[start..cut], &mut out)?;
            start = cut;
        }
        decoder.finish(&mut out)?;
        Ok(out)
    }

    #[test]
    fn every_line_end_and_every_split_give_the_same_events() {
        let text = ":comment\r\nevent: delta\ndata: a\rdata:b\r\n\r\ndata:  c\n\n\ndata\nid: 7\nretry: 1\nfoo: x\n\n";
        let expected = vec![event("delta", "a\nb"), event("", " c"), event("", "")];
        let bytes = text.as_bytes();
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                assert_eq!(
                    decode_cut(bytes, &[a, b]).unwrap(),
                    expected,
                    "cut at {a} and {b}"
                );
            }
        }
    }

    #[test]
    fn bom_events_without_data_and_a_last_unended_line() {
        let out = decode_cut("\u{feff}data: 1\n\nevent: x\n\ndata: 2".as_bytes(), &[1]).unwrap();
        assert_eq!(out, vec![event("", "1"), event("", "2")]);
        // An `event:` with no data dispatches nothing and does not leak into the next.
        let out = decode_cut(b"event: ping\n\ndata: 3\n\n", &[]).unwrap();
        assert_eq!(out, vec![event("", "3")]);
    }

    #[test]
    fn limits_and_bad_bytes_are_errors() {
        let long = format!("data: {}\n\n", "x".repeat(100));
        assert!(
            decode_cut(long.as_bytes(), &[10, 50])
                .unwrap_err()
                .contains("longer than 64")
        );
        let many = "data: 0123456789\n".repeat(8);
        assert!(
            decode_cut(many.as_bytes(), &[])
                .unwrap_err()
                .contains("an event")
        );
        // An endless line without a line end is refused at the limit, whatever the chunks.
        let mut decoder = SseDecoder::new(64);
        let mut out = Vec::new();
        let mut failed = false;
        for _ in 0..100 {
            if decoder.feed(b"xxxxxxxx", &mut out).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
        assert_eq!(
            decode_cut(b"data: \xff\n\n", &[]).unwrap_err(),
            "the event stream is not UTF-8"
        );
    }
}
