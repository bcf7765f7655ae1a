//! `cargo xtask`: the project's one entry point for checks and benchmarks.
//!
//! - `cargo xtask ci` runs every check CI runs, in order (`cargo package` of every
//!   publishable crate and the library's runnable host examples among them), prints one
//!   summary line per step, and exits non-zero if any step failed. Steps run even after
//!   a failure, so one run shows everything that is wrong.
//! - `cargo xtask bench [json] [--quick]` builds in release and runs the benchmarks,
//!   writing their figures under `target/bench/`.
//! - `cargo xtask crash [--seed S] [--rounds N] [--store sqlite|postgres]` runs the
//!   crash campaign and writes its report to `target/crash/report-STORE.json`;
//!   `cargo xtask simulate [--seed S] [--cases N]` runs the deterministic simulation
//!   (`docs/reliability.md`).
//! - `cargo xtask fuzz [--minutes M] [--target NAME]` runs the fuzz targets in `fuzz/`,
//!   M minutes each (default 1), and fails on a crash (see `fuzz.rs`).
//!
//! - `cargo xtask python` builds the Python package's release wheel with maturin,
//!   installs it into a fresh venv and runs its pytest suite (`python.rs`).
//! - `cargo xtask man` writes the command's man pages under `target/man/` (`man.rs`).
//! - `cargo xtask screenshots` runs the dashboard's browser test and copies its overview
//!   screenshot to `docs/dashboard-overview.png`, the image the README shows.
//!
//! xtask depends on `serde_json` and, for the man pages, clap's own generators: it
//! drives cargo and reads its output.

#![allow(clippy::print_stderr, reason = "xtask is a command: usage errors go to stderr")]

mod fuzz;
mod man;
mod python;
mod tidy;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Instant,
};

/// cargo-deny is installed at this version when missing, so every machine runs the same.
const CARGO_DENY_VERSION: &str = "0.20.2";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    match args.first().map(String::as_str) {
        Some("ci") if args.len() == 1 => ci(&root),
        Some("bench") => bench(&root, args.get(1..).unwrap_or_default()),
        Some("tidy") if args.len() == 1 => report(&[step("tidy", || tidy::check(&root))]),
        Some("man") if args.len() == 1 => report(&[step("man pages", || man::write(&root))]),
        Some("python") if args.len() == 1 => {
            report(&[step("python (wheel, pytest)", || python::run(&root))])
        }
        Some("screenshots") if args.len() == 1 => {
            report(&[step("dashboard screenshots", || screenshots(&root))])
        }
        Some(command @ ("crash" | "simulate")) => match Campaign::parse(command, &args[1..]) {
            Ok(campaign) => report(&[campaign.step(&root)]),
            Err(message) => {
                eprintln!("{message}");
                ExitCode::from(2)
            }
        },
        Some("fuzz") => match fuzz_options(args.get(1..).unwrap_or_default()) {
            Some((minutes, targets)) => {
                report(&[step("fuzz", || fuzz::run_targets(&root, minutes, &targets))])
            }
            None => {
                eprintln!(
                    "usage: cargo xtask fuzz [--minutes M] [--target {}]",
                    fuzz::TARGETS.join("|")
                );
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!(
                "usage: cargo xtask ci | cargo xtask bench [json] [report] [--quick] | cargo xtask tidy | cargo xtask man | cargo xtask python | cargo xtask screenshots \
                 | cargo xtask crash [--seed S] [--rounds N] [--store sqlite|postgres] \
                 | cargo xtask simulate [--seed S] [--cases N] | cargo xtask fuzz [--minutes M] [--target NAME]"
            );
            ExitCode::from(2)
        }
    }
}

/// `[--minutes M] [--target NAME]`: the minutes per target (1 by default) and the
/// targets (all by default), or `None` when the arguments are not that.
fn fuzz_options(args: &[String]) -> Option<(f64, Vec<&'static str>)> {
    let (mut minutes, mut targets) = (1.0, fuzz::TARGETS.to_vec());
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next()?;
        match flag.as_str() {
            "--minutes" => minutes = value.parse().ok()?,
            "--target" => targets = vec![*fuzz::TARGETS.iter().find(|name| *name == value)?],
            _ => return None,
        }
    }
    Some((minutes, targets))
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// One finished step: its name, whether it passed, how long it took, and a note.
struct Outcome {
    name: String,
    passed: bool,
    seconds: f64,
    note: String,
}

fn step(name: &str, run: impl FnOnce() -> Result<String, String>) -> Outcome {
    println!("==> {name}");
    let start = Instant::now();
    let result = run();
    let seconds = start.elapsed().as_secs_f64();
    let (passed, note) = match result {
        Ok(note) => (true, note),
        Err(note) => (false, note),
    };
    let outcome = Outcome { name: name.to_owned(), passed, seconds, note };
    println!("{}", summary(&outcome));
    outcome
}

fn summary(outcome: &Outcome) -> String {
    let verdict = if outcome.passed { "ok" } else { "FAILED" };
    let note = if outcome.note.is_empty() { String::new() } else { format!(" ({})", outcome.note) };
    format!("xtask: {:<28} {verdict:<6} {:>7.1}s{note}", outcome.name, outcome.seconds)
}

fn report(outcomes: &[Outcome]) -> ExitCode {
    println!();
    println!("xtask summary:");
    for outcome in outcomes {
        println!("{}", summary(outcome));
    }
    let failed = outcomes.iter().filter(|outcome| !outcome.passed).count();
    println!(
        "xtask: {} steps, {} passed, {failed} failed",
        outcomes.len(),
        outcomes.len() - failed
    );
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Runs `cargo` with `args` in the workspace root, with extra environment, streaming its
/// output. Ok when it exits 0.
fn cargo(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    command.current_dir(root).args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    let status = command.status().map_err(|err| format!("could not start cargo: {err}"))?;
    if status.success() { Ok(String::new()) } else { Err(format!("cargo exited with {status}")) }
}

/// The command line's test modules that run a second time with PostgreSQL ledgers.
const CLI_ON_POSTGRES: [&str; 12] = [
    "flows::",
    "dashboard::",
    "blocks::",
    "concurrency::",
    "kill::",
    "liveness::",
    "operators::",
    "relay::",
    "http::",
    "tools::",
    "mcp::",
    "library::the_simulation_refuses_an_operation_of_another_downstream",
];

/// The debug test mode's target dir, shared by every step that builds in debug.
const DEBUG_DIR: &str = "target/ci/test-debug";

/// The release test mode's target dir, shared by every step that builds in release.
pub(crate) const RELEASE_DIR: &str = "target/ci/test-release";

/// The flags of every build in [`RELEASE_DIR`]: one set, so no step rebuilds another's.
pub(crate) const RELEASE_RUSTFLAGS: &str = "-D warnings";

/// The report's traces rows: the OpenTelemetry SDK in the bench crate.
pub(crate) const BENCH_OTEL_FEATURE: &str = "toolledger-bench/otel";

fn ci(root: &Path) -> ExitCode {
    let mut outcomes = vec![
        step("fmt", || cargo(root, &["fmt", "--all", "--check"], &[])),
        step("clippy", || {
            cargo(
                root,
                &["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"],
                &[],
            )
        }),
        // The line above built the facade with its spans (feature `otel`: the binaries
        // turn it on, and a workspace build unifies features). A library user's build
        // without them, and the report's traces rows (the bench crate's own `otel`),
        // are checked here.
        step("clippy (feature sets)", || {
            let without = [
                "clippy",
                "-p",
                "toolledger",
                "-p",
                "toolledger-downstream-http",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ];
            cargo(root, &without, &[])?;
            let bench = [
                "clippy",
                "-p",
                "toolledger-bench",
                "--all-targets",
                "--locked",
                "--features",
                BENCH_OTEL_FEATURE,
                "--",
                "-D",
                "warnings",
            ];
            cargo(root, &bench, &[])
        }),
        step("doc", || {
            cargo(
                root,
                &["doc", "--workspace", "--no-deps", "--locked"],
                &[("RUSTDOCFLAGS", "-D warnings")],
            )
        }),
        step("deny (licenses bans sources advisories)", || deny(root)),
        step("tidy (crate graph, facade doc examples)", || tidy::check(root)),
        step("man pages", || man::write(root)),
        step("contract vectors (independent python)", || contract_vectors(root)),
        step("package (cargo package)", || package(root)),
    ];
    // Each mode has its own target dir: RUSTFLAGS changes every fingerprint, and sharing
    // one dir would rebuild the world at each switch. The suite runs in debug and in
    // release. The release build denies warnings itself (clippy's `-D warnings` above
    // denied every warning of the debug profile, rustc's own lints included), so a
    // warning only the release profile shows (code under `debug_assertions`) fails it;
    // every later step in its target dir passes the same flags and builds nothing again.
    // Benches are built in release only by `cargo xtask bench`: clippy checks them.
    let modes: [(&str, &[&str], &str, &str); 2] = [
        ("test debug", &["test"], "", DEBUG_DIR),
        ("test release -D warnings", &["test", "--release"], RELEASE_RUSTFLAGS, RELEASE_DIR),
    ];
    for (name, command, rustflags, dir) in modes {
        outcomes.push(step(name, || {
            let mut args = command.to_vec();
            args.extend_from_slice(&["--workspace", "--locked", "--target-dir", dir]);
            cargo(root, &args, &[("RUSTFLAGS", rustflags)])
        }));
    }
    // The command line's end-to-end modules again, each test's ledger a fresh PostgreSQL
    // database on the cluster the tests start (errors, honesty and migrate test SQLite
    // files themselves and ran above).
    outcomes.push(step("test cli end-to-end on postgres", || {
        let mut args =
            vec!["test", "--locked", "-p", "toolledger-cli", "--target-dir", DEBUG_DIR, "--"];
        args.extend_from_slice(&CLI_ON_POSTGRES);
        cargo(root, &args, &[("RUSTFLAGS", ""), ("TOOLLEDGER_TEST_STORE", "postgres")])
    }));
    // The seeded campaigns (`docs/reliability.md`), each in a test mode's target dir.
    for campaign in [
        Campaign::parse("crash", &[]),
        Campaign::parse(
            "crash",
            &["--store".to_owned(), "postgres".to_owned(), "--rounds".to_owned(), "20".to_owned()],
        ),
        Campaign::parse("simulate", &[]),
    ] {
        match campaign {
            Ok(campaign) => outcomes.push(campaign.step(root)),
            Err(message) => outcomes.push(step("campaign", || Err(message))),
        }
    }
    // The library's runnable hosts, built in the debug test mode's target dir.
    for example in ["host", "tokio_host"] {
        outcomes.push(step(&format!("example {example}"), || {
            cargo(
                root,
                &[
                    "run",
                    "--locked",
                    "-q",
                    "-p",
                    "toolledger",
                    "--example",
                    example,
                    "--target-dir",
                    DEBUG_DIR,
                ],
                &[("RUSTFLAGS", "")],
            )
        }));
    }
    // The Python package: its wheel built by maturin in release (the test release mode's
    // dependencies), installed into a fresh venv, its pytest suite and doctests.
    outcomes.push(step("python (maturin wheel, pytest)", || python::run(root)));
    outcomes.push(step("fuzz smoke (10 s per target)", || fuzz::run(root, 10.0 / 60.0)));
    report(&outcomes)
}

/// The seed every campaign uses unless given one: a failure found in CI reproduces with
/// the same command on any machine.
const CAMPAIGN_SEED: &str = "20261201";

/// One seeded campaign (`docs/reliability.md`): the crash campaign of the command line's
/// tests (real processes killed at random and after each commit) or the deterministic
/// simulation of the conformance tests (seeded interleavings with injected faults).
struct Campaign {
    simulate: bool,
    seed: String,
    /// Rounds of the crash campaign, interleavings per store of the simulation.
    count: String,
    store: String,
}

impl Campaign {
    fn parse(command: &str, args: &[String]) -> Result<Campaign, String> {
        let simulate = command == "simulate";
        let mut campaign = Campaign {
            simulate,
            seed: CAMPAIGN_SEED.to_owned(),
            count: if simulate { "2000" } else { "40" }.to_owned(),
            store: "sqlite".to_owned(),
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let number = || {
                value
                    .parse::<u64>()
                    .map(|_| value.clone())
                    .map_err(|_| format!("{flag}: not a number"))
            };
            match (flag.as_str(), simulate) {
                ("--seed", _) => campaign.seed = number()?,
                ("--rounds", false) | ("--cases", true) => campaign.count = number()?,
                ("--store", false) if value == "sqlite" || value == "postgres" => {
                    campaign.store = value.clone();
                }
                ("--store", false) => return Err("--store takes sqlite or postgres".to_owned()),
                _ => return Err(format!("unknown option {flag} for cargo xtask {command}")),
            }
        }
        Ok(campaign)
    }

    fn step(&self, root: &Path) -> Outcome {
        if self.simulate {
            let name = format!("simulation (seed {}, {} cases per store)", self.seed, self.count);
            return step(&name, || self.simulation(root));
        }
        let name =
            format!("crash campaign ({}, seed {}, {} rounds)", self.store, self.seed, self.count);
        step(&name, || self.crash(root))
    }

    /// The crash campaign, in the debug test mode's target dir (no build of its own).
    fn crash(&self, root: &Path) -> Result<String, String> {
        let dir = root.join("target/crash");
        std::fs::create_dir_all(&dir).map_err(|err| format!("target/crash: {err}"))?;
        let report = dir.join(format!("report-{}.json", self.store));
        let args = [
            "test",
            "--locked",
            "-p",
            "toolledger-cli",
            "--test",
            "it",
            "--target-dir",
            DEBUG_DIR,
            "--",
            "crash::",
            "--nocapture",
        ];
        let report_path = report.to_string_lossy();
        cargo(
            root,
            &args,
            &[
                ("RUSTFLAGS", ""),
                ("TOOLLEDGER_TEST_STORE", &self.store),
                ("TOOLLEDGER_CRASH_SEED", &self.seed),
                ("TOOLLEDGER_CRASH_ROUNDS", &self.count),
                ("TOOLLEDGER_CRASH_REPORT", &report_path),
            ],
        )?;
        Ok(format!("report in target/crash/report-{}.json", self.store))
    }

    /// The simulation on both stores, in the release test mode's target dir; the SQLite
    /// ledgers on a memory filesystem when there is one (the model is checked, not the
    /// disk: real I/O faults have tests of their own).
    fn simulation(&self, root: &Path) -> Result<String, String> {
        // `--workspace`, as the release test mode built it: `-p` alone would resolve the
        // dependencies' features for this one package and compile them all again.
        let args = [
            "test",
            "--locked",
            "--release",
            "--workspace",
            "--test",
            "it",
            "--target-dir",
            RELEASE_DIR,
            "--",
            "simulation::",
            "--nocapture",
        ];
        let mut env = vec![
            ("RUSTFLAGS", RELEASE_RUSTFLAGS),
            ("TOOLLEDGER_SIM_SEED", self.seed.as_str()),
            ("TOOLLEDGER_SIM_CASES", self.count.as_str()),
        ];
        if Path::new("/dev/shm").is_dir() {
            env.push(("TMPDIR", "/dev/shm"));
        }
        cargo(root, &args, &env)
    }
}

/// `cargo package --workspace` of every crate whose manifest lets it publish, each built
/// from its packaged sources; the `publish = false` crates (benches, conformance suite,
/// xtask) are excluded by name, read from the manifests, so `publish` is the one place
/// the decision lives. Verification builds in the debug test mode's target dir, so
/// dependencies compiled for the tests are reused.
fn package(root: &Path) -> Result<String, String> {
    let metadata = tidy::workspace_metadata(root)?;
    let packages = metadata["packages"].as_array().map(Vec::as_slice).unwrap_or_default();
    // `publish = false` reads as an empty list of registries; a publishable crate's is null.
    let unpublished: Vec<&str> = packages
        .iter()
        .filter(|package| package["publish"].as_array().is_some_and(|to| to.is_empty()))
        .filter_map(|package| package["name"].as_str())
        .collect();
    let mut args = vec!["package", "--workspace", "--locked", "--target-dir", DEBUG_DIR];
    for name in &unpublished {
        args.extend(["--exclude", name]);
    }
    cargo(root, &args, &[("RUSTFLAGS", "")]).map(|_| {
        format!("{} crates, {} unpublished", packages.len() - unpublished.len(), unpublished.len())
    })
}

/// The browser test of the dashboard (headless Chromium), then its overview screenshot
/// copied to where the README shows it.
fn screenshots(root: &Path) -> Result<String, String> {
    let args = [
        "test",
        "--locked",
        "-p",
        "toolledger-cli",
        "--test",
        "it",
        "--",
        "browser::an_operator_filters_opens_and_requeues_a_dead_letter_in_chromium",
        "--exact",
    ];
    cargo(root, &args, &[])?;
    let shot = root.join("target/screenshots/overview.png");
    let image = root.join("docs/dashboard-overview.png");
    std::fs::copy(&shot, &image).map_err(|err| format!("copying {}: {err}", shot.display()))?;
    Ok("docs/dashboard-overview.png updated; every page's screenshot is in target/screenshots"
        .to_owned())
}

/// `docs/contract-vectors.json` checked by a second implementation written from
/// `docs/contract.md` alone, in Python: the digests must agree across languages.
fn contract_vectors(root: &Path) -> Result<String, String> {
    let status = Command::new("python3")
        .current_dir(root)
        .args(["scripts/check_contract_vectors.py", "docs/contract-vectors.json"])
        .status()
        .map_err(|err| format!("could not start python3: {err}"))?;
    if status.success() { Ok(String::new()) } else { Err(format!("python3 exited with {status}")) }
}

/// cargo-deny from the tools directory: licenses, bans and sources, then the advisories when
/// the RustSec database can be fetched. It is fetched from github.com, not from a package
/// registry: where that fails, the step says so and why, and passes on the other checks.
fn deny(root: &Path) -> Result<String, String> {
    let deny = tool(root, "cargo-deny", CARGO_DENY_VERSION, &["deny", "--version"])?;
    let run = |checks: &[&str]| {
        Command::new(&deny)
            .current_dir(root)
            .args(["deny", "--locked", "check"])
            .args(checks)
            .output()
            .map_err(|err| format!("could not start cargo-deny: {err}"))
    };
    let output = run(&["licenses", "bans", "sources"])?;
    print!("{}", String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        return Err(format!("cargo-deny exited with {}", output.status));
    }
    let output = run(&["advisories"])?;
    let log = String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        print!("{log}");
        return Ok("advisories checked".to_owned());
    }
    if log.contains("failed to fetch advisory database") {
        // git's own last words: `Could not resolve host: github.com`, say.
        let why = log
            .lines()
            .rev()
            .find_map(|line| line.strip_prefix("fatal: "))
            .map(|line| line.rsplit_once("': ").map_or(line, |(_, why)| why))
            .unwrap_or("the fetch failed");
        return Ok(format!(
            "advisories not checked: the RustSec database could not be fetched from github.com ({why})"
        ));
    }
    print!("{log}");
    Err(format!("cargo-deny advisories exited with {}", output.status))
}

/// Where the pinned tools are installed: `$XDG_CACHE_HOME/toolledger/tools` (or
/// `~/.cache/…`), so a new clone on the same machine reuses them instead of compiling
/// them again; `target/tools` when neither variable is set. Each is checked against its
/// pinned version before use, so a stale one is installed again.
pub(crate) fn tools_dir(root: &Path) -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")));
    cache.map_or_else(|| root.join("target/tools"), |cache| cache.join("toolledger/tools"))
}

/// `bin/NAME` under [`tools_dir`] at `version` (a debug build: these tools only drive
/// cargo and read manifests), installed there when `NAME probe…` does not print that
/// version. Nothing is installed into the user's own cargo bin.
pub(crate) fn tool(
    root: &Path,
    name: &str,
    version: &str,
    probe: &[&str],
) -> Result<PathBuf, String> {
    let tools = tools_dir(root);
    let binary = tools.join("bin").join(name);
    let installed = Command::new(&binary)
        .args(probe)
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(version));
    if !installed {
        println!("{name} {version} is missing: installing it under {}", tools.display());
        let root_arg = tools.to_string_lossy();
        let args =
            ["install", name, "--locked", "--force", "--debug", "--version", version, "--root"];
        let mut args = args.to_vec();
        args.push(&root_arg);
        cargo(root, &args, &[]).map_err(|why| format!("cargo install {name}: {why}"))?;
    }
    Ok(binary)
}

fn bench(root: &Path, args: &[String]) -> ExitCode {
    let quick = args.iter().any(|arg| arg == "--quick");
    // `--store postgres`: the PostgreSQL report instead of the SQLite benches.
    let at = args.iter().position(|arg| arg == "--store");
    let postgres = match at.map(|at| args.get(at + 1)) {
        None => false,
        Some(Some(store)) if store == "sqlite" => false,
        Some(Some(store)) if store == "postgres" => true,
        Some(_) => {
            eprintln!("--store takes sqlite or postgres");
            return ExitCode::from(2);
        }
    };
    // The bench names: every argument but the flags and `--store`'s value.
    let names: Vec<&str> = args
        .iter()
        .enumerate()
        .filter(|(index, arg)| {
            *arg != "--quick" && at.is_none_or(|at| *index != at && *index != at + 1)
        })
        .map(|(_, arg)| arg.as_str())
        .collect();
    // Each bench by name: the package and the bench target that run it.
    const BENCHES: [(&str, &str, &str); 4] = [
        ("json", "toolledger-bench", "corpus"),
        ("report", "toolledger-bench", "report"),
        ("mcp", "toolledger-bench", "mcp"),
        ("python", "toolledger-bench", "python"),
    ];
    let mut selected = Vec::new();
    for name in &names {
        match BENCHES.iter().find(|(known, _, _)| known == name) {
            Some(bench) => selected.push(*bench),
            None => {
                eprintln!("unknown bench {name:?}; known: json, report, mcp, python");
                return ExitCode::from(2);
            }
        }
    }
    if postgres {
        if !selected.is_empty() {
            eprintln!("--store postgres runs the PostgreSQL report alone");
            return ExitCode::from(2);
        }
        selected = vec![("report-postgres", "toolledger-bench", "postgres")];
    } else if selected.is_empty() {
        selected = BENCHES.to_vec();
    }
    let mut outcomes = Vec::new();
    for (name, package, target) in selected {
        outcomes.push(step(&format!("bench {name}"), || {
            let out = root.join(format!("target/bench/{name}.json"));
            let out = out.to_string_lossy();
            // Every bench with the bench's `otel` feature (the facade's spans compiled in,
            // off unless a provider is installed): the report's traces rows need it, and one
            // feature set keeps each bench from rebuilding the others' crates.
            let mut args = vec![
                "bench",
                "--locked",
                "-p",
                package,
                "--features",
                "otel",
                "--bench",
                target,
                "--",
                "--out",
                &out,
            ];
            if quick {
                args.push("--quick");
            }
            if name.starts_with("report") || name == "mcp" {
                // The binaries the report spawns: the command (its wall time) and the
                // reference service (the HTTP figures), in the bench's own profile.
                let build = [
                    "build",
                    "--release",
                    "--locked",
                    "-p",
                    "toolledger-cli",
                    "-p",
                    "toolledger-refundd",
                ];
                cargo(root, &build, &[])?;
            }
            if name == "python" {
                // The wheel in release, installed into a venv whose python the bench runs,
                // and the Rust peer of its many-callers rows, a workspace of its own (its
                // sqlx tree never enters the main workspace's build or lock).
                let python = python::bench_venv(root)?;
                let peer_target = root.join("target/peers");
                let peer_target = peer_target.to_string_lossy();
                let peer = [
                    "build",
                    "--release",
                    "--locked",
                    "--manifest-path",
                    "peers/agent-effects/Cargo.toml",
                    "--target-dir",
                    &peer_target,
                ];
                cargo(root, &peer, &[])?;
                let peer = root.join("target/peers/release/toolledger-peer-agent-effects");
                return cargo(
                    root,
                    &args,
                    &[
                        ("TOOLLEDGER_PYTHON", python.as_str()),
                        ("TOOLLEDGER_PEER_AGENT_EFFECTS", &peer.to_string_lossy()),
                    ],
                );
            }
            cargo(root, &args, &[])
        }));
    }
    report(&outcomes)
}
