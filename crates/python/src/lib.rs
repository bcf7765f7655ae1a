//! `toolledger._toolledger`: the ledger for Python hosts, over the `toolledger` facade.
//!
//! The Python package (`crates/python/python/toolledger`) re-exports what is here and
//! adds the pure-Python layer (the `@ledger.tool` decorator, the framework adapters).
//! Every call goes through the facade, as the command line's and the MCP gateway's do:
//! one door, one set of answers. The GIL is released for the store's I/O and the
//! downstream's HTTP; a Python downstream takes it back only while its own code runs.
//! `docs/python.md` is the user's guide.

mod convert;
mod downstream;
mod errors;
mod reply;
mod soon;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use pyo3::{
    prelude::*,
    types::{PyDict, PyList},
};
use serde_json::{Value, json};
use toolledger::{
    Config, DownstreamIdentity, Evidence, ListFilter, Location, ProviderProfile, RefundOrder,
    Relay, Requeued, StatusQuery, StatusRef, ToolDefinition, ToolSpec, Until,
};

use crate::{
    convert::{to_call_value, to_python, to_value},
    downstream::{Roles, Routed, Target, Wired},
    errors::{invalid, raise},
    soon::{Completions, Finished},
};

/// An awaited call's delivery (`_ledger.py`'s `_soon`): the loop's completions, the
/// call's id there, the host's `contextvars.Context`, and the pool's size. A method
/// given one starts the call on the pool and returns `None`.
type Soon = (Py<Completions>, u64, Py<PyAny>, usize);

/// The profile of a call that names no model call: one key is one model call
/// (`docs/python.md`, "One model call").
fn python_profile() -> ProviderProfile {
    ProviderProfile::new("python", "function_call", "toolledger-python-1")
}

/// A tool: its name, description, JSON Schemas (draft 2020-12) and policies, checked and
/// compiled when it is made (`docs/tools.md` holds every member).
#[pyclass(frozen, from_py_object, module = "toolledger")]
#[derive(Clone)]
struct Tool {
    spec: ToolSpec,
    document: Value,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool").field("name", &self.spec.name).finish_non_exhaustive()
    }
}

#[pymethods]
impl Tool {
    #[new]
    #[pyo3(signature = (name, *, description, input_schema, output_schema, output_bindings = None, revisions = None, approval = None, authorization = None, max_attempts = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: &str,
        description: &str,
        input_schema: &Bound<'_, PyAny>,
        output_schema: &Bound<'_, PyAny>,
        output_bindings: Option<&Bound<'_, PyAny>>,
        revisions: Option<&Bound<'_, PyAny>>,
        approval: Option<&Bound<'_, PyAny>>,
        authorization: Option<&Bound<'_, PyAny>>,
        max_attempts: Option<i64>,
    ) -> PyResult<Tool> {
        let mut document = json!({
            "name": name,
            "description": description,
            "input_schema": to_value(input_schema, "the input schema")?,
            "output_schema": to_value(output_schema, "the output schema")?,
        });
        let optional = [
            ("output_bindings", output_bindings),
            ("revisions", revisions),
            ("approval", approval),
            ("authorization", authorization),
        ];
        for (member, given) in optional {
            if let (Some(given), Some(members)) = (given, document.as_object_mut()) {
                members.insert(member.to_owned(), to_value(given, member)?);
            }
        }
        if let (Some(attempts), Some(members)) = (max_attempts, document.as_object_mut()) {
            members.insert("max_attempts".to_owned(), json!(attempts));
        }
        let file = format!("tool {name}");
        let definition = ToolDefinition::from_document(&file, &document)
            .map_err(|err| invalid(err.to_string()))?;
        Ok(Tool { spec: definition.tool(), document })
    }

    /// Reads a definition file (TOML, or JSON when the name ends in `.json`).
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Tool> {
        let definition = toolledger::load_tool(&path).map_err(|err| raise(&err))?;
        let document = json!({
            "name": definition.name,
            "description": definition.description,
            "input_schema": definition.input.document().clone(),
            "output_schema": definition.output.document().clone(),
            "approval": {"required": definition.approval.required},
        });
        Ok(Tool { spec: definition.tool(), document })
    }

    /// The built-in `refund_order` (its rules read the orders in the call's context);
    /// refunds above `approval_threshold_minor` need an approval.
    #[staticmethod]
    #[pyo3(signature = (approval_threshold_minor = None))]
    fn refund_order(approval_threshold_minor: Option<i64>) -> Tool {
        let spec = RefundOrder { approval_threshold_minor }.tool();
        let document = json!({"name": spec.name});
        Tool { spec, document }
    }

    /// The tool's name.
    #[getter]
    fn name(&self) -> &str {
        &self.spec.name
    }

    /// The description given to the model (`None` for a built-in tool).
    #[getter]
    fn description(&self) -> Option<&str> {
        self.document.get("description").and_then(Value::as_str)
    }

    /// The input schema, as a new `dict` (`None` for a built-in tool).
    #[getter]
    fn input_schema<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.document.get("input_schema").map(|schema| to_python(py, schema)).transpose()
    }

    /// The output schema, as a new `dict` (`None` for a built-in tool).
    #[getter]
    fn output_schema<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.document.get("output_schema").map(|schema| to_python(py, schema)).transpose()
    }

    /// Whether a call of it needs an approval bound to the call.
    #[getter]
    fn requires_approval(&self) -> bool {
        self.document.pointer("/approval/required").and_then(Value::as_bool).unwrap_or(false)
    }

    fn __repr__(&self) -> String {
        format!("Tool({:?})", self.spec.name)
    }
}

/// The model call a tool call came from: a registered provider profile and the ids the
/// provider gave the response and the call. One model call is one intent.
#[pyclass(frozen, from_py_object, module = "toolledger")]
#[derive(Debug, Clone)]
struct ModelCall {
    profile: (String, String, String),
    response_id: String,
    call_id: String,
}

#[pymethods]
impl ModelCall {
    #[new]
    fn new(
        provider: String,
        api_family: String,
        adapter_revision: String,
        response_id: String,
        call_id: String,
    ) -> ModelCall {
        ModelCall { profile: (provider, api_family, adapter_revision), response_id, call_id }
    }

    /// The call's id.
    #[getter]
    fn call_id(&self) -> &str {
        &self.call_id
    }

    /// The response's id.
    #[getter]
    fn response_id(&self) -> &str {
        &self.response_id
    }

    fn __repr__(&self) -> String {
        format!("ModelCall({:?}, {:?})", self.response_id, self.call_id)
    }
}

impl ModelCall {
    fn facade(&self) -> toolledger::ModelCall {
        let (provider, api, revision) = &self.profile;
        toolledger::ModelCall::new(provider, api, revision, &self.response_id, &self.call_id)
    }
}

/// An approval as the approver gave it; the ledger binds it to the call's digest.
#[pyclass(frozen, from_py_object, module = "toolledger")]
#[derive(Debug, Clone)]
struct Approval {
    grant: toolledger::Grant,
    eligible_approvers: Vec<String>,
}

#[pymethods]
impl Approval {
    #[new]
    #[pyo3(signature = (approval_id, approver_id, approved_at, expires_at, *, eligible_approvers = Vec::new()))]
    fn new(
        approval_id: String,
        approver_id: String,
        approved_at: i64,
        expires_at: i64,
        eligible_approvers: Vec<String>,
    ) -> Approval {
        let grant = toolledger::Grant { approval_id, approver_id, approved_at, expires_at };
        Approval { grant, eligible_approvers }
    }

    fn __repr__(&self) -> String {
        format!("Approval({:?}, approver={:?})", self.grant.approval_id, self.grant.approver_id)
    }
}

/// One tool call: the tool, its arguments, the idempotency key, who asks, and optionally
/// the model call, the business context the tool's rules read, an approval and the
/// instant (Unix seconds; the wall clock when `None`).
#[pyclass(frozen, module = "toolledger")]
#[derive(Debug, Clone)]
struct Call {
    tool: String,
    arguments: Value,
    key: String,
    tenant: Option<String>,
    subject: Option<String>,
    model_call: Option<ModelCall>,
    context: Value,
    approval: Option<Approval>,
    at: Option<i64>,
    operation_id: Option<String>,
}

#[pymethods]
impl Call {
    #[new]
    #[pyo3(signature = (tool, arguments, *, key, tenant = None, subject = None, model_call = None, context = None, approval = None, at = None, operation_id = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        tool: String,
        arguments: &Bound<'_, PyAny>,
        key: String,
        tenant: Option<String>,
        subject: Option<String>,
        model_call: Option<ModelCall>,
        context: Option<&Bound<'_, PyAny>>,
        approval: Option<Approval>,
        at: Option<i64>,
        operation_id: Option<String>,
    ) -> PyResult<Call> {
        let arguments = to_call_value(arguments, "the arguments")?;
        let context = match context {
            Some(context) => to_value(context, "the context")?,
            None => Value::Object(serde_json::Map::new()),
        };
        Ok(Call {
            tool,
            arguments,
            key,
            tenant,
            subject,
            model_call,
            context,
            approval,
            at,
            operation_id,
        })
    }

    /// The tool's name.
    #[getter]
    fn tool(&self) -> &str {
        &self.tool
    }

    /// The idempotency key.
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// The model call it came from, when the host named one.
    #[getter]
    fn model_call(&self) -> Option<ModelCall> {
        self.model_call.clone()
    }

    /// The arguments (a new `dict` at each read).
    #[getter]
    fn arguments<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.arguments)
    }

    fn __repr__(&self) -> String {
        format!("Call({:?}, key={:?})", self.tool, self.key)
    }
}

/// The Python host's span of a call, as the package's Python side hands it over (its
/// `traceparent` and `tracestate`, empty when it has none): the call's own span, which
/// the ledger's steps are children of (`docs/python.md`, "Traces").
type Trace = (String, String);

/// `call` in the Python host's span `trace`, when the package traces it.
fn traced(call: toolledger::Call, trace: Option<Trace>) -> toolledger::Call {
    let Some((traceparent, tracestate)) = trace else { return call };
    let call = call.in_host_span();
    match toolledger::TraceContext::parse(&traceparent, &tracestate) {
        Some(parent) => call.trace_parent(parent),
        None => call,
    }
}

impl Call {
    /// The facade's call, the principal defaulting to the ledger's.
    fn facade(&self, principal: &DefaultPrincipal) -> PyResult<toolledger::Call> {
        let (tenant, subject) = principal.of(self.tenant.as_deref(), self.subject.as_deref())?;
        let model_call = match &self.model_call {
            Some(model_call) => model_call.facade(),
            None => toolledger::ModelCall::keyed(
                python_profile(),
                "py",
                tenant,
                subject,
                &self.tool,
                &self.key,
            ),
        };
        let mut call = toolledger::Call::new(&self.tool, self.arguments.clone())
            .principal(tenant, subject)
            .idempotency_key(&self.key)
            .model_call(model_call)
            .context(self.context.clone());
        if let Some(approval) = &self.approval {
            let approvers: Vec<&str> =
                approval.eligible_approvers.iter().map(String::as_str).collect();
            call = call.approval(approval.grant.clone(), &approvers);
        }
        if let Some(at) = self.at {
            call = call.at(at);
        }
        if let Some(operation_id) = &self.operation_id {
            call = call.operation_id(operation_id);
        }
        Ok(call)
    }
}

/// The ledger's default principal, for calls that name none.
#[derive(Debug, Clone, Default)]
struct DefaultPrincipal {
    tenant: Option<String>,
    subject: Option<String>,
}

impl DefaultPrincipal {
    fn of<'a>(
        &'a self,
        tenant: Option<&'a str>,
        subject: Option<&'a str>,
    ) -> PyResult<(&'a str, &'a str)> {
        match (tenant.or(self.tenant.as_deref()), subject.or(self.subject.as_deref())) {
            (Some(tenant), Some(subject)) => Ok((tenant, subject)),
            _ => Err(invalid(
                "the call names no principal: give tenant= and subject= to the call or to Ledger.open"
                    .to_owned(),
            )),
        }
    }
}

/// How to build the ledger's downstream and resolver again (after a tool is registered,
/// and once per relay worker).
#[derive(Debug, Clone)]
struct Recipe {
    location: Location,
    config: Option<Arc<Config>>,
    tools: Vec<ToolSpec>,
    python: BTreeMap<String, Target>,
    fallback: Option<Target>,
    simulated: bool,
    roles: Roles,
    profiles: Vec<ProviderProfile>,
    worker: Option<String>,
    lease_seconds: Option<i64>,
}

type Inner = toolledger::Ledger<Wired, Roles>;

impl Recipe {
    fn downstream(&self) -> Result<Wired, toolledger::Error> {
        if self.simulated {
            return toolledger::simulated(&self.location).map(Wired::Simulated);
        }
        let nobody = DownstreamIdentity::new("python-unrouted", "1")
            .unwrap_or_else(|_| unreachable!("a valid identity"));
        let (http, http_tools) = match &self.config {
            Some(config) => {
                let routed: BTreeSet<String> = config
                    .tools()
                    .iter()
                    .filter(|tool| tool.route.is_some())
                    .map(|tool| tool.definition.name.clone())
                    .collect();
                (Some(config.downstream(nobody.clone())?), routed)
            }
            None => (None, BTreeSet::new()),
        };
        Ok(Wired::Routed(Routed {
            http,
            http_tools,
            python: self.python.clone(),
            fallback: self.fallback.clone(),
            nobody,
        }))
    }

    fn open(&self) -> Result<Inner, toolledger::Error> {
        let mut builder = toolledger::Ledger::builder(&self.location);
        for tool in &self.tools {
            builder = builder.tool(tool.clone());
        }
        for profile in &self.profiles {
            builder = builder.profile(profile.clone());
        }
        if let Some(worker) = &self.worker {
            builder = builder.worker_id(worker);
        }
        if let Some(seconds) = self.lease_seconds {
            builder = builder.lease_seconds(seconds);
        }
        builder.open(self.downstream()?, self.roles.clone())
    }
}

#[derive(Debug)]
struct State {
    recipe: Recipe,
    ledger: Option<Inner>,
}

/// A ledger over a SQLite file or a PostgreSQL database. Open it with `Ledger.open`.
#[pyclass(subclass, module = "toolledger")]
#[derive(Debug)]
struct Ledger {
    state: Mutex<State>,
    principal: DefaultPrincipal,
}

fn locked(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while the lock was held cannot leave a half-written ledger (every commit
    // is a transaction): the state is used as it is.
    state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A handle of the open ledger: taken under the lock, used after it is let go, so
/// calls from many threads run at once.
fn open_ledger(state: &Mutex<State>) -> PyResult<Inner> {
    locked(state).ledger.clone().ok_or_else(|| invalid("the ledger is closed".to_owned()))
}

impl Ledger {
    /// Works a call on the open ledger: here, with the GIL let go, answering its reply;
    /// or, for an awaited call (`soon`), on the package's pool, answering `None` at once
    /// while the reply goes to the awaiting loop.
    fn work(
        &self,
        py: Python<'_>,
        soon: Option<Soon>,
        work: impl FnOnce(&Inner) -> Finished + Send + 'static,
    ) -> PyResult<Py<PyAny>> {
        let ledger = open_ledger(&self.state)?;
        match soon {
            None => py.detach(|| work(&ledger)).answer(py),
            Some((completions, id, context, size)) => {
                completions.get().start(id, context, size, move || work(&ledger))?;
                Ok(py.None())
            }
        }
    }
}

#[pymethods]
impl Ledger {
    #[new]
    #[pyo3(signature = (location, *, config = None, tools = None, downstream = None, downstreams = None, roles = None, tenant = None, subject = None, profiles = None, worker = None, lease_seconds = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        location: PathOrUrl,
        config: Option<PathBuf>,
        tools: Option<Vec<Tool>>,
        downstream: Option<&Bound<'_, PyAny>>,
        downstreams: Option<&Bound<'_, PyDict>>,
        roles: Option<&Bound<'_, PyAny>>,
        tenant: Option<String>,
        subject: Option<String>,
        profiles: Option<Vec<(String, String, String)>>,
        worker: Option<String>,
        lease_seconds: Option<i64>,
    ) -> PyResult<Ledger> {
        let config = match config {
            Some(path) => Some(Arc::new(Config::load(&path).map_err(|err| raise(&err))?)),
            None => None,
        };
        let mut specs: Vec<ToolSpec> = match &config {
            Some(config) => config.tool_specs().map_err(|err| raise(&err))?,
            None => Vec::new(),
        };
        specs.extend(tools.unwrap_or_default().into_iter().map(|tool| tool.spec));
        let mut python = BTreeMap::new();
        if let Some(downstreams) = downstreams {
            for (tool, object) in downstreams.iter() {
                python.insert(tool.extract::<String>()?, Target::new(&object)?);
            }
        }
        let fallback = downstream.map(Target::new).transpose()?;
        // With no configuration and no downstream, the simulation performs the built-in
        // refund tool (as the command line does), for trying the contract.
        let simulated = config.is_none() && python.is_empty() && fallback.is_none();
        if simulated && specs.is_empty() {
            specs.push(RefundOrder::default().tool());
        } else if simulated && specs.iter().any(|spec| spec.name != "refund_order") {
            return Err(invalid(
                "tools were given with no downstream to perform them: give downstream= or downstreams= (only refund_order runs on the simulation)"
                    .to_owned(),
            ));
        }
        let mut all_profiles = vec![python_profile()];
        for (provider, api, revision) in profiles.unwrap_or_default() {
            all_profiles.push(ProviderProfile::new(&provider, &api, &revision));
        }
        let recipe = Recipe {
            location: location.0,
            config,
            tools: specs,
            python,
            fallback,
            simulated,
            roles: Roles(roles.map(|roles| Arc::new(roles.clone().unbind()))),
            profiles: all_profiles,
            worker,
            lease_seconds,
        };
        exporting(py)?;
        let ledger = py.detach(|| recipe.open()).map_err(|err| raise(&err))?;
        Ok(Ledger {
            state: Mutex::new(State { recipe, ledger: Some(ledger) }),
            principal: DefaultPrincipal { tenant, subject },
        })
    }

    /// Dispatches a call: a new intent is accepted (commit A) and performed now; a
    /// retry replays the first result; another intent under the same key is
    /// `IDEMPOTENCY_CONFLICT`. Raises `toolledger.Error` only when nothing was accepted.
    #[pyo3(signature = (call, *, _soon = None, _trace = None))]
    fn dispatch(
        &self,
        py: Python<'_>,
        call: &Call,
        _soon: Option<Soon>,
        _trace: Option<Trace>,
    ) -> PyResult<Py<PyAny>> {
        let call = traced(call.facade(&self.principal)?, _trace);
        self.work(py, _soon, move |ledger| Finished::of(ledger.dispatch(&call), Finished::Reply))
    }

    /// Accepts a call (commit A) and stops: `Accepted`, certainly not sent; a worker
    /// (`process`) or the relay performs it.
    #[pyo3(signature = (call, *, _soon = None, _trace = None))]
    fn enqueue(
        &self,
        py: Python<'_>,
        call: &Call,
        _soon: Option<Soon>,
        _trace: Option<Trace>,
    ) -> PyResult<Py<PyAny>> {
        let call = traced(call.facade(&self.principal)?, _trace);
        self.work(py, _soon, move |ledger| Finished::of(ledger.enqueue(&call), Finished::Reply))
    }

    /// Works the accepted operation `status_ref` as a worker: the tenant, subject and
    /// arguments come from the ledger; `context` is the business context its rules read.
    #[pyo3(signature = (status_ref, *, context = None, at = None, _soon = None, _trace = None))]
    fn process(
        &self,
        py: Python<'_>,
        status_ref: &str,
        context: Option<&Bound<'_, PyAny>>,
        at: Option<i64>,
        _soon: Option<Soon>,
        _trace: Option<Trace>,
    ) -> PyResult<Py<PyAny>> {
        let status_ref = parse_ref(status_ref)?;
        let mut call = traced(toolledger::Call::new("", Value::Null), _trace);
        if let Some(context) = context {
            call = call.context(to_value(context, "the context")?);
        }
        if let Some(at) = at {
            call = call.at(at);
        }
        self.work(py, _soon, move |ledger| {
            Finished::of(ledger.process(&status_ref, &call), Finished::Reply)
        })
    }

    /// The explicit status query for `status_ref`: settles an unknown outcome on the
    /// downstream's evidence, or answers what the ledger knows. Asked as `call` (the
    /// same intent), or by a host that holds only the ref: then `tenant`/`subject`
    /// (default: the ledger's), `model_call` (default: one derived from the ref) and
    /// `context`.
    #[pyo3(signature = (status_ref, call = None, *, tenant = None, subject = None, model_call = None, context = None, at = None, _soon = None, _trace = None))]
    #[allow(clippy::too_many_arguments)]
    fn status(
        &self,
        py: Python<'_>,
        status_ref: &str,
        call: Option<&Call>,
        tenant: Option<String>,
        subject: Option<String>,
        model_call: Option<ModelCall>,
        context: Option<&Bound<'_, PyAny>>,
        at: Option<i64>,
        _soon: Option<Soon>,
        _trace: Option<Trace>,
    ) -> PyResult<Py<PyAny>> {
        let parsed = parse_ref(status_ref)?;
        if let Some(call) = call {
            let call = traced(call.facade(&self.principal)?, _trace);
            self.work(py, _soon, move |ledger| {
                Finished::of(ledger.status(&call, &parsed), Finished::Reply)
            })
        } else {
            let (tenant, subject) = self.principal.of(tenant.as_deref(), subject.as_deref())?;
            let model_call = match model_call {
                Some(model_call) => model_call.facade(),
                None => toolledger::ModelCall::keyed(
                    python_profile(),
                    "pys",
                    tenant,
                    subject,
                    "status",
                    status_ref,
                ),
            };
            let mut query = StatusQuery::new(tenant, subject).model_call(model_call);
            if let Some((traceparent, tracestate)) = _trace {
                query = query.in_host_span();
                if let Some(parent) = toolledger::TraceContext::parse(&traceparent, &tracestate) {
                    query = query.trace_parent(parent);
                }
            }
            if let Some(context) = context {
                query = query.context(to_value(context, "the context")?);
            }
            if let Some(at) = at {
                query = query.at(at);
            }
            self.work(py, _soon, move |ledger| {
                Finished::of(ledger.status_of(&query, &parsed), Finished::Reply)
            })
        }
    }

    /// Settles by hand an operation no status query could tell: with the downstream's
    /// `output` the operator found (checked as a receipt is), or as not having happened.
    /// Returns `"succeeded"` or `"failed"`; raises `InvalidError` when it cannot be
    /// settled (`NOT_RESOLVABLE`, `LEASE_HELD`, `NOT_FOUND`, or an output that is not the
    /// operation's).
    #[pyo3(signature = (status_ref, *, reason, output = None, not_happened = false, at = None, _soon = None))]
    #[allow(clippy::too_many_arguments)]
    fn resolve(
        &self,
        py: Python<'_>,
        status_ref: &str,
        reason: &str,
        output: Option<&Bound<'_, PyAny>>,
        not_happened: bool,
        at: Option<i64>,
        _soon: Option<Soon>,
    ) -> PyResult<Py<PyAny>> {
        let parsed = parse_ref(status_ref)?;
        let evidence = match (output, not_happened) {
            (Some(output), false) => Evidence::Output(to_value(output, "the output")?),
            (None, true) => Evidence::NotHappened,
            _ => return Err(invalid("give output= or not_happened=True, not both".to_owned())),
        };
        let reason = reason.to_owned();
        self.work(py, _soon, move |ledger| {
            let resolution = ledger.resolve(&parsed, &evidence, &reason, at);
            Finished::of(resolution, |resolution| Finished::Resolved(parsed, resolution))
        })
    }

    /// Runs the relay: `workers` threads claim due events under expiring, fenced leases
    /// and perform them. Returns when nothing is due (`stop=None`), or when `stop` (a
    /// `threading.Event`) is set; what is claimed is finished first. Returns what it did.
    #[pyo3(signature = (*, workers = 1, batch = None, stop = None, poll = 0.05, context = None, at = None, lease_seconds = None))]
    #[allow(clippy::too_many_arguments)]
    fn relay<'py>(
        &self,
        py: Python<'py>,
        workers: usize,
        batch: Option<usize>,
        stop: Option<&Bound<'py, PyAny>>,
        poll: f64,
        context: Option<&Bound<'py, PyAny>>,
        at: Option<i64>,
        lease_seconds: Option<i64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let recipe = locked(&self.state).recipe.clone();
        let context = match context {
            Some(context) => to_value(context, "the context")?,
            None => Value::Object(serde_json::Map::new()),
        };
        let mut relay = Relay::new(&recipe.location).concurrency(workers);
        for tool in &recipe.tools {
            relay = relay.tool(tool.clone());
        }
        for profile in &recipe.profiles {
            relay = relay.profile(profile.clone());
        }
        if let Some(batch) = batch {
            relay = relay.batch(batch);
        }
        if let Some(at) = at {
            relay = relay.at(at);
        }
        if let Some(seconds) = lease_seconds.or(recipe.lease_seconds) {
            relay = relay.lease_seconds(seconds);
        }
        if poll.is_finite() && poll > 0.0 {
            relay = relay.poll(Duration::from_secs_f64(poll.min(60.0)));
        }
        let flag = AtomicBool::new(false);
        let run = |until: Until<'_>| {
            relay.run(|| recipe.downstream(), || recipe.roles.clone(), &context, until, &|_| {})
        };
        let drained = match stop {
            None => py.detach(|| run(Until::Drained)),
            Some(stop) => {
                // The relay runs on a thread of its own; this thread waits without the
                // GIL, and takes it back every 50 ms to read `stop` and to run the
                // interpreter's signal handlers (a SIGTERM handler that sets the event).
                let (done_tx, done_rx) = mpsc::channel();
                let done_rx = Mutex::new(done_rx);
                std::thread::scope(|scope| {
                    let flag = &flag;
                    let run = &run;
                    scope.spawn(move || {
                        let _ = done_tx.send(run(Until::Stopped(flag)));
                    });
                    let mut interrupted: Option<PyErr> = None;
                    loop {
                        let waited = py.detach(|| {
                            done_rx
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .recv_timeout(Duration::from_millis(50))
                        });
                        match waited {
                            Ok(drained) => {
                                return match interrupted {
                                    Some(err) => Err(err),
                                    None => Ok(drained),
                                };
                            }
                            Err(mpsc::RecvTimeoutError::Disconnected) => {
                                return Err(invalid(
                                    "the relay stopped without an answer".to_owned(),
                                ));
                            }
                            Err(mpsc::RecvTimeoutError::Timeout) => {}
                        }
                        if let Err(err) = py.check_signals() {
                            interrupted.get_or_insert(err);
                            flag.store(true, Ordering::SeqCst);
                        }
                        let set = stop.call_method0("is_set").and_then(|set| set.is_truthy());
                        if set.unwrap_or(true) {
                            flag.store(true, Ordering::SeqCst);
                        }
                    }
                })?
            }
        };
        let drained = drained.map_err(|err| raise(&err))?;
        let dict = PyDict::new(py);
        for (name, count) in [
            ("claimed", drained.claimed),
            ("delivered", drained.delivered),
            ("failed", drained.failed),
            ("quarantined", drained.quarantined),
            ("retried", drained.retried),
            ("dead", drained.dead),
            ("unknown", drained.unknown),
            ("refused", drained.refused),
            ("fenced", drained.fenced),
        ] {
            dict.set_item(name, count)?;
        }
        Ok(dict)
    }

    /// Audits the ledger (read-only): every operation's rows and digests checked.
    fn audit(&self, py: Python<'_>) -> PyResult<Audit> {
        let location = locked(&self.state).recipe.location.clone();
        let audit = py.detach(|| toolledger::audit(&location)).map_err(|err| raise(&err))?;
        Ok(Audit { passed: audit.passed(), package: audit.package() })
    }

    /// Lists operations, oldest change first: each a `dict` with `status_ref`, `tool`,
    /// `state`, `attempts`, `age`, `idle`, `reason` and `cursor` (pass it as `after` for
    /// the next page).
    #[pyo3(signature = (*, state = None, tool = None, older_than = 0, limit = 100, after = None, arguments = false, at = None))]
    #[allow(clippy::too_many_arguments)]
    fn list<'py>(
        &self,
        py: Python<'py>,
        state: Option<String>,
        tool: Option<String>,
        older_than: i64,
        limit: usize,
        after: Option<String>,
        arguments: bool,
        at: Option<i64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let location = locked(&self.state).recipe.location.clone();
        let filter = ListFilter {
            state: state.as_deref(),
            tool: tool.as_deref(),
            older_than,
            limit,
            after: after.as_deref(),
        };
        let listed = py
            .detach(|| toolledger::list(&location, &filter, arguments, at))
            .map_err(|err| raise(&err))?;
        let list = PyList::empty(py);
        for operation in &listed {
            let mut row = toolledger::listed_json(operation);
            if let Some(members) = row.as_object_mut() {
                members.insert("cursor".to_owned(), json!(operation.cursor));
            }
            list.append(to_python(py, &row)?)?;
        }
        Ok(list)
    }

    /// An operation's history (`None` when the ledger has no such ref).
    #[pyo3(signature = (status_ref, *, arguments = false))]
    fn show<'py>(
        &self,
        py: Python<'py>,
        status_ref: &str,
        arguments: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let parsed = parse_ref(status_ref)?;
        let location = locked(&self.state).recipe.location.clone();
        let shown = py
            .detach(|| toolledger::show(&location, &parsed, arguments))
            .map_err(|err| raise(&err))?;
        shown.map(|shown| to_python(py, &shown)).transpose()
    }

    /// Sends a dead or failed operation again (pending, due now), with the operator's
    /// reason in the append-only log. Returns `"requeued"`, `"missing"`, or the state
    /// that refused it (e.g. `"succeeded"`).
    #[pyo3(signature = (status_ref, *, reason, at = None))]
    fn requeue(
        &self,
        py: Python<'_>,
        status_ref: &str,
        reason: &str,
        at: Option<i64>,
    ) -> PyResult<String> {
        let parsed = parse_ref(status_ref)?;
        let location = locked(&self.state).recipe.location.clone();
        let requeued = py
            .detach(|| toolledger::requeue(&location, &parsed, reason, at))
            .map_err(|err| raise(&err))?;
        Ok(match requeued {
            Requeued::Requeued => "requeued".to_owned(),
            Requeued::Missing => "missing".to_owned(),
            Requeued::Refused(status) => status.as_str().to_owned(),
        })
    }

    /// `sqlite` or `postgres`: a trace's `toolledger.store`.
    #[getter]
    fn _store(&self) -> &'static str {
        locked(&self.state).recipe.location.backend()
    }

    /// The names of the tools this ledger serves.
    #[getter]
    fn tools(&self) -> Vec<String> {
        locked(&self.state).recipe.tools.iter().map(|tool| tool.name.clone()).collect()
    }

    /// Registers `tool`, performed by `downstream` (an object with `identity`, `execute`
    /// and `lookup`), on the open ledger: what `@ledger.tool` does.
    fn _register(
        &self,
        py: Python<'_>,
        tool: &Tool,
        downstream: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let target = Target::new(downstream)?;
        let mut state = locked(&self.state);
        if state.ledger.is_none() {
            return Err(invalid("the ledger is closed".to_owned()));
        }
        let mut recipe = state.recipe.clone();
        if recipe.simulated {
            recipe.simulated = false;
            recipe.tools.clear();
        }
        // A name is one tool, as in a configuration: a second one would silently take the
        // first's place (and its performer) under calls already accepted for the first.
        if recipe.tools.iter().any(|known| known.name == tool.spec.name) {
            return Err(invalid(format!(
                "the ledger already serves a tool named {}: a name is one tool",
                tool.spec.name
            )));
        }
        recipe.tools.push(tool.spec.clone());
        recipe.python.insert(tool.spec.name.clone(), target);
        let reopened = py.detach(|| recipe.open()).map_err(|err| raise(&err))?;
        state.recipe = recipe;
        state.ledger = Some(reopened);
        Ok(())
    }

    /// Closes the store's connection; the ledger answers nothing after.
    fn close(&self) {
        drop(locked(&self.state).ledger.take());
    }

    fn __enter__(slf: Py<Ledger>) -> Py<Ledger> {
        slf
    }

    fn __exit__(
        &self,
        _kind: Option<&Bound<'_, PyAny>>,
        _value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        self.close();
        false
    }
}

/// What the audit found: `passed`, and the audit's package (`dict`).
#[pyclass(frozen, module = "toolledger")]
#[derive(Debug)]
struct Audit {
    passed: bool,
    package: Value,
}

#[pymethods]
impl Audit {
    /// Whether every check passed.
    #[getter]
    fn passed(&self) -> bool {
        self.passed
    }

    /// The audit's package, as a new `dict`.
    #[getter]
    fn package<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.package)
    }

    fn __bool__(&self) -> bool {
        self.passed
    }

    fn __repr__(&self) -> String {
        format!("Audit(passed={})", self.passed)
    }
}

/// A store location from Python: a path (`str` or `os.PathLike`) or a `postgres://` URL.
#[derive(Debug)]
struct PathOrUrl(Location);

impl<'a, 'py> FromPyObject<'a, 'py> for PathOrUrl {
    type Error = PyErr;

    fn extract(object: Borrowed<'a, 'py, PyAny>) -> PyResult<PathOrUrl> {
        if let Ok(text) = object.extract::<String>() {
            return Ok(PathOrUrl(Location::parse(&text)));
        }
        let path: PathBuf = object.extract()?;
        Ok(PathOrUrl(Location::from(path)))
    }
}

fn parse_ref(text: &str) -> PyResult<StatusRef> {
    StatusRef::new(text).map_err(|_| invalid("not a status ref (sr_ and 32 hex digits)".to_owned()))
}

/// Whether `text` is an idempotency key, by the ledger's own rule (the adapters ask it
/// before a human is asked to approve a call that could never be keyed).
#[pyfunction]
fn is_key(text: &str) -> bool {
    toolledger::Identifier::new(text).is_ok()
}

/// The process's exporters of the ledger's own spans and metrics (its steps: commit A,
/// the downstream's call, commit C), installed when the first ledger opens if the
/// standard `OTEL_*` variables ask for them (`docs/python.md`, "Traces"); the host's
/// Python spans go through its own exporter. `None` when nothing is exported.
static EXPORTING: std::sync::OnceLock<Option<toolledger_otlp::Exporting>> =
    std::sync::OnceLock::new();

/// Installs the exporters once per process. A configuration the package cannot honour
/// (gRPC, which a Python host's own exporter may use; an `https://` endpoint) exports
/// nothing from the ledger and says why in a `RuntimeWarning`: telemetry never stops a
/// host's ledger from opening.
fn exporting(py: Python<'_>) -> PyResult<()> {
    let mut refused = None;
    EXPORTING.get_or_init(|| match toolledger_otlp::start(&std::env::vars().collect()) {
        Ok(exporting) => Some(exporting),
        Err(message) => {
            refused = Some(message);
            None
        }
    });
    if let Some(message) = refused {
        let warning = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
        let message = std::ffi::CString::new(format!(
            "toolledger exports none of its own spans or metrics: {message}"
        ))
        .unwrap_or_default();
        PyErr::warn(py, &warning, &message, 1)?;
    }
    Ok(())
}

/// Exports what the ledger's exporters hold now: the package runs it at the
/// interpreter's exit, so the last calls' spans are not lost.
#[pyfunction]
fn _flush(py: Python<'_>) {
    if let Some(Some(exporting)) = EXPORTING.get() {
        py.detach(|| exporting.flush());
    }
}

#[pymodule]
fn _toolledger(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(_flush, module)?)?;
    module.add_function(wrap_pyfunction!(is_key, module)?)?;
    module.add_class::<Ledger>()?;
    module.add_class::<Completions>()?;
    module.add_function(wrap_pyfunction!(soon::_park, module)?)?;
    module.add_class::<Tool>()?;
    module.add_class::<Call>()?;
    module.add_class::<ModelCall>()?;
    module.add_class::<Approval>()?;
    module.add_class::<Audit>()?;
    reply::register(module)?;
    downstream::register(module)?;
    errors::register(module)?;
    Ok(())
}
