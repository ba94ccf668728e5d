//! A person at the terminal answers a run's requests (`spec/human.md` §4.1): the
//! [`Terminal`] answerer of `aplc run` and `aplc resume`, and their `--no-input` and
//! `--as` flags. A leaf: `run.rs` and `durable.rs` use it.

use std::io::{BufRead, IsTerminal, Read, Write};
use std::sync::Arc;

use aplc_runtime::driver::{Answerer, BoxFuture, Nobody, Pending};
use aplc_runtime::human::now_ms;
use aplc_vm::human::{HumanAnswer, InputRequest, MAX_ANSWER_BYTES, Reply, RequestKind};
use aplc_vm::text::escape_control;
use clap::Args;
use serde_json::Value as Json;

use crate::Failure;

/// Who answers a run's requests from the command line: `aplc run`, `aplc resume`.
#[derive(Args, Debug)]
pub(crate) struct AnswerArgs {
    /// Never ask on the terminal: a run that asks waits in its store (exit 4), or fails
    /// without one.
    #[arg(long)]
    no_input: bool,
    /// Who answers, as the journal records it (default `cli`).
    #[arg(long = "as", value_name = "NAME")]
    by: Option<String>,
}

impl AnswerArgs {
    /// The name answers are journaled with: `--as NAME`, or `cli`.
    pub(crate) fn by(&self) -> Result<String, Failure> {
        match &self.by {
            None => Ok("cli".into()),
            Some(name) => check_name(name),
        }
    }

    /// The answerer of a run: the terminal when stdin is one and `--no-input` is not
    /// given, nobody otherwise.
    pub(crate) fn answerer(&self) -> Result<Arc<dyn Answerer>, Failure> {
        let by = self.by()?;
        Ok(if !self.no_input && std::io::stdin().is_terminal() {
            Arc::new(Terminal { by })
        } else {
            Arc::new(Nobody)
        })
    }
}

/// `--as NAME`: it is printed and journaled, so printable and short.
fn check_name(name: &str) -> Result<String, Failure> {
    let ok = !name.trim().is_empty() && name.len() <= 128 && !name.chars().any(char::is_control);
    if ok {
        Ok(name.to_owned())
    } else {
        Err(Failure::usage(format!(
            "invalid --as `{}`: use 1 to 128 printable characters",
            escape_control(name)
        )))
    }
}

/// Asks the person at the terminal: each request on stderr, each answer a line of stdin.
#[derive(Debug)]
pub(crate) struct Terminal {
    by: String,
}

impl Answerer for Terminal {
    fn answer<'a>(&'a self, pending: &'a [Pending]) -> BoxFuture<'a, Vec<HumanAnswer>> {
        let requests: Vec<InputRequest> = pending.iter().map(|p| p.request.clone()).collect();
        let by = self.by.clone();
        Box::pin(async move {
            let (tx, rx) = tokio::sync::oneshot::channel();
            // A thread of its own rather than the runtime's blocking pool: a read of stdin
            // cannot be cancelled, and a runtime waits for its blocking tasks when it
            // shuts down, so Ctrl-C during a question would hang until Enter.
            let asking = std::thread::Builder::new()
                .name("aplc-answer".into())
                .spawn(move || {
                    let mut stdin = std::io::stdin().lock();
                    let mut stderr = std::io::stderr().lock();
                    let _ = tx.send(dialogue(&requests, &by, &mut stdin, &mut stderr));
                });
            match asking {
                Ok(_) => rx.await.unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        })
    }
}

/// Asks each request in turn until the input ends: the answers given, in order.
fn dialogue(
    requests: &[InputRequest],
    by: &str,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Vec<HumanAnswer> {
    let mut answers = Vec::new();
    for request in requests {
        let Some(reply) = ask(request, input, out) else {
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

/// Shows `request` on `out` and reads lines from `input` until one answers it; `None`
/// at the end of the input.
fn ask(request: &InputRequest, input: &mut impl BufRead, out: &mut impl Write) -> Option<Reply> {
    let _ = show(request, out);
    match request.kind {
        RequestKind::Approval => ask_approval(input, out),
        RequestKind::Tool | RequestKind::Input => ask_value(request, input, out),
    }
}

/// The request as the person reads it. What the model wrote (a prompt, arguments) may
/// hold escape sequences: they are shown escaped.
fn show(request: &InputRequest, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "\nthe run asks ({} {} in step `{}`):\n  {}",
        request.kind.as_str(),
        escape_control(&request.id),
        escape_control(&request.step),
        escape_control(&request.prompt)
    )?;
    if let Some(tool) = &request.tool {
        writeln!(out, "  tool:      {}", escape_control(tool))?;
    }
    if let Some(arguments) = &request.arguments {
        writeln!(
            out,
            "  arguments: {}",
            escape_control(&arguments.to_string())
        )?;
    }
    if let Some(schema) = &request.schema {
        writeln!(out, "  schema:    {}", escape_control(&schema.to_string()))?;
    }
    Ok(())
}

/// `y` or `n`, then an optional reason for a denial.
fn ask_approval(input: &mut impl BufRead, out: &mut impl Write) -> Option<Reply> {
    loop {
        let _ = write!(out, "approve? [y/n] ").and_then(|()| out.flush());
        let line = match read_line(input)? {
            Ok(line) => line,
            Err(problem) => {
                let _ = writeln!(out, "{problem}");
                continue;
            }
        };
        match line.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => {
                return Some(Reply::Approve {
                    approved: true,
                    reason: None,
                });
            }
            "n" | "no" => break,
            _ => {
                let _ = writeln!(out, "answer y or n");
            }
        }
    }
    let _ = write!(out, "reason (optional, Enter for none): ").and_then(|()| out.flush());
    // The denial stands even if the input ends here: the person said no.
    let reason = match read_line(input) {
        Some(Ok(line)) => Some(line.trim().to_owned()).filter(|r| !r.is_empty()),
        _ => None,
    };
    Some(Reply::Approve {
        approved: false,
        reason,
    })
}

/// A line of text or JSON, valid against the request's schema; asked again until it is.
fn ask_value(
    request: &InputRequest,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Option<Reply> {
    loop {
        let _ = write!(out, "answer (text or JSON): ").and_then(|()| out.flush());
        let checked = read_line(input)?.and_then(|line| value_of(request, &line));
        match checked {
            Ok(value) => return Some(Reply::Value(value)),
            Err(problem) => {
                let _ = writeln!(out, "{}; try again", escape_control(&problem));
            }
        }
    }
}

/// The value a typed line gives: the JSON it is, if it is JSON valid against the schema;
/// otherwise the line as a string, if that is valid (so `42` answers a string schema
/// too). The error is the JSON value's, or the string's for text that is not JSON.
fn value_of(request: &InputRequest, line: &str) -> Result<Json, String> {
    let text = line.trim();
    let as_text = Json::String(text.to_owned());
    match serde_json::from_str::<Json>(text) {
        Ok(json) => match request.check(&Reply::Value(json.clone())) {
            Ok(()) => Ok(json),
            Err(problem) => match request.check(&Reply::Value(as_text.clone())) {
                Ok(()) => Ok(as_text),
                Err(_) => Err(problem),
            },
        },
        Err(_) => request
            .check(&Reply::Value(as_text.clone()))
            .map(|()| as_text),
    }
}

/// One line of input without its line break: `None` at the end of the input, an error
/// for a line that is too long (the rest of it is skipped) or not UTF-8.
fn read_line(input: &mut impl BufRead) -> Option<Result<String, String>> {
    const LIMIT: u64 = MAX_ANSWER_BYTES as u64 + 2;
    let mut bytes = Vec::new();
    match input.by_ref().take(LIMIT).read_until(b'\n', &mut bytes) {
        Ok(0) | Err(_) => return None,
        Ok(_) => {}
    }
    if bytes.last() != Some(&b'\n') && bytes.len() as u64 >= LIMIT {
        // Skipped in bounded pieces: memory stays bounded whatever the line's length.
        loop {
            let mut rest = Vec::new();
            match input.by_ref().take(LIMIT).read_until(b'\n', &mut rest) {
                Ok(0) | Err(_) => break,
                Ok(_) if rest.last() == Some(&b'\n') => break,
                Ok(_) => {}
            }
        }
        return Some(Err(format!(
            "that line is longer than an answer may be ({MAX_ANSWER_BYTES} bytes)"
        )));
    }
    while matches!(bytes.last(), Some(b'\n' | b'\r')) {
        bytes.pop();
    }
    Some(String::from_utf8(bytes).map_err(|_| "that line is not valid UTF-8".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(kind: RequestKind, schema: Option<Json>) -> InputRequest {
        InputRequest {
            id: "2-1".into(),
            kind,
            prompt: "Refund \x1b[31m?".into(),
            step: "act".into(),
            tool: Some("refund".into()),
            arguments: Some(json!({"amount": 20})),
            schema,
            timeout_ms: None,
        }
    }

    /// The dialogue for `requests` with `typed` as stdin: the answers and what was shown.
    fn talk(requests: &[InputRequest], typed: &str) -> (Vec<HumanAnswer>, String) {
        let mut out = Vec::new();
        let answers = dialogue(requests, "ann", &mut typed.as_bytes(), &mut out);
        (answers, String::from_utf8(out).unwrap())
    }

    fn replies(answers: &[HumanAnswer]) -> Vec<Reply> {
        answers.iter().map(|a| a.reply.clone()).collect()
    }

    #[test]
    fn approvals_take_y_or_n_and_a_reason() {
        let approval = request(RequestKind::Approval, None);
        let (answers, shown) = talk(
            &[approval.clone(), approval.clone(), approval],
            "maybe\nY\nn\ntoo much\r\nno\n\n",
        );
        assert_eq!(
            replies(&answers),
            [
                Reply::Approve {
                    approved: true,
                    reason: None
                },
                Reply::Approve {
                    approved: false,
                    reason: Some("too much".into())
                },
                Reply::Approve {
                    approved: false,
                    reason: None
                },
            ]
        );
        assert!(answers.iter().all(|a| a.by == "ann" && a.id == "2-1"));
        assert!(shown.contains("answer y or n"), "{shown}");
        assert!(shown.contains("arguments: {\"amount\":20}"), "{shown}");
        // The model's text cannot drive the terminal.
        assert!(!shown.contains('\x1b'), "{shown}");
    }

    #[test]
    fn values_are_json_or_text_and_asked_again_until_valid() {
        let number = request(RequestKind::Input, Some(json!({"type": "integer"})));
        let text = request(RequestKind::Tool, Some(json!({"type": "string"})));
        let any = request(RequestKind::Input, None);
        let (answers, shown) = talk(
            &[number, text.clone(), text, any.clone(), any],
            "many\n12\n42\nfor a friend\n{\"a\": [1]}\nhello\n",
        );
        assert_eq!(
            replies(&answers),
            [
                Reply::Value(json!(12)),
                Reply::Value(json!("42")),
                Reply::Value(json!("for a friend")),
                Reply::Value(json!({"a": [1]})),
                Reply::Value(json!("hello")),
            ]
        );
        assert!(
            shown.contains("does not match its schema") && shown.contains("try again"),
            "{shown}"
        );
    }

    #[test]
    fn the_end_of_input_answers_nothing_more() {
        let approval = request(RequestKind::Approval, None);
        let (answers, _) = talk(&[approval.clone(), approval.clone()], "y\n");
        assert_eq!(answers.len(), 1);
        let (answers, _) = talk(&[approval], "");
        assert!(answers.is_empty());
        let input = request(RequestKind::Input, Some(json!({"type": "boolean"})));
        let (answers, _) = talk(&[input], "perhaps\n");
        assert!(answers.is_empty(), "no valid answer before the end");
    }

    #[test]
    fn long_and_binary_lines_are_refused_and_skipped() {
        let input = request(RequestKind::Input, None);
        let mut typed = vec![b'x'; MAX_ANSWER_BYTES * 2 + 10];
        typed.extend_from_slice(b"\n\xff\xfe\nfine\n");
        let mut out = Vec::new();
        let answers = dialogue(&[input], "cli", &mut typed.as_slice(), &mut out);
        assert_eq!(replies(&answers), [Reply::Value(json!("fine"))]);
        let shown = String::from_utf8(out).unwrap();
        assert!(shown.contains("longer than an answer may be"), "{shown}");
        assert!(shown.contains("not valid UTF-8"), "{shown}");
    }

    #[test]
    fn names_are_printable() {
        assert!(check_name("ann").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a\nb").is_err());
        assert!(check_name(&"a".repeat(200)).is_err());
    }
}
