//! One upstream MCP server: its connection (made again when it dropped), its tools, and
//! one call classified the three ways that matter to the ledger.

use rmcp::{
    RoleClient, ServiceError, ServiceExt,
    model::{
        CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ErrorCode,
        MetaObject, PingRequest, RequestMetaObject, ServerResult, SubscribeRequestParams,
    },
    service::{Peer, PeerRequestOptions, RunningService},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use serde_json::{Map, Value};
use tokio::sync::Mutex;

use crate::{
    config::{Transport, UpstreamDecl},
    hosts::Hosts,
    relay::{Asking, HostCall, Relaying, Relays},
};

/// How long an upstream may take to start when the gateway or a relay starts, before
/// any call is waiting on it (its own timeout when that is longer): a server started
/// through `npx` or by a cold interpreter can take seconds before it answers anything,
/// and the start sends nothing a call could duplicate (`docs/mcp.md`, "Timeouts").
pub(crate) const START_BOUND: Duration = Duration::from_secs(60);

/// How long an upstream whose request timed out has to answer a `ping` before its
/// connection is dropped and made again (its child process restarted): a slow tool
/// leaves a live server that answers at once, a frozen one answers nothing.
pub(crate) const PING_BOUND: Duration = Duration::from_secs(2);

/// What an upstream serves besides tools, as it declared at initialization.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Serves {
    pub(crate) resources: bool,
    pub(crate) prompts: bool,
    pub(crate) completions: bool,
    /// `logging/setLevel` (the handshake era's logging).
    pub(crate) logging: bool,
    /// `resources/subscribe`.
    pub(crate) subscribe: bool,
    /// `notifications/resources/list_changed` and `notifications/prompts/list_changed`.
    pub(crate) resources_changed: bool,
    pub(crate) prompts_changed: bool,
}

/// How one call to an upstream went, when it produced no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The request certainly did not leave: the upstream could not be reached.
    NotSent(String),
    /// The upstream refused the request as a request (unknown tool, invalid params):
    /// it did not run it.
    Refused(String),
    /// The request left and no answer came back (a timeout, a closed stream, an
    /// internal error): the effect may have happened.
    Lost(String),
}

/// An upstream and its connection.
#[derive(Debug)]
pub(crate) struct Upstream {
    pub(crate) decl: UpstreamDecl,
    client: Mutex<Option<RunningService<RoleClient, Asking>>>,
    /// The calls in flight on it, for its progress and log messages.
    relays: Arc<Relays>,
    /// A request timed out since the connection was last known to answer: the next
    /// use pings it first.
    suspect: AtomicBool,
}

impl Upstream {
    /// Upstream `decl`, whose announcements outside any call go to `hosts`.
    pub(crate) fn new(decl: UpstreamDecl, hosts: Arc<Hosts>) -> Upstream {
        let relays = Arc::new(Relays::new(&decl.name, hosts));
        Upstream { decl, client: Mutex::new(None), relays, suspect: AtomicBool::new(false) }
    }

    /// A new connection, its start (the child spawned, `initialize` answered) bounded
    /// by `bound`.
    async fn connect(&self, bound: Duration) -> Result<RunningService<RoleClient, Asking>, String> {
        let relays = Arc::clone(&self.relays);
        let name = &self.decl.name;
        let asking = Asking { relays: Arc::clone(&relays) };
        let serving = match &self.decl.transport {
            Transport::Child { program, args, dir, env } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).current_dir(dir).envs(env.iter().cloned()).kill_on_drop(true);
                let inner = TokioChildProcess::new(command)
                    .map_err(|err| format!("could not start upstream {name}: {}", err.kind()))?;
                let transport = Relaying { inner, relays };
                tokio::time::timeout(bound, asking.serve(transport)).await
            }
            Transport::Http { url, client, bearer } => {
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.auth_header.clone_from(bearer);
                let inner = StreamableHttpClientTransport::with_client(client.clone(), config);
                let transport = Relaying { inner, relays };
                tokio::time::timeout(bound, asking.serve(transport)).await
            }
        };
        match serving {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(err)) => Err(format!("upstream {name} did not initialize: {err}")),
            Err(_) => {
                Err(format!("upstream {name} did not initialize within {} ms", bound.as_millis()))
            }
        }
    }

    /// Starts the upstream when the gateway or a relay starts, before any call: bounded
    /// by [`START_BOUND`] or the upstream's timeout, whichever is longer.
    pub(crate) async fn start(&self) -> Result<(), String> {
        self.live(self.decl.timeout.max(START_BOUND)).await.map(drop)
    }

    /// A live connection: the current one, or a new one when it dropped (also how a
    /// request the gateway does not own is passed to the upstream unchanged). A new
    /// one's start counts toward the upstream's timeout: a call may be waiting on it,
    /// under a lease measured against that timeout.
    pub(crate) async fn peer(&self) -> Result<Peer<RoleClient>, String> {
        self.live(self.decl.timeout).await
    }

    async fn live(&self, bound: Duration) -> Result<Peer<RoleClient>, String> {
        let mut client = self.client.lock().await;
        if let Some(running) = client.as_ref() {
            if !running.is_transport_closed() && self.answers(running).await {
                return Ok(running.peer().clone());
            }
        }
        if let Some(mut old) = client.take() {
            let _ = old.close().await;
        }
        self.relays.reconnected();
        let running = self.connect(bound).await?;
        let peer = running.peer().clone();
        *client = Some(running);
        // A new connection knows no subscriptions: the hosts' are made again.
        for uri in self.relays.hosts.subscriptions(&self.decl.name) {
            #[allow(
                deprecated,
                reason = "the handshake era's resources/subscribe, as the host made it"
            )]
            let subscribed = peer.subscribe(SubscribeRequestParams::new(uri));
            let _ = tokio::time::timeout(self.decl.timeout, subscribed).await;
        }
        Ok(peer)
    }

    /// Whether the connection is to be kept: yes, unless a request on it timed out and
    /// it does not answer a `ping` within [`PING_BOUND`] either (a server frozen with
    /// its process alive, which would otherwise time out every call for ever).
    async fn answers(&self, running: &RunningService<RoleClient, Asking>) -> bool {
        if !self.suspect.swap(false, Ordering::SeqCst) {
            return true;
        }
        let ping = running.peer().send_request(ClientRequest::PingRequest(PingRequest::default()));
        let answered = matches!(
            tokio::time::timeout(PING_BOUND.min(self.decl.timeout), ping).await,
            Ok(Ok(_))
        );
        if !answered {
            crate::log(&format!(
                "upstream {} timed out and does not answer a ping: restarting it",
                self.decl.name
            ));
        }
        answered
    }

    /// Every tool the upstream lists, as JSON.
    pub(crate) async fn list_tools(&self) -> Result<Vec<Value>, String> {
        let peer = self.peer().await?;
        let tools = tokio::time::timeout(self.decl.timeout, peer.list_all_tools())
            .await
            .map_err(|_| format!("upstream {} did not list its tools in time", self.decl.name))?
            .map_err(|err| {
                format!("upstream {} could not list its tools: {err}", self.decl.name)
            })?;
        tools
            .into_iter()
            .map(|tool| serde_json::to_value(tool).map_err(|err| err.to_string()))
            .collect()
    }

    /// Calls `tool` with `arguments`, `_meta` carrying `meta`, for `host` when a host
    /// is waiting on it; the result as JSON.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        meta: Map<String, Value>,
        host: Option<&HostCall>,
    ) -> Result<Value, CallError> {
        let peer = self.peer().await.map_err(CallError::NotSent)?;
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = Some(arguments);
        if !meta.is_empty() {
            params.meta = Some(RequestMetaObject(MetaObject(meta)));
        }
        match self.send(&peer, params, host).await {
            Ok(result) => serde_json::to_value(result)
                .map_err(|err| CallError::Lost(format!("an unreadable result: {err}"))),
            Err(ServiceError::Timeout { .. }) => Err(CallError::Lost(self.timed_out())),
            Err(err) => Err(classify(&self.decl.name, &err)),
        }
    }

    /// Why a request got no answer within the upstream's timeout.
    pub(crate) fn timed_out(&self) -> String {
        format!(
            "upstream {} did not answer within {} ms",
            self.decl.name,
            self.decl.timeout.as_millis()
        )
    }

    /// Sends the `tools/call` of `params` on `peer`, for `host` when a host waits on it
    /// (the upstream's progress and log messages reach it meanwhile), bounded by the
    /// upstream's timeout (past it, the upstream is told the call is cancelled).
    pub(crate) async fn send(
        &self,
        peer: &Peer<RoleClient>,
        mut params: CallToolRequestParams,
        host: Option<&HostCall>,
    ) -> Result<CallToolResult, ServiceError> {
        if let Some(host) = host {
            host.stamp(&mut params.meta.get_or_insert_with(Default::default).0.0);
        }
        let mut options = PeerRequestOptions::no_options();
        options.timeout = Some(self.decl.timeout);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = peer.send_request_with_option(request, options).await?;
        let in_flight = match host {
            Some(host) => {
                Some(self.relays.begin(host.clone(), handle.progress_token.clone()).await)
            }
            None => None,
        };
        let answer = handle.await_response().await;
        drop(in_flight);
        if matches!(answer, Err(ServiceError::Timeout { .. })) {
            self.suspect.store(true, Ordering::SeqCst);
        }
        match answer? {
            ServerResult::CallToolResult(result) => Ok(result),
            _ => Err(ServiceError::UnexpectedResponse),
        }
    }

    /// What the upstream serves besides tools, as it declared.
    pub(crate) async fn serves(&self) -> Result<Serves, String> {
        let info = self.peer().await?.peer_info();
        Ok(info.map_or_else(Serves::default, |info| {
            let capabilities = &info.capabilities;
            #[allow(deprecated, reason = "a handshake-era upstream still declares logging")]
            let logging = capabilities.logging.is_some();
            let resources = capabilities.resources.as_ref();
            Serves {
                resources: resources.is_some(),
                prompts: capabilities.prompts.is_some(),
                completions: capabilities.completions.is_some(),
                logging,
                subscribe: resources.and_then(|can| can.subscribe).unwrap_or(false),
                resources_changed: resources.and_then(|can| can.list_changed).unwrap_or(false),
                prompts_changed: capabilities
                    .prompts
                    .as_ref()
                    .and_then(|can| can.list_changed)
                    .unwrap_or(false),
            }
        }))
    }

    /// Closes the connection, so the child exits (stdin closed, then signalled).
    pub(crate) async fn shutdown(&self) {
        if let Some(mut running) = self.client.lock().await.take() {
            let _ = running.close_with_timeout(Duration::from_millis(1500)).await;
        }
    }
}

/// An error after the request was handed to the transport: only an answer that says
/// the upstream did not run the request is a refusal; everything else may have acted.
fn classify(upstream: &str, err: &ServiceError) -> CallError {
    match err {
        ServiceError::McpError(error)
            if [
                ErrorCode::PARSE_ERROR,
                ErrorCode::INVALID_REQUEST,
                ErrorCode::METHOD_NOT_FOUND,
                ErrorCode::INVALID_PARAMS,
            ]
            .contains(&error.code) =>
        {
            CallError::Refused(format!(
                "upstream {upstream} refused the request: {}",
                error.message
            ))
        }
        other => CallError::Lost(format!("upstream {upstream}: {other}")),
    }
}
