//! The message loop: open documents, debounced diagnostics, request dispatch.
//!
//! One thread does everything: a compile takes milliseconds, so requests are answered
//! in order, each on the newest text. Diagnostics are published once the document has
//! been quiet for [`DEBOUNCE`], so a burst of keystrokes compiles once. A panic while
//! answering a request becomes an error answer to that request (`InternalError`) and the
//! loop goes on; a panic while compiling for diagnostics is logged and skipped.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use aplc_compiler::Options;
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument, Notification as _,
    PublishDiagnostics,
};
use lsp_types::request::{
    CodeActionRequest, Completion, DocumentSymbolRequest, FoldingRangeRequest, GotoDefinition,
    HoverRequest, PrepareRenameRequest, References, Rename, Request as _,
    SemanticTokensFullRequest,
};
use lsp_types::{
    DidChangeTextDocumentParams, DidCloseTextDocumentParams, DidOpenTextDocumentParams,
    PublishDiagnosticsParams, Uri,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value as Json;

use crate::document::Document;
use crate::features;

/// How long a document must be quiet before its diagnostics are published.
pub const DEBOUNCE: Duration = Duration::from_millis(50);

/// What the embedding program decides about the server.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Answer the `aplc/panic` request by panicking: lets a test check that a panic in
    /// one request does not take the server down. Off unless a test turns it on.
    pub panic_request: bool,
}

/// Serves one client on `connection` until it says `exit`.
pub fn serve(connection: &Connection, config: Config) -> Result<(), String> {
    let capabilities = serde_json::to_value(features::capabilities()).map_err(|e| e.to_string())?;
    let init = connection
        .initialize(capabilities)
        .map_err(|e| e.to_string())?;
    let mut state = State {
        connection,
        config,
        options: options(&init),
        documents: HashMap::new(),
        due: HashMap::new(),
    };
    state.run()
}

/// Compile options from the client's `initializationOptions`:
/// `{"relaxed": true, "dialect": "defuss-1.1"}`; anything else is `aplc check`'s default.
fn options(init: &Json) -> Options {
    let given = init.get("initializationOptions");
    let relaxed = given
        .and_then(|o| o.get("relaxed"))
        .and_then(Json::as_bool)
        .unwrap_or(false);
    let dialect = given
        .and_then(|o| o.get("dialect"))
        .and_then(Json::as_str)
        .and_then(aplc_vm::Dialect::from_name)
        .unwrap_or(aplc_vm::Dialect::Spec);
    Options {
        relaxed,
        dialect,
        ..Options::default()
    }
}

struct State<'c> {
    connection: &'c Connection,
    config: Config,
    options: Options,
    /// Open documents by URI.
    documents: HashMap<String, (Uri, Document)>,
    /// Documents whose diagnostics are due, and when.
    due: HashMap<String, Instant>,
}

impl State<'_> {
    fn run(&mut self) -> Result<(), String> {
        loop {
            let next = self.due.values().min().copied();
            let message = match next {
                None => match self.connection.receiver.recv() {
                    Ok(m) => m,
                    Err(_) => return Ok(()),
                },
                Some(at) => {
                    let wait = at.saturating_duration_since(Instant::now());
                    match self.connection.receiver.recv_timeout(wait) {
                        Ok(m) => m,
                        Err(e) if e.is_timeout() => {
                            self.publish_due();
                            continue;
                        }
                        Err(_) => return Ok(()),
                    }
                }
            };
            match message {
                Message::Request(request) => {
                    if self
                        .connection
                        .handle_shutdown(&request)
                        .map_err(|e| e.to_string())?
                    {
                        return Ok(());
                    }
                    let response = self.answer(request);
                    self.send(Message::Response(response));
                }
                Message::Notification(n) => self.notification(n),
                Message::Response(_) => {}
            }
        }
    }

    fn send(&self, message: Message) {
        // The writer thread is gone only when the client closed stdout; the loop ends at
        // the next receive.
        let _ = self.connection.sender.send(message);
    }

    fn notification(&mut self, n: Notification) {
        let now = Instant::now();
        match n.method.as_str() {
            DidOpenTextDocument::METHOD => {
                if let Some(p) = params::<DidOpenTextDocumentParams>(n.params) {
                    let doc = Document::new(p.text_document.text, p.text_document.version);
                    let key = p.text_document.uri.as_str().to_string();
                    self.documents
                        .insert(key.clone(), (p.text_document.uri, doc));
                    // Opening shows diagnostics at once: there is no burst to wait for.
                    self.due.insert(key, now);
                }
            }
            DidChangeTextDocument::METHOD => {
                if let Some(p) = params::<DidChangeTextDocumentParams>(n.params) {
                    let key = p.text_document.uri.as_str().to_string();
                    if let Some((_, doc)) = self.documents.get_mut(&key) {
                        doc.change(p.text_document.version, p.content_changes);
                        self.due.insert(key, now + DEBOUNCE);
                    }
                }
            }
            DidCloseTextDocument::METHOD => {
                if let Some(p) = params::<DidCloseTextDocumentParams>(n.params) {
                    let key = p.text_document.uri.as_str().to_string();
                    self.due.remove(&key);
                    if self.documents.remove(&key).is_some() {
                        self.publish(p.text_document.uri, Vec::new(), None);
                    }
                }
            }
            _ => {}
        }
    }

    fn publish_due(&mut self) {
        let now = Instant::now();
        let keys: Vec<String> = self
            .due
            .iter()
            .filter(|&(_, &at)| at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.due.remove(&key);
            let Some((uri, doc)) = self.documents.get_mut(&key) else {
                continue;
            };
            let options = &self.options;
            let computed = catch_unwind(AssertUnwindSafe(|| {
                features::diagnostics(uri, doc, options)
            }));
            match computed {
                Ok(diagnostics) => {
                    let (uri, version) = (uri.clone(), doc.version);
                    self.publish(uri, diagnostics, Some(version));
                }
                Err(_) => eprintln!("aplc lsp: computing diagnostics panicked"),
            }
        }
    }

    fn publish(&self, uri: Uri, diagnostics: Vec<lsp_types::Diagnostic>, version: Option<i32>) {
        let params = PublishDiagnosticsParams {
            uri,
            diagnostics,
            version,
        };
        self.send(Message::Notification(Notification::new(
            PublishDiagnostics::METHOD.to_string(),
            params,
        )));
    }

    /// Answers one request; a panic in its handler is an error answer.
    fn answer(&mut self, request: Request) -> Response {
        let id = request.id.clone();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.dispatch(request)));
        match outcome {
            Ok(Ok(value)) => Response::new_ok(id, value),
            Ok(Err((code, message))) => Response::new_err(id, code as i32, message),
            Err(_) => Response::new_err(
                id,
                ErrorCode::InternalError as i32,
                "the request failed inside aplc lsp (a bug); the server goes on".to_string(),
            ),
        }
    }

    fn dispatch(&mut self, request: Request) -> Result<Json, (ErrorCode, String)> {
        let Request { id, method, params } = request;
        let options = self.options.clone();
        let docs = &mut self.documents;
        match method.as_str() {
            HoverRequest::METHOD => on_doc(docs, params, &options, features::hover),
            GotoDefinition::METHOD => on_doc(docs, params, &options, features::definition),
            References::METHOD => on_doc(docs, params, &options, features::references),
            PrepareRenameRequest::METHOD => {
                on_doc(docs, params, &options, features::prepare_rename)
            }
            Rename::METHOD => on_doc(docs, params, &options, features::rename),
            Completion::METHOD => on_doc(docs, params, &options, features::completion),
            DocumentSymbolRequest::METHOD => on_doc(docs, params, &options, features::symbols),
            FoldingRangeRequest::METHOD => on_doc(docs, params, &options, features::folding),
            CodeActionRequest::METHOD => on_doc(docs, params, &options, features::code_actions),
            SemanticTokensFullRequest::METHOD => {
                on_doc(docs, params, &options, features::semantic_tokens)
            }
            "aplc/panic" if self.config.panic_request => {
                panic!("aplc/panic requested (request {id})")
            }
            _ => Err((
                ErrorCode::MethodNotFound,
                format!("aplc lsp does not answer `{method}`"),
            )),
        }
    }
}

/// A request about one open document: its parameters parsed, the document found.
pub(crate) trait DocumentRequest: DeserializeOwned {
    /// The document the request is about.
    fn uri(&self) -> &Uri;
}

/// Parses the parameters, finds the document and runs `handler`.
fn on_doc<P: DocumentRequest, R: Serialize>(
    docs: &mut HashMap<String, (Uri, Document)>,
    params: Json,
    options: &Options,
    handler: fn(&P, &Uri, &mut Document, &Options) -> Result<R, String>,
) -> Result<Json, (ErrorCode, String)> {
    let params: P =
        serde_json::from_value(params).map_err(|e| (ErrorCode::InvalidParams, e.to_string()))?;
    let Some((uri, doc)) = docs.get_mut(params.uri().as_str()) else {
        // A request for a document that is not open (or already closed): nothing.
        return Ok(Json::Null);
    };
    let result = handler(&params, uri, doc, options).map_err(|m| (ErrorCode::RequestFailed, m))?;
    serde_json::to_value(result).map_err(|e| (ErrorCode::InternalError, e.to_string()))
}

fn params<P: DeserializeOwned>(params: Json) -> Option<P> {
    serde_json::from_value(params).ok()
}
