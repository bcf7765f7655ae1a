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

use crate::{Error, Outcome, Reply};

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
/// current on each thread that works the call; ended once, by [`CallSpan::end`].
#[derive(Clone, Debug)]
pub(crate) struct CallSpan(Parent);

/// What the call span says of the call before it is worked.
#[cfg_attr(not(feature = "otel"), allow(dead_code, reason = "read by the spans alone"))]
pub(crate) struct Named<'a> {
    /// The tool, as the call names it.
    pub(crate) tool: &'a str,
    /// The model's id for this tool call, when the host gave one: never the key.
    pub(crate) call_id: Option<&'a str>,
    /// What the call asks of the ledger.
    pub(crate) purpose: Purpose,
}

impl Named<'_> {
    /// What the span of a loaded call (a case file's) says of it, made for `purpose`.
    pub(crate) fn loaded(call: &toolledger_contract::HostCall, purpose: Purpose) -> Named<'_> {
        Named {
            tool: &call.proposal.tool_name,
            call_id: Some(call.host.provider_call_id.as_str()),
            purpose,
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
    fn as_str(self) -> &'static str {
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
        trace::{SpanKind, Status, TraceContextExt, Tracer},
    };

    use super::{CallSpan, Named, Parent, Step};
    use crate::{Error, Reply};

    /// The instrumentation scope of every span of the ledger.
    const SCOPE: &str = "toolledger";

    pub(super) fn start(named: &Named<'_>, store: &'static str, parent: &Context) -> CallSpan {
        let tracer = opentelemetry::global::tracer(SCOPE);
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", named.tool.to_owned()),
            KeyValue::new("gen_ai.tool.type", "function"),
            KeyValue::new("toolledger.purpose", named.purpose.as_str()),
            KeyValue::new("toolledger.store", store),
        ];
        if let Some(call_id) = named.call_id {
            attributes.push(KeyValue::new("gen_ai.tool.call.id", call_id.to_owned()));
        }
        let span = tracer
            .span_builder(format!("execute_tool {}", named.tool))
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes)
            .start_with_context(&tracer, parent);
        CallSpan(Parent { context: parent.with_span(span) })
    }

    pub(super) fn end(call: &CallSpan, answer: &Result<Reply, Error>) {
        let span = call.0.context.span();
        let (decision, error) = super::decision(answer);
        span.set_attribute(KeyValue::new("toolledger.decision", decision));
        if let Some(error) = error {
            span.set_attribute(KeyValue::new("error.type", error));
            span.set_status(Status::error(error));
        }
        span.end();
    }

    pub(super) fn step<T>(step: Step, work: impl FnOnce() -> T) -> T {
        let parent = Context::current();
        // Only inside a trace: a store or downstream used outside any call (an operator's
        // command with no span of the host's around it) makes no root spans of its own.
        if !parent.has_active_span() {
            return work();
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
        answer
    }

    pub(super) fn current() -> Context {
        Context::current()
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
            CallSpan(Parent {})
        }
    }

    /// Runs `work` with the call's span current, so the steps it takes are its children.
    pub(crate) fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        self.0.run(work)
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

/// The call span's `toolledger.decision`, and its `error.type` when the call did not
/// end as asked: a refusal's code, `OUTCOME_UNKNOWN`, or the facade error's code.
#[cfg_attr(not(feature = "otel"), allow(dead_code, reason = "read by the spans alone"))]
fn decision(answer: &Result<Reply, Error>) -> (&'static str, Option<&'static str>) {
    use toolledger_contract::BlockCode;
    let reply = match answer {
        Ok(reply) => reply,
        Err(error) => return ("error", Some(error.code().as_str())),
    };
    match reply.outcome() {
        Outcome::Fresh(_) => ("fresh", None),
        Outcome::Replayed(_) => ("replay", None),
        Outcome::Reconciled(_) => ("reconciled", None),
        Outcome::Accepted { .. } => ("accepted", None),
        Outcome::Unknown { .. } => ("outcome_unknown", Some(BlockCode::OutcomeUnknown.as_str())),
        Outcome::Blocked { code, .. } => {
            let decision = match code {
                BlockCode::IdempotencyConflict => "conflict",
                BlockCode::ApprovalRequired => "approval_required",
                BlockCode::OutcomeUnknown => "outcome_unknown",
                _ => "blocked",
            };
            (decision, Some(code.as_str()))
        }
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
