//! The ledger's statements and commit points, written once for every backend
//! (`docs/schema.md`): the reads a dispatch, a worker, a replay and a status query make,
//! and commits A, claim, B and C as [`Commit`] values.
//!
//! Where SQLite's and PostgreSQL's statements used to differ, both now run the stricter
//! one, with the reason beside it: PostgreSQL needs it because `READ COMMITTED` re-checks
//! an updated row's own conditions (not a subquery's) after waiting for a racer's lock;
//! SQLite, whose writers are serialized, loses nothing by it.

use toolledger_contract::{
    DownstreamIdentity, DownstreamRequestRef, Identifier, LeaseSeconds, Purpose, Scope, StatusRef,
};
use toolledger_json::canonicalize;

use crate::{
    CallIdentity, Claim, Claimed, ClaimedBatch, DispatchLookup, DownstreamReceipt, Ending,
    FailureKind, Finalize, Finalizer, Lease, LocalReceipt, NewOperation, Now, OPERATION_WIDTH,
    Operation, OperationStatus, OutboxEvent, OutboxState, RecordedCall, Release, Reservation,
    StoreError, TraceRecord,
    driver::{Arg, Commit, Db, Dialect, Durability, Row, Sql, locked, returning_id},
    not_claimed,
    verify::{self, RawOperation},
};

/// `SELECT` an operation with its outbox event, local receipt and terminal outcome,
/// `WHERE` the filter that follows.
macro_rules! select_operation {
    ($($filter:literal),+) => {
        concat!("SELECT ", operation_columns!(), " ", operation_from!(), " WHERE ", $($filter),+)
    };
}

// The hot statements. Each is named in `statements()`, whose query plans a test checks.
pub(crate) static SELECT_CALL: Sql = Sql::new(
    "SELECT c.purpose, o.status_ref, o.tenant_id, o.subject_id, o.status \
     FROM call_identities c JOIN operations o ON o.id = c.op_id \
     WHERE c.provider = $1 AND c.api_family = $2 AND c.provider_response_id = $3 AND c.provider_call_id = $4",
);
/// No conflict target: a racer holding the scope, or any row holding this intent's refs,
/// makes it insert nothing (in PostgreSQL a targeted `ON CONFLICT` still raises on another
/// unique index when two inserts race). Which one it was is read afterwards.
pub(crate) static INSERT_OPERATION: Sql = returning_id!(
    "INSERT INTO operations (tenant_id, subject_id, tool_name, idempotency_key, status_ref, \
     downstream_request_ref, request_sha256, arguments_json, input_revision, output_revision, \
     effect_revision, handler_revision, producer_revision, policy_revision, provider, api_family, \
     adapter_revision, provider_response_id, provider_call_id, operation_id, approval_id, approver_id, \
     approval_sha256, approved_at, approval_expires_at, downstream_name, downstream_revision, status, \
     created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, \
     $21, $22, $23, $24, $25, $27, $28, $29, $26, $26) \
     ON CONFLICT DO NOTHING"
);
pub(crate) static INSERT_OUTBOX_CLAIMED: Sql = Sql::new(
    "INSERT INTO outbox (op_id, state, lease_owner, lease_until, attempt_count, \
     next_attempt_at, last_reason, attempts_before, created_at, updated_at) \
     VALUES ($1, 'processing', $3, $4, 1, $4, NULL, 0, $2, $2)",
);
pub(crate) static INSERT_OUTBOX: Sql = Sql::new(
    "INSERT INTO outbox (op_id, state, lease_owner, lease_until, attempt_count, next_attempt_at, \
     last_reason, attempts_before, created_at, updated_at) VALUES ($1, 'pending', NULL, NULL, 0, $2, NULL, 0, $2, $2)",
);
/// PostgreSQL keeps a counter as sixteen rows, one per shard, and a session adds to its
/// own (`pg_backend_pid() % 16`): one row would be a lock every claim holds until its
/// commit is flushed, serializing the commits of every host. SQLite has one writer and
/// one row per counter. Readers sum the shards.
pub(crate) static BUMP: Sql = Sql::dialects(
    "INSERT INTO counters (name, value) VALUES ($1, 1) \
     ON CONFLICT (name) DO UPDATE SET value = value + 1",
    "INSERT INTO counters (name, shard, value) VALUES ($1, pg_backend_pid() % 16, 1) \
     ON CONFLICT (name, shard) DO UPDATE SET value = counters.value + 1",
);
pub(crate) static BUMP_BY: Sql = Sql::dialects(
    "INSERT INTO counters (name, value) VALUES ($1, $2) \
     ON CONFLICT (name) DO UPDATE SET value = value + $2",
    "INSERT INTO counters (name, shard, value) VALUES ($1, pg_backend_pid() % 16, $2) \
     ON CONFLICT (name, shard) DO UPDATE SET value = counters.value + EXCLUDED.value",
);
pub(crate) static RETIRED: Sql =
    Sql::new("SELECT final_status FROM tombstones WHERE status_ref = $1");
pub(crate) static INSERT_TRACE: Sql =
    Sql::new("INSERT INTO trace_contexts (op_id, traceparent, tracestate) VALUES ($1, $2, $3)");
static TRACE_OF: Sql = Sql::new(
    "SELECT t.traceparent, t.tracestate FROM trace_contexts t \
     JOIN operations o ON o.id = t.op_id WHERE o.status_ref = $1",
);
static INSERT_CALL: Sql = Sql::new(
    "INSERT INTO call_identities (provider, api_family, adapter_revision, provider_response_id, \
     provider_call_id, purpose, op_id, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (provider, api_family, provider_response_id, provider_call_id) DO NOTHING",
);
/// The claim's first step: the state the event is in. PostgreSQL locks the row, so the
/// state read is the one the claim's update changes (a racer waits here, then finds it
/// claimed); SQLite's writer holds the whole file.
pub static LOCK_OUTBOX: Sql = locked!(
    "SELECT b.state FROM operations o JOIN outbox b ON b.op_id = o.id WHERE o.status_ref = $1",
    " FOR UPDATE OF b"
);
pub(crate) static CLAIM: Sql = Sql::new(
    "UPDATE outbox SET state = 'processing', lease_owner = $2, lease_until = $3, \
     next_attempt_at = $3, attempt_count = attempt_count + 1, last_reason = NULL, updated_at = $4 \
     WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1) \
     AND (state = 'pending' OR (state = 'processing' AND lease_until <= $4)) \
     RETURNING op_id, attempt_count",
);
pub(crate) static MARK_PROCESSING: Sql =
    Sql::new("UPDATE operations SET status = 'processing', updated_at = $2 WHERE id = $1");
/// No conflict target, as [`INSERT_OPERATION`]: the receipt's own ref is unique too, and
/// a row refused for it is told apart afterwards.
pub(crate) static INSERT_DOWNSTREAM: Sql = Sql::new(
    "INSERT INTO downstream_receipts (downstream_request_ref, request_sha256, receipt_ref, \
     receipt_json, created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
);
pub(crate) static SELECT_DOWNSTREAM: Sql = Sql::new(
    "SELECT request_sha256, receipt_ref, receipt_json FROM downstream_receipts \
     WHERE downstream_request_ref = $1",
);
/// [`FINALIZE`]'s update without its `RETURNING`, for [`END_SUCCEEDED`] too.
macro_rules! finalize {
    () => {
        "UPDATE outbox SET state = $5, updated_at = $4 \
         WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1 \
         AND status NOT IN ('succeeded', 'failed', 'quarantined', 'dead')) \
         AND state IN ('pending', 'processing') \
         AND (CAST($2 AS TEXT) IS NULL OR (state = 'processing' AND lease_owner = $2 AND attempt_count = $3))"
    };
}
/// Conditional on the operation not having ended, and on the event's own state being
/// pending or processing: PostgreSQL re-checks the updated row's conditions after waiting
/// for a racer's lock, not the subquery's, and an event still pending or processing is
/// exactly an operation that has not ended. For a worker ($2 not NULL), fenced on owner
/// and attempt.
pub(crate) static FINALIZE: Sql = Sql::new(concat!(finalize!(), " RETURNING op_id"));
pub(crate) static INSERT_OUTCOME: Sql = Sql::new(
    "INSERT INTO terminal_outcomes (op_id, kind, reason, receipt_json, finalized_by, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6)",
);
pub(crate) static MARK_ENDED: Sql = Sql::new(
    "UPDATE operations SET status = $3, updated_at = $2 WHERE id = $1 \
     AND status NOT IN ('succeeded', 'failed', 'quarantined', 'dead')",
);
pub(crate) static RELEASE: Sql = Sql::new(
    "UPDATE outbox SET state = $5, lease_owner = NULL, lease_until = NULL, next_attempt_at = $6, \
     last_reason = $7, updated_at = $4 \
     WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1) \
     AND state = 'processing' AND lease_owner = $2 AND attempt_count = $3 RETURNING op_id",
);
pub(crate) static MARK_RELEASED: Sql =
    Sql::new("UPDATE operations SET status = $3, updated_at = $2 WHERE id = $1");
/// An attempt set aside (`Release::Later`): still processing ($5), its lease ending at $6,
/// the reason kept (so no heartbeat renews it), fenced as a release is; the owner stays.
pub(crate) static SET_ASIDE: Sql = Sql::new(
    "UPDATE outbox SET state = $5, lease_until = $6, next_attempt_at = $6, last_reason = $7, \
     updated_at = $4 WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1) \
     AND state = 'processing' AND lease_owner = $2 AND attempt_count = $3 RETURNING op_id",
);
/// The relay's due events. PostgreSQL locks them and skips those another relay has
/// locked, so two relays never wait on each other or take the same event.
pub static DUE: Sql = locked!(
    "SELECT b.op_id, b.state FROM outbox b JOIN operations o ON o.id = b.op_id \
     WHERE b.state IN ('pending', 'processing') AND b.next_attempt_at <= $1 \
     AND o.downstream_name = $3 AND o.downstream_revision = $4 \
     ORDER BY b.next_attempt_at, b.op_id LIMIT $2",
    " FOR UPDATE OF b SKIP LOCKED"
);
pub(crate) static CLAIM_ONE: Sql = Sql::new(
    "UPDATE outbox SET state = 'processing', lease_owner = $2, lease_until = $3, \
     next_attempt_at = $3, attempt_count = attempt_count + 1, last_reason = NULL, updated_at = $4 \
     WHERE op_id = $1 AND state IN ('pending', 'processing') AND next_attempt_at <= $4 \
     RETURNING attempt_count",
);
/// The owner and the lease end are re-checked on the row itself, not only in the
/// subquery (see [`FINALIZE`]): a lease taken over meanwhile is not extended.
pub(crate) static HEARTBEAT: Sql = Sql::new(
    "UPDATE outbox SET lease_until = $3, next_attempt_at = $3, updated_at = $2 \
     WHERE op_id IN (SELECT op_id FROM outbox WHERE state IN ('pending', 'processing') \
     AND next_attempt_at > $2 AND lease_owner = $1) \
     AND state = 'processing' AND lease_owner = $1 AND next_attempt_at > $2 AND last_reason IS NULL",
);
pub(crate) static SELECT_STATUS: Sql =
    Sql::new("SELECT status FROM operations WHERE status_ref = $1");
pub(crate) static INSERT_LOCAL_RECEIPT: Sql = Sql::new(
    "INSERT INTO local_receipts (op_id, downstream_request_ref, receipt_ref, receipt_json, \
     output_json, result_sha256, finalized_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
);
pub(crate) static SELECT_OPERATION_ID: Sql =
    Sql::new("SELECT id FROM operations WHERE status_ref = $1");
pub(crate) static BY_SCOPE: Sql = Sql::new(select_operation!(
    "o.tenant_id = $1 AND o.subject_id = $2 AND o.tool_name = $3 AND o.idempotency_key = $4"
));
pub(crate) static BY_STATUS_REF: Sql = Sql::new(select_operation!("o.status_ref = $1"));
pub(crate) static BY_ID: Sql = Sql::new(select_operation!("o.id = $1"));
/// The replay record's statements, from its one list of columns: each record column
/// beside the column of the rows it is copied from (`o` the operation, `b` its outbox
/// event, `l` its local receipt), in [`OPERATION_COLUMNS`](crate::OPERATION_COLUMNS)
/// order. A success has no terminal outcome: the read answers its four columns NULL.
/// The DDL's `replays` table is frozen text; a test pins its columns to this list.
macro_rules! replay_record {
    (
        $($column:ident <- $source:literal,)*
        @terminal_outcome,
        $($after:ident <- $after_source:literal,)*
    ) => {
        /// A replay's read: the scope's replay record, when its operation succeeded and
        /// no row it was copied from has changed since (the schema's triggers delete it
        /// then). Every column of the table in its order and nothing else, so PostgreSQL
        /// sends the stored row as it is; [`RecordColumns`] reads it.
        pub(crate) static REPLAY_BY_SCOPE: Sql = Sql::new(concat!(
            "SELECT r.op_id",
            $(", r.", stringify!($column),)*
            $(", r.", stringify!($after),)*
            " FROM replays r WHERE r.tenant_id = $1 AND r.subject_id = $2 \
             AND r.tool_name = $3 AND r.idempotency_key = $4"
        ));
        /// Where the terminal outcome's columns, which a record has not, would stand
        /// among [`OPERATION_COLUMNS`](crate::OPERATION_COLUMNS).
        const TERMINAL_OUTCOME_AT: usize = [$(stringify!($column),)*].len();
        /// The replay record of operation `$1`, copied from the rows commit C has just
        /// written, in the same transaction.
        pub(crate) static INSERT_REPLAY: Sql = Sql::new(replay_record!(
            @insert $($column $source)* $($after $after_source)*;
            " FROM operations o JOIN outbox b ON b.op_id = o.id \
             JOIN local_receipts l ON l.op_id = o.id WHERE o.id = $1"
        ));
        /// The replay records of the operations whose ids the array `$1` holds
        /// (PostgreSQL's batch commit C).
        pub const INSERT_REPLAYS: &str = replay_record!(
            @insert $($column $source)* $($after $after_source)*;
            " FROM operations o JOIN outbox b ON b.op_id = o.id \
             JOIN local_receipts l ON l.op_id = o.id WHERE o.id = ANY($1)"
        );
        /// PostgreSQL's commit C of a success in one statement, one round trip: what
        /// [`FINALIZE`], [`INSERT_LOCAL_RECEIPT`], [`MARK_ENDED`] and [`INSERT_REPLAY`]
        /// write one after the other, with the same conditions. The record is copied
        /// from the rows as the statement writes them (`RETURNING`). Answers the
        /// operation's id, or no row when the ending may not be written.
        /// `$1`–`$5` are [`FINALIZE`]'s; `$6`–`$11` the local receipt's
        /// `downstream_request_ref, receipt_ref, receipt_json, output_json,
        /// result_sha256, finalized_by`.
        pub(crate) static END_SUCCEEDED: Sql = Sql::new(concat!(
            "WITH b AS (",
            finalize!(),
            " RETURNING *), \
             l AS (INSERT INTO local_receipts (op_id, downstream_request_ref, receipt_ref, \
             receipt_json, output_json, result_sha256, finalized_by, created_at) \
             SELECT op_id, $6, $7, $8, $9, $10, $11, $4 FROM b RETURNING *), \
             o AS (UPDATE operations SET status = 'succeeded', updated_at = $4 \
             WHERE id = (SELECT op_id FROM b) \
             AND status NOT IN ('succeeded', 'failed', 'quarantined', 'dead') RETURNING *), \
             r AS (",
            replay_record!(
                @insert $($column $source)* $($after $after_source)*;
                " FROM o JOIN b ON b.op_id = o.id JOIN l ON l.op_id = o.id RETURNING op_id"
            ),
            ") SELECT op_id FROM b"
        ));
        /// Replay records that are not an exact copy of their operation's rows, or whose
        /// operation has not succeeded: a replay reads the record instead of those rows,
        /// so it must be theirs, column for column (`IS DISTINCT FROM`: NULL equals NULL).
        pub const REPLAYS_DIFFER: &str = concat!(
            "SELECT COALESCE(o.status_ref, r.status_ref) FROM replays r \
             LEFT JOIN operations o ON o.id = r.op_id LEFT JOIN outbox b ON b.op_id = r.op_id \
             LEFT JOIN local_receipts l ON l.op_id = r.op_id \
             LEFT JOIN terminal_outcomes t ON t.op_id = r.op_id \
             WHERE o.id IS NULL OR b.op_id IS NULL OR l.op_id IS NULL OR t.op_id IS NOT NULL",
            $(" OR r.", stringify!($column), " IS DISTINCT FROM ", $source,)*
            $(" OR r.", stringify!($after), " IS DISTINCT FROM ", $after_source,)*
            " OR o.status <> 'succeeded' ORDER BY r.op_id"
        );
        /// The `replays` table's columns after `op_id`, in the order the DDL lists them.
        #[cfg(test)]
        pub(crate) const REPLAY_RECORD_COLUMNS: &[&str] =
            &[$(stringify!($column),)* $(stringify!($after),)*];
        /// The column of an operation's rows each record column is copied from, in the
        /// same order.
        #[cfg(test)]
        pub(crate) const REPLAY_RECORD_SOURCES: &[&str] = &[$($source,)* $($after_source,)*];
    };
    (@insert $($column:ident $source:literal)*; $from:literal) => {
        concat!(
            "INSERT INTO replays (op_id",
            $(", ", stringify!($column),)*
            ") SELECT o.id",
            $(", ", $source,)*
            $from
        )
    };
}
replay_record! {
    tenant_id <- "o.tenant_id",
    subject_id <- "o.subject_id",
    tool_name <- "o.tool_name",
    idempotency_key <- "o.idempotency_key",
    status_ref <- "o.status_ref",
    downstream_request_ref <- "o.downstream_request_ref",
    request_sha256 <- "o.request_sha256",
    arguments_json <- "o.arguments_json",
    input_revision <- "o.input_revision",
    output_revision <- "o.output_revision",
    effect_revision <- "o.effect_revision",
    handler_revision <- "o.handler_revision",
    producer_revision <- "o.producer_revision",
    policy_revision <- "o.policy_revision",
    provider <- "o.provider",
    api_family <- "o.api_family",
    adapter_revision <- "o.adapter_revision",
    provider_response_id <- "o.provider_response_id",
    provider_call_id <- "o.provider_call_id",
    operation_id <- "o.operation_id",
    approval_id <- "o.approval_id",
    approver_id <- "o.approver_id",
    approval_sha256 <- "o.approval_sha256",
    approved_at <- "o.approved_at",
    approval_expires_at <- "o.approval_expires_at",
    status <- "o.status",
    created_at <- "o.created_at",
    outbox_state <- "b.state",
    lease_owner <- "b.lease_owner",
    lease_until <- "b.lease_until",
    attempt_count <- "b.attempt_count",
    receipt_ref <- "l.receipt_ref",
    receipt_json <- "l.receipt_json",
    output_json <- "l.output_json",
    result_sha256 <- "l.result_sha256",
    receipt_request_ref <- "l.downstream_request_ref",
    finalized_by <- "l.finalized_by",
    downstream_name <- "o.downstream_name",
    downstream_revision <- "o.downstream_revision",
    @terminal_outcome,
    next_attempt_at <- "b.next_attempt_at",
    last_reason <- "b.last_reason",
    attempts_before <- "b.attempts_before",
}
/// Dispatch's one read: the scope's operation and the call's identity. The one-row
/// subquery `$one` makes it one row whether or not either exists.
macro_rules! dispatch_lookup {
    ($one:literal) => {
        concat!(
            "SELECT ",
            operation_columns!(),
            ", o.id, c.purpose, co.status_ref, co.tenant_id, co.subject_id, co.status FROM ",
            $one,
            " LEFT JOIN operations o ON o.tenant_id = $1 AND o.subject_id = $2 AND o.tool_name = $3 \
             AND o.idempotency_key = $4 \
             LEFT JOIN outbox b ON b.op_id = o.id LEFT JOIN local_receipts l ON l.op_id = o.id \
             LEFT JOIN terminal_outcomes t ON t.op_id = o.id \
             LEFT JOIN call_identities c ON c.provider = $5 AND c.api_family = $6 \
             AND c.provider_response_id = $7 AND c.provider_call_id = $8 \
             LEFT JOIN operations co ON co.id = c.op_id"
        )
    };
}
/// PostgreSQL (before 16) requires the subquery's alias; SQLite plans the unnamed one as
/// a constant row, and the named one as a scan of it.
pub(crate) static DISPATCH_LOOKUP: Sql =
    Sql::dialects(dispatch_lookup!("(SELECT 1)"), dispatch_lookup!("(SELECT 1) AS one"));

/// Every statement a dispatch, a worker, a replay or a status query runs, by name.
pub fn statements() -> Vec<(&'static str, &'static Sql)> {
    vec![
        ("replay record", &REPLAY_BY_SCOPE),
        ("dispatch lookup", &DISPATCH_LOOKUP),
        ("operation by scope", &BY_SCOPE),
        ("operation by status_ref", &BY_STATUS_REF),
        ("call identity", &SELECT_CALL),
        ("A: insert operation", &INSERT_OPERATION),
        ("A: insert outbox event", &INSERT_OUTBOX),
        ("A+claim: insert leased outbox event", &INSERT_OUTBOX_CLAIMED),
        ("A: insert call identity", &INSERT_CALL),
        ("claim", &CLAIM),
        ("claim: outbox state", &LOCK_OUTBOX),
        ("claim: mark processing", &MARK_PROCESSING),
        ("B: insert downstream receipt", &INSERT_DOWNSTREAM),
        ("B: downstream receipt by ref", &SELECT_DOWNSTREAM),
        ("C: deliver", &FINALIZE),
        ("C: operation status", &SELECT_STATUS),
        ("C: insert local receipt", &INSERT_LOCAL_RECEIPT),
        ("C: insert terminal outcome", &INSERT_OUTCOME),
        ("C: mark ended", &MARK_ENDED),
        ("C: replay record", &INSERT_REPLAY),
        ("release: outbox", &RELEASE),
        ("release: mark pending, dead or still processing", &MARK_RELEASED),
        ("release: set an attempt aside", &SET_ASIDE),
        ("relay: due events", &DUE),
        ("relay: claim one due event", &CLAIM_ONE),
        ("relay: heartbeat", &HEARTBEAT),
        ("counters: bump", &BUMP),
        ("counters: bump by a batch's count", &BUMP_BY),
        ("A: retired key", &RETIRED),
        ("relay: operation by id", &BY_ID),
        ("status query: operation id", &SELECT_OPERATION_ID),
        ("A: insert trace context", &INSERT_TRACE),
        ("trace context of an operation", &TRACE_OF),
    ]
}

// ---- reads ----------------------------------------------------------------------------

/// The operation `sql` selects, verified.
pub(crate) fn operation(
    db: &mut dyn Db,
    sql: &Sql,
    args: &[Arg<'_>],
) -> Result<Option<Operation>, StoreError> {
    let raw = db.first(sql, args, |row| RawOperation::decode(row))?;
    Ok(raw.map(verify::operation).transpose()?)
}

/// The operation of `scope`, verified.
pub(crate) fn by_scope(db: &mut dyn Db, scope: &Scope) -> Result<Option<Operation>, StoreError> {
    operation(
        db,
        &BY_SCOPE,
        &[
            scope.tenant_id.as_str().into(),
            scope.subject_id.as_str().into(),
            scope.tool_name.as_str().into(),
            scope.idempotency_key.as_str().into(),
        ],
    )
}

/// The operation of `status_ref`, verified.
pub(crate) fn by_status_ref(
    db: &mut dyn Db,
    status_ref: &StatusRef,
) -> Result<Option<Operation>, StoreError> {
    operation(db, &BY_STATUS_REF, &[status_ref.as_str().into()])
}

/// A row of [`REPLAY_BY_SCOPE`] read as the columns of
/// [`OPERATION_COLUMNS`](crate::OPERATION_COLUMNS): the record's own after its `op_id`,
/// and a success's terminal outcome, which it has not, NULL.
struct RecordColumns<'r, 'a>(&'r Row<'a>);

impl RecordColumns<'_, '_> {
    /// The record's column for column `index` of an operation's, if it has one.
    fn at(index: usize) -> Option<usize> {
        const OUTCOME_WIDTH: usize = 4;
        match index {
            index if index < TERMINAL_OUTCOME_AT => Some(index + 1),
            index if index < TERMINAL_OUTCOME_AT + OUTCOME_WIDTH => None,
            index => Some(index + 1 - OUTCOME_WIDTH),
        }
    }
}

impl verify::Columns for RecordColumns<'_, '_> {
    type Error = StoreError;

    fn text(&self, index: usize) -> Result<String, StoreError> {
        let index =
            Self::at(index).ok_or(StoreError::Internal("a replay record has no outcome"))?;
        self.0.text(index)
    }

    fn optional_text(&self, index: usize) -> Result<Option<String>, StoreError> {
        Self::at(index).map_or(Ok(None), |index| self.0.optional_text(index))
    }

    fn optional_int(&self, index: usize) -> Result<Option<i64>, StoreError> {
        Self::at(index).map_or(Ok(None), |index| self.0.optional_int(index))
    }

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        let index =
            Self::at(index).ok_or(StoreError::Internal("a replay record has no outcome"))?;
        self.0.int(index)
    }
}

/// Dispatch's read: a finished operation's replay record and, when `call` is not the
/// operation's own, what is recorded of it; otherwise (no record) [`DISPATCH_LOOKUP`].
///
/// An operation's own call identity was recorded for it, purpose `dispatch`, by the
/// commit A that created it; a change to that row deletes the record. So a record read
/// with its own call answers the call without reading it.
pub(crate) fn dispatch_lookup(
    db: &mut dyn Db,
    scope: &Scope,
    call: &CallIdentity,
) -> Result<DispatchLookup, StoreError> {
    let keys = [
        scope.tenant_id.as_str().into(),
        scope.subject_id.as_str().into(),
        scope.tool_name.as_str().into(),
        scope.idempotency_key.as_str().into(),
    ];
    if let Some(raw) =
        db.first(&REPLAY_BY_SCOPE, &keys, |row| RawOperation::decode(&RecordColumns(row)))?
    {
        let operation = verify::operation(raw)?;
        if operation.status != OperationStatus::Succeeded {
            return Err(StoreError::ContractViolation("replay record is not a success"));
        }
        let intent = &operation.intent;
        let call = if intent.is_first_call(call) {
            Some(RecordedCall {
                purpose: Purpose::Dispatch,
                status_ref: intent.status_ref.clone(),
                tenant_id: intent.scope.tenant_id.clone(),
                subject_id: intent.scope.subject_id.clone(),
                status: operation.status,
            })
        } else {
            recorded_call(db, call)?
        };
        return Ok(DispatchLookup { call, operation: Some(operation) });
    }
    let args = [
        scope.tenant_id.as_str().into(),
        scope.subject_id.as_str().into(),
        scope.tool_name.as_str().into(),
        scope.idempotency_key.as_str().into(),
        call.profile.provider.as_str().into(),
        call.profile.api_family.as_str().into(),
        call.provider_response_id.as_str().into(),
        call.provider_call_id.as_str().into(),
    ];
    // One statement, so both facts come from one snapshot: the single row always
    // exists; the operation's columns are NULL when the scope is free.
    let (raw, recorded) = db
        .first(&DISPATCH_LOOKUP, &args, |row| {
            let raw = match row.optional_int(OPERATION_WIDTH)? {
                Some(_) => Some(RawOperation::decode(row)?),
                None => None,
            };
            let recorded = match row.optional_text(OPERATION_WIDTH + 1)? {
                Some(_) => Some(raw_recorded(row, OPERATION_WIDTH + 1)?),
                None => None,
            };
            Ok((raw, recorded))
        })?
        .ok_or(StoreError::Internal("a statement answered no row"))?;
    let call = recorded.map(recorded_from).transpose()?;
    let operation = raw.map(verify::operation).transpose()?;
    Ok(DispatchLookup { call, operation })
}

/// What is recorded of a call identity.
pub(crate) fn recorded_call(
    db: &mut dyn Db,
    call: &CallIdentity,
) -> Result<Option<RecordedCall>, StoreError> {
    let args = [
        call.profile.provider.as_str().into(),
        call.profile.api_family.as_str().into(),
        call.provider_response_id.as_str().into(),
        call.provider_call_id.as_str().into(),
    ];
    db.first(&SELECT_CALL, &args, |row| raw_recorded(row, 0))?.map(recorded_from).transpose()
}

/// A recorded call's purpose and its operation's status ref, tenant, subject and
/// status, from five columns starting at `at`.
type RawRecorded = (String, String, String, String, String);

fn raw_recorded(row: &Row<'_>, at: usize) -> Result<RawRecorded, StoreError> {
    Ok((row.text(at)?, row.text(at + 1)?, row.text(at + 2)?, row.text(at + 3)?, row.text(at + 4)?))
}

fn recorded_from(
    (purpose, status_ref, tenant, subject, status): RawRecorded,
) -> Result<RecordedCall, StoreError> {
    verify::recorded_call(&purpose, &status_ref, &tenant, &subject, &status)
}

/// Whether the scope of `status_ref` was retired by retention.
/// The trace context kept with the intent of `status_ref`, when its caller had one.
pub(crate) fn trace_of(
    db: &mut dyn Db,
    status_ref: &StatusRef,
) -> Result<Option<TraceRecord>, StoreError> {
    db.first(&TRACE_OF, &[status_ref.as_str().into()], |row| {
        Ok(TraceRecord { traceparent: row.text(0)?, tracestate: row.text(1)? })
    })
}

pub(crate) fn retired(db: &mut dyn Db, status_ref: &StatusRef) -> Result<bool, StoreError> {
    Ok(db.text(&RETIRED, &[status_ref.as_str().into()])?.is_some())
}

/// The stand-in's receipt for `downstream_request_ref`, verified against itself.
///
/// # Errors
///
/// [`StoreError`]; `ContractViolation` when the row contradicts itself.
pub fn downstream_receipt(
    db: &mut dyn Db,
    downstream_request_ref: &DownstreamRequestRef,
) -> Result<Option<DownstreamReceipt>, StoreError> {
    let row = db.first(&SELECT_DOWNSTREAM, &[downstream_request_ref.as_str().into()], |row| {
        Ok((row.text(0)?, row.text(1)?, row.text(2)?))
    })?;
    Ok(row
        .map(|(request, receipt_ref, receipt_json)| {
            verify::downstream(
                downstream_request_ref.as_str(),
                &request,
                receipt_ref,
                &receipt_json,
            )
        })
        .transpose()?)
}

/// An operation's status, read inside a transaction.
fn status_of(
    db: &mut dyn Db,
    status_ref: &StatusRef,
) -> Result<Option<OperationStatus>, StoreError> {
    db.text(&SELECT_STATUS, &[status_ref.as_str().into()])?
        .map(|text| {
            OperationStatus::parse(&text)
                .ok_or(StoreError::ContractViolation("stored status is unknown"))
        })
        .transpose()
}

// ---- pieces of commit points ----------------------------------------------------------

/// `now + lease`.
///
/// # Errors
///
/// A failure of `db`'s backend past year 9999.
pub fn lease_end(db: &dyn Db, now: Now, lease: LeaseSeconds) -> Result<Now, StoreError> {
    now.checked_add(lease)
        .ok_or_else(|| StoreError::failed(db.backend(), "the lease would end after year 9999"))
}

/// `at`, an instant the caller derived from its own clock reading `from`, moved to the
/// clock reading `to`: the same distance from it (within the instants' range).
pub fn shifted(at: Now, from: Now, to: Now) -> Now {
    let moved = to.get().saturating_add(at.get().saturating_sub(from.get()));
    Now::new(moved.clamp(0, Now::MAX)).unwrap_or(to)
}

/// Adds one to the counter `name`, inside the caller's transaction.
pub(crate) fn bump(db: &mut dyn Db, name: &str) -> Result<(), StoreError> {
    db.execute(&BUMP, &[name.into()])?;
    Ok(())
}

/// Adds `count` to the counter `name` (nothing when zero): a batch counts once.
///
/// # Errors
///
/// [`StoreError`].
pub fn bump_by(db: &mut dyn Db, name: &str, count: i64) -> Result<(), StoreError> {
    if count > 0 {
        db.execute(&BUMP_BY, &[name.into(), count.into()])?;
    }
    Ok(())
}

/// Records `call` for the operation `op_id`. A racer that recorded the same identity
/// first (its transaction committed while this one waited) makes this insert nothing:
/// that is a conflict, and the whole transaction runs again and finds the identity
/// recorded. (SQLite's single writer read the identity absent in the same transaction.)
fn insert_call(
    db: &mut dyn Db,
    call: &CallIdentity,
    purpose: Purpose,
    op_id: i64,
    now: Now,
) -> Result<(), StoreError> {
    let inserted = db.execute(
        &INSERT_CALL,
        &[
            call.profile.provider.as_str().into(),
            call.profile.api_family.as_str().into(),
            call.profile.adapter_revision.as_str().into(),
            call.provider_response_id.as_str().into(),
            call.provider_call_id.as_str().into(),
            purpose.as_str().into(),
            op_id.into(),
            now.get().into(),
        ],
    )?;
    if inserted == 1 {
        Ok(())
    } else {
        Err(StoreError::of_kind(
            db.backend(),
            FailureKind::Conflict,
            "a concurrent transaction conflicted",
        ))
    }
}

/// Why a conditional end or release matched nothing: the operation is gone, has already
/// ended, or — for a lease holder — its lease was taken over (a fenced write, counted).
///
/// # Errors
///
/// [`StoreError`]; `Internal` when the operation vanished or has no outbox event.
pub fn not_written(
    db: &mut dyn Db,
    status_ref: &StatusRef,
    by_lease: bool,
) -> Result<Finalize, StoreError> {
    match status_of(db, status_ref)? {
        None => Err(StoreError::Internal("the operation vanished")),
        Some(status) if status.is_final() => Ok(Finalize::AlreadyFinal),
        Some(_) if by_lease => {
            bump(db, "fenced_writes")?;
            Ok(Finalize::LeaseLost)
        }
        Some(_) => Err(StoreError::Internal("the operation has no outbox event")),
    }
}

/// How an operation ends, as commit C writes it: [`Ending`] with its JSON made
/// canonical (by the caller, outside the transaction).
#[derive(Debug, Clone)]
pub(crate) enum Written {
    /// The local receipt, its receipt's canonical JSON and its output's.
    Succeeded(LocalReceipt, String, String),
    /// The downstream's reason.
    Failed(String),
    /// The kept receipt's canonical JSON and the reason.
    Quarantined(String, String),
}

impl Written {
    /// `ending` as commit C writes it.
    pub(crate) fn of(ending: &Ending<'_>) -> Written {
        match *ending {
            Ending::Succeeded(receipt) | Ending::SucceededSynced(receipt) => {
                Written::succeeded(receipt)
            }
            Ending::Failed(reason) => Written::Failed(reason.to_owned()),
            Ending::Quarantined { receipt, reason } => {
                Written::Quarantined(receipt.to_owned(), reason.to_owned())
            }
        }
    }

    /// The ending of a local receipt.
    pub(crate) fn succeeded(receipt: &LocalReceipt) -> Written {
        Written::Succeeded(
            receipt.clone(),
            receipt.downstream.receipt_json.clone(),
            canonicalize(&receipt.output),
        )
    }

    /// The status it leaves the operation in.
    fn status(&self) -> OperationStatus {
        match self {
            Written::Succeeded(..) => OperationStatus::Succeeded,
            Written::Failed(_) => OperationStatus::Failed,
            Written::Quarantined(..) => OperationStatus::Quarantined,
        }
    }
}

/// Commit C inside the caller's transaction: conditional on the operation not having
/// ended and, for a worker, on it still holding the lease (owner and attempt); then the
/// outcome's row and the operation's status. A refused write is counted there too.
pub(crate) fn end_in(
    db: &mut dyn Db,
    status_ref: &StatusRef,
    by: &Finalizer,
    now: Now,
    ending: &Written,
) -> Result<Finalize, StoreError> {
    let (owner, attempt) = match by {
        Finalizer::Lease(lease) => (Some(lease.owner.as_str()), Some(lease.attempt)),
        Finalizer::StatusQuery | Finalizer::Operator => (None, None),
    };
    let status = ending.status();
    let fenced = [
        status_ref.as_str().into(),
        owner.into(),
        attempt.into(),
        now.get().into(),
        status.outbox_state().as_str().into(),
    ];
    // PostgreSQL writes a success's whole commit C in its first statement.
    let fused = match (db.dialect(), ending) {
        (Dialect::Postgres, Written::Succeeded(receipt, receipt_json, output_json)) => {
            Some(local_receipt_args(receipt, receipt_json, output_json, by))
        }
        _ => None,
    };
    let id = match &fused {
        Some(receipt) => db.int(&END_SUCCEEDED, &[&fenced[..], &receipt[..]].concat())?,
        None => db.int(&FINALIZE, &fenced)?,
    };
    let Some(id) = id else {
        // Nothing of the ending written: say why (a refused write is counted).
        return not_written(db, status_ref, owner.is_some());
    };
    if matches!((by, ending), (Finalizer::StatusQuery, Written::Succeeded(..))) {
        bump(db, "reconciliations")?;
    }
    if fused.is_some() {
        return Ok(Finalize::Finalized);
    }
    match ending {
        Written::Succeeded(receipt, receipt_json, output_json) => {
            let [request_ref, receipt_ref, receipt_json, output_json, result, by] =
                local_receipt_args(receipt, receipt_json, output_json, by);
            db.execute(
                &INSERT_LOCAL_RECEIPT,
                &[
                    id.into(),
                    request_ref,
                    receipt_ref,
                    receipt_json,
                    output_json,
                    result,
                    by,
                    now.get().into(),
                ],
            )?;
        }
        Written::Failed(reason) | Written::Quarantined(_, reason) => {
            let receipt = match ending {
                Written::Quarantined(receipt, _) => Some(receipt.as_str()),
                _ => None,
            };
            let reason = crate::bounded_reason(reason);
            db.execute(
                &INSERT_OUTCOME,
                &[
                    id.into(),
                    status.as_str().into(),
                    reason.as_str().into(),
                    receipt.into(),
                    by.as_str().into(),
                    now.get().into(),
                ],
            )?;
        }
    }
    db.execute(&MARK_ENDED, &[id.into(), now.get().into(), status.as_str().into()])?;
    if matches!(ending, Written::Succeeded(..)) {
        db.execute(&INSERT_REPLAY, &[id.into()])?;
    }
    Ok(Finalize::Finalized)
}

/// A local receipt's columns between its `op_id` and its `created_at`, as
/// [`INSERT_LOCAL_RECEIPT`] and [`END_SUCCEEDED`] both take them.
fn local_receipt_args<'a>(
    receipt: &'a LocalReceipt,
    receipt_json: &'a str,
    output_json: &'a str,
    by: &'a Finalizer,
) -> [Arg<'a>; 6] {
    let downstream = &receipt.downstream;
    [
        downstream.downstream_request_ref.as_str().into(),
        downstream.receipt_ref.as_str().into(),
        receipt_json.into(),
        output_json.into(),
        receipt.result_sha256.as_str().into(),
        by.as_str().into(),
    ]
}

/// Commit B inside the caller's transaction: the receipt unless one exists for its ref;
/// the stored one either way.
fn record_downstream_in(
    db: &mut dyn Db,
    receipt: &DownstreamReceipt,
    receipt_json: &str,
    now: Now,
) -> Result<Option<DownstreamReceipt>, StoreError> {
    let inserted = db.execute(
        &INSERT_DOWNSTREAM,
        &[
            receipt.downstream_request_ref.as_str().into(),
            receipt.request_sha256.as_str().into(),
            receipt.receipt_ref.as_str().into(),
            receipt_json.into(),
            now.get().into(),
        ],
    )?;
    if inserted == 1 {
        // This call wrote it: what is stored is exactly `receipt` (`None`: the caller has
        // it).
        return Ok(None);
    }
    // Nothing stored under this ref, yet something refused the row: another ref holds
    // its receipt ref.
    let stored = downstream_receipt(db, &receipt.downstream_request_ref)?;
    stored.map(Some).ok_or_else(|| {
        StoreError::of_kind(
            db.backend(),
            FailureKind::Refused,
            "a constraint or trigger refused the write",
        )
    })
}

/// Commit A inside the caller's transaction (see
/// [`LedgerStore::reserve`](crate::LedgerStore::reserve)); with `claim`, the new event is
/// leased to its owner until the given instant in the same transaction. Answers whether
/// to keep what it wrote: only a reservation writes anything.
fn reserve_in(
    db: &mut dyn Db,
    (intent, arguments_json): (&NewOperation, &str),
    call: &CallIdentity,
    now: Now,
    claim: Option<(&Identifier, Now)>,
    trace: Option<&TraceRecord>,
) -> Result<(Reserved, bool), StoreError> {
    let downstream_request_ref =
        toolledger_contract::digest::downstream_request_ref(&intent.scope, &intent.request_sha256);
    match recorded_call(db, call)? {
        Some(recorded) if recorded.purpose == Purpose::QueryStatus => {
            return Ok((Reserved::Answered(Reservation::CallPurposeConflict), false));
        }
        // One model call is one intent: its identity already names another operation.
        Some(recorded) if recorded.status_ref != intent.status_ref => {
            return Ok((Reserved::Answered(Reservation::CallReused(Box::new(recorded))), false));
        }
        _ => {}
    }
    let status = reserved_status(claim.is_some());
    let scope = &intent.scope;
    let revisions = &intent.revisions;
    let approval = intent.approval.as_ref();
    let args = [
        scope.tenant_id.as_str().into(),
        scope.subject_id.as_str().into(),
        scope.tool_name.as_str().into(),
        scope.idempotency_key.as_str().into(),
        intent.status_ref.as_str().into(),
        downstream_request_ref.as_str().into(),
        intent.request_sha256.as_str().into(),
        arguments_json.into(),
        revisions.input.as_str().into(),
        revisions.output.as_str().into(),
        revisions.effect.as_str().into(),
        revisions.handler.as_str().into(),
        revisions.producer.as_str().into(),
        revisions.policy.as_str().into(),
        intent.profile.provider.as_str().into(),
        intent.profile.api_family.as_str().into(),
        intent.profile.adapter_revision.as_str().into(),
        intent.provider_response_id.as_str().into(),
        intent.provider_call_id.as_str().into(),
        intent.operation_id.as_str().into(),
        approval.map(|approval| approval.approval_id.as_str()).into(),
        approval.map(|approval| approval.approver_id.as_str()).into(),
        approval.map(|approval| approval.approval_sha256.as_str()).into(),
        approval.map(|approval| approval.approved_at.get()).into(),
        approval.map(|approval| approval.expires_at.get()).into(),
        now.get().into(),
        intent.downstream.name().into(),
        intent.downstream.revision().into(),
        status.as_str().into(),
    ];
    let inserted = db.insert(&INSERT_OPERATION, &args).map_err(|err| match err {
        // A row the table's constraints refuse (not the scope: that conflict inserts
        // nothing) contradicts the stored rows.
        StoreError::Backend { kind: FailureKind::Refused, .. } => StoreError::ContractViolation(
            "a stored row holds this intent's refs under another scope",
        ),
        err => err,
    })?;
    let Some(id) = inserted else {
        // Nothing inserted: the scope exists (a racer's commit was waited for), or
        // another row holds this intent's refs. Read the authoritative row; nothing
        // was written.
        return match by_scope(db, scope)? {
            Some(existing) => {
                Ok((Reserved::Answered(Reservation::Exists(Box::new(existing))), false))
            }
            None if retired(db, &intent.status_ref)? => {
                Ok((Reserved::Answered(Reservation::Retired), false))
            }
            None => Err(StoreError::ContractViolation(
                "a stored row holds this intent's refs under another scope",
            )),
        };
    };
    // A retired scope has no row, so its insert succeeds: its tombstone (committed with
    // the removal, so visible now, even to an insert that waited for the removal) says
    // it may not be reserved again, and the insert is rolled back.
    if retired(db, &intent.status_ref)? {
        return Ok((Reserved::Answered(Reservation::Retired), false));
    }
    match claim {
        None => db.execute(&INSERT_OUTBOX, &[id.into(), now.get().into()])?,
        Some((owner, until)) => db.execute(
            &INSERT_OUTBOX_CLAIMED,
            &[id.into(), now.get().into(), owner.as_str().into(), until.get().into()],
        )?,
    };
    if claim.is_some() {
        bump(db, "claims")?;
    }
    insert_call(db, call, Purpose::Dispatch, id, now)?;
    if let Some(trace) = trace {
        let args = [id.into(), trace.traceparent.as_str().into(), trace.tracestate.as_str().into()];
        db.execute(&INSERT_TRACE, &args)?;
    }
    let lease_until = claim.map(|(_, until)| until);
    Ok((Reserved::Written { downstream_request_ref, now, lease_until }, true))
}

/// The status commit A writes: pending and unclaimed, or processing under the claim's
/// lease at attempt 1.
fn reserved_status(claimed: bool) -> OperationStatus {
    if claimed { OperationStatus::Processing } else { OperationStatus::Pending }
}

/// What a run of commit A answers: the answer itself, or — when it wrote the operation —
/// what the written row holds beyond the intent the command owns, which
/// [`Reserve::answer`] moves into the answer once the transaction has committed.
#[derive(Debug)]
pub enum Reserved {
    /// Nothing was written: the answer as it is.
    Answered(Reservation),
    /// The operation was written at `now`; with the claim, its lease ends at
    /// `lease_until`.
    Written {
        /// The written row's downstream request ref.
        downstream_request_ref: DownstreamRequestRef,
        /// The instant it was written at.
        now: Now,
        /// The claim's lease end, when commit A claimed it.
        lease_until: Option<Now>,
    },
}

// ---- commit points --------------------------------------------------------------------

/// Commit A, fused with the claim when `claim` names the dispatcher and its lease.
#[derive(Debug)]
pub struct Reserve {
    intent: NewOperation,
    arguments_json: String,
    call: CallIdentity,
    now: Now,
    claim: Option<(Identifier, LeaseSeconds)>,
    trace: Option<TraceRecord>,
}

impl Reserve {
    /// Commit A of `intent`, recorded as `call`'s dispatch.
    pub fn new(
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        claim: Option<(&Identifier, LeaseSeconds)>,
    ) -> Reserve {
        Reserve {
            intent: intent.clone(),
            arguments_json: canonicalize(&intent.arguments),
            call: call.clone(),
            now,
            claim: claim.map(|(owner, lease)| (owner.clone(), lease)),
            trace: None,
        }
    }

    /// This commit A, keeping `trace` beside the intent when it writes one.
    #[must_use]
    pub fn traced(mut self, trace: TraceRecord) -> Reserve {
        self.trace = Some(trace);
        self
    }

    /// The reservation, from what the committed run answered: a written operation as a
    /// read would return it — pending and unclaimed, or processing under the claim's
    /// lease at attempt 1 — holding this command's intent, moved rather than copied.
    pub fn answer(self, reserved: Reserved) -> Reservation {
        let (downstream_request_ref, now, lease_until) = match reserved {
            Reserved::Answered(answer) => return answer,
            Reserved::Written { downstream_request_ref, now, lease_until } => {
                (downstream_request_ref, now, lease_until)
            }
        };
        let owner = self.claim.map(|(owner, _)| owner);
        let claimed = owner.is_some();
        let status = reserved_status(claimed);
        Reservation::Reserved(Box::new(Operation {
            intent: self.intent,
            downstream_request_ref,
            status,
            outbox: OutboxEvent {
                state: status.outbox_state(),
                lease_owner: owner,
                lease_until: lease_until.map(Now::get),
                attempt_count: i64::from(claimed),
                next_attempt_at: lease_until.unwrap_or(now).get(),
                last_reason: None,
                attempts_before: 0,
            },
            receipt: None,
            outcome: None,
            created_at: now.get(),
        }))
    }
}

impl Commit for Reserve {
    type Output = Reserved;

    fn run(&self, db: &mut dyn Db) -> Result<(Reserved, bool), StoreError> {
        let now = db.now(self.now)?;
        let claim = match &self.claim {
            Some((owner, lease)) => Some((owner, lease_end(db, now, *lease)?)),
            None => None,
        };
        let intent = (&self.intent, self.arguments_json.as_str());
        reserve_in(db, intent, &self.call, now, claim, self.trace.as_ref())
    }
}

/// The claim of one operation's event by a worker.
#[derive(Debug)]
pub struct ClaimOne {
    status_ref: StatusRef,
    owner: Identifier,
    now: Now,
    lease: LeaseSeconds,
}

impl ClaimOne {
    /// `owner`'s claim of the event of `status_ref` for `lease`.
    pub fn new(status_ref: &StatusRef, owner: &Identifier, now: Now, lease: LeaseSeconds) -> Self {
        ClaimOne { status_ref: status_ref.clone(), owner: owner.clone(), now, lease }
    }
}

impl Commit for ClaimOne {
    type Output = Claim;

    fn run(&self, db: &mut dyn Db) -> Result<(Claim, bool), StoreError> {
        let now = db.now(self.now)?;
        let lease_until = lease_end(db, now, self.lease)?;
        let status_ref = self.status_ref.as_str();
        let Some(was) = db.text(&LOCK_OUTBOX, &[status_ref.into()])? else {
            return Ok((Claim::Missing, false));
        };
        // One conditional update claims a pending event or an expired lease (live while
        // now < lease_until) and answers the new attempt.
        let args = [
            status_ref.into(),
            self.owner.as_str().into(),
            lease_until.get().into(),
            now.get().into(),
        ];
        let Some((id, attempt)) = db.first(&CLAIM, &args, |row| Ok((row.int(0)?, row.int(1)?)))?
        else {
            // Nothing claimed (and nothing written): say why.
            return not_claimed(&was).map(|claim| (claim, false));
        };
        db.execute(&MARK_PROCESSING, &[id.into(), now.get().into()])?;
        bump(db, "claims")?;
        let reclaimed = was == OutboxState::Processing.as_str();
        if reclaimed {
            bump(db, "lease_reclaims")?;
        }
        // Read back inside the claim: a row that no longer verifies rolls the claim back.
        let operation = by_status_ref(db, &self.status_ref)?
            .ok_or(StoreError::Internal("the operation vanished"))?;
        Ok((Claim::Claimed(Box::new(Claimed { attempt, reclaimed, operation })), true))
    }
}

/// A status query's call identity, recorded unless it already is.
#[derive(Debug)]
pub struct RecordStatusQuery {
    call: CallIdentity,
    status_ref: StatusRef,
    now: Now,
}

impl RecordStatusQuery {
    /// `call` as a status query of `status_ref`.
    pub fn new(call: &CallIdentity, status_ref: &StatusRef, now: Now) -> Self {
        RecordStatusQuery { call: call.clone(), status_ref: status_ref.clone(), now }
    }
}

impl Commit for RecordStatusQuery {
    type Output = Option<RecordedCall>;

    fn run(&self, db: &mut dyn Db) -> Result<(Option<RecordedCall>, bool), StoreError> {
        let now = db.now(self.now)?;
        if let Some(recorded) = recorded_call(db, &self.call)? {
            return Ok((Some(recorded), false));
        }
        let id = db
            .int(&SELECT_OPERATION_ID, &[self.status_ref.as_str().into()])?
            .ok_or(StoreError::Internal("the operation vanished"))?;
        insert_call(db, &self.call, Purpose::QueryStatus, id, now)?;
        Ok((None, true))
    }
}

/// Commit C of one operation, whichever way it ends.
#[derive(Debug)]
pub struct End {
    status_ref: StatusRef,
    by: Finalizer,
    ending: Written,
    /// The ending's ([`Ending::durability`]).
    durability: Durability,
    now: Now,
}

impl End {
    /// The end of `status_ref` by `by`.
    pub fn new(status_ref: &StatusRef, by: &Finalizer, ending: &Ending<'_>, now: Now) -> End {
        End {
            status_ref: status_ref.clone(),
            by: by.clone(),
            ending: Written::of(ending),
            durability: ending.durability(),
            now,
        }
    }
}

impl Commit for End {
    type Output = Finalize;

    fn run(&self, db: &mut dyn Db) -> Result<(Finalize, bool), StoreError> {
        let now = db.now(self.now)?;
        end_in(db, &self.status_ref, &self.by, now, &self.ending).map(|end| (end, true))
    }

    fn durability(&self) -> Durability {
        self.durability
    }
}

/// Commit C of several operations in one transaction, answered in order.
#[derive(Debug)]
pub struct Ends {
    items: Vec<(StatusRef, Finalizer, Written)>,
    now: Now,
}

impl Ends {
    /// Each of `items` succeeded with its local receipt.
    pub fn succeeded(items: &[(StatusRef, Finalizer, LocalReceipt)], now: Now) -> Ends {
        let items = items
            .iter()
            .map(|(status_ref, by, receipt)| {
                (status_ref.clone(), by.clone(), Written::succeeded(receipt))
            })
            .collect();
        Ends { items, now }
    }
}

impl Commit for Ends {
    type Output = Vec<Finalize>;

    fn run(&self, db: &mut dyn Db) -> Result<(Vec<Finalize>, bool), StoreError> {
        let now = db.now(self.now)?;
        let ends = self
            .items
            .iter()
            .map(|(status_ref, by, ending)| end_in(db, status_ref, by, now, ending))
            .collect::<Result<_, _>>()?;
        Ok((ends, true))
    }

    /// Lazy: [`Ends::succeeded`], its one constructor, holds successes only, whose
    /// commit C is lazy ([`Ending::durability`]).
    fn durability(&self) -> Durability {
        Durability::Lazy
    }
}

/// How a lease is given back, owned (see [`Release`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Giving {
    Later(Now),
    Retry(Now),
    Dead,
}

/// A lease given back after a request that was certainly not sent.
#[derive(Debug)]
pub struct ReleaseLease {
    status_ref: StatusRef,
    lease: Lease,
    giving: Giving,
    reason: String,
    now: Now,
}

impl ReleaseLease {
    /// `lease` on `status_ref`, given back as `release` says.
    pub fn new(
        status_ref: &StatusRef,
        lease: &Lease,
        release: &Release<'_>,
        now: Now,
    ) -> ReleaseLease {
        let (giving, reason) = match *release {
            Release::Later { at, reason } => (Giving::Later(at), reason),
            Release::Retry { at, reason } => (Giving::Retry(at), reason),
            Release::Dead { reason } => (Giving::Dead, reason),
        };
        ReleaseLease {
            status_ref: status_ref.clone(),
            lease: lease.clone(),
            giving,
            reason: crate::bounded_reason(reason),
            now,
        }
    }
}

impl Commit for ReleaseLease {
    type Output = Finalize;

    fn run(&self, db: &mut dyn Db) -> Result<(Finalize, bool), StoreError> {
        let now = db.now(self.now)?;
        // An instant the caller chose keeps its distance from the clock the write judges by.
        let (sql, state, at) = match self.giving {
            Giving::Later(at) => (&SET_ASIDE, OutboxState::Processing, shifted(at, self.now, now)),
            Giving::Retry(at) => (&RELEASE, OutboxState::Pending, shifted(at, self.now, now)),
            Giving::Dead => (&RELEASE, OutboxState::Dead, now),
        };
        let args = [
            self.status_ref.as_str().into(),
            self.lease.owner.as_str().into(),
            self.lease.attempt.into(),
            now.get().into(),
            state.as_str().into(),
            at.get().into(),
            self.reason.as_str().into(),
        ];
        let Some(id) = db.int(sql, &args)? else {
            return not_written(db, &self.status_ref, true).map(|answer| (answer, true));
        };
        db.execute(&MARK_RELEASED, &[id.into(), now.get().into(), state.as_str().into()])?;
        Ok((Finalize::Finalized, true))
    }
}

/// The relay's claim of up to `limit` due events of one downstream, oldest due first.
#[derive(Debug)]
pub struct ClaimDue {
    owner: Identifier,
    downstream: DownstreamIdentity,
    now: Now,
    lease: LeaseSeconds,
    limit: i64,
}

impl ClaimDue {
    /// `owner`'s claim of `downstream`'s due events for `lease`.
    pub fn new(
        owner: &Identifier,
        downstream: &DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> ClaimDue {
        ClaimDue {
            owner: owner.clone(),
            downstream: downstream.clone(),
            now,
            lease,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        }
    }
}

impl Commit for ClaimDue {
    type Output = ClaimedBatch;

    fn run(&self, db: &mut dyn Db) -> Result<(ClaimedBatch, bool), StoreError> {
        let now = db.now(self.now)?;
        let lease_until = lease_end(db, now, self.lease)?;
        let args = [
            now.get().into(),
            self.limit.into(),
            self.downstream.name().into(),
            self.downstream.revision().into(),
        ];
        let due = db.all(&DUE, &args, |row| Ok((row.int(0)?, row.text(1)?)))?;
        let mut batch = ClaimedBatch::default();
        let mut reclaims = 0;
        for (id, state) in due {
            // Verified before it is claimed: a row that does not verify is left as it
            // is (nothing written) and counted, for the audit to name.
            let operation = match operation(db, &BY_ID, &[id.into()]) {
                Ok(Some(operation)) => operation,
                Ok(None) | Err(StoreError::ContractViolation(_)) => {
                    batch.skipped += 1;
                    continue;
                }
                Err(err) => return Err(err),
            };
            let args =
                [id.into(), self.owner.as_str().into(), lease_until.get().into(), now.get().into()];
            let Some(attempt) = db.int(&CLAIM_ONE, &args)? else { continue };
            db.execute(&MARK_PROCESSING, &[id.into(), now.get().into()])?;
            let reclaim = state == OutboxState::Processing.as_str();
            reclaims += i64::from(reclaim);
            batch.claimed.push(claimed(operation, &self.owner, lease_until, attempt, reclaim));
        }
        bump_by(db, "claims", i64::try_from(batch.claimed.len()).unwrap_or(i64::MAX))?;
        bump_by(db, "lease_reclaims", reclaims)?;
        Ok((batch, true))
    }
}

/// The event of `operation`, read before the claim, claimed by `owner` until
/// `lease_until` at `attempt`: the operation as a read would now return it.
pub fn claimed(
    mut operation: Operation,
    owner: &Identifier,
    lease_until: Now,
    attempt: i64,
    reclaimed: bool,
) -> Claimed {
    operation.status = OperationStatus::Processing;
    operation.outbox.state = OutboxState::Processing;
    operation.outbox.lease_owner = Some(owner.clone());
    operation.outbox.lease_until = Some(lease_until.get());
    operation.outbox.next_attempt_at = lease_until.get();
    operation.outbox.attempt_count = attempt;
    Claimed { attempt, reclaimed, operation }
}

/// Every live lease of one owner extended.
#[derive(Debug)]
pub struct Heartbeat {
    owner: Identifier,
    now: Now,
    lease: LeaseSeconds,
}

impl Heartbeat {
    /// `owner`'s leases, extended to `now + lease`.
    pub fn new(owner: &Identifier, now: Now, lease: LeaseSeconds) -> Heartbeat {
        Heartbeat { owner: owner.clone(), now, lease }
    }
}

impl Commit for Heartbeat {
    type Output = usize;

    fn run(&self, db: &mut dyn Db) -> Result<(usize, bool), StoreError> {
        let now = db.now(self.now)?;
        let lease_until = lease_end(db, now, self.lease)?;
        let args = [self.owner.as_str().into(), now.get().into(), lease_until.get().into()];
        let extended = db.execute(&HEARTBEAT, &args)?;
        Ok((usize::try_from(extended).unwrap_or(usize::MAX), true))
    }
}

/// Commit B of the stand-in's receipts, each with its canonical JSON.
#[derive(Debug)]
pub struct RecordReceipts {
    receipts: Vec<(DownstreamReceipt, String)>,
    now: Now,
}

impl RecordReceipts {
    /// Commit B of `receipts`, in order.
    pub fn new(receipts: &[DownstreamReceipt], now: Now) -> RecordReceipts {
        let receipts = receipts
            .iter()
            .map(|receipt| (receipt.clone(), receipt.receipt_json.clone()))
            .collect();
        RecordReceipts { receipts, now }
    }

    /// What is stored under each receipt's ref, in order, from what the committed run
    /// answered: the receipt itself where this commit wrote it (moved, not copied), else
    /// the one already stored.
    pub fn answer(self, stored: Vec<Option<DownstreamReceipt>>) -> Vec<DownstreamReceipt> {
        self.receipts
            .into_iter()
            .zip(stored)
            .map(|((receipt, _), stored)| stored.unwrap_or(receipt))
            .collect()
    }
}

impl Commit for RecordReceipts {
    /// Per receipt, `None` where this commit wrote it, else the receipt already stored.
    type Output = Vec<Option<DownstreamReceipt>>;

    fn run(&self, db: &mut dyn Db) -> Result<(Self::Output, bool), StoreError> {
        let now = db.now(self.now)?;
        let stored = self
            .receipts
            .iter()
            .map(|(receipt, json)| record_downstream_in(db, receipt, json, now))
            .collect::<Result<_, _>>()?;
        Ok((stored, true))
    }
}

/// Operations that already finished, written through the very statements of A with the
/// claim (owner `loader`, attempt 1), B and C in one transaction: for building large
/// ledgers. Nothing of it is kept when any operation is refused.
#[derive(Debug)]
pub struct Load {
    finished: Vec<(NewOperation, CallIdentity, LocalReceipt)>,
    now: Now,
}

impl Load {
    /// The load of `finished`.
    pub fn new(finished: &[(NewOperation, CallIdentity, LocalReceipt)], now: Now) -> Load {
        Load { finished: finished.to_vec(), now }
    }
}

impl Commit for Load {
    type Output = usize;

    fn run(&self, db: &mut dyn Db) -> Result<(usize, bool), StoreError> {
        let now = db.now(self.now)?;
        let loader = Identifier::new("loader")
            .map_err(|_| StoreError::Internal("the loader's name is an identifier"))?;
        let one = LeaseSeconds::new(1).map_err(|_| StoreError::Internal("one second"))?;
        let lease_until = lease_end(db, now, one)?;
        let by = Finalizer::Lease(Lease { owner: loader.clone(), attempt: 1 });
        for (intent, call, receipt) in &self.finished {
            let arguments = canonicalize(&intent.arguments);
            match reserve_in(
                db,
                (intent, &arguments),
                call,
                now,
                Some((&loader, lease_until)),
                None,
            )? {
                (Reserved::Written { .. }, true) => {}
                _ => return Err(StoreError::ContractViolation("a loaded operation is not new")),
            }
            let downstream = &receipt.downstream;
            record_downstream_in(db, downstream, &downstream.receipt_json, now)?;
            match end_in(db, &intent.status_ref, &by, now, &Written::succeeded(receipt))? {
                Finalize::Finalized => {}
                _ => return Err(StoreError::Internal("a loaded operation did not finish")),
            }
        }
        Ok((self.finished.len(), true))
    }
}

#[cfg(test)]
mod tests {
    use super::{REPLAY_RECORD_SOURCES, RecordColumns};
    use crate::{OPERATION_COLUMNS, OPERATION_WIDTH};

    /// A replay's row is read through [`RecordColumns`] as if it were the join's: each
    /// column of an operation's is the record column copied from it, and only the
    /// terminal outcome's (`t.`), which a success has not, is missing.
    #[test]
    fn a_records_row_reads_as_the_operations_columns() {
        let columns: Vec<&str> = OPERATION_COLUMNS.split(',').map(str::trim).collect();
        assert_eq!(columns.len(), OPERATION_WIDTH);
        let mut read = Vec::new();
        for (index, column) in columns.iter().enumerate() {
            match RecordColumns::at(index) {
                Some(at) => {
                    assert_eq!(REPLAY_RECORD_SOURCES[at - 1], *column);
                    read.push(at);
                }
                None => assert!(column.starts_with("t."), "{column}"),
            }
        }
        // Every record column after `op_id` (column 0), each once, in order.
        assert_eq!(read, (1..=REPLAY_RECORD_SOURCES.len()).collect::<Vec<_>>());
    }
}
