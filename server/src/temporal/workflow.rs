//! `apl.Run`: one run of an agent as a Temporal workflow.
//!
//! The workflow drives the run's [`Machine`] itself, through its one door
//! ([`Machine::apply`], the journal's alphabet): it polls it with the workflow's time
//! (Temporal's, the same on every replay) and performs each action it asks for as an
//! activity, handing the activity's result back as the machine's input. A replay
//! re-runs this code against the recorded results, and the deterministic machine takes
//! the same inputs in the same order: the run's state is rebuilt, and nothing is asked
//! again.
//!
//! The bundle is pinned: the first thing a run does is `apl.resolve` (a local activity,
//! recorded in history), which names the agent's bundle by content hash; every replay
//! and every other worker runs that bundle, or fails its workflow task (Temporal retries
//! it, on a worker that has the bundle), never another version.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aplc_runtime::INTERRUPTED_TOOL;
use aplc_runtime::human::{Pending, reply_from_json, timed_out};
use aplc_vm::human::{HumanAnswer, Reply};
use aplc_vm::journal::{Input, JournalError};
use aplc_vm::{
    Action, Expecting, Machine, ProviderError, ProviderErrorKind, RunOptions, RunOutcome,
};
use serde_json::{Value as Json, json};
use temporalio_common::RetryPolicy;
use temporalio_macros::{workflow, workflow_methods};
use temporalio_sdk::workflows::select;
use temporalio_sdk::{
    ActivityOptions, CancellableFuture, ContinueAsNewOptions, LocalActivityOptions,
    SyncWorkflowContext, TimerResult, WorkflowContext, WorkflowContextView, WorkflowResult,
    WorkflowTermination,
};

use super::activities::{AplActivities, HEARTBEAT_EVERY};
use super::continuation::{Progress, RETRY_AFTER_EVENTS, Schedule, key_of, own_key};
use super::payload::{ProviderCall, Resume, RunInput, ToolCallInput};
use super::{Host, host};
use crate::agents::Agent;

/// How long without a heartbeat before an activity counts as lost with its worker, and
/// the workflow sends its call again.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times a provider call lost with its worker is sent again before the run
/// takes it as a transport error.
const MAX_SENDS: u32 = 10;

/// How many times Temporal runs an idempotent tool's call before its failure stands.
const IDEMPOTENT_TOOL_ATTEMPTS: u32 = 3;

/// The largest final context with `context_history` in the result, in bytes: Temporal
/// warns at 512 KiB per payload, and fails over 2 MiB.
const MAX_RESULT_WITH_HISTORY: usize = 256 * 1024;

/// One run, and what its queries see of it.
#[workflow]
#[derive(Default)]
pub struct AplRun {
    /// What `apl.status` answers.
    status: Status,
    /// The requests for a person the run waits on, not yet answered (`apl.pending`),
    /// each with the workflow time it was asked at.
    pending: Vec<Pending>,
    /// Answers `apl.input` took, not yet handed to the machine.
    answers: Vec<HumanAnswer>,
    /// The requests of this workflow run answered by their timeout, with their
    /// `timeout_ms`: `apl.input` refuses them, saying so.
    timed_out: Vec<(String, u64)>,
}

/// What `apl.status` answers: how far the run is.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Status {
    status: &'static str,
    agent: String,
    bundle_hash: Option<String>,
    steps: u64,
    provider_calls: u64,
    tool_calls: u64,
    errors: Json,
}

#[workflow_methods]
impl AplRun {
    /// Runs the agent of `input` to its end; the result is `{status, context, error?}`.
    #[run(name = "apl.Run")]
    pub async fn run(ctx: &mut WorkflowContext<Self>, input: Json) -> WorkflowResult<Json> {
        let input: RunInput = match serde_json::from_value(input) {
            Ok(input) => input,
            Err(e) => {
                return Ok(refused(
                    ctx,
                    format!("the input must be {{\"agent\", \"context\", \"options\"}}: {e}"),
                ));
            }
        };
        ctx.state_mut(|s| {
            s.status.status = "starting";
            s.status.agent.clone_from(&input.agent);
        });
        let started = match input.resume.clone() {
            None => start(ctx, &input).await?,
            Some(resume) => match own_key(&resume.key, ctx.workflow_id()) {
                Ok(()) => Ok(go_on(ctx, &input, resume).await),
                Err(error) => Err(error),
            },
        };
        let (host, machine, run) = match started {
            Ok(started) => started,
            Err(error) => return Ok(refused(ctx, error)),
        };
        let outcome = drive(ctx, &host, machine, run, &input).await?;
        let result = result_of(&outcome);
        ctx.state_mut(|s| {
            s.status.status = result["status"].as_str().map_or("failed", |status| {
                if status == "completed" {
                    "completed"
                } else {
                    "failed"
                }
            });
            s.status.steps = outcome.steps;
        });
        Ok(result)
    }

    /// How far the run is: `{status, agent, bundle_hash, steps, provider_calls,
    /// tool_calls, errors}`.
    #[query(name = "apl.status")]
    pub fn status(&self, _ctx: &WorkflowContextView) -> Json {
        serde_json::to_value(&self.status).unwrap_or(Json::Null)
    }

    /// The requests for a person the run waits on (spec/human.md §2), without an answer.
    #[query(name = "apl.pending")]
    pub fn pending(&self, _ctx: &WorkflowContextView) -> Json {
        Json::Array(
            self.unanswered()
                .map(|p| crate::api::shown(p.to_json()))
                .collect(),
        )
    }

    /// Refuses an answer that names no pending request (none, one answered, one whose
    /// timeout passed) or does not fit it (its kind, its schema): the update is
    /// rejected, and nothing enters history.
    #[update_validator(input)]
    fn check_input(
        &self,
        _ctx: &WorkflowContextView,
        body: &Json,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let (id, reply) = read_answer(body)?;
        if let Some((_, timeout_ms)) = self.timed_out.iter().find(|(expired, _)| *expired == id) {
            return Err(
                format!("request `{id}` timed out: no answer within {timeout_ms} ms").into(),
            );
        }
        let pending = self
            .unanswered()
            .find(|p| p.request.id == id)
            .ok_or_else(|| format!("the run waits for no request `{id}` (or it is answered)"))?;
        pending.request.check(&reply)?;
        Ok(())
    }

    /// A person's answer to a pending request, the body of `POST /v1/runs/{id}/input`:
    /// `{"id", "value"}` or `{"id", "approve", "reason"?}`. Answers
    /// `{"accepted": true, "pending": [ids still without an answer]}`.
    #[update(name = "apl.input")]
    pub fn input(&mut self, ctx: &mut SyncWorkflowContext<Self>, body: Json) -> Json {
        let Ok((id, reply)) = read_answer(&body) else {
            return json!({"accepted": false});
        };
        self.answers.push(HumanAnswer {
            id,
            reply,
            by: "temporal".into(),
            answered_at_ms: epoch_ms(ctx.workflow_time()),
        });
        let pending: Vec<&str> = self.unanswered().map(|p| p.request.id.as_str()).collect();
        json!({"accepted": true, "pending": pending})
    }
}

impl AplRun {
    /// The pending requests without an answer, here or queued for the machine.
    fn unanswered(&self) -> impl Iterator<Item = &Pending> {
        self.pending
            .iter()
            .filter(|p| !self.answers.iter().any(|a| a.id == p.request.id))
    }

    /// When the first timeout among the unanswered requests passes (ms since the epoch,
    /// workflow time), if any has one.
    fn next_expiry(&self) -> Option<i64> {
        self.unanswered().filter_map(Pending::expires_at_ms).min()
    }
}

/// A new run: pins its bundle (`apl.resolve`) and makes its machine; `Err` when the run
/// cannot start (the workflow's result then says why).
async fn start(
    ctx: &mut WorkflowContext<AplRun>,
    input: &RunInput,
) -> Result<Result<Started, String>, WorkflowTermination> {
    let resolved = ctx
        .execute_local_activity(AplActivities::resolve, input.clone(), resolve_options())
        .await?;
    let Some(hash) = resolved.bundle_hash else {
        let error = resolved
            .error
            .unwrap_or_else(|| "the agent cannot run".into());
        return Ok(Err(error));
    };
    let (host, agent) = pinned_or_fail(ctx, &input.agent, &hash).await;
    running(ctx, &hash);
    let machine = Machine::new(agent.program.clone(), run_options(&host, &agent, input));
    let run = Continuation {
        key: key_of(ctx.workflow_id(), ctx.run_id()),
        checkpoints: 0,
        bundle_hash: hash,
        agent,
        history_start: 0,
        schedule: Schedule::new(0, input.options.checkpoint_every),
        elapsed: Duration::ZERO,
    };
    Ok(Ok((host, machine, run)))
}

/// A run that continued as new: its machine again, from its checkpoints in the worker's
/// store. A worker that lacks the bundle or cannot read the checkpoints fails the
/// workflow task (Temporal retries it), as for a bundle mismatch.
async fn go_on(ctx: &mut WorkflowContext<AplRun>, input: &RunInput, resume: Resume) -> Started {
    let (host, agent) = pinned_or_fail(ctx, &input.agent, &resume.bundle_hash).await;
    let restored = host
        .checkpoints
        .read(&resume.key, resume.checkpoints)
        .and_then(|stored| {
            let segments: Vec<(u64, &[u8])> = (stored.segments.iter())
                .map(|(start, bytes)| (*start, bytes.as_slice()))
                .collect();
            let options = run_options(&host, &agent, input);
            Machine::restore(agent.program.clone(), options, &segments, &stored.state).map_err(
                |e| {
                    format!(
                        "run `{}`: checkpoint {}: {e}",
                        resume.key, resume.checkpoints
                    )
                },
            )
        });
    let machine = match restored {
        Ok(machine) => machine,
        Err(message) => fail_task(ctx, message).await,
    };
    running(ctx, &resume.bundle_hash);
    ctx.state_mut(|s| {
        s.status.provider_calls = resume.provider_calls;
        s.status.tool_calls = resume.tool_calls;
        s.status.steps = machine.steps();
    });
    let run = Continuation {
        key: resume.key,
        checkpoints: resume.checkpoints,
        bundle_hash: resume.bundle_hash,
        agent,
        history_start: machine.history_len(),
        schedule: Schedule::new(machine.steps(), input.options.checkpoint_every),
        elapsed: Duration::from_millis(resume.elapsed_ms),
    };
    (host, machine, run)
}

/// A run under way: its host, its machine, where it stands towards continue-as-new.
type Started = (Arc<Host>, Machine, Continuation);

/// `apl.status` says the run is running, on bundle `hash`.
fn running(ctx: &WorkflowContext<AplRun>, hash: &str) {
    ctx.state_mut(|s| {
        s.status.status = "running";
        s.status.bundle_hash = Some(hash.to_owned());
    });
}

/// This worker's host and agent `name` of bundle `hash`; without them, the workflow task
/// fails (aplc's fault, not the run's), and Temporal retries it until a worker that has
/// the bundle takes it.
async fn pinned_or_fail(
    ctx: &WorkflowContext<AplRun>,
    name: &str,
    hash: &str,
) -> (Arc<Host>, Arc<Agent>) {
    match pinned(name, hash) {
        Ok(found) => found,
        Err(message) => fail_task(ctx, message).await,
    }
}

/// Fails the workflow task with `message` (Temporal retries it) and never returns.
async fn fail_task<T>(ctx: &WorkflowContext<AplRun>, message: String) -> T {
    tracing::warn!("{message}");
    ctx.force_task_fail(std::io::Error::other(message));
    // A failed workflow task is not polled again: this workflow code ends here.
    std::future::pending::<T>().await
}

/// Where a workflow run stands towards its continue-as-new (spec/temporal.md §6).
struct Continuation {
    /// The run's key in the store.
    key: String,
    /// Checkpoints of it stored before this workflow run.
    checkpoints: u64,
    bundle_hash: String,
    agent: Arc<Agent>,
    /// The first `context_history` entry the stored checkpoints lack.
    history_start: u64,
    /// When it tries to continue as new.
    schedule: Schedule,
    /// The run's clock when this workflow run began.
    elapsed: Duration,
}

impl Continuation {
    /// Whether the run should try to continue as new now ([`Schedule::due`]).
    fn due(&self, ctx: &WorkflowContext<AplRun>, machine: &Machine) -> bool {
        self.schedule.due(progress(ctx, machine))
    }
}

/// How far the run is, for its [`Schedule`].
fn progress(ctx: &WorkflowContext<AplRun>, machine: &Machine) -> Progress {
    Progress {
        steps: machine.steps(),
        events: ctx.history_length(),
        suggested: ctx.continue_as_new_suggested(),
    }
}

/// Checkpoints the run into the worker's store and continues as new with a reference to
/// it. `Ok(())` when it cannot now: the machine is not at rest (a child run is going on:
/// it tries again after its next input), or its checkpoint is refused (a variable holds
/// a value with no durable form: it warns, once, and tries again after another
/// threshold's worth of steps or events, [`Schedule::refused`]). `Err` when the store
/// cannot take the checkpoint.
fn continue_as_new(
    ctx: &WorkflowContext<AplRun>,
    host: &Host,
    machine: &Machine,
    run: &mut Continuation,
    input: &RunInput,
    at: Duration,
) -> Result<Result<(), String>, WorkflowTermination> {
    let checkpoint = match machine.checkpoint(run.history_start) {
        Ok(checkpoint) => checkpoint,
        Err(JournalError::NotAtRest(_)) => return Ok(Ok(())),
        Err(refused) => {
            let first = run.schedule.refused(progress(ctx, machine));
            // Replays decide the same, and need not say it again.
            if first && !ctx.is_replaying() {
                let events = format!("{RETRY_AFTER_EVENTS} history events");
                let again = match input.options.checkpoint_every {
                    Some(steps) => format!("{steps} steps or {events}"),
                    None => events,
                };
                tracing::warn!(
                    workflow_id = ctx.workflow_id(),
                    "the run cannot continue as new yet: {refused}; it tries again after \
                     another {again}"
                );
            }
            return Ok(Ok(()));
        }
    };
    let steps = machine.steps();
    if let Err(message) = host
        .checkpoints
        .write(&run.key, &run.agent, steps, checkpoint)
    {
        return Ok(Err(message));
    }
    let status = ctx.state(|s| s.status.clone());
    let next = RunInput {
        agent: input.agent.clone(),
        context: serde_json::Map::new(),
        options: input.options.clone(),
        resume: Some(Resume {
            key: run.key.clone(),
            checkpoints: run.checkpoints + 1,
            bundle_hash: run.bundle_hash.clone(),
            elapsed_ms: u64::try_from(at.as_millis()).unwrap_or(u64::MAX),
            provider_calls: status.provider_calls,
            tool_calls: status.tool_calls,
        }),
    };
    let next = serde_json::to_value(next).unwrap_or(Json::Null);
    ctx.continue_as_new(next, ContinueAsNewOptions::default())?;
    Ok(Ok(()))
}

/// The request id and the reply of an answer's body (the rules of
/// `POST /v1/runs/{id}/input`).
fn read_answer(body: &Json) -> Result<(String, Reply), String> {
    let Json::Object(map) = body else {
        return Err(
            "an answer is a JSON object: {\"id\", \"value\"} or {\"id\", \"approve\"}".into(),
        );
    };
    let id = match map.get("id") {
        Some(Json::String(id)) if !id.is_empty() => id.clone(),
        _ => return Err("an answer needs `id`: the request's id".into()),
    };
    let mut reply = map.clone();
    reply.remove("id");
    let reply = reply_from_json(&Json::Object(reply))?;
    Ok((id, reply))
}

/// The run's clock: workflow time since the run started, less the time it waited for
/// people (its clock stands still meanwhile, spec/human.md §3).
/// After a continue-as-new, it goes on from the clock of the checkpoint (`elapsed`).
struct Clock {
    start: SystemTime,
    elapsed: Duration,
    waited: Duration,
}

impl Clock {
    fn at(&self, ctx: &WorkflowContext<AplRun>) -> Duration {
        let since = now(ctx).duration_since(self.start).unwrap_or_default();
        (self.elapsed + since).saturating_sub(self.waited)
    }
}

/// Drives `machine` to its end, every call an activity; its outcome.
async fn drive(
    ctx: &mut WorkflowContext<AplRun>,
    host: &Host,
    mut machine: Machine,
    mut run: Continuation,
    input: &RunInput,
) -> Result<RunOutcome, WorkflowTermination> {
    let mut clock = Clock {
        start: now(ctx),
        elapsed: run.elapsed,
        waited: Duration::ZERO,
    };
    loop {
        if run.due(ctx, &machine) {
            let at = clock.at(ctx);
            if let Err(message) = continue_as_new(ctx, host, &machine, &mut run, input, at)? {
                fail_task(ctx, message).await
            }
        }
        let action = machine.apply(Input::Poll { at: clock.at(ctx) });
        match action {
            Action::Continue => continue,
            Action::Done => break,
            Action::AwaitInput => {
                let paused = clock.at(ctx);
                wait_for_people(ctx, &mut machine, paused).await?;
                clock.waited += clock.at(ctx).saturating_sub(paused);
            }
            Action::CallProvider(request) => {
                let remaining = machine.deadline().saturating_sub(clock.at(ctx));
                let call = ProviderCall::of(&request, remaining);
                let input = match provider_call(ctx, call).await {
                    Some(result) => Input::Provider {
                        at: clock.at(ctx),
                        result,
                    },
                    None => Input::Timeout {
                        at: clock.at(ctx).max(machine.deadline()),
                    },
                };
                // An answer: the machine goes on at the next poll.
                let _ = machine.apply(input);
                ctx.state_mut(|s| s.status.provider_calls += 1);
            }
            Action::CallTool(invocation) => {
                let remaining = machine.deadline().saturating_sub(clock.at(ctx));
                let idempotent = host
                    .equipment
                    .toolbox
                    .registry()
                    .get(&invocation.name)
                    .is_some_and(|spec| spec.idempotency().is_some());
                let call = ToolCallInput::of(&invocation, remaining);
                let input = match tool_call(ctx, call, idempotent).await {
                    Some(result) => Input::Tool {
                        at: clock.at(ctx),
                        result,
                    },
                    None => Input::Timeout {
                        at: clock.at(ctx).max(machine.deadline()),
                    },
                };
                let _ = machine.apply(input);
                ctx.state_mut(|s| s.status.tool_calls += 1);
            }
        }
        let steps = machine.steps();
        let errors = machine.vars().get("errors").map_or(Json::Null, |v| {
            serde_json::to_value(v).unwrap_or(Json::Null)
        });
        ctx.state_mut(|s| {
            s.status.steps = steps;
            s.status.errors = errors;
        });
    }
    Ok(machine.into_outcome())
}

/// Waits until every request the machine waits on has its answer: a person's
/// (`apl.input`), or its timeout's once `timeout_ms` of workflow time passed since it was
/// asked (a Temporal timer, so replays and other workers see the same). Each answer is
/// handed to the machine at `paused`, the time the run began to wait.
///
/// A run never continues as new while it waits (it does only at the top of its loop),
/// so when a request was asked, workflow time recorded in this workflow run's history,
/// is the same on every replay.
async fn wait_for_people(
    ctx: &mut WorkflowContext<AplRun>,
    machine: &mut Machine,
    paused: Duration,
) -> Result<(), WorkflowTermination> {
    let requested_at_ms = epoch_ms(ctx.workflow_time());
    let requests: Vec<Pending> = (machine.pending_requests().into_iter())
        .map(|request| Pending {
            request: request.clone(),
            requested_at_ms,
        })
        .collect();
    ctx.state_mut(|s| {
        s.status.status = "waiting";
        s.pending = requests;
    });
    while machine.expecting() == Expecting::Answer {
        let expiry = ctx.state(AplRun::next_expiry);
        let mut expired_at = None;
        match expiry {
            None => ctx.wait_condition(|s| !s.answers.is_empty()).await?,
            Some(at) => {
                let left = at.saturating_sub(epoch_ms(ctx.workflow_time()));
                if left > 0 {
                    let wait = Duration::from_millis(u64::try_from(left).unwrap_or(u64::MAX));
                    let mut timer = std::pin::pin!(ctx.timer(wait));
                    select! {
                        answered = ctx.wait_condition(|s| !s.answers.is_empty()) => {
                            // Cancelled, so a wait answered in time leaves no timer behind.
                            timer.cancel();
                            answered?;
                        }
                        fired = timer.as_mut() => {
                            // Not when cancelled with the workflow: the wait's condition
                            // says so at the next turn.
                            if matches!(fired, TimerResult::Fired) {
                                expired_at = Some(at);
                            }
                        }
                    }
                } else {
                    expired_at = Some(at);
                }
            }
        }
        // Answers first: one taken before the timer fired (in the same workflow task
        // too) wins over the timeout.
        let answers = ctx.state_mut(|s| std::mem::take(&mut s.answers));
        for answer in answers {
            take_answer(ctx, machine, paused, answer);
        }
        if let Some(at) = expired_at {
            let now = epoch_ms(ctx.workflow_time()).max(at);
            let expired: Vec<Pending> = ctx.state(|s| {
                s.unanswered()
                    .filter(|p| p.expires_at_ms().is_some_and(|expiry| expiry <= at))
                    .cloned()
                    .collect()
            });
            for pending in expired {
                let request = pending.request;
                take_answer(ctx, machine, paused, timed_out(&request.id, now));
                let timeout_ms = request.timeout_ms.unwrap_or_default();
                ctx.state_mut(|s| s.timed_out.push((request.id, timeout_ms)));
            }
        }
    }
    ctx.state_mut(|s| {
        s.status.status = "running";
        s.pending.clear();
    });
    Ok(())
}

/// Hands `answer` to the machine at `paused`; the request is pending no more.
fn take_answer(
    ctx: &WorkflowContext<AplRun>,
    machine: &mut Machine,
    paused: Duration,
    answer: HumanAnswer,
) {
    let id = answer.id.clone();
    // Checked by the update's validator; a second answer to one request (two updates in
    // one task) is dropped, as the store keeps the first.
    if machine.check_answer(&answer).is_ok() {
        let _ = machine.apply(Input::Answer { at: paused, answer });
    }
    ctx.state_mut(|s| s.pending.retain(|p| p.request.id != id));
}

/// Performs a provider call: its answer, or `None` when the run's deadline passed. A call
/// lost with its worker (no heartbeat, or it timed out) is sent again, as a durable
/// resume sends an unjournaled call again; after [`MAX_SENDS`], it fails the step.
async fn provider_call(
    ctx: &WorkflowContext<AplRun>,
    call: ProviderCall,
) -> Option<Result<aplc_vm::Completion, ProviderError>> {
    let mut last = String::new();
    for _ in 0..MAX_SENDS {
        let options = activity_options(call.remaining_ms, 1);
        match ctx
            .execute_activity(AplActivities::provider_call, call.clone(), options)
            .await
        {
            Ok(answer) => return answer,
            Err(e) => last = e.to_string(),
        }
    }
    Some(Err(ProviderError::new(
        ProviderErrorKind::Transport,
        format!("the call was lost {MAX_SENDS} times: {last}"),
    )))
}

/// Performs a tool call: its result, or `None` when the run's deadline passed. A call
/// lost with its worker is retried by Temporal only for an idempotent tool; otherwise
/// it resolves as a failed call, as a durable resume resolves one in flight at a crash.
async fn tool_call(
    ctx: &WorkflowContext<AplRun>,
    call: ToolCallInput,
    idempotent: bool,
) -> Option<Result<Json, String>> {
    let attempts = if idempotent {
        IDEMPOTENT_TOOL_ATTEMPTS
    } else {
        1
    };
    let options = activity_options(call.remaining_ms, attempts);
    match ctx
        .execute_activity(AplActivities::tool_call, call, options)
        .await
    {
        Ok(answer) => answer,
        Err(_) if !idempotent => Some(Err(INTERRUPTED_TOOL.to_string())),
        Err(e) => Some(Err(format!("the tool call failed: {e}"))),
    }
}

/// The options of an activity with `remaining_ms` of run time left, run at most
/// `attempts` times by Temporal.
fn activity_options(remaining_ms: u64, attempts: u32) -> ActivityOptions {
    // A little past the run's deadline: the activity itself stops at the deadline and
    // says so; Temporal's timeout is only for a worker that never answers.
    let close = Duration::from_millis(remaining_ms)
        .saturating_add(Duration::from_secs(30))
        .min(Duration::from_secs(24 * 3600));
    ActivityOptions::with_start_to_close_timeout(close)
        .heartbeat_timeout(HEARTBEAT_TIMEOUT.max(HEARTBEAT_EVERY * 3))
        .retry_policy(RetryPolicy::builder().maximum_attempts(attempts).build())
        .build()
}

/// The options of `apl.resolve`: quick, retried a few times.
fn resolve_options() -> LocalActivityOptions {
    LocalActivityOptions::builder()
        .start_to_close_timeout(Duration::from_secs(30))
        .retry_policy(RetryPolicy::builder().maximum_attempts(3).build())
        .build()
}

/// The workflow's time now.
fn now(ctx: &WorkflowContext<AplRun>) -> SystemTime {
    ctx.workflow_time().unwrap_or(SystemTime::UNIX_EPOCH)
}

/// A workflow time in ms since the Unix epoch (0 without one), as answers and requests
/// keep their times.
fn epoch_ms(time: Option<SystemTime>) -> i64 {
    time.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// This worker's host and its agent whose bundle is `hash`, or why it has none.
fn pinned(name: &str, hash: &str) -> Result<(Arc<Host>, Arc<Agent>), String> {
    let host = host().ok_or("the worker has not started")?;
    let agent = host
        .agents
        .get(name)
        .filter(|agent| agent.hash == hash)
        .ok_or_else(|| {
            format!(
                "this worker lacks bundle {hash} of agent `{name}` (the run is pinned to it): \
                 another worker that has it will take the run"
            )
        })?;
    Ok((host, agent))
}

/// The run's options: `input`'s limits and context, the worker's tools and agents.
fn run_options(host: &Host, agent: &Agent, input: &RunInput) -> RunOptions {
    let options = &input.options;
    RunOptions {
        timeout: Duration::from_millis(
            options.timeout_ms.unwrap_or(crate::api::DEFAULT_TIMEOUT_MS),
        ),
        max_steps: options.max_steps.unwrap_or(aplc_vm::DEFAULT_MAX_STEPS),
        tools: host.equipment.toolbox.registry(),
        agents: crate::api::served_agents_of(&host.agents, &host.equipment, agent),
        ..RunOptions::default()
    }
    .with_context_json(&input.context)
}

/// The workflow's result for a run that could not start: `status: failed` (and so its
/// `apl.status`).
fn refused(ctx: &WorkflowContext<AplRun>, error: String) -> Json {
    ctx.state_mut(|s| s.status.status = "failed");
    json!({"status": "failed", "context": {}, "error": error})
}

/// The workflow's result: `{status, context, error?}`. The context has
/// `context_history` unless that would make the payload too large (then
/// `context_history_omitted: true`).
fn result_of(outcome: &RunOutcome) -> Json {
    let mut context = outcome.context_json();
    let large =
        serde_json::to_vec(&context).map_or(true, |bytes| bytes.len() > MAX_RESULT_WITH_HISTORY);
    let mut result = serde_json::Map::new();
    if large {
        context = outcome.variables_json();
        result.insert("context_history_omitted".into(), Json::Bool(true));
    }
    let status = if outcome.error.is_some() {
        "failed"
    } else {
        "completed"
    };
    result.insert("status".into(), status.into());
    result.insert("context".into(), context);
    if let Some(error) = &outcome.error {
        result.insert("error".into(), error.message.clone().into());
    }
    Json::Object(result)
}
