//! `toolledger.Error` and its subclasses: every failure a call can have before anything
//! was accepted, each with the stable `.code` the command line prints.

use pyo3::{create_exception, exceptions::PyException, prelude::*};

create_exception!(
    toolledger,
    Error,
    PyException,
    "Why a call could not be answered at all: nothing was accepted. `.code` is the stable code (e.g. `USAGE_ERROR`, `STORE_BUSY`), `.message` says why."
);
create_exception!(
    toolledger,
    InvalidError,
    Error,
    "A call, a tool, a setting or a file that is not valid (`USAGE_ERROR`, `FIXTURE_INVALID`, `CLAIMS_INVALID`, ...): nothing was written."
);
create_exception!(
    toolledger,
    StoreError,
    Error,
    "The store failed, was busy past its wait bound, is missing, or is of another schema (`STORE_ERROR`, `STORE_BUSY`, `STORE_NOT_FOUND`, `SCHEMA_UNSUPPORTED`, `STORE_CONTRACT_VIOLATION`)."
);
create_exception!(
    toolledger,
    RolesError,
    Error,
    "The host's role resolver failed or answered something that is not a list of role names (`ROLES_UNAVAILABLE`, `ROLES_INVALID`)."
);

thread_local! {
    /// The host's exception behind the facade error this thread is about to raise (a
    /// role resolver that raised), kept for its `__cause__`.
    static CAUSE: std::cell::RefCell<Option<PyErr>> = const { std::cell::RefCell::new(None) };
}

/// Keeps `raised`, the host's own exception, as the cause of the error this call
/// raises next on this thread.
pub(crate) fn keep_cause(raised: PyErr) {
    CAUSE.with_borrow_mut(|cause| *cause = Some(raised));
}

/// The host's exception this thread kept for the error it raises next, taken.
pub(crate) fn take_cause() -> Option<PyErr> {
    CAUSE.with_borrow_mut(Option::take)
}

/// The Python exception for a facade error, with `.code` and `.message` set, and the
/// host's own exception that caused it on this thread (a role resolver's) as its
/// `__cause__`.
pub(crate) fn raise(error: &toolledger::Error) -> PyErr {
    raise_caused(error, take_cause())
}

/// [`raise`], with the host's exception `cause` kept by the thread that worked the call.
pub(crate) fn raise_caused(error: &toolledger::Error, cause: Option<PyErr>) -> PyErr {
    use toolledger::ErrorCode as Code;
    let code = error.code();
    let message = error.to_string();
    let err = match code {
        Code::StoreError
        | Code::StoreBusy
        | Code::StoreNotFound
        | Code::SchemaUnsupported
        | Code::StoreContractViolation => StoreError::new_err(message.clone()),
        Code::RolesUnavailable | Code::RolesInvalid => RolesError::new_err(message.clone()),
        Code::UsageError | Code::FixtureInvalid | Code::FixtureIoError => {
            InvalidError::new_err(message.clone())
        }
        _ => Error::new_err(message.clone()),
    };
    if let (Code::RolesUnavailable, Some(cause)) = (code, cause) {
        Python::attach(|py| err.set_cause(py, Some(cause)));
    }
    annotate(err, code.as_str(), &message)
}

/// An `InvalidError` (`USAGE_ERROR`) saying `message`.
pub(crate) fn invalid(message: String) -> PyErr {
    let err = InvalidError::new_err(message.clone());
    annotate(err, "USAGE_ERROR", &message)
}

/// An `InvalidError` carrying a BLOCK code: an operator action the ledger refused.
pub(crate) fn blocked(code: &str, message: &str) -> PyErr {
    annotate(InvalidError::new_err(message.to_owned()), code, message)
}

fn annotate(err: PyErr, code: &str, message: &str) -> PyErr {
    Python::attach(|py| {
        let value = err.value(py);
        // Setting an attribute on a fresh exception instance cannot fail; if it ever did,
        // the exception still says why in its text.
        let _ = value.setattr("code", code);
        let _ = value.setattr("message", message);
    });
    err
}

/// Adds the exception classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("Error", py.get_type::<Error>())?;
    module.add("InvalidError", py.get_type::<InvalidError>())?;
    module.add("StoreError", py.get_type::<StoreError>())?;
    module.add("RolesError", py.get_type::<RolesError>())?;
    Ok(())
}
