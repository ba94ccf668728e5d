//! MCP servers of a host that outlives its runs (`aplc serve`; spec/mcp.md, "Hosts that
//! live long"): started once, their sessions shared by every run, and a server whose
//! session ends (its child died) restarted with backoff.
//!
//! The tools a host offers are [`Supervised`] stand-ins, registered once with the
//! descriptors of the first start: a run that started with them keeps seeing the same
//! tools whatever happens to the server. A call takes the server's current session; while
//! the server is down it fails at once (`MCP server \`x\` is restarting`). A restarted
//! server that lists other tools keeps the first offer (the host's listener hears
//! `tools_changed`); a tool it no longer lists fails its calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use aplc_vm::tools::{ToolInvocation, ToolSpec};
use serde_json::Value as Json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{McpError, McpServer, McpSessions, Started};
use crate::future::BoxFuture;
use crate::native::Tool;
use crate::redact::Redactor;

/// The wait before the first restart after a server was up for [`HEALTHY`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two restarts: the wait doubles up to it.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A server up this long was healthy: its next restart waits [`FIRST_BACKOFF`] again.
const HEALTHY: Duration = Duration::from_secs(30);
/// How often a watcher looks whether its server's session ended. The SDK offers no
/// future for it, and a flag read five times a second costs nothing.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// A change of a supervised server, for the host's log.
#[derive(Debug)]
#[non_exhaustive]
pub enum McpEvent<'a> {
    /// Its session ended (the child exited or closed its stdout); it will be restarted.
    Exited {
        /// The server's name.
        server: &'a str,
    },
    /// It was started again, initialized and listed.
    Restarted {
        /// The server's name.
        server: &'a str,
        /// Its restarts so far, this one included.
        restarts: u64,
        /// It lists other tools (or descriptors) than it did at the first start: the
        /// first offer stays, and a tool it no longer lists fails its calls.
        tools_changed: bool,
    },
    /// A restart failed; the next one comes after `retry_in`.
    RestartFailed {
        /// The server's name.
        server: &'a str,
        /// Why (names the server; redacted).
        error: &'a McpError,
        /// The wait before the next attempt.
        retry_in: Duration,
    },
}

/// Hears every [`McpEvent`]; called on the runtime's threads, so it must not block.
pub type McpListener = Arc<dyn Fn(&McpEvent<'_>) + Send + Sync>;

/// A supervised server's state, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerHealth {
    /// The server's name.
    pub server: String,
    /// Its session is up.
    pub up: bool,
    /// How many times it was restarted.
    pub restarts: u64,
}

/// The supervised servers of a host: their health, and [`McpHost::stop`]. Dropping it
/// stops them too (their process groups are killed).
#[derive(Default)]
pub struct McpHost {
    slots: Vec<Arc<Slot>>,
    watchers: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for McpHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHost")
            .field("servers", &self.health())
            .finish_non_exhaustive()
    }
}

impl McpHost {
    /// Every server's state, in manifest order.
    pub fn health(&self) -> Vec<ServerHealth> {
        self.slots.iter().map(|slot| slot.health()).collect()
    }

    /// Stops every server: no more restarts, each session closed and its process group
    /// killed. Calls to their tools fail from now on. Waits for the watchers to end, so
    /// that no restart under way outlives this.
    pub async fn stop(&self) {
        for watcher in self.take_watchers() {
            watcher.abort();
            let _ = watcher.await;
        }
        for slot in &self.slots {
            slot.stop();
        }
    }

    fn take_watchers(&self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut *self.watchers.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for McpHost {
    fn drop(&mut self) {
        for watcher in self.take_watchers() {
            watcher.abort();
        }
        // A watcher still running on another thread cannot bring a session back: a
        // stopped slot refuses new ones (`Slot::set`).
        for slot in &self.slots {
            slot.stop();
        }
    }
}

/// Starts every server in order (each as [`super::start_one`]) and supervises them: the
/// tools to register, and the host. The first server that fails is the error; the ones
/// already started are stopped then.
pub(crate) async fn start(
    servers: &[McpServer],
    hidden_env: &[String],
    redactor: &Redactor,
    listener: McpListener,
) -> Result<(McpHost, Vec<(String, ToolSpec, Arc<dyn Tool>)>), McpError> {
    let mut host = McpHost::default();
    let mut offers = Vec::new();
    let mut tools: Vec<(String, ToolSpec, Arc<dyn Tool>)> = Vec::new();
    for server in servers {
        // On an error, `host` drops: the servers started so far stop.
        let started = super::start_one(server, hidden_env, redactor).await?;
        let offer = offer(&started);
        let slot = Arc::new(Slot {
            server: server.clone(),
            state: RwLock::new(State::Up(Running::new(started))),
            restarts: AtomicU64::new(0),
        });
        for spec in &offer {
            let stand_in = Supervised {
                slot: slot.clone(),
                name: spec.name().to_owned(),
            };
            tools.push((server.name.clone(), spec.clone(), Arc::new(stand_in)));
        }
        offers.push(offer);
        host.slots.push(slot);
    }
    let watchers = host
        .slots
        .iter()
        .zip(offers)
        .map(|(slot, offer)| {
            let restart = Restart {
                slot: slot.clone(),
                offer,
                hidden_env: hidden_env.to_vec(),
                redactor: redactor.clone(),
                listener: listener.clone(),
            };
            tokio::spawn(restart.watch())
        })
        .collect();
    host.watchers = Mutex::new(watchers);
    Ok((host, tools))
}

/// The descriptors a start offers, in its order.
fn offer(started: &Started) -> Vec<ToolSpec> {
    started.1.iter().map(|(_, spec, _)| spec.clone()).collect()
}

/// What of an offer must stay the same for runs to stay consistent: each tool's
/// descriptor and whether it is idempotent.
fn shape(offer: &[ToolSpec]) -> Vec<(Json, bool)> {
    offer
        .iter()
        .map(|spec| (spec.descriptor().clone(), spec.idempotency().is_some()))
        .collect()
}

/// One supervised server.
struct Slot {
    server: McpServer,
    state: RwLock<State>,
    restarts: AtomicU64,
}

enum State {
    Up(Running),
    Restarting,
    /// For good ([`McpHost::stop`]).
    Stopped,
}

/// A server's live session and its tools by model-facing name.
struct Running {
    session: Arc<McpSessions>,
    since: Instant,
    tools: HashMap<String, Arc<dyn Tool>>,
}

impl Running {
    fn new((session, tools): Started) -> Running {
        Running {
            session,
            since: Instant::now(),
            tools: tools
                .into_iter()
                .map(|(_, spec, tool)| (spec.name().to_owned(), tool))
                .collect(),
        }
    }
}

impl Slot {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the state, unless the server was stopped for good: then `state` is
    /// dropped (a session in it closes, its process group is killed). Dropping the old
    /// state does the same to the session it held.
    fn set(&self, state: State) -> bool {
        let mut current = self.state.write().unwrap_or_else(|e| e.into_inner());
        if matches!(*current, State::Stopped) {
            return false;
        }
        *current = state;
        true
    }

    fn stop(&self) {
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = State::Stopped;
    }

    fn health(&self) -> ServerHealth {
        ServerHealth {
            server: self.server.name.clone(),
            up: matches!(*self.read(), State::Up(_)),
            restarts: self.restarts.load(Ordering::Relaxed),
        }
    }

    /// The current implementation of the tool `name`, or why there is none now.
    fn tool(&self, name: &str) -> Result<Arc<dyn Tool>, String> {
        let server = &self.server.name;
        match &*self.read() {
            State::Up(running) => running.tools.get(name).cloned().ok_or_else(|| {
                format!("MCP server `{server}` no longer lists `{name}` since it restarted")
            }),
            State::Restarting => Err(format!("MCP server `{server}` is restarting")),
            State::Stopped => Err(format!("MCP server `{server}` has stopped")),
        }
    }

    /// `None` while the session is up and open; `Some(since)` once it ended, with the
    /// time it came up; the watcher's end (`Err`) once stopped.
    fn ended(&self) -> Result<Option<Instant>, ()> {
        match &*self.read() {
            State::Up(running) if running.session.closed() => Ok(Some(running.since)),
            State::Up(_) | State::Restarting => Ok(None),
            State::Stopped => Err(()),
        }
    }
}

/// A tool of a supervised server, as runs see it: it calls the server's current session.
struct Supervised {
    slot: Arc<Slot>,
    /// The model-facing name.
    name: String,
}

impl Tool for Supervised {
    fn call<'a>(&'a self, invocation: &'a ToolInvocation) -> BoxFuture<'a, Result<Json, String>> {
        let tool = self.slot.tool(&self.name);
        Box::pin(async move { tool?.call(invocation).await })
    }
}

/// A watcher: restarts its server whenever its session ends.
struct Restart {
    slot: Arc<Slot>,
    /// The first start's descriptors (what every run was offered).
    offer: Vec<ToolSpec>,
    hidden_env: Vec<String>,
    redactor: Redactor,
    listener: McpListener,
}

impl Restart {
    async fn watch(self) {
        let name = self.slot.server.name.as_str();
        let mut backoff = FIRST_BACKOFF;
        loop {
            let since = loop {
                tokio::time::sleep(WATCH_EVERY).await;
                match self.slot.ended() {
                    Ok(Some(since)) => break since,
                    Ok(None) => {}
                    Err(()) => return,
                }
            };
            // Dropping the ended session kills what is left of its process group.
            if !self.slot.set(State::Restarting) {
                return;
            }
            (self.listener)(&McpEvent::Exited { server: name });
            if since.elapsed() >= HEALTHY {
                backoff = FIRST_BACKOFF;
            }
            loop {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                match super::start_one(&self.slot.server, &self.hidden_env, &self.redactor).await {
                    Ok(started) => {
                        let tools_changed = shape(&offer(&started)) != shape(&self.offer);
                        if !self.slot.set(State::Up(Running::new(started))) {
                            return;
                        }
                        let restarts = self.slot.restarts.fetch_add(1, Ordering::Relaxed) + 1;
                        (self.listener)(&McpEvent::Restarted {
                            server: name,
                            restarts,
                            tools_changed,
                        });
                        break;
                    }
                    Err(error) => (self.listener)(&McpEvent::RestartFailed {
                        server: name,
                        error: &error,
                        retry_in: backoff,
                    }),
                }
            }
        }
    }
}
