//! The executor measured against the render floor, in one bench run.
//!
//! * `compile/*`: source to bundle, for a small agent and a generated 1,000-step agent.
//! * `load/*`: bundle decode plus program load (every template compiled).
//! * `run/<agent>/executor`: one whole run with the scripted provider (rewound each time).
//! * `run/<agent>/render_floor`: the same templates, rendered directly with minijinja in
//!   the order the run renders them, against a store holding the run's variables. This
//!   is the physical floor: the executor can only add overhead on top of it.
//!
//! * `agents/{inline,delegated}`: 20 rounds of two steps each, the second inlined in
//!   the loop or run as a child agent by `call_agent`: the difference over 20 is the
//!   overhead of one child run (`spec/agents.md`).
//!
//! Criterion prints each agent's executor and floor side by side; `benches/README.md`
//! records the numbers and the budgets.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use aplc_benches::{agent, agent_context, generated_agent};
use aplc_compiler::{Options, compile};
use aplc_vm::bundle::{Bundle, LinkedAgent, TemplateKind, decode, encode};
use aplc_vm::{Limits, Program, RunOptions, ScriptedProvider, Store, run_scripted, template_env};
use criterion::{Criterion, criterion_group, criterion_main};

fn bundle(source: &str) -> Bundle {
    compile(source, "bench.apl", &Options::default())
        .bundle
        .expect("the agent compiles")
}

fn bench_compile(c: &mut Criterion) {
    let small = agent("loop4").0;
    let large = generated_agent(1000);
    let mut group = c.benchmark_group("compile");
    group.bench_function("loop4", |b| {
        b.iter(|| compile(black_box(&small), "a.apl", &Options::default()))
    });
    group.sample_size(10);
    group.bench_function("generated_1000_steps", |b| {
        b.iter(|| compile(black_box(&large), "a.apl", &Options::default()))
    });
    group.finish();
}

fn bench_load(c: &mut Criterion) {
    let mut group = c.benchmark_group("load");
    for name in ["loop4", "agent8", "self_loop"] {
        let bytes = encode(&bundle(&agent(name).0)).expect("encodes");
        group.bench_function(name, |b| {
            b.iter(|| Program::from_bundle(decode(black_box(&bytes)).unwrap(), Limits::default()))
        });
    }
    group.finish();
}

/// The templates a run renders, in order: for each step it entered, pre, the role
/// sections and post.
fn render_sequence(bundle: &Bundle, trace: &[String]) -> Vec<usize> {
    let mut order = Vec::new();
    for step in trace {
        let Some(id) = bundle.steps.iter().position(|s| &s.name == step) else {
            continue;
        };
        let of_kind = |want: fn(TemplateKind) -> bool| {
            bundle
                .templates
                .iter()
                .enumerate()
                .filter(move |(_, t)| t.step.index() == id && want(t.kind))
                .map(|(i, _)| i)
        };
        order.extend(of_kind(|k| k == TemplateKind::Pre));
        order.extend(of_kind(|k| matches!(k, TemplateKind::Prompt(_))));
        order.extend(of_kind(|k| k == TemplateKind::Post));
    }
    order
}

fn bench_run(c: &mut Criterion) {
    for name in ["loop4", "agent8", "self_loop"] {
        let (source, mock) = agent(name);
        let bundle = bundle(&source);
        let program = Arc::new(Program::from_bundle(bundle.clone(), Limits::default()).unwrap());
        let script = ScriptedProvider::from_json(&mock).unwrap();
        let options = RunOptions::default().with_context_json(&agent_context(name));
        let run_once = || {
            let mut script = script.clone();
            script.rewind();
            let start = Instant::now();
            run_scripted(program.clone(), options.clone(), &mut script, || {
                start.elapsed()
            })
        };

        // One reference run gives the trace of steps and the variables to render with.
        let outcome = run_once();
        assert!(outcome.error.is_none(), "{name}: {:?}", outcome.error);
        let mut trace = vec![bundle.steps[0].name.clone()];
        for snap in outcome
            .history
            .iter()
            .take(outcome.history.len().saturating_sub(1))
        {
            let next = snap
                .get_attr("next_step")
                .ok()
                .and_then(|v| v.as_str().map(str::to_string));
            trace.push(next.unwrap_or_default());
        }
        let sequence = render_sequence(&bundle, &trace);
        let mut env = template_env(&Limits::default());
        for (i, t) in bundle.templates.iter().enumerate() {
            env.add_template_owned(i.to_string(), t.source.clone())
                .unwrap();
        }
        let names: Vec<String> = (0..bundle.templates.len()).map(|i| i.to_string()).collect();

        let mut group = c.benchmark_group(format!("run/{name}"));
        if name == "self_loop" {
            group.sample_size(20);
        }
        group.bench_function("executor", |b| b.iter(|| black_box(run_once())));
        group.bench_function("render_floor", |b| {
            b.iter(|| {
                let store = Store::new(outcome.vars.clone());
                let root = aplc_vm::minijinja::Value::from_dyn_object(store);
                for &t in &sequence {
                    let template = env.get_template(&names[t]).unwrap();
                    black_box(template.render(root.clone()).ok());
                }
            })
        });
        group.finish();
    }
}

/// Rounds of `agents/*`.
const ROUNDS: usize = 20;

/// Two steps per round, `work` inlined: `a` goes to `work`, which goes back to `a`.
const INLINE: &str = "# prompt: a\n## user\nRound {{ i | default(0) }}\n\n\
# post: a\n{{ set_context('i', (i | default(0)) + 1) }}{{ set_context('next_step', 'work') }}\n\n\
# prompt: work\n## user\nWork on {{ i }}\n\n\
# post: work\n{% if i < 20 %}{{ set_context('next_step', 'a') }}{% endif %}\n";

/// The same rounds with `work` a child agent that `a` delegates to.
const DELEGATED: &str = "# prompt: a\n## user\nRound {{ i | default(0) }}\n\n\
# post: a\n{{ set_context('i', (i | default(0)) + 1) }}\
{{ set_context('call_agent', {'agent': 'work', 'context': {'i': i}}) }}\
{% if i < 20 %}{{ set_context('next_step', 'a') }}{% endif %}\n";

const WORK: &str = "{# inputs: i #}\n# prompt: work\n## user\nWork on {{ i }}\n";

fn bench_agents(c: &mut Criterion) {
    let inline = Arc::new(Program::from_bundle(bundle(INLINE), Limits::default()).unwrap());
    let mut delegated = bundle(DELEGATED);
    delegated.agents = vec![LinkedAgent {
        name: "work".into(),
        bundle: bundle(WORK),
    }];
    let delegated = Arc::new(Program::from_bundle(delegated, Limits::default()).unwrap());
    let answers = serde_json::to_string(&vec!["ok"; 2 * ROUNDS]).unwrap();
    let script = ScriptedProvider::from_json(&answers).unwrap();
    let mut group = c.benchmark_group("agents");
    for (name, program) in [("inline", inline), ("delegated", delegated)] {
        let run_once = || {
            let mut script = script.clone();
            script.rewind();
            let start = Instant::now();
            run_scripted(program.clone(), RunOptions::default(), &mut script, || {
                start.elapsed()
            })
        };
        let outcome = run_once();
        assert!(outcome.error.is_none(), "{name}: {:?}", outcome.error);
        assert_eq!(outcome.steps, 2 * ROUNDS as u64, "{name}");
        group.bench_function(name, |b| b.iter(|| black_box(run_once())));
    }
    group.finish();
}

criterion_group!(benches, bench_compile, bench_load, bench_run, bench_agents);
criterion_main!(benches);
