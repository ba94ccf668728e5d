//! People in the loop, on the runtime's side (`spec/human.md`): a run's requests as hosts
//! show them ([`Pending`]), answers in the form stores and the service keep them, and
//! the [`Answerer`] a host gives a run to ask a person in-process (a terminal, a Python
//! callback). A leaf: the driver, the durable driver and the hosts use it.

use std::time::{SystemTime, UNIX_EPOCH};

use aplc_vm::human::{HumanAnswer, InputRequest, Reply};
use serde_json::{Value as Json, json};

use crate::future::BoxFuture;

/// A request a run waits on, as hosts and stores show it: the machine's request, and
/// when the run first paused on it (wall clock), which restarts keep.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The machine's request.
    pub request: InputRequest,
    /// When the run first asked it, in ms since the Unix epoch.
    pub requested_at_ms: i64,
}

impl Pending {
    /// When the request's timeout passes, in ms since the Unix epoch, if it has one.
    pub fn expires_at_ms(&self) -> Option<i64> {
        let timeout = i64::try_from(self.request.timeout_ms?).unwrap_or(i64::MAX);
        Some(self.requested_at_ms.saturating_add(timeout))
    }

    /// The stored and shown form (`spec/human.md` §2): the request's fields, with
    /// `requested_at` (RFC 3339), and `requested_at_ms` and `expires_at_ms` for stores.
    pub fn to_json(&self) -> Json {
        let mut json = serde_json::to_value(&self.request).unwrap_or(Json::Null);
        if let Json::Object(map) = &mut json {
            map.insert("requested_at".into(), json!(rfc3339(self.requested_at_ms)));
            map.insert("requested_at_ms".into(), json!(self.requested_at_ms));
            if let Some(expires) = self.expires_at_ms() {
                map.insert("expires_at_ms".into(), json!(expires));
            }
        }
        json
    }

    /// Reads [`Pending::to_json`] back (a store's pending list).
    pub fn from_json(json: &Json) -> Option<Pending> {
        let request: InputRequest = serde_json::from_value(json.clone()).ok()?;
        let requested_at_ms = json.get("requested_at_ms")?.as_i64()?;
        Some(Pending {
            request,
            requested_at_ms,
        })
    }

    /// `waiting for input: ID (KIND: PROMPT)`, the line a host prints for it.
    pub fn waiting_line(&self) -> String {
        format!(
            "waiting for input: {} ({}: {})",
            aplc_vm::text::escape_control(&self.request.id),
            self.request.kind.as_str(),
            aplc_vm::text::escape_control(&self.request.prompt)
        )
    }
}

/// Now on the wall clock, in ms since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `ms` since the epoch as RFC 3339 UTC with milliseconds (`requested_at`), formatted as
/// `aplc runs` formats its times (humantime).
pub fn rfc3339(ms: i64) -> String {
    let since = u64::try_from(ms)
        .map(std::time::Duration::from_millis)
        .unwrap_or_default();
    humantime::format_rfc3339_millis(UNIX_EPOCH + since).to_string()
}

/// An answer as stores keep it and the service takes it: `{"approve", "reason"?}`,
/// `{"value"}` or `{"timed_out": true}`, with `by` and `answered_at_ms`.
pub fn answer_json(answer: &HumanAnswer) -> Json {
    let mut json = reply_json(&answer.reply);
    if let Json::Object(map) = &mut json {
        map.insert("by".into(), json!(answer.by));
        map.insert("answered_at_ms".into(), json!(answer.answered_at_ms));
    }
    json
}

/// A reply's JSON form, without who and when.
pub fn reply_json(reply: &Reply) -> Json {
    match reply {
        Reply::Approve { approved, reason } => match reason {
            Some(reason) => json!({"approve": approved, "reason": reason}),
            None => json!({"approve": approved}),
        },
        Reply::Value(value) => json!({ "value": value }),
        Reply::TimedOut => json!({"timed_out": true}),
    }
}

/// Reads a reply: `{"approve": bool, "reason"?: string}`, `{"value": any}` or
/// `{"timed_out": true}` (other keys, such as `id`, `by` and `answered_at_ms`, are left
/// to the caller). The message says what is wrong.
pub fn reply_from_json(json: &Json) -> Result<Reply, String> {
    let Some(map) = json.as_object() else {
        return Err("an answer is a JSON object".into());
    };
    match (map.get("approve"), map.get("value"), map.get("timed_out")) {
        (Some(approve), None, None) => {
            let approved = approve.as_bool().ok_or("`approve` must be true or false")?;
            let reason = match map.get("reason") {
                None | Some(Json::Null) => None,
                Some(Json::String(reason)) => Some(reason.clone()),
                Some(_) => return Err("`reason` must be a string".into()),
            };
            Ok(Reply::Approve { approved, reason })
        }
        (None, Some(value), None) => Ok(Reply::Value(value.clone())),
        (None, None, Some(Json::Bool(true))) => Ok(Reply::TimedOut),
        _ => Err("an answer has either `approve` (with an optional `reason`) or `value`".into()),
    }
}

/// A stored answer ([`answer_json`]) to request `id`.
pub fn answer_from_json(id: &str, json: &Json) -> Result<HumanAnswer, String> {
    Ok(HumanAnswer {
        id: id.to_owned(),
        reply: reply_from_json(json)?,
        by: json
            .get("by")
            .and_then(Json::as_str)
            .unwrap_or("unknown")
            .to_owned(),
        answered_at_ms: json
            .get("answered_at_ms")
            .and_then(Json::as_i64)
            .unwrap_or(0),
    })
}

/// The answer a request's timeout gives.
pub fn timed_out(id: &str, now_ms: i64) -> HumanAnswer {
    HumanAnswer {
        id: id.to_owned(),
        reply: Reply::TimedOut,
        by: "timeout".into(),
        answered_at_ms: now_ms,
    }
}

/// Who answers a run's requests in its own process: a terminal, a Python callback.
/// Given every request still unanswered, it answers any of them (checked by the run
/// against the request, and dropped if they do not fit), or none: then a durable run
/// pauses until answers come through its store, and an in-memory run fails.
pub trait Answerer: Send + Sync + std::fmt::Debug {
    /// Answers some of `pending`, or none.
    fn answer<'a>(&'a self, pending: &'a [Pending]) -> BoxFuture<'a, Vec<HumanAnswer>>;
}

/// Nobody: every request waits (`aplc serve`, `--no-input`, no terminal).
#[derive(Debug, Clone, Copy, Default)]
pub struct Nobody;

impl Answerer for Nobody {
    fn answer<'a>(&'a self, _pending: &'a [Pending]) -> BoxFuture<'a, Vec<HumanAnswer>> {
        Box::pin(async { Vec::new() })
    }
}

/// The error of a run that asks and has nobody to ask and no store to wait in.
pub fn nobody_message(pending: &[Pending]) -> String {
    let asked: Vec<String> = pending
        .iter()
        .map(|p| {
            format!(
                "{} ({}: {})",
                p.request.id,
                p.request.kind.as_str(),
                p.request.prompt
            )
        })
        .collect();
    format!(
        "the run needs input ({}) but nobody can answer: run it with --store to let it \
         wait, or from a terminal",
        asked.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use aplc_vm::human::RequestKind;

    #[test]
    fn dates_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_795_651_200_000), "2026-11-26T00:00:00.000Z");
    }

    #[test]
    fn answers_round_trip_and_bad_ones_say_why() {
        for reply in [
            Reply::Approve {
                approved: false,
                reason: Some("no".into()),
            },
            Reply::Value(json!([1, {"a": null}])),
            Reply::TimedOut,
        ] {
            let answer = HumanAnswer {
                id: "2-1".into(),
                reply,
                by: "cli".into(),
                answered_at_ms: 5,
            };
            assert_eq!(
                answer_from_json("2-1", &answer_json(&answer)).unwrap(),
                answer
            );
        }
        assert!(reply_from_json(&json!({"approve": "yes"})).is_err());
        assert!(reply_from_json(&json!({"approve": true, "value": 1})).is_err());
        assert!(reply_from_json(&json!(3)).is_err());
    }

    #[test]
    fn a_pending_request_keeps_its_time_and_expiry() {
        let pending = Pending {
            request: InputRequest {
                id: "1-0".into(),
                kind: RequestKind::Input,
                prompt: "ok?".into(),
                step: "a".into(),
                tool: None,
                arguments: None,
                schema: None,
                timeout_ms: Some(1000),
                agent: None,
            },
            requested_at_ms: 10,
        };
        assert_eq!(pending.expires_at_ms(), Some(1010));
        let json = pending.to_json();
        assert_eq!(json["requested_at"], json!("1970-01-01T00:00:00.010Z"));
        assert_eq!(Pending::from_json(&json), Some(pending));
    }
}
