//! The ledger's downstream for MCP upstreams: a ledgered tool's effect is one
//! `tools/call` to the upstream, its status lookup the upstream's lookup tool when the
//! configuration names one (`docs/mcp.md`, "What each failure becomes").

use std::{collections::HashMap, sync::Arc};

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toolledger::{
    Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest, Lookup,
    Now,
};

use crate::{
    config::LookupDecl,
    relay::HostCall,
    tools::recorded,
    upstream::{CallError, Upstream},
};

/// The `_meta` member every forwarded ledgered call carries: the operation's request
/// ref, the scope an idempotent upstream may key on.
pub(crate) const REQUEST_REF_META: &str = "io.toolledger/request_ref";

/// Where a ledgered tool's effect is performed.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) tool: String,
    pub(crate) identity: DownstreamIdentity,
    pub(crate) key_argument: Option<String>,
    pub(crate) lookup: Option<LookupDecl>,
    /// Whether the tool declares an output schema (its `structuredContent` is recorded).
    pub(crate) structured: bool,
}

/// Every ledgered tool's route, by its ledger name.
pub(crate) type Routes = Arc<HashMap<String, Route>>;

/// The ledger's downstream over MCP upstreams: a ledgered tool's effect is one
/// `tools/call` to the upstream that serves it, and its status lookup the upstream's
/// lookup tool when the configuration names one (`docs/mcp.md`). Made by
/// [`Upstreams::downstream`](crate::Upstreams::downstream) for a relay.
#[derive(Debug)]
pub struct McpDownstream {
    identity: DownstreamIdentity,
    routes: Routes,
    runtime: tokio::runtime::Handle,
}

/// What the host of the call this thread works gave it: the call's cancellation,
/// checked right before sending, and the host waiting on it, for the upstream's
/// progress and logs. Calls run at once on their own threads, so each thread holds its
/// own call's (see [`watching`]).
#[derive(Debug, Default)]
struct Watched {
    cancelled: Option<CancellationToken>,
    host: Option<HostCall>,
}

thread_local! {
    static WATCHED: std::cell::RefCell<Watched> = std::cell::RefCell::default();
}

/// Runs `work` (one ledger call, on this thread) with the host's `cancelled` and `host`
/// watched by the downstream, and forgets them after, however `work` ends.
pub(crate) fn watching<T>(
    cancelled: CancellationToken,
    host: HostCall,
    work: impl FnOnce() -> T,
) -> T {
    struct Forget;
    impl Drop for Forget {
        fn drop(&mut self) {
            WATCHED.with(|watched| *watched.borrow_mut() = Watched::default());
        }
    }
    WATCHED.with(|watched| {
        *watched.borrow_mut() = Watched { cancelled: Some(cancelled), host: Some(host) };
    });
    let _forget = Forget;
    work()
}

/// Why an operation cancelled before it was sent ended.
pub(crate) const CANCELLED_REASON: &str =
    "the host cancelled the call before it was sent to the upstream; nothing was sent";

impl McpDownstream {
    pub(crate) fn new(
        identity: DownstreamIdentity,
        routes: Routes,
        runtime: tokio::runtime::Handle,
    ) -> McpDownstream {
        McpDownstream { identity, routes, runtime }
    }

    fn route(&self, tool: &str) -> Result<&Route, DownstreamError> {
        self.routes.get(tool).ok_or_else(|| DownstreamError::NotSent {
            reason: format!("no upstream serves the tool {tool}"),
        })
    }
}

impl Downstream for McpDownstream {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn identity_for(&self, tool: &str) -> &DownstreamIdentity {
        self.routes.get(tool).map_or(&self.identity, |route| &route.identity)
    }

    fn identities(&self) -> Vec<DownstreamIdentity> {
        let mut identities: Vec<DownstreamIdentity> =
            self.routes.values().map(|route| route.identity.clone()).collect();
        identities.sort_by(|a, b| (a.name(), a.revision()).cmp(&(b.name(), b.revision())));
        identities.dedup();
        identities
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let (cancelled, host) = WATCHED.with(|watched| {
            let watched = watched.borrow();
            (watched.cancelled.clone(), watched.host.clone())
        });
        if cancelled.as_ref().is_some_and(CancellationToken::is_cancelled) {
            return Err(DownstreamError::Refused { reason: CANCELLED_REASON.to_owned() });
        }
        let route = self.route(&request.tool_name)?.clone();
        let mut arguments = request.arguments.as_object().cloned().unwrap_or_default();
        if let Some(argument) = &route.key_argument {
            arguments.insert(argument.clone(), json!(request.downstream_request_ref.as_str()));
        }
        let mut meta = traced(Map::new());
        meta.insert(REQUEST_REF_META.to_owned(), json!(request.downstream_request_ref.as_str()));
        let answer =
            self.runtime.block_on(route.upstream.call(&route.tool, arguments, meta, host.as_ref()));
        match answer {
            Ok(result) if result.get("isError") == Some(&Value::Bool(true)) => {
                Err(DownstreamError::Refused { reason: error_text(&result) })
            }
            Ok(result) => Ok(request.receipt(recorded(&result, route.structured))),
            Err(CallError::NotSent(reason)) => Err(DownstreamError::NotSent { reason }),
            Err(CallError::Refused(reason)) => Err(DownstreamError::Refused { reason }),
            Err(CallError::Lost(reason)) => Err(DownstreamError::Unknown { reason }),
        }
    }

    /// Only a tool with a lookup tool configured: any other's success is synced.
    fn can_look_up(&self, tool: &str) -> bool {
        self.routes.get(tool).is_some_and(|route| route.lookup.is_some())
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        let route = self.route(&request.tool_name)?.clone();
        let Some(lookup) = &route.lookup else {
            return Err(DownstreamError::Unknown {
                reason: format!(
                    "the upstream tool {} has no lookup tool configured: nothing can tell whether it acted",
                    route.tool
                ),
            });
        };
        let mut arguments = Map::new();
        arguments
            .insert(lookup.key_argument.clone(), json!(request.downstream_request_ref.as_str()));
        let answer = self.runtime.block_on(route.upstream.call(
            &lookup.tool,
            arguments,
            traced(Map::new()),
            None,
        ));
        let result = match answer {
            Ok(result) if result.get("isError") != Some(&Value::Bool(true)) => result,
            Ok(result) => return Err(DownstreamError::Unknown { reason: error_text(&result) }),
            Err(
                CallError::NotSent(reason) | CallError::Refused(reason) | CallError::Lost(reason),
            ) => {
                return Err(DownstreamError::Unknown { reason });
            }
        };
        let structured = result.get("structuredContent").cloned().unwrap_or(Value::Null);
        match structured.pointer(&lookup.found) {
            Some(Value::Bool(false)) => Ok(Lookup::NotFound),
            Some(Value::Bool(true)) => {
                let found = structured.pointer(&lookup.result).cloned().unwrap_or(Value::Null);
                let text = toolledger_json::canonicalize(&found);
                let output = if route.structured {
                    json!({"content": [{"type": "text", "text": text}], "structuredContent": found})
                } else {
                    json!({"content": [{"type": "text", "text": text}]})
                };
                Ok(Lookup::Done(request.receipt(output)))
            }
            _ => Err(DownstreamError::Unknown {
                reason: format!(
                    "the lookup tool {} answered without a boolean at {}",
                    lookup.tool, lookup.found
                ),
            }),
        }
    }
}

/// `meta` with the W3C trace context of the span current on this thread, under the
/// names MCP reserves for it (`traceparent`, and `tracestate` when it holds any): the
/// ledger's `execute` or `lookup` span, so the upstream's own span of the call is its
/// child (`docs/observability.md`). Nothing outside a trace.
fn traced(mut meta: Map<String, Value>) -> Map<String, Value> {
    if let Some(context) = toolledger::TraceContext::current() {
        meta.insert("traceparent".to_owned(), json!(context.traceparent()));
        if !context.tracestate().is_empty() {
            meta.insert("tracestate".to_owned(), json!(context.tracestate()));
        }
    }
    meta
}

/// The text of an error result, bounded (the ledger keeps at most 512 bytes).
fn error_text(result: &Value) -> String {
    let text: String = result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|block| block.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    let text =
        if text.is_empty() { "the upstream tool reported an error".to_owned() } else { text };
    let mut end = text.len().min(400);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default().to_owned()
}
