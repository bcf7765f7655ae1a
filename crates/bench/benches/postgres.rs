//! The PostgreSQL report (`cargo xtask bench --store postgres`): the ledger on a private
//! PostgreSQL server started for the run, each figure against a raw baseline on the same
//! server in the same run.
//!
//! - fresh dispatch, 1 client, against the raw 4-commit pipeline (the same rows and
//!   transactions with plain SQL and no validation, JSON or hashing), alternating;
//! - the same with 8 clients, the raw pipeline claiming with `SKIP LOCKED`;
//! - replay against one raw unique-key `SELECT` round trip;
//! - four relay processes draining a backlog in batches, against the per-operation
//!   pipeline (fresh dispatch, 1 client);
//! - the audit of a large ledger (built through the store's own statements): rows read
//!   from its snapshot, all tables, per second.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark fails loudly")]

use std::{
    process::Command,
    sync::{Arc, Mutex},
    thread,
    time::Instant,
};

use postgres::{Client, NoTls};
use serde_json::{Value, json};
use toolledger_bench::{
    Args, Contention, Rate, Work,
    ledger::{CASE, Cases, Row, finished, row, worker},
    sibling_binary, threads, timed, write_report,
};
use toolledger_contract::{NoRoles, Registry, UnixSeconds};
use toolledger_engine::{Engine, StandIn};
use toolledger_store::{LedgerStore, Waits};
use toolledger_store_postgres::PgStore;
use toolledger_testkit::cluster::Cluster;

/// The ratios with a target, first in the report, in this order.
const TARGETS: [&str; 5] = [
    "pg_pipeline_vs_raw_1",
    "pg_pipeline_vs_raw_8",
    "pg_replay_vs_raw_select",
    "pg_relay_vs_pipeline",
    "pg_audit_rows_per_s",
];

struct Settings {
    /// Alternating rounds per comparison.
    rounds: usize,
    /// Operations per round (per client with 8).
    ops: usize,
    /// Events the relays drain.
    events: usize,
    /// Operations in the audited ledger.
    audited: usize,
}

type PgEngine = Engine<PgStore, StandIn<PgStore>, NoRoles>;

fn engine(url: &str) -> PgEngine {
    let store = PgStore::connect(url, Waits::default()).unwrap();
    let downstream = StandIn::new(PgStore::connect(url, Waits::default()).unwrap());
    Engine::new(store, downstream, NoRoles, Registry::builtin())
}

/// A new database holding an empty store.
fn ledger(cluster: &Cluster, name: &str) -> String {
    let url = cluster.fresh_database(name).unwrap();
    drop(PgStore::connect(&url, Waits::default()).unwrap());
    url
}

fn main() {
    let Args { out, quick, profile, .. } = Args::parse("report-postgres");
    if let Some(flow) = profile {
        // One flow alone in a loop, for a profiler: `--profile replay|fresh`.
        return profile_flow(&flow);
    }
    let settings = if quick {
        Settings { rounds: 3, ops: 40, events: 400, audited: 5_000 }
    } else {
        Settings { rounds: 5, ops: 200, events: 4_000, audited: 1_000_000 }
    };
    let mut report: Vec<(String, Value)> = Vec::new();
    let mut put = |key: &str, value: Value| report.push((key.to_owned(), value));
    put("quick", json!(quick));
    put("cores", json!(thread::available_parallelism().map(usize::from).unwrap_or(1)));
    println!("starting a private PostgreSQL server");
    let cluster = Cluster::start().unwrap();
    let version: String =
        connect(&cluster.url()).query_one("SHOW server_version", &[]).unwrap().get(0);
    put("postgres_version", json!(version));
    let cases = Arc::new(Cases::new());

    // 1: one client, alternating batches of the raw pipeline and fresh dispatch.
    println!("pipeline, 1 client: raw 4-commit pipeline vs fresh dispatch");
    let (raw_url, fresh_url) = (ledger(&cluster, "raw1"), ledger(&cluster, "fresh1"));
    let mut raw_client = connect(&raw_url);
    let raw_statements = RawStatements::prepare(&mut raw_client);
    let mut fresh = engine(&fresh_url);
    for index in 0..20 {
        raw_operation(&mut raw_client, &raw_statements, &row(&cases, 9_000_000 + index), false);
        fresh.dispatch(&cases.get(9_000_000 + index), &worker()).unwrap();
    }
    let (mut raw_rates, mut fresh_rates) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds {
        let first = round * settings.ops;
        let rows: Vec<Row> = (first..first + settings.ops).map(|i| row(&cases, i)).collect();
        raw_rates.push(timed(settings.ops, |index| {
            raw_operation(&mut raw_client, &raw_statements, &rows[index], false);
        }));
        fresh_rates.push(timed(settings.ops, |index| {
            let answer = fresh.dispatch(&cases.get(first + index), &worker()).unwrap();
            assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("fresh"));
        }));
    }
    let (raw_1, fresh_1) = (Rate::median(&raw_rates), Rate::median(&fresh_rates));
    put("pg_raw_pipeline_1_ops_per_s", json!(raw_1.per_s));
    put("pg_fresh_dispatch_1_ops_per_s", json!(fresh_1.per_s));
    put("pg_pipeline_vs_raw_1", json!(fresh_1.per_s / raw_1.per_s));
    // The client's CPU alone (the server's processes are not this process's).
    put("pg_raw_pipeline_1_client_cpu_us_per_op", json!(raw_1.cpu_us));
    put("pg_fresh_dispatch_1_client_cpu_us_per_op", json!(fresh_1.cpu_us));
    put("pg_cpu_fresh_vs_raw_pipeline_client", json!(fresh_1.cpu_us / raw_1.cpu_us));
    let fresh_1 = fresh_1.per_s;

    // 2: eight clients, each its own connections.
    println!("pipeline, 8 clients: raw pipeline (SKIP LOCKED claims) vs fresh dispatch");
    let (mut raw_8, mut fresh_8) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds {
        let first = 1_000_000 + round * 8 * settings.ops;
        // Each thread's own connections, made before the threads start.
        let raw_clients: Vec<Mutex<(Client, RawStatements)>> = (0..8)
            .map(|_| {
                let mut client = connect(&raw_url);
                let statements = RawStatements::prepare(&mut client);
                Mutex::new((client, statements))
            })
            .collect();
        let shared = (Arc::clone(&cases), raw_clients);
        raw_8.push(threads(settings.ops, move |thread, index| {
            let (cases, clients) = &shared;
            let row = row(cases, first + thread * 100_000 + index);
            let mut client = clients[thread].lock().unwrap();
            let (client, statements) = &mut *client;
            raw_operation(client, statements, &row, true);
        }));
        let engines: Vec<Mutex<PgEngine>> =
            (0..8).map(|_| Mutex::new(engine(&fresh_url))).collect();
        let shared = (Arc::clone(&cases), engines);
        fresh_8.push(threads(settings.ops, move |thread, index| {
            let (cases, engines) = &shared;
            let case = cases.get(first + thread * 100_000 + index);
            let answer = engines[thread].lock().unwrap().dispatch(&case, &worker()).unwrap();
            assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("fresh"));
        }));
    }
    let (raw_8, fresh_8) = (Contention::median(raw_8), Contention::median(fresh_8));
    put("pg_raw_pipeline_8_ops_per_s", json!(raw_8.ops_per_s));
    put("pg_fresh_dispatch_8_ops_per_s", json!(fresh_8.ops_per_s));
    put("pg_fresh_dispatch_8_p99_ms", json!(fresh_8.p99_ms));
    put("pg_raw_pipeline_8_p99_ms", json!(raw_8.p99_ms));
    put("pg_pipeline_vs_raw_8", json!(fresh_8.ops_per_s / raw_8.ops_per_s));
    put("pg_raw_pipeline_8_client_cpu_us_per_op", json!(raw_8.cpu_us));
    put("pg_fresh_dispatch_8_client_cpu_us_per_op", json!(fresh_8.cpu_us));

    // 3: replay of finished operations against a raw unique-key SELECT.
    println!("replay vs raw unique-key SELECT round trip");
    let replay_url = ledger(&cluster, "replay");
    let keys = settings.ops * 4;
    load(&replay_url, &cases, 0, keys, 2);
    let mut replayer = engine(&replay_url);
    let mut raw_reader = connect(&replay_url);
    let select = raw_reader
        .prepare(
            "SELECT * FROM operations WHERE tenant_id = $1 AND subject_id = $2 AND tool_name = $3 \
             AND idempotency_key = $4",
        )
        .unwrap();
    let prepared: Vec<_> = (0..keys).map(|index| cases.get(index)).collect();
    let scopes: Vec<Row> = (0..keys).map(|index| row(&cases, index)).collect();
    let (mut replays, mut selects) = (Vec::new(), Vec::new());
    for _ in 0..settings.rounds {
        selects.push(timed(keys, |index| {
            let scope = &scopes[index].scope;
            let found = raw_reader
                .query_opt(
                    &select,
                    &[
                        &scope.tenant_id.as_str(),
                        &scope.subject_id.as_str(),
                        &scope.tool_name,
                        &scope.idempotency_key.as_str(),
                    ],
                )
                .unwrap();
            assert!(found.is_some());
        }));
        replays.push(timed(keys, |index| {
            let answer = replayer.dispatch(&prepared[index], &worker()).unwrap();
            assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("local_replay"));
        }));
    }
    let (replay, select) = (Rate::median(&replays), Rate::median(&selects));
    put("pg_replay_per_s", json!(replay.per_s));
    put("pg_raw_unique_select_per_s", json!(select.per_s));
    put("pg_replay_vs_raw_select", json!(replay.per_s / select.per_s));
    put("pg_raw_unique_select_client_cpu_us_per_op", json!(select.cpu_us));
    put("pg_replay_client_cpu_us_per_op", json!(replay.cpu_us));
    put("pg_cpu_replay_vs_raw_select_client", json!(replay.cpu_us / select.cpu_us));

    // 4: four relay processes drain a backlog, batches of 64.
    println!("relay: 4 processes draining {} accepted events", settings.events);
    let relay_url = ledger(&cluster, "relay");
    let mut acceptor = engine(&relay_url);
    for index in 0..settings.events {
        acceptor.enqueue(&cases.get(3_000_000 + index)).unwrap();
    }
    drop(acceptor);
    let work = Work::new();
    let case_file = work.file("case.json");
    std::fs::write(&case_file, CASE).unwrap();
    let toolledger = sibling_binary("toolledger");
    let started = Instant::now();
    let relays: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&toolledger)
                .args(["--db", &relay_url, "--fixture"])
                .arg(&case_file)
                .args(["relay", "--once", "--concurrency", "2", "--batch", "64"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // All four run at once: each is waited for only after every one has started.
    for relay in relays {
        let output = relay.wait_with_output().unwrap();
        assert!(output.status.success(), "{output:?}");
    }
    let relay_s = started.elapsed().as_secs_f64();
    let delivered: i64 =
        connect(&relay_url).query_one("SELECT count(*) FROM local_receipts", &[]).unwrap().get(0);
    assert_eq!(delivered, i64::try_from(settings.events).unwrap());
    let relay_rate = settings.events as f64 / relay_s;
    put("pg_relay_4_processes_events_per_s", json!(relay_rate));
    put("pg_relay_vs_pipeline", json!(relay_rate / fresh_1));

    // 5: the audit of a large ledger, one REPEATABLE READ snapshot.
    println!(
        "building a ledger of {} operations through the store (load_finished)",
        settings.audited
    );
    let audit_url = ledger(&cluster, "audit");
    let built = Instant::now();
    load(&audit_url, &cases, 5_000_000, settings.audited, 2);
    put("pg_audit_ledger_operations", json!(settings.audited));
    put("pg_audit_ledger_build_s", json!(built.elapsed().as_secs_f64()));
    let mut auditor = PgStore::connect(&audit_url, Waits::default()).unwrap();
    let started = Instant::now();
    let audit = auditor.audit().unwrap();
    let audit_s = started.elapsed().as_secs_f64();
    assert!(audit.passed(), "{audit:?}");
    // Rows read from the snapshot, all tables (as the SQLite report counts them).
    let rows: i64 = audit.counts.iter().filter_map(|(_, count)| *count).sum();
    put("pg_audit_rows", json!(rows));
    put("pg_audit_s", json!(audit_s));
    put("pg_audit_rows_per_s", json!(rows as f64 / audit_s));
    put("pg_audit_operations_per_s", json!(settings.audited as f64 / audit_s));

    write_report(&out, &report, &TARGETS);
    let cpu = [
        "pg_fresh_dispatch_1_client_cpu_us_per_op",
        "pg_raw_pipeline_1_client_cpu_us_per_op",
        "pg_cpu_fresh_vs_raw_pipeline_client",
        "pg_replay_client_cpu_us_per_op",
        "pg_raw_unique_select_client_cpu_us_per_op",
        "pg_cpu_replay_vs_raw_select_client",
    ];
    for key in TARGETS.iter().chain(&cpu) {
        let value = report.iter().find(|(name, _)| name == key).map(|(_, value)| value.clone());
        println!("{key:<42} {}", value.unwrap_or(Value::Null));
    }
}

fn connect(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap()
}

/// Writes `count` finished operations (keys from `first`) through the store's own
/// statements, on `threads` connections, 1,000 per transaction.
fn load(url: &str, cases: &Arc<Cases>, first: usize, count: usize, threads: usize) {
    let now = UnixSeconds::new(cases.base.clock.now.get()).unwrap();
    let per_thread = count.div_ceil(threads);
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let (url, cases) = (url.to_owned(), Arc::clone(cases));
            thread::spawn(move || {
                let mut store = PgStore::connect(&url, Waits::default()).unwrap();
                let start = first + thread * per_thread;
                let end = (start + per_thread).min(first + count);
                for chunk in (start..end).step_by(1_000) {
                    let batch: Vec<_> = (chunk..(chunk + 1_000).min(end))
                        .map(|index| finished(&cases, &format!("k-{index}")))
                        .collect();
                    store.load_finished(&batch, now).unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
}

/// The raw pipeline's statements, prepared once per connection: plain SQL on purpose.
struct RawStatements {
    operation: postgres::Statement,
    outbox: postgres::Statement,
    call: postgres::Statement,
    claim: postgres::Statement,
    claimed: postgres::Statement,
    receipt: postgres::Statement,
    local: postgres::Statement,
    succeeded: postgres::Statement,
    delivered: postgres::Statement,
}

impl RawStatements {
    fn prepare(client: &mut Client) -> RawStatements {
        let mut prepare = |sql: &str| client.prepare(sql).unwrap();
        RawStatements {
            operation: prepare(
                "INSERT INTO operations (tenant_id, subject_id, tool_name, idempotency_key, status_ref, \
                 downstream_request_ref, request_sha256, arguments_json, input_revision, output_revision, \
                 effect_revision, handler_revision, producer_revision, policy_revision, provider, api_family, \
                 adapter_revision, provider_response_id, provider_call_id, operation_id, approval_id, approver_id, \
                 approval_sha256, approved_at, approval_expires_at, downstream_name, downstream_revision, status, \
                 created_at, updated_at) \
                 VALUES ($1, $2, 'refund_order', $3, $4, $5, $6, $7, \
                 'refund_order.input.v2', 'refund_order.output.v2', 'refund_order.effect.v1', 'refund_order.handler.v1', \
                 'toolledger.producer.v1', 'refund_order.policy.v1', 'openai', 'responses', 'openai-responses-2026-05', \
                 'resp-001', $8, 'op-001', 'appr-001', 'approver-1', $9, 1767225500, 1767229100, 'toolledger-stand-in', \
                 '1', 'pending', 1767225600, 1767225600) \
                 ON CONFLICT (tenant_id, subject_id, tool_name, idempotency_key) DO NOTHING RETURNING id",
            ),
            outbox: prepare(
                "INSERT INTO outbox (op_id, state, attempt_count, next_attempt_at, attempts_before, created_at, \
                 updated_at) VALUES ($1, 'pending', 0, 1767225600, 0, 1767225600, 1767225600)",
            ),
            call: prepare(
                "INSERT INTO call_identities (provider, api_family, adapter_revision, provider_response_id, \
                 provider_call_id, purpose, op_id, created_at) \
                 VALUES ('openai', 'responses', 'openai-responses-2026-05', 'resp-001', $1, 'dispatch', $2, 1767225600)",
            ),
            claim: prepare(
                "UPDATE outbox SET state = 'processing', lease_owner = 'w', lease_until = 1767225630, \
                 next_attempt_at = 1767225630, attempt_count = attempt_count + 1 WHERE op_id = \
                 (SELECT op_id FROM outbox WHERE op_id = $1 AND state = 'pending' FOR UPDATE SKIP LOCKED) \
                 RETURNING op_id",
            ),
            claimed: prepare("UPDATE operations SET status = 'processing' WHERE id = $1"),
            receipt: prepare(
                "INSERT INTO downstream_receipts (downstream_request_ref, request_sha256, receipt_ref, \
                 receipt_json, created_at) VALUES ($1, $2, $3, $4, 1767225600) \
                 ON CONFLICT (downstream_request_ref) DO NOTHING",
            ),
            local: prepare(
                "INSERT INTO local_receipts (op_id, downstream_request_ref, receipt_ref, receipt_json, \
                 output_json, result_sha256, finalized_by, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, 'worker', 1767225600)",
            ),
            succeeded: prepare("UPDATE operations SET status = 'succeeded' WHERE id = $1"),
            delivered: prepare("UPDATE outbox SET state = 'delivered' WHERE op_id = $1"),
        }
    }
}

/// The bare 4-commit pipeline of one operation: A (operation, event, call identity),
/// the claim (`skip_locked`: the event taken with `FOR UPDATE SKIP LOCKED`), B (the
/// downstream's receipt), C (local receipt, succeeded, delivered).
fn raw_operation(client: &mut Client, statements: &RawStatements, row: &Row, skip_locked: bool) {
    let call_id = format!("call-{}", row.scope.idempotency_key);
    let mut tx = client.transaction().unwrap();
    let id: i64 = tx
        .query_one(
            &statements.operation,
            &[
                &row.scope.tenant_id.as_str(),
                &row.scope.subject_id.as_str(),
                &row.scope.idempotency_key.as_str(),
                &row.status_ref,
                &row.downstream_request_ref,
                &row.request_sha256,
                &row.arguments_json,
                &call_id,
                &row.approval_sha256,
            ],
        )
        .unwrap()
        .get(0);
    tx.execute(&statements.outbox, &[&id]).unwrap();
    tx.execute(&statements.call, &[&call_id, &id]).unwrap();
    tx.commit().unwrap();
    let mut tx = client.transaction().unwrap();
    let claimed = tx.query_opt(&statements.claim, &[&id]).unwrap();
    assert!(claimed.is_some() || !skip_locked);
    tx.execute(&statements.claimed, &[&id]).unwrap();
    tx.commit().unwrap();
    client
        .execute(
            &statements.receipt,
            &[
                &row.downstream_request_ref,
                &row.request_sha256,
                &row.receipt_ref,
                &row.receipt_json,
            ],
        )
        .unwrap();
    let mut tx = client.transaction().unwrap();
    tx.execute(
        &statements.local,
        &[
            &id,
            &row.downstream_request_ref,
            &row.receipt_ref,
            &row.receipt_json,
            &row.output_json,
            &row.result_sha256,
        ],
    )
    .unwrap();
    tx.execute(&statements.succeeded, &[&id]).unwrap();
    tx.execute(&statements.delivered, &[&id]).unwrap();
    tx.commit().unwrap();
}

/// `flow` alone, in a loop of about ten seconds on a private server: `replay` (finished
/// operations dispatched again), `lookup` (the store's read of replay alone) or `fresh`
/// (new intents dispatched).
fn profile_flow(flow: &str) {
    let cluster = Cluster::start().unwrap();
    let url = ledger(&cluster, "profile");
    let cases = Arc::new(Cases::new());
    let keys = 1_000;
    let mut engine = engine(&url);
    let started = Instant::now();
    let mut done = 0;
    match flow {
        "replay" => {
            load(&url, &cases, 0, keys, 1);
            let prepared: Vec<_> = (0..keys).map(|index| cases.get(index)).collect();
            let started = Instant::now();
            while started.elapsed().as_secs() < 10 {
                engine.dispatch(&prepared[done % keys], &worker()).unwrap();
                done += 1;
            }
        }
        "lookup" => {
            load(&url, &cases, 0, keys, 1);
            let mut store = PgStore::connect(&url, Waits::default()).unwrap();
            let inputs: Vec<_> =
                (0..keys).map(|index| finished(&cases, &format!("k-{index}"))).collect();
            let started = Instant::now();
            while started.elapsed().as_secs() < 10 {
                let (intent, call, _) = &inputs[done % keys];
                store.dispatch_lookup(&intent.scope, call).unwrap();
                done += 1;
            }
        }
        "rawlookup" => {
            load(&url, &cases, 0, keys, 1);
            let mut client = connect(&url);
            let sql = format!(
                "SELECT {}, o.id, c.purpose, co.status_ref, co.tenant_id, co.subject_id, co.status \
                 FROM (SELECT 1) AS one LEFT JOIN operations o ON o.tenant_id = $1 AND o.subject_id = $2 \
                 AND o.tool_name = $3 AND o.idempotency_key = $4 \
                 LEFT JOIN outbox b ON b.op_id = o.id LEFT JOIN local_receipts l ON l.op_id = o.id \
                 LEFT JOIN terminal_outcomes t ON t.op_id = o.id \
                 LEFT JOIN call_identities c ON c.provider = $5 AND c.api_family = $6 \
                 AND c.provider_response_id = $7 AND c.provider_call_id = $8 \
                 LEFT JOIN operations co ON co.id = c.op_id",
                toolledger_store::OPERATION_COLUMNS
            );
            let statement = client.prepare(&sql).unwrap();
            let rows: Vec<Row> = (0..keys).map(|index| row(&cases, index)).collect();
            let started = Instant::now();
            while started.elapsed().as_secs() < 10 {
                let row = &rows[done % keys];
                let call = format!("call-{}", row.scope.idempotency_key);
                client
                    .query_one(
                        &statement,
                        &[
                            &row.scope.tenant_id.as_str(),
                            &row.scope.subject_id.as_str(),
                            &row.scope.tool_name,
                            &row.scope.idempotency_key.as_str(),
                            &"openai",
                            &"responses",
                            &"resp-001",
                            &call,
                        ],
                    )
                    .unwrap();
                done += 1;
            }
        }
        "select" | "onerow" | "record" => {
            // The baseline's one-row read, and the same read of one row holding every
            // column dispatch's join returns: the floor a one-row replay layout would meet.
            load(&url, &cases, 0, keys, 1);
            let mut client = connect(&url);
            // `record`: that one row decoded and verified by `verify::operation`, as the
            // store reads its replay record, without the store around it.
            let sql = if flow == "select" {
                "SELECT * FROM operations WHERE tenant_id = $1 AND subject_id = $2 \
                 AND tool_name = $3 AND idempotency_key = $4"
                    .to_owned()
            } else {
                client
                    .batch_execute(&format!(
                        "CREATE TABLE replay_probe AS SELECT {} {}; \
                         CREATE UNIQUE INDEX ON replay_probe (tenant_id, subject_id, tool_name, idempotency_key); \
                         ANALYZE replay_probe",
                        // Columns named twice in the join get their own names.
                        toolledger_store::OPERATION_COLUMNS
                            .replace("l.downstream_request_ref", "l.downstream_request_ref AS l_ref")
                            .replace("t.receipt_json", "t.receipt_json AS t_receipt")
                            .replace("t.finalized_by", "t.finalized_by AS t_by"),
                        "FROM operations o JOIN outbox b ON b.op_id = o.id \
                         LEFT JOIN local_receipts l ON l.op_id = o.id \
                         LEFT JOIN terminal_outcomes t ON t.op_id = o.id"
                    ))
                    .unwrap();
                "SELECT * FROM replay_probe WHERE tenant_id = $1 AND subject_id = $2 \
                 AND tool_name = $3 AND idempotency_key = $4"
                    .to_owned()
            };
            let statement = client.prepare(&sql).unwrap();
            let rows: Vec<Row> = (0..keys).map(|index| row(&cases, index)).collect();
            let started = Instant::now();
            while started.elapsed().as_secs() < 10 {
                let scope = &rows[done % keys].scope;
                let found = client
                    .query_opt(
                        &statement,
                        &[
                            &scope.tenant_id.as_str(),
                            &scope.subject_id.as_str(),
                            &scope.tool_name,
                            &scope.idempotency_key.as_str(),
                        ],
                    )
                    .unwrap();
                let found = found.unwrap();
                if flow == "record" {
                    let raw = toolledger_store_postgres::raw_operation(&found).unwrap();
                    let operation = toolledger_store::verify::operation(raw).unwrap();
                    assert!(operation.receipt.is_some());
                }
                done += 1;
            }
        }
        "fresh" => {
            while started.elapsed().as_secs() < 10 {
                engine.dispatch(&cases.get(done), &worker()).unwrap();
                done += 1;
            }
        }
        other => panic!(
            "unknown flow {other}: replay, lookup, rawlookup, select, onerow, record or fresh"
        ),
    }
    println!("{flow}: {:.0} per second", done as f64 / started.elapsed().as_secs_f64());
}
