//! `GET /v1/runs/{id}/events`: a run's events as Server-Sent Events.
//!
//! The stream reads the journaled events from the store, from the start or after
//! `Last-Event-ID` (an event's `seq`, which is its SSE `id`), then follows the run live
//! until it ends: from the run's in-process broadcast when this process executes it
//! (an event arrives as the machine makes it, before its commit), and by polling the
//! store when another process does. Live events the store has not caught up with are
//! sent once, in `seq` order; transient events that are not journaled (token deltas,
//! `provider_delta`) are sent live only, without an `id`, so a reconnect never asks to
//! resume after one.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use aplc_runtime::durable::{DurableError, EventReader};
use axum::response::sse::Event;
use futures_util::Stream;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use crate::live::{EndWatch, LiveEvent};
use crate::state::AppState;

/// Events read from the store at a time.
const PAGE: u64 = 256;
/// How often a stream without live events polls the store.
const POLL: Duration = Duration::from_millis(250);

/// Where a stream is.
struct Cursor {
    state: AppState,
    id: String,
    /// The `seq` of the next journaled event to send.
    next: u64,
    /// The run's events as the store has them (stored, or replayed from its journal).
    reader: EventReader,
    ready: VecDeque<Event>,
    live: Option<broadcast::Receiver<LiveEvent>>,
    /// Wakes the stream when the run ends in this process.
    end: EndWatch,
    /// The run was seen finished; one more read of the store, then the end.
    finished: bool,
    done: bool,
}

/// The stream of run `id`'s events after `after` (all of them for `None`).
pub(crate) fn stream(
    state: AppState,
    id: String,
    after: Option<u64>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let end = state.live.watch_end(&id);
    let next = after.map_or(0, |seq| seq.saturating_add(1));
    let reader = EventReader::new(&id, next, state.equipment.durable.redactor.clone());
    let cursor = Cursor {
        reader,
        end,
        state,
        id,
        next,
        ready: VecDeque::new(),
        live: None,
        finished: false,
        done: false,
    };
    futures_util::stream::unfold(cursor, |mut cursor| async move {
        let event = cursor.next_event().await?;
        Some((Ok(event), cursor))
    })
}

impl Cursor {
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            if self.done || *self.state.stop.borrow() {
                return None;
            }
            if self.live.is_none() {
                self.live = self.state.live.subscribe(&self.id);
            }
            // What the broadcast already holds goes first: a delta made before an event
            // the store now has (a call's held-back redacted tail, sent just before the
            // call's result) must not come after it.
            if self.drain_live() {
                continue;
            }
            self.reader.skip_to(self.next);
            let store = self.state.store.clone();
            match self.reader.page(store.as_ref(), PAGE).await {
                Ok(events) if !events.is_empty() => {
                    for json in events {
                        self.journaled(&json);
                    }
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    self.fail(&e);
                    continue;
                }
            }
            match self.state.store.queue_entry(&self.id).await {
                // Its outcome was committed with its last events: one more read of the
                // store (the one above may have come first) sends them all.
                Ok(entry) if entry.status.is_final() => {
                    if self.finished {
                        self.done = true;
                    }
                    self.finished = true;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    self.fail(&DurableError::Store(e));
                    continue;
                }
            }
            self.wait().await;
        }
    }

    /// Waits for a live event, the end of a run here, the poll interval, or shutdown.
    async fn wait(&mut self) {
        let mut stop = self.state.stop.clone();
        let finished = self.end.ended();
        let live = async {
            match self.live.as_mut() {
                Some(live) => Some(live.recv().await),
                None => std::future::pending().await,
            }
        };
        let received = tokio::select! {
            received = live => received,
            () = finished => None,
            () = tokio::time::sleep(POLL) => None,
            _ = stop.changed() => None,
        };
        if let Some(received) = received {
            self.take(received);
        }
    }

    /// Takes every live event already received, without waiting; true if any is ready.
    fn drain_live(&mut self) -> bool {
        while let Some(live) = self.live.as_mut() {
            match live.try_recv() {
                Ok(event) => self.take(Ok(event)),
                Err(TryRecvError::Lagged(n)) => self.take(Err(RecvError::Lagged(n))),
                Err(TryRecvError::Closed) => self.take(Err(RecvError::Closed)),
                Err(TryRecvError::Empty) => break,
            }
        }
        !self.ready.is_empty()
    }

    /// A live event: the next journaled one or a delta is ready to send.
    fn take(&mut self, received: Result<LiveEvent, RecvError>) {
        match received {
            Ok(LiveEvent {
                seq: Some(seq),
                json,
            }) if seq == self.next => {
                self.ready
                    .push_back(Event::default().id(seq.to_string()).data(&*json));
                self.next += 1;
            }
            Ok(LiveEvent { seq: None, json }) => {
                self.ready.push_back(Event::default().data(&*json));
            }
            // Older than what was sent, or past a gap the store fills.
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => self.live = None,
        }
    }

    fn journaled(&mut self, json: &str) {
        self.ready
            .push_back(Event::default().id(self.next.to_string()).data(json));
        self.next += 1;
    }

    /// Ends the stream with an `error` event: the store failed or the run is gone.
    fn fail(&mut self, error: &DurableError) {
        tracing::error!(run_id = %self.id, error = %error, "event stream stopped");
        let body = serde_json::json!({"error": {"code": "store", "message": error.to_string()}});
        self.ready
            .push_back(Event::default().event("error").data(body.to_string()));
        self.done = true;
    }
}
