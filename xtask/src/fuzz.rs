//! `cargo xtask fuzz`: builds the cargo-fuzz targets in `fuzz/` and runs each one for a
//! fixed time, two at a time.
//!
//! cargo-fuzz is installed at a pinned version in the tools directory
//! (`~/.cache/toolledger/tools`, never the global cargo bin) when it is missing there.
//! The targets are built without a sanitizer: the workspace forbids `unsafe` code, so
//! AddressSanitizer would only slow the runs; the coverage instrumentation and
//! libFuzzer are what find the bugs. Without a sanitizer
//! cargo-fuzz passes no `-Z` flag, so the stable toolchain builds the targets as it is
//! (no nightly, no `RUSTC_BOOTSTRAP`).
//!
//! Each run reads the committed seeds in `fuzz/corpus/<target>/` and writes what it
//! discovers to a scratch corpus in `target/fuzz-corpus/<target>/`, so the committed
//! corpus stays small. A crash fails the step with the input's path and the command
//! that reproduces it; the input, once the bug is fixed, is committed under the
//! target's corpus as a regression file (see `docs/reliability.md`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

/// cargo-fuzz is installed at this version, so every machine builds the same way.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Every target in `fuzz/fuzz_targets/`, in the order they run.
pub(crate) const TARGETS: [&str; 7] = [
    "json_parse",
    "case_file",
    "claims",
    "stored_row",
    "http_answer",
    "tool_definition",
    "accept_path",
];

/// Runs every target for `minutes` each.
pub(crate) fn run(root: &Path, minutes: f64) -> Result<String, String> {
    run_targets(root, minutes, &TARGETS)
}

/// Runs `targets` for `minutes` each, two at a time: installs cargo-fuzz when missing,
/// builds them all, prints one line per target, and fails when one crashed.
pub(crate) fn run_targets(root: &Path, minutes: f64, targets: &[&str]) -> Result<String, String> {
    if !(minutes.is_finite() && minutes > 0.0) {
        return Err(format!("--minutes must be a positive number, not {minutes}"));
    }
    let seconds = ((minutes * 60.0).round() as u64).max(1);
    let cargo_fuzz = install(root)?;
    let mut build = fuzz_command(root, &cargo_fuzz);
    build.args(["build", "--sanitizer", "none"]);
    let status = build.status().map_err(|err| format!("could not start cargo-fuzz: {err}"))?;
    if !status.success() {
        return Err(format!("cargo fuzz build exited with {status}"));
    }

    // Two targets at a time: one per core of the machines CI runs on.
    let mut crashes = Vec::new();
    for pair in targets.chunks(2) {
        let lines: Vec<Result<String, String>> = std::thread::scope(|scope| {
            let runs: Vec<_> = pair
                .iter()
                .map(|target| scope.spawn(|| run_one(root, &cargo_fuzz, target, seconds)))
                .collect();
            runs.into_iter()
                .map(|run| run.join().unwrap_or_else(|_| Err("a fuzz run panicked".to_owned())))
                .collect()
        });
        for line in lines {
            let line = line?;
            println!("fuzz: {line}");
            if line.contains("CRASHED") {
                crashes.push(line);
            }
        }
    }
    if crashes.is_empty() {
        Ok(format!("{} targets, {seconds} s each, no crash", targets.len()))
    } else {
        Err(crashes.join("; "))
    }
}

/// `bin/cargo-fuzz` of the tools directory at [`CARGO_FUZZ_VERSION`], installed when it is not.
fn install(root: &Path) -> Result<PathBuf, String> {
    crate::tool(root, "cargo-fuzz", CARGO_FUZZ_VERSION, &["fuzz", "--version"])
}

/// `cargo fuzz` from the tools directory, in the workspace root.
fn fuzz_command(root: &Path, cargo_fuzz: &Path) -> Command {
    let mut command = Command::new(cargo_fuzz);
    // Called directly, cargo-fuzz expects the `fuzz` cargo would pass it.
    command.current_dir(root).arg("fuzz");
    command
}

/// Runs one target and says how it went in one line: `CRASHED` in it when it did.
fn run_one(root: &Path, cargo_fuzz: &Path, target: &str, seconds: u64) -> Result<String, String> {
    let scratch = root.join("target/fuzz-corpus").join(target);
    let logs = root.join("target/fuzz-logs");
    for dir in [&scratch, &logs] {
        fs::create_dir_all(dir)
            .map_err(|err| format!("could not create {}: {err}", dir.display()))?;
    }
    let before = file_count(&scratch);
    let log_path = logs.join(format!("{target}.log"));
    let log = fs::File::create(&log_path)
        .map_err(|err| format!("could not create {}: {err}", log_path.display()))?;
    let mut command = fuzz_command(root, cargo_fuzz);
    command
        .args(["run", "--sanitizer", "none", target])
        .arg(&scratch)
        .arg(root.join("fuzz/corpus").join(target))
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        // A slow input is reported, not waited on for libFuzzer's default 20 minutes.
        .arg("-timeout=60")
        .arg("-print_final_stats=1")
        .stdout(log.try_clone().map_err(|err| format!("could not share the log: {err}"))?)
        .stderr(log);
    let status = command.status().map_err(|err| format!("could not start cargo-fuzz: {err}"))?;
    let text = fs::read_to_string(&log_path).unwrap_or_default();
    let executions = text
        .lines()
        .find_map(|line| line.strip_prefix("stat::number_of_executed_units:"))
        .map_or_else(|| "?".to_owned(), |count| count.trim().to_owned());
    let after = file_count(&scratch);
    let found = after.saturating_sub(before);
    if status.success() {
        return Ok(format!(
            "{target}: {executions} executions in {seconds} s, {found} new inputs \
             (scratch corpus: {after} files)"
        ));
    }
    let crash = text
        .lines()
        .find_map(|line| line.split_once("Test unit written to ").map(|(_, path)| path.trim()))
        .map(|path| root.join(path).display().to_string());
    Ok(match crash {
        Some(path) => format!(
            "{target}: CRASHED after {executions} executions; input {path}; log {}; reproduce \
             with: {} fuzz run --sanitizer none {target} {path}",
            log_path.display(),
            cargo_fuzz.display(),
        ),
        None => format!(
            "{target}: CRASHED (cargo fuzz exited with {status}, no input written); log {}",
            log_path.display()
        ),
    })
}

fn file_count(dir: &Path) -> usize {
    fs::read_dir(dir).map(|entries| entries.count()).unwrap_or(0)
}
