//! `cargo xtask bench mcp`: the MCP gateway's own cost per call, against the same call
//! made directly to the upstream over the same transport, in the same run.
//!
//! The client is rmcp's (the official Rust SDK), so the client's own cost is small and
//! equal on both sides. The upstream is the tests' payments server on the official
//! Python SDK (`crates/mcp/tests/peers/payments.py`): each `create_payment` commits a row
//! to its SQLite file. Four figures, alternating in rounds, medians reported:
//!
//! - `upstream_direct_ms`: `create_payment` over stdio to the upstream itself;
//! - `gateway_floor_ms`: a call the gateway answers alone (`toolledger_status` with a
//!   malformed ref): the host↔gateway hop;
//! - `gateway_fresh_ms`: a new key through `toolledger mcp` (commit A, claim, the
//!   upstream call, commit C);
//! - `gateway_replay_ms`: the same key again: the stored result, no upstream call;
//!
//! and the ledger's own fresh cost, measured the way a Rust host embedding the library
//! would pay it: `library_fresh_ms`, the facade's `dispatch` of the same tool in this
//! process, its `Downstream` calling the same upstream (a second instance on its own
//! state file) over the same transport. `ledger_fresh_ms`, that minus
//! `upstream_direct_ms`, is the ledger's own cost on the same disk, interleaved with
//! the upstream's own commits exactly as the gateway's are. `instant_fresh_ms` is the
//! ledger with a downstream that answers at once, for reference.
//!
//! Each difference is taken within a round, and the median of the rounds' differences
//! reported, so drift between rounds (this disk's fsync times vary by 2×) cancels:
//! `gateway_own_fresh_ms` is the gateway's own cost on the fresh path, the median of
//! `gateway_fresh - library_fresh`, and `fresh_added_ms` is `ledger_fresh_ms` plus it.
//!
//! Targets: replay adds at most 1.5 ms (`gateway_replay_ms - gateway_floor_ms`); fresh
//! adds at most the ledger's own fresh cost plus 0.5 ms (`gateway_fresh_ms -
//! upstream_direct_ms <= ledger_fresh_ms + 0.5`, that is `gateway_fresh_ms <=
//! library_fresh_ms + 0.5`); replays run at 10× the upstream's own rate or more
//! (`upstream_direct_ms / gateway_replay_ms >= 10`).
//!
//! Many calls at once, on an upstream that takes 0.3 s a call (the payments server's
//! `delay_ms`, 150 ms each side of its commit): `gateway_8_pipelined_over_1` is the wall
//! time of eight `tools/call`s of eight keys sent at once on one host connection
//! through `toolledger mcp`, over one such call's; `upstream_8_pipelined_over_1` the
//! same made directly to the upstream. Target: the gateway's within 1.3 (a gateway that
//! worked one call at a time would be 8).
//!
//! Usage: `mcp [--quick] [--out PATH]`.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark fails loudly")]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use rmcp::{
    RoleClient, ServiceExt,
    model::{CallToolRequestParams, MetaObject, RequestMetaObject},
    service::RunningService,
    transport::TokioChildProcess,
};
use serde_json::{Map, json};
use toolledger::{
    Call, Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest,
    Ledger, Lookup, ModelCall, NoRoles, Now, ProviderProfile, ToolDefinition,
};
use toolledger_bench::{Args, Work, median, sibling_binary, workspace, write_report};

/// The SDK the upstream runs on: the peers' one pin, shared with the tests.
const MCP_SDK: &str = include_str!("../../mcp/tests/peers/requirements.txt").trim_ascii();

fn main() {
    let Args { out, quick, profile, .. } = Args::parse("mcp");
    let (rounds, calls) = if quick { (3, 20) } else { (15, 100) };
    let python = venv_python();
    let work = Work::new();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let config = write_config(&work, &python);
    if let Some(flow) = profile {
        // One flow alone for 20 s, for a profiler attached to the gateway:
        // `--profile replay|fresh`.
        return runtime.block_on(profile_flow(&flow, &config, &work));
    }
    let (mut direct, mut floor, mut fresh, mut replay, mut library, mut instant) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    runtime.block_on(async {
        let upstream = connect(payments(&python, &work, "direct")).await;
        let gateway = connect(gateway(&config, &work)).await;
        let embedded = connect(payments(&python, &work, "library")).await;
        let host = library_ledger(&work, Through(embedded));
        // Warm both (the Python side's first calls import and compile).
        for call in 0..20 {
            pay(&upstream, format!("warm-{call}"), false).await;
            pay(&gateway, format!("warm-{call}"), true).await;
        }
        for round in 0..rounds {
            direct.push(
                timed(calls, |call| pay(&upstream, format!("d-{round}-{call}"), false)).await,
            );
            floor.push(timed(calls, |_| malformed_status(&gateway)).await);
            fresh.push(timed(calls, |call| pay(&gateway, format!("f-{round}-{call}"), true)).await);
            replay.push(timed(calls, |_| pay(&gateway, "warm-0".to_owned(), true)).await);
            library.push(tokio::task::block_in_place(|| {
                timed_sync(calls, |call| {
                    let reply = host.dispatch(&payment(&format!("l-{round}-{call}"))).unwrap();
                    assert!(reply.outcome().is_done(), "{}", reply.canonical());
                })
            }));
            // The ledger alone, in the same round, so disk drift hits it too.
            instant.push(tokio::task::block_in_place(|| instant_fresh(&work, round, calls)));
        }
        upstream.cancel().await.unwrap();
        gateway.cancel().await.unwrap();
    });
    let (gateway_pipelined, upstream_pipelined) =
        runtime.block_on(pipelined(&work, &python, if quick { 1 } else { 5 }));
    // Each round's own differences, then their median: drift between rounds cancels.
    let paired = |a: &[f64], b: &[f64]| median(a.iter().zip(b).map(|(a, b)| a - b).collect());
    let gateway_own = paired(&fresh, &library);
    let replay_added = paired(&replay, &floor);
    let ratios = median(direct.iter().zip(&replay).map(|(d, r)| d / r).collect());
    let (direct, floor, fresh, replay, library, instant) = (
        median(direct),
        median(floor),
        median(fresh),
        median(replay),
        median(library),
        median(instant),
    );
    let ledger = library - direct;
    let fresh_added = ledger + gateway_own;
    let replay_vs_upstream = ratios;
    let report = vec![
        ("upstream_direct_ms".to_owned(), json!(round3(direct))),
        ("gateway_floor_ms".to_owned(), json!(round3(floor))),
        ("gateway_fresh_ms".to_owned(), json!(round3(fresh))),
        ("gateway_replay_ms".to_owned(), json!(round3(replay))),
        ("library_fresh_ms".to_owned(), json!(round3(library))),
        ("ledger_fresh_ms".to_owned(), json!(round3(ledger))),
        ("instant_fresh_ms".to_owned(), json!(round3(instant))),
        ("gateway_own_fresh_ms".to_owned(), json!(round3(gateway_own))),
        (
            "replay_added_ms".to_owned(),
            json!({"value": round3(replay_added), "target": "<= 1.5", "met": replay_added <= 1.5}),
        ),
        (
            "fresh_added_ms".to_owned(),
            json!({"value": round3(fresh_added), "target": format!("<= ledger_fresh_ms + 0.5 = {}", round3(ledger + 0.5)), "met": fresh_added <= ledger + 0.5}),
        ),
        (
            "replay_vs_upstream".to_owned(),
            json!({"value": round3(replay_vs_upstream), "target": ">= 10", "met": replay_vs_upstream >= 10.0}),
        ),
        (
            "gateway_8_pipelined_over_1".to_owned(),
            json!({"value": round3(gateway_pipelined), "target": "<= 1.3", "met": gateway_pipelined <= 1.3}),
        ),
        ("upstream_8_pipelined_over_1".to_owned(), json!(round3(upstream_pipelined))),
        ("rounds".to_owned(), json!(rounds)),
        ("calls_per_round".to_owned(), json!(calls)),
    ];
    println!("{:<24} {:>10}", "figure", "value");
    for (name, value) in &report {
        println!("{name:<24} {value}");
    }
    write_report(
        &out,
        &report,
        &["replay_added_ms", "fresh_added_ms", "replay_vs_upstream", "gateway_8_pipelined_over_1"],
    );
}

/// Eight calls of eight keys sent at once over one connection, over one call alone
/// (wall times), through a gateway and directly, on an upstream that takes 0.3 s a
/// call: the medians over `rounds` of each ratio.
async fn pipelined(work: &Work, python: &Path, rounds: usize) -> (f64, f64) {
    let faults = work.file("slow-faults.json");
    std::fs::write(&faults, r#"{"delay_ms": 150}"#).unwrap();
    let config = write_config_with(work, python, "slow", &faults);
    let gateway = connect(gateway_at(&config, work, "slow-gateway.sqlite3")).await;
    let mut direct = payments(python, work, "slow-direct");
    direct.env("PAYMENTS_FAULTS", &faults);
    let upstream = connect(direct).await;
    pay(&gateway, "slow-warm".to_owned(), true).await;
    pay(&upstream, "slow-warm".to_owned(), false).await;
    let (mut through, mut alone) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for (client, keyed, ratios) in
            [(&gateway, true, &mut through), (&upstream, false, &mut alone)]
        {
            let started = Instant::now();
            pay(client, format!("s1-{round}"), keyed).await;
            let one = started.elapsed().as_secs_f64();
            let started = Instant::now();
            let calls = (0..8).map(|n| pay(client, format!("s8-{round}-{n}"), keyed));
            join_all(calls).await;
            ratios.push(started.elapsed().as_secs_f64() / one);
        }
    }
    gateway.cancel().await.unwrap();
    upstream.cancel().await.unwrap();
    (median(through), median(alone))
}

/// Every future of `futures`, polled at once on this task, to its end.
async fn join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    std::future::poll_fn(|context| {
        pending.retain_mut(|future| future.as_mut().poll(context).is_pending());
        if pending.is_empty() { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
    })
    .await;
}

async fn profile_flow(flow: &str, config: &Path, work: &Work) {
    let gateway = connect(gateway(config, work)).await;
    pay(&gateway, "warm".to_owned(), true).await;
    let started = Instant::now();
    let mut calls = 0;
    while started.elapsed().as_secs() < 20 {
        match flow {
            "replay" => pay(&gateway, "warm".to_owned(), true).await,
            "fresh" => pay(&gateway, format!("p-{calls}"), true).await,
            other => panic!("--profile takes replay or fresh, not {other}"),
        }
        calls += 1;
    }
    println!(
        "{flow}: {:.3} ms per call",
        started.elapsed().as_secs_f64() * 1000.0 / f64::from(calls)
    );
    gateway.cancel().await.unwrap();
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Milliseconds per call over `calls` calls of `each`.
async fn timed<F, Fut>(calls: usize, mut each: F) -> f64
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let started = Instant::now();
    for call in 0..calls {
        each(call).await;
    }
    started.elapsed().as_secs_f64() * 1000.0 / calls as f64
}

async fn connect(command: tokio::process::Command) -> RunningService<RoleClient, ()> {
    ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap()
}

/// One `create_payment` for order `key`; through the gateway it carries the key.
async fn pay(client: &RunningService<RoleClient, ()>, key: String, keyed: bool) {
    let mut arguments = Map::new();
    arguments.insert("order_id".to_owned(), json!(&key));
    arguments.insert("amount_minor".to_owned(), json!(100));
    arguments.insert("currency".to_owned(), json!("USD"));
    if keyed {
        arguments.insert("idempotency_key".to_owned(), json!(key));
    }
    let mut params = CallToolRequestParams::new("create_payment");
    params.arguments = Some(arguments);
    let result = client.call_tool(params).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
}

async fn malformed_status(client: &RunningService<RoleClient, ()>) {
    let mut params = CallToolRequestParams::new("toolledger_status");
    params.arguments = Some(json!({"status_ref": "not-a-ref"}).as_object().unwrap().clone());
    let result = client.call_tool(params).await.unwrap();
    assert_eq!(result.is_error, Some(true));
}

fn payments(python: &Path, work: &Work, name: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(python);
    command
        .arg(workspace().join("crates/mcp/tests/peers/payments.py"))
        .env("PAYMENTS_STATE", work.file(&format!("{name}-payments.sqlite3")));
    command
}

fn gateway(config: &Path, work: &Work) -> tokio::process::Command {
    gateway_at(config, work, "gateway.sqlite3")
}

fn gateway_at(config: &Path, work: &Work, ledger: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(sibling_binary("toolledger"));
    command.arg("mcp").arg("--config").arg(config).arg("--db").arg(work.file(ledger));
    command
}

fn write_config(work: &Work, python: &Path) -> PathBuf {
    let text = format!(
        "[mcp]\ntenant = \"bench\"\nsubject = \"agent\"\n\n[mcp.upstreams.payments]\n\
         command = [{python:?}, {server:?}]\nenv = {{ PAYMENTS_STATE = {state:?} }}\n",
        python = python.display().to_string(),
        server = workspace().join("crates/mcp/tests/peers/payments.py").display().to_string(),
        state = work.file("gateway-payments.sqlite3").display().to_string(),
    );
    let path = work.file("toolledger.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A configuration named `name` whose upstream reads its faults from `faults`.
fn write_config_with(work: &Work, python: &Path, name: &str, faults: &Path) -> PathBuf {
    let text = format!(
        "[mcp]\ntenant = \"bench\"\nsubject = \"agent\"\n\n[mcp.upstreams.payments]\n\
         command = [{python:?}, {server:?}]\n\
         env = {{ PAYMENTS_STATE = {state:?}, PAYMENTS_FAULTS = {faults:?} }}\n",
        python = python.display().to_string(),
        server = workspace().join("crates/mcp/tests/peers/payments.py").display().to_string(),
        state = work.file(&format!("{name}-payments.sqlite3")).display().to_string(),
        faults = faults.display().to_string(),
    );
    let path = work.file(&format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The venv the tests make (`target/mcp/venv`), made here when it is missing.
fn venv_python() -> PathBuf {
    let venv = workspace().join("target/mcp/venv");
    let python = venv.join("bin/python");
    if !venv.join(format!(".ready-{MCP_SDK}")).exists() {
        assert!(
            Command::new("python3").args(["-m", "venv"]).arg(&venv).status().unwrap().success()
        );
        let status = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", MCP_SDK])
            .status()
            .unwrap();
        assert!(status.success(), "pip install {MCP_SDK}");
        std::fs::write(venv.join(format!(".ready-{MCP_SDK}")), b"").unwrap();
    }
    python
}

fn timed_sync(calls: usize, mut each: impl FnMut(usize)) -> f64 {
    let started = Instant::now();
    for call in 0..calls {
        each(call);
    }
    started.elapsed().as_secs_f64() * 1000.0 / calls as f64
}

/// The downstream of a Rust host that embeds the library in front of the same
/// upstream: `create_payment` over rmcp, entered from the ledger's blocking call.
struct Through(RunningService<RoleClient, ()>);

impl std::fmt::Debug for Through {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Through")
    }
}

static THROUGH: std::sync::LazyLock<DownstreamIdentity> =
    std::sync::LazyLock::new(|| DownstreamIdentity::new("bench-library", "1").unwrap());

impl Downstream for Through {
    fn identity(&self) -> &DownstreamIdentity {
        &THROUGH
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        // The same request the gateway sends: the request ref as the upstream's own key
        // argument and in `_meta`, so the upstream does the same work on both sides.
        let mut params = CallToolRequestParams::new("create_payment");
        let mut arguments = request.arguments.as_object().cloned().unwrap_or_default();
        arguments
            .insert("idempotency_key".to_owned(), json!(request.downstream_request_ref.as_str()));
        params.arguments = Some(arguments);
        let mut meta = Map::new();
        meta.insert(
            "io.toolledger/request_ref".to_owned(),
            json!(request.downstream_request_ref.as_str()),
        );
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        let result = tokio::runtime::Handle::current()
            .block_on(self.0.call_tool(params))
            .map_err(|err| DownstreamError::Unknown { reason: err.to_string() })?;
        let result = serde_json::to_value(result).unwrap();
        Ok(request.receipt(
            json!({"content": result["content"], "structuredContent": result["structuredContent"]}),
        ))
    }

    fn lookup(&self, _request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }
}

/// A downstream that performs nothing and answers at once: the ledger alone.
#[derive(Debug)]
struct Instant0(DownstreamIdentity);

impl Downstream for Instant0 {
    fn identity(&self) -> &DownstreamIdentity {
        &self.0
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let arguments = &request.arguments;
        Ok(request.receipt(json!({"content": [], "structuredContent": {
            "payment_id": "pay_1", "order_id": arguments["order_id"],
            "amount_minor": arguments["amount_minor"], "currency": arguments["currency"],
            "status": "captured"}})))
    }

    fn lookup(&self, _request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }
}

/// The tool as the gateway's ledger holds it (the payments server's schemas).
fn definition() -> ToolDefinition {
    ToolDefinition::from_document(
        "bench",
        &json!({
            "name": "payments-create_payment",
            "description": "bench",
            "input_schema": {"type": "object", "required": ["order_id", "amount_minor", "currency"],
                "properties": {"order_id": {"type": "string"}, "amount_minor": {"type": "integer", "minimum": 1},
                    "currency": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "additionalProperties": false},
            "output_schema": {"type": "object", "required": ["content", "structuredContent"],
                "properties": {"content": {"type": "array"}, "structuredContent": {"type": "object"}}}
        }),
    )
    .unwrap()
}

fn library_ledger<D: Downstream>(work: &Work, downstream: D) -> Ledger<D, NoRoles> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let next = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ledger::builder(work.file(&format!("ledger-{next}.sqlite3")))
        .tool(definition().tool())
        .profile(ProviderProfile::new("mcp", "tools_call", "toolledger-mcp-1"))
        .open(downstream, NoRoles)
        .unwrap()
}

fn payment(key: &str) -> Call {
    Call::new(
        "payments-create_payment",
        json!({"order_id": key, "amount_minor": 100, "currency": "USD"}),
    )
    .principal("bench", "agent")
    .idempotency_key(key)
    .model_call(ModelCall::new(
        "mcp",
        "tools_call",
        "toolledger-mcp-1",
        &format!("r-{key}"),
        &format!("c-{key}"),
    ))
}

/// The ledger with a downstream that answers at once, on a new file.
fn instant_fresh(work: &Work, round: usize, calls: usize) -> f64 {
    let ledger =
        library_ledger(work, Instant0(DownstreamIdentity::new("bench-instant", "1").unwrap()));
    for warm in 0..20 {
        ledger.dispatch(&payment(&format!("warm-{round}-{warm}"))).unwrap();
    }
    timed_sync(calls, |key| {
        let reply = ledger.dispatch(&payment(&format!("k-{round}-{key}"))).unwrap();
        assert!(reply.outcome().is_done());
    })
}
