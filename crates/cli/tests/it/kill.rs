//! Real crashes: `toolledger dispatch` processes killed with SIGKILL at spread-out
//! moments (before the store opens, inside commit A with its claim, B or C). After every
//! kill the ledger must audit clean and hold one of the crash table's states, and
//! driving the same call on to the end must give exactly one downstream receipt per
//! key: never a second side effect, never a guess.

use std::{process::Stdio, thread, time::Duration};

use serde_json::Value;

use crate::Dir;

const LATER: &str = "1767225700"; // past every lease the killed processes could hold

#[test]
fn sigkill_at_any_moment_leaves_a_ledger_that_audits_clean_and_recovers() {
    let dir = Dir::new();
    // A store exists before the first kill, so every kill lands on a real ledger.
    assert_eq!(dir.run(&["--fixture", "case.json", "dispatch"]).code, 0);
    let mut delay_us: u64 = 0;
    let kills = 30;
    let mut seen = std::collections::BTreeMap::new();
    for round in 0..kills {
        let name = format!("kill-{round}.json");
        dir.write_case(&name, |case| {
            case["host_context"]["idempotency_key"] = Value::from(format!("kill-key-{round}"));
            // Each intent is its own model call: one call is one intent.
            case["host_context"]["provider_call_id"] = Value::from(format!("call-kill-{round}"));
        });
        let mut child = dir
            .command(&["--fixture", &name, "dispatch"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Spread the kills from before the store opens to after the process is done
        // (a debug build takes ~6 ms for the whole dispatch, a release build ~3 ms).
        delay_us = (delay_us + 499) % 15_000;
        thread::sleep(Duration::from_micros(delay_us));
        let _ = child.kill();
        let _ = child.wait();

        let audit = dir.run(&["audit"]);
        assert_eq!(audit.code, 0, "round {round}, killed after {delay_us}us: {}", audit.stdout);
        // What the kill left is a row of the crash table. Dispatch takes its lease in
        // commit A, so an accepted intent is never left pending by a killed dispatch.
        let left = dir.db_text(&format!(
            "SELECT coalesce((SELECT o.status || '/' || b.state || '/' || b.attempt_count || '/' || \
             (SELECT count(*) FROM downstream_receipts d WHERE d.downstream_request_ref = o.downstream_request_ref) \
             FROM operations o JOIN outbox b ON b.op_id = o.id WHERE o.idempotency_key = 'kill-key-{round}'), 'none')"
        ));
        assert!(
            [
                "none",
                "processing/processing/1/0",
                "processing/processing/1/1",
                "succeeded/delivered/1/1"
            ]
            .contains(&left.as_str()),
            "round {round}: {left}"
        );
        *seen.entry(left).or_insert(0) += 1;

        // Whatever the kill left, the call can be driven to its end without a guess.
        let again = dir.run(&["--fixture", &name, "dispatch"]);
        match again.text("/code").as_str() {
            "OK" => {}
            "OUTCOME_UNKNOWN" => {
                let ended = dir.recover(&name, &again.text("/status_ref"), LATER);
                assert_eq!(ended.text("/code"), "OK", "round {round}: {ended:?}");
            }
            other => panic!("round {round}: re-dispatch answered {other}: {again:?}"),
        }
        assert_eq!(dir.run(&["--fixture", &name, "dispatch"]).text("/delivery"), "local_replay");
    }
    println!("states the kills left: {seen:?}");
    // One operation, one side effect, one local receipt per key.
    let keys = i64::from(kills) + 1;
    assert_eq!(dir.db_int("SELECT count(*) FROM operations"), keys);
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), keys);
    assert_eq!(dir.db_int("SELECT count(*) FROM local_receipts"), keys);
    let audit = dir.run(&["audit"]);
    assert_eq!(
        (audit.code, audit.answer()["unreconciled_downstream_receipts"].clone()),
        (0, Value::Array(vec![]))
    );
}
