//! Maps the driver's errors to [`StoreError`]s in fixed words: the server's message can
//! quote SQL, a value or a path, so it is never passed on (it stays the error's `cause`,
//! for logs).

use postgres::error::{Severity, SqlState};
use toolledger_store::{FailureKind, StoreError};

/// The backend's name in messages.
pub(crate) const BACKEND: &str = "postgres";
/// A lost connection, in any statement. A write in flight is not known to have
/// committed or not; the store reconnects on its next call.
pub(crate) const LOST: &str = "the connection to the server was lost";
/// A constraint or a trigger refused a write.
pub(crate) const REFUSED: &str = "a constraint or trigger refused the write";
/// A serialization failure or a deadlock: the whole transaction is retried (a bounded
/// number of times, then `Busy`). Never answered to a caller as such.
pub(crate) const CONFLICT: &str = "a concurrent transaction conflicted";
/// The database named in the connection string does not exist.
pub(crate) const NO_DATABASE: &str = "the database does not exist";
/// Any other server error.
const GENERIC: &str = "a PostgreSQL error";
/// A connection that could not be made.
pub(crate) const UNREACHABLE: &str = "could not connect to the server";
/// A server that accepted the connection but did not finish its startup within the
/// wait bound (stopped, overloaded, or not a PostgreSQL server at all).
pub(crate) const UNANSWERED: &str = "the server did not answer within the wait bound";

/// A connection abandoned after an exchange ran past its bound: never used again, so
/// the store makes a new one (see [`is_lost`]).
pub(crate) fn abandoned() -> StoreError {
    fail(FailureKind::LostConnection, LOST)
}

/// A failure described by `what`, with no underlying error.
pub(crate) fn failed(what: &'static str) -> StoreError {
    StoreError::failed(BACKEND, what)
}

/// A failure of `kind` described by `what`, with no underlying error.
pub(crate) fn fail(kind: FailureKind, what: &'static str) -> StoreError {
    StoreError::of_kind(BACKEND, kind, what)
}

/// Whether `err` is a lost connection (the store must reconnect before its next call).
pub(crate) fn is_lost(err: &StoreError) -> bool {
    err.failure_kind() == Some(FailureKind::LostConnection)
}

/// Whether `err` asks for the whole transaction to be run again.
pub(crate) fn is_conflict(err: &StoreError) -> bool {
    err.failure_kind() == Some(FailureKind::Conflict)
}

/// Maps any driver error to a kind and fixed words, from its SQLSTATE (or, without
/// one, from whether the socket failed), never from the server's message.
pub(crate) fn pg(err: postgres::Error) -> StoreError {
    if err.is_closed() {
        return StoreError::caused(BACKEND, FailureKind::LostConnection, LOST, err);
    }
    let (kind, what) = match err.as_db_error() {
        Some(db) => match by_code(db.code()) {
            // Any other error the server ends the session with (an idle-session
            // timeout, an administrator's command): the connection is gone.
            Ok((FailureKind::Other, GENERIC))
                if matches!(db.parsed_severity(), Some(Severity::Fatal | Severity::Panic)) =>
            {
                (FailureKind::LostConnection, LOST)
            }
            Ok(found) => found,
            Err(answer) => return answer,
        },
        // No server error: the socket (an I/O error is a lost connection), or the
        // protocol.
        None if io_cause(&err) => (FailureKind::LostConnection, LOST),
        None => (FailureKind::Other, "a PostgreSQL client error"),
    };
    StoreError::caused(BACKEND, kind, what, err)
}

/// The kind and fixed words for a server error, or the whole answer when it is not a
/// failure of the backend as such (a lock wait that timed out, corruption).
fn by_code(code: &SqlState) -> Result<(FailureKind, &'static str), StoreError> {
    use FailureKind::{Conflict, LostConnection, NoDatabase, Other, Refused, Unreachable};
    let text = code.code();
    Ok(match text {
        // lock_not_available: `lock_timeout` ran out (or NOWAIT).
        "55P03" => return Err(StoreError::Busy),
        "XX001" | "XX002" => return Err(StoreError::Corrupt),
        "40001" | "40P01" => (Conflict, CONFLICT),
        "53100" => (Other, "the disk is full"),
        "53200" => (Other, "the server is out of memory"),
        "53300" => (Unreachable, "the server has too many connections"),
        "57P01" | "57P02" | "57P03" | "57P05" => (LostConnection, LOST),
        "25006" => (Other, "the database is read-only"),
        "57014" => (Other, "the statement was canceled"),
        "3D000" => (NoDatabase, NO_DATABASE),
        _ if text.starts_with("23") => (Refused, REFUSED),
        _ if text.starts_with("08") => (LostConnection, LOST),
        _ if text.starts_with("28") => (Unreachable, "the server refused the login"),
        _ => (Other, GENERIC),
    })
}

/// Whether the driver's error comes from the socket.
fn io_cause(err: &postgres::Error) -> bool {
    std::error::Error::source(err).is_some_and(|source| source.is::<std::io::Error>())
}

/// Maps an error of making a connection: the server's own refusals keep their words,
/// anything else (refused, unreachable, timed out) is [`UNREACHABLE`].
pub(crate) fn connect(err: postgres::Error) -> StoreError {
    match err.code() {
        Some(_) => pg(err),
        None => StoreError::caused(BACKEND, FailureKind::Unreachable, UNREACHABLE, err),
    }
}

/// A value read back that is not of its column's type: the row contradicts the schema,
/// a contract violation, not a failure.
pub(crate) fn decode(_: postgres::Error) -> StoreError {
    StoreError::ContractViolation("a stored value is not of its column's type")
}

#[cfg(test)]
mod tests {
    use postgres::error::SqlState;
    use toolledger_store::{FailureKind, StoreError};

    use super::by_code;

    #[test]
    fn the_kind_comes_from_the_sqlstate_alone() {
        let kind = |code: SqlState| by_code(&code).map(|(kind, _)| kind);
        assert_eq!(kind(SqlState::T_R_SERIALIZATION_FAILURE), Ok(FailureKind::Conflict));
        assert_eq!(kind(SqlState::T_R_DEADLOCK_DETECTED), Ok(FailureKind::Conflict));
        assert_eq!(kind(SqlState::CONNECTION_FAILURE), Ok(FailureKind::LostConnection));
        assert_eq!(kind(SqlState::ADMIN_SHUTDOWN), Ok(FailureKind::LostConnection));
        assert_eq!(kind(SqlState::INVALID_CATALOG_NAME), Ok(FailureKind::NoDatabase));
        assert_eq!(kind(SqlState::UNIQUE_VIOLATION), Ok(FailureKind::Refused));
        assert_eq!(kind(SqlState::INVALID_PASSWORD), Ok(FailureKind::Unreachable));
        assert_eq!(kind(SqlState::DISK_FULL), Ok(FailureKind::Other));
        assert_eq!(kind(SqlState::LOCK_NOT_AVAILABLE), Err(StoreError::Busy));
        assert_eq!(kind(SqlState::DATA_CORRUPTED), Err(StoreError::Corrupt));
    }
}
