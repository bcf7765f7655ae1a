//! The store's error type.

use std::sync::Arc;

use toolledger_contract::ErrorCode;

/// Why a store operation failed. Messages never carry a path, SQL, OS error text or a
/// stored value; the underlying error, where there is one, is kept as the error's
/// [`source`](std::error::Error::source) for logs and `Debug`, never in its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database refused or failed (not a database, I/O, a constraint, an injected
    /// trigger, a full disk, a lost connection). The backend is named in the message
    /// only; the code is `STORE_ERROR` whichever it is.
    #[error("{backend} failed: {what}")]
    Backend {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// What kind of failure, chosen from the driver's error code: what a store
        /// decides by (retry, reconnect), never the words.
        kind: FailureKind,
        /// What failed, in fixed words.
        what: &'static str,
        /// The driver's own error, for logs.
        #[source]
        cause: Option<Cause>,
    },
    /// The database failed while committing (an I/O error at the commit's sync, a
    /// connection lost during `COMMIT`): the transaction may hold or not, and only a
    /// later read can tell. The code is `STORE_ERROR`; a dispatch whose commit A ends
    /// this way answers `OUTCOME_UNKNOWN`, never "nothing happened".
    #[error("{backend} failed while committing: whether the commit holds is unknown")]
    CommitUnknown {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// The failure, for logs.
        #[source]
        cause: Option<Cause>,
    },
    /// The database is not a toolledger store of this version. It was not touched.
    #[error("the database is not a toolledger store of this version")]
    SchemaUnsupported,
    /// The database is an older toolledger store. It was not touched; `migrate` upgrades it.
    #[error(
        "the database is a toolledger store of schema version {version}: upgrade it with `toolledger migrate` (a backup is made first)"
    )]
    SchemaOutdated {
        /// Its `user_version`.
        version: i64,
    },
    /// A stored row contradicts itself: JSON not canonical, a digest that does not
    /// recompute, a receipt not bound to its operation.
    #[error("stored data violates the contract: {0}")]
    ContractViolation(&'static str),
    /// A command that never creates a store was pointed at none (a missing or empty
    /// file, a database without toolledger's tables). The code is `STORE_NOT_FOUND`.
    #[error("no ledger there: dispatch, relay and the library's open create one")]
    Missing,
    /// The database found its own data corrupt (a damaged page, a broken index).
    #[error("the database is corrupt")]
    Corrupt,
    /// Another connection held a lock for longer than the store's bound on waiting.
    /// Nothing was written by the refused step.
    #[error("the store stayed locked by another connection for longer than the wait bound")]
    Busy,
    /// A list cursor that no listing of the same state and tool handed out: malformed,
    /// edited, truncated or carried over from another listing. The code is `USAGE_ERROR`;
    /// the message never repeats the cursor.
    #[error("the list cursor is not one a listing of this state and tool handed out")]
    InvalidCursor,
    /// Something the store relies on between two of its own statements did not hold
    /// (a row deleted by hand under a running command).
    #[error("the store's state changed under it: {0}")]
    Internal(&'static str),
}

/// The kind of a [`StoreError::Backend`] failure: what the store's own code decides by.
/// A backend chooses it from its driver's error codes (SQLSTATE, SQLite's result
/// codes), never from message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// Two transactions met in a way only a fresh start resolves (a serialization
    /// failure, a deadlock): the whole transaction runs again.
    Conflict,
    /// The connection is gone: the store makes a new one before its next call. A write
    /// in flight is not known to have committed or not.
    LostConnection,
    /// No connection could be made (refused, unreachable, not answered in time).
    Unreachable,
    /// A constraint or a trigger refused a write.
    Refused,
    /// The database named does not exist.
    NoDatabase,
    /// Any other failure (a full disk, a read-only database, an I/O error, …).
    Other,
}

impl StoreError {
    /// A failure of `backend` described by `what`, with no underlying error.
    pub fn failed(backend: &'static str, what: &'static str) -> StoreError {
        StoreError::of_kind(backend, FailureKind::Other, what)
    }

    /// A failure of `backend` of `kind`, described by `what`, with no underlying error.
    pub fn of_kind(backend: &'static str, kind: FailureKind, what: &'static str) -> StoreError {
        StoreError::Backend { backend, kind, what, cause: None }
    }

    /// A failure of `backend` of `kind`, described by `what`, keeping the driver's
    /// `cause` for logs.
    pub fn caused(
        backend: &'static str,
        kind: FailureKind,
        what: &'static str,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Backend { backend, kind, what, cause: Some(Cause(Arc::new(cause))) }
    }

    /// The kind of a backend's failure; `None` for every other error.
    pub fn failure_kind(&self) -> Option<FailureKind> {
        match self {
            StoreError::Backend { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// `err`, met while `backend` was committing: [`StoreError::CommitUnknown`].
    pub fn commit_unknown(backend: &'static str, err: StoreError) -> StoreError {
        StoreError::CommitUnknown { backend, cause: Some(Cause(Arc::new(err))) }
    }

    /// The stable code: `STORE_ERROR`, `SCHEMA_UNSUPPORTED`, `STORE_CONTRACT_VIOLATION`,
    /// `STORE_BUSY`, `STORE_NOT_FOUND` or `USAGE_ERROR`.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Backend { .. }
            | StoreError::CommitUnknown { .. }
            | StoreError::Corrupt
            | StoreError::Internal(_) => ErrorCode::StoreError,
            StoreError::SchemaUnsupported | StoreError::SchemaOutdated { .. } => {
                ErrorCode::SchemaUnsupported
            }
            StoreError::ContractViolation(_) => ErrorCode::StoreContractViolation,
            StoreError::Busy => ErrorCode::StoreBusy,
            StoreError::Missing => ErrorCode::StoreNotFound,
            StoreError::InvalidCursor => ErrorCode::UsageError,
        }
    }
}

/// The error beneath a [`StoreError`], shared so the error stays cheap to clone. Two
/// causes are equal only when they are the same error.
#[derive(Debug, Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync>);

impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Cause {}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}
