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
//! Usage: `python [--quick] [--out PATH]`.

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
    count: u64,
}

impl Downstream for Instant0 {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn execute(
        &mut self,
        request: &DownstreamRequest,
        _now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        self.count += 1;
        let arguments = &request.arguments;
        Ok(request.receipt(json!({"payment_id": format!("pay-{}", self.count),
            "amount_minor": arguments["amount_minor"], "currency": arguments["currency"]})))
    }

    fn lookup(&mut self, _request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }
}

fn call(key: &str) -> Call {
    let profile = ProviderProfile::new("python", "function_call", "toolledger-python-1");
    Call::new("pay", json!({"payer": "bob", "amount_minor": 100, "currency": "USD"}))
        .principal("bench", "agent")
        .idempotency_key(key)
        .model_call(ModelCall::keyed(profile, "py", "bench", "agent", "pay", key))
}

/// Fresh and replay rates of the Rust facade, on a new file.
fn rust(work: &Work, round: usize, calls: usize) -> (f64, f64) {
    let tool = toolledger::load_tool(&workspace().join("crates/python/bench/pay.json")).unwrap();
    let identity = DownstreamIdentity::new("bench-instant", "1").unwrap();
    let mut ledger = Ledger::builder(work.file(&format!("rust-{round}")))
        .tool(tool.tool())
        .profile(ProviderProfile::new("python", "function_call", "toolledger-python-1"))
        .open(Instant0 { identity, count: 0 }, NoRoles)
        .unwrap();
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
