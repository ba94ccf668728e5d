//! One run, driven from JavaScript: [`Run`] is the machine with the few conversions a
//! host needs, [`Program`] a loaded bundle, [`Script`] the `scripted` provider's answers
//! and [`Stream`] an OpenAI stream being assembled.
//!
//! The calling contract is the machine's (`Machine::apply`): JavaScript polls with the
//! time since the run started, performs the action it gets, and answers with the time
//! the answer came; it drains the events after each call (`spec/js.md`, "The driver").

use std::sync::Arc;
use std::time::Duration;

use aplc_vm::journal::Input;
use aplc_vm::tools::{ToolRegistry, ToolSpec};
use aplc_vm::wire::StreamAssembler;
use aplc_vm::wire::openai::{self, ChunkAssembler};
use aplc_vm::{
    Action, Completion, Event, EventKind, Limits, Machine, ProviderError, ProviderErrorKind,
    RunOptions, ScriptedProvider,
};
use serde_json::{Value as Json, json};
use wasm_bindgen::prelude::*;

use crate::js_error;

/// A program: a validated bundle with its templates compiled once, for any number of runs.
#[wasm_bindgen]
#[derive(Clone)]
pub struct Program(Arc<aplc_vm::Program>);

#[wasm_bindgen]
impl Program {
    /// Loads bundle bytes (`aplc build`'s output, or `compile`'s); garbage, truncated or
    /// tampered bytes are an error saying why.
    pub fn load(bytes: &[u8], dialect: Option<String>) -> Result<Program, JsError> {
        let dialect = match dialect.as_deref() {
            None | Some("") => aplc_vm::Dialect::Spec,
            Some(name) => aplc_vm::Dialect::from_name(name)
                .ok_or_else(|| js_error(format!("unknown dialect {name:?}")))?,
        };
        aplc_vm::Program::load_in(bytes, dialect)
            .map(|p| Program(Arc::new(p)))
            .map_err(|e| js_error(format!("invalid bundle: {e}")))
    }

    /// The step names, in source order.
    pub fn steps(&self) -> Vec<String> {
        let bundle = self.0.bundle();
        bundle.steps.iter().map(|s| s.name.clone()).collect()
    }

    /// The inputs the agent declares (`{# inputs: … #}`).
    pub fn inputs(&self) -> Vec<String> {
        self.0.bundle().inputs.clone()
    }
}

impl Program {
    /// A compiled bundle, loaded.
    pub(crate) fn from_bundle(
        bundle: aplc_vm::bundle::Bundle,
        dialect: aplc_vm::Dialect,
    ) -> Result<Program, String> {
        aplc_vm::Program::from_bundle_in(bundle, Limits::default(), dialect)
            .map(|p| Program(Arc::new(p)))
            .map_err(|e| e.to_string())
    }
}

/// The answers of the `scripted` provider: `aplc run --mock`'s entries, decoded once.
#[wasm_bindgen]
pub struct Script(ScriptedProvider);

#[wasm_bindgen]
impl Script {
    /// Reads the entries (a JSON array, `fixtures/README.md`'s shapes); an entry that is
    /// no answer is an error naming its index.
    #[wasm_bindgen(constructor)]
    pub fn new(entries: &str) -> Result<Script, JsError> {
        ScriptedProvider::from_json(entries)
            .map(Script)
            .map_err(js_error)
    }

    /// The next answer as JSON: `{"response": <Chat Completions response>}` or
    /// `{"error": {"kind", "message"}}`, for a caller that calls the provider itself.
    pub fn next_json(&mut self) -> String {
        match self.0.next_response() {
            Ok(completion) => json!({"response": openai::response_json(&completion)}),
            Err(error) => json!({"error": {"kind": error.kind.as_str(), "message": error.message}}),
        }
        .to_string()
    }

    /// How many answers are left.
    pub fn remaining(&self) -> usize {
        self.0.remaining()
    }
}

/// An OpenAI Chat Completions stream (`"stream": true`) being read: bytes in, text
/// deltas out, then the completion, with the VM's own assembler (`wire::openai`).
#[wasm_bindgen]
pub struct Stream(Option<ChunkAssembler>);

#[wasm_bindgen]
impl Stream {
    /// A stream with nothing read yet.
    #[wasm_bindgen(constructor)]
    pub fn new() -> Stream {
        Stream(Some(ChunkAssembler::new()))
    }

    /// Reads the next bytes of the body: the text deltas they complete, as a JSON array
    /// of strings. A stream that carried an error or is not a Chat Completions stream
    /// is an error.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<String, JsError> {
        let assembler = self
            .0
            .as_mut()
            .ok_or_else(|| js_error("the stream is over"))?;
        let mut deltas = Vec::new();
        assembler
            .feed(chunk, &mut deltas)
            .map_err(|e| js_error(e.message))?;
        Ok(Json::from(deltas).to_string())
    }

    /// True once the stream's terminator (`data: [DONE]`) arrived.
    pub fn done(&self) -> bool {
        self.0.as_ref().is_some_and(StreamAssembler::done)
    }

    /// The body ended: the response the stream assembles into, as Chat Completions JSON.
    pub fn finish(&mut self) -> Result<String, JsError> {
        let assembler = self
            .0
            .take()
            .ok_or_else(|| js_error("the stream is over"))?;
        let completion = assembler.finish().map_err(|e| js_error(e.message))?;
        Ok(openai::response_json(&completion).to_string())
    }
}

impl Default for Stream {
    fn default() -> Self {
        Stream::new()
    }
}

/// One run of a [`Program`].
#[wasm_bindgen]
pub struct Run {
    machine: Option<Machine>,
    /// The `seq`, step and path of the last `provider_call`: the call that streamed
    /// deltas belong to (`spec/events.md`, "Streaming deltas").
    call: (u64, String, Option<String>),
    events: Vec<Json>,
}

/// What JavaScript passes to [`Run::new`], as JSON: `{"context": {...}, "timeoutMs",
/// "maxSteps", "maxRuns", "events": bool, "tools": [{"descriptor", "withContext"}]}`.
fn run_options(text: &str) -> Result<RunOptions, String> {
    let value: Json = serde_json::from_str(text).map_err(|e| format!("invalid options: {e}"))?;
    let mut options = RunOptions::default();
    let number = |key: &str| -> Result<Option<u64>, String> {
        match value.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|f| *f >= 0.0 && f.is_finite())
                        .map(|f| f as u64)
                })
                .map(Some)
                .ok_or_else(|| format!("`{key}` must be a non-negative number")),
        }
    };
    if let Some(ms) = number("timeoutMs")? {
        options.timeout = Duration::from_millis(ms);
    }
    if let Some(n) = number("maxSteps")? {
        if n == 0 {
            return Err("`maxSteps` must be at least 1".into());
        }
        options.max_steps = n;
    }
    options.max_runs = number("maxRuns")?;
    options.events = value.get("events").and_then(Json::as_bool).unwrap_or(false);
    match value.get("context") {
        None | Some(Json::Null) => {}
        Some(Json::Object(map)) => options = options.with_context_json(map),
        Some(_) => return Err("`context` must be an object of variables".into()),
    }
    let mut registry = ToolRegistry::new();
    for tool in value
        .get("tools")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        let descriptor = tool.get("descriptor").cloned().unwrap_or(Json::Null);
        let with_context = tool.get("withContext").and_then(Json::as_bool) == Some(true);
        let spec = ToolSpec::new(descriptor).map_err(|e| e.to_string())?;
        registry
            .register(spec.with_context(with_context))
            .map_err(|e| e.to_string())?;
    }
    options.tools = Arc::new(registry);
    Ok(options)
}

/// Milliseconds from JavaScript as a time since the run started; a clock that went
/// backwards or is not a number reads zero.
fn at(ms: f64) -> Duration {
    if ms.is_finite() && ms > 0.0 {
        Duration::from_secs_f64(ms / 1000.0)
    } else {
        Duration::ZERO
    }
}

#[wasm_bindgen]
impl Run {
    /// Starts a run of `program` (its clock reads zero now) with `options` (JSON, see
    /// `run_options`). A tool descriptor that is not valid is an error naming the tool.
    #[wasm_bindgen(constructor)]
    pub fn new(program: &Program, options: &str) -> Result<Run, JsError> {
        let options = run_options(options).map_err(js_error)?;
        let mut run = Run {
            machine: Some(Machine::new(program.0.clone(), options)),
            call: (0, String::new(), None),
            events: Vec::new(),
        };
        run.collect();
        Ok(run)
    }

    /// The run's deadline, in milliseconds since it started.
    pub fn deadline_ms(&self) -> f64 {
        self.machine
            .as_ref()
            .map_or(0.0, |m| m.deadline().as_secs_f64() * 1000.0)
    }

    /// Runs to the next action, at `now_ms`: JSON `{"type": "continue" | "provider" |
    /// "tool" | "input" | "done", ...}`. A provider action carries the Chat Completions
    /// `request` body; a tool action `id`,
    /// `name`, `arguments` and `context` (a `withContext` tool's).
    pub fn poll(&mut self, now_ms: f64) -> String {
        let action = match self.machine.as_mut() {
            Some(machine) => machine.apply(Input::Poll { at: at(now_ms) }),
            None => Action::Done,
        };
        self.collect();
        match action {
            Action::Continue => json!({"type": "continue"}),
            Action::CallProvider(request) => {
                let body = |bytes: Result<Vec<u8>, ProviderError>| {
                    bytes
                        .ok()
                        .and_then(|b| serde_json::from_slice::<Json>(&b).ok())
                        .unwrap_or(Json::Null)
                };
                json!({
                    "type": "provider",
                    "request": body(openai::encode_request(&request)),
                })
            }
            Action::CallTool(invocation) => json!({
                "type": "tool",
                "id": invocation.id,
                "name": invocation.name,
                "arguments": invocation.arguments,
                "context": invocation.context,
            }),
            Action::AwaitInput => json!({"type": "input"}),
            Action::Done => json!({"type": "done"}),
        }
        .to_string()
    }

    /// Hands in the provider's answer, a Chat Completions response as JSON text, taken at
    /// `now_ms`. An answer that does not read is a failed call (`invalid_response`), as
    /// from the HTTP provider.
    pub fn answer_provider(&mut self, now_ms: f64, response: &str) {
        let result = openai::decode_response(response.as_bytes());
        self.apply(Input::Provider {
            at: at(now_ms),
            result,
        });
    }

    /// The provider call failed: `kind` is a provider error kind (`spec/events.md`;
    /// anything else is `other`).
    pub fn fail_provider(&mut self, now_ms: f64, kind: &str, message: &str) {
        let kind = ProviderErrorKind::from_name(kind).unwrap_or(ProviderErrorKind::Other);
        self.apply(Input::Provider {
            at: at(now_ms),
            result: Err(ProviderError::new(kind, message)),
        });
    }

    /// Answers the provider call with `script`'s next entry, exactly as `--mock` does.
    pub fn answer_scripted(&mut self, now_ms: f64, script: &mut Script) {
        let result: Result<Completion, ProviderError> = script.0.next_response();
        self.apply(Input::Provider {
            at: at(now_ms),
            result,
        });
    }

    /// Hands in a tool's result, JSON text (`undefined` from JavaScript is `null`).
    pub fn answer_tool(&mut self, now_ms: f64, result: &str) {
        let result = serde_json::from_str::<Json>(result)
            .map_err(|e| format!("the tool's result is not JSON: {e}"));
        self.apply(Input::Tool {
            at: at(now_ms),
            result,
        });
    }

    /// The tool call failed with `message`.
    pub fn fail_tool(&mut self, now_ms: f64, message: &str) {
        self.apply(Input::Tool {
            at: at(now_ms),
            result: Err(message.to_owned()),
        });
    }

    /// The run's deadline passed while the call was out: the machine ends the run
    /// `timeout` at its next poll.
    pub fn time_out(&mut self, now_ms: f64) {
        let deadline = self.machine.as_ref().map(Machine::deadline);
        let at = deadline.map_or(at(now_ms), |d| at(now_ms).max(d));
        self.apply(Input::Timeout { at });
    }

    /// Cancels the run (an `AbortSignal` fired): the next poll ends it `cancelled`.
    pub fn cancel(&mut self) {
        if let Some(machine) = &self.machine {
            machine.cancel_flag().cancel();
        }
    }

    /// Ends a run that asked a person: JavaScript has nobody to ask.
    pub fn abandon_input(&mut self, message: &str) {
        if let Some(machine) = self.machine.as_mut() {
            machine.abandon_input(message.to_owned());
        }
        self.collect();
    }

    /// The `provider_delta` event of text `index` of the current provider call, at
    /// `now_ms`, as JSON (`spec/events.md`).
    pub fn delta(&self, now_ms: f64, index: u32, text: String) -> String {
        let (seq, step, path) = &self.call;
        let mut event = Event::provider_delta(*seq, at(now_ms), step, u64::from(index), text);
        event.path.clone_from(path);
        event.to_json().to_string()
    }

    /// The events recorded since the last call, as a JSON array.
    pub fn events(&mut self) -> String {
        Json::Array(std::mem::take(&mut self.events)).to_string()
    }

    /// The outcome, once `poll` said `done`: JSON `{"context", "error", "lastStepErrors",
    /// "steps"}`, `context` as `aplc run --json` prints it. The run is over after this.
    pub fn finish(&mut self) -> Result<String, JsError> {
        let machine = self
            .machine
            .take()
            .ok_or_else(|| js_error("the run is over"))?;
        let outcome = machine.into_outcome();
        let error = outcome.error.as_ref().map(|e| {
            json!({
                "kind": e.kind.as_str(),
                "message": e.message,
                "step": e.step,
                "line": e.span.map(|s| s.line),
                "column": e.span.map(|s| s.col),
            })
        });
        Ok(json!({
            "context": outcome.context_json(),
            "error": error,
            "lastStepErrors": outcome.last_step_errors,
            "steps": outcome.steps,
        })
        .to_string())
    }
}

impl Run {
    fn apply(&mut self, input: Input) {
        if let Some(machine) = self.machine.as_mut() {
            let _ = machine.apply(input);
        }
        self.collect();
    }

    /// Takes the machine's new events, noting the provider call deltas belong to.
    fn collect(&mut self) {
        let Some(machine) = self.machine.as_mut() else {
            return;
        };
        for event in machine.drain_events() {
            if let EventKind::ProviderCall { step, .. } = &event.kind {
                self.call = (event.seq, step.clone(), event.path.clone());
            }
            self.events.push(event.to_json());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(source: &str) -> Program {
        let c = aplc_compiler::compile(source, "t.apl", &aplc_compiler::Options::for_run(false));
        Program::from_bundle(c.bundle.expect("compiles"), aplc_vm::Dialect::Spec).unwrap()
    }

    #[test]
    fn a_run_asks_its_provider_and_ends_with_the_answer() {
        let p = program("# prompt: a\n## user\nhi\n");
        let mut run = Run::new(&p, r#"{"events": true, "context": {"x": 1}}"#).unwrap();
        let action: Json = serde_json::from_str(&run.poll(1.0)).unwrap();
        let action = if action["type"] == "continue" {
            serde_json::from_str::<Json>(&run.poll(2.0)).unwrap()
        } else {
            action
        };
        assert_eq!(action["type"], "provider", "{action}");
        assert_eq!(action["request"]["messages"][0]["content"], "hi");
        run.answer_provider(3.0, r#"{"choices": [{"message": {"content": "yo"}}]}"#);
        let mut last = Json::Null;
        for t in 4..20 {
            last = serde_json::from_str(&run.poll(t as f64)).unwrap();
            if last["type"] == "done" {
                break;
            }
        }
        assert_eq!(last["type"], "done");
        let events: Json = serde_json::from_str(&run.events()).unwrap();
        let kinds: Vec<&str> = events
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds.first(), Some(&"run_started"), "{kinds:?}");
        assert_eq!(kinds.last(), Some(&"run_finished"), "{kinds:?}");
        let outcome: Json = serde_json::from_str(&run.finish().unwrap()).unwrap();
        assert_eq!(outcome["context"]["result_text"], "yo");
        assert_eq!(outcome["context"]["x"], 1);
        assert!(outcome["error"].is_null());
    }

    #[test]
    fn bad_options_and_descriptors_are_refused() {
        assert!(run_options("[").is_err());
        assert!(run_options(r#"{"context": 3}"#).is_err());
        assert!(run_options(r#"{"maxSteps": 0}"#).is_err());
        let bad = run_options(r#"{"tools": [{"descriptor": {"description": "no name"}}]}"#);
        assert!(bad.is_err());
        let good = run_options(
            r#"{"tools": [{"descriptor": {"name": "add", "parameters": {"type": "object"}}}]}"#,
        )
        .unwrap();
        assert_eq!(good.tools.len(), 1);
    }
}
