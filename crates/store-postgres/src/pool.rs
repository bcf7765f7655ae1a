//! A small connection pool for a relay's worker threads: at most `size` connections,
//! each lent to one [`PgStore`] at a time and taken back when that store is dropped
//! (unless the connection was lost).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use tokio_postgres::Config;

use crate::{
    StoreError, Waits,
    pg::{PgStore, StoreClock},
    session::{self, Conn},
};

/// A pool of connections to one store. Cheap to clone; clones share the connections.
#[derive(Debug, Clone)]
pub struct PgPool {
    shared: Arc<Shared>,
    clock: StoreClock,
}

/// What the clones of a pool and its lent stores share.
#[derive(Debug)]
pub(crate) struct Shared {
    config: Config,
    waits: Waits,
    size: usize,
    state: Mutex<State>,
    returned: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Connections not lent.
    idle: Vec<Conn>,
    /// Connections made and not yet dropped: idle, or lent.
    open: usize,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A store's connection coming back: kept for the next store unless it was lost.
    pub(crate) fn give_back(&self, conn: Option<Conn>) {
        let mut state = self.state();
        match conn {
            Some(conn) if !conn.client.is_closed() => state.idle.push(conn),
            _ => state.open = state.open.saturating_sub(1),
        }
        drop(state);
        self.returned.notify_one();
    }
}

impl PgPool {
    /// Opens the store at `url` as [`PgStore::connect`] does (creating it when the
    /// database holds none of toolledger's tables) and keeps that first connection; at
    /// most `size` (at least 1) connections are ever open at once.
    ///
    /// # Errors
    ///
    /// As [`PgStore::connect`].
    pub fn new(url: &str, size: usize, waits: Waits) -> Result<PgPool, StoreError> {
        let config = session::config(url)?;
        let mut first = PgStore::connect(url, waits)?;
        let mut state = State::default();
        if let Some(conn) = first.take_connection() {
            state.idle.push(conn);
            state.open = 1;
        }
        let shared = Shared {
            config,
            waits,
            size: size.max(1),
            state: Mutex::new(state),
            returned: Condvar::new(),
        };
        Ok(PgPool { shared: Arc::new(shared), clock: StoreClock::default() })
    }

    /// The pool handing out stores whose writes judge by `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: StoreClock) -> PgPool {
        self.clock = clock;
        self
    }

    /// A store on an idle connection, or on a new one while fewer than `size` are open;
    /// otherwise waits for a store to be dropped, within the pool's wait bound.
    ///
    /// # Errors
    ///
    /// [`StoreError::Busy`] when every connection stayed lent past the bound;
    /// [`StoreError::Backend`] when a new connection cannot be made.
    pub fn store(&self) -> Result<PgStore, StoreError> {
        let shared = &self.shared;
        let deadline = shared.waits.next_deadline();
        let mut state = shared.state();
        loop {
            if let Some(conn) = state.idle.pop() {
                drop(state);
                return Ok(self.lend(conn));
            }
            if state.open < shared.size {
                state.open += 1;
                drop(state);
                return match session::open(&shared.config, &shared.waits) {
                    Ok(conn) => Ok(self.lend(conn)),
                    Err(err) => {
                        shared.give_back(None);
                        Err(err)
                    }
                };
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(StoreError::Busy);
            }
            state =
                shared.returned.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    fn lend(&self, conn: Conn) -> PgStore {
        let shared = Arc::clone(&self.shared);
        PgStore::pooled(shared.config.clone(), shared.waits, self.clock, conn, shared)
    }

    /// The most connections open at once.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// Connections open now, and how many of them are idle.
    pub fn open(&self) -> (usize, usize) {
        let state = self.shared.state();
        (state.open, state.idle.len())
    }
}
