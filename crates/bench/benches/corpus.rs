//! `cargo xtask bench json`: strict parse + canonicalize against serde_json's parse +
//! serialize, on the same inputs, in one run.
//!
//! Rounds alternate between the two so that machine drift hits both alike; the figure
//! reported for each is its median round. Usage: `corpus [--out PATH] [--quick]`.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark fails loudly")]

use std::{hint::black_box, time::Instant};

use toolledger_bench::{Args, corpus, median, write_report};
use toolledger_json::{Limits, canonicalize, parse_strict};

fn main() {
    let Args { out, quick, .. } = Args::parse("json");
    let inputs = corpus();
    let bytes: usize = inputs.iter().map(|(_, input)| input.len()).sum();
    let limits = Limits::default();

    // Both sides must agree on what the corpus means before either is timed.
    for (name, input) in &inputs {
        let ours = parse_strict(input, &limits).unwrap_or_else(|err| panic!("{name}: {err}"));
        let theirs: serde_json::Value = serde_json::from_slice(input).expect("serde_json");
        assert_eq!(ours, theirs, "{name}");
    }

    let (rounds, passes) = if quick { (5, 20) } else { (31, 60) };
    let mut ours_s = Vec::with_capacity(rounds);
    let mut serde_s = Vec::with_capacity(rounds);
    for round in 0..rounds {
        // Alternate which side goes first, too.
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for ours in order {
            let start = Instant::now();
            for _ in 0..passes {
                for (_, input) in &inputs {
                    if ours {
                        let value = parse_strict(black_box(input), &limits).unwrap();
                        black_box(canonicalize(&value));
                    } else {
                        let value: serde_json::Value =
                            serde_json::from_slice(black_box(input)).unwrap();
                        black_box(serde_json::to_vec(&value).unwrap());
                    }
                }
            }
            let seconds = start.elapsed().as_secs_f64();
            if ours { ours_s.push(seconds) } else { serde_s.push(seconds) }
        }
    }
    let (ours, theirs) = (median(ours_s), median(serde_s));
    let megabytes = (bytes * passes) as f64 / 1e6;
    let report = serde_json::json!({
        "corpus_files": inputs.len(),
        "corpus_bytes": bytes,
        "rounds": rounds,
        "passes_per_round": passes,
        "toolledger_json_mb_per_s": megabytes / ours,
        "serde_json_mb_per_s": megabytes / theirs,
        "json_vs_serde": ours / theirs,
    });
    let report: Vec<(String, serde_json::Value)> =
        report.as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    write_report(&out, &report, &[]);

    println!(
        "json corpus: {} files, {} bytes, {rounds} rounds x {passes} passes",
        inputs.len(),
        bytes
    );
    println!("  parse_strict + canonicalize        {:>8.1} MB/s", megabytes / ours);
    println!("  serde_json from_slice + to_vec     {:>8.1} MB/s", megabytes / theirs);
    println!("  json_vs_serde (time ratio, lower is better)  {:.3}", ours / theirs);
    println!("  written to {}", out.display());
}
