//! What a native tool implements (§5): the [`Tool`] trait and the [`ProgressSink`] it
//! reports to. A leaf, so the toolbox (`tool.rs`), the manifest's command and HTTP tools
//! and MCP's tools share it without importing each other.

use aplc_vm::Progress;
use aplc_vm::tools::ToolInvocation;
use serde_json::Value as Json;

use crate::future::BoxFuture;

/// A native tool (§5): takes checked arguments (and the context, for `with_context`
/// tools), returns a JSON result or an error message. A failure never aborts the run.
pub trait Tool: Send + Sync {
    /// Runs the tool.
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>>;

    /// Runs the tool, reporting its progress to `progress` as it goes (when someone
    /// observes the run). A tool that has no progress to report keeps this default.
    fn call_with_progress<'a>(
        &'a self,
        invocation: &'a ToolInvocation,
        progress: Option<&'a ProgressSink>,
    ) -> BoxFuture<'a, Result<Json, String>> {
        let _ = progress;
        self.call(invocation)
    }
}

/// Where a tool reports its progress during a call: the run's observer gets each report
/// as a `tool_progress` event (`spec/events.md`). Bounded and lossy: a report that finds
/// the queue full is dropped, never awaited, since progress is advisory (not an input of
/// the run) and a tool must not wait on a slow listener.
#[derive(Debug, Clone)]
pub struct ProgressSink(tokio::sync::mpsc::Sender<Progress>);

impl ProgressSink {
    /// A sink and the receiving end of its queue, which holds `capacity` reports.
    pub fn channel(capacity: usize) -> (ProgressSink, tokio::sync::mpsc::Receiver<Progress>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity);
        (ProgressSink(sender), receiver)
    }

    /// Sends `progress`, or drops it if the queue is full or nobody listens any more.
    pub fn report(&self, progress: Progress) {
        let _ = self.0.try_send(progress);
    }
}
