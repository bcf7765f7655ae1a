
CREATE TABLE operations (
    id                     INTEGER PRIMARY KEY,
    tenant_id              TEXT NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 128),
    subject_id             TEXT NOT NULL CHECK (length(subject_id) BETWEEN 1 AND 128),
    tool_name              TEXT NOT NULL CHECK (length(tool_name) BETWEEN 1 AND 128),
    idempotency_key        TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 128),
    status_ref             TEXT NOT NULL UNIQUE CHECK (status_ref GLOB 'sr_*' AND length(status_ref) = 35),
    downstream_request_ref TEXT NOT NULL UNIQUE CHECK (downstream_request_ref GLOB 'dr_*' AND length(downstream_request_ref) = 35),
    request_sha256         TEXT NOT NULL CHECK (length(request_sha256) = 64),
    arguments_json         TEXT NOT NULL CHECK (json_valid(arguments_json)),
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
    approved_at            INTEGER CHECK (approved_at IS NULL OR approved_at BETWEEN 0 AND 253402300799),
    approval_expires_at    INTEGER CHECK (approval_expires_at IS NULL OR approval_expires_at BETWEEN 0 AND 253402300799),
    downstream_name        TEXT NOT NULL CHECK (length(downstream_name) BETWEEN 1 AND 128),
    downstream_revision    TEXT NOT NULL CHECK (length(downstream_revision) BETWEEN 1 AND 128),
    status                 TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'succeeded', 'failed', 'quarantined', 'dead')),
    created_at             INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    updated_at             INTEGER NOT NULL CHECK (updated_at BETWEEN 0 AND 253402300799),
    CHECK ((approval_id IS NULL) = (approver_id IS NULL) AND (approval_id IS NULL) = (approval_sha256 IS NULL)
           AND (approval_id IS NULL) = (approved_at IS NULL) AND (approval_id IS NULL) = (approval_expires_at IS NULL)),
    CHECK (approved_at IS NULL OR approved_at < approval_expires_at),
    UNIQUE (tenant_id, subject_id, tool_name, idempotency_key)
) STRICT;

CREATE TABLE outbox (
    op_id           INTEGER PRIMARY KEY REFERENCES operations (id),
    state           TEXT NOT NULL CHECK (state IN ('pending', 'processing', 'delivered', 'failed', 'quarantined', 'dead')),
    lease_owner     TEXT CHECK (lease_owner IS NULL OR length(lease_owner) BETWEEN 1 AND 128),
    lease_until     INTEGER CHECK (lease_until IS NULL OR lease_until BETWEEN 0 AND 253402300799),
    attempt_count   INTEGER NOT NULL CHECK (attempt_count >= 0),
    next_attempt_at INTEGER NOT NULL CHECK (next_attempt_at BETWEEN 0 AND 253402300799),
    last_reason     TEXT CHECK (last_reason IS NULL OR length(last_reason) BETWEEN 1 AND 512),
    attempts_before INTEGER NOT NULL CHECK (attempts_before BETWEEN 0 AND attempt_count),
    created_at      INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    updated_at      INTEGER NOT NULL CHECK (updated_at BETWEEN 0 AND 253402300799),
    CHECK (state NOT IN ('pending', 'dead') OR (lease_owner IS NULL AND lease_until IS NULL)),
    CHECK (state <> 'processing' OR (lease_owner IS NOT NULL AND lease_until IS NOT NULL AND attempt_count > 0
           AND next_attempt_at = lease_until)),
    CHECK (state <> 'dead' OR last_reason IS NOT NULL)
) STRICT;

CREATE INDEX outbox_due ON outbox (next_attempt_at, op_id) WHERE state IN ('pending', 'processing');

CREATE TABLE downstream_receipts (
    downstream_request_ref TEXT PRIMARY KEY CHECK (downstream_request_ref GLOB 'dr_*' AND length(downstream_request_ref) = 35),
    request_sha256         TEXT NOT NULL CHECK (length(request_sha256) = 64),
    receipt_ref            TEXT NOT NULL UNIQUE CHECK (receipt_ref GLOB 'rc_*' AND length(receipt_ref) = 35),
    receipt_json           TEXT NOT NULL CHECK (json_valid(receipt_json)),
    created_at             INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799)
) STRICT;

CREATE TABLE local_receipts (
    op_id                  INTEGER PRIMARY KEY REFERENCES operations (id),
    downstream_request_ref TEXT NOT NULL UNIQUE,
    receipt_ref            TEXT NOT NULL UNIQUE CHECK (receipt_ref GLOB 'rc_*' AND length(receipt_ref) = 35),
    receipt_json           TEXT NOT NULL CHECK (json_valid(receipt_json)),
    output_json            TEXT NOT NULL CHECK (json_valid(output_json)),
    result_sha256          TEXT NOT NULL CHECK (length(result_sha256) = 64),
    finalized_by           TEXT NOT NULL CHECK (finalized_by IN ('worker', 'status_query')),
    created_at             INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799)
) STRICT;

CREATE TABLE terminal_outcomes (
    op_id        INTEGER PRIMARY KEY REFERENCES operations (id),
    kind         TEXT NOT NULL CHECK (kind IN ('failed', 'quarantined')),
    reason       TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 512),
    receipt_json TEXT CHECK (receipt_json IS NULL OR json_valid(receipt_json)),
    finalized_by TEXT NOT NULL CHECK (finalized_by IN ('worker', 'status_query')),
    created_at   INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    CHECK ((kind = 'quarantined') = (receipt_json IS NOT NULL))
) STRICT;

CREATE TABLE call_identities (
    id                   INTEGER PRIMARY KEY,
    provider             TEXT NOT NULL,
    api_family           TEXT NOT NULL,
    adapter_revision     TEXT NOT NULL,
    provider_response_id TEXT NOT NULL,
    provider_call_id     TEXT NOT NULL,
    purpose              TEXT NOT NULL CHECK (purpose IN ('dispatch', 'query_status')),
    op_id                INTEGER NOT NULL REFERENCES operations (id),
    created_at           INTEGER NOT NULL CHECK (created_at BETWEEN 0 AND 253402300799),
    UNIQUE (provider, api_family, provider_response_id, provider_call_id)
) STRICT;

CREATE INDEX call_identities_op ON call_identities (op_id);

CREATE INDEX operations_status ON operations (status, updated_at);

CREATE TABLE operator_log (
    id         INTEGER PRIMARY KEY,
    status_ref TEXT NOT NULL CHECK (status_ref GLOB 'sr_*' AND length(status_ref) = 35),
    action     TEXT NOT NULL CHECK (action IN ('requeue')),
    from_state TEXT NOT NULL CHECK (from_state IN ('failed', 'dead')),
    reason     TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 512),
    was        TEXT NOT NULL CHECK (length(was) BETWEEN 1 AND 512),
    at         INTEGER NOT NULL CHECK (at BETWEEN 0 AND 253402300799)
) STRICT;

CREATE INDEX operator_log_ref ON operator_log (status_ref);

CREATE TRIGGER operator_log_no_update BEFORE UPDATE ON operator_log
BEGIN SELECT RAISE(ABORT, 'the operator log is append-only'); END;

CREATE TRIGGER operator_log_no_delete BEFORE DELETE ON operator_log
BEGIN SELECT RAISE(ABORT, 'the operator log is append-only'); END;

CREATE TABLE tombstones (
    status_ref     TEXT PRIMARY KEY CHECK (status_ref GLOB 'sr_*' AND length(status_ref) = 35),
    request_sha256 TEXT NOT NULL CHECK (length(request_sha256) = 64),
    final_status   TEXT NOT NULL CHECK (final_status IN ('succeeded', 'failed', 'quarantined', 'dead')),
    retired_at     INTEGER NOT NULL CHECK (retired_at BETWEEN 0 AND 253402300799)
) STRICT;

CREATE TABLE counters (
    name  TEXT PRIMARY KEY CHECK (name IN ('claims', 'lease_reclaims', 'fenced_writes', 'reconciliations', 'retired')),
    value INTEGER NOT NULL CHECK (value >= 0)
) STRICT;

CREATE TABLE migrations (
    version     INTEGER PRIMARY KEY,
    from_schema TEXT NOT NULL,
    to_schema   TEXT NOT NULL,
    started_at  INTEGER NOT NULL CHECK (started_at BETWEEN 0 AND 253402300799),
    finished_at INTEGER NOT NULL CHECK (finished_at BETWEEN 0 AND 253402300799)
) STRICT;
