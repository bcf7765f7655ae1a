//! `load_finished`: a batch of finished operations written set-based reads back verified,
//! audits clean, replays as any finished operation would, and is never written twice.

use toolledger_store::{LedgerStore, OperationStatus, StoreError};

use crate::{assert_audit_passes, at, count, fresh, intent, raw, receipts, sr, store};

#[test]
fn loaded_operations_verify_audit_clean_and_are_never_loaded_twice() {
    let url = fresh("load");
    let mut store = store(&url);
    let batch: Vec<_> = (0..25)
        .map(|index| {
            let (intent, call) = intent(&format!("loaded-{index}"));
            let (_, local) = receipts(&intent);
            (intent, call, local)
        })
        .collect();
    assert_eq!(store.load_finished(&batch, at(1_767_225_600)).unwrap(), 25);
    for (intent, call, local) in &batch {
        let operation = store.operation_by_status_ref(&sr(intent)).unwrap().unwrap();
        assert_eq!(operation.status, OperationStatus::Succeeded);
        assert_eq!(operation.receipt.as_ref(), Some(local));
        assert_eq!(operation.outbox.attempt_count, 1);
        let recorded = store.recorded_call(call).unwrap().unwrap();
        assert_eq!(recorded.status_ref, intent.status_ref);
    }
    assert_audit_passes(&mut store);
    let mut client = raw(&url);
    assert_eq!(
        count(&mut client, "SELECT sum(value)::bigint FROM counters WHERE name = 'claims'"),
        25
    );

    // Loading any of them again refuses the whole batch and writes nothing.
    let (fresh_intent, fresh_call) = intent("loaded-new");
    let (_, fresh_local) = receipts(&fresh_intent);
    let again = vec![(fresh_intent, fresh_call, fresh_local), batch[3].clone()];
    assert!(matches!(
        store.load_finished(&again, at(1_767_225_700)),
        Err(StoreError::ContractViolation(_))
    ));
    assert_eq!(count(&mut client, "SELECT count(*) FROM operations"), 25);
    assert_eq!(count(&mut client, "SELECT count(*) FROM local_receipts"), 25);
}
