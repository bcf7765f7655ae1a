//! A host's own tool (`open_ticket`, no approval) and downstream (its ticket service)
//! through every state: done, replayed, unknown then reconciled, not sent, refused
//! (`failed`), quarantined; the simulation refusing a host's operation; approval
//! policies; the types a host moves across threads.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use toolledger::{
    BlockCode, Call, Grant, Ledger, ModelCall, NoRoles, Outcome, RefundOrder, StatusRef,
};

use crate::{
    TempDir, blocked, dump, int, text,
    tickets::{TicketService, Tickets, open_ticket, ticket_call},
};

struct Host {
    dir: TempDir,
    service: Arc<Mutex<TicketService>>,
    ledger: Ledger<Tickets, NoRoles>,
}

impl Host {
    fn new() -> Host {
        let dir = TempDir::new("host");
        let service = Arc::new(Mutex::new(TicketService::default()));
        let ledger = Ledger::builder(dir.join("host.sqlite3"))
            .tool(open_ticket())
            .open(Tickets::new(Arc::clone(&service)), NoRoles)
            .unwrap();
        Host { dir, service, ledger }
    }

    fn db(&self) -> std::path::PathBuf {
        self.dir.join("host.sqlite3")
    }

    fn service(&self) -> std::sync::MutexGuard<'_, TicketService> {
        self.service.lock().unwrap()
    }
}

fn ticket(key: &str, queue: &str) -> Call {
    ticket_call(key, queue, "low").at(1_767_225_600)
}

#[test]
fn a_tool_without_approval_is_done_once_and_replayed() {
    let host = Host::new();
    let first = host.ledger.dispatch(&ticket("k1", "acme-it")).unwrap();
    let Outcome::Fresh(receipt) = first.outcome() else { panic!("{first:?}") };
    assert_eq!(receipt.output()["state"], "open");
    let again = host.ledger.dispatch(&ticket("k1", "acme-it")).unwrap();
    assert!(matches!(again.outcome(), Outcome::Replayed(_)));
    assert_eq!(host.service().tickets.len(), 1);
    // Nothing about an approval is stored for a tool that needs none.
    assert_eq!(int(&host.db(), "SELECT count(*) FROM operations WHERE approval_id IS NULL"), 1);
    assert_eq!(
        text(&host.db(), "SELECT downstream_name || '@' || downstream_revision FROM operations"),
        "acme-tickets@2026-11"
    );
    // The rules decide: another tenant's queue looks like nothing at all.
    let foreign = host.ledger.dispatch(&ticket("k2", "globex-it")).unwrap();
    assert_eq!(blocked(foreign.outcome()), BlockCode::NotFound);
    let frozen = host
        .ledger
        .dispatch(&ticket("k3", "acme-it").context(json!({"frozen_queues": ["acme-it"]})))
        .unwrap();
    assert_eq!(blocked(frozen.outcome()), BlockCode::BusinessStateInvalid);
    assert!(toolledger::audit(host.db()).unwrap().passed());
}

#[test]
fn a_lost_response_is_unknown_until_a_status_query_reconciles_it() {
    let host = Host::new();
    host.service().lose_next_response = true;
    let lost = host.ledger.dispatch(&ticket("k1", "acme-it")).unwrap();
    let Outcome::Unknown { status_ref } = lost.outcome().clone() else { panic!("{lost:?}") };
    // A retry does not guess either.
    let retry = host.ledger.dispatch(&ticket("k1", "acme-it")).unwrap();
    assert!(matches!(retry.outcome(), Outcome::Unknown { .. }));
    let settled = host.ledger.status(&ticket("k1", "acme-it"), &status_ref).unwrap();
    assert!(matches!(settled.outcome(), Outcome::Reconciled(_)), "{settled:?}");
    assert_eq!(host.service().tickets.len(), 1);
    assert!(toolledger::audit(host.db()).unwrap().passed());
}

#[test]
fn a_request_not_sent_leaves_the_operation_accepted_and_workable_at_once() {
    let host = Host::new();
    host.service().refuse_next_connection = true;
    let unsent = host.ledger.dispatch(&ticket("k1", "acme-it")).unwrap();
    assert_eq!(blocked(unsent.outcome()), BlockCode::DownstreamUnavailable);
    assert_eq!(unsent.package()["status"], "pending");
    let status_ref = unsent.status_ref().unwrap().clone();
    assert_eq!(text(&host.db(), "SELECT state FROM outbox"), "pending");
    assert_eq!(int(&host.db(), "SELECT attempt_count FROM outbox"), 1);
    assert!(host.service().tickets.is_empty());
    // The lease was given back: a worker takes it now, not after the lease ends.
    let worked = host.ledger.process(&status_ref, &ticket("k1", "acme-it")).unwrap();
    assert!(matches!(worked.outcome(), Outcome::Fresh(_)), "{worked:?}");
    assert_eq!(int(&host.db(), "SELECT attempt_count FROM outbox"), 2);
    assert!(toolledger::audit(host.db()).unwrap().passed());
}

#[test]
fn a_definite_refusal_fails_for_good_and_every_read_says_so() {
    let host = Host::new();
    host.service().closed_queues.push("acme-old".to_owned());
    let refused = host.ledger.dispatch(&ticket("k1", "acme-old")).unwrap();
    assert_eq!(blocked(refused.outcome()), BlockCode::DownstreamRefused);
    assert_eq!(refused.package()["status"], "failed");
    let status_ref: StatusRef = refused.status_ref().unwrap().clone();
    assert_eq!(
        (
            text(&host.db(), "SELECT status FROM operations"),
            text(&host.db(), "SELECT state FROM outbox")
        ),
        ("failed".to_owned(), "failed".to_owned())
    );
    assert_eq!(
        text(&host.db(), "SELECT reason FROM terminal_outcomes"),
        "queue acme-old is closed"
    );
    // The service reopening the queue changes nothing: failed is terminal.
    host.service().closed_queues.clear();
    let before = dump(&host.db());
    for reply in [
        host.ledger.dispatch(&ticket("k1", "acme-old")).unwrap(),
        host.ledger.process(&status_ref, &ticket("k1", "acme-old")).unwrap(),
        host.ledger.status(&ticket("k1", "acme-old"), &status_ref).unwrap(),
    ] {
        assert_eq!(blocked(reply.outcome()), BlockCode::DownstreamRefused);
    }
    // (The status query records its own call identity; nothing else changes.)
    let after: Vec<String> =
        dump(&host.db()).into_iter().filter(|row| !row.starts_with("call_identities")).collect();
    let before: Vec<String> =
        before.into_iter().filter(|row| !row.starts_with("call_identities")).collect();
    assert_eq!(after, before);
    assert!(host.service().tickets.is_empty());
    assert!(toolledger::audit(host.db()).unwrap().passed());
}

#[test]
fn a_receipt_breaking_the_contract_is_quarantined_and_the_audit_says_so() {
    let host = Host::new();
    host.service().garble_next = true;
    let garbled = host.ledger.dispatch(&ticket("k1", "acme-it")).unwrap();
    assert_eq!(blocked(garbled.outcome()), BlockCode::ReceiptQuarantined);
    let status_ref = garbled.status_ref().unwrap().clone();
    let kept: Value =
        serde_json::from_str(&text(&host.db(), "SELECT receipt_json FROM terminal_outcomes"))
            .unwrap();
    assert_eq!(kept["output"]["state"], "maybe-open");
    assert_eq!(
        text(&host.db(), "SELECT reason FROM terminal_outcomes"),
        "the receipt's output breaks the tool's output schema"
    );
    assert_eq!(int(&host.db(), "SELECT count(*) FROM local_receipts"), 0);
    for reply in [
        garbled,
        host.ledger.dispatch(&ticket("k1", "acme-it")).unwrap(),
        host.ledger.status(&ticket("k1", "acme-it"), &status_ref).unwrap(),
    ] {
        assert_eq!(blocked(reply.outcome()), BlockCode::ReceiptQuarantined);
        // The real reason, by kind: the output broke the schema (not a conflict).
        assert_eq!(reply.package()["reason"], "output_schema", "{:?}", reply.package());
    }
    let audit = toolledger::audit(host.db()).unwrap();
    assert!(!audit.passed());
    assert_eq!(
        audit.package()["findings"],
        json!([{"check": "operations_quarantined", "ref": status_ref.as_str()}])
    );
}

/// A host's downstream whose receipts carry their text as it chose to write it
/// (pretty-printed) instead of as `DownstreamReceipt::new` makes it.
struct HandBuilt(Tickets);

impl toolledger::Downstream for HandBuilt {
    fn identity(&self) -> &toolledger::DownstreamIdentity {
        self.0.identity()
    }

    fn execute(
        &self,
        request: &toolledger::DownstreamRequest,
        now: toolledger::Now,
    ) -> Result<toolledger::DownstreamReceipt, toolledger::DownstreamError> {
        let mut receipt = self.0.execute(request, now)?;
        receipt.receipt_json = serde_json::to_string_pretty(&receipt.receipt()).unwrap();
        Ok(receipt)
    }

    fn lookup(
        &self,
        request: &toolledger::DownstreamRequest,
    ) -> Result<toolledger::Lookup, toolledger::DownstreamError> {
        self.0.lookup(request)
    }
}

/// A receipt that is not its own canonical text is refused before anything of it is
/// written: a success is never answered that a later read would refuse. The operation
/// stays accepted and its outcome unknown, as for any receipt the ledger cannot trust.
#[test]
fn a_receipt_not_in_its_canonical_text_is_refused_before_it_is_written() {
    let dir = TempDir::new("hand-built");
    let service = Arc::new(Mutex::new(TicketService::default()));
    let db = dir.join("host.sqlite3");
    let ledger = Ledger::builder(&db)
        .tool(open_ticket())
        .open(HandBuilt(Tickets::new(Arc::clone(&service))), NoRoles)
        .unwrap();
    let reply = ledger.dispatch(&ticket("k1", "acme-it")).unwrap();
    assert!(matches!(reply.outcome(), Outcome::Unknown { .. }), "{:?}", reply.package());
    assert_eq!(int(&db, "SELECT count(*) FROM local_receipts"), 0);
    assert_eq!(int(&db, "SELECT count(*) FROM terminal_outcomes"), 0);
    assert_eq!(text(&db, "SELECT status FROM operations"), "processing");
    // The service did open the ticket: the operation is unknown, not failed.
    assert_eq!(service.lock().unwrap().tickets.len(), 1);
}

#[test]
fn the_simulation_refuses_a_hosts_operation_and_writes_nothing() {
    let host = Host::new();
    host.service().lose_next_response = true;
    let lost = host.ledger.dispatch(&ticket("k1", "acme-it")).unwrap();
    let status_ref = lost.status_ref().unwrap().clone();
    let before = dump(&host.db());
    let simulated = Ledger::builder(host.db()).tool(open_ticket()).open_simulated(NoRoles).unwrap();
    for reply in [
        simulated.process(&status_ref, &ticket("k1", "acme-it").at(1_767_229_999)).unwrap(),
        simulated.status(&ticket("k1", "acme-it"), &status_ref).unwrap(),
        simulated.dispatch(&ticket("k1", "acme-it")).unwrap(),
    ] {
        assert_eq!(blocked(reply.outcome()), BlockCode::DownstreamMismatch);
    }
    assert_eq!(dump(&host.db()), before);
}

fn refund(amount: i64) -> Call {
    Call::new(
        "refund_order",
        json!({"order_id": "ord-1", "amount_minor": amount, "currency": "USD", "reason": "damaged"}),
    )
    .principal("tenant-a", "user-1")
    .idempotency_key(&format!("refund-{amount}"))
    .model_call(ModelCall::new("openai", "responses", "openai-responses-2026-05", "resp-1", &format!("call-{amount}")))
    .context(json!({"orders": [{"order_id": "ord-1", "tenant_id": "tenant-a",
        "owner_subject_id": "user-1", "status": "paid", "amount_minor": 900_000, "currency": "USD"}]}))
    .at(1_767_225_600)
}

#[test]
fn an_approval_threshold_is_a_policy_and_the_library_binds_the_approval() {
    let dir = TempDir::new("approval");
    let ledger = Ledger::builder(dir.join("refunds.sqlite3"))
        .tool(RefundOrder { approval_threshold_minor: Some(10_000) }.tool())
        .open_simulated(NoRoles)
        .unwrap();
    // At or under the threshold: no approval needed, none stored.
    assert!(ledger.dispatch(&refund(10_000)).unwrap().outcome().is_done());
    // Above it: refused without one...
    let missing = ledger.dispatch(&refund(50_000)).unwrap();
    assert_eq!(blocked(missing.outcome()), BlockCode::ApprovalInvalid);
    // ... and done with one, bound to this exact call by the library.
    let grant = Grant {
        approval_id: "appr-1".to_owned(),
        approver_id: "lead-1".to_owned(),
        approved_at: 1_767_225_500,
        expires_at: 1_767_229_100,
    };
    let approved = ledger.dispatch(&refund(50_000).approval(grant.clone(), &["lead-1"])).unwrap();
    assert!(approved.outcome().is_done(), "{approved:?}");
    // An approver outside the tenant's policy is not one.
    let ineligible = ledger.dispatch(&refund(60_000).approval(grant, &["someone-else"])).unwrap();
    assert_eq!(blocked(ineligible.outcome()), BlockCode::ApprovalInvalid);
    let path = dir.join("refunds.sqlite3");
    assert_eq!(int(&path, "SELECT count(*) FROM operations WHERE approval_id IS NULL"), 1);
    assert_eq!(int(&path, "SELECT count(*) FROM operations WHERE approval_id = 'appr-1'"), 1);
    assert!(toolledger::audit(&path).unwrap().passed());
}

#[test]
fn a_ledger_moves_across_threads() {
    fn send<T: Send>() {}
    send::<Ledger<Tickets, NoRoles>>();
    send::<Ledger<toolledger::Simulated, NoRoles>>();
    send::<toolledger::Reply>();
}

#[test]
fn an_error_keeps_what_caused_it_as_its_source_and_out_of_its_message() {
    let dir = TempDir::new("error-source");
    let path = dir.join("not-a-ledger.sqlite3");
    std::fs::write(&path, vec![b'x'; 4096]).unwrap();
    let err = toolledger::audit(&path).unwrap_err();
    assert_eq!(err.code(), toolledger::ErrorCode::StoreError);
    assert_eq!(err.to_string(), "sqlite failed: the file is not a SQLite database");
    // Beneath it: the store's error, then SQLite's own, which names what SQLite saw.
    let mut chain = Vec::new();
    let mut next = std::error::Error::source(&err);
    while let Some(cause) = next {
        chain.push(cause.to_string());
        next = cause.source();
    }
    assert_eq!(chain.first().map(String::as_str), Some(err.to_string().as_str()), "{chain:?}");
    assert!(chain.iter().skip(1).any(|text| text.contains("not a database")), "{chain:?}");
}
