//! People in the loop (`spec/human.md`): what a run asks a person ([`InputRequest`]) and
//! what the person answers ([`HumanAnswer`]).
//!
//! The machine makes requests (an approval before a tool runs, a human tool's call, a
//! post phase's `await_input`) and takes answers through its one door, as
//! [`Input::Answer`](crate::journal::Input::Answer): an answer is one more input of the
//! run, journaled like a provider's completion. Both are boundary types (they leave the
//! process as JSON, in events, stores and the service's API), so they derive serde.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// The most JSON text one answer may hold.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// May this tool call run?
    Approval,
    /// The result of a human tool's call.
    Tool,
    /// The answer to a post phase's `await_input`.
    Input,
}

impl RequestKind {
    /// The kind's name: `approval`, `tool` or `input`.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::Approval => "approval",
            RequestKind::Tool => "tool",
            RequestKind::Input => "input",
        }
    }
}

/// A question a run waits on (`spec/human.md` §2). Its `id` is made from the run's
/// position, so a replay of the run makes the same request with the same id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputRequest {
    /// `STEP-N`: the steps entered, then the tool call's position (from 1), or 0 for
    /// `await_input`.
    pub id: String,
    /// What is asked.
    pub kind: RequestKind,
    /// What the person reads.
    pub prompt: String,
    /// The step that asks.
    pub step: String,
    /// The tool, for `approval` and `tool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The call's validated arguments, for `approval` and `tool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Json>,
    /// What an answer's value must satisfy (`tool`, `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Json>,
    /// How long the request waits before it is answered by its timeout (wall clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The child run that asks (`spec/agents.md`), as its events' `path`; none for the
    /// root run. Its id starts with it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// What a person replied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// To an approval.
    Approve {
        /// Approved or denied.
        approved: bool,
        /// Why, if they said.
        reason: Option<String>,
    },
    /// To a `tool` or `input` request: any JSON value.
    Value(Json),
    /// Nobody answered within the request's `timeout_ms`.
    TimedOut,
}

/// One answer to one request, as journaled: who gave it and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HumanAnswer {
    /// The request's id.
    pub id: String,
    /// The reply.
    pub reply: Reply,
    /// Who answered: `cli`, `--as NAME`, a token's id, `python`, `timeout`.
    pub by: String,
    /// When, on the wall clock (ms since the Unix epoch), as the answerer said.
    pub answered_at_ms: i64,
}

impl InputRequest {
    /// Checks that `reply` answers this request: the right kind, and a value valid
    /// against its schema. The message says what is wrong, for the person to fix.
    pub fn check(&self, reply: &Reply) -> Result<(), String> {
        match (self.kind, reply) {
            (_, Reply::TimedOut) => Ok(()),
            (RequestKind::Approval, Reply::Approve { .. }) => Ok(()),
            (RequestKind::Approval, Reply::Value(_)) => Err(format!(
                "request `{}` asks for an approval: answer with approve (true or false), \
                 not a value",
                self.id
            )),
            (_, Reply::Approve { .. }) => Err(format!(
                "request `{}` asks for a value ({}), not an approval",
                self.id,
                self.kind.as_str()
            )),
            (_, Reply::Value(value)) => self.check_value(value),
        }
    }

    fn check_value(&self, value: &Json) -> Result<(), String> {
        let size = serde_json::to_string(value).map_or(0, |text| text.len());
        if size > MAX_ANSWER_BYTES {
            return Err(format!(
                "the answer to `{}` is {size} bytes of JSON, more than the {MAX_ANSWER_BYTES} \
                 an answer may hold",
                self.id
            ));
        }
        let Some(schema) = &self.schema else {
            return Ok(());
        };
        let validator = compile_schema(schema)?;
        let problems: Vec<String> = schema_problems(&validator, value).take(5).collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the answer to `{}` does not match its schema: {}",
                self.id,
                problems.join("; ")
            ))
        }
    }

    /// What the reply does, as a person reads it, for the message a denial or a timeout
    /// leaves in `errors`.
    pub(crate) fn timeout_message(&self) -> String {
        format!("no answer within {} ms", self.timeout_ms.unwrap_or(0))
    }

    /// The request's timeout, as a duration.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout_ms.map(Duration::from_millis)
    }
}

/// Compiles a JSON Schema, or says why it is not one.
pub(crate) fn compile_schema(schema: &Json) -> Result<Arc<jsonschema::Validator>, String> {
    jsonschema::validator_for(schema)
        .map(Arc::new)
        .map_err(|e| format!("invalid schema: {e}"))
}

/// The validator's messages for `value`, each with the path it is about (tool arguments
/// and answers are checked with the same words).
pub(crate) fn schema_problems<'v>(
    validator: &'v jsonschema::Validator,
    value: &'v Json,
) -> impl Iterator<Item = String> + 'v {
    validator.iter_errors(value).map(|e| {
        let path = e.instance_path().as_str().to_string();
        if path.is_empty() {
            e.to_string()
        } else {
            format!("at {path}: {e}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(kind: RequestKind, schema: Option<Json>) -> InputRequest {
        InputRequest {
            id: "3-1".into(),
            kind,
            prompt: "?".into(),
            step: "s".into(),
            tool: None,
            arguments: None,
            schema,
            timeout_ms: None,
            agent: None,
        }
    }

    #[test]
    fn a_reply_must_fit_its_request() {
        let approval = request(RequestKind::Approval, None);
        let yes = Reply::Approve {
            approved: true,
            reason: None,
        };
        assert!(approval.check(&yes).is_ok());
        let error = approval.check(&Reply::Value(json!(1))).unwrap_err();
        assert!(error.contains("asks for an approval"), "{error}");
        let input = request(RequestKind::Input, Some(json!({"type": "boolean"})));
        assert!(input.check(&Reply::Value(json!(true))).is_ok());
        let error = input.check(&Reply::Value(json!("yes"))).unwrap_err();
        assert!(error.contains("does not match its schema"), "{error}");
        assert!(input.check(&yes).unwrap_err().contains("not an approval"));
        assert!(input.check(&Reply::TimedOut).is_ok());
    }

    #[test]
    fn requests_have_a_stable_json_form() {
        let mut asked = request(RequestKind::Tool, None);
        asked.tool = Some("ask_user".into());
        let json = serde_json::to_value(&asked).unwrap();
        assert_eq!(
            json,
            json!({"id": "3-1", "kind": "tool", "prompt": "?", "step": "s", "tool": "ask_user"})
        );
        let back: InputRequest = serde_json::from_value(json).unwrap();
        assert_eq!(back, asked);
    }
}
