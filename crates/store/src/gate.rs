//! One writer gate per database file, per process.
//!
//! SQLite allows one writer at a time. Connections of one process that contend for the
//! write lock otherwise meet `SQLITE_BUSY` and sleep in SQLite's busy handler, whose
//! back-off leaves the file idle while they sleep (8 threads saw waits of up to a
//! second). Taking this in-process lock around every write transaction hands the
//! write lock from one connection to the next at once instead. Writers in other
//! processes still rely on `busy_timeout`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak},
};

/// The gate of one file: held for the whole of each write transaction.
#[derive(Debug, Clone)]
pub(crate) struct Gate(Arc<Mutex<()>>);

impl Gate {
    /// The gate of the file at `path`, shared by every connection of this process to
    /// that file (however the path is spelled).
    pub(crate) fn of(path: &Path) -> Gate {
        static GATES: OnceLock<Mutex<HashMap<PathBuf, Weak<Mutex<()>>>>> = OnceLock::new();
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut gates =
            GATES.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(gate) = gates.get(&key).and_then(Weak::upgrade) {
            return Gate(gate);
        }
        gates.retain(|_, gate| gate.strong_count() > 0);
        let gate = Arc::new(Mutex::new(()));
        gates.insert(key, Arc::downgrade(&gate));
        Gate(gate)
    }

    /// Waits for the gate. A panic while it was held does not poison it: the
    /// transaction it guarded rolled back when it was dropped.
    pub(crate) fn enter(&self) -> MutexGuard<'_, ()> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
