//! Property tests: the front end never panics (nor does rendering its diagnostics), and
//! whatever it accepts, the VM loads and runs without panicking. Inputs include arbitrary
//! text, generated non-ASCII templates and deep expressions (issue #9, F1, F2, F17).
// A test harness, not the compiler: it may time runs and use big-stack threads.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Duration;

use aplc_compiler::{Options, compile, render};
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
        compile_and_render(&source, relaxed);
    }

    #[test]
    fn arbitrary_bytes_as_lossy_text_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let source = String::from_utf8_lossy(&bytes);
        compile_and_render(&source, false);
    }

    /// F1: templates mixing Jinja syntax and non-ASCII characters, at every position a
    /// syntax error can be reported; F17: sometimes behind a byte-order mark.
    #[test]
    fn non_ascii_templates_never_panic(
        pieces in prop::collection::vec(non_ascii_piece(), 1..12),
        bom: bool,
        relaxed: bool,
    ) {
        let body = pieces.concat();
        let bom = if bom { "\u{feff}" } else { "" };
        let source = format!("{bom}# prompt: a\n## user\n{body}\n# post: a\n{body}\n");
        compile_and_render(&source, relaxed);
    }

    /// F2: random chains of operators, lookups, filters and brackets, up to well past
    /// the depth limit, never overflow the stack (a 2 MiB thread, as tokio's workers).
    #[test]
    fn deep_expressions_never_overflow(expr in deep_expression(), relaxed: bool) {
        let source = format!("# prompt: a\n## user\n{{{{ {expr} }}}}\n# post: a\n{{% if {expr} %}}x{{% endif %}}\n");
        let worker = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let c = compile_and_render(&source, relaxed);
                if let Some(bundle) = c {
                    Program::from_bundle(bundle, Limits::default()).expect("compiler output loads");
                }
            })
            .expect("spawn a 2 MiB thread");
        prop_assert!(worker.join().is_ok());
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
        let mut ticks = 0u64;
        let outcome = run_scripted(Arc::new(program), options, &mut script, move || {
            ticks += 1;
            Duration::from_millis(ticks)
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

/// F2: one level more is APL0024 at the template, and nothing overflows, however long.
#[test]
fn deeper_expressions_are_refused_with_apl0024() {
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
            .expect("APL0024");
        assert!(d.span().start >= source.find("{{").unwrap_or(0));
        assert!(c.bundle.is_none());
    }
}

/// Compiles `source`, renders every diagnostic (the printer must not panic on any span),
/// checks that every span falls on character boundaries, and returns the bundle.
fn compile_and_render(source: &str, relaxed: bool) -> Option<aplc_compiler::Bundle> {
    let c = compile(
        source,
        "fuzz.apl",
        &Options {
            relaxed,
            ..Options::default()
        },
    );
    for label in c.diagnostics.iter().flat_map(|d| &d.labels) {
        assert!(
            source.is_char_boundary(label.span.start) && source.is_char_boundary(label.span.end),
            "span {:?} splits a character in {source:?}",
            label.span
        );
    }
    let _ = render(&c.diagnostics, "fuzz.apl", source, false);
    let _ = render(&c.diagnostics, "fuzz.apl", source, true);
    c.bundle
}

/// Jinja fragments, valid and broken, mixed with multi-byte characters.
fn non_ascii_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("{{ ".to_string()),
        Just(" }}".to_string()),
        Just("{% if ".to_string()),
        Just(" %}".to_string()),
        Just("{% endif %}".to_string()),
        Just("{# ".to_string()),
        Just(" #}".to_string()),
        Just("'".to_string()),
        Just("|".to_string()),
        Just(".".to_string()),
        Just("(".to_string()),
        Just("name".to_string()),
        Just("café".to_string()),
        Just("—".to_string()),
        Just("\u{a0}".to_string()),
        Just("🦀".to_string()),
        Just("\u{feff}".to_string()),
        Just("\u{301}".to_string()),
        "\\PC{1,4}",
    ]
}

/// One expression: a chain of random length (up to four times the depth limit) of
/// random links, some wrapped in brackets.
fn deep_expression() -> impl Strategy<Value = String> {
    let link = prop_oneof![
        Just("+1"),
        Just("~'a'"),
        Just(" and x"),
        Just(" or x"),
        Just(".a"),
        Just("[0]"),
        Just("|string"),
        Just(" is defined"),
        Just(" if x else 1"),
        Just("**2"),
    ];
    let max = 4 * aplc_vm::MAX_EXPRESSION_DEPTH;
    (
        prop::collection::vec(link, 0..max),
        0..aplc_vm::MAX_EXPRESSION_DEPTH,
        prop_oneof![Just("not "), Just("-"), Just("("), Just("[")],
    )
        .prop_map(|(links, prefix, opener)| {
            let closer = match opener {
                "(" => ")",
                "[" => "]",
                _ => "",
            };
            format!(
                "{}x{}{}",
                opener.repeat(prefix),
                links.concat(),
                closer.repeat(prefix)
            )
        })
}
