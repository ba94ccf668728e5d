//! Hostile input: templates. See issue #9 and `spec/limits.md`, "Templates: values, fuel
//! and time" (findings F3, F4 and F6).

use std::time::Duration;

use crate::harness::{Caps, aplc, scratch, write};

/// 1 GiB of address space: enough for aplc, far too little for any of the values below.
const MEMORY: u64 = 1 << 30;

/// Runs a one-step agent whose pre phase is `pre` (and whose post phase is `post`), with
/// a mock provider answering `calls` times, and returns the capped run.
fn run_agent(
    name: &str,
    pre: &str,
    post: &str,
    calls: usize,
    extra: &[&str],
) -> crate::harness::Capped {
    let dir = scratch(name);
    let source = write(
        &dir,
        "agent.apl",
        format!("# pre: s\n{pre}\n\n# prompt: s\nhi\n\n# post: s\n{post}\n"),
    );
    let answers = serde_json::to_string(&vec!["ok"; calls]).expect("a JSON array");
    let mock = write(&dir, "mock.json", answers);
    let mut args = vec!["run", "--json", "--mock", &mock];
    args.extend_from_slice(extra);
    args.push(&source);
    aplc(
        &args,
        Caps {
            memory: MEMORY,
            time: Duration::from_secs(60),
        },
    )
}

/// F4: each of these once allocated gigabytes (or aborted on a failed allocation). Now
/// the expression fails with a template error that names the limit, and the run goes on.
#[test]
fn f4_one_expression_cannot_allocate_gigabytes() {
    let cases = [
        ("center", "{{ set_context('out', 'x'|center(10**10)) }}"),
        (
            "format_width",
            "{{ set_context('out', '%10000000000s'|format('x')) }}",
        ),
        (
            "str_format_width",
            "{{ set_context('out', '{:>10000000000}'.format('x')) }}",
        ),
        (
            "indent",
            "{{ set_context('out', ('a\\n' * 100)|indent(10**8)) }}",
        ),
        (
            "batch",
            "{{ set_context('out', range(10)|batch(10**12, 0)|list) }}",
        ),
        (
            "tilde_doubling",
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        ),
        (
            "plus_doubling",
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        ),
        (
            "list_doubling",
            "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ set_context('out', ns.l|list) }}",
        ),
        (
            "list_repeat",
            "{{ set_context('out', ([1] * 10**8)|list) }}",
        ),
        (
            "join_shared",
            "{% set s = 'x' * 10**7 %}{{ set_context('out', ([s] * 1000)|join) }}",
        ),
        (
            "join_method_shared",
            "{% set s = 'x' * 10**7 %}{{ set_context('out', ''.join([s] * 1000)) }}",
        ),
        (
            "tojson_shared",
            "{% set s = 'x' * 10**7 %}{{ set_context('out', ([s] * 1000)|tojson) }}",
        ),
        (
            "string_shared",
            "{% set s = 'x' * 10**7 %}{{ set_context('out', ([s] * 1000)|string) }}",
        ),
        (
            "replace",
            "{{ set_context('out', ('x' * 10**7)|replace('x', 'y' * 1000)) }}",
        ),
        (
            "replace_method",
            "{{ set_context('out', ('x' * 10**7).replace('x', 'y' * 1000)) }}",
        ),
        (
            "add_context_doubling",
            "{{ set_context('s', 'x' * 10**7) }}{% for i in range(64) %}{{ add_context('s', get_context('s')) }}{% endfor %}",
        ),
    ];
    for (name, pre) in cases {
        let run = run_agent(&format!("f4-{name}"), pre, "", 1, &[]);
        run.assert_clean_exit();
        // Exit 3: the run finished, and its last step ended with errors.
        assert_eq!(run.code, Some(3), "{name}: {}", run.stderr);
        assert!(
            run.stderr.contains("value too large") && run.stderr.contains("spec/limits.md"),
            "{name}: no limit error:\n{}",
            run.stderr
        );
    }
}

/// F3: a template can no longer build a value deep enough to overflow the stack of
/// `tojson`, `safe`, printing or `run --json`.
#[test]
fn f3_deep_values_built_by_a_template_are_refused() {
    let nest = "{% set ns = namespace(v=[]) %}{% for i in range(100000) %}{% set ns.v = [ns.v] %}{% endfor %}";
    let cases = [
        ("tojson", format!("{nest}{{{{ set_context('out', ns.v|tojson) }}}}")),
        ("safe", format!("{nest}{{{{ set_context('out', ns.v|safe) }}}}")),
        ("print", format!("{nest}{{{{ ns.v }}}}")),
        ("store", format!("{nest}{{{{ set_context('out', ns.v) }}}}")),
        (
            "map",
            "{% set ns = namespace(v={}) %}{% for i in range(100000) %}{% set ns.v = {'a': ns.v} %}{% endfor %}{{ set_context('out', ns.v) }}".to_string(),
        ),
        (
            "batch",
            "{% set ns = namespace(v=[1]) %}{% for i in range(100000) %}{% set ns.v = ns.v|batch(1)|list %}{% endfor %}{{ set_context('out', ns.v) }}".to_string(),
        ),
        (
            "namespace_cycle",
            "{% set ns = namespace(v=[]) %}{% set ns.v = [ns] %}{{ set_context('out', ns) }}".to_string(),
        ),
        (
            "context_cycle",
            "{{ set_context('out', [context]) }}{{ context|tojson }}".to_string(),
        ),
    ];
    for (name, pre) in cases {
        let run = run_agent(&format!("f3-{name}"), &pre, "", 1, &[]);
        run.assert_clean_exit();
        assert_eq!(run.code, Some(3), "{name}: {}", run.stderr);
        assert!(
            run.stderr.contains("levels deep exceeds the limit")
                || run.stderr.contains("namespace() cannot be stored")
                || run.stderr.contains("live `context` view cannot be stored"),
            "{name}: no nesting error:\n{}",
            run.stderr
        );
    }
}

/// F3: a value deepened a little in every step (here 200 levels per step for 150 steps,
/// 30,000 in all) once made `run --json` overflow the stack; the nesting limit stops it
/// in the second step.
#[test]
fn f3_deep_values_built_across_steps_are_refused() {
    let pre = "{% set ns = namespace(v=get_context('v', [])) %}{% for i in range(200) %}{% set ns.v = [ns.v] %}{% endfor %}{{ set_context('v', ns.v) }}";
    let post = "{% if get_context('n', 0) < 150 %}{{ inc_context('n') }}{{ set_context('next_step', 's') }}{% endif %}";
    let run = run_agent("f3-steps", pre, post, 200, &[]);
    run.assert_clean_exit();
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(
        run.stderr.contains("levels deep exceeds the limit"),
        "{}",
        run.stderr
    );
    // The deepest value the run could keep is within the limit, so the output is small.
    assert!(run.stdout.len() < 8 << 20, "{} bytes", run.stdout.len());
}

/// F6: one slow render (each iteration copies an 8 MB string) once ran for minutes past
/// `--timeout 1000`. The watchdog interrupts it: the run fails with the timeout error
/// within about a second of its deadline.
#[test]
fn f6_a_slow_render_stops_at_the_run_timeout() {
    let pre =
        "{% set s = 'x' * 4000000 %}{% for i in range(100000) %}{% set t = s ~ s %}{% endfor %}";
    let run = run_agent("f6-slow", pre, "", 1, &["--timeout", "1000"]);
    run.assert_clean_exit();
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("Run timeout"), "{}", run.stderr);
    assert!(
        run.elapsed < Duration::from_millis(3500),
        "the run took {:?}",
        run.elapsed
    );
}
