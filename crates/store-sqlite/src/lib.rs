//! toolledger's embedded store: one SQLite file in WAL mode, `synchronous=FULL` (but for
//! a success's commit C, which is lazy: `Durability::Lazy` of `toolledger-store`).
//!
//! [`SqliteStore`] is a [`Backend`](toolledger_store::driver::Backend) of
//! `toolledger-store`, and so a [`LedgerStore`](toolledger_store::LedgerStore) and an
//! [`OperatorStore`](toolledger_store::OperatorStore) (and, through the engine, the
//! stand-in's `StandInReceipts`), with the store crate's statements
//! and commit points (`docs/schema.md`). What is SQLite's here is how they are run:
//! every write is one `BEGIN IMMEDIATE` transaction (the write lock taken before the
//! first read), and writes of different threads that arrive together share one commit
//! (group commit, each in its own savepoint).
//! Every read re-verifies what it returns with `toolledger_store::verify`. The store
//! reads no wall clock: every instant it records or judges is handed in; only its waits
//! for another connection's lock read the monotonic clock, against their bound. One
//! rusqlite type is in its API: the row [`raw_operation`] decodes.
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

mod audit;
mod error;
mod gate;
mod migrate;
mod schema;
mod sqlite;

// The boundary's names, in scope under `crate::` for this crate's modules.
use toolledger_store::{
    AuditReport, CallIdentity, LocalReceipt, NewOperation, Now, STAND_IN_NAME, STAND_IN_REVISION,
    StoreError, Waits, verify,
};

pub use crate::{
    audit::{CHECKS, HEALTH},
    migrate::{Migrated, migrate},
    schema::{SCHEMA_ID, USER_VERSION},
    sqlite::{SqliteStore, raw_operation},
};
