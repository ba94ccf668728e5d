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
