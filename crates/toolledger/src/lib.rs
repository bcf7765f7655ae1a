//! toolledger: make an AI agent's side-effecting tool calls survive retries, crashes and
//! lost responses.
//!
//! A host embeds one [`Ledger`]: it registers its tools (schemas as data, rules as a
//! [`ToolRules`] it implements), plugs in its own [`Downstream`] (the client that performs
//! the effect), and describes each model call as a [`Call`]. Then:
//!
//! - [`Ledger::dispatch`] accepts the intent (commit A) and works it now: a retry of
//!   the same call replays the first result, a different intent under the same key is a
//!   conflict;
//! - [`Ledger::enqueue`] accepts it and stops, for a worker to take later;
//! - [`Ledger::process`] is that worker; [`Ledger::status`] is the explicit status query
//!   that settles an unknown outcome.
//!
//! Every answer is a [`Reply`]: a typed [`Outcome`] (done with a [`Receipt`], unknown
//! with its [`StatusRef`], or blocked with a [`BlockCode`]) that renders to the canonical
//! package. An outcome that may have happened is never guessed: it is
//! [`Outcome::Unknown`] until a status query settles it. toolledger is **not
//! exactly-once**: the downstream must be idempotent on the request ref it is handed.
//!
//! ```
//! use serde_json::json;
//! use toolledger::{Call, Ledger, ModelCall, NoRoles, Outcome, RefundOrder};
//!
//! # let dir = std::env::temp_dir().join(format!("toolledger-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! # let path = dir.join("crate.sqlite3");
//! // The built-in refund tool (with no approval up to 50.00) and the simulated
//! // downstream the command line uses.
//! let refunds = RefundOrder { approval_threshold_minor: Some(5_000) }.tool();
//! let ledger = Ledger::builder(&path).tool(refunds).open_simulated(NoRoles)?;
//! let call = Call::new("refund_order", json!({
//!         "order_id": "ord-1", "amount_minor": 2599, "currency": "USD", "reason": "damaged"}))
//!     .principal("tenant-a", "user-1")
//!     .idempotency_key("refund-ord-1")
//!     .model_call(ModelCall::new("openai", "responses", "openai-responses-2026-05", "resp-1", "call-1"))
//!     .context(json!({"orders": [{"order_id": "ord-1", "tenant_id": "tenant-a",
//!         "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]}))
//!     .at(1_767_225_600);
//! let first = ledger.dispatch(&call)?;
//! assert!(matches!(first.outcome(), Outcome::Fresh(_)));
//! // The model retries: the first result again, no second refund.
//! assert!(matches!(ledger.dispatch(&call)?.outcome(), Outcome::Replayed(_)));
//! # std::fs::remove_dir_all(dir).unwrap();
//! # Ok::<(), toolledger::Error>(())
//! ```
//!
//! ## Many callers, and async hosts
//!
//! A [`Ledger`] is a cheap handle, [`Send`] and [`Sync`]: threads share one (or clones
//! of it) with no lock of their own. Calls of different keys run at once, each on a
//! store connection of its own, their downstreams in parallel; their commits share
//! fsyncs (the group commit of the embedded store); a second call of a key this process
//! is working waits for the first and replays it. A tokio host calls the `*_async`
//! paths ([`Ledger::dispatch_async`]…), whose disk work runs on the runtime's blocking
//! pool, and may plug in an [`AsyncDownstream`] run on its own runtime
//! ([`LedgerBuilder::open_async`]). `examples/tokio_host.rs` is such a host, and a test
//! runs it.
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

mod audit;
mod call;
mod config;
mod definitions;
pub mod door;
mod files;
mod meters;
mod operate;
mod relay;
mod reply;
mod store;
mod tasks;
mod traces;
pub use tasks::blocking;

use std::{path::PathBuf, sync::Arc};

use toolledger_engine::Engine;

pub use crate::files::{Unreadable, read_bounded};
pub use toolledger_contract::{
    ApprovalPolicy, ApprovalRule, ApprovalValidAt, Authorization, Binding, BlockCode,
    BusinessRefusal, Charset, Claims, Clock, ContractError, DefinitionError, Delivery, Denied,
    DownstreamIdentity, ErrorCode, Field, FieldRule, HostCall, Identifier, JsonSchema,
    LeaseSeconds, NoRoles, Precondition, PrincipalResolver, ProviderProfile, RefundOrder, Registry,
    Rejection, ResolverError, Revisions, RuleCall, Schema, SchemaRefusal, StatusRef,
    ToolDefinition, ToolRules, ToolSpec, UnixSeconds, Verdict, builtin_profiles, load_case,
    load_claims, parse_document,
};
pub use toolledger_engine::{
    Answer, Backoff, DEFAULT_BUSY_TIMEOUT_MS, Downstream, DownstreamError, DownstreamRequest,
    Drained, EngineError, Faults, Lookup, StandIn, Waits, drill,
};
/// A downstream over HTTP, for services that implement the IETF Idempotency-Key header:
/// [`http::HttpDownstream`], an [`http::Endpoint`] per tool, [`http::Timeouts`]. The
/// outcome table is in `docs/http.md`.
///
/// ```
/// use toolledger::http::{Endpoint, HttpDownstream, Timeouts};
/// let identity = toolledger::DownstreamIdentity::new("refunds-http", "1").unwrap();
/// let downstream = HttpDownstream::new(identity, Timeouts::default())
///     .endpoint("refund_order", Endpoint::refunds("http://127.0.0.1:8080"));
/// # let _ = downstream;
/// ```
pub mod http {
    pub use toolledger_downstream_http::{
        Endpoint, HttpDownstream, HttpPrecondition, Timeouts, body, precondition_answer,
    };
}

pub use toolledger_engine::{Evidence, Resolution};
pub use toolledger_store::{
    DownstreamReceipt, Figures, ListFilter, Listed, Now, OperationStatus, Requeued, Resolved,
    STAND_IN_NAME, STATES,
};
pub use toolledger_store_sqlite::{Migrated, SCHEMA_ID};

pub use crate::{
    audit::{Audit, audit, audit_with},
    call::{Call, Grant, ModelCall, StatusQuery},
    config::{CONFIG_ENV, CONFIG_FILE, Config, Declared, Route, ServiceDecl, Setting},
    definitions::load_tool,
    meters::observe_figures,
    operate::{
        REASON_BYTES_MAX, figures, gc, list, listed_json, metrics, operator_reason, requeue,
        requeue_package, resolve_package, show,
    },
    relay::{Relay, RelayEvent, Until, simulated, simulated_with},
    reply::{Outcome, Receipt, Reply},
    store::{Location, Store, StoreClock},
    tasks::{AsyncDownstream, OnRuntime},
    traces::{Capture, Entered, TraceContext},
};

/// The simulated downstream of the command line: the stand-in refund API on its own
/// connection to the ledger's file, behind a recovery-drill switch.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("simulated");
/// use toolledger::drill::FailurePoint;
/// // Stop the next call right after the downstream commits, as a crash would.
/// ledger.downstream().switch().arm(FailurePoint::AfterDownstreamCommit);
/// assert!(matches!(ledger.dispatch(&call)?.outcome(), toolledger::Outcome::Unknown { .. }));
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub type Simulated = drill::Interrupt<StandIn<Store>>;

/// Why a call could not be answered at all. Nothing was accepted: an error never follows
/// an accepted intent (that is [`Outcome::Unknown`]).
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("error");
/// let nameless = call.idempotency_key("not an identifier");
/// assert_eq!(ledger.dispatch(&nameless).unwrap_err().code(), toolledger::ErrorCode::UsageError);
/// # std::fs::remove_dir_all(dir).unwrap();
/// ```
///
/// The error beneath it (the engine's, the store's, and the driver's under those) is
/// kept as its [`source`](std::error::Error::source), for logs; two errors are equal
/// when their codes and messages are.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    code: ErrorCode,
    message: String,
    #[source]
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl Eq for Error {}

impl Error {
    /// The stable code, e.g. `STORE_BUSY`.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-err-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let missing = toolledger::audit(&dir.join("none.sqlite3")).unwrap_err();
    /// assert_eq!(missing.code(), toolledger::ErrorCode::StoreNotFound);
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// ```
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    pub(crate) fn invalid(message: String) -> Error {
        Error { code: ErrorCode::UsageError, message, source: None }
    }

    /// An error of `code` saying what `source` says, and keeping it.
    pub(crate) fn caused(
        code: ErrorCode,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error { code, message: source.to_string(), source: Some(Arc::new(source)) }
    }
}

impl From<EngineError> for Error {
    fn from(err: EngineError) -> Error {
        Error::caused(err.code(), err)
    }
}

impl From<toolledger_store::StoreError> for Error {
    fn from(err: toolledger_store::StoreError) -> Error {
        Error::caused(err.code(), err)
    }
}

/// The wall clock, in Unix seconds: the facade is where a host's calls get their instant
/// when they do not name one.
fn wall_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
}

/// A ledger file with its tools, its downstream and its principal resolver.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("ledger");
/// let reply = ledger.dispatch(&call)?;
/// println!("{}", reply.canonical());
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
///
/// A `Ledger` is a handle: cloning it is cheap, and every clone is the same ledger. Its
/// methods take `&self`, and it is [`Send`] and [`Sync`] when its downstream and
/// resolver are, so threads share one without a lock (see [`Ledger::dispatch`] for what
/// runs at once).
#[derive(Debug)]
pub struct Ledger<D, R> {
    shared: Arc<Shared<D, R>>,
}

impl<D, R> Clone for Ledger<D, R> {
    fn clone(&self) -> Self {
        Ledger { shared: Arc::clone(&self.shared) }
    }
}

/// What every handle of one ledger shares.
#[derive(Debug)]
struct Shared<D, R> {
    downstream: D,
    resolver: R,
    registry: Arc<Registry>,
    /// Store connections no call holds now: a call takes one (or opens one when every
    /// connection is in use) and gives it back, so the pool grows to the number of calls
    /// that ever ran at once. Held for the moment of a push or a pop only.
    idle: std::sync::Mutex<Vec<Store>>,
    location: Location,
    waits: Waits,
    clock: StoreClock,
    worker: Identifier,
    lease: LeaseSeconds,
    /// The scopes a dispatch of this ledger is working now (see [`Turns`]).
    turns: Turns,
    /// What its spans record beyond the defaults.
    capture: traces::Capture,
}

/// What [`Ledger::known`] found for a call.
enum Known {
    /// What the ledger already holds for it, or the door's refusal.
    Answered(Reply),
    /// A scope to dispatch (new, or being worked by another call of this ledger), the
    /// call through the door (boxed: a call is far larger than a reply).
    New(Box<HostCall>),
}

/// One dispatch at a time per scope (tenant, subject, tool, key) within one ledger: a
/// second call of a key this process is already working waits for the first and then
/// reads what it left (a replay, or how it ended), as a call after it would, instead
/// of finding the operation in flight and answering `OUTCOME_UNKNOWN`. Calls of other
/// keys never wait. Between processes the ledger's lease decides, as it always does.
/// A call made from inside the call that holds its scope's turn (a downstream that
/// dispatches its own key again) does not wait for itself: it reads the operation in
/// flight, as a call from another process would.
#[derive(Debug, Default)]
struct Turns {
    working: std::sync::Mutex<std::collections::HashMap<String, std::thread::ThreadId>>,
    done: std::sync::Condvar,
}

/// A scope's turn, given back when dropped (however the call ends); `None` for a call
/// its own thread already holds the turn of.
struct Turn<'a> {
    turns: &'a Turns,
    scope: Option<String>,
}

impl Turns {
    fn scope(call: &HostCall) -> String {
        [
            call.principal.tenant_id.as_str(),
            call.principal.subject_id.as_str(),
            call.proposal.tool_name.as_str(),
            call.host.idempotency_key.as_str(),
        ]
        .join("\u{0}")
    }

    /// The scope's turn when nobody holds it (or this thread does); `None` when another
    /// call holds it now.
    fn try_take(&self, call: &HostCall) -> Option<Turn<'_>> {
        let scope = Turns::scope(call);
        let me = std::thread::current().id();
        let mut working = self.working.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match working.get(&scope) {
            None => {}
            Some(holder) if *holder == me => return Some(Turn { turns: self, scope: None }),
            Some(_) => return None,
        }
        working.insert(scope.clone(), me);
        Some(Turn { turns: self, scope: Some(scope) })
    }

    fn take(&self, call: &HostCall) -> Turn<'_> {
        let scope = Turns::scope(call);
        let me = std::thread::current().id();
        let mut working = self.working.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            match working.get(&scope) {
                None => break,
                Some(holder) if *holder == me => return Turn { turns: self, scope: None },
                Some(_) => {
                    working =
                        self.done.wait(working).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            }
        }
        working.insert(scope.clone(), me);
        Turn { turns: self, scope: Some(scope) }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(scope) = &self.scope {
            let mut working =
                self.turns.working.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            working.remove(scope);
            self.turns.done.notify_all();
        }
    }
}

impl<D: Downstream, R: PrincipalResolver> Shared<D, R> {
    /// Runs `work` on an engine of its own: a store connection from the pool, the shared
    /// downstream and resolver. No lock is held while it runs.
    fn engine<T>(
        &self,
        work: impl FnOnce(&mut Engine<Store, traces::Traced<&D>, &R>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let store = match self.idle().pop() {
            Some(store) => store,
            None => Store::open(&self.location, self.waits, self.clock)?,
        };
        let downstream = traces::Traced(&self.downstream);
        let mut engine = Engine::new(store, downstream, &self.resolver, Arc::clone(&self.registry));
        let answer = work(&mut engine);
        self.idle().push(engine.into_store());
        answer
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Store>> {
        self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How to open a [`Ledger`]: which file, which tools, how long to wait for locks.
///
/// ```
/// let builder = toolledger::Ledger::builder("ledger.sqlite3")
///     .tool(toolledger::RefundOrder::default().tool())
///     .lease_seconds(60)
///     .worker_id("host-1");
/// # let _ = builder;
/// ```
#[derive(Debug, Clone)]
pub struct LedgerBuilder {
    location: Location,
    clock: StoreClock,
    tools: Vec<ToolSpec>,
    profiles: Vec<ProviderProfile>,
    waits: Waits,
    worker: Option<String>,
    lease_seconds: i64,
    capture: traces::Capture,
}

impl Ledger<(), ()> {
    /// Starts describing the ledger at `location` (created when missing): a SQLite file's
    /// path, or a PostgreSQL URL (`postgres://…`). The built-in provider profiles are
    /// registered; no tool is.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-b-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let ledger = toolledger::Ledger::builder(dir.join("ledger.sqlite3"))
    ///     .tool(toolledger::RefundOrder::default().tool())
    ///     .open_simulated(toolledger::NoRoles)?;
    /// # drop(ledger);
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn builder(location: impl Into<Location>) -> LedgerBuilder {
        LedgerBuilder {
            location: location.into(),
            clock: StoreClock::Database,
            tools: Vec::new(),
            profiles: toolledger_contract::builtin_profiles(),
            waits: Waits::default(),
            worker: None,
            lease_seconds: 30,
            capture: traces::Capture::from_env(),
        }
    }
}

impl LedgerBuilder {
    /// Registers a tool: its schemas and revisions, and the rules the host implements.
    ///
    /// ```
    /// let builder = toolledger::Ledger::builder("ledger.sqlite3")
    ///     .tool(toolledger::RefundOrder::default().tool());
    /// # let _ = builder;
    /// ```
    pub fn tool(mut self, tool: ToolSpec) -> LedgerBuilder {
        self.tools.retain(|known| known.name != tool.name);
        self.tools.push(tool);
        self
    }

    /// Registers every tool a configuration declares ([`Config::tool_specs`]).
    ///
    /// # Errors
    ///
    /// As [`Config::tool_specs`].
    ///
    /// ```
    /// let config = toolledger::Config::load(std::path::Path::new(concat!(
    ///     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// let builder = toolledger::Ledger::builder("ledger.sqlite3").config(&config)?;
    /// # let _ = builder;
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn config(self, config: &Config) -> Result<LedgerBuilder, Error> {
        Ok(config.tool_specs()?.into_iter().fold(self, LedgerBuilder::tool))
    }

    /// Registers a provider profile beyond the built-in ones.
    ///
    /// ```
    /// let builder = toolledger::Ledger::builder("ledger.sqlite3").profile(
    ///     toolledger::ProviderProfile::new("acme-llm", "chat", "acme-chat-2026-11"),
    /// );
    /// # let _ = builder;
    /// ```
    pub fn profile(mut self, profile: ProviderProfile) -> LedgerBuilder {
        if !self.profiles.contains(&profile) {
            self.profiles.push(profile);
        }
        self
    }

    /// How long to wait for locks other connections hold (default: 5 s per wait).
    ///
    /// ```
    /// let builder = toolledger::Ledger::builder("ledger.sqlite3")
    ///     .waits(toolledger::Waits::total(std::time::Duration::from_secs(2)));
    /// # let _ = builder;
    /// ```
    pub fn waits(mut self, waits: Waits) -> LedgerBuilder {
        self.waits = waits;
        self
    }

    /// Whose clock a PostgreSQL ledger judges leases and due times by (default: the
    /// database's). A SQLite ledger always judges by the instants it is handed.
    ///
    /// ```
    /// let builder = toolledger::Ledger::builder("ledger.sqlite3")
    ///     .store_clock(toolledger::StoreClock::Caller);
    /// # let _ = builder;
    /// ```
    pub fn store_clock(mut self, clock: StoreClock) -> LedgerBuilder {
        self.clock = clock;
        self
    }

    /// This process's worker id, the owner of the leases it takes (default: unique per
    /// process and moment).
    ///
    /// ```
    /// let builder = toolledger::Ledger::builder("ledger.sqlite3").worker_id("host-7");
    /// # let _ = builder;
    /// ```
    pub fn worker_id(mut self, worker: &str) -> LedgerBuilder {
        self.worker = Some(worker.to_owned());
        self
    }

    /// How long a worker's lease lasts, 1–3600 s (default 30): a crashed worker's
    /// operation is reclaimable once it ends.
    ///
    /// ```
    /// let builder = toolledger::Ledger::builder("ledger.sqlite3").lease_seconds(60);
    /// # let _ = builder;
    /// ```
    pub fn lease_seconds(mut self, seconds: i64) -> LedgerBuilder {
        self.lease_seconds = seconds;
        self
    }

    /// What the ledger's spans record beyond the defaults (default: what the
    /// environment asks, [`Capture::from_env`]): the arguments and result, the principal.
    /// Each is data a trace backend would then keep; off unless the operator opts in.
    ///
    /// ```
    /// let builder = toolledger::Ledger::builder("ledger.sqlite3")
    ///     .capture_in_spans(toolledger::Capture { content: false, principal: true });
    /// # let _ = builder;
    /// ```
    pub fn capture_in_spans(mut self, capture: traces::Capture) -> LedgerBuilder {
        self.capture = capture;
        self
    }

    /// Opens the ledger with the host's own downstream and principal resolver.
    ///
    /// # Errors
    ///
    /// An [`Error`] when the file cannot be a store (another schema: `SCHEMA_UNSUPPORTED`,
    /// an older one naming `migrate`), a lock outlasts the wait bound, or a setting is
    /// invalid (`USAGE_ERROR`), as is a downstream other than the simulation that declares
    /// the simulation's identity (`toolledger-stand-in`).
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-o-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # let path = dir.join("ledger.sqlite3");
    /// use toolledger::{Ledger, NoRoles, RefundOrder, StandIn};
    /// // Any `Downstream` will do; here, the stand-in on its own connection.
    /// let downstream = StandIn::new(toolledger::store_connection(&path)?);
    /// let ledger = Ledger::builder(&path).tool(RefundOrder::default().tool()).open(downstream, NoRoles)?;
    /// # drop(ledger);
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn open<D: Downstream, R: PrincipalResolver>(
        self,
        downstream: D,
        resolver: R,
    ) -> Result<Ledger<D, R>, Error> {
        let worker = match &self.worker {
            Some(worker) => Identifier::new(worker)
                .map_err(|_| Error::invalid("the worker id is not an identifier".to_owned()))?,
            None => unique_worker(),
        };
        let lease = LeaseSeconds::new(self.lease_seconds)
            .map_err(|_| Error::invalid("the lease must last 1 to 3600 seconds".to_owned()))?;
        refuse_reserved(&downstream)?;
        let store = Store::open(&self.location, self.waits, self.clock)?;
        let registry = Arc::new(toolledger_contract::Registry::new(self.tools, self.profiles));
        Ok(Ledger {
            shared: Arc::new(Shared {
                downstream,
                resolver,
                registry,
                idle: std::sync::Mutex::new(vec![store]),
                location: self.location,
                waits: self.waits,
                clock: self.clock,
                worker,
                lease,
                turns: Turns::default(),
                capture: self.capture,
            }),
        })
    }

    /// Opens the ledger with the command line's simulated downstream (the stand-in
    /// refund API in this same file): for trying the contract, never for real effects.
    ///
    /// # Errors
    ///
    /// As [`LedgerBuilder::open`].
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-s-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let ledger = toolledger::Ledger::builder(dir.join("try.sqlite3"))
    ///     .tool(toolledger::RefundOrder::default().tool())
    ///     .open_simulated(toolledger::NoRoles)?;
    /// # drop(ledger);
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn open_simulated<R: PrincipalResolver>(
        self,
        resolver: R,
    ) -> Result<Ledger<Simulated, R>, Error> {
        let stand_in = StandIn::new(Store::open(&self.location, self.waits, self.clock)?);
        self.open(drill::Interrupt::new(stand_in, drill::Switch::default()), resolver)
    }
}

/// A second connection to the ledger at `location` (a path or a [`Location`]): what the
/// stand-in downstream commits its receipts on.
///
/// # Errors
///
/// As [`LedgerBuilder::open`].
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("toolledger-doc-c-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let connection = toolledger::store_connection(&dir.join("ledger.sqlite3"))?;
/// # drop(connection);
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn store_connection(location: impl Into<Location>) -> Result<Store, Error> {
    Store::open(&location.into(), Waits::default(), StoreClock::Database)
}

/// Refuses a downstream that declares the simulation's identity without being the
/// simulation (see [`toolledger_engine::reserved_identity`]): before anything is
/// accepted for it, so no operation of the simulation is ever sent to a service, and no
/// operation of a service is ever finished by the simulation.
pub(crate) fn refuse_reserved(downstream: &impl Downstream) -> Result<(), Error> {
    if toolledger_engine::reserved_identity(downstream) {
        return Err(Error::invalid(format!(
            "{} is the simulation's identity: no other downstream may declare it",
            toolledger_store::STAND_IN_NAME
        )));
    }
    Ok(())
}

/// `worker-<pid>-<nanoseconds, hex>`: unique to this process and this moment.
fn unique_worker() -> Identifier {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    Identifier::new(&format!("worker-{}-{nanos:x}", std::process::id()))
        .unwrap_or_else(|_| unreachable!("digits, '-' and hex form an identifier"))
}

impl<D: Downstream, R: PrincipalResolver> Ledger<D, R> {
    /// Dispatches a call: a new intent is accepted (commit A) and worked now; a known one
    /// replays, stays unknown, or answers how it ended; a different intent under the
    /// same key is `IDEMPOTENCY_CONFLICT`.
    ///
    /// # Errors
    ///
    /// An [`Error`] only when nothing was accepted (an invalid call, the store or the
    /// resolver failing first). Once the intent is accepted, every failure is
    /// [`Outcome::Unknown`].
    ///
    /// Threads may call it at once on one ledger: no lock of the ledger's is held while
    /// the downstream works, so calls of different keys run in parallel. A call of a key
    /// another call of this ledger is working waits for that one, then answers what it
    /// left (its replay).
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("dispatch");
    /// let reply = ledger.dispatch(&call)?;
    /// match reply.outcome() {
    ///     toolledger::Outcome::Fresh(receipt) => assert!(receipt.output()["refund_id"].is_string()),
    ///     other => panic!("{other:?}"),
    /// }
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn dispatch(&self, call: &Call) -> Result<Reply, Error> {
        self.traced(&call.named(traces::Purpose::Dispatch), || match self.host_call_of(call)? {
            Ok(host_call) => self.dispatch_admitted(&host_call),
            Err(refused) => Ok(refused),
        })
    }

    /// Runs `work`, one call of the ledger, under its span (`docs/observability.md`).
    fn traced(
        &self,
        named: &traces::Named<'_>,
        work: impl FnOnce() -> Result<Reply, Error>,
    ) -> Result<Reply, Error> {
        let named = named.clone().capturing(self.shared.capture);
        let span = traces::CallSpan::start(&named, self.shared.location.backend());
        let answer = span.run(work);
        span.end(&answer);
        answer
    }

    /// [`Ledger::dispatch`] of a call through the door (its arguments admitted).
    fn dispatch_admitted(&self, call: &HostCall) -> Result<Reply, Error> {
        let (worker, _turn) = (&self.shared.worker, self.shared.turns.take(call));
        self.shared.engine(|engine| Ok(Reply::from(engine.dispatch(call, worker)?)))
    }

    /// What [`Ledger::dispatch`] answers `call` when the ledger already holds its scope
    /// (a replay, a conflict, an unknown, how it ended) or the door refuses it, read
    /// alone: nothing is written and no downstream is asked. [`Known::New`] when the
    /// scope is new, or when a call of this ledger is working it now: only a dispatch
    /// (which waits for that call) answers it, and takes the call as the door let it
    /// through.
    fn known(&self, call: &Call) -> Result<Known, Error> {
        let host_call = match self.host_call_of(call)? {
            Ok(host_call) => host_call,
            Err(refused) => return Ok(Known::Answered(refused)),
        };
        let Some(turn) = self.shared.turns.try_take(&host_call) else {
            return Ok(Known::New(Box::new(host_call)));
        };
        let known = self.shared.engine(|engine| Ok(engine.known(&host_call)?.map(Reply::from)));
        drop(turn);
        Ok(match known? {
            Some(reply) => Known::Answered(reply),
            None => Known::New(Box::new(host_call)),
        })
    }

    /// [`Ledger::dispatch`] of a call [`Ledger::known`] found new, at the instant the
    /// dispatch starts (its clock read again: the read may have waited).
    fn dispatch_new(&self, call: &Call, mut host_call: Box<HostCall>) -> Result<Reply, Error> {
        host_call.clock = self.clock_of(call)?;
        self.dispatch_admitted(&host_call)
    }

    /// Accepts a call (commit A) and stops: a worker ([`Ledger::process`]) takes it
    /// later. The reply is [`Outcome::Accepted`] with the operation's ref: accepted,
    /// and certainly not sent (not [`Outcome::Unknown`], which a host pages on).
    ///
    /// # Errors
    ///
    /// As [`Ledger::dispatch`].
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("enqueue");
    /// let accepted = ledger.enqueue(&call)?;
    /// assert!(matches!(accepted.outcome(), toolledger::Outcome::Accepted { .. }));
    /// let status_ref = accepted.status_ref().unwrap().clone();
    /// let worked = ledger.process(&status_ref, &call)?;
    /// assert!(matches!(worked.outcome(), toolledger::Outcome::Fresh(_)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn enqueue(&self, call: &Call) -> Result<Reply, Error> {
        self.traced(&call.named(traces::Purpose::Enqueue), || {
            let host_call = match self.host_call_of(call)? {
                Ok(host_call) => host_call,
                Err(refused) => return Ok(refused),
            };
            self.shared.engine(|engine| Ok(Reply::from(engine.enqueue(&host_call)?)))
        })
    }

    /// Works the accepted operation `status_ref` as a worker: claims its lease, rechecks
    /// the contract, the current authorization and the business precondition (against
    /// the `call`'s business context and instant), calls the downstream, records the
    /// outcome. Tenant, subject and arguments come from the ledger, never the call.
    ///
    /// # Errors
    ///
    /// An [`Error`] when the store fails before the lease is claimed.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("process");
    /// let status_ref = ledger.enqueue(&call)?.status_ref().unwrap().clone();
    /// assert!(ledger.process(&status_ref, &call)?.outcome().is_done());
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn process(&self, status_ref: &StatusRef, call: &Call) -> Result<Reply, Error> {
        self.traced(&call.named(traces::Purpose::Process), || {
            let clock = self.clock_of(call)?;
            let worker = &self.shared.worker;
            self.shared.engine(|engine| {
                linked(engine, status_ref);
                Ok(Reply::from(engine.process(status_ref, &clock, call.context_value(), worker)?))
            })
        })
    }

    /// The explicit status query for `status_ref`, asked by the model call `call`
    /// describes (the same intent): settles an unknown outcome on the downstream's
    /// evidence, or answers what the ledger knows.
    ///
    /// # Errors
    ///
    /// An [`Error`] when the store or the resolver fails; a status query causes no side
    /// effect, so asking again is always safe.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("status");
    /// let status_ref = ledger.dispatch(&call)?.status_ref().unwrap().clone();
    /// assert!(matches!(ledger.status(&call, &status_ref)?.outcome(), toolledger::Outcome::Replayed(_)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn status(&self, call: &Call, status_ref: &StatusRef) -> Result<Reply, Error> {
        self.traced(&call.named(traces::Purpose::QueryStatus), || {
            let host_call = match self.host_call_of(call)? {
                Ok(host_call) => host_call,
                Err(refused) => return Ok(refused),
            };
            self.shared.engine(|engine| {
                linked(engine, status_ref);
                Ok(Reply::from(engine.status(&host_call, status_ref)?))
            })
        })
    }

    /// The status query of a host that holds only `status_ref`: the principal, the
    /// asking model call and, where the tool's rules need one, the business context
    /// ([`StatusQuery`]). The ledger holds the tool, the arguments and the approval; the
    /// principal must be the one whose operation it is, with the roles it holds now.
    ///
    /// # Errors
    ///
    /// As [`Ledger::status`].
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("status-of");
    /// use toolledger::{ModelCall, StatusQuery};
    /// let status_ref = ledger.dispatch(&call)?.status_ref().unwrap().clone();
    /// // Restarted with the ref alone (and the orders the refund's rules read).
    /// let query = StatusQuery::new("tenant-a", "user-1")
    ///     .model_call(ModelCall::new("openai", "responses", "openai-responses-2026-05", "resp-2", "call-2"))
    ///     .context(serde_json::json!({"orders": [{"order_id": "ord-1", "tenant_id": "tenant-a",
    ///         "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]}));
    /// assert!(matches!(ledger.status_of(&query, &status_ref)?.outcome(), toolledger::Outcome::Replayed(_)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn status_of(&self, query: &StatusQuery, status_ref: &StatusRef) -> Result<Reply, Error> {
        self.traced(&query.named(), || {
            let now = UnixSeconds::new(query.now().unwrap_or_else(wall_clock))
                .map_err(|_| Error::invalid("the query's instant is out of range".to_owned()))?;
            let (tenant_id, subject_id, call) = query.parts(&self.shared.registry)?;
            let asking = toolledger_engine::Asking {
                tenant_id: &tenant_id,
                subject_id: &subject_id,
                call: &call,
                now,
                context: query.context_value(),
            };
            self.shared.engine(|engine| {
                linked(engine, status_ref);
                Ok(Reply::from(engine.status_by_ref(&asking, status_ref)?))
            })
        })
    }

    /// Settles by hand an operation whose outcome no status query could tell: with the
    /// downstream's result the operator found ([`Evidence::Output`], checked against the
    /// operation and the tool's output contract as a downstream's receipt is), or as not
    /// having happened ([`Evidence::NotHappened`]: it ends `failed`, and a
    /// [`requeue`] sends it again). Only an operation that is pending, or unknown (no
    /// worker holds a live lease on it), is settled; the action, `reason` and what it
    /// was waiting on go to the append-only operator log in the same transaction, and
    /// `show` and the audit list it. `now`: the instant (the wall clock when `None`).
    ///
    /// # Errors
    ///
    /// An [`Error`] when the store fails (nothing is then written); `USAGE_ERROR` when
    /// `reason` is not one [`operator_reason`] keeps.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("resolve");
    /// use toolledger::{Evidence, Resolution, Resolved};
    /// let status_ref = ledger.enqueue(&call)?.status_ref().unwrap().clone();
    /// let settled = ledger.resolve(&status_ref, &Evidence::NotHappened, "the bank has no such refund", None)?;
    /// assert_eq!(settled, Resolution::Store(Resolved::Resolved(toolledger::OperationStatus::Failed)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn resolve(
        &self,
        status_ref: &StatusRef,
        evidence: &Evidence,
        reason: &str,
        now: Option<i64>,
    ) -> Result<Resolution, Error> {
        let reason = operate::kept_reason(reason)?;
        let now = UnixSeconds::new(now.unwrap_or_else(wall_clock))
            .map_err(|_| Error::invalid("the instant is out of range".to_owned()))?;
        self.shared.engine(|engine| Ok(engine.resolve(status_ref, evidence, reason, now)?))
    }

    /// The downstream, e.g. to arm a [`drill::Switch`] or read a test double.
    ///
    /// ```
    /// # let (ledger, _call, dir) = toolledger::doc_fixture("downstream");
    /// use toolledger::Downstream;
    /// assert_eq!(ledger.downstream().identity().to_string(), "toolledger-stand-in@1");
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// ```
    pub fn downstream(&self) -> &D {
        &self.shared.downstream
    }

    /// Dispatches a call the host already holds as a validated [`HostCall`], its
    /// approval digest its own: a case file loaded by [`load_case`] (the command line).
    /// The call's clock (instant and lease) and business context are used as given; its
    /// arguments pass the same door as a [`Call`]'s ([`door`]).
    ///
    /// # Errors
    ///
    /// As [`Ledger::dispatch`].
    ///
    /// ```
    /// # let (ledger, _call, dir) = toolledger::doc_fixture("dispatch-loaded");
    /// let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/persistence-case.json")).unwrap();
    /// let registry = toolledger::Registry::new(vec![toolledger::RefundOrder::default().tool()], toolledger::builtin_profiles());
    /// let case = toolledger::load_case(&bytes, &registry, None)?;
    /// assert!(matches!(ledger.dispatch_loaded(&case)?.outcome(), toolledger::Outcome::Fresh(_)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dispatch_loaded(&self, call: &HostCall) -> Result<Reply, Error> {
        self.traced(&traces::Named::loaded(call, traces::Purpose::Dispatch), || {
            match admitted(call) {
                Ok(call) => self.dispatch_admitted(&call),
                Err(rejection) => Ok(refused(&rejection)),
            }
        })
    }

    /// Accepts a loaded call (commit A) and stops, as [`Ledger::enqueue`] does a
    /// [`Call`].
    ///
    /// # Errors
    ///
    /// As [`Ledger::dispatch`].
    ///
    /// ```
    /// # let (ledger, _call, dir) = toolledger::doc_fixture("enqueue-loaded");
    /// let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/persistence-case.json")).unwrap();
    /// let registry = toolledger::Registry::new(vec![toolledger::RefundOrder::default().tool()], toolledger::builtin_profiles());
    /// let case = toolledger::load_case(&bytes, &registry, None)?;
    /// assert!(matches!(ledger.enqueue_loaded(&case)?.outcome(), toolledger::Outcome::Accepted { .. }));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn enqueue_loaded(&self, call: &HostCall) -> Result<Reply, Error> {
        self.traced(&traces::Named::loaded(call, traces::Purpose::Enqueue), || {
            let call = match admitted(call) {
                Ok(call) => call,
                Err(rejection) => return Ok(refused(&rejection)),
            };
            self.shared.engine(|engine| Ok(Reply::from(engine.enqueue(&call)?)))
        })
    }

    /// The status query of a loaded call, as [`Ledger::status`] is of a [`Call`].
    ///
    /// # Errors
    ///
    /// As [`Ledger::status`].
    ///
    /// ```
    /// # let (ledger, _call, dir) = toolledger::doc_fixture("status-loaded");
    /// let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/persistence-case.json")).unwrap();
    /// let registry = toolledger::Registry::new(vec![toolledger::RefundOrder::default().tool()], toolledger::builtin_profiles());
    /// let case = toolledger::load_case(&bytes, &registry, None)?;
    /// let status_ref = ledger.dispatch_loaded(&case)?.status_ref().unwrap().clone();
    /// assert!(matches!(ledger.status_loaded(&case, &status_ref)?.outcome(), toolledger::Outcome::Replayed(_)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn status_loaded(&self, call: &HostCall, status_ref: &StatusRef) -> Result<Reply, Error> {
        self.traced(&traces::Named::loaded(call, traces::Purpose::QueryStatus), || {
            let call = match admitted(call) {
                Ok(call) => call,
                Err(rejection) => return Ok(refused(&rejection)),
            };
            self.shared.engine(|engine| {
                linked(engine, status_ref);
                Ok(Reply::from(engine.status(&call, status_ref)?))
            })
        })
    }

    /// Works the accepted operation `status_ref` as [`Ledger::process`] does, judged at
    /// the loaded call's clock and against its business context.
    ///
    /// # Errors
    ///
    /// As [`Ledger::process`].
    ///
    /// ```
    /// # let (ledger, _call, dir) = toolledger::doc_fixture("process-loaded");
    /// let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/persistence-case.json")).unwrap();
    /// let registry = toolledger::Registry::new(vec![toolledger::RefundOrder::default().tool()], toolledger::builtin_profiles());
    /// let case = toolledger::load_case(&bytes, &registry, None)?;
    /// let status_ref = ledger.enqueue_loaded(&case)?.status_ref().unwrap().clone();
    /// assert!(ledger.process_loaded(&status_ref, &case)?.outcome().is_done());
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn process_loaded(&self, status_ref: &StatusRef, call: &HostCall) -> Result<Reply, Error> {
        let worker = &self.shared.worker;
        self.traced(&traces::Named::loaded(call, traces::Purpose::Process), || {
            self.shared.engine(|engine| {
                linked(engine, status_ref);
                Ok(Reply::from(engine.process(
                    status_ref,
                    &call.clock,
                    &call.business_state,
                    worker,
                )?))
            })
        })
    }

    fn clock_of(&self, call: &Call) -> Result<Clock, Error> {
        let now = UnixSeconds::new(call.now().unwrap_or_else(wall_clock))
            .map_err(|_| Error::invalid("the call's instant is out of range".to_owned()))?;
        if now.checked_add(self.shared.lease).is_none() {
            return Err(Error::invalid("the call's lease would end after year 9999".to_owned()));
        }
        Ok(Clock { now, lease_seconds: self.shared.lease })
    }

    /// The call as the engine takes it, its approval digest computed from the call
    /// itself; or, inside, the `INPUT_INVALID` reply for arguments the ledger cannot
    /// hold (nothing written).
    fn host_call_of(&self, call: &Call) -> Result<Result<HostCall, Reply>, Error> {
        let clock = self.clock_of(call)?;
        Ok(call
            .to_host_call(clock, &self.shared.registry)?
            .map_err(|rejection| refused(&rejection)))
    }
}

/// Links the call span to the trace of the call that asked for `status_ref` (stored
/// with its intent), when the span is recorded: a worker's attempt or a status query
/// leads back to it (`docs/observability.md`).
fn linked<D: Downstream, R: PrincipalResolver>(
    engine: &mut Engine<Store, traces::Traced<&D>, &R>,
    status_ref: &StatusRef,
) {
    traces::link_stored(|| {
        toolledger_store::TraceStore::trace_of(engine.store(), status_ref).ok().flatten()
    });
}

/// A loaded call with its arguments through the door ([`door::admit`]), or the
/// `INPUT_INVALID` reply (nothing written).
fn admitted(call: &HostCall) -> Result<HostCall, toolledger_contract::Rejection> {
    let arguments = door::admit(&call.proposal.arguments)?;
    let mut call = call.clone();
    call.proposal.arguments = arguments;
    Ok(call)
}

/// The `INPUT_INVALID` reply for arguments the door refused.
fn refused(rejection: &toolledger_contract::Rejection) -> Reply {
    Reply::from(toolledger_engine::input_invalid(Some(rejection)))
}

/// Upgrades the store at `location` to the current schema, after an online backup to a
/// sibling file (see [`Migrated`]). `legacy` is the downstream every existing operation
/// belongs to (older stores did not record it). A PostgreSQL ledger is upgraded in one
/// transaction, without a copy.
///
/// # Errors
///
/// An [`Error`] when there is no store, it is not one this version knows, a lock
/// outlasts `waits`, or the backup cannot be written. The store is then as it was.
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("toolledger-doc-m-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let path = dir.join("ledger.sqlite3");
/// # drop(toolledger::store_connection(&path)?);
/// let stand_in = toolledger::DownstreamIdentity::new("toolledger-stand-in", "1").unwrap();
/// // A store of the current version is left alone.
/// assert_eq!(toolledger::migrate(&path, &stand_in, toolledger::Waits::default())?, toolledger::Migrated::Current);
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn migrate(
    location: impl Into<Location>,
    legacy: &DownstreamIdentity,
    waits: Waits,
) -> Result<Migrated, Error> {
    let path = match location.into() {
        Location::Sqlite(path) => path,
        Location::Postgres(url) => {
            return Ok(match toolledger_store_postgres::migrate(&url, waits)? {
                None => Migrated::Current,
                Some((from, operations)) => Migrated::Upgraded {
                    from,
                    to: toolledger_store_postgres::SCHEMA_VERSION,
                    backup: None,
                    operations,
                },
            });
        }
    };
    let now = UnixSeconds::new(wall_clock())
        .map_err(|_| Error::invalid("the wall clock is out of range".to_owned()))?;
    Ok(toolledger_store_sqlite::migrate(&path, legacy, now, waits)?)
}

/// For the documentation's examples: a simulated ledger with the refund tool in a fresh
/// directory, and a refund call. Not part of the API.
#[doc(hidden)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "documentation examples only")]
pub fn doc_fixture(name: &str) -> (Ledger<Simulated, NoRoles>, Call, PathBuf) {
    use serde_json::json;
    let dir = std::env::temp_dir().join(format!("toolledger-doc-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = Ledger::builder(dir.join("ledger.sqlite3"))
        .tool(RefundOrder { approval_threshold_minor: Some(5_000) }.tool())
        .open_simulated(NoRoles)
        .unwrap();
    let call = Call::new(
        "refund_order",
        json!({"order_id": "ord-1", "amount_minor": 2599, "currency": "USD", "reason": "damaged"}),
    )
    .principal("tenant-a", "user-1")
    .idempotency_key("refund-ord-1")
    .model_call(ModelCall::new(
        "openai",
        "responses",
        "openai-responses-2026-05",
        "resp-1",
        "call-1",
    ))
    .context(json!({"orders": [{"order_id": "ord-1", "tenant_id": "tenant-a",
        "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]}))
    .at(1_767_225_600);
    (ledger, call, dir)
}
