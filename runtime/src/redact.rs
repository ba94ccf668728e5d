//! Scrubs secrets (API keys, header values) from messages before anyone sees them.
//!
//! A [`Redactor`] knows every secret of a provider's configuration and replaces, in any
//! ASCII letter case, every run of [`REDACTED_RUN`] or more characters of a secret with
//! `<redacted>`: not only the whole secret, but also the part a server quoted after
//! cutting it, or that a message was cut in the middle of. Messages are redacted *before*
//! they are shortened ([`Redactor::clip`]), so a cut never leaves the rest of a secret
//! behind. `spec/limits.md` ("Secrets and redaction") states the rules.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// What a secret is replaced with.
pub(crate) const REDACTED: &str = "<redacted>";
/// The longest run of a secret's characters a message may keep: every run of this many
/// is replaced. A secret no longer than this is replaced when it appears whole.
pub(crate) const REDACTED_RUN: usize = 16;
/// Shorter secrets are not searched for: replacing every `"1"` would garble the message
/// and protect nothing.
pub(crate) const MIN_SECRET_LEN: usize = 8;

/// Finds any run of [`REDACTED_RUN`] characters of any secret.
///
/// The default redactor knows no secret and changes nothing. The CLI builds one from the
/// run's secrets for tool results ([`crate::tool::Toolbox::redact_with`]); each
/// provider builds its own from its configuration.
#[derive(Clone, Default)]
pub struct Redactor {
    /// One pattern per distinct window of each secret (or the whole secret, if short).
    matcher: Option<AhoCorasick>,
    /// The longest secret, in characters: how far past a cut a secret can reach.
    longest: usize,
}

/// Never shows a secret: only how many there are.
impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").finish_non_exhaustive()
    }
}

impl Redactor {
    /// A redactor for `secrets`. Surrounding whitespace is trimmed; secrets shorter than
    /// [`MIN_SECRET_LEN`] characters are ignored. Each whitespace-separated word of a
    /// secret counts too: the token of `Bearer <token>` is a secret on its own.
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Redactor {
        let mut patterns: Vec<String> = Vec::new();
        let mut longest = 0;
        let mut add = |secret: &str| {
            let chars: Vec<(usize, char)> = secret.char_indices().collect();
            if chars.len() < MIN_SECRET_LEN {
                return;
            }
            longest = longest.max(chars.len());
            if chars.len() <= REDACTED_RUN {
                patterns.push(secret.to_owned());
                return;
            }
            for start in 0..=chars.len() - REDACTED_RUN {
                let from = chars[start].0;
                let to = chars
                    .get(start + REDACTED_RUN)
                    .map_or(secret.len(), |(at, _)| *at);
                patterns.push(secret[from..to].to_owned());
            }
        };
        for secret in secrets {
            let secret = secret.trim();
            add(secret);
            let words: Vec<&str> = secret.split_whitespace().collect();
            if words.len() > 1 {
                words.into_iter().for_each(&mut add);
            }
        }
        if patterns.is_empty() {
            // Most runs know no secret: building an empty automaton is not free.
            return Redactor {
                matcher: None,
                longest,
            };
        }
        patterns.sort();
        patterns.dedup();
        let matcher = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .build(&patterns)
            .ok()
            .filter(|_| !patterns.is_empty());
        Redactor { matcher, longest }
    }

    /// `text` with every run of [`REDACTED_RUN`] characters of a secret (and every whole
    /// short secret) replaced by `<redacted>`; overlapping or touching runs become one.
    pub fn redact(&self, text: &str) -> String {
        let spans = self.spans(text);
        replace(text, &spans)
    }

    /// The byte ranges of `text` to replace, merged where they overlap or touch, in order.
    fn spans(&self, text: &str) -> Vec<(usize, usize)> {
        let mut spans: Vec<(usize, usize)> = Vec::new();
        let Some(matcher) = &self.matcher else {
            return spans;
        };
        for found in matcher.find_overlapping_iter(text) {
            match spans.last_mut() {
                Some((_, end)) if found.start() <= *end => *end = (*end).max(found.end()),
                _ => spans.push((found.start(), found.end())),
            }
        }
        spans
    }

    /// True if this redactor knows no secret (it changes nothing).
    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// `json` with every string (and object key) redacted as by [`Redactor::redact`]:
    /// a tool's result may quote a secret anywhere in its structure.
    pub fn redact_json(&self, json: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        if self.matcher.is_none() {
            return json;
        }
        match json {
            Value::String(s) => Value::String(self.redact(&s)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.redact_json(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| (self.redact(&k), self.redact_json(v)))
                    .collect(),
            ),
            other => other,
        }
    }

    /// `text` on one line (control characters become spaces), redacted, then cut to
    /// `max` characters with `…`. Only the part that can reach into the first `max`
    /// characters is searched, so a huge body costs no more than a short one.
    pub fn clip(&self, text: &str, max: usize) -> String {
        let reach = max
            .saturating_add(self.longest)
            .saturating_add(REDACTED_RUN);
        let flat: String = text
            .trim()
            .chars()
            .take(reach)
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let redacted = self.redact(&flat);
        let cut = redacted.char_indices().nth(max).map(|(at, _)| at);
        let longer = text.trim().chars().nth(reach).is_some();
        match cut {
            Some(cut) => format!("{}…", &redacted[..cut]),
            None if longer => format!("{redacted}…"),
            None => redacted,
        }
    }
}

/// `text` with each of `spans` (merged, in order) replaced by `<redacted>`.
fn replace(text: &str, spans: &[(usize, usize)]) -> String {
    if spans.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for &(start, end) in spans {
        out.push_str(&text[at..start]);
        out.push_str(REDACTED);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// Redacts a text that arrives in pieces, such as a streamed answer's deltas: a secret
/// split across pieces is replaced as it would be in the whole text.
///
/// It holds back the last `REDACTED_RUN - 1` characters of what it was given (every
/// pattern is at most [`REDACTED_RUN`] characters, so no match can start before them and
/// end in a later piece), and releases them with the next piece or at
/// [`finish`](StreamRedactor::finish). Without secrets it holds nothing back.
#[derive(Debug, Clone, Default)]
pub struct StreamRedactor {
    redactor: Redactor,
    /// Text received but not released yet, unredacted.
    held: String,
    /// What was released last ended in `<redacted>`: a match at the start of the held
    /// text continues it (the whole text would have one `<redacted>` there).
    redacted_tail: bool,
}

impl StreamRedactor {
    /// A stream redactor with `redactor`'s secrets.
    pub fn new(redactor: Redactor) -> StreamRedactor {
        StreamRedactor {
            redactor,
            held: String::new(),
            redacted_tail: false,
        }
    }

    /// Takes the next piece; returns what can be released now, redacted (maybe empty).
    pub fn push(&mut self, piece: &str) -> String {
        if self.redactor.is_empty() {
            return piece.to_owned();
        }
        self.held.push_str(piece);
        let text = std::mem::take(&mut self.held);
        // The cut leaves REDACTED_RUN - 1 characters held, and moves back to the start of
        // a match that crosses it: the match may go on in the next piece (the whole text
        // would replace all of it), so it is held whole.
        let keep = REDACTED_RUN - 1;
        let mut cut = text
            .char_indices()
            .rev()
            .nth(keep - 1)
            .map_or(0, |(at, _)| at);
        let spans = self.redactor.spans(&text);
        if let Some(&(start, _)) = spans.iter().find(|&&(start, end)| start < cut && cut < end) {
            cut = start;
        }
        let released: Vec<(usize, usize)> =
            spans.into_iter().filter(|&(_, end)| end <= cut).collect();
        let out = self.release(&text[..cut], &released);
        self.held = text[cut..].to_owned();
        out
    }

    /// Releases what is held, redacted: the text is complete.
    pub fn finish(&mut self) -> String {
        let held = std::mem::take(&mut self.held);
        let spans = self.redactor.spans(&held);
        let out = self.release(&held, &spans);
        self.redacted_tail = false;
        out
    }

    /// `text` with `spans` replaced, without a second `<redacted>` where a match goes on
    /// from the one the last release ended in.
    fn release(&mut self, text: &str, spans: &[(usize, usize)]) -> String {
        if text.is_empty() {
            return String::new();
        }
        let mut out = replace(text, spans);
        if self.redacted_tail && spans.first().is_some_and(|&(start, _)| start == 0) {
            out.replace_range(..REDACTED.len(), "");
        }
        self.redacted_tail = spans.last().is_some_and(|&(_, end)| end == text.len());
        out
    }
}

/// A run's `provider_delta` events, redacted as one text per provider call with a
/// [`StreamRedactor`], for consumers that keep or send on what they get (the events
/// file, the server's event stream).
///
/// The deltas it passes on are renumbered (a delta whose text is all held back is not
/// passed on), and the text a call's redactor still holds goes out as one more delta,
/// with the last delta's `seq`, `t_ms` and step, before the call's next event (or at
/// [`finish`](DeltaRedactor::finish)). Other events pass as they are: each consumer
/// redacts them as it does the rest of its output.
#[derive(Debug, Default)]
pub struct DeltaRedactor {
    redactor: Redactor,
    /// The current call's redactor, its last delta and the next index passed on.
    call: Option<(StreamRedactor, aplc_vm::Event, u64)>,
}

impl DeltaRedactor {
    /// Deltas redacted with `redactor`'s secrets.
    pub fn new(redactor: Redactor) -> DeltaRedactor {
        DeltaRedactor {
            redactor,
            call: None,
        }
    }

    /// Hands `out` what to pass on for `event`, in order.
    pub fn on_event(&mut self, event: &aplc_vm::Event, mut out: impl FnMut(&aplc_vm::Event)) {
        if let aplc_vm::EventKind::ProviderDelta { text, .. } = &event.kind {
            let redactor = &self.redactor;
            let (stream, last, _) = self
                .call
                .get_or_insert_with(|| (StreamRedactor::new(redactor.clone()), event.clone(), 0));
            last.clone_from(event);
            let released = stream.push(text);
            self.pass(released, &mut out);
            return;
        }
        self.finish(&mut out);
        out(event);
    }

    /// Hands `out` the text the current call's redactor still holds, as one more delta,
    /// and forgets the call: at the end of a run, or when its consumer closes.
    pub fn finish(&mut self, mut out: impl FnMut(&aplc_vm::Event)) {
        if let Some((stream, _, _)) = self.call.as_mut() {
            let rest = stream.finish();
            self.pass(rest, &mut out);
        }
        self.call = None;
    }

    /// Passes on one delta of the current call with `text` (redacted), unless empty.
    fn pass(&mut self, text: String, out: &mut impl FnMut(&aplc_vm::Event)) {
        let Some((_, last, next)) = self.call.as_mut() else {
            return;
        };
        if text.is_empty() {
            return;
        }
        let mut delta = last.clone();
        if let aplc_vm::EventKind::ProviderDelta {
            text: slot, index, ..
        } = &mut delta.kind
        {
            *slot = text;
            *index = *next;
        }
        *next += 1;
        out(&delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether any `REDACTED_RUN`-character window of `secret` is in `text`, in any case.
    fn leaks(secret: &str, text: &str) -> bool {
        let (secret, text) = (secret.to_ascii_lowercase(), text.to_ascii_lowercase());
        (0..=secret.len().saturating_sub(REDACTED_RUN))
            .any(|i| text.contains(&secret[i..(i + REDACTED_RUN).min(secret.len())]))
    }

    #[test]
    fn whole_secrets_parts_and_any_case_are_replaced() {
        let key = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789";
        let redactor = Redactor::new([key, "extra-secret", "1", "Bearer tok-0123456789abcd"]);
        assert_eq!(
            redactor.redact(&format!("a {key} b extra-secret c 1")),
            "a <redacted> b <redacted> c 1"
        );
        assert_eq!(redactor.redact(&key.to_uppercase()), "<redacted>");
        assert_eq!(redactor.redact("EXTRA-SECRET"), "<redacted>");
        // A part of the key, cut on both sides, is caught; 15 characters are not a run.
        assert_eq!(
            redactor.redact(&format!("x{}y", &key[5..30])),
            "x<redacted>y"
        );
        assert_eq!(redactor.redact(&key[3..18]), &key[3..18]);
        // The token of a `Bearer` header value, alone (the space before it is a run of
        // the whole value too).
        assert_eq!(redactor.redact("got tok-0123456789abcd"), "got<redacted>");
        assert_eq!(
            redactor.redact("got\ntok-0123456789abcd"),
            "got\n<redacted>"
        );
        assert_eq!(Redactor::new([]).redact(key), key);
    }

    #[test]
    fn json_results_are_redacted_in_every_string_and_key() {
        let key = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789";
        let redactor = Redactor::new([key]);
        let result = serde_json::json!({
            "ok": true, "n": 1, "note": format!("key={key}"),
            key: [format!("{}", key.to_uppercase()), null],
        });
        assert_eq!(
            redactor.redact_json(result),
            serde_json::json!({"ok": true, "n": 1, "note": "key=<redacted>",
                               "<redacted>": ["<redacted>", null]})
        );
        let plain = serde_json::json!({"a": key});
        assert_eq!(Redactor::default().redact_json(plain.clone()), plain);
    }

    #[test]
    fn a_secret_split_across_pieces_is_redacted() {
        let key = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789";
        let text = format!(
            "say {key} twice: {} and a short ab-secret-x.",
            key.to_uppercase()
        );
        let whole = Redactor::new([key, "ab-secret-x"]).redact(&text);
        // Every way of cutting the text into pieces of `size` gives the whole text's
        // redaction, and no piece reveals a run of the key.
        for size in 1..=text.len() {
            let mut stream = StreamRedactor::new(Redactor::new([key, "ab-secret-x"]));
            let mut out = String::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(size) {
                let piece: String = piece.iter().collect();
                let released = stream.push(&piece);
                assert!(!leaks(key, &released), "size {size}: {released}");
                out.push_str(&released);
            }
            out.push_str(&stream.finish());
            assert_eq!(out, whole, "size {size}");
        }
        // Without secrets nothing is held back.
        let mut plain = StreamRedactor::default();
        assert_eq!(plain.push("abc"), "abc");
        assert_eq!(plain.finish(), "");
    }

    #[test]
    fn deltas_are_redacted_per_call_and_renumbered() {
        use aplc_vm::{Event, EventKind};
        let key = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789";
        let text = format!("the key {key} is here");
        let at = std::time::Duration::ZERO;
        let mut deltas = DeltaRedactor::new(Redactor::new([key]));
        let mut out: Vec<Event> = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for (i, piece) in chars.chunks(7).enumerate() {
            let piece: String = piece.iter().collect();
            let delta = Event::provider_delta(3, at, "a", i as u64, piece);
            deltas.on_event(&delta, |e| out.push(e.clone()));
        }
        let next = Event {
            seq: 4,
            t_ms: 1.0,
            path: None,
            kind: EventKind::StepFinished {
                step: "a".into(),
                duration_ms: 1.0,
            },
        };
        deltas.on_event(&next, |e| out.push(e.clone()));
        let (last, passed) = out.split_last().unwrap();
        assert_eq!(
            last, &next,
            "the held rest goes out before the call's next event"
        );
        let mut joined = String::new();
        for (i, delta) in passed.iter().enumerate() {
            let EventKind::ProviderDelta { text, index, .. } = &delta.kind else {
                panic!("{delta:?}");
            };
            assert_eq!((delta.seq, *index), (3, i as u64));
            joined.push_str(text);
        }
        assert_eq!(joined, "the key <redacted> is here");
        // Nothing is held after the call; `finish` passes nothing more.
        deltas.finish(|e| panic!("{e:?}"));
    }

    #[test]
    fn clipping_comes_after_redaction() {
        // The case: an 80-character preamble, then a 164-character key.
        let key: String = (0..164)
            .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
            .collect();
        let redactor = Redactor::new([key.as_str()]);
        let body = format!("{}{key} and more", "p".repeat(80));
        let clipped = redactor.clip(&body, 200);
        assert!(!leaks(&key, &clipped), "{clipped}");
        assert!(clipped.starts_with(&"p".repeat(80)), "{clipped}");
        // Wherever the cut falls, no run of the key is left.
        for offset in 0..220 {
            let body = format!("{}{key}{}", "p".repeat(offset), "q".repeat(300));
            let clipped = redactor.clip(&body, 200);
            assert!(!leaks(&key, &clipped), "offset {offset}: {clipped}");
            assert!(clipped.chars().count() <= 201, "{clipped}");
        }
        assert_eq!(redactor.clip("a\nb", 200), "a b");
        let long = "x".repeat(5000);
        assert_eq!(redactor.clip(&long, 10), format!("{}…", "x".repeat(10)));
    }
}
