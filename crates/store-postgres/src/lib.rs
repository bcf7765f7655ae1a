//! toolledger's server store: the ledger in a PostgreSQL database, for workers and
//! relays on several hosts.
//!
//! [`PgStore`] is a [`Backend`](toolledger_store::driver::Backend) of
//! `toolledger-store`, and so a [`LedgerStore`](toolledger_store::LedgerStore) and an
//! [`OperatorStore`](toolledger_store::OperatorStore) (and, through the engine, the
//! stand-in's `StandInReceipts`): the ledger's statements and
//! commit points are the store crate's, written once for every backend
//! (`docs/schema.md`). What is PostgreSQL's here is how writers meet: SQLite serializes
//! them; here every write is one `READ COMMITTED` transaction made correct by row locks
//! and unique constraints (an insert that waits for a racer and then inserts nothing, an
//! update re-checked on the row it waited for, `FOR UPDATE SKIP LOCKED` for relays), and
//! a serialization failure or deadlock is retried a bounded number of times.
//!
//! Leases and due times are judged on the **database's clock** by default
//! ([`StoreClock::Database`]): every write transaction reads `now()` and uses it instead of
//! the instant handed in, so workers on several hosts need no trusted clock of their
//! own. [`StoreClock::Caller`] keeps the handed-in instants, for tests and drills.
//!
//! A store whose connection is lost answers that call with
//! `postgres failed: the connection to the server was lost` (a write in flight is not
//! known to have committed or not) and reconnects on its next call. [`PgPool`] lends
//! connections to worker threads. (A throwaway server for tests is `toolledger-testkit`'s.)
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

mod audit;
mod error;
mod pg;
mod pool;
mod schema;
mod session;

// The boundary's names, in scope under `crate::` for this crate's modules.
use toolledger_store::{
    AuditReport, CallIdentity, ClaimedBatch, DownstreamReceipt, Finalize, Finalizer, Lease,
    LocalReceipt, NewOperation, Now, Operation, OutboxState, STAND_IN_NAME, STAND_IN_REVISION,
    StoreError, Waits, verify,
};

pub use crate::{
    audit::{CHECKS, HEALTH},
    pg::{ATTEMPTS, PgStore, StoreClock, migrate, raw_operation},
    pool::PgPool,
    schema::{SCHEMA_ID, SCHEMA_VERSION},
};
