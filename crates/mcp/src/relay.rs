//! What an upstream tells the host during a call: its progress, under the host's own
//! progress token, and its log messages, to each host session with a call in flight on
//! that upstream (`docs/mcp.md`, "Progress and logs"); and what it asks the host during
//! a call — sampling, elicitation, roots — to the one host session waiting on it
//! (`docs/mcp.md`, "Upstreams that ask").
//!
//! The upstream sees the progress token rmcp gives each request on that connection (two
//! hosts may both use `1`); while the call is in flight the gateway keeps which host
//! session, and which of its tokens, that token stands for.
#![allow(
    deprecated,
    reason = "2026-07-28 deprecates logging (SEP-2577), but hosts and upstreams of the handshake era still log, and the gateway forwards what they send"
)]

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use rmcp::{
    ClientHandler, ErrorData as McpError, RoleClient, RoleServer, ServiceError,
    model::{
        CallToolRequestParams, ClientCapabilities, ClientInfo, CreateMessageRequestParams,
        CreateMessageResult, ElicitRequestParams, ElicitResult, ErrorCode, Implementation,
        JsonRpcMessage, JsonRpcNotification, ListRootsResult, LoggingMessageNotificationParam,
        ProgressNotificationParam, ProgressToken, ProtocolVersion, Request, RequestNoParam,
        ServerNotification, ServerRequest,
    },
    service::{Peer, RequestContext, RxJsonRpcMessage, TxJsonRpcMessage},
    transport::Transport,
};
use serde_json::{Map, Value};

use crate::hosts::{Changed, Hosts};

/// The `_meta` member a 2026-07-28 host sets to receive a call's log messages.
pub(crate) const LOG_LEVEL_META: &str = "io.modelcontextprotocol/logLevel";

/// Whether `version` is 2026-07-28 or later: no handshake, no requests from a server
/// mid-call, subscriptions on `subscriptions/listen` streams.
pub(crate) fn is_modern(version: &ProtocolVersion) -> bool {
    version.as_str() >= ProtocolVersion::V_2026_07_28.as_str()
}

/// The host's side of one call the gateway makes upstream.
#[derive(Debug, Clone)]
pub(crate) struct HostCall {
    /// The host session (one gateway session per host connection).
    pub(crate) session: u64,
    pub(crate) peer: Peer<RoleServer>,
    /// The host's progress token, when it asked for progress.
    pub(crate) progress: Option<ProgressToken>,
    /// The log level the host asked this call's messages at (2026-07-28).
    pub(crate) log_level: Option<Value>,
    /// What the host can be asked (sampling, elicitation, roots), as it declared.
    pub(crate) capabilities: Option<ClientCapabilities>,
    /// The host speaks 2026-07-28 or later, where a server sends it no requests.
    pub(crate) modern: bool,
    /// Where an upstream's question for a 2026-07-28 host goes, when the host's call can
    /// be answered `input_required` meanwhile (a call passed through).
    pub(crate) questions: Option<tokio::sync::mpsc::UnboundedSender<Question>>,
}

/// A question an upstream asks during a call of a 2026-07-28 host: the request (as its
/// wire JSON, an input request), and where the host's answer goes.
#[derive(Debug)]
pub(crate) struct Question {
    pub(crate) request: Value,
    pub(crate) answer: tokio::sync::oneshot::Sender<Result<Value, McpError>>,
}

impl HostCall {
    /// The host's side of `params`, called in `context`.
    pub(crate) fn of(
        session: u64,
        params: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> HostCall {
        let own = params.meta.as_ref();
        let progress = own
            .and_then(|meta| meta.get_progress_token())
            .or_else(|| context.meta.get_progress_token());
        let log_level = own
            .and_then(|meta| meta.0.0.get(LOG_LEVEL_META))
            .or_else(|| context.meta.0.0.get(LOG_LEVEL_META))
            .cloned();
        let modern = context.protocol_version().is_some_and(|version| is_modern(&version));
        HostCall {
            session,
            peer: context.peer.clone(),
            progress,
            log_level,
            capabilities: context.client_capabilities(),
            modern,
            questions: None,
        }
    }

    /// What the upstream request's `_meta` carries for the host: its log level (rmcp
    /// sets the progress token of every request itself).
    pub(crate) fn stamp(&self, meta: &mut Map<String, Value>) {
        if let Some(level) = &self.log_level {
            meta.insert(LOG_LEVEL_META.to_owned(), level.clone());
        }
    }
}

/// The most progress notifications kept for a request not yet recorded as in flight
/// (rmcp names a request's token only once the request is on its way).
const EARLY_MAX: usize = 32;

/// The longest a host may take to accept one relayed notification: past it, that host
/// misses it, and the upstream's next message (perhaps the result) is read.
pub(crate) const RELAY_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// The calls in flight on one upstream connection, by the progress token of each, and
/// the host sessions to tell what the upstream announces outside any call.
#[derive(Debug)]
pub(crate) struct Relays {
    state: Mutex<State>,
    pub(crate) hosts: Arc<Hosts>,
    upstream: String,
}

#[derive(Debug, Default)]
struct State {
    calls: HashMap<ProgressToken, HostCall>,
    /// Progress that arrived before its call was recorded, oldest first.
    early: VecDeque<ProgressNotificationParam>,
}

/// A call in flight: removed from its upstream's relays when dropped.
#[derive(Debug)]
pub(crate) struct InFlight {
    relays: Arc<Relays>,
    token: ProgressToken,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.relays.lock().calls.remove(&self.token);
    }
}

impl Relays {
    /// The relays of upstream `upstream`, whose announcements go to `hosts`.
    pub(crate) fn new(upstream: &str, hosts: Arc<Hosts>) -> Relays {
        Relays { state: Mutex::default(), hosts, upstream: upstream.to_owned() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets the progress kept for requests never recorded: a new connection numbers
    /// its requests' tokens afresh.
    pub(crate) fn reconnected(&self) {
        self.lock().early.clear();
    }

    /// Records `call` as in flight under the upstream request's progress `token` until
    /// the returned guard is dropped; the progress that already arrived for it, sent on.
    pub(crate) async fn begin(self: &Arc<Self>, call: HostCall, token: ProgressToken) -> InFlight {
        let early: Vec<ProgressNotificationParam> = {
            let mut state = self.lock();
            state.calls.insert(token.clone(), call.clone());
            let (mine, others): (Vec<_>, Vec<_>) =
                state.early.drain(..).partition(|early| early.progress_token == token);
            state.early = others.into();
            mine
        };
        for params in early {
            relay_progress(&call, params).await;
        }
        InFlight { relays: Arc::clone(self), token }
    }

    /// The upstream's progress, to the host whose call it is, under the host's token.
    async fn progress(&self, params: ProgressNotificationParam) {
        let call = {
            let mut state = self.lock();
            let call = state.calls.get(&params.progress_token).cloned();
            if call.is_none() {
                if state.early.len() == EARLY_MAX {
                    state.early.pop_front();
                }
                state.early.push_back(params.clone());
            }
            call
        };
        if let Some(call) = call {
            relay_progress(&call, params).await;
        }
    }

    /// The host an upstream's request mid-call is for: the one host session with calls
    /// in flight on this upstream. MCP's handshake era does not say which call a
    /// server's request belongs to, so with two sessions waiting it could go to the
    /// wrong person, and it is refused instead.
    fn asked(&self) -> Result<HostCall, String> {
        let state = self.lock();
        let mut calls = state.calls.values();
        let Some(first) = calls.next() else {
            return Err("no host is waiting on a call to this upstream".to_owned());
        };
        if calls.any(|call| call.session != first.session) {
            return Err("calls of several host sessions are in flight on this upstream, so the \
                        gateway cannot tell which host the request is for"
                .to_owned());
        }
        Ok(first.clone())
    }

    /// The upstream's log message, to each host session with a call in flight on it.
    async fn log(&self, params: LoggingMessageNotificationParam) {
        let mut sessions: Vec<HostCall> = Vec::new();
        for call in self.lock().calls.values() {
            if !sessions.iter().any(|seen| seen.session == call.session) {
                sessions.push(call.clone());
            }
        }
        for call in sessions {
            let notified = call.peer.notify_logging_message(params.clone());
            let _ = tokio::time::timeout(RELAY_WAIT, notified).await;
        }
    }
}

/// `params` to the host of `call`, under the host's own token (when it asked).
async fn relay_progress(call: &HostCall, mut params: ProgressNotificationParam) {
    let Some(token) = call.progress.clone() else { return };
    params.progress_token = token;
    // A host that went away, or does not read, misses it; the call is not affected.
    let _ = tokio::time::timeout(RELAY_WAIT, call.peer.notify_progress(params)).await;
}

/// An upstream's transport, read through: its progress and log messages (and its
/// resource updates and changed lists) reach the hosts as they are read, in order,
/// before anything the upstream sends after them — above all the call's result (rmcp
/// hands notifications to its handler on tasks of their
/// own, which would let a result overtake them).
#[derive(Debug)]
pub(crate) struct Relaying<T> {
    pub(crate) inner: T,
    pub(crate) relays: Arc<Relays>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Relaying<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.inner.receive().await?;
        if let JsonRpcMessage::Notification(JsonRpcNotification { notification, .. }) = &message {
            match notification {
                ServerNotification::ProgressNotification(progress) => {
                    self.relays.progress(progress.params.clone()).await;
                }
                ServerNotification::LoggingMessageNotification(log) => {
                    self.relays.log(log.params.clone()).await;
                }
                ServerNotification::ResourceUpdatedNotification(updated) => {
                    self.relays.hosts.updated(updated.params.clone()).await;
                }
                ServerNotification::ResourceListChangedNotification(_) => {
                    self.relays.hosts.changed(Changed::Resources).await;
                }
                ServerNotification::PromptListChangedNotification(_) => {
                    self.relays.hosts.changed(Changed::Prompts).await;
                }
                ServerNotification::ToolListChangedNotification(_) => crate::log(&format!(
                    "upstream {} says its tools changed; the gateway keeps the tools it \
                     listed at start (restart it to list the new ones)",
                    self.relays.upstream
                )),
                _ => {}
            }
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// An upstream connection's client: it asks the host what the upstream asks during a
/// call (`sampling/createMessage`, `elicitation/create`, `roots/list`), and answers the
/// upstream with the host's answer, or with an error saying why the host was not asked.
#[derive(Debug)]
pub(crate) struct Asking {
    pub(crate) relays: Arc<Relays>,
}

impl Asking {
    /// Asks the host waiting on this upstream `request` (`what`, which a host that
    /// `can` answer declared): mid-call in the handshake era, through the host's call
    /// answered `input_required` on 2026-07-28 (a call passed through). The host's
    /// answer, or its error as it was.
    async fn ask<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        can: fn(&ClientCapabilities) -> bool,
        request: ServerRequest,
    ) -> Result<T, McpError> {
        // Code -1, as MCP's own example of a client declining a request: not one of the
        // codes that say a request was not run, so an upstream that passes this error on
        // as its answer leaves the call to be reconciled, not taken as never made.
        let refuse = |why: String| {
            McpError::new(
                ErrorCode(-1),
                format!(
                    "toolledger gateway: {what} from upstream {} not relayed: {why}",
                    self.relays.upstream
                ),
                None,
            )
        };
        let call = self.relays.asked().map_err(refuse)?;
        if !call.capabilities.as_ref().is_some_and(can) {
            return Err(refuse("the host did not declare that capability".to_owned()));
        }
        let answer = match (call.modern, &call.questions) {
            (false, _) => match call.peer.send_request(request).await {
                Ok(result) => serde_json::to_value(result).map_err(|err| err.to_string()),
                Err(ServiceError::McpError(error)) => return Err(error),
                Err(other) => Err(format!("the host did not answer: {other}")),
            },
            (true, Some(questions)) => {
                let (answer, answered) = tokio::sync::oneshot::channel();
                let request = serde_json::to_value(&request).unwrap_or_default();
                if questions.send(Question { request, answer }).is_err() {
                    return Err(refuse("the host's call has ended".to_owned()));
                }
                match answered.await {
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(error)) => return Err(error),
                    Err(_) => return Err(refuse("the host did not answer in time".to_owned())),
                }
            }
            (true, None) => {
                return Err(refuse(
                    "the host speaks MCP 2026-07-28, where a server sends its client no \
                     requests, and a ledgered call cannot be answered input_required while \
                     the ledger works it"
                        .to_owned(),
                ));
            }
        };
        answer
            .and_then(|value| serde_json::from_value(value).map_err(|err| err.to_string()))
            .map_err(|why| {
                McpError::internal_error(format!("the host's answer to {what}: {why}"), None)
            })
    }
}

impl ClientHandler for Asking {
    fn get_info(&self) -> ClientInfo {
        let capabilities = serde_json::from_value(serde_json::json!({
            "sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {}
        }))
        .unwrap_or_default();
        ClientInfo::new(
            capabilities,
            Implementation::new("toolledger-mcp", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, McpError> {
        let request = ServerRequest::CreateMessageRequest(Request::new(params));
        self.ask("sampling/createMessage", |can| can.sampling.is_some(), request).await
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let request = ServerRequest::ElicitRequest(Request::new(params));
        self.ask("elicitation/create", |can| can.elicitation.is_some(), request).await
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, McpError> {
        let request = ServerRequest::ListRootsRequest(RequestNoParam {
            method: Default::default(),
            extensions: Default::default(),
        });
        self.ask("roots/list", |can| can.roots.is_some(), request).await
    }
}
