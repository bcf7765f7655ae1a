//! Downstreams written in Python, the host's role resolver, and the routing of each tool
//! to the downstream that performs it.
//!
//! A Python downstream is any object with `identity` (`"name@revision"`), `execute(request)`
//! and `lookup(request)`. Its answers are `Receipt`, `NotSent`, `Refused` or `Unknown`
//! (`toolledger.downstream`). An exception raised by `execute`, or an answer of any other
//! type, is `Unknown`: the code ran, so the request may have left. Nothing a Python
//! downstream does is ever read as "nothing happened" unless it says `NotSent` itself.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use pyo3::{prelude::*, types::PyTuple};
use serde_json::Value;
use toolledger::{
    Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest,
    Identifier, Lookup, Now, PrincipalResolver, ResolverError, Simulated, http::HttpDownstream,
};

use crate::convert::{to_python, to_value};

/// What a downstream is handed: the operation's request, from the ledger.
#[pyclass(frozen, module = "toolledger.downstream")]
#[derive(Debug)]
pub(crate) struct Request {
    request_ref: String,
    request_sha256: String,
    tool: String,
    output_revision: String,
    arguments: Value,
}

#[pymethods]
impl Request {
    /// The scope the downstream must be idempotent on (`dr_…`): send it as the
    /// service's idempotency key, and answer the first result again when it comes twice.
    #[getter]
    fn request_ref(&self) -> &str {
        &self.request_ref
    }

    /// The request digest: the request's fingerprint.
    #[getter]
    fn request_sha256(&self) -> &str {
        &self.request_sha256
    }

    /// The tool's name.
    #[getter]
    fn tool(&self) -> &str {
        &self.tool
    }

    /// The output revision the receipt is recorded under.
    #[getter]
    fn output_revision(&self) -> &str {
        &self.output_revision
    }

    /// The arguments, as the ledger holds them (a new `dict` at each read).
    #[getter]
    fn arguments<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.arguments)
    }

    fn __repr__(&self) -> String {
        format!("Request(tool={:?}, request_ref={:?})", self.tool, self.request_ref)
    }
}

/// The effect is done: `output` is the tool's output (it must satisfy the tool's output
/// schema and bindings, or the receipt is quarantined, not trusted).
#[pyclass(frozen, name = "Receipt", module = "toolledger.downstream")]
#[derive(Debug)]
pub(crate) struct ReceiptAnswer {
    output: Py<PyAny>,
}

#[pymethods]
impl ReceiptAnswer {
    #[new]
    fn new(output: Py<PyAny>) -> ReceiptAnswer {
        ReceiptAnswer { output }
    }

    /// The output.
    #[getter]
    fn output(&self, py: Python<'_>) -> Py<PyAny> {
        self.output.clone_ref(py)
    }

    fn __repr__(&self) -> &'static str {
        "Receipt(...)"
    }
}

macro_rules! reason_answer {
    ($name:ident, $python:literal, $doc:literal) => {
        #[doc = $doc]
        #[pyclass(frozen, name = $python, module = "toolledger.downstream")]
        #[derive(Debug)]
        pub(crate) struct $name {
            reason: String,
        }

        #[pymethods]
        impl $name {
            #[new]
            #[pyo3(signature = (reason = String::new()))]
            fn new(reason: String) -> $name {
                $name { reason }
            }

            /// Why, for logs (a refusal's reason is kept with the operation).
            #[getter]
            fn reason(&self) -> &str {
                &self.reason
            }

            fn __repr__(&self) -> String {
                format!("{}({:?})", $python, self.reason)
            }
        }
    };
}

reason_answer!(
    NotSentAnswer,
    "NotSent",
    "The request certainly did not leave (connection refused, the service said busy): the operation stays accepted and is tried again. From `lookup`: the downstream has no record of the request."
);
reason_answer!(
    RefusedAnswer,
    "Refused",
    "The downstream refused the request for good (card declined): nothing happened and nothing will."
);
reason_answer!(
    UnknownAnswer,
    "Unknown",
    "The request may have been carried out (a timeout after sending, a reset): the outcome is unknown until a lookup tells."
);

/// A Python object that performs one or more tools' effects.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    object: Arc<Py<PyAny>>,
    identity: DownstreamIdentity,
    /// Its `can_look_up` attribute (default true): whether its `lookup` can find what
    /// it performed. A success of one that cannot is synced before it is answered.
    can_look_up: bool,
}

impl Target {
    /// `object`, which must say who it is (`identity = "name@revision"`).
    pub(crate) fn new(object: &Bound<'_, PyAny>) -> PyResult<Target> {
        let refused = || {
            crate::errors::invalid(
                "a downstream says who it is: an `identity` attribute such as \"payments@1\""
                    .to_owned(),
            )
        };
        let text: String =
            object.getattr("identity").map_err(|_| refused())?.extract().map_err(|_| refused())?;
        let (name, revision) = text.rsplit_once('@').ok_or_else(refused)?;
        let identity = DownstreamIdentity::new(name, revision).map_err(|_| refused())?;
        let can_look_up = match object.getattr_opt("can_look_up")? {
            Some(flag) => flag.extract::<bool>().map_err(|_| {
                crate::errors::invalid(
                    "a downstream's `can_look_up`, when it has one, is True or False".to_owned(),
                )
            })?,
            None => true,
        };
        Ok(Target { object: Arc::new(object.clone().unbind()), identity, can_look_up })
    }

    fn execute(&self, request: &DownstreamRequest) -> Result<DownstreamReceipt, DownstreamError> {
        Python::attach(|py| {
            let handed = Request::of(request);
            let execute = self.object.bind(py).getattr("execute");
            let called = (handed,).into_pyobject(py);
            let answer = match execute.and_then(|execute| call_hosted(&execute, called?)) {
                Ok(answer) => answer,
                Err(err) => return Err(unknown(raised(py, &err))),
            };
            if let Ok(receipt) = answer.cast::<ReceiptAnswer>() {
                return match to_value(receipt.get().output.bind(py), "the receipt's output") {
                    Ok(output) => Ok(request.receipt(output)),
                    Err(_) => Err(unknown(
                        "the downstream's receipt holds an output that is not JSON".to_owned(),
                    )),
                };
            }
            if let Ok(not_sent) = answer.cast::<NotSentAnswer>() {
                return Err(DownstreamError::NotSent { reason: not_sent.get().reason.clone() });
            }
            if let Ok(refused) = answer.cast::<RefusedAnswer>() {
                return Err(DownstreamError::Refused { reason: refused.get().reason.clone() });
            }
            if let Ok(unknown_answer) = answer.cast::<UnknownAnswer>() {
                return Err(unknown(unknown_answer.get().reason.clone()));
            }
            Err(unknown(format!(
                "the downstream answered a {}, not a Receipt, NotSent, Refused or Unknown",
                type_name(&answer)
            )))
        })
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Python::attach(|py| {
            let handed = Request::of(request);
            let lookup = self.object.bind(py).getattr("lookup");
            let called = (handed,).into_pyobject(py);
            let answer = match lookup.and_then(|lookup| call_hosted(&lookup, called?)) {
                Ok(answer) => answer,
                Err(err) => return Err(unknown(raised(py, &err))),
            };
            if let Ok(receipt) = answer.cast::<ReceiptAnswer>() {
                return match to_value(receipt.get().output.bind(py), "the receipt's output") {
                    Ok(output) => Ok(Lookup::Done(request.receipt(output))),
                    Err(_) => Err(unknown(
                        "the lookup's receipt holds an output that is not JSON".to_owned(),
                    )),
                };
            }
            if answer.cast::<NotSentAnswer>().is_ok() {
                return Ok(Lookup::NotFound);
            }
            if let Ok(refused) = answer.cast::<RefusedAnswer>() {
                return Ok(Lookup::Refused { reason: refused.get().reason.clone() });
            }
            if let Ok(unknown_answer) = answer.cast::<UnknownAnswer>() {
                return Err(unknown(unknown_answer.get().reason.clone()));
            }
            Err(unknown(format!(
                "the lookup answered a {}, not a Receipt, NotSent, Refused or Unknown",
                type_name(&answer)
            )))
        })
    }
}

impl Request {
    fn of(request: &DownstreamRequest) -> Request {
        Request {
            request_ref: request.downstream_request_ref.as_str().to_owned(),
            request_sha256: request.request_sha256.as_str().to_owned(),
            tool: request.tool_name.clone(),
            output_revision: request.output_revision.clone(),
            arguments: request.arguments.clone(),
        }
    }
}

fn unknown(reason: String) -> DownstreamError {
    DownstreamError::Unknown { reason }
}

/// An exception's type only: its text may hold anything (a path, a secret).
fn raised(py: Python<'_>, err: &PyErr) -> String {
    let kind = err.get_type(py).name().map(|name| name.to_string()).unwrap_or_default();
    format!("the downstream raised {kind}; the request may have left")
}

fn type_name(object: &Bound<'_, PyAny>) -> String {
    object.get_type().name().map(|name| name.to_string()).unwrap_or_default()
}

/// Who performs each tool: the simulation (the command line's stand-in refund API), or
/// the configuration's HTTP services and Python objects, each tool to one.
#[derive(Debug)]
pub(crate) enum Wired {
    /// The simulated downstream, alone.
    Simulated(Simulated),
    /// HTTP services and Python objects.
    Routed(Routed),
}

/// HTTP services and Python objects, by tool.
#[derive(Debug)]
pub(crate) struct Routed {
    /// The configuration's services, for the tools routed to one.
    pub(crate) http: Option<HttpDownstream>,
    /// The tools the configuration routes to one of its services.
    pub(crate) http_tools: BTreeSet<String>,
    /// A Python object per tool.
    pub(crate) python: BTreeMap<String, Target>,
    /// The Python object of every other tool.
    pub(crate) fallback: Option<Target>,
    /// Who answers for tools of no one (a call of one is refused before anything is
    /// accepted: the tool is not registered).
    pub(crate) nobody: DownstreamIdentity,
}

impl Routed {
    fn python_for(&self, tool: &str) -> Option<&Target> {
        match self.python.get(tool) {
            Some(target) => Some(target),
            None if self.http_tools.contains(tool) => None,
            None => self.fallback.as_ref(),
        }
    }
}

impl Downstream for Wired {
    fn identity(&self) -> &DownstreamIdentity {
        match self {
            Wired::Simulated(simulated) => simulated.identity(),
            Wired::Routed(routed) => match (&routed.fallback, &routed.http) {
                (Some(target), _) => &target.identity,
                (None, Some(http)) => http.identity(),
                (None, None) => &routed.nobody,
            },
        }
    }

    fn identity_for(&self, tool: &str) -> &DownstreamIdentity {
        match self {
            Wired::Simulated(simulated) => simulated.identity_for(tool),
            Wired::Routed(routed) => match (routed.python_for(tool), &routed.http) {
                (Some(target), _) => &target.identity,
                (None, Some(http)) => http.identity_for(tool),
                (None, None) => &routed.nobody,
            },
        }
    }

    fn identities(&self) -> Vec<DownstreamIdentity> {
        match self {
            Wired::Simulated(simulated) => simulated.identities(),
            Wired::Routed(routed) => {
                let mut all: Vec<DownstreamIdentity> = Vec::new();
                let python = routed.python.values().chain(routed.fallback.iter());
                let http = routed.http.iter().flat_map(Downstream::identities);
                for identity in python.map(|target| target.identity.clone()).chain(http) {
                    if !all.contains(&identity) {
                        all.push(identity);
                    }
                }
                all
            }
        }
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        match self {
            Wired::Simulated(simulated) => simulated.execute(request, now),
            Wired::Routed(routed) => match routed.python_for(&request.tool_name) {
                Some(target) => target.execute(request),
                None => match &routed.http {
                    Some(http) => http.execute(request, now),
                    None => Err(DownstreamError::NotSent {
                        reason: "no downstream performs this tool".to_owned(),
                    }),
                },
            },
        }
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        match self {
            Wired::Simulated(simulated) => simulated.lookup(request),
            Wired::Routed(routed) => match routed.python_for(&request.tool_name) {
                Some(target) => target.lookup(request),
                None => match &routed.http {
                    Some(http) => http.lookup(request),
                    None => Ok(Lookup::NotFound),
                },
            },
        }
    }

    fn can_look_up(&self, tool: &str) -> bool {
        match self {
            Wired::Simulated(simulated) => simulated.can_look_up(tool),
            Wired::Routed(routed) => {
                routed.python_for(tool).is_none_or(|target| target.can_look_up)
            }
        }
    }

    fn is_simulation(&self) -> bool {
        matches!(self, Wired::Simulated(_))
    }
}

/// The host's role resolver: a callable `(tenant, subject) -> list[str]`, asked at every
/// step (roles are never stored); `None` holds no roles.
#[derive(Debug, Clone)]
pub(crate) struct Roles(pub(crate) Option<Arc<Py<PyAny>>>);

impl PrincipalResolver for Roles {
    fn current_roles(
        &self,
        tenant_id: &Identifier,
        subject_id: &Identifier,
    ) -> Result<Vec<String>, ResolverError> {
        let Some(resolver) = &self.0 else { return Ok(Vec::new()) };
        Python::attach(|py| {
            let asked = (tenant_id.as_str(), subject_id.as_str()).into_pyobject(py);
            let answer = asked.and_then(|asked| call_hosted(resolver.bind(py), asked)).map_err(
                |raised| {
                    // The host's own exception becomes the `__cause__` of the
                    // `RolesError` this call raises.
                    crate::errors::keep_cause(raised);
                    ResolverError::Unavailable
                },
            )?;
            answer.extract::<Vec<String>>().map_err(|_| {
                ResolverError::Invalid("the resolver did not answer a list of str".to_owned())
            })
        })
    }
}

thread_local! {
    /// The host's `contextvars.Context` of the awaited call this thread works (see
    /// `soon`): the host's code it calls runs in it, as it would have on the awaiting
    /// coroutine's own thread. Taken out while that code runs, so a call it makes in
    /// turn runs in the context already entered.
    static CONTEXT: std::cell::RefCell<Option<Py<PyAny>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `work` with `context` as the host's context of the calls it makes to Python.
pub(crate) fn in_context<T>(context: Py<PyAny>, work: impl FnOnce() -> T) -> T {
    CONTEXT.with_borrow_mut(|held| *held = Some(context));
    let answer = work();
    CONTEXT.with_borrow_mut(Option::take);
    answer
}

/// Calls the host's `callable` with `args`, in the host's context of the call this
/// thread works, if any.
fn call_hosted<'py>(
    callable: &Bound<'py, PyAny>,
    args: Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = callable.py();
    let Some(context) = CONTEXT.with_borrow_mut(Option::take) else {
        return callable.call1(args);
    };
    let mut all = vec![callable.clone()];
    all.extend(args.iter());
    let answer = PyTuple::new(py, all).and_then(|all| context.bind(py).call_method1("run", all));
    CONTEXT.with_borrow_mut(|held| *held = Some(context));
    answer
}

/// Adds the classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("_Request", py.get_type::<Request>())?;
    module.add("_Receipt", py.get_type::<ReceiptAnswer>())?;
    module.add("_NotSent", py.get_type::<NotSentAnswer>())?;
    module.add("_Refused", py.get_type::<RefusedAnswer>())?;
    module.add("_Unknown", py.get_type::<UnknownAnswer>())?;
    Ok(())
}
