//! The deterministic simulation: seeded interleavings of dispatch, process, status, relay
//! passes, lease expiry, role changes and stale finalizes over a few keys, with store
//! faults injected at any call ([`Rule::FailCall`]: the call fails before the store
//! sees it; [`Rule::CrashAfterCall`]: it commits and the process dies;
//! [`Rule::CommitUnknownCall`]: it fails while committing, held or not), and power
//! losses (SQLite: the files go back to their last synced commit, taking back a
//! success's lazy commit C made since; `docs/schema.md`, "Lazy commit C"), each step
//! checked against a model of what the ledger promises:
//!
//! - an intent the store accepted stays accepted, and a call that accepted it never
//!   answers an error ("nothing happened") unless its process died first;
//! - `OUTCOME_UNKNOWN` names an operation the store holds, unless its status is null
//!   after a commit A that failed while committing;
//! - an ended operation never changes: its status and result digest stay what the
//!   first answer or the store said, and every later answer repeats them — but for a
//!   success whose commit C a power loss took back: it is open again (answered
//!   `OUTCOME_UNKNOWN`) until it ends with the same status and result digest;
//! - a power loss takes back no accepted intent and nothing but a success's commit C;
//! - a key is finalized freshly at most once; one downstream receipt per scope, none
//!   without its operation; succeeded means a local receipt; the audit passes.
//!
//! After the steps, the public recovery path alone (a relay pass, then status and
//! process per open operation, past every lease) must end every accepted intent.
//!
//! The runs follow from `TOOLLEDGER_SIM_SEED` (default [`SEED`]);
//! `TOOLLEDGER_SIM_CASES` sets how many interleavings SQLite runs (default 50, a smoke;
//! `cargo xtask simulate` and `cargo xtask ci` run 2,000) and PostgreSQL one in fifty. A failure is shrunk
//! to a minimal sequence of steps and printed with the seed that reproduces it.

use std::{cell::Cell, collections::BTreeMap, sync::Arc};

use proptest::{
    prelude::*,
    test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner},
};
use toolledger_conformance::{Faults, Faulty, PowerLoss, Roles, Rule, StoreUnderTest, setting};
use toolledger_contract::{
    Clock, HostCall, IdempotencyKey, LeaseSeconds, Registry, Scope,
    digest::{downstream_request_ref, result_sha256, status_ref},
};
use toolledger_engine::StandInReceipts;
use toolledger_engine::{
    Answer, Backoff, Engine, EngineError, StandIn,
    drill::{Interrupt, Switch},
};
use toolledger_store::{Ending, Finalize, Finalizer, Lease, LedgerStore, LocalReceipt};

use crate::{FailurePoint, Flows, at, case_with, id};

/// The seed of the default runs.
const SEED: u64 = 20_261_201;
const NOW: i64 = 1_767_225_600;
const KEYS: usize = 3;
const LEASE: i64 = 30;

#[derive(Debug, Clone)]
enum Step {
    Dispatch {
        key: usize,
        drill: Option<FailurePoint>,
        fault: Rule,
    },
    Process {
        key: usize,
        worker: usize,
        drill: Option<FailurePoint>,
        fault: Rule,
    },
    Status {
        key: usize,
        fault: Rule,
    },
    Relay {
        limit: usize,
        closed: bool,
        fault: Rule,
    },
    Advance {
        seconds: i64,
    },
    /// The subject's role is taken away or given back: every later step re-resolves it.
    Roles {
        granted: bool,
    },
    /// A worker that lost its lease wakes up and tries commit C with what it held.
    StaleFinalize {
        key: usize,
    },
    /// The machine loses power: every process dies, and the disk keeps what was synced.
    PowerLoss,
}

fn drill() -> impl Strategy<Value = Option<FailurePoint>> {
    prop_oneof![
        4 => Just(None),
        1 => Just(Some(FailurePoint::AfterIntentCommit)),
        1 => Just(Some(FailurePoint::AfterClaim)),
        1 => Just(Some(FailurePoint::AfterDownstreamCommit)),
    ]
}

fn fault() -> impl Strategy<Value = Rule> {
    prop_oneof![
        5 => Just(Rule::Clean),
        1 => (1..7u64).prop_map(Rule::FailCall),
        2 => (1..7u64).prop_map(Rule::CrashAfterCall),
        1 => (1..7u64, any::<bool>()).prop_map(|(n, held)| Rule::CommitUnknownCall(n, held)),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..KEYS, drill(), fault())
            .prop_map(|(key, drill, fault)| Step::Dispatch { key, drill, fault }),
        3 => (0..KEYS, 0..3usize, drill(), fault()).prop_map(|(key, worker, drill, fault)| {
            // process has no intent commit of its own
            let drill = drill.filter(|point| *point != FailurePoint::AfterIntentCommit);
            Step::Process { key, worker, drill, fault }
        }),
        2 => (0..KEYS, fault()).prop_map(|(key, fault)| Step::Status { key, fault }),
        2 => (1..4usize, any::<bool>(), fault())
            .prop_map(|(limit, closed, fault)| Step::Relay { limit, closed: closed && limit == 1, fault }),
        2 => (0..45i64).prop_map(|seconds| Step::Advance { seconds }),
        1 => any::<bool>().prop_map(|granted| Step::Roles { granted }),
        1 => (0..KEYS).prop_map(|key| Step::StaleFinalize { key }),
        1 => Just(Step::PowerLoss),
    ]
}

type Simulated<B> = Engine<
    Faulty<<B as StoreUnderTest>::Store>,
    Interrupt<StandIn<Faulty<<B as StoreUnderTest>::Store>>>,
    Roles,
>;

/// What the model knows of one key.
#[derive(Debug, Default, Clone)]
struct Key {
    accepted: bool,
    /// How it ended: status and result digest (empty when it has none).
    ended: Option<(String, String)>,
    fresh: usize,
    /// A power loss took its ending back: open until it ends again, the same.
    lost: bool,
}

/// What one run counted, summed over the runs.
#[derive(Debug, Default)]
struct Tally {
    runs: Cell<u64>,
    steps: Cell<u64>,
    fails: Cell<u64>,
    crashes: Cell<u64>,
    answers: Cell<u64>,
    ended: Cell<u64>,
    power_losses: Cell<u64>,
    lost_commits: Cell<u64>,
}

fn bump(cell: &Cell<u64>) {
    cell.set(cell.get() + 1);
}

struct Sim<B: StoreUnderTest> {
    backend: B,
    faults: Faults,
    /// The disk under the ledger where a commit may be lazy.
    power: Option<Arc<PowerLoss>>,
    roles: Roles,
    engine: Simulated<B>,
    /// The audit's own connection, clean of faults.
    auditor: B::Store,
    now: i64,
    model: [Key; KEYS],
}

fn keyed(key: usize, now: i64) -> HostCall {
    // Each key is its own model call: one call is one intent.
    let mut case = case_with(|case| {
        case.host.idempotency_key = IdempotencyKey::new(&format!("key-{key}")).unwrap();
        case.host.provider_call_id = id(&format!("call-key-{key}"));
        // The approval outlives every run's clock.
        case.approval.as_mut().unwrap().expires_at = at(NOW + 1_000_000);
    });
    case.clock.now = at(now);
    case
}

fn scope_of(case: &HostCall) -> Scope {
    Scope {
        tenant_id: case.principal.tenant_id.clone(),
        subject_id: case.principal.subject_id.clone(),
        tool_name: "refund_order".to_owned(),
        idempotency_key: case.host.idempotency_key.clone(),
    }
}

fn engine<B: StoreUnderTest>(backend: &B, faults: &Faults, roles: &Roles) -> Simulated<B> {
    let downstream = Interrupt::new(
        StandIn::new(Faulty::new(backend.store(), faults.clone())),
        Switch::default(),
    );
    Engine::new(
        Faulty::new(backend.store(), faults.clone()),
        downstream,
        roles.clone(),
        Registry::builtin(),
    )
}

/// `(status, result digest)` of each key's operation in the store.
fn held<B: StoreUnderTest>(backend: &B) -> BTreeMap<String, (String, String)> {
    backend
        .rows(
            "SELECT o.idempotency_key, o.status, coalesce(l.result_sha256, '') FROM operations o \
             LEFT JOIN local_receipts l ON l.op_id = o.id",
        )
        .into_iter()
        .map(|row| {
            let text = |index: usize| row[index].clone().unwrap_or_default();
            (text(0), (text(1), text(2)))
        })
        .collect()
}

fn terminal(status: &str) -> bool {
    matches!(status, "succeeded" | "failed" | "quarantined" | "dead")
}

impl<B: StoreUnderTest> Sim<B> {
    fn new() -> Sim<B> {
        let backend = B::fresh();
        let power = backend.power_loss();
        let faults = match &power {
            Some(power) => Faults::on_disk(power.clone()),
            None => Faults::default(),
        };
        let roles = Roles::default();
        roles.grant("tenant-a", "user-1", "support_agent");
        let engine = engine(&backend, &faults, &roles);
        let auditor = backend.store();
        Sim { backend, faults, power, roles, engine, auditor, now: NOW, model: Default::default() }
    }

    fn clock(&self) -> Clock {
        Clock { now: at(self.now), lease_seconds: LeaseSeconds::new(LEASE).unwrap() }
    }

    /// Runs one step under its fault; returns its answer (`None` when its process died
    /// or it answers nothing) and the key it was about.
    fn run(
        &mut self,
        step: &Step,
        tally: &Tally,
    ) -> (Option<Result<Answer, EngineError>>, Option<usize>) {
        let rule = match step {
            Step::Dispatch { fault, .. }
            | Step::Process { fault, .. }
            | Step::Status { fault, .. }
            | Step::Relay { fault, .. } => *fault,
            _ => Rule::Clean,
        };
        match rule {
            Rule::FailCall(_) | Rule::CommitUnknownCall(..) => bump(&tally.fails),
            Rule::CrashAfterCall(_) => bump(&tally.crashes),
            _ => {}
        }
        self.faults.restart(rule);
        let now = self.now;
        let (answer, key) = match *step {
            Step::Advance { seconds } => {
                self.now += seconds;
                (None, None)
            }
            Step::Roles { granted } => {
                self.roles.revoke_all();
                if granted {
                    self.roles.grant("tenant-a", "user-1", "support_agent");
                }
                (None, None)
            }
            Step::Dispatch { key, drill, .. } => (
                Some(self.engine.dispatch_at(&keyed(key, now), &id("dispatcher"), drill)),
                Some(key),
            ),
            Step::Process { key, worker, drill, .. } => {
                let case = keyed(key, now);
                let status_ref = status_ref(&scope_of(&case));
                let worker = id(&format!("worker-{worker}"));
                let clock = self.clock();
                let answer = self.engine.process_at(
                    status_ref.as_str(),
                    &clock,
                    &case.business_state,
                    &worker,
                    drill,
                );
                (Some(answer), Some(key))
            }
            Step::Status { key, .. } => {
                let case = keyed(key, now);
                let status_ref = status_ref(&scope_of(&case));
                (Some(self.engine.status_of(&case, status_ref.as_str())), Some(key))
            }
            Step::Relay { limit, closed, .. } => {
                let mut state = keyed(0, now).business_state;
                if closed {
                    // The order was refunded meanwhile: the recheck fails what is claimed.
                    state["orders"][0]["status"] = "refunded".into();
                }
                let clock = self.clock();
                let _ = self.engine.relay_batch(
                    &id("relay"),
                    &clock,
                    &state,
                    limit,
                    Backoff::default(),
                );
                (None, None)
            }
            Step::StaleFinalize { key } => {
                self.stale_finalize(key);
                (None, None)
            }
            Step::PowerLoss => {
                self.cut_power(tally);
                (None, None)
            }
        };
        if self.faults.crashed() {
            // The process is gone with whatever it was about to answer; a new one
            // opens new connections.
            self.faults.restart(Rule::Clean);
            self.engine = engine(&self.backend, &self.faults, &self.roles);
            return (None, key);
        }
        self.faults.restart(Rule::Clean);
        (answer, key)
    }

    /// Every process dies, and the ledger's files go back to what the disk held: a
    /// success's commit C made since the last synced commit is lost, and the model
    /// expects that success to be open until it ends again, the same.
    fn cut_power(&mut self, tally: &Tally) {
        bump(&tally.power_losses);
        let Some(power) = self.power.clone() else {
            // Every commit was synced: the machine comes back as a new process would.
            self.engine = engine(&self.backend, &self.faults, &self.roles);
            return;
        };
        // Every connection to the files closes before they change.
        let elsewhere = B::fresh();
        drop(std::mem::replace(
            &mut self.engine,
            engine(&elsewhere, &Faults::default(), &self.roles),
        ));
        drop(std::mem::replace(&mut self.auditor, elsewhere.store()));
        if power.cut() {
            bump(&tally.lost_commits);
        }
        self.engine = engine(&self.backend, &self.faults, &self.roles);
        self.auditor = self.backend.store();
        let store = held(&self.backend);
        for (index, model) in self.model.iter_mut().enumerate() {
            let open =
                store.get(&format!("key-{index}")).is_some_and(|(status, _)| !terminal(status));
            if open && model.ended.is_some() {
                model.lost = true;
                model.fresh = 0;
            }
        }
    }

    fn stale_finalize(&mut self, key: usize) {
        let case = keyed(key, self.now);
        let scope = scope_of(&case);
        let store = self.engine.store();
        let Some(operation) = store.operation_by_status_ref(&status_ref(&scope)).unwrap() else {
            return;
        };
        let dr_ref = downstream_request_ref(&scope, &operation.intent.request_sha256);
        let Some(receipt) = store.downstream_receipt(&dr_ref).unwrap() else { return };
        let output = receipt.receipt()["output"].clone();
        let local = LocalReceipt {
            result_sha256: result_sha256(
                "refund_order",
                &operation.intent.revisions.output,
                &output,
            ),
            downstream: receipt,
            output,
        };
        let holder = operation.outbox.lease_owner.clone().unwrap_or_else(|| id("nobody"));
        let attempts = operation.outbox.attempt_count;
        for stale in [
            Finalizer::Lease(Lease { owner: holder.clone(), attempt: attempts - 1 }),
            Finalizer::Lease(Lease { owner: id("ghost"), attempt: attempts }),
        ] {
            let outcome = store
                .end(&status_ref(&scope), &stale, &Ending::Succeeded(&local), at(self.now))
                .unwrap();
            assert_ne!(outcome, Finalize::Finalized, "a stale lease holder finalized");
        }
    }

    /// Checks one step: its answer against the model, then the store against the model
    /// and the ledger's invariants.
    fn check(
        &mut self,
        step: &Step,
        answer: Option<Result<Answer, EngineError>>,
        key: Option<usize>,
        tally: &Tally,
    ) -> Result<(), String> {
        let store = held(&self.backend);
        let key_name = |key: usize| format!("key-{key}");
        if let (Some(answer), Some(key)) = (answer, key) {
            bump(&tally.answers);
            let accepted_now = store.contains_key(&key_name(key));
            match answer {
                Err(err) => {
                    if accepted_now && !self.model[key].accepted {
                        return Err(format!(
                            "{step:?} accepted key-{key} and answered an error: {err}"
                        ));
                    }
                }
                Ok(answer) => {
                    let package = answer.package();
                    // With a null status, OUTCOME_UNKNOWN says commit A may not hold: only
                    // a commit that failed while committing may answer so.
                    let in_doubt = package["status"].is_null()
                        && matches!(
                            step,
                            Step::Dispatch { fault: Rule::CommitUnknownCall(..), .. }
                        );
                    if answer.code() == "OUTCOME_UNKNOWN" && !accepted_now && !in_doubt {
                        return Err(format!("{step:?} answered OUTCOME_UNKNOWN for nothing held"));
                    }
                    if answer.delivery().is_some_and(|delivery| delivery.as_str() == "fresh") {
                        self.model[key].fresh += 1;
                        // Only the current lease holder finalizes.
                        let holder = match step {
                            Step::Dispatch { .. } => "dispatcher".to_owned(),
                            Step::Process { worker, .. } => format!("worker-{worker}"),
                            _ => String::new(),
                        };
                        let owner = self.backend.text(&format!(
                            "SELECT b.lease_owner FROM outbox b JOIN operations o ON o.id = b.op_id \
                             WHERE o.idempotency_key = 'key-{key}'"
                        ));
                        if !holder.is_empty() && owner != holder {
                            return Err(format!("{step:?} finalized under {owner}'s lease"));
                        }
                    }
                    if let Some(status) =
                        package["status"].as_str().filter(|status| terminal(status))
                    {
                        let result = package
                            .pointer("/result/digests/result_sha256")
                            .and_then(serde_json::Value::as_str)
                            .unwrap_or("")
                            .to_owned();
                        let said = (status.to_owned(), result);
                        match &self.model[key].ended {
                            Some(ended)
                                if ended.0 != said.0
                                    || (!said.1.is_empty() && ended.1 != said.1) =>
                            {
                                return Err(format!(
                                    "{step:?} answered {said:?} for key-{key}, which ended {ended:?}"
                                ));
                            }
                            Some(_) => {}
                            None => self.model[key].ended = Some(said),
                        }
                    }
                }
            }
        }
        for (index, model) in self.model.iter_mut().enumerate() {
            match store.get(&key_name(index)) {
                None if model.accepted => {
                    return Err(format!("key-{index} was accepted and is gone"));
                }
                None => {}
                Some((status, result)) => {
                    model.accepted = true;
                    if let Some(ended) = &model.ended {
                        let lost = model.lost && !terminal(status);
                        if !lost
                            && (status, result) != (&ended.0, &ended.1)
                            && !(ended.1.is_empty() && status == &ended.0)
                        {
                            return Err(format!(
                                "key-{index} ended {ended:?} and the store now holds {status}/{result}"
                            ));
                        }
                        if lost && ended.0 != "succeeded" {
                            return Err(format!(
                                "a power loss took back key-{index}'s ending {ended:?}"
                            ));
                        }
                        model.lost = lost;
                    } else if terminal(status) {
                        model.ended = Some((status.clone(), result.clone()));
                    }
                }
            }
            if model.fresh > 1 {
                return Err(format!("key-{index} was finalized freshly {} times", model.fresh));
            }
        }
        self.invariants()
    }

    fn invariants(&mut self) -> Result<(), String> {
        let counts = self.backend.rows(
            "SELECT (SELECT count(*) FROM downstream_receipts d LEFT JOIN operations o \
             ON o.downstream_request_ref = d.downstream_request_ref WHERE o.id IS NULL), \
             (SELECT count(*) FROM downstream_receipts), (SELECT count(*) FROM operations), \
             (SELECT count(*) FROM operations o LEFT JOIN local_receipts l ON l.op_id = o.id \
             WHERE o.status = 'succeeded' AND l.op_id IS NULL)",
        );
        let count = |index: usize| -> i64 {
            counts[0][index].as_deref().unwrap_or_default().parse().unwrap()
        };
        let (orphans, effects, operations, unreceipted) = (count(0), count(1), count(2), count(3));
        if orphans != 0 || effects > operations || unreceipted != 0 {
            return Err(format!(
                "{orphans} receipts without an operation, {effects} effects for {operations} operations, \
                 {unreceipted} succeeded operations without a local receipt"
            ));
        }
        // One snapshot, on a connection of its own kept for the run.
        let report =
            self.auditor.audit().map_err(|err| format!("the audit could not run: {err}"))?;
        let audit = crate::audited(&report);
        if audit.code() != "OK" {
            return Err(format!("the audit failed: {}", audit.package()));
        }
        Ok(())
    }

    /// The public recovery path past every lease: relay passes, then a status query and
    /// a worker for each operation still open. Every accepted intent must end.
    fn recover(&mut self, tally: &Tally) -> Result<(), String> {
        self.roles.revoke_all();
        self.roles.grant("tenant-a", "user-1", "support_agent");
        for _ in 0..4 {
            // Past every lease and every backoff of a run.
            self.now += 400;
            let state = keyed(0, self.now).business_state;
            let clock = self.clock();
            self.engine
                .relay_batch(&id("recovery"), &clock, &state, 16, Backoff::default())
                .map_err(|err| format!("the recovery relay failed: {err}"))?;
            for key in 0..KEYS {
                let case = keyed(key, self.now);
                let status_ref = status_ref(&scope_of(&case));
                let open = held(&self.backend)
                    .get(&format!("key-{key}"))
                    .is_some_and(|(status, _)| !terminal(status));
                if !open {
                    continue;
                }
                let status = self.engine.status_of(&case, status_ref.as_str());
                self.check(
                    &Step::Status { key, fault: Rule::Clean },
                    Some(status),
                    Some(key),
                    tally,
                )?;
                let clock = self.clock();
                let worked = self.engine.process_at(
                    status_ref.as_str(),
                    &clock,
                    &case.business_state,
                    &id("recovery"),
                    None,
                );
                self.check(
                    &Step::Process { key, worker: 9, drill: None, fault: Rule::Clean },
                    Some(worked),
                    Some(key),
                    tally,
                )?;
            }
        }
        let store = held(&self.backend);
        for (key, (status, _)) in &store {
            if !terminal(status) {
                return Err(format!("{key} is still {status} after recovery"));
            }
            bump(&tally.ended);
        }
        Ok(())
    }
}

fn simulate<B: StoreUnderTest>(steps: &[Step], tally: &Tally) -> Result<(), String> {
    let mut sim = Sim::<B>::new();
    bump(&tally.runs);
    for (index, step) in steps.iter().enumerate() {
        bump(&tally.steps);
        let (answer, key) = sim.run(step, tally);
        sim.check(step, answer, key, tally).map_err(|err| format!("step {index}: {err}"))?;
    }
    sim.recover(tally).map_err(|err| format!("recovery: {err}"))
}

/// Runs the seeded interleavings on backend `B`.
fn interleavings_keep_every_promise<B: StoreUnderTest>() {
    let seed = setting("TOOLLEDGER_SIM_SEED", SEED);
    // PostgreSQL runs one case in fifty: each of its cases costs about fifty times a
    // SQLite one here (a database created per case, a connection per restarted process,
    // a flushed commit per write).
    let cases = setting("TOOLLEDGER_SIM_CASES", 50);
    let cases = if B::NAME == "postgres" { (cases / 50).max(1) } else { cases };
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases: u32::try_from(cases).unwrap(),
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let tally = Tally::default();
    let outcome = runner.run(&proptest::collection::vec(step(), 1..32), |steps| {
        simulate::<B>(&steps, &tally).map_err(TestCaseError::fail)
    });
    if let Err(err) = outcome {
        panic!(
            "the simulation on {} failed (seed {seed}): {err}\nreproduce: TOOLLEDGER_SIM_SEED={seed} \
             TOOLLEDGER_SIM_CASES={cases} cargo test -p toolledger-conformance --test it -- simulation",
            B::NAME
        );
    }
    println!(
        "simulation: store {}, seed {seed}, {} interleavings, {} steps, {} injected failures, {} crashes, \
         {} power losses ({} taking back a commit C), {} answers checked, {} operations ended by recovery",
        B::NAME,
        tally.runs.get(),
        tally.steps.get(),
        tally.fails.get(),
        tally.crashes.get(),
        tally.power_losses.get(),
        tally.lost_commits.get(),
        tally.answers.get(),
        tally.ended.get()
    );
}

#[test]
fn seeded_interleavings_keep_every_promise_on_sqlite() {
    interleavings_keep_every_promise::<toolledger_conformance::Sqlite>();
}

#[test]
fn seeded_interleavings_keep_every_promise_on_postgres() {
    interleavings_keep_every_promise::<toolledger_conformance::Postgres>();
}
