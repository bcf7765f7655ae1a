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
}

impl StoreError {
    /// The stable code the CLI prints: `SQLITE_ERROR`, `SCHEMA_UNSUPPORTED` or
    /// `STORE_CONTRACT_VIOLATION`.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Sqlite(_) | StoreError::Missing => "SQLITE_ERROR",
            StoreError::SchemaUnsupported => "SCHEMA_UNSUPPORTED",
            StoreError::ContractViolation(_) => "STORE_CONTRACT_VIOLATION",
        }
    }
}

/// The description of a busy or locked database.
pub(crate) const BUSY: &str = "the database stayed busy";

/// Maps any rusqlite error to a fixed description: SQLite's own message can quote SQL or
/// a path, so it is never passed on.
pub(crate) fn sqlite(err: rusqlite::Error) -> StoreError {
    use rusqlite::{Error, ErrorCode};
    let what = match &err {
        Error::SqliteFailure(failure, _) => match failure.code {
            ErrorCode::NotADatabase => "the file is not a SQLite database",
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => BUSY,
            ErrorCode::ConstraintViolation => "a constraint or trigger refused the write",
            ErrorCode::DiskFull => "the disk is full",
            ErrorCode::ReadOnly => "the database is read-only",
            ErrorCode::CannotOpen => "the database file could not be opened",
            ErrorCode::SystemIoFailure => "an I/O error",
            ErrorCode::DatabaseCorrupt => "the database is corrupt",
            _ => "a SQLite error",
        },
        _ => "a SQLite error",
    };
    StoreError::Sqlite(what)
}
