//! A host's own tool and downstream: `open_ticket`, performed by the host's ticket
//! service through its client. Shared by the `host` example and the crate's tests.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use serde_json::{Value, json};
use toolledger::{
    ApprovalPolicy, BusinessRefusal, Call, Charset, Denied, Downstream, DownstreamError,
    DownstreamIdentity, DownstreamReceipt, DownstreamRequest, Field, FieldRule, Lookup, ModelCall,
    Revisions, RuleCall, Schema, ToolRules, ToolSpec, UnixSeconds,
};

/// The tool: its data (schemas, revisions) and its rules.
pub(crate) fn open_ticket() -> ToolSpec {
    let slug =
        |len_max| FieldRule::Text { prefix: "", len_min: 1, len_max, charset: Charset::Slug };
    ToolSpec::new(
        "open_ticket",
        Revisions {
            input: "open_ticket.input.v1".to_owned(),
            output: "open_ticket.output.v1".to_owned(),
            effect: "open_ticket.effect.v1".to_owned(),
            handler: "open_ticket.handler.v1".to_owned(),
            producer: "acme-host.v1".to_owned(),
            policy: "open_ticket.policy.v1".to_owned(),
        },
        Schema::Fields(vec![
            Field { name: "queue", rule: slug(64) },
            Field { name: "summary", rule: slug(120) },
            Field { name: "priority", rule: FieldRule::OneOf(&["low", "normal", "high"]) },
        ]),
        Schema::Fields(vec![
            Field {
                name: "ticket_id",
                rule: FieldRule::Text {
                    prefix: "T-",
                    len_min: 8,
                    len_max: 8,
                    charset: Charset::LowerHex,
                },
            },
            Field { name: "queue", rule: FieldRule::SameAsInput },
            Field { name: "priority", rule: FieldRule::SameAsInput },
            Field { name: "state", rule: FieldRule::Const("open") },
        ]),
        TicketRules,
    )
}

/// A model's call of `open_ticket` for user-7 of tenant acme: one model call per key.
pub(crate) fn ticket_call(key: &str, queue: &str, priority: &str) -> Call {
    Call::new(
        "open_ticket",
        json!({"queue": queue, "summary": "refund-not-received", "priority": priority}),
    )
    .principal("acme", "user-7")
    .idempotency_key(key)
    .model_call(ModelCall::new(
        "openai",
        "responses",
        "openai-responses-2026-05",
        "resp-1",
        &format!("call-{key}"),
    ))
}

/// Anyone may open a ticket in one of their own tenant's queues (`<tenant>-…`), unless
/// the business context lists the queue as frozen. No approval is needed.
#[derive(Debug)]
pub(crate) struct TicketRules;

fn queue<'a>(call: &RuleCall<'a>) -> Option<&'a str> {
    call.arguments.get("queue").and_then(Value::as_str)
}

impl ToolRules for TicketRules {
    fn authorize(&self, call: &RuleCall<'_>) -> Result<(), Denied> {
        let prefix = format!("{}-", call.tenant_id.as_str());
        if queue(call).is_some_and(|queue| queue.starts_with(&prefix)) {
            Ok(())
        } else {
            Err(Denied)
        }
    }

    fn check_business(&self, call: &RuleCall<'_>) -> Result<(), BusinessRefusal> {
        let frozen = call.context.get("frozen_queues").and_then(Value::as_array);
        let is_frozen =
            frozen.is_some_and(|queues| queues.iter().any(|frozen| frozen.as_str() == queue(call)));
        if is_frozen { Err(BusinessRefusal) } else { Ok(()) }
    }

    fn approval(&self, _arguments: &Value) -> ApprovalPolicy {
        ApprovalPolicy::NotRequired
    }
}

/// What the ticket service's client reports: the service's own answers and faults.
#[derive(Debug)]
pub(crate) enum ClientError {
    /// The connection was refused: nothing reached the service.
    Unreachable,
    /// The service refused the ticket (a closed queue), for good.
    Rejected(String),
    /// The service committed the ticket and the response was lost.
    Timeout,
}

/// The ticket service, as the host's client sees it: idempotent on the key the ledger
/// hands it, with switches to misbehave once.
#[derive(Debug, Default)]
pub(crate) struct TicketService {
    /// Tickets by idempotency key: (fingerprint, ticket).
    pub(crate) tickets: BTreeMap<String, (String, Value)>,
    /// Queues the service refuses.
    pub(crate) closed_queues: Vec<String>,
    /// The next request commits, then its response is lost.
    pub(crate) lose_next_response: bool,
    /// The next request is not delivered at all.
    pub(crate) refuse_next_connection: bool,
    /// The next this many requests are not delivered at all.
    pub(crate) unreachable_for: usize,
    /// The next ticket comes back with a field the contract does not allow.
    pub(crate) garble_next: bool,
}

impl TicketService {
    /// Opens a ticket for `key` (or returns the one opened before under it).
    pub(crate) fn open(
        &mut self,
        key: &str,
        fingerprint: &str,
        request: &Value,
    ) -> Result<Value, ClientError> {
        if std::mem::take(&mut self.refuse_next_connection) {
            return Err(ClientError::Unreachable);
        }
        if self.unreachable_for > 0 {
            self.unreachable_for -= 1;
            return Err(ClientError::Unreachable);
        }
        let queue = request.get("queue").and_then(Value::as_str).unwrap_or_default();
        if self.closed_queues.iter().any(|closed| closed == queue) {
            return Err(ClientError::Rejected(format!("queue {queue} is closed")));
        }
        if let Some((_, ticket)) = self.tickets.get(key) {
            return Ok(ticket.clone());
        }
        let number = self.tickets.len() + 1;
        let mut ticket = json!({
            "ticket_id": format!("T-{number:08x}"),
            "queue": queue,
            "priority": request.get("priority").cloned().unwrap_or(Value::Null),
            "state": "open",
        });
        if std::mem::take(&mut self.garble_next) {
            ticket["state"] = json!("maybe-open");
        }
        self.tickets.insert(key.to_owned(), (fingerprint.to_owned(), ticket.clone()));
        if std::mem::take(&mut self.lose_next_response) {
            return Err(ClientError::Timeout);
        }
        Ok(ticket)
    }

    /// The ticket opened under `key`, if any.
    pub(crate) fn find(&self, key: &str) -> Option<Value> {
        self.tickets.get(key).map(|(_, ticket)| ticket.clone())
    }
}

/// The host's downstream: the ledger's requests, through the ticket client.
#[derive(Debug)]
pub(crate) struct Tickets {
    pub(crate) service: Arc<Mutex<TicketService>>,
    identity: DownstreamIdentity,
}

impl Tickets {
    pub(crate) fn new(service: Arc<Mutex<TicketService>>) -> Tickets {
        let identity =
            DownstreamIdentity::new("acme-tickets", "2026-11").expect("a valid identity");
        Tickets { service, identity }
    }
}

impl Downstream for Tickets {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _now: UnixSeconds,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let mut service = self.service.lock().expect("the service lock");
        let opened = service.open(
            request.downstream_request_ref.as_str(),
            request.request_sha256.as_str(),
            &request.arguments,
        );
        match opened {
            // The ledger checks the output against the tool's contract before trusting it.
            Ok(ticket) => Ok(request.receipt(ticket)),
            Err(ClientError::Unreachable) => {
                Err(DownstreamError::NotSent { reason: "connection refused".to_owned() })
            }
            Err(ClientError::Rejected(reason)) => Err(DownstreamError::Refused { reason }),
            Err(ClientError::Timeout) => {
                Err(DownstreamError::Unknown { reason: "timed out after sending".to_owned() })
            }
        }
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        let service = self.service.lock().expect("the service lock");
        Ok(match service.find(request.downstream_request_ref.as_str()) {
            Some(ticket) => Lookup::Done(request.receipt(ticket)),
            None => Lookup::NotFound,
        })
    }
}
