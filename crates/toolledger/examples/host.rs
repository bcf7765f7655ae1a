//! An agent host embedding toolledger with its own tool and its own downstream.
//!
//! The host registers `open_ticket` (its own schemas and rules, no approval) and plugs
//! in its ticket service's client. Then the story a host lives through:
//! a call done, the model's retry replayed, a response lost after the service committed
//! (unknown, then a status query reconciles it), a definite refusal (`failed`), and a
//! receipt that breaks the tool's contract (`quarantined`). Every step is checked; the
//! example exits non-zero if any behaves otherwise.
//!
//! Run it: `cargo run -p toolledger --example host`

#[path = "tickets/mod.rs"]
mod tickets;

use std::sync::{Arc, Mutex};

use toolledger::{BlockCode, Ledger, NoRoles, Outcome};

use crate::tickets::{TicketService, Tickets, open_ticket, ticket_call};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("toolledger-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let service = Arc::new(Mutex::new(TicketService::default()));
    let ledger = Ledger::builder(dir.join("host.sqlite3"))
        .tool(open_ticket())
        .open(Tickets::new(Arc::clone(&service)), NoRoles)?;

    // One model call per intent: the model's call id, the host's key.
    let call = |key: &str, queue: &str| ticket_call(key, queue, "high");

    // 1. Done, then the model retries: the same ticket, not a second one.
    let first = ledger.dispatch(&call("t-1", "acme-billing"))?;
    let Outcome::Fresh(receipt) = first.outcome() else { return fail("fresh", &first) };
    println!("1. fresh: {}", receipt.output());
    let retry = ledger.dispatch(&call("t-1", "acme-billing"))?;
    let Outcome::Replayed(again) = retry.outcome() else { return fail("replayed", &retry) };
    assert_eq!(again.output(), receipt.output());
    println!("2. replayed: the same ticket, {}", again.output()["ticket_id"]);

    // 2. The service commits, the response is lost: unknown, never guessed.
    service.lock().expect("lock").lose_next_response = true;
    let lost = ledger.dispatch(&call("t-2", "acme-billing"))?;
    let Outcome::Unknown { status_ref } = lost.outcome() else { return fail("unknown", &lost) };
    println!("3. unknown: query {status_ref}");
    let settled = ledger.status(&call("t-2", "acme-billing"), status_ref)?;
    let Outcome::Reconciled(reconciled) = settled.outcome() else {
        return fail("reconciled", &settled);
    };
    println!("4. reconciled: {}", reconciled.output()["ticket_id"]);

    // 3. A definite refusal: failed for good, answered the same way every time.
    service.lock().expect("lock").closed_queues.push("acme-archive".to_owned());
    for attempt in 0..2 {
        let refused = ledger.dispatch(&call("t-3", "acme-archive"))?;
        let Outcome::Blocked { code: BlockCode::DownstreamRefused, .. } = refused.outcome() else {
            return fail("refused", &refused);
        };
        println!("5.{attempt} refused: {}", refused.package()["status"]);
    }

    // 4. A receipt that breaks the output contract: quarantined, and the audit says so.
    service.lock().expect("lock").garble_next = true;
    let garbled = ledger.dispatch(&call("t-4", "acme-billing"))?;
    let Outcome::Blocked { code: BlockCode::ReceiptQuarantined, .. } = garbled.outcome() else {
        return fail("quarantined", &garbled);
    };
    let audit = toolledger::audit(dir.join("host.sqlite3"))?;
    assert!(!audit.passed());
    println!("6. quarantined; the audit lists it: {}", audit.package()["findings"]);

    // One ticket per accepted intent that reached the service; none twice.
    assert_eq!(service.lock().expect("lock").tickets.len(), 3);
    std::fs::remove_dir_all(dir)?;
    println!("every step behaved");
    Ok(())
}

fn fail(expected: &str, reply: &toolledger::Reply) -> Result<(), Box<dyn std::error::Error>> {
    Err(format!("expected {expected}, got {}", reply.canonical()).into())
}
