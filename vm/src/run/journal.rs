//! The durable form of a run: the inputs a [`Machine`](crate::Machine) consumed, and
//! checkpoints of its state.
//!
//! A machine is deterministic given its inputs: the times passed to `poll` and
//! `handle_*`, the provider completions and the tool results. Journaling those inputs,
//! in order, is enough to rebuild a run exactly by replaying them into a fresh machine
//! (`spec/durability.md`). A [`Checkpoint`] spares the replay from step 0: it is the
//! machine's state at a point where its next input is a `poll`, plus the segment of
//! `context_history` since the previous checkpoint, so storage grows with what each step
//! changed and never with the whole history.
//!
//! These are boundary types: they derive serde and encode with postcard. The run state
//! they are made from (`machine.rs`, `store.rs`) does not.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::human::{HumanAnswer, Reply};
use crate::{Completion, FinishReason, Part, ProviderError, ToolCall, Usage};

/// One input the machine consumed, with the time it was given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Input {
    /// `Machine::poll(at)`.
    Poll {
        /// Time since the run started.
        at: Duration,
    },
    /// `Machine::handle_provider_response(at, result)`.
    Provider {
        /// Time since the run started.
        at: Duration,
        /// What the provider answered (`Completion::raw` is not kept).
        result: Result<Completion, ProviderError>,
    },
    /// `Machine::handle_tool_result(at, result)`.
    Tool {
        /// Time since the run started.
        at: Duration,
        /// The tool's output or error message.
        result: Result<serde_json::Value, String>,
    },
    /// `Machine::handle_timeout(at)`.
    Timeout {
        /// Time since the run started.
        at: Duration,
    },
    /// A person's answer to one of the requests the machine waits on (`spec/human.md`).
    Answer {
        /// Time since the run started: the time the run paused, since a run's clock
        /// stands still while it waits.
        at: Duration,
        /// The answer, with who gave it and when.
        answer: HumanAnswer,
    },
}

impl Input {
    /// The time the input was given.
    pub fn at(&self) -> Duration {
        match self {
            Input::Poll { at }
            | Input::Provider { at, .. }
            | Input::Tool { at, .. }
            | Input::Timeout { at }
            | Input::Answer { at, .. } => *at,
        }
    }

    /// Encodes the input as a journal entry recording `after`, the position the run
    /// reached once it took the input: a format byte ([`INPUT_FORMAT`]), the input in
    /// postcard, then the position.
    pub fn encode(&self, after: Position) -> Vec<u8> {
        self.entry_head().finish(after)
    }

    /// The first half of [`Input::encode`]: a driver encodes the input before handing it
    /// to the machine, which takes it by value, and finishes the entry with the position
    /// the machine then reports; the input is never cloned.
    ///
    /// postcard is not self-describing, so it cannot read a `serde_json::Value` back; the
    /// JSON inside an input (tool results, tool-call arguments, usage fields) is kept as
    /// JSON text, which serde_json reads back exactly (key order included) and with its
    /// nesting limit of 128.
    pub fn entry_head(&self) -> EntryHead {
        // Room for a poll's entry and most answers' at once: growing from one byte took
        // four reallocations per entry, a tenth of a durable step's own work (issue #24).
        let mut entry = Vec::with_capacity(64);
        entry.push(INPUT_FORMAT);
        // Five of a provider loop's six inputs a step are polls: their bytes are written
        // here, as postcard writes them (a test holds the two to the same bytes).
        let wire = match self {
            Input::Poll { at } => return EntryHead::time(entry, WIRE_POLL, *at),
            Input::Timeout { at } => return EntryHead::time(entry, WIRE_TIMEOUT, *at),
            Input::Provider { at, result } => WireInput::Provider {
                at: *at,
                result: match result {
                    Ok(completion) => Ok(WireCompletion::from(completion)),
                    Err(error) => Err(error.clone()),
                },
            },
            Input::Tool { at, result } => WireInput::Tool {
                at: *at,
                result: match result {
                    Ok(value) => Ok(value.to_string()),
                    Err(message) => Err(message.clone()),
                },
            },
            Input::Answer { at, answer } => WireInput::Answer {
                at: *at,
                answer: WireAnswer::from(answer),
            },
        };
        // Serializing into a Vec fails only on types postcard cannot write (sequences of
        // unknown length, `deserialize_any`-only values); `WireInput` has none.
        EntryHead(
            postcard::to_extend(&wire, entry)
                .expect("postcard serializes every WireInput: plain structs, strings, integers"),
        )
    }

    /// Decodes an entry written by [`Input::encode`] (and [`Position::finish`]): the
    /// input, and the position the run reached after it, if the entry records one
    /// (entries of format 1, written before positions, do not). Any other bytes, truncated or
    /// trailing ones included, are [`JournalError::Corrupt`]; memory use is bounded by a
    /// small multiple of `bytes.len()`.
    pub fn decode_entry(bytes: &[u8]) -> Result<(Input, Option<Position>), JournalError> {
        let Some((&format, payload)) = bytes.split_first() else {
            return Err(JournalError::Corrupt("empty input entry".into()));
        };
        if format != INPUT_FORMAT && format != INPUT_FORMAT_UNPOSITIONED {
            return Err(JournalError::Corrupt(format!(
                "input entry format {format}, expected {INPUT_FORMAT}"
            )));
        }
        let (wire, rest): (WireInput, &[u8]) = postcard::take_from_bytes(payload)
            .map_err(|error| JournalError::Corrupt(format!("input entry: {error}")))?;
        let (position, rest) = if format == INPUT_FORMAT {
            let (position, rest): (Position, &[u8]) = postcard::take_from_bytes(rest)
                .map_err(|error| JournalError::Corrupt(format!("input entry position: {error}")))?;
            (Some(position), rest)
        } else {
            (None, rest)
        };
        if !rest.is_empty() {
            return Err(JournalError::Corrupt(format!(
                "input entry: {} trailing bytes",
                rest.len()
            )));
        }
        let input = match wire {
            WireInput::Poll { at } => Input::Poll { at },
            WireInput::Provider { at, result } => Input::Provider {
                at,
                result: match result {
                    Ok(completion) => Ok(completion.into_completion()?),
                    Err(error) => Err(error),
                },
            },
            WireInput::Tool { at, result } => Input::Tool {
                at,
                result: match result {
                    Ok(text) => Ok(json_from_text(&text, "tool result")?),
                    Err(message) => Err(message),
                },
            },
            WireInput::Timeout { at } => Input::Timeout { at },
            WireInput::Answer { at, answer } => Input::Answer {
                at,
                answer: answer.into_answer()?,
            },
        };
        Ok((input, position))
    }

    /// The input of an entry ([`Input::decode_entry`] without the position).
    pub fn decode(bytes: &[u8]) -> Result<Input, JournalError> {
        Input::decode_entry(bytes).map(|(input, _)| input)
    }
}

/// Where a run is after an input: how many events it has made and how many steps it has
/// entered ([`Machine::position`](crate::Machine::position)). A journal records it with
/// every input, and a replay checks it input by input
/// ([`Machine::replay`](crate::Machine::replay)), so a journal that a changed machine
/// would replay another way is refused where it diverges, not run on silently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Events made so far: the next event's `seq`.
    pub events: u64,
    /// Steps entered so far.
    pub steps: u64,
}

/// A journal entry whose position is still to come ([`Input::entry_head`]).
#[derive(Debug)]
#[must_use = "an entry is complete only once finished with its position"]
pub struct EntryHead(Vec<u8>);

impl EntryHead {
    /// The complete entry: the input, then `after` (as postcard writes a [`Position`]).
    pub fn finish(self, after: Position) -> Vec<u8> {
        let mut entry = self.0;
        push_varint(&mut entry, after.events);
        push_varint(&mut entry, after.steps);
        entry
    }

    /// The head of a [`WireInput`] that holds only its time: its variant's index, then
    /// the [`Duration`]'s seconds and nanoseconds, as postcard writes them.
    fn time(mut entry: Vec<u8>, variant: u8, at: Duration) -> EntryHead {
        entry.push(variant);
        push_varint(&mut entry, at.as_secs());
        push_varint(&mut entry, u64::from(at.subsec_nanos()));
        EntryHead(entry)
    }
}

/// The index postcard writes for [`WireInput::Poll`] and [`WireInput::Timeout`].
const WIRE_POLL: u8 = 0;
const WIRE_TIMEOUT: u8 = 3;

/// An unsigned integer as postcard writes it: seven bits a byte, low first, the top bit
/// set on every byte but the last.
fn push_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// The first byte of every journal entry ([`Input::encode`]): the version of its layout.
/// Format 2 follows the input with the [`Position`] after it.
pub const INPUT_FORMAT: u8 = 2;

/// Entries written before positions: the input alone. Still read, so a run journaled by
/// an older aplc resumes (without the per-input check).
pub const INPUT_FORMAT_UNPOSITIONED: u8 = 1;

/// [`Input`] as postcard writes it: JSON values as JSON text (see [`Input::encode`]).
#[derive(Serialize, Deserialize)]
enum WireInput {
    Poll {
        at: Duration,
    },
    Provider {
        at: Duration,
        result: Result<WireCompletion, ProviderError>,
    },
    Tool {
        at: Duration,
        result: Result<String, String>,
    },
    Timeout {
        at: Duration,
    },
    /// Last, so that the variants before keep their postcard tags.
    Answer {
        at: Duration,
        answer: WireAnswer,
    },
}

/// [`HumanAnswer`] with its value as JSON text.
#[derive(Serialize, Deserialize)]
struct WireAnswer {
    id: String,
    reply: WireReply,
    by: String,
    answered_at_ms: i64,
}

#[derive(Serialize, Deserialize)]
enum WireReply {
    Approve {
        approved: bool,
        reason: Option<String>,
    },
    Value(String),
    TimedOut,
}

impl From<&HumanAnswer> for WireAnswer {
    fn from(answer: &HumanAnswer) -> WireAnswer {
        WireAnswer {
            id: answer.id.clone(),
            reply: match &answer.reply {
                Reply::Approve { approved, reason } => WireReply::Approve {
                    approved: *approved,
                    reason: reason.clone(),
                },
                Reply::Value(value) => WireReply::Value(value.to_string()),
                Reply::TimedOut => WireReply::TimedOut,
            },
            by: answer.by.clone(),
            answered_at_ms: answer.answered_at_ms,
        }
    }
}

impl WireAnswer {
    fn into_answer(self) -> Result<HumanAnswer, JournalError> {
        Ok(HumanAnswer {
            id: self.id,
            reply: match self.reply {
                WireReply::Approve { approved, reason } => Reply::Approve { approved, reason },
                WireReply::Value(text) => Reply::Value(json_from_text(&text, "answer")?),
                WireReply::TimedOut => Reply::TimedOut,
            },
            by: self.by,
            answered_at_ms: self.answered_at_ms,
        })
    }
}

/// [`Completion`] without `raw`, its JSON as text.
#[derive(Serialize, Deserialize)]
struct WireCompletion {
    role: String,
    content: Vec<Part>,
    /// `(id, name, arguments as JSON text)`.
    tool_calls: Vec<(String, String, String)>,
    /// `(input_tokens, output_tokens, fields as JSON text)`.
    usage: Option<(Option<u64>, Option<u64>, String)>,
    finish_reason: Option<FinishReason>,
    model: Option<String>,
}

impl From<&Completion> for WireCompletion {
    fn from(completion: &Completion) -> WireCompletion {
        WireCompletion {
            role: completion.role.clone(),
            content: completion.content.clone(),
            tool_calls: completion
                .tool_calls
                .iter()
                .map(|call| {
                    (
                        call.id.clone(),
                        call.name.clone(),
                        call.arguments.to_string(),
                    )
                })
                .collect(),
            usage: completion.usage.as_ref().map(|usage| {
                (
                    usage.input_tokens,
                    usage.output_tokens,
                    serde_json::Value::Object(usage.fields.clone()).to_string(),
                )
            }),
            finish_reason: completion.finish_reason.clone(),
            model: completion.model.clone(),
        }
    }
}

impl WireCompletion {
    fn into_completion(self) -> Result<Completion, JournalError> {
        let tool_calls = self
            .tool_calls
            .into_iter()
            .map(|(id, name, arguments)| {
                Ok(ToolCall::new(
                    id,
                    name,
                    json_from_text(&arguments, "tool-call arguments")?,
                ))
            })
            .collect::<Result<Vec<_>, JournalError>>()?;
        let usage = match self.usage {
            None => None,
            Some((input_tokens, output_tokens, fields)) => {
                match json_from_text(&fields, "usage")? {
                    serde_json::Value::Object(fields) => Some(Usage {
                        input_tokens,
                        output_tokens,
                        fields,
                    }),
                    _ => return Err(JournalError::Corrupt("usage is not an object".into())),
                }
            }
        };
        Ok(Completion {
            role: self.role,
            content: self.content,
            tool_calls,
            usage,
            finish_reason: self.finish_reason,
            model: self.model,
            raw: None,
        })
    }
}

fn json_from_text(text: &str, what: &str) -> Result<serde_json::Value, JournalError> {
    serde_json::from_str(text).map_err(|error| JournalError::Corrupt(format!("{what}: {error}")))
}

/// A machine's state at rest (its next input is a `poll`), encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Index of the first `context_history` entry in `history`.
    pub history_start: u64,
    /// `context_history` entries `history_start..`, encoded as deltas.
    pub history: Vec<u8>,
    /// Everything else: variables, position, counters, ledger, tool round, events'
    /// sequence numbers.
    pub state: Vec<u8>,
}

/// A journal or checkpoint that cannot be read or made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// Bytes that do not decode.
    #[error("corrupt journal entry: {0}")]
    Corrupt(String),
    /// A checkpoint asked for while a provider or tool call is outstanding.
    #[error("the machine is not at rest: {0}")]
    NotAtRest(&'static str),
    /// A value that has no durable form (a macro, a callable): the caller skips this
    /// checkpoint, and resume replays from an earlier one.
    #[error("variable `{name}` holds a {kind}, which cannot be checkpointed")]
    Unencodable {
        /// The variable.
        name: String,
        /// What it holds.
        kind: String,
    },
    /// A checkpoint of another program, or segments out of order.
    #[error("checkpoint does not match: {0}")]
    Mismatch(String),
    /// Replaying the journal went another way than the run that wrote it
    /// ([`Machine::replay`](crate::Machine::replay)).
    #[error("the journal does not replay on this machine: {0}")]
    Diverged(String),
}

#[cfg(test)]
mod tests {
    /// The bytes written by hand for polls, timeouts and positions are postcard's.
    #[test]
    fn hand_written_entries_are_postcards() {
        let times = [
            0,
            1,
            127,
            128,
            999_999,
            1_000_000_000,
            u64::from(u32::MAX) * 7,
        ];
        for secs in [0, 1, 127, 128, 300, 1 << 20, u64::MAX >> 1, u64::MAX] {
            for nanos in [0u32, 1, 127, 128, 16_383, 16_384, 999_999_999] {
                let at = Duration::new(secs, nanos);
                for (input, wire) in [
                    (Input::Poll { at }, WireInput::Poll { at }),
                    (Input::Timeout { at }, WireInput::Timeout { at }),
                ] {
                    for (&events, &steps) in times.iter().zip(times.iter().rev()) {
                        let after = Position { events, steps };
                        let generic = postcard::to_extend(&wire, vec![INPUT_FORMAT]).unwrap();
                        let generic = postcard::to_extend(&after, generic).unwrap();
                        assert_eq!(input.encode(after), generic, "{input:?} {after:?}");
                        let (back, position) = Input::decode_entry(&generic).unwrap();
                        assert_eq!((back, position), (input.clone(), Some(after)));
                    }
                }
            }
        }
    }

    use super::*;
    use crate::{FinishReason, ProviderErrorKind};
    use serde_json::json;

    fn inputs() -> Vec<Input> {
        let mut completion = Completion::text("hi");
        completion.content.push(Part::ImageUrl("data:x".into()));
        completion.tool_calls = vec![
            ToolCall::new("c1", "add", json!("{\"a\": 1}")),
            ToolCall::new("c2", "mul", json!({"z": 1.0, "a": [1, -2, null, true]})),
        ];
        let mut fields = serde_json::Map::new();
        fields.insert("total_tokens".into(), json!(3));
        fields.insert("prompt_tokens".into(), json!(1));
        completion.usage = Some(Usage {
            input_tokens: Some(1),
            output_tokens: None,
            fields,
        });
        completion.finish_reason = Some(FinishReason::Other("weird".into()));
        completion.model = Some("m".into());
        vec![
            Input::Poll {
                at: Duration::new(3, 141_592_653),
            },
            Input::Provider {
                at: Duration::from_millis(5),
                result: Ok(completion),
            },
            Input::Provider {
                at: Duration::from_millis(6),
                result: Ok(Completion::empty()),
            },
            Input::Provider {
                at: Duration::ZERO,
                result: Err(ProviderError::new(
                    ProviderErrorKind::RateLimited,
                    "slow down",
                )),
            },
            Input::Tool {
                at: Duration::from_secs(u64::MAX),
                result: Ok(json!({"b": 1, "a": 1.5, "c": u64::MAX, "d": i64::MIN})),
            },
            Input::Tool {
                at: Duration::from_secs(1),
                result: Err("boom".into()),
            },
            Input::Timeout {
                at: Duration::from_nanos(1),
            },
            Input::Answer {
                at: Duration::from_millis(9),
                answer: HumanAnswer {
                    id: "3-1".into(),
                    reply: Reply::Approve {
                        approved: false,
                        reason: Some("too much".into()),
                    },
                    by: "cli".into(),
                    answered_at_ms: 1_790_000_000_000,
                },
            },
            Input::Answer {
                at: Duration::from_millis(10),
                answer: HumanAnswer {
                    id: "4-0".into(),
                    reply: Reply::Value(json!({"z": 1, "a": [true, null]})),
                    by: "5d2c9a11".into(),
                    answered_at_ms: -1,
                },
            },
            Input::Answer {
                at: Duration::ZERO,
                answer: HumanAnswer {
                    id: "4-2".into(),
                    reply: Reply::TimedOut,
                    by: "timeout".into(),
                    answered_at_ms: 0,
                },
            },
        ]
    }

    const AFTER: Position = Position {
        events: 300,
        steps: 7,
    };

    #[test]
    fn every_input_round_trips_exactly() {
        for input in inputs() {
            let bytes = input.encode(AFTER);
            assert_eq!(bytes[0], INPUT_FORMAT);
            let (back, after) = Input::decode_entry(&bytes).unwrap();
            assert_eq!(after, Some(AFTER));
            assert_eq!(back, input);
            // Key order and number kinds survive, not only equality.
            if let (Input::Tool { result: Ok(a), .. }, Input::Tool { result: Ok(b), .. }) =
                (&input, &back)
            {
                assert_eq!(a.to_string(), b.to_string());
            }
        }
    }

    /// An entry journaled before positions (format 1: the input alone) still reads, so
    /// a run an older aplc journaled resumes.
    #[test]
    fn entries_without_a_position_still_read() {
        for input in inputs() {
            let mut bytes = input.entry_head().0;
            bytes[0] = INPUT_FORMAT_UNPOSITIONED;
            assert_eq!(Input::decode_entry(&bytes), Ok((input, None)));
        }
    }

    #[test]
    fn bad_bytes_are_corrupt() {
        assert!(matches!(Input::decode(&[]), Err(JournalError::Corrupt(_))));
        assert!(matches!(
            Input::decode(&[3, 0, 0, 0, 0, 0]),
            Err(JournalError::Corrupt(_))
        ));
        for input in inputs() {
            let bytes = input.encode(AFTER);
            for len in 0..bytes.len() {
                assert!(
                    matches!(Input::decode(&bytes[..len]), Err(JournalError::Corrupt(_))),
                    "truncated to {len}: {input:?}"
                );
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(matches!(
                Input::decode(&long),
                Err(JournalError::Corrupt(_))
            ));
        }
    }

    #[test]
    fn a_huge_length_prefix_does_not_allocate_it() {
        // Provider, Ok, role of length u32::MAX: postcard checks lengths against the input.
        let bytes = [INPUT_FORMAT, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(matches!(
            Input::decode(&bytes),
            Err(JournalError::Corrupt(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = Input::decode(&bytes);
        }

        #[test]
        fn flipped_bits_never_panic(index in 0usize..4096, bit in 0u8..8) {
            for input in inputs() {
                let mut bytes = input.encode(AFTER);
                let at = index % bytes.len();
                bytes[at] ^= 1 << bit;
                if let Ok((back, after)) = Input::decode_entry(&bytes) {
                    // A flip that still decodes gives some valid input, which round-trips.
                    let after = after.unwrap_or(AFTER);
                    proptest::prop_assert_eq!(Input::decode_entry(&back.encode(after)), Ok((back, Some(after))));
                }
            }
        }
    }
}
