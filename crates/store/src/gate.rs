//! One writer gate per database file, per process.
//!
//! SQLite allows one writer at a time. Connections of one process that contend for the
//! write lock otherwise meet `SQLITE_BUSY` and sleep in SQLite's busy handler, whose
//! back-off leaves the file idle while they sleep (8 threads saw waits of up to a
//! second). Taking this in-process gate around every write transaction hands the write
//! lock from one connection to the next at once instead. Writers enter in arrival
//! order, none waits behind more than the writers that came before it, and a release
//! wakes only the next writer. Writers in other processes still rely on `busy_timeout`.

use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock, PoisonError, Weak},
    thread::{self, Thread},
    time::{Duration, Instant},
};

/// Who holds the gate and who waits for it, in arrival order.
#[derive(Debug, Default)]
struct State {
    held: bool,
    /// The last ticket handed over to a waiter.
    granted: u64,
    next_ticket: u64,
    waiting: VecDeque<(u64, Thread)>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
}

/// The gate of one file: held for the whole of each write transaction.
#[derive(Debug, Clone)]
pub(crate) struct Gate(Arc<Shared>);

/// Holding the gate; dropping it hands it to the next writer, or opens it.
#[derive(Debug)]
pub(crate) struct Entered<'a>(&'a Shared);

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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

    /// Waits for this caller's turn: at once when the gate is open, else behind every
    /// writer that came before. Only the writer whose turn it is gets woken. `None` when
    /// the turn has not come within `timeout`: the caller left the queue and holds
    /// nothing.
    pub(crate) fn enter(&self, timeout: Duration) -> Option<Entered<'_>> {
        let shared = &*self.0;
        let mut state = shared.state();
        if !state.held {
            state.held = true;
            return Some(Entered(shared));
        }
        let deadline = Instant::now().checked_add(timeout);
        state.next_ticket += 1;
        let ticket = state.next_ticket;
        state.waiting.push_back((ticket, thread::current()));
        while state.granted != ticket {
            let left = deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                // Leave the queue. The gate cannot have been handed to this ticket (it
                // is not granted), so nothing is held and nobody waits on us.
                state.waiting.retain(|(waiting, _)| *waiting != ticket);
                return None;
            }
            drop(state);
            // A spurious wake-up just loops: the turn is marked by `granted`.
            thread::park_timeout(left);
            state = shared.state();
        }
        Some(Entered(shared))
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        match state.waiting.pop_front() {
            // Hand the gate straight over; it stays held.
            Some((ticket, waiter)) => {
                state.granted = ticket;
                drop(state);
                waiter.unpark();
            }
            None => state.held = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        thread,
        time::Duration,
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
                        let _entered = gate.enter(Duration::MAX).unwrap();
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

    /// A writer whose turn does not come in time leaves the queue holding nothing, and
    /// the gate still passes from the holder to the next writer in line.
    #[test]
    fn a_writer_that_times_out_leaves_the_queue() {
        let dir = std::env::temp_dir().join(format!("toolledger-gate-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gate = Gate::of(&dir.join("gate.sqlite3"));
        let held = gate.enter(Duration::ZERO).unwrap();
        assert!(gate.enter(Duration::from_millis(20)).is_none());
        assert!(gate.enter(Duration::ZERO).is_none());
        let waiter = {
            let gate = gate.clone();
            thread::spawn(move || gate.enter(Duration::from_secs(60)).is_some())
        };
        // The waiter is queued behind the holder (or not yet queued); either way the
        // release must reach it, not the writers that gave up.
        thread::sleep(Duration::from_millis(20));
        drop(held);
        assert!(waiter.join().unwrap());
        assert!(gate.enter(Duration::ZERO).is_some());
        let _ = std::fs::remove_dir_all(dir);
    }
}
