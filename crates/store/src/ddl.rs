//! The current schema's DDL (version 6), written once for every backend.
//!
//! It is written in PostgreSQL's spelling, and SQLite's text is derived from it by five
//! rules: an identity key is `INTEGER PRIMARY KEY`, `BIGINT` is `INTEGER`, a ref's
//! prefix check `LIKE 'sr\_%'` is `GLOB 'sr_*'`, `x::json IS NOT NULL` is
//! `json_valid(x)`, and every table is `STRICT`. Two blocks are each dialect's own: the
//! operator log's append-only triggers (a PL/pgSQL function in PostgreSQL, `RAISE` in
//! SQLite), and the counters (sixteen shards a counter in PostgreSQL, so concurrent
//! writers do not queue on one row; one row in SQLite, whose writers are serialized).
//!
//! Both texts are frozen: a SQLite store compares its schema's text with this one's, so a
//! change is a new schema version, never an edit. `tests::the_texts_are_frozen` pins
//! each rendering's SHA-256.

use std::sync::OnceLock;

use crate::driver::Dialect;

/// The `meta` table, which every schema version has had in this form.
const META: &str = r#"
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"#;

/// The tables up to the operator log's triggers.
const BEFORE_TRIGGERS: &str = r#"
CREATE TABLE operations (
    id                     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id              TEXT NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 128),
    subject_id             TEXT NOT NULL CHECK (length(subject_id) BETWEEN 1 AND 128),
    tool_name              TEXT NOT NULL CHECK (length(tool_name) BETWEEN 1 AND 128),
    idempotency_key        TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 128),
    status_ref             TEXT NOT NULL UNIQUE CHECK (status_ref LIKE 'sr\_%' AND length(status_ref) = 35),
    downstream_request_ref TEXT NOT NULL UNIQUE CHECK (downstream_request_ref LIKE 'dr\_%' AND length(downstream_request_ref) = 35),
    request_sha256         TEXT NOT NULL CHECK (length(request_sha256) = 64),
    arguments_json         TEXT NOT NULL CHECK (arguments_json::json IS NOT NULL),
    input_revision         TEXT NOT NULL,
    output_revision        TEXT NOT NULL,
    effect_revision        TEXT NOT NULL,
    handler_revision       TEXT NOT NULL,
    producer_revision      TEXT NOT NULL,
    policy_revision        TEXT NOT NULL,
    provider               TEXT NOT NULL,
    api_family             TEXT NOT NULL,
    adapter_revision       TEXT NOT NULL,
    provider_response_id   TEXT NOT NULL,
    provider_call_id       TEXT NOT NULL,
    operation_id           TEXT NOT NULL,
    approval_id            TEXT,
    approver_id            TEXT,
    approval_sha256        TEXT CHECK (approval_sha256 IS NULL OR length(approval_sha256) = 64),
    approved_at            BIGINT CHECK (approved_at IS NULL OR approved_at BETWEEN 0 AND 253402300799),
    approval_expires_at    BIGINT CHECK (approval_expires_at IS NULL OR approval_expires_at BETWEEN 0 AND 253402300799),
    downstream_name        TEXT NOT NULL CHECK (length(downstream_name) BETWEEN 1 AND 128),
    downstream_revision    TEXT NOT NULL CHECK (length(downstream_revision) BETWEEN 1 AND 128),
    status                 TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'succeeded', 'failed', 'quarantined', 'dead')),
    created_at             BIGINT NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    updated_at             BIGINT NOT NULL CHECK (updated_at BETWEEN 0 AND 253402300799),
    CHECK ((approval_id IS NULL) = (approver_id IS NULL) AND (approval_id IS NULL) = (approval_sha256 IS NULL)
           AND (approval_id IS NULL) = (approved_at IS NULL) AND (approval_id IS NULL) = (approval_expires_at IS NULL)),
    CHECK (approved_at IS NULL OR approved_at < approval_expires_at),
    UNIQUE (tenant_id, subject_id, tool_name, idempotency_key)
);

CREATE TABLE outbox (
    op_id           BIGINT PRIMARY KEY REFERENCES operations (id),
    state           TEXT NOT NULL CHECK (state IN ('pending', 'processing', 'delivered', 'failed', 'quarantined', 'dead')),
    lease_owner     TEXT CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 128),
    lease_until     BIGINT CHECK (lease_until IS NULL OR lease_until BETWEEN 0 AND 253402300799),
    attempt_count   BIGINT NOT NULL CHECK (attempt_count >= 0),
    next_attempt_at BIGINT NOT NULL CHECK (next_attempt_at BETWEEN 0 AND 253402300799),
    last_reason     TEXT CHECK (last_reason IS NULL OR length(last_reason) BETWEEN 1 AND 512),
    attempts_before BIGINT NOT NULL CHECK (attempts_before BETWEEN 0 AND attempt_count),
    created_at      BIGINT NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    updated_at      BIGINT NOT NULL CHECK (updated_at BETWEEN 0 AND 253402300799),
    CHECK (state NOT IN ('pending', 'dead') OR (lease_owner IS NULL AND lease_until IS NULL)),
    CHECK (state <> 'processing' OR (lease_owner IS NOT NULL AND lease_until IS NOT NULL AND attempt_count > 0
           AND next_attempt_at = lease_until)),
    CHECK (state <> 'dead' OR last_reason IS NOT NULL)
);

CREATE INDEX outbox_due ON outbox (next_attempt_at, op_id) WHERE state IN ('pending', 'processing');

CREATE TABLE downstream_receipts (
    downstream_request_ref TEXT PRIMARY KEY CHECK (downstream_request_ref LIKE 'dr\_%' AND length(downstream_request_ref) = 35),
    request_sha256         TEXT NOT NULL CHECK (length(request_sha256) = 64),
    receipt_ref            TEXT NOT NULL UNIQUE CHECK (receipt_ref LIKE 'rc\_%' AND length(receipt_ref) = 35),
    receipt_json           TEXT NOT NULL CHECK (receipt_json::json IS NOT NULL),
    created_at             BIGINT NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799)
);

CREATE TABLE local_receipts (
    op_id                  BIGINT PRIMARY KEY REFERENCES operations (id),
    downstream_request_ref TEXT NOT NULL UNIQUE,
    receipt_ref            TEXT NOT NULL UNIQUE CHECK (receipt_ref LIKE 'rc\_%' AND length(receipt_ref) = 35),
    receipt_json           TEXT NOT NULL CHECK (receipt_json::json IS NOT NULL),
    output_json            TEXT NOT NULL CHECK (output_json::json IS NOT NULL),
    result_sha256          TEXT NOT NULL CHECK (length(result_sha256) = 64),
    finalized_by           TEXT NOT NULL CHECK (finalized_by IN ('worker', 'status_query', 'operator')),
    created_at             BIGINT NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799)
);

CREATE TABLE terminal_outcomes (
    op_id        BIGINT PRIMARY KEY REFERENCES operations (id),
    kind         TEXT NOT NULL CHECK (kind IN ('failed', 'quarantined')),
    reason       TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 512),
    receipt_json TEXT CHECK (receipt_json IS NULL OR receipt_json::json IS NOT NULL),
    finalized_by TEXT NOT NULL CHECK (finalized_by IN ('worker', 'status_query', 'operator')),
    created_at   BIGINT NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    CHECK ((kind = 'quarantined') = (receipt_json IS NOT NULL))
);

CREATE TABLE call_identities (
    id                   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider             TEXT NOT NULL,
    api_family           TEXT NOT NULL,
    adapter_revision     TEXT NOT NULL,
    provider_response_id TEXT NOT NULL,
    provider_call_id     TEXT NOT NULL,
    purpose              TEXT NOT NULL CHECK (purpose IN ('dispatch', 'query_status')),
    op_id                BIGINT NOT NULL REFERENCES operations (id),
    created_at           BIGINT NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    UNIQUE (provider, api_family, provider_response_id, provider_call_id)
);

CREATE INDEX call_identities_op ON call_identities (op_id);

CREATE INDEX operations_status ON operations (status, updated_at);

CREATE TABLE operator_log (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status_ref TEXT NOT NULL CHECK (status_ref LIKE 'sr\_%' AND length(status_ref) = 35),
    action     TEXT NOT NULL CHECK (action IN ('requeue', 'resolve')),
    from_state TEXT NOT NULL CHECK (from_state IN ('failed', 'dead', 'pending', 'processing')),
    reason     TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 512),
    was        TEXT NOT NULL CHECK (length(was) BETWEEN 1 AND 512),
    at         BIGINT NOT NULL CHECK (at BETWEEN 0 AND 253402300799)
);

CREATE INDEX operator_log_ref ON operator_log (status_ref);

"#;

/// PostgreSQL's append-only operator log: one function, three triggers.
const POSTGRES_TRIGGERS: &str = r#"CREATE FUNCTION operator_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    RAISE EXCEPTION 'the operator log is append-only' USING ERRCODE = 'integrity_constraint_violation';
END;
$body$;

CREATE TRIGGER operator_log_no_update BEFORE UPDATE ON operator_log
FOR EACH ROW EXECUTE FUNCTION operator_log_append_only();

CREATE TRIGGER operator_log_no_delete BEFORE DELETE ON operator_log
FOR EACH ROW EXECUTE FUNCTION operator_log_append_only();

CREATE TRIGGER operator_log_no_truncate BEFORE TRUNCATE ON operator_log
FOR EACH STATEMENT EXECUTE FUNCTION operator_log_append_only();

"#;

/// SQLite's append-only operator log (SQLite has no `TRUNCATE`).
const SQLITE_TRIGGERS: &str = r#"CREATE TRIGGER operator_log_no_update BEFORE UPDATE ON operator_log
BEGIN SELECT RAISE(ABORT, 'the operator log is append-only'); END;

CREATE TRIGGER operator_log_no_delete BEFORE DELETE ON operator_log
BEGIN SELECT RAISE(ABORT, 'the operator log is append-only'); END;

"#;

/// The tables between the triggers and the counters.
const BEFORE_COUNTERS: &str = r#"CREATE TABLE tombstones (
    status_ref     TEXT PRIMARY KEY CHECK (status_ref LIKE 'sr\_%' AND length(status_ref) = 35),
    request_sha256 TEXT NOT NULL CHECK (length(request_sha256) = 64),
    final_status   TEXT NOT NULL CHECK (final_status IN ('succeeded', 'failed', 'quarantined', 'dead')),
    retired_at     BIGINT NOT NULL CHECK (retired_at BETWEEN 0 AND 253402300799)
);

"#;

/// PostgreSQL's counters: sixteen shards a counter, read as their sum.
const POSTGRES_COUNTERS: &str = r#"CREATE TABLE counters (
    name  TEXT NOT NULL CHECK (name IN ('claims', 'lease_reclaims', 'fenced_writes', 'reconciliations', 'retired')),
    shard INTEGER NOT NULL CHECK (shard BETWEEN 0 AND 15),
    value BIGINT NOT NULL CHECK (value >= 0),
    PRIMARY KEY (name, shard)
);

"#;

/// SQLite's counters: one row a counter.
const SQLITE_COUNTERS: &str = r#"CREATE TABLE counters (
    name  TEXT PRIMARY KEY CHECK (name IN ('claims', 'lease_reclaims', 'fenced_writes', 'reconciliations', 'retired')),
    value INTEGER NOT NULL CHECK (value >= 0)
) STRICT;

"#;

/// The tables after the counters.
const AFTER_COUNTERS: &str = r#"CREATE TABLE migrations (
    version     BIGINT PRIMARY KEY,
    from_schema TEXT NOT NULL,
    to_schema   TEXT NOT NULL,
    started_at  BIGINT NOT NULL CHECK (started_at BETWEEN 0 AND 253402300799),
    finished_at BIGINT NOT NULL CHECK (finished_at BETWEEN 0 AND 253402300799)
);
"#;

/// Version 5's one table: a finished operation's replay record, every column dispatch's
/// join reads (`OPERATION_COLUMNS`, but a terminal outcome's, which a success has not),
/// written by commit C with the local receipt. A replay reads this one row and verifies
/// it as it verifies the join's row. Its columns carry no CHECKs: nothing is trusted
/// because it was let in, every read re-verifies it.
const REPLAYS: &str = r#"
CREATE TABLE replays (
    op_id                  BIGINT PRIMARY KEY REFERENCES operations (id),
    tenant_id              TEXT NOT NULL,
    subject_id             TEXT NOT NULL,
    tool_name              TEXT NOT NULL,
    idempotency_key        TEXT NOT NULL,
    status_ref             TEXT NOT NULL,
    downstream_request_ref TEXT NOT NULL,
    request_sha256         TEXT NOT NULL,
    arguments_json         TEXT NOT NULL,
    input_revision         TEXT NOT NULL,
    output_revision        TEXT NOT NULL,
    effect_revision        TEXT NOT NULL,
    handler_revision       TEXT NOT NULL,
    producer_revision      TEXT NOT NULL,
    policy_revision        TEXT NOT NULL,
    provider               TEXT NOT NULL,
    api_family             TEXT NOT NULL,
    adapter_revision       TEXT NOT NULL,
    provider_response_id   TEXT NOT NULL,
    provider_call_id       TEXT NOT NULL,
    operation_id           TEXT NOT NULL,
    approval_id            TEXT,
    approver_id            TEXT,
    approval_sha256        TEXT,
    approved_at            BIGINT,
    approval_expires_at    BIGINT,
    status                 TEXT NOT NULL,
    created_at             BIGINT NOT NULL,
    outbox_state           TEXT NOT NULL,
    lease_owner            TEXT,
    lease_until            BIGINT,
    attempt_count          BIGINT NOT NULL,
    receipt_ref            TEXT NOT NULL,
    receipt_json           TEXT NOT NULL,
    output_json            TEXT NOT NULL,
    result_sha256          TEXT NOT NULL,
    receipt_request_ref    TEXT NOT NULL,
    finalized_by           TEXT NOT NULL,
    downstream_name        TEXT NOT NULL,
    downstream_revision    TEXT NOT NULL,
    next_attempt_at        BIGINT NOT NULL,
    last_reason            TEXT,
    attempts_before        BIGINT NOT NULL,
    UNIQUE (tenant_id, subject_id, tool_name, idempotency_key)
);

"#;

/// PostgreSQL's invalidation of a replay record: any change to a row it was copied from
/// deletes it, so a replay of a changed row finds none, reads the join, and refuses.
/// The operation's function answers `OLD`: its `BEFORE DELETE` trigger (the record goes
/// before the row it references) would cancel the delete on `NULL`.
const POSTGRES_REPLAY_TRIGGERS: &str = r#"CREATE FUNCTION replays_forget_operation() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    DELETE FROM replays WHERE op_id = OLD.id;
    RETURN OLD;
END;
$body$;

CREATE FUNCTION replays_forget_old() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    DELETE FROM replays WHERE op_id = OLD.op_id;
    RETURN NULL;
END;
$body$;

CREATE FUNCTION replays_forget_new() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    DELETE FROM replays WHERE op_id = NEW.op_id;
    RETURN NULL;
END;
$body$;

CREATE TRIGGER replays_operation_changed AFTER UPDATE ON operations
FOR EACH ROW WHEN (OLD.status = 'succeeded') EXECUTE FUNCTION replays_forget_operation();

CREATE TRIGGER replays_operation_deleted BEFORE DELETE ON operations
FOR EACH ROW EXECUTE FUNCTION replays_forget_operation();

CREATE TRIGGER replays_event_changed AFTER UPDATE ON outbox
FOR EACH ROW WHEN (OLD.state = 'delivered') EXECUTE FUNCTION replays_forget_old();

CREATE TRIGGER replays_event_deleted AFTER DELETE ON outbox
FOR EACH ROW EXECUTE FUNCTION replays_forget_old();

CREATE TRIGGER replays_receipt_changed AFTER UPDATE OR DELETE ON local_receipts
FOR EACH ROW EXECUTE FUNCTION replays_forget_old();

CREATE TRIGGER replays_call_changed AFTER UPDATE OR DELETE ON call_identities
FOR EACH ROW EXECUTE FUNCTION replays_forget_old();

CREATE TRIGGER replays_outcome_added AFTER INSERT ON terminal_outcomes
FOR EACH ROW EXECUTE FUNCTION replays_forget_new();
"#;

/// SQLite's invalidation of a replay record, the same rules as PostgreSQL's.
const SQLITE_REPLAY_TRIGGERS: &str = r#"CREATE TRIGGER replays_operation_changed AFTER UPDATE ON operations
WHEN OLD.status = 'succeeded' BEGIN DELETE FROM replays WHERE op_id = OLD.id; END;

CREATE TRIGGER replays_operation_deleted BEFORE DELETE ON operations
BEGIN DELETE FROM replays WHERE op_id = OLD.id; END;

CREATE TRIGGER replays_event_changed AFTER UPDATE ON outbox
WHEN OLD.state = 'delivered' BEGIN DELETE FROM replays WHERE op_id = OLD.op_id; END;

CREATE TRIGGER replays_event_deleted AFTER DELETE ON outbox
BEGIN DELETE FROM replays WHERE op_id = OLD.op_id; END;

CREATE TRIGGER replays_receipt_changed AFTER UPDATE ON local_receipts
BEGIN DELETE FROM replays WHERE op_id = OLD.op_id; END;

CREATE TRIGGER replays_receipt_deleted AFTER DELETE ON local_receipts
BEGIN DELETE FROM replays WHERE op_id = OLD.op_id; END;

CREATE TRIGGER replays_call_changed AFTER UPDATE ON call_identities
BEGIN DELETE FROM replays WHERE op_id = OLD.op_id; END;

CREATE TRIGGER replays_call_deleted AFTER DELETE ON call_identities
BEGIN DELETE FROM replays WHERE op_id = OLD.op_id; END;

CREATE TRIGGER replays_outcome_added AFTER INSERT ON terminal_outcomes
BEGIN DELETE FROM replays WHERE op_id = NEW.op_id; END;
"#;

/// Version 6's one table: the W3C trace context of the call that asked for an operation,
/// written by commit A beside the intent when the caller had one, read when a later
/// attempt or status query links back to it (`docs/observability.md`). No digest covers
/// it; retention removes it with its operation.
const TRACE_CONTEXTS: &str = r#"
CREATE TABLE trace_contexts (
    op_id       BIGINT PRIMARY KEY REFERENCES operations (id),
    traceparent TEXT NOT NULL CHECK (length(traceparent) = 55),
    tracestate  TEXT NOT NULL CHECK (length(tracestate) <= 512)
);
"#;

/// The `meta` table's DDL in `dialect`'s spelling.
pub fn meta(dialect: Dialect) -> &'static str {
    static SQLITE: OnceLock<String> = OnceLock::new();
    match dialect {
        Dialect::Postgres => META,
        Dialect::Sqlite => SQLITE.get_or_init(|| sqlite(META)),
    }
}

/// Every table, index and trigger but `meta`, in `dialect`'s spelling: version 4's, the
/// replay records of version 5 and the trace contexts of version 6, each after the one
/// before (so a migrated store gets the same schema text as a new one).
pub fn tables(dialect: Dialect) -> &'static str {
    static POSTGRES: OnceLock<String> = OnceLock::new();
    static SQLITE: OnceLock<String> = OnceLock::new();
    let cell = match dialect {
        Dialect::Postgres => &POSTGRES,
        Dialect::Sqlite => &SQLITE,
    };
    cell.get_or_init(|| [tables_v5(dialect), added_in_v6(dialect)].concat())
}

/// Version 5's tables, indexes and triggers but `meta`, frozen: what a migration from
/// version 5 starts from.
pub fn tables_v5(dialect: Dialect) -> &'static str {
    static POSTGRES: OnceLock<String> = OnceLock::new();
    static SQLITE: OnceLock<String> = OnceLock::new();
    let cell = match dialect {
        Dialect::Postgres => &POSTGRES,
        Dialect::Sqlite => &SQLITE,
    };
    cell.get_or_init(|| [tables_v4(dialect), added_in_v5(dialect)].concat())
}

/// What version 6 adds to version 5, in `dialect`'s spelling: a migration's step.
pub fn added_in_v6(dialect: Dialect) -> &'static str {
    static SQLITE: OnceLock<String> = OnceLock::new();
    match dialect {
        Dialect::Postgres => TRACE_CONTEXTS,
        Dialect::Sqlite => SQLITE.get_or_init(|| sqlite(TRACE_CONTEXTS)),
    }
}

/// What version 5 adds to version 4, in `dialect`'s spelling: a migration's step.
pub fn added_in_v5(dialect: Dialect) -> &'static str {
    static SQLITE: OnceLock<String> = OnceLock::new();
    static POSTGRES: OnceLock<String> = OnceLock::new();
    match dialect {
        Dialect::Postgres => POSTGRES.get_or_init(|| [REPLAYS, POSTGRES_REPLAY_TRIGGERS].concat()),
        Dialect::Sqlite => {
            SQLITE.get_or_init(|| [sqlite(REPLAYS).as_str(), SQLITE_REPLAY_TRIGGERS].concat())
        }
    }
}

/// Version 4's tables, indexes and triggers but `meta`, frozen: what a migration from
/// version 4 starts from.
pub fn tables_v4(dialect: Dialect) -> &'static str {
    static POSTGRES: OnceLock<String> = OnceLock::new();
    static SQLITE: OnceLock<String> = OnceLock::new();
    match dialect {
        Dialect::Postgres => POSTGRES.get_or_init(|| {
            [BEFORE_TRIGGERS, POSTGRES_TRIGGERS, BEFORE_COUNTERS, POSTGRES_COUNTERS, AFTER_COUNTERS]
                .concat()
        }),
        Dialect::Sqlite => SQLITE.get_or_init(|| {
            [
                sqlite(BEFORE_TRIGGERS).as_str(),
                SQLITE_TRIGGERS,
                sqlite(BEFORE_COUNTERS).as_str(),
                SQLITE_COUNTERS,
                sqlite(AFTER_COUNTERS).as_str(),
            ]
            .concat()
        }),
    }
}

/// The whole schema, `meta` first, in `dialect`'s spelling.
pub fn all(dialect: Dialect) -> &'static str {
    static POSTGRES: OnceLock<String> = OnceLock::new();
    static SQLITE: OnceLock<String> = OnceLock::new();
    let cell = match dialect {
        Dialect::Postgres => &POSTGRES,
        Dialect::Sqlite => &SQLITE,
    };
    cell.get_or_init(|| [meta(dialect), tables(dialect)].concat())
}

/// SQLite's spelling of DDL written in PostgreSQL's (the rules in the module's docs).
fn sqlite(postgres: &str) -> String {
    let mut text = postgres
        .replace("BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "INTEGER PRIMARY KEY")
        .replace("BIGINT", "INTEGER")
        .replace("\n);", "\n) STRICT;");
    for prefix in ["sr", "dr", "rc"] {
        text = text.replace(&format!("LIKE '{prefix}\\_%'"), &format!("GLOB '{prefix}_*'"));
    }
    json_valid(&text)
}

/// `x::json IS NOT NULL` as `json_valid(x)`, for every column name `x`.
fn json_valid(text: &str) -> String {
    const CAST: &str = "::json IS NOT NULL";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(CAST) {
        let (head, tail) = rest.split_at(at);
        let start = head
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |before| before + 1);
        let (kept, column) = head.split_at(start);
        out.push_str(kept);
        out.push_str("json_valid(");
        out.push_str(column);
        out.push(')');
        rest = tail.strip_prefix(CAST).unwrap_or(tail);
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use toolledger_contract::digest::sha256_canonical;

    use super::{
        Dialect, REPLAYS, added_in_v5, added_in_v6, all, json_valid, meta, tables_v4, tables_v5,
    };

    /// The SHA-256 of `text` as a canonical JSON string.
    fn sha256(text: &str) -> String {
        sha256_canonical(&Value::from(text)).as_str().to_owned()
    }

    /// The frozen `replays` table has exactly the columns, in the same order, that
    /// commit C copies, a replay reads and the audit compares: one list
    /// (`ledger::replay_record!`) writes those three statements.
    #[test]
    fn the_replay_records_columns_are_the_statements_columns() {
        let body = REPLAYS.split_once("CREATE TABLE replays (").unwrap().1;
        let columns: Vec<&str> = body
            .lines()
            .map(str::trim)
            .take_while(|line| !line.starts_with("UNIQUE"))
            .filter_map(|line| line.split_whitespace().next())
            .collect();
        let mut expected = vec!["op_id"];
        expected.extend_from_slice(crate::ledger::REPLAY_RECORD_COLUMNS);
        assert_eq!(columns, expected);
    }

    /// Version 4's and version 5's DDL as both backends created them while each was
    /// current, and version 6's as they create it now: a SQLite store compares its own
    /// schema's text with these, so not a byte may move.
    #[test]
    fn the_texts_are_frozen() {
        let v4 = |dialect| [meta(dialect), tables_v4(dialect)].concat();
        assert_eq!(
            sha256(&v4(Dialect::Postgres)),
            "7a356f5d258b86fd0d1109726c382852f972dc2b144b5d11080e1818a6b20c34"
        );
        assert_eq!(
            sha256(&v4(Dialect::Sqlite)),
            "47522162315b2f0d58b0cc0f425d5a6e7b664612a52e1ded96bc308f2cff7ea1"
        );
        let v5 = |dialect| [meta(dialect), tables_v5(dialect)].concat();
        assert_eq!(
            sha256(&v5(Dialect::Postgres)),
            "9d24021c1d67f17c8dc494de18921f481571523ecd9bd8aab31a42a7118e8a3e"
        );
        assert_eq!(
            sha256(&v5(Dialect::Sqlite)),
            "135808fcda5b419f3b50206ee987fdfdb5ccd218e5a5f30dce407c8ec0377c16"
        );
        assert_eq!(
            sha256(all(Dialect::Postgres)),
            "2c60ecd1542507b74a897ee132b29db90a74e605f16b7f915fbd79284103b9c9"
        );
        assert_eq!(
            sha256(all(Dialect::Sqlite)),
            "c057ffefb74f5ddfd3b478dc948c21257ed9ab00f06518d6d617d47431150db2"
        );
        for dialect in [Dialect::Postgres, Dialect::Sqlite] {
            assert_eq!(v5(dialect), [v4(dialect).as_str(), added_in_v5(dialect)].concat());
            assert_eq!(all(dialect), [v5(dialect).as_str(), added_in_v6(dialect)].concat());
        }
    }

    #[test]
    fn a_json_check_names_its_own_column() {
        assert_eq!(
            json_valid("CHECK (a IS NULL OR b_json::json IS NOT NULL), c::json IS NOT NULL"),
            "CHECK (a IS NULL OR json_valid(b_json)), json_valid(c)"
        );
    }
}
