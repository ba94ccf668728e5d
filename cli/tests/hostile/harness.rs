//! Runs the `aplc` binary with an address-space cap and a wall-clock cap.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a capped run of `aplc` did.
#[derive(Debug)]
pub struct Capped {
    /// The exit code; `None` when a signal ended it (or the harness killed it).
    pub code: Option<i32>,
    /// The signal that ended the process, if one did.
    pub signal: Option<i32>,
    /// The harness killed it because it ran past its time cap.
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Capped {
    /// Fails the test unless the process exited by itself, without a signal, within its
    /// caps. A panic exits with 101, so callers also check the code they expect.
    #[track_caller]
    pub fn assert_clean_exit(&self) {
        assert!(
            !self.timed_out,
            "aplc ran past its time cap ({:?})\nstderr:\n{}",
            self.elapsed, self.stderr
        );
        assert!(
            self.signal.is_none(),
            "aplc was killed by signal {:?} (stack overflow, abort or OOM)\nstderr:\n{}",
            self.signal,
            self.stderr
        );
        assert_ne!(self.code, Some(101), "aplc panicked:\n{}", self.stderr);
    }
}

/// Caps for one run.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// `RLIMIT_AS`, in bytes.
    pub memory: u64,
    /// Killed after this long.
    pub time: Duration,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            memory: 2 << 30,
            time: Duration::from_secs(30),
        }
    }
}

/// Runs `aplc ARGS` with `caps`, feeding `stdin` (if any).
pub fn aplc(args: &[&str], caps: Caps) -> Capped {
    aplc_in(args, caps, None, &[])
}

/// Like [`aplc`], with standard input and extra environment variables.
pub fn aplc_in(args: &[&str], caps: Caps, stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Capped {
    let mut command = Command::new(env!("CARGO_BIN_EXE_aplc"));
    command
        .args(args)
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let memory = caps.memory;
    // SAFETY: `setrlimit` is async-signal-safe, and the closure allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: memory,
                rlim_max: memory,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let mut child = command.spawn().expect("aplc starts");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        let input = input.to_vec();
        std::thread::spawn(move || {
            use std::io::Write;
            // The process may exit before reading everything; that is its business.
            let _ = pipe.write_all(&input);
        });
    }
    let out = drain(child.stdout.take().expect("stdout is piped"));
    let err = drain(child.stderr.take().expect("stderr is piped"));
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for aplc") {
            break status;
        }
        if started.elapsed() > caps.time {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait for aplc");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = started.elapsed();
    Capped {
        code: status.code(),
        signal: status.signal(),
        timed_out,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
        elapsed,
    }
}

/// Reads a pipe to the end on a thread, keeping at most 8 MiB (a runaway writer must not
/// exhaust the test process either).
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        const KEEP: usize = 8 << 20;
        let mut kept = Vec::new();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = KEEP.saturating_sub(kept.len());
                    kept.extend_from_slice(&chunk[..n.min(room)]);
                }
            }
        }
        String::from_utf8_lossy(&kept).into_owned()
    })
}

/// A scratch directory unique to one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aplc-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// Writes `contents` to `dir/name` and returns the path as a string.
pub fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write a scratch file");
    path.to_string_lossy().into_owned()
}

/// A path under the repository's `fixtures/`.
pub fn fixture(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(path)
        .to_string_lossy()
        .into_owned()
}

/// The harness itself: a clean run is reported as one, and the caps bite.
#[test]
fn harness_reports_exit_codes_and_enforces_time() {
    let ok = aplc(
        &["check", &fixture("check/spec_1_2_2_simple.apl")],
        Caps::default(),
    );
    ok.assert_clean_exit();
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);

    let dir = scratch("harness");
    let source = write(&dir, "echo.apl", "# prompt: echo\n## user\nhi\n");
    let fed = aplc_in(&["check", "-"], Caps::default(), Some(b"not read"), &[]);
    fed.assert_clean_exit();
    let checked = aplc(&["check", &source], Caps::default());
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);
    assert!(checked.stdout.is_empty(), "{}", checked.stdout);
    let fifo = dir.join("never-written");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    // Reading a FIFO nobody writes blocks forever: the time cap must end it.
    let hung = aplc(
        &["check", &fifo.to_string_lossy()],
        Caps {
            time: Duration::from_millis(300),
            ..Caps::default()
        },
    );
    assert!(hung.timed_out);
    assert!(hung.elapsed < Duration::from_secs(10));
}
