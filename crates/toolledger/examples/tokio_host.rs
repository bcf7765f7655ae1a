//! The pattern for a tokio host: the ledger is synchronous (SQLite, fsync) and `Send`,
//! so calls go to `spawn_blocking` and no runtime thread waits on the disk.
//!
//! Run it: `cargo run -p toolledger --example tokio_host`

use std::sync::{Arc, Mutex};

use serde_json::json;
use toolledger::{Call, Ledger, ModelCall, NoRoles, Outcome, RefundOrder};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("toolledger-tokio-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Refunds up to 50.00 need no approval; the simulated downstream stands in for a
    // payment API.
    let refunds = RefundOrder { approval_threshold_minor: Some(5_000) }.tool();
    let ledger = Arc::new(Mutex::new(
        Ledger::builder(dir.join("tokio.sqlite3")).tool(refunds).open_simulated(NoRoles)?,
    ));
    let orders = json!({"orders": (1..=4).map(|n| json!({"order_id": format!("ord-{n}"),
        "tenant_id": "tenant-a", "owner_subject_id": "user-1", "status": "paid",
        "amount_minor": 2599, "currency": "USD"})).collect::<Vec<_>>()});
    let call = move |n: u32| {
        Call::new(
            "refund_order",
            json!({"order_id": format!("ord-{n}"), "amount_minor": 2599,
                "currency": "USD", "reason": "damaged"}),
        )
        .principal("tenant-a", "user-1")
        .idempotency_key(&format!("refund-ord-{n}"))
        .model_call(ModelCall::new(
            "openai",
            "responses",
            "openai-responses-2026-05",
            "resp-1",
            &format!("call-{n}"),
        ))
        .context(orders.clone())
    };

    // Four model calls at once, each on the blocking pool; then the same four again.
    for round in ["fresh", "replayed"] {
        let mut tasks = Vec::new();
        for n in 1..=4 {
            let (ledger, call) = (Arc::clone(&ledger), call(n));
            tasks.push(tokio::task::spawn_blocking(move || {
                ledger
                    .lock()
                    .map_err(|_| "a poisoned ledger")?
                    .dispatch(&call)
                    .map_err(|err| err.to_string())
                    .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
            }));
        }
        for task in tasks {
            let reply = task.await?.map_err(|err| err.to_string())?;
            let expected = matches!(
                (round, reply.outcome()),
                ("fresh", Outcome::Fresh(_)) | ("replayed", Outcome::Replayed(_))
            );
            if !expected {
                return Err(format!("expected {round}, got {}", reply.canonical()).into());
            }
        }
        println!("4 calls, all {round}");
    }
    std::fs::remove_dir_all(dir)?;
    Ok(())
}
