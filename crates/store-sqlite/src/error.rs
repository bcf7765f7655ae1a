//! Maps the driver's errors to [`StoreError`]s that carry no SQL, path or OS text.

use rusqlite::{Error, ErrorCode};
use toolledger_store::{FailureKind, StoreError};

/// The backend's name in messages.
pub(crate) const BACKEND: &str = "sqlite";

/// A failure described by `what`, with no underlying error.
pub(crate) fn failed(what: &'static str) -> StoreError {
    StoreError::failed(BACKEND, what)
}

/// Maps any rusqlite error to a kind and a fixed description, from SQLite's result
/// code: SQLite's own message can quote SQL or a path, so it is never passed on.
pub(crate) fn sqlite(err: rusqlite::Error) -> StoreError {
    let other = |what| (FailureKind::Other, what);
    let (kind, what) = match &err {
        Error::SqliteFailure(failure, _) => match failure.code {
            ErrorCode::NotADatabase => other("the file is not a SQLite database"),
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => return StoreError::Busy,
            ErrorCode::ConstraintViolation => {
                (FailureKind::Refused, "a constraint or trigger refused the write")
            }
            ErrorCode::DiskFull => other("the disk is full"),
            ErrorCode::ReadOnly => other("the database is read-only"),
            ErrorCode::CannotOpen => other("the database file could not be opened"),
            ErrorCode::SystemIoFailure => other("an I/O error"),
            ErrorCode::DatabaseCorrupt => return StoreError::Corrupt,
            _ => other("a SQLite error"),
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
        _ => other("a SQLite error"),
    };
    StoreError::caused(BACKEND, kind, what, err)
}
