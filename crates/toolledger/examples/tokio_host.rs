//! A tokio host: one ledger shared by every task, an async downstream run on the
//! host's runtime, and the `*_async` call paths, whose disk work never blocks a
//! runtime thread. No `spawn_blocking`, no `Mutex` around the ledger.
//!
//! Run it: `cargo run -p toolledger --example tokio_host`

use std::{collections::HashMap, sync::Mutex};

use serde_json::json;
use toolledger::{
    AsyncDownstream, Call, DownstreamError, DownstreamIdentity, DownstreamReceipt,
    DownstreamRequest, Ledger, Lookup, ModelCall, NoRoles, Now, Outcome, RefundOrder,
};

/// The host's refund client. A real one sends `request.downstream_request_ref` as the
/// service's idempotency key over its async HTTP client; this one keeps the refunds in
/// memory, one per key.
struct Refunds {
    identity: DownstreamIdentity,
    done: Mutex<HashMap<String, serde_json::Value>>,
}

impl AsyncDownstream for Refunds {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    async fn execute(
        &self,
        request: &DownstreamRequest,
        _now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let key = request.downstream_request_ref.as_str().to_owned();
        let mut done = self.done.lock().map_err(|_| DownstreamError::Unknown {
            reason: "the client's state is poisoned".to_owned(),
        })?;
        let count = done.len();
        let refund = done.entry(key).or_insert_with(|| {
            json!({"refund_id": format!("rf_{:032x}", count + 1),
                "order_id": request.arguments["order_id"],
                "amount_minor": request.arguments["amount_minor"],
                "currency": request.arguments["currency"], "status": "refunded"})
        });
        Ok(request.receipt(refund.clone()))
    }

    async fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        let done = self.done.lock().map_err(|_| DownstreamError::Unknown {
            reason: "the client's state is poisoned".to_owned(),
        })?;
        Ok(match done.get(request.downstream_request_ref.as_str()) {
            Some(refund) => Lookup::Done(request.receipt(refund.clone())),
            None => Lookup::NotFound,
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("toolledger-tokio-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Refunds up to 50.00 need no approval.
    let refunds = RefundOrder { approval_threshold_minor: Some(5_000) }.tool();
    let client = Refunds {
        identity: DownstreamIdentity::new("refunds", "1")?,
        done: Mutex::new(HashMap::new()),
    };
    let ledger =
        Ledger::builder(dir.join("tokio.sqlite3")).tool(refunds).open_async(client, NoRoles)?;
    let orders = json!({"orders": (1..=4).map(|n| json!({"order_id": format!("ord-{n}"),
        "tenant_id": "tenant-a", "owner_subject_id": "user-1", "status": "paid",
        "amount_minor": 2599, "currency": "USD"})).collect::<Vec<_>>()});
    let call = |n: u32| {
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

    // Four model calls at once, as tasks on one ledger; then the same four again.
    for round in ["fresh", "replayed"] {
        let tasks: Vec<_> =
            (1..=4).map(|n| tokio::spawn(ledger.dispatch_async(&call(n)))).collect();
        for task in tasks {
            let reply = task.await??;
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
