//! Several hosts, one PostgreSQL ledger: relays in separate processes, each with its own
//! connection pool, judging leases on the database's clock; killed at random; and a
//! worker whose database connection is terminated in the middle of a transaction.
//! Nothing accepted is lost, and no key is refunded twice.
//!
//! These tests make their own PostgreSQL ledger whatever `TOOLLEDGER_TEST_STORE` says:
//! several hosts are what the PostgreSQL store is for.

use std::{
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use toolledger_conformance::{Postgres, StoreUnderTest};

use crate::{
    Dir,
    http::{Refundd, with},
    liveness::Draw,
};

/// `toolledger --db URL <args>` in `dir` (the database's clock: no `--store-clock`).
fn on(dir: &Dir, db: &Postgres, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolledger"));
    command.current_dir(dir.path()).args(["--db", db.url()]).args(args);
    command
}

fn answer(command: &mut Command) -> (i32, Value) {
    let output = command.output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let value = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    (output.status.code().unwrap_or(-1), value)
}

/// Accepts `count` intents (commit A only), each under its own key and model call.
fn accept(dir: &Dir, db: &Postgres, count: usize, downstream: &[String]) {
    for n in 0..count {
        let name = format!("host-{n}.json");
        dir.write_case(&name, |case| {
            case["host_context"]["idempotency_key"] = Value::from(format!("hosts-{n}"));
            case["host_context"]["provider_call_id"] = Value::from(format!("call-hosts-{n}"));
        });
        let mut args =
            vec!["--fixture", name.as_str(), "dispatch", "--failure", "after_intent_commit"];
        args.extend(downstream.iter().map(String::as_str));
        let (code, value) = answer(&mut on(dir, db, &args));
        assert_eq!((code, value["code"].as_str()), (1, Some("OUTCOME_UNKNOWN")), "{value}");
    }
}

fn count(db: &Postgres, sql: &str) -> i64 {
    db.text(sql).parse().unwrap()
}

fn relay(dir: &Dir, db: &Postgres, service: &Refundd) -> Child {
    let args = with(
        service,
        &[
            "--fixture",
            "case.json",
            "relay",
            "--concurrency",
            "2",
            "--batch",
            "4",
            "--lease-seconds",
            "2",
            "--poll-ms",
            "20",
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    on(dir, db, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

#[test]
fn relays_on_several_hosts_killed_at_random_deliver_every_intent_once() {
    let mut draw = Draw::seeded("multihost", 20_261_201);
    let dir = Dir::new();
    let db = Postgres::fresh();
    let service = Refundd::start(&dir, &["--delay-ms", "5"]);
    let intents = 60;
    accept(&dir, &db, intents, &with(&service, &[]));

    // Four hosts' relays; at random instants one is SIGKILLed and another host starts.
    let mut relays: Vec<Child> = (0..4).map(|_| relay(&dir, &db, &service)).collect();
    let mut kills = 0;
    for _ in 0..12 {
        thread::sleep(Duration::from_millis(100 + draw.below(300)));
        let victim = usize::try_from(draw.below(4)).unwrap();
        let _ = relays[victim].kill();
        let _ = relays[victim].wait();
        kills += 1;
        relays[victim] = relay(&dir, &db, &service);
    }
    // The survivors drain the rest; leases of the killed ones end on the database's
    // clock (2 s) and are taken over.
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&db, "SELECT count(*) FROM operations WHERE status <> 'succeeded'") > 0 {
        assert!(Instant::now() < deadline, "the relays did not drain the ledger");
        thread::sleep(Duration::from_millis(100));
    }
    for relay in &mut relays {
        let _ = Command::new("kill").args(["-TERM", &relay.id().to_string()]).status();
    }
    for mut relay in relays {
        let _ = relay.wait();
    }

    let delivered = count(&db, "SELECT count(*) FROM local_receipts");
    let reclaims =
        count(&db, "SELECT coalesce(sum(value), 0) FROM counters WHERE name = 'lease_reclaims'");
    println!(
        "multihost: {intents} intents, 4 relays, {kills} kills, {reclaims} leases reclaimed, {delivered} delivered"
    );
    assert_eq!(delivered, i64::try_from(intents).unwrap());
    // One refund per key at the service: no second effect, however many took over.
    assert_eq!(service.refunds(), i64::try_from(intents).unwrap());
    let (code, audit) = answer(&mut on(&dir, &db, &["audit"]));
    assert_eq!(code, 0, "{audit}");
}

/// The backend pid of the toolledger session waiting for a lock, once there is one.
fn waiting_backend(db: &Postgres) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = db.rows(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'toolledger' \
             AND wait_event_type = 'Lock' AND datname = current_database()",
        );
        if let Some(pid) = rows.first().and_then(|row| row.first().cloned().flatten()) {
            return pid.parse().unwrap();
        }
        assert!(Instant::now() < deadline, "no toolledger session came to wait for the lock");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Holds the `counters` table so that the next claim blocks inside its transaction
/// (after it leased its events, before it commits), runs `step`, terminates the blocked
/// session's backend, and lets go.
fn terminated_mid_transaction(db: &Postgres, step: Command) -> std::process::Output {
    let mut holder = db.raw();
    let mut hold = holder.transaction().unwrap();
    hold.batch_execute("LOCK TABLE counters IN EXCLUSIVE MODE").unwrap();
    let mut step = step;
    let child = step.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = waiting_backend(db);
    let terminated: bool =
        db.raw().query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap().get(0);
    assert!(terminated);
    hold.rollback().unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_worker_whose_backend_is_terminated_mid_transaction_loses_nothing() {
    let dir = Dir::new();
    let db = Postgres::fresh();
    accept(&dir, &db, 5, &[]);

    // A relay's batch claim, cut off inside its transaction: nothing of it commits.
    let output = terminated_mid_transaction(
        &db,
        on(&dir, &db, &["--fixture", "case.json", "relay", "--once", "--log-format", "json"]),
    );
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(log.contains("STORE_ERROR"), "the relay's pass must fail: {log}");
    assert_eq!(
        count(&db, "SELECT count(*) FROM outbox WHERE state = 'pending' AND attempt_count = 0"),
        5
    );

    // A dispatch's commit A with its claim, cut off the same way: exit 2, nothing
    // accepted, and it can be dispatched again.
    dir.write_case("fresh.json", |case| {
        case["host_context"]["idempotency_key"] = Value::from("after-termination");
        case["host_context"]["provider_call_id"] = Value::from("call-after-termination");
    });
    let output =
        terminated_mid_transaction(&db, on(&dir, &db, &["--fixture", "fresh.json", "dispatch"]));
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("STORE_ERROR"), "{output:?}");
    assert_eq!(count(&db, "SELECT count(*) FROM operations"), 5);
    let (code, fresh) = answer(&mut on(&dir, &db, &["--fixture", "fresh.json", "dispatch"]));
    assert_eq!((code, fresh["delivery"].as_str()), (0, Some("fresh")), "{fresh}");

    // Another host's relay drains everything: one receipt per key, and the audit passes.
    let (code, drained) =
        answer(&mut on(&dir, &db, &["--fixture", "case.json", "relay", "--once"]));
    assert_eq!(code, 0, "{drained}");
    assert_eq!(drained["relay"]["delivered"], Value::from(5));
    assert_eq!(count(&db, "SELECT count(*) FROM local_receipts"), 6);
    assert_eq!(count(&db, "SELECT count(*) FROM downstream_receipts"), 6);
    let (code, audit) = answer(&mut on(&dir, &db, &["audit"]));
    assert_eq!(code, 0, "{audit}");
}
