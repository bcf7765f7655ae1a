//! Properties of the lease state machine: random interleavings of dispatch, process,
//! status, lease expiry and failure points over a few keys never make two downstream
//! receipts for one scope, a succeeded operation without a local receipt, or a finalize
//! by a stale lease holder; and the audit passes after every step.

use crate::Backend;
use std::collections::BTreeMap;

use crate::{FailurePoint, Flows, audit_sqlite};
use proptest::prelude::*;
use toolledger_contract::digest::{downstream_request_ref, result_sha256};
use toolledger_contract::{
    Clock, IdempotencyKey, LeaseSeconds, Registry, Scope, digest::status_ref,
};
use toolledger_store::{Finalize, Finalizer, LedgerStore, LocalReceipt, StandInReceipts};

use crate::{Db, Roles, at, case_with, id};

const NOW: i64 = 1_767_225_600;
const KEYS: usize = 3;

#[derive(Debug, Clone)]
enum Step {
    Dispatch {
        key: usize,
        failure: Option<FailurePoint>,
    },
    Process {
        key: usize,
        worker: usize,
        failure: Option<FailurePoint>,
    },
    Status {
        key: usize,
    },
    Advance {
        seconds: i64,
    },
    /// A worker that lost its lease wakes up and tries commit C with what it held.
    StaleFinalize {
        key: usize,
    },
}

fn failure() -> impl Strategy<Value = Option<FailurePoint>> {
    prop_oneof![
        Just(None),
        Just(Some(FailurePoint::AfterIntentCommit)),
        Just(Some(FailurePoint::AfterClaim)),
        Just(Some(FailurePoint::AfterDownstreamCommit))
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..KEYS, failure()).prop_map(|(key, failure)| Step::Dispatch { key, failure }),
        (0..KEYS, 0..3usize, failure()).prop_map(|(key, worker, failure)| Step::Process {
            key,
            worker,
            // process has no intent commit of its own
            failure: failure.filter(|point| *point != FailurePoint::AfterIntentCommit),
        }),
        (0..KEYS).prop_map(|key| Step::Status { key }),
        (0..45i64).prop_map(|seconds| Step::Advance { seconds }),
        (0..KEYS).prop_map(|key| Step::StaleFinalize { key }),
    ]
}

fn keyed(key: usize, now: i64) -> toolledger_contract::Case {
    // Each key is its own model call: one call is one intent.
    let mut case = case_with(|case| {
        case.host.idempotency_key = IdempotencyKey::new(&format!("key-{key}")).unwrap();
        case.host.provider_call_id = crate::id(&format!("call-key-{key}"));
    });
    case.clock.now = at(now);
    case
}

fn scope_of(case: &toolledger_contract::Case) -> Scope {
    Scope {
        tenant_id: case.principal.tenant_id.clone(),
        subject_id: case.principal.subject_id.clone(),
        tool_name: "refund_order".to_owned(),
        idempotency_key: case.host.idempotency_key.clone(),
    }
}

fn lease_owner(db: &Db, key: usize) -> String {
    db.text(&format!(
        "SELECT o.lease_owner FROM outbox o JOIN operations p ON p.id = o.op_id WHERE p.idempotency_key = 'key-{key}'"
    ))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn no_interleaving_breaks_the_ledger(steps in proptest::collection::vec(step(), 1..24)) {
        let db = Db::fresh();
        let mut engine = db.engine_with(Roles::default(), Registry::builtin());
        let mut now = NOW;
        let mut fresh_per_key: BTreeMap<usize, usize> = BTreeMap::new();
        for step in &steps {
            match *step {
                Step::Advance { seconds } => now += seconds,
                Step::Dispatch { key, failure } => {
                    let answer = engine.dispatch_at(&keyed(key, now), &id("dispatcher"), failure).unwrap();
                    if answer.delivery().is_some_and(|delivery| delivery.as_str() == "fresh") {
                        *fresh_per_key.entry(key).or_default() += 1;
                        prop_assert_eq!(lease_owner(&db, key), "dispatcher");
                    }
                }
                Step::Process { key, worker, failure } => {
                    let case = keyed(key, now);
                    let scope = scope_of(&case);
                    let clock = Clock { now: at(now), lease_seconds: LeaseSeconds::new(30).unwrap() };
                    let worker_id = format!("worker-{worker}");
                    let answer = engine.process_at(status_ref(&scope).as_str(), &clock, &case.business_state, &id(&worker_id), failure).unwrap();
                    if answer.delivery().is_some_and(|delivery| delivery.as_str() == "fresh") {
                        *fresh_per_key.entry(key).or_default() += 1;
                        // Only the current lease holder finalizes.
                        prop_assert_eq!(lease_owner(&db, key), worker_id);
                    }
                }
                Step::StaleFinalize { key } => {
                    let case = keyed(key, now);
                    let scope = scope_of(&case);
                    let store = engine.store();
                    let Some(operation) = store.operation_by_status_ref(&status_ref(&scope)).unwrap() else { continue };
                    let dr_ref = downstream_request_ref(&scope, &operation.intent.request_sha256);
                    let Some(receipt) = store.downstream_receipt(&dr_ref).unwrap() else { continue };
                    let output = receipt.receipt["output"].clone();
                    let local = LocalReceipt {
                        result_sha256: result_sha256("refund_order", &operation.intent.revisions.output, &output),
                        downstream: receipt,
                        output,
                    };
                    let holder = operation.outbox.lease_owner.clone().unwrap_or_else(|| "nobody".to_owned());
                    let attempts = operation.outbox.attempt_count;
                    for stale in [
                        Finalizer::Lease { owner: id(&holder), attempt: attempts - 1 },
                        Finalizer::Lease { owner: id("ghost"), attempt: attempts },
                    ] {
                        let outcome = store.finalize(&status_ref(&scope), &stale, &local, at(now)).unwrap();
                        prop_assert_ne!(outcome, Finalize::Finalized);
                    }
                }
                Step::Status { key } => {
                    let case = keyed(key, now);
                    let scope = scope_of(&case);
                    engine.status_of(&case, status_ref(&scope).as_str()).unwrap();
                }
            }
            if !db.path().exists() {
                continue;
            }
            // One downstream receipt per scope at most, each belonging to an operation.
            prop_assert_eq!(db.int(
                "SELECT count(*) FROM downstream_receipts d LEFT JOIN operations o \
                 ON o.downstream_request_ref = d.downstream_request_ref WHERE o.id IS NULL"), 0);
            prop_assert!(db.count("downstream_receipts") <= db.count("operations"));
            // Succeeded ⇔ local receipt ⇔ delivered, and every row re-verifies.
            prop_assert_eq!(db.int(
                "SELECT count(*) FROM operations o LEFT JOIN local_receipts l ON l.op_id = o.id \
                 WHERE o.status = 'succeeded' AND l.op_id IS NULL"), 0);
            let audit = audit_sqlite(db.path()).unwrap();
            prop_assert_eq!(audit.code(), "OK", "{}", audit.package());
        }
        // A key is finalized freshly at most once, whoever does it.
        prop_assert!(fresh_per_key.values().all(|count| *count <= 1), "{:?}", fresh_per_key);
        prop_assert!(db.count("local_receipts") <= KEYS as i64);
    }
}
