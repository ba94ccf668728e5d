//! A durable run's events, read back from its store (`spec/durability.md`, "Events").
//!
//! A run with a listener builds its events and stores them as made. A run nobody listens
//! to builds none (its machine only counts them: `RunOptions::journaled`), and stores
//! only the ones it makes after an interrupt (a cancel, or its deadline seen in the middle
//! of a render), which no journal can replay. Its other events are made again here, by
//! replaying its journal into a machine with events on: the journal holds every input,
//! times included, so the replay makes the same events, which each input's recorded
//! position checks.
//!
//! The events a run stored are one unbroken run of `seq`s: all of them (a run listened to
//! from its start), or from some `seq` on (a run listened to from a resume on, or the
//! events of an interrupt). Before that `seq`, the replay says what happened; from it on,
//! the store does.

use std::collections::VecDeque;

use aplc_vm::journal::Input;
use aplc_vm::{Event, Machine};
use serde_json::Value as Json;

use super::{DurableError, stored_run};
use crate::redact::Redactor;
use crate::store::{RunJournal, event_text};

/// Inputs read from the store at a time while replaying.
const INPUTS_PAGE: u64 = 1024;

/// Reads one run's events in order, page by page, from the store or by replaying its
/// journal, and goes on where it left off: a replay is made once, however many pages
/// are read, and follows a run that is still going.
pub struct EventReader {
    id: String,
    redactor: Redactor,
    /// The `seq` of the next event to hand out.
    next: u64,
    source: Source,
}

impl std::fmt::Debug for EventReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReader")
            .field("id", &self.id)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

enum Source {
    /// Nothing is stored or journaled yet.
    Unknown,
    /// Every event was stored, from the first.
    Stored,
    /// Made by replay up to the first stored one.
    Replayed(Box<Replay>),
}

struct Replay {
    machine: Machine,
    /// Inputs replayed so far.
    inputs: u64,
    /// The `seq` of the first stored event, once one is stored: the events from there on
    /// are the store's (stored from its index 0 on).
    stored_from: Option<u64>,
    /// Replayed events, as text, not handed out yet.
    ready: VecDeque<String>,
}

impl EventReader {
    /// A reader of run `id`'s events from `seq` `from` on; `redactor` scrubs the events
    /// it replays (the stored ones were scrubbed when written).
    pub fn new(id: &str, from: u64, redactor: Redactor) -> EventReader {
        EventReader {
            id: id.to_owned(),
            redactor,
            next: from,
            source: Source::Unknown,
        }
    }

    /// The `seq` of the next event [`EventReader::page`] hands out.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Goes on from `seq` (a reader that got the events before it elsewhere: a service's
    /// stream sends live ones as they come); a `seq` already passed changes nothing.
    pub fn skip_to(&mut self, seq: u64) {
        if seq <= self.next {
            return;
        }
        if let Source::Replayed(replay) = &mut self.source {
            let skipped = usize::try_from(seq - self.next).unwrap_or(usize::MAX);
            replay.ready.drain(..skipped.min(replay.ready.len()));
        }
        self.next = seq;
    }

    /// The next events, at most `limit`, as JSON text: those the store holds or its
    /// journal replays now. Fewer than `limit` (none, at the end): all there is for now.
    pub async fn page(
        &mut self,
        store: &dyn RunJournal,
        limit: u64,
    ) -> Result<Vec<String>, DurableError> {
        if matches!(self.source, Source::Unknown) {
            let summary = store.summary(&self.id).await?;
            self.source = match first_stored(store, &self.id, summary.events).await? {
                Some(0) => Source::Stored,
                stored_from if summary.inputs > 0 || stored_from.is_some() => {
                    Source::Replayed(Box::new(self.replay(store, stored_from).await?))
                }
                _ => return Ok(Vec::new()),
            };
        }
        let replay = match &mut self.source {
            Source::Unknown => return Ok(Vec::new()),
            Source::Stored => {
                let page = store.events(&self.id, self.next, limit).await?;
                self.next += page.len() as u64;
                return Ok(page);
            }
            Source::Replayed(replay) => replay,
        };
        if replay.stored_from.is_none() {
            // Stored since: the events of an interrupt, or a resume's listener.
            let summary = store.summary(&self.id).await?;
            replay.stored_from = first_stored(store, &self.id, summary.events).await?;
        }
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        while replay.ready.len() < limit && replay.go_on(&self.id, store).await? {
            for event in replay.machine.drain_events() {
                let stored = replay.stored_from.is_some_and(|from| event.seq >= from);
                if event.seq >= self.next && !stored {
                    replay.ready.push_back(event_text(&event, &self.redactor));
                }
            }
        }
        let mut page: Vec<String> = replay
            .ready
            .drain(..replay.ready.len().min(limit))
            .collect();
        self.next += page.len() as u64;
        if page.len() < limit
            && let Some(from) = replay.stored_from
            && self.next >= from
        {
            let left = (limit - page.len()) as u64;
            let stored = store.events(&self.id, self.next - from, left).await?;
            self.next += stored.len() as u64;
            page.extend(stored);
        }
        Ok(page)
    }

    /// Every event there is now, from the reader's `seq` on.
    pub async fn all(mut self, store: &dyn RunJournal) -> Result<Vec<String>, DurableError> {
        const PAGE: u64 = 4096;
        let mut events = Vec::new();
        loop {
            let page = self.page(store, PAGE).await?;
            let short = (page.len() as u64) < PAGE;
            events.extend(page);
            if short {
                return Ok(events);
            }
        }
    }

    /// A machine with events on, for run `id` as it started, at its first event.
    async fn replay(
        &self,
        store: &dyn RunJournal,
        stored_from: Option<u64>,
    ) -> Result<Replay, DurableError> {
        let loaded = store.load(&self.id).await?;
        let (program, mut options) = stored_run(&self.id, &loaded)?;
        options.events = true;
        options.journaled = true;
        let mut machine = Machine::new(program, options);
        let ready = (machine.drain_events())
            .filter(|e: &Event| e.seq >= self.next && stored_from.is_none_or(|s| e.seq < s))
            .map(|e| event_text(&e, &self.redactor))
            .collect();
        Ok(Replay {
            machine,
            inputs: 0,
            stored_from,
            ready,
        })
    }
}

impl Replay {
    /// Replays the next page of the journal (its events are the machine's to drain);
    /// false when there is nothing more to replay for now, or the replay reached the
    /// stored events.
    async fn go_on(&mut self, id: &str, store: &dyn RunJournal) -> Result<bool, DurableError> {
        let corrupt = |message: String| DurableError::Journal {
            id: id.to_owned(),
            message,
        };
        if self.at_stored() {
            return Ok(false);
        }
        let page = store.inputs(id, self.inputs, INPUTS_PAGE).await?;
        if page.is_empty() {
            let Some(from) = self.stored_from else {
                return Ok(false);
            };
            // A batch stores its inputs with its events: the journal leads to the first
            // stored event, or the store lost part of it.
            let made = self.machine.position().events;
            return Err(corrupt(format!(
                "its journal ends at event {made}, before its first stored event, {from}"
            )));
        }
        for bytes in &page {
            let (input, recorded) =
                Input::decode_entry(bytes).map_err(|e| corrupt(e.to_string()))?;
            // The input during which the run saw an interrupt made events no replay
            // makes (they are stored): its position is the run's, not the replay's.
            let recorded = match self.stored_from {
                Some(from) if recorded.is_some_and(|p| p.events > from) => None,
                _ => recorded,
            };
            let _ = (self.machine)
                .replay(self.inputs, input, recorded)
                .map_err(|e| corrupt(e.to_string()))?;
            self.inputs += 1;
            if self.at_stored() {
                break;
            }
        }
        Ok(true)
    }

    /// True once the replay made every event before the first stored one.
    fn at_stored(&self) -> bool {
        (self.stored_from).is_some_and(|from| self.machine.position().events >= from)
    }
}

/// The `seq` of the first event run `id` stored (of `stored` in all), if it stored any.
async fn first_stored(
    store: &dyn RunJournal,
    id: &str,
    stored: u64,
) -> Result<Option<u64>, DurableError> {
    if stored == 0 {
        return Ok(None);
    }
    let first = store.events(id, 0, 1).await?;
    let seq = first
        .first()
        .and_then(|text| serde_json::from_str::<Json>(text).ok())
        .and_then(|event| event.get("seq").and_then(Json::as_u64));
    match seq {
        Some(seq) => Ok(Some(seq)),
        None => Err(DurableError::Journal {
            id: id.to_owned(),
            message: "its first stored event has no `seq`".into(),
        }),
    }
}
