//! The one integration-test binary of `toolledger-cli`: the real `toolledger` binary,
//! spawned as a user or an operator script would.
//!
//! With `TOOLLEDGER_TEST_STORE=postgres`, every test's ledger is a fresh PostgreSQL
//! database instead of `toolledger.sqlite3` in its directory: each command gets `--db
//! URL --store-clock caller` (the tests' case files carry a simulated clock), and the
//! helpers that read or change rows go to that database. `cargo xtask ci` runs the
//! end-to-end modules both ways; `errors` and `honesty` test SQLite files themselves.

mod blocks;
mod browser;
mod concurrency;
mod conventions;
mod crash;
mod dashboard;
mod errors;
mod flows;
mod honesty;
mod http;
mod iofaults;
mod kill;
mod library;
mod listeners;
mod liveness;
mod mcp;
mod multihost;
mod operators;
mod readme;
mod relay;
mod tools;
mod traces;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::atomic::{AtomicUsize, Ordering},
};

use serde_json::Value;
use toolledger_contract::{Registry, load_case};

/// Whether this run's ledgers are PostgreSQL databases (`TOOLLEDGER_TEST_STORE=postgres`).
pub fn on_postgres() -> bool {
    std::env::var("TOOLLEDGER_TEST_STORE").as_deref() == Ok("postgres")
}

/// A working directory with a recognisable secret in its path: no error may print it;
/// and the test's ledger, a file in it or a PostgreSQL database of its own.
#[derive(Debug)]
pub struct Dir(PathBuf, Option<toolledger_conformance::Postgres>);

pub const SECRET: &str = "secret-dir-7731";

impl Dir {
    pub fn new() -> Dir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "toolledger-cli-{}-{}/{SECRET}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let postgres = on_postgres().then(
            <toolledger_conformance::Postgres as toolledger_conformance::StoreUnderTest>::fresh,
        );
        let dir = Dir(dir, postgres);
        dir.write(
            "case.json",
            &std::fs::read(workspace("fixtures/persistence-case.json")).unwrap(),
        );
        dir
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.0.join(name), bytes).unwrap();
    }

    /// Writes the PASS case changed by `change`, with its approval rebound.
    pub fn write_case(&self, name: &str, change: impl FnOnce(&mut Value)) {
        let mut value: Value = serde_json::from_slice(
            &std::fs::read(workspace("fixtures/persistence-case.json")).unwrap(),
        )
        .unwrap();
        change(&mut value);
        let text = serde_json::to_string_pretty(&value).unwrap();
        let case = load_case(text.as_bytes(), &Registry::builtin(), None).unwrap();
        let registry = Registry::builtin();
        let tool = registry.tool("refund_order").unwrap();
        let binding = case.approval_binding(&tool.name, &tool.revisions);
        let digest = case.approval.as_ref().unwrap().digest_for(&binding);
        value["approval"]["approval_sha256"] = Value::from(digest.as_str());
        self.write(name, serde_json::to_string_pretty(&value).unwrap().as_bytes());
    }

    /// Runs `toolledger <args>` in this directory.
    pub fn run(&self, args: &[&str]) -> Run {
        self.run_with(args, &[])
    }

    pub fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut command = self.command(args);
        for (key, value) in env {
            command.env(key, value);
        }
        Run::from(command.output().unwrap())
    }

    /// `toolledger <args>` in this directory, to be adjusted and then [`finish`]ed. On
    /// PostgreSQL, a command that names no `--db` is pointed at the test's database.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolledger"));
        command.current_dir(&self.0).args(args);
        // The commands that open a ledger; `demo`, `--help` and `--version` take no `--db`.
        const LEDGER_COMMANDS: [&str; 15] = [
            "dispatch", "enqueue", "process", "status", "audit", "migrate", "relay", "list",
            "show", "requeue", "resolve", "metrics", "gc", "serve", "mcp",
        ];
        // The commands that take leases (or the clock), and so `--store-clock`.
        const LEASE_COMMANDS: [&str; 6] =
            ["dispatch", "enqueue", "process", "status", "relay", "resolve"];
        if let Some(postgres) = &self.1 {
            // (`tools list` opens none: `list` there is a subcommand of `tools`.)
            let opens_ledger = args.first() != Some(&"tools")
                && args.iter().any(|arg| LEDGER_COMMANDS.contains(arg));
            if opens_ledger && !args.contains(&"--db") {
                command.args(["--db", postgres.url()]);
                if args.iter().any(|arg| LEASE_COMMANDS.contains(arg)) {
                    command.args(["--store-clock", "caller"]);
                }
            }
        }
        command
    }

    /// The public recovery path for the operation `status_ref` of the case file `case`:
    /// a status query and, when it answers `OUTCOME_UNKNOWN` (no downstream receipt to
    /// reconcile yet), a worker at `later`, past every lease. Returns the last answer:
    /// OK once the operation has ended, the query's `NOT_FOUND` when nothing is held
    /// under the ref (a commit A that failed while committing and did not hold).
    pub fn recover(&self, case: &str, status_ref: &str, later: &str) -> Run {
        let status =
            self.run(&["--fixture", case, "status", "--status-ref", status_ref, "--now", later]);
        match status.text("/code").as_str() {
            "OUTCOME_UNKNOWN" => self.run(&[
                "--fixture",
                case,
                "process",
                "--status-ref",
                status_ref,
                "--now",
                later,
            ]),
            _ => status,
        }
    }

    /// The test's ledger as `--db` names it.
    pub fn db(&self) -> String {
        match &self.1 {
            Some(postgres) => postgres.url().to_owned(),
            None => self.join("toolledger.sqlite3").to_string_lossy().into_owned(),
        }
    }

    /// The test's ledger as the library opens it.
    pub fn location(&self) -> toolledger::Location {
        toolledger::Location::parse(&self.db())
    }

    /// Every row `sql` answers in the test's ledger, each value as text.
    pub fn db_rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        match &self.1 {
            Some(postgres) => toolledger_conformance::StoreUnderTest::rows(postgres, sql),
            None => toolledger_conformance::sqlite_rows(&self.join("toolledger.sqlite3"), sql),
        }
    }

    /// Runs `sql` on the test's ledger, as an intruder with a raw connection would.
    pub fn db_execute(&self, sql: &str) {
        match &self.1 {
            Some(postgres) => toolledger_conformance::StoreUnderTest::execute(postgres, sql),
            None => toolledger_conformance::sqlite_execute(&self.join("toolledger.sqlite3"), sql),
        }
    }

    pub fn db_text(&self, sql: &str) -> String {
        match self.db_rows(sql).as_slice() {
            [row] => row.first().cloned().flatten().unwrap_or_else(|| panic!("{sql}: NULL")),
            rows => panic!("{sql}: {} rows", rows.len()),
        }
    }

    pub fn db_int(&self, sql: &str) -> i64 {
        self.db_text(sql).parse().unwrap()
    }

    /// Whether the test's ledger holds no operation (or does not exist at all).
    pub fn ledger_is_empty(&self) -> bool {
        match &self.1 {
            Some(postgres) => {
                let tables = toolledger_conformance::StoreUnderTest::rows(
                    postgres,
                    "SELECT 1 FROM pg_tables WHERE tablename = 'operations'",
                );
                tables.is_empty() || self.db_int("SELECT count(*) FROM operations") == 0
            }
            None => {
                !self.join("toolledger.sqlite3").exists()
                    || self.db_int("SELECT count(*) FROM operations") == 0
            }
        }
    }
}

impl Default for Dir {
    fn default() -> Dir {
        Dir::new()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

/// One finished process.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }
}

impl Run {
    /// The single JSON object on stdout, checked to be canonical and newline-terminated.
    pub fn answer(&self) -> Value {
        assert!(self.stdout.ends_with('\n'), "stdout does not end in a newline: {:?}", self.stdout);
        let line = self.stdout.strip_suffix('\n').unwrap();
        assert!(!line.contains('\n'), "more than one line on stdout");
        let value = toolledger_json::parse_strict(line.as_bytes(), &Default::default()).unwrap();
        assert_eq!(toolledger_json::canonicalize(&value), line, "stdout is not canonical");
        value
    }

    pub fn text(&self, pointer: &str) -> String {
        self.answer().pointer(pointer).and_then(Value::as_str).unwrap_or_default().to_owned()
    }

    /// Asserts an exit-2 error of `code`: stdout empty, one JSON line on stderr, and no
    /// path or OS text in it.
    pub fn assert_error(&self, code: &str) {
        assert_eq!(self.code, 2, "{self:?}");
        assert_eq!(self.stdout, "", "{self:?}");
        assert!(self.stderr.ends_with('\n') && self.stderr.lines().count() == 1, "{self:?}");
        let value =
            toolledger_json::parse_strict(self.stderr.trim_end().as_bytes(), &Default::default())
                .unwrap();
        let error = value["error"].as_object().unwrap();
        assert_eq!(value.as_object().unwrap().len(), 1);
        assert_eq!(error.len(), 2, "{self:?}");
        assert_eq!(error["code"], Value::from(code), "{self:?}");
        let message = error["message"].as_str().unwrap();
        assert!(!message.is_empty());
        for leak in [
            SECRET,
            ".json",
            ".sqlite3",
            "/tmp",
            "No such file",
            "os error",
            "Permission",
            "SELECT",
            "INSERT",
            "panicked",
            "src/",
        ] {
            assert!(!self.stderr.contains(leak), "stderr leaks {leak:?}: {}", self.stderr);
        }
    }
}

pub use toolledger_testkit::listening_base;

/// Runs `command` to its end, killing it if it is still running after two minutes: a
/// command that hangs fails its test instead of stalling the suite. It runs in a process
/// group of its own, killed whole once the command has ended, so nothing it started (a
/// server a failed script never stopped) outlives the test or holds its output open.
pub fn finish(mut command: Command) -> Run {
    finish_to(command.stdout(std::process::Stdio::piped()))
}

/// [`finish`] with stdout as `command` already has it (a file, a closed pipe).
pub fn finish_to(command: &mut Command) -> Run {
    use std::{io::Read, os::unix::process::CommandExt, time::Duration, time::Instant};
    let mut child = command.process_group(0).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let group = child.id();
    let readers = [
        child.stdout.take().map(|out| Box::new(out) as Box<dyn Read + Send>),
        child.stderr.take().map(|err| Box::new(err) as Box<dyn Read + Send>),
    ]
    .map(|pipe| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(std::process::Stdio::null())
        .status();
    let [stdout, stderr] = readers.map(|reader| reader.join().unwrap_or_default());
    Run::from(std::process::Output { status, stdout, stderr })
}

/// Sends SIGTERM to `child` and waits at most `within` for it to exit: its status.
/// Panics when it is still running then.
pub fn sigterm(
    child: &mut std::process::Child,
    within: std::time::Duration,
) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > within {
            let _ = child.kill();
            panic!("still running {within:?} after SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub fn workspace(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}
