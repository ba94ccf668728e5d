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
        assert!(out.stderr.contains("APL0020"), "{name}: {}", out.stderr);
    }
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
}

/// F7: `graph` and `inspect` are linear in the number of steps. A chain of 60,000 steps
/// took about 9 s a pass per 20,000 steps squared before (steps × templates); now each
/// command is a few seconds even in a debug build.
#[test]
fn f7_graph_and_inspect_are_linear() {
    const STEPS: usize = 60_000;
    let dir = scratch("f7");
    let mut source = String::with_capacity(STEPS * 80);
    for i in 0..STEPS {
        source.push_str(&format!("# prompt: s{i}\nhi\n"));
        if i + 1 < STEPS {
            source.push_str(&format!(
                "# post: s{i}\n{{{{ set_context('next_step', 's{}') }}}}\n",
                i + 1
            ));
        }
    }
    let file = write(&dir, "chain.apl", &source);
    let bundle = dir.join("chain.aplb").to_string_lossy().into_owned();
    let caps = Caps {
        time: std::time::Duration::from_secs(15),
        ..Caps::default()
    };
    let built = aplc(&["build", &file, "-o", &bundle], caps);
    built.assert_clean_exit();
    assert_eq!(built.code, Some(0), "{}", built.stderr);
    for args in [
        vec!["graph", file.as_str()],
        vec!["graph", bundle.as_str(), "--format", "mermaid"],
        vec!["inspect", bundle.as_str()],
    ] {
        let out = aplc(&args, caps);
        out.assert_clean_exit();
        assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
    }
}
