//! Rows changed behind the store's back: the audit names them, reads refuse them.

use toolledger_engine::StandInReceipts;
use toolledger_store::{Claim, Ending, Finalizer, Lease, LedgerStore, StoreError};

use crate::{at, fresh, intent, lease, raw, receipts, sr, stand_in, store, worker};

/// The checks that failed.
fn failed(store: &mut toolledger_store_postgres::PgStore) -> Vec<&'static str> {
    let report = store.audit().unwrap();
    report.checks.iter().filter(|(_, passed)| !passed).map(|(check, _)| *check).collect()
}

#[test]
fn tampered_arguments_are_found_by_the_audit_and_refused_by_every_read() {
    let url = fresh("tamper_args");
    let mut store = store(&url);
    let (first, call) = intent("k-1");
    let (second, second_call) = intent("k-2");
    store.reserve(&first, &call, at(0)).unwrap();
    store.reserve(&second, &second_call, at(0)).unwrap();
    let (downstream, local) = receipts(&first);
    store.claim(&sr(&first), &worker("w"), at(1), lease(30)).unwrap();
    store.record_downstream_receipt(&downstream, at(2)).unwrap();
    let by = Finalizer::Lease(Lease { owner: worker("w"), attempt: 1 });
    store.end(&sr(&first), &by, &Ending::Succeeded(&local), at(3)).unwrap();
    assert!(failed(&mut store).is_empty());

    let mut client = raw(&url);
    // Not canonical (a space), same meaning.
    let text: String = client
        .query_one(
            "SELECT arguments_json FROM operations WHERE status_ref = $1",
            &[&sr(&first).as_str()],
        )
        .unwrap()
        .get(0);
    let spaced = text.replacen(':', ": ", 1);
    client
        .execute(
            "UPDATE operations SET arguments_json = $1 WHERE status_ref = $2",
            &[&spaced, &sr(&first).as_str()],
        )
        .unwrap();
    assert_eq!(failed(&mut store), ["json_canonical"]);
    let report = store.audit().unwrap();
    assert!(report.findings.iter().any(|finding| finding.check == "json_canonical"
        && finding.reference.as_deref() == Some(sr(&first).as_str())));
    for read in [
        store.operation_by_status_ref(&sr(&first)).map(drop),
        store.operation_by_scope(&first.scope).map(drop),
        store.dispatch_lookup(&first.scope, &call).map(drop),
    ] {
        assert!(matches!(read.unwrap_err(), StoreError::ContractViolation(_)));
    }

    // Canonical but different: the request digest no longer recomputes.
    client
        .execute(
            "UPDATE operations SET arguments_json = '{\"amount\":1}' WHERE status_ref = $1",
            &[&sr(&second).as_str()],
        )
        .unwrap();
    assert_eq!(failed(&mut store), ["json_canonical", "digests_recompute"]);
    assert!(matches!(
        store.operation_by_status_ref(&sr(&second)).unwrap_err(),
        StoreError::ContractViolation(_)
    ));
    // The claim reads the row back and rolls back: nothing written.
    assert!(matches!(
        store.claim(&sr(&second), &worker("w"), at(5), lease(30)).unwrap_err(),
        StoreError::ContractViolation(_)
    ));
    let state: String = client
        .query_one(
            "SELECT b.state FROM outbox b JOIN operations o ON o.id = b.op_id WHERE o.status_ref = $1",
            &[&sr(&second).as_str()],
        )
        .unwrap()
        .get(0);
    assert_eq!(state, "pending");
    // A relay's batch skips it, and claims nothing else.
    let batch = store.claim_due(&worker("relay"), &stand_in(), at(6), lease(30), 10).unwrap();
    assert_eq!((batch.claimed.len(), batch.skipped), (0, 1));

    // Text that is not JSON at all is refused by the column's CHECK.
    assert!(
        client
            .execute(
                "UPDATE operations SET arguments_json = 'not json' WHERE status_ref = $1",
                &[&sr(&second).as_str()],
            )
            .is_err()
    );
}

#[test]
fn a_claim_of_an_intact_row_beside_a_tampered_one_succeeds() {
    let url = fresh("tamper_beside");
    let mut store = store(&url);
    let (first, call) = intent("k-1");
    let (second, second_call) = intent("k-2");
    store.reserve(&first, &call, at(0)).unwrap();
    store.reserve(&second, &second_call, at(1)).unwrap();
    raw(&url)
        .execute(
            "UPDATE operations SET request_sha256 = repeat('0', 64) WHERE status_ref = $1",
            &[&sr(&first).as_str()],
        )
        .unwrap();
    let batch = store.claim_due(&worker("relay"), &stand_in(), at(2), lease(30), 10).unwrap();
    assert_eq!(batch.skipped, 1);
    assert_eq!(batch.claimed.len(), 1);
    assert_eq!(batch.claimed[0].operation.intent.status_ref, sr(&second));
    assert!(matches!(
        store.claim(&sr(&second), &worker("w"), at(3), lease(30)).unwrap(),
        Claim::LeaseHeld
    ));
}
