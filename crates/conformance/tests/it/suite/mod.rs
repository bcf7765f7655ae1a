//! The conformance suite: every test here is written once over [`StoreUnderTest`] and runs on
//! every store, so SQLite and PostgreSQL are held to the same rows of the matrix:
//! races, crashes at each commit point, leases and fencing, tampering, the audit, and
//! the operator's paged `list`.
//!
//! [`StoreUnderTest`]: toolledger_conformance::StoreUnderTest

pub(crate) mod audit;
pub(crate) mod concurrency;
pub(crate) mod crash;
pub(crate) mod list;
pub(crate) mod tampering;

/// One `#[test]` per backend for each listed suite test.
macro_rules! suite {
    ($($module:ident :: $test:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $test() {
                crate::suite::$module::$test::<toolledger_conformance::Sqlite>();
            })*
        }
        mod postgres {
            $(#[test]
            fn $test() {
                crate::suite::$module::$test::<toolledger_conformance::Postgres>();
            })*
        }
    };
}

suite!(
    concurrency::eight_connections_reserving_one_intent_make_one_operation_and_one_side_effect,
    concurrency::eight_different_intents_under_one_key_one_wins_the_rest_conflict,
    concurrency::eight_workers_claiming_one_event_get_exactly_one_owner,
    concurrency::eight_processes_of_one_event_make_one_side_effect,
    concurrency::a_replay_on_another_connection_sees_the_first_ones_receipt,
    crash::each_failure_point_leaves_the_crash_table_state_and_redispatch_touches_nothing,
    crash::a_live_lease_is_held_and_an_expired_one_is_reclaimed,
    crash::an_accepted_intent_is_worked_later_by_process,
    crash::a_reclaimed_downstream_request_is_not_executed_twice,
    crash::a_status_query_reconciles_after_the_downstream_commit,
    crash::a_status_query_before_any_downstream_commit_stays_unknown,
    crash::a_stale_lease_holder_cannot_finalize,
    tampering::a_status_out_of_step_with_its_outbox_event_or_receipt_is_refused,
    tampering::a_changed_tenant_is_refused_by_every_command,
    tampering::a_local_receipt_naming_another_downstream_request_is_refused,
    tampering::non_canonical_arguments_are_refused,
    tampering::duplicate_key_arguments_are_refused,
    tampering::arguments_outside_the_input_schema_are_refused_even_with_a_matching_digest,
    tampering::a_changed_stored_digest_is_refused,
    tampering::a_changed_status_ref_is_refused_wherever_the_row_is_read,
    tampering::a_receipt_with_a_wrong_output_or_input_binding_is_refused,
    tampering::a_downstream_receipt_breaking_the_input_binding_is_quarantined,
    tampering::a_changed_replay_record_is_refused_on_replay,
    tampering::a_change_to_a_finished_operations_rows_removes_its_replay_record,
    audit::a_local_receipts_downstream_request_ref_must_recompute,
    audit::call_identities_must_be_bound_to_their_operation,
    audit::a_succeeded_operation_needs_its_downstream_receipt,
    list::pages_of_any_size_add_up_to_the_unpaged_listing,
    list::the_tool_filter_and_its_combination_with_state_and_age_walk_by_pages,
    list::a_page_boundary_inside_the_processing_unknown_split_loses_and_repeats_nothing,
    list::an_operation_that_moves_between_pages_does_not_break_the_walk,
    list::a_malformed_edited_or_misplaced_cursor_is_a_usage_error,
);
