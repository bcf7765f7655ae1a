//! Liveness over real processes: 500 intents accepted with random failure points, four
//! relay processes against a simulation that is randomly unavailable and slow, random
//! SIGKILLs, then relays with --once until nothing is due. Every event must end
//! delivered, failed or dead; no key may have two downstream receipts; the audit must
//! pass; `metrics` must agree with `list`. Seeded (TOOLLEDGER_SEED), the seed printed.

use std::{
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use serde_json::Value;

use crate::{
    Dir,
    operators::{listed, promtool, samples},
};

const T: i64 = 1_767_225_600;

/// xorshift64*: a small, seeded, reproducible stream.
pub(crate) struct Draw(pub(crate) u64);

impl Draw {
    /// The stream of `TOOLLEDGER_SEED`, or of `default`; the seed is printed so that a
    /// failing `test` can be rerun exactly.
    pub(crate) fn seeded(test: &str, default: u64) -> Draw {
        let seed: u64 = std::env::var("TOOLLEDGER_SEED")
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(default);
        println!("{test} seed {seed} (rerun with TOOLLEDGER_SEED={seed})");
        Draw(seed | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

fn relay(dir: &Dir, now: i64, seed: u64, once: bool) -> Child {
    let (now, seed) = (now.to_string(), seed.to_string());
    let mut args = vec![
        "--fixture",
        "case.json",
        "relay",
        "--concurrency",
        "2",
        "--batch",
        "16",
        "--poll-ms",
        "20",
        "--max-attempts",
        "3",
        "--simulate-unavailable",
        "30",
        "--simulate-delay-ms",
        "1",
        "--simulate-seed",
        &seed,
        "--now",
        &now,
    ];
    if once {
        args.push("--once");
    }
    dir.command(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

#[test]
fn every_accepted_intent_ends_delivered_failed_or_dead_under_kills() {
    let mut draw = Draw::seeded("liveness", 20_261_130);
    let seed = draw.0;
    let dir = Dir::new();
    let intents: i64 = 500;
    for n in 0..intents {
        let name = format!("l-{n}.json");
        dir.write_case(&name, |case| {
            case["host_context"]["idempotency_key"] = Value::from(format!("live-{n}"));
            case["host_context"]["provider_call_id"] = Value::from(format!("call-live-{n}"));
        });
        let failure = ["", "after_intent_commit", "after_claim", "after_downstream_commit"]
            [usize::try_from(draw.below(4)).unwrap()];
        let mut args = vec!["--fixture", name.as_str(), "dispatch"];
        if !failure.is_empty() {
            args.extend_from_slice(&["--failure", failure]);
        }
        let run = dir.run(&args);
        assert!(run.code == 0 || run.text("/code") == "OUTCOME_UNKNOWN", "{run:?}");
    }

    // Rounds of four relays, some killed at random instants; each round judged 100 s
    // after the last, so killed workers' leases (30 s) and backoffs have run out.
    let mut kills = 0;
    for round in 1..=6_i64 {
        let mut relays: Vec<Child> = (0..4)
            .map(|index| relay(&dir, T + 100 * round, seed + round as u64 * 10 + index, false))
            .collect();
        thread::sleep(Duration::from_millis(50 + draw.below(250)));
        for child in &mut relays {
            let signal = if draw.below(2) == 0 { "-KILL" } else { "-TERM" };
            kills += usize::from(signal == "-KILL");
            let _ = Command::new("kill").args([signal, &child.id().to_string()]).status();
        }
        for mut child in relays {
            let _ = child.wait();
        }
    }

    // Then relays with --once, later and later, until nothing is left to do.
    let mut now = T + 1_000;
    for _ in 0..10 {
        let status = relay(&dir, now, seed + now as u64, true).wait().unwrap();
        assert_eq!(status.code(), Some(0));
        if dir.db_int("SELECT count(*) FROM operations WHERE status IN ('pending', 'processing')")
            == 0
        {
            break;
        }
        now += 1_000;
    }

    let count = |status: &str| {
        dir.db_int(&format!("SELECT count(*) FROM operations WHERE status = '{status}'"))
    };
    let (delivered, failed, dead) = (count("succeeded"), count("failed"), count("dead"));
    let duplicates = dir.db_int(
        "SELECT count(*) FROM (SELECT downstream_request_ref FROM downstream_receipts GROUP BY 1 HAVING count(*) > 1) AS doubled",
    );
    println!(
        "liveness: intents={intents} kills={kills} delivered={delivered} failed={failed} dead={dead} duplicates={duplicates}"
    );
    assert_eq!(delivered + failed + dead, intents, "an event did not end");
    assert_eq!(duplicates, 0);
    // One downstream receipt per delivered operation, and none for the dead.
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), delivered);
    assert_eq!(dir.db_int("SELECT count(*) FROM local_receipts"), delivered);
    assert!(dead > 0, "max_attempts 3 at 30% unavailable should kill some events");
    assert_eq!(dir.run(&["audit"]).code, 0);
    let metrics = dir.run(&["metrics", "--now", &now.to_string()]).stdout;
    promtool(&metrics);
    let by_state = samples(&metrics, "toolledger_operations");
    let listed = listed(&dir, now);
    for (state, count) in &by_state {
        assert_eq!(listed.get(state).copied().unwrap_or(0), *count, "{state}");
    }
}

/// Polls `list --state STATE` (the wall clock) until it lists `count` operations, for at
/// most `bound`; what it listed last.
fn listed_within(dir: &Dir, state: &str, count: usize, bound: Duration) -> Vec<Value> {
    let started = std::time::Instant::now();
    loop {
        let run = dir.run(&["list", "--state", state]);
        let lines: Vec<Value> =
            run.stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        if lines.len() == count || started.elapsed() > bound {
            return lines;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// A running relay whose call ended unknown (the answer dropped after the service
/// committed) sets the attempt aside and asks again after a backoff, while it still
/// runs: its heartbeat renews only calls in flight. Before, the heartbeat renewed the
/// lease for as long as the relay lived, so nobody asked (here the lease is 60 s, far
/// past the test's bound, so only the re-ask can settle it).
#[test]
fn a_running_relay_asks_again_about_an_answer_it_lost() {
    let dir = Dir::new();
    let service = crate::http::Refundd::start(&dir, &[]);
    let url = service.base.clone();
    let accepted = dir.run(&[
        "--fixture",
        "case.json",
        "dispatch",
        "--failure",
        "after_intent_commit",
        "--downstream",
        &url,
    ]);
    assert_eq!(accepted.text("/code"), "OUTCOME_UNKNOWN", "{accepted:?}");
    service.faults(&serde_json::json!({"drop_next": 1}));
    let mut relay = dir
        .command(&[
            "--fixture",
            "case.json",
            "relay",
            "--poll-ms",
            "50",
            "--lease-seconds",
            "60",
            "--downstream",
            &url,
            "--downstream-timeout-ms",
            "3000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let succeeded = listed_within(&dir, "succeeded", 1, Duration::from_secs(30));
    stop(&mut relay);
    assert_eq!(succeeded.len(), 1, "not settled while the relay ran");
    assert_eq!(service.refunds(), 1, "asked again, never sent twice");
    assert_eq!(dir.run(&["audit"]).code, 0);
}

/// A running relay whose business recheck refuses an operation sets it aside: nobody is
/// working it, so `list` shows it `unknown` with the reason, and a later pass rechecks
/// it. Before, the heartbeat kept its lease live, and it showed as `processing`.
#[test]
fn a_running_relay_shows_what_its_recheck_refused_as_unknown() {
    let dir = Dir::new();
    let accepted =
        dir.run(&["--fixture", "case.json", "dispatch", "--failure", "after_intent_commit"]);
    assert_eq!(accepted.text("/code"), "OUTCOME_UNKNOWN", "{accepted:?}");
    dir.write_case("refunded.json", |case| {
        case["business_state"]["orders"][0]["status"] = Value::from("refunded");
    });
    let mut relay = dir
        .command(&[
            "--fixture",
            "refunded.json",
            "relay",
            "--poll-ms",
            "50",
            "--lease-seconds",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let unknown = listed_within(&dir, "unknown", 1, Duration::from_secs(15));
    let metrics = dir.run(&["metrics"]).stdout;
    stop(&mut relay);
    assert_eq!(unknown.len(), 1, "not shown as unknown while the relay ran");
    assert!(unknown[0]["last_reason"].as_str().is_some_and(|reason| !reason.is_empty()));
    assert_eq!(samples(&metrics, "toolledger_operations")["unknown"], 1);
    assert_eq!(dir.run(&["audit"]).code, 0);
}

/// SIGTERM, then the exit within a bound.
fn stop(relay: &mut Child) {
    crate::sigterm(relay, Duration::from_secs(10));
}

/// Runs `toolledger ARGS` against the ledger at `db` with a 2 s wait bound; the run and
/// how long it took.
fn bounded(dir: &Dir, db: &str, args: &[&str]) -> (crate::Run, Duration) {
    let mut all = vec!["--db", db, "--busy-timeout-ms", "2000"];
    all.extend_from_slice(args);
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolledger"));
    command.current_dir(dir.path()).args(&all);
    let started = std::time::Instant::now();
    let run = crate::finish(command);
    (run, started.elapsed())
}

/// Every wait on PostgreSQL has a bound, as on SQLite: against a server that was stopped
/// (`SIGSTOP`: it accepts connections and says nothing), and against a port that accepts
/// and never answers, `list` and `dispatch` answer `STORE_ERROR` within the wait bound
/// and a little (before: they waited past 30 s whatever `--busy-timeout-ms` said), and
/// nothing is accepted; once the server runs again, they work.
#[test]
fn a_stopped_postgres_server_is_answered_within_the_bound() {
    let dir = Dir::new();
    let cluster = toolledger_testkit::cluster::Cluster::start().unwrap();
    let db = cluster.url();
    let (created, _) = bounded(&dir, &db, &["--case", "case.json", "dispatch"]);
    assert_eq!(created.code, 0, "{created:?}");
    let postmaster = std::fs::read_to_string(cluster.dir().unwrap().join("data/postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_owned();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_db = format!("postgres://postgres@{}/none", silent.local_addr().unwrap());
    let holder = thread::spawn(move || {
        let held: Vec<_> = silent.incoming().take(4).collect();
        thread::sleep(Duration::from_secs(20));
        drop(held);
    });
    assert!(Command::new("kill").args(["-STOP", &postmaster]).status().unwrap().success());
    let mut answers = Vec::new();
    for target in [&db, &silent_db] {
        for args in [&["list"][..], &["--case", "case.json", "dispatch"]] {
            answers.push(bounded(&dir, target, args));
        }
    }
    assert!(Command::new("kill").args(["-CONT", &postmaster]).status().unwrap().success());
    for (run, waited) in &answers {
        run.assert_error("STORE_ERROR");
        assert!(*waited < Duration::from_secs(10), "{waited:?}: {run:?}");
    }
    let (listed, _) = bounded(&dir, &db, &["list"]);
    assert_eq!((listed.code, listed.stdout.lines().count()), (0, 1), "{listed:?}");
    let (replayed, _) = bounded(&dir, &db, &["--case", "case.json", "dispatch"]);
    assert_eq!(replayed.text("/delivery"), "local_replay", "{replayed:?}");
    drop(holder);
}
