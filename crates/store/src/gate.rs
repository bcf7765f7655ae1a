//! One writer gate per database file, per process.
//!
//! SQLite allows one writer at a time. Connections of one process that contend for the
//! write lock otherwise meet `SQLITE_BUSY` and sleep in SQLite's busy handler, whose
//! back-off leaves the file idle while they sleep (8 threads saw waits of up to a
//! second). Taking this in-process gate around every write transaction hands the write
//! lock from one connection to the next at once instead. The gate is a ticket lock, so
//! writers enter in arrival order and none waits behind more than the writers that came
//! before it. Writers in other processes still rely on `busy_timeout`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak},
};

/// Tickets handed out and the ticket being served.
#[derive(Debug, Default)]
struct Tickets {
    next: u64,
    serving: u64,
}

#[derive(Debug, Default)]
struct Shared {
    tickets: Mutex<Tickets>,
    turn: Condvar,
}

/// The gate of one file: held for the whole of each write transaction.
#[derive(Debug, Clone)]
pub(crate) struct Gate(Arc<Shared>);

/// Holding the gate; dropping it lets the next writer in.
#[derive(Debug)]
pub(crate) struct Entered<'a>(&'a Shared);

impl Gate {
    /// The gate of the file at `path`, shared by every connection of this process to
    /// that file (however the path is spelled).
    pub(crate) fn of(path: &Path) -> Gate {
        static GATES: OnceLock<Mutex<HashMap<PathBuf, Weak<Shared>>>> = OnceLock::new();
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut gates =
            GATES.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(gate) = gates.get(&key).and_then(Weak::upgrade) {
            return Gate(gate);
        }
        gates.retain(|_, gate| gate.strong_count() > 0);
        let gate = Arc::new(Shared::default());
        gates.insert(key, Arc::downgrade(&gate));
        Gate(gate)
    }

    /// Waits for this caller's turn. A panic while the gate was held does not block it:
    /// the transaction it guarded rolled back, and the guard's drop still hands on the
    /// turn.
    pub(crate) fn enter(&self) -> Entered<'_> {
        let shared = &*self.0;
        let mut tickets = shared.tickets.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = tickets.next;
        tickets.next += 1;
        while tickets.serving != mine {
            tickets = shared.turn.wait(tickets).unwrap_or_else(PoisonError::into_inner);
        }
        Entered(shared)
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut tickets = self.0.tickets.lock().unwrap_or_else(PoisonError::into_inner);
        tickets.serving += 1;
        drop(tickets);
        self.0.turn.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        thread,
    };

    use super::Gate;

    #[test]
    fn writers_hold_the_gate_one_at_a_time() {
        let dir = std::env::temp_dir().join(format!("toolledger-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gate.sqlite3");
        let inside = Arc::new(Mutex::new((0usize, 0usize)));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (gate, inside) = (Gate::of(&path), Arc::clone(&inside));
                thread::spawn(move || {
                    for _ in 0..200 {
                        let _entered = gate.enter();
                        let mut counts = inside.lock().unwrap();
                        counts.0 += 1;
                        counts.1 = counts.1.max(counts.0);
                        drop(counts);
                        thread::yield_now();
                        inside.lock().unwrap().0 -= 1;
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        assert_eq!(*inside.lock().unwrap(), (0, 1), "two writers were inside at once");
        let _ = std::fs::remove_dir_all(dir);
    }
}
