//! People in the loop on the command line (spec/human.md §4.1): the terminal that asks a
//! person (`aplc run`, `aplc resume` on a terminal), and the answers `aplc resume` takes
//! from its flags (`--approve`, `--deny`, `--input`, `--input-file`), checked against the
//! run's pending requests before any is stored.

use std::io::{BufRead, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use aplc_runtime::driver::BoxFuture;
use aplc_runtime::human::{Answerer, Nobody, Pending, answer_json, now_ms, reply_from_json};
use aplc_runtime::store::{Answered, RunStore};
use aplc_vm::human::{HumanAnswer, InputRequest, Reply, RequestKind};
use aplc_vm::text::escape_control;
use clap::Args;
use serde_json::Value as Json;

use crate::Failure;

/// Who may answer a run's requests in this process: `aplc run` and `aplc resume`.
#[derive(Args, Debug, Default)]
pub(crate) struct AskArgs {
    /// Never ask on the terminal: a run that needs an answer waits in its store (exit 4),
    /// or, without a store, fails.
    #[arg(long)]
    pub(crate) no_input: bool,
    /// Who answers, as the journal records it (default `cli`).
    #[arg(long = "as", value_name = "NAME")]
    pub(crate) by: Option<String>,
}

impl AskArgs {
    /// Who answers requests here: the terminal when stdin is one and `--no-input` is not
    /// given, else nobody.
    pub(crate) fn answerer(&self) -> Arc<dyn Answerer> {
        if !self.no_input && std::io::stdin().is_terminal() {
            Arc::new(Terminal { by: self.by() })
        } else {
            Arc::new(Nobody)
        }
    }

    fn by(&self) -> String {
        self.by.clone().unwrap_or_else(|| "cli".into())
    }
}

/// The answers `aplc resume` is given.
#[derive(Args, Debug, Default)]
pub(crate) struct AnswerArgs {
    /// Approve request ID (repeatable).
    #[arg(long, value_name = "ID")]
    approve: Vec<String>,
    /// Deny request ID, with an optional reason (repeatable).
    #[arg(long, value_name = "ID[=REASON]")]
    deny: Vec<String>,
    /// Answer request ID with a JSON value (repeatable).
    #[arg(long, value_name = "ID=JSON")]
    input: Vec<String>,
    /// Answers as a JSON object from request id to answer: true/false or
    /// {"approve", "reason"} for an approval, the value for the others.
    #[arg(long, value_name = "FILE")]
    input_file: Option<PathBuf>,
}

impl AnswerArgs {
    /// Checks every answer against the run's pending requests, then stores them all: one
    /// bad answer (an unknown request, a wrong kind, a schema violation, one answered
    /// already) stores none.
    pub(crate) async fn store(
        &self,
        store: &dyn RunStore,
        run_id: &str,
        ask: &AskArgs,
    ) -> Result<(), Failure> {
        let given = self.given()?;
        if given.is_empty() {
            return Ok(());
        }
        let summary = store
            .summary(run_id)
            .await
            .map_err(|e| Failure::usage(e.to_string()))?;
        if summary.state == aplc_runtime::store::RunState::Finished {
            return Err(Failure::run(format!(
                "run `{run_id}` is already finished: it takes no answers"
            )));
        }
        let pending: Vec<Pending> = summary
            .pending
            .iter()
            .filter_map(Pending::from_json)
            .collect();
        let stored = store
            .answers(run_id)
            .await
            .map_err(|e| Failure::run(e.to_string()))?;
        let by = ask.by();
        let mut answers = Vec::new();
        for (id, given) in given {
            if stored.iter().any(|(answered, _)| *answered == id) {
                return Err(Failure::usage(format!(
                    "request `{}` is already answered",
                    escape_control(&id)
                )));
            }
            let Some(request) = pending.iter().find(|p| p.request.id == id) else {
                return Err(Failure::usage(format!(
                    "run `{run_id}` waits for no request `{}` (answered already, or never \
                     asked){}",
                    escape_control(&id),
                    waiting_for(&pending)
                )));
            };
            let reply = match given {
                Given::Reply(reply) => reply,
                Given::Entry(entry) => entry_reply(&request.request, entry)?,
            };
            request.request.check(&reply).map_err(Failure::usage)?;
            answers.push(HumanAnswer {
                id,
                reply,
                by: by.clone(),
                answered_at_ms: now_ms(),
            });
        }
        for answer in &answers {
            let stored = store
                .answer(run_id, &answer.id, answer_json(answer))
                .await
                .map_err(|e| Failure::run(e.to_string()))?;
            match stored {
                Answered::Accepted { .. } => {}
                // Answered meanwhile (through the service): the first answer stands.
                Answered::AlreadyAnswered => eprintln!(
                    "request `{}` was answered meanwhile; that answer stands",
                    escape_control(&answer.id)
                ),
                other => {
                    return Err(Failure::run(format!(
                        "the store refused the answer: {other:?}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The answers given, in flag order: approvals, denials, inputs, then the file's.
    fn given(&self) -> Result<Vec<(String, Given)>, Failure> {
        let mut given: Vec<(String, Given)> = Vec::new();
        for id in &self.approve {
            given.push((id.clone(), Given::Reply(approve(true, None))));
        }
        for deny in &self.deny {
            let (id, reason) = match deny.split_once('=') {
                Some((id, reason)) => (id, Some(reason.to_owned())),
                None => (deny.as_str(), None),
            };
            given.push((id.to_owned(), Given::Reply(approve(false, reason))));
        }
        for input in &self.input {
            let Some((id, json)) = input.split_once('=') else {
                return Err(Failure::usage(format!(
                    "--input takes ID=JSON, found `{}`",
                    escape_control(input)
                )));
            };
            let value: Json = serde_json::from_str(json).map_err(|e| {
                Failure::usage(format!(
                    "--input {}: the answer is not JSON ({e}); quote a string as JSON: '\"text\"'",
                    escape_control(id)
                ))
            })?;
            given.push((id.to_owned(), Given::Reply(Reply::Value(value))));
        }
        if let Some(file) = &self.input_file {
            let text = crate::input::read_json(file)?;
            let answers: serde_json::Map<String, Json> =
                serde_json::from_str(&text).map_err(|e| {
                    Failure::usage(format!("{}: not a JSON object: {e}", file.display()))
                })?;
            // Read once the request's kind is known: `true` approves an approval and is
            // the value of a question whose schema is a boolean.
            given.extend(
                answers
                    .into_iter()
                    .map(|(id, answer)| (id, Given::Entry(answer))),
            );
        }
        let mut ids: Vec<&str> = given.iter().map(|(id, _)| id.as_str()).collect();
        ids.sort_unstable();
        if let Some(twice) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(Failure::usage(format!(
                "request `{}` is answered twice",
                escape_control(twice[0])
            )));
        }
        Ok(given)
    }
}

/// An answer as given: a reply (the flags), or an entry of `--input-file`, which the
/// kind of the request it answers reads.
#[derive(Debug, PartialEq)]
enum Given {
    Reply(Reply),
    Entry(Json),
}

/// An `--input-file` entry's reply to `request`: `true`/`false` or `{"approve",
/// "reason"}` for an approval, the value itself for the others.
fn entry_reply(request: &InputRequest, entry: Json) -> Result<Reply, Failure> {
    if request.kind != RequestKind::Approval {
        return Ok(Reply::Value(entry));
    }
    match &entry {
        Json::Bool(approved) => return Ok(approve(*approved, None)),
        Json::Object(_) => {
            if let Ok(reply @ Reply::Approve { .. }) = reply_from_json(&entry) {
                return Ok(reply);
            }
        }
        _ => {}
    }
    Err(Failure::usage(format!(
        "request `{}` asks for an approval: answer it with true, false or \
         {{\"approve\": true|false, \"reason\": \"…\"}}",
        escape_control(&request.id)
    )))
}

fn approve(approved: bool, reason: Option<String>) -> Reply {
    Reply::Approve { approved, reason }
}

/// `; it waits for: 1-1, 2-0`, or nothing.
fn waiting_for(pending: &[Pending]) -> String {
    if pending.is_empty() {
        return " (it waits for no answer)".into();
    }
    let ids: Vec<&str> = pending.iter().map(|p| p.request.id.as_str()).collect();
    format!("; it waits for: {}", ids.join(", "))
}

/// A person at the terminal: each request is shown on stderr and answered on stdin. An
/// answer that does not fit its request is asked again; end of input answers nothing
/// (the run then waits in its store, or fails without one).
#[derive(Debug)]
struct Terminal {
    by: String,
}

impl Answerer for Terminal {
    fn answer<'a>(&'a self, pending: &'a [Pending]) -> BoxFuture<'a, Vec<HumanAnswer>> {
        let requests: Vec<InputRequest> = pending.iter().map(|p| p.request.clone()).collect();
        let by = self.by.clone();
        Box::pin(async move {
            // Reading stdin blocks: on a thread of its own, so the runtime goes on. Not
            // the runtime's blocking pool: a read cannot be cancelled, and a runtime
            // waits for its blocking tasks when it shuts down, so Ctrl-C at a question
            // would stop aplc only once Enter was pressed.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let asking = std::thread::Builder::new()
                .name("aplc-ask".into())
                .spawn(move || {
                    let _ = tx.send(ask_all(&requests, &by));
                });
            match asking {
                Ok(_) => rx.await.unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        })
    }
}

fn ask_all(requests: &[InputRequest], by: &str) -> Vec<HumanAnswer> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    // Not locked while a read waits: the error of a Ctrl-C meanwhile must get out.
    let mut err = std::io::stderr();
    let mut answers = Vec::new();
    for request in requests {
        let Some(reply) = ask(request, &mut input, &mut err) else {
            break;
        };
        answers.push(HumanAnswer {
            id: request.id.clone(),
            reply,
            by: by.to_owned(),
            answered_at_ms: now_ms(),
        });
    }
    answers
}

/// Shows `request` and reads its answer, asking again until one fits; `None` at the end
/// of input.
fn ask(request: &InputRequest, input: &mut impl BufRead, out: &mut impl Write) -> Option<Reply> {
    let _ = writeln!(out, "{}", describe(request));
    loop {
        let question = match request.kind {
            RequestKind::Approval => "approve? [y/n] ",
            _ => "answer (text or JSON): ",
        };
        let _ = write!(out, "{question}");
        let _ = out.flush();
        let line = match read_line(input)? {
            Ok(line) => line,
            Err(problem) => {
                let _ = writeln!(out, "{problem}");
                continue;
            }
        };
        let reply = match request.kind {
            RequestKind::Approval => match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => Some(approve(true, None)),
                "n" | "no" => {
                    let _ = write!(out, "reason (optional): ");
                    let _ = out.flush();
                    let reason = read_line(input).and_then(Result::ok).unwrap_or_default();
                    let reason = reason.trim();
                    Some(approve(
                        false,
                        (!reason.is_empty()).then(|| reason.to_owned()),
                    ))
                }
                _ => None,
            },
            _ => Some(Reply::Value(typed(request, &line))),
        };
        match reply.map(|reply| request.check(&reply).map(|()| reply)) {
            Some(Ok(reply)) => return Some(reply),
            Some(Err(message)) => {
                let _ = writeln!(out, "{}", escape_control(&message));
            }
            None => {
                let _ = writeln!(out, "answer y or n");
            }
        }
    }
}

/// A line read as JSON when it is JSON, else as text.
/// Except that a line that is JSON but fails the request's schema, which the line as
/// text would satisfy, is the text: `42` answers a question whose schema is a string.
fn typed(request: &InputRequest, line: &str) -> Json {
    let line = line.trim_end_matches(['\n', '\r']);
    let text = Json::String(line.to_owned());
    match serde_json::from_str::<Json>(line) {
        Ok(json)
            if request.check(&Reply::Value(json.clone())).is_err()
                && request.check(&Reply::Value(text.clone())).is_ok() =>
        {
            text
        }
        Ok(json) => json,
        Err(_) => text,
    }
}

/// The longest line the terminal reads: an answer's limit, and its line break.
const MAX_LINE: u64 = aplc_vm::human::MAX_ANSWER_BYTES as u64 + 2;

/// A line of input without its end; `None` at the end of input (or an unreadable one).
/// A line longer than [`MAX_LINE`] is an error, skipped in pieces of that size, so
/// memory stays bounded however long it is; invalid UTF-8 is replaced.
fn read_line(input: &mut impl BufRead) -> Option<Result<String, String>> {
    let mut bytes = Vec::new();
    match input.by_ref().take(MAX_LINE).read_until(b'\n', &mut bytes) {
        Ok(0) | Err(_) => return None,
        Ok(_) => {}
    }
    if bytes.last() != Some(&b'\n') && bytes.len() as u64 == MAX_LINE {
        loop {
            bytes.clear();
            match input.by_ref().take(MAX_LINE).read_until(b'\n', &mut bytes) {
                Ok(0) | Err(_) => break,
                Ok(_) if bytes.last() == Some(&b'\n') => break,
                Ok(_) => {}
            }
        }
        return Some(Err(format!(
            "that line is longer than an answer may be ({} bytes)",
            aplc_vm::human::MAX_ANSWER_BYTES
        )));
    }
    let line = String::from_utf8_lossy(&bytes);
    Some(Ok(line.trim_end_matches(['\n', '\r']).to_owned()))
}

/// What a person reads about a request.
fn describe(request: &InputRequest) -> String {
    let mut text = format!(
        "input requested: {} ({} in step `{}`)\n  {}",
        escape_control(&request.id),
        request.kind.as_str(),
        escape_control(&request.step),
        escape_control(&request.prompt)
    );
    if let Some(tool) = &request.tool {
        let arguments = request
            .arguments
            .as_ref()
            .map(Json::to_string)
            .unwrap_or_default();
        text.push_str(&format!(
            "\n  tool: {} {}",
            escape_control(tool),
            escape_control(&arguments)
        ));
    }
    if let Some(schema) = &request.schema {
        text.push_str(&format!(
            "\n  schema: {}",
            escape_control(&schema.to_string())
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(kind: RequestKind, schema: Option<Json>) -> InputRequest {
        InputRequest {
            id: "1-1".into(),
            kind,
            prompt: "Go?".into(),
            step: "s".into(),
            tool: Some("refund".into()),
            arguments: Some(json!({"n": 1})),
            schema,
            timeout_ms: None,
            agent: None,
        }
    }

    fn asked(request: &InputRequest, typed_in: &str) -> (Option<Reply>, String) {
        let mut out = Vec::new();
        let reply = ask(request, &mut typed_in.as_bytes(), &mut out);
        (reply, String::from_utf8(out).unwrap())
    }

    #[test]
    fn the_terminal_asks_again_until_an_answer_fits() {
        let approval = request(RequestKind::Approval, None);
        let (reply, shown) = asked(&approval, "maybe\nn\ntoo much\n");
        assert_eq!(reply, Some(approve(false, Some("too much".into()))));
        assert!(shown.contains("tool: refund {\"n\":1}"), "{shown}");
        assert!(shown.contains("answer y or n"), "{shown}");
        let input = request(RequestKind::Input, Some(json!({"type": "integer"})));
        let (reply, shown) = asked(&input, "seven\n7\n");
        assert_eq!(reply, Some(Reply::Value(json!(7))));
        assert!(shown.contains("does not match its schema"), "{shown}");
        let text = request(RequestKind::Tool, None);
        assert_eq!(
            asked(&text, "hello there\n").0,
            Some(Reply::Value(json!("hello there")))
        );
        assert_eq!(asked(&text, "").0, None, "end of input answers nothing");
    }

    #[test]
    fn file_entries_are_read_by_the_kind_of_their_request() {
        let entry = |kind, json: Json| {
            entry_reply(&request(kind, None), json).map_err(|failure| failure.message)
        };
        let approval = RequestKind::Approval;
        assert_eq!(entry(approval, json!(true)), Ok(approve(true, None)));
        assert_eq!(
            entry(approval, json!({"approve": false, "reason": "no"})),
            Ok(approve(false, Some("no".into())))
        );
        for bad in [
            json!("yes"),
            json!({"value": 1}),
            json!({"timed_out": true}),
        ] {
            assert!(
                entry(approval, bad)
                    .unwrap_err()
                    .contains("asks for an approval")
            );
        }
        assert_eq!(
            entry(RequestKind::Input, json!(true)),
            Ok(Reply::Value(json!(true)))
        );
        assert_eq!(
            entry(RequestKind::Tool, json!({"approve": true})),
            Ok(Reply::Value(json!({"approve": true})))
        );
    }

    #[test]
    fn a_line_that_fails_the_schema_as_json_may_fit_as_text() {
        let text = request(RequestKind::Tool, Some(json!({"type": "string"})));
        assert_eq!(asked(&text, "42\n").0, Some(Reply::Value(json!("42"))));
        assert_eq!(asked(&text, "\"42\"\n").0, Some(Reply::Value(json!("42"))));
        let any = request(RequestKind::Input, None);
        assert_eq!(asked(&any, "42\n").0, Some(Reply::Value(json!(42))));
        let number = request(RequestKind::Input, Some(json!({"type": "number"})));
        assert_eq!(asked(&number, "x\n42\n").0, Some(Reply::Value(json!(42))));
    }

    #[test]
    fn a_line_longer_than_an_answer_is_refused_and_skipped_in_bounded_pieces() {
        let any = request(RequestKind::Input, None);
        let mut typed_in = "x".repeat(3 * MAX_LINE as usize + 7);
        typed_in.push_str("\nshort\n");
        let (reply, shown) = asked(&any, &typed_in);
        assert_eq!(reply, Some(Reply::Value(json!("short"))));
        assert!(shown.contains("longer than an answer may be"), "{shown}");
    }

    #[test]
    fn flags_read_into_answers_and_twice_is_refused() {
        let args = AnswerArgs {
            approve: vec!["1-1".into()],
            deny: vec!["1-2=over budget".into(), "1-3".into()],
            input: vec!["2-0=true".into()],
            input_file: None,
        };
        let Ok(given) = args.given() else {
            panic!("the flags read");
        };
        let reply = |r| Given::Reply(r);
        assert_eq!(
            given[1],
            (
                "1-2".into(),
                reply(approve(false, Some("over budget".into())))
            )
        );
        assert_eq!(given[2], ("1-3".into(), reply(approve(false, None))));
        assert_eq!(given[3], ("2-0".into(), reply(Reply::Value(json!(true)))));
        let twice = AnswerArgs {
            approve: vec!["1-1".into()],
            deny: vec!["1-1".into()],
            ..AnswerArgs::default()
        };
        assert!(twice.given().is_err());
        let bad = AnswerArgs {
            input: vec!["2-0=yes".into()],
            ..AnswerArgs::default()
        };
        assert!(bad.given().is_err());
    }
}
