//! Did-you-mean fixes as edits (`Diagnostic::suggestion`): for every diagnostic that
//! suggests a name, the edit replaces exactly the misspelt text, on non-ASCII lines too,
//! and applying it makes that diagnostic go away.

use aplc_compiler::{Code, Diagnostic, Options, Suggestion, compile};

fn diagnostics(source: &str) -> Vec<Diagnostic> {
    compile(source, "t.apl", &Options::default()).diagnostics
}

/// The one diagnostic with `code`, its suggestion's replaced text and replacement, and
/// the source with the suggestion applied.
fn fix(source: &str, code: Code) -> (String, String, String) {
    let diags = diagnostics(source);
    let with_code: Vec<&Diagnostic> = diags.iter().filter(|d| d.code == code).collect();
    assert_eq!(with_code.len(), 1, "{diags:#?}");
    let Some(Suggestion { span, replacement }) = with_code[0].suggestion.clone() else {
        panic!("no suggestion: {:#?}", with_code[0]);
    };
    let mut fixed = source.to_string();
    fixed.replace_range(span.range(), &replacement);
    (source[span.range()].to_string(), replacement, fixed)
}

/// Checks the replaced text and the replacement, and that the fixed source has no
/// diagnostic left at all.
fn assert_fixes(source: &str, code: Code, old: &str, new: &str) {
    let (replaced, replacement, fixed) = fix(source, code);
    assert_eq!((replaced.as_str(), replacement.as_str()), (old, new));
    let left = diagnostics(&fixed);
    assert!(left.is_empty(), "{fixed}\n{left:#?}");
}

#[test]
fn a_misspelt_phase_keyword() {
    assert_fixes(
        "# prompt: a\nÉté 🌞.\n\n# pots: a\n{{ 'é' }}\n",
        Code::InvalidStepHeading,
        "pots",
        "post",
    );
}

#[test]
fn a_misspelt_step_name_in_a_phase_heading() {
    let source = "# prompt: classify\nClasse 🚀.\n\n# post: clasify\n{{ set_context('x', 1) }}\n";
    assert_fixes(source, Code::MissingPrompt, "clasify", "classify");
}

#[test]
fn a_misspelt_role_keeps_its_colon() {
    let (old, new, fixed) = fix(
        "# prompt: a\n## sytem:\nSois 😀.\n",
        Code::InvalidRoleHeading,
    );
    assert_eq!((old.as_str(), new.as_str()), ("sytem", "system"));
    assert!(fixed.contains("## system:\n"), "{fixed}");
    assert_fixes(
        "# prompt: a\n## usr\nSalut 😀.\n",
        Code::InvalidRoleHeading,
        "usr",
        "user",
    );
}

#[test]
fn a_misspelt_next_step_target() {
    let source = "# prompt: début\n😀\n\n# post: début\nÉtape 🚀 {{ set_context('next_step', \"fni\") }}\n\n# prompt: fin\nFin.\n";
    assert_fixes(source, Code::UnknownStep, "fni", "fin");
}

#[test]
fn a_misspelt_function_filter_and_test() {
    assert_fixes(
        "# prompt: a\n😀 {{ rnage(3) | list }}\n",
        Code::UnknownFunction,
        "rnage",
        "range",
    );
    assert_fixes(
        "# prompt: a\n😀 {{ 'é' | uppper }}\n",
        Code::UnknownFilter,
        "uppper",
        "upper",
    );
    assert_fixes(
        "# prompt: a\n😀 {% if 'x' is strnig %}x{% endif %}\n",
        Code::UnknownFilter,
        "strnig",
        "string",
    );
}

#[test]
fn a_misspelt_variable_in_relaxed_syntax() {
    // Relaxed syntax rewrites the line before parsing it: the edit must still land on
    // the name in the file.
    let source = "# prompt: a\nBonjour 😀.\n\n# post: a\nset_context('total', 1)\n\n# prompt: b\nÉté 🌞.\n\n# post: b\n  set_context('y', totl)\n";
    let options = Options {
        relaxed: true,
        ..Options::default()
    };
    let diags = compile(source, "t.apl", &options).diagnostics;
    let d = diags
        .iter()
        .find(|d| d.code == Code::UndefinedVariable)
        .unwrap_or_else(|| panic!("{diags:#?}"));
    let s = d.suggestion.as_ref().expect("a suggestion");
    assert_eq!(
        (&source[s.span.range()], s.replacement.as_str()),
        ("totl", "total")
    );
}

#[test]
fn a_misspelt_variable() {
    let source = "# prompt: a\nÉté 🌞.\n\n# post: a\n{{ set_context('total', 1) }}{{ set_context('next_step', 'b') }}\n\n# prompt: b\nÉté {{ totl }}\n";
    assert_fixes(source, Code::UndefinedVariable, "totl", "total");
}

#[test]
fn help_without_a_name_has_no_edit() {
    // `set` is a statement, not a misspelling: words only.
    let diags = diagnostics("# prompt: a\n{{ set('x', 1) }}\n");
    assert!(
        diags[0].help.is_some() && diags[0].suggestion.is_none(),
        "{diags:#?}"
    );
}
