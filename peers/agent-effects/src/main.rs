//! agent-effects 0.2 on the many-callers bench's work: `--tasks` tokio tasks on one
//! runtime and one SQLite store (the store's own `synchronous = FULL`), each running
//! `--calls` effects of fresh keys in turn, then the same keys again (replays). The
//! effect answers at once, as the toolledger side's downstream does. Prints one JSON
//! object: `fresh_per_s`, `replay_per_s`.
//!
//! Usage: `toolledger-peer-agent-effects --db PATH --tasks N --calls N --round R`

use std::{sync::Arc, time::Instant};

use agent_effects::{EffectFailure, EffectKind, EffectOutcome, Runtime};
use agent_effects_sqlite::SqliteStore;

fn arg(name: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|arg| arg == name).unwrap_or_else(|| panic!("{name} is needed"));
    args.get(at + 1).cloned().unwrap_or_else(|| panic!("{name} takes a value"))
}

#[tokio::main]
async fn main() {
    let (db, round) = (arg("--db"), arg("--round"));
    let tasks: usize = arg("--tasks").parse().expect("--tasks is a number");
    let calls: usize = arg("--calls").parse().expect("--calls is a number");
    let store = SqliteStore::open(&db).await.expect("the store opens");
    let runtime = Arc::new(Runtime::new(store));
    let pass = |label: &'static str| {
        let runtime = Arc::clone(&runtime);
        let round = round.clone();
        async move {
            let started = Instant::now();
            let handles: Vec<_> = (0..tasks)
                .map(|task| {
                    let (runtime, round) = (Arc::clone(&runtime), round.clone());
                    tokio::spawn(async move {
                        for n in 0..calls {
                            let key = format!("k-{round}-{task}-{n}");
                            let outcome = runtime
                                .effect("pay", key.as_str())
                                .kind(EffectKind::IrreversibleWrite)
                                .input(&serde_json::json!({"payer": "bob", "amount_minor": 100, "currency": "USD"}))
                                .run(|ctx| async move {
                                    Ok::<_, EffectFailure>(serde_json::json!({
                                        "payment_id": format!("pay-{}", ctx.idempotency_key()),
                                        "amount_minor": 100, "currency": "USD"}))
                                })
                                .await
                                .expect("the effect runs");
                            assert!(matches!(outcome, EffectOutcome::Committed(_)), "{label}: {outcome:?}");
                        }
                    })
                })
                .collect();
            for handle in handles {
                handle.await.expect("a task ends");
            }
            (tasks * calls) as f64 / started.elapsed().as_secs_f64()
        }
    };
    let fresh = pass("fresh").await;
    let replay = pass("replay").await;
    println!("{}", serde_json::json!({"fresh_per_s": fresh, "replay_per_s": replay}));
}
