//! A model's tool call, described by the host: who asks, what, under which key, from
//! which model call, with which approval.

use serde_json::Value;
use toolledger_contract::{
    Approval, Clock, HostCall, HostContext, IdempotencyKey, Identifier, Principal, Proposal,
    ProviderProfile, Registry, Rejection, UnixSeconds, approval_sha256,
};

use crate::Error;

/// The model call a tool call came from: its provider profile and the response and call
/// ids the provider gave it. One model call is one intent.
///
/// ```
/// let call = toolledger::ModelCall::new("openai", "chat_completions", "openai-chat-2026-05", "chatcmpl-1", "call_7");
/// # let _ = call;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCall {
    profile: ProviderProfile,
    response_id: String,
    call_id: String,
    /// Made from the key ([`ModelCall::keyed`]): its ids are a digest of the key, which
    /// no span may carry, so the call span has no `gen_ai.tool.call.id`.
    keyed: bool,
}

impl ModelCall {
    /// The call `call_id` of response `response_id`, through `provider`'s
    /// `api_family` at `adapter_revision` (a registered profile).
    ///
    /// ```
    /// let call = toolledger::ModelCall::new("anthropic", "messages", "anthropic-messages-2026-05", "msg_01", "toolu_01");
    /// # let _ = call;
    /// ```
    pub fn new(
        provider: &str,
        api_family: &str,
        adapter_revision: &str,
        response_id: &str,
        call_id: &str,
    ) -> ModelCall {
        ModelCall {
            profile: ProviderProfile::new(provider, api_family, adapter_revision),
            response_id: response_id.to_owned(),
            call_id: call_id.to_owned(),
            keyed: false,
        }
    }
}

impl ModelCall {
    /// The model call of a host that is given no id of the model's tool use (an MCP
    /// `tools/call`, a Python function called without a framework): named by what stays
    /// the same across the call's retries — the principal, the tool and the idempotency
    /// key — so one key is one model call. The ids are `{prefix}-r-` and `{prefix}-c-`
    /// followed by the two halves of the SHA-256 of the canonical
    /// `[tenant, subject, tool, key]`.
    ///
    /// ```
    /// let profile = toolledger::ProviderProfile::new("python", "function_call", "toolledger-python-1");
    /// let once = toolledger::ModelCall::keyed(profile.clone(), "py", "acme", "user-7", "open_ticket", "k-1");
    /// assert_eq!(once, toolledger::ModelCall::keyed(profile, "py", "acme", "user-7", "open_ticket", "k-1"));
    /// ```
    pub fn keyed(
        profile: ProviderProfile,
        prefix: &str,
        tenant: &str,
        subject: &str,
        tool: &str,
        key: &str,
    ) -> ModelCall {
        let digest = toolledger_contract::digest::sha256_canonical(&serde_json::json!([
            tenant, subject, tool, key
        ]));
        let digest = digest.as_str();
        ModelCall {
            profile,
            response_id: format!("{prefix}-r-{}", digest.get(..32).unwrap_or_default()),
            call_id: format!("{prefix}-c-{}", digest.get(32..).unwrap_or_default()),
            keyed: true,
        }
    }

    /// The model call of a `what` (call or query), checked: present, of a registered
    /// profile, its ids identifiers.
    fn checked(
        model_call: Option<&ModelCall>,
        registry: &Registry,
        what: &str,
    ) -> Result<(ProviderProfile, Identifier, Identifier), Error> {
        let model_call =
            model_call.ok_or_else(|| Error::invalid(format!("the {what} names no model call")))?;
        if !registry.has_profile(&model_call.profile) {
            return Err(Error::invalid(
                "the model call's provider profile is not registered".to_owned(),
            ));
        }
        let id = |text: &str, which: &str| {
            Identifier::new(text)
                .map_err(|_| Error::invalid(format!("the {what}'s {which} is not an identifier")))
        };
        Ok((
            model_call.profile.clone(),
            id(&model_call.response_id, "model response id")?,
            id(&model_call.call_id, "model call id")?,
        ))
    }
}

/// An approval as the approver gave it. The library binds it to the call (computes its
/// digest over the call's exact request, key and model call); the host never patches a
/// digest in.
///
/// ```
/// let grant = toolledger::Grant {
///     approval_id: "appr-9".to_owned(),
///     approver_id: "lead-2".to_owned(),
///     approved_at: 1_767_225_500,
///     expires_at: 1_767_229_100,
/// };
/// # let _ = grant;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The approval's id.
    pub approval_id: String,
    /// Who approved.
    pub approver_id: String,
    /// When, in Unix seconds.
    pub approved_at: i64,
    /// Until when, in Unix seconds (exclusive).
    pub expires_at: i64,
}

/// One tool call, described with a builder. Validated when it is used.
///
/// ```
/// use serde_json::json;
/// let call = toolledger::Call::new("open_ticket", json!({"queue": "billing", "title": "refund"}))
///     .principal("acme", "user-7")
///     .idempotency_key("ticket-42")
///     .model_call(toolledger::ModelCall::new("openai", "responses", "openai-responses-2026-05", "resp_9", "call_3"));
/// # let _ = call;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    tool: String,
    arguments: Value,
    principal: (String, String),
    key: String,
    model_call: Option<ModelCall>,
    operation_id: Option<String>,
    context: Value,
    grant: Option<(Grant, Vec<String>)>,
    now: Option<i64>,
    trace: Option<crate::TraceContext>,
    host_span: bool,
}

impl Call {
    /// What the span of the call says of it before it is worked, made for `purpose`.
    pub(crate) fn named(&self, purpose: crate::traces::Purpose) -> crate::traces::Named<'_> {
        crate::traces::Named {
            tool: &self.tool,
            // A keyed model call's id is a digest of the key: never in a span.
            call_id: self
                .model_call
                .as_ref()
                .filter(|model_call| !model_call.keyed)
                .map(|model_call| model_call.call_id.as_str()),
            purpose,
            parent: self.trace.as_ref(),
            host_span: self.host_span,
            principal: Some((self.principal.0.as_str(), self.principal.1.as_str())),
            arguments: Some(&self.arguments),
            capture: crate::Capture::default(),
        }
    }

    /// A call of `tool` with `arguments` (checked against the tool's input schema).
    ///
    /// ```
    /// let call = toolledger::Call::new("refund_order", serde_json::json!({"order_id": "ord-1"}));
    /// # let _ = call;
    /// ```
    pub fn new(tool: &str, arguments: Value) -> Call {
        Call {
            tool: tool.to_owned(),
            arguments,
            principal: (String::new(), String::new()),
            key: String::new(),
            model_call: None,
            operation_id: None,
            context: Value::Null,
            grant: None,
            now: None,
            trace: None,
            host_span: false,
        }
    }

    /// Who asks: the tenant and the subject. Their roles are asked of the resolver at
    /// every check, never taken from the call.
    ///
    /// ```
    /// let call = toolledger::Call::new("t", serde_json::json!({})).principal("acme", "user-7");
    /// # let _ = call;
    /// ```
    pub fn principal(mut self, tenant_id: &str, subject_id: &str) -> Call {
        self.principal = (tenant_id.to_owned(), subject_id.to_owned());
        self
    }

    /// The idempotency key: one intent per (tenant, subject, tool, key).
    ///
    /// ```
    /// let call = toolledger::Call::new("t", serde_json::json!({})).idempotency_key("order-1-refund");
    /// # let _ = call;
    /// ```
    pub fn idempotency_key(mut self, key: &str) -> Call {
        self.key = key.to_owned();
        self
    }

    /// The model call it came from.
    ///
    /// ```
    /// let call = toolledger::Call::new("t", serde_json::json!({})).model_call(
    ///     toolledger::ModelCall::new("openai", "responses", "openai-responses-2026-05", "resp_1", "call_1"),
    /// );
    /// # let _ = call;
    /// ```
    pub fn model_call(mut self, model_call: ModelCall) -> Call {
        self.model_call = Some(model_call);
        self
    }

    /// The host's own id for the operation (default: the model call's id).
    ///
    /// ```
    /// let call = toolledger::Call::new("t", serde_json::json!({})).operation_id("op-77");
    /// # let _ = call;
    /// ```
    pub fn operation_id(mut self, operation_id: &str) -> Call {
        self.operation_id = Some(operation_id.to_owned());
        self
    }

    /// The business context the tool's rules judge (default `null`: rules that read the
    /// host's own systems need none).
    ///
    /// ```
    /// let call = toolledger::Call::new("t", serde_json::json!({})).context(serde_json::json!({"plan": "pro"}));
    /// # let _ = call;
    /// ```
    pub fn context(mut self, context: Value) -> Call {
        self.context = context;
        self
    }

    /// The approval, and the approvers the tenant's policy allows. Needed when the
    /// tool's policy requires one; ignored (and not stored) otherwise.
    ///
    /// ```
    /// let grant = toolledger::Grant {
    ///     approval_id: "appr-1".to_owned(),
    ///     approver_id: "lead-1".to_owned(),
    ///     approved_at: 1_767_225_500,
    ///     expires_at: 1_767_229_100,
    /// };
    /// let call = toolledger::Call::new("t", serde_json::json!({})).approval(grant, &["lead-1"]);
    /// # let _ = call;
    /// ```
    pub fn approval(mut self, grant: Grant, eligible_approvers: &[&str]) -> Call {
        let approvers = eligible_approvers.iter().map(|approver| (*approver).to_owned()).collect();
        self.grant = Some((grant, approvers));
        self
    }

    /// The instant the call is judged at, in Unix seconds (default: the wall clock when
    /// it is used).
    ///
    /// ```
    /// let call = toolledger::Call::new("t", serde_json::json!({})).at(1_767_225_600);
    /// # let _ = call;
    /// ```
    pub fn at(mut self, now: i64) -> Call {
        self.now = Some(now);
        self
    }

    /// The trace the call continues, as the host received it (an HTTP request's
    /// `traceparent` and `tracestate`, an MCP request's `_meta`, a Python host's current
    /// span): the call's span is a child of it instead of the context current on the
    /// thread. Spans are made only with the `otel` feature (`docs/observability.md`).
    ///
    /// ```
    /// let parent = toolledger::TraceContext::parse(
    ///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ///     "",
    /// );
    /// let mut call = toolledger::Call::new("t", serde_json::json!({}));
    /// if let Some(parent) = parent {
    ///     call = call.trace_parent(parent);
    /// }
    /// # let _ = call;
    /// ```
    pub fn trace_parent(mut self, parent: crate::TraceContext) -> Call {
        self.trace = Some(parent);
        self
    }

    /// The host's own span (the one current where it calls, or the one
    /// [`Call::trace_parent`] names) is the call's `execute_tool` span: the ledger makes
    /// none of its own, adds its attributes to the host's (when it is a span of this
    /// process) and makes its steps the host's span's children. The host ends its span.
    /// OpenTelemetry's GenAI conventions ask for this when the host already traces its
    /// tool calls.
    ///
    /// ```
    /// let call = toolledger::Call::new("t", serde_json::json!({})).in_host_span();
    /// # let _ = call;
    /// ```
    pub fn in_host_span(mut self) -> Call {
        self.host_span = true;
        self
    }

    pub(crate) fn now(&self) -> Option<i64> {
        self.now
    }

    pub(crate) fn context_value(&self) -> &Value {
        &self.context
    }

    /// The engine's view of the call, validated, with the approval bound to it: or,
    /// inside, where its arguments are outside what the ledger holds ([`crate::door`]:
    /// nothing is written, the call is answered `INPUT_INVALID`).
    pub(crate) fn to_host_call(
        &self,
        clock: Clock,
        registry: &Registry,
    ) -> Result<Result<HostCall, Rejection>, Error> {
        let id = |text: &str, what: &str| {
            Identifier::new(text)
                .map_err(|_| Error::invalid(format!("the call's {what} is not an identifier")))
        };
        let (profile, response_id, call_id) =
            ModelCall::checked(self.model_call.as_ref(), registry, "call")?;
        let host = HostContext {
            profile,
            provider_response_id: response_id,
            operation_id: match &self.operation_id {
                Some(operation_id) => id(operation_id, "operation id")?,
                None => call_id.clone(),
            },
            provider_call_id: call_id,
            idempotency_key: IdempotencyKey::new(&self.key).map_err(|_| {
                Error::invalid("the call's idempotency key is not an identifier".to_owned())
            })?,
        };
        let arguments = match crate::door::admit(&self.arguments) {
            Ok(arguments) => arguments,
            Err(rejection) => return Ok(Err(rejection)),
        };
        let mut host_call = HostCall {
            clock,
            principal: Principal {
                tenant_id: id(&self.principal.0, "tenant id")?,
                subject_id: id(&self.principal.1, "subject id")?,
            },
            host,
            proposal: Proposal { tool_name: self.tool.clone(), arguments },
            approval: None,
            eligible_approvers: Vec::new(),
            business_state: self.context.clone(),
        };
        if let (Some((grant, approvers)), Some(tool)) = (&self.grant, registry.tool(&self.tool)) {
            let instant = |seconds: i64| {
                UnixSeconds::new(seconds).map_err(|_| {
                    Error::invalid("the approval's instants are out of range".to_owned())
                })
            };
            let (approval_id, approver_id) =
                (id(&grant.approval_id, "approval id")?, id(&grant.approver_id, "approver id")?);
            let (approved_at, expires_at) =
                (instant(grant.approved_at)?, instant(grant.expires_at)?);
            let binding = host_call.approval_binding(&tool.name, &tool.revisions);
            let approval_sha256 =
                approval_sha256(&approval_id, &approver_id, approved_at, expires_at, &binding);
            let approval =
                Approval { approval_id, approver_id, approved_at, expires_at, approval_sha256 };
            host_call.approval = Some(approval);
            host_call.eligible_approvers = approvers
                .iter()
                .map(|approver| id(approver, "eligible approver"))
                .collect::<Result<_, _>>()?;
        }
        Ok(Ok(host_call))
    }
}

/// A status query of a host that holds only the operation's ref: who asks, from which
/// model call (the query is a purpose-bound call of its own), and the business context
/// the tool's rules judge. The tool, the arguments and the approval are the ledger's.
///
/// ```
/// let query = toolledger::StatusQuery::new("acme", "user-7")
///     .model_call(toolledger::ModelCall::new("openai", "responses", "openai-responses-2026-05", "resp-9", "call-9"));
/// # let _ = query;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct StatusQuery {
    principal: (String, String),
    model_call: Option<ModelCall>,
    context: Value,
    now: Option<i64>,
    trace: Option<crate::TraceContext>,
    host_span: bool,
}

impl StatusQuery {
    /// A query by `subject_id` of `tenant_id`.
    ///
    /// ```
    /// let query = toolledger::StatusQuery::new("acme", "user-7");
    /// # let _ = query;
    /// ```
    pub fn new(tenant_id: &str, subject_id: &str) -> StatusQuery {
        StatusQuery {
            principal: (tenant_id.to_owned(), subject_id.to_owned()),
            model_call: None,
            context: Value::Null,
            now: None,
            trace: None,
            host_span: false,
        }
    }

    /// The trace the query continues, as [`Call::trace_parent`].
    ///
    /// ```
    /// let parent = toolledger::TraceContext::parse(
    ///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ///     "",
    /// )
    /// .unwrap();
    /// let query = toolledger::StatusQuery::new("acme", "user-7").trace_parent(parent);
    /// # let _ = query;
    /// ```
    pub fn trace_parent(mut self, parent: crate::TraceContext) -> StatusQuery {
        self.trace = Some(parent);
        self
    }

    /// The host's own span is the query's, as [`Call::in_host_span`].
    ///
    /// ```
    /// let query = toolledger::StatusQuery::new("acme", "user-7").in_host_span();
    /// # let _ = query;
    /// ```
    pub fn in_host_span(mut self) -> StatusQuery {
        self.host_span = true;
        self
    }

    /// What the span of the query says of it: no tool before the ledger reads the
    /// operation, and no model call id (the query's is not the tool call's).
    pub(crate) fn named(&self) -> crate::traces::Named<'_> {
        crate::traces::Named {
            tool: "",
            call_id: None,
            purpose: crate::traces::Purpose::QueryStatus,
            parent: self.trace.as_ref(),
            host_span: self.host_span,
            principal: Some((self.principal.0.as_str(), self.principal.1.as_str())),
            arguments: None,
            capture: crate::Capture::default(),
        }
    }

    /// The model call asking (required).
    ///
    /// ```
    /// let query = toolledger::StatusQuery::new("acme", "user-7")
    ///     .model_call(toolledger::ModelCall::new("openai", "responses", "openai-responses-2026-05", "resp-9", "call-9"));
    /// # let _ = query;
    /// ```
    pub fn model_call(mut self, model_call: ModelCall) -> StatusQuery {
        self.model_call = Some(model_call);
        self
    }

    /// The business context the tool's rules judge (default `null`: rules that consult
    /// the host's own systems, or a definition's, need none).
    ///
    /// ```
    /// let query = toolledger::StatusQuery::new("acme", "user-7").context(serde_json::json!({"orders": []}));
    /// # let _ = query;
    /// ```
    pub fn context(mut self, context: Value) -> StatusQuery {
        self.context = context;
        self
    }

    /// Judge the query at `now` (Unix seconds) instead of the wall clock.
    ///
    /// ```
    /// let query = toolledger::StatusQuery::new("acme", "user-7").at(1_767_225_600);
    /// # let _ = query;
    /// ```
    pub fn at(mut self, now: i64) -> StatusQuery {
        self.now = Some(now);
        self
    }

    pub(crate) fn now(&self) -> Option<i64> {
        self.now
    }

    pub(crate) fn context_value(&self) -> &Value {
        &self.context
    }

    /// The principal and the asking call, validated.
    pub(crate) fn parts(
        &self,
        registry: &Registry,
    ) -> Result<(Identifier, Identifier, toolledger_store::CallIdentity), Error> {
        let id = |text: &str, what: &str| {
            Identifier::new(text)
                .map_err(|_| Error::invalid(format!("the query's {what} is not an identifier")))
        };
        let (profile, provider_response_id, provider_call_id) =
            ModelCall::checked(self.model_call.as_ref(), registry, "query")?;
        let call =
            toolledger_store::CallIdentity { profile, provider_response_id, provider_call_id };
        Ok((id(&self.principal.0, "tenant id")?, id(&self.principal.1, "subject id")?, call))
    }
}
