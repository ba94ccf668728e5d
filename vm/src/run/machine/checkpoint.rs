//! Checkpoints: a machine's state at rest, written to bytes and read back exactly
//! (`spec/durability.md`, "Checkpoints").
//!
//! The format is written by hand rather than derived: it reads untrusted bytes (a store
//! on disk), so every length is checked against the input left before anything is
//! allocated, and every nesting level against the program's `max_depth`, which a
//! derived postcard reader of recursive values would not do. Template values keep their
//! exact representation (integer kinds, floats, safe strings, tuples, ordered maps with
//! any keys, namespaces, frozen snapshots); a value without one is refused with
//! [`JournalError::Unencodable`] rather than written approximately.
//!
//! `context_history` is written as segments: each entry as the variables that changed
//! since the entry before it, so a segment grows with what its steps changed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use imbl::Vector;
use minijinja::Value;
use minijinja::value::durable::{self, Number};
use minijinja::value::{Tuple, ValueKind};

use super::{Machine, State, ToolRound, Verdict};
use crate::bundle::{Role, SourceSpan, StepId};
use crate::interrupt::Interrupt;
use crate::program::Program;
use crate::provider::exchange::{
    Completion, Content, FinishReason, Message, Part, ProviderError, ProviderErrorKind, ToolCall,
    Usage,
};
use crate::provider::tools::Ledger;
use crate::run::events::{Phase, Recorder, RecorderState};
use crate::run::journal::{Checkpoint, JournalError};
use crate::run::{RunError, RunErrorKind, RunOptions};
use crate::template::store::{History, Snapshot, Store, Vars};

/// The first bytes of a checkpoint's state.
const STATE_MAGIC: &[u8; 4] = b"APLS";
/// The first bytes of a history segment.
const HISTORY_MAGIC: &[u8; 4] = b"APLH";
/// The layout version of both; a reader refuses any other but [`FORMAT_1`].
/// Format 2 adds a tool round's approval verdicts (`spec/human.md`).
const FORMAT: u8 = 2;
/// The layout before approvals, still read (a round then has no verdicts).
const FORMAT_1: u8 = 1;

// Value tags.
const T_UNDEFINED: u8 = 0;
const T_SILENT_UNDEFINED: u8 = 1;
const T_NONE: u8 = 2;
const T_FALSE: u8 = 3;
const T_TRUE: u8 = 4;
const T_U64: u8 = 5;
const T_I64: u8 = 6;
const T_F64: u8 = 7;
const T_U128: u8 = 8;
const T_I128: u8 = 9;
const T_STRING: u8 = 10;
const T_SAFE_STRING: u8 = 11;
const T_BYTES: u8 = 12;
const T_LIST: u8 = 13;
const T_TUPLE: u8 = 14;
const T_MAP: u8 = 15;
/// A namespace, by its id in the state's table: one object wherever it appears.
const T_NAMESPACE: u8 = 16;
const T_SNAPSHOT: u8 = 17;
const T_HISTORY: u8 = 18;
/// A `BTreeMap<String, Value>` object (the initial `logit_bias`).
const T_STRING_MAP: u8 = 19;

// JSON tags.
const J_NULL: u8 = 0;
const J_FALSE: u8 = 1;
const J_TRUE: u8 = 2;
const J_U64: u8 = 3;
const J_I64: u8 = 4;
const J_F64: u8 = 5;
const J_STRING: u8 = 6;
const J_ARRAY: u8 = 7;
const J_OBJECT: u8 = 8;

/// The namespaces a run's checkpoints have met, by identity. A namespace is mutable and
/// shared: the live variable and every `context_history` entry that holds it are one
/// object, and a change made later shows in all of them. So a checkpoint writes each
/// namespace once, in its state, with its current content, and every place that holds
/// it (history segments written by earlier checkpoints included) refers to it by an id
/// that stays the same for the whole run, across restores.
#[derive(Debug, Default)]
pub(super) struct Namespaces(Mutex<NamespaceTable>);

#[derive(Debug, Default)]
struct NamespaceTable {
    /// Identity to id.
    ids: HashMap<usize, u64>,
    /// By id. Holding them keeps every identity unique for the run.
    values: Vec<Value>,
}

impl Namespaces {
    fn new(values: Vec<Value>) -> Namespaces {
        let ids = (values.iter().enumerate())
            .filter_map(|(i, v)| Some((durable::namespace_identity(v)?, i as u64)))
            .collect();
        Namespaces(Mutex::new(NamespaceTable { ids, values }))
    }

    fn lock(&self) -> MutexGuard<'_, NamespaceTable> {
        // The table is only ever appended to: a panic cannot leave it half-written.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The id of the namespace `value` (whose identity is `identity`), new if need be.
    fn id(&self, identity: usize, value: &Value) -> u64 {
        let mut table = self.lock();
        if let Some(id) = table.ids.get(&identity) {
            return *id;
        }
        let id = table.values.len() as u64;
        table.values.push(value.clone());
        table.ids.insert(identity, id);
        id
    }

    fn values(&self) -> Vec<Value> {
        self.lock().values.clone()
    }

    /// The id of the namespace `identity` if it has one below `below`: the namespaces
    /// a deferred history segment may name (those its checkpoint's state wrote).
    fn known(&self, identity: usize, below: u64) -> Option<u64> {
        self.lock()
            .ids
            .get(&identity)
            .copied()
            .filter(|id| *id < below)
    }
}

pub(super) fn history_len(machine: &Machine) -> u64 {
    machine.store.parts().1.len() as u64
}

pub(super) fn checkpoint(
    machine: &Machine,
    history_start: u64,
) -> Result<Checkpoint, JournalError> {
    let history = machine.store.parts().1;
    let max_depth = machine.program.limits().max_depth;
    check_history_start(history_start, history.len())?;
    // The history first: the namespaces it finds go into the state's table too.
    let namespaces = &machine.namespaces;
    let history = encode_history(
        &history,
        history_start as usize,
        max_depth,
        namespaces,
        None,
    )?;
    let (state, _) = encode_state(machine)?;
    Ok(Checkpoint {
        history_start,
        history,
        state,
    })
}

/// A checkpoint whose state is written and whose `context_history` segment is left to
/// be written later, on another thread if need be ([`HistorySegment::encode`]): the
/// entries are immutable snapshots, so the segment written later is the one written now.
#[derive(Clone)]
pub struct DeferredCheckpoint {
    /// Index of the first `context_history` entry of the segment.
    pub history_start: u64,
    /// The state, as [`Checkpoint::state`].
    pub state: Vec<u8>,
    /// The segment, to write.
    pub history: HistorySegment,
}

/// `context_history` entries to write as a checkpoint's segment (see
/// [`DeferredCheckpoint`]).
#[derive(Clone)]
pub struct HistorySegment {
    history: Vector<Value>,
    start: usize,
    max_depth: usize,
    namespaces: Arc<Namespaces>,
    /// The namespaces the state's table holds: a namespace past them is one only the
    /// history holds, whose content the state did not capture when it was written.
    known_namespaces: u64,
}

impl std::fmt::Debug for HistorySegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistorySegment")
            .field("start", &self.start)
            .field("entries", &(self.history.len() - self.start))
            .finish()
    }
}

impl std::fmt::Debug for DeferredCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredCheckpoint")
            .field("history_start", &self.history_start)
            .field("state_bytes", &self.state.len())
            .field("history", &self.history)
            .finish()
    }
}

impl HistorySegment {
    /// The segment, as [`Checkpoint::history`]. Refused with
    /// [`JournalError::NotAtRest`] when an entry holds a namespace the state's table does
    /// not (one the run has since let go of: its content then was not captured), and
    /// with [`JournalError::Unencodable`] for a value with no durable form: then no
    /// checkpoint is taken from this state, and a checkpoint written whole
    /// ([`Machine::checkpoint`]) is the way on.
    pub fn encode(&self) -> Result<Vec<u8>, JournalError> {
        encode_history(
            &self.history,
            self.start,
            self.max_depth,
            &self.namespaces,
            Some(self.known_namespaces),
        )
    }
}

pub(super) fn deferred(
    machine: &Machine,
    history_start: u64,
) -> Result<DeferredCheckpoint, JournalError> {
    let history = machine.store.parts().1;
    check_history_start(history_start, history.len())?;
    let (state, known_namespaces) = encode_state(machine)?;
    Ok(DeferredCheckpoint {
        history_start,
        state,
        history: HistorySegment {
            history,
            start: history_start as usize,
            max_depth: machine.program.limits().max_depth,
            namespaces: machine.namespaces.clone(),
            known_namespaces,
        },
    })
}

fn check_history_start(history_start: u64, len: usize) -> Result<(), JournalError> {
    if history_start > len as u64 {
        return Err(JournalError::Mismatch(format!(
            "history_start {history_start} is past the history's {len} entries"
        )));
    }
    Ok(())
}

/// The state of `machine` at rest, and how many namespaces its table holds.
fn encode_state(machine: &Machine) -> Result<(Vec<u8>, u64), JournalError> {
    let (vars, history) = machine.store.parts();
    let max_depth = machine.program.limits().max_depth;
    let len = history.len() as u64;
    let namespaces = &*machine.namespaces;
    let mut w = Writer::new(max_depth, Some(namespaces));
    match &machine.state {
        State::Running => w.u8(0),
        State::PromptFailed => w.u8(1),
        State::Responded(Ok(completion)) => {
            w.u8(2);
            w.completion(completion);
        }
        State::Responded(Err(error)) => {
            w.u8(3);
            w.provider_error(error);
        }
        State::Done => w.u8(4),
        State::AwaitingProvider => {
            return Err(JournalError::NotAtRest("a provider call is outstanding"));
        }
        State::AwaitingTool { .. } => {
            return Err(JournalError::NotAtRest("a tool call is outstanding"));
        }
        State::AwaitingInput => {
            return Err(JournalError::NotAtRest(
                "the run waits for a person's answer",
            ));
        }
    }
    w.u64(machine.pc as u64);
    w.step(machine.step);
    w.u64(machine.runs.len() as u64);
    for runs in &machine.runs {
        w.u64(*runs);
    }
    w.u64(machine.global_runs);
    w.duration(machine.step_started);
    w.u64(machine.messages.len() as u64);
    for message in machine.messages.iter() {
        w.message(message);
    }
    w.tool_calls(&machine.tool_calls);
    match &machine.tool_round {
        None => w.u8(0),
        Some(round) => {
            w.u8(1);
            w.tool_calls(&round.calls);
            w.u64(round.next as u64);
            w.u64(round.results.len() as u64);
            for result in &round.results {
                w.value(result, "result_tool_calls", 0)?;
            }
            w.verdicts(round.verdicts.as_deref());
        }
    }
    let entries = machine.ledger.entries();
    w.u64(entries.len() as u64);
    for (key, value, stored) in entries {
        w.str(key);
        w.json(value);
        w.duration(stored);
    }
    w.bool(machine.post_ran);
    w.strings(&machine.last_step_errors);
    w.step(machine.last_errors_step);
    w.u64(machine.steps);
    match &machine.error {
        None => w.u8(0),
        Some(error) => {
            w.u8(1);
            w.run_error(error);
        }
    }
    w.recorder(&machine.events.state());
    w.vars(&vars, 0)?;
    // The namespaces last: writing the rest is what finds them. The state starts with
    // them all the same, so that a reader has them before the first reference.
    let mut head = Writer::new(max_depth, None);
    head.raw(STATE_MAGIC);
    head.u8(FORMAT);
    fingerprint(&mut head, &machine.program);
    head.u64(len);
    let table = namespaces.values();
    head.u64(table.len() as u64);
    for namespace in &table {
        let Some(pairs) = namespace.as_object().and_then(|o| o.try_iter_pairs()) else {
            return Err(unencodable("namespace()", describe(namespace)));
        };
        let pairs: Vec<(Value, Value)> = pairs.collect();
        head.u64(pairs.len() as u64);
        for (key, item) in &pairs {
            // Namespace keys are strings: the engine sets them by attribute name.
            let Some(key) = key.as_str() else {
                return Err(unencodable(
                    "namespace()",
                    "namespace with a non-string key",
                ));
            };
            head.str(key);
            // A namespace inside a namespace is refused by the engine (and, without a
            // table here, by this writer).
            head.value(item, key, 1)?;
        }
    }
    head.raw(&w.buf);
    Ok((head.buf, table.len() as u64))
}

pub(super) fn restore(
    program: Arc<Program>,
    options: RunOptions,
    segments: &[(u64, &[u8])],
    state: &[u8],
) -> Result<Machine, JournalError> {
    let max_depth = program.limits().max_depth;
    let mut r = Reader::new(state, max_depth, &[]);
    let format = r.magic(STATE_MAGIC, "checkpoint state")?;
    check_fingerprint(&mut r, &program)?;
    let history_len = r.u64()?;
    let mut table = Vec::new();
    for _ in 0..r.count()? {
        let mut pairs = Vec::new();
        for _ in 0..r.count()? {
            let key: Arc<str> = Arc::from(r.string()?);
            let item = r.value(1)?;
            pairs.push((key, item));
        }
        table.push(durable::namespace_from_pairs(pairs));
    }
    let mut r = Reader::new(r.bytes, max_depth, &table);
    let history = decode_history(segments, history_len, max_depth, &table)?;
    let machine_state = match r.u8()? {
        0 => State::Running,
        1 => State::PromptFailed,
        2 => State::Responded(Ok(r.completion()?)),
        3 => State::Responded(Err(r.provider_error()?)),
        4 => State::Done,
        tag => return Err(corrupt(format!("state tag {tag}"))),
    };
    let bundle = program.bundle();
    let pc = r.u64()?;
    if pc > bundle.code.len() as u64 {
        return Err(corrupt(format!("pc {pc} is past the code")));
    }
    let step = r.step(&program)?;
    let runs_len = r.count()?;
    if runs_len != bundle.steps.len() {
        return Err(corrupt(format!(
            "{runs_len} run counters for {} steps",
            bundle.steps.len()
        )));
    }
    let runs = (0..runs_len)
        .map(|_| r.u64())
        .collect::<Result<Vec<_>, _>>()?;
    let global_runs = r.u64()?;
    let step_started = r.duration()?;
    let messages_len = r.count()?;
    let messages = (0..messages_len)
        .map(|_| r.message())
        .collect::<Result<Vec<_>, _>>()?;
    let tool_calls = r.tool_calls()?;
    let tool_round = match r.u8()? {
        0 => None,
        1 => {
            let calls = r.tool_calls()?;
            let next = r.u64()?;
            if next > calls.len() as u64 {
                return Err(corrupt(format!(
                    "tool round at call {next} of {}",
                    calls.len()
                )));
            }
            let results_len = r.count()?;
            let results = (0..results_len)
                .map(|_| r.value(0))
                .collect::<Result<Vec<_>, _>>()?;
            let verdicts = if format == FORMAT_1 {
                None
            } else {
                r.verdicts(calls.len())?
            };
            Some(ToolRound {
                calls,
                next: next as usize,
                results,
                verdicts,
            })
        }
        tag => return Err(corrupt(format!("tool round tag {tag}"))),
    };
    let mut ledger = Ledger::default();
    for _ in 0..r.count()? {
        let key = r.string()?;
        let value = r.json(0)?;
        let stored = r.duration()?;
        ledger.put(key, value, stored);
    }
    let post_ran = r.bool()?;
    let last_step_errors = r.strings()?;
    let last_errors_step = r.step(&program)?;
    let steps = r.u64()?;
    let error = match r.u8()? {
        0 => None,
        1 => Some(r.run_error()?),
        tag => return Err(corrupt(format!("error tag {tag}"))),
    };
    let recorder = r.recorder()?;
    let vars = r.vars(0)?;
    r.end()?;
    let nest = super::child::Nest::root(&program, &options);
    let tools = nest.agents.tools(&options.tools);
    Ok(Machine {
        program,
        store: Store::from_parts(vars, history),
        state: machine_state,
        pc: pc as usize,
        step,
        runs,
        global_runs,
        max_runs: options.max_runs,
        max_steps: options.max_steps,
        step_started,
        deadline: options.timeout,
        timeout: options.timeout,
        messages: messages.into(),
        tool_calls,
        tools,
        tool_round,
        ledger,
        post_ran,
        last_step_errors,
        last_errors_step,
        steps,
        error,
        interrupt: [Interrupt::new(), options.interrupt],
        asking: None,
        events: Recorder::restored(options.events, options.journaled, recorder)
            .with_phase_times(options.phase_times),
        namespaces: Arc::new(Namespaces::new(table)),
        nest,
    })
}

/// What ties a checkpoint to its program: the source hash and the table sizes the
/// state indexes into (a recompiled source with another layout gets another hash).
fn fingerprint(w: &mut Writer, program: &Program) {
    let bundle = program.bundle();
    w.raw(&bundle.source_hash);
    w.u64(bundle.code.len() as u64);
    w.u64(bundle.steps.len() as u64);
    w.u64(bundle.templates.len() as u64);
}

fn check_fingerprint(r: &mut Reader, program: &Program) -> Result<(), JournalError> {
    let mut expected = Writer::new(0, None);
    fingerprint(&mut expected, program);
    let found = r.take(expected.buf.len())?;
    if found != expected.buf.as_slice() {
        return Err(JournalError::Mismatch(format!(
            "the checkpoint was made for another program than `{}` ({})",
            program.bundle().source_name,
            program.bundle().source_hash_hex()
        )));
    }
    Ok(())
}

/// Encodes `history[start..]`, each entry as its changes against the entry before.
/// `known`: the namespaces the segment may name (a deferred segment's); `None` lets it
/// add to the table.
fn encode_history(
    history: &Vector<Value>,
    start: usize,
    max_depth: usize,
    namespaces: &Namespaces,
    known: Option<u64>,
) -> Result<Vec<u8>, JournalError> {
    let mut w = Writer::new(max_depth, None);
    w.raw(HISTORY_MAGIC);
    w.u8(FORMAT);
    w.u64(start as u64);
    w.u64((history.len() - start) as u64);
    let mut previous = match start.checked_sub(1) {
        Some(i) => Some(snapshot_vars(&history[i])?),
        None => None,
    };
    // Scratch space reused by every entry (allocating a buffer per changed value was a
    // fifth of a checkpoint): the entry's changes as written (each name, then its
    // value), and an old value's bytes to compare with.
    let mut changes = Writer::new(max_depth, Some(namespaces));
    let mut old_bytes = Writer::new(max_depth, Some(namespaces));
    changes.known_namespaces = known;
    old_bytes.known_namespaces = known;
    let mut removed: Vec<&str> = Vec::new();
    for entry in history.iter().skip(start) {
        let current = snapshot_vars(entry)?;
        // Only what changed since the entry before is written. Consecutive snapshots
        // share most values (the store copies references, not data), so a value is
        // encoded only when it is not plainly the same as the one before: encoding every
        // variable of every entry to compare bytes was most of a durable run's cost on
        // its own thread (callgrind, issue #24).
        // Both entries list their variables in name order: one merge finds what
        // changed, what is new and what was removed.
        let mut olds = previous.into_iter().flat_map(Vars::iter).peekable();
        changes.buf.clear();
        removed.clear();
        let mut changed = 0u64;
        for (name, value) in current.iter() {
            while let Some((gone, _)) = olds.next_if(|(old, _)| *old < name) {
                removed.push(gone);
            }
            let old = olds.next_if(|(old, _)| *old == name).map(|(_, old)| old);
            if old.is_some_and(|old| same_encoding(old, value)) {
                continue;
            }
            let mark = changes.buf.len();
            changes.str(name);
            let at = changes.buf.len();
            changes.value(value, name, 0)?;
            // Equal values that are not the same object (a list built anew each step):
            // their bytes decide, as they always did.
            if let Some(old) = old {
                old_bytes.buf.clear();
                old_bytes.value(old, name, 0)?;
                if old_bytes.buf == changes.buf[at..] {
                    changes.buf.truncate(mark);
                    continue;
                }
            }
            changed += 1;
        }
        w.u64(changed);
        w.raw(&changes.buf);
        removed.extend(olds.map(|(gone, _)| gone));
        w.u64(removed.len() as u64);
        for name in &removed {
            w.str(name);
        }
        previous = Some(current);
    }
    Ok(w.buf)
}

/// The variables of a `context_history` entry.
fn snapshot_vars(entry: &Value) -> Result<&Vars, JournalError> {
    match entry.downcast_object_ref::<Snapshot>() {
        Some(snapshot) => Ok(&snapshot.0),
        None => Err(JournalError::Unencodable {
            name: "context_history".into(),
            kind: format!("{} entry", entry.kind()),
        }),
    }
}

/// True if `a` and `b` certainly encode to the same bytes: the same object (a clone of
/// a value is the same object; objects are encoded whole, and namespaces by identity),
/// or equal scalars of the same representation. False says nothing: the caller then
/// compares the bytes.
fn same_encoding(a: &Value, b: &Value) -> bool {
    if a.is_same_object(b) {
        return true;
    }
    match (a.kind(), b.kind()) {
        (ValueKind::Undefined, ValueKind::Undefined) => {
            durable::is_silent_undefined(a) == durable::is_silent_undefined(b)
        }
        (ValueKind::None, ValueKind::None) => true,
        (ValueKind::Bool, ValueKind::Bool) => a.is_true() == b.is_true(),
        (ValueKind::Number, ValueKind::Number) => match (durable::number(a), durable::number(b)) {
            // By bits: 0.0 and -0.0 are equal floats that encode apart.
            (Some(Number::F64(x)), Some(Number::F64(y))) => x.to_bits() == y.to_bits(),
            (Some(Number::F64(_)), _) | (_, Some(Number::F64(_))) => false,
            // The same variant with the same value (integers only, here).
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
        (ValueKind::String, ValueKind::String) => {
            a.is_safe() == b.is_safe() && a.as_str().is_some() && a.as_str() == b.as_str()
        }
        _ => false,
    }
}

fn decode_history(
    segments: &[(u64, &[u8])],
    expected_len: u64,
    max_depth: usize,
    namespaces: &[Value],
) -> Result<Vector<Value>, JournalError> {
    let mut history = Vector::new();
    let mut previous = Vars::new();
    for (start, bytes) in segments {
        if *start != history.len() as u64 {
            return Err(JournalError::Mismatch(format!(
                "history segment starts at {start}, expected {}",
                history.len()
            )));
        }
        let mut r = Reader::new(bytes, max_depth, namespaces);
        r.magic(HISTORY_MAGIC, "history segment")?;
        let written_start = r.u64()?;
        if written_start != *start {
            return Err(JournalError::Mismatch(format!(
                "history segment says it starts at {written_start}, given as {start}"
            )));
        }
        for _ in 0..r.count()? {
            let mut vars = previous.clone();
            for _ in 0..r.count()? {
                let name = r.string()?;
                let value = r.value(0)?;
                vars.insert(name, value);
            }
            let removed = (0..r.count()?)
                .map(|_| r.string())
                .collect::<Result<Vec<_>, _>>()?;
            if !removed.is_empty() {
                // Vars has no removal: rebuild without the removed names (rare: no
                // template can unset a variable).
                let mut kept = Vars::new();
                for (name, value) in vars.iter() {
                    if !removed.iter().any(|r| r == name) {
                        kept.insert(name, value.clone());
                    }
                }
                vars = kept;
            }
            history.push_back(Value::from_object(Snapshot(vars.clone())));
            previous = vars;
        }
        r.end()?;
    }
    if history.len() as u64 != expected_len {
        return Err(JournalError::Mismatch(format!(
            "the history segments hold {} entries, the checkpoint {expected_len}",
            history.len()
        )));
    }
    Ok(history)
}

fn corrupt(message: String) -> JournalError {
    JournalError::Corrupt(format!("checkpoint: {message}"))
}

fn unencodable(name: &str, kind: impl Into<String>) -> JournalError {
    JournalError::Unencodable {
        name: name.to_string(),
        kind: kind.into(),
    }
}

/// What an unencodable value is, in words.
fn describe(value: &Value) -> String {
    if format!("{value:?}").starts_with("<macro ") {
        return "macro".into();
    }
    match value.kind() {
        ValueKind::Plain => "callable or engine object (a loop, cycler, joiner, …)".into(),
        ValueKind::Iterable => "lazy iterable".into(),
        ValueKind::Invalid => "invalid value".into(),
        ValueKind::Seq => "sequence object".into(),
        ValueKind::Map => "map object".into(),
        other => format!("{other}"),
    }
}

struct Writer<'n> {
    buf: Vec<u8>,
    max_depth: usize,
    /// Where namespaces go; `None` where none may appear (inside a namespace).
    namespaces: Option<&'n Namespaces>,
    /// `Some(n)`: only the first `n` namespaces of the table may be named (a deferred
    /// history segment's, [`HistorySegment`]); `None`: a new one joins the table.
    known_namespaces: Option<u64>,
}

impl<'n> Writer<'n> {
    fn new(max_depth: usize, namespaces: Option<&'n Namespaces>) -> Writer<'n> {
        Writer {
            buf: Vec::new(),
            max_depth,
            namespaces,
            known_namespaces: None,
        }
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    /// LEB128.
    fn u64(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.u8(byte);
                return;
            }
            self.u8(byte | 0x80);
        }
    }

    fn i64(&mut self, v: i64) {
        self.u64(((v << 1) ^ (v >> 63)) as u64);
    }

    fn duration(&mut self, d: Duration) {
        self.u64(d.as_secs());
        self.u64(u64::from(d.subsec_nanos()));
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        self.raw(bytes);
    }

    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }

    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.u64(v);
            }
        }
    }

    fn strings(&mut self, strings: &[String]) {
        self.u64(strings.len() as u64);
        for s in strings {
            self.str(s);
        }
    }

    fn step(&mut self, step: Option<StepId>) {
        match step {
            None => self.u8(0),
            Some(step) => {
                self.u8(1);
                self.u64(u64::from(step.0));
            }
        }
    }

    fn vars(&mut self, vars: &Vars, depth: usize) -> Result<(), JournalError> {
        self.u64(vars.len() as u64);
        for (name, value) in vars.iter() {
            self.str(name);
            self.value(value, name, depth)?;
        }
        Ok(())
    }

    /// `value`, inside `depth` containers; `name` is the variable it belongs to.
    fn value(&mut self, value: &Value, name: &str, depth: usize) -> Result<(), JournalError> {
        match value.kind() {
            ValueKind::Undefined => {
                self.u8(if durable::is_silent_undefined(value) {
                    T_SILENT_UNDEFINED
                } else {
                    T_UNDEFINED
                });
            }
            ValueKind::None => self.u8(T_NONE),
            ValueKind::Bool => self.u8(if value.is_true() { T_TRUE } else { T_FALSE }),
            ValueKind::Number => match durable::number(value) {
                Some(Number::U64(v)) => {
                    self.u8(T_U64);
                    self.u64(v);
                }
                Some(Number::I64(v)) => {
                    self.u8(T_I64);
                    self.i64(v);
                }
                Some(Number::F64(v)) => {
                    self.u8(T_F64);
                    self.raw(&v.to_bits().to_le_bytes());
                }
                Some(Number::U128(v)) => {
                    self.u8(T_U128);
                    self.raw(&v.to_le_bytes());
                }
                Some(Number::I128(v)) => {
                    self.u8(T_I128);
                    self.raw(&v.to_le_bytes());
                }
                None => return Err(unencodable(name, describe(value))),
            },
            ValueKind::String => {
                let Some(s) = value.as_str() else {
                    return Err(unencodable(name, describe(value)));
                };
                self.u8(if value.is_safe() {
                    T_SAFE_STRING
                } else {
                    T_STRING
                });
                self.str(s);
            }
            ValueKind::Bytes => {
                let Some(bytes) = value.as_bytes() else {
                    return Err(unencodable(name, describe(value)));
                };
                self.u8(T_BYTES);
                self.bytes(bytes);
            }
            _ => self.object(value, name, depth)?,
        }
        Ok(())
    }

    fn object(&mut self, value: &Value, name: &str, depth: usize) -> Result<(), JournalError> {
        let inner = depth + 1;
        if inner > self.max_depth {
            return Err(unencodable(
                name,
                format!("value nested more than {} levels deep", self.max_depth),
            ));
        }
        if let Some(items) = value.downcast_object_ref::<Vec<Value>>() {
            self.u8(T_LIST);
            return self.values(items.iter(), items.len(), name, inner);
        }
        if let Some(tuple) = value.downcast_object_ref::<Tuple>() {
            self.u8(T_TUPLE);
            return self.values(tuple.iter(), tuple.len(), name, inner);
        }
        if let Some(history) = value.downcast_object_ref::<History>() {
            self.u8(T_HISTORY);
            return self.values(history.0.iter(), history.0.len(), name, inner);
        }
        if let Some(snapshot) = value.downcast_object_ref::<Snapshot>() {
            self.u8(T_SNAPSHOT);
            return self.vars(&snapshot.0, inner);
        }
        if let Some(map) = value.downcast_object_ref::<BTreeMap<String, Value>>() {
            self.u8(T_STRING_MAP);
            self.u64(map.len() as u64);
            for (key, item) in map {
                self.str(key);
                self.value(item, name, inner)?;
            }
            return Ok(());
        }
        if let Some(identity) = durable::namespace_identity(value) {
            let Some(namespaces) = self.namespaces else {
                return Err(unencodable(name, "namespace inside a namespace"));
            };
            let id = match self.known_namespaces {
                None => namespaces.id(identity, value),
                Some(known) => namespaces
                    .known(identity, known)
                    .ok_or(JournalError::NotAtRest(
                        "a namespace only context_history holds: its checkpoint is written whole",
                    ))?,
            };
            self.u8(T_NAMESPACE);
            self.u64(id);
            return Ok(());
        }
        if durable::is_value_map(value) {
            let Some(pairs) = value.as_object().and_then(|o| o.try_iter_pairs()) else {
                return Err(unencodable(name, describe(value)));
            };
            let pairs: Vec<(Value, Value)> = pairs.collect();
            self.u8(T_MAP);
            self.u64(pairs.len() as u64);
            for (key, item) in &pairs {
                self.value(key, name, inner)?;
                self.value(item, name, inner)?;
            }
            return Ok(());
        }
        Err(unencodable(name, describe(value)))
    }

    fn values<'a>(
        &mut self,
        items: impl Iterator<Item = &'a Value>,
        len: usize,
        name: &str,
        depth: usize,
    ) -> Result<(), JournalError> {
        self.u64(len as u64);
        for item in items {
            self.value(item, name, depth)?;
        }
        Ok(())
    }

    fn json(&mut self, value: &serde_json::Value) {
        use serde_json::Value as Json;
        match value {
            Json::Null => self.u8(J_NULL),
            Json::Bool(false) => self.u8(J_FALSE),
            Json::Bool(true) => self.u8(J_TRUE),
            Json::Number(n) => {
                if let Some(v) = n.as_u64() {
                    self.u8(J_U64);
                    self.u64(v);
                } else if let Some(v) = n.as_i64() {
                    self.u8(J_I64);
                    self.i64(v);
                } else {
                    // Without `arbitrary_precision`, a number is a u64, an i64 or an f64.
                    self.u8(J_F64);
                    self.raw(&n.as_f64().unwrap_or(0.0).to_bits().to_le_bytes());
                }
            }
            Json::String(s) => {
                self.u8(J_STRING);
                self.str(s);
            }
            Json::Array(items) => {
                self.u8(J_ARRAY);
                self.u64(items.len() as u64);
                for item in items {
                    self.json(item);
                }
            }
            Json::Object(map) => {
                self.u8(J_OBJECT);
                self.json_map(map);
            }
        }
    }

    fn json_map(&mut self, map: &serde_json::Map<String, serde_json::Value>) {
        self.u64(map.len() as u64);
        for (key, item) in map {
            self.str(key);
            self.json(item);
        }
    }

    fn part(&mut self, part: &Part) {
        let (tag, s) = match part {
            Part::Text(s) => (0, s),
            Part::ImageUrl(s) => (1, s),
            Part::AudioInput(s) => (2, s),
            Part::File(s) => (3, s),
        };
        self.u8(tag);
        self.str(s);
    }

    fn parts(&mut self, parts: &[Part]) {
        self.u64(parts.len() as u64);
        for part in parts {
            self.part(part);
        }
    }

    fn tool_calls(&mut self, calls: &[ToolCall]) {
        self.u64(calls.len() as u64);
        for call in calls {
            self.str(&call.id);
            self.str(&call.name);
            self.json(&call.arguments);
        }
    }

    fn completion(&mut self, c: &Completion) {
        self.str(&c.role);
        self.parts(&c.content);
        self.tool_calls(&c.tool_calls);
        match &c.usage {
            None => self.u8(0),
            Some(usage) => {
                self.u8(1);
                self.opt_u64(usage.input_tokens);
                self.opt_u64(usage.output_tokens);
                self.json_map(&usage.fields);
            }
        }
        match &c.finish_reason {
            None => self.u8(0),
            Some(FinishReason::Stop) => self.u8(1),
            Some(FinishReason::Length) => self.u8(2),
            Some(FinishReason::ToolCalls) => self.u8(3),
            Some(FinishReason::ContentFilter) => self.u8(4),
            Some(FinishReason::Other(other)) => {
                self.u8(5);
                self.str(other);
            }
        }
        self.opt_str(c.model.as_deref());
    }

    fn provider_error(&mut self, e: &ProviderError) {
        // The index in `ProviderErrorKind::ALL`, which the reader uses; a match, so a new
        // kind cannot be written as another.
        self.u8(match e.kind {
            ProviderErrorKind::Auth => 0,
            ProviderErrorKind::RateLimited => 1,
            ProviderErrorKind::Server => 2,
            ProviderErrorKind::Timeout => 3,
            ProviderErrorKind::Transport => 4,
            ProviderErrorKind::InvalidRequest => 5,
            ProviderErrorKind::InvalidResponse => 6,
            ProviderErrorKind::Other => 7,
        });
        self.str(&e.message);
    }

    fn message(&mut self, m: &Message) {
        // The index in `Role::ALL`, which the reader uses.
        self.u8(match m.role {
            Role::System => 0,
            Role::User => 1,
            Role::Assistant => 2,
            Role::Developer => 3,
            Role::ToolResult => 4,
        });
        match &m.content {
            Content::Text(text) => {
                self.u8(0);
                self.str(text);
            }
            Content::Parts(parts) => {
                self.u8(1);
                self.parts(parts);
            }
        }
    }

    /// A tool round's verdicts: whether it asked, then one tag per call.
    fn verdicts(&mut self, verdicts: Option<&[Option<Verdict>]>) {
        let Some(verdicts) = verdicts else {
            self.bool(false);
            return;
        };
        self.bool(true);
        self.u64(verdicts.len() as u64);
        for verdict in verdicts {
            match verdict {
                None => self.u8(0),
                Some(Verdict::Approved) => self.u8(1),
                Some(Verdict::Denied(message)) => {
                    self.u8(2);
                    self.str(message);
                }
            }
        }
    }

    fn run_error(&mut self, e: &RunError) {
        self.u8(match e.kind {
            RunErrorKind::UnknownStep => 0,
            RunErrorKind::BudgetExceeded => 1,
            RunErrorKind::StepBudgetExceeded => 2,
            RunErrorKind::Timeout => 3,
            RunErrorKind::InvalidOptions => 4,
            RunErrorKind::MissingInput => 5,
            RunErrorKind::Protocol => 6,
            RunErrorKind::Cancelled => 7,
            RunErrorKind::InputUnavailable => 8,
        });
        self.str(&e.message);
        self.opt_str(e.step.as_deref());
        match e.span {
            None => self.u8(0),
            Some(span) => {
                self.u8(1);
                for v in [span.start, span.end, span.line, span.col] {
                    self.u64(u64::from(v));
                }
            }
        }
    }

    fn recorder(&mut self, s: &RecorderState) {
        self.u64(s.seq);
        self.duration(s.now);
        self.duration(s.step_started);
        match s.phase {
            None => self.u8(0),
            Some((phase, started)) => {
                self.u8(match phase {
                    Phase::Pre => 1,
                    Phase::Prompt => 2,
                    Phase::Post => 3,
                });
                self.duration(started);
            }
        }
        self.duration(s.provider_started);
        self.duration(s.tool_started);
        self.u64(s.errors_seen as u64);
        self.u64(s.provider_calls);
        self.u64(s.input_tokens);
        self.u64(s.output_tokens);
        self.bool(s.finished);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    max_depth: usize,
    /// The state's namespaces, by id.
    namespaces: &'a [Value],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], max_depth: usize, namespaces: &'a [Value]) -> Reader<'a> {
        Reader {
            bytes,
            max_depth,
            namespaces,
        }
    }

    /// Reads the magic and the format (returned: this version reads both).
    fn magic(&mut self, magic: &[u8; 4], what: &str) -> Result<u8, JournalError> {
        if self.bytes.get(..4) != Some(magic.as_slice()) {
            return Err(corrupt(format!("not a {what}")));
        }
        self.bytes = &self.bytes[4..];
        let format = self.u8()?;
        if format != FORMAT && format != FORMAT_1 {
            return Err(corrupt(format!(
                "{what} format {format}, this version reads {FORMAT_1} and {FORMAT}"
            )));
        }
        Ok(format)
    }

    /// A tool round's verdicts ([`Writer::verdicts`]), for a round of `calls` calls.
    fn verdicts(&mut self, calls: usize) -> Result<Option<Vec<Option<Verdict>>>, JournalError> {
        if !self.bool()? {
            return Ok(None);
        }
        if self.count()? != calls {
            return Err(corrupt("verdicts for another number of calls".into()));
        }
        let verdicts = (0..calls)
            .map(|_| match self.u8()? {
                0 => Ok(None),
                1 => Ok(Some(Verdict::Approved)),
                2 => Ok(Some(Verdict::Denied(self.string()?))),
                tag => Err(corrupt(format!("verdict tag {tag}"))),
            })
            .collect::<Result<_, _>>()?;
        Ok(Some(verdicts))
    }

    fn end(&self) -> Result<(), JournalError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(corrupt(format!("{} trailing bytes", self.bytes.len())))
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], JournalError> {
        if n > self.bytes.len() {
            return Err(corrupt("truncated".into()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, JournalError> {
        Ok(self.take(1)?[0])
    }

    fn bool(&mut self) -> Result<bool, JournalError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(corrupt(format!("bool {other}"))),
        }
    }

    fn u64(&mut self) -> Result<u64, JournalError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(corrupt("integer overflows 64 bits".into()));
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("integer overflows 64 bits".into()))
    }

    fn i64(&mut self) -> Result<i64, JournalError> {
        let v = self.u64()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    fn u32(&mut self) -> Result<u32, JournalError> {
        let v = self.u64()?;
        u32::try_from(v).map_err(|_| corrupt(format!("{v} overflows 32 bits")))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], JournalError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A count of items, each at least one byte: never more than the bytes left, so a
    /// corrupt count cannot make the reader allocate beyond the input's size.
    fn count(&mut self) -> Result<usize, JournalError> {
        let n = self.u64()?;
        if n > self.bytes.len() as u64 {
            return Err(corrupt(format!(
                "{n} items with {} bytes left",
                self.bytes.len()
            )));
        }
        Ok(n as usize)
    }

    fn duration(&mut self) -> Result<Duration, JournalError> {
        let secs = self.u64()?;
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(corrupt(format!("{nanos} nanoseconds")));
        }
        Ok(Duration::new(secs, nanos))
    }

    fn byte_vec(&mut self) -> Result<&'a [u8], JournalError> {
        let n = self.count()?;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, JournalError> {
        let bytes = self.byte_vec()?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|_| corrupt("string is not UTF-8".into()))
    }

    fn opt_string(&mut self) -> Result<Option<String>, JournalError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.string()?)),
            tag => Err(corrupt(format!("option tag {tag}"))),
        }
    }

    fn opt_u64(&mut self) -> Result<Option<u64>, JournalError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.u64()?)),
            tag => Err(corrupt(format!("option tag {tag}"))),
        }
    }

    fn strings(&mut self) -> Result<Vec<String>, JournalError> {
        (0..self.count()?).map(|_| self.string()).collect()
    }

    fn step(&mut self, program: &Program) -> Result<Option<StepId>, JournalError> {
        match self.u8()? {
            0 => Ok(None),
            1 => {
                let index = self.u32()?;
                if index as usize >= program.bundle().steps.len() {
                    return Err(corrupt(format!("step {index} does not exist")));
                }
                Ok(Some(StepId(index)))
            }
            tag => Err(corrupt(format!("option tag {tag}"))),
        }
    }

    fn vars(&mut self, depth: usize) -> Result<Vars, JournalError> {
        let mut vars = Vars::new();
        for _ in 0..self.count()? {
            let name = self.string()?;
            let value = self.value(depth)?;
            vars.insert(name, value);
        }
        Ok(vars)
    }

    fn value(&mut self, depth: usize) -> Result<Value, JournalError> {
        let tag = self.u8()?;
        let inner = depth + 1;
        if tag >= T_LIST && inner > self.max_depth {
            return Err(corrupt(format!(
                "value nested more than {} levels deep",
                self.max_depth
            )));
        }
        Ok(match tag {
            T_UNDEFINED => Value::UNDEFINED,
            T_SILENT_UNDEFINED => durable::silent_undefined(),
            T_NONE => Value::from(()),
            T_FALSE => Value::from(false),
            T_TRUE => Value::from(true),
            T_U64 => durable::from_number(Number::U64(self.u64()?)),
            T_I64 => durable::from_number(Number::I64(self.i64()?)),
            T_F64 => durable::from_number(Number::F64(f64::from_bits(u64::from_le_bytes(
                self.array()?,
            )))),
            T_U128 => durable::from_number(Number::U128(u128::from_le_bytes(self.array()?))),
            T_I128 => durable::from_number(Number::I128(i128::from_le_bytes(self.array()?))),
            T_STRING => Value::from(self.string()?),
            T_SAFE_STRING => Value::from_safe_string(self.string()?),
            T_BYTES => Value::from_bytes(self.byte_vec()?.to_vec()),
            T_LIST => Value::from(self.values(inner)?),
            T_TUPLE => Value::from_object(Tuple::new(self.values(inner)?)),
            T_HISTORY => {
                let items = self.values(inner)?;
                if items
                    .iter()
                    .any(|item| item.downcast_object_ref::<Snapshot>().is_none())
                {
                    return Err(corrupt("a history entry is not a snapshot".into()));
                }
                Value::from_object(History(items.into_iter().collect()))
            }
            T_SNAPSHOT => Value::from_object(Snapshot(self.vars(inner)?)),
            T_MAP => {
                let n = self.count()?;
                let mut pairs = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = self.value(inner)?;
                    let item = self.value(inner)?;
                    pairs.push((key, item));
                }
                Value::from_pairs(pairs)
            }
            T_STRING_MAP => {
                let mut map = BTreeMap::new();
                for _ in 0..self.count()? {
                    let key = self.string()?;
                    let item = self.value(inner)?;
                    map.insert(key, item);
                }
                Value::from_object(map)
            }
            T_NAMESPACE => {
                let id = self.u64()?;
                let namespace = usize::try_from(id)
                    .ok()
                    .and_then(|i| self.namespaces.get(i));
                match namespace {
                    Some(namespace) => namespace.clone(),
                    None => return Err(corrupt(format!("namespace {id} does not exist"))),
                }
            }
            tag => return Err(corrupt(format!("value tag {tag}"))),
        })
    }

    fn values(&mut self, depth: usize) -> Result<Vec<Value>, JournalError> {
        let n = self.count()?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.value(depth)?);
        }
        Ok(items)
    }

    fn json(&mut self, depth: usize) -> Result<serde_json::Value, JournalError> {
        use serde_json::Value as Json;
        let tag = self.u8()?;
        if tag >= J_ARRAY && depth + 1 > self.max_depth {
            return Err(corrupt(format!(
                "JSON nested more than {} levels deep",
                self.max_depth
            )));
        }
        Ok(match tag {
            J_NULL => Json::Null,
            J_FALSE => Json::Bool(false),
            J_TRUE => Json::Bool(true),
            J_U64 => Json::from(self.u64()?),
            J_I64 => Json::from(self.i64()?),
            J_F64 => {
                let v = f64::from_bits(u64::from_le_bytes(self.array()?));
                Json::Number(
                    serde_json::Number::from_f64(v)
                        .ok_or_else(|| corrupt("a JSON number is not finite".into()))?,
                )
            }
            J_STRING => Json::String(self.string()?),
            J_ARRAY => {
                let n = self.count()?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.json(depth + 1)?);
                }
                Json::Array(items)
            }
            J_OBJECT => Json::Object(self.json_map(depth + 1)?),
            tag => return Err(corrupt(format!("JSON tag {tag}"))),
        })
    }

    fn json_map(
        &mut self,
        depth: usize,
    ) -> Result<serde_json::Map<String, serde_json::Value>, JournalError> {
        let mut map = serde_json::Map::new();
        for _ in 0..self.count()? {
            let key = self.string()?;
            let item = self.json(depth)?;
            map.insert(key, item);
        }
        Ok(map)
    }

    fn part(&mut self) -> Result<Part, JournalError> {
        let tag = self.u8()?;
        let s = self.string()?;
        Ok(match tag {
            0 => Part::Text(s),
            1 => Part::ImageUrl(s),
            2 => Part::AudioInput(s),
            3 => Part::File(s),
            tag => return Err(corrupt(format!("part tag {tag}"))),
        })
    }

    fn parts(&mut self) -> Result<Vec<Part>, JournalError> {
        (0..self.count()?).map(|_| self.part()).collect()
    }

    fn tool_calls(&mut self) -> Result<Vec<ToolCall>, JournalError> {
        (0..self.count()?)
            .map(|_| {
                let id = self.string()?;
                let name = self.string()?;
                let arguments = self.json(0)?;
                Ok(ToolCall::new(id, name, arguments))
            })
            .collect()
    }

    fn completion(&mut self) -> Result<Completion, JournalError> {
        let role = self.string()?;
        let content = self.parts()?;
        let tool_calls = self.tool_calls()?;
        let usage = match self.u8()? {
            0 => None,
            1 => Some(Usage {
                input_tokens: self.opt_u64()?,
                output_tokens: self.opt_u64()?,
                fields: self.json_map(1)?,
            }),
            tag => return Err(corrupt(format!("usage tag {tag}"))),
        };
        let finish_reason = match self.u8()? {
            0 => None,
            1 => Some(FinishReason::Stop),
            2 => Some(FinishReason::Length),
            3 => Some(FinishReason::ToolCalls),
            4 => Some(FinishReason::ContentFilter),
            5 => Some(FinishReason::Other(self.string()?)),
            tag => return Err(corrupt(format!("finish reason tag {tag}"))),
        };
        let model = self.opt_string()?;
        Ok(Completion {
            role,
            content,
            tool_calls,
            usage,
            finish_reason,
            model,
            raw: None,
        })
    }

    fn provider_error(&mut self) -> Result<ProviderError, JournalError> {
        let kind = self.u8()?;
        let Some(kind) = ProviderErrorKind::ALL.get(usize::from(kind)).copied() else {
            return Err(corrupt(format!("provider error kind {kind}")));
        };
        Ok(ProviderError::new(kind, self.string()?))
    }

    fn message(&mut self) -> Result<Message, JournalError> {
        let role = self.u8()?;
        let Some(role) = Role::ALL.get(usize::from(role)).copied() else {
            return Err(corrupt(format!("role {role}")));
        };
        let content = match self.u8()? {
            0 => Content::Text(self.string()?),
            1 => Content::Parts(self.parts()?),
            tag => return Err(corrupt(format!("content tag {tag}"))),
        };
        Ok(Message::new(role, content))
    }

    fn run_error(&mut self) -> Result<RunError, JournalError> {
        let kind = match self.u8()? {
            0 => RunErrorKind::UnknownStep,
            1 => RunErrorKind::BudgetExceeded,
            2 => RunErrorKind::StepBudgetExceeded,
            3 => RunErrorKind::Timeout,
            4 => RunErrorKind::InvalidOptions,
            5 => RunErrorKind::MissingInput,
            6 => RunErrorKind::Protocol,
            7 => RunErrorKind::Cancelled,
            8 => RunErrorKind::InputUnavailable,
            tag => return Err(corrupt(format!("run error kind {tag}"))),
        };
        let message = self.string()?;
        let step = self.opt_string()?;
        let span = match self.u8()? {
            0 => None,
            1 => Some(SourceSpan {
                start: self.u32()?,
                end: self.u32()?,
                line: self.u32()?,
                col: self.u32()?,
            }),
            tag => return Err(corrupt(format!("span tag {tag}"))),
        };
        Ok(RunError {
            kind,
            message,
            step,
            span,
        })
    }

    fn recorder(&mut self) -> Result<RecorderState, JournalError> {
        let seq = self.u64()?;
        let now = self.duration()?;
        let step_started = self.duration()?;
        let phase = match self.u8()? {
            0 => None,
            tag @ 1..=3 => {
                let phase = [Phase::Pre, Phase::Prompt, Phase::Post][usize::from(tag - 1)];
                Some((phase, self.duration()?))
            }
            tag => return Err(corrupt(format!("phase tag {tag}"))),
        };
        Ok(RecorderState {
            seq,
            now,
            step_started,
            phase,
            provider_started: self.duration()?,
            tool_started: self.duration()?,
            errors_seen: usize::try_from(self.u64()?)
                .map_err(|_| corrupt("error count overflows".into()))?,
            provider_calls: self.u64()?,
            input_tokens: self.u64()?,
            output_tokens: self.u64()?,
            finished: self.bool()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(value: &Value, namespaces: &Namespaces) -> Result<Vec<u8>, JournalError> {
        let mut w = Writer::new(256, Some(namespaces));
        w.value(value, "v", 0)?;
        Ok(w.buf)
    }

    fn decode(bytes: &[u8], table: &[Value]) -> Result<Value, JournalError> {
        let mut r = Reader::new(bytes, 256, table);
        let value = r.value(0)?;
        r.end()?;
        Ok(value)
    }

    /// Decoding gives a value that encodes to the same bytes, and prints the same.
    fn round_trip(value: Value) -> Value {
        let namespaces = Namespaces::default();
        let bytes = encode(&value, &namespaces).unwrap();
        let back = decode(&bytes, &namespaces.values()).unwrap();
        assert_eq!(encode(&back, &namespaces).unwrap(), bytes, "{value:?}");
        assert_eq!(format!("{back:?}"), format!("{value:?}"));
        back
    }

    #[test]
    fn scalars_keep_their_representation() {
        for number in [
            Number::U64(u64::MAX),
            Number::U64(1),
            Number::I64(1),
            Number::I64(i64::MIN),
            Number::F64(1.0),
            Number::F64(-0.0),
            Number::F64(f64::NAN),
            Number::F64(f64::INFINITY),
            Number::U128(u128::MAX),
            Number::I128(i128::MIN),
        ] {
            let back = round_trip(durable::from_number(number));
            match (durable::number(&back), number) {
                (Some(Number::F64(a)), Number::F64(b)) => assert_eq!(a.to_bits(), b.to_bits()),
                (got, want) => assert_eq!(got, Some(want)),
            }
        }
        assert_ne!(
            encode(&Value::from(1), &Namespaces::default()),
            encode(&Value::from(1.0), &Namespaces::default())
        );
        assert!(round_trip(Value::from_safe_string("<b>".into())).is_safe());
        assert!(!round_trip(Value::from("<b>")).is_safe());
        let bytes = round_trip(Value::from_bytes(vec![0, 255, 7]));
        assert_eq!(bytes.as_bytes(), Some(&[0u8, 255, 7][..]));
        assert!(durable::is_silent_undefined(&round_trip(
            durable::silent_undefined()
        )));
        let undefined = round_trip(Value::UNDEFINED);
        assert!(undefined.is_undefined() && !durable::is_silent_undefined(&undefined));
        round_trip(Value::from(()));
        round_trip(Value::from(true));
        round_trip(Value::from("é\u{0}\n"));
    }

    #[test]
    fn containers_keep_their_type_keys_and_order() {
        let map = Value::from_pairs(vec![
            (Value::from(2), Value::from("two")),
            (
                Value::from("a"),
                Value::from(Tuple::new(vec![Value::from(1)])),
            ),
            (Value::from(()), Value::from(vec![Value::from(1.5)])),
        ]);
        let back = round_trip(map);
        assert!(durable::is_value_map(&back));
        let keys: Vec<Value> = back.try_iter().unwrap().collect();
        assert_eq!(keys, [Value::from(2), Value::from("a"), Value::from(())]);
        assert!(back.get_item(&Value::from("a")).unwrap().is_tuple());
        let mut vars = Vars::new();
        vars.insert("x", Value::from(1));
        let snapshot = round_trip(Value::from_object(Snapshot(vars.clone())));
        assert!(snapshot.downcast_object_ref::<Snapshot>().is_some());
        let history = Value::from_object(History(
            [Value::from_object(Snapshot(vars))].into_iter().collect(),
        ));
        assert!(
            round_trip(history)
                .downcast_object_ref::<History>()
                .is_some()
        );
        let sorted = std::collections::BTreeMap::from([("b".to_string(), Value::from(1))]);
        let back = round_trip(Value::from_object(sorted));
        assert!(
            back.downcast_object_ref::<BTreeMap<String, Value>>()
                .is_some()
        );
    }

    #[test]
    fn a_namespace_is_written_once_and_read_back_as_one_mutable_object() {
        let namespace = durable::namespace_from_pairs([(Arc::from("n"), Value::from(1))]);
        let list = Value::from(vec![namespace.clone(), namespace.clone()]);
        let namespaces = Namespaces::default();
        let bytes = encode(&list, &namespaces).unwrap();
        assert_eq!(namespaces.values().len(), 1);
        // The table as `restore` reads it: fresh namespaces with the same content.
        let table = vec![durable::namespace_from_pairs([(
            Arc::from("n"),
            Value::from(1),
        )])];
        let back = decode(&bytes, &table).unwrap();
        let items: Vec<Value> = back.try_iter().unwrap().collect();
        assert_eq!(
            durable::namespace_identity(&items[0]),
            durable::namespace_identity(&table[0])
        );
        assert_eq!(
            durable::namespace_identity(&items[1]),
            durable::namespace_identity(&table[0])
        );
        assert!(matches!(decode(&bytes, &[]), Err(JournalError::Corrupt(_))));
        // Mutable: the engine's `{% set ns.n = … %}` works on it.
        let env = minijinja::Environment::new();
        let out = env
            .render_str(
                "{% set ns.n = 5 %}{{ ns.n }}",
                minijinja::context! { ns => items[0].clone() },
            )
            .unwrap();
        assert_eq!(out, "5");
        assert_eq!(items[1].get_attr("n").unwrap(), Value::from(5));
    }

    #[test]
    fn nesting_is_bounded_both_ways() {
        let mut value = Value::from(1);
        for _ in 0..256 {
            value = Value::from(vec![value]);
        }
        let namespaces = Namespaces::default();
        let bytes = encode(&value, &namespaces).unwrap();
        decode(&bytes, &[]).unwrap();
        let deeper = Value::from(vec![value]);
        assert!(matches!(
            encode(&deeper, &namespaces),
            Err(JournalError::Unencodable { .. })
        ));
        // Hand-made bytes past the limit: refused before recursing further.
        let mut hostile = [T_LIST, 1].repeat(100_000);
        hostile.push(T_NONE);
        assert!(matches!(
            decode(&hostile, &[]),
            Err(JournalError::Corrupt(_))
        ));
        // A length far past the input.
        assert!(matches!(
            decode(&[T_LIST, 0xff, 0xff, 0xff, 0xff, 0x0f], &[]),
            Err(JournalError::Corrupt(_))
        ));
    }

    #[test]
    fn every_provider_error_kind_and_role_reads_back_as_itself() {
        for kind in ProviderErrorKind::ALL {
            let mut w = Writer::new(256, None);
            w.provider_error(&ProviderError::new(kind, "m"));
            let mut r = Reader::new(&w.buf, 256, &[]);
            assert_eq!(r.provider_error().unwrap(), ProviderError::new(kind, "m"));
        }
        for role in Role::ALL {
            let message = Message::text(role, "t");
            let mut w = Writer::new(256, None);
            w.message(&message);
            let mut r = Reader::new(&w.buf, 256, &[]);
            assert_eq!(r.message().unwrap(), message);
        }
    }

    #[test]
    fn json_keeps_number_kinds_and_key_order() {
        let json = serde_json::json!({"z": u64::MAX, "a": -1, "m": 1.0, "l": [null, true, "s"]});
        let mut w = Writer::new(256, None);
        w.json(&json);
        let mut r = Reader::new(&w.buf, 256, &[]);
        let back = r.json(0).unwrap();
        r.end().unwrap();
        assert_eq!(back.to_string(), json.to_string());
    }
}
