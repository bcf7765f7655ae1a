//! Where a ledger lives: a SQLite file (the embedded default) or a PostgreSQL database
//! (when workers run on several hosts), and one connection type over both.

use std::path::{Path, PathBuf};

use toolledger_contract::{
    DownstreamIdentity, DownstreamRequestRef, Identifier, LeaseSeconds, Scope, StatusRef,
};
use toolledger_engine::StandInReceipts;
use toolledger_store::{
    AuditReport, CallIdentity, Claim, ClaimedBatch, DispatchLookup, DownstreamReceipt, Ending,
    Figures, Finalize, Finalizer, Lease, LedgerStore, ListFilter, Listed, LocalReceipt,
    NewOperation, Now, Operation, OperatorStore, RecordedCall, Release, Requeued, Reservation,
    Resolved, Settlement, Shown, StoreError, TraceRecord, TraceStore, Waits,
};
pub use toolledger_store_postgres::StoreClock;
use toolledger_store_postgres::{PgPool, PgStore};
use toolledger_store_sqlite::SqliteStore;

use crate::{
    Error,
    traces::{self, Step},
};

/// Where a ledger lives.
///
/// ```
/// use toolledger::Location;
/// assert!(matches!(Location::parse("ledger.sqlite3"), Location::Sqlite(_)));
/// assert!(matches!(Location::parse("sqlite:ledger.sqlite3"), Location::Sqlite(_)));
/// assert!(matches!(Location::parse("postgres://app@db.internal/ledger"), Location::Postgres(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file, created when missing.
    Sqlite(PathBuf),
    /// A PostgreSQL database, by connection URL (`postgres://` or `postgresql://`); its
    /// tables are created when it has none.
    Postgres(String),
}

impl Location {
    /// `postgres://…` or `postgresql://…` is a PostgreSQL database; `sqlite:PATH` or any
    /// other text is a SQLite file's path.
    ///
    /// ```
    /// let location = toolledger::Location::parse("postgresql://localhost/ledger");
    /// assert_eq!(location, toolledger::Location::Postgres("postgresql://localhost/ledger".to_owned()));
    /// ```
    pub fn parse(text: &str) -> Location {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Location::Postgres(text.to_owned())
        } else {
            Location::Sqlite(PathBuf::from(text.strip_prefix("sqlite:").unwrap_or(text)))
        }
    }

    /// The backend's name: `sqlite` or `postgres`.
    ///
    /// ```
    /// assert_eq!(toolledger::Location::parse("a.sqlite3").backend(), "sqlite");
    /// ```
    pub fn backend(&self) -> &'static str {
        match self {
            Location::Sqlite(_) => "sqlite",
            Location::Postgres(_) => "postgres",
        }
    }
}

impl From<&Path> for Location {
    fn from(path: &Path) -> Location {
        Location::Sqlite(path.to_path_buf())
    }
}

impl From<PathBuf> for Location {
    fn from(path: PathBuf) -> Location {
        Location::Sqlite(path)
    }
}

impl From<&PathBuf> for Location {
    fn from(path: &PathBuf) -> Location {
        Location::Sqlite(path.clone())
    }
}

impl From<&str> for Location {
    /// As [`Location::parse`].
    fn from(text: &str) -> Location {
        Location::parse(text)
    }
}

impl From<String> for Location {
    /// As [`Location::parse`].
    fn from(text: String) -> Location {
        Location::parse(&text)
    }
}

impl From<&Location> for Location {
    fn from(location: &Location) -> Location {
        location.clone()
    }
}

/// One connection to a ledger, wherever it lives.
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("toolledger-doc-store-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let location = toolledger::Location::from(dir.join("ledger.sqlite3"));
/// let store = toolledger::Store::open(&location, toolledger::Waits::default(), Default::default())?;
/// assert_eq!(store.backend(), "sqlite");
/// # drop(store);
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug)]
pub enum Store {
    /// A SQLite file.
    Sqlite(SqliteStore),
    /// A PostgreSQL database (boxed: its connection state is far larger than SQLite's).
    Postgres(Box<PgStore>),
}

impl Store {
    /// Opens (creating when there is none) the ledger at `location`.
    ///
    /// # Errors
    ///
    /// An [`Error`] when the location holds something else (`SCHEMA_UNSUPPORTED`), cannot
    /// be reached or opened (`STORE_ERROR`), or a lock outlasts `waits` (`STORE_BUSY`).
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-open-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// use toolledger::{Location, Store, StoreClock, Waits};
    /// let store = Store::open(&Location::from(dir.join("l.sqlite3")), Waits::default(), StoreClock::Database)?;
    /// # drop(store);
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn open(location: &Location, waits: Waits, clock: StoreClock) -> Result<Store, Error> {
        Ok(match location {
            Location::Sqlite(path) => Store::Sqlite(SqliteStore::open_with(path, waits)?),
            Location::Postgres(url) => {
                Store::Postgres(Box::new(PgStore::connect(url, waits)?.with_clock(clock)))
            }
        })
    }

    /// Opens the ledger at `location` without ever creating one: what commands that only
    /// read (and operators' commands) use.
    ///
    /// # Errors
    ///
    /// As [`Store::open`]; no ledger there is `STORE_NOT_FOUND`-class `STORE_ERROR`.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-ex-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// use toolledger::{Location, Store, StoreClock, Waits};
    /// let missing = Location::from(dir.join("missing.sqlite3"));
    /// assert!(Store::open_existing(&missing, Waits::default(), StoreClock::Database).is_err());
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// ```
    pub fn open_existing(
        location: &Location,
        waits: Waits,
        clock: StoreClock,
    ) -> Result<Store, Error> {
        Ok(match location {
            Location::Sqlite(path) => Store::Sqlite(SqliteStore::open_existing_with(path, waits)?),
            Location::Postgres(url) => {
                Store::Postgres(Box::new(PgStore::connect_existing(url, waits)?.with_clock(clock)))
            }
        })
    }

    /// `count` connections to the ledger at `location`, for a relay's workers and its
    /// heartbeat: a PostgreSQL ledger lends them from one pool of that size (each goes
    /// back when its store is dropped, a lost one is replaced by the next lend).
    pub(crate) fn open_many(
        location: &Location,
        count: usize,
        waits: Waits,
        clock: StoreClock,
    ) -> Result<Vec<Store>, Error> {
        match location {
            Location::Sqlite(_) => {
                (0..count).map(|_| Store::open(location, waits, clock)).collect()
            }
            Location::Postgres(url) => {
                let pool = PgPool::new(url, count, waits)?.with_clock(clock);
                (0..count).map(|_| Ok(Store::Postgres(Box::new(pool.store()?)))).collect()
            }
        }
    }

    /// `sqlite` or `postgres`.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-be-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # let location = toolledger::Location::from(dir.join("l.sqlite3"));
    /// let store = toolledger::Store::open(&location, Default::default(), Default::default())?;
    /// assert_eq!(store.backend(), location.backend());
    /// # drop(store);
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }
}

/// Each method of a trait, answered by whichever store this is.
macro_rules! delegate {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty;)*) => {
        $(fn $name(&mut self, $($arg: $ty),*) -> Result<$ret, StoreError> {
            match self {
                Store::Sqlite(store) => store.$name($($arg),*),
                Store::Postgres(store) => store.$name($($arg),*),
            }
        })*
    };
}

/// Each of a trait's methods, answered by whichever store this is, as a step of the call
/// span current while it runs ([`traces::step`]).
macro_rules! delegate_step {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty = $step:expr;)*) => {
        $(fn $name(&mut self, $($arg: $ty),*) -> Result<$ret, StoreError> {
            traces::step($step, || match self {
                Store::Sqlite(store) => store.$name($($arg),*),
                Store::Postgres(store) => store.$name($($arg),*),
            })
        })*
    };
}

impl Store {
    /// Commit A (fused with the claim when `claim` names one), as a step of the call
    /// span, keeping the trace context current where the call is worked (the call's
    /// span, or the one its host handed over) beside a new intent, so a later attempt or
    /// status query can link back to it (`docs/observability.md`). Outside any trace,
    /// nothing more is written.
    fn reserve_in_trace(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        claim: Option<(&Identifier, LeaseSeconds)>,
    ) -> Result<Reservation, StoreError> {
        let trace = crate::TraceContext::current().map(|context| TraceRecord {
            traceparent: context.traceparent().to_owned(),
            tracestate: context.tracestate().to_owned(),
        });
        let claimed = claim.is_some();
        let reserved = traces::step(Step::CommitA, || match (trace, claim) {
            (Some(trace), claim) => self.reserve_traced(intent, call, now, claim, &trace),
            (None, None) => match self {
                Store::Sqlite(store) => store.reserve(intent, call, now),
                Store::Postgres(store) => store.reserve(intent, call, now),
            },
            (None, Some((owner, lease))) => match self {
                Store::Sqlite(store) => store.reserve_claimed(intent, call, now, owner, lease),
                Store::Postgres(store) => store.reserve_claimed(intent, call, now, owner, lease),
            },
        })?;
        if claimed && matches!(reserved, Reservation::Reserved(_)) {
            traces::attempt(1);
        }
        Ok(reserved)
    }
}

impl TraceStore for Store {
    fn reserve_traced(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        claim: Option<(&Identifier, LeaseSeconds)>,
        trace: &TraceRecord,
    ) -> Result<Reservation, StoreError> {
        match self {
            Store::Sqlite(store) => store.reserve_traced(intent, call, now, claim, trace),
            Store::Postgres(store) => store.reserve_traced(intent, call, now, claim, trace),
        }
    }

    delegate! {
        trace_of(status_ref: &StatusRef) -> Option<TraceRecord>;
    }
}

impl LedgerStore for Store {
    fn reserve(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
    ) -> Result<Reservation, StoreError> {
        self.reserve_in_trace(intent, call, now, None)
    }

    fn reserve_claimed(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        owner: &Identifier,
        lease: LeaseSeconds,
    ) -> Result<Reservation, StoreError> {
        self.reserve_in_trace(intent, call, now, Some((owner, lease)))
    }

    fn claim(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<Claim, StoreError> {
        let claim = traces::step(Step::Claim, || match self {
            Store::Sqlite(store) => store.claim(status_ref, owner, now, lease),
            Store::Postgres(store) => store.claim(status_ref, owner, now, lease),
        })?;
        if let Claim::Claimed(claimed) = &claim {
            traces::attempt(claimed.attempt);
        }
        Ok(claim)
    }

    fn claim_due(
        &mut self,
        owner: &Identifier,
        downstream: &DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> Result<ClaimedBatch, StoreError> {
        let batch = traces::step(Step::Claim, || match self {
            Store::Sqlite(store) => store.claim_due(owner, downstream, now, lease, limit),
            Store::Postgres(store) => store.claim_due(owner, downstream, now, lease, limit),
        })?;
        // A relay's pass is a trace of its own, linked to the trace of each caller whose
        // operation it claimed.
        if !batch.claimed.is_empty() {
            traces::relay_claimed(|| {
                let refs = batch.claimed.iter().map(|claimed| &claimed.operation.intent.status_ref);
                refs.map(|status_ref| self.trace_of(status_ref).ok().flatten()).collect()
            });
        }
        Ok(batch)
    }

    delegate_step! {
        end(status_ref: &StatusRef, by: &Finalizer, ending: &Ending<'_>, now: Now) -> Finalize =
            Step::CommitC { synced: ending.durability() == toolledger_store::driver::Durability::Synced };
        finalize_many(items: &[(StatusRef, Finalizer, LocalReceipt)], now: Now)
            -> Vec<Finalize> = Step::CommitC { synced: false };
    }

    delegate! {
        operation_by_scope(scope: &Scope) -> Option<Operation>;
        operation_by_status_ref(status_ref: &StatusRef) -> Option<Operation>;
        dispatch_lookup(scope: &Scope, call: &CallIdentity) -> DispatchLookup;
        recorded_call(call: &CallIdentity) -> Option<RecordedCall>;
        record_status_query(call: &CallIdentity, status_ref: &StatusRef, now: Now)
            -> Option<RecordedCall>;
        release(status_ref: &StatusRef, lease: &Lease, release: &Release<'_>, now: Now)
            -> Finalize;
        retired(status_ref: &StatusRef) -> bool;
        heartbeat(owner: &Identifier, now: Now, lease: LeaseSeconds) -> usize;
        audit() -> AuditReport;
    }
}

impl StandInReceipts for Store {
    delegate! {
        record_downstream_receipt(receipt: &DownstreamReceipt, now: Now) -> DownstreamReceipt;
        downstream_receipt(downstream_request_ref: &DownstreamRequestRef) -> Option<DownstreamReceipt>;
        record_downstream_receipts(receipts: &[DownstreamReceipt], now: Now)
            -> Vec<DownstreamReceipt>;
    }
}

impl OperatorStore for Store {
    delegate! {
        list(filter: &ListFilter<'_>, show_arguments: bool, now: Now) -> Vec<Listed>;
        show(status_ref: &StatusRef) -> Shown;
        requeue(status_ref: &StatusRef, reason: &str, now: Now) -> Requeued;
        resolve(status_ref: &StatusRef, settlement: &Settlement, reason: &str, now: Now)
            -> Resolved;
        retire(cutoff: Now, now: Now, limit: usize) -> usize;
        figures(now: Now) -> Figures;
    }
}
