//! `cargo xtask bench`: toolledger against the physical limit, in one run.
//!
//! Every figure is reported next to a baseline measured in the same run, on the same
//! disk, with the same pragmas (plain rusqlite, bundled SQLite, WAL, synchronous FULL),
//! and subject and baseline rounds alternate so machine drift hits both. The report is
//! written to `target/bench/report.json` and printed as a table.
//!
//! Usage: `report [--quick] [--out PATH]`. `--quick` is a smoke run: smaller ledgers and
//! fewer rounds, so its figures are noisy and its "1m" ledger holds 20,000 operations.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark fails loudly")]

use std::{
    path::Path,
    process::Command,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use rusqlite::{Connection, params};
use serde_json::{Value, json};
use toolledger::drill::{FailurePoint, Interrupt, Switch};
use toolledger_contract::{
    HostCall, LeaseSeconds, NoRoles, RefundOrder, Registry, StatusRef, ToolSpec, builtin_profiles,
};
use toolledger_engine::{Engine, StandIn};

/// The engine of the bench: the ledger, and the stand-in downstream on its own connection.
type SqliteEngine<R> = Engine<SqliteStore, Interrupt<StandIn<SqliteStore>>, R>;
use toolledger_bench::{
    Args, Contention, Meter, Rate, Work, corpus,
    ledger::{CASE, Cases, Row, finished, row, worker},
    median, sibling_binary, threads, timed, timed_rate, write_report,
};
use toolledger_json::{Limits, canonicalize, parse_strict};
use toolledger_store::LedgerStore;
use toolledger_store_sqlite::SqliteStore;

/// The ratios with a target, first in the report, in this order.
const TARGETS: [&str; 13] = [
    "cpu_fresh_vs_raw_pipeline",
    "cpu_replay_vs_raw_select",
    "group_commit_vs_raw_pipeline",
    "group_commit_p99_over_little",
    "pipeline_vs_raw",
    "peer_style_vs_raw2",
    "relay_vs_pipeline",
    "replay_vs_raw_select",
    "processes_vs_raw",
    "definition_fresh_vs_code_defined",
    "definition_replay_vs_code_defined",
    "traces_fresh_on_vs_off",
    "traces_replay_on_vs_off",
];

/// Untimed operations run on a new file before a pipeline measurement: enough to pass
/// the first WAL checkpoint, after which the WAL file is reused instead of grown.
const WARMUP: usize = 150;
/// Keys for warm-up operations start here, far from every measured range.
const WARMUP_KEYS: usize = 10_000_000;

struct Settings {
    /// Alternating rounds per comparison.
    rounds: usize,
    /// Operations per round.
    ops: usize,
    /// Operations in the "big" ledger.
    big: usize,
    /// Operations in the audited ledger.
    audited: usize,
    /// Calls per timed loop of one schema validation.
    validations: usize,
}

impl Settings {
    /// The full run's sizes, or `--quick`'s.
    fn of(quick: bool) -> Settings {
        if quick {
            Settings { rounds: 3, ops: 60, big: 20_000, audited: 5_000, validations: 20_000 }
        } else {
            Settings { rounds: 7, ops: 300, big: 1_000_000, audited: 50_000, validations: 200_000 }
        }
    }
}

fn main() {
    let Args { out, quick, profile: flow, child } = Args::parse("report");
    if let Some(child) = child {
        return child_main(&child);
    }
    if let Some(flow) = flow {
        // A loop of one flow alone, for a profiler:
        // `--profile replay|fresh|raw|pipeline|http|list|audit|lookup|record|select|storage|traces`.
        return profile(&flow);
    }
    let settings = Settings::of(quick);
    let work = Work::new();
    let mut report: Vec<(String, Value)> = Vec::new();
    let mut put = |key: &str, value: Value| {
        report.push((key.to_owned(), value));
    };
    put("quick", json!(quick));
    put("sqlite_version", json!(rusqlite::version()));
    put("cores", json!(thread::available_parallelism().map(usize::from).unwrap_or(1)));

    // 1 + 2: the durable pipeline, raw and through the engine, alternating.
    println!(
        "pipeline: raw 4-commit pipeline vs fresh dispatch ({} rounds x {} ops)",
        settings.rounds, settings.ops
    );
    let cases = Cases::new();
    let mut commit_rates = Vec::new();
    let (raw_pipeline, fresh) = pipeline_rounds(&work, &cases, &settings, |round| {
        commit_rates
            .push(raw_commit_rate(&work.file(&format!("commit-{round}")), settings.ops * 2));
    });
    let (raw_pipeline_ops, fresh_ops) = (raw_pipeline.per_s, fresh.per_s);
    put("raw_commit_per_s", json!(median(commit_rates)));
    put("raw_pipeline_ops_per_s", json!(raw_pipeline_ops));
    put("fresh_dispatch_ops_per_s", json!(fresh_ops));
    put("pipeline_vs_raw", json!(fresh_ops / raw_pipeline_ops));
    put("raw_pipeline_cpu_us_per_op", json!(raw_pipeline.cpu_us));
    put("fresh_dispatch_cpu_us_per_op", json!(fresh.cpu_us));
    put("cpu_fresh_vs_raw_pipeline", json!(fresh.cpu_us / raw_pipeline.cpu_us));

    // A peer-style downstream (one row into its own WAL file, synchronous=NORMAL): fresh
    // dispatch (A with the claim, the peer's row, C) against the bare 2-commit FULL
    // pipeline plus the same row, alternating.
    println!("peer-style downstream: raw 2-commit pipeline + peer row vs fresh dispatch");
    let (mut raw2_rates, mut peer_rates) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds {
        let (raw_rate, peer_rate) =
            peer_round(&work, round, &cases, 1_500_000 + round * settings.ops, settings.ops);
        raw2_rates.push(raw_rate);
        peer_rates.push(peer_rate);
    }
    let (raw2, peer) = (Rate::median(&raw2_rates), Rate::median(&peer_rates));
    put("raw2_peer_ops_per_s", json!(raw2.per_s));
    put("peer_style_dispatch_ops_per_s", json!(peer.per_s));
    put("peer_style_vs_raw2", json!(peer.per_s / raw2.per_s));
    put("raw2_peer_cpu_us_per_op", json!(raw2.cpu_us));
    put("peer_style_dispatch_cpu_us_per_op", json!(peer.cpu_us));
    put("cpu_peer_style_vs_raw2", json!(peer.cpu_us / raw2.cpu_us));

    // Tools as data: refund_order through its shipped definition (JSON Schema) against
    // the same tool written in code (the table form), alternating; then what one
    // validation costs, per tool.
    tools_as_data(&work, &cases, &settings, &mut put);
    #[cfg(feature = "otel")]
    traces_on_off(&work, &cases, &settings, &mut put);

    // Replay, status reconciliation, claims, on a small ledger.
    let small = work.file("small");
    let mut small_engine = engine(&small);
    let keys = settings.ops;
    for index in 0..keys {
        small_engine.dispatch(&cases.get(index), &worker()).unwrap();
    }
    // 4: scaling needs the 1M ledger, also the raw SELECT baseline's table.
    println!("building a ledger of {} operations through the store (load_finished)", settings.big);
    let big = work.file("big");
    let built = Instant::now();
    fill(&big, &cases, settings.big);
    put("big_ledger_operations", json!(settings.big));
    put("big_ledger_build_s", json!(built.elapsed().as_secs_f64()));
    let mut big_engine = engine(&big);
    for index in 0..keys {
        big_engine.dispatch(&cases.get(index), &worker()).unwrap();
    }

    println!("replay vs raw unique-key SELECT on {} rows", settings.big);
    let (mut select_rates, mut replay_small, mut replay_big) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..settings.rounds {
        select_rates.push(raw_select(&big, settings.big, settings.ops * 20));
        replay_small.push(replay(&mut small_engine, &cases, keys, settings.ops * 4));
        replay_big.push(replay(&mut big_engine, &cases, keys, settings.ops * 4));
    }
    let select = Rate::median(&select_rates);
    let (replay_small, replay_big) = (Rate::median(&replay_small), Rate::median(&replay_big));
    let replay_1m = replay_big.per_s;
    put("raw_unique_select_per_s", json!(select.per_s));
    put("replay_per_s", json!(replay_small.per_s));
    put("replay_big_ledger_per_s", json!(replay_1m));
    put("replay_vs_raw_select", json!(replay_1m / select.per_s));
    put("raw_unique_select_cpu_us_per_op", json!(select.cpu_us));
    put("replay_cpu_us_per_op", json!(replay_small.cpu_us));
    put("replay_big_ledger_cpu_us_per_op", json!(replay_big.cpu_us));
    put("cpu_replay_vs_raw_select", json!(replay_big.cpu_us / select.cpu_us));

    println!("scaling: fresh dispatch with 1K and {} existing operations", settings.big);
    let thousand = work.file("thousand");
    fill(&thousand, &cases, 1_000);
    let mut thousand_engine = engine(&thousand);
    let (mut fresh_1k, mut fresh_1m) = (Vec::new(), Vec::new());
    let base = 100_000;
    for round in 0..settings.rounds {
        let start = base + round * settings.ops;
        fresh_1k.push(timed(settings.ops, |index| {
            thousand_engine.dispatch(&cases.get(start + index), &worker()).unwrap();
        }));
        fresh_1m.push(timed(settings.ops, |index| {
            big_engine.dispatch(&cases.get(start + index), &worker()).unwrap();
        }));
    }
    let (fresh_1k, fresh_1m) = (Rate::median(&fresh_1k), Rate::median(&fresh_1m));
    let replay_thousand = {
        for index in 0..keys {
            thousand_engine.dispatch(&cases.get(index), &worker()).unwrap();
        }
        median(
            (0..settings.rounds)
                .map(|_| replay(&mut thousand_engine, &cases, keys, settings.ops * 4).per_s)
                .collect(),
        )
    };
    put("fresh_1k_ops_per_s", json!(fresh_1k.per_s));
    put("fresh_1m_ops_per_s", json!(fresh_1m.per_s));
    put("replay_1k_per_s", json!(replay_thousand));
    put("replay_1m_per_s", json!(replay_1m));
    put("scaling_fresh_1m_vs_1k", json!(fresh_1m.per_s / fresh_1k.per_s));
    put("scaling_replay_1m_vs_1k", json!(replay_1m / replay_thousand));
    put("fresh_1k_cpu_us_per_op", json!(fresh_1k.cpu_us));
    put("fresh_1m_cpu_us_per_op", json!(fresh_1m.cpu_us));
    put("cpu_fresh_1m_vs_1k", json!(fresh_1m.cpu_us / fresh_1k.cpu_us));
    drop(big_engine);

    // The operator's reads on the big ledger: a page of `list` and all of `metrics`, each
    // from indexes and counter rows (median of three).
    println!("list and metrics on {} operations", settings.big);
    let at = cases.base.clock.now.get() + 60;
    let timed_read = |read: &dyn Fn()| {
        median(
            (0..3)
                .map(|_| {
                    let started = Instant::now();
                    read();
                    started.elapsed().as_secs_f64()
                })
                .collect(),
        )
    };
    let filter = toolledger::ListFilter { state: Some("succeeded"), ..Default::default() };
    let list_s = timed_read(&|| {
        assert_eq!(toolledger::list(&big, &filter, false, Some(at)).unwrap().len(), 100);
    });
    let metrics_s = timed_read(&|| {
        assert!(toolledger::metrics(&big, Some(at)).unwrap().contains("toolledger_operations"));
    });
    put("list_big_ledger_s", json!(list_s));
    put("metrics_big_ledger_s", json!(metrics_s));

    // The dashboard's pages on the big ledger, rendered by `toolledger serve` in its own
    // process and fetched over loopback one at a time: each page's p50 and p99. The
    // baseline is `/healthz`, the same server's round trip with one store read.
    println!("dashboard pages on {} operations", settings.big);
    let listed = toolledger::list(&big, &filter, false, Some(at)).unwrap();
    let (first, last) = (&listed[0], &listed[listed.len() - 1]);
    let serve = Serve::start(&big, at);
    let pages = [
        ("healthz", "/healthz".to_owned()),
        ("overview", "/".to_owned()),
        ("list", "/operations?state=succeeded".to_owned()),
        ("list_next_page", format!("/operations?state=succeeded&after={}", last.cursor)),
        (
            "list_tool_age",
            "/operations?state=succeeded&tool=refund_order&older_than_minutes=1".to_owned(),
        ),
        ("operation", format!("/operations/{}", first.status_ref)),
    ];
    let fetches = if quick { 20 } else { 200 };
    // A plain client: the request in one write, the answer read to the server's close.
    // (ureq's writes meet the server's delayed ACK: a 44 ms floor under every page,
    // /style.css included, measured; Python's http.client and curl see 1–2 ms.)
    let addr = serve.base.trim_start_matches("http://").to_owned();
    for (name, path) in &pages {
        let mut latencies: Vec<f64> = (0..fetches)
            .map(|_| {
                use std::io::{Read, Write};
                let started = Instant::now();
                let mut stream = std::net::TcpStream::connect(&addr).unwrap();
                stream.set_nodelay(true).unwrap();
                let request =
                    format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
                stream.write_all(request.as_bytes()).unwrap();
                let mut answer = Vec::new();
                stream.read_to_end(&mut answer).unwrap();
                assert!(answer.starts_with(b"HTTP/1.1 200 "), "{path}");
                started.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        let measured = Contention::from(&mut latencies, 1.0);
        put(&format!("dashboard_{name}_p50_ms"), json!(measured.p50_ms));
        put(&format!("dashboard_{name}_p99_ms"), json!(measured.p99_ms));
    }
    drop(serve);

    println!("status reconciliation and worker claims");
    let reconcile = work.file("reconcile");
    let mut reconcile_engine = engine(&reconcile);
    let status_base = 200_000;
    let refs = stopped(
        &mut reconcile_engine,
        &cases,
        status_base,
        settings.ops,
        Some(FailurePoint::AfterDownstreamCommit),
    );
    let status_refs: Vec<StatusRef> =
        refs.iter().map(|text| StatusRef::new(text).unwrap()).collect();
    let status_rate = timed_rate(settings.ops, |index| {
        let answer =
            reconcile_engine.status(&cases.get(status_base + index), &status_refs[index]).unwrap();
        assert_eq!(answer.code(), "OK");
    });
    put("status_reconciliations_per_s", json!(status_rate));
    let claim_base = 300_000;
    let pending = stopped(&mut reconcile_engine, &cases, claim_base, settings.ops, None);
    let mut claimer = SqliteStore::open(&reconcile).unwrap();
    let lease = LeaseSeconds::new(30).unwrap();
    let now = cases.base.clock.now;
    let claim_rate = timed_rate(settings.ops, |index| {
        claimer.claim(&StatusRef::new(&pending[index]).unwrap(), &worker(), now, lease).unwrap();
    });
    put("claims_per_s", json!(claim_rate));

    // The relay draining a backlog (one worker) against the per-operation pipeline
    // (fresh dispatch) measured above: batches of 256 (the row), and of 64.
    let events = settings.ops * 16;
    let mut relay_rates = Vec::new();
    for (batch, first) in [(256, 400_000), (64, 1_600_000)] {
        let relayed = work.file(&format!("relay-{batch}"));
        println!("relay: {events} accepted events, one worker, batches of {batch}");
        let mut relay_engine = engine(&relayed);
        for index in 0..events {
            relay_engine.enqueue(&cases.get(first + index)).unwrap();
        }
        drop(relay_engine);
        let mut meter = Meter::default();
        let drained = meter.time(|| {
            toolledger::Relay::new(&relayed)
                .tool(toolledger::RefundOrder::default().tool())
                .batch(batch)
                .at(now.get() + 1)
                .run(
                    || toolledger::simulated(&relayed),
                    || NoRoles,
                    &cases.base.business_state,
                    toolledger::Until::Drained,
                    &|_| {},
                )
                .unwrap()
        });
        relay_rates.push(meter.rate(events));
        assert_eq!(drained.delivered, events, "{drained:?}");
    }
    let events = settings.ops * 4;
    put("relay_events_per_s", json!(relay_rates[0].per_s));
    put("relay_batch64_events_per_s", json!(relay_rates[1].per_s));
    put("relay_vs_pipeline", json!(relay_rates[0].per_s / fresh_ops));
    put("relay_cpu_us_per_event", json!(relay_rates[0].cpu_us));
    put("relay_batch64_cpu_us_per_event", json!(relay_rates[1].cpu_us));
    put("cpu_relay_vs_fresh", json!(relay_rates[0].cpu_us / fresh.cpu_us));

    // Over HTTP on loopback, against the reference service in its own process: a fresh
    // dispatch, against what it cannot avoid (one raw HTTP round trip that commits a
    // refund, plus the bare 4-commit pipeline measured above), alternating; then the
    // relay draining a backlog with eight workers.
    println!("http: dispatch over loopback vs raw HTTP round trip + raw pipeline; relay x8");
    let service = Refundd::start(&work.file("refundd"));
    let http_ops = settings.ops / 2;
    let (mut raw_http, mut over_http) = (Vec::new(), Vec::new());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_idle_connections(0)
        .build()
        .into();
    for round in 0..settings.rounds {
        raw_http.push(timed(http_ops, |index| {
            let case = cases.get(700_000 + round * http_ops + index);
            let body = json!({"arguments": case.proposal.arguments, "request_sha256": "0".repeat(64),
                "output_revision": "refund_order.output.v1", "tool_name": "refund_order"});
            let response = agent
                .post(format!("{}/refunds", service.base))
                .header("Idempotency-Key", format!("\"raw-{round}-{index}\""))
                .header("Connection", "close")
                .send(canonicalize(&body))
                .unwrap();
            assert_eq!(response.status().as_u16(), 201);
        }));
        let path = work.file(&format!("http-{round}"));
        let ledger = http_ledger(&path, &service.base);
        over_http.push(http_dispatches(&ledger, &cases, 800_000 + round * http_ops, http_ops));
    }
    let (raw_http, http_dispatch) = (Rate::median(&raw_http), Rate::median(&over_http));
    let over_http = http_dispatch.per_s;
    let floor = 1.0 / (1.0 / raw_http.per_s + 1.0 / raw_pipeline_ops);
    put("raw_http_round_trips_per_s", json!(raw_http.per_s));
    put("http_floor_ops_per_s", json!(floor));
    put("http_dispatch_ops_per_s", json!(over_http));
    put("http_dispatch_vs_floor", json!(over_http / floor));
    // The client's CPU alone (the service is its own process): a round trip's, plus the
    // raw pipeline's, is the floor's.
    let floor_cpu_us = raw_http.cpu_us + raw_pipeline.cpu_us;
    put("http_floor_cpu_us_per_op", json!(floor_cpu_us));
    put("http_dispatch_cpu_us_per_op", json!(http_dispatch.cpu_us));
    put("cpu_http_dispatch_vs_floor", json!(http_dispatch.cpu_us / floor_cpu_us));

    let backlog = work.file("http-relay");
    {
        let ledger = http_ledger(&backlog, &service.base);
        for index in 0..events {
            let reply = ledger.enqueue_loaded(&cases.get(900_000 + index)).unwrap();
            assert!(matches!(reply.outcome(), toolledger::Outcome::Accepted { .. }));
        }
    }
    let started = Instant::now();
    let drained = toolledger::Relay::new(&backlog)
        .tool(toolledger::RefundOrder::default().tool())
        .concurrency(8)
        .batch(16)
        .at(now.get() + 1)
        .run(
            || Ok(http_downstream(&service.base)),
            || NoRoles,
            &cases.base.business_state,
            toolledger::Until::Drained,
            &|_| {},
        )
        .unwrap();
    let http_relay = events as f64 / started.elapsed().as_secs_f64();
    assert_eq!(drained.delivered, events, "{drained:?}");
    put("http_relay_events_per_s", json!(http_relay));
    put("http_relay_vs_dispatch", json!(http_relay / over_http));
    drop(service);

    // The audit of a ledger of valid, finished operations.
    println!("audit of {} finished operations", settings.audited);
    let audited = work.file("audited");
    fill_valid(&audited, &cases, settings.audited);
    // The median of three audits: one audit is one long measurement, easily disturbed.
    let mut audits = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let started = Instant::now();
        last = Some(toolledger::audit(&audited).unwrap());
        audits.push(started.elapsed().as_secs_f64());
    }
    let audit_s = median(audits);
    let answer = last.unwrap();
    assert!(answer.passed(), "{}", answer.package());
    let rows: i64 =
        answer.package()["counts"].as_object().unwrap().values().map(|n| n.as_i64().unwrap()).sum();
    put("audit_operations", json!(settings.audited));
    put("audit_rows", json!(rows));
    put("audit_s", json!(audit_s));
    put("audit_rows_per_s", json!(rows as f64 / audit_s));
    put("audit_operations_per_s", json!(settings.audited as f64 / audit_s));

    // 3: contention, 8 threads on one file.
    println!("contention: 8 threads, distinct keys, one file");
    let per_thread = settings.ops / 4;
    let (mut ours, mut raws) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds.min(3) {
        raws.push(raw_contention(
            &work.file(&format!("raw-contention-{round}")),
            &cases,
            400_000 + round * 8 * per_thread,
            per_thread,
        ));
        ours.push(contention(
            &work.file(&format!("contention-{round}")),
            &cases,
            500_000 + round * 8 * per_thread,
            per_thread,
        ));
    }
    let ours = Contention::median(ours);
    let raws = Contention::median(raws);
    put("contention_ops_per_s", json!(ours.ops_per_s));
    put("contention_p50_ms", json!(ours.p50_ms));
    put("contention_p99_ms", json!(ours.p99_ms));
    put("contention_max_ms", json!(ours.max_ms));
    put("raw_contention_ops_per_s", json!(raws.ops_per_s));
    put("raw_contention_p50_ms", json!(raws.p50_ms));
    put("raw_contention_p99_ms", json!(raws.p99_ms));
    put("raw_contention_max_ms", json!(raws.max_ms));
    put("contention_vs_raw", json!(ours.ops_per_s / raws.ops_per_s));
    put("contention_cpu_us_per_op", json!(ours.cpu_us));
    put("raw_contention_cpu_us_per_op", json!(raws.cpu_us));
    put("cpu_contention_vs_raw", json!(ours.cpu_us / raws.cpu_us));
    put("contention_little_bound_ms", json!(8.0 * 1000.0 / raw_pipeline_ops));
    // Group commit: the eight threads' aggregate against the single-thread pipeline's
    // ceiling, and their tail against the mean latency Little's law gives that run.
    put("group_commit_vs_raw_pipeline", json!(ours.ops_per_s / raw_pipeline_ops));
    put("contention_little_mean_ms", json!(8.0 * 1000.0 / ours.ops_per_s));
    put("group_commit_p99_over_little", json!(ours.p99_ms / (8.0 * 1000.0 / ours.ops_per_s)));
    put("contention_batches", json!(ours.batches));

    // 8 processes (not threads): no gate between them, only SQLite's locks.
    println!("processes: 8 processes, distinct keys, one file");
    let (mut ours_p, mut raws_p) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds.min(3) {
        raws_p.push(processes(
            "raw",
            &work.file(&format!("raw-processes-{round}")),
            1_000_000 + round * 8 * per_thread,
            per_thread,
        ));
        ours_p.push(processes(
            "dispatch",
            &work.file(&format!("processes-{round}")),
            1_100_000 + round * 8 * per_thread,
            per_thread,
        ));
    }
    let (ours_p, raws_p) = (Contention::median(ours_p), Contention::median(raws_p));
    put("processes_ops_per_s", json!(ours_p.ops_per_s));
    put("processes_p50_ms", json!(ours_p.p50_ms));
    put("processes_p99_ms", json!(ours_p.p99_ms));
    put("raw_processes_ops_per_s", json!(raws_p.ops_per_s));
    put("raw_processes_p99_ms", json!(raws_p.p99_ms));
    put("processes_vs_raw", json!(ours_p.ops_per_s / raws_p.ops_per_s));

    // 5: JSON.
    println!("json: parse_strict + canonicalize vs serde_json");
    let (ours_mb, serde_mb) = json_corpus(settings.rounds * 3);
    put("json_mb_per_s", json!(ours_mb));
    put("serde_json_mb_per_s", json!(serde_mb));
    put("json_vs_serde", json!(serde_mb / ours_mb));

    // 6: the CLI as a whole process.
    println!("cli: whole-process wall time");
    let runs = if quick { 15 } else { 61 };
    let (replay_ms, version_ms, true_ms) = cli(&work, runs);
    put("cli_dispatch_replay_ms", json!(replay_ms));
    put("cli_version_ms", json!(version_ms));
    put("process_spawn_true_ms", json!(true_ms));
    put("cli_replay_over_version", json!(replay_ms / version_ms));

    let plans: serde_json::Map<String, Value> = SqliteStore::open(&big)
        .unwrap()
        .query_plans()
        .unwrap()
        .into_iter()
        .map(|(name, plan)| (name.to_owned(), json!(plan.join(" | "))))
        .collect();
    put("query_plans", Value::Object(plans));

    write_report(&out, &report, &TARGETS);
    print_table(&Value::Object(report.into_iter().collect()));
    println!("written to {}", out.display());
}

fn profile(flow: &str) {
    let work = Work::new();
    let cases = Cases::new();
    let path = work.file("profile");
    match flow {
        "replay" => {
            let mut engine = engine(&path);
            for index in 0..100 {
                engine.dispatch(&cases.get(index), &worker()).unwrap();
            }
            let count = count_from_env("REPLAYS", 200_000);
            let rate = replay(&mut engine, &cases, 100, count);
            println!("{:.0} replays/s, {:.1} us CPU each", rate.per_s, rate.cpu_us);
        }
        "lookup" | "record" | "select" => {
            // A replay's read alone, over 1,000 finished operations: `lookup` is the
            // store's `dispatch_lookup` (the replay record, decoded and verified);
            // `record` reads a copy of every column of the seven-table join, by the same
            // key, with plain SQL, decoded and verified by `verify::operation`: the
            // record's read without the store around it.
            // `LEDGER_ROWS` more operations first (keys `fill-<n>`), as the report's 1M
            // ledger; `select` is then the report's raw select over them.
            let rows = count_from_env("LEDGER_ROWS", 0);
            if rows > 0 {
                fill(&path, &cases, rows);
            }
            let keys: Vec<String> = (0..1000).map(|index| format!("k-{index}")).collect();
            let inputs: Vec<_> = keys.iter().map(|key| finished(&cases, key)).collect();
            let mut store = SqliteStore::open(&path).unwrap();
            assert_eq!(store.load_finished(&inputs, cases.base.clock.now).unwrap(), inputs.len());
            let count = count_from_env("REPLAYS", 200_000);
            let rate = if flow == "select" {
                assert!(rows > 0, "--profile select reads the LEDGER_ROWS operations: set it");
                raw_select(&path, rows, count)
            } else if flow == "lookup" {
                timed(count, |index| {
                    let (intent, call, _) = &inputs[index % inputs.len()];
                    let found = store.dispatch_lookup(&intent.scope, call).unwrap();
                    assert!(found.operation.is_some_and(|operation| operation.receipt.is_some()));
                })
            } else {
                let conn = raw(&path);
                conn.execute_batch(&format!(
                    "CREATE TABLE replay_probe AS SELECT {} FROM operations o \
                     JOIN outbox b ON b.op_id = o.id LEFT JOIN local_receipts l ON l.op_id = o.id \
                     LEFT JOIN terminal_outcomes t ON t.op_id = o.id; \
                     CREATE UNIQUE INDEX replay_probe_scope ON replay_probe \
                     (tenant_id, subject_id, tool_name, idempotency_key)",
                    // Columns named twice in the join get their own names.
                    toolledger_store::OPERATION_COLUMNS
                        .replace("l.downstream_request_ref", "l.downstream_request_ref AS l_ref")
                        .replace("t.receipt_json", "t.receipt_json AS t_receipt")
                        .replace("t.finalized_by", "t.finalized_by AS t_by"),
                ))
                .unwrap();
                let mut select = conn
                    .prepare(
                        "SELECT * FROM replay_probe WHERE tenant_id = ?1 AND subject_id = ?2 \
                         AND tool_name = ?3 AND idempotency_key = ?4",
                    )
                    .unwrap();
                timed(count, |index| {
                    let scope = &inputs[index % inputs.len()].0.scope;
                    let raw = select
                        .query_row(
                            params![
                                scope.tenant_id.as_str(),
                                scope.subject_id.as_str(),
                                scope.tool_name,
                                scope.idempotency_key.as_str()
                            ],
                            |row| Ok(toolledger_store_sqlite::raw_operation(row)),
                        )
                        .unwrap()
                        .unwrap();
                    let operation = toolledger_store::verify::operation(raw).unwrap();
                    assert!(operation.receipt.is_some());
                })
            };
            println!("{flow}: {:.0} reads/s, {:.1} us CPU each", rate.per_s, rate.cpu_us);
        }
        "storage" => {
            // What replay records cost on disk: a ledger of `LEDGER_ROWS` finished
            // operations (100,000 unless set), compacted, with its records and without.
            let rows = count_from_env("LEDGER_ROWS", 100_000);
            fill(&path, &cases, rows);
            let conn = raw(&path);
            let bytes = |conn: &Connection| -> i64 {
                conn.execute_batch("VACUUM").unwrap();
                let pages: i64 = conn.query_row("PRAGMA page_count", [], |row| row.get(0)).unwrap();
                let size: i64 = conn.query_row("PRAGMA page_size", [], |row| row.get(0)).unwrap();
                pages * size
            };
            let with = bytes(&conn);
            assert_eq!(conn.execute("DELETE FROM replays", []).unwrap(), rows);
            let without = bytes(&conn);
            println!(
                "{rows} operations: {with} bytes with their replay records, {without} without: \
                 {:.0} bytes a record, {:.0} bytes an operation without one",
                (with - without) as f64 / rows as f64,
                without as f64 / rows as f64
            );
        }
        "raw" => {
            drop(SqliteStore::open(&path).unwrap());
            let (ledger, downstream) = (raw(&path), raw(&path));
            let rows: Vec<Row> = (0..3000).map(|index| row(&cases, index)).collect();
            let rate = timed(rows.len(), |index| raw_operation(&ledger, &downstream, &rows[index]));
            println!("{:.0} raw pipelines/s, {:.1} us CPU each", rate.per_s, rate.cpu_us);
        }
        "contention" => {
            let measured = contention(&path, &cases, 0, 500);
            println!(
                "{:.0} ops/s, p99 {:.2} ms, {:.1} per group commit",
                measured.ops_per_s, measured.p99_ms, measured.batches
            );
        }
        "processes" => {
            // The report's 8-process row alone: `PER_PROCESS` dispatches each (75 unless
            // set), ours and then the bare pipeline's, each on a fresh file.
            let per_process = count_from_env("PER_PROCESS", 75);
            for mode in ["dispatch", "raw"] {
                let measured = processes(mode, &work.file(mode), 0, per_process);
                println!(
                    "{mode}: {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms",
                    measured.ops_per_s, measured.p50_ms, measured.p99_ms
                );
            }
        }
        "relay" => {
            let mut engine = engine(&path);
            let events = count_from_env("RELAY_EVENTS", 5000);
            for index in 0..events {
                engine.enqueue(&cases.get(index)).unwrap();
            }
            drop(engine);
            // What the enqueue wrote, apart from the relay's own (the total follows).
            print_io();
            println!("relaying");
            let started = Instant::now();
            let workers = count_from_env("RELAY_WORKERS", 1);
            let drained = toolledger::Relay::new(&path)
                .tool(toolledger::RefundOrder::default().tool())
                .concurrency(workers)
                .batch(count_from_env("RELAY_BATCH", 64))
                .at(cases.base.clock.now.get() + 1)
                .run(
                    || toolledger::simulated(&path),
                    || NoRoles,
                    &cases.base.business_state,
                    toolledger::Until::Drained,
                    &|_| {},
                )
                .unwrap();
            let rate = drained.delivered as f64 / started.elapsed().as_secs_f64();
            println!("{rate:.0} events/s");
        }
        "tools" => {
            // The report's "tools as data" section alone, at the full run's sizes.
            let settings = Settings::of(false);
            tools_as_data(&work, &cases, &settings, &mut |key, value| {
                println!("{key}: {value}");
            });
        }
        #[cfg(feature = "otel")]
        "traces" => {
            // The report's traces section alone, at the full run's sizes.
            traces_on_off(&work, &cases, &Settings::of(false), &mut |key, value| {
                println!("{key}: {value}");
            });
        }
        "http" => {
            // Fresh dispatches over loopback to the reference service (its own process):
            // this process's CPU is the ledger's and the HTTP client's.
            let service = Refundd::start(&work.file("refundd"));
            let ledger = http_ledger(&path, &service.base);
            let rate = http_dispatches(&ledger, &cases, 0, count_from_env("HTTP_OPS", 3000));
            println!("{:.0} dispatches/s, {:.1} us CPU each", rate.per_s, rate.cpu_us);
        }
        "validate" => {
            // Each tool's three validations alone; `VALIDATIONS` calls per loop, and
            // `VALIDATE` (a key of the report's `validate_*` figures, e.g.
            // `refund_order_definition`) to run one tool only, as for callgrind.
            let calls = count_from_env("VALIDATIONS", 1_000_000);
            let only = std::env::var("VALIDATE").ok();
            for (tool, (label, key)) in validated(&cases).iter().zip(VALIDATED) {
                if only.as_deref().is_some_and(|only| only != key) {
                    continue;
                }
                let [input, output, invalid] = validations(tool, calls);
                println!(
                    "{label}: input {input:.3} us, output {output:.3} us, invalid {invalid:.3} us"
                );
            }
        }
        "pipeline" => {
            // The report's first rows alone, at the full run's sizes: rounds of the raw
            // 4-commit pipeline and fresh dispatches alternating, their medians.
            let (raw, fresh) = pipeline_rounds(&work, &cases, &Settings::of(false), |_| {});
            println!(
                "raw {:.0}/s {:.1} us CPU, fresh {:.0}/s {:.1} us CPU: pipeline_vs_raw {:.3}, cpu_fresh_vs_raw_pipeline {:.3}",
                raw.per_s,
                raw.cpu_us,
                fresh.per_s,
                fresh.cpu_us,
                fresh.per_s / raw.per_s,
                fresh.cpu_us / raw.cpu_us
            );
        }
        "fresh" => {
            // `LEDGER_ROWS` finished operations first (the scaling row's big ledger), then
            // `FRESH` fresh dispatches (3,000 unless set).
            let rows = count_from_env("LEDGER_ROWS", 0);
            if rows > 0 {
                fill(&path, &cases, rows);
            }
            let rate = fresh_dispatch(&path, &cases, 0, count_from_env("FRESH", 3000));
            println!("{:.0} fresh dispatches/s, {:.1} us CPU each", rate.per_s, rate.cpu_us);
        }
        "list" => {
            // The report's list row alone, many times (it times three calls):
            // `LIST_CALLS` calls of `list`, each opening the file as the command does, on a
            // ledger of `LIST_ROWS` finished operations.
            fill(&path, &cases, count_from_env("LIST_ROWS", 1_000_000));
            let at = cases.base.clock.now.get() + 60;
            let filter = toolledger::ListFilter { state: Some("succeeded"), ..Default::default() };
            let rate = timed(count_from_env("LIST_CALLS", 300), |_| {
                assert_eq!(toolledger::list(&path, &filter, false, Some(at)).unwrap().len(), 100);
            });
            println!("{:.1} us per list, {:.1} us CPU each", 1e6 / rate.per_s, rate.cpu_us);
        }
        "audit" => {
            fill_valid(&path, &cases, 20_000);
            for _ in 0..5 {
                let started = Instant::now();
                toolledger::audit(&path).unwrap();
                println!("{:.0} operations/s", 20_000.0 / started.elapsed().as_secs_f64());
            }
        }
        other => panic!("no flow {other}"),
    }
    print_io();
}

/// This process's I/O so far (`/proc/self/io`), on one line.
fn print_io() {
    if let Ok(io) = std::fs::read_to_string("/proc/self/io") {
        println!("{}", io.replace('\n', " "));
    }
}

fn print_table(report: &Value) {
    let f = |key: &str| report[key].as_f64().unwrap_or(f64::NAN);
    println!();
    println!("{:<40} {:>14} {:>14} {:>9}  target", "figure", "toolledger", "baseline", "ratio");
    let rows: [(&str, &str, &str, &str, &str); 19] = [
        (
            "8-thread ops/s vs raw 1-thread pipeline",
            "contention_ops_per_s",
            "raw_pipeline_ops_per_s",
            "group_commit_vs_raw_pipeline",
            ">= 2.0",
        ),
        (
            "8-thread p99 ms vs Little's-law mean",
            "contention_p99_ms",
            "contention_little_mean_ms",
            "group_commit_p99_over_little",
            "<= 2.0",
        ),
        (
            "fresh dispatch ops/s vs raw pipeline",
            "fresh_dispatch_ops_per_s",
            "raw_pipeline_ops_per_s",
            "pipeline_vs_raw",
            ">= 1.20",
        ),
        (
            "peer-style dispatch vs raw 2-commit+row",
            "peer_style_dispatch_ops_per_s",
            "raw2_peer_ops_per_s",
            "peer_style_vs_raw2",
            ">= 0.85",
        ),
        (
            "relay events/s vs fresh dispatch ops/s",
            "relay_events_per_s",
            "fresh_dispatch_ops_per_s",
            "relay_vs_pipeline",
            ">= 10",
        ),
        (
            "replay/s vs raw unique SELECT/s",
            "replay_big_ledger_per_s",
            "raw_unique_select_per_s",
            "replay_vs_raw_select",
            ">= 0.50",
        ),
        (
            "8-process ops/s vs raw 8-process",
            "processes_ops_per_s",
            "raw_processes_ops_per_s",
            "processes_vs_raw",
            ">= 1.0",
        ),
        (
            "refund_order fresh: definition vs code",
            "definition_fresh_ops_per_s",
            "code_defined_fresh_ops_per_s",
            "definition_fresh_vs_code_defined",
            ">= 0.95",
        ),
        (
            "refund_order replay: definition vs code",
            "definition_replay_per_s",
            "code_defined_replay_per_s",
            "definition_replay_vs_code_defined",
            ">= 0.98",
        ),
        (
            "facade fresh: spans on vs off",
            "traces_on_fresh_per_s",
            "traces_off_fresh_per_s",
            "traces_fresh_on_vs_off",
            ">= 0.9",
        ),
        (
            "facade replay: spans on vs off",
            "traces_on_replay_per_s",
            "traces_off_replay_per_s",
            "traces_replay_on_vs_off",
            ">= 0.9",
        ),
        (
            "8-process p99 ms (ours, raw)",
            "processes_p99_ms",
            "raw_processes_p99_ms",
            "processes_p99_ms",
            "reported",
        ),
        (
            "8-thread ops/s vs raw 8-thread",
            "contention_ops_per_s",
            "raw_contention_ops_per_s",
            "contention_vs_raw",
            "-",
        ),
        (
            "fresh ops/s, 1M vs 1K ledger",
            "fresh_1m_ops_per_s",
            "fresh_1k_ops_per_s",
            "scaling_fresh_1m_vs_1k",
            ">= 0.80",
        ),
        (
            "replay/s, 1M vs 1K ledger",
            "replay_1m_per_s",
            "replay_1k_per_s",
            "scaling_replay_1m_vs_1k",
            ">= 0.80",
        ),
        (
            "http dispatch ops/s vs HTTP+pipeline floor",
            "http_dispatch_ops_per_s",
            "http_floor_ops_per_s",
            "http_dispatch_vs_floor",
            ">= 0.85",
        ),
        (
            "http relay x8 events/s vs http dispatch",
            "http_relay_events_per_s",
            "http_dispatch_ops_per_s",
            "http_relay_vs_dispatch",
            "-",
        ),
        (
            "json MB/s vs serde_json",
            "json_mb_per_s",
            "serde_json_mb_per_s",
            "json_vs_serde",
            "<= 1.5 (time)",
        ),
        (
            "cli replay ms vs --version ms",
            "cli_dispatch_replay_ms",
            "cli_version_ms",
            "cli_replay_over_version",
            "-",
        ),
    ];
    for (label, subject, baseline, ratio, target) in rows {
        println!(
            "{label:<40} {:>14.2} {:>14.2} {:>9.3}  {target}",
            f(subject),
            f(baseline),
            f(ratio)
        );
    }
    // CPU per operation (user + system, this process), steadier than wall time on a
    // shared machine: each flow against its baseline's.
    println!();
    println!(
        "{:<40} {:>14} {:>14} {:>9}  target",
        "CPU us per op", "toolledger", "baseline", "ratio"
    );
    let cpu_rows: [(&str, &str, &str, &str, &str); 8] = [
        (
            "fresh dispatch vs raw pipeline",
            "fresh_dispatch_cpu_us_per_op",
            "raw_pipeline_cpu_us_per_op",
            "cpu_fresh_vs_raw_pipeline",
            "<= 1.5",
        ),
        (
            "replay (1M ledger) vs raw unique SELECT",
            "replay_big_ledger_cpu_us_per_op",
            "raw_unique_select_cpu_us_per_op",
            "cpu_replay_vs_raw_select",
            "<= 3.0",
        ),
        (
            "peer-style dispatch vs raw 2-commit+row",
            "peer_style_dispatch_cpu_us_per_op",
            "raw2_peer_cpu_us_per_op",
            "cpu_peer_style_vs_raw2",
            "-",
        ),
        (
            "fresh, 1M vs 1K ledger",
            "fresh_1m_cpu_us_per_op",
            "fresh_1k_cpu_us_per_op",
            "cpu_fresh_1m_vs_1k",
            "-",
        ),
        (
            "relay event vs fresh dispatch",
            "relay_cpu_us_per_event",
            "fresh_dispatch_cpu_us_per_op",
            "cpu_relay_vs_fresh",
            "-",
        ),
        (
            "http dispatch vs round trip + pipeline",
            "http_dispatch_cpu_us_per_op",
            "http_floor_cpu_us_per_op",
            "cpu_http_dispatch_vs_floor",
            "-",
        ),
        (
            "8-thread op vs raw 8-thread",
            "contention_cpu_us_per_op",
            "raw_contention_cpu_us_per_op",
            "cpu_contention_vs_raw",
            "-",
        ),
        (
            "refund_order fresh: definition vs code",
            "definition_fresh_cpu_us_per_op",
            "code_defined_fresh_cpu_us_per_op",
            "cpu_definition_fresh_vs_code_defined",
            "-",
        ),
    ];
    for (label, subject, baseline, ratio, target) in cpu_rows {
        println!(
            "{label:<40} {:>14.1} {:>14.1} {:>9.3}  {target}",
            f(subject),
            f(baseline),
            f(ratio)
        );
    }
    println!();
    for (label, key) in [
        ("list page s, 1M ledger", "list_big_ledger_s"),
        ("metrics s, 1M ledger", "metrics_big_ledger_s"),
    ] {
        println!("{label:<40} {:>14.4} {:>14} {:>9}  < 1", f(key), "", "");
    }
    println!(
        "{:<40} {:>14.0} {:>14} {:>9}  >= 100000",
        "audit rows/s",
        f("audit_rows_per_s"),
        "",
        ""
    );
    println!(
        "{:<40} {:>14.0} {:>14} {:>9}",
        "status reconciliations/s",
        f("status_reconciliations_per_s"),
        "",
        ""
    );
    println!(
        "{:<40} {:>14.0} {:>14.0} {:>9}",
        "claims/s vs raw single-row commits/s",
        f("claims_per_s"),
        f("raw_commit_per_s"),
        ""
    );
    println!();
    println!(
        "{:<40} {:>14} {:>14} {:>14}",
        "validate, us per call", "input", "output", "invalid input"
    );
    for (label, tool) in VALIDATED {
        println!(
            "{label:<40} {:>14.3} {:>14.3} {:>14.3}",
            f(&format!("validate_input_us_{tool}")),
            f(&format!("validate_output_us_{tool}")),
            f(&format!("validate_invalid_input_us_{tool}")),
        );
    }
}

// ---------------------------------------------------------------------------------
// Inputs

/// The HTTP downstream of the bench: the reference service's refund endpoints.
fn http_downstream(base: &str) -> toolledger::http::HttpDownstream {
    let identity = toolledger::DownstreamIdentity::new("refunds-http", "1").unwrap();
    toolledger::http::HttpDownstream::new(identity, toolledger::http::Timeouts::default())
        .endpoint("refund_order", toolledger::http::Endpoint::refunds(base))
}

/// `count` fresh dispatches from case `first` through `ledger`, each answered `Pass`.
fn http_dispatches(
    ledger: &toolledger::Ledger<toolledger::http::HttpDownstream, NoRoles>,
    cases: &Cases,
    first: usize,
    count: usize,
) -> Rate {
    timed(count, |index| {
        let reply = ledger.dispatch_loaded(&cases.get(first + index)).unwrap();
        assert!(matches!(reply.outcome(), toolledger::Outcome::Fresh(_)), "{}", reply.package());
    })
}

/// A count a profiling run takes from the environment variable `name`, else `default`.
fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |count| count.parse().unwrap())
}

/// A ledger at `path` whose refunds go to the service at `base`.
fn http_ledger(
    path: &Path,
    base: &str,
) -> toolledger::Ledger<toolledger::http::HttpDownstream, NoRoles> {
    toolledger::Ledger::builder(path)
        .tool(toolledger::RefundOrder::default().tool())
        .open(http_downstream(base), NoRoles)
        .unwrap()
}

/// The reference service in its own process (built beside this bench by
/// `cargo xtask bench`), killed when dropped.
/// A server of this workspace in its own process, started on a free loopback port and
/// killed when dropped: the reference refund service, or `toolledger serve`.
struct Listening {
    child: std::process::Child,
    base: String,
}

impl Listening {
    /// Starts `binary` with `args` and waits for its first line, `listening on ADDR`.
    fn start(binary: &Path, args: &[&std::ffi::OsStr]) -> Listening {
        assert!(
            binary.exists(),
            "build {} in release first (cargo xtask bench does)",
            binary.display()
        );
        let mut child =
            Command::new(binary).args(args).stdout(std::process::Stdio::piped()).spawn().unwrap();
        Listening { base: toolledger_testkit::listening_base(&mut child), child }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The reference refund service on `db`, with eight threads.
struct Refundd;

impl Refundd {
    fn start(db: &Path) -> Listening {
        let exe = std::env::current_exe().unwrap();
        let binary = exe.parent().and_then(Path::parent).unwrap().join("toolledger-refundd");
        let args = ["--listen", "127.0.0.1:0", "--threads", "8", "--db"].map(std::ffi::OsStr::new);
        let mut args = args.to_vec();
        args.push(db.as_os_str());
        Listening::start(&binary, &args)
    }
}

/// `toolledger serve` on a ledger, judged at `at`.
struct Serve;

impl Serve {
    fn start(db: &Path, at: i64) -> Listening {
        let at = at.to_string();
        let mut args = ["serve", "--listen", "127.0.0.1:0", "--now", &at, "--db"]
            .map(std::ffi::OsStr::new)
            .to_vec();
        args.push(db.as_os_str());
        Listening::start(&sibling_binary("toolledger"), &args)
    }
}

fn engine(path: &Path) -> SqliteEngine<NoRoles> {
    engine_with(path, Registry::builtin())
}

/// [`engine`] with another registry.
fn engine_with(path: &Path, registry: Registry) -> SqliteEngine<NoRoles> {
    let downstream =
        Interrupt::new(StandIn::new(SqliteStore::open(path).unwrap()), Switch::default());
    Engine::new(SqliteStore::open(path).unwrap(), downstream, NoRoles, registry)
}

/// A raw connection with the store's pragmas.
fn raw(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_millis(5000)).unwrap();
    conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get::<_, String>(0)).unwrap();
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;").unwrap();
    conn
}

// ---------------------------------------------------------------------------------
// Raw baselines

fn raw_commit_rate(path: &Path, count: usize) -> f64 {
    let conn = raw(path);
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL) STRICT").unwrap();
    let mut insert = conn.prepare("INSERT INTO t (v) VALUES (?1)").unwrap();
    timed_rate(count, |index| {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        insert.execute([format!("row-{index}")]).unwrap();
        conn.execute_batch("COMMIT").unwrap();
    })
}

/// The values one operation writes, computed before any timing.
/// The raw baselines' own insert of an operation row: plain SQL on purpose, with the
/// constants a dispatch of these cases writes. Ledger rows the bench needs are written
/// by the store (`fill`).
const INSERT_OPERATION: &str = "INSERT INTO operations (tenant_id, subject_id, tool_name, idempotency_key, status_ref, \
    downstream_request_ref, request_sha256, arguments_json, input_revision, output_revision, effect_revision, \
    handler_revision, producer_revision, policy_revision, provider, api_family, adapter_revision, \
    provider_response_id, provider_call_id, operation_id, approval_id, approver_id, approval_sha256, approved_at, \
    approval_expires_at, downstream_name, downstream_revision, status, created_at, updated_at) \
    VALUES (?1, ?2, 'refund_order', ?3, ?4, ?5, ?6, ?7, \
    'refund_order.input.v2', 'refund_order.output.v2', 'refund_order.effect.v1', 'refund_order.handler.v1', \
    'toolledger.producer.v1', 'refund_order.policy.v1', 'openai', 'responses', 'openai-responses-2026-05', \
    'resp-001', ?8, 'op-001', 'appr-001', 'approver-1', ?9, 1767225500, 1767229100, 'toolledger-stand-in', '1', \
    ?10, 1767225600, 1767225600) \
    ON CONFLICT (tenant_id, subject_id, tool_name, idempotency_key) DO NOTHING";

/// One round of the pipeline comparison: the bare 4-commit pipeline on the store's own
/// tables (the same rows and transactions as a fresh dispatch, with no validation, JSON
/// or hashing) against fresh dispatch through the engine, each on its own warmed file,
/// alternating in batches so that drift in the disk hits both alike.
/// The report's pipeline rows: `settings.rounds` rounds of [`pipeline_round`], each
/// after `before(round)`; the medians of the raw pipeline's rates and of the fresh
/// dispatches'.
fn pipeline_rounds(
    work: &Work,
    cases: &Cases,
    settings: &Settings,
    mut before: impl FnMut(usize),
) -> (Rate, Rate) {
    let (mut raw_rates, mut fresh_rates) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds {
        before(round);
        let (raw_rate, fresh_rate) = pipeline_round(
            &work.file(&format!("raw-{round}")),
            &work.file(&format!("fresh-{round}")),
            cases,
            round * settings.ops,
            settings.ops,
        );
        raw_rates.push(raw_rate);
        fresh_rates.push(fresh_rate);
    }
    (Rate::median(&raw_rates), Rate::median(&fresh_rates))
}

fn pipeline_round(
    raw_path: &Path,
    fresh_path: &Path,
    cases: &Cases,
    first: usize,
    count: usize,
) -> (Rate, Rate) {
    drop(SqliteStore::open(raw_path).unwrap()); // the store's schema
    let rows: Vec<Row> = (first..first + count).map(|index| row(cases, index)).collect();
    let prepared: Vec<HostCall> = (first..first + count).map(|index| cases.get(index)).collect();
    let ledger = raw(raw_path);
    let downstream = raw(raw_path);
    let mut engine = engine(fresh_path);
    // Warm both files past their first WAL checkpoint, so neither pays for growing it.
    for index in 0..WARMUP {
        raw_operation(&ledger, &downstream, &row(cases, WARMUP_KEYS + first + index));
        engine.dispatch(&cases.get(WARMUP_KEYS + first + index), &worker()).unwrap();
    }
    const BATCH: usize = 25;
    let (mut raw_meter, mut fresh_meter) = (Meter::default(), Meter::default());
    for batch in (0..count).step_by(BATCH) {
        let end = (batch + BATCH).min(count);
        raw_meter.time(|| {
            for row in &rows[batch..end] {
                raw_operation(&ledger, &downstream, row);
            }
        });
        fresh_meter.time(|| {
            for case in &prepared[batch..end] {
                let answer = engine.dispatch(case, &worker()).unwrap();
                assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("fresh"));
            }
        });
    }
    (raw_meter.rate(count), fresh_meter.rate(count))
}

/// The raw baselines' insert of `row`'s operation with `status` under provider call
/// `call_id`; its id.
fn insert_operation(conn: &Connection, row: &Row, call_id: &str, status: &str) -> i64 {
    conn.prepare_cached(INSERT_OPERATION)
        .unwrap()
        .execute(params![
            row.scope.tenant_id.as_str(),
            row.scope.subject_id.as_str(),
            row.scope.idempotency_key.as_str(),
            row.status_ref,
            row.downstream_request_ref,
            row.request_sha256,
            row.arguments_json,
            call_id,
            row.approval_sha256,
            status
        ])
        .unwrap();
    conn.last_insert_rowid()
}

/// The dispatch call identity of an operation inserted by [`insert_operation`].
const INSERT_DISPATCH_CALL: &str = "INSERT INTO call_identities (provider, api_family, adapter_revision, \
     provider_response_id, provider_call_id, purpose, op_id, created_at) \
     VALUES ('openai', 'responses', 'openai-responses-2026-05', 'resp-001', ?1, 'dispatch', ?2, 1767225600)";

fn raw_operation(ledger: &Connection, downstream: &Connection, row: &Row) {
    // A: operation + outbox + call identity.
    ledger.execute_batch("BEGIN IMMEDIATE").unwrap();
    let call_id = format!("call-{}", row.scope.idempotency_key);
    let id = insert_operation(ledger, row, &call_id, "pending");
    ledger
        .prepare_cached("INSERT INTO outbox (op_id, state, attempt_count, next_attempt_at, attempts_before, created_at, updated_at) VALUES (?1, 'pending', 0, 1767225600, 0, 1767225600, 1767225600)")
        .unwrap()
        .execute([id])
        .unwrap();
    ledger.prepare_cached(INSERT_DISPATCH_CALL).unwrap().execute(params![call_id, id]).unwrap();
    ledger.execute_batch("COMMIT").unwrap();
    // Claim.
    ledger.execute_batch("BEGIN IMMEDIATE").unwrap();
    ledger
        .prepare_cached("UPDATE outbox SET state = 'processing', lease_owner = 'w', lease_until = 1767225630, next_attempt_at = 1767225630, attempt_count = attempt_count + 1 WHERE op_id = ?1")
        .unwrap()
        .execute([id])
        .unwrap();
    ledger
        .prepare_cached("UPDATE operations SET status = 'processing' WHERE id = ?1")
        .unwrap()
        .execute([id])
        .unwrap();
    ledger.execute_batch("COMMIT").unwrap();
    // B: the downstream's own commit.
    downstream.execute_batch("BEGIN IMMEDIATE").unwrap();
    downstream
        .prepare_cached(
            "INSERT INTO downstream_receipts (downstream_request_ref, request_sha256, receipt_ref, receipt_json, created_at) \
             VALUES (?1, ?2, ?3, ?4, 1767225600) ON CONFLICT (downstream_request_ref) DO NOTHING",
        )
        .unwrap()
        .execute(params![row.downstream_request_ref, row.request_sha256, row.receipt_ref, row.receipt_json])
        .unwrap();
    downstream.execute_batch("COMMIT").unwrap();
    raw_commit_c(ledger, id, row);
}

/// The raw pipeline's commit C: local receipt + succeeded + delivered.
fn raw_commit_c(ledger: &Connection, id: i64, row: &Row) {
    ledger.execute_batch("BEGIN IMMEDIATE").unwrap();
    ledger
        .prepare_cached(
            "INSERT INTO local_receipts (op_id, downstream_request_ref, receipt_ref, receipt_json, output_json, result_sha256, \
             finalized_by, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'worker', 1767225600)",
        )
        .unwrap()
        .execute(params![id, row.downstream_request_ref, row.receipt_ref, row.receipt_json, row.output_json, row.result_sha256])
        .unwrap();
    ledger
        .prepare_cached("UPDATE operations SET status = 'succeeded' WHERE id = ?1")
        .unwrap()
        .execute([id])
        .unwrap();
    ledger
        .prepare_cached("UPDATE outbox SET state = 'delivered' WHERE op_id = ?1")
        .unwrap()
        .execute([id])
        .unwrap();
    ledger.execute_batch("COMMIT").unwrap();
}

/// Random unique-key lookups of operations rows by scope on the big ledger.
fn raw_select(path: &Path, rows: usize, count: usize) -> Rate {
    let conn = raw(path);
    let mut select = conn
        .prepare(
            "SELECT id, status_ref, request_sha256, arguments_json, status FROM operations \
             WHERE tenant_id = ?1 AND subject_id = ?2 AND tool_name = ?3 AND idempotency_key = ?4",
        )
        .unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let keys: Vec<String> = (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            format!("fill-{}", state % rows as u64)
        })
        .collect();
    timed(count, |index| {
        let found: i64 = select
            .query_row(params!["tenant-a", "user-1", "refund_order", keys[index]], |row| row.get(0))
            .unwrap();
        std::hint::black_box(found);
    })
}

/// `count` finished operations under keys `fill-<n>`, loaded through the store's own
/// statements (`SqliteStore::load_finished`) in transactions of 20,000, while another
/// thread builds the next chunk.
fn fill(path: &Path, cases: &Cases, count: usize) {
    fill_keys(path, cases, (0..count).map(|index| format!("fill-{index}")).collect());
}

/// `count` finished operations under keys `audit-<n>`, for the audit.
fn fill_valid(path: &Path, cases: &Cases, count: usize) {
    fill_keys(path, cases, (0..count).map(|index| format!("audit-{index}")).collect());
}

fn fill_keys(path: &Path, cases: &Cases, keys: Vec<String>) {
    const CHUNK: usize = 20_000;
    let mut store = SqliteStore::open(path).unwrap();
    let now = cases.base.clock.now;
    let (send, receive) = std::sync::mpsc::sync_channel(1);
    thread::scope(|scope| {
        scope.spawn(move || {
            for chunk in keys.chunks(CHUNK) {
                let built: Vec<_> = chunk.iter().map(|key| finished(cases, key)).collect();
                send.send(built).unwrap();
            }
        });
        for built in receive {
            assert_eq!(store.load_finished(&built, now).unwrap(), built.len());
        }
    });
}

// ---------------------------------------------------------------------------------
// toolledger

fn fresh_dispatch(path: &Path, cases: &Cases, first: usize, count: usize) -> Rate {
    let prepared: Vec<HostCall> = (first..first + count).map(|index| cases.get(index)).collect();
    let mut engine = engine(path);
    for index in 0..WARMUP {
        engine.dispatch(&cases.get(WARMUP_KEYS + first + index), &worker()).unwrap();
    }
    timed(count, |index| {
        let answer = engine.dispatch(&prepared[index], &worker()).unwrap();
        assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("fresh"));
    })
}

/// Dispatches `count` cases from `first`, each stopped at `failure`; their status refs.
/// `None` stops right after commit A (`enqueue`); a point, where the drill stops it.
fn stopped(
    engine: &mut SqliteEngine<NoRoles>,
    cases: &Cases,
    first: usize,
    count: usize,
    failure: Option<FailurePoint>,
) -> Vec<String> {
    (first..first + count)
        .map(|index| {
            let answer = match failure {
                None => engine.enqueue(&cases.get(index)).unwrap(),
                Some(point) => {
                    engine.downstream().switch().arm(point);
                    engine.dispatch(&cases.get(index), &worker()).unwrap()
                }
            };
            answer.package()["status_ref"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn replay(engine: &mut SqliteEngine<NoRoles>, cases: &Cases, keys: usize, count: usize) -> Rate {
    let prepared: Vec<HostCall> = (0..keys).map(|index| cases.get(index)).collect();
    timed(count, |index| {
        let answer = engine.dispatch(&prepared[index % keys], &worker()).unwrap();
        assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("local_replay"));
    })
}

/// 8 threads, each with its own engine, dispatching distinct keys into one file.
fn contention(path: &Path, cases: &Cases, first: usize, per_thread: usize) -> Contention {
    drop(engine(path));
    let prepared: Vec<Vec<HostCall>> = (0..8)
        .map(|thread| {
            (0..per_thread).map(|index| cases.get(first + thread * per_thread + index)).collect()
        })
        .collect();
    let engines: Vec<std::sync::Mutex<SqliteEngine<NoRoles>>> =
        (0..8).map(|_| std::sync::Mutex::new(engine(path))).collect();
    let shared = Arc::new((prepared, engines));
    let observer = SqliteStore::open(path).unwrap();
    let before = observer.group_commits();
    let mut measured = threads(per_thread, move |thread, index| {
        let (prepared, engines) = &*shared;
        let mut engine = engines[thread].lock().unwrap();
        let answer = engine.dispatch(&prepared[thread][index], &worker()).unwrap();
        assert_eq!(answer.code(), "OK");
    });
    let after = observer.group_commits();
    measured.batches = (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64;
    measured
}

/// 8 threads, each with its own raw connections, running the bare pipeline with
/// nothing but `busy_timeout` between them.
fn raw_contention(path: &Path, cases: &Cases, first: usize, per_thread: usize) -> Contention {
    drop(SqliteStore::open(path).unwrap());
    let rows: Vec<Vec<Row>> = (0..8)
        .map(|thread| {
            (0..per_thread).map(|index| row(cases, first + thread * per_thread + index)).collect()
        })
        .collect();
    let connections: Vec<std::sync::Mutex<(Connection, Connection)>> =
        (0..8).map(|_| std::sync::Mutex::new((raw(path), raw(path)))).collect();
    let shared = Arc::new((rows, connections));
    threads(per_thread, move |thread, index| {
        let (rows, connections) = &*shared;
        let pair = connections[thread].lock().unwrap();
        raw_operation(&pair.0, &pair.1, &rows[thread][index]);
    })
}

// ---------------------------------------------------------------------------------
// Tools as data

/// The tools whose validation is timed: the table's label, and the key suffix.
const VALIDATED: [(&str, &str); 4] = [
    ("refund_order (definition)", "refund_order_definition"),
    ("refund_order (code-defined table)", "refund_order_table"),
    ("send_invoice_email (definition)", "send_invoice_email"),
    ("open_ticket (definition)", "open_ticket"),
];

/// A registry of `refund_order` alone, as `tool`, with the built-in profiles: the two
/// sides of the comparison differ in nothing else.
fn refund_registry(tool: ToolSpec) -> Registry {
    Registry::new(vec![tool], builtin_profiles())
}

/// Runs `a` and `b` over `0..count` in alternating batches of `batch` (`a` first in even
/// batches, `b` in odd ones), each side's time summed on its own; their rates.
fn alternating(
    count: usize,
    batch: usize,
    mut a: impl FnMut(usize),
    mut b: impl FnMut(usize),
) -> (Rate, Rate) {
    let run = |meter: &mut Meter, each: &mut dyn FnMut(usize), range: std::ops::Range<usize>| {
        meter.time(|| range.for_each(each));
    };
    let (mut a_meter, mut b_meter) = (Meter::default(), Meter::default());
    for (turn, start) in (0..count).step_by(batch).enumerate() {
        let range = start..(start + batch).min(count);
        if turn % 2 == 0 {
            run(&mut a_meter, &mut a, range.clone());
            run(&mut b_meter, &mut b, range);
        } else {
            run(&mut b_meter, &mut b, range.clone());
            run(&mut a_meter, &mut a, range);
        }
    }
    (a_meter.rate(count), b_meter.rate(count))
}

/// `refund_order` through its definition against the code-defined tool: fresh dispatch
/// (`2 × rounds` rounds, each side on its own fresh, warmed file per round, the same
/// cases, alternating in batches of 25) and replay (each side on its own ledger of `ops`
/// operations, `20 × ops` replays a round, alternating in batches of 100); the median
/// round of each side, and each round's ratio. Then the cost of one schema validation
/// per tool.
fn tools_as_data(
    work: &Work,
    cases: &Cases,
    settings: &Settings,
    put: &mut impl FnMut(&str, Value),
) {
    println!(
        "tools as data: refund_order's definition vs the code-defined tool, fresh dispatch \
         ({} rounds x {} ops) and replay ({} rounds x {} replays)",
        settings.rounds * 2,
        settings.ops,
        settings.rounds,
        settings.ops * 20
    );
    let definition = || refund_registry(RefundOrder::default().tool());
    let code = || refund_registry(RefundOrder::default().code_defined());
    assert!(matches!(definition().tools()[0].input, toolledger_contract::Schema::Json { .. }));
    assert!(matches!(code().tools()[0].input, toolledger_contract::Schema::Fields(_)));
    let fresh = |engine: &mut SqliteEngine<NoRoles>, case: &HostCall| {
        let answer = engine.dispatch(case, &worker()).unwrap();
        assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("fresh"));
    };
    // Twice the report's rounds: a fresh dispatch is a few fsyncs, and one slow fsync
    // moves a round by a few percent, more than the target's margin.
    let (mut definition_fresh, mut code_fresh) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds * 2 {
        let first = 2_000_000 + round * settings.ops;
        let mut by_definition =
            engine_with(&work.file(&format!("tools-definition-{round}")), definition());
        let mut by_code = engine_with(&work.file(&format!("tools-code-{round}")), code());
        for index in 0..WARMUP {
            let case = cases.get(WARMUP_KEYS + first + index);
            fresh(&mut by_definition, &case);
            fresh(&mut by_code, &case);
        }
        let prepared: Vec<HostCall> =
            (first..first + settings.ops).map(|index| cases.get(index)).collect();
        let (a, b) = alternating(
            settings.ops,
            25,
            |index| fresh(&mut by_definition, &prepared[index]),
            |index| fresh(&mut by_code, &prepared[index]),
        );
        definition_fresh.push(a);
        code_fresh.push(b);
    }
    // Each round's own ratio too: how far apart the rounds are is how far the medians'
    // ratio may be trusted on a noisy disk.
    put("definition_fresh_round_ratios", json!(ratios(&definition_fresh, &code_fresh)));
    let (definition_fresh, code_fresh) =
        (Rate::median(&definition_fresh), Rate::median(&code_fresh));
    put("definition_fresh_ops_per_s", json!(definition_fresh.per_s));
    put("code_defined_fresh_ops_per_s", json!(code_fresh.per_s));
    put("definition_fresh_vs_code_defined", json!(definition_fresh.per_s / code_fresh.per_s));
    put("definition_fresh_cpu_us_per_op", json!(definition_fresh.cpu_us));
    put("code_defined_fresh_cpu_us_per_op", json!(code_fresh.cpu_us));
    put("cpu_definition_fresh_vs_code_defined", json!(definition_fresh.cpu_us / code_fresh.cpu_us));

    let keys = settings.ops;
    let mut by_definition = engine_with(&work.file("tools-replay-definition"), definition());
    let mut by_code = engine_with(&work.file("tools-replay-code"), code());
    let prepared: Vec<HostCall> = (0..keys).map(|index| cases.get(index)).collect();
    for case in &prepared {
        fresh(&mut by_definition, case);
        fresh(&mut by_code, case);
    }
    let replayed = |engine: &mut SqliteEngine<NoRoles>, case: &HostCall| {
        let answer = engine.dispatch(case, &worker()).unwrap();
        assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("local_replay"));
    };
    let (mut definition_replay, mut code_replay) = (Vec::new(), Vec::new());
    for _ in 0..settings.rounds {
        let (a, b) = alternating(
            settings.ops * 20,
            100,
            |index| replayed(&mut by_definition, &prepared[index % keys]),
            |index| replayed(&mut by_code, &prepared[index % keys]),
        );
        definition_replay.push(a);
        code_replay.push(b);
    }
    put("definition_replay_round_ratios", json!(ratios(&definition_replay, &code_replay)));
    let (definition_replay, code_replay) =
        (Rate::median(&definition_replay), Rate::median(&code_replay));
    put("definition_replay_per_s", json!(definition_replay.per_s));
    put("code_defined_replay_per_s", json!(code_replay.per_s));
    put("definition_replay_vs_code_defined", json!(definition_replay.per_s / code_replay.per_s));
    put("definition_replay_cpu_us_per_op", json!(definition_replay.cpu_us));
    put("code_defined_replay_cpu_us_per_op", json!(code_replay.cpu_us));
    drop((by_definition, by_code));

    println!(
        "tools as data: one validation per tool ({} rounds x {} calls)",
        settings.rounds, settings.validations
    );
    let validated = validated(cases);
    let mut samples = vec![[Vec::new(), Vec::new(), Vec::new()]; validated.len()];
    // Each round times every tool's three loops in turn, so drift hits all alike.
    for _ in 0..settings.rounds {
        for (tool, samples) in validated.iter().zip(&mut samples) {
            for (sample, us) in samples.iter_mut().zip(validations(tool, settings.validations)) {
                sample.push(us);
            }
        }
    }
    for ((_, key), [input, output, invalid]) in VALIDATED.iter().zip(samples) {
        put(&format!("validate_input_us_{key}"), json!(median(input)));
        put(&format!("validate_output_us_{key}"), json!(median(output)));
        put(&format!("validate_invalid_input_us_{key}"), json!(median(invalid)));
    }
    put("validate_calls_per_loop", json!(settings.validations));

    // The facade's door on a call's arguments (`refund_order`'s valid ones), against
    // the clone of them the facade made before it had a door: what the door adds to
    // every call of the facade's API, taking turns in each round.
    let arguments = &validated[0].valid;
    let (mut door, mut clone) = (Vec::new(), Vec::new());
    for _ in 0..settings.rounds {
        door.push(validate_us(settings.validations, || {
            toolledger::door::admit(std::hint::black_box(arguments)).is_ok()
        }));
        clone.push(validate_us(settings.validations, || {
            std::hint::black_box(arguments.clone()).is_object()
        }));
    }
    let (door, clone) = (median(door), median(clone));
    put("door_admit_us", json!(door));
    put("arguments_clone_us", json!(clone));
    put("door_admit_vs_clone", json!(door / clone));
}

/// Replays in one turn of the traces rows: the SDK batch processor's own export batch
/// (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, 512 by default), so each turn's flush exports what
/// the processor would have exported at once, rather than a fraction of it.
#[cfg(feature = "otel")]
const REPLAY_TURN: usize = 512;

/// Calls through the facade's `Ledger` (`dispatch_loaded` of the report's cases, on the
/// simulation) with its spans on against off: on, a provider of the OpenTelemetry SDK
/// whose batch processor exports every span (to its in-memory exporter), flushed at the
/// end of each of its batches so the export is timed with the calls that made it; off,
/// no provider (the API's no-op). Fresh: `2 × rounds` rounds, each side on its own new,
/// warmed file, alternating in batches of 25; replay: one ledger a side of `ops`
/// operations, `20 × ops` replays a round alternating in turns of [`REPLAY_TURN`].
/// Medians.
#[cfg(feature = "otel")]
fn traces_on_off(
    work: &Work,
    cases: &Cases,
    settings: &Settings,
    put: &mut impl FnMut(&str, Value),
) {
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    println!(
        "traces: spans on vs off through the facade, fresh ({} rounds x {} ops) and replay \
         ({} rounds x {} replays)",
        settings.rounds * 2,
        settings.ops,
        settings.rounds,
        settings.ops * 20
    );
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter.clone()).build();
    let switch = |on: bool| {
        if on {
            opentelemetry::global::set_tracer_provider(provider.clone());
        } else {
            opentelemetry::global::set_tracer_provider(
                opentelemetry::trace::noop::NoopTracerProvider::new(),
            );
        }
    };
    let ledger = |name: &str| {
        toolledger::Ledger::builder(work.file(name))
            .tool(RefundOrder::default().tool())
            .open_simulated(NoRoles)
            .unwrap()
    };
    let call = |ledger: &toolledger::Ledger<toolledger::Simulated, NoRoles>, case: &HostCall| {
        ledger.dispatch_loaded(case).unwrap().outcome().clone()
    };
    // Both sides' batches, turn about: `on` first in even turns. Each batch's provider is
    // set before it is timed; `on`'s batch ends with its spans exported.
    let turns = |count: usize, batch: usize, each: &mut dyn FnMut(bool, usize)| {
        let (mut on_meter, mut off_meter) = (Meter::default(), Meter::default());
        for (turn, start) in (0..count).step_by(batch).enumerate() {
            let range = start..(start + batch).min(count);
            for on in [turn % 2 == 0, turn % 2 != 0] {
                switch(on);
                let meter = if on { &mut on_meter } else { &mut off_meter };
                meter.time(|| {
                    range.clone().for_each(|index| each(on, index));
                    if on {
                        provider.force_flush().unwrap();
                    }
                });
            }
        }
        let exported = exporter.get_finished_spans().unwrap().len();
        assert!(exported >= count, "the spans on were exported: {exported} for {count} calls");
        exporter.reset();
        (on_meter.rate(count), off_meter.rate(count))
    };
    let (mut on_fresh, mut off_fresh) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds * 2 {
        let first = 4_000_000 + round * settings.ops;
        let (on_ledger, off_ledger) =
            (ledger(&format!("traces-on-{round}")), ledger(&format!("traces-off-{round}")));
        switch(false);
        for index in 0..WARMUP {
            let case = cases.get(WARMUP_KEYS + first + index);
            call(&on_ledger, &case);
            call(&off_ledger, &case);
        }
        let prepared: Vec<HostCall> =
            (first..first + settings.ops).map(|index| cases.get(index)).collect();
        let (on, off) = turns(settings.ops, 25, &mut |on, index| {
            let ledger = if on { &on_ledger } else { &off_ledger };
            assert!(matches!(call(ledger, &prepared[index]), toolledger::Outcome::Fresh(_)));
        });
        on_fresh.push(on);
        off_fresh.push(off);
    }
    let keys = settings.ops;
    let (on_ledger, off_ledger) = (ledger("traces-replay-on"), ledger("traces-replay-off"));
    let prepared: Vec<HostCall> = (0..keys).map(|index| cases.get(index)).collect();
    switch(false);
    for case in &prepared {
        call(&on_ledger, case);
        call(&off_ledger, case);
    }
    let (mut on_replay, mut off_replay) = (Vec::new(), Vec::new());
    for _ in 0..settings.rounds {
        let (on, off) = turns(settings.ops * 20, REPLAY_TURN, &mut |on, index| {
            let ledger = if on { &on_ledger } else { &off_ledger };
            let replayed = call(ledger, &prepared[index % keys]);
            assert!(matches!(replayed, toolledger::Outcome::Replayed(_)));
        });
        on_replay.push(on);
        off_replay.push(off);
    }
    switch(false);
    put("traces_fresh_round_ratios", json!(ratios(&on_fresh, &off_fresh)));
    put("traces_replay_round_ratios", json!(ratios(&on_replay, &off_replay)));
    for (name, on, off) in [("fresh", on_fresh, off_fresh), ("replay", on_replay, off_replay)] {
        let (on, off) = (Rate::median(&on), Rate::median(&off));
        put(&format!("traces_on_{name}_per_s"), json!(on.per_s));
        put(&format!("traces_off_{name}_per_s"), json!(off.per_s));
        put(&format!("traces_on_{name}_cpu_us_per_op"), json!(on.cpu_us));
        put(&format!("traces_off_{name}_cpu_us_per_op"), json!(off.cpu_us));
        put(&format!("traces_{name}_on_vs_off"), json!(on.per_s / off.per_s));
    }
}

/// Each round's `subject / baseline`, to three decimals.
fn ratios(subject: &[Rate], baseline: &[Rate]) -> Vec<f64> {
    subject
        .iter()
        .zip(baseline)
        .map(|(a, b)| (a.per_s / b.per_s * 1000.0).round() / 1000.0)
        .collect()
}

/// One tool of the validation figures: the tool, representative valid arguments, an
/// output of them that keeps its bindings, and arguments that break one rule.
struct Validated {
    tool: ToolSpec,
    valid: Value,
    output: Value,
    invalid: Value,
}

/// The tools of [`VALIDATED`], in its order, each checked once before any timing.
fn validated(cases: &Cases) -> Vec<Validated> {
    let arguments = cases.base.proposal.arguments.clone();
    let output = json!({"refund_id": format!("rf_{}", "0a".repeat(16)), "order_id": arguments["order_id"],
        "amount_minor": arguments["amount_minor"], "currency": arguments["currency"], "status": "refunded"});
    let mut invalid_refund = arguments.clone();
    invalid_refund["currency"] = json!("usd");
    let load = |name: &str| {
        let path = toolledger_bench::workspace().join(format!("fixtures/tools/{name}.toml"));
        toolledger::load_tool(&path).unwrap().tool()
    };
    let invoice = json!({"invoice_id": "inv_2041", "to": "ada@example.com",
        "cc": ["books@example.com"], "attach_pdf": true,
        "customer": {"customer_id": "cust-7", "name": "Ada L."}});
    let mut invalid_invoice = invoice.clone();
    invalid_invoice["to"] = json!("not an address");
    let ticket = json!({"queue": "billing", "summary": "refund not received", "priority": "high"});
    let mut invalid_ticket = ticket.clone();
    invalid_ticket["priority"] = json!("urgent");
    let all = vec![
        Validated {
            tool: RefundOrder::default().tool(),
            valid: arguments.clone(),
            output: output.clone(),
            invalid: invalid_refund.clone(),
        },
        Validated {
            tool: RefundOrder::default().code_defined(),
            valid: arguments,
            output,
            invalid: invalid_refund,
        },
        Validated {
            tool: load("send_invoice_email"),
            output: json!({"message_id": format!("msg_{}", "0b".repeat(16)),
                "invoice_id": invoice["invoice_id"], "to": invoice["to"], "status": "sent"}),
            valid: invoice,
            invalid: invalid_invoice,
        },
        Validated {
            tool: load("open_ticket"),
            output: json!({"ticket_id": format!("tk_{}", "0c".repeat(16)),
                "queue": ticket["queue"], "priority": ticket["priority"], "state": "open"}),
            valid: ticket,
            invalid: invalid_ticket,
        },
    ];
    for (tool, (label, _)) in all.iter().zip(VALIDATED) {
        tool.tool.input.validate(&tool.valid, None).unwrap_or_else(|err| panic!("{label}: {err}"));
        tool.tool
            .output
            .validate(&tool.output, Some(&tool.valid))
            .unwrap_or_else(|err| panic!("{label}: {err}"));
        assert!(tool.tool.input.validate(&tool.invalid, None).is_err(), "{label}");
    }
    all
}

/// Microseconds per call of `tool`'s input validation of its valid arguments, output
/// validation with those arguments' bindings, and input validation of its invalid
/// arguments, each a loop of `calls` calls.
fn validations(tool: &Validated, calls: usize) -> [f64; 3] {
    use std::hint::black_box;
    let (input, output) = (&tool.tool.input, &tool.tool.output);
    [
        validate_us(calls, || input.validate(black_box(&tool.valid), None).is_ok()),
        validate_us(calls, || output.validate(black_box(&tool.output), Some(&tool.valid)).is_ok()),
        validate_us(calls, || input.validate(black_box(&tool.invalid), None).is_err()),
    ]
}

/// Microseconds per call of `check` (which must answer true) over `calls` calls.
fn validate_us(calls: usize, mut check: impl FnMut() -> bool) -> f64 {
    use std::hint::black_box;
    let started = Instant::now();
    for _ in 0..calls {
        assert!(black_box(check()));
    }
    started.elapsed().as_secs_f64() * 1e6 / calls as f64
}

// ---------------------------------------------------------------------------------
// JSON and the CLI

fn json_corpus(rounds: usize) -> (f64, f64) {
    let inputs: Vec<Vec<u8>> = corpus().into_iter().map(|(_, input)| input).collect();
    let bytes: usize = inputs.iter().map(Vec::len).sum();
    let passes = 30;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        for _ in 0..passes {
            for input in &inputs {
                let value = parse_strict(std::hint::black_box(input), &Limits::default()).unwrap();
                std::hint::black_box(canonicalize(&value));
            }
        }
        ours.push((bytes * passes) as f64 / 1e6 / started.elapsed().as_secs_f64());
        let started = Instant::now();
        for _ in 0..passes {
            for input in &inputs {
                let value: Value = serde_json::from_slice(std::hint::black_box(input)).unwrap();
                std::hint::black_box(serde_json::to_vec(&value).unwrap());
            }
        }
        theirs.push((bytes * passes) as f64 / 1e6 / started.elapsed().as_secs_f64());
    }
    (median(ours), median(theirs))
}

/// Median wall time (ms) of: `toolledger dispatch` on the replay path of a warm store;
/// `toolledger --version` (the same process start and argument parsing, no I/O); and
/// spawning `true` (the cost of a process at all).
fn cli(work: &Work, runs: usize) -> (f64, f64, f64) {
    let binary = &sibling_binary("toolledger");
    let db = work.file("cli");
    let case = work.path().join("case.json");
    std::fs::write(&case, CASE).unwrap();
    let dispatch = || {
        Command::new(binary)
            .arg("--db")
            .arg(&db)
            .arg("--fixture")
            .arg(&case)
            .arg("dispatch")
            .output()
            .unwrap()
    };
    assert!(dispatch().status.success());
    let time = |mut command: Box<dyn FnMut()>| {
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let started = Instant::now();
            command();
            samples.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        median(samples)
    };
    let mut replay_samples = Vec::new();
    let mut version_samples = Vec::new();
    let mut true_samples = Vec::new();
    // Interleave the three so drift hits each alike.
    for _ in 0..3 {
        replay_samples.push(time(Box::new(|| assert!(dispatch().status.success()))));
        version_samples.push(time(Box::new(move || {
            assert!(Command::new(binary).arg("--version").output().unwrap().status.success());
        })));
        true_samples.push(time(Box::new(|| {
            assert!(Command::new("true").output().unwrap().status.success());
        })));
    }
    (median(replay_samples), median(version_samples), median(true_samples))
}

// ---------------------------------------------------------------------------------
// A peer-style downstream, and processes

/// A peer-style downstream: one row per refund in its own SQLite file, WAL with
/// `synchronous=NORMAL` (each commit reaches the OS, not the disk), keyed by the request
/// ref — what a lighter ledger keeps. Its refund is a pure function of the request, so a
/// lookup recomputes the receipt of a row it finds.
struct Peer {
    conn: Connection,
    identity: toolledger::DownstreamIdentity,
}

impl Peer {
    fn open(path: &Path) -> Peer {
        let conn = Connection::open(path).unwrap();
        conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get::<_, String>(0)).unwrap();
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL; CREATE TABLE IF NOT EXISTS refunds \
             (request_ref TEXT PRIMARY KEY, receipt_json TEXT NOT NULL) STRICT",
        )
        .unwrap();
        let identity = toolledger::DownstreamIdentity::new("peer-style", "1").unwrap();
        Peer { conn, identity }
    }

    /// The peer's one write: its row, in its own autocommit transaction.
    fn insert(&self, request_ref: &str, receipt_json: &str) {
        self.conn
            .prepare_cached(
                "INSERT INTO refunds (request_ref, receipt_json) VALUES (?1, ?2) \
                 ON CONFLICT (request_ref) DO NOTHING",
            )
            .unwrap()
            .execute(params![request_ref, receipt_json])
            .unwrap();
    }
}

impl toolledger_engine::Downstream for Peer {
    fn identity(&self) -> &toolledger::DownstreamIdentity {
        &self.identity
    }

    fn execute(
        &self,
        request: &toolledger_engine::DownstreamRequest,
        _now: toolledger_store::Now,
    ) -> Result<toolledger_store::DownstreamReceipt, toolledger_engine::DownstreamError> {
        let receipt = toolledger_engine::simulated_refund(request);
        self.insert(receipt.downstream_request_ref.as_str(), &receipt.receipt_json);
        Ok(receipt)
    }

    fn lookup(
        &self,
        request: &toolledger_engine::DownstreamRequest,
    ) -> Result<toolledger_engine::Lookup, toolledger_engine::DownstreamError> {
        let found: Option<String> = self
            .conn
            .query_row(
                "SELECT request_ref FROM refunds WHERE request_ref = ?1",
                [request.downstream_request_ref.as_str()],
                |row| row.get(0),
            )
            .ok();
        Ok(match found {
            Some(_) => {
                toolledger_engine::Lookup::Done(toolledger_engine::simulated_refund(request))
            }
            None => toolledger_engine::Lookup::NotFound,
        })
    }
}

/// The bare 2-commit pipeline with a peer downstream: A and the claim in one FULL
/// commit, the peer's row, then C in one FULL commit.
fn raw_fused_operation(ledger: &Connection, peer: &Peer, row: &Row) {
    ledger.execute_batch("BEGIN IMMEDIATE").unwrap();
    let call_id = format!("call-{}", row.scope.idempotency_key);
    let id = insert_operation(ledger, row, &call_id, "processing");
    ledger
        .prepare_cached("INSERT INTO outbox (op_id, state, lease_owner, lease_until, attempt_count, next_attempt_at, attempts_before, created_at, updated_at) VALUES (?1, 'processing', 'w', 1767225630, 1, 1767225630, 0, 1767225600, 1767225600)")
        .unwrap()
        .execute([id])
        .unwrap();
    ledger.prepare_cached(INSERT_DISPATCH_CALL).unwrap().execute(params![call_id, id]).unwrap();
    ledger.execute_batch("COMMIT").unwrap();
    peer.insert(&row.downstream_request_ref, &row.receipt_json);
    raw_commit_c(ledger, id, row);
}

/// One round of the peer-style comparison: the bare 2-commit pipeline + the peer's row
/// against fresh dispatch with the peer as its downstream, each on its own warmed files,
/// alternating in batches.
fn peer_round(
    work: &Work,
    round: usize,
    cases: &Cases,
    first: usize,
    count: usize,
) -> (Rate, Rate) {
    let raw_path = work.file(&format!("raw2-{round}"));
    drop(SqliteStore::open(&raw_path).unwrap());
    let rows: Vec<Row> = (first..first + count).map(|index| row(cases, index)).collect();
    let prepared: Vec<HostCall> = (first..first + count).map(|index| cases.get(index)).collect();
    let ledger = raw(&raw_path);
    let raw_peer = Peer::open(&work.file(&format!("raw2-peer-{round}")));
    let mut engine = Engine::new(
        SqliteStore::open(&work.file(&format!("peer-{round}"))).unwrap(),
        Peer::open(&work.file(&format!("peer-peer-{round}"))),
        NoRoles,
        Registry::builtin(),
    );
    for index in 0..WARMUP {
        raw_fused_operation(&ledger, &raw_peer, &row(cases, WARMUP_KEYS + first + index));
        engine.dispatch(&cases.get(WARMUP_KEYS + first + index), &worker()).unwrap();
    }
    const BATCH: usize = 25;
    let (mut raw_meter, mut peer_meter) = (Meter::default(), Meter::default());
    for batch in (0..count).step_by(BATCH) {
        let end = (batch + BATCH).min(count);
        raw_meter.time(|| {
            for row in &rows[batch..end] {
                raw_fused_operation(&ledger, &raw_peer, row);
            }
        });
        peer_meter.time(|| {
            for case in &prepared[batch..end] {
                let answer = engine.dispatch(case, &worker()).unwrap();
                assert_eq!(answer.delivery().map(|delivery| delivery.as_str()), Some("fresh"));
            }
        });
    }
    (raw_meter.rate(count), peer_meter.rate(count))
}

/// Eight processes (this bench, started with `--child`), each dispatching `per_process`
/// distinct keys into the file at `path` (`mode` "dispatch"), or running the bare
/// pipeline with its own connections (`mode` "raw"), released together once all are
/// ready; their latencies and the wall time from the release to the last answer.
fn processes(mode: &str, path: &Path, first: usize, per_process: usize) -> Contention {
    use std::io::{BufRead, BufReader, Write};
    let cases = Cases::new();
    // The schema, and the file warmed past its first checkpoint.
    if mode == "raw" {
        drop(SqliteStore::open(path).unwrap());
        let (ledger, downstream) = (raw(path), raw(path));
        for index in 0..WARMUP {
            raw_operation(&ledger, &downstream, &row(&cases, WARMUP_KEYS + first + index));
        }
    } else {
        let mut warm = engine(path);
        for index in 0..WARMUP {
            warm.dispatch(&cases.get(WARMUP_KEYS + first + index), &worker()).unwrap();
        }
    }
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<std::process::Child> = (0..8)
        .map(|process| {
            Command::new(&exe)
                .arg("--child")
                .arg(mode)
                .arg(path)
                .arg((first + process * per_process).to_string())
                .arg(per_process.to_string())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut readers: Vec<_> = children
        .iter_mut()
        .map(|child| {
            let mut reader = BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "ready");
            reader
        })
        .collect();
    let started = Instant::now();
    for child in &mut children {
        writeln!(child.stdin.take().unwrap(), "go").unwrap();
    }
    let mut latencies = Vec::new();
    for (child, reader) in children.iter_mut().zip(&mut readers) {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let done: Value = serde_json::from_str(&line).unwrap();
        latencies
            .extend(done["latencies_ms"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()));
        assert!(child.wait().unwrap().success());
    }
    Contention::from(&mut latencies, started.elapsed().as_secs_f64())
}

/// A worker process of [`processes`]: `MODE PATH FIRST COUNT`. Prepares everything,
/// says `ready`, waits for a line on stdin, works, and prints its latencies as JSON.
fn child_main(args: &[String]) {
    use std::io::{BufRead, Write};
    let [mode, path, first, count] = args else { panic!("--child MODE PATH FIRST COUNT") };
    let (path, first, count) = (Path::new(path), first.parse().unwrap(), count.parse().unwrap());
    let cases = Cases::new();
    let mut work: Box<dyn FnMut(usize)> = if mode == "raw" {
        let rows: Vec<Row> = (first..first + count).map(|index| row(&cases, index)).collect();
        let (ledger, downstream) = (raw(path), raw(path));
        Box::new(move |index| raw_operation(&ledger, &downstream, &rows[index]))
    } else {
        let prepared: Vec<HostCall> =
            (first..first + count).map(|index| cases.get(index)).collect();
        let mut engine = engine(path);
        Box::new(move |index| {
            let answer = engine.dispatch(&prepared[index], &worker()).unwrap();
            assert_eq!(answer.code(), "OK");
        })
    };
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go).unwrap();
    let latencies: Vec<f64> = (0..count)
        .map(|index| {
            let started = Instant::now();
            work(index);
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    println!("{}", json!({ "latencies_ms": latencies }));
}
