//! The `aplc` binary as a child process, for the tests that drive it through its command
//! line: the repository root, scratch directories, a command with a clean environment,
//! and the checks on how it ended.
//!
//! [`aplc!`](crate::aplc) and [`scratch_in!`](crate::scratch_in) are macros: the binary's
//! path and the scratch root are known to the test crate that calls them
//! (`CARGO_BIN_EXE_aplc`, `CARGO_TARGET_TMPDIR`), not to this one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository's root (fixtures live below it): this crate's parent directory.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A scratch directory `group/name` for one test under the calling test crate's
/// `CARGO_TARGET_TMPDIR`, emptied first: [`scratch_dir`] there.
#[macro_export]
macro_rules! scratch_in {
    ($group:expr, $name:expr $(,)?) => {
        $crate::process::scratch_dir(
            ::std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
            $group,
            $name,
        )
    };
}

/// `aplc ARGS` in `dir` with the calling test crate's `aplc` binary
/// (`CARGO_BIN_EXE_aplc`): [`command`] with that binary.
#[macro_export]
macro_rules! aplc {
    ($dir:expr, $args:expr $(,)?) => {
        $crate::process::command(
            ::std::path::Path::new(env!("CARGO_BIN_EXE_aplc")),
            $dir,
            $args,
        )
    };
}

/// A scratch directory `group/name` below `tmp` for one test, emptied first (made
/// writable again first: a failed run may have left it read-only).
pub fn scratch_dir(tmp: &Path, group: &str, name: &str) -> PathBuf {
    let dir = tmp.join(group).join(name);
    if dir.exists() {
        let _ = Command::new("chmod").args(["-R", "u+w"]).arg(&dir).status();
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// `BINARY ARGS` (the `aplc` binary) in `dir`, with no store or key from the test's own
/// environment.
pub fn command(binary: &Path, dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary);
    command
        .current_dir(dir)
        .args(args)
        .env_remove("APLC_STORE")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null());
    command
}

/// Runs `command`, which must succeed; its output.
#[track_caller]
pub fn succeed(command: &mut Command) -> Output {
    let output = command.output().expect("run aplc");
    assert!(
        output.status.success(),
        "aplc failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The final context `aplc run --json` (or `resume --json`) printed, without the fields
/// that measure time (`time_elapsed`, `time_elapsed_global`, at any depth): what two runs
/// given the same answers agree on.
#[track_caller]
pub fn final_context(output: &Output) -> serde_json::Value {
    let mut json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "--json prints the context ({e}); stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    strip_times(&mut json);
    json
}

/// Removes `time_elapsed` and `time_elapsed_global` from `json`, at any depth.
pub fn strip_times(json: &mut serde_json::Value) {
    match json {
        serde_json::Value::Object(map) => {
            map.remove("time_elapsed");
            map.remove("time_elapsed_global");
            map.values_mut().for_each(strip_times);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_times),
        _ => {}
    }
}

/// Runs `command`, which must fail; its exit code and stderr.
#[track_caller]
pub fn fail(command: &mut Command) -> (Option<i32>, String) {
    let output = command.output().expect("run aplc");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "aplc succeeded:\n{stderr}");
    (output.status.code(), stderr)
}

/// Waits until `ready` holds, polling every 10 ms, or fails the test once `within` has
/// passed.
#[track_caller]
pub fn wait_for(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILL: no handler, no flush, no goodbye. The process must not have succeeded.
#[track_caller]
pub fn kill9(mut child: Child) {
    child.kill().expect("SIGKILL aplc");
    let status = child.wait().expect("reap aplc");
    assert!(!status.success(), "aplc was killed, yet it succeeded");
}

/// `aplc trace`'s and `--verbose`'s text with its times made stable for a snapshot: every
/// number followed by ` ms` or ` s` (a line's leading time, a duration) becomes `[t]`,
/// and each line's leading spaces go.
pub fn without_times(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        let mut kept = Vec::new();
        let mut i = 0;
        while i < words.len() {
            let unit = words.get(i + 1).map(|w| w.trim_end_matches(','));
            if words[i].parse::<f64>().is_ok() && matches!(unit, Some("ms" | "s")) {
                kept.push(words[i + 1].replace(unit.unwrap_or_default(), "[t]"));
                i += 2;
            } else {
                kept.push(words[i].to_string());
                i += 1;
            }
        }
        out.push_str(kept.join(" ").trim_start());
        out.push('\n');
    }
    out
}
