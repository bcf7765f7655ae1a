//! The store's error type.

/// Why a store operation failed. Messages never carry a path, SQL, OS error text or a
/// stored value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite refused or failed (not a database, I/O, a constraint, an injected trigger,
    /// a full disk, a journal mode that is not WAL).
    #[error("sqlite failed: {0}")]
    Sqlite(&'static str),
    /// The file is SQLite but not a toolledger store of this version. It was not
    /// touched.
    #[error("the file is not a toolledger-store-v1 store")]
    SchemaUnsupported,
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
}

impl StoreError {
    /// The stable code the CLI prints: `SQLITE_ERROR`, `SCHEMA_UNSUPPORTED`,
    /// `STORE_CONTRACT_VIOLATION` or `STORE_BUSY`.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Sqlite(_) | StoreError::Missing | StoreError::Corrupt => "SQLITE_ERROR",
            StoreError::SchemaUnsupported => "SCHEMA_UNSUPPORTED",
            StoreError::ContractViolation(_) => "STORE_CONTRACT_VIOLATION",
            StoreError::Busy => "STORE_BUSY",
        }
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
    StoreError::Sqlite(what)
}
