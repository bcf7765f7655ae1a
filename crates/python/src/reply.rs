//! What a call answers: a `Reply` and its typed outcome.

use pyo3::prelude::*;
use serde_json::Value;
use toolledger::Outcome;

use crate::convert::to_python;

/// The receipt members a done outcome carries.
#[derive(Debug, Clone)]
struct Done {
    status_ref: String,
    output: Value,
    result_sha256: String,
    request_sha256: String,
    receipt_ref: String,
}

impl Done {
    fn of(receipt: &toolledger::Receipt) -> Done {
        Done {
            status_ref: receipt.status_ref().as_str().to_owned(),
            output: receipt.output().clone(),
            result_sha256: receipt.result_sha256().to_owned(),
            request_sha256: receipt.request_sha256().to_owned(),
            receipt_ref: receipt.receipt_ref().to_owned(),
        }
    }
}

macro_rules! done_outcome {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[pyclass(frozen, module = "toolledger")]
        #[derive(Debug)]
        pub(crate) struct $name {
            done: Done,
        }

        #[pymethods]
        impl $name {
            /// The operation's status ref (`sr_…`).
            #[getter]
            fn status_ref(&self) -> &str {
                &self.done.status_ref
            }

            /// The tool's output, a new `dict` at each read.
            #[getter]
            fn output<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                to_python(py, &self.done.output)
            }

            /// The result digest binding the output to the tool's output revision.
            #[getter]
            fn result_sha256(&self) -> &str {
                &self.done.result_sha256
            }

            /// The request digest: what was asked, exactly.
            #[getter]
            fn request_sha256(&self) -> &str {
                &self.done.request_sha256
            }

            /// The downstream receipt's ref (`rc_…`).
            #[getter]
            fn receipt_ref(&self) -> &str {
                &self.done.receipt_ref
            }

            /// Always `"OK"`.
            #[getter]
            fn code(&self) -> &'static str {
                "OK"
            }

            /// The effect is done.
            #[getter]
            fn done(&self) -> bool {
                true
            }

            fn __repr__(&self) -> String {
                format!("{}(status_ref={:?})", stringify!($name), self.done.status_ref)
            }
        }
    };
}

done_outcome!(
    Fresh,
    "Done now, by this call: the downstream's receipt, recorded before it was answered."
);
done_outcome!(
    Replayed,
    "Done before: the ledger's receipt, answered again without a second effect."
);
done_outcome!(Reconciled, "Done, as a status query just learned from the downstream.");

macro_rules! pending_outcome {
    ($name:ident, $code:literal, $doc:literal) => {
        #[doc = $doc]
        #[pyclass(frozen, module = "toolledger")]
        #[derive(Debug)]
        pub(crate) struct $name {
            status_ref: String,
        }

        #[pymethods]
        impl $name {
            /// The operation's status ref (`sr_…`): what to query.
            #[getter]
            fn status_ref(&self) -> &str {
                &self.status_ref
            }

            /// The stable code.
            #[getter]
            fn code(&self) -> &'static str {
                $code
            }

            /// Not known to be done.
            #[getter]
            fn done(&self) -> bool {
                false
            }

            /// No output: nothing is known to be done.
            #[getter]
            fn output(&self) -> Option<()> {
                None
            }

            fn __repr__(&self) -> String {
                format!("{}(status_ref={:?})", stringify!($name), self.status_ref)
            }
        }
    };
}

pending_outcome!(
    Unknown,
    "OUTCOME_UNKNOWN",
    "It may or may not have happened: ask `Ledger.status(status_ref)`, and never retry under a new key."
);
pending_outcome!(
    Accepted,
    "ACCEPTED",
    "Accepted and queued (`Ledger.enqueue`): certainly not sent yet; a worker or the relay performs it."
);

/// Refused, or ended without success: `code` says why (`IDEMPOTENCY_CONFLICT`,
/// `INPUT_INVALID`, `AUTHORIZATION_DENIED`, `DOWNSTREAM_REFUSED`, ...).
#[pyclass(frozen, module = "toolledger")]
#[derive(Debug)]
pub(crate) struct Blocked {
    code: &'static str,
    status_ref: Option<String>,
}

#[pymethods]
impl Blocked {
    /// Why, as a stable code.
    #[getter]
    fn code(&self) -> &'static str {
        self.code
    }

    /// The operation, where the caller may see it.
    #[getter]
    fn status_ref(&self) -> Option<&str> {
        self.status_ref.as_deref()
    }

    /// Not done.
    #[getter]
    fn done(&self) -> bool {
        false
    }

    /// No output.
    #[getter]
    fn output(&self) -> Option<()> {
        None
    }

    fn __repr__(&self) -> String {
        match &self.status_ref {
            Some(status_ref) => format!("Blocked(code={:?}, status_ref={status_ref:?})", self.code),
            None => format!("Blocked(code={:?}, status_ref=None)", self.code),
        }
    }
}

/// The answer to one call: `outcome` (one of `Fresh`, `Replayed`, `Reconciled`,
/// `Unknown`, `Accepted`, `Blocked`) and the canonical package a host hands to the model
/// or logs.
#[pyclass(frozen, module = "toolledger")]
#[derive(Debug)]
pub(crate) struct Reply {
    reply: toolledger::Reply,
    outcome: Py<PyAny>,
}

impl Reply {
    pub(crate) fn new(py: Python<'_>, reply: toolledger::Reply) -> PyResult<Reply> {
        let outcome = match reply.outcome() {
            Outcome::Fresh(receipt) => Py::new(py, Fresh { done: Done::of(receipt) })?.into_any(),
            Outcome::Replayed(receipt) => {
                Py::new(py, Replayed { done: Done::of(receipt) })?.into_any()
            }
            Outcome::Reconciled(receipt) => {
                Py::new(py, Reconciled { done: Done::of(receipt) })?.into_any()
            }
            Outcome::Unknown { status_ref } => {
                Py::new(py, Unknown { status_ref: status_ref.as_str().to_owned() })?.into_any()
            }
            Outcome::Accepted { status_ref } => {
                Py::new(py, Accepted { status_ref: status_ref.as_str().to_owned() })?.into_any()
            }
            Outcome::Blocked { code, status_ref } => Py::new(
                py,
                Blocked {
                    code: code.as_str(),
                    status_ref: status_ref.as_ref().map(|sr| sr.as_str().to_owned()),
                },
            )?
            .into_any(),
        };
        Ok(Reply { reply, outcome })
    }
}

#[pymethods]
impl Reply {
    /// The typed outcome.
    #[getter]
    fn outcome(&self, py: Python<'_>) -> Py<PyAny> {
        self.outcome.clone_ref(py)
    }

    /// The package's code: `OK`, or why not.
    #[getter]
    fn code(&self) -> &str {
        self.reply.package().get("code").and_then(Value::as_str).unwrap_or_default()
    }

    /// The operation's status ref, when the package shows one.
    #[getter]
    fn status_ref(&self) -> Option<&str> {
        self.reply.status_ref().map(|sr| sr.as_str())
    }

    /// The tool's output when the effect is done, else `None`.
    #[getter]
    fn output<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.reply.outcome() {
            Outcome::Fresh(receipt) | Outcome::Replayed(receipt) | Outcome::Reconciled(receipt) => {
                to_python(py, receipt.output()).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Whether the effect is done (fresh, replayed or reconciled).
    #[getter]
    fn done(&self) -> bool {
        self.reply.outcome().is_done()
    }

    /// What the ledger decided, as a trace says it (`toolledger.decision`): `fresh`,
    /// `replay`, `reconciled`, `accepted`, `outcome_unknown`, `conflict`,
    /// `approval_required` or `blocked`.
    #[getter]
    fn decision(&self) -> &'static str {
        self.reply.decision()
    }

    /// A trace's `error.type`: the code when the call did not end as asked, else `None`.
    #[getter]
    fn error_type(&self) -> Option<&'static str> {
        self.reply.error_type()
    }

    /// The package (Tool Result v2 PASS, or BLOCK) as a new `dict`.
    #[getter]
    fn package<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, self.reply.package())
    }

    /// The package in canonical JSON (RFC 8785): byte for byte what the command line
    /// prints.
    fn canonical(&self) -> String {
        self.reply.canonical()
    }

    fn __repr__(&self) -> String {
        match self.status_ref() {
            Some(status_ref) => format!("Reply(code={:?}, status_ref={status_ref:?})", self.code()),
            None => format!("Reply(code={:?}, status_ref=None)", self.code()),
        }
    }
}

/// Adds the classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Reply>()?;
    module.add_class::<Fresh>()?;
    module.add_class::<Replayed>()?;
    module.add_class::<Reconciled>()?;
    module.add_class::<Unknown>()?;
    module.add_class::<Accepted>()?;
    module.add_class::<Blocked>()?;
    Ok(())
}
