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
    let work = Work::new();
    let (mut rust_fresh, mut rust_replay, mut py_fresh, mut py_replay) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut fresh_ratios, mut replay_ratios) = (Vec::new(), Vec::new());
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
    }
    let report = vec![
        ("python_vs_rust_fresh".to_owned(), json!(median(fresh_ratios))),
        ("python_vs_rust_replay".to_owned(), json!(median(replay_ratios))),
        ("rust_fresh_per_s".to_owned(), json!(median(rust_fresh))),
        ("python_fresh_per_s".to_owned(), json!(median(py_fresh))),
        ("rust_replay_per_s".to_owned(), json!(median(rust_replay))),
        ("python_replay_per_s".to_owned(), json!(median(py_replay))),
        ("calls_per_round".to_owned(), json!(calls)),
        ("rounds".to_owned(), json!(rounds)),
    ];
    for (name, value) in &report {
        println!("{name}: {value}");
    }
    write_report(&args.out, &report, &[]);
}

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
