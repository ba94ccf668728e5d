//! Opening a SQLite file: what it must be (a regular file, SQLite, an aplc store or
//! empty), the connection's settings, the read-only connection, and the migrations.

use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::{BUSY_TIMEOUT, db_error, open_failure};
use crate::store::{MAGIC, SCHEMA_VERSION, StoreError};

/// `PRAGMA application_id` of an aplc store: "aplc" in ASCII.
const APPLICATION_ID: i64 = 0x6170_6c63;

/// Migrations, by the version they lead to. Version 1 is the first schema.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE aplc_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
     CREATE TABLE bundles (hash TEXT PRIMARY KEY, bytes BLOB NOT NULL);
     CREATE TABLE runs (
         id TEXT PRIMARY KEY,
         agent TEXT NOT NULL,
         bundle_hash TEXT NOT NULL,
         state TEXT NOT NULL,
         steps INTEGER NOT NULL,
         started_at_ms INTEGER NOT NULL,
         updated_at_ms INTEGER NOT NULL,
         options TEXT NOT NULL,
         outcome TEXT,
         input_count INTEGER NOT NULL,
         event_count INTEGER NOT NULL
     );
     CREATE INDEX runs_by_start ON runs (started_at_ms DESC, id DESC);
     CREATE TABLE inputs (
         run_id TEXT NOT NULL, seq INTEGER NOT NULL, bytes BLOB NOT NULL,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE events (
         run_id TEXT NOT NULL, seq INTEGER NOT NULL, json TEXT NOT NULL,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE checkpoints (
         run_id TEXT NOT NULL, seq INTEGER NOT NULL, inputs INTEGER NOT NULL,
         history_start INTEGER NOT NULL, history BLOB NOT NULL, state BLOB,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE leases (run_id TEXT PRIMARY KEY, holder TEXT NOT NULL);",
    ),
    (
        2,
        // The service's queue (spec/serve.md). `final_status` is set by the append that
        // finishes the run (NULL while it is open), so claims scan open runs only and
        // counts read no outcome.
        "CREATE TABLE run_queue (
         run_id TEXT PRIMARY KEY,
         agent TEXT NOT NULL,
         enqueued_at_ms INTEGER NOT NULL,
         claimed INTEGER NOT NULL DEFAULT 0,
         final_status TEXT,
         cancel_requested INTEGER NOT NULL DEFAULT 0,
         traceparent TEXT
     );
     CREATE INDEX run_queue_open ON run_queue (final_status, enqueued_at_ms, run_id);
     CREATE TABLE idempotency_keys (
         agent TEXT NOT NULL,
         key TEXT NOT NULL,
         run_id TEXT NOT NULL,
         created_at_ms INTEGER NOT NULL,
         PRIMARY KEY (agent, key)
     );",
    ),
    (
        3,
        // Several consecutive entries per journal row (`store/rows.rs`): `seq` is the
        // first one's number, `n` their count. The rows written before hold one entry
        // each, as the default says, so none is rewritten.
        "ALTER TABLE inputs ADD COLUMN n INTEGER NOT NULL DEFAULT 1;
     ALTER TABLE events ADD COLUMN n INTEGER NOT NULL DEFAULT 1;",
    ),
    (
        4,
        // People in the loop (spec/human.md): the requests a run waits on, the answers
        // given (the first per request wins: the primary key), and in the queue whether
        // a run waits (not claimable) and when its first open request times out. The
        // claims read two indexes (`queue.rs`), so that runs waiting for days, however
        // many, are not walked by every claim.
        "ALTER TABLE runs ADD COLUMN pending TEXT;
     CREATE TABLE answers (
         run_id TEXT NOT NULL,
         request_id TEXT NOT NULL,
         answer TEXT NOT NULL,
         stored_at_ms INTEGER NOT NULL,
         PRIMARY KEY (run_id, request_id)
     );
     ALTER TABLE run_queue ADD COLUMN waiting INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE run_queue ADD COLUMN wake_at_ms INTEGER;
     CREATE INDEX run_queue_ready ON run_queue (waiting, claimed, enqueued_at_ms, run_id)
         WHERE final_status IS NULL;
     CREATE INDEX run_queue_wake ON run_queue (waiting, wake_at_ms)
         WHERE final_status IS NULL;",
    ),
];

/// Lets a read-only connection to a store older than version 4 read as a new one: it
/// cannot be migrated, so temporary objects stand in for what is missing (a temporary
/// view shadows the table of the same name).
pub(super) fn read_as_current(conn: &Connection, version: i64) -> Result<(), StoreError> {
    if version >= 4 {
        return Ok(());
    }
    conn.execute_batch(
        "CREATE TEMP VIEW runs AS SELECT *, NULL AS pending FROM main.runs;
         CREATE TEMP TABLE answers (run_id TEXT, request_id TEXT, answer TEXT,
                                    stored_at_ms INTEGER);",
    )
    .map_err(db_error)?;
    if version >= 2 {
        // The queue came with version 2: its runs read as not waiting.
        conn.execute_batch(
            "CREATE TEMP VIEW run_queue AS
             SELECT *, 0 AS waiting, NULL AS wake_at_ms FROM main.run_queue;",
        )
        .map_err(db_error)?;
    }
    Ok(())
}

/// Refuses a path that names something other than a regular file (a device such as
/// `/dev/null`, a directory, a FIFO) before SQLite opens it: SQLite would create its
/// journal and this store its lock directory beside it. A missing file is a new store.
pub(super) fn check_file(path: &Path) -> Result<(), StoreError> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(StoreError::Open(format!(
            "{} is not a regular file",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// Opens a connection with the store's settings.
///
/// The file is identified before anything is written to it: switching a foreign
/// database to WAL mode would rewrite its header and leave it in WAL mode.
pub(super) fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(|e| open_failure(path, &e))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(db_error)?;
    // The first read of the file: a file that is not SQLite fails here, another
    // application's database a line below.
    identify(&conn)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(db_error)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Open(format!(
            "{}: cannot switch to WAL mode (got `{mode}`)",
            path.display()
        )));
    }
    // See the module's doc: a killed process loses nothing, an OS crash may lose the last
    // commits.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(db_error)?;
    Ok(conn)
}

/// Opens a read-only connection that writes nothing, not even SQLite's shared-memory
/// files: `immutable` when the file has no WAL file beside it (no writer has it open, or
/// one is about to start: a read may then fail, never write), plain `mode=ro` when it has
/// one (a writer may be at work: its WAL holds the newest commits). With the connection,
/// the file's schema version: an older store is read as it is, not migrated.
pub(super) fn connect_read_only(path: &Path) -> Result<(Connection, i64), StoreError> {
    if !path.exists() {
        return empty_store();
    }
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let absolute = std::path::absolute(path)
        .map_err(|e| StoreError::Open(format!("{}: {e}", path.display())))?;
    let query = if Path::new(&wal).exists() {
        "mode=ro"
    } else {
        "mode=ro&immutable=1"
    };
    let uri = format!("file:{}?{query}", uri_path(&absolute));
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(&uri, flags).map_err(|e| open_failure(path, &e))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(db_error)?;
    let (app_id, version) = identify(&conn)?;
    if app_id != APPLICATION_ID {
        // `identify` refused every foreign file: this one is empty.
        return empty_store();
    }
    check_meta(&conn, version)?;
    Ok((conn, version))
}

/// A store with nothing in it yet, in memory: what a missing or empty file reads as.
fn empty_store() -> Result<(Connection, i64), StoreError> {
    let conn = Connection::open_in_memory().map_err(db_error)?;
    migrate(&conn)?;
    Ok((conn, SCHEMA_VERSION))
}

/// `path` for a SQLite URI: every byte but letters, digits and `/-_.~` percent-encoded
/// (`?`, `#` and `%` would otherwise end or escape the path).
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for &byte in path.as_os_str().as_encoded_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-_.~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Checks that the file is an aplc store (or empty), and brings its schema up to date.
pub(super) fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let (app_id, version) = identify(conn)?;
    if app_id == APPLICATION_ID && version == SCHEMA_VERSION {
        return check_meta(conn, version);
    }
    // Immediate: two processes creating the same new file do not both migrate it.
    conn.execute_batch("BEGIN IMMEDIATE").map_err(db_error)?;
    let result = (|| {
        let (app_id, version) = identify(conn)?;
        if app_id == APPLICATION_ID {
            check_meta(conn, version)?;
        }
        for (to, sql) in MIGRATIONS.iter().filter(|(to, _)| *to > version) {
            conn.execute_batch(sql).map_err(db_error)?;
            conn.pragma_update(None, "user_version", to)
                .map_err(db_error)?;
        }
        conn.execute(
            "INSERT INTO aplc_meta (key, value) VALUES ('magic', ?1), ('schema_version', ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![MAGIC, SCHEMA_VERSION.to_string()],
        )
        .map_err(db_error)?;
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(db_error)?;
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT").map_err(db_error),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The file's application id and schema version, read without writing anything. Another
/// application's database (an id of its own, or tables without aplc's id) and a newer
/// schema are refused here.
fn identify(conn: &Connection) -> Result<(i64, i64), StoreError> {
    // One statement, so one snapshot: read apart, the id could predate another
    // process's creation of the schema and the tables follow it.
    let (app_id, version, tables): (i64, i64, Option<String>) = conn
        .query_row(
            "SELECT (SELECT application_id FROM pragma_application_id()),
                    (SELECT user_version FROM pragma_user_version()),
                    (SELECT group_concat(name, ', ') FROM
                       (SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name))",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .map_err(db_error)?;
    if app_id == APPLICATION_ID {
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        return Ok((app_id, version));
    }
    if app_id != 0 || tables.is_some() {
        return Err(StoreError::Foreign(format!(
            "a SQLite database of another application (application_id {app_id}, tables: {})",
            tables.as_deref().unwrap_or("none")
        )));
    }
    Ok((app_id, version))
}

/// The `aplc_meta` table agrees with the pragmas: its magic marks an aplc store, and its
/// schema version is `PRAGMA user_version` (the PostgreSQL store reads the same row).
fn check_meta(conn: &Connection, version: i64) -> Result<(), StoreError> {
    let meta = |key: &str| -> Result<Option<String>, StoreError> {
        conn.query_row(
            "SELECT value FROM aplc_meta WHERE key = ?1",
            params![key],
            |row| row.get(0),
        )
        .optional()
        .map_err(db_error)
    };
    if meta("magic")?.as_deref() != Some(MAGIC) {
        return Err(StoreError::Corrupt(
            "the file is marked as an aplc store but its `aplc_meta` table is not".into(),
        ));
    }
    let recorded = meta("schema_version")?.unwrap_or_default();
    if recorded.parse::<i64>().ok() != Some(version) {
        return Err(StoreError::Corrupt(format!(
            "the schema version in `aplc_meta` (`{}`) is not the file's user_version ({version})",
            recorded.escape_debug()
        )));
    }
    Ok(())
}
