//! The ledger's spans, for the host's own OpenTelemetry provider (the cargo feature
//! `otel`; `docs/observability.md`). The facade uses the OpenTelemetry API alone: its
//! spans go to whatever provider the host installed globally, and to none (a no-op)
//! when it installed none. Without the feature every function here is the work alone.
//!
//! A call is one `execute_tool {tool}` span (kind `INTERNAL`), a child of the caller's
//! context. What the ledger did for it are the call span's children: `commit A`, a
//! worker's `claim`, the downstream's `execute` or `lookup` (kind `CLIENT`), `commit C`.
//! A replay reads and
//! writes nothing new, so its call span has no children. No span ever carries the
//! idempotency key, a digest of it or of the request, the arguments or the result.

use toolledger_store::TraceRecord;

use crate::{Error, Reply};

/// A step of a call, made a child span of the call's while it runs ([`step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The transaction that accepts the intent.
    CommitA,
    /// The transaction that takes an accepted operation's lease, for a worker.
    Claim,
    /// The transaction that ends the operation, synced or lazy.
    CommitC {
        /// Whether it waits for the disk.
        synced: bool,
    },
    /// The downstream performing the request.
    Execute,
    /// The downstream asked what became of the request.
    Lookup,
}

/// One call's span, from its start to its answer: the context that holds it, made
/// current on each thread that works the call; ended once, by [`CallSpan::end`] (when
/// the ledger made it: a host's own span, [`Call::in_host_span`](crate::Call::in_host_span),
/// is the host's to end).
#[derive(Clone, Debug)]
pub(crate) struct CallSpan {
    parent: Parent,
    #[cfg(feature = "otel")]
    owned: bool,
    /// What the call asks and of which store, for its `toolledger.calls` count.
    #[cfg(feature = "otel")]
    counted: (Purpose, &'static str),
    /// What it records beyond the defaults (the result, when opted in).
    #[cfg(feature = "otel")]
    capture: Capture,
}

/// A W3C trace context (`traceparent`, and `tracestate`): the one a call continues
/// when the host hands it over ([`Call::trace_parent`](crate::Call::trace_parent)), or
/// the one current on this thread, for a downstream to send onward
/// ([`TraceContext::current`]). `docs/observability.md`.
///
/// ```
/// let context = toolledger::TraceContext::parse(
///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
///     "vendor=opaque",
/// )
/// .unwrap();
/// assert_eq!(context.tracestate(), "vendor=opaque");
/// // Not W3C's format: a receiver starts a new trace instead (W3C Trace Context, 4.3).
/// assert_eq!(toolledger::TraceContext::parse("00-not-a-context", ""), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: String,
}

/// The longest `tracestate` kept: W3C's 32 members of at most 256 characters each would
/// be 8 KiB; a longer value is dropped, and with it only the vendors' state.
const TRACESTATE_MAX: usize = 512;

impl TraceContext {
    /// The context of a `traceparent` header value and its `tracestate` (empty when
    /// there is none). `None` when `traceparent` is not W3C's format (version `ff`, a
    /// wrong length, upper-case or non-hex digits, an all-zero trace or span id): W3C
    /// Trace Context has the receiver start a new trace then, and so does the ledger. A
    /// `tracestate` longer than 512 bytes or with a byte outside printable ASCII is
    /// dropped (the trace goes on without the vendors' state).
    ///
    /// ```
    /// let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// assert!(toolledger::TraceContext::parse(parent, "").is_some());
    /// assert!(toolledger::TraceContext::parse(&parent.to_uppercase(), "").is_none());
    /// ```
    pub fn parse(traceparent: &str, tracestate: &str) -> Option<TraceContext> {
        let fields: Vec<&str> = traceparent.splitn(5, '-').collect();
        let hex = |field: &str, len: usize| {
            field.len() == len
                && field.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let [version, trace_id, span_id, flags, rest @ ..] = fields.as_slice() else {
            return None;
        };
        let well_formed = hex(version, 2)
            && *version != "ff"
            && hex(trace_id, 32)
            && hex(span_id, 16)
            && hex(flags, 2)
            && trace_id.bytes().any(|b| b != b'0')
            && span_id.bytes().any(|b| b != b'0')
            // Version 00 is exactly four fields; a later version may append its own.
            && (rest.is_empty() || *version != "00");
        if !well_formed {
            return None;
        }
        let tracestate = if tracestate.len() <= TRACESTATE_MAX
            && tracestate.bytes().all(|b| (b' '..=b'~').contains(&b))
        {
            tracestate.trim().to_owned()
        } else {
            String::new()
        };
        Some(TraceContext { traceparent: format!("00-{trace_id}-{span_id}-{flags}"), tracestate })
    }

    /// The `traceparent` value, in version 00's format.
    ///
    /// ```
    /// let context = toolledger::TraceContext::parse(
    ///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ///     "vendor=opaque",
    /// )
    /// .unwrap();
    /// assert_eq!(context.traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    /// ```
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` value; empty when there is none.
    ///
    /// ```
    /// let context = toolledger::TraceContext::parse(
    ///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ///     "vendor=opaque",
    /// )
    /// .unwrap();
    /// assert_eq!(context.tracestate(), "vendor=opaque");
    /// ```
    pub fn tracestate(&self) -> &str {
        &self.tracestate
    }

    /// The context of the span current on this thread, for a downstream to send onward
    /// (the HTTP downstream's headers, an MCP upstream's `_meta`): while the ledger
    /// performs a call, its `execute` or `lookup` span. `None` outside a trace, and
    /// always without the `otel` feature.
    ///
    /// ```
    /// // No trace here: nothing to send.
    /// assert_eq!(toolledger::TraceContext::current(), None);
    /// ```
    pub fn current() -> Option<TraceContext> {
        #[cfg(feature = "otel")]
        {
            on::current_context()
        }
        #[cfg(not(feature = "otel"))]
        {
            None
        }
    }

    /// Makes this context the current one on this thread until the guard drops: every
    /// call made meanwhile continues it, as if each were given it with
    /// [`Call::trace_parent`](crate::Call::trace_parent). What a command does with the
    /// `TRACEPARENT` its caller set in its environment. Nothing without the `otel`
    /// feature.
    ///
    /// ```
    /// let parent = toolledger::TraceContext::parse(
    ///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ///     "",
    /// )
    /// .unwrap();
    /// let _entered = parent.enter();
    /// // Calls made here continue the trace.
    /// ```
    #[must_use = "the context is current only while the guard lives"]
    pub fn enter(&self) -> Entered {
        Entered {
            #[cfg(feature = "otel")]
            _attached: on::enter(self),
        }
    }
}

/// A context made current by [`TraceContext::enter`], until it drops.
///
/// ```
/// let parent = toolledger::TraceContext::parse(
///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
///     "",
/// )
/// .unwrap();
/// let entered: toolledger::Entered = parent.enter();
/// drop(entered); // the context before is current again
/// ```
#[derive(Debug)]
pub struct Entered {
    /// Held for its drop, which restores the context before.
    #[cfg(feature = "otel")]
    _attached: Option<opentelemetry::ContextGuard>,
}

/// What the call span says of the call before it is worked.
#[cfg_attr(not(feature = "otel"), allow(dead_code, reason = "read by the spans alone"))]
#[derive(Clone)]
pub(crate) struct Named<'a> {
    /// The tool, as the call names it.
    pub(crate) tool: &'a str,
    /// The model's id for this tool call, when the host gave one: never the key.
    pub(crate) call_id: Option<&'a str>,
    /// What the call asks of the ledger.
    pub(crate) purpose: Purpose,
    /// The context the host handed over, continued instead of the thread's own.
    pub(crate) parent: Option<&'a TraceContext>,
    /// Whether the host's span (the parent) is the call's own: no span is made, the
    /// host's gets the attributes.
    pub(crate) host_span: bool,
    /// Who asks, recorded only when the operator opts in ([`Capture::principal`]).
    pub(crate) principal: Option<(&'a str, &'a str)>,
    /// The arguments, recorded only when the operator opts in ([`Capture::content`]).
    pub(crate) arguments: Option<&'a serde_json::Value>,
    /// What the ledger's spans record beyond the defaults.
    pub(crate) capture: Capture,
}

impl Named<'_> {
    /// What the span of a loaded call (a case file's) says of it, made for `purpose`.
    pub(crate) fn loaded(call: &toolledger_contract::HostCall, purpose: Purpose) -> Named<'_> {
        Named {
            tool: &call.proposal.tool_name,
            call_id: Some(call.host.provider_call_id.as_str()),
            purpose,
            parent: None,
            host_span: false,
            principal: Some((
                call.principal.tenant_id.as_str(),
                call.principal.subject_id.as_str(),
            )),
            arguments: Some(&call.proposal.arguments),
            capture: Capture::default(),
        }
    }

    /// The same, recording what `capture` opts in to.
    pub(crate) fn capturing(mut self, capture: Capture) -> Self {
        self.capture = capture;
        self
    }
}

/// What a ledger's spans record beyond the defaults, each off unless the operator opts
/// in (`docs/observability.md`, "Opting in"): given to
/// [`LedgerBuilder::capture_in_spans`](crate::LedgerBuilder::capture_in_spans), or read
/// from the environment ([`Capture::from_env`], the default).
///
/// ```
/// let capture = toolledger::Capture { content: false, principal: false };
/// assert_eq!(capture, toolledger::Capture::default());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capture {
    /// The call's arguments and its result, as the GenAI conventions' opt-in
    /// `gen_ai.tool.call.arguments` and `gen_ai.tool.call.result` (canonical JSON).
    pub content: bool,
    /// The tenant and the subject, as `toolledger.tenant` and `toolledger.subject`.
    pub principal: bool,
}

impl Capture {
    /// What the environment asks for: `content` when
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` is `true` (the variable
    /// OpenTelemetry's GenAI instrumentations read), `principal` when
    /// `TOOLLEDGER_OTEL_CAPTURE_PRINCIPAL` is `true`; nothing otherwise.
    ///
    /// ```
    /// let capture = toolledger::Capture::from_env();
    /// # let _ = capture;
    /// ```
    pub fn from_env() -> Capture {
        let on =
            |name: &str| std::env::var(name).is_ok_and(|value| value.eq_ignore_ascii_case("true"));
        Capture {
            content: on("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"),
            principal: on("TOOLLEDGER_OTEL_CAPTURE_PRINCIPAL"),
        }
    }
}

/// What a call asks of the ledger: its span's `toolledger.purpose`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Perform it now (`dispatch`).
    Dispatch,
    /// Accept it for a worker (`enqueue`).
    Enqueue,
    /// Work an accepted one (`process`).
    Process,
    /// Ask what became of one (`status`).
    QueryStatus,
}

impl Purpose {
    #[cfg_attr(not(feature = "otel"), allow(dead_code, reason = "read by the spans alone"))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Purpose::Dispatch => "dispatch",
            Purpose::Enqueue => "enqueue",
            Purpose::Process => "process",
            Purpose::QueryStatus => "query_status",
        }
    }
}

#[cfg(feature = "otel")]
mod on {
    use opentelemetry::{
        Context, KeyValue,
        trace::{
            SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
            TraceState, Tracer,
        },
    };

    use super::{CallSpan, Named, Parent, Step, TraceContext, TraceRecord};
    use crate::{Error, Reply};

    /// The instrumentation scope of every span of the ledger.
    const SCOPE: &str = "toolledger";

    /// The remote span `context` names, as a parent.
    fn remote(context: &TraceContext) -> Option<SpanContext> {
        let mut fields = context.traceparent.split('-').skip(1);
        let trace_id = TraceId::from_hex(fields.next()?).ok()?;
        let span_id = SpanId::from_hex(fields.next()?).ok()?;
        let flags = u8::from_str_radix(fields.next()?, 16).ok()?;
        let state = context.tracestate.parse::<TraceState>().unwrap_or_default();
        Some(SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state))
    }

    pub(super) fn enter(context: &TraceContext) -> Option<opentelemetry::ContextGuard> {
        remote(context).map(|remote| Context::current().with_remote_span_context(remote).attach())
    }

    pub(super) fn current_context() -> Option<TraceContext> {
        let context = Context::current();
        let span = context.span();
        let span = span.span_context();
        if !span.is_valid() {
            return None;
        }
        Some(TraceContext {
            traceparent: format!(
                "00-{}-{}-{:02x}",
                span.trace_id(),
                span.span_id(),
                span.trace_flags().to_u8()
            ),
            tracestate: span.trace_state().header(),
        })
    }

    pub(super) fn start(named: &Named<'_>, store: &'static str, current: &Context) -> CallSpan {
        let handed = named.parent.and_then(remote);
        let parent = match handed {
            Some(remote) => current.with_remote_span_context(remote),
            None => current.clone(),
        };
        let parent = &parent;
        let tracer = opentelemetry::global::tracer(SCOPE);
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.type", "function"),
            KeyValue::new("toolledger.purpose", named.purpose.as_str()),
            KeyValue::new("toolledger.store", store),
        ];
        // A worker's call names no tool before the ledger reads its operation.
        if !named.tool.is_empty() {
            attributes.push(KeyValue::new("gen_ai.tool.name", named.tool.to_owned()));
        }
        if let Some(call_id) = named.call_id {
            attributes.push(KeyValue::new("gen_ai.tool.call.id", call_id.to_owned()));
        }
        let capture = named.capture;
        if let (true, Some((tenant, subject))) = (capture.principal, named.principal) {
            attributes.push(KeyValue::new("toolledger.tenant", tenant.to_owned()));
            attributes.push(KeyValue::new("toolledger.subject", subject.to_owned()));
        }
        if let (true, Some(arguments)) = (capture.content, named.arguments) {
            let arguments = toolledger_json::canonicalize(arguments);
            attributes.push(KeyValue::new("gen_ai.tool.call.arguments", arguments));
        }
        if named.host_span {
            // The host's span is the call's: it gets the attributes (a remote one, which
            // this process cannot write to, is the host's to describe), and stays open.
            let span = parent.span();
            for attribute in attributes {
                span.set_attribute(attribute);
            }
            let (counted, capture) = ((named.purpose, store), named.capture);
            let parent = Parent { context: parent.clone() };
            return CallSpan { parent, owned: false, counted, capture };
        }
        let span = tracer
            .span_builder(if named.tool.is_empty() {
                "execute_tool".to_owned()
            } else {
                format!("execute_tool {}", named.tool)
            })
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes)
            .start_with_context(&tracer, parent);
        let (counted, capture) = ((named.purpose, store), named.capture);
        CallSpan {
            parent: Parent { context: parent.with_span(span) },
            owned: true,
            counted,
            capture,
        }
    }

    pub(super) fn end(call: &CallSpan, answer: &Result<Reply, Error>) {
        let span = call.parent.context.span();
        let (decision, error) = super::decision(answer);
        let (purpose, store) = call.counted;
        crate::meters::call_ended(purpose.as_str(), store, decision);
        span.set_attribute(KeyValue::new("toolledger.decision", decision));
        if let (true, Ok(reply)) = (call.capture.content, answer) {
            use crate::Outcome;
            if let Outcome::Fresh(receipt)
            | Outcome::Replayed(receipt)
            | Outcome::Reconciled(receipt) = reply.outcome()
            {
                let result = toolledger_json::canonicalize(receipt.output());
                span.set_attribute(KeyValue::new("gen_ai.tool.call.result", result));
            }
        }
        if let Some(error) = error {
            span.set_attribute(KeyValue::new("error.type", error));
            span.set_status(Status::error(error));
        }
        if call.owned {
            span.end();
        }
    }

    pub(super) fn step<T>(step: Step, work: impl FnOnce() -> T) -> T {
        // A commit point's duration is measured whether or not it is traced.
        let point = match step {
            Step::CommitA => Some("A"),
            Step::Claim => Some("claim"),
            Step::CommitC { .. } => Some("C"),
            Step::Execute | Step::Lookup => None,
        };
        let started = point.map(|_| std::time::Instant::now());
        let timed = |answer: T| {
            if let (Some(point), Some(started)) = (point, started) {
                crate::meters::commit_took(point, started.elapsed().as_secs_f64());
            }
            answer
        };
        let parent = Context::current();
        // Only inside a trace: a store or downstream used outside any call (an operator's
        // command with no span of the host's around it) makes no root spans of its own.
        if !parent.has_active_span() {
            return timed(work());
        }
        let tracer = opentelemetry::global::tracer(SCOPE);
        let (name, kind) = match step {
            Step::CommitA => ("commit A", SpanKind::Internal),
            Step::Claim => ("claim", SpanKind::Internal),
            Step::CommitC { .. } => ("commit C", SpanKind::Internal),
            Step::Execute => ("execute", SpanKind::Client),
            Step::Lookup => ("lookup", SpanKind::Client),
        };
        let mut builder = tracer.span_builder(name).with_kind(kind);
        if let Step::CommitC { synced } = step {
            let durability = if synced { "synced" } else { "lazy" };
            builder = builder.with_attributes([KeyValue::new("toolledger.durability", durability)]);
        }
        let span = builder.start_with_context(&tracer, &parent);
        let context = parent.with_span(span);
        let answer = {
            let _attached = context.clone().attach();
            work()
        };
        context.span().end();
        timed(answer)
    }

    pub(super) fn current() -> Context {
        Context::current()
    }

    /// The link to a caller's stored context, marked as such.
    fn link_to(span: &opentelemetry::trace::SpanRef<'_>, stored: &TraceRecord) {
        let context = TraceContext::parse(&stored.traceparent, &stored.tracestate);
        if let Some(remote) = context.as_ref().and_then(remote) {
            span.add_link(remote, vec![KeyValue::new("toolledger.link", "caller")]);
        }
    }

    pub(super) fn link_stored(fetch: impl FnOnce() -> Option<TraceRecord>) {
        let context = Context::current();
        let span = context.span();
        // Only a span that is recorded is worth a read.
        if !span.is_recording() {
            return;
        }
        if let Some(stored) = fetch() {
            link_to(&span, &stored);
        }
    }

    /// A relay pass in progress on this thread: its span, once it has claimed something.
    struct Pass {
        store: &'static str,
        /// When the pass began: its first claim's start.
        begun: std::time::SystemTime,
        started: Option<(Context, opentelemetry::ContextGuard)>,
    }

    thread_local! {
        static PASS: std::cell::RefCell<Option<Pass>> = const { std::cell::RefCell::new(None) };
    }

    pub(super) fn relay_pass<T>(
        store: &'static str,
        work: impl FnOnce() -> T,
        told: impl FnOnce(&T) -> (usize, Option<&'static str>),
    ) -> T {
        let begun = std::time::SystemTime::now();
        PASS.with(|pass| *pass.borrow_mut() = Some(Pass { store, begun, started: None }));
        let answer = work();
        let pass = PASS.with(|pass| pass.borrow_mut().take());
        if let Some(Pass { started: Some((context, guard)), .. }) = pass {
            drop(guard);
            let span = context.span();
            let (claimed, error) = told(&answer);
            span.set_attribute(KeyValue::new(
                "toolledger.claimed",
                i64::try_from(claimed).unwrap_or(i64::MAX),
            ));
            if let Some(error) = error {
                span.set_attribute(KeyValue::new("error.type", error));
                span.set_status(Status::error(error));
            }
            span.end();
        }
        answer
    }

    pub(super) fn relay_claimed(stored: impl FnOnce() -> Vec<Option<TraceRecord>>) {
        PASS.with(|pass| {
            let mut pass = pass.borrow_mut();
            let Some(pass) = pass.as_mut() else { return };
            if pass.started.is_none() {
                // A new trace of its own: the pass works many callers' operations, each
                // linked, none its parent.
                let tracer = opentelemetry::global::tracer(SCOPE);
                let span = tracer
                    .span_builder("relay pass")
                    .with_kind(SpanKind::Consumer)
                    .with_attributes([
                        KeyValue::new("toolledger.purpose", "relay"),
                        KeyValue::new("toolledger.store", pass.store),
                    ])
                    .with_start_time(pass.begun)
                    .start_with_context(&tracer, &Context::new());
                let context = Context::new().with_span(span);
                // The claim that found work ran before the pass had a span: its child
                // still, over the time it took.
                let mut claim = tracer
                    .span_builder("claim")
                    .with_kind(SpanKind::Internal)
                    .with_start_time(pass.begun)
                    .start_with_context(&tracer, &context);
                opentelemetry::trace::Span::end(&mut claim);
                let guard = context.clone().attach();
                pass.started = Some((context, guard));
            }
            if let Some((context, _)) = &pass.started {
                let span = context.span();
                if span.is_recording() {
                    for stored in stored().iter().flatten() {
                        link_to(&span, stored);
                    }
                }
            }
        });
    }
}

impl CallSpan {
    /// Starts the call's span on a store of `store` (`sqlite`, `postgres`), a child of
    /// the context current on this thread (the host's own span, if it has one).
    pub(crate) fn start(named: &Named<'_>, store: &'static str) -> CallSpan {
        #[cfg(feature = "otel")]
        {
            on::start(named, store, &on::current())
        }
        #[cfg(not(feature = "otel"))]
        {
            let _ = (named, store);
            CallSpan { parent: Parent {} }
        }
    }

    /// Runs `work` with the call's span current, so the steps it takes are its children.
    pub(crate) fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        self.parent.run(work)
    }

    /// Ends the span with what the call answered.
    pub(crate) fn end(&self, answer: &Result<Reply, Error>) {
        #[cfg(feature = "otel")]
        on::end(self, answer);
        #[cfg(not(feature = "otel"))]
        let _ = answer;
    }
}

/// A trace context carried to the thread that works a call: the one current where a
/// host made a future (the call's span is then a child of the host's wherever the
/// future is awaited), or a call's own span ([`CallSpan`]).
#[derive(Clone, Debug)]
pub(crate) struct Parent {
    #[cfg(feature = "otel")]
    context: opentelemetry::Context,
}

impl Parent {
    /// The context current on this thread.
    pub(crate) fn current() -> Parent {
        Parent {
            #[cfg(feature = "otel")]
            context: on::current(),
        }
    }

    /// Runs `work` with this context current.
    pub(crate) fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        #[cfg(feature = "otel")]
        let _attached = self.context.clone().attach();
        work()
    }
}

/// Runs `work`, a step of the call whose span is current, as a child span of it.
pub(crate) fn step<T>(step: Step, work: impl FnOnce() -> T) -> T {
    #[cfg(feature = "otel")]
    {
        on::step(step, work)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = step;
        work()
    }
}

/// Records on the call span current on this thread the attempt a claim was granted
/// (`toolledger.attempt`: 1 for a dispatch's own claim, more for a retry or a
/// takeover).
pub(crate) fn attempt(attempt: i64) {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt;
        let context = opentelemetry::Context::current();
        context.span().set_attribute(opentelemetry::KeyValue::new("toolledger.attempt", attempt));
    }
    #[cfg(not(feature = "otel"))]
    let _ = attempt;
}

/// Links the span current on this thread, when it is recorded, to the trace context
/// `fetch` reads: the one stored with the intent the call works (its caller's), so a
/// later attempt or status query, in a trace of its own, leads back to the call that
/// asked. Nothing is read when no span records it.
pub(crate) fn link_stored(fetch: impl FnOnce() -> Option<TraceRecord>) {
    #[cfg(feature = "otel")]
    on::link_stored(fetch);
    #[cfg(not(feature = "otel"))]
    let _ = fetch;
}

/// Runs `work`, one relay pass, as a trace of its own once it claims something (a
/// `relay pass` span, kind `CONSUMER`, linked to each claimed operation's caller: see
/// [`relay_claimed`]); an idle pass makes no span. `told` says, of its answer, how many
/// events it claimed and the error's code when it failed.
pub(crate) fn relay_pass<T>(
    store: &'static str,
    work: impl FnOnce() -> T,
    told: impl FnOnce(&T) -> (usize, Option<&'static str>),
) -> T {
    #[cfg(feature = "otel")]
    {
        on::relay_pass(store, work, told)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (store, told);
        work()
    }
}

/// What a relay pass claimed: its span starts (and is made current) at the first claim
/// that got something, and links to every caller context `stored` reads for it.
pub(crate) fn relay_claimed(stored: impl FnOnce() -> Vec<Option<TraceRecord>>) {
    #[cfg(feature = "otel")]
    on::relay_claimed(stored);
    #[cfg(not(feature = "otel"))]
    let _ = stored;
}

/// The call span's `toolledger.decision`, and its `error.type` when the call did not
/// end as asked ([`Reply::decision`], [`Reply::error_type`]), or `error` and the facade
/// error's code.
#[cfg_attr(not(feature = "otel"), allow(dead_code, reason = "read by the spans alone"))]
fn decision(answer: &Result<Reply, Error>) -> (&'static str, Option<&'static str>) {
    match answer {
        Ok(reply) => (reply.decision(), reply.error_type()),
        Err(error) => ("error", Some(error.code().as_str())),
    }
}

/// A downstream whose `execute` and `lookup` are child spans (kind `CLIENT`) of the
/// call span current while they run; everything else is what it wraps.
pub(crate) struct Traced<D>(pub(crate) D);

impl<D: toolledger_engine::Downstream> toolledger_engine::Downstream for Traced<D> {
    fn identity(&self) -> &toolledger_contract::DownstreamIdentity {
        self.0.identity()
    }

    fn identity_for(&self, tool: &str) -> &toolledger_contract::DownstreamIdentity {
        self.0.identity_for(tool)
    }

    fn identities(&self) -> Vec<toolledger_contract::DownstreamIdentity> {
        self.0.identities()
    }

    fn execute(
        &self,
        request: &toolledger_engine::DownstreamRequest,
        now: toolledger_store::Now,
    ) -> Result<toolledger_store::DownstreamReceipt, toolledger_engine::DownstreamError> {
        step(Step::Execute, || self.0.execute(request, now))
    }

    fn lookup(
        &self,
        request: &toolledger_engine::DownstreamRequest,
    ) -> Result<toolledger_engine::Lookup, toolledger_engine::DownstreamError> {
        step(Step::Lookup, || self.0.lookup(request))
    }

    fn can_look_up(&self, tool: &str) -> bool {
        self.0.can_look_up(tool)
    }

    fn is_simulation(&self) -> bool {
        self.0.is_simulation()
    }

    fn execute_batch(
        &self,
        requests: &[toolledger_engine::DownstreamRequest],
        now: toolledger_store::Now,
    ) -> Vec<Result<toolledger_store::DownstreamReceipt, toolledger_engine::DownstreamError>> {
        step(Step::Execute, || self.0.execute_batch(requests, now))
    }
}
