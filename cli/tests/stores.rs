//! SQLite run stores through the command line, the way an unlucky or hostile user meets
//! them (issue #22): another application's database, a read-only store, `/dev/null`, a
//! schema record that disagrees, a bundle changed in the store, many processes starting
//! runs on one new file at once. Every check uses real files and real `aplc` processes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use aplc_test_support::process::{fail, root, succeed};
use aplc_test_support::{aplc, scratch_in};

/// A scratch directory for one test, emptied first.
fn scratch(name: &str) -> PathBuf {
    scratch_in!("stores", name)
}

/// `aplc run` of a scripted agent (no model) with `extra` flags: three steps.
fn mock_run(dir: &Path, extra: &[&str]) -> Command {
    let agent = root().join("fixtures/run/loop_by_runs.apl");
    let mock = root().join("fixtures/run/loop_by_runs.mock.json");
    let (agent, mock) = (agent.display().to_string(), mock.display().to_string());
    let mut args = vec!["run", agent.as_str(), "--mock", mock.as_str(), "--quiet"];
    args.extend_from_slice(extra);
    aplc!(dir, &args)
}

/// Every file and directory under `dir`: a hash of its bytes (0 for a directory), its
/// length and modification time.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, u64, std::time::SystemTime)> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("metadata");
        let bytes = if meta.is_dir() {
            todo.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            0
        } else {
            xxhash_rust::xxh3::xxh3_64(&std::fs::read(&path).expect("read"))
        };
        files.insert(path, (bytes, meta.len(), meta.modified().unwrap()));
    }
    files
}

/// R10: another application's database is refused before anything is written to it: it
/// stays in rollback-journal mode, byte for byte, with nothing beside it.
#[test]
fn a_foreign_sqlite_file_is_refused_before_anything_is_written() {
    let dir = scratch("foreign");
    let db = dir.join("app.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO accounts (name) VALUES ('ada'), ('grace');",
        )
        .unwrap();
    }
    let before = snapshot(&dir);
    let store = format!("sqlite:{}", db.display());
    let (code, stderr) = fail(&mut mock_run(&dir, &["--store", &store]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("not an aplc run store"), "{stderr}");
    assert!(stderr.contains("accounts"), "{stderr}");
    assert_eq!(
        snapshot(&dir),
        before,
        "the foreign file or its directory changed"
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
}

/// A store with one finished run `done`, at `dir/runs.db`.
fn store_with_a_run(dir: &Path) -> String {
    let store = format!("sqlite:{}", dir.join("runs.db").display());
    succeed(&mut mock_run(dir, &["--store", &store, "--run-id", "done"]));
    store
}

/// R11: `aplc runs list|show|events` read a read-only store and write nothing to it or
/// beside it. (Tests run as root, whom modes do not stop: the check is that no byte, no
/// modification time and no directory entry changed.)
#[test]
fn a_read_only_store_is_inspected_without_a_write() {
    let dir = scratch("read-only");
    let store = store_with_a_run(&dir);
    let inspect = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--store", &store]);
        let output = succeed(&mut aplc!(&dir, &all));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    // Modes as a careful operator sets them: a 0444 file in a 0555 directory.
    let locks = dir.join("runs.db.locks");
    for (path, mode) in [
        (dir.join("runs.db"), "0444"),
        (locks, "0555"),
        (dir.clone(), "0555"),
    ] {
        let status = Command::new("chmod").arg(mode).arg(&path).status().unwrap();
        assert!(status.success());
    }
    let before = snapshot(&dir);
    assert!(inspect(&["runs", "list"]).contains("done"));
    assert!(inspect(&["runs", "show", "done"]).contains("steps:"));
    assert!(inspect(&["runs", "show", "done", "--json"]).contains("context_history"));
    assert!(inspect(&["runs", "events", "done"]).contains("run_finished"));
    let (code, stderr) = fail(&mut aplc!(
        &dir,
        &["runs", "show", "nope", "--store", &store],
    ));
    assert_eq!(code, Some(2), "{stderr}");
    let after = snapshot(&dir);
    let _ = Command::new("chmod").args(["-R", "u+w"]).arg(&dir).status();
    assert_eq!(after, before, "inspecting the store wrote to it");
}

/// R11: a missing or empty file reads as an empty store, and is left as it was.
#[test]
fn a_missing_or_empty_file_lists_no_runs_and_stays_as_it_was() {
    let dir = scratch("empty");
    std::fs::write(dir.join("empty.db"), b"").unwrap();
    let before = snapshot(&dir);
    for name in ["empty.db", "missing.db"] {
        let store = format!("sqlite:{}", dir.join(name).display());
        let list = succeed(&mut aplc!(&dir, &["runs", "list", "--store", &store]));
        assert_eq!(String::from_utf8_lossy(&list.stdout).lines().count(), 1);
        let (code, stderr) = fail(&mut aplc!(&dir, &["runs", "show", "x", "--store", &store]));
        assert_eq!(code, Some(2), "{stderr}");
    }
    assert_eq!(snapshot(&dir), before);
}

/// R11: a run that was never stored (here: its id is taken) is not offered for resume.
/// A run's row is created by its first commit, while its first provider call is out
/// (issue #24), so an id given with `--run-id` is checked before the run starts: no
/// provider call is made for a run that cannot be stored.
#[test]
fn a_run_that_was_never_stored_is_not_offered_for_resume() {
    let dir = scratch("never-stored");
    let store = store_with_a_run(&dir);
    let (code, stderr) = fail(&mut mock_run(
        &dir,
        &[
            "--store",
            &store,
            "--run-id",
            "done",
            "--events",
            "events.jsonl",
        ],
    ));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("already exists"), "{stderr}");
    assert!(!stderr.contains("aplc resume"), "{stderr}");
    let events = std::fs::read_to_string(dir.join("events.jsonl")).unwrap_or_default();
    assert!(!events.contains("provider_call"), "{events}");
}

/// R11: `sqlite:/dev/null` (or any file that is not a regular file) is refused before
/// SQLite opens it: no `/dev/null-journal`, no `/dev/null.locks`.
#[test]
fn a_device_is_refused_and_nothing_is_made_beside_it() {
    let dir = scratch("dev-null");
    for leftover in ["/dev/null-journal", "/dev/null-wal", "/dev/null-shm"] {
        let _ = std::fs::remove_file(leftover);
    }
    let _ = std::fs::remove_dir_all("/dev/null.locks");
    let (code, stderr) = fail(&mut mock_run(&dir, &["--store", "sqlite:/dev/null"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
    let (_, stderr) = fail(&mut aplc!(
        &dir,
        &["runs", "list", "--store", "sqlite:/dev/null"],
    ));
    assert!(stderr.contains("not a regular file"), "{stderr}");
    for leftover in ["/dev/null-journal", "/dev/null-wal", "/dev/null.locks"] {
        assert!(!Path::new(leftover).exists(), "{leftover} was made");
    }
}

/// R13: the schema version in `aplc_meta` and `PRAGMA user_version` must agree.
#[test]
fn a_schema_record_that_disagrees_is_refused() {
    let dir = scratch("schema-records");
    let store = store_with_a_run(&dir);
    let conn = rusqlite::Connection::open(dir.join("runs.db")).unwrap();
    conn.execute(
        "UPDATE aplc_meta SET value = '1' WHERE key = 'schema_version'",
        [],
    )
    .unwrap();
    drop(conn);
    for command in [
        &mut aplc!(&dir, &["runs", "list", "--store", &store]),
        &mut mock_run(&dir, &["--store", &store]),
    ] {
        let (code, stderr) = fail(command);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("schema version in `aplc_meta`"), "{stderr}");
    }
}

/// R12: a bundle changed in the store, its own checksum recomputed, no longer matches
/// the content hash it is stored under: resuming the run is refused, and so is
/// rebuilding its context.
#[test]
fn a_tampered_bundle_is_refused_on_resume() {
    let dir = scratch("tampered");
    let store = store_with_a_run(&dir);
    let conn = rusqlite::Connection::open(dir.join("runs.db")).unwrap();
    // Made resumable again, as if the process had died before the end.
    conn.execute(
        "UPDATE runs SET state = 'running', outcome = NULL WHERE id = 'done'",
        [],
    )
    .unwrap();
    let mut bundle: Vec<u8> = conn
        .query_row("SELECT bytes FROM bundles", [], |row| row.get(0))
        .unwrap();
    // A prompt's text, rewritten in place; the header's xxh3-64 of the payload
    // (bytes 16..24, the payload after the 24-byte header) recomputed.
    let at = bundle
        .windows(4)
        .position(|w| w == b"Pass")
        .expect("the bundle holds the agent's text");
    bundle[at..at + 4].copy_from_slice(b"PASS");
    let checksum = xxhash_rust::xxh3::xxh3_64(&bundle[24..]);
    bundle[16..24].copy_from_slice(&checksum.to_le_bytes());
    conn.execute("UPDATE bundles SET bytes = ?1", [&bundle])
        .unwrap();
    drop(conn);
    let mock = root().join("fixtures/run/loop_by_runs.mock.json");
    let mock = mock.display().to_string();
    let (code, stderr) = fail(&mut aplc!(
        &dir,
        &[
            "resume", "done", "--store", &store, "--mock", &mock, "--quiet",
        ],
    ));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("does not match its content hash"),
        "{stderr}"
    );
    let (_, stderr) = fail(&mut aplc!(
        &dir,
        &["runs", "show", "done", "--json", "--store", &store],
    ));
    assert!(
        stderr.contains("does not match its content hash"),
        "{stderr}"
    );
}

/// R16: many processes starting runs on one new file at once all succeed: no
/// `database is locked` from the switch to WAL mode, the schema's creation or a write.
/// (On the old code this failed about once in 4,800 starts: a stress test, not a proof.)
#[test]
fn concurrent_starts_on_a_new_file_never_fail() {
    const ROUNDS: usize = 40;
    const PROCESSES: usize = 16;
    let dir = scratch("concurrent");
    for round in 0..ROUNDS {
        let store = format!("sqlite:{}", dir.join(format!("runs-{round}.db")).display());
        let children: Vec<_> = (0..PROCESSES)
            .map(|_| {
                mock_run(&dir, &["--store", &store])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn aplc")
            })
            .collect();
        for child in children {
            let output = child.wait_with_output().expect("wait for aplc");
            assert!(
                output.status.success(),
                "round {round}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let list = succeed(&mut aplc!(&dir, &["runs", "list", "--store", &store]));
        let runs = String::from_utf8_lossy(&list.stdout).lines().count() - 1;
        assert_eq!(runs, PROCESSES, "round {round}");
    }
}
