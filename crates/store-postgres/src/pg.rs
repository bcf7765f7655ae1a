//! The PostgreSQL implementation of [`LedgerStore`] and [`StandInReceipts`]: one
//! connection, one thread.
//!
//! Every write is one `READ COMMITTED` transaction whose correctness rests on row locks
//! and unique constraints, not on serialized writers: an `INSERT … ON CONFLICT DO
//! NOTHING` that waits for a racer's commit and then inserts nothing, a conditional
//! `UPDATE` that PostgreSQL re-checks on the newest row version after waiting for its
//! lock, `SELECT … FOR UPDATE` before a decision that a read made, `FOR UPDATE SKIP
//! LOCKED` for the relay's batch. A serialization failure or a deadlock runs the whole
//! transaction again (at most [`ATTEMPTS`] times, then `Busy`). A transaction dropped
//! without commit rolls back: `?` inside one is always safe.

use std::{sync::Arc, time::Duration};

use serde_json::Value;
use tokio_postgres::{Config, IsolationLevel, Row, types::ToSql};
use toolledger_contract::{
    DownstreamIdentity, Identifier, LeaseSeconds, Purpose, Scope, StatusRef, UnixSeconds,
};
use toolledger_json::canonicalize;
use toolledger_store::{FailureKind, OPERATION_COLUMNS, OPERATION_FROM, OPERATION_WIDTH};

use crate::{
    AuditReport, CallIdentity, Claim, ClaimedBatch, DispatchLookup, DownstreamReceipt, Finalize,
    Finalizer, LedgerStore, LocalReceipt, NewOperation, Now, Operation, OperationStatus,
    OutboxEvent, OutboxState, RecordedCall, Release, Reservation, StandInReceipts, StoreError,
    Waits,
    error::{self, failed, is_conflict, is_lost},
    not_claimed,
    pool::Shared,
    schema,
    session::{self, Conn, Db, GenericClient, Transaction, get},
    verify::{self, RawOperation},
};

/// How many times one write transaction is run when PostgreSQL answers a serialization
/// failure or a deadlock (or two transactions met on one call identity) before the
/// caller is answered `Busy`.
pub const ATTEMPTS: u32 = 5;

/// Which clock a store's writes judge and stamp by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Clock {
    /// The database server's: every write transaction reads `now()` first (whole
    /// seconds) and uses it instead of the instant handed in for everything it stores
    /// and judges — lease ends, due times, `created_at`/`updated_at`. Workers on several
    /// hosts then need no trusted wall clock of their own. An instant the caller derived
    /// from its own clock (a release's retry time, a retention cutoff) keeps its
    /// distance from the caller's `now`.
    #[default]
    Database,
    /// The instant each call hands in: for tests and drills that simulate time.
    Caller,
}

/// A toolledger store in a PostgreSQL database.
pub struct PgStore {
    config: Config,
    waits: Waits,
    clock: Clock,
    /// The connection; `None` once it was lost, until the next call reconnects.
    conn: Option<Conn>,
    /// The pool the connection goes back to when the store is dropped.
    home: Option<Arc<Shared>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("waits", &self.waits)
            .field("clock", &self.clock)
            .field("connected", &self.conn.is_some())
            .field("pooled", &self.home.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.give_back(self.conn.take());
        }
    }
}

// The hot statements. `$n` are the same parameters, in the same order, as SQLite's `?n`.
const SELECT_CALL: &str = "SELECT c.purpose, o.status_ref, o.tenant_id, o.subject_id, o.status \
     FROM call_identities c JOIN operations o ON o.id = c.op_id \
     WHERE c.provider = $1 AND c.api_family = $2 AND c.provider_response_id = $3 AND c.provider_call_id = $4";
/// No conflict target: a racer holding the scope, or any row holding this intent's refs,
/// makes it insert nothing (a targeted `ON CONFLICT` still raises on another unique
/// index when two inserts race). Which one it was is read afterwards.
const INSERT_OPERATION: &str = "INSERT INTO operations (tenant_id, subject_id, tool_name, idempotency_key, status_ref, \
     downstream_request_ref, request_sha256, arguments_json, input_revision, output_revision, \
     effect_revision, handler_revision, producer_revision, policy_revision, provider, api_family, \
     adapter_revision, provider_response_id, provider_call_id, operation_id, approval_id, approver_id, \
     approval_sha256, approved_at, approval_expires_at, downstream_name, downstream_revision, status, \
     created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, \
     $21, $22, $23, $24, $25, $27, $28, $29, $26, $26) \
     ON CONFLICT DO NOTHING RETURNING id";
const INSERT_OUTBOX_CLAIMED: &str = "INSERT INTO outbox (op_id, state, lease_owner, lease_until, attempt_count, \
     next_attempt_at, last_reason, attempts_before, created_at, updated_at) \
     VALUES ($1, 'processing', $3, $4, 1, $4, NULL, 0, $2, $2)";
const INSERT_OUTBOX: &str = "INSERT INTO outbox (op_id, state, lease_owner, lease_until, attempt_count, next_attempt_at, \
     last_reason, attempts_before, created_at, updated_at) VALUES ($1, 'pending', NULL, NULL, 0, $2, NULL, 0, $2, $2)";
/// A counter is sixteen rows, one per shard, and a session adds to its own
/// (`pg_backend_pid() % 16`): one row would be a lock every claim holds until its commit
/// is flushed, serializing the commits of every host. Readers sum the shards.
const BUMP: &str = "INSERT INTO counters (name, shard, value) VALUES ($1, pg_backend_pid() % 16, 1) \
     ON CONFLICT (name, shard) DO UPDATE SET value = counters.value + 1";
const BUMP_BY: &str = "INSERT INTO counters (name, shard, value) VALUES ($1, pg_backend_pid() % 16, $2) \
     ON CONFLICT (name, shard) DO UPDATE SET value = counters.value + EXCLUDED.value";
const RETIRED: &str = "SELECT final_status FROM tombstones WHERE status_ref = $1";
const INSERT_CALL: &str = "INSERT INTO call_identities (provider, api_family, adapter_revision, provider_response_id, \
     provider_call_id, purpose, op_id, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (provider, api_family, provider_response_id, provider_call_id) DO NOTHING";
/// The claim's first step: the event's row locked, so the state it was in is the one
/// the claim changes (a racer waits here, then finds it claimed).
const LOCK_OUTBOX: &str = "SELECT b.state FROM operations o JOIN outbox b ON b.op_id = o.id \
     WHERE o.status_ref = $1 FOR UPDATE OF b";
const CLAIM: &str = "UPDATE outbox SET state = 'processing', lease_owner = $2, lease_until = $3, \
     next_attempt_at = $3, attempt_count = attempt_count + 1, last_reason = NULL, updated_at = $4 \
     WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1) \
     AND (state = 'pending' OR (state = 'processing' AND lease_until <= $4)) \
     RETURNING op_id, attempt_count";
const MARK_PROCESSING: &str =
    "UPDATE operations SET status = 'processing', updated_at = $2 WHERE id = $1";
/// No conflict target, as [`INSERT_OPERATION`]: the receipt's ref is unique too.
const INSERT_DOWNSTREAM: &str = "INSERT INTO downstream_receipts (downstream_request_ref, request_sha256, receipt_ref, \
     receipt_json, created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING";
const SELECT_DOWNSTREAM: &str = "SELECT request_sha256, receipt_ref, receipt_json FROM downstream_receipts \
     WHERE downstream_request_ref = $1";
/// SQLite's condition, plus the event's own state: PostgreSQL re-checks the updated
/// row's conditions after waiting for a racer's lock, not the subquery's, and an event
/// still pending or processing is exactly an operation that has not ended.
const FINALIZE: &str = "UPDATE outbox SET state = $5, updated_at = $4 \
     WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1 \
     AND status NOT IN ('succeeded', 'failed', 'quarantined', 'dead')) \
     AND state IN ('pending', 'processing') \
     AND ($2::text IS NULL OR (state = 'processing' AND lease_owner = $2 AND attempt_count = $3)) \
     RETURNING op_id";
const INSERT_OUTCOME: &str = "INSERT INTO terminal_outcomes (op_id, kind, reason, receipt_json, finalized_by, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6)";
const MARK_ENDED: &str = "UPDATE operations SET status = $3, updated_at = $2 WHERE id = $1 \
     AND status NOT IN ('succeeded', 'failed', 'quarantined', 'dead')";
const RELEASE: &str = "UPDATE outbox SET state = $5, lease_owner = NULL, lease_until = NULL, next_attempt_at = $6, \
     last_reason = $7, updated_at = $4 \
     WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1) \
     AND state = 'processing' AND lease_owner = $2 AND attempt_count = $3 RETURNING op_id";
const MARK_RELEASED: &str = "UPDATE operations SET status = $3, updated_at = $2 WHERE id = $1";
/// An attempt set aside (`Release::Later`): SQLite's statement.
const SET_ASIDE: &str = "UPDATE outbox SET state = $5, lease_until = $6, next_attempt_at = $6, last_reason = $7, \
     updated_at = $4 WHERE op_id = (SELECT id FROM operations WHERE status_ref = $1) \
     AND state = 'processing' AND lease_owner = $2 AND attempt_count = $3 RETURNING op_id";
/// The relay's due events, locked; events another relay has locked are skipped, so two
/// relays never wait on each other or take the same event.
const DUE: &str = "SELECT b.op_id, b.state FROM outbox b JOIN operations o ON o.id = b.op_id \
     WHERE b.state IN ('pending', 'processing') AND b.next_attempt_at <= $1 \
     AND o.downstream_name = $3 AND o.downstream_revision = $4 \
     ORDER BY b.next_attempt_at, b.op_id LIMIT $2 FOR UPDATE OF b SKIP LOCKED";
/// Commit C of a batch, each item fenced as [`FINALIZE`] fences one (an item with no
/// owner is a status query's); the refs and ids of those finalized.
const FINALIZE_MANY: &str = "UPDATE outbox b SET state = 'delivered', updated_at = $4 \
     FROM unnest($1::text[], $2::text[], $3::bigint[]) AS i (status_ref, owner, attempt) \
     JOIN operations o ON o.status_ref = i.status_ref \
     WHERE b.op_id = o.id AND o.status NOT IN ('succeeded', 'failed', 'quarantined', 'dead') \
     AND b.state IN ('pending', 'processing') \
     AND (i.owner IS NULL OR (b.state = 'processing' AND b.lease_owner = i.owner AND b.attempt_count = i.attempt)) \
     RETURNING i.status_ref, b.op_id";
const INSERT_LOCAL_MANY: &str = "INSERT INTO local_receipts (op_id, downstream_request_ref, receipt_ref, \
     receipt_json, output_json, result_sha256, finalized_by, created_at) \
     SELECT o, d, r, j, u, h, f, $8 FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], \
     $5::text[], $6::text[], $7::text[]) AS t (o, d, r, j, u, h, f)";
const MARK_SUCCEEDED_MANY: &str = "UPDATE operations SET status = 'succeeded', updated_at = $2 \
     WHERE id = ANY($1) AND status NOT IN ('succeeded', 'failed', 'quarantined', 'dead')";
/// Commit B of a batch (the simulation's): the refs it stored.
const INSERT_DOWNSTREAM_MANY: &str = "INSERT INTO downstream_receipts (downstream_request_ref, request_sha256, \
     receipt_ref, receipt_json, created_at) \
     SELECT d, q, r, j, $5 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS t (d, q, r, j) \
     ON CONFLICT DO NOTHING RETURNING downstream_request_ref";
/// The relay's claim of its verified due events, in one statement.
const CLAIM_MANY: &str = "UPDATE outbox SET state = 'processing', lease_owner = $2, lease_until = $3, \
     next_attempt_at = $3, attempt_count = attempt_count + 1, last_reason = NULL, updated_at = $4 \
     WHERE op_id = ANY($1) AND state IN ('pending', 'processing') AND next_attempt_at <= $4 \
     RETURNING op_id, attempt_count";
const MARK_PROCESSING_MANY: &str =
    "UPDATE operations SET status = 'processing', updated_at = $2 WHERE id = ANY($1)";
/// SQLite's statement, with the owner and the lease end re-checked on the row itself
/// (see [`FINALIZE`]): a lease taken over meanwhile is not extended.
const HEARTBEAT: &str = "UPDATE outbox SET lease_until = $3, next_attempt_at = $3, updated_at = $2 \
     WHERE op_id IN (SELECT op_id FROM outbox WHERE state IN ('pending', 'processing') \
     AND next_attempt_at > $2 AND lease_owner = $1) \
     AND state = 'processing' AND lease_owner = $1 AND next_attempt_at > $2 AND last_reason IS NULL";
const SELECT_STATUS: &str = "SELECT status FROM operations WHERE status_ref = $1";
const INSERT_LOCAL_RECEIPT: &str = "INSERT INTO local_receipts (op_id, downstream_request_ref, receipt_ref, receipt_json, \
     output_json, result_sha256, finalized_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
const SELECT_OPERATION_ID: &str = "SELECT id FROM operations WHERE status_ref = $1";

const BY_SCOPE: &str =
    "o.tenant_id = $1 AND o.subject_id = $2 AND o.tool_name = $3 AND o.idempotency_key = $4";
pub(crate) const BY_STATUS_REF: &str = "o.status_ref = $1";

/// How many of `load_finished`'s status refs retention has tombstoned.
const LOAD_RETIRED: &str = "SELECT count(*) FROM tombstones WHERE status_ref = ANY($1::text[])";
/// `load_finished`'s operations: one row per element of the arrays, succeeded.
const LOAD_OPERATIONS: &str = "INSERT INTO operations (tenant_id, subject_id, tool_name, idempotency_key, \
     status_ref, downstream_request_ref, request_sha256, arguments_json, input_revision, output_revision, \
     effect_revision, handler_revision, producer_revision, policy_revision, provider, api_family, \
     adapter_revision, provider_response_id, provider_call_id, operation_id, approval_id, approver_id, \
     approval_sha256, approved_at, approval_expires_at, downstream_name, downstream_revision, status, \
     created_at, updated_at) \
     SELECT t.*, 'succeeded', $28::bigint, $28::bigint FROM unnest($1::text[], $2::text[], $3::text[], \
     $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], \
     $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $18::text[], $19::text[], \
     $20::text[], $21::text[], $22::text[], $23::text[], $24::bigint[], $25::bigint[], $26::text[], \
     $27::text[]) AS t \
     ON CONFLICT DO NOTHING RETURNING id, status_ref";
/// The lease owner `load_finished` writes its operations as.
const LOADER: &str = "loader";
/// `load_finished`'s events: delivered, attempt 1 under the loader's ended lease.
const LOAD_OUTBOX: &str = "INSERT INTO outbox (op_id, state, lease_owner, lease_until, attempt_count, \
     next_attempt_at, last_reason, attempts_before, created_at, updated_at) \
     SELECT id, 'delivered', $4, $2, 1, $2, NULL, 0, $3, $3 FROM unnest($1::bigint[]) AS id";
/// `load_finished`'s dispatch call identities.
const LOAD_CALLS: &str = "INSERT INTO call_identities (provider, api_family, adapter_revision, \
     provider_response_id, provider_call_id, purpose, op_id, created_at) \
     SELECT p, f, a, r, c, 'dispatch', o, $7 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], \
     $5::text[], $6::bigint[]) AS t (p, f, a, r, c, o)";

/// The columns of a `load_finished` batch, as the arrays its statements bind.
#[derive(Default)]
struct Loaded {
    /// The operation's twenty text columns, `tenant_id` to `operation_id`.
    text: Vec<Vec<String>>,
    /// `approval_id`, `approver_id`, `approval_sha256` (NULL without an approval).
    approvals: [Vec<Option<String>>; 3],
    approved_at: Vec<Option<i64>>,
    approval_expires_at: Vec<Option<i64>>,
    downstream_names: Vec<String>,
    downstream_revisions: Vec<String>,
    providers: Vec<String>,
    api_families: Vec<String>,
    adapter_revisions: Vec<String>,
    response_ids: Vec<String>,
    call_ids: Vec<String>,
    request_digests: Vec<String>,
}

impl Loaded {
    fn of(finished: &[(NewOperation, CallIdentity, LocalReceipt)]) -> Loaded {
        let mut loaded = Loaded { text: vec![Vec::new(); 20], ..Loaded::default() };
        for (intent, call, receipt) in finished {
            let scope = &intent.scope;
            let revisions = &intent.revisions;
            let downstream = &receipt.downstream;
            let columns = [
                scope.tenant_id.as_str().to_owned(),
                scope.subject_id.as_str().to_owned(),
                scope.tool_name.clone(),
                scope.idempotency_key.as_str().to_owned(),
                intent.status_ref.as_str().to_owned(),
                toolledger_contract::digest::downstream_request_ref(scope, &intent.request_sha256),
                intent.request_sha256.as_str().to_owned(),
                canonicalize(&intent.arguments),
                revisions.input.clone(),
                revisions.output.clone(),
                revisions.effect.clone(),
                revisions.handler.clone(),
                revisions.producer.clone(),
                revisions.policy.clone(),
                intent.profile.provider.clone(),
                intent.profile.api_family.clone(),
                intent.profile.adapter_revision.clone(),
                intent.provider_response_id.as_str().to_owned(),
                intent.provider_call_id.as_str().to_owned(),
                intent.operation_id.as_str().to_owned(),
            ];
            for (column, value) in loaded.text.iter_mut().zip(columns) {
                column.push(value);
            }
            let approval = intent.approval.as_ref();
            let [ids, approvers, digests] = &mut loaded.approvals;
            ids.push(approval.map(|approval| approval.approval_id.as_str().to_owned()));
            approvers.push(approval.map(|approval| approval.approver_id.as_str().to_owned()));
            digests.push(approval.map(|approval| approval.approval_sha256.as_str().to_owned()));
            loaded.approved_at.push(approval.map(|approval| approval.approved_at.get()));
            loaded.approval_expires_at.push(approval.map(|approval| approval.expires_at.get()));
            loaded.downstream_names.push(intent.downstream.name().to_owned());
            loaded.downstream_revisions.push(intent.downstream.revision().to_owned());
            loaded.providers.push(call.profile.provider.clone());
            loaded.api_families.push(call.profile.api_family.clone());
            loaded.adapter_revisions.push(call.profile.adapter_revision.clone());
            loaded.response_ids.push(call.provider_response_id.as_str().to_owned());
            loaded.call_ids.push(call.provider_call_id.as_str().to_owned());
            loaded.request_digests.push(downstream.request_sha256.as_str().to_owned());
        }
        loaded
    }

    /// The parameters of [`LOAD_OPERATIONS`], stamped `now`.
    fn operation_params<'a>(&'a self, now: &'a i64) -> Vec<&'a (dyn ToSql + Sync)> {
        let mut params: Vec<&(dyn ToSql + Sync)> =
            self.text.iter().map(|column| column as &(dyn ToSql + Sync)).collect();
        params.extend(self.approvals.iter().map(|column| column as &(dyn ToSql + Sync)));
        params.push(&self.approved_at);
        params.push(&self.approval_expires_at);
        params.push(&self.downstream_names);
        params.push(&self.downstream_revisions);
        params.push(now);
        params
    }
}

/// An operation with its outbox event and local receipt, chosen by `filter`.
fn operation_sql(filter: &str) -> String {
    format!("SELECT {OPERATION_COLUMNS} {OPERATION_FROM} WHERE {filter}")
}

/// Dispatch's one read: the scope's operation and the call's identity. `(SELECT 1)`
/// makes it one row whether or not either exists.
fn dispatch_lookup_sql() -> String {
    format!(
        "SELECT {OPERATION_COLUMNS}, o.id, c.purpose, co.status_ref, co.tenant_id, co.subject_id, co.status \
         FROM (SELECT 1) AS one \
         LEFT JOIN operations o ON {BY_SCOPE} \
         LEFT JOIN outbox b ON b.op_id = o.id LEFT JOIN local_receipts l ON l.op_id = o.id \
         LEFT JOIN terminal_outcomes t ON t.op_id = o.id \
         LEFT JOIN call_identities c ON c.provider = $5 AND c.api_family = $6 AND c.provider_response_id = $7 \
         AND c.provider_call_id = $8 LEFT JOIN operations co ON co.id = c.op_id"
    )
}

/// A transaction's runner.
type Tx<'d, 't> = Db<'d, Transaction<'t>>;

/// How a store is opened: what it may create, and whether a damaged one is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opening {
    /// Created when the database holds none of toolledger's tables.
    Create,
    /// Never created; a damaged store is refused.
    Existing,
    /// Never created; a damaged store is opened, for the audit alone.
    Audit,
}

/// Upgrades the store at `url` to the current schema, in one transaction: the version
/// it had and the operations carried over, or `None` when it was current already
/// (nothing written). PostgreSQL's DDL is
/// transactional, so a failure leaves the store as it was; no copy is made (take one
/// with `pg_dump` first if policy wants it).
///
/// # Errors
///
/// [`StoreError::Missing`] when there is no store (or no such database);
/// [`StoreError::SchemaUnsupported`] when it is not a store this crate knows, or an
/// older one whose objects were changed by hand; [`StoreError::Backend`] when the server
/// cannot be reached.
pub fn migrate(url: &str, waits: Waits) -> Result<Option<(i64, i64)>, StoreError> {
    let config = session::config(url)?;
    let mut conn = session::open(&config, &waits).map_err(|err| match err {
        StoreError::Backend { kind: FailureKind::NoDatabase, .. } => StoreError::Missing,
        err => err,
    })?;
    schema::migrate(&mut conn)
}

impl PgStore {
    /// Connects to the database at `url` (a `postgres://` URL or `key=value` pairs) and
    /// opens the store in its current schema: created, in one transaction, when the
    /// database holds none of toolledger's tables; opened when `meta` names
    /// `toolledger-store-v4` and every table, column, index, constraint and trigger is
    /// the expected one; anything else is [`StoreError::SchemaUnsupported`] and nothing
    /// is written. Writes judge by the database's clock ([`Clock::Database`]).
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when the server cannot be reached or refuses;
    /// [`StoreError::SchemaUnsupported`] as above; [`StoreError::Busy`] when another
    /// creator held the creation lock past the wait bound.
    pub fn connect(url: &str, waits: Waits) -> Result<PgStore, StoreError> {
        PgStore::open(url, waits, Opening::Create)
    }

    /// Opens an existing store, for the commands that never create one: as
    /// [`PgStore::connect`], but creates nothing — a database without toolledger's
    /// tables is [`StoreError::Missing`]. A store whose objects differ from the DDL is
    /// refused as by [`PgStore::connect`]: only [`PgStore::connect_for_audit`] reads one.
    ///
    /// # Errors
    ///
    /// As [`PgStore::connect`], plus [`StoreError::Missing`] (also when the database
    /// itself does not exist).
    pub fn connect_existing(url: &str, waits: Waits) -> Result<PgStore, StoreError> {
        PgStore::open(url, waits, Opening::Existing)
    }

    /// Opens an existing store for [`LedgerStore::audit`]: as
    /// [`PgStore::connect_existing`], but a store whose objects differ from the DDL is
    /// opened too, so the audit can report `schema_matches` and everything else it can
    /// still read. Nothing else may use such a connection.
    ///
    /// # Errors
    ///
    /// As [`PgStore::connect_existing`].
    pub fn connect_for_audit(url: &str, waits: Waits) -> Result<PgStore, StoreError> {
        PgStore::open(url, waits, Opening::Audit)
    }

    fn open(url: &str, waits: Waits, opening: Opening) -> Result<PgStore, StoreError> {
        let create = opening == Opening::Create;
        let config = session::config(url)?;
        let mut conn = session::open(&config, &waits).map_err(|err| match err {
            // No such database is no store there, to a reader (as a missing file is).
            StoreError::Backend { kind: FailureKind::NoDatabase, .. } if !create => {
                StoreError::Missing
            }
            err => err,
        })?;
        schema::prepare(&mut conn, create, opening == Opening::Audit)?;
        Ok(PgStore { config, waits, clock: Clock::default(), conn: Some(conn), home: None })
    }

    /// A store on a connection the pool made (the schema already checked).
    pub(crate) fn pooled(
        config: Config,
        waits: Waits,
        clock: Clock,
        conn: Conn,
        home: Arc<Shared>,
    ) -> PgStore {
        PgStore { config, waits, clock, conn: Some(conn), home: Some(home) }
    }

    /// Takes the connection away (the pool keeps it); the store is left unconnected.
    pub(crate) fn take_connection(&mut self) -> Option<Conn> {
        self.conn.take()
    }

    /// The store with its writes judged by `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> PgStore {
        self.clock = clock;
        self
    }

    /// Which clock the store's writes judge by.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Writes finished operations (`intent`, its dispatch `call`, its local receipt) in
    /// one transaction, set-based (one statement per table over arrays): the rows a
    /// dispatch that claimed, received the stand-in's receipt and finalized would have
    /// written (attempt 1 under the lease of `loader`, finalized by it at `now`). For
    /// building large ledgers (benchmarks); the number written. Every row is verified on
    /// the way out like any other, and the audit holds them to every invariant.
    ///
    /// # Errors
    ///
    /// [`StoreError`]; `ContractViolation` when an operation's scope or refs are already
    /// taken, and then nothing of the batch is written.
    pub fn load_finished(
        &mut self,
        finished: &[(NewOperation, CallIdentity, LocalReceipt)],
        now: Now,
    ) -> Result<usize, StoreError> {
        let lease = LeaseSeconds::new(1).map_err(|_| StoreError::Internal("one second"))?;
        let count = i64::try_from(finished.len())
            .map_err(|_| StoreError::Internal("the batch is too large"))?;
        self.write(now, |db, now| {
            let until = lease_end(now, lease)?;
            let loaded = Loaded::of(finished);
            let retired: Option<i64> =
                db.value(LOAD_RETIRED, &[&loaded.text.get(4).cloned().unwrap_or_default()])?;
            if retired.unwrap_or(0) > 0 {
                return Err(StoreError::ContractViolation("a loaded operation's key was retired"));
            }
            let stamp = now.get();
            let ids: Vec<(i64, String)> = db
                .query(LOAD_OPERATIONS, &loaded.operation_params(&stamp))?
                .iter()
                .map(|row| Ok((get(row, 0)?, get(row, 1)?)))
                .collect::<Result<_, StoreError>>()?;
            if ids.len() != finished.len() {
                return Err(StoreError::ContractViolation("a loaded operation is not new"));
            }
            let by_ref: std::collections::HashMap<&str, i64> =
                ids.iter().map(|(id, status_ref)| (status_ref.as_str(), *id)).collect();
            let op_ids = finished
                .iter()
                .map(|(intent, _, _)| {
                    by_ref
                        .get(intent.status_ref.as_str())
                        .copied()
                        .ok_or(StoreError::Internal("a loaded operation has no id"))
                })
                .collect::<Result<Vec<i64>, _>>()?;
            db.exec(LOAD_OUTBOX, &[&op_ids, &until.get(), &now.get(), &LOADER])?;
            db.exec(
                LOAD_CALLS,
                &[
                    &loaded.providers,
                    &loaded.api_families,
                    &loaded.adapter_revisions,
                    &loaded.response_ids,
                    &loaded.call_ids,
                    &op_ids,
                    &now.get(),
                ],
            )?;
            // The stand-in's receipts and the local receipts, by the batch statements of
            // commits B and C, finalized by the loader's lease.
            let loader = Identifier::new(LOADER)
                .map_err(|_| StoreError::Internal("the loader's name is an identifier"))?;
            let by = Finalizer::Lease { owner: loader, attempt: 1 };
            let mut local = LocalColumns::default();
            for (id, (_, _, receipt)) in op_ids.iter().zip(finished) {
                local.push(*id, &by, receipt);
            }
            let stored = db.query(
                INSERT_DOWNSTREAM_MANY,
                &[
                    &local.request_refs,
                    &loaded.request_digests,
                    &local.receipt_refs,
                    &local.receipts,
                    &now.get(),
                ],
            )?;
            if stored.len() != finished.len() {
                return Err(StoreError::ContractViolation("a loaded receipt is not new"));
            }
            local.insert(db, now)?;
            bump_by(db, "claims", count)?;
            Ok(finished.len())
        })
    }

    /// The server process id of the store's connection (`pg_backend_pid()`), connecting
    /// first if the connection was lost: for operators matching `pg_stat_activity`.
    ///
    /// # Errors
    ///
    /// [`StoreError`].
    pub fn backend_pid(&mut self) -> Result<i32, StoreError> {
        self.read(|db| {
            db.value("SELECT pg_backend_pid()", &[])?
                .ok_or(StoreError::Internal("a function answered no row"))
        })
    }

    /// The connection, made again when it was lost; the lock wait bound re-armed when
    /// the store has a deadline.
    fn ready(&mut self) -> Result<&mut Conn, StoreError> {
        if self.conn.as_ref().is_some_and(|conn| conn.client.is_closed()) {
            self.conn = None;
        }
        let conn = match self.conn.take() {
            Some(mut conn) => {
                let armed = match self.waits.deadline {
                    Some(_) => conn.arm(self.waits.next_wait()),
                    None => Ok(()),
                };
                if let Err(err) = armed {
                    if !is_lost(&err) {
                        self.conn = Some(conn);
                    }
                    return Err(err);
                }
                conn
            }
            None => session::open(&self.config, &self.waits)?,
        };
        Ok(self.conn.insert(conn))
    }

    /// After an error: a connection that was lost is dropped, to be made again.
    fn settle(&mut self, err: &StoreError) {
        if is_lost(err) || self.conn.as_ref().is_some_and(|conn| conn.client.is_closed()) {
            self.conn = None;
        }
    }

    /// Runs `work` on the connection outside a transaction (each statement its own
    /// snapshot). A connection found lost is made again and `work` run once more: a
    /// read changes nothing.
    pub(crate) fn with_conn<T>(
        &mut self,
        mut work: impl FnMut(&mut Conn) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut again = true;
        loop {
            let result = self.ready().and_then(&mut work);
            match result {
                Err(err) => {
                    self.settle(&err);
                    if is_lost(&err) && std::mem::take(&mut again) {
                        continue;
                    }
                    return Err(err);
                }
                ok => return ok,
            }
        }
    }

    /// A read on the connection (see [`PgStore::with_conn`]).
    pub(crate) fn read<T>(
        &mut self,
        mut work: impl FnMut(&mut Db<'_, session::Client>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.with_conn(|conn| work(&mut conn.db()))
    }

    /// [`PgStore::read`] judged at an instant: the database's clock (read first, on the
    /// same connection) or `now`, as the store's writes judge (see [`Clock`]). A reader
    /// whose host clock lags the server's thus sees what the writers stamped.
    pub(crate) fn read_at<T>(
        &mut self,
        now: Now,
        mut work: impl FnMut(&mut Db<'_, session::Client>, Now) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let clock = self.clock;
        self.read(|db| {
            let now = match clock {
                Clock::Database => session::database_now(db)?,
                Clock::Caller => now,
            };
            work(db, now)
        })
    }

    /// Runs `work` as one write transaction and commits it. `work` gets the instant to
    /// judge and stamp by: the database's clock, or `now` (see [`Clock`]).
    pub(crate) fn write<T>(
        &mut self,
        now: Now,
        mut work: impl FnMut(&mut Tx<'_, '_>, Now) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.transact(now, |db, now| work(db, now).map(|value| (value, true)))
    }

    /// Runs `work` as one write transaction, committed when it answers `(_, true)` and
    /// rolled back when it answers `(_, false)`. A serialization failure or a deadlock
    /// runs it again, up to [`ATTEMPTS`] times, then answers `Busy`; a connection found
    /// lost before the transaction began is made again once.
    pub(crate) fn transact<T>(
        &mut self,
        now: Now,
        mut work: impl FnMut(&mut Tx<'_, '_>, Now) -> Result<(T, bool), StoreError>,
    ) -> Result<T, StoreError> {
        let mut attempts = 0;
        let mut reconnect = true;
        loop {
            match self.attempt(now, &mut work) {
                Ok(value) => return Ok(value),
                Err((err, began)) => {
                    self.settle(&err);
                    if is_lost(&err) && !began && std::mem::take(&mut reconnect) {
                        continue;
                    }
                    if is_conflict(&err) {
                        attempts += 1;
                        if attempts >= ATTEMPTS {
                            return Err(StoreError::Busy);
                        }
                        std::thread::sleep(Duration::from_millis(u64::from(attempts) * 2));
                        continue;
                    }
                    return Err(err);
                }
            }
        }
    }

    /// One run of a write transaction; an error says whether the transaction had begun.
    fn attempt<T>(
        &mut self,
        now: Now,
        work: &mut impl FnMut(&mut Tx<'_, '_>, Now) -> Result<(T, bool), StoreError>,
    ) -> Result<T, (StoreError, bool)> {
        let clock = self.clock;
        let Conn { client, cache } = self.ready().map_err(|err| (err, false))?;
        let mut tx =
            client.begin(IsolationLevel::ReadCommitted, false).map_err(|err| (err, false))?;
        let (value, keep) =
            run(&mut Db::new(&mut tx, cache), clock, now, work).map_err(|err| (err, true))?;
        if keep {
            // The server may have committed before the answer was lost, or went unsaid.
            tx.commit().map_err(|err| (StoreError::commit_unknown("postgres", err), true))?;
            toolledger_store::crash::committed();
        } else {
            tx.rollback().map_err(|err| (err, true))?;
        }
        Ok(value)
    }
}

/// `work` inside the transaction, with the instant it judges by.
fn run<T>(
    db: &mut Tx<'_, '_>,
    clock: Clock,
    now: Now,
    work: &mut impl FnMut(&mut Tx<'_, '_>, Now) -> Result<(T, bool), StoreError>,
) -> Result<(T, bool), StoreError> {
    let now = match clock {
        Clock::Database => session::database_now(db)?,
        Clock::Caller => now,
    };
    work(db, now)
}

/// `at`, an instant the caller derived from its own clock reading `from`, moved to the
/// clock reading `to`: the same distance from it (within the instants' range).
pub(crate) fn shifted(at: Now, from: Now, to: Now) -> Now {
    let moved = to.get().saturating_add(at.get().saturating_sub(from.get()));
    UnixSeconds::new(moved.clamp(0, UnixSeconds::MAX)).unwrap_or(to)
}

/// `now + lease`, or an error past year 9999.
fn lease_end(now: Now, lease: LeaseSeconds) -> Result<Now, StoreError> {
    now.checked_add(lease).ok_or(failed("the lease would end after year 9999"))
}

/// The columns of an operation joined with its outbox event, in
/// [`OPERATION_COLUMNS`] order.
pub(crate) fn raw_operation(row: &Row) -> Result<RawOperation, postgres::Error> {
    RawOperation::decode(&Columns(row))
}

/// A driver row, read by position for [`RawOperation::decode`].
struct Columns<'r>(&'r Row);

impl verify::Columns for Columns<'_> {
    type Error = postgres::Error;

    fn text(&self, index: usize) -> Result<String, postgres::Error> {
        self.0.try_get(index)
    }

    fn optional_text(&self, index: usize) -> Result<Option<String>, postgres::Error> {
        self.0.try_get(index)
    }

    fn optional_int(&self, index: usize) -> Result<Option<i64>, postgres::Error> {
        self.0.try_get(index)
    }

    fn int(&self, index: usize) -> Result<i64, postgres::Error> {
        self.0.try_get(index)
    }
}

/// The operation `filter` chooses, verified.
pub(crate) fn select_operation_in<C: GenericClient>(
    db: &mut Db<'_, C>,
    filter: &str,
    key: &session::Params<'_>,
) -> Result<Option<Operation>, StoreError> {
    let Some(row) = db.opt(&operation_sql(filter), key)? else {
        return Ok(None);
    };
    let raw = raw_operation(&row).map_err(error::decode)?;
    Ok(Some(verify::operation(raw)?))
}

fn by_scope<C: GenericClient>(
    db: &mut Db<'_, C>,
    scope: &Scope,
) -> Result<Option<Operation>, StoreError> {
    select_operation_in(
        db,
        BY_SCOPE,
        &[
            &scope.tenant_id.as_str(),
            &scope.subject_id.as_str(),
            &scope.tool_name,
            &scope.idempotency_key.as_str(),
        ],
    )
}

fn by_status_ref<C: GenericClient>(
    db: &mut Db<'_, C>,
    status_ref: &StatusRef,
) -> Result<Option<Operation>, StoreError> {
    select_operation_in(db, BY_STATUS_REF, &[&status_ref.as_str()])
}

fn recorded_call<C: GenericClient>(
    db: &mut Db<'_, C>,
    call: &CallIdentity,
) -> Result<Option<RecordedCall>, StoreError> {
    let row = db.opt(
        SELECT_CALL,
        &[
            &call.profile.provider,
            &call.profile.api_family,
            &call.provider_response_id.as_str(),
            &call.provider_call_id.as_str(),
        ],
    )?;
    row.map(|row| raw_recorded(&row, 0)).transpose()?.map(recorded_from).transpose()
}

/// A recorded call's purpose and its operation's status ref, tenant, subject and
/// status, from five columns starting at `at`.
type RawRecorded = (String, String, String, String, String);

fn raw_recorded(row: &Row, at: usize) -> Result<RawRecorded, StoreError> {
    Ok((get(row, at)?, get(row, at + 1)?, get(row, at + 2)?, get(row, at + 3)?, get(row, at + 4)?))
}

fn recorded_from(
    (purpose, status_ref, tenant, subject, status): RawRecorded,
) -> Result<RecordedCall, StoreError> {
    verify::recorded_call(&purpose, &status_ref, &tenant, &subject, &status)
}

/// Records `call` for the operation `op_id`. A racer that recorded the same identity
/// first (its transaction committed while this one waited) makes this insert nothing:
/// then the whole transaction runs again, and finds the identity recorded.
fn insert_call(
    db: &mut Tx<'_, '_>,
    call: &CallIdentity,
    purpose: Purpose,
    op_id: i64,
    now: Now,
) -> Result<(), StoreError> {
    let inserted = db.exec(
        INSERT_CALL,
        &[
            &call.profile.provider,
            &call.profile.api_family,
            &call.profile.adapter_revision,
            &call.provider_response_id.as_str(),
            &call.provider_call_id.as_str(),
            &purpose.as_str(),
            &op_id,
            &now.get(),
        ],
    )?;
    if inserted == 1 { Ok(()) } else { Err(error::conflict()) }
}

fn downstream_receipt<C: GenericClient>(
    db: &mut Db<'_, C>,
    downstream_request_ref: &str,
) -> Result<Option<DownstreamReceipt>, StoreError> {
    let Some(row) = db.opt(SELECT_DOWNSTREAM, &[&downstream_request_ref])? else {
        return Ok(None);
    };
    let (request, receipt_ref, receipt_json): (String, String, String) =
        (get(&row, 0)?, get(&row, 1)?, get(&row, 2)?);
    Ok(Some(verify::downstream(
        downstream_request_ref.to_owned(),
        &request,
        receipt_ref,
        &receipt_json,
    )?))
}

/// How an operation ends, in commit C, with its JSON canonicalized by the caller.
pub(crate) enum Ending {
    /// The local receipt, its receipt's canonical JSON and its output's.
    Succeeded(LocalReceipt, String, String),
    Failed(String),
    /// The kept receipt's canonical JSON and the reason.
    Quarantined(String, String),
}

impl Ending {
    pub(crate) fn succeeded(receipt: &LocalReceipt) -> Ending {
        Ending::Succeeded(
            receipt.clone(),
            canonicalize(&receipt.downstream.receipt),
            canonicalize(&receipt.output),
        )
    }
}

/// An operation's status, read inside a transaction.
fn status_of(
    db: &mut Tx<'_, '_>,
    status_ref: &StatusRef,
) -> Result<Option<OperationStatus>, StoreError> {
    db.value::<String>(SELECT_STATUS, &[&status_ref.as_str()])?
        .map(|text| {
            OperationStatus::parse(&text)
                .ok_or(StoreError::ContractViolation("stored status is unknown"))
        })
        .transpose()
}

/// Commit C inside the caller's transaction: conditional on the operation not having
/// ended and, for a worker, on it still holding the lease (owner and attempt); then the
/// outcome's row and the operation's status. A refused write is counted there too.
pub(crate) fn end_in(
    db: &mut Tx<'_, '_>,
    status_ref: &StatusRef,
    by: &Finalizer,
    now: Now,
    ending: &Ending,
) -> Result<Finalize, StoreError> {
    let (owner, attempt) = match by {
        Finalizer::Lease { owner, attempt } => (Some(owner.as_str()), Some(*attempt)),
        Finalizer::StatusQuery | Finalizer::Operator => (None, None),
    };
    let status = match ending {
        Ending::Succeeded(..) => OperationStatus::Succeeded,
        Ending::Failed(_) => OperationStatus::Failed,
        Ending::Quarantined(..) => OperationStatus::Quarantined,
    };
    let state = status.outbox_state().as_str();
    let id: Option<i64> =
        db.value(FINALIZE, &[&status_ref.as_str(), &owner, &attempt, &now.get(), &state])?;
    let Some(id) = id else {
        // Nothing of the ending written: say why (a refused write is counted).
        return not_written(db, status_ref, owner.is_some());
    };
    if matches!((by, ending), (Finalizer::StatusQuery, Ending::Succeeded(..))) {
        bump(db, "reconciliations")?;
    }
    match ending {
        Ending::Succeeded(receipt, receipt_json, output_json) => {
            let downstream = &receipt.downstream;
            db.exec(
                INSERT_LOCAL_RECEIPT,
                &[
                    &id,
                    &downstream.downstream_request_ref,
                    &downstream.receipt_ref,
                    receipt_json,
                    output_json,
                    &receipt.result_sha256.as_str(),
                    &by.as_str(),
                    &now.get(),
                ],
            )?;
        }
        Ending::Failed(reason) | Ending::Quarantined(_, reason) => {
            let receipt = match ending {
                Ending::Quarantined(receipt, _) => Some(receipt.as_str()),
                _ => None,
            };
            db.exec(
                INSERT_OUTCOME,
                &[
                    &id,
                    &status.as_str(),
                    &toolledger_store::bounded_reason(reason),
                    &receipt,
                    &by.as_str(),
                    &now.get(),
                ],
            )?;
        }
    }
    db.exec(MARK_ENDED, &[&id, &now.get(), &status.as_str()])?;
    Ok(Finalize::Finalized)
}

/// Commit B inside the caller's transaction: the receipt unless one exists for its ref;
/// the stored one either way.
fn record_downstream_in(
    db: &mut Tx<'_, '_>,
    receipt: &DownstreamReceipt,
    receipt_json: &str,
    now: Now,
) -> Result<DownstreamReceipt, StoreError> {
    let inserted = db.exec(
        INSERT_DOWNSTREAM,
        &[
            &receipt.downstream_request_ref,
            &receipt.request_sha256.as_str(),
            &receipt.receipt_ref,
            &receipt_json,
            &now.get(),
        ],
    )?;
    if inserted == 1 {
        // This call wrote it: what is stored is exactly `receipt`.
        return Ok(receipt.clone());
    }
    // Nothing stored under this ref, yet something refused the row: another ref holds
    // its receipt ref (SQLite answers this as its unique constraint's refusal).
    downstream_receipt(db, &receipt.downstream_request_ref)?
        .ok_or(error::fail(FailureKind::Refused, error::REFUSED))
}

/// Adds one to the counter `name`, inside the caller's transaction.
pub(crate) fn bump(db: &mut Tx<'_, '_>, name: &str) -> Result<(), StoreError> {
    db.exec(BUMP, &[&name])?;
    Ok(())
}

/// Adds `count` to the counter `name` (nothing when zero): a batch counts once.
fn bump_by(db: &mut Tx<'_, '_>, name: &str, count: i64) -> Result<(), StoreError> {
    if count > 0 {
        db.exec(BUMP_BY, &[&name, &count])?;
    }
    Ok(())
}

/// Why a conditional end or release matched nothing: the operation is gone, has already
/// ended, or — for a lease holder — its lease was taken over (a fenced write, counted).
fn not_written(
    db: &mut Tx<'_, '_>,
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

/// Whether the scope of `status_ref` was retired by retention.
fn retired<C: GenericClient>(
    db: &mut Db<'_, C>,
    status_ref: &StatusRef,
) -> Result<bool, StoreError> {
    Ok(db.value::<String>(RETIRED, &[&status_ref.as_str()])?.is_some())
}

/// Commit A inside the caller's transaction (see [`LedgerStore::reserve`]); with
/// `claim`, the new event is leased to its owner for the lease in the same transaction.
/// Answers whether to commit: only a reservation wrote anything.
fn reserve_in(
    db: &mut Tx<'_, '_>,
    (intent, arguments_json): (&NewOperation, &str),
    call: &CallIdentity,
    now: Now,
    claim: Option<(&Identifier, LeaseSeconds)>,
) -> Result<(Reservation, bool), StoreError> {
    let claim = claim.map(|(owner, lease)| lease_end(now, lease).map(|until| (owner, until)));
    let claim = claim.transpose()?;
    let downstream_request_ref =
        toolledger_contract::digest::downstream_request_ref(&intent.scope, &intent.request_sha256);
    match recorded_call(db, call)? {
        Some(recorded) if recorded.purpose == Purpose::QueryStatus => {
            return Ok((Reservation::CallPurposeConflict, false));
        }
        // One model call is one intent: its identity already names another operation.
        Some(recorded) if recorded.status_ref != intent.status_ref => {
            return Ok((Reservation::CallReused(Box::new(recorded)), false));
        }
        _ => {}
    }
    if retired(db, &intent.status_ref)? {
        return Ok((Reservation::Retired, false));
    }
    // Pending and unclaimed, or processing under the claim's lease at attempt 1.
    let status =
        if claim.is_some() { OperationStatus::Processing } else { OperationStatus::Pending };
    let scope = &intent.scope;
    let revisions = &intent.revisions;
    let approval = intent.approval.as_ref();
    let inserted: Option<i64> = db
        .value(
            INSERT_OPERATION,
            &[
                &scope.tenant_id.as_str(),
                &scope.subject_id.as_str(),
                &scope.tool_name,
                &scope.idempotency_key.as_str(),
                &intent.status_ref.as_str(),
                &downstream_request_ref,
                &intent.request_sha256.as_str(),
                &arguments_json,
                &revisions.input,
                &revisions.output,
                &revisions.effect,
                &revisions.handler,
                &revisions.producer,
                &revisions.policy,
                &intent.profile.provider,
                &intent.profile.api_family,
                &intent.profile.adapter_revision,
                &intent.provider_response_id.as_str(),
                &intent.provider_call_id.as_str(),
                &intent.operation_id.as_str(),
                &approval.map(|approval| approval.approval_id.as_str()),
                &approval.map(|approval| approval.approver_id.as_str()),
                &approval.map(|approval| approval.approval_sha256.as_str()),
                &approval.map(|approval| approval.approved_at.get()),
                &approval.map(|approval| approval.expires_at.get()),
                &now.get(),
                &intent.downstream.name(),
                &intent.downstream.revision(),
                &status.as_str(),
            ],
        )
        .map_err(|err| match err {
            // As SQLite: a row the table's constraints refuse is a contract violation.
            StoreError::Backend { kind: FailureKind::Refused, .. } => {
                StoreError::ContractViolation(
                    "a stored row holds this intent's refs under another scope",
                )
            }
            err => err,
        })?;
    let Some(id) = inserted else {
        // Nothing inserted: the scope exists (a racer's commit was waited for), or
        // another row holds this intent's refs. Read the authoritative row; nothing
        // was written.
        return match by_scope(db, scope)? {
            Some(existing) => Ok((Reservation::Exists(Box::new(existing)), false)),
            // Retired between the check above and the insert: the scope's row is gone.
            None if retired(db, &intent.status_ref)? => Ok((Reservation::Retired, false)),
            None => Err(StoreError::ContractViolation(
                "a stored row holds this intent's refs under another scope",
            )),
        };
    };
    // Retention may have removed the scope's old row while this insert waited for it:
    // its tombstone committed with the removal, so it is visible now.
    if retired(db, &intent.status_ref)? {
        return Ok((Reservation::Retired, false));
    }
    match claim {
        None => db.exec(INSERT_OUTBOX, &[&id, &now.get()])?,
        Some((owner, until)) => {
            db.exec(INSERT_OUTBOX_CLAIMED, &[&id, &now.get(), &owner.as_str(), &until.get()])?
        }
    };
    if claim.is_some() {
        bump(db, "claims")?;
    }
    insert_call(db, call, Purpose::Dispatch, id, now)?;
    // What was just written, as a read would return it: pending and unclaimed, or
    // processing under the claim's lease at attempt 1.
    let reserved = Operation {
        intent: intent.clone(),
        downstream_request_ref,
        status,
        outbox: OutboxEvent {
            state: status.outbox_state(),
            lease_owner: claim.map(|(owner, _)| owner.as_str().to_owned()),
            lease_until: claim.map(|(_, until)| until.get()),
            attempt_count: i64::from(claim.is_some()),
            next_attempt_at: claim.map_or(now.get(), |(_, until)| until.get()),
            last_reason: None,
            attempts_before: 0,
        },
        receipt: None,
        outcome: None,
        created_at: now.get(),
    };
    Ok((Reservation::Reserved(Box::new(reserved)), true))
}

/// The claim inside the caller's transaction (see [`LedgerStore::claim`]).
fn claim_in(
    db: &mut Tx<'_, '_>,
    status_ref: &StatusRef,
    owner: &Identifier,
    now: Now,
    lease: LeaseSeconds,
) -> Result<Claim, StoreError> {
    let lease_until = lease_end(now, lease)?;
    // The event's row locked first: the state read is the one the update changes.
    let Some(was) = db.value::<String>(LOCK_OUTBOX, &[&status_ref.as_str()])? else {
        return Ok(Claim::Missing);
    };
    // One conditional update claims a pending event or an expired lease (live while
    // now < lease_until) and answers the new attempt.
    let claimed =
        db.opt(CLAIM, &[&status_ref.as_str(), &owner.as_str(), &lease_until.get(), &now.get()])?;
    let Some(row) = claimed else {
        // Nothing claimed (and nothing written): say why.
        return not_claimed(&was);
    };
    let (id, attempt): (i64, i64) = (get(&row, 0)?, get(&row, 1)?);
    db.exec(MARK_PROCESSING, &[&id, &now.get()])?;
    bump(db, "claims")?;
    let reclaimed = was == OutboxState::Processing.as_str();
    if reclaimed {
        bump(db, "lease_reclaims")?;
    }
    // Read back inside the claim: a row that no longer verifies rolls the claim back.
    let operation =
        by_status_ref(db, status_ref)?.ok_or(StoreError::Internal("the operation vanished"))?;
    Ok(Claim::Claimed { attempt, operation: Box::new(operation), reclaimed })
}

/// The local receipts of a finalized batch, as the arrays [`INSERT_LOCAL_MANY`] binds.
#[derive(Default)]
struct LocalColumns {
    ids: Vec<i64>,
    request_refs: Vec<String>,
    receipt_refs: Vec<String>,
    receipts: Vec<String>,
    outputs: Vec<String>,
    results: Vec<String>,
    finalized_by: Vec<&'static str>,
}

impl LocalColumns {
    fn push(&mut self, id: i64, by: &Finalizer, receipt: &LocalReceipt) {
        let downstream = &receipt.downstream;
        self.ids.push(id);
        self.request_refs.push(downstream.downstream_request_ref.clone());
        self.receipt_refs.push(downstream.receipt_ref.clone());
        self.receipts.push(canonicalize(&downstream.receipt));
        self.outputs.push(canonicalize(&receipt.output));
        self.results.push(receipt.result_sha256.as_str().to_owned());
        self.finalized_by.push(by.as_str());
    }

    /// Inserts every receipt pushed so far in one statement.
    fn insert(&self, db: &mut Tx<'_, '_>, now: Now) -> Result<u64, StoreError> {
        db.exec(
            INSERT_LOCAL_MANY,
            &[
                &self.ids,
                &self.request_refs,
                &self.receipt_refs,
                &self.receipts,
                &self.outputs,
                &self.results,
                &self.finalized_by,
                &now.get(),
            ],
        )
    }
}

/// The verified operations of the due events `ids`, by id; a row that cannot be decoded
/// or does not verify is left out (it is not claimed).
fn verified_due(
    db: &mut Tx<'_, '_>,
    ids: &[i64],
) -> Result<std::collections::HashMap<i64, Operation>, StoreError> {
    let sql = format!("SELECT {OPERATION_COLUMNS}, o.id {OPERATION_FROM} WHERE o.id = ANY($1)");
    let mut verified = std::collections::HashMap::new();
    for row in db.query(&sql, &[&ids])? {
        let id: i64 = get(&row, OPERATION_WIDTH)?;
        let Ok(raw) = raw_operation(&row) else { continue };
        match verify::operation(raw) {
            Ok(operation) => {
                verified.insert(id, operation);
            }
            Err(_) => continue,
        }
    }
    Ok(verified)
}

impl LedgerStore for PgStore {
    fn dispatch_lookup(
        &mut self,
        scope: &Scope,
        call: &CallIdentity,
    ) -> Result<DispatchLookup, StoreError> {
        let sql = dispatch_lookup_sql();
        self.read(|db| {
            // One statement, so both facts come from one snapshot: the single row always
            // exists; the operation's columns are NULL when the scope is free.
            let row = db.one(
                &sql,
                &[
                    &scope.tenant_id.as_str(),
                    &scope.subject_id.as_str(),
                    &scope.tool_name,
                    &scope.idempotency_key.as_str(),
                    &call.profile.provider,
                    &call.profile.api_family,
                    &call.provider_response_id.as_str(),
                    &call.provider_call_id.as_str(),
                ],
            )?;
            let raw = match get::<Option<i64>>(&row, OPERATION_WIDTH)? {
                Some(_) => Some(raw_operation(&row).map_err(error::decode)?),
                None => None,
            };
            let recorded = match get::<Option<String>>(&row, OPERATION_WIDTH + 1)? {
                Some(_) => Some(raw_recorded(&row, OPERATION_WIDTH + 1)?),
                None => None,
            };
            let call = recorded.map(recorded_from).transpose()?;
            let operation = raw.map(verify::operation).transpose()?;
            Ok(DispatchLookup { call, operation })
        })
    }

    fn operation_by_scope(&mut self, scope: &Scope) -> Result<Option<Operation>, StoreError> {
        self.read(|db| by_scope(db, scope))
    }

    fn operation_by_status_ref(
        &mut self,
        status_ref: &StatusRef,
    ) -> Result<Option<Operation>, StoreError> {
        self.read(|db| by_status_ref(db, status_ref))
    }

    fn recorded_call(&mut self, call: &CallIdentity) -> Result<Option<RecordedCall>, StoreError> {
        self.read(|db| recorded_call(db, call))
    }

    fn reserve(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
    ) -> Result<Reservation, StoreError> {
        let arguments = canonicalize(&intent.arguments);
        self.transact(now, |db, now| reserve_in(db, (intent, &arguments), call, now, None))
    }

    fn reserve_claimed(
        &mut self,
        intent: &NewOperation,
        call: &CallIdentity,
        now: Now,
        owner: &Identifier,
        lease: LeaseSeconds,
    ) -> Result<Reservation, StoreError> {
        let arguments = canonicalize(&intent.arguments);
        self.transact(now, |db, now| {
            reserve_in(db, (intent, &arguments), call, now, Some((owner, lease)))
        })
    }

    fn claim(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<Claim, StoreError> {
        self.write(now, |db, now| claim_in(db, status_ref, owner, now, lease))
    }

    fn record_status_query(
        &mut self,
        call: &CallIdentity,
        status_ref: &StatusRef,
        now: Now,
    ) -> Result<Option<RecordedCall>, StoreError> {
        self.write(now, |db, now| {
            if let Some(recorded) = recorded_call(db, call)? {
                return Ok(Some(recorded));
            }
            let id: i64 = db
                .value(SELECT_OPERATION_ID, &[&status_ref.as_str()])?
                .ok_or(StoreError::Internal("the operation vanished"))?;
            insert_call(db, call, Purpose::QueryStatus, id, now)?;
            Ok(None)
        })
    }

    fn finalize(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        receipt: &LocalReceipt,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        let ending = Ending::succeeded(receipt);
        self.write(now, |db, now| end_in(db, status_ref, by, now, &ending))
    }

    fn fail(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        reason: &str,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        let ending = Ending::Failed(reason.to_owned());
        self.write(now, |db, now| end_in(db, status_ref, by, now, &ending))
    }

    fn quarantine(
        &mut self,
        status_ref: &StatusRef,
        by: &Finalizer,
        receipt: &Value,
        reason: &str,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        let ending = Ending::Quarantined(canonicalize(receipt), reason.to_owned());
        self.write(now, |db, now| end_in(db, status_ref, by, now, &ending))
    }

    fn finalize_many(
        &mut self,
        items: &[(StatusRef, Finalizer, LocalReceipt)],
        now: Now,
    ) -> Result<Vec<Finalize>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<&str> = items.iter().map(|(status_ref, _, _)| status_ref.as_str()).collect();
        let owners: Vec<Option<&str>> = items
            .iter()
            .map(|(_, by, _)| match by {
                Finalizer::Lease { owner, .. } => Some(owner.as_str()),
                Finalizer::StatusQuery | Finalizer::Operator => None,
            })
            .collect();
        let attempts: Vec<Option<i64>> = items
            .iter()
            .map(|(_, by, _)| match by {
                Finalizer::Lease { attempt, .. } => Some(*attempt),
                Finalizer::StatusQuery | Finalizer::Operator => None,
            })
            .collect();
        self.write(now, |db, now| {
            // Every fenced commit C of the batch in one statement, then the receipts and
            // the statuses of those it finalized in one statement each.
            let finalized: std::collections::HashMap<String, i64> = db
                .query(FINALIZE_MANY, &[&refs, &owners, &attempts, &now.get()])?
                .iter()
                .map(|row| Ok((get::<String>(row, 0)?, get::<i64>(row, 1)?)))
                .collect::<Result<_, StoreError>>()?;
            let mut local = LocalColumns::default();
            let mut reconciled = 0;
            for (status_ref, by, receipt) in items {
                let Some(id) = finalized.get(status_ref.as_str()) else { continue };
                reconciled += i64::from(matches!(by, Finalizer::StatusQuery));
                local.push(*id, by, receipt);
            }
            local.insert(db, now)?;
            db.exec(MARK_SUCCEEDED_MANY, &[&local.ids, &now.get()])?;
            if reconciled > 0 {
                bump_by(db, "reconciliations", reconciled)?;
            }
            items
                .iter()
                .map(|(status_ref, by, _)| {
                    if finalized.contains_key(status_ref.as_str()) {
                        Ok(Finalize::Finalized)
                    } else {
                        not_written(db, status_ref, matches!(by, Finalizer::Lease { .. }))
                    }
                })
                .collect()
        })
    }

    fn release(
        &mut self,
        status_ref: &StatusRef,
        owner: &Identifier,
        attempt: i64,
        release: &Release<'_>,
        now: Now,
    ) -> Result<Finalize, StoreError> {
        let caller_now = now;
        self.write(now, |db, now| {
            let (sql, state, at, reason) = match release {
                Release::Later { at, reason } => (
                    SET_ASIDE,
                    OutboxState::Processing,
                    shifted(*at, caller_now, now).get(),
                    toolledger_store::bounded_reason(reason),
                ),
                Release::Retry { at, reason } => (
                    RELEASE,
                    OutboxState::Pending,
                    shifted(*at, caller_now, now).get(),
                    toolledger_store::bounded_reason(reason),
                ),
                Release::Dead { reason } => (
                    RELEASE,
                    OutboxState::Dead,
                    now.get(),
                    toolledger_store::bounded_reason(reason),
                ),
            };
            let state = state.as_str();
            let id: Option<i64> = db.value(
                sql,
                &[
                    &status_ref.as_str(),
                    &owner.as_str(),
                    &attempt,
                    &now.get(),
                    &state,
                    &at,
                    &reason,
                ],
            )?;
            let Some(id) = id else {
                return not_written(db, status_ref, true);
            };
            db.exec(MARK_RELEASED, &[&id, &now.get(), &state])?;
            Ok(Finalize::Finalized)
        })
    }

    fn claim_due(
        &mut self,
        owner: &Identifier,
        downstream: &DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> Result<ClaimedBatch, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(now, |db, now| {
            let lease_until = lease_end(now, lease)?;
            // The due events, locked (a relay on another host skips them): then their
            // operations verified before any is claimed, one statement each, so a batch
            // costs the same few round trips whatever its size.
            let due = db
                .query(DUE, &[&now.get(), &limit, &downstream.name(), &downstream.revision()])?
                .iter()
                .map(|row| Ok((get::<i64>(row, 0)?, get::<String>(row, 1)?)))
                .collect::<Result<Vec<_>, StoreError>>()?;
            let ids: Vec<i64> = due.iter().map(|(id, _)| *id).collect();
            let mut verified = verified_due(db, &ids)?;
            let mut batch =
                ClaimedBatch { skipped: due.len() - verified.len(), ..Default::default() };
            let claimable: Vec<i64> =
                ids.iter().copied().filter(|id| verified.contains_key(id)).collect();
            let attempts: std::collections::HashMap<i64, i64> = db
                .query(CLAIM_MANY, &[&claimable, &owner.as_str(), &lease_until.get(), &now.get()])?
                .iter()
                .map(|row| Ok((get::<i64>(row, 0)?, get::<i64>(row, 1)?)))
                .collect::<Result<_, StoreError>>()?;
            let claimed: Vec<i64> =
                claimable.iter().copied().filter(|id| attempts.contains_key(id)).collect();
            db.exec(MARK_PROCESSING_MANY, &[&claimed, &now.get()])?;
            let mut reclaims = 0;
            for (id, state) in &due {
                let (Some(attempt), Some(mut operation)) = (attempts.get(id), verified.remove(id))
                else {
                    continue;
                };
                // The claimed operation as a read would now return it.
                let reclaim = state == OutboxState::Processing.as_str();
                reclaims += i64::from(reclaim);
                operation.status = OperationStatus::Processing;
                operation.outbox.state = OutboxState::Processing;
                operation.outbox.lease_owner = Some(owner.as_str().to_owned());
                operation.outbox.lease_until = Some(lease_until.get());
                operation.outbox.next_attempt_at = lease_until.get();
                operation.outbox.attempt_count = *attempt;
                batch.claimed.push((*attempt, reclaim, operation));
            }
            bump_by(db, "claims", i64::try_from(claimed.len()).unwrap_or(i64::MAX))?;
            bump_by(db, "lease_reclaims", reclaims)?;
            Ok(batch)
        })
    }

    fn retired(&mut self, status_ref: &StatusRef) -> Result<bool, StoreError> {
        self.read(|db| retired(db, status_ref))
    }

    fn heartbeat(
        &mut self,
        owner: &Identifier,
        now: Now,
        lease: LeaseSeconds,
    ) -> Result<usize, StoreError> {
        self.write(now, |db, now| {
            let lease_until = lease_end(now, lease)?;
            let extended =
                db.exec(HEARTBEAT, &[&owner.as_str(), &now.get(), &lease_until.get()])?;
            Ok(usize::try_from(extended).unwrap_or(usize::MAX))
        })
    }

    fn audit(&mut self) -> Result<AuditReport, StoreError> {
        self.with_conn(crate::audit::run)
    }
}

impl StandInReceipts for PgStore {
    fn record_downstream_receipt(
        &mut self,
        receipt: &DownstreamReceipt,
        now: Now,
    ) -> Result<DownstreamReceipt, StoreError> {
        let receipt_json = canonicalize(&receipt.receipt);
        self.write(now, |db, now| record_downstream_in(db, receipt, &receipt_json, now))
    }

    fn downstream_receipt(
        &mut self,
        downstream_request_ref: &str,
    ) -> Result<Option<DownstreamReceipt>, StoreError> {
        self.read(|db| downstream_receipt(db, downstream_request_ref))
    }

    fn record_downstream_receipts(
        &mut self,
        receipts: &[DownstreamReceipt],
        now: Now,
    ) -> Result<Vec<DownstreamReceipt>, StoreError> {
        if receipts.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<&str> =
            receipts.iter().map(|receipt| receipt.downstream_request_ref.as_str()).collect();
        let digests: Vec<&str> =
            receipts.iter().map(|receipt| receipt.request_sha256.as_str()).collect();
        let receipt_refs: Vec<&str> =
            receipts.iter().map(|receipt| receipt.receipt_ref.as_str()).collect();
        let texts: Vec<String> =
            receipts.iter().map(|receipt| canonicalize(&receipt.receipt)).collect();
        self.write(now, |db, now| {
            // The batch's commit B in one statement; a receipt already stored under its
            // ref is read back and answered instead, as one at a time would.
            let stored: std::collections::HashSet<String> = db
                .query(
                    INSERT_DOWNSTREAM_MANY,
                    &[&refs, &digests, &receipt_refs, &texts, &now.get()],
                )?
                .iter()
                .map(|row| get::<String>(row, 0))
                .collect::<Result<_, StoreError>>()?;
            receipts
                .iter()
                .map(|receipt| {
                    if stored.contains(&receipt.downstream_request_ref) {
                        Ok(receipt.clone())
                    } else {
                        downstream_receipt(db, &receipt.downstream_request_ref)?
                            .ok_or(error::fail(FailureKind::Refused, error::REFUSED))
                    }
                })
                .collect()
        })
    }
}
