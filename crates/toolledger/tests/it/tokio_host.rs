//! The async pattern: a tokio host moves its calls to `spawn_blocking`; the ledger is
//! `Send`, and many calls at once still make one effect each.

use std::sync::{Arc, Mutex};

use serde_json::json;
use toolledger::{Call, Ledger, ModelCall, NoRoles, Outcome, RefundOrder};

use crate::{TempDir, int};

/// Two paid orders of 1.00.
fn orders() -> Vec<serde_json::Value> {
    (0..2)
        .map(|n| {
            json!({"order_id": format!("ord-{n}"), "tenant_id": "tenant-a",
                "owner_subject_id": "user-1", "status": "paid", "amount_minor": 100, "currency": "USD"})
        })
        .collect()
}

#[test]
fn calls_from_a_tokio_runtime_run_on_the_blocking_pool() {
    let dir = TempDir::new("tokio");
    let path = dir.join("tokio.sqlite3");
    let ledger = Ledger::builder(&path)
        .tool(RefundOrder { approval_threshold_minor: Some(5_000) }.tool())
        .open_simulated(NoRoles)
        .unwrap();
    let ledger = Arc::new(Mutex::new(ledger));
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let outcomes = runtime.block_on(async {
        let mut tasks = Vec::new();
        // Eight tasks, two intents: each intent is made once, the rest replay.
        for task in 0..8 {
            let ledger = Arc::clone(&ledger);
            let order = task % 2;
            tasks.push(tokio::task::spawn_blocking(move || {
                let call = Call::new(
                    "refund_order",
                    json!({"order_id": format!("ord-{order}"), "amount_minor": 100, "currency": "USD", "reason": "damaged"}),
                )
                .principal("tenant-a", "user-1")
                .idempotency_key(&format!("refund-{order}"))
                .model_call(ModelCall::new("openai", "responses", "openai-responses-2026-05", "resp-1", &format!("call-{order}")))
                .context(json!({"orders": orders()}))
                .at(1_767_225_600);
                ledger.lock().unwrap().dispatch(&call).unwrap()
            }));
        }
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
        outcomes
    });
    let fresh =
        outcomes.iter().filter(|reply| matches!(reply.outcome(), Outcome::Fresh(_))).count();
    let replayed =
        outcomes.iter().filter(|reply| matches!(reply.outcome(), Outcome::Replayed(_))).count();
    assert_eq!((fresh, replayed), (2, 6));
    assert_eq!(int(&path, "SELECT count(*) FROM downstream_receipts"), 2);
}
