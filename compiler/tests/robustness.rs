//! Property tests: the front end never panics, and whatever it accepts, the VM loads
//! and runs without panicking.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aplc_compiler::{Options, compile};
use aplc_vm::bundle::{decode, encode};
use aplc_vm::{Limits, Program, RunOptions, ScriptedProvider, run_scripted};
use proptest::prelude::*;

/// Lines that exercise every part of the grammar, mixed at random.
fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("# prompt: a".to_string()),
        Just("# pre: a".to_string()),
        Just("# post: a".to_string()),
        Just("# prompt: b".to_string()),
        Just("#PROMPT".to_string()),
        Just("# prompt: return".to_string()),
        Just("# promt: x".to_string()),
        Just("# prompt: {{ x }}".to_string()),
        Just("## system".to_string()),
        Just("## user:".to_string()),
        Just("## nope".to_string()),
        Just("```".to_string()),
        Just("~~~~".to_string()),
        Just("{{ set_context('next_step', 'a') }}".to_string()),
        Just("{{ set_context('next_step', 'b') }}".to_string()),
        Just("{% if runs < 2 %}{{ set_context('next_step', 'a') }}{% endif %}".to_string()),
        Just("{{ inc_context('n') }}{{ n }}".to_string()),
        Just("{% for x in [1, 2] %}{{ x }}{% endfor %}".to_string()),
        Just("{% if x %}".to_string()),
        Just("{% endif %}".to_string()),
        Just("{{ memory }}".to_string()),
        Just("{{ undefined_thing }}".to_string()),
        Just("{# comment".to_string()),
        Just("#}".to_string()),
        Just("set_context('k', 1)".to_string()),
        Just("if runs < 1".to_string()),
        Just("endif".to_string()),
        Just("@image_url https://example.com/a.png".to_string()),
        "[ -~]{0,20}",
        "\\PC{0,8}",
    ]
}

/// Template lines that are valid Jinja on their own.
fn body_line() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("{{ set_context('next_step', 'a') }}".to_string()),
        Just("{{ set_context('next_step', 'b') }}".to_string()),
        Just("{{ set_context('next_step', 'c') }}".to_string()),
        Just("{% if runs < 2 %}{{ set_context('next_step', 'a') }}{% endif %}".to_string()),
        Just("{{ inc_context('n') }}{{ n }}".to_string()),
        Just("{{ set_context('output_mode', 'json') }}".to_string()),
        Just("{% for x in [1, 2] %}{{ x }}{% endfor %}".to_string()),
        Just("{{ undefined_thing }}".to_string()),
        Just("{{ result_text.lower() | truncate(5) }}".to_string()),
        Just("@image_url https://example.com/a.png".to_string()),
        Just("## user".to_string()),
        Just("## system".to_string()),
        "[a-z ]{0,20}",
    ]
}

/// A step: optional pre, a prompt, optional post, each with random body lines.
fn step(name: &'static str) -> impl Strategy<Value = String> {
    let body = || prop::collection::vec(body_line(), 0..4);
    (prop::option::of(body()), body(), prop::option::of(body())).prop_map(
        move |(pre, prompt, post)| {
            let mut out = String::new();
            if let Some(pre) = pre {
                out += &format!("# pre: {name}\n{}\n", pre.join("\n"));
            }
            out += &format!("# prompt: {name}\n{}\n", prompt.join("\n"));
            if let Some(post) = post {
                out += &format!("# post: {name}\n{}\n", post.join("\n"));
            }
            out
        },
    )
}

/// Mostly well-formed programs of one to three steps, sometimes with noise lines inserted.
fn document() -> impl Strategy<Value = String> {
    let steps = prop_oneof![
        step("a").prop_map(|a| vec![a]),
        (step("a"), step("b")).prop_map(|(a, b)| vec![a, b]),
        (step("a"), step("b"), step("c")).prop_map(|(a, b, c)| vec![a, b, c]),
    ];
    (
        steps,
        prop::collection::vec((any::<prop::sample::Index>(), line()), 0..3),
    )
        .prop_map(|(steps, noise)| {
            let mut lines: Vec<String> = steps.concat().lines().map(str::to_string).collect();
            for (at, l) in noise {
                let i = at.index(lines.len() + 1);
                lines.insert(i, l);
            }
            lines.join("\n")
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn arbitrary_text_never_panics(source in "\\PC{0,300}", relaxed: bool) {
        let _ = compile(&source, "fuzz.apl", &Options { relaxed, ..Options::default() });
    }

    #[test]
    fn arbitrary_bytes_as_lossy_text_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let source = String::from_utf8_lossy(&bytes);
        let _ = compile(&source, "fuzz.apl", &Options::default());
    }

    #[test]
    fn accepted_programs_load_and_run(source in document(), relaxed: bool, responses in 0usize..4) {
        // As `aplc run` compiles: an unknown jump target reaches the VM.
        let c = compile(&source, "fuzz.apl", &Options::for_run(relaxed));
        prop_assert_eq!(c.bundle.is_some(), !c.has_errors());
        let Some(bundle) = c.bundle else { return Ok(()) };

        // The compiler's output always survives encoding and validation.
        let bytes = encode(&bundle).expect("compiler output encodes");
        let decoded = decode(&bytes).expect("compiler output decodes");
        prop_assert_eq!(&decoded, &bundle);
        let program = Program::from_bundle(decoded, Limits::default()).expect("compiler output loads");

        // And runs to an end: a bounded budget and a simulated clock stop any loop.
        let entries: Vec<serde_json::Value> =
            (0..responses).map(|i| serde_json::Value::String(format!("reply {i}"))).collect();
        let mut script = ScriptedProvider::from_entries(entries).unwrap();
        let options = RunOptions {
            max_runs: Some(5),
            timeout: Duration::from_millis(500),
            ..RunOptions::default()
        };
        let start = Instant::now();
        let mut ticks = 0u64;
        let outcome = run_scripted(Arc::new(program), options, &mut script, move || {
            ticks += 1;
            start + Duration::from_millis(ticks)
        });
        prop_assert!(outcome.steps > 0);
        let _ = outcome.context_json();
    }
}

/// Expressions at the depth limit, in every shape that makes the analysis recurse.
fn deepest_templates() -> Vec<String> {
    let n = aplc_vm::MAX_EXPRESSION_DEPTH;
    let half = n / 2;
    vec![
        format!("{{{{ 1{} }}}}", "+1".repeat(n)),
        format!("{{{{ {}x }}}}", "not ".repeat(n)),
        format!("{{{{ {}1 }}}}", "- ".repeat(n)),
        format!("{{{{ x{} }}}}", ".a".repeat(n)),
        format!("{{{{ x{} }}}}", "|string".repeat(n)),
        format!("{{{{ x{} }}}}", " is defined".repeat(n)),
        format!("{{{{ 1{} }}}}", " if x else 1".repeat(half)),
        format!("{{% if x{} %}}y{{% endif %}}", " and x".repeat(n - 1)),
        format!("{{{{ {}1{} }}}}", "x[".repeat(half), "]".repeat(half)),
        format!("{{{{ {}1{} }}}}", "(1+".repeat(half), ")".repeat(half)),
        format!("{{{{ {}1{} }}}}", "range(".repeat(half), ")".repeat(half)),
        format!(
            "{{{{ set_context('k', {}1{}) }}}}",
            "[".repeat(n - 2),
            "]".repeat(n - 2)
        ),
        format!(
            "{}{{{{ 1{} }}}}{}",
            "{% if x %}".repeat(140),
            "+1".repeat(n),
            "{% endif %}".repeat(140)
        ),
        format!(
            "{}{{{{ x }}}}{}",
            "{% for x in y %}".repeat(140),
            "{% endfor %}".repeat(140)
        ),
    ]
}

/// F2: the deepest expressions the compiler accepts go through the whole front end
/// (minijinja's parser, the analysis, the VM's template compilation) on a 2 MiB stack.
#[test]
fn the_deepest_accepted_expressions_compile_on_a_2_mib_stack() {
    let worker = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            for template in deepest_templates() {
                for relaxed in [false, true] {
                    let source = format!("{{# inputs: x, y #}}\n# prompt: a\n## user\n{template}\n# post: a\n{template}\n");
                    let c = compile(&source, "deep.apl", &Options { relaxed, ..Options::default() });
                    assert!(
                        c.diagnostics.iter().all(|d| d.code != aplc_compiler::Code::ExpressionTooDeep),
                        "{}: {:?}",
                        &template[..40],
                        c.diagnostics
                    );
                    if let Some(bundle) = c.bundle {
                        Program::from_bundle(bundle, Limits::default()).expect("compiler output loads");
                    }
                }
            }
        })
        .expect("spawn a 2 MiB thread");
    worker.join().expect("no stack overflow on a 2 MiB stack");
}

/// F2: one level more is APL0020 at the template, and nothing overflows, however long.
#[test]
fn deeper_expressions_are_refused_with_apl0020() {
    let n = aplc_vm::MAX_EXPRESSION_DEPTH;
    for template in [
        format!("{{{{ 1{} }}}}", "+1".repeat(n + 1)),
        format!("{{{{ x{} }}}}", ".a".repeat(50_000)),
        format!("{{{{ {}x }}}}", "not ".repeat(50_000)),
    ] {
        let source = format!("# prompt: a\n## user\nhi\n{template}\n");
        let c = compile(&source, "deep.apl", &Options::default());
        let d = c
            .diagnostics
            .iter()
            .find(|d| d.code == aplc_compiler::Code::ExpressionTooDeep)
            .expect("APL0020");
        assert!(d.span().start >= source.find("{{").unwrap_or(0));
        assert!(c.bundle.is_none());
    }
}
