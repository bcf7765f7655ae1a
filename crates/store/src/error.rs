//! The store's error type.

use std::sync::Arc;

use toolledger_contract::ErrorCode;

/// Why a store operation failed. Messages never carry a path, SQL, OS error text or a
/// stored value; the underlying error, where there is one, is kept as the error's
/// [`source`](std::error::Error::source) for logs and `Debug`, never in its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite refused or failed (not a database, I/O, a constraint, an injected trigger,
    /// a full disk, a journal mode that is not WAL).
    #[error("sqlite failed: {what}")]
    Sqlite {
        /// What failed, in fixed words.
        what: &'static str,
        /// SQLite's own error, for logs.
        #[source]
        cause: Option<Cause>,
    },
    /// The file is SQLite but not a toolledger store of this version. It was not
    /// touched.
    #[error("the file is not a toolledger-store-v2 store")]
    SchemaUnsupported,
    /// The file is an older toolledger store. It was not touched; `migrate` upgrades it.
    #[error(
        "the file is a toolledger store of schema version {version}: upgrade it with `toolledger migrate` (a backup is made first)"
    )]
    SchemaOutdated {
        /// Its `user_version`.
        version: i64,
    },
    /// A stored row contradicts itself: JSON not canonical, a digest that does not
    /// recompute, a receipt not bound to its operation.
    #[error("stored data violates the contract: {0}")]
    ContractViolation(&'static str),
    /// `audit` was pointed at a path with no store (missing or empty file).
    #[error("no store at that path")]
    Missing,
    /// SQLite found the file corrupt (a damaged page, a broken index).
    #[error("the database is corrupt")]
    Corrupt,
    /// Another connection held a lock for longer than the store's bound on waiting.
    /// Nothing was written by the refused step.
    #[error("the store stayed locked by another connection for longer than the wait bound")]
    Busy,
    /// Something the store relies on between two of its own statements did not hold
    /// (a row deleted by hand under a running command).
    #[error("the store's state changed under it: {0}")]
    Internal(&'static str),
}

impl StoreError {
    /// A failure described by `what`, with no underlying error.
    pub fn failed(what: &'static str) -> StoreError {
        StoreError::Sqlite { what, cause: None }
    }

    /// The stable code: `SQLITE_ERROR`, `SCHEMA_UNSUPPORTED`, `STORE_CONTRACT_VIOLATION`
    /// or `STORE_BUSY`.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Sqlite { .. }
            | StoreError::Missing
            | StoreError::Corrupt
            | StoreError::Internal(_) => ErrorCode::SqliteError,
            StoreError::SchemaUnsupported | StoreError::SchemaOutdated { .. } => {
                ErrorCode::SchemaUnsupported
            }
            StoreError::ContractViolation(_) => ErrorCode::StoreContractViolation,
            StoreError::Busy => ErrorCode::StoreBusy,
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

/// Maps any rusqlite error to a fixed description: SQLite's own message can quote SQL or
/// a path, so it is never passed on.
pub(crate) fn sqlite(err: rusqlite::Error) -> StoreError {
    use rusqlite::{Error, ErrorCode};
    let what = match &err {
        Error::SqliteFailure(failure, _) => match failure.code {
            ErrorCode::NotADatabase => "the file is not a SQLite database",
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => return StoreError::Busy,
            ErrorCode::ConstraintViolation => "a constraint or trigger refused the write",
            ErrorCode::DiskFull => "the disk is full",
            ErrorCode::ReadOnly => "the database is read-only",
            ErrorCode::CannotOpen => "the database file could not be opened",
            ErrorCode::SystemIoFailure => "an I/O error",
            ErrorCode::DatabaseCorrupt => return StoreError::Corrupt,
            _ => "a SQLite error",
        },
        // A stored value SQLite cannot hand over as its column's type: text that is not
        // UTF-8, a value of another type (a STRICT table edited by hand). The row
        // contradicts the schema, which is a contract violation, not a failure.
        Error::FromSqlConversionFailure(..)
        | Error::InvalidColumnType(..)
        | Error::Utf8Error(..) => {
            return StoreError::ContractViolation(
                "a stored value is not of its column's type or not UTF-8",
            );
        }
        _ => "a SQLite error",
    };
    StoreError::Sqlite { what, cause: Some(Cause(Arc::new(err))) }
}
