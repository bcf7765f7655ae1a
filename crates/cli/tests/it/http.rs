//! Two real processes on loopback: `toolledger` with `--downstream` against the reference
//! refund service `toolledger-refundd`, each fault the draft and the network can produce.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use serde_json::{Value, json};

use crate::Dir;

const T: i64 = 1_767_225_600;

/// The reference service in its own process, with its own file; killed when dropped.
pub(crate) struct Refundd {
    child: Child,
    pub(crate) base: String,
    db: PathBuf,
}

impl Refundd {
    pub(crate) fn start(dir: &Dir, extra: &[&str]) -> Refundd {
        // The service is its own package's binary, built beside this one.
        let binary =
            PathBuf::from(env!("CARGO_BIN_EXE_toolledger")).with_file_name("toolledger-refundd");
        assert!(
            binary.exists(),
            "toolledger-refundd is not built: `cargo build -p toolledger-refundd` (cargo xtask ci builds it)"
        );
        let db = dir.join("refunds.sqlite3");
        let mut child = Command::new(binary)
            .args(["--listen", "127.0.0.1:0", "--db"])
            .arg(&db)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Refundd { base: crate::listening_base(&mut child), child, db }
    }

    /// Refunds in the service's own store.
    pub(crate) fn refunds(&self) -> i64 {
        rusqlite::Connection::open(&self.db)
            .unwrap()
            .query_row("SELECT count(*) FROM refunds", [], |row| row.get(0))
            .unwrap()
    }

    pub(crate) fn faults(&self, faults: &Value) {
        let response = ureq::post(format!("{}/admin/faults", self.base)).send(faults.to_string());
        assert_eq!(response.unwrap().status().as_u16(), 200);
    }
}

impl Drop for Refundd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn with(service: &Refundd, args: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    all.extend([
        "--downstream".to_owned(),
        service.base.clone(),
        "--downstream-timeout-ms".to_owned(),
        "3000".to_owned(),
    ]);
    all
}

fn run(dir: &Dir, args: &[String]) -> crate::Run {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    dir.run(&args)
}

#[test]
fn a_dropped_answer_is_unknown_then_reconciled_with_one_refund() {
    let dir = Dir::new();
    let service = Refundd::start(&dir, &[]);
    service.faults(&json!({"drop_next": 1}));
    let lost = run(&dir, &with(&service, &["--fixture", "case.json", "dispatch"]));
    assert_eq!((lost.code, lost.text("/code")), (1, "OUTCOME_UNKNOWN".to_owned()), "{lost:?}");
    assert_eq!(service.refunds(), 1, "the service committed");
    let status_ref = lost.text("/status_ref");
    let settled = run(
        &dir,
        &with(&service, &["--fixture", "case.json", "status", "--status-ref", &status_ref]),
    );
    assert_eq!(
        (settled.code, settled.text("/delivery")),
        (0, "receipt_reconciled".to_owned()),
        "{settled:?}"
    );
    // A retry replays; nothing reaches the service twice.
    let again = run(&dir, &with(&service, &["--fixture", "case.json", "dispatch"]));
    assert_eq!((again.code, again.text("/delivery")), (0, "local_replay".to_owned()), "{again:?}");
    assert_eq!(service.refunds(), 1);
    assert_eq!(dir.run(&["audit"]).code, 0);
}

#[test]
fn a_client_killed_between_the_services_commit_and_its_receipt_leaves_one_refund() {
    let dir = Dir::new();
    let service = Refundd::start(&dir, &["--answer-delay-ms", "5000"]);
    let args = with(&service, &["--fixture", "case.json", "dispatch"]);
    let mut client = dir.command(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut client = client.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // Wait until the service has committed, then kill -9 the client before its commit C.
    for _ in 0..500 {
        if service.refunds() == 1 {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(service.refunds(), 1);
    let _ = Command::new("kill").args(["-KILL", &client.id().to_string()]).status();
    let _ = client.wait();
    assert_eq!(dir.db_int("SELECT count(*) FROM local_receipts"), 0);
    let status_ref = dir.db_text("SELECT status_ref FROM operations");
    // A worker after the lease: the service is asked by key, and answers the refund.
    let later = (T + 120).to_string();
    let worked = run(
        &dir,
        &with(
            &service,
            &["--fixture", "case.json", "process", "--status-ref", &status_ref, "--now", &later],
        ),
    );
    assert_eq!(worked.code, 0, "{worked:?}");
    assert_eq!(service.refunds(), 1);
    assert_eq!(dir.db_int("SELECT count(*) FROM local_receipts"), 1);
    assert_eq!(dir.run(&["audit"]).code, 0);
}

#[test]
fn eight_hosts_one_key_in_flight_make_one_refund() {
    // Eight hosts, each with its own ledger, dispatch the same call: one is sent while the
    // others hear 409 (in flight) and keep it pending; each worker then gets the one refund.
    let dir = Dir::new();
    let service = Refundd::start(&dir, &["--delay-ms", "700"]);
    let hosts: Vec<String> = (0..8).map(|host| format!("host-{host}.sqlite3")).collect();
    let answers: Vec<crate::Run> = thread::scope(|scope| {
        let handles: Vec<_> = hosts
            .iter()
            .map(|db| {
                let (dir, service) = (&dir, &service);
                scope.spawn(move || {
                    run(dir, &with(service, &["--db", db, "--fixture", "case.json", "dispatch"]))
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    let fresh = answers.iter().filter(|run| run.code == 0).count();
    let in_flight =
        answers.iter().filter(|run| run.text("/code") == "DOWNSTREAM_UNAVAILABLE").count();
    assert_eq!((fresh, in_flight), (1, 7), "{answers:?}");
    for (db, answer) in hosts.iter().zip(&answers) {
        if answer.code == 0 {
            continue;
        }
        let status_ref = answer.text("/status_ref");
        let worked = run(
            &dir,
            &with(
                &service,
                &["--db", db, "--fixture", "case.json", "process", "--status-ref", &status_ref],
            ),
        );
        assert_eq!(worked.code, 0, "{worked:?}");
    }
    assert_eq!(service.refunds(), 1);
}

#[test]
fn a_forged_request_under_the_same_key_is_refused_and_never_retried_under_another() {
    let dir = Dir::new();
    let service = Refundd::start(&dir, &[]);
    let first = run(&dir, &with(&service, &["--fixture", "case.json", "dispatch"]));
    assert_eq!(first.code, 0, "{first:?}");
    let key = dir.db_text("SELECT downstream_request_ref FROM operations");
    // Someone else sends another payload under the ledger's key: 422.
    let forged = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent()
        .post(format!("{}/refunds", service.base))
        .header("Idempotency-Key", format!("\"{key}\""))
        .send(
            json!({"arguments": {"order_id": "ord-x", "amount_minor": 1, "currency": "USD"}})
                .to_string(),
        )
        .unwrap();
    assert_eq!(forged.status().as_u16(), 422);
    assert_eq!(service.refunds(), 1);

    // A ledger whose key someone else took first: the service answers 422 and toolledger
    // never sends the intent under another key.
    dir.write_case("second.json", |case| {
        case["host_context"]["idempotency_key"] = Value::from("taken-key");
        case["host_context"]["provider_call_id"] = Value::from("call-taken");
    });
    let accepted = run(
        &dir,
        &with(
            &service,
            &["--fixture", "second.json", "dispatch", "--failure", "after_intent_commit"],
        ),
    );
    let status_ref = accepted.text("/status_ref");
    let key = dir.db_text(&format!(
        "SELECT downstream_request_ref FROM operations WHERE status_ref = '{status_ref}'"
    ));
    let squatted = ureq::post(format!("{}/refunds", service.base))
        .header("Idempotency-Key", format!("\"{key}\""))
        .send(
            json!({"arguments": {"order_id": "ord-x", "amount_minor": 1, "currency": "USD"}})
                .to_string(),
        )
        .unwrap();
    assert_eq!(squatted.status().as_u16(), 201);
    let refused = run(
        &dir,
        &with(&service, &["--fixture", "second.json", "process", "--status-ref", &status_ref]),
    );
    println!("conflict: {refused:?}");
    assert_eq!(service.refunds(), 2, "one real refund and the squatter's");
    // The reply names the quarantine's real reason: a fingerprint conflict, not a
    // broken output contract.
    assert_eq!(refused.text("/code"), "RECEIPT_QUARANTINED", "{refused:?}");
    assert_eq!(refused.text("/reason"), "fingerprint_conflict");
}

#[test]
fn the_relay_drains_five_hundred_events_through_drops_delays_and_5xx() {
    // 10% of requests commit and lose their answer, 10% answer 503 before committing,
    // and each is held a random 0-20 ms (seeded: the run replays).
    let dir = Dir::new();
    let service = Refundd::start(
        &dir,
        &[
            "--drop-percent",
            "10",
            "--fail-percent",
            "10",
            "--jitter-ms",
            "20",
            "--seed",
            "20261130",
        ],
    );
    let intents: i64 = 500;
    for n in 0..intents {
        let name = format!("h-{n}.json");
        dir.write_case(&name, |case| {
            case["host_context"]["idempotency_key"] = Value::from(format!("http-{n}"));
            case["host_context"]["provider_call_id"] = Value::from(format!("call-http-{n}"));
        });
        let run = run(
            &dir,
            &with(&service, &["--fixture", &name, "dispatch", "--failure", "after_intent_commit"]),
        );
        assert_eq!(run.text("/code"), "OUTCOME_UNKNOWN", "{run:?}");
    }
    let mut now = T + 100;
    for _ in 0..10 {
        let now_text = now.to_string();
        let relay = run(
            &dir,
            &with(
                &service,
                &[
                    "--fixture",
                    "case.json",
                    "relay",
                    "--once",
                    "--concurrency",
                    "4",
                    "--batch",
                    "16",
                    "--max-attempts",
                    "3",
                    "--now",
                    &now_text,
                ],
            ),
        );
        assert_eq!(relay.code, 0, "{relay:?}");
        if dir.db_int("SELECT count(*) FROM operations WHERE status IN ('pending', 'processing')")
            == 0
        {
            break;
        }
        now += 100;
    }
    let count = |status: &str| {
        dir.db_int(&format!("SELECT count(*) FROM operations WHERE status = '{status}'"))
    };
    let (delivered, failed, dead) = (count("succeeded"), count("failed"), count("dead"));
    let reclaims =
        dir.db_int("SELECT coalesce(sum(value), 0) FROM counters WHERE name = 'lease_reclaims'");
    println!(
        "http relay: intents={intents} delivered={delivered} failed={failed} dead={dead} refunds={} lease_reclaims={reclaims}",
        service.refunds()
    );
    assert!(reclaims > 0, "no answer was lost: the faults did not fire");
    assert_eq!(delivered + failed + dead, intents);
    assert_eq!(service.refunds(), delivered, "refunds in the service's store = delivered events");
    assert_eq!(dir.run(&["audit"]).code, 0);
}
