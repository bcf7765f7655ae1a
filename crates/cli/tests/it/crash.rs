//! The crash campaign (`cargo xtask crash`): rounds of real `toolledger` processes —
//! dispatch, enqueue, process, status and relay — racing on one ledger while a
//! supervisor stops them: some by `SIGKILL` at a random instant, some right after
//! their Nth commit (`TOOLLEDGER_CRASH_AFTER_COMMIT`, group commits included). After
//! every round the public recovery path alone (relay `--once`, status, process) drives
//! every accepted intent to its end, and the campaign checks:
//!
//! - the audit passes;
//! - every accepted intent ended (succeeded, failed, quarantined or dead), nothing left
//!   pending or processing;
//! - no key has two downstream effects and no effect lacks its intent;
//! - every acknowledged answer (exit 0, or `OUTCOME_UNKNOWN` naming a `status_ref`) is
//!   still what the ledger holds.
//!
//! Everything random comes from one seed: `TOOLLEDGER_CRASH_SEED` (default
//! [`DEFAULT_SEED`]), `TOOLLEDGER_CRASH_ROUNDS` (default 2, a smoke for the plain test
//! run). A failure names the seed and round that reproduce it. The campaign prints one
//! summary line and, with `TOOLLEDGER_CRASH_REPORT=PATH`, writes its figures as JSON.
//! The same campaign runs on PostgreSQL ledgers with `TOOLLEDGER_TEST_STORE=postgres`.

use std::{
    collections::BTreeMap,
    os::unix::process::ExitStatusExt,
    process::{Child, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use toolledger_contract::{IdempotencyKey, Identifier, Scope, digest::status_ref};

use toolledger_conformance::setting;

use crate::{Dir, Run, on_postgres};

/// The seed `cargo xtask crash` uses unless given one.
pub(crate) const DEFAULT_SEED: u64 = 20_261_201;
/// Intents per round.
const INTENTS: usize = 6;
/// Processes racing in a round.
const PROCESSES: usize = 8;
/// The case files' clock; each round runs [`ROUND_SECONDS`] after the previous one.
const START: i64 = 1_767_225_600;
const ROUND_SECONDS: i64 = 120;
/// Past every lease a round's processes could hold (the case's leases are 30 s).
const RECOVERY_AFTER: i64 = 60;
/// The intents' approvals stay valid for a long campaign's rounds (about 80,000).
const APPROVAL_ENDS: i64 = START + 10_000_000;

/// splitmix64: a whole campaign follows from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// How a process of the campaign is stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// It runs to its end.
    Never,
    /// `SIGKILL` this many microseconds after its start.
    KillAfter(u64),
    /// It aborts right after its Nth commit.
    AfterCommit(u64),
}

/// What one process of a round was asked to do.
#[derive(Debug)]
struct Job {
    args: Vec<String>,
    stop: Stop,
}

/// The campaign's figures, as the JSON report writes them.
#[derive(Debug, Default)]
struct Figures {
    processes: u64,
    completed: u64,
    killed: u64,
    aborted_at_commit: u64,
    stopped_by_the_switch_but_ran_to_the_end: u64,
    intents: u64,
    acknowledged: u64,
    outcome_unknown: u64,
    ended: BTreeMap<String, u64>,
    duplicate_effects: u64,
    lost_acknowledgements: u64,
    audit_failures: u64,
}

/// One intent of a round: its case file and where its answers are checked.
struct Intent {
    case: String,
    status_ref: String,
}

fn intent(dir: &Dir, round: u64, index: usize) -> Intent {
    let key = format!("crash-{round}-{index}");
    let case = format!("crash-{round}-{index}.json");
    dir.write_case(&case, |case| {
        case["host_context"]["idempotency_key"] = Value::from(key.as_str());
        case["host_context"]["provider_call_id"] = Value::from(format!("call-{key}"));
        case["approval"]["expires_at"] = Value::from(APPROVAL_ENDS);
    });
    let scope = Scope {
        tenant_id: Identifier::new("tenant-a").unwrap(),
        subject_id: Identifier::new("user-1").unwrap(),
        tool_name: "refund_order".to_owned(),
        idempotency_key: IdempotencyKey::new(&key).unwrap(),
    };
    Intent { case, status_ref: status_ref(&scope).as_str().to_owned() }
}

/// A round's jobs: each a command on one of the round's intents (or the relay), each
/// with the way it is stopped.
fn jobs(rng: &mut Rng, intents: &[Intent], now: i64) -> Vec<Job> {
    let now = now.to_string();
    (0..PROCESSES)
        .map(|_| {
            let intent = &intents[rng.below(intents.len() as u64) as usize];
            let with_case = |rest: &[&str]| {
                let mut args = vec!["--fixture".to_owned(), intent.case.clone()];
                args.extend(rest.iter().map(|arg| (*arg).to_owned()));
                args.extend(["--now".to_owned(), now.clone()]);
                args
            };
            let args = match rng.below(10) {
                0..=3 => with_case(&["dispatch"]),
                4 | 5 => with_case(&["dispatch", "--failure", "after_intent_commit"]),
                6 => with_case(&["process", "--status-ref", &intent.status_ref]),
                7 => with_case(&["status", "--status-ref", &intent.status_ref]),
                // The relay works with a closed order half the time: its recheck of the
                // business state fails what it claims.
                _ => {
                    let case = if rng.below(2) == 0 { "closed.json" } else { "case.json" };
                    ["--fixture", case, "relay", "--once", "--batch", "3", "--concurrency", "2"]
                        .iter()
                        .map(|arg| (*arg).to_owned())
                        .chain(["--now".to_owned(), now.clone()])
                        .collect()
                }
            };
            let stop = match rng.below(3) {
                0 => Stop::Never,
                // A debug dispatch takes a few milliseconds alone, longer eight at once.
                1 => Stop::KillAfter(rng.below(40_000)),
                _ => Stop::AfterCommit(1 + rng.below(4)),
            };
            Job { args, stop }
        })
        .collect()
}

fn spawn(dir: &Dir, job: &Job) -> Child {
    let args: Vec<&str> = job.args.iter().map(String::as_str).collect();
    let mut command = dir.command(&args);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Stop::AfterCommit(n) = job.stop {
        command.env(toolledger_store::crash::CRASH_AFTER_COMMIT_ENV, n.to_string());
    }
    command.spawn().unwrap()
}

/// Runs a round's jobs at once, stops them as planned, and returns each one's end:
/// `Some(run)` when it exited, `None` when a signal ended it.
fn race(dir: &Dir, jobs: &[Job], figures: &mut Figures) -> Vec<Option<Run>> {
    let start = Instant::now();
    let children: Vec<Child> = jobs.iter().map(|job| spawn(dir, job)).collect();
    let mut kills: Vec<(Duration, u32)> = jobs
        .iter()
        .zip(&children)
        .filter_map(|(job, child)| match job.stop {
            Stop::KillAfter(us) => Some((Duration::from_micros(us), child.id())),
            _ => None,
        })
        .collect();
    kills.sort();
    for (at, pid) in kills {
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            thread::sleep(wait);
        }
        // The process may have ended already; then the kill finds nothing (or its
        // zombie, which it does not disturb).
        let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    let mut ends = Vec::new();
    for (job, child) in jobs.iter().zip(children) {
        let output = child.wait_with_output().unwrap();
        figures.processes += 1;
        match (output.status.signal(), job.stop) {
            (Some(9), _) => {
                figures.killed += 1;
                ends.push(None);
            }
            (Some(6), Stop::AfterCommit(_)) => {
                figures.aborted_at_commit += 1;
                ends.push(None);
            }
            (Some(signal), _) => panic!("{:?} died of signal {signal}: {output:?}", job.args),
            (None, stop) => {
                if matches!(stop, Stop::AfterCommit(_)) {
                    figures.stopped_by_the_switch_but_ran_to_the_end += 1;
                }
                figures.completed += 1;
                ends.push(Some(Run::from(output)));
            }
        }
    }
    ends
}

/// What an answer acknowledged: the operation it names (an exit-0 answer, or an exit-1
/// one such as `OUTCOME_UNKNOWN` or `LEASE_HELD`) and, for a finished one, the status
/// and result digest the ledger must keep.
fn acknowledged(run: &Run) -> Option<(String, Option<(String, String)>)> {
    if run.code != 0 && run.stdout.is_empty() {
        // An exit-2 error: nothing was accepted by this process.
        return None;
    }
    let answer = run.answer();
    if answer["status"].is_null() {
        // NOT_FOUND, or a commit A in doubt: nothing is promised to be held.
        return None;
    }
    let status_ref = answer["status_ref"].as_str()?.to_owned();
    let finished = match answer["status"].as_str() {
        Some(status @ ("succeeded" | "failed" | "quarantined" | "dead")) => Some((
            status.to_owned(),
            answer
                .pointer("/result/digests/result_sha256")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        )),
        _ => None,
    };
    Some((status_ref, finished))
}

/// The public recovery path, past every lease: the relay drains what is due (pending
/// events, expired leases; with `closed`, the order was refunded meanwhile and it
/// fails what it has not sent), then each operation still open is asked for by a
/// status query and worked by `process`.
fn recover(dir: &Dir, intents: &[Intent], later: i64, closed: bool) {
    let after_relay = (later + RECOVERY_AFTER).to_string();
    let later = later.to_string();
    let case = if closed { "closed.json" } else { "case.json" };
    let relay = dir.run(&["--fixture", case, "relay", "--once", "--now", &later]);
    assert_eq!(relay.code, 0, "recovery relay: {relay:?}");
    for intent in intents {
        let state = |dir: &Dir| {
            dir.db_rows(&format!(
                "SELECT status FROM operations WHERE status_ref = '{}'",
                intent.status_ref
            ))
        };
        let Some(Some(status)) = state(dir).first().and_then(|row| row.first().cloned()) else {
            continue; // never accepted
        };
        if status != "pending" && status != "processing" {
            continue;
        }
        // Past the leases the recovery relay itself may hold on what it could not end.
        let ended = dir.recover(&intent.case, &intent.status_ref, &after_relay);
        assert_eq!(ended.text("/code"), "OK", "recovery: {ended:?}");
    }
}

/// Checks the ledger after a round's recovery; `acks` are every answer acknowledged so
/// far. Returns what it found wrong, for the failure message.
fn check(
    dir: &Dir,
    acks: &[(String, Option<(String, String)>)],
    figures: &mut Figures,
) -> Vec<String> {
    let mut wrong = Vec::new();
    let audit = dir.run(&["audit"]);
    if audit.code != 0 {
        figures.audit_failures += 1;
        wrong.push(format!("audit: {}", audit.stdout));
    }
    let open = dir.db_int(
        "SELECT count(*) FROM operations o JOIN outbox b ON b.op_id = o.id \
         WHERE o.status IN ('pending', 'processing') OR b.state IN ('pending', 'processing')",
    );
    if open != 0 {
        wrong.push(format!("{open} accepted intents did not end"));
    }
    // One effect per key: no scope with two downstream receipts, no receipt without
    // the operation that asked for it.
    let duplicates = dir.db_int(
        "SELECT count(*) FROM (SELECT o.idempotency_key FROM operations o \
         JOIN downstream_receipts d ON d.downstream_request_ref = o.downstream_request_ref \
         GROUP BY o.tenant_id, o.subject_id, o.tool_name, o.idempotency_key HAVING count(*) > 1) x",
    ) + dir.db_int(
        "SELECT count(*) FROM downstream_receipts d WHERE NOT EXISTS \
         (SELECT 1 FROM operations o WHERE o.downstream_request_ref = d.downstream_request_ref)",
    );
    if duplicates != 0 {
        figures.duplicate_effects += u64::try_from(duplicates).unwrap();
        wrong.push(format!("{duplicates} keys with a second or unowned downstream effect"));
    }
    for (status_ref, finished) in acks {
        let held = dir.db_rows(&format!(
            "SELECT o.status, coalesce(l.result_sha256, '') FROM operations o \
             LEFT JOIN local_receipts l ON l.op_id = o.id WHERE o.status_ref = '{status_ref}'"
        ));
        let lost = match (held.as_slice(), finished) {
            ([], _) => true,
            ([row], Some((status, result))) => {
                row.first().cloned().flatten().as_deref() != Some(status.as_str())
                    || (!result.is_empty()
                        && row.get(1).cloned().flatten().as_deref() != Some(result.as_str()))
            }
            ([_], None) => false,
            _ => true,
        };
        if lost {
            figures.lost_acknowledgements += 1;
            wrong.push(format!(
                "acknowledged {status_ref} {finished:?} is not what the ledger holds: {held:?}"
            ));
        }
    }
    wrong
}

#[test]
fn processes_killed_at_random_instants_and_at_every_commit_lose_nothing() {
    let seed = setting("TOOLLEDGER_CRASH_SEED", DEFAULT_SEED);
    let rounds = setting("TOOLLEDGER_CRASH_ROUNDS", 2);
    let store = if on_postgres() { "postgres" } else { "sqlite" };
    let rerun = format!("cargo xtask crash --seed {seed} --rounds {rounds} --store {store}");
    let mut rng = Rng(seed);
    let mut figures = Figures::default();
    let dir = Dir::new();
    // The relay's business state half the time: the order was refunded meanwhile, so
    // the worker's recheck fails the operation instead of delivering it.
    dir.write_case("closed.json", |case| {
        case["business_state"]["orders"][0]["status"] = Value::from("refunded");
    });
    let mut acks = Vec::new();
    for round in 0..rounds {
        let now = START + i64::try_from(round).unwrap() * ROUND_SECONDS;
        let intents: Vec<Intent> = (0..INTENTS).map(|index| intent(&dir, round, index)).collect();
        figures.intents += INTENTS as u64;
        let jobs = jobs(&mut rng, &intents, now);
        for end in race(&dir, &jobs, &mut figures).into_iter().flatten() {
            if let Some(ack) = acknowledged(&end) {
                // Exit 1 answers name the operation too: OUTCOME_UNKNOWN, or a block
                // such as LEASE_HELD while another process works it.
                if end.text("/code") == "OUTCOME_UNKNOWN" {
                    figures.outcome_unknown += 1;
                }
                figures.acknowledged += 1;
                acks.push(ack);
            }
        }
        recover(&dir, &intents, now + RECOVERY_AFTER, rng.below(3) == 0);
        let wrong = check(&dir, &acks, &mut figures);
        assert!(
            wrong.is_empty(),
            "crash campaign failed in round {round} of seed {seed}: {wrong:?}\n\
             jobs: {jobs:?}\nreproduce: {rerun}"
        );
    }
    for row in
        dir.db_rows("SELECT status, count(*) FROM operations GROUP BY status ORDER BY status")
    {
        let status = row.first().cloned().flatten().unwrap();
        figures.ended.insert(status, row.get(1).cloned().flatten().unwrap().parse().unwrap());
    }
    let report = json!({
        "store": store,
        "seed": seed,
        "rounds": rounds,
        "processes": figures.processes,
        "completed": figures.completed,
        "killed": figures.killed,
        "aborted_at_commit": figures.aborted_at_commit,
        "armed_but_ran_to_the_end": figures.stopped_by_the_switch_but_ran_to_the_end,
        "intents": figures.intents,
        "accepted": figures.ended.values().sum::<u64>(),
        "ended": figures.ended,
        "acknowledged": figures.acknowledged,
        "outcome_unknown_answers": figures.outcome_unknown,
        "duplicate_effects": figures.duplicate_effects,
        "lost_acknowledgements": figures.lost_acknowledgements,
        "audit_failures": figures.audit_failures,
        "reproduce": rerun,
    });
    println!(
        "crash campaign: store {store}, seed {seed}, {rounds} rounds, {} processes ({} killed, {} aborted after a commit), \
         {} intents, ended {:?}, duplicate effects {}, lost acknowledgements {}, audit failures {}",
        figures.processes,
        figures.killed,
        figures.aborted_at_commit,
        figures.intents,
        figures.ended,
        figures.duplicate_effects,
        figures.lost_acknowledgements,
        figures.audit_failures
    );
    if let Ok(path) = std::env::var("TOOLLEDGER_CRASH_REPORT") {
        std::fs::write(&path, format!("{report:#}\n")).unwrap();
    }
}
