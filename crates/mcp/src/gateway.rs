//! The MCP server the host talks to: `tools/list` is the upstreams' tools (a ledgered
//! one with its `idempotency_key`) and `toolledger_status`; a `tools/call` of a
//! ledgered tool goes through the ledger, any other request to its upstream unchanged.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams,
        CompleteResult, GetPromptRequestParams, GetPromptResponse, Implementation,
        InitializeResult, InputRequiredResult, ListPromptsResult, ListResourceTemplatesResult,
        ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
        ReadResourceResponse, Reference, ResultType, ServerCapabilities, SubscribeRequestParams,
        SubscriptionFilter, UnsubscribeRequestParams,
    },
    service::{RequestContext, SubscriptionContext},
};
use serde_json::{Map, Value, json};
use toolledger::{
    BlockCode, Call, Grant, Identifier, Ledger, ModelCall, NoRoles, Outcome, ProviderProfile,
    Reply, StatusQuery, StatusRef, TraceContext,
};

use crate::{
    config::ApprovalDecl,
    downstream::McpDownstream,
    hosts::{Hosts, Key, Target},
    http::TokenHolder,
    relay::{HostCall, Question, is_modern},
    tools::{Exposed, KEY_ARGUMENT, KEY_META, STATUS_TOOL, hex},
    upstream::{Serves, Upstream},
};

/// The provider profile of every call the gateway records: MCP's `tools/call`.
pub(crate) const PROFILE: (&str, &str, &str) = ("mcp", "tools_call", "toolledger-mcp-1");

/// The ledger, shared by every call at once (a [`Ledger`] is a handle whose calls run
/// side by side): each call is worked off the runtime's async threads, and no lock is
/// held while it runs.
pub(crate) type SharedLedger = Arc<Held>;

/// The gateway's ledger, dropped off the runtime's async context: a PostgreSQL store
/// runs a runtime of its own, and tokio refuses to drop a runtime inside another's
/// async context.
#[derive(Debug)]
pub(crate) struct Held(Option<Ledger<McpDownstream, NoRoles>>);

impl Held {
    pub(crate) fn new(ledger: Ledger<McpDownstream, NoRoles>) -> Held {
        Held(Some(ledger))
    }
}

impl std::ops::Deref for Held {
    type Target = Ledger<McpDownstream, NoRoles>;

    fn deref(&self) -> &Self::Target {
        self.0.as_ref().unwrap_or_else(|| unreachable!("the ledger is taken only when dropped"))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(ledger) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                // Off the async context, on any runtime (a host's current-thread one
                // too): the blocking pool drops it.
                Ok(handle) => drop(handle.spawn_blocking(move || drop(ledger))),
                Err(_) => drop(ledger),
            }
        }
    }
}

/// The gateway; cheap to clone (each host session holds one, [`Gateway::session`]).
#[derive(Debug, Clone)]
pub(crate) struct Gateway {
    inner: Arc<Inner>,
    /// Which host session this one serves (0 before [`Gateway::session`]).
    session: u64,
}

#[derive(Debug)]
struct Inner {
    tenant: String,
    subject: String,
    upstreams: Vec<Arc<Upstream>>,
    /// The host sessions, for the upstreams' announcements outside any call.
    hosts: Arc<Hosts>,
    tools: HashMap<String, Exposed>,
    listing: Vec<Value>,
    ledger: SharedLedger,
    /// The upstreams that serve resources, resource subscriptions, prompts, completions
    /// and `logging/setLevel` (indices into `upstreams`).
    resources: Vec<usize>,
    subscribe: Vec<usize>,
    prompts: Vec<usize>,
    completions: Vec<usize>,
    logging: Vec<usize>,
    /// Which upstream listed each resource URI and prompt name, as last listed.
    owners: Mutex<HashMap<String, usize>>,
    /// What `initialize` answers.
    info: InitializeResult,
    /// Calls passed through whose upstream waits on a 2026-07-28 host's answer, by the
    /// request state the host's retry carries.
    parked: Mutex<HashMap<String, Parked>>,
    /// The last number handed out to a host session or a listener.
    sessions: std::sync::atomic::AtomicU64,
}

impl Inner {
    /// A new number, for a host session or a listener.
    fn number(&self) -> u64 {
        self.sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed).saturating_add(1)
    }
}

impl Gateway {
    /// The gateway for `principal` (the configuration's tenant and subject).
    pub(crate) fn new(
        principal: (String, String),
        upstreams: Vec<Arc<Upstream>>,
        hosts: Arc<Hosts>,
        tools: Vec<Exposed>,
        ledger: SharedLedger,
        serves: &[Serves],
    ) -> Gateway {
        let which = |pick: fn(&Serves) -> bool| -> Vec<usize> {
            serves.iter().enumerate().filter(|(_, serves)| pick(serves)).map(|(at, _)| at).collect()
        };
        let (resources, prompts) =
            (which(|serves| serves.resources), which(|serves| serves.prompts));
        let (completions, logging) =
            (which(|serves| serves.completions), which(|serves| serves.logging));
        let mut listing: Vec<Value> = tools.iter().map(|tool| tool.listing.clone()).collect();
        listing.push(status_tool());
        let tools = tools.into_iter().map(|tool| (tool.name.clone(), tool)).collect();
        let subscribe = which(|serves| serves.subscribe);
        let any = |pick: fn(&Serves) -> bool| serves.iter().any(pick);
        let info = server_info(&Declared {
            resources: !resources.is_empty(),
            subscribe: !subscribe.is_empty(),
            resources_changed: any(|serves| serves.resources_changed),
            prompts: !prompts.is_empty(),
            prompts_changed: any(|serves| serves.prompts_changed),
            completions: !completions.is_empty(),
            logging: !logging.is_empty(),
        });
        Gateway {
            inner: Arc::new(Inner {
                tenant: principal.0,
                subject: principal.1,
                upstreams,
                hosts,
                tools,
                listing,
                ledger,
                resources,
                subscribe,
                prompts,
                completions,
                logging,
                owners: Mutex::new(HashMap::new()),
                info,
                parked: Mutex::new(HashMap::new()),
                sessions: std::sync::atomic::AtomicU64::new(0),
            }),
            session: 0,
        }
    }

    /// The gateway for a new host session: the same gateway, with a session number of
    /// its own (an upstream's log messages go once to each session waiting on it).
    pub(crate) fn session(&self) -> Gateway {
        Gateway { inner: Arc::clone(&self.inner), session: self.inner.number() }
    }

    /// Who may present an approval in `_meta` on this request (`docs/mcp.md`, "Who
    /// approves"): the stdio host, and a loopback listener's caller when no tokens are
    /// configured (both the configuration's own principal), may present any; over a
    /// listener with tokens, only a token declared with an `approver`, as that approver.
    fn presenter(&self, context: &RequestContext<RoleServer>) -> Presenter {
        match token_holder(context) {
            None => Presenter::Host,
            Some(holder) => Presenter::Token(holder.approver.clone()),
        }
    }

    /// Who makes the call: the bearer token's principal over HTTP, else the
    /// configuration's (stdio, or a loopback listener without tokens).
    fn principal(&self, context: &RequestContext<RoleServer>) -> (String, String) {
        token_holder(context).map_or_else(
            || (self.inner.tenant.clone(), self.inner.subject.clone()),
            |principal| (principal.tenant.clone(), principal.subject.clone()),
        )
    }

    async fn ledgered(
        &self,
        exposed: &Exposed,
        params: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let Some(ledgered) = &exposed.ledgered else {
            return tool_error("USAGE_ERROR", "not a ledgered tool", None).into();
        };
        let mut arguments = params.arguments.clone().unwrap_or_default();
        let given = arguments.remove(KEY_ARGUMENT);
        let from_meta = meta_key(params, context);
        let key = match (from_meta, given) {
            (Some(key), _) => key,
            (None, Some(Value::String(key))) => key,
            (None, Some(_)) => {
                return tool_error("INPUT_INVALID", "idempotency_key must be a string", None)
                    .into();
            }
            (None, None) if ledgered.key_from_arguments => {
                let canonical = toolledger_json::canonicalize(&Value::Object(arguments.clone()));
                format!("args-{}", &hex(canonical.as_bytes())[..32])
            }
            (None, None) => {
                return tool_error(
                    "INPUT_INVALID",
                    &format!(
                        "this tool changes something, so every call names its action: give \
                         `{KEY_ARGUMENT}` (a new key for a new action, the same key when \
                         retrying it), or set `_meta[\"{KEY_META}\"]`"
                    ),
                    Some(json!({"pointer": format!("/{KEY_ARGUMENT}"), "keyword": "required"})),
                )
                .into();
            }
        };
        if Identifier::new(&key).is_err() {
            return tool_error(
                "INPUT_INVALID",
                "an idempotency key is 1 to 128 bytes of [A-Za-z0-9._:-], starting with a letter or digit",
                Some(json!({"pointer": format!("/{KEY_ARGUMENT}"), "keyword": "pattern"})),
            )
            .into();
        }
        if let Some(argument) = &ledgered.key_argument {
            arguments.remove(argument);
        }
        let (tenant, subject) = self.principal(context);
        let shown = Value::Object(arguments.clone());
        let mut call = Call::new(&ledgered.ledger_name, Value::Object(arguments))
            .principal(&tenant, &subject)
            .idempotency_key(&key)
            .model_call(call_identity(&tenant, &subject, &ledgered.ledger_name, &key));
        if let Some(parent) = trace_parent(params, context) {
            call = call.trace_parent(parent);
        }
        let host = HostCall::of(self.session, params, context);
        let first = self.work(&call, context, &host).await;
        let Some(approval) = &ledgered.approval else { return answered(first).into() };
        // A new call of a tool a person approves: nothing was written. Ask the person
        // (or read what they answered), bind their approval to this call, and accept it.
        let unapproved = matches!(&first, Ok(reply) if matches!(reply.outcome(),
            Outcome::Blocked { code: BlockCode::ApprovalInvalid, status_ref: None }));
        if !unapproved {
            return answered(first).into();
        }
        let asked = format!(
            "Approve {} with {} (idempotency key {key})?",
            exposed.name,
            toolledger_json::canonicalize(&shown)
        );
        match approve(
            approval,
            &self.presenter(context),
            &asked,
            &[&tenant, &subject, &ledgered.ledger_name, &key],
            params,
            context,
        )
        .await
        {
            Approved::Grant(grant) => {
                let approved = call.approval(grant, &[approval.approver.as_str()]);
                answered(self.work(&approved, context, &host).await).into()
            }
            Approved::Ask(input_required) => CallToolResponse::InputRequired(input_required),
            Approved::Refused(refused) => refused.into(),
        }
    }

    /// The ledger's answer to `call`, worked in place (its reply carries why it ended,
    /// when it did not succeed: `Reply::ended_reason`).
    async fn work(
        &self,
        call: &Call,
        context: &RequestContext<RoleServer>,
        host: &HostCall,
    ) -> Result<Reply, toolledger::Error> {
        // The whole call is worked off the runtime's async threads, beside the other
        // calls: once handed to the ledger it runs to its end even if the host goes
        // away, and the next call with this key reads it. A cancellation is seen right
        // before the upstream would be called. On a multi-thread runtime (the gateway's
        // own) it is worked in place, this worker made a blocking thread while another
        // takes its tasks (no hand-off: `docs/performance.md`); a current-thread runtime
        // (a host's) has no other worker, so the call goes to the blocking pool.
        let (cancelled, watched) = (context.ct.clone(), host.clone());
        let flavor = tokio::runtime::Handle::current().runtime_flavor();
        if flavor == tokio::runtime::RuntimeFlavor::MultiThread {
            let ledger = &self.inner.ledger;
            return tokio::task::block_in_place(|| {
                crate::downstream::watching(cancelled, watched, || ledger.dispatch(call))
            });
        }
        let (ledger, call) = (Ledger::clone(&self.inner.ledger), call.clone());
        toolledger::blocking(move || {
            crate::downstream::watching(cancelled, watched, || ledger.dispatch(&call))
        })
        .await
    }

    async fn status(
        &self,
        params: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let text = params
            .arguments
            .as_ref()
            .and_then(|arguments| arguments.get("status_ref"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Ok(status_ref) = StatusRef::new(text) else {
            return tool_error(
                "INPUT_INVALID",
                "status_ref must be the sr_… ref an OUTCOME_UNKNOWN answer gave",
                Some(json!({"pointer": "/status_ref", "keyword": "pattern"})),
            );
        };
        let (tenant, subject) = self.principal(context);
        let mut query = StatusQuery::new(&tenant, &subject).model_call(ModelCall::new(
            PROFILE.0,
            PROFILE.1,
            PROFILE.2,
            &format!("mcp-status-{}", status_ref.as_str()),
            &format!("mcp-status-{}", status_ref.as_str()),
        ));
        if let Some(parent) = trace_parent(params, context) {
            query = query.trace_parent(parent);
        }
        match self.inner.ledger.status_of_async(&query, &status_ref).await {
            Ok(reply) => answer(&reply, None),
            Err(error) => tool_error(error.code().as_str(), &error.to_string(), None),
        }
    }

    /// A call passed through to its upstream. For a 2026-07-28 host, a question the
    /// upstream asks meanwhile answers the call `input_required`; the host's retry with
    /// the answer resumes the same upstream call (`docs/mcp.md`, "Upstreams that ask").
    async fn passthrough(
        &self,
        exposed: &Exposed,
        mut params: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if let Some(state) =
            params.request_state.as_deref().filter(|state| state.starts_with(PARKED))
        {
            let Some(parked) = self.unpark(state, &self.principal(context)) else {
                return Err(McpError::invalid_params(
                    "this question of the upstream is no longer open (answered, or past the \
                     upstream's timeout); call the tool again",
                    None,
                ));
            };
            let answer = params
                .input_responses
                .as_mut()
                .and_then(|responses| responses.remove(QUESTION_INPUT))
                .ok_or_else(|| McpError::invalid_params("the host gave no answer", None));
            let _ = parked.answer.send(answer);
            return self.awaited(parked.at, parked.call, parked.questions, parked.principal).await;
        }
        let at = exposed.upstream;
        let upstream = Arc::clone(self.upstream(at)?);
        let peer =
            upstream.peer().await.map_err(|reason| McpError::internal_error(reason, None))?;
        let mut host = HostCall::of(self.session, &params, context);
        params.name = exposed.upstream_tool.clone().into();
        if !host.modern {
            // The handshake era asks the host mid-call: nothing to park.
            return self.completed(at, upstream.send(&peer, params, Some(&host)).await);
        }
        let (asked, questions) = tokio::sync::mpsc::unbounded_channel();
        host.questions = Some(asked);
        let call = tokio::spawn(async move { upstream.send(&peer, params, Some(&host)).await });
        self.awaited(at, call, questions, self.principal(context)).await
    }

    /// The host's answer to a call passed through to upstream `at`, from the
    /// upstream's `answer`.
    fn completed(
        &self,
        at: usize,
        answer: Result<CallToolResult, rmcp::ServiceError>,
    ) -> Result<CallToolResponse, McpError> {
        if let Err(rmcp::ServiceError::Timeout { .. }) = answer {
            return Err(McpError::internal_error(self.upstream(at)?.timed_out(), None));
        }
        let mut result = passed(answer)?;
        result.result_type = Some(ResultType::COMPLETE);
        Ok(result.into())
    }

    /// The answer of an upstream `call` passed through to upstream `at` for a
    /// 2026-07-28 host, or, when the upstream asks a question first, the call answered
    /// `input_required` with it, kept for a retry of `principal` (over HTTP such a
    /// host's retry may come on another connection, so the state is a token only that
    /// call's answer names).
    async fn awaited(
        &self,
        at: usize,
        mut call: Answering,
        mut questions: tokio::sync::mpsc::UnboundedReceiver<Question>,
        principal: (String, String),
    ) -> Result<CallToolResponse, McpError> {
        let question = tokio::select! {
            answer = &mut call => {
                let Ok(answer) = answer else {
                    return Err(McpError::internal_error("the upstream call ended abruptly", None));
                };
                return self.completed(at, answer);
            }
            Some(question) = questions.recv() => question,
        };
        let state = format!("{PARKED}{}", unguessable(self.inner.number()));
        let input_required = json!({
            "resultType": "input_required",
            "inputRequests": {QUESTION_INPUT: question.request},
            "requestState": state,
        });
        let input_required = serde_json::from_value(input_required).map_err(|err| {
            McpError::internal_error(format!("the upstream's question: {err}"), None)
        })?;
        let timeout = self.upstream(at)?.decl.timeout;
        let mut parked =
            self.inner.parked.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A question nobody answered within twice the upstream's timeout: its call has
        // ended by now; the upstream is told the host did not answer.
        parked.retain(|_, open| open.since.elapsed() < timeout.saturating_mul(2));
        let open = Parked {
            principal,
            since: std::time::Instant::now(),
            at,
            call,
            questions,
            answer: question.answer,
        };
        parked.insert(state, open);
        Ok(CallToolResponse::InputRequired(input_required))
    }

    /// The call parked under `state`, when it is `principal`'s.
    fn unpark(&self, state: &str, principal: &(String, String)) -> Option<Parked> {
        let mut parked =
            self.inner.parked.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match parked.get(state) {
            Some(open) if open.principal == *principal => parked.remove(state),
            _ => None,
        }
    }

    /// Upstream `at`.
    fn upstream(&self, at: usize) -> Result<&Arc<Upstream>, McpError> {
        self.inner
            .upstreams
            .get(at)
            .ok_or_else(|| McpError::internal_error("no such upstream", None))
    }

    /// The live connection of upstream `at`.
    async fn peer(&self, at: usize) -> Result<rmcp::service::Peer<rmcp::RoleClient>, McpError> {
        self.upstream(at)?.peer().await.map_err(|reason| McpError::internal_error(reason, None))
    }

    /// The upstream that listed `name` (a resource URI, or `prompt:NAME`), else the first
    /// of `candidates`.
    fn owner(&self, name: &str, candidates: &[usize]) -> Result<usize, McpError> {
        let owners = self.inner.owners.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        owners
            .get(name)
            .copied()
            .or_else(|| candidates.first().copied())
            .ok_or_else(|| McpError::invalid_params(format!("no upstream serves {name}"), None))
    }

    fn own(&self, names: impl IntoIterator<Item = String>, at: usize) {
        let mut owners =
            self.inner.owners.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for name in names {
            owners.entry(name).or_insert(at);
        }
    }

    /// Subscribes `key` (told through `target`) to `uri`, at the upstream that serves
    /// it when `key` is the first.
    #[allow(deprecated, reason = "the handshake era's resources/subscribe, which upstreams speak")]
    async fn watch(&self, uri: &str, key: Key, target: Target) -> Result<(), McpError> {
        let at = self.owner(uri, &self.inner.resources)?;
        if !self.inner.subscribe.contains(&at) {
            return Err(McpError::invalid_params(
                format!("the upstream that serves {uri} takes no subscriptions"),
                None,
            ));
        }
        let upstream = self.upstream(at)?;
        let hosts = &self.inner.hosts;
        if hosts.subscribe(uri, &upstream.decl.name, key, target) {
            let subscribed = match self.peer(at).await {
                Ok(peer) => passed(peer.subscribe(SubscribeRequestParams::new(uri)).await),
                Err(err) => Err(err),
            };
            if let Err(err) = subscribed {
                hosts.unsubscribe(uri, key);
                return Err(err);
            }
        }
        Ok(())
    }

    /// Tells the upstream that serves `uri` that nobody subscribes to it any more.
    #[allow(
        deprecated,
        reason = "the handshake era's resources/unsubscribe, which upstreams speak"
    )]
    async fn unwatch(&self, uri: &str) -> Result<(), McpError> {
        let at = self.owner(uri, &self.inner.resources)?;
        let unsubscribe = UnsubscribeRequestParams::new(uri);
        passed(self.peer(at).await?.unsubscribe(unsubscribe).await)
    }

    /// Closes every upstream connection.
    pub(crate) async fn shutdown(&self) {
        for upstream in &self.inner.upstreams {
            upstream.shutdown().await;
        }
    }
}

/// An upstream call passed through, running on a task of its own.
type Answering = tokio::task::JoinHandle<Result<CallToolResult, rmcp::ServiceError>>;

/// Where the request state of a call parked on an upstream's question starts.
const PARKED: &str = "toolledger-question-";

/// The key of an upstream's question among a 2026-07-28 call's input requests.
const QUESTION_INPUT: &str = "toolledger_upstream_question";

/// A call passed through whose upstream asked a 2026-07-28 host a question: the host's
/// retry with the answer resumes it.
#[derive(Debug)]
struct Parked {
    principal: (String, String),
    since: std::time::Instant,
    at: usize,
    call: Answering,
    questions: tokio::sync::mpsc::UnboundedReceiver<Question>,
    answer: tokio::sync::oneshot::Sender<Result<Value, McpError>>,
}

/// 128 bits nobody outside this process can predict, for number `n`: SipHash under the
/// secret keys the standard library draws from the operating system.
fn unguessable(n: u64) -> String {
    use std::hash::{BuildHasher, Hasher};
    let half = |salt: u64| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(n);
        hasher.write_u64(salt);
        hasher.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

/// The ledger's answer as a tool result.
fn answered(worked: Result<Reply, toolledger::Error>) -> CallToolResult {
    match worked {
        Ok(reply) => answer(&reply, reply.ended_reason()),
        Err(error) => tool_error(error.code().as_str(), &error.to_string(), None),
    }
}

/// The `_meta` member a host sets to present an approval it obtained itself.
pub(crate) const APPROVAL_META: &str = "io.toolledger/approval";

/// The key of the gateway's elicitation among a 2026-07-28 call's input requests.
const APPROVAL_INPUT: &str = "toolledger_approval";

/// What asking for an approval came to.
enum Approved {
    /// Approved: the grant, to be bound to the call.
    Grant(Grant),
    /// Ask the person first (2026-07-28): the call is retried with their answer.
    Ask(InputRequiredResult),
    /// Not approved, or it could not be asked: the tool error that says what to do.
    Refused(CallToolResult),
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
}

/// The bearer token's holder of a request over HTTP with tokens; `None` over stdio or a
/// loopback listener without tokens.
fn token_holder(context: &RequestContext<RoleServer>) -> Option<&TokenHolder> {
    context
        .extensions
        .get::<hyper::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<TokenHolder>())
}

/// Who presents an approval in a request's `_meta`.
enum Presenter {
    /// The host that started the gateway (stdio), or a loopback caller without tokens:
    /// the configuration's own principal.
    Host,
    /// A bearer token's holder, and the approver the configuration declares it for.
    Token(Option<String>),
}

impl Presenter {
    fn may_present(&self, approver_id: &str) -> bool {
        match self {
            Presenter::Host => true,
            Presenter::Token(approver) => approver.as_deref() == Some(approver_id),
        }
    }
}

/// The approval of a new call of a tool a person approves: one the host presents in
/// `_meta`, the person's answer to the gateway's elicitation (in this request's input
/// responses on 2026-07-28, or asked now on earlier protocols), or a refusal saying what
/// to do.
async fn approve(
    approval: &ApprovalDecl,
    presenter: &Presenter,
    asked: &str,
    scope: &[&str],
    params: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Approved {
    let presented = params
        .meta
        .as_ref()
        .and_then(|meta| meta.0.0.get(APPROVAL_META).cloned())
        .or_else(|| context.meta.0.0.get(APPROVAL_META).cloned());
    if let Some(presented) = presented {
        let field = |name: &str| presented.get(name).cloned();
        let text = |name: &str| field(name).and_then(|value| value.as_str().map(str::to_owned));
        let time = |name: &str| field(name).and_then(|value| value.as_i64());
        return match (
            text("approval_id"),
            text("approver_id"),
            time("approved_at"),
            time("expires_at"),
        ) {
            (Some(_), Some(approver_id), Some(_), Some(_))
                if !presenter.may_present(&approver_id) =>
            {
                Approved::Refused(tool_error(
                    "APPROVAL_INVALID",
                    "over HTTP with tokens, an approval is presented only with a token the configuration declares for that approver; this one may not present it. Nothing was accepted or sent",
                    None,
                ))
            }
            (Some(approval_id), Some(approver_id), Some(approved_at), Some(expires_at)) => {
                Approved::Grant(Grant { approval_id, approver_id, approved_at, expires_at })
            }
            _ => Approved::Refused(tool_error(
                "APPROVAL_INVALID",
                &format!(
                    "_meta[\"{APPROVAL_META}\"] must hold approval_id, approver_id, approved_at and expires_at"
                ),
                None,
            )),
        };
    }
    let answered = params
        .input_responses
        .as_ref()
        .and_then(|responses| responses.get(APPROVAL_INPUT))
        .cloned();
    let answer = match answered {
        Some(answer) => answer,
        None => {
            let can_elicit = context
                .client_capabilities()
                .is_some_and(|capabilities| capabilities.elicitation.is_some());
            if !can_elicit {
                return Approved::Refused(approval_required(
                    "this host does not support MCP elicitation, so the gateway cannot ask",
                ));
            }
            let request = json!({
                "message": asked,
                "requestedSchema": {
                    "type": "object",
                    "properties": {"approve": {"type": "boolean", "title": "Approve", "description": asked}},
                    "required": ["approve"]
                }
            });
            let modern = context.protocol_version().is_some_and(|version| is_modern(&version));
            if modern {
                let input_required = json!({
                    "resultType": "input_required",
                    "inputRequests": {APPROVAL_INPUT: {"method": "elicitation/create", "params": request}}
                });
                return match serde_json::from_value(input_required) {
                    Ok(input_required) => Approved::Ask(input_required),
                    Err(_) => {
                        Approved::Refused(approval_required("the elicitation could not be formed"))
                    }
                };
            }
            let request = json!({"method": "elicitation/create", "params": request});
            let Ok(request) = serde_json::from_value::<rmcp::model::ServerRequest>(request) else {
                return Approved::Refused(approval_required("the elicitation could not be formed"));
            };
            match context.peer.send_request(request).await {
                Ok(result) => serde_json::to_value(result).unwrap_or_default(),
                Err(_) => {
                    return Approved::Refused(approval_required(
                        "the host did not answer the elicitation",
                    ));
                }
            }
        }
    };
    let accepted = answer.get("action") == Some(&json!("accept"))
        && answer.pointer("/content/approve") == Some(&Value::Bool(true));
    if !accepted {
        return Approved::Refused(tool_error(
            BlockCode::ApprovalRequired.as_str(),
            "the approver did not approve this call; nothing was accepted or sent",
            None,
        ));
    }
    let approved_at = unix_now();
    let digest = hex(toolledger_json::canonicalize(&json!([scope, approved_at])).as_bytes());
    Approved::Grant(Grant {
        approval_id: format!("mcp-approval-{}", digest.get(..24).unwrap_or_default()),
        approver_id: approval.approver.clone(),
        approved_at,
        expires_at: approved_at.saturating_add(approval.validity_seconds),
    })
}

fn approval_required(why: &str) -> CallToolResult {
    tool_error(
        BlockCode::ApprovalRequired.as_str(),
        &format!(
            "this tool needs a person's approval before it is accepted, and {why}; nothing was \
             accepted or sent. Use a host that supports MCP elicitation, or have the host \
             obtain the approval and present it in _meta[\"{APPROVAL_META}\"] (approval_id, \
             approver_id, approved_at, expires_at) when it retries with the same key"
        ),
        None,
    )
}

/// The key a host set in the request's `_meta` (only that member is read: SDKs add
/// their own members to the same object).
fn meta_key(
    params: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Option<String> {
    let from =
        |meta: &Map<String, Value>| meta.get(KEY_META).and_then(Value::as_str).map(str::to_owned);
    params.meta.as_ref().and_then(|meta| from(&meta.0.0)).or_else(|| from(&context.meta.0.0))
}

/// The trace the host's request continues: `traceparent` and `tracestate` in its
/// `_meta` (MCP reserves both names for W3C Trace Context), else the HTTP request's own
/// headers of the same names (Streamable HTTP). `None` when neither holds a valid one:
/// the call's span then starts a trace (`docs/observability.md`).
fn trace_parent(
    params: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Option<TraceContext> {
    let in_meta = |meta: &Map<String, Value>| {
        let parent = meta.get("traceparent")?.as_str()?;
        let state = meta.get("tracestate").and_then(Value::as_str).unwrap_or_default();
        Some((parent.to_owned(), state.to_owned()))
    };
    let in_headers = || {
        let parts = context.extensions.get::<hyper::http::request::Parts>()?;
        let header = |name: &str| parts.headers.get(name).and_then(|value| value.to_str().ok());
        Some((
            header("traceparent")?.to_owned(),
            header("tracestate").unwrap_or_default().to_owned(),
        ))
    };
    let (parent, state) = params
        .meta
        .as_ref()
        .and_then(|meta| in_meta(&meta.0.0))
        .or_else(|| in_meta(&context.meta.0.0))
        .or_else(in_headers)?;
    TraceContext::parse(&parent, &state)
}

/// The model call of a `tools/call` (`docs/mcp.md`, "One model call"): MCP gives a
/// server no id of the model's tool use, and a retry carries a new JSON-RPC id, so the
/// call is named by what stays the same across its retries — the principal, the tool
/// and the idempotency key.
pub(crate) fn call_identity(tenant: &str, subject: &str, tool: &str, key: &str) -> ModelCall {
    let profile = ProviderProfile::new(PROFILE.0, PROFILE.1, PROFILE.2);
    ModelCall::keyed(profile, "mcp", tenant, subject, tool, key)
}

fn status_tool() -> Value {
    json!({
        "name": STATUS_TOOL,
        "description": "Ask the ledger what became of an operation a tool answered OUTCOME_UNKNOWN for: it asks the upstream when it can, and answers the outcome, or OUTCOME_UNKNOWN again when nothing can tell yet. Never retry the action under a new key instead.",
        "inputSchema": {
            "type": "object",
            "properties": {"status_ref": {"type": "string", "pattern": "^sr_[0-9a-f]{32}$", "description": "The status_ref of the OUTCOME_UNKNOWN answer."}},
            "required": ["status_ref"],
            "additionalProperties": false
        },
        "annotations": {"readOnlyHint": true, "idempotentHint": true}
    })
}

/// A tool error the model reads: the code first, then what to do.
fn tool_error(code: &str, message: &str, detail: Option<Value>) -> CallToolResult {
    let mut package = json!({"gate": "BLOCK", "code": code, "message": message});
    if let (Some(detail), Some(members)) = (detail, package.as_object_mut()) {
        members.insert("detail".to_owned(), detail);
    }
    result(json!({
        "content": [{"type": "text", "text": format!("{code}: {message}")}],
        "structuredContent": package,
        "isError": true,
    }))
}

fn result(value: Value) -> CallToolResult {
    let mut result: CallToolResult =
        serde_json::from_value(value).unwrap_or_else(|_| CallToolResult::error(Vec::new()));
    result.result_type = Some(ResultType::COMPLETE);
    result
}

/// The ledger's reply as a `tools/call` result; `reason`: why it ended, when it did.
fn answer(reply: &Reply, reason: Option<&str>) -> CallToolResult {
    match reply.outcome() {
        Outcome::Fresh(receipt) | Outcome::Replayed(receipt) | Outcome::Reconciled(receipt) => {
            let replayed = matches!(reply.outcome(), Outcome::Replayed(_));
            let mut value = receipt.output().clone();
            if let Some(members) = value.as_object_mut() {
                members.insert(
                    "_meta".to_owned(),
                    json!({
                        "io.toolledger/status_ref": receipt.status_ref().as_str(),
                        "io.toolledger/replayed": replayed,
                    }),
                );
            }
            result(value)
        }
        Outcome::Unknown { status_ref } => tool_error(
            "OUTCOME_UNKNOWN",
            &format!(
                "the action may or may not have happened; status_ref {status_ref}. Do not \
                 retry it under a new key: call {STATUS_TOOL} with this status_ref, or call \
                 again with the same key"
            ),
            Some(json!({"status_ref": status_ref.as_str()})),
        ),
        Outcome::Accepted { status_ref } => tool_error(
            "ACCEPTED",
            &format!("accepted and queued as {status_ref}; nothing was sent yet"),
            Some(json!({"status_ref": status_ref.as_str()})),
        ),
        Outcome::Blocked { code, status_ref } => {
            let message =
                reply.package().get("message").and_then(Value::as_str).unwrap_or("refused");
            let mut detail = reply.package().get("detail").cloned().unwrap_or(json!({}));
            if let (Some(status_ref), Some(members)) = (status_ref, detail.as_object_mut()) {
                members.insert("status_ref".to_owned(), json!(status_ref.as_str()));
                if let Some(reason) = reason {
                    members.insert("reason".to_owned(), json!(reason));
                }
            }
            let message = match code {
                BlockCode::IdempotencyConflict => {
                    format!("{message}; a new action takes a new key")
                }
                _ => match reason {
                    Some(reason) => format!("{message}: {reason}"),
                    None => message.to_owned(),
                },
            };
            tool_error(code.as_str(), &message, Some(detail))
        }
    }
}

/// An upstream's answer to a request passed through: its own error as it was, any other
/// failure an internal error.
fn passed<T>(answer: Result<T, rmcp::ServiceError>) -> Result<T, McpError> {
    match answer {
        Ok(answer) => Ok(answer),
        Err(rmcp::ServiceError::McpError(error)) => Err(error),
        Err(other) => Err(McpError::internal_error(other.to_string(), None)),
    }
}

/// A listing result of `member` holding `items`, complete.
fn listed<T: serde::de::DeserializeOwned>(member: &str, items: Vec<Value>) -> Result<T, McpError> {
    let mut value = serde_json::Map::new();
    value.insert(member.to_owned(), Value::Array(items));
    value.insert("resultType".to_owned(), json!("complete"));
    serde_json::from_value(Value::Object(value))
        .map_err(|err| McpError::internal_error(format!("a listing: {err}"), None))
}

/// What the gateway declares it serves besides tools: what its upstreams serve.
#[derive(Debug, Clone, Copy)]
struct Declared {
    resources: bool,
    subscribe: bool,
    resources_changed: bool,
    prompts: bool,
    prompts_changed: bool,
    completions: bool,
    logging: bool,
}

/// What `initialize` answers: tools, and what `declared` says the upstreams serve.
fn server_info(declared: &Declared) -> InitializeResult {
    // Each capability an upstream serves, with the flags that are on (those off are
    // left out).
    let flags = |flags: &[(&str, bool)]| -> Value {
        let on = flags.iter().filter(|(_, on)| *on);
        Value::Object(on.map(|(flag, _)| ((*flag).to_owned(), Value::Bool(true))).collect())
    };
    let served = [
        (
            "resources",
            declared.resources,
            flags(&[
                ("subscribe", declared.subscribe),
                ("listChanged", declared.resources_changed),
            ]),
        ),
        ("prompts", declared.prompts, flags(&[("listChanged", declared.prompts_changed)])),
        ("completions", declared.completions, flags(&[])),
        ("logging", declared.logging, flags(&[])),
    ];
    let mut capabilities = Map::new();
    capabilities.insert("tools".to_owned(), json!({}));
    for (capability, on, flags) in served {
        if on {
            capabilities.insert(capability.to_owned(), flags);
        }
    }
    let capabilities = Value::Object(capabilities);
    let capabilities: ServerCapabilities = serde_json::from_value(capabilities)
        .unwrap_or_else(|_| ServerCapabilities::builder().enable_tools().build());
    let mut info = InitializeResult::new(capabilities);
    info.server_info = Implementation::new("toolledger-mcp", env!("CARGO_PKG_VERSION"));
    info.instructions = Some(format!(
        "toolledger gateway: every tool that changes something takes an `{KEY_ARGUMENT}`. \
         Retry an action with the same key; an OUTCOME_UNKNOWN answer is settled with \
         {STATUS_TOOL}, never by retrying under a new key."
    ));
    info
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> InitializeResult {
        self.inner.info.clone()
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut all = Vec::new();
        for &at in &self.inner.resources {
            let resources = passed(self.peer(at).await?.list_all_resources().await)?;
            self.own(resources.iter().map(|resource| resource.uri.clone()), at);
            for resource in resources {
                all.push(serde_json::to_value(resource).unwrap_or_default());
            }
        }
        listed("resources", all)
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        // A 2026-07-28 host hears of changes only on the streams it listens on.
        let handshake =
            context.peer.peer_info().is_some_and(|info| !is_modern(&info.protocol_version));
        if handshake {
            self.inner.hosts.joined(Key::Session(self.session), Target::Peer(context.peer));
        }
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (key, target) = (Key::Session(self.session), Target::Peer(context.peer));
        self.watch(&request.uri, key, target).await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if self.inner.hosts.unsubscribe(&request.uri, Key::Session(self.session)) {
            self.unwatch(&request.uri).await?;
        }
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // Resources and prompts whose lists change, and resources an upstream takes
        // subscriptions for; never the tool list, which the gateway keeps from its start.
        let mut accepted = requested.clone();
        accepted.tools_list_changed = None;
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|uri| {
                    self.owner(uri, &self.inner.resources)
                        .is_ok_and(|at| self.inner.subscribe.contains(&at))
                })
                .cloned()
                .collect()
        });
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let key = Key::Listener(self.inner.number());
        let sink = context.sink().clone();
        self.inner.hosts.joined(key, Target::Sink(sink.clone()));
        let uris = context.accepted().resource_subscriptions.clone().unwrap_or_default();
        let mut watched = Ok(());
        for uri in uris {
            watched = self.watch(&uri, key, Target::Sink(sink.clone())).await;
            if watched.is_err() {
                break;
            }
        }
        if watched.is_ok() {
            context.cancelled().await;
        }
        for uri in self.inner.hosts.left(key) {
            let _ = self.unwatch(&uri).await;
        }
        watched
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let mut all = Vec::new();
        for &at in &self.inner.resources {
            let templates = passed(self.peer(at).await?.list_all_resource_templates().await)?;
            all.extend(
                templates
                    .into_iter()
                    .map(|template| serde_json::to_value(template).unwrap_or_default()),
            );
        }
        listed("resourceTemplates", all)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let at = self.owner(&request.uri, &self.inner.resources)?;
        let mut read = passed(self.peer(at).await?.read_resource_once(request).await)?;
        // An upstream on an older protocol leaves the field out; the host's may need it.
        if let ReadResourceResponse::Complete(result) = &mut read {
            result.result_type = Some(ResultType::COMPLETE);
        }
        Ok(read)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let mut all = Vec::new();
        for &at in &self.inner.prompts {
            let prompts = passed(self.peer(at).await?.list_all_prompts().await)?;
            self.own(prompts.iter().map(|prompt| format!("prompt:{}", prompt.name)), at);
            all.extend(
                prompts.into_iter().map(|prompt| serde_json::to_value(prompt).unwrap_or_default()),
            );
        }
        listed("prompts", all)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let at = self.owner(&format!("prompt:{}", request.name), &self.inner.prompts)?;
        let mut prompt = passed(self.peer(at).await?.get_prompt_once(request).await)?;
        if let GetPromptResponse::Complete(result) = &mut prompt {
            result.result_type = Some(ResultType::COMPLETE);
        }
        Ok(prompt)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        // A prompt's argument goes to the upstream that listed the prompt; a resource
        // template's to the one that listed it, else the first that completes.
        let name = match &request.r#ref {
            Reference::Prompt(prompt) => format!("prompt:{}", prompt.name),
            Reference::Resource(resource) => resource.uri.clone(),
            _ => String::new(),
        };
        let at = self.owner(&name, &self.inner.completions)?;
        passed(self.peer(at).await?.complete(request).await)
    }

    #[allow(deprecated, reason = "a handshake-era host still sets the level of its upstreams")]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        for &at in &self.inner.logging {
            passed(self.peer(at).await?.set_level(request.clone()).await)?;
        }
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut listed: ListToolsResult =
            serde_json::from_value(json!({"tools": self.inner.listing}))
                .map_err(|err| McpError::internal_error(format!("a tool listing: {err}"), None))?;
        listed.result_type = Some(ResultType::COMPLETE);
        Ok(listed)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if request.name == STATUS_TOOL {
            return Ok(self.status(&request, &context).await.into());
        }
        let Some(exposed) = self.inner.tools.get(request.name.as_ref()) else {
            return Err(McpError::invalid_params(format!("no tool named {}", request.name), None));
        };
        let exposed = exposed.clone();
        if exposed.ledgered.is_some() {
            Ok(self.ledgered(&exposed, &request, &context).await)
        } else {
            self.passthrough(&exposed, request, &context).await
        }
    }
}
