//! Group commit: commit points of different operations that meet at the writer gate
//! share one transaction, each in its own savepoint. A batch is forced by holding the
//! file's write lock from a plain connection until every caller has queued: the first
//! caller then waits in `BEGIN IMMEDIATE` holding the gate, and takes everyone queued
//! behind it once the lock is free.

use crate::StoreUnderTest;
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use proptest::prelude::*;
use toolledger_contract::{Clock, HostCall, IdempotencyKey, LeaseSeconds, Registry};
use toolledger_engine::Answer;
use toolledger_store_sqlite::SqliteStore;

use crate::{Db, FailurePoint, Flows, Roles, at, audit_sqlite, case_with, id, open_sqlite};

const NOW: i64 = 1_767_225_600;

/// Runs every job on its own thread while a plain connection holds the write lock,
/// releases the lock once all of them are either queued at the gate, holding it, or
/// done without writing, and returns their results in order.
fn forced_batch<T: Send + 'static>(
    db: &Db,
    observer: &SqliteStore,
    jobs: Vec<Box<dyn FnOnce() -> T + Send>>,
) -> Vec<T> {
    let lock = db.raw();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let count = jobs.len();
    let done = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            let done = Arc::clone(&done);
            thread::spawn(move || {
                let result = job();
                done.fetch_add(1, Ordering::SeqCst);
                result
            })
        })
        .collect();
    // One caller holds the gate (waiting for the lock), the rest queue behind it — or
    // finished without a write. Bounded: a batch that never forms fails the test.
    let deadline = Instant::now() + Duration::from_secs(60);
    while observer.writes_waiting() + done.load(Ordering::SeqCst) + 1 < count {
        assert!(Instant::now() < deadline, "the callers never queued");
        thread::sleep(Duration::from_millis(1));
    }
    lock.execute_batch("COMMIT").unwrap();
    handles.into_iter().map(|handle| handle.join().unwrap()).collect()
}

fn keyed(key: &str, now: i64) -> HostCall {
    let mut case = case_with(|case| {
        case.host.idempotency_key = IdempotencyKey::new(key).unwrap();
        case.host.provider_call_id = id(&format!("call-{key}"));
    });
    case.clock.now = at(now);
    case
}

/// Eight commits A forced into one batch: one is refused inside its transaction (a
/// trigger, after its operation row was written), one is another intent under key-0's
/// key (an idempotency conflict decided inside the batch). Each rolls back or answers
/// alone; the other six commit and go on to their effects.
#[test]
fn a_batch_commits_every_operation_but_the_one_refused() {
    let db = Db::fresh();
    // Opened before the trigger exists: a store refuses to open a schema it did not make.
    let engines: Vec<_> = (0..8)
        .map(|_| open_sqlite(db.path(), Roles::default(), Registry::builtin()).unwrap())
        .collect();
    let observer = SqliteStore::open(db.path()).unwrap();
    // A refusal inside commit A of one operation only, after its operation row is in:
    // a trigger on its outbox event, as a constraint would refuse it.
    db.raw()
        .execute_batch(
            "CREATE TRIGGER doomed BEFORE INSERT ON outbox WHEN NEW.op_id = \
             (SELECT id FROM operations WHERE idempotency_key = 'key-3') \
             BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        .unwrap();
    let (batches, batched) = observer.group_commits();
    let jobs: Vec<Box<dyn FnOnce() -> Result<Answer, String> + Send>> = engines
        .into_iter()
        .enumerate()
        .map(|(n, mut engine)| {
            Box::new(move || {
                // Job 7 is another intent (another amount) under key-0's key.
                let case = match n {
                    7 => {
                        let mut case = keyed("key-0", NOW);
                        case.proposal.arguments["amount_minor"] = serde_json::json!(1234);
                        crate::rebind(&mut case);
                        case
                    }
                    _ => keyed(&format!("key-{n}"), NOW),
                };
                engine
                    .dispatch_at(&case, &id(&format!("w-{n}")), None)
                    .map_err(|error| error.code().as_str().to_owned())
            }) as Box<dyn FnOnce() -> _ + Send>
        })
        .collect();
    let answers = forced_batch(&db, &observer, jobs);
    let code = |n: usize| match &answers[n] {
        Ok(answer) => answer.delivery().map_or(answer.code(), |d| d.as_str()).to_owned(),
        Err(code) => code.clone(),
    };
    assert_eq!(code(3), "STORE_ERROR");
    for n in [1, 2, 4, 5, 6] {
        assert_eq!(code(n), "fresh", "{n}: {:?}", answers[n]);
    }
    // Whichever of the two intents under key-0 ran first in the batch won it.
    let mut pair = [code(0), code(7)];
    pair.sort();
    assert_eq!(pair, ["IDEMPOTENCY_CONFLICT".to_owned(), "fresh".to_owned()], "{answers:?}");
    // The first transaction held all eight commits A; the six accepted ones went on.
    let (after, held) = observer.group_commits();
    assert!(held - batched >= (after - batches) + 7, "{batches}/{batched} → {after}/{held}");
    assert_eq!(db.int("SELECT count(*) FROM operations WHERE idempotency_key = 'key-3'"), 0);
    assert_eq!(db.int("SELECT count(*) FROM operations WHERE idempotency_key = 'key-0'"), 1);
    assert_eq!(
        (db.count("operations"), db.count("downstream_receipts"), db.count("local_receipts")),
        (6, 6, 6)
    );
    db.raw().execute_batch("DROP TRIGGER doomed").unwrap();
    assert_eq!(audit_sqlite(db.path()).unwrap().code(), "OK");
}

/// One caller's step in the property test below.
#[derive(Debug, Clone)]
enum Call {
    Dispatch { key: usize, failure: Option<FailurePoint> },
    Process { key: usize, worker: usize },
    Status { key: usize },
}

#[derive(Debug, Clone)]
enum Step {
    /// One caller alone: its batch is itself.
    Alone(Call),
    /// Several callers at once, their first writes forced into one batch.
    Together(Vec<Call>),
    Advance(i64),
}

fn call() -> impl Strategy<Value = Call> {
    let failure = prop_oneof![
        Just(None),
        Just(Some(FailurePoint::AfterIntentCommit)),
        Just(Some(FailurePoint::AfterClaim)),
        Just(Some(FailurePoint::AfterDownstreamCommit)),
    ];
    prop_oneof![
        (0..3usize, failure).prop_map(|(key, failure)| Call::Dispatch { key, failure }),
        (0..3usize, 0..3usize).prop_map(|(key, worker)| Call::Process { key, worker }),
        (0..3usize).prop_map(|key| Call::Status { key }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        call().prop_map(Step::Alone),
        proptest::collection::vec(call(), 2..6).prop_map(Step::Together),
        (0..45i64).prop_map(Step::Advance),
    ]
}

/// Runs `call` on its own engine; whether it answered `fresh` (it caused the effect).
fn run(path: &std::path::Path, call: &Call, now: i64) -> bool {
    let mut engine = open_sqlite(path, Roles::default(), Registry::builtin()).unwrap();
    let clock = Clock { now: at(now), lease_seconds: LeaseSeconds::new(30).unwrap() };
    let answer = match *call {
        Call::Dispatch { key, failure } => {
            engine.dispatch_at(&keyed(&format!("key-{key}"), now), &id("dispatcher"), failure)
        }
        Call::Process { key, worker } => {
            let case = keyed(&format!("key-{key}"), now);
            let status_ref = toolledger_contract::digest::status_ref(&toolledger_contract::Scope {
                tenant_id: case.principal.tenant_id.clone(),
                subject_id: case.principal.subject_id.clone(),
                tool_name: "refund_order".to_owned(),
                idempotency_key: case.host.idempotency_key.clone(),
            });
            engine.process_at(
                status_ref.as_str(),
                &clock,
                &case.business_state,
                &id(&format!("worker-{worker}")),
                None,
            )
        }
        Call::Status { key } => {
            let case = keyed(&format!("key-{key}"), now);
            let dispatched =
                engine.dispatch_at(&case, &id("dispatcher"), Some(FailurePoint::AfterIntentCommit));
            match dispatched
                .ok()
                .and_then(|answer| answer.package()["status_ref"].as_str().map(str::to_owned))
            {
                Some(status_ref) => engine.status_of(&case, &status_ref),
                None => return false,
            }
        }
    };
    // A store error is an answer too (a batch may refuse as a whole); no call panics.
    answer
        .is_ok_and(|answer| answer.delivery().is_some_and(|delivery| delivery.as_str() == "fresh"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Batched and lone callers interleaved: at most one side effect and one `fresh`
    /// answer per key, a succeeded operation always has its receipt, and the audit
    /// passes after every step.
    #[test]
    fn batched_and_lone_callers_never_break_the_ledger(steps in proptest::collection::vec(step(), 1..10)) {
        let db = Db::fresh();
        let observer = SqliteStore::open(db.path()).unwrap();
        let mut now = NOW;
        let mut fresh: BTreeMap<usize, usize> = BTreeMap::new();
        let key_of = |call: &Call| match *call {
            Call::Dispatch { key, .. } | Call::Process { key, .. } | Call::Status { key } => key,
        };
        for step in &steps {
            match step {
                Step::Advance(seconds) => now += seconds,
                Step::Alone(call) => {
                    if run(db.path(), call, now) {
                        *fresh.entry(key_of(call)).or_default() += 1;
                    }
                }
                Step::Together(calls) => {
                    let jobs: Vec<Box<dyn FnOnce() -> bool + Send>> = calls
                        .iter()
                        .map(|call| {
                            let (path, call) = (db.path().to_path_buf(), call.clone());
                            Box::new(move || run(&path, &call, now)) as Box<dyn FnOnce() -> bool + Send>
                        })
                        .collect();
                    for (call, was_fresh) in calls.iter().zip(forced_batch(&db, &observer, jobs)) {
                        if was_fresh {
                            *fresh.entry(key_of(call)).or_default() += 1;
                        }
                    }
                }
            }
            let audit = audit_sqlite(db.path()).unwrap();
            prop_assert_eq!(audit.code(), "OK", "{:?}", audit.package());
            for count in fresh.values() {
                prop_assert!(*count <= 1, "{fresh:?}");
            }
            let effects = db.int(
                "SELECT count(*) FROM (SELECT downstream_request_ref FROM downstream_receipts \
                 GROUP BY downstream_request_ref HAVING count(*) > 1)",
            );
            prop_assert_eq!(effects, 0);
            prop_assert!(db.count("downstream_receipts") <= db.count("operations"));
            prop_assert_eq!(
                db.int("SELECT count(*) FROM operations o LEFT JOIN local_receipts l ON l.op_id = o.id \
                        WHERE o.status = 'succeeded' AND l.op_id IS NULL"),
                0
            );
        }
    }
}

/// Where [`eight_threads_dispatching_answer_only_what_is_committed`] works when it runs
/// as the child of [`sigkill_during_group_commits_loses_and_invents_nothing`]: the store's
/// path and the keys' prefix.
const CHILD_STORE: &str = "TOOLLEDGER_TEST_GROUP_COMMIT_STORE";
const CHILD_PREFIX: &str = "TOOLLEDGER_TEST_GROUP_COMMIT_PREFIX";

/// Eight threads, each with its own engine on one file, dispatch fresh keys back to back
/// (their commits meet at the gate and are combined) and acknowledge each answer on
/// stdout as `ack KEY CODE` once they have it. Alone, it checks every answer and the
/// audit; as a child it runs on the parent's store until it is killed (still bounded).
#[test]
fn eight_threads_dispatching_answer_only_what_is_committed() {
    let own = Db::fresh();
    let path =
        std::env::var_os(CHILD_STORE).map_or(own.path().to_path_buf(), std::path::PathBuf::from);
    let prefix = std::env::var(CHILD_PREFIX).unwrap_or_else(|_| "alone".to_owned());
    let per_thread = 40;
    let handles: Vec<_> = (0..8)
        .map(|thread| {
            let (path, prefix) = (path.clone(), prefix.clone());
            thread::spawn(move || {
                let mut engine = open_sqlite(&path, Roles::default(), Registry::builtin()).unwrap();
                for n in 0..per_thread {
                    let key = format!("{prefix}-{thread}-{n}");
                    let answer = engine.dispatch_at(&keyed(&key, NOW), &id("dispatcher"), None);
                    let code = answer
                        .map_or_else(|e| e.code().as_str().to_owned(), |a| a.code().to_owned());
                    // Line-buffered: each acknowledgement is written whole once it is known
                    // (captured by the test harness unless run as the child).
                    println!("ack {key} {code}");
                    assert_eq!(code, "OK", "{key}");
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(own.count("local_receipts"), if path == own.path() { 8 * per_thread } else { 0 });
    assert_eq!(audit_sqlite(&path).unwrap().code(), "OK");
}

/// kill -9 of a process whose threads' commits are being combined, at spread-out
/// moments: every operation acknowledged `OK` is committed as succeeded with its receipt
/// (nothing acknowledged is lost, nothing is acknowledged before its commit), the audit
/// passes after every kill, and the recovery path ends every accepted intent with one
/// side effect.
#[test]
fn sigkill_during_group_commits_loses_and_invents_nothing() {
    let db = Db::fresh();
    drop(open_sqlite(db.path(), Roles::default(), Registry::builtin()).unwrap());
    let observer = SqliteStore::open(db.path()).unwrap();
    let mut acknowledged = 0;
    for round in 0..6u64 {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["groupcommit::eight_threads_dispatching_answer_only_what_is_committed"])
            .args(["--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_STORE, db.path())
            .env(CHILD_PREFIX, format!("round{round}"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let reader = thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
            text
        });
        thread::sleep(Duration::from_millis(60 + 45 * round));
        let _ = child.kill();
        let _ = child.wait();
        let text = reader.join().unwrap();
        // Only whole lines count: the kill may cut the last one.
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        for line in whole.lines().filter_map(|line| line.strip_prefix("ack ")) {
            let (key, code) = line.split_once(' ').unwrap();
            assert_eq!(code, "OK", "{line}");
            let status = db.text(&format!(
                "SELECT o.status || '/' || count(l.op_id) FROM operations o \
                 LEFT JOIN local_receipts l ON l.op_id = o.id WHERE o.idempotency_key = '{key}'"
            ));
            assert_eq!(status, "succeeded/1", "round {round}: {key} was acknowledged");
            acknowledged += 1;
        }
        assert_eq!(audit_sqlite(db.path()).unwrap().code(), "OK", "round {round}");
    }
    assert!(acknowledged > 0, "no child got as far as an answer");
    // Recovery: every accepted intent is driven to its end past any lease.
    let mut engine = open_sqlite(db.path(), Roles::default(), Registry::builtin()).unwrap();
    let refs: Vec<(String, String)> = {
        let raw = db.raw();
        let mut statement = raw
            .prepare(
                "SELECT status_ref, idempotency_key FROM operations WHERE status != 'succeeded'",
            )
            .unwrap();
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let later = Clock { now: at(NOW + 31), lease_seconds: LeaseSeconds::new(30).unwrap() };
    for (status_ref, key) in &refs {
        let case = keyed(key, NOW + 31);
        let answer =
            engine.process_at(status_ref, &later, &case.business_state, &id("recovery"), None);
        assert_eq!(answer.unwrap().code(), "OK", "{key}");
    }
    let operations = db.count("operations");
    assert_eq!(
        (db.count("downstream_receipts"), db.count("local_receipts")),
        (operations, operations)
    );
    assert_eq!(audit_sqlite(db.path()).unwrap().code(), "OK");
    let (batches, batched) = observer.group_commits();
    println!(
        "{operations} operations, {acknowledged} acknowledged before the kills, {batches}/{batched} in this process"
    );
}

/// The group commits' connection never checkpoints inside the gate: a combiner with
/// nobody behind it copies the log once out of the gate, and with writers queued the
/// file's checkpointer copies it while they go on, taking the gate only for the rest,
/// and letting readers on the log's last frames finish, so a later commit starts the
/// log over. Eight writers dispatching back to back (each reading too) write many
/// times the checkpoint threshold; the log's file stays near the restart threshold
/// (without a copy, or without a start over, it holds every page written) and the
/// audit passes.
#[test]
fn the_log_is_copied_back_and_started_over_while_writers_go_on() {
    let db = Db::fresh();
    let observer = SqliteStore::open(db.path()).unwrap();
    let wal = {
        let mut name = db.path().as_os_str().to_owned();
        name.push("-wal");
        std::path::PathBuf::from(name)
    };
    let page = 4096;
    let dispatched = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..8)
        .map(|thread| {
            let (path, dispatched) = (db.path().to_path_buf(), Arc::clone(&dispatched));
            thread::spawn(move || {
                let mut engine = open_sqlite(&path, Roles::default(), Registry::builtin()).unwrap();
                // Bounded: 8 x 120 dispatches write the threshold's 1,000 pages many
                // times (a log never started over passes 30 MB).
                for n in 0..120 {
                    let key = format!("copied-{thread}-{n}");
                    let answer = engine.dispatch_at(&keyed(&key, NOW), &id("dispatcher"), None);
                    assert_eq!(answer.unwrap().code(), "OK", "{key}");
                    dispatched.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let mut largest = 0;
    while handles.iter().any(|handle| !handle.is_finished()) {
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |meta| meta.len()));
        thread::sleep(Duration::from_millis(2));
    }
    for handle in handles {
        handle.join().unwrap();
    }
    println!(
        "{} dispatches, {} copies of the log, largest log {largest} bytes",
        dispatched.load(Ordering::SeqCst),
        observer.checkpoints()
    );
    assert!(observer.checkpoints() >= 3, "{} copies of the log", observer.checkpoints());
    // The restart threshold's pages, plus what the writers commit while a copy runs.
    assert!(largest < 4 * 1000 * page, "the log grew to {largest} bytes");
    drop(observer);
    assert_eq!(audit_sqlite(db.path()).unwrap().code(), "OK");
}
