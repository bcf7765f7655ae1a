//! The harness both benchmarks share: their arguments, a scratch directory, medians and
//! timed loops, the JSON corpus, the sibling binaries they spawn, and writing a report.
//!
//! The benches are `cargo bench` targets of this crate, run by `cargo xtask bench`,
//! which builds the binaries they spawn (`toolledger`, `toolledger-refundd`) first.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark fails loudly")]

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Barrier},
    thread,
    time::Instant,
};

pub mod ledger;

/// What a bench was asked for: `[--out PATH] [--quick] [--profile FLOW] [--child ARGS…]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Where the report goes.
    pub out: PathBuf,
    /// A smoke run: small sizes, few rounds, noisy figures.
    pub quick: bool,
    /// One flow alone in a loop, for a profiler (the report bench only).
    pub profile: Option<String>,
    /// The bench started as one of its own worker processes: everything after `--child`.
    pub child: Option<Vec<String>>,
}

impl Args {
    /// Reads the process's arguments; `name` is the report's default file name under
    /// `target/bench/`. `--bench`, which `cargo bench` passes, is ignored.
    ///
    /// # Panics
    ///
    /// On an unknown argument or a flag without its value.
    pub fn parse(name: &str) -> Args {
        Args::from(name, std::env::args().skip(1))
    }

    /// [`Args::parse`] over given arguments.
    ///
    /// ```
    /// let args = toolledger_bench::Args::from("x", ["--quick".to_owned(), "--bench".to_owned()]);
    /// assert!(args.quick && args.out.ends_with("target/bench/x.json"));
    /// ```
    ///
    /// # Panics
    ///
    /// As [`Args::parse`].
    pub fn from(name: &str, args: impl IntoIterator<Item = String>) -> Args {
        let mut parsed = Args {
            out: workspace().join(format!("target/bench/{name}.json")),
            quick: false,
            profile: None,
            child: None,
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--out" => parsed.out = PathBuf::from(args.next().expect("--out takes a path")),
                "--quick" => parsed.quick = true,
                "--profile" => parsed.profile = Some(args.next().expect("--profile takes a flow")),
                "--bench" => {}
                "--child" => parsed.child = Some(args.by_ref().collect()),
                other => panic!("unknown argument {other}"),
            }
        }
        parsed
    }
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A scratch directory, removed when dropped.
#[derive(Debug)]
pub struct Work(tempfile::TempDir);

impl Work {
    /// A fresh directory under the system's temp dir.
    ///
    /// # Panics
    ///
    /// When it cannot be made.
    pub fn new() -> Work {
        Work(tempfile::Builder::new().prefix("toolledger-bench-").tempdir().unwrap())
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// `<name>.sqlite3` in it.
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.path().join(format!("{name}.sqlite3"))
    }
}

impl Default for Work {
    fn default() -> Work {
        Work::new()
    }
}

/// The median of `samples` (the upper one of an even count).
///
/// ```
/// assert_eq!(toolledger_bench::median(vec![3.0, 1.0, 2.0]), 2.0);
/// ```
///
/// # Panics
///
/// On no samples.
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Runs `each(0..count)` and answers how many ran per second.
pub fn timed_rate(count: usize, each: impl FnMut(usize)) -> f64 {
    timed(count, each).per_s
}

/// Runs `each(0..count)` and answers its rate and its CPU per operation.
pub fn timed(count: usize, mut each: impl FnMut(usize)) -> Rate {
    let mut meter = Meter::default();
    meter.time(|| {
        for index in 0..count {
            each(index);
        }
    });
    meter.rate(count)
}

/// The CPU this process has used so far, user plus system, over all its threads
/// (`getrusage(RUSAGE_SELF)`), in seconds.
///
/// # Panics
///
/// When `getrusage` fails (it cannot, for `RUSAGE_SELF`).
pub fn cpu_s() -> f64 {
    use nix::sys::{
        resource::{UsageWho, getrusage},
        time::{TimeVal, TimeValLike},
    };
    let usage = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let seconds = |time: TimeVal| time.num_microseconds() as f64 / 1e6;
    seconds(usage.user_time()) + seconds(usage.system_time())
}

/// What a timed loop measured: operations per second of wall time, and the process's
/// CPU (user + system, every thread) per operation, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Operations per second of wall time.
    pub per_s: f64,
    /// CPU microseconds per operation.
    pub cpu_us: f64,
}

impl Rate {
    /// The median of each figure over `rates` (rounds), taken apart.
    ///
    /// # Panics
    ///
    /// On no rates.
    pub fn median(rates: &[Rate]) -> Rate {
        Rate {
            per_s: median(rates.iter().map(|rate| rate.per_s).collect()),
            cpu_us: median(rates.iter().map(|rate| rate.cpu_us).collect()),
        }
    }
}

/// Wall time and CPU summed over the spans it timed: for loops measured in batches that
/// alternate with a baseline's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Meter {
    wall_s: f64,
    cpu_s: f64,
}

impl Meter {
    /// Runs `span`, adding its wall time and CPU to this meter's.
    pub fn time<T>(&mut self, span: impl FnOnce() -> T) -> T {
        let (started, cpu) = (Instant::now(), cpu_s());
        let out = span();
        self.cpu_s += cpu_s() - cpu;
        self.wall_s += started.elapsed().as_secs_f64();
        out
    }

    /// The rate of `count` operations over the time summed so far.
    pub fn rate(&self, count: usize) -> Rate {
        Rate { per_s: count as f64 / self.wall_s, cpu_us: self.cpu_s * 1e6 / count as f64 }
    }
}

/// The JSON corpus (`crates/bench/corpus/*.json`), by file name, sorted.
///
/// # Panics
///
/// When the folder cannot be read.
pub fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("corpus folder")
        .map(|entry| entry.expect("corpus entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("corpus file"))
        })
        .collect();
    inputs.sort();
    inputs
}

/// A binary of the workspace built in the same profile as the running bench
/// (`target/release/<name>`).
///
/// # Panics
///
/// When it is not built, naming the command that builds it.
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let binary = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(binary.exists(), "{name} is not built: cargo xtask bench builds it first");
    binary
}

/// Writes `report` pretty-printed to `out`, making its folder: an object whose keys
/// come first in the order of `first`, then in the report's own order.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let out = dir.path().join("r.json");
/// let report = vec![("b".to_owned(), serde_json::json!(1)), ("a".to_owned(), serde_json::json!(2))];
/// toolledger_bench::write_report(&out, &report, &["a"]);
/// assert_eq!(std::fs::read_to_string(&out).unwrap(), "{\n  \"a\": 2,\n  \"b\": 1\n}\n");
/// ```
///
/// # Panics
///
/// When it cannot be written.
pub fn write_report(out: &Path, report: &[(String, serde_json::Value)], first: &[&str]) {
    let mut ordered: Vec<&(String, serde_json::Value)> =
        first.iter().filter_map(|key| report.iter().find(|(name, _)| name == key)).collect();
    ordered.extend(report.iter().filter(|(name, _)| !first.contains(&name.as_str())));
    let body: Vec<String> = ordered
        .iter()
        .map(|(name, value)| {
            let value = serde_json::to_string_pretty(value).unwrap().replace('\n', "\n  ");
            format!("  {}: {value}", serde_json::to_string(name).unwrap())
        })
        .collect();
    std::fs::create_dir_all(out.parent().expect("--out has a parent")).unwrap();
    std::fs::write(out, format!("{{\n{}\n}}\n", body.join(",\n"))).unwrap();
}

/// Throughput and latency of concurrent clients: operations per second of the wall
/// time, and the latencies' median, 99th percentile and maximum.
#[derive(Debug, Clone, PartialEq)]
pub struct Contention {
    /// Operations per second.
    pub ops_per_s: f64,
    /// The median latency, ms.
    pub p50_ms: f64,
    /// The 99th-percentile latency, ms.
    pub p99_ms: f64,
    /// The longest, ms.
    pub max_ms: f64,
    /// Commit points per group commit (threads of one SQLite process only; 0 otherwise).
    pub batches: f64,
    /// This process's CPU per operation, microseconds, user + system over every thread
    /// ([`threads`] only; 0 otherwise).
    pub cpu_us: f64,
}

impl Contention {
    /// The figures of `latencies` (ms, in any order) run within `wall_s` seconds.
    ///
    /// # Panics
    ///
    /// On no latencies.
    #[allow(clippy::indexing_slicing, reason = "a quantile of a non-empty list")]
    pub fn from(latencies: &mut [f64], wall_s: f64) -> Contention {
        latencies.sort_by(f64::total_cmp);
        let at = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q).round() as usize];
        Contention {
            ops_per_s: latencies.len() as f64 / wall_s,
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: at(1.0),
            batches: 0.0,
            cpu_us: 0.0,
        }
    }

    /// The round with the median throughput.
    ///
    /// # Panics
    ///
    /// On no rounds.
    pub fn median(mut rounds: Vec<Contention>) -> Contention {
        rounds.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
        let middle = rounds.len() / 2;
        rounds.swap_remove(middle)
    }
}

/// Eight threads released together, each running `work(thread, index)` for `index` in
/// `0..per_thread`; timed from before they start.
///
/// # Panics
///
/// When a thread panics.
pub fn threads(
    per_thread: usize,
    work: impl Fn(usize, usize) + Send + Sync + 'static,
) -> Contention {
    let work = Arc::new(work);
    let barrier = Arc::new(Barrier::new(8));
    let (started, cpu) = (Instant::now(), cpu_s());
    let handles: Vec<_> = (0..8)
        .map(|thread| {
            let (work, barrier) = (Arc::clone(&work), Arc::clone(&barrier));
            thread::spawn(move || {
                barrier.wait();
                (0..per_thread)
                    .map(|index| {
                        let started = Instant::now();
                        work(thread, index);
                        started.elapsed().as_secs_f64() * 1000.0
                    })
                    .collect::<Vec<f64>>()
            })
        })
        .collect();
    let mut latencies: Vec<f64> =
        handles.into_iter().flat_map(|handle| handle.join().unwrap()).collect();
    let cpu_us = (cpu_s() - cpu) * 1e6 / latencies.len() as f64;
    Contention { cpu_us, ..Contention::from(&mut latencies, started.elapsed().as_secs_f64()) }
}
