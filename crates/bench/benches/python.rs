//! `cargo xtask bench python`: the Python package's `dispatch` against the Rust
//! facade's, the same work in the same run.
//!
//! Both sides dispatch the tool of `crates/python/bench/pay.json` to a downstream that
//! answers at once (Rust: a struct; Python: a class, so the GIL's hand-back is counted),
//! each on a new SQLite file in one scratch directory, with a call built per dispatch
//! and its model call derived from the key (as a Python call without one is). Rounds
//! alternate the two sides; each round's Python rate is divided by the Rust rate of the
//! same round, and the median of those ratios reported:
//!
//! - `python_vs_rust_fresh`: new keys (commit A, the effect, commit C); target ≥ 0.90;
//! - `python_vs_rust_replay`: the same keys again (one verified read); target ≥ 0.80.
//!
//! The Python side is `crates/python/bench/bench.py`, run by the interpreter
//! `TOOLLEDGER_PYTHON` names (xtask installs the wheel into a venv and sets it).
//!
//! The same run measures the pure-Python peers on the same work
//! (`crates/python/bench/peers.py`: a payment made once per key, remembered in SQLite,
//! then the same keys again): agent-runtime-governance, replyonce over a SQLite store,
//! and DBOS. `python_vs_<peer>_fresh` and `_replay` are the package's rates over each
//! peer's, per round, medians reported.
//!
//! Many callers on one ledger, in the same run (`crates/python/bench/many.py` for the
//! Python side):
//!
//! - `rust_tokio_64_vs_1_fresh`: 64 tokio tasks each dispatching fresh calls in turn
//!   (`dispatch_async`) on one ledger, over one task doing the same; target ≥ 3 (their
//!   commits share fsyncs);
//! - `python_threads_8x_slow_wall_over_slow`: eight threads, each one call of a tool
//!   that takes 0.3 s, on one `Ledger`: the wall time over 0.3 s; target ≤ 1.3;
//! - `python_asyncio_64_vs_rust_tokio_64_fresh`: 64 asyncio tasks (`adispatch`) over the
//!   64 tokio tasks; target ≥ 0.8;
//! - `python_loop_lag_p99_ms`: how late a 1 ms sleep on the event loop wakes while the
//!   64 tasks run; target ≤ 2;
//! - `fresh_lookup_lazy_c_per_s` and `fresh_no_lookup_synced_c_per_s`: one caller's
//!   fresh calls when the downstream can look its requests up (a success's commit C
//!   lazy) and when it cannot (synced: `docs/schema.md`, "Lazy commit C");
//! - `rust_tokio_64_vs_agent_effects_64_fresh` and `_replay`: the 64 tokio tasks over
//!   agent-effects 0.2 with its SQLite store doing the same with 64 tasks, on the same
//!   disk (`peers/agent-effects`, whose binary `TOOLLEDGER_PEER_AGENT_EFFECTS` names);
//!   targets ≥ 5 and ≥ 10;
//! - `toolledger_64_fsyncs_per_call` and `agent_effects_64_fsyncs_per_call`: the same
//!   work of both (64 tasks' fresh calls, then their replays, on a new file) once more
//!   in a process of its own under `strace -f -c`, its `fsync` and `fdatasync` calls over
//!   the fresh calls made: what the group commit shares. Counted apart from the timed
//!   passes, since tracing slows every system call.
//!
//! Usage: `python [--quick] [--out PATH]`; `--child tokio PATH TASKS CALLS` is the
//! counted toolledger process.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark fails loudly")]

use std::{process::Command, time::Instant};

use serde_json::{Value, json};
use toolledger::{
    Call, Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest,
    Ledger, Lookup, ModelCall, NoRoles, Now, Outcome, ProviderProfile,
};
use toolledger_bench::{Args, Work, median, workspace, write_report};

fn main() {
    let args = Args::parse("python");
    if let Some(child) = args.child {
        return child_main(&child);
    }
    if let Some(flow) = &args.profile {
        // For a profiler: `--profile tokio-fresh|tokio-replay`, 64 tasks for a few seconds.
        return profile(flow);
    }
    let python = std::env::var("TOOLLEDGER_PYTHON")
        .expect("TOOLLEDGER_PYTHON names the venv's python (cargo xtask bench python sets it)");
    let (rounds, calls) = if args.quick { (2, 200) } else { (7, 1_000) };
    // The peers are an order of magnitude slower on fresh calls: fewer, so a run stays
    // within minutes.
    let peer_calls = if args.quick { 50 } else { 300 };
    let work = Work::new();
    let (mut rust_fresh, mut rust_replay, mut py_fresh, mut py_replay) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut fresh_ratios, mut replay_ratios) = (Vec::new(), Vec::new());
    // Per peer: its fresh and replay rates, and the package's rates over them.
    let mut peers: Vec<(&str, [Vec<f64>; 4])> =
        PEERS.iter().map(|peer| (*peer, Default::default())).collect();
    for round in 0..rounds {
        let (fresh, replay) = rust(&work, round, calls);
        let output = Command::new(&python)
            .arg(workspace().join("crates/python/bench/bench.py"))
            .args(["--dir", &work.path().to_string_lossy()])
            .args(["--calls", &calls.to_string(), "--round", &round.to_string()])
            .output()
            .expect("the venv's python starts");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let measured: Value = serde_json::from_slice(&output.stdout).unwrap();
        let (pf, pr) =
            (measured["fresh_per_s"].as_f64().unwrap(), measured["replay_per_s"].as_f64().unwrap());
        println!(
            "round {round}: fresh rust {fresh:.0}/s python {pf:.0}/s; replay rust {replay:.0}/s python {pr:.0}/s"
        );
        fresh_ratios.push(pf / fresh);
        replay_ratios.push(pr / replay);
        rust_fresh.push(fresh);
        rust_replay.push(replay);
        py_fresh.push(pf);
        py_replay.push(pr);
        for (peer, [peer_fresh, peer_replay, fresh_ratios, replay_ratios]) in &mut peers {
            let output = Command::new(&python)
                .arg(workspace().join("crates/python/bench/peers.py"))
                .args(["--peer", peer, "--dir", &work.path().to_string_lossy()])
                .args(["--calls", &peer_calls.to_string(), "--round", &round.to_string()])
                .output()
                .expect("the venv's python starts");
            assert!(output.status.success(), "{peer}: {}", String::from_utf8_lossy(&output.stderr));
            let line = String::from_utf8_lossy(&output.stdout);
            let measured: Value =
                serde_json::from_str(line.lines().last().unwrap_or_default()).unwrap();
            let (ef, er) = (
                measured["fresh_per_s"].as_f64().unwrap(),
                measured["replay_per_s"].as_f64().unwrap(),
            );
            println!("round {round}: {peer} fresh {ef:.0}/s replay {er:.0}/s");
            peer_fresh.push(ef);
            peer_replay.push(er);
            fresh_ratios.push(pf / ef);
            replay_ratios.push(pr / er);
        }
    }
    let many = many_callers(&work, &python, rounds, args.quick);
    let report = vec![
        ("python_vs_rust_fresh".to_owned(), json!(median(fresh_ratios))),
        ("python_vs_rust_replay".to_owned(), json!(median(replay_ratios))),
        ("rust_fresh_per_s".to_owned(), json!(median(rust_fresh))),
        ("python_fresh_per_s".to_owned(), json!(median(py_fresh))),
        ("rust_replay_per_s".to_owned(), json!(median(rust_replay))),
        ("python_replay_per_s".to_owned(), json!(median(py_replay))),
        ("calls_per_round".to_owned(), json!(calls)),
        ("peer_calls_per_round".to_owned(), json!(peer_calls)),
        ("rounds".to_owned(), json!(rounds)),
    ];
    let mut report = report;
    report.extend(many);
    for (peer, [peer_fresh, peer_replay, fresh_ratios, replay_ratios]) in peers {
        let name = peer.replace('-', "_");
        report.push((format!("{name}_fresh_per_s"), json!(median(peer_fresh))));
        report.push((format!("{name}_replay_per_s"), json!(median(peer_replay))));
        report.push((format!("python_vs_{name}_fresh"), json!(median(fresh_ratios))));
        report.push((format!("python_vs_{name}_replay"), json!(median(replay_ratios))));
    }
    for (name, value) in &report {
        println!("{name}: {value}");
    }
    write_report(&args.out, &report, &[]);
}

/// The peers `peers.py` knows.
const PEERS: [&str; 3] = ["agent-runtime-governance", "replyonce", "dbos"];

/// A downstream that answers at once.
struct Instant0 {
    identity: DownstreamIdentity,
    count: std::sync::atomic::AtomicU64,
    /// Whether it says it can look its requests up (a success's commit C then lazy).
    looks_up: bool,
}

impl Downstream for Instant0 {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let count = self.count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let arguments = &request.arguments;
        Ok(request.receipt(json!({"payment_id": format!("pay-{count}"),
            "amount_minor": arguments["amount_minor"], "currency": arguments["currency"]})))
    }

    fn lookup(&self, _request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }

    fn can_look_up(&self, _tool: &str) -> bool {
        self.looks_up
    }
}

fn call(key: &str) -> Call {
    let profile = ProviderProfile::new("python", "function_call", "toolledger-python-1");
    Call::new("pay", json!({"payer": "bob", "amount_minor": 100, "currency": "USD"}))
        .principal("bench", "agent")
        .idempotency_key(key)
        .model_call(ModelCall::keyed(profile, "py", "bench", "agent", "pay", key))
}

/// A new ledger in `work`'s file `name` with the bench's tool, over [`Instant0`] saying
/// it can (or cannot) look its requests up.
fn bench_ledger(work: &Work, name: &str, looks_up: bool) -> Ledger<Instant0, NoRoles> {
    ledger_at(&work.file(name), looks_up)
}

/// [`bench_ledger`] at `path`.
fn ledger_at(path: &std::path::Path, looks_up: bool) -> Ledger<Instant0, NoRoles> {
    let tool = toolledger::load_tool(&workspace().join("crates/python/bench/pay.json")).unwrap();
    let identity = DownstreamIdentity::new("bench-instant", "1").unwrap();
    let count = std::sync::atomic::AtomicU64::new(0);
    Ledger::builder(path)
        .tool(tool.tool())
        .profile(ProviderProfile::new("python", "function_call", "toolledger-python-1"))
        .open(Instant0 { identity, count, looks_up }, NoRoles)
        .unwrap()
}

/// Fresh and replay rates of the Rust facade, on a new file.
fn rust(work: &Work, round: usize, calls: usize) -> (f64, f64) {
    let ledger = bench_ledger(work, &format!("rust-{round}"), true);
    for warm in 0..20 {
        ledger.dispatch(&call(&format!("warm-{warm}"))).unwrap();
    }
    let keys: Vec<String> = (0..calls).map(|n| format!("k-{round}-{n}")).collect();
    let started = Instant::now();
    for key in &keys {
        assert!(ledger.dispatch(&call(key)).unwrap().outcome().is_done());
    }
    let fresh = calls as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for key in &keys {
        let reply = ledger.dispatch(&call(key)).unwrap();
        assert!(matches!(reply.outcome(), Outcome::Replayed(_)));
    }
    let replay = calls as f64 / started.elapsed().as_secs_f64();
    (fresh, replay)
}

/// Fresh calls per second of one caller on a new ledger whose downstream says it can
/// (`true`: a success's commit C lazy) or cannot (`false`: synced) look requests up.
fn fresh_rate(work: &Work, name: &str, calls: usize, looks_up: bool) -> f64 {
    let ledger = bench_ledger(work, name, looks_up);
    for warm in 0..20 {
        ledger.dispatch(&call(&format!("warm-{warm}"))).unwrap();
    }
    let started = Instant::now();
    for n in 0..calls {
        assert!(ledger.dispatch(&call(&format!("k-{n}"))).unwrap().outcome().is_done());
    }
    calls as f64 / started.elapsed().as_secs_f64()
}

/// How long the slow tool of the threads row takes.
const SLOW_S: f64 = 0.3;

/// The many-callers rows (see the module's doc), each a median over `rounds`.
fn many_callers(work: &Work, python: &str, rounds: usize, quick: bool) -> Vec<(String, Value)> {
    let (tasks, calls) = if quick { (64, 5) } else { (64, 20) };
    let (mut scaling, mut one_rates, mut many_rates) = (Vec::new(), Vec::new(), Vec::new());
    let (mut walls, mut asyncio_ratios, mut lags, mut asyncio_rates) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut peer_fresh, mut peer_replay, mut over_peer_fresh, mut over_peer_replay) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let peer = std::env::var("TOOLLEDGER_PEER_AGENT_EFFECTS").expect(
        "TOOLLEDGER_PEER_AGENT_EFFECTS names the agent-effects peer (cargo xtask bench python sets it)",
    );
    let (mut lazy_rates, mut synced_rates) = (Vec::new(), Vec::new());
    let mut own = Command::new(std::env::current_exe().unwrap());
    own.args(["--child", "tokio", &work.file("fsyncs-toolledger").to_string_lossy()]);
    own.args([&tasks.to_string(), &calls.to_string()]);
    let mut theirs = Command::new(&peer);
    theirs.args(["--db", &work.file("fsyncs-agent-effects").to_string_lossy()]);
    theirs.args(["--tasks", &tasks.to_string(), "--calls", &calls.to_string(), "--round", "0"]);
    let fsyncs = [
        fsyncs_per_call(work, "toolledger", own, tasks * calls),
        fsyncs_per_call(work, "agent-effects", theirs, tasks * calls),
    ];
    println!(
        "fsyncs per fresh call, {tasks} tasks: toolledger {:.3}, agent-effects {:.3}",
        fsyncs[0], fsyncs[1]
    );
    for round in 0..rounds {
        let fresh_calls = tasks * calls;
        lazy_rates.push(fresh_rate(work, &format!("lazy-{round}"), fresh_calls, true));
        synced_rates.push(fresh_rate(work, &format!("synced-{round}"), fresh_calls, false));
        let (one, many, many_replay) = tokio_rates(work, round, tasks, calls);
        let output = Command::new(&peer)
            .args(["--db", &work.file(&format!("agent-effects-{round}")).to_string_lossy()])
            .args(["--tasks", &tasks.to_string(), "--calls", &calls.to_string()])
            .args(["--round", &round.to_string()])
            .output()
            .expect("the agent-effects peer starts");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let measured: Value = serde_json::from_slice(&output.stdout).unwrap();
        let (pf, pr) =
            (measured["fresh_per_s"].as_f64().unwrap(), measured["replay_per_s"].as_f64().unwrap());
        println!(
            "round {round}: agent-effects {tasks} tasks fresh {pf:.0}/s replay {pr:.0}/s; toolledger replay {many_replay:.0}/s"
        );
        peer_fresh.push(pf);
        peer_replay.push(pr);
        over_peer_fresh.push(many / pf);
        over_peer_replay.push(many_replay / pr);
        let output = Command::new(python)
            .arg(workspace().join("crates/python/bench/many.py"))
            .args(["--dir", &work.path().to_string_lossy(), "--round", &round.to_string()])
            .args(["--tasks", &tasks.to_string(), "--calls", &calls.to_string()])
            .args(["--slow", &SLOW_S.to_string()])
            .output()
            .expect("the venv's python starts");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let measured: Value = serde_json::from_slice(&output.stdout).unwrap();
        let (wall, rate, lag) = (
            measured["threads_wall_s"].as_f64().unwrap(),
            measured["asyncio_fresh_per_s"].as_f64().unwrap(),
            measured["loop_lag_p99_ms"].as_f64().unwrap(),
        );
        println!(
            "round {round}: tokio 1 task {one:.0}/s, {tasks} tasks {many:.0}/s; python 8 threads x {SLOW_S} s: {wall:.3} s; asyncio {tasks} tasks {rate:.0}/s, loop lag p99 {lag:.2} ms"
        );
        scaling.push(many / one);
        one_rates.push(one);
        many_rates.push(many);
        walls.push(wall / SLOW_S);
        asyncio_ratios.push(rate / many);
        asyncio_rates.push(rate);
        lags.push(lag);
    }
    vec![
        ("rust_tokio_64_vs_1_fresh".to_owned(), json!(median(scaling))),
        ("rust_tokio_1_fresh_per_s".to_owned(), json!(median(one_rates))),
        ("rust_tokio_64_fresh_per_s".to_owned(), json!(median(many_rates))),
        ("python_threads_8x_slow_wall_over_slow".to_owned(), json!(median(walls))),
        ("python_asyncio_64_vs_rust_tokio_64_fresh".to_owned(), json!(median(asyncio_ratios))),
        ("python_asyncio_64_fresh_per_s".to_owned(), json!(median(asyncio_rates))),
        ("python_loop_lag_p99_ms".to_owned(), json!(median(lags))),
        ("fresh_lookup_lazy_c_per_s".to_owned(), json!(median(lazy_rates))),
        ("fresh_no_lookup_synced_c_per_s".to_owned(), json!(median(synced_rates))),
        ("rust_tokio_64_vs_agent_effects_64_fresh".to_owned(), json!(median(over_peer_fresh))),
        ("rust_tokio_64_vs_agent_effects_64_replay".to_owned(), json!(median(over_peer_replay))),
        ("agent_effects_64_fresh_per_s".to_owned(), json!(median(peer_fresh))),
        ("agent_effects_64_replay_per_s".to_owned(), json!(median(peer_replay))),
        ("toolledger_64_fsyncs_per_call".to_owned(), json!(fsyncs[0])),
        ("agent_effects_64_fsyncs_per_call".to_owned(), json!(fsyncs[1])),
    ]
}

/// `command` run to its end under `strace -f -c`: its `fsync` and `fdatasync` calls, on
/// every thread, over the `calls` fresh calls it makes. Panics when strace is missing:
/// the row is reported or the bench fails.
fn fsyncs_per_call(work: &Work, name: &str, command: Command, calls: usize) -> f64 {
    let summary = work.path().join(format!("strace-{name}.txt"));
    let status = Command::new("strace")
        .args(["-f", "-qq", "-c", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&summary)
        .arg("--")
        .arg(command.get_program())
        .args(command.get_args())
        .stdout(std::process::Stdio::null())
        .status()
        .expect("strace runs (the fsync rows count system calls with it: apt-get install strace)");
    assert!(status.success(), "{name} under strace: {status}");
    let summary = std::fs::read_to_string(&summary).unwrap();
    // `% time  seconds  usecs/call  calls  [errors]  syscall`: calls is the fourth column.
    let synced: u64 = summary
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|columns| matches!(columns.last(), Some(&("fsync" | "fdatasync"))))
        .map(|columns| columns[3].parse::<u64>().unwrap())
        .sum();
    synced as f64 / calls as f64
}

/// The counted toolledger process of the fsync rows: `tasks` tokio tasks each making
/// `calls` fresh calls on a new ledger at `path`, then the same calls again (replays).
fn child_main(args: &[String]) {
    let [mode, path, tasks, calls] = args else { panic!("--child tokio PATH TASKS CALLS") };
    assert_eq!(mode, "tokio", "the one child mode");
    let (tasks, calls): (usize, usize) = (tasks.parse().unwrap(), calls.parse().unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let ledger = ledger_at(std::path::Path::new(path), true);
        for _pass in 0..2 {
            many_tasks(&ledger, "fsyncs", tasks, calls).await;
        }
    });
}

/// 64 tokio tasks' fresh calls (`tokio-fresh`) or their replays (`tokio-replay`) on one
/// ledger, 20 passes of 64 × 50 calls (replays: 200), the rate of each printed.
fn profile(flow: &str) {
    let replay = match flow {
        "tokio-fresh" => false,
        "tokio-replay" => true,
        other => panic!("--profile tokio-fresh|tokio-replay, not {other}"),
    };
    let work = Work::new();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let ledger = bench_ledger(&work, "profile", true);
        if replay {
            many_tasks(&ledger, "profile", 64, 50).await;
        }
        // Replays are fast: more passes, so the fresh pass before them is a small part.
        for pass in 0..if replay { 200 } else { 20 } {
            let prefix = if replay { "profile".to_owned() } else { format!("profile-{pass}") };
            let started = Instant::now();
            many_tasks(&ledger, &prefix, 64, 50).await;
            println!("{flow}: {:.0}/s", 3200.0 / started.elapsed().as_secs_f64());
        }
    });
}

/// `tasks` tokio tasks on `ledger`, each dispatching `calls` keys of `prefix` in turn.
async fn many_tasks(ledger: &Ledger<Instant0, NoRoles>, prefix: &str, tasks: usize, calls: usize) {
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (ledger, prefix) = (ledger.clone(), prefix.to_owned());
            tokio::spawn(async move {
                for n in 0..calls {
                    let key = format!("{prefix}-{task}-{n}");
                    let reply = ledger.dispatch_async(&call(&key)).await.unwrap();
                    assert!(reply.outcome().is_done());
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
}

/// Calls per second on one ledger: one tokio task dispatching fresh keys in turn, then
/// `tasks` tasks each dispatching `calls` fresh keys in turn, then the same keys again
/// (replays), on a multi-thread runtime.
fn tokio_rates(work: &Work, round: usize, tasks: usize, calls: usize) -> (f64, f64, f64) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let ledger = bench_ledger(work, &format!("tokio-{round}"), true);
        for warm in 0..20 {
            ledger.dispatch_async(&call(&format!("warm-{warm}"))).await.unwrap();
        }
        let total = tasks * calls;
        let started = Instant::now();
        for n in 0..total {
            let reply = ledger.dispatch_async(&call(&format!("one-{round}-{n}"))).await.unwrap();
            assert!(reply.outcome().is_done());
        }
        let one = total as f64 / started.elapsed().as_secs_f64();
        let mut rates = [0.0; 2];
        for rate in &mut rates {
            let started = Instant::now();
            many_tasks(&ledger, &format!("many-{round}"), tasks, calls).await;
            *rate = total as f64 / started.elapsed().as_secs_f64();
        }
        (one, rates[0], rates[1])
    })
}
