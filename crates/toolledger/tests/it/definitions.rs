//! Tools from definition files, through the library, against the reference service over
//! HTTP (served in a thread of this process): dispatch, a retry, a conflict, refusals
//! that name the pointer and keyword with nothing written, the approval and
//! precondition policies of a definition, and a property test of the round trip.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
};

use proptest::prelude::*;
use serde_json::{Value, json};
use toolledger::{
    BlockCode, Call, DownstreamIdentity, Grant, Identifier, Ledger, ModelCall, Outcome,
    Precondition, PrincipalResolver, ResolverError, RuleCall, ToolDefinition, ToolSpec, Verdict,
    http::{Endpoint, HttpDownstream, Timeouts},
    load_tool,
};
use toolledger_refundd::{Faults, Recipes, Service, bind};

use crate::TempDir;

/// The reference service with the shipped recipes, on a loopback port, until dropped.
struct Reference {
    url: String,
    db: std::path::PathBuf,
    stop: Box<dyn Fn()>,
}

impl Reference {
    fn start(dir: &TempDir) -> Reference {
        Reference::start_with(dir, Faults::default())
    }

    fn start_with(dir: &TempDir, faults: Faults) -> Reference {
        let recipes: Value = serde_json::from_slice(
            &std::fs::read(crate::workspace("fixtures/tools/refundd-recipes.json")).unwrap(),
        )
        .unwrap();
        let db = dir.join("service.sqlite3");
        let service = Arc::new(
            Service::open_with_tools(&db, faults, Recipes::from_json(&recipes).unwrap()).unwrap(),
        );
        let (server, addr) = bind("127.0.0.1:0").unwrap();
        let serving = Arc::clone(&server);
        std::thread::spawn(move || service.serve(&serving, 2));
        Reference { url: format!("http://{addr}"), db, stop: Box::new(move || server.unblock()) }
    }

    fn endpoint(&self, tool: &str) -> Endpoint {
        Endpoint {
            execute_url: format!("{}/tools/{tool}", self.url),
            lookup_url: format!("{}/tools/{tool}/by-key/{{key}}", self.url),
            headers: Vec::new(),
            identity: None,
            timeouts: None,
        }
    }

    fn downstream(&self, tools: &[&str]) -> HttpDownstream {
        let identity = DownstreamIdentity::new("reference-tools", "1").unwrap();
        tools.iter().fold(HttpDownstream::new(identity, Timeouts::default()), |http, tool| {
            http.endpoint(tool, self.endpoint(tool))
        })
    }

    /// A ledger at `path` serving `send_invoice_email` through this service.
    fn invoices(&self, path: &Path) -> Ledger<HttpDownstream, Roles> {
        Ledger::builder(path)
            .tool(invoice_tool())
            .open(self.downstream(&["send_invoice_email"]), Roles::default())
            .unwrap()
    }

    /// The effects the service itself committed.
    fn effects(&self) -> i64 {
        let conn = rusqlite::Connection::open(&self.db).unwrap();
        conn.query_row("SELECT count(*) FROM effects", [], |row| row.get(0)).unwrap()
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        (self.stop)();
    }
}

/// Roles by subject, as the host's identity system says now.
#[derive(Debug, Clone, Default)]
struct Roles(Arc<Mutex<BTreeMap<String, Vec<String>>>>);

impl Roles {
    fn grant(&self, subject: &str, role: &str) {
        self.0.lock().unwrap().entry(subject.to_owned()).or_default().push(role.to_owned());
    }
}

impl PrincipalResolver for Roles {
    fn current_roles(
        &self,
        _: &Identifier,
        subject: &Identifier,
    ) -> Result<Vec<String>, ResolverError> {
        Ok(self.0.lock().unwrap().get(subject.as_str()).cloned().unwrap_or_default())
    }
}

#[test]
fn the_definition_docs_tools_md_shows_loads_and_refuses_what_it_says() {
    let docs = std::fs::read_to_string(crate::workspace("docs/tools.md")).unwrap();
    let block = docs.split("```toml\n").nth(1).unwrap().split("```").next().unwrap();
    let document = toolledger::parse_document("docs.toml", block.as_bytes()).unwrap();
    let shown = ToolDefinition::from_document("docs.toml", &document).unwrap();
    assert_eq!(shown.name, "send_invoice_email");
    assert_eq!(shown.authorization.owner.as_deref(), Some("/customer/customer_id"));
    let refusal = docs.lines().find(|line| line.starts_with("tool.toml: at ")).unwrap();
    let mut remote = document;
    remote["input_schema"]["properties"]["to"] = json!({"$ref": "https://example.com/email.json"});
    let refused = ToolDefinition::from_document("tool.toml", &remote).unwrap_err();
    assert_eq!(refused.to_string(), refusal);
}

fn invoice_tool() -> ToolSpec {
    load_tool(&crate::workspace("fixtures/tools/send_invoice_email.toml")).unwrap().tool()
}

fn invoice(key: &str, arguments: Value) -> Call {
    Call::new("send_invoice_email", arguments)
        .principal("acme", "cust-7")
        .idempotency_key(key)
        .model_call(ModelCall::new(
            "openai",
            "responses",
            "openai-responses-2026-05",
            "resp-1",
            &format!("call-{key}"),
        ))
        .at(1_767_225_600)
}

fn arguments() -> Value {
    json!({"invoice_id": "inv_2041", "to": "ada@example.com", "cc": ["books@example.com"],
        "attach_pdf": true, "customer": {"customer_id": "cust-7", "name": "Ada L."}})
}

fn operations(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT count(*) FROM operations", [], |row| row.get(0)).unwrap()
}

fn code(outcome: &Outcome) -> Option<BlockCode> {
    match outcome {
        Outcome::Blocked { code, .. } => Some(*code),
        _ => None,
    }
}

#[test]
fn a_tool_from_a_file_is_dispatched_retried_and_conflicted_over_http() {
    let dir = TempDir::new("definition-http");
    let service = Reference::start(&dir);
    let path = dir.join("ledger.sqlite3");
    let ledger = service.invoices(&path);
    let first = ledger.dispatch(&invoice("inv-key-1", arguments())).unwrap();
    let Outcome::Fresh(receipt) = first.outcome() else { panic!("{first:?}") };
    assert_eq!(receipt.output()["to"], "ada@example.com");
    assert_eq!(receipt.output()["status"], "sent");
    // The model retries: the same receipt, and the service saw one effect.
    let again = ledger.dispatch(&invoice("inv-key-1", arguments())).unwrap();
    let Outcome::Replayed(replayed) = again.outcome() else { panic!("{again:?}") };
    assert_eq!(replayed.result_sha256(), receipt.result_sha256());
    assert_eq!(replayed.request_sha256(), receipt.request_sha256());
    // The same key, another intent: a conflict, no second email.
    let mut other = arguments();
    other["to"] = json!("grace@example.com");
    let conflict = ledger
        .dispatch(&invoice("inv-key-1", other).model_call(ModelCall::new(
            "openai",
            "responses",
            "openai-responses-2026-05",
            "resp-2",
            "call-other",
        )))
        .unwrap();
    assert_eq!(code(conflict.outcome()), Some(BlockCode::IdempotencyConflict));
    assert_eq!(service.effects(), 1);
    // Someone else's invoice: not found, unless they may act for others.
    let foreign = invoice("inv-key-2", arguments()).principal("acme", "cust-8");
    assert_eq!(code(ledger.dispatch(&foreign).unwrap().outcome()), Some(BlockCode::NotFound));
    assert_eq!(operations(&path), 1);
}

#[test]
fn a_host_restarted_with_only_the_status_ref_reconciles_a_lost_answer() {
    let dir = TempDir::new("definition-status-of");
    // The service commits the first email, then drops the connection.
    let service = Reference::start_with(&dir, Faults { drop_next: 1, ..Faults::default() });
    let path = dir.join("ledger.sqlite3");
    let open = || service.invoices(&path);
    let ledger = open();
    let lost = ledger.dispatch(&invoice("inv-lost", arguments())).unwrap();
    let Outcome::Unknown { status_ref } = lost.outcome().clone() else { panic!("{lost:?}") };
    assert_eq!(service.effects(), 1, "the service committed");
    drop(ledger);
    // Restarted, with the ref alone: who asks, from which model call.
    let ledger = open();
    let asking = |call: &str, subject: &str| {
        toolledger::StatusQuery::new("acme", subject)
            .model_call(ModelCall::new(
                "openai",
                "responses",
                "openai-responses-2026-05",
                "resp-q",
                call,
            ))
            .at(1_767_225_700)
    };
    let settled = ledger.status_of(&asking("call-q1", "cust-7"), &status_ref).unwrap();
    let Outcome::Reconciled(receipt) = settled.outcome() else { panic!("{settled:?}") };
    assert_eq!(receipt.output()["to"], "ada@example.com");
    let again = ledger.status_of(&asking("call-q1", "cust-7"), &status_ref).unwrap();
    assert!(matches!(again.outcome(), Outcome::Replayed(_)), "{again:?}");
    // Someone else, with the same ref: nothing to see.
    let other = ledger.status_of(&asking("call-q2", "cust-8"), &status_ref).unwrap();
    assert_eq!(code(other.outcome()), Some(BlockCode::NotFound));
    assert_eq!(service.effects(), 1);
    // Enqueued: accepted and certainly not sent, then worked.
    let accepted = ledger.enqueue(&invoice("inv-queued", arguments())).unwrap();
    let Outcome::Accepted { status_ref } = accepted.outcome().clone() else {
        panic!("{accepted:?}")
    };
    assert_eq!(accepted.package()["status"], "pending");
    assert_eq!(service.effects(), 1, "nothing sent yet");
    let worked = ledger.process(&status_ref, &invoice("inv-queued", arguments())).unwrap();
    assert!(matches!(worked.outcome(), Outcome::Fresh(_)), "{worked:?}");
    assert_eq!(service.effects(), 2);
}

/// `send_invoice_email` with a precondition asked of the reference service: the
/// invoice must be sendable (`GET /tools/send_invoice_email/allow/{invoice_id}`).
fn guarded_invoices(service: &Reference) -> ToolSpec {
    let mut document = toolledger::parse_document(
        "send_invoice_email.toml",
        &std::fs::read(crate::workspace("fixtures/tools/send_invoice_email.toml")).unwrap(),
    )
    .unwrap();
    document["precondition"] = json!("/tools/send_invoice_email/allow/{invoice_id}");
    let definition = ToolDefinition::from_document("guarded.toml", &document).unwrap();
    let url = format!("{}{}", service.url, definition.precondition.as_deref().unwrap());
    let ask = toolledger::http::HttpPrecondition::new(&url, Vec::new(), Default::default());
    definition.tool_with(None, Some(Arc::new(ask)))
}

#[test]
fn a_precondition_is_asked_of_the_service_and_a_changed_schema_is_drift_at_the_worker() {
    let dir = TempDir::new("definition-precondition");
    let refused = Faults { refuse_resources: vec!["inv_2041".to_owned()], ..Faults::default() };
    let service = Reference::start_with(&dir, refused);
    let path = dir.join("ledger.sqlite3");
    let roles = Roles::default();
    roles.grant("agent-3", "billing_agent");
    let ledger = Ledger::builder(&path)
        .tool(guarded_invoices(&service))
        .open(service.downstream(&["send_invoice_email"]), roles.clone())
        .unwrap();
    // The service says this invoice may not be sent: refused, nothing written.
    let refused = ledger.dispatch(&invoice("pre-1", arguments())).unwrap();
    assert_eq!(code(refused.outcome()), Some(BlockCode::BusinessStateInvalid));
    assert_eq!(operations(&path), 0);
    // Another invoice, sent by a billing agent on the customer's behalf.
    let mut other = arguments();
    other["invoice_id"] = json!("inv_2042");
    let by_agent = invoice("pre-2", other.clone()).principal("acme", "agent-3");
    assert!(matches!(ledger.dispatch(&by_agent).unwrap().outcome(), Outcome::Fresh(_)));
    // Accepted now, then the tool's input schema changes before a worker gets to it.
    let queued = invoice("pre-3", other).principal("acme", "agent-3");
    let status_ref = ledger.enqueue(&queued).unwrap().status_ref().unwrap().clone();
    drop(ledger);
    let mut document = toolledger::parse_document(
        "send_invoice_email.toml",
        &std::fs::read(crate::workspace("fixtures/tools/send_invoice_email.toml")).unwrap(),
    )
    .unwrap();
    document["input_schema"]["properties"]["to"]["maxLength"] = json!(100);
    let changed = ToolDefinition::from_document("changed.toml", &document).unwrap().tool();
    let ledger = Ledger::builder(&path)
        .tool(changed)
        .open(service.downstream(&["send_invoice_email"]), roles)
        .unwrap();
    let drifted = ledger.process(&status_ref, &queued).unwrap();
    assert_eq!(code(drifted.outcome()), Some(BlockCode::ContractDrift), "{drifted:?}");
    assert_eq!(service.effects(), 1);
    drop(ledger);
    // The service down (a port nothing listens on): the precondition decides nothing,
    // and nothing is written.
    drop(service);
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let down = Reference { url: closed, db: dir.join("none.sqlite3"), stop: Box::new(|| ()) };
    let ledger = Ledger::builder(dir.join("other.sqlite3"))
        .tool(guarded_invoices(&down))
        .open(down.downstream(&["send_invoice_email"]), Roles::default())
        .unwrap();
    let unavailable = ledger.dispatch(&invoice("pre-4", arguments())).unwrap();
    assert_eq!(code(unavailable.outcome()), Some(BlockCode::DownstreamUnavailable));
    assert_eq!(operations(&dir.join("other.sqlite3")), 0);
}

#[test]
fn arguments_the_schema_refuses_name_the_pointer_and_keyword_and_write_nothing() {
    let dir = TempDir::new("definition-refusals");
    let service = Reference::start(&dir);
    let path = dir.join("ledger.sqlite3");
    let ledger = service.invoices(&path);
    let cases = [
        ("/to", json!("not-an-address"), "/to", "format"),
        ("/cc", json!(["a@example.com", "a@example.com"]), "/cc", "uniqueItems"),
        ("/attach_pdf", json!("yes"), "/attach_pdf", "type"),
        ("/customer/nickname", json!("x"), "/customer", "additionalProperties"),
        ("/invoice_id", json!("INV-1"), "/invoice_id", "pattern"),
    ];
    for (index, (at, value, pointer, keyword)) in cases.into_iter().enumerate() {
        let mut broken = arguments();
        let (parent, member) = at.rsplit_once('/').unwrap();
        broken.pointer_mut(parent).unwrap()[member] = value;
        let reply = ledger.dispatch(&invoice(&format!("bad-{index}"), broken)).unwrap();
        assert_eq!(code(reply.outcome()), Some(BlockCode::InputInvalid), "{at}");
        assert_eq!(
            reply.package()["detail"],
            json!({"pointer": pointer, "keyword": keyword}),
            "{at}"
        );
        assert!(!reply.canonical().contains("not-an-address"), "never the value");
        if index == 0 {
            // docs/tools.md shows this very package.
            let docs = std::fs::read_to_string(crate::workspace("docs/tools.md")).unwrap();
            let shown = docs.lines().find(|line| line.starts_with("{\"code\":\"INPUT_INVALID\""));
            assert_eq!(shown, Some(reply.canonical().trim_end()));
        }
    }
    let mut missing = arguments();
    missing.as_object_mut().unwrap().remove("customer");
    let reply = ledger.dispatch(&invoice("bad-missing", missing)).unwrap();
    assert_eq!(reply.package()["detail"]["keyword"], "required");
    assert_eq!(operations(&path), 0);
    assert_eq!(service.effects(), 0);
}

/// A definition with an approval valid only up to the effect, approvers by role, and a
/// precondition asked of a system this test controls.
fn guarded(precondition: Arc<dyn Precondition>) -> ToolSpec {
    let text = r#"
name = "open_ticket"
description = "Open a ticket; a lead approves, and the queue must be open."
precondition = "/queues/{queue}/open"
[input_schema]
type = "object"
required = ["queue", "summary", "priority"]
additionalProperties = false
properties = { queue = { type = "string" }, summary = { type = "string" }, priority = { enum = ["low", "normal", "high"] } }
[output_schema]
type = "object"
required = ["ticket_id", "queue", "priority", "state"]
properties = { ticket_id = { type = "string" }, queue = { type = "string" }, priority = { type = "string" }, state = { const = "open" } }
[output_bindings]
"/queue" = "/queue"
[approval]
required = true
approver_roles = ["support_lead"]
max_validity_seconds = 600
valid_at = "effect"
"#;
    let document = toolledger::parse_document("guarded.toml", text.as_bytes()).unwrap();
    let definition = ToolDefinition::from_document("guarded.toml", &document).unwrap();
    definition.tool_with(None, Some(precondition))
}

/// Answers what it is told to, and counts the questions.
#[derive(Debug, Default)]
struct Gate(Mutex<(Vec<Verdict>, usize)>);

impl Gate {
    fn answer(&self, verdict: Verdict) {
        self.0.lock().unwrap().0.push(verdict);
    }
}

impl Precondition for Gate {
    fn ask(&self, call: &RuleCall<'_>) -> Verdict {
        assert!(call.arguments.get("queue").is_some());
        let mut gate = self.0.lock().unwrap();
        gate.1 += 1;
        gate.0.first().cloned().unwrap_or(Verdict::Allow)
    }
}

fn ticket(key: &str, approver: &str, approved_at: i64, expires_at: i64) -> Call {
    Call::new("open_ticket", json!({"queue": "billing", "summary": "refund", "priority": "high"}))
        .principal("acme", "user-7")
        .idempotency_key(key)
        .model_call(ModelCall::new(
            "openai",
            "responses",
            "openai-responses-2026-05",
            "resp-1",
            &format!("call-{key}"),
        ))
        .approval(
            Grant {
                approval_id: format!("appr-{key}"),
                approver_id: approver.to_owned(),
                approved_at,
                expires_at,
            },
            &[],
        )
        .at(1_767_225_600)
}

#[test]
fn a_definitions_approval_and_precondition_are_asked_at_acceptance_and_before_the_effect() {
    let dir = TempDir::new("definition-policy");
    let service = Reference::start(&dir);
    let path = dir.join("ledger.sqlite3");
    let gate = Arc::new(Gate::default());
    let roles = Roles::default();
    roles.grant("lead-1", "support_lead");
    let ledger = Ledger::builder(&path)
        .tool(guarded(Arc::clone(&gate) as Arc<dyn Precondition>))
        .open(service.downstream(&["open_ticket"]), roles.clone())
        .unwrap();
    let now = 1_767_225_600;
    // An approver without the role, then an approval valid for longer than allowed.
    let outsider = ticket("t-1", "intern-3", now - 10, now + 300);
    assert_eq!(
        code(ledger.dispatch(&outsider).unwrap().outcome()),
        Some(BlockCode::ApprovalInvalid)
    );
    let long = ticket("t-2", "lead-1", now - 10, now + 3_600);
    assert_eq!(code(ledger.dispatch(&long).unwrap().outcome()), Some(BlockCode::ApprovalInvalid));
    // The precondition cannot be asked: nothing decided, nothing written.
    gate.answer(Verdict::Unavailable { reason: "connection refused".to_owned() });
    let call = ticket("t-3", "lead-1", now - 10, now + 300);
    assert_eq!(
        code(ledger.dispatch(&call).unwrap().outcome()),
        Some(BlockCode::DownstreamUnavailable)
    );
    assert_eq!(operations(&path), 0);
    // The queue is closed: refused.
    gate.0.lock().unwrap().0 = vec![Verdict::Refuse { reason: Some("queue closed".to_owned()) }];
    assert_eq!(
        code(ledger.dispatch(&call).unwrap().outcome()),
        Some(BlockCode::BusinessStateInvalid)
    );
    assert_eq!(operations(&path), 0);
    // Open again: accepted and queued; the approval expires before a worker gets to it.
    gate.0.lock().unwrap().0.clear();
    let accepted = ledger.enqueue(&call).unwrap();
    let status_ref = accepted.status_ref().unwrap().clone();
    let later = call.clone().at(now + 301);
    let worked = ledger.process(&status_ref, &later).unwrap();
    assert_eq!(code(worked.outcome()), Some(BlockCode::DownstreamRefused), "{worked:?}");
    assert_eq!(service.effects(), 0, "nothing was sent");
    let shown = toolledger::show(&path, &status_ref, false).unwrap().unwrap();
    assert_eq!(shown["status"], "failed", "{shown}");
    assert!(shown.to_string().contains("the approval expired before the side effect"), "{shown}");
    // A fresh one, worked in time, but the precondition is down at the effect: not sent,
    // still accepted, then sent once it answers.
    let call = ticket("t-4", "lead-1", now - 10, now + 300);
    let accepted = ledger.enqueue(&call).unwrap();
    let status_ref = accepted.status_ref().unwrap().clone();
    gate.answer(Verdict::Unavailable { reason: "timed out".to_owned() });
    let worked = ledger.process(&status_ref, &call).unwrap();
    assert_eq!(code(worked.outcome()), Some(BlockCode::DownstreamUnavailable));
    assert_eq!(service.effects(), 0);
    gate.0.lock().unwrap().0.clear();
    let worked = ledger.process(&status_ref, &call).unwrap();
    assert!(matches!(worked.outcome(), Outcome::Fresh(_)), "{worked:?}");
    assert_eq!(service.effects(), 1);
    assert!(gate.0.lock().unwrap().1 >= 6, "asked at acceptance and before each effect");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Any value the schema and the strict domain admit round-trips through acceptance,
    /// storage and replay with the same digests; any other is INPUT_INVALID naming a
    /// pointer and a keyword, with nothing written.
    #[test]
    fn a_definitions_values_round_trip_or_are_refused_with_nothing_written(
        invoice_id in "inv_[0-9a-z]{2,6}|[A-Z]{3}",
        to in "[a-z]{1,8}@example\\.com|[a-z ]{1,8}",
        cc in proptest::collection::vec("[a-z]{1,4}@example\\.org", 0..7),
        attach in prop_oneof![Just(json!(true)), Just(json!(false)), Just(json!(1)), Just(Value::Null)],
        name in proptest::option::of("[A-Za-z .]{0,12}"),
        extra in proptest::option::of(Just(json!({"note": 1}))),
    ) {
        let dir = TempDir::new("definition-property");
        let service = Reference::start(&dir);
        let path = dir.join("ledger.sqlite3");
        let ledger = service.invoices(&path);
        let mut arguments = json!({"invoice_id": invoice_id, "to": to, "cc": cc,
            "customer": {"customer_id": "cust-7"}});
        if !attach.is_null() {
            arguments["attach_pdf"] = attach;
        }
        if let Some(name) = name {
            arguments["customer"]["name"] = json!(name);
        }
        if let Some(extra) = extra {
            arguments["customer"]["extra"] = extra;
        }
        let tool = invoice_tool();
        let valid = tool.input.validate(&arguments, None).is_ok();
        let first = ledger.dispatch(&invoice("prop-1", arguments.clone())).unwrap();
        if valid {
            let Outcome::Fresh(receipt) = first.outcome() else { panic!("{first:?}") };
            let again = ledger.dispatch(&invoice("prop-1", arguments)).unwrap();
            let Outcome::Replayed(replayed) = again.outcome() else { panic!("{again:?}") };
            prop_assert_eq!(receipt.request_sha256(), replayed.request_sha256());
            prop_assert_eq!(receipt.result_sha256(), replayed.result_sha256());
            prop_assert_eq!(receipt.output(), replayed.output());
            prop_assert_eq!(service.effects(), 1);
        } else {
            prop_assert_eq!(code(first.outcome()), Some(BlockCode::InputInvalid));
            let detail = &first.package()["detail"];
            prop_assert!(detail["pointer"].is_string() && detail["keyword"].is_string(), "{}", detail);
            prop_assert_eq!(operations(&path), 0);
            prop_assert_eq!(service.effects(), 0);
        }
    }
}

/// A configuration of one service whose headers come from `headers` (a TOML inline table).
fn service_config(dir: &TempDir, headers: &str) -> std::path::PathBuf {
    let path = dir.join("toolledger.toml");
    let text = format!(
        "[services.billing]\nbase_url = \"http://127.0.0.1:9\"\nidentity = \"billing@1\"\nheaders_from_env = {headers}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_header_the_downstream_writes_or_that_frames_the_message_cannot_be_configured() {
    let dir = TempDir::new("reserved-headers");
    for header in
        ["Idempotency-Key", "idempotency-key", "Content-Length", "Transfer-Encoding", "Host"]
    {
        let path = service_config(&dir, &format!("{{ {header} = \"BILLING_TOKEN\" }}"));
        let refused = toolledger::Config::load(&path).map(drop).unwrap_err();
        assert_eq!(refused.code().as_str(), "USAGE_ERROR");
        assert!(refused.to_string().contains("writes this header itself"), "{refused}");
    }
    let path = service_config(&dir, "{ Authorization = \"BILLING_TOKEN_IN_TEST\" }");
    assert!(toolledger::Config::load(&path).is_ok());
}

#[test]
fn a_configuration_or_definition_that_is_a_fifo_is_refused_at_once() {
    let dir = TempDir::new("fifo");
    let fifo = dir.join("toolledger.toml");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Opening a FIFO for reading blocks until a writer comes: none ever does here.
    let refused = toolledger::Config::load(&fifo).map(drop).unwrap_err();
    assert!(refused.to_string().ends_with("is not a regular file"), "{refused}");
    let refused = load_tool(&fifo).map(drop).unwrap_err();
    assert!(refused.to_string().ends_with("is not a regular file"), "{refused}");
}
