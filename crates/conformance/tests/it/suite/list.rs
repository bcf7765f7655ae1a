//! `list` on every backend: keyset pages that add up to the whole listing, the tool
//! filter, the `processing`/`unknown` split inside a page, operations that move while a
//! walk is under way, and cursors that are refused.

use std::collections::BTreeSet;

use toolledger_contract::{IdempotencyKey, LeaseSeconds, Registry, StatusRef};
use toolledger_store::{
    CallIdentity, Claim, Ending, Finalize, Finalizer, Lease, LedgerStore, ListFilter, Listed,
    NewOperation, OperatorStore, Release, STATES, StoreError,
};

use crate::{StoreUnderTest, at, case, id, stand_in_identity};

const BASE: i64 = 1_767_225_600;
/// When every listing is judged: the live leases (1,000 s) are still held, the short
/// ones (5 s) have ended.
const NOW: i64 = BASE + 100;
const TOOLS: [&str; 2] = ["refund_order", "open_ticket"];

/// The case's intent for `tool` under key `key`, its approval bound to that tool, and its
/// own model call. The store knows no registry: another tool's name is as good as the
/// built-in one, with the refund's arguments and revisions.
fn intent(tool: &str, key: &str) -> (NewOperation, CallIdentity) {
    let mut case = case();
    case.host.idempotency_key = IdempotencyKey::new(key).unwrap();
    case.host.provider_call_id = id(&format!("call-{key}"));
    let revisions = Registry::builtin().tool("refund_order").unwrap().revisions.clone();
    toolledger_testkit::intent_of(&case, tool, &revisions, stand_in_identity())
}

fn claim<S: LedgerStore>(store: &mut S, status_ref: &StatusRef, now: i64, lease_seconds: i64) {
    let lease = LeaseSeconds::new(lease_seconds).unwrap();
    let claimed = store.claim(status_ref, &id("worker"), at(now), lease).unwrap();
    assert!(matches!(claimed, Claim::Claimed(_)), "{claimed:?}");
}

/// 24 operations of two tools in five states. Accepted four to a second and claimed in
/// shared seconds, so ties on `updated_at` are broken by row id; the stored `processing`
/// rows alternate live and ended leases (`processing`, `unknown`), ties included.
fn ledger<B: StoreUnderTest>() -> (B, B::Store, Vec<StatusRef>) {
    let db = B::fresh();
    let mut store = db.store();
    let mut refs = Vec::new();
    for index in 0..24_i64 {
        let tool = TOOLS[usize::from(index % 4 < 2)];
        let (intent, call) = intent(tool, &format!("k-{index:02}"));
        store.reserve(&intent, &call, at(BASE + index / 4)).unwrap();
        let status_ref = intent.status_ref;
        let claimed_at = BASE + 10 + index / 4;
        let by = Finalizer::Lease(Lease { owner: id("worker"), attempt: 1 });
        match index % 6 {
            1 => claim(&mut store, &status_ref, claimed_at, 1000),
            2 => claim(&mut store, &status_ref, claimed_at, 5),
            3 => {
                claim(&mut store, &status_ref, claimed_at, 1000);
                let failed = store
                    .end(&status_ref, &by, &Ending::Failed("refused"), at(claimed_at))
                    .unwrap();
                assert_eq!(failed, Finalize::Finalized);
            }
            4 => {
                claim(&mut store, &status_ref, claimed_at, 1000);
                let dead = Release::Dead { reason: "attempts spent" };
                let released = store
                    .release(
                        &status_ref,
                        &Lease { owner: id("worker"), attempt: 1 },
                        &dead,
                        at(claimed_at),
                    )
                    .unwrap();
                assert_eq!(released, Finalize::Finalized);
            }
            _ => {}
        }
        refs.push(status_ref);
    }
    (db, store, refs)
}

/// The whole listing of `filter` in one call.
fn unpaged<S: OperatorStore>(store: &mut S, filter: ListFilter<'_>) -> Vec<Listed> {
    let all = store.list(&ListFilter { limit: 10_000, ..filter }, false, at(NOW)).unwrap();
    assert!(all.len() < 10_000);
    all
}

/// The listing of `filter` walked `size` at a time, each page after the last one's final
/// cursor: every page but the last is full.
fn paged<S: OperatorStore>(store: &mut S, filter: ListFilter<'_>, size: usize) -> Vec<Vec<Listed>> {
    paged_with(store, filter, size, |_, _| {})
}

/// As [`paged`], calling `between(store, pages so far)` before each page after the first.
fn paged_with<S: OperatorStore>(
    store: &mut S,
    filter: ListFilter<'_>,
    size: usize,
    mut between: impl FnMut(&mut S, &[Vec<Listed>]),
) -> Vec<Vec<Listed>> {
    let mut pages: Vec<Vec<Listed>> = Vec::new();
    loop {
        let cursor = pages.last().and_then(|page| page.last()).map(|last| last.cursor.clone());
        if cursor.is_some() {
            between(store, &pages);
        }
        let page = ListFilter { limit: size, after: cursor.as_deref(), ..filter };
        let page = store.list(&page, false, at(NOW)).unwrap();
        assert!(page.len() <= size, "a page of {size} answered {}", page.len());
        let full = page.len() == size;
        pages.push(page);
        if !full {
            return pages;
        }
        assert!(pages.len() <= 100, "the walk does not end");
    }
}

fn refs(listed: &[Listed]) -> Vec<&str> {
    listed.iter().map(|listed| listed.status_ref.as_str()).collect()
}

fn states(listed: &[Listed]) -> Vec<&'static str> {
    listed.iter().map(|listed| listed.state).collect()
}

/// Asserts `listed` is in the listing's order: states in [`STATES`] order, oldest change
/// first within each, no operation twice.
fn assert_ordered(listed: &[Listed]) {
    let rank = |state: &str| STATES.iter().position(|known| *known == state).unwrap();
    for pair in listed.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let in_order = rank(a.state) < rank(b.state) || (a.state == b.state && a.idle >= b.idle);
        assert!(in_order, "{a:?} before {b:?}");
    }
    let distinct: BTreeSet<&str> = refs(listed).into_iter().collect();
    assert_eq!(distinct.len(), listed.len(), "an operation is listed twice");
}

pub(crate) fn pages_of_any_size_add_up_to_the_unpaged_listing<B: StoreUnderTest>() {
    let (_db, mut store, _) = ledger::<B>();
    let all = unpaged(&mut store, ListFilter::default());
    assert_ordered(&all);
    let counted: Vec<usize> = STATES
        .iter()
        .map(|state| all.iter().filter(|listed| listed.state == *state).count())
        .collect();
    assert_eq!(counted, [8, 4, 4, 0, 4, 0, 4], "{:?}", states(&all));
    for size in 1..=5 {
        let pages = paged(&mut store, ListFilter::default(), size);
        assert_eq!(pages.concat(), all, "pages of {size}");
        assert_eq!(pages.len(), all.len() / size + 1, "pages of {size}");
    }
}

pub(crate) fn the_tool_filter_and_its_combination_with_state_and_age_walk_by_pages<
    B: StoreUnderTest,
>() {
    let (_db, mut store, _) = ledger::<B>();
    let all = unpaged(&mut store, ListFilter::default());
    for tool in TOOLS {
        let filter = ListFilter { tool: Some(tool), ..ListFilter::default() };
        let of_tool = unpaged(&mut store, filter);
        let expected: Vec<&str> = all
            .iter()
            .filter(|listed| listed.tool == tool)
            .map(|l| l.status_ref.as_str())
            .collect();
        assert_eq!(refs(&of_tool), expected, "{tool}");
        assert_eq!(of_tool.len(), 12, "{tool}");
        assert_eq!(paged(&mut store, filter, 3).concat(), of_tool, "{tool}");
    }
    // A state, a tool and an age at once: pending refunds unchanged for 98 seconds or
    // more (accepted in the first three seconds).
    let (state, tool, older_than) = ("pending", "refund_order", NOW - BASE - 2);
    let filter =
        ListFilter { state: Some(state), tool: Some(tool), older_than, ..ListFilter::default() };
    let narrowed = unpaged(&mut store, filter);
    let expected: Vec<&str> = all
        .iter()
        .filter(|l| l.state == state && l.tool == tool && l.idle >= older_than)
        .map(|l| l.status_ref.as_str())
        .collect();
    assert_eq!(refs(&narrowed), expected);
    assert_eq!(narrowed.len(), 2, "{narrowed:?}");
    for size in 1..=3 {
        assert_eq!(paged(&mut store, filter, size).concat(), narrowed, "pages of {size}");
    }
    // No operation of an unknown tool.
    let none = ListFilter { tool: Some("no_such_tool"), ..ListFilter::default() };
    assert!(unpaged(&mut store, none).is_empty());
}

pub(crate) fn a_page_boundary_inside_the_processing_unknown_split_loses_and_repeats_nothing<
    B: StoreUnderTest,
>() {
    let (_db, mut store, _) = ledger::<B>();
    // Stored `processing` rows, in (updated_at, id) order, alternate a live lease and an
    // ended one, and two seconds hold one of each: each listed state skips the other's.
    for state in ["processing", "unknown"] {
        let filter = ListFilter { state: Some(state), ..ListFilter::default() };
        let listed = unpaged(&mut store, filter);
        assert_eq!(states(&listed), [state; 4]);
        for size in 1..=3 {
            // Every page but the last is full: the split does not leave short pages.
            assert_eq!(paged(&mut store, filter, size).concat(), listed, "{state} by {size}");
        }
    }
    // Across the two: the last `processing` operation's cursor continues with the first
    // `unknown` one.
    let all = unpaged(&mut store, ListFilter::default());
    let last_live = all.iter().rposition(|listed| listed.state == "processing").unwrap();
    let after =
        ListFilter { limit: 1, after: Some(&all[last_live].cursor), ..ListFilter::default() };
    let next = store.list(&after, false, at(NOW)).unwrap();
    assert_eq!(next, [all[last_live + 1].clone()]);
    assert_eq!(next[0].state, "unknown");
}

pub(crate) fn an_operation_that_moves_between_pages_does_not_break_the_walk<B: StoreUnderTest>() {
    let (_db, mut store, _) = ledger::<B>();
    let before = unpaged(&mut store, ListFilter::default());
    let pending: Vec<String> = before
        .iter()
        .filter(|listed| listed.state == "pending")
        .map(|listed| listed.status_ref.clone())
        .collect();
    let mut moved = Vec::new();
    let pages = paged_with(&mut store, ListFilter::default(), 2, |store, pages| {
        if pages.len() != 1 {
            return;
        }
        // After the first page: the operation whose cursor the walk continues from, and one
        // the walk has not reached, are claimed: both move to the end of `processing`.
        let carrier = pages[0].last().unwrap().status_ref.clone();
        let unreached = pending.last().unwrap().clone();
        for status_ref in [&carrier, &unreached] {
            claim(store, &StatusRef::new(status_ref).unwrap(), NOW, 1000);
        }
        moved.extend([carrier, unreached]);
    });
    let walked = pages.concat();
    assert_eq!(moved.len(), 2);
    // Within each state no operation twice, and each state in order.
    for state in STATES {
        let run: Vec<Listed> = walked.iter().filter(|l| l.state == state).cloned().collect();
        assert_ordered(&run);
    }
    // The carrier was listed as pending and is met again, at the end of processing; the
    // unreached one is met only there. Nothing else moved or went missing.
    let processing: Vec<&str> =
        walked.iter().filter(|l| l.state == "processing").map(|l| l.status_ref.as_str()).collect();
    assert_eq!(processing[processing.len() - 2..], [moved[0].as_str(), moved[1].as_str()]);
    let walked_pending: Vec<&str> =
        walked.iter().filter(|l| l.state == "pending").map(|l| l.status_ref.as_str()).collect();
    let expected_pending: Vec<&str> =
        pending.iter().map(String::as_str).filter(|sr| *sr != moved[1]).collect();
    assert_eq!(walked_pending, expected_pending);
    assert_eq!(walked.len(), before.len() + 1);
    // And the listing now is what the walk saw, less the carrier's first place.
    let after = unpaged(&mut store, ListFilter::default());
    let mut seen = refs(&walked);
    seen.remove(seen.iter().position(|sr| *sr == moved[0]).unwrap());
    assert_eq!(refs(&after), seen);
}

pub(crate) fn a_malformed_edited_or_misplaced_cursor_is_a_usage_error<B: StoreUnderTest>() {
    let (_db, mut store, _) = ledger::<B>();
    let refunds = ListFilter { tool: Some("refund_order"), limit: 2, ..ListFilter::default() };
    let cursor = store.list(&refunds, false, at(NOW)).unwrap().pop().unwrap().cursor;
    let edited = {
        let mut edited = cursor.clone().into_bytes();
        let last = edited.last_mut().unwrap();
        *last = if *last == b'0' { b'1' } else { b'0' };
        String::from_utf8(edited).unwrap()
    };
    let refused = [
        (refunds, String::new()),
        (refunds, "not a cursor".to_owned()),
        (refunds, "c1.0.0.0.0'; DROP TABLE operations; --".to_owned()),
        (refunds, "\u{0}".repeat(100)),
        (refunds, edited),
        (refunds, cursor[..cursor.len() - 2].to_owned()),
        (ListFilter { tool: Some("open_ticket"), ..refunds }, cursor.clone()),
        (ListFilter { tool: None, ..refunds }, cursor.clone()),
        (ListFilter { state: Some("dead"), ..refunds }, cursor.clone()),
    ];
    for (filter, text) in &refused {
        let filter = ListFilter { after: Some(text), ..*filter };
        let err = store.list(&filter, false, at(NOW)).unwrap_err();
        assert_eq!(err, StoreError::InvalidCursor, "{text:?}");
        assert_eq!(err.code(), "USAGE_ERROR");
        assert!(text.is_empty() || !err.to_string().contains(text.as_str()), "{err}");
    }
    // The store is unharmed, and the cursor still works where it belongs.
    let next = store.list(&ListFilter { after: Some(&cursor), ..refunds }, false, at(NOW)).unwrap();
    assert_eq!(next.len(), 2);
    assert!(next.iter().all(|listed| listed.tool == "refund_order"));
}
