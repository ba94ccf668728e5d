//! Hostile input: the front end (source files) and bundle loading. See issue #9 and the
//! section "Source files and bundles" of `spec/limits.md`.

use crate::harness::{Caps, aplc, scratch, write};

/// F1: a template syntax error at a non-ASCII character is reported, not a panic in the
/// diagnostic printer.
#[test]
fn f1_syntax_error_at_a_non_ascii_character_is_a_diagnostic() {
    let dir = scratch("f1");
    let cases: [(&str, &[u8]); 4] = [
        ("cafe.apl", "{{ café }}".as_bytes()),
        ("dash.apl", "{{ name — }}".as_bytes()),
        ("nbsp.apl", b"{{ name\xc2\xa0}}"),
        ("emoji.apl", "{% if 🦀 %}x{% endif %}".as_bytes()),
    ];
    for (name, template) in cases {
        let mut source = b"# prompt: a\n## user\n".to_vec();
        source.extend_from_slice(template);
        source.push(b'\n');
        let file = write(&dir, name, &source);
        let out = aplc(&["check", &file], Caps::default());
        out.assert_clean_exit();
        assert_eq!(out.code, Some(2), "{name}: {}", out.stderr);
        assert!(out.stderr.contains("APL0009"), "{name}: {}", out.stderr);
    }
    // The bundles here are megabytes; keep only a failing test's files.
    let _ = std::fs::remove_dir_all(&dir);
}

/// F17: a UTF-8 byte-order mark before a valid file is accepted, and diagnostics still
/// point at the right line and column.
#[test]
fn f17_a_byte_order_mark_is_accepted() {
    let dir = scratch("f17");
    let ok = write(&dir, "ok.apl", "\u{feff}# prompt: a\n## user\nhi\n");
    let out = aplc(&["check", &ok], Caps::default());
    out.assert_clean_exit();
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    let bad = write(&dir, "bad.apl", "\u{feff}# prompt: a\n## user\n{{ x + }}\n");
    let out = aplc(&["check", &bad], Caps::default());
    out.assert_clean_exit();
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("APL0009"), "{}", out.stderr);
    assert!(out.stderr.contains("bad.apl:3:"), "{}", out.stderr);
    // The bundles here are megabytes; keep only a failing test's files.
    let _ = std::fs::remove_dir_all(&dir);
}

/// Long chains that once overflowed the stack: 50,000 terms of each kind.
fn long_chains() -> Vec<(&'static str, String)> {
    const TERMS: usize = 50_000;
    vec![
        ("plus", format!("{{{{ 1{} }}}}", "+1".repeat(TERMS))),
        ("not", format!("{{{{ {}x }}}}", "not ".repeat(TERMS))),
        ("attr", format!("{{{{ x{} }}}}", ".a".repeat(TERMS))),
        ("filter", format!("{{{{ x{} }}}}", "|lower".repeat(TERMS))),
        ("neg", format!("{{{{ {}1 }}}}", "-".repeat(TERMS))),
        (
            "ifelse",
            format!("{{{{ 1{} }}}}", " if x else 1".repeat(TERMS)),
        ),
    ]
}

/// F2: `check` reports an over-long expression as a diagnostic, not a stack overflow.
#[test]
fn f2_long_chains_in_source_are_a_diagnostic() {
    let dir = scratch("f2-source");
    for (name, template) in long_chains() {
        let file = write(
            &dir,
            &format!("{name}.apl"),
            format!("# prompt: a\n## user\n{template}\n"),
        );
        let out = aplc(&["check", &file], Caps::default());
        out.assert_clean_exit();
        assert_eq!(out.code, Some(2), "{name}: {}", out.stderr);
        assert!(out.stderr.contains("APL0024"), "{name}: {}", out.stderr);
    }
    // The bundles here are megabytes; keep only a failing test's files.
    let _ = std::fs::remove_dir_all(&dir);
}

/// Builds a valid bundle for a one-step program with a prompt and a post phase, then
/// replaces both templates with `template`: what a crafted bundle can do that the
/// compiler would refuse.
fn crafted_bundle(dir: &std::path::Path, name: &str, template: &str) -> String {
    let compiled = aplc_compiler::compile(
        "# prompt: a\n## user\nhi\n# post: a\nbye\n",
        "crafted.apl",
        &aplc_compiler::Options::default(),
    );
    let mut bundle = compiled.bundle.expect("the seed program compiles");
    for t in &mut bundle.templates {
        t.source = template.to_string();
    }
    let bytes = aplc_vm::bundle::encode(&bundle).expect("the crafted bundle encodes");
    write(dir, name, bytes)
}

/// F2: a crafted bundle with an over-long expression is refused at load, not a stack
/// overflow (the bundle is about 100 KB).
#[test]
fn f2_long_chains_in_a_bundle_are_refused_at_load() {
    let dir = scratch("f2-bundle");
    let mock = write(&dir, "mock.json", r#"["ok"]"#);
    for (name, template) in long_chains() {
        let bundle = crafted_bundle(&dir, &format!("{name}.aplb"), &template);
        let out = aplc(&["run", &bundle, "--mock", &mock], Caps::default());
        out.assert_clean_exit();
        assert_eq!(out.code, Some(1), "{name}: {}", out.stderr);
        assert!(
            out.stderr.contains("unreadable bundle") && out.stderr.contains("nested too deeply"),
            "{name}: {}",
            out.stderr
        );
        // `graph` and `inspect` analyse post templates too; they describe the bundle
        // (falling back to its stored edges) without parsing the deep template.
        for args in [
            vec!["graph", bundle.as_str()],
            vec!["inspect", bundle.as_str()],
        ] {
            let out = aplc(&args, Caps::default());
            out.assert_clean_exit();
            assert_eq!(out.code, Some(0), "{name} {args:?}: {}", out.stderr);
        }
    }
    // The bundles here are megabytes; keep only a failing test's files.
    let _ = std::fs::remove_dir_all(&dir);
}

/// F21: a crafted bundle whose template includes, imports or extends another template is
/// refused at load, as the compiler refuses the source.
#[test]
fn f21_include_import_extends_in_a_bundle_are_refused_at_load() {
    let dir = scratch("f21");
    let mock = write(&dir, "mock.json", r#"["ok"]"#);
    let cases = [
        ("include", "{% include '0' %}"),
        ("include-ignore", "{% include 'x' ignore missing %}"),
        ("import", "{% import '0' as m %}"),
        ("from", "{% from '0' import x %}"),
        ("extends", "{% extends '0' %}"),
        ("block", "{% block b %}x{% endblock %}"),
        ("ws", "{%- include '0' -%}"),
    ];
    for (name, template) in cases {
        let bundle = crafted_bundle(&dir, &format!("{name}.aplb"), template);
        let out = aplc(&["run", &bundle, "--mock", &mock], Caps::default());
        out.assert_clean_exit();
        assert_eq!(out.code, Some(1), "{name}: {}", out.stderr);
        assert!(
            out.stderr.contains("unreadable bundle") && out.stderr.contains("not supported"),
            "{name}: {}",
            out.stderr
        );
    }
    // The bundles here are megabytes; keep only a failing test's files.
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bundle of a chain of `steps` steps, each with a prompt and a post template that
/// jumps to the next step, built directly (the compiler refuses programs this large,
/// but `graph` and `inspect` describe any valid bundle).
fn chain_bundle(steps: usize) -> aplc_vm::bundle::Bundle {
    use aplc_vm::bundle::{Edge, EdgeTarget, Instr, StepId, TemplateId};
    let seed = aplc_compiler::compile(
        "# prompt: s\n## user\nhi\n# post: s\n{{ set_context('next_step', 'NEXT') }}\n",
        "chain.apl",
        &aplc_compiler::Options::for_run(false),
    )
    .bundle
    .expect("the seed program compiles");
    let mut bundle = seed.clone();
    bundle.steps.clear();
    bundle.templates.clear();
    bundle.messages.clear();
    bundle.code.clear();
    bundle.code_spans.clear();
    bundle.edges.clear();
    for i in 0..steps {
        let id = StepId(i as u32);
        let t0 = bundle.templates.len() as u32;
        let m0 = bundle.messages.len() as u32;
        let mut step = seed.steps[0].clone();
        step.name = format!("s{i}");
        step.entry = bundle.code.len() as u32;
        bundle.steps.push(step);
        for t in &seed.templates {
            let mut t = t.clone();
            t.step = id;
            t.source = t.source.replace("NEXT", &format!("s{}", i + 1));
            bundle.templates.push(t);
        }
        for m in &seed.messages {
            let mut m = *m;
            m.template = TemplateId(m.template.0 + t0);
            bundle.messages.push(m);
        }
        for instr in &seed.code {
            bundle.code.push(match *instr {
                Instr::EnterStep(_) => Instr::EnterStep(id),
                Instr::RenderPre(t) => Instr::RenderPre(TemplateId(t.0 + t0)),
                Instr::RenderPost(t) => Instr::RenderPost(TemplateId(t.0 + t0)),
                Instr::BuildPrompts { first, count } => Instr::BuildPrompts {
                    first: first + m0,
                    count,
                },
                other => other,
            });
        }
        bundle.code_spans.extend(seed.code_spans.iter().copied());
        bundle.edges.push(Edge {
            from: id,
            to: if i + 1 < steps {
                EdgeTarget::Step(StepId(i as u32 + 1))
            } else {
                EdgeTarget::Return
            },
            span: seed.steps[0].span,
        });
    }
    bundle
}

/// F7: `graph` and `inspect` are linear in the size of the bundle. On a chain of 60,000
/// steps they cost steps × templates before and ran past the cap; now each takes a few
/// seconds even in a debug build.
#[test]
fn f7_graph_and_inspect_are_linear() {
    let dir = scratch("f7");
    let bytes = aplc_vm::bundle::encode(&chain_bundle(60_000)).expect("the chain encodes");
    let bundle = write(&dir, "chain.aplb", bytes);
    let caps = Caps {
        time: std::time::Duration::from_secs(15),
        ..Caps::default()
    };
    for args in [
        vec!["graph", bundle.as_str()],
        vec!["graph", bundle.as_str(), "--format", "mermaid"],
        vec!["inspect", bundle.as_str()],
    ] {
        let out = aplc(&args, caps);
        out.assert_clean_exit();
        assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
    }
    // The bundles here are megabytes; keep only a failing test's files.
    let _ = std::fs::remove_dir_all(&dir);
}

/// F8: loading a bundle of a million empty templates (8 MB) once took about 800 times
/// its size in memory; now the loader refuses more than `MAX_TEMPLATES` templates,
/// `MAX_STEPS` steps or `MAX_TEMPLATE_BYTES` of template source with a clear error,
/// well within a 1 GiB address-space cap.
#[test]
fn f8_absurd_template_and_step_counts_are_refused_at_load() {
    let dir = scratch("f8");
    let mock = write(&dir, "mock.json", r#"["ok"]"#);
    let caps = Caps {
        memory: 1 << 30,
        ..Caps::default()
    };

    let mut many_templates = chain_bundle(1);
    let template = many_templates.templates[0].clone();
    many_templates.templates = vec![template; 1_000_000];
    for t in &mut many_templates.templates {
        t.source.clear();
    }
    let steps = chain_bundle(aplc_vm::MAX_STEPS + 1);
    let mut long = chain_bundle(1);
    long.templates[0].source = "{{ x }}".repeat(aplc_vm::MAX_TEMPLATE_BYTES / 7 + 1);
    for (name, bundle, what) in [
        ("templates", many_templates, "templates"),
        ("steps", steps, "steps"),
        ("bytes", long, "bytes of template source"),
    ] {
        let bytes = aplc_vm::bundle::encode(&bundle).expect("encodes");
        let file = write(&dir, &format!("{name}.aplb"), bytes);
        let out = aplc(&["run", &file, "--mock", &mock], caps);
        out.assert_clean_exit();
        assert_eq!(out.code, Some(1), "{name}: {}", out.stderr);
        assert!(
            out.stderr.contains(&format!("{what}; aplc loads at most")),
            "{name}: {}",
            out.stderr
        );
    }
    // The bundles here are megabytes; keep only a failing test's files.
    let _ = std::fs::remove_dir_all(&dir);
}

/// F8: the compiler refuses to build a program the VM would refuse to load.
#[test]
fn f8_the_compiler_refuses_programs_too_large_to_load() {
    let dir = scratch("f8-source");
    let source = format!(
        "# prompt: a\n{}",
        "## user\nhi\n".repeat(aplc_vm::MAX_TEMPLATES + 1)
    );
    let file = write(&dir, "sections.apl", source);
    let bundle = dir.join("out.aplb").to_string_lossy().into_owned();
    let out = aplc(&["build", &file, "-o", &bundle], Caps::default());
    out.assert_clean_exit();
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("APL0013") && out.stderr.contains("too large to load"),
        "{}",
        out.stderr
    );
    assert!(!std::path::Path::new(&bundle).exists());
    // The bundles here are megabytes; keep only a failing test's files.
    let _ = std::fs::remove_dir_all(&dir);
}
