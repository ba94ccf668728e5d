//! Leases: rows of `leases` naming their holder, an open store, whose liveness is the OS
//! file lock on its holder file in `<db file>.locks/`.

use std::collections::HashSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::oneshot;

use super::{Job, Lessee, SqliteStore, Writer, db_error};
use crate::store::{Lease, StoreError};

/// A lease: a row of `leases` naming this store. Dropping it frees the run in this
/// process at once and deletes the row (queued to the writer, after the run's last append).
#[derive(Debug)]
pub(super) struct SqliteLease {
    pub(super) run_id: String,
    pub(super) holder: Arc<str>,
    pub(super) held: Arc<Mutex<HashSet<String>>>,
    pub(super) writer: Writer,
}

impl Drop for SqliteLease {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.run_id);
        // A closed writer (the store is gone) has nothing to delete: the row names a
        // holder that no longer locks its file, and the next taker takes it over.
        if let Some(writer) = &*self.writer.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = writer.send(Job::Release(
                std::mem::take(&mut self.run_id),
                self.holder.clone(),
            ));
        }
    }
}

impl Lease for SqliteLease {
    fn run_id(&self) -> &str {
        &self.run_id
    }
}

impl SqliteStore {
    /// Takes the lease of run `id` with `job` (a create or an acquire): refused at once
    /// if this store holds it, else by the writer if a live holder does.
    pub(super) async fn lease(
        &self,
        id: &str,
        job: impl FnOnce(Lessee, oneshot::Sender<Result<(), StoreError>>) -> Job,
    ) -> Result<SqliteLease, StoreError> {
        if !self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string())
        {
            return Err(StoreError::Locked(id.to_string()));
        }
        // From here, dropping the lease undoes the insert above (and deletes a row the
        // job may have written).
        let lease = SqliteLease {
            run_id: id.to_string(),
            holder: self.holder.clone(),
            held: self.held.clone(),
            writer: self.writer.clone(),
        };
        let lessee = Lessee {
            holder: self.holder.clone(),
            locks: self.locks.clone(),
        };
        self.write(|reply| job(lessee, reply)).await?;
        Ok(lease)
    }
}

/// Gives `lessee` the lease of run `id`, unless a live holder has it.
pub(super) fn take_lease(tx: &Connection, id: &str, lessee: &Lessee) -> Result<(), StoreError> {
    let holder: Option<String> = tx
        .prepare_cached("SELECT holder FROM leases WHERE run_id = ?1")
        .and_then(|mut s| s.query_row(params![id], |row| row.get(0)).optional())
        .map_err(db_error)?;
    match holder {
        None => {}
        // This store's own row, left by a release that failed: the caller checked that
        // this store does not hold the run (its own holder file is locked, by itself).
        Some(holder) if *holder == *lessee.holder => {}
        Some(holder) if holder_alive(&lessee.locks, &holder) => {
            return Err(StoreError::Locked(id.to_string()));
        }
        // A dead process's lease.
        Some(_) => {}
    }
    tx.prepare_cached("INSERT OR REPLACE INTO leases (run_id, holder) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![id, &*lessee.holder]))
        .map_err(db_error)?;
    Ok(())
}

pub(super) fn release_lease(tx: &Connection, id: &str, holder: &str) -> Result<(), StoreError> {
    tx.prepare_cached("DELETE FROM leases WHERE run_id = ?1 AND holder = ?2")
        .and_then(|mut s| s.execute(params![id, holder]))
        .map_err(db_error)?;
    Ok(())
}

/// True if the store named `holder` is open: its file in `locks` is locked. A name that
/// is not one this code makes (a damaged row) is no live holder's.
pub(super) fn holder_alive(locks: &Path, holder: &str) -> bool {
    if !is_holder_name(holder) {
        return false;
    }
    let Ok(file) = File::open(locks.join(holder)) else {
        return false;
    };
    match file.try_lock() {
        // Nobody holds it: its store is closed or its process dead. (Our lock goes with
        // `file`.)
        Ok(()) => false,
        Err(TryLockError::WouldBlock) => true,
        // Unsure: assume alive rather than take a lease that may be held.
        Err(TryLockError::Error(_)) => true,
    }
}

/// `<pid>-<16 hex digits>.holder`.
fn is_holder_name(name: &str) -> bool {
    name.strip_suffix(".holder").is_some_and(|stem| {
        !stem.is_empty()
            && stem.len() <= 40
            && stem.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    })
}

/// Creates and locks this store's holder file in `locks`, and deletes the files of
/// holders that are gone.
pub(super) fn hold(locks: &Path) -> Result<(Arc<str>, File), StoreError> {
    std::fs::create_dir_all(locks).map_err(|e| {
        StoreError::Open(format!(
            "cannot create the lock directory {}: {e}",
            locks.display()
        ))
    })?;
    if let Ok(entries) = std::fs::read_dir(locks) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            if let Some(name) = name.to_str()
                && is_holder_name(name)
                && !holder_alive(locks, name)
            {
                // Their leases' rows are taken over when asked for; the files go now.
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let name = format!("{}-{:016x}.holder", std::process::id(), fastrand::u64(..));
    let path = locks.join(&name);
    // Locked under a name no sweep above looks at, then renamed: a file that appeared
    // unlocked under a holder's name would be deleted (or briefly locked) by another
    // process's sweep, and this store's own lock then refused or its leases lost.
    let pending = locks.join(format!("{name}.new"));
    let file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&pending)
        .map_err(|e| StoreError::Open(format!("cannot create {}: {e}", pending.display())))?;
    let locked = match file.try_lock() {
        Ok(()) => std::fs::rename(&pending, &path)
            .map_err(|e| StoreError::Open(format!("cannot rename {}: {e}", pending.display()))),
        Err(TryLockError::WouldBlock) => Err(StoreError::Open(format!(
            "{} is locked by another process",
            pending.display()
        ))),
        Err(TryLockError::Error(e)) => Err(StoreError::Open(format!(
            "cannot lock {}: {e}",
            pending.display()
        ))),
    };
    match locked {
        Ok(()) => Ok((Arc::from(name), file)),
        Err(e) => {
            let _ = std::fs::remove_file(&pending);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_this_code_makes_are_holders() {
        assert!(is_holder_name("1234-00ff00ff00ff00ff.holder"));
        assert!(!is_holder_name("../../etc/passwd"));
        assert!(!is_holder_name("a/b.holder"));
        assert!(!is_holder_name(".holder"));
        assert!(!is_holder_name("1234-00ff.lock"));
    }
}
