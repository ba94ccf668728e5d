//! Compile, load and run benchmarks for the fixture agents.
//!
//! Each benchmark works in-process, so it measures the compiler and the executor, not
//! process start-up. Runs use the scripted provider, rewound before every iteration.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use aplc_compiler::{Options, compile};
use aplc_vm::bundle::{decode, encode};
use aplc_vm::{Limits, Program, RunOptions, ScriptedProvider, run_scripted};
use criterion::{Criterion, criterion_group, criterion_main};

const AGENTS: &[&str] = &["simple_one_step", "loop_by_runs", "spec_7_4_3_process_loop"];

fn source(name: &str) -> String {
    let path = aplc_benches::fixtures_dir().join(format!("run/{name}.apl"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn bench(c: &mut Criterion) {
    for name in AGENTS {
        let src = source(name);
        let bundle = compile(&src, name, &Options::default())
            .bundle
            .expect("fixture compiles");
        let bytes = encode(&bundle);
        let mock_path = aplc_benches::fixtures_dir().join(format!("run/{name}.mock.json"));
        let mock = std::fs::read_to_string(mock_path).expect("mock file");
        let script = ScriptedProvider::from_json(&mock).expect("valid mock");
        let program = Arc::new(Program::load(&bytes).expect("bundle loads"));

        c.bench_function(&format!("compile/{name}"), |b| {
            b.iter(|| compile(black_box(&src), name, &Options::default()))
        });
        c.bench_function(&format!("load/{name}"), |b| {
            b.iter(|| Program::from_bundle(decode(black_box(&bytes)).unwrap(), Limits::default()))
        });
        c.bench_function(&format!("run/{name}"), |b| {
            b.iter(|| {
                let mut script = script.clone();
                script.rewind();
                run_scripted(
                    program.clone(),
                    RunOptions::default(),
                    &mut script,
                    Instant::now,
                )
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
