//! The PostgreSQL store's schema: its migrations, and the check on open that the
//! database is an aplc store (or holds none of its tables) before it is migrated.

use tokio_postgres::Client;

use super::db_error;
use crate::store::{MAGIC, SCHEMA_VERSION, StoreError};

/// Migrations, by the version they lead to.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE aplc_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
     CREATE TABLE bundles (hash TEXT PRIMARY KEY, bytes BYTEA NOT NULL);
     CREATE TABLE runs (
         id TEXT PRIMARY KEY,
         agent TEXT NOT NULL,
         bundle_hash TEXT NOT NULL,
         state TEXT NOT NULL,
         steps BIGINT NOT NULL,
         started_at_ms BIGINT NOT NULL,
         updated_at_ms BIGINT NOT NULL,
         options TEXT NOT NULL,
         outcome TEXT,
         input_count BIGINT NOT NULL,
         event_count BIGINT NOT NULL
     );
     CREATE INDEX runs_by_start ON runs (started_at_ms DESC, id DESC);
     CREATE TABLE inputs (
         run_id TEXT NOT NULL, seq BIGINT NOT NULL, bytes BYTEA NOT NULL,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE events (
         run_id TEXT NOT NULL, seq BIGINT NOT NULL, json TEXT NOT NULL,
         PRIMARY KEY (run_id, seq)
     );
     CREATE TABLE checkpoints (
         run_id TEXT NOT NULL, seq BIGINT NOT NULL, inputs BIGINT NOT NULL,
         history_start BIGINT NOT NULL, history BYTEA NOT NULL, state BYTEA,
         PRIMARY KEY (run_id, seq)
     );",
    ),
    (
        2,
        // The service's queue (spec/serve.md), as in SQLite's version 2.
        "CREATE TABLE run_queue (
         run_id TEXT PRIMARY KEY,
         agent TEXT NOT NULL,
         enqueued_at_ms BIGINT NOT NULL,
         claimed BOOLEAN NOT NULL DEFAULT FALSE,
         final_status TEXT,
         cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
         traceparent TEXT
     );
     CREATE INDEX run_queue_open ON run_queue (enqueued_at_ms, run_id)
         WHERE final_status IS NULL;
     CREATE TABLE idempotency_keys (
         agent TEXT NOT NULL,
         key TEXT NOT NULL,
         run_id TEXT NOT NULL,
         created_at_ms BIGINT NOT NULL,
         PRIMARY KEY (agent, key)
     );",
    ),
    (
        3,
        // Several entries per journal row, as in SQLite's version 3. A constant default
        // rewrites no row (PostgreSQL 11 and later).
        "ALTER TABLE inputs ADD COLUMN n BIGINT NOT NULL DEFAULT 1;
     ALTER TABLE events ADD COLUMN n BIGINT NOT NULL DEFAULT 1;",
    ),
    (
        4,
        // People in the loop (spec/human.md): as SQLite's version 4. `n` orders answers
        // as they were stored. The claims' indexes leave waiting runs out (`CLAIM_NEW`)
        // or hold only them (`CLAIM_ABANDONED`'s woken runs).
        "ALTER TABLE runs ADD COLUMN pending TEXT;
     CREATE TABLE answers (
         run_id TEXT NOT NULL,
         request_id TEXT NOT NULL,
         answer TEXT NOT NULL,
         stored_at_ms BIGINT NOT NULL,
         n BIGSERIAL,
         PRIMARY KEY (run_id, request_id)
     );
     ALTER TABLE run_queue ADD COLUMN waiting BOOLEAN NOT NULL DEFAULT FALSE;
     ALTER TABLE run_queue ADD COLUMN wake_at_ms BIGINT;
     CREATE INDEX run_queue_ready ON run_queue (enqueued_at_ms, run_id)
         WHERE final_status IS NULL AND NOT waiting;
     CREATE INDEX run_queue_wake ON run_queue (wake_at_ms)
         WHERE final_status IS NULL AND waiting;",
    ),
];

/// The tables of every version: a database holding any of them without `aplc_meta` is
/// not ours.
const TABLES: &[&str] = &[
    "aplc_meta",
    "bundles",
    "runs",
    "inputs",
    "events",
    "checkpoints",
    "run_queue",
    "idempotency_keys",
    "answers",
];

/// The advisory lock (transaction-level) that serializes migrations between processes.
const MIGRATION_LOCK: i64 = 0x6170_6c63_0000_0001;

/// Checks that the database is an aplc store or holds none of its tables, and migrates it,
/// in one transaction serialized against other processes by an advisory lock.
pub(super) async fn migrate(url: &str, client: &mut Client) -> Result<(), StoreError> {
    let error = |e: tokio_postgres::Error| db_error(url, &e);
    let tx = client.transaction().await.map_err(error)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(error)?;
    let present: Vec<String> = tx
        .query(
            "SELECT table_name::TEXT FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_name = ANY($1) ORDER BY 1",
            &[&TABLES],
        )
        .await
        .map_err(error)?
        .into_iter()
        .map(|row| row.get(0))
        .collect();
    let version = if present.iter().any(|t| t == "aplc_meta") {
        stored_version(url, &tx).await?
    } else if present.is_empty() {
        0
    } else {
        return Err(StoreError::Foreign(format!(
            "the database has tables named like an aplc store's ({}) but no `aplc_meta`",
            present.join(", ")
        )));
    };
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version == SCHEMA_VERSION {
        return tx.commit().await.map_err(error);
    }
    for (_, sql) in MIGRATIONS.iter().filter(|(to, _)| *to > version) {
        tx.batch_execute(sql).await.map_err(error)?;
    }
    tx.execute(
        "INSERT INTO aplc_meta (key, value) VALUES ('magic', $1), ('schema_version', $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&MAGIC, &SCHEMA_VERSION.to_string()],
    )
    .await
    .map_err(error)?;
    tx.commit().await.map_err(error)
}

/// The schema version recorded in `aplc_meta`, after checking its magic.
async fn stored_version(
    url: &str,
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<i64, StoreError> {
    let rows = tx
        .query(
            "SELECT key, value FROM aplc_meta WHERE key IN ('magic', 'schema_version')",
            &[],
        )
        .await
        .map_err(|e| {
            // An `aplc_meta` of another shape is someone else's table.
            if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_COLUMN) {
                StoreError::Foreign("the database's `aplc_meta` table is not aplc's".into())
            } else {
                db_error(url, &e)
            }
        })?;
    // `try_get`: a table of another shape must be an error, not a panic.
    let value = |key: &str| {
        rows.iter()
            .find(|row| row.try_get::<_, String>(0).is_ok_and(|k| k == key))
            .and_then(|row| row.try_get::<_, String>(1).ok())
    };
    if value("magic").as_deref() != Some(MAGIC) {
        return Err(StoreError::Foreign(
            "the database's `aplc_meta` table does not mark an aplc store".into(),
        ));
    }
    let version = value("schema_version").unwrap_or_default();
    version
        .parse()
        .map_err(|_| StoreError::Corrupt(format!("schema version `{version}` is not a number")))
}
