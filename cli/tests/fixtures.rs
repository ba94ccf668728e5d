//! The language test suite: every file under `fixtures/` is compiled (and run), and the
//! result is snapshot-tested with insta.
//!
//! * `fixtures/check/*.apl`: diagnostics as plain text, and for valid files the bundle
//!   listing. Valid files must compile; `err_*` files must not.
//! * `fixtures/run/*.apl`: compiled, run with the scripted provider (`<name>.mock.json`)
//!   and a simulated clock; the snapshot is the outcome and the final context with the
//!   time fields redacted. Each run is repeated from the encoded and decoded bundle and
//!   must give the same result.
//!
//! Accept intended changes with `cargo insta test --accept` and read the diff.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aplc_compiler::{Options, compile, render};
use aplc_vm::bundle::{self, listing};
use aplc_vm::{Limits, Program, RunOptions, RunOutcome, ScriptedProvider, run_scripted};
use serde_json::Value as Json;

#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureOptions {
    #[serde(default)]
    relaxed: bool,
    max_runs: Option<u64>,
    timeout_ms: Option<u64>,
}

fn options_for(path: &Path) -> FixtureOptions {
    let p = path.with_extension("options.json");
    match std::fs::read_to_string(&p) {
        Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        Err(_) => FixtureOptions::default(),
    }
}

fn name_of(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn check_fixtures() {
    insta::glob!("../../fixtures", "check/*.apl", |path| {
        let source = std::fs::read_to_string(path).unwrap();
        let opts = options_for(path);
        let name = name_of(path);
        let c = compile(
            &source,
            &name,
            &Options {
                relaxed: opts.relaxed,
            },
        );
        let diagnostics = render(&c.diagnostics, &name, &source, false);
        let is_err = name.starts_with("err_");
        assert_eq!(
            c.has_errors(),
            is_err,
            "{name}: expected errors: {is_err}\n{diagnostics}"
        );
        let mut snap = String::new();
        snap.push_str(&diagnostics);
        if let Some(b) = &c.bundle {
            // The encoded bundle decodes to the same value.
            let decoded = bundle::decode(&bundle::encode(b)).expect("round trip");
            assert_eq!(&decoded, b);
            snap.push_str("---\n");
            snap.push_str(&listing(b));
        }
        insta::assert_snapshot!(snap);
    });
}

#[test]
fn run_fixtures() {
    insta::glob!("../../fixtures", "run/*.apl", |path| {
        let source = std::fs::read_to_string(path).unwrap();
        let opts = options_for(path);
        let name = name_of(path);
        let c = compile(
            &source,
            &name,
            &Options {
                relaxed: opts.relaxed,
            },
        );
        let bundle = c.bundle.unwrap_or_else(|| {
            panic!(
                "{name} does not compile:\n{}",
                render(&c.diagnostics, &name, &source, false)
            )
        });
        let mock = std::fs::read_to_string(path.with_extension("mock.json")).unwrap();
        let script = ScriptedProvider::from_json(&mock).unwrap();
        let mut run_options = RunOptions {
            max_runs: opts.max_runs,
            ..RunOptions::default()
        };
        if let Some(ms) = opts.timeout_ms {
            run_options.timeout = Duration::from_millis(ms);
        }
        if let Ok(text) = std::fs::read_to_string(path.with_extension("context.json")) {
            let Json::Object(map) = serde_json::from_str(&text).unwrap() else {
                panic!("{name}: context must be an object")
            };
            run_options = run_options.with_context_json(&map);
        }

        let from_source = run(
            Program::from_bundle(bundle.clone(), Limits::default()).unwrap(),
            &run_options,
            &script,
        );
        let bytes = bundle::encode(&bundle);
        let from_bundle = run(Program::load(&bytes).unwrap(), &run_options, &script);
        let snap = describe(&from_source);
        assert_eq!(
            snap,
            describe(&from_bundle),
            "{name}: bundle and source runs differ"
        );
        insta::assert_snapshot!(snap);
    });
}

/// Runs with a simulated clock that advances 1 ms every time it is read.
fn run(program: Program, options: &RunOptions, script: &ScriptedProvider) -> RunOutcome {
    let start = Instant::now();
    let mut ticks = 0u64;
    let clock = move || {
        ticks += 1;
        start + Duration::from_millis(ticks)
    };
    let mut script = script.clone();
    script.rewind();
    run_scripted(Arc::new(program), options.clone(), &mut script, clock)
}

fn describe(outcome: &RunOutcome) -> String {
    let exit = match (&outcome.error, outcome.last_step_errors.is_empty()) {
        (Some(_), _) => 1,
        (None, false) => 3,
        (None, true) => 0,
    };
    let mut out = format!("exit: {exit}\n");
    if let Some(e) = &outcome.error {
        out.push_str(&format!("error: {:?}: {}\n", e.kind, e.message));
        if let Some(step) = &e.step {
            out.push_str(&format!("  in step `{step}`\n"));
        }
    }
    for e in &outcome.last_step_errors {
        out.push_str(&format!("last step error: {e}\n"));
    }
    let mut context = outcome.context_json();
    redact(&mut context);
    out.push_str(&serde_json::to_string_pretty(&context).unwrap());
    out.push('\n');
    out
}

/// Replaces the time fields, wherever they are, so snapshots do not depend on timing.
fn redact(value: &mut Json) {
    match value {
        Json::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "time_elapsed" || k == "time_elapsed_global" {
                    *v = Json::String("[ms]".into());
                } else {
                    redact(v);
                }
            }
        }
        Json::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}
