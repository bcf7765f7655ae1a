//! The PostgreSQL backend: the ledger of `toolledger_store::ledger` over one
//! connection, one thread.
//!
//! Every write is one `READ COMMITTED` transaction whose correctness rests on row locks
//! and unique constraints, not on serialized writers: an `INSERT … ON CONFLICT DO
//! NOTHING` that waits for a racer's commit and then inserts nothing, a conditional
//! `UPDATE` that PostgreSQL re-checks on the newest row version after waiting for its
//! lock, `SELECT … FOR UPDATE` before a decision that a read made, `FOR UPDATE SKIP
//! LOCKED` for the relay's batch. What is PostgreSQL's own here is driver glue: a
//! serialization failure or a deadlock runs the whole transaction again (at most
//! [`ATTEMPTS`] times, then `Busy`), a lost connection is made again, the database's
//! clock, and the batch statements over arrays (`unnest`, `ANY`) that replace the
//! ledger's one-row-at-a-time defaults. A transaction dropped without commit rolls back:
//! `?` inside one is always safe.

use std::{error::Error, sync::Arc, time::Duration};

use bytes::BytesMut;
use tokio_postgres::{
    Config, IsolationLevel, Row,
    types::{IsNull, ToSql, Type},
};
use toolledger_contract::{DownstreamIdentity, Identifier, LeaseSeconds, StatusRef};
use toolledger_json::canonicalize;
use toolledger_store::{
    FailureKind, OPERATION_COLUMNS, OPERATION_FROM, OPERATION_WIDTH,
    driver::{Arg, Backend, Commit, Db as LedgerDb, Dialect, Row as LedgerRow, Sql},
    ledger::{self, DUE, lease_end},
};

use crate::{
    AuditReport, CallIdentity, ClaimedBatch, DownstreamReceipt, Finalize, Finalizer, Lease,
    LocalReceipt, NewOperation, Now, Operation, OutboxState, StoreError, Waits,
    error::{self, is_conflict, is_lost},
    pool::Shared,
    schema,
    session::{self, Conn, Db, GenericClient, Transaction, get},
    verify::{self, RawOperation},
};

/// How many times one write transaction is run when PostgreSQL answers a serialization
/// failure or a deadlock (or two transactions met on one call identity) before the
/// caller is answered `Busy`.
pub const ATTEMPTS: u32 = 5;

/// Whose clock a ledger's writes judge and stamp by (leases, due times, `created_at`):
/// the database server's, or the instants each call is handed. A SQLite ledger always
/// uses the instants it is handed (one host, one clock).
///
/// ```
/// assert_eq!(toolledger_store_postgres::StoreClock::default(), toolledger_store_postgres::StoreClock::Database);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreClock {
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
    clock: StoreClock,
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

// The batch statements PostgreSQL runs in place of the ledger's one-row defaults.
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
                toolledger_contract::digest::downstream_request_ref(scope, &intent.request_sha256)
                    .into(),
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
    /// is written. Writes judge by the database's clock ([`StoreClock::Database`]).
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

    /// Opens an existing store for [`LedgerStore::audit`](toolledger_store::LedgerStore::audit): as
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
        Ok(PgStore { config, waits, clock: StoreClock::default(), conn: Some(conn), home: None })
    }

    /// A store on a connection the pool made (the schema already checked).
    pub(crate) fn pooled(
        config: Config,
        waits: Waits,
        clock: StoreClock,
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
    pub fn with_clock(mut self, clock: StoreClock) -> PgStore {
        self.clock = clock;
        self
    }

    /// Which clock the store's writes judge by.
    pub fn clock(&self) -> StoreClock {
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
        let loaded = Loaded::of(finished);
        self.write(|pg| {
            let now = pg.now(now)?;
            let until = lease_end(pg, now, lease)?;
            let db = &mut pg.db;
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
            let by = Finalizer::Lease(Lease { owner: loader, attempt: 1 });
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
            db.exec(ledger::INSERT_REPLAYS, &[&op_ids])?;
            ledger::bump_by(pg, "claims", count)?;
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
        self.with_conn(|conn| {
            conn.db()
                .value("SELECT pg_backend_pid()", &[])?
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

    /// Runs `work` as one write transaction and commits it.
    fn write<T>(
        &mut self,
        mut work: impl FnMut(&mut Pg<'_, Transaction<'_>>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.transact(|pg| work(pg).map(|value| (value, true)))
    }

    /// Runs `work` as one write transaction, committed when it answers `(_, true)` and
    /// rolled back when it answers `(_, false)`. A serialization failure or a deadlock
    /// runs it again, up to [`ATTEMPTS`] times, then answers `Busy`; a connection found
    /// lost before the transaction began is made again once.
    fn transact<T>(
        &mut self,
        mut work: impl FnMut(&mut Pg<'_, Transaction<'_>>) -> Result<(T, bool), StoreError>,
    ) -> Result<T, StoreError> {
        let mut attempts = 0;
        let mut reconnect = true;
        loop {
            match self.attempt(&mut work) {
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
        work: &mut impl FnMut(&mut Pg<'_, Transaction<'_>>) -> Result<(T, bool), StoreError>,
    ) -> Result<T, (StoreError, bool)> {
        let clock = self.clock;
        let Conn { client, cache } = self.ready().map_err(|err| (err, false))?;
        let mut tx =
            client.begin(IsolationLevel::ReadCommitted, false).map_err(|err| (err, false))?;
        let (value, keep) =
            work(&mut Pg { db: Db::new(&mut tx, cache), clock }).map_err(|err| (err, true))?;
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

/// PostgreSQL's side of the seam: a connection or a transaction, and the clock the
/// store's writes judge by.
pub(crate) struct Pg<'a, C: GenericClient> {
    db: Db<'a, C>,
    clock: StoreClock,
}

impl<C: GenericClient> LedgerDb for Pg<'_, C> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn backend(&self) -> &'static str {
        error::BACKEND
    }

    fn now(&mut self, caller: Now) -> Result<Now, StoreError> {
        match self.clock {
            StoreClock::Database => session::database_now(&mut self.db),
            StoreClock::Caller => Ok(caller),
        }
    }

    fn execute(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let binds: Vec<Bind<'_>> = args.iter().map(Bind).collect();
        let params: Vec<&(dyn ToSql + Sync)> =
            binds.iter().map(|bind| bind as &(dyn ToSql + Sync)).collect();
        self.db.exec(sql.text(Dialect::Postgres), &params)
    }

    fn insert(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<Option<i64>, StoreError> {
        // The statement's `RETURNING id` answers the row, when one was inserted.
        let db: &mut dyn LedgerDb = self;
        db.int(sql, args)
    }

    fn query(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        each: &mut dyn FnMut(&LedgerRow<'_>) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let binds: Vec<Bind<'_>> = args.iter().map(Bind).collect();
        let params: Vec<&(dyn ToSql + Sync)> =
            binds.iter().map(|bind| bind as &(dyn ToSql + Sync)).collect();
        for row in self.db.query(sql.text(Dialect::Postgres), &params)? {
            if !each(&Columns(&row))? {
                break;
            }
        }
        Ok(())
    }
}

/// A parameter, bound as the type the server inferred for it.
#[derive(Debug)]
struct Bind<'a>(&'a Arg<'a>);

impl ToSql for Bind<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match *self.0 {
            Arg::Text(text) => text.to_sql(ty, out),
            Arg::Int(int) => int.to_sql(ty, out),
            Arg::Bool(value) => value.to_sql(ty, out),
            Arg::Null => Ok(IsNull::Yes),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn to_sql_checked(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match *self.0 {
            Arg::Text(text) => text.to_sql_checked(ty, out),
            Arg::Int(int) => int.to_sql_checked(ty, out),
            Arg::Bool(value) => value.to_sql_checked(ty, out),
            Arg::Null => Ok(IsNull::Yes),
        }
    }
}

/// A row of the columns of an operation joined with its outbox event, local receipt
/// and terminal outcome, in [`OPERATION_COLUMNS`] order, decoded for
/// [`verify::operation`] (which checks it): for a tool that reads those columns with its
/// own statement.
///
/// # Errors
///
/// [`StoreError`] when a column is missing or of another type.
pub fn raw_operation(row: &Row) -> Result<RawOperation, StoreError> {
    RawOperation::decode(&Columns(row))
}

/// A driver row, read by position.
struct Columns<'r>(&'r Row);

impl verify::Columns for Columns<'_> {
    type Error = StoreError;

    fn text(&self, index: usize) -> Result<String, StoreError> {
        get(self.0, index)
    }

    fn optional_text(&self, index: usize) -> Result<Option<String>, StoreError> {
        get(self.0, index)
    }

    fn optional_int(&self, index: usize) -> Result<Option<i64>, StoreError> {
        get(self.0, index)
    }

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        get(self.0, index)
    }
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
        self.request_refs.push(downstream.downstream_request_ref.as_str().to_owned());
        self.receipt_refs.push(downstream.receipt_ref.as_str().to_owned());
        self.receipts.push(downstream.receipt_json.clone());
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

impl Backend for PgStore {
    fn read<T>(
        &mut self,
        mut read: impl FnMut(&mut dyn LedgerDb) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let clock = self.clock;
        self.with_conn(|conn| read(&mut Pg { db: conn.db(), clock }))
    }

    fn commit<C: Commit>(&mut self, command: C) -> Result<(C::Output, C), StoreError> {
        let output = self.transact(|pg| command.run(pg))?;
        Ok((output, command))
    }

    fn audit_snapshot(&mut self) -> Result<AuditReport, StoreError> {
        self.with_conn(crate::audit::run)
    }

    fn batch_finalize(
        &mut self,
        items: &[(StatusRef, Finalizer, LocalReceipt)],
        now: Now,
    ) -> Result<Vec<Finalize>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<&str> = items.iter().map(|(status_ref, _, _)| status_ref.as_str()).collect();
        let (owners, attempts): (Vec<Option<&str>>, Vec<Option<i64>>) = items
            .iter()
            .map(|(_, by, _)| match by {
                Finalizer::Lease(lease) => (Some(lease.owner.as_str()), Some(lease.attempt)),
                Finalizer::StatusQuery | Finalizer::Operator => (None, None),
            })
            .unzip();
        self.write(|pg| {
            let now = pg.now(now)?;
            // Every fenced commit C of the batch in one statement, then the receipts and
            // the statuses of those it finalized in one statement each.
            let finalized: std::collections::HashMap<String, i64> = pg
                .db
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
            local.insert(&mut pg.db, now)?;
            pg.db.exec(MARK_SUCCEEDED_MANY, &[&local.ids, &now.get()])?;
            pg.db.exec(ledger::INSERT_REPLAYS, &[&local.ids])?;
            ledger::bump_by(pg, "reconciliations", reconciled)?;
            items
                .iter()
                .map(|(status_ref, by, _)| {
                    if finalized.contains_key(status_ref.as_str()) {
                        Ok(Finalize::Finalized)
                    } else {
                        ledger::not_written(pg, status_ref, matches!(by, Finalizer::Lease(_)))
                    }
                })
                .collect()
        })
    }

    fn batch_claim_due(
        &mut self,
        owner: &Identifier,
        downstream: &DownstreamIdentity,
        now: Now,
        lease: LeaseSeconds,
        limit: usize,
    ) -> Result<ClaimedBatch, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(|pg| {
            let now = pg.now(now)?;
            let lease_until = lease_end(pg, now, lease)?;
            // The due events, locked (a relay on another host skips them): then their
            // operations verified before any is claimed, one statement each, so a batch
            // costs the same few round trips whatever its size.
            let due_args: [&(dyn ToSql + Sync); 4] =
                [&now.get(), &limit, &downstream.name(), &downstream.revision()];
            let due = pg
                .db
                .query(DUE.text(Dialect::Postgres), &due_args)?
                .iter()
                .map(|row| Ok((get::<i64>(row, 0)?, get::<String>(row, 1)?)))
                .collect::<Result<Vec<_>, StoreError>>()?;
            let ids: Vec<i64> = due.iter().map(|(id, _)| *id).collect();
            let mut verified = verified_due(&mut pg.db, &ids)?;
            let mut batch =
                ClaimedBatch { skipped: due.len() - verified.len(), ..Default::default() };
            let claimable: Vec<i64> =
                ids.iter().copied().filter(|id| verified.contains_key(id)).collect();
            let claim_args: [&(dyn ToSql + Sync); 4] =
                [&claimable, &owner.as_str(), &lease_until.get(), &now.get()];
            let attempts: std::collections::HashMap<i64, i64> = pg
                .db
                .query(CLAIM_MANY, &claim_args)?
                .iter()
                .map(|row| Ok((get::<i64>(row, 0)?, get::<i64>(row, 1)?)))
                .collect::<Result<_, StoreError>>()?;
            let claimed: Vec<i64> =
                claimable.iter().copied().filter(|id| attempts.contains_key(id)).collect();
            pg.db.exec(MARK_PROCESSING_MANY, &[&claimed, &now.get()])?;
            let mut reclaims = 0;
            for (id, state) in &due {
                let (Some(attempt), Some(operation)) = (attempts.get(id), verified.remove(id))
                else {
                    continue;
                };
                let reclaim = state == OutboxState::Processing.as_str();
                reclaims += i64::from(reclaim);
                batch.claimed.push(ledger::claimed(
                    operation,
                    owner,
                    lease_until,
                    *attempt,
                    reclaim,
                ));
            }
            ledger::bump_by(pg, "claims", i64::try_from(claimed.len()).unwrap_or(i64::MAX))?;
            ledger::bump_by(pg, "lease_reclaims", reclaims)?;
            Ok(batch)
        })
    }

    fn batch_record_receipts(
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
            receipts.iter().map(|receipt| receipt.receipt_json.clone()).collect();
        self.write(|pg| {
            let now = pg.now(now)?;
            // The batch's commit B in one statement; a receipt already stored under its
            // ref is read back and answered instead, as one at a time would.
            let stored: std::collections::HashSet<String> = pg
                .db
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
                    if stored.contains(receipt.downstream_request_ref.as_str()) {
                        Ok(receipt.clone())
                    } else {
                        ledger::downstream_receipt(pg, &receipt.downstream_request_ref)?
                            .ok_or(error::fail(FailureKind::Refused, error::REFUSED))
                    }
                })
                .collect()
        })
    }
}
