//! The ledger's spans (feature `otel`), read back with the OpenTelemetry SDK's own
//! in-memory exporter: the host's span is the parent of the call's, what the ledger did
//! are the call's children, a replay has none, and no span carries the key, a digest,
//! an argument or a result.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::{
    Context, KeyValue,
    trace::{SpanKind, Status, TraceContextExt, TraceId, Tracer, TracerProvider as _},
};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    trace::{InMemorySpanExporter, SdkTracerProvider, SpanData},
};
use serde_json::json;
use toolledger::{
    Call, Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest,
    Ledger, Lookup, ModelCall, NoRoles, Now, Outcome, ToolDefinition,
};

use crate::TempDir;

/// The argument and result values the tests send: none may be in any span.
const SECRET_AMOUNT: u64 = 987_654_321;
const SECRET_RESULT: &str = "pay-result-5f3a9c";
const SECRET_KEY: &str = "key-7d1e0b42";

/// The process's provider, installed once for every test of this module: each test
/// reads back only the spans of its own trace.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        opentelemetry::global::set_tracer_provider(provider);
        exporter
    })
}

/// Runs `work` under a span of the host's own (`agent turn`), and returns the finished
/// spans of that trace, the host's first.
fn traced(work: impl FnOnce()) -> Vec<SpanData> {
    let exporter = exporter();
    let tracer = opentelemetry::global::tracer_provider().tracer("host");
    let host = tracer.start("agent turn");
    let context = Context::current_with_span(host);
    let trace_id = context.span().span_context().trace_id();
    {
        let _attached = context.clone().attach();
        work();
    }
    context.span().end();
    of_trace(exporter, trace_id)
}

fn of_trace(exporter: &InMemorySpanExporter, trace_id: TraceId) -> Vec<SpanData> {
    let mut spans: Vec<_> = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|span| span.span_context.trace_id() == trace_id)
        .collect();
    spans.sort_by_key(|span| (span.name != "agent turn", span.start_time));
    spans
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a opentelemetry::Value> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> String {
    attribute(span, key).map(|value| value.as_str().into_owned()).unwrap_or_default()
}

/// Every attribute value of every span, and every span name, as text.
fn everything(spans: &[SpanData]) -> String {
    let mut all = String::new();
    for span in spans {
        all.push_str(&span.name);
        for KeyValue { key, value, .. } in &span.attributes {
            all.push_str(&format!(" {key}={value}"));
        }
        all.push('\n');
    }
    all
}

/// A payment service that keeps what it performed, and, once told to, loses its
/// answers after performing (as a timeout after sending does).
struct Pays {
    identity: DownstreamIdentity,
    performed: Mutex<HashMap<String, DownstreamReceipt>>,
    loses_answers: AtomicBool,
}

impl Downstream for Pays {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let receipt = request.receipt(json!({"payment_id": SECRET_RESULT}));
        let key = request.downstream_request_ref.as_str().to_owned();
        self.performed.lock().unwrap().insert(key, receipt.clone());
        if self.loses_answers.load(Ordering::SeqCst) {
            return Err(DownstreamError::Unknown { reason: "the answer was lost".to_owned() });
        }
        Ok(receipt)
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        let performed = self.performed.lock().unwrap();
        Ok(match performed.get(request.downstream_request_ref.as_str()) {
            Some(receipt) => Lookup::Done(receipt.clone()),
            None => Lookup::NotFound,
        })
    }
}

/// A payment service that has performed nothing yet.
fn pays() -> Pays {
    Pays {
        identity: DownstreamIdentity::new("payments", "1").unwrap(),
        performed: Mutex::default(),
        loses_answers: AtomicBool::new(false),
    }
}

fn ledger(dir: &TempDir) -> Ledger<Pays, NoRoles> {
    ledger_at(dir, "ledger.sqlite3")
}

fn paying(amount: u64, call_id: &str) -> Call {
    paying_with(SECRET_KEY, amount, call_id)
}

/// A payment of `amount` under `key`, from the model's call `call_id`.
fn paying_with(key: &str, amount: u64, call_id: &str) -> Call {
    Call::new("pay", json!({"amount_minor": amount}))
        .principal("acme", "user-1")
        .idempotency_key(key)
        .model_call(ModelCall::new(
            "openai",
            "responses",
            "openai-responses-2026-05",
            "resp-1",
            call_id,
        ))
}

/// The host's span, the call's span under it, and the call's children.
fn tree(spans: &[SpanData]) -> (&SpanData, &SpanData, Vec<&SpanData>) {
    let host = &spans[0];
    assert_eq!(host.name, "agent turn");
    let calls: Vec<_> =
        spans.iter().filter(|span| span.name.starts_with("execute_tool ")).collect();
    assert_eq!(calls.len(), 1, "one call span: {spans:#?}");
    let call = calls[0];
    assert_eq!(call.parent_span_id, host.span_context.span_id(), "the host's span is the parent");
    let children =
        spans.iter().filter(|span| span.parent_span_id == call.span_context.span_id()).collect();
    (host, call, children)
}

/// `call`'s steps (its children), in the order they started.
fn steps(spans: &[SpanData], call: &SpanData) -> Vec<String> {
    spans
        .iter()
        .filter(|span| span.parent_span_id == call.span_context.span_id())
        .map(|span| span.name.to_string())
        .collect()
}

#[test]
fn a_fresh_call_is_one_span_under_the_hosts_with_what_the_ledger_did_beneath() {
    let dir = TempDir::new("traces-fresh");
    let ledger = ledger(&dir);
    let mut reply = None;
    let spans = traced(|| reply = Some(ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap()));
    assert!(matches!(reply.unwrap().outcome(), Outcome::Fresh(_)));
    let (_, call, children) = tree(&spans);
    assert_eq!(call.span_kind, SpanKind::Internal);
    assert_eq!(text(call, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(text(call, "gen_ai.tool.name"), "pay");
    assert_eq!(text(call, "gen_ai.tool.type"), "function");
    assert_eq!(text(call, "gen_ai.tool.call.id"), "call-1", "the model's call id");
    assert_eq!(text(call, "toolledger.decision"), "fresh");
    assert_eq!(text(call, "toolledger.store"), "sqlite");
    assert!(attribute(call, "error.type").is_none());
    assert_eq!(call.status, Status::Unset);
    let steps: Vec<_> =
        children.iter().map(|span| (span.name.as_ref(), span.span_kind.clone())).collect();
    assert_eq!(
        steps,
        [
            ("commit A", SpanKind::Internal),
            ("execute", SpanKind::Client),
            ("commit C", SpanKind::Internal)
        ]
    );
    assert_eq!(text(children[2], "toolledger.durability"), "lazy", "the downstream can look up");
    assert_eq!(spans.len(), 5, "the host's, the call's and three steps: {spans:#?}");
    assert_eq!(attribute(call, "toolledger.attempt"), Some(&opentelemetry::Value::I64(1)));
}

#[test]
fn a_replay_is_the_call_span_alone_and_a_conflict_says_its_code() {
    let dir = TempDir::new("traces-replay");
    let ledger = ledger(&dir);
    ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap();
    let spans = traced(|| {
        let again = ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap();
        assert!(matches!(again.outcome(), Outcome::Replayed(_)));
    });
    let (_, call, children) = tree(&spans);
    assert_eq!(text(call, "toolledger.decision"), "replay");
    assert!(children.is_empty(), "a replay is no new effect: {children:#?}");
    assert!(attribute(call, "toolledger.attempt").is_none(), "a replay makes no attempt");

    // The same key with another amount: a conflict, an error of its code.
    let spans = traced(|| {
        let other = ledger.dispatch(&paying(SECRET_AMOUNT + 1, "call-2")).unwrap();
        assert!(matches!(other.outcome(), Outcome::Blocked { .. }));
    });
    let (_, call, children) = tree(&spans);
    assert_eq!(text(call, "toolledger.decision"), "conflict");
    assert_eq!(text(call, "error.type"), "IDEMPOTENCY_CONFLICT");
    assert!(matches!(call.status, Status::Error { .. }));
    assert!(children.is_empty());
}

#[test]
fn an_awaited_call_is_traced_under_the_context_it_was_called_in() {
    let dir = TempDir::new("traces-async");
    let ledger = ledger(&dir);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let spans = traced(|| {
        // The future is made where the host's span is current, and awaited elsewhere.
        let fresh = ledger.dispatch_async(&paying(SECRET_AMOUNT, "call-1"));
        let reply = std::thread::scope(|scope| {
            scope.spawn(|| runtime.block_on(fresh)).join().unwrap().unwrap()
        });
        assert!(matches!(reply.outcome(), Outcome::Fresh(_)));
    });
    let (_, call, children) = tree(&spans);
    assert_eq!(text(call, "toolledger.decision"), "fresh");
    let names: Vec<_> = children.iter().map(|span| span.name.as_ref()).collect();
    assert_eq!(names, ["commit A", "execute", "commit C"]);

    let spans = traced(|| {
        let again = runtime.block_on(ledger.dispatch_async(&paying(SECRET_AMOUNT, "call-1")));
        assert!(matches!(again.unwrap().outcome(), Outcome::Replayed(_)));
    });
    let (_, call, children) = tree(&spans);
    assert_eq!(text(call, "toolledger.decision"), "replay");
    assert!(children.is_empty());
}

#[test]
fn no_span_holds_the_key_a_digest_an_argument_or_a_result() {
    let dir = TempDir::new("traces-never");
    let ledger = ledger(&dir);
    let mut replies = Vec::new();
    let spans = traced(|| {
        replies.push(ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap());
        replies.push(ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap());
        replies.push(ledger.dispatch(&paying(SECRET_AMOUNT + 1, "call-2")).unwrap());
    });
    assert_eq!(spans.len(), 1 + 5 + 1, "{spans:#?}");
    let all = everything(&spans);
    let package = replies[0].package();
    let mut never = vec![
        SECRET_KEY.to_owned(),
        SECRET_AMOUNT.to_string(),
        SECRET_RESULT.to_owned(),
        "acme".to_owned(),
        "user-1".to_owned(),
    ];
    // Every digest and ref the ledger answered: each is derived from the key or the
    // request.
    let result = &package["result"];
    for value in [
        &result["digests"]["call_binding_sha256"],
        &result["digests"]["request_sha256"],
        &result["digests"]["result_sha256"],
        &result["host_view"]["downstream_receipt_ref"],
        &result["host_view"]["downstream_request_ref"],
        &result["host_view"]["status_ref"],
    ] {
        never.push(value.as_str().unwrap_or_else(|| panic!("{package}")).to_owned());
    }
    for secret in never {
        assert!(!all.contains(&secret), "{secret} is in a span:\n{all}");
    }
}

#[test]
fn a_queued_call_and_its_worker_are_each_a_span_of_their_purpose() {
    let dir = TempDir::new("traces-queued");
    let ledger = ledger(&dir);
    let call = paying(SECRET_AMOUNT, "call-1");
    let mut accepted = None;
    let spans = traced(|| accepted = Some(ledger.enqueue(&call).unwrap()));
    let accepted = accepted.unwrap();
    let (_, span, _) = tree(&spans);
    assert_eq!(text(span, "toolledger.purpose"), "enqueue");
    assert_eq!(text(span, "toolledger.decision"), "accepted");
    assert_eq!(steps(&spans, span), ["commit A"]);

    let status_ref = accepted.status_ref().unwrap().clone();
    let spans = traced(|| {
        let worked = ledger.process(&status_ref, &call).unwrap();
        assert!(matches!(worked.outcome(), Outcome::Fresh(_)));
    });
    let (_, span, _) = tree(&spans);
    assert_eq!(text(span, "toolledger.purpose"), "process");
    assert_eq!(text(span, "toolledger.decision"), "fresh");
    assert_eq!(steps(&spans, span), ["claim", "execute", "commit C"]);
    assert_eq!(attribute(span, "toolledger.attempt"), Some(&opentelemetry::Value::I64(1)));
}

#[test]
fn a_lost_answer_is_unknown_and_the_status_query_that_settles_it_looks_it_up() {
    let dir = TempDir::new("traces-unknown");
    let ledger = ledger(&dir);
    ledger.downstream().loses_answers.store(true, Ordering::SeqCst);
    let call = paying(SECRET_AMOUNT, "call-1");
    let mut unknown = None;
    let spans = traced(|| unknown = Some(ledger.dispatch(&call).unwrap()));
    let unknown = unknown.unwrap();
    let Outcome::Unknown { status_ref } = unknown.outcome() else { panic!("{unknown:?}") };
    let (_, span, _) = tree(&spans);
    assert_eq!(text(span, "toolledger.decision"), "outcome_unknown");
    assert_eq!(text(span, "error.type"), "OUTCOME_UNKNOWN");
    assert!(matches!(span.status, Status::Error { .. }));
    // Nothing is written after the lost answer: the operation stays under its lease.
    assert_eq!(steps(&spans, span), ["commit A", "execute"]);
    let execute = spans.iter().find(|span| span.name == "execute").unwrap();
    assert_eq!(execute.span_kind, SpanKind::Client);

    let asking = paying(SECRET_AMOUNT, "call-2");
    let spans = traced(|| {
        let settled = ledger.status(&asking, status_ref).unwrap();
        assert!(matches!(settled.outcome(), Outcome::Reconciled(_)), "{settled:?}");
    });
    let (_, span, _) = tree(&spans);
    assert_eq!(text(span, "toolledger.purpose"), "query_status");
    assert_eq!(text(span, "toolledger.decision"), "reconciled");
    assert_eq!(text(span, "gen_ai.tool.call.id"), "call-2");
    // Asked, not performed again: no `execute`.
    assert_eq!(steps(&spans, span), ["lookup", "commit C"]);
    let lookup = spans.iter().find(|span| span.name == "lookup").unwrap();
    assert_eq!(lookup.span_kind, SpanKind::Client);
}

#[test]
fn a_loaded_call_is_traced_as_the_call_it_describes() {
    let dir = TempDir::new("traces-loaded");
    let ledger = toolledger::Ledger::builder(dir.join("ledger.sqlite3"))
        .tool(toolledger::RefundOrder::default().tool())
        .open_simulated(NoRoles)
        .unwrap();
    let bytes = std::fs::read(crate::workspace("fixtures/persistence-case.json")).unwrap();
    let registry = toolledger::Registry::new(
        vec![toolledger::RefundOrder::default().tool()],
        toolledger::builtin_profiles(),
    );
    let case = toolledger::load_case(&bytes, &registry, None).unwrap();
    let spans = traced(|| {
        let reply = ledger.dispatch_loaded(&case).unwrap();
        assert!(matches!(reply.outcome(), Outcome::Fresh(_)));
    });
    let (_, call, _) = tree(&spans);
    assert_eq!(call.name, "execute_tool refund_order");
    assert_eq!(text(call, "gen_ai.tool.call.id"), case.host.provider_call_id.as_str());
    assert_eq!(text(call, "toolledger.decision"), "fresh");
    assert_eq!(steps(&spans, call), ["commit A", "execute", "commit C"]);
}

/// An HTTP service that answers each request with the next of `answers` (a status and a
/// body) and keeps each request's head, lowercased header names and all: what the
/// ledger sent. One request per connection (the HTTP downstream closes each).
struct Service {
    base: String,
    heads: Arc<Mutex<Vec<HashMap<String, String>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Service {
    fn start(answers: Vec<(u16, &'static str)>) -> Service {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let heads = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&heads);
        let thread = std::thread::spawn(move || {
            for (status, body) in answers {
                let (mut stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut head = HashMap::new();
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                head.insert(":request".to_owned(), line.trim_end().to_owned());
                loop {
                    line.clear();
                    reader.read_line(&mut line).unwrap();
                    let Some((name, value)) = line.trim_end().split_once(':') else { break };
                    head.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
                }
                let length = head.get("content-length").map_or(0, |value| value.parse().unwrap());
                std::io::copy(&mut reader.by_ref().take(length), &mut std::io::sink()).unwrap();
                kept.lock().unwrap().push(head);
                let answer = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).unwrap();
            }
        });
        Service { base, heads, thread: Some(thread) }
    }

    /// The HTTP downstream of `pay` on this service (`POST /payments`, `GET
    /// /payments/by-key/<key>`).
    fn downstream(&self) -> toolledger::http::HttpDownstream {
        let endpoint = toolledger::http::Endpoint {
            execute_url: format!("{}/payments", self.base),
            lookup_url: format!("{}/payments/by-key/", self.base),
            headers: Vec::new(),
            identity: None,
            timeouts: None,
        };
        let identity = DownstreamIdentity::new("payments", "1").unwrap();
        toolledger::http::HttpDownstream::new(identity, toolledger::http::Timeouts::default())
            .endpoint("pay", endpoint)
    }

    /// The heads of the requests, once all were answered.
    fn heads(mut self) -> Vec<HashMap<String, String>> {
        self.thread.take().unwrap().join().unwrap();
        std::mem::take(&mut *self.heads.lock().unwrap())
    }
}

/// The span context a request's head carries, as the OpenTelemetry SDK's own W3C
/// propagator reads it on the service's side.
fn carried(head: &HashMap<String, String>) -> opentelemetry::trace::SpanContext {
    let context = TraceContextPropagator::new().extract(head);
    context.span().span_context().clone()
}

#[test]
fn the_services_requests_carry_the_context_of_the_ledgers_client_span() {
    let dir = TempDir::new("traces-http");
    // The payment is made but its answer is a gateway's timeout; the lookup finds none.
    let service = Service::start(vec![(504, "{}"), (404, "{}")]);
    let ledger = Ledger::builder(dir.join("ledger.sqlite3"))
        .tool(crate::many::pay())
        .open(service.downstream(), NoRoles)
        .unwrap();
    let mut unknown = None;
    let dispatched =
        traced(|| unknown = Some(ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap()));
    let unknown = unknown.unwrap();
    let Outcome::Unknown { status_ref } = unknown.outcome() else { panic!("{unknown:?}") };
    let asked = traced(|| {
        ledger.status(&paying(SECRET_AMOUNT, "call-2"), status_ref).unwrap();
    });
    let heads = service.heads();
    assert_eq!(heads.len(), 2);
    for (head, spans, step) in [(&heads[0], &dispatched, "execute"), (&heads[1], &asked, "lookup")]
    {
        let client = spans.iter().find(|span| span.name == step).unwrap();
        let remote = carried(head);
        assert!(remote.is_valid() && remote.is_remote(), "{head:?}");
        assert_eq!(remote.trace_id(), client.span_context.trace_id(), "{head:?}");
        assert_eq!(
            remote.span_id(),
            client.span_context.span_id(),
            "the {step} span is the parent"
        );
        assert!(remote.is_sampled());
        assert!(!head.contains_key("tracestate"), "the host's context has no state: {head:?}");
    }
    assert!(heads[0][":request"].starts_with("POST /payments "), "{heads:?}");
    assert!(heads[1][":request"].starts_with("GET /payments/by-key/dr_"), "{heads:?}");
}

#[test]
fn a_precondition_asked_over_http_carries_the_context_of_the_call() {
    let dir = TempDir::new("traces-precondition");
    // Asked at acceptance and again right before the effect, then the payment.
    let allow = r#"{"allow": true}"#;
    let paid = r#"{"output": {"payment_id": "pay-1"}}"#;
    let service = Service::start(vec![(200, allow), (200, allow), (200, paid)]);
    let definition = ToolDefinition::from_document(
        "pay.json",
        &json!({
            "name": "pay",
            "description": "Pay, once per idempotency key, when the service allows it.",
            "input_schema": {"type": "object", "required": ["amount_minor"],
                "properties": {"amount_minor": {"type": "integer", "minimum": 1}}},
            "output_schema": {"type": "object", "required": ["payment_id"]},
            "precondition": "/allowed/{amount_minor}",
        }),
    )
    .unwrap();
    let timeouts = toolledger::http::Timeouts::default();
    let asks = toolledger::http::HttpPrecondition::new(
        &format!("{}/allowed/{{amount_minor}}", service.base),
        Vec::new(),
        timeouts,
    );
    let tool = definition.tool_with(None, Some(Arc::new(asks)));
    let ledger = Ledger::builder(dir.join("ledger.sqlite3"))
        .tool(tool)
        .open(service.downstream(), NoRoles)
        .unwrap();
    let spans = traced(|| {
        let reply = ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap();
        assert!(matches!(reply.outcome(), Outcome::Fresh(_)), "{reply:?}");
    });
    let (_, call, _) = tree(&spans);
    let execute = spans.iter().find(|span| span.name == "execute").unwrap();
    let heads = service.heads();
    let parents: Vec<_> = heads
        .iter()
        .map(|head| (head[":request"].split(' ').next().unwrap().to_owned(), carried(head)))
        .collect();
    for (method, remote) in &parents {
        assert!(remote.is_valid(), "{method}: {heads:?}");
        assert_eq!(remote.trace_id(), call.span_context.trace_id());
    }
    // The precondition is the call's own question; the payment is the `execute` step's.
    let call_id = call.span_context.span_id();
    let execute_id = execute.span_context.span_id();
    let ids: Vec<_> =
        parents.iter().map(|(method, remote)| (method.as_str(), remote.span_id())).collect();
    assert_eq!(ids, [("GET", call_id), ("GET", call_id), ("POST", execute_id)]);
}

/// The spans of `trace_id`, in the order they started.
fn of_remote(trace_id: TraceId) -> Vec<SpanData> {
    of_trace(exporter(), trace_id)
}

#[test]
fn a_context_handed_over_on_the_call_is_its_spans_parent_and_a_malformed_one_is_ignored() {
    let dir = TempDir::new("traces-handed");
    let ledger = ledger(&dir);
    // A host that received the trace from elsewhere (an HTTP header, MCP `_meta`), with
    // no span of its own current on this thread.
    let handed = toolledger::TraceContext::parse(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "vendor=v1",
    )
    .unwrap();
    exporter();
    let reply = ledger.dispatch(&paying(SECRET_AMOUNT, "call-1").trace_parent(handed)).unwrap();
    assert!(matches!(reply.outcome(), Outcome::Fresh(_)));
    let spans = of_remote(TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap());
    let call = spans.iter().find(|span| span.name == "execute_tool pay").unwrap();
    assert_eq!(
        call.parent_span_id.to_string(),
        "b7ad6b7169203331",
        "the remote span is the parent"
    );
    assert_eq!(call.span_context.trace_state().get("vendor"), Some("v1"));
    assert_eq!(steps(&spans, call), ["commit A", "execute", "commit C"]);

    // Not W3C's format: the call's span is under the thread's current context instead.
    assert_eq!(toolledger::TraceContext::parse("00-0af7-b7ad-01", ""), None);
    for malformed in [
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
    ] {
        assert_eq!(toolledger::TraceContext::parse(malformed, ""), None, "{malformed}");
    }
    // A later version may add fields; its first four are read as version 00's.
    let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra";
    let later = toolledger::TraceContext::parse(later, "").unwrap();
    assert_eq!(later.traceparent(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
}

#[test]
fn a_hosts_own_tool_span_is_enriched_instead_of_a_second_one_made() {
    let dir = TempDir::new("traces-host-span");
    let ledger = ledger(&dir);
    let spans = traced(|| {
        let reply = ledger.dispatch(&paying(SECRET_AMOUNT, "call-1").in_host_span()).unwrap();
        assert!(matches!(reply.outcome(), Outcome::Fresh(_)));
    });
    let host = &spans[0];
    assert!(
        !spans.iter().any(|span| span.name.starts_with("execute_tool")),
        "no span of the ledger's own for the call: {spans:#?}"
    );
    assert_eq!(text(host, "gen_ai.tool.name"), "pay");
    assert_eq!(text(host, "gen_ai.tool.call.id"), "call-1");
    assert_eq!(text(host, "toolledger.decision"), "fresh");
    assert_eq!(steps(&spans, host), ["commit A", "execute", "commit C"]);
}

#[test]
fn a_model_call_made_from_the_key_is_never_the_spans_call_id() {
    let dir = TempDir::new("traces-keyed");
    let ledger = ledger(&dir);
    let profile =
        toolledger::ProviderProfile::new("openai", "responses", "openai-responses-2026-05");
    let keyed = ModelCall::keyed(profile, "py", "acme", "user-1", "pay", SECRET_KEY);
    let call = paying(SECRET_AMOUNT, "call-1").model_call(keyed);
    let spans = traced(|| assert!(ledger.dispatch(&call).unwrap().outcome().is_done()));
    let (_, span, _) = tree(&spans);
    assert!(attribute(span, "gen_ai.tool.call.id").is_none(), "{span:#?}");
}

#[test]
fn a_status_query_by_ref_alone_is_a_span_that_looks_the_operation_up() {
    let dir = TempDir::new("traces-status-of");
    let ledger = ledger(&dir);
    ledger.downstream().loses_answers.store(true, Ordering::SeqCst);
    let unknown = ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap();
    let Outcome::Unknown { status_ref } = unknown.outcome() else { panic!("{unknown:?}") };
    let query = toolledger::StatusQuery::new("acme", "user-1").model_call(ModelCall::new(
        "openai",
        "responses",
        "openai-responses-2026-05",
        "resp-9",
        "status-9",
    ));
    let spans = traced(|| {
        let settled = ledger.status_of(&query, status_ref).unwrap();
        assert!(matches!(settled.outcome(), Outcome::Reconciled(_)), "{settled:?}");
    });
    let (_, span, _) = tree_named(&spans, "execute_tool");
    assert_eq!(text(span, "toolledger.purpose"), "query_status");
    assert_eq!(text(span, "toolledger.decision"), "reconciled");
    assert!(attribute(span, "gen_ai.tool.name").is_none(), "unknown before the ledger reads it");
    assert!(attribute(span, "gen_ai.tool.call.id").is_none(), "the query's is not the tool call's");
    assert_eq!(steps(&spans, span), ["lookup", "commit C"]);
}

/// [`tree`], for a call span named exactly `name`.
fn tree_named<'a>(
    spans: &'a [SpanData],
    name: &str,
) -> (&'a SpanData, &'a SpanData, Vec<&'a SpanData>) {
    let host = &spans[0];
    let call = spans.iter().find(|span| span.name == name).unwrap();
    assert_eq!(call.parent_span_id, host.span_context.span_id());
    let children =
        spans.iter().filter(|span| span.parent_span_id == call.span_context.span_id()).collect();
    (host, call, children)
}

/// The (trace, span) each of `span`'s links leads to, with its `toolledger.link`.
fn links(span: &SpanData) -> Vec<(String, String, String)> {
    span.links
        .links
        .iter()
        .map(|link| {
            let kind = link
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == "toolledger.link")
                .map(|kv| kv.value.as_str().into_owned())
                .unwrap_or_default();
            let context = &link.span_context;
            (context.trace_id().to_string(), context.span_id().to_string(), kind)
        })
        .collect()
}

/// Where a link to `span` leads.
fn link_to(span: &SpanData) -> (String, String, String) {
    let context = &span.span_context;
    (context.trace_id().to_string(), context.span_id().to_string(), "caller".to_owned())
}

#[test]
fn a_worker_and_a_later_status_query_link_back_to_the_call_that_asked() {
    let dir = TempDir::new("traces-linked");
    let ledger = ledger(&dir);
    let call = paying(SECRET_AMOUNT, "call-1");
    let mut accepted = None;
    let asked = traced(|| accepted = Some(ledger.enqueue(&call).unwrap()));
    let (_, asking, _) = tree(&asked);
    let status_ref = accepted.unwrap().status_ref().unwrap().clone();

    // The worker, in a trace of its own: its call span links to the caller's.
    let worked =
        traced(|| assert!(ledger.process(&status_ref, &call).unwrap().outcome().is_done()));
    let (_, working, _) = tree(&worked);
    assert_ne!(working.span_context.trace_id(), asking.span_context.trace_id());
    assert_eq!(links(working), [link_to(asking)]);

    // A status query by ref alone, later, in another trace: linked the same way.
    let query = toolledger::StatusQuery::new("acme", "user-1").model_call(ModelCall::new(
        "openai",
        "responses",
        "openai-responses-2026-05",
        "resp-9",
        "status-9",
    ));
    let queried =
        traced(|| assert!(ledger.status_of(&query, &status_ref).unwrap().outcome().is_done()));
    let (_, querying, _) = tree_named(&queried, "execute_tool");
    assert_eq!(links(querying), [link_to(asking)]);
}

/// Commit A keeps the call span's own context (the one a later attempt links to). A call
/// with no provider and no parent keeps none: the command line's
/// `traces::a_command_outside_any_trace_keeps_no_context_and_one_in_its_callers_keeps_that`
/// checks it, in processes with no provider (this one has the SDK's installed).
#[test]
fn a_call_in_a_trace_keeps_its_own_spans_context_beside_the_intent() {
    let dir = TempDir::new("traces-stored");
    let ledger = ledger(&dir);
    let stored = || {
        let db = rusqlite::Connection::open(dir.join("ledger.sqlite3")).unwrap();
        db.query_row("SELECT count(*), max(traceparent) FROM trace_contexts", [], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Option<String>>(1)?))
        })
        .unwrap()
    };
    let spans = traced(|| {
        assert!(ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap().outcome().is_done())
    });
    let (_, call, _) = tree(&spans);
    let own = format!("00-{}-{}-01", call.span_context.trace_id(), call.span_context.span_id());
    assert_eq!(stored(), (1, Some(own)), "the call's own span, to link back to");
    // A replay writes nothing, so keeps nothing more.
    traced(|| {
        assert!(ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap().outcome().is_done())
    });
    assert_eq!(stored().0, 1);
}

#[test]
fn a_relay_pass_is_a_trace_of_its_own_linked_to_each_caller_and_an_idle_one_makes_none() {
    let dir = TempDir::new("traces-relay");
    let ledger = ledger(&dir);
    let mut callers = Vec::new();
    for (key, call_id) in [("key-r1", "call-r1"), ("key-r2", "call-r2")] {
        let call = paying_with(key, 5, call_id);
        let spans = traced(|| assert!(ledger.enqueue(&call).unwrap().status_ref().is_some()));
        callers.push(tree(&spans).1.clone());
    }
    let relay = || {
        toolledger::Relay::new(dir.join("ledger.sqlite3")).tool(crate::many::pay()).run(
            || Ok(pays()),
            || NoRoles,
            &serde_json::Value::Null,
            toolledger::Until::Drained,
            &|_| {},
        )
    };
    assert_eq!(relay().unwrap().delivered, 2);
    let finished = exporter().get_finished_spans().unwrap();
    let passes: Vec<&SpanData> = finished
        .iter()
        .filter(|span| span.name == "relay pass")
        .filter(|span| links(span).contains(&link_to(&callers[0])))
        .collect();
    assert_eq!(passes.len(), 1, "{passes:#?}");
    let pass = passes[0];
    assert_eq!(pass.span_kind, SpanKind::Consumer);
    assert_eq!(pass.parent_span_id, opentelemetry::trace::SpanId::INVALID, "a trace of its own");
    let mut linked = links(pass);
    linked.sort();
    let mut expected: Vec<_> = callers.iter().map(link_to).collect();
    expected.sort();
    assert_eq!(linked, expected);
    assert_eq!(attribute(pass, "toolledger.claimed"), Some(&opentelemetry::Value::I64(2)));
    let steps: Vec<String> = finished
        .iter()
        .filter(|span| span.parent_span_id == pass.span_context.span_id())
        .map(|span| span.name.to_string())
        .collect();
    assert_eq!(steps, ["claim", "execute", "commit C"]);

    // Nothing due: no pass span.
    let before = finished.iter().filter(|span| span.name == "relay pass").count();
    assert_eq!(relay().unwrap().claimed, 0);
    let after =
        exporter().get_finished_spans().unwrap().iter().filter(|s| s.name == "relay pass").count();
    assert_eq!(before, after, "an idle pass makes no span");
}

#[test]
fn the_arguments_result_and_principal_are_recorded_only_when_the_operator_opts_in() {
    let dir = TempDir::new("traces-capture");
    let capture = toolledger::Capture { content: true, principal: true };
    let ledger = Ledger::builder(dir.join("ledger.sqlite3"))
        .tool(crate::many::pay())
        .capture_in_spans(capture)
        .open(pays(), NoRoles)
        .unwrap();
    let spans = traced(|| {
        assert!(ledger.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap().outcome().is_done());
    });
    let (_, call, _) = tree(&spans);
    assert_eq!(
        text(call, "gen_ai.tool.call.arguments"),
        format!("{{\"amount_minor\":{SECRET_AMOUNT}}}")
    );
    assert_eq!(
        text(call, "gen_ai.tool.call.result"),
        format!("{{\"payment_id\":\"{SECRET_RESULT}\"}}")
    );
    assert_eq!(
        (text(call, "toolledger.tenant"), text(call, "toolledger.subject")),
        ("acme".to_owned(), "user-1".to_owned())
    );
    // The key is never recorded, opted in or not.
    assert!(!everything(&spans).contains(SECRET_KEY));
    // By default (the environment says nothing here): none of them.
    let plain = ledger_at(&dir, "plain.sqlite3");
    let spans = traced(|| {
        assert!(plain.dispatch(&paying(SECRET_AMOUNT, "call-1")).unwrap().outcome().is_done());
    });
    let (_, call, _) = tree(&spans);
    for key in [
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "toolledger.tenant",
        "toolledger.subject",
    ] {
        assert!(attribute(call, key).is_none(), "{key}");
    }
}

fn ledger_at(dir: &TempDir, file: &str) -> Ledger<Pays, NoRoles> {
    Ledger::builder(dir.join(file)).tool(crate::many::pay()).open(pays(), NoRoles).unwrap()
}
