//! The answers `aplc resume` is given on its command line (`spec/human.md` §4.1):
//! `--approve`, `--deny`, `--input` and `--input-file`, each checked against the run's
//! pending requests before any is stored. A leaf: `durable.rs` uses it.

use std::path::{Path, PathBuf};

use aplc_runtime::driver::Pending;
use aplc_runtime::human::{now_ms, reply_from_json};
use aplc_vm::human::{HumanAnswer, InputRequest, Reply, RequestKind};
use aplc_vm::text::escape_control;
use clap::Args;
use serde_json::Value as Json;

use crate::Failure;

/// Answers to a waiting run's requests.
#[derive(Args, Debug, Default)]
pub(crate) struct GivenArgs {
    /// Approve the pending request ID: its tool runs (repeatable).
    #[arg(long, value_name = "ID")]
    approve: Vec<String>,
    /// Deny the pending request ID, with a reason the model reads (repeatable).
    #[arg(long, value_name = "ID[=REASON]")]
    deny: Vec<String>,
    /// Answer the pending request ID with a JSON value (repeatable).
    #[arg(long, value_name = "ID=JSON")]
    input: Vec<String>,
    /// Answers in a JSON object from request id to answer: true, false or {"approve",
    /// "reason"} for an approval, the value for the others.
    #[arg(long, value_name = "FILE")]
    input_file: Option<PathBuf>,
}

/// An answer as given, before the request it answers is looked at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Given {
    /// `--approve`, `--deny`.
    Approve {
        approved: bool,
        reason: Option<String>,
    },
    /// `--input`.
    Value(Json),
    /// An entry of `--input-file`: an approval or a value, as the request's kind says.
    Entry(Json),
}

impl GivenArgs {
    /// The answers given, by request id: usage errors for malformed flags, an unreadable
    /// file, or one id answered twice.
    pub(crate) fn parse(&self) -> Result<Vec<(String, Given)>, Failure> {
        let mut given = Vec::new();
        for id in &self.approve {
            given.push((
                id.clone(),
                Given::Approve {
                    approved: true,
                    reason: None,
                },
            ));
        }
        for deny in &self.deny {
            let (id, reason) = match deny.split_once('=') {
                Some((id, reason)) => (id, Some(reason.to_owned()).filter(|r| !r.is_empty())),
                None => (deny.as_str(), None),
            };
            let approved = false;
            given.push((id.to_owned(), Given::Approve { approved, reason }));
        }
        for input in &self.input {
            let Some((id, json)) = input.split_once('=') else {
                return Err(Failure::usage(format!(
                    "--input `{}`: expected ID=JSON",
                    escape_control(input)
                )));
            };
            let value = serde_json::from_str(json).map_err(|e| {
                Failure::usage(format!(
                    "--input for request `{}`: invalid JSON: {e}",
                    escape_control(id)
                ))
            })?;
            given.push((id.to_owned(), Given::Value(value)));
        }
        if let Some(file) = &self.input_file {
            given.extend(read_file(file)?);
        }
        for (i, (id, _)) in given.iter().enumerate() {
            if given[..i].iter().any(|(earlier, _)| earlier == id) {
                return Err(Failure::usage(format!(
                    "request `{}` is answered twice",
                    escape_control(id)
                )));
            }
        }
        Ok(given)
    }
}

/// `--input-file`: a JSON object from request id to answer, read bounded.
fn read_file(file: &Path) -> Result<Vec<(String, Given)>, Failure> {
    let text = crate::input::read_json(file)?;
    let json: Json = serde_json::from_str(&text)
        .map_err(|e| Failure::usage(format!("{}: invalid JSON: {e}", file.display())))?;
    let Json::Object(entries) = json else {
        return Err(Failure::usage(format!(
            "{}: expected a JSON object from request id to answer",
            file.display()
        )));
    };
    Ok(entries
        .into_iter()
        .map(|(id, answer)| (id, Given::Entry(answer)))
        .collect())
}

/// Checks every answer against the request it answers, among the run's `pending`
/// requests, and makes the answers to store: the first problem is an error (exit 2),
/// and then none is stored.
pub(crate) fn check(
    run_id: &str,
    given: Vec<(String, Given)>,
    pending: &[Pending],
    by: &str,
) -> Result<Vec<HumanAnswer>, Failure> {
    given
        .into_iter()
        .map(|(id, given)| {
            let request = pending
                .iter()
                .map(|p| &p.request)
                .find(|r| r.id == id)
                .ok_or_else(|| not_waiting(run_id, &id, pending))?;
            let reply = reply(request, given)?;
            request.check(&reply).map_err(Failure::usage)?;
            Ok(HumanAnswer {
                id,
                reply,
                by: by.to_owned(),
                answered_at_ms: now_ms(),
            })
        })
        .collect()
}

/// The reply an answer makes to `request`.
fn reply(request: &InputRequest, given: Given) -> Result<Reply, Failure> {
    Ok(match (given, request.kind) {
        (Given::Approve { approved, reason }, _) => Reply::Approve { approved, reason },
        (Given::Value(value), _) => Reply::Value(value),
        (Given::Entry(Json::Bool(approved)), RequestKind::Approval) => Reply::Approve {
            approved,
            reason: None,
        },
        (Given::Entry(entry @ Json::Object(_)), RequestKind::Approval) => {
            match reply_from_json(&entry) {
                Ok(reply @ Reply::Approve { .. }) => reply,
                _ => return Err(not_an_approval(request)),
            }
        }
        (Given::Entry(_), RequestKind::Approval) => return Err(not_an_approval(request)),
        (Given::Entry(value), RequestKind::Tool | RequestKind::Input) => Reply::Value(value),
    })
}

fn not_an_approval(request: &InputRequest) -> Failure {
    Failure::usage(format!(
        "request `{}` asks for an approval: answer it with true, false or \
         {{\"approve\": true|false, \"reason\": \"…\"}}",
        escape_control(&request.id)
    ))
}

/// The error for an answer to a request the run does not wait on.
fn not_waiting(run_id: &str, id: &str, pending: &[Pending]) -> Failure {
    let waiting: Vec<&str> = pending.iter().map(|p| p.request.id.as_str()).collect();
    let waits_on = if waiting.is_empty() {
        "it waits on none".to_owned()
    } else {
        format!("it waits on {}", waiting.join(", "))
    };
    Failure::usage(format!(
        "run `{run_id}` does not wait on request `{}` ({})",
        escape_control(id),
        escape_control(&waits_on)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pending(id: &str, kind: RequestKind, schema: Option<Json>) -> Pending {
        Pending {
            request: InputRequest {
                id: id.into(),
                kind,
                prompt: "?".into(),
                step: "act".into(),
                tool: None,
                arguments: None,
                schema,
                timeout_ms: None,
            },
            requested_at_ms: 0,
        }
    }

    fn waiting() -> Vec<Pending> {
        vec![
            pending("1-1", RequestKind::Approval, None),
            pending("1-2", RequestKind::Tool, Some(json!({"type": "string"}))),
            pending("2-0", RequestKind::Input, None),
        ]
    }

    fn flags(args: &[&str]) -> GivenArgs {
        use clap::{FromArgMatches, Parser};
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            given: GivenArgs,
        }
        let matches = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap();
        Cli::from_arg_matches(&matches).unwrap().given
    }

    fn checked(args: &[&str]) -> Result<Vec<Reply>, String> {
        let given = flags(args).parse().map_err(|f| f.message)?;
        check("r", given, &waiting(), "cli")
            .map(|answers| answers.into_iter().map(|a| a.reply).collect())
            .map_err(|f| f.message)
    }

    #[test]
    fn flags_make_answers() {
        assert_eq!(
            checked(&["--deny", "1-1=too=much", "--input", "1-2=\"why\""]).unwrap(),
            [
                Reply::Approve {
                    approved: false,
                    reason: Some("too=much".into())
                },
                Reply::Value(json!("why")),
            ]
        );
        assert_eq!(
            checked(&["--approve", "1-1", "--input", "2-0={\"a\": 1}"]).unwrap(),
            [
                Reply::Approve {
                    approved: true,
                    reason: None
                },
                Reply::Value(json!({"a": 1})),
            ]
        );
    }

    #[test]
    fn bad_answers_say_why() {
        let error = |args: &[&str]| checked(args).unwrap_err();
        assert!(error(&["--approve", "9-9"]).contains("does not wait on request `9-9`"));
        assert!(error(&["--input", "1-1=true"]).contains("asks for an approval"));
        assert!(error(&["--approve", "1-2"]).contains("not an approval"));
        assert!(error(&["--input", "1-2=3"]).contains("does not match its schema"));
        assert!(error(&["--input", "1-2=why"]).contains("request `1-2`: invalid JSON"));
        assert!(error(&["--input", "1-2"]).contains("expected ID=JSON"));
        assert!(error(&["--approve", "1-1", "--deny", "1-1"]).contains("answered twice"));
    }

    #[test]
    fn file_entries_follow_the_kind() {
        let request = &waiting()[0].request;
        let entry = |json: Json| reply(request, Given::Entry(json)).map_err(|f| f.message);
        assert_eq!(
            entry(json!(false)).unwrap(),
            Reply::Approve {
                approved: false,
                reason: None
            }
        );
        assert_eq!(
            entry(json!({"approve": false, "reason": "no"})).unwrap(),
            Reply::Approve {
                approved: false,
                reason: Some("no".into())
            }
        );
        for bad in [
            json!("yes"),
            json!({"timed_out": true}),
            json!({"value": 1}),
        ] {
            assert!(entry(bad).unwrap_err().contains("asks for an approval"));
        }
        let tool = &waiting()[1].request;
        assert_eq!(
            reply(tool, Given::Entry(json!({"approve": true})))
                .map_err(|f| f.message)
                .unwrap(),
            Reply::Value(json!({"approve": true}))
        );
    }
}
