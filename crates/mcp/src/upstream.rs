//! One upstream MCP server: its connection (made again when it dropped), its tools, and
//! one call classified the three ways that matter to the ledger.

use rmcp::{
    RoleClient, ServiceError, ServiceExt,
    model::{CallToolRequestParams, ErrorCode, MetaObject, RequestMetaObject},
    service::{Peer, RunningService},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess,
        streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Map, Value};
use tokio::sync::Mutex;

use crate::{
    config::{Transport, UpstreamDecl},
    upstream_http::HttpClient,
};

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
    client: Mutex<Option<RunningService<RoleClient, ()>>>,
}

impl Upstream {
    pub(crate) fn new(decl: UpstreamDecl) -> Upstream {
        Upstream { decl, client: Mutex::new(None) }
    }

    async fn connect(&self) -> Result<RunningService<RoleClient, ()>, String> {
        let name = &self.decl.name;
        let serving = match &self.decl.transport {
            Transport::Child { program, args, dir, env } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).current_dir(dir).envs(env.iter().cloned()).kill_on_drop(true);
                let transport = TokioChildProcess::new(command)
                    .map_err(|err| format!("could not start upstream {name}: {}", err.kind()))?;
                tokio::time::timeout(self.decl.timeout, ().serve(transport)).await
            }
            Transport::Http { url, bearer } => {
                let client =
                    HttpClient::new(url).map_err(|why| format!("upstream {name}'s url {why}"))?;
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.auth_header.clone_from(bearer);
                let transport = StreamableHttpClientTransport::with_client(client, config);
                tokio::time::timeout(self.decl.timeout, ().serve(transport)).await
            }
        };
        match serving {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(err)) => Err(format!("upstream {name} did not initialize: {err}")),
            Err(_) => Err(format!("upstream {name} did not initialize in time")),
        }
    }

    /// A live connection: the current one, or a new one when it dropped (also how a
    /// request the gateway does not own is passed to the upstream unchanged).
    pub(crate) async fn peer(&self) -> Result<Peer<RoleClient>, String> {
        let mut client = self.client.lock().await;
        if let Some(running) = client.as_ref() {
            if !running.is_transport_closed() {
                return Ok(running.peer().clone());
            }
        }
        if let Some(mut old) = client.take() {
            let _ = old.close().await;
        }
        let running = self.connect().await?;
        let peer = running.peer().clone();
        *client = Some(running);
        Ok(peer)
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

    /// Calls `tool` with `arguments`, `_meta` carrying `meta`; the result as JSON.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        meta: Map<String, Value>,
    ) -> Result<Value, CallError> {
        let peer = self.peer().await.map_err(CallError::NotSent)?;
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = Some(arguments);
        if !meta.is_empty() {
            params.meta = Some(RequestMetaObject(MetaObject(meta)));
        }
        let answer = tokio::time::timeout(self.decl.timeout, peer.call_tool(params)).await;
        match answer {
            Err(_) => Err(CallError::Lost(format!(
                "upstream {} did not answer within {} ms",
                self.decl.name,
                self.decl.timeout.as_millis()
            ))),
            Ok(Ok(result)) => serde_json::to_value(result)
                .map_err(|err| CallError::Lost(format!("an unreadable result: {err}"))),
            Ok(Err(err)) => Err(classify(&self.decl.name, &err)),
        }
    }

    /// Whether the upstream serves resources, and prompts, as it declared.
    pub(crate) async fn serves(&self) -> Result<(bool, bool), String> {
        let info = self.peer().await?.peer_info();
        Ok(info.map_or((false, false), |info| {
            (info.capabilities.resources.is_some(), info.capabilities.prompts.is_some())
        }))
    }

    /// Closes the connection, so the child exits (stdin closed, then signalled).
    pub(crate) async fn shutdown(&self) {
        if let Some(mut running) = self.client.lock().await.take() {
            let _ = running.close_with_timeout(std::time::Duration::from_millis(1500)).await;
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
