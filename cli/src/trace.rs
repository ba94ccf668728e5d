//! `aplc trace FILE`: a readable timeline of a run from its events file (JSON Lines, as
//! `aplc run --events FILE` and `aplc runs events` write it), then its totals.
//!
//! The file may come from anywhere, so it is read one bounded line at a time (memory
//! does not grow with the file), a line that is not an event is an error naming its
//! number, event types this aplc does not know are skipped (spec/events.md: readers
//! ignore them), and a file cut short prints what is there and says so.

use std::io::{BufRead, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use aplc_vm::Event;
use aplc_vm::text::escape_control;
use clap::Args;
use serde_json::Value as Json;

use crate::Failure;
use crate::timeline::{Timeline, ms, status};

/// The longest line read: far more than any event of a real run (an error message is
/// clipped well below this), small enough that a hostile file cannot exhaust memory.
const MAX_LINE: u64 = 16 * 1024 * 1024;

/// The event types of events format version 1: a line of one of these types that does
/// not parse is malformed; any other type is skipped.
const KNOWN_TYPES: &[&str] = &[
    "run_started",
    "step_started",
    "phase_finished",
    "provider_call",
    "provider_result",
    "tool_call",
    "tool_result",
    "error",
    "jump",
    "step_finished",
    "run_finished",
    "agent_started",
    "agent_finished",
];

#[derive(Args, Debug)]
pub(crate) struct TraceArgs {
    /// The events file (JSON Lines); `-` reads stdin.
    file: PathBuf,
}

pub(crate) fn trace(args: &TraceArgs) -> Result<ExitCode, Failure> {
    let name = args.file.display().to_string();
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let written = if args.file.as_os_str() == "-" {
        timeline(std::io::stdin().lock(), &name, &mut out)
    } else {
        let file = std::fs::File::open(&args.file)
            .map_err(|e| Failure::usage(format!("cannot read {name}: {e}")))?;
        timeline(std::io::BufReader::new(file), &name, &mut out)
    };
    match written.and_then(|()| out.flush().map_err(Stop::Io)) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // A closed stdout (`| head`) ends the listing quietly.
        Err(Stop::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(Stop::Io(e)) => Err(Failure::run(format!("cannot write the timeline: {e}"))),
        Err(Stop::Failure(failure)) => {
            // What was read before the bad line is still shown.
            let _ = out.flush();
            Err(failure)
        }
    }
}

/// Why the timeline stopped early.
enum Stop {
    /// Writing stdout failed.
    Io(std::io::Error),
    /// The input is not an events file.
    Failure(Failure),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Stop {
        Stop::Io(e)
    }
}

/// Reads `input` line by line and writes the timeline and totals to `out`.
fn timeline(mut input: impl BufRead, name: &str, out: &mut impl Write) -> Result<(), Stop> {
    let mut timeline = Timeline::new(true);
    let mut line = Vec::new();
    let mut number = 0u64;
    let mut cut_short = false;
    let malformed = |number: u64, why: String| {
        Stop::Failure(Failure::usage(format!(
            "{name}: line {number}: not an event: {why}"
        )))
    };
    loop {
        line.clear();
        let read = input
            .by_ref()
            .take(MAX_LINE + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| Stop::Failure(Failure::usage(format!("cannot read {name}: {e}"))))?;
        if read == 0 {
            break;
        }
        number += 1;
        let complete = line.last() == Some(&b'\n');
        if !complete && line.len() as u64 > MAX_LINE {
            return Err(malformed(
                number,
                format!("the line is longer than {MAX_LINE} bytes"),
            ));
        }
        let text = match std::str::from_utf8(&line) {
            Ok(text) => text.trim(),
            Err(_) if !complete => {
                cut_short = true;
                break;
            }
            Err(e) => {
                return Err(malformed(
                    number,
                    format!("invalid UTF-8 at byte {}", e.valid_up_to()),
                ));
            }
        };
        if text.is_empty() {
            continue;
        }
        let event = match parse(text) {
            Ok(Some(event)) => event,
            Ok(None) => continue,
            // The last line of a file whose writer was killed mid-write.
            Err(_) if !complete => {
                cut_short = true;
                break;
            }
            Err(why) => return Err(malformed(number, why)),
        };
        if let Some(text) = timeline.line(&event) {
            writeln!(out, "{}", escape_control(&text))?;
        }
    }
    let t = &timeline.totals;
    writeln!(out)?;
    if cut_short {
        writeln!(out, "the last line ({number}) is cut short")?;
    }
    if number == 0 {
        writeln!(out, "{name} holds no events")?;
    }
    let (outcome, wall) = match t.finished {
        Some((outcome, elapsed)) => (status(outcome).to_owned(), elapsed),
        None => (
            "did not finish (no run_finished event)".to_owned(),
            t.last_t_ms,
        ),
    };
    writeln!(out, "steps           {}", t.steps)?;
    writeln!(
        out,
        "provider calls  {} ({} failed)",
        t.provider_calls, t.provider_failed
    )?;
    writeln!(
        out,
        "tool calls      {} ({} failed, {} cached)",
        t.tool_calls, t.tool_failed, t.tool_cached
    )?;
    writeln!(
        out,
        "tokens          {} in, {} out",
        t.input_tokens, t.output_tokens
    )?;
    writeln!(out, "errors          {}", t.errors)?;
    writeln!(out, "wall time       {}", ms(wall))?;
    writeln!(out, "status          {outcome}")?;
    Ok(())
}

/// One line: `Ok(None)` for an event type this aplc does not know.
fn parse(text: &str) -> Result<Option<Event>, String> {
    let json: Json = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let kind = match json.get("type") {
        Some(Json::String(kind)) => kind.clone(),
        Some(_) => return Err("`type` is not a string".into()),
        None if json.is_object() => return Err("no `type`".into()),
        None => return Err("not a JSON object".into()),
    };
    match serde_json::from_value::<Event>(json) {
        Ok(event) => Ok(Some(event)),
        Err(e) if KNOWN_TYPES.contains(&kind.as_str()) => Err(e.to_string()),
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(input: &str) -> Result<String, String> {
        let mut out = Vec::new();
        match timeline(input.as_bytes(), "f.jsonl", &mut out) {
            Ok(()) => Ok(String::from_utf8(out).unwrap_or_default()),
            Err(Stop::Failure(f)) => Err(f.message),
            Err(Stop::Io(e)) => Err(e.to_string()),
        }
    }

    const STEP: &str = r#"{"seq":1,"t_ms":0.5,"type":"step_started","step":"a","runs":0}"#;

    #[test]
    fn unknown_types_and_blank_lines_are_skipped() {
        let input = format!("{STEP}\n\n{{\"seq\":2,\"t_ms\":1,\"type\":\"from_the_future\"}}\n");
        let out = run(&input).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.contains("step a (runs 0)"), "{out}");
        assert!(out.contains("steps           1"), "{out}");
        assert!(out.contains("did not finish"), "{out}");
    }

    #[test]
    fn a_bad_line_names_its_number() {
        for bad in [
            "nope",
            "[1]",
            r#"{"type":7}"#,
            r#"{"seq":2,"t_ms":1,"type":"step_started"}"#,
        ] {
            let err = run(&format!("{STEP}\n{bad}\n")).unwrap_err();
            assert!(err.starts_with("f.jsonl: line 2: not an event: "), "{err}");
        }
    }

    #[test]
    fn a_last_line_cut_short_is_not_an_error() {
        let out = run(&format!("{STEP}\n{{\"seq\":2,\"t_m")).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.contains("the last line (2) is cut short"), "{out}");
        assert!(out.contains("did not finish"), "{out}");
    }

    #[test]
    fn an_empty_file_says_so() {
        let out = run("").unwrap_or_else(|e| panic!("{e}"));
        assert!(out.contains("f.jsonl holds no events"), "{out}");
        assert!(out.contains("did not finish"), "{out}");
    }

    #[test]
    fn control_characters_are_escaped() {
        let input = r#"{"seq":1,"t_ms":0.5,"type":"step_started","step":"a\u001b[2Jb","runs":0}"#;
        let out = run(input).unwrap_or_else(|e| panic!("{e}"));
        assert!(!out.contains('\u{1b}'), "{out}");
    }
}
