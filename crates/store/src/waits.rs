//! How long a store waits for what other connections hold.

use std::time::{Duration, Instant};

/// How long a store waits for locks other connections hold.
///
/// Every wait — for the file's in-process writer gate, the database's own lock wait (SQLite's busy handler, PostgreSQL's `lock_timeout`), the
/// retries of an open — is bounded by `busy_timeout`; with a `deadline`, no wait
/// extends past it either, so a whole command (open and every transaction) answers
/// within one bound. A wait that runs out is [`StoreError::Busy`](crate::StoreError::Busy), and the step that
/// waited wrote nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// The longest one wait may take.
    pub busy_timeout: Duration,
    /// When set, the instant after which nothing waits at all.
    pub deadline: Option<Instant>,
}

impl Default for Waits {
    /// Five seconds per wait, no overall deadline: what a long-lived host wants.
    fn default() -> Waits {
        Waits { busy_timeout: Duration::from_millis(DEFAULT_BUSY_TIMEOUT_MS), deadline: None }
    }
}

/// The default bound of one wait, in milliseconds.
pub const DEFAULT_BUSY_TIMEOUT_MS: u64 = 5000;

impl Waits {
    /// One bound for everything from now on: each wait, and all of them together, end
    /// within `total` of this call. What a command wants.
    pub fn total(total: Duration) -> Waits {
        Waits { busy_timeout: total, deadline: Instant::now().checked_add(total) }
    }

    /// How long the next wait may take: `busy_timeout`, cut short by the deadline.
    pub fn next_wait(&self) -> Duration {
        match self.deadline {
            Some(deadline) => self.busy_timeout.min(left(deadline)),
            None => self.busy_timeout,
        }
    }

    /// The instant the next wait must end by.
    pub fn next_deadline(&self) -> Instant {
        let now = Instant::now();
        now.checked_add(self.next_wait()).unwrap_or(now)
    }
}

/// What is left until `deadline` (zero once it has passed).
fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
