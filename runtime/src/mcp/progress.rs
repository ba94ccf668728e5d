//! A server's `notifications/progress` during a call, to the run's observer as
//! `tool_progress` events (`spec/mcp.md`, "Progress").
//!
//! rmcp gives every request a progress token of its own (`_meta.progressToken`). When
//! someone observes the run, a call is sent so that its token is known ([`call_tool`]),
//! and this client handler forwards each notification that carries a watched token to
//! that call's [`ProgressSink`]. A token it does not watch (no observer, a call that
//! ended, a server that makes one up) is ignored. Forwarding never waits: the sink drops
//! a report it has no room for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, ProgressNotificationParam, ProgressToken, RequestId, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError};

use crate::native::ProgressSink;

/// The session of a running server, with this client's handler.
pub(crate) type Service = RunningService<RoleClient, Client>;

/// The client side of a server's session: `()`'s defaults (no sampling, roots or
/// elicitation), plus the progress of the calls in flight.
#[derive(Clone, Default)]
pub(crate) struct Client {
    calls: Arc<Mutex<HashMap<ProgressToken, ProgressSink>>>,
}

impl ClientHandler for Client {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let Ok(calls) = self.calls.lock() else { return };
        if let Some(sink) = calls.get(&params.progress_token) {
            sink.report(aplc_vm::Progress {
                progress: params.progress,
                total: params.total,
                // Redacted and clipped by the toolbox before it reaches an event.
                message: params.message,
            });
        }
    }
}

/// Sends `tools/call` with `params`: through rmcp's `call_tool` without `progress`;
/// with it, as a request whose progress token (rmcp gives every request one) is watched
/// until the call ends, each report going to `progress`. Dropping the call before its
/// answer (a timeout) sends `notifications/cancelled` either way.
pub(crate) async fn call_tool(
    service: &Service,
    params: CallToolRequestParams,
    progress: Option<&ProgressSink>,
) -> Result<CallToolResult, ServiceError> {
    let peer = service.peer();
    let Some(sink) = progress else {
        return peer.call_tool(params).await;
    };
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let handle = peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await?;
    // Registered as soon as the request is queued, before the server can have read it.
    let _watch = service.service().watch(handle.progress_token.clone(), sink);
    let mut abandoned = Abandoned {
        peer: peer.clone(),
        id: Some(handle.id.clone()),
    };
    let answer = handle.await_response().await;
    abandoned.id = None;
    match answer? {
        ServerResult::CallToolResult(result) => Ok(result),
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// A request dropped before its answer: tells the server to stop working on it, as
/// rmcp's own `call_tool` does.
struct Abandoned {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let peer = self.peer.clone();
        let cancelled = CancelledNotificationParam::new(
            Some(id),
            Some("request abandoned by the caller".to_owned()),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = peer.notify_cancelled(cancelled).await;
            });
        }
    }
}

/// A call's progress watch: its token is known to the handler until this is dropped
/// (when the call ends, however it ends).
struct Watch {
    calls: Arc<Mutex<HashMap<ProgressToken, ProgressSink>>>,
    token: ProgressToken,
}

impl Client {
    /// Sends the progress reports that carry `token` to `sink` until the watch drops.
    fn watch(&self, token: ProgressToken, sink: &ProgressSink) -> Watch {
        if let Ok(mut calls) = self.calls.lock() {
            calls.insert(token.clone(), sink.clone());
        }
        Watch {
            calls: self.calls.clone(),
            token,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.remove(&self.token);
        }
    }
}
