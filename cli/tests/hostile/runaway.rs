//! Hostile input: runaway loops, failure messages, files and terminals (issue #9:
//! "Runaway loops", F9, F14, F15, F18, F20's duplicate `--context` keys). See
//! `spec/limits.md`, sections "Runs: steps, provider calls, time and memory" and "Files
//! and terminal output".

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{Caps, aplc, scratch, write};

/// The README's haiku agent: its post phase retries until a haiku passes or `runs`
/// reaches 3. A failed provider call is not a run, so against a provider that fails for
/// good it loops forever.
const HAIKU: &str = "# pre: draft
{{ set_context('topic', get_context('topic', 'sunsets')) }}

# prompt: draft
## system
You write haiku.
## user
Write a haiku about {{ topic }}.

# post: draft
{% if runs < 3 and \"5-7-5\" not in result_text %}
{{ set_context('next_step', 'draft') }}
{% endif %}
";

/// Caps for a runaway run: before the fix it spun until its timeout, growing memory by
/// about 170 MB/s, so a regression fails on the time or memory cap.
fn runaway_caps() -> Caps {
    Caps {
        memory: 1 << 30,
        time: Duration::from_secs(20),
    }
}

#[test]
fn a_retry_loop_against_an_exhausted_mock_ends_at_the_step_budget() {
    let dir = scratch("runaway-mock");
    let agent = write(&dir, "haiku.apl", HAIKU);
    let mock = write(&dir, "mock.json", r#"["first try"]"#);
    let out = aplc(
        &[
            "run",
            &agent,
            "--mock",
            &mock,
            "--max-runs",
            "3",
            "--timeout",
            "60000",
        ],
        runaway_caps(),
    );
    out.assert_clean_exit();
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("Step budget exceeded: 1000 steps"),
        "{}",
        out.stderr
    );
    // The failure says why the step kept failing.
    assert!(
        out.stderr
            .contains("(last errors in step `draft`: provider error: mock provider exhausted)"),
        "{}",
        out.stderr
    );
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);

    // A run that needs more steps raises the budget explicitly.
    let looped = write(
        &dir,
        "count.apl",
        "# prompt: a\nhi\n# post: a\n{{ inc_context('n') }}\
         {% if n < 1500 %}{{ set_context('next_step', 'a') }}{% endif %}\n",
    );
    let many = write(
        &dir,
        "many.json",
        format!("[{}]", vec!["\"ok\""; 1500].join(",")),
    );
    let raised = aplc(
        &["run", &looped, "--mock", &many, "--max-steps", "1500"],
        runaway_caps(),
    );
    assert_eq!(raised.code, Some(0), "{}", raised.stderr);
    let default = aplc(&["run", &looped, "--mock", &many], runaway_caps());
    assert_eq!(default.code, Some(1), "{}", default.stderr);
    assert!(
        default
            .stderr
            .starts_with("error: Step budget exceeded: 1000 steps\n"),
        "{}",
        default.stderr
    );
}

/// A server on 127.0.0.1 that answers every request with 401 and an error body; returns
/// its base URL. The thread lives as long as the test process.
fn always_401() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    let port = listener.local_addr().expect("local address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let _ = answer_401(stream);
        }
    });
    format!("http://127.0.0.1:{port}")
}

fn answer_401(stream: std::net::TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    // Read the whole request, so closing the socket never resets it under the client.
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let answer = r#"{"error": {"message": "Incorrect API key provided: sk-test", "type": "invalid_request_error"}}"#;
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
        answer.len()
    )?;
    stream.flush()
}

#[test]
fn a_retry_loop_against_a_server_answering_401_ends_at_the_step_budget_and_shows_the_401() {
    let dir = scratch("runaway-401");
    let agent = write(&dir, "haiku.apl", HAIKU);
    let base = always_401();
    let out = crate::harness::aplc_in(
        &["run", &agent, "--base-url", &base, "--timeout", "60000"],
        runaway_caps(),
        None,
        &[("OPENAI_API_KEY", "sk-test"), ("NO_PROXY", "*")],
    );
    out.assert_clean_exit();
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("Step budget exceeded: 1000 steps"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("401"), "{}", out.stderr);
    assert!(
        out.stderr.contains("Incorrect API key provided"),
        "{}",
        out.stderr
    );
}

/// F14: the run times out while the second tool of a batch runs. The first one ran (its
/// side effect is in the file system), so its result must be in the final context.
#[test]
fn a_timeout_in_the_middle_of_a_tool_batch_keeps_the_calls_that_ran() {
    let dir = scratch("runaway-tools");
    let agent = write(&dir, "tools.apl", "# prompt: a\nuse the tools\n");
    let marker = dir.join("ran.txt");
    let tool = |name: &str, script: &str| {
        serde_json::json!({
            "command": ["sh", "-c", script],
            "timeout_ms": 20000,
            "descriptor": {"name": name, "parameters": {"type": "object"}}
        })
    };
    let manifest = serde_json::json!({
        "mark": tool("mark", &format!("echo ran >> '{}'; echo '\"marked\"'", marker.display())),
        "slow": tool("slow", "sleep 10; echo '\"late\"'"),
    });
    let tools = write(&dir, "tools.json", manifest.to_string());
    let call = |id: &str, name: &str| serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}});
    let mock = serde_json::json!([
        {"tool_calls": [call("1", "mark"), call("2", "slow"), call("3", "mark")]}
    ]);
    let mock = write(&dir, "mock.json", mock.to_string());
    let out = aplc(
        &[
            "run",
            &agent,
            "--mock",
            &mock,
            "--tools",
            &tools,
            "--timeout",
            "1500",
            "--json",
        ],
        runaway_caps(),
    );
    out.assert_clean_exit();
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("Run timeout"), "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "ran\n",
        "the first call ran once and the third never"
    );
    let context: serde_json::Value = serde_json::from_str(&out.stdout).expect("--json output");
    let results = context["result_tool_calls"].as_array().expect("a list");
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(results[0]["content"], "marked");
    assert_eq!(results[0]["with_error"], false);
    assert_eq!(results[1]["with_error"], true);
    assert_eq!(results[2]["with_error"], true);
    assert_eq!(context["errors"].as_array().map(Vec::len), Some(2));
}

/// F9: the input limit is enforced while reading, so an endless input is cut at 64 MiB
/// instead of filling memory.
#[test]
fn endless_inputs_are_cut_at_the_input_limit() {
    let caps = Caps {
        memory: 768 << 20,
        time: Duration::from_secs(20),
    };
    for command in ["check", "run", "inspect"] {
        let out = aplc(&[command, "/dev/zero"], caps);
        out.assert_clean_exit();
        assert_eq!(out.code, Some(2), "{command}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("the input is longer than 67108864 bytes"),
            "{command}: {}",
            out.stderr
        );
    }

    // A FIFO that a writer feeds forever.
    let dir = scratch("runaway-fifo");
    let fifo = dir.join("endless.apl");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let path = fifo.clone();
    let writer = std::thread::spawn(move || {
        // Opening blocks until aplc opens the other end; writing fails once it closes it.
        let Ok(mut pipe) = std::fs::OpenOptions::new().write(true).open(&path) else {
            return;
        };
        let chunk = vec![b'x'; 1 << 16];
        while pipe.write_all(&chunk).is_ok() {}
    });
    let out = aplc(&["check", &fifo.to_string_lossy()], caps);
    out.assert_clean_exit();
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("the input is longer than 67108864 bytes"),
        "{}",
        out.stderr
    );
    writer
        .join()
        .expect("the writer ends when aplc closes the FIFO");
}

const SMALL: &str = "# prompt: a\nhi\n";

/// F15: `build` never writes its bundle over its own source, however the output path
/// reaches it.
#[test]
fn build_refuses_to_overwrite_its_source() {
    let dir = scratch("runaway-build-self");
    let source = write(&dir, "a.apl", SMALL);
    let symlink = dir.join("link.apl");
    std::os::unix::fs::symlink(&source, &symlink).expect("symlink");
    let hard = dir.join("hard.apl");
    std::fs::hard_link(&source, &hard).expect("hard link");
    let dotted = dir.join(".").join("a.apl");
    for output in [
        source.clone(),
        symlink.to_string_lossy().into_owned(),
        hard.to_string_lossy().into_owned(),
        dotted.to_string_lossy().into_owned(),
    ] {
        let out = aplc(&["build", &source, "-o", &output], Caps::default());
        out.assert_clean_exit();
        assert_eq!(out.code, Some(2), "-o {output}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("refusing to write the bundle over its source"),
            "{}",
            out.stderr
        );
        assert_eq!(std::fs::read_to_string(&source).expect("source"), SMALL);
    }
    // Another path is fine, and a symlink to an existing bundle is written through.
    let bundle = dir.join("a.aplb");
    let out = aplc(
        &["build", &source, "-o", &bundle.to_string_lossy()],
        Caps::default(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let to_bundle = dir.join("bundle-link");
    std::os::unix::fs::symlink(&bundle, &to_bundle).expect("symlink");
    let out = aplc(
        &["build", &source, "-o", &to_bundle.to_string_lossy()],
        Caps::default(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        std::fs::symlink_metadata(&to_bundle)
            .expect("link")
            .file_type()
            .is_symlink()
    );
}

/// F15: a write that fails half-way (here: the file-size limit, as on a full disk)
/// leaves the existing bundle as it was, and leaves no temporary file behind.
#[test]
fn a_failed_build_write_keeps_the_old_bundle() {
    let dir = scratch("runaway-build-fail");
    // A template of 200 KB makes a bundle far over the 64 KiB file-size limit below.
    let big = format!("# prompt: a\n{}\n", "lorem ipsum ".repeat(200_000 / 12));
    let source = write(&dir, "big.apl", big);
    let old = write(&dir, "out.aplb", "the old bundle");
    let mut command = Command::new(env!("CARGO_BIN_EXE_aplc"));
    command
        .args(["build", &source, "-o", &old])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: `setrlimit` and `signal` are async-signal-safe; nothing is allocated.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64 << 10,
                rlim_max: 64 << 10,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Writing past the limit then fails with EFBIG instead of killing aplc.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = command.output().expect("aplc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&old).expect("old bundle"),
        "the old bundle"
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("scratch dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// Fails unless `text` is free of raw terminal control (ESC, CSI, CR, bidi overrides).
#[track_caller]
fn assert_no_raw_control(what: &str, text: &str) {
    let raw = text.chars().find(|&c| {
        (c.is_control() && c != '\n' && c != '\t') || ('\u{202A}'..='\u{202E}').contains(&c)
    });
    assert!(raw.is_none(), "{what}: raw {raw:?} in\n{text}");
}

/// F18: escape sequences in step names, template text, provider errors and the file name
/// reach no human-readable output raw.
#[test]
fn terminal_escapes_are_escaped_in_human_readable_output() {
    let esc = "\u{1b}]0;pwned\u{7}\u{1b}[2J";
    let dir = scratch("runaway-escapes");
    // Template text with escapes, a jump to an unknown step whose name has escapes, and a
    // template error quoting the bad text. (Step names cannot hold control characters in
    // source; a crafted bundle's can, and `inspect` escapes its whole listing.)
    let agent = format!(
        "# prompt: a\nhello {esc} {{{{ 1 + }}}}\n# post: a\n{{{{ set_context('next_step', 'x{esc}') }}}}\n"
    );
    let source = write(&dir, &format!("evil{esc}.apl"), &agent);
    let check = aplc(&["check", &source], Caps::default());
    check.assert_clean_exit();
    assert_no_raw_control("check stderr", &check.stderr);
    assert_no_raw_control("check stdout", &check.stdout);
    assert!(check.stderr.contains("\\u{1b}"), "{}", check.stderr);

    let valid = format!(
        "# prompt: a\nhello {esc}\n# post: a\n{{{{ set_context('next_step', 'x{esc}') }}}}\n"
    );
    let source = write(&dir, &format!("run{esc}.apl"), &valid);
    let mock = serde_json::json!([{ "error": format!("bad {esc} key") }]);
    let mock = write(&dir, "mock.json", mock.to_string());
    let run = aplc(&["run", &source, "--mock", &mock], Caps::default());
    run.assert_clean_exit();
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("Unknown step"), "{}", run.stderr);
    assert_no_raw_control("run stderr", &run.stderr);

    // The step budget's message quotes the provider's error, escapes and all.
    let looping =
        format!("# prompt: a\nhello {esc}\n# post: a\n{{{{ set_context('next_step', 'a') }}}}\n");
    let source = write(&dir, "loop.apl", &looping);
    let errors = serde_json::json!([
        { "error": format!("bad {esc} key") },
        { "error": format!("bad {esc} key") },
        { "error": format!("bad {esc} key") }
    ]);
    let errors = write(&dir, "errors.json", errors.to_string());
    let run = aplc(
        &["run", &source, "--mock", &errors, "--max-steps", "3"],
        Caps::default(),
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("Step budget exceeded: 3 steps (last errors in step `a`: provider error: bad \\u{1b}]0;pwned"),
        "{}",
        run.stderr
    );
    assert_no_raw_control("run stderr", &run.stderr);

    let bundle = dir.join("evil.aplb").to_string_lossy().into_owned();
    let built = aplc(&["build", &source, "-o", &bundle], Caps::default());
    assert_eq!(built.code, Some(0), "{}", built.stderr);
    let inspect = aplc(&["inspect", &bundle], Caps::default());
    assert_eq!(inspect.code, Some(0), "{}", inspect.stderr);
    assert_no_raw_control("inspect stdout", &inspect.stdout);
    for format in ["dot", "mermaid"] {
        let graph = aplc(&["graph", &source, "--format", format], Caps::default());
        assert_eq!(graph.code, Some(0), "{}", graph.stderr);
        assert_no_raw_control("graph stdout", &graph.stdout);
        assert_no_raw_control("graph stderr", &graph.stderr);
    }
}

/// F20: a `--context` file with a key twice is refused instead of silently running with
/// the last value.
#[test]
fn duplicate_context_keys_are_refused() {
    let dir = scratch("runaway-context");
    let agent = write(&dir, "a.apl", "# prompt: a\n{{ topic }}\n");
    let mock = write(&dir, "mock.json", r#"["ok"]"#);
    let context = write(&dir, "ctx.json", r#"{"topic": "cats", "topic": "dogs"}"#);
    let out = aplc(
        &["run", &agent, "--mock", &mock, "--context", &context],
        Caps::default(),
    );
    out.assert_clean_exit();
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("duplicate key `topic`"),
        "{}",
        out.stderr
    );
    let nested = write(&dir, "nested.json", r#"{"topic": {"a": 1, "a": 2}}"#);
    let out = aplc(
        &["run", &agent, "--mock", &mock, "--context", &nested],
        Caps::default(),
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("duplicate key `a`"), "{}", out.stderr);
    let fine = write(
        &dir,
        "fine.json",
        r#"{"topic": "cats", "other": {"topic": 1}}"#,
    );
    let out = aplc(
        &["run", &agent, "--mock", &mock, "--context", &fine],
        Caps::default(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "ok\n");
}
