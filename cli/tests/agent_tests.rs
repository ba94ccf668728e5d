//! `aplc test`, `aplc run --record`, `aplc init` and `aplc completions`, black box.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn aplc_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("aplc runs")
}

/// A fresh scratch directory unique to one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aplc-agent-tests-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, contents: &str) {
    std::fs::write(dir.join(name), contents).unwrap();
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn last_line(text: &str) -> &str {
    text.trim_end().lines().last().unwrap_or("")
}

const TRIAGE: &str = "\
# pre: triage
{{ set_context('output_mode', 'json') }}

# prompt: triage
Classify this ticket: {{ ticket }}

# post: triage
{% if result_json and result_json.category == 'billing' %}
{{ set_context('next_step', 'refund') }}
{% endif %}

# pre: refund
{{ set_context('output_mode', 'text') }}

# prompt: refund
Issue a refund for: {{ ticket }}
";

/// A directory holding `triage.apl` and a test file with `cases`.
fn triage_project(name: &str, cases: &str) -> PathBuf {
    let dir = scratch(name);
    write(&dir, "triage.apl", TRIAGE);
    write(
        &dir,
        "triage.test.toml",
        &format!("agent = \"triage.apl\"\n\n{cases}"),
    );
    dir
}

#[test]
fn the_fixtures_own_test_files_pass() {
    // `aplc test fixtures/` from the repository root, as a user would run it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = aplc_in(&root, &["test", "fixtures/"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("test fixtures/run/unknown_step.test.toml::"),
        "{text}"
    );
    assert!(
        text.contains("test fixtures/tools/calc.test.toml::"),
        "{text}"
    );
    let summary = last_line(&text);
    assert!(summary.ends_with(" passed, 0 failed"), "{summary}");
    let passed: usize = summary.split(' ').next().unwrap().parse().unwrap();
    assert!(passed >= 10, "{summary}");
}

#[test]
fn passing_cases_print_cargo_test_lines_and_the_summary() {
    let dir = triage_project(
        "pass",
        r#"
[[case]]
name = "billing ticket"
context = { ticket = "I was charged twice" }
responses = ['{"category": "billing"}', "Refund issued"]
expect = ["result_text == 'Refund issued'", "global_runs == 2", "errors | length == 0",
          "context_history[0].result_json.category == 'billing'"]

[[case]]
name = "other ticket"
context = { ticket = "Hello" }
responses = ['{"category": "other"}']
expect = ["result_json.category == 'other'", "global_runs == 1"]
"#,
    );
    let out = aplc_in(&dir, &["test"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("running 2 tests"), "{text}");
    assert!(
        text.contains("test triage.test.toml::billing ticket ... ok"),
        "{text}"
    );
    assert!(
        text.contains("test triage.test.toml::other ticket ... ok"),
        "{text}"
    );
    assert_eq!(last_line(&text), "2 passed, 0 failed");

    // A path may be the file or its directory.
    let by_file = aplc_in(&dir, &["test", "triage.test.toml"]);
    assert_eq!(last_line(&stdout(&by_file)), "2 passed, 0 failed");
    let by_dir = aplc_in(dir.parent().unwrap(), &["test", dir.to_str().unwrap()]);
    assert_eq!(last_line(&stdout(&by_dir)), "2 passed, 0 failed");

    // The agent may be a bundle, recognised by its magic bytes whatever its name.
    let build = aplc_in(&dir, &["build", "triage.apl", "-o", "triage.bin"]);
    assert_eq!(build.status.code(), Some(0), "{}", stderr(&build));
    let cases = std::fs::read_to_string(dir.join("triage.test.toml")).unwrap();
    write(
        &dir,
        "bundle.test.toml",
        &cases.replace("agent = \"triage.apl\"", "agent = \"triage.bin\""),
    );
    let bundle = aplc_in(&dir, &["test", "bundle.test.toml"]);
    assert_eq!(bundle.status.code(), Some(0), "{}", stdout(&bundle));
    assert_eq!(last_line(&stdout(&bundle)), "2 passed, 0 failed");
}

#[test]
fn a_failing_assertion_prints_the_expression_the_values_it_reads_and_result_text() {
    let dir = triage_project(
        "fail",
        r#"
[[case]]
name = "misclassified"
context = { ticket = "I was charged twice" }
responses = ['{"category": "sales"}']
expect = ["result_json.category == 'billing'", "global_runs == 1"]
"#,
    );
    let out = aplc_in(&dir, &["test"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("test triage.test.toml::misclassified ... FAILED"),
        "{text}"
    );
    assert!(
        text.contains("---- triage.test.toml::misclassified ----"),
        "{text}"
    );
    assert!(
        text.contains("expect `result_json.category == 'billing'` is false"),
        "{text}"
    );
    assert!(
        text.contains("    result_json = {\"category\":\"sales\"}"),
        "{text}"
    );
    assert!(
        text.contains("    result_json.category = \"sales\""),
        "{text}"
    );
    assert!(
        text.contains(r#"result_text: "{\"category\": \"sales\"}""#),
        "{text}"
    );
    assert!(
        !text.contains("global_runs == 1"),
        "a passing expect is not reported"
    );
    assert_eq!(last_line(&text), "0 passed, 1 failed");
}

#[test]
fn an_expression_that_fails_to_evaluate_is_a_failed_case() {
    let dir = triage_project(
        "eval-error",
        r#"
[[case]]
name = "reads a missing variable"
context = { ticket = "x" }
responses = ['{"category": "other"}']
expect = ["no_such_variable.field == 1", "'%d' | format(global_runs) == '1'"]
"#,
    );
    let out = aplc_in(&dir, &["test"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("expect `no_such_variable.field == 1` could not be evaluated"),
        "{text}"
    );
    assert!(text.contains("    no_such_variable = undefined"), "{text}");
    assert_eq!(last_line(&text), "0 passed, 1 failed");
}

#[test]
fn expect_error_passes_on_the_expected_failure_only() {
    let dir = scratch("expect-error");
    write(
        &dir,
        "jump.apl",
        "# prompt: start\nStart.\n\n# post: start\n{{ set_context('next_step', 'finish') }}\n\n# prompt: Finish\nNever.\n",
    );
    write(
        &dir,
        "jump.test.toml",
        r#"agent = "jump.apl"

[[case]]
name = "unknown step"
responses = ["started"]
expect_error = "Unknown step: finish"
expect = ["result_text == 'started'"]

[[case]]
name = "wrong message"
responses = ["started"]
expect_error = "Run budget exceeded"

[[case]]
name = "unexpected failure"
responses = ["started"]
"#,
    );
    let out = aplc_in(&dir, &["test"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("::unknown step ... ok"), "{text}");
    assert!(text.contains("::wrong message ... FAILED"), "{text}");
    assert!(
        text.contains("expected the run to fail with `Run budget exceeded`, but it failed with: Unknown step: finish"),
        "{text}"
    );
    assert!(text.contains("::unexpected failure ... FAILED"), "{text}");
    assert!(
        text.contains("the run failed: Unknown step: finish"),
        "{text}"
    );
    assert_eq!(last_line(&text), "1 passed, 2 failed");

    // A run that completes cleanly does not satisfy expect_error.
    let dir = triage_project(
        "expect-error-clean",
        "[[case]]\nname = \"clean\"\ncontext = { ticket = \"x\" }\nresponses = ['{}']\nexpect_error = \"boom\"\n",
    );
    let out = aplc_in(&dir, &["test"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("but it completed without errors"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn an_unknown_key_is_an_invalid_file() {
    let dir = triage_project(
        "unknown-key",
        "[[case]]\nname = \"typo\"\ncontext = { ticket = \"x\" }\nresponses = ['{}']\nexpects = [\"false\"]\n",
    );
    let out = aplc_in(&dir, &["test"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("triage.test.toml"), "{err}");
    assert!(err.contains("unknown field `expects`"), "{err}");
    assert!(err.contains("line 7"), "{err}");

    // The same at the top level and for `[[cases]]`.
    for (name, text) in [
        (
            "top",
            "agent = \"triage.apl\"\nmodel = \"x\"\n[[case]]\nname = \"a\"\n",
        ),
        ("cases", "agent = \"triage.apl\"\n[[cases]]\nname = \"a\"\n"),
    ] {
        let dir = scratch(&format!("unknown-key-{name}"));
        write(&dir, "triage.apl", TRIAGE);
        write(&dir, "t.test.toml", text);
        let out = aplc_in(&dir, &["test"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains("unknown field"), "{}", stderr(&out));
    }
}

#[test]
fn invalid_files_exit_2_and_the_valid_ones_still_run() {
    let dir = triage_project(
        "invalid",
        "[[case]]\nname = \"ok\"\ncontext = { ticket = \"x\" }\nresponses = ['{}']\nexpect = [\"global_runs == 1\"]\n",
    );
    write(&dir, "broken.apl", "# prompt: a\n{% if %}\n");
    let bad = [
        ("bad_toml", "agent = \n".to_string(), "TOML parse error"),
        (
            "missing_agent",
            "agent = \"nope.apl\"\n[[case]]\nname = \"a\"\n".to_string(),
            "nope.apl",
        ),
        (
            "agent_with_errors",
            "agent = \"broken.apl\"\n[[case]]\nname = \"a\"\n".to_string(),
            "broken.apl has errors",
        ),
        (
            "bad_expression",
            "agent = \"triage.apl\"\n[[case]]\nname = \"a\"\nexpect = [\"1 +\"]\n".to_string(),
            "is not a valid expression",
        ),
        (
            "missing_responses_file",
            "agent = \"triage.apl\"\n[[case]]\nname = \"a\"\nresponses = { file = \"gone.json\" }\n"
                .to_string(),
            "gone.json",
        ),
        (
            "bad_responses",
            "agent = \"triage.apl\"\n[[case]]\nname = \"a\"\nresponses = { path = \"x\" }\n"
                .to_string(),
            "`responses` must be an array",
        ),
        (
            "no_cases",
            "agent = \"triage.apl\"\n".to_string(),
            "no test cases",
        ),
        (
            "zero_max_steps",
            "agent = \"triage.apl\"\n[[case]]\nname = \"a\"\nmax_steps = 0\n".to_string(),
            "`max_steps` must be at least 1",
        ),
    ];
    for (name, text, _) in &bad {
        write(&dir, &format!("{name}.test.toml"), text);
    }
    let out = aplc_in(&dir, &["test"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for (name, _, message) in &bad {
        let line = err
            .lines()
            .find(|l| l.starts_with(&format!("error: {name}.test.toml")))
            .unwrap_or_else(|| panic!("no error for {name} in:\n{err}"));
        let block = &err[err.find(line).unwrap()..];
        assert!(
            block.contains(message),
            "{name}: {message} not in:\n{block}"
        );
    }
    // The valid file's case ran and passed.
    assert_eq!(last_line(&stdout(&out)), "1 passed, 0 failed");
}

#[test]
fn format_json_prints_one_object_per_case() {
    let dir = triage_project(
        "json",
        r#"
[[case]]
name = "passes"
context = { ticket = "x" }
responses = ['{"category": "other"}']
expect = ["global_runs == 1"]

[[case]]
name = "fails"
context = { ticket = "x" }
responses = ['{"category": "other"}']
expect = ["result_json.category == 'billing'"]
"#,
    );
    let out = aplc_in(&dir, &["test", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is a JSON object"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["name"], "passes");
    assert_eq!(lines[0]["file"], "triage.test.toml");
    assert_eq!(lines[0]["outcome"], "ok");
    assert!(lines[0]["duration_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(lines[0]["failures"], serde_json::json!([]));
    assert_eq!(lines[1]["outcome"], "failed");
    let failure = &lines[1]["failures"][0];
    assert_eq!(failure["kind"], "assertion");
    assert_eq!(failure["expression"], "result_json.category == 'billing'");
    assert_eq!(failure["variables"]["result_json.category"], "\"other\"");
    assert_eq!(lines[1]["result_text"], r#"{"category": "other"}"#);
    assert_eq!(last_line(&stderr(&out)), "1 passed, 1 failed");
}

#[test]
fn record_then_replay_as_a_test() {
    let dir = scratch("record");
    write(&dir, "triage.apl", TRIAGE);
    write(&dir, "context.json", r#"{"ticket": "charged twice"}"#);
    // Stands in for a real model: a full response with usage, then a failed call.
    write(
        &dir,
        "model.json",
        r#"[{"choices": [{"message": {"role": "assistant", "content": "{\"category\": \"billing\"}"}}],
             "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}},
            {"error": "HTTP 503"}]"#,
    );
    let run = aplc_in(
        &dir,
        &[
            "run",
            "triage.apl",
            "--mock",
            "model.json",
            "--context",
            "context.json",
            "--record",
            "recorded.json",
        ],
    );
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    let recorded: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("recorded.json")).unwrap()).unwrap();
    let entries = recorded.as_array().expect("a JSON array");
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["usage"]["total_tokens"], 14);
    assert_eq!(entries[1], serde_json::json!({"error": "HTTP 503"}));
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // A recording that cannot be written: exit 1 after the run's output, and a run
    // error is still the one reported.
    let unwritable = aplc_in(
        &dir,
        &[
            "run",
            "triage.apl",
            "--mock",
            "model.json",
            "--context",
            "context.json",
            "--record",
            "no-such-dir/recorded.json",
        ],
    );
    assert_eq!(unwritable.status.code(), Some(1), "{}", stderr(&unwritable));
    assert!(
        stderr(&unwritable).contains("cannot write no-such-dir/recorded.json"),
        "{}",
        stderr(&unwritable)
    );
    write(
        &dir,
        "jump.apl",
        "# prompt: a\nA.\n\n# post: a\n{{ set_context('next_step', 'nowhere') }}\n",
    );
    write(&dir, "one.json", r#"["a"]"#);
    let jump = aplc_in(
        &dir,
        &[
            "run",
            "jump.apl",
            "--mock",
            "one.json",
            "--record",
            "no-such-dir/r.json",
        ],
    );
    assert_eq!(jump.status.code(), Some(1));
    let err = stderr(&jump);
    assert!(err.contains("cannot write no-such-dir/r.json"), "{err}");
    assert!(err.contains("Unknown step: nowhere"), "{err}");

    // `--mock` replays the recording exactly.
    let replay = aplc_in(
        &dir,
        &[
            "run",
            "triage.apl",
            "--mock",
            "recorded.json",
            "--context",
            "context.json",
            "--json",
        ],
    );
    assert_eq!(replay.status.code(), Some(3), "{}", stderr(&replay));

    // And so does a test case.
    write(
        &dir,
        "triage.test.toml",
        r#"agent = "triage.apl"

[[case]]
name = "recorded"
context = { ticket = "charged twice" }
responses = { file = "recorded.json" }
expect_error = "HTTP 503"
expect = ["context_history[0].usage.total_tokens == 14",
          "context_history[0].result_json.category == 'billing'", "global_runs == 1"]
"#,
    );
    let out = aplc_in(&dir, &["test"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(last_line(&stdout(&out)), "1 passed, 0 failed");
}

#[test]
fn init_creates_a_project_whose_tests_pass_and_never_overwrites() {
    let dir = scratch("init");
    let out = aplc_in(&dir, &["init", "support-agent"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let project = dir.join("support-agent");
    for file in [
        "agent.apl",
        "agent.test.toml",
        "providers.json",
        "README.md",
    ] {
        assert!(project.join(file).is_file(), "{file} missing");
    }
    let readme = std::fs::read_to_string(project.join("README.md")).unwrap();
    assert!(readme.starts_with("# support-agent\n"), "{readme}");

    let check = aplc_in(&project, &["check", "agent.apl"]);
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    assert!(!stderr(&check).contains("Warning"), "{}", stderr(&check));
    let test = aplc_in(&project, &["test"]);
    assert_eq!(test.status.code(), Some(0), "{}", stdout(&test));
    assert!(last_line(&stdout(&test)).ends_with(" passed, 0 failed"));
    let providers: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(project.join("providers.json")).unwrap())
            .unwrap();
    assert!(providers["routes"].is_array());

    // Again: refused, exit 2, the edited agent untouched.
    write(&project, "agent.apl", "# prompt: mine\nMine.\n");
    let again = aplc_in(&dir, &["init", "support-agent"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        stderr(&again).contains("not overwriting"),
        "{}",
        stderr(&again)
    );
    assert_eq!(
        std::fs::read_to_string(project.join("agent.apl")).unwrap(),
        "# prompt: mine\nMine.\n"
    );

    // One existing file is enough for nothing at all to be written.
    let partial = dir.join("partial");
    std::fs::create_dir_all(&partial).unwrap();
    write(&partial, "README.md", "mine");
    let out = aplc_in(&dir, &["init", "partial"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("README.md"), "{}", stderr(&out));
    assert!(!partial.join("agent.apl").exists());
    assert_eq!(
        std::fs::read_to_string(partial.join("README.md")).unwrap(),
        "mine"
    );

    // A file where the directory should be.
    write(&dir, "a-file", "x");
    let out = aplc_in(&dir, &["init", "a-file"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is not a directory"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn completions_for_bash_zsh_and_fish() {
    let dir = std::env::temp_dir();
    for shell in ["bash", "zsh", "fish"] {
        let out = aplc_in(&dir, &["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(script.contains("aplc"), "{shell}");
        assert!(script.contains("completions"), "{shell}");
        assert!(script.contains("record"), "{shell}: `run --record` missing");
    }
    let out = aplc_in(&dir, &["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
}

/// `aplc test ARGS` in `dir`, killed and reported if it has not ended within a minute (a
/// hang must fail the test, not stall the suite).
fn aplc_within_a_minute(dir: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("aplc runs");
    let started = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("aplc {args:?} still running after a minute");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// Issue #22 R14: a FIFO named like a test file made the directory walk wait forever for
/// a writer. The walk skips it; named explicitly, it is refused at once.
#[cfg(unix)]
#[test]
fn a_fifo_named_like_a_test_file_is_skipped_or_refused() {
    let dir = triage_project(
        "fifo",
        "[[case]]\nname = \"ok\"\ncontext = { ticket = \"x\" }\nresponses = ['{}']\nexpect = [\"global_runs == 1\"]\n",
    );
    let fifo = dir.join("hang.test.toml");
    let path = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
    // SAFETY: `mkfifo` reads a NUL-terminated path and has no other memory effects.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0, "mkfifo");

    let out = aplc_within_a_minute(&dir, &["test"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(last_line(&stdout(&out)), "1 passed, 0 failed");

    let out = aplc_within_a_minute(&dir, &["test", "hang.test.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
}

/// Issue #22 R15: a test file is refused over the agent source limit (8 MiB) before any
/// of it is read: a sparse 32 MiB file, which would cost a gigabyte once parsed.
#[test]
fn an_oversized_test_file_is_refused_before_it_is_read() {
    let dir = scratch("oversized");
    let file = std::fs::File::create(dir.join("big.test.toml")).unwrap();
    file.set_len(32 * 1024 * 1024).unwrap();
    let out = aplc_in(&dir, &["test", "big.test.toml"]);
    let err = stderr(&out);
    let shown = &err[..err.len().min(2000)];
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(
        err.contains("the file is 33554432 bytes; aplc reads test files of at most 8388608 bytes"),
        "{shown}"
    );
}

/// Issue #22 R15: a TOML error on a line of megabytes printed the whole line (twice). It
/// prints the line, column and a clipped excerpt around the error.
#[test]
fn a_toml_error_on_a_long_line_prints_a_bounded_excerpt() {
    let dir = scratch("long-line");
    let line = format!("agent = \"triage.apl\" {} = 1\n", "x".repeat(4_000_000));
    write(&dir, "long.test.toml", &line);
    let out = aplc_in(&dir, &["test"]);
    let err = stderr(&out);
    let shown = &err[..err.len().min(2000)];
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(err.len() < 4096, "{} bytes of errors: {shown}", err.len());
    assert!(
        err.contains("TOML parse error at line 1, column 22"),
        "{err}"
    );
    assert!(err.contains("xxxx…"), "{err}");
}
