//! Honest under faults: after commit A no failure is an exit-2 "nothing happened"; every
//! wait and every read is bounded; small edges of the command line answer cleanly.

use std::{
    process::{Command, Stdio},
    sync::mpsc,
    thread,
};

use serde_json::Value;

use crate::{Dir, Run, finish, finish_to};

const BIN: &str = env!("CARGO_BIN_EXE_toolledger");
const LATER: &str = "1767225700"; // past every lease a failed call could hold

/// `toolledger <args>` run by bash after `prelude` (a `ulimit`, a redirection).
fn under_bash(dir: &Dir, prelude: &str, args: &[&str]) -> Command {
    let mut command = Command::new("bash");
    command
        .current_dir(dir.path())
        .arg("-c")
        .arg(format!("{prelude}\nexec \"$0\" \"$@\" {}", redirection(prelude)))
        .arg(BIN)
        .args(args);
    command
}

/// A prelude line starting with `>` or `1<` is a redirection of the command itself.
fn redirection(prelude: &str) -> &str {
    if prelude.starts_with('>') || prelude.starts_with("1<") { prelude } else { "" }
}

/// Operations accepted in the directory's store (0 when there is no usable store).
fn operations(dir: &Dir) -> i64 {
    let Ok(conn) = rusqlite::Connection::open_with_flags(
        dir.join("toolledger.sqlite3"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE,
    ) else {
        return 0;
    };
    conn.query_row("SELECT count(*) FROM operations", [], |row| row.get(0)).unwrap_or(0)
}

/// Drives the case's operation to its end through the public recovery path (the
/// call again when a status query finds nothing under its ref) and asserts one
/// downstream receipt and a clean audit.
fn settle(dir: &Dir, status_ref: &str) {
    let ended = dir.recover("case.json", status_ref, LATER);
    if ended.text("/code") == "NOT_FOUND" {
        // Commit A failed while committing (OUTCOME_UNKNOWN with no status) and did not
        // hold: nothing was accepted, so the call is made again.
        let again = dir.run(&["--fixture", "case.json", "dispatch"]);
        assert_eq!(again.text("/code"), "OK", "{again:?}");
    } else {
        assert_eq!(ended.text("/code"), "OK", "{ended:?}");
    }
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 1);
    assert_eq!(dir.db_int("SELECT count(*) FROM local_receipts"), 1);
    assert_eq!(dir.run(&["audit"]).code, 0);
}

/// A file-size limit anywhere from the store's creation to commit C: the process is
/// never killed by SIGXFSZ, an exit 2 means nothing was accepted, and every accepted
/// intent is answered OUTCOME_UNKNOWN (or PASS) and settles to one receipt.
#[test]
fn a_file_size_limit_never_turns_an_accepted_intent_into_an_error() {
    let mut seen = std::collections::BTreeSet::new();
    for kib in (8..=260).step_by(6) {
        let dir = Dir::new();
        let run = finish(under_bash(
            &dir,
            &format!("ulimit -f {kib}"),
            &["--fixture", "case.json", "dispatch"],
        ));
        assert!((0..=2).contains(&run.code), "{kib} KiB: killed: {run:?}");
        seen.insert(run.code);
        match run.code {
            2 => {
                run.assert_error(&run_error_code(&run));
                assert_eq!(operations(&dir), 0, "{kib} KiB: exit 2 after an intent was accepted");
            }
            1 => {
                assert_eq!(run.text("/code"), "OUTCOME_UNKNOWN", "{kib} KiB: {run:?}");
                settle(&dir, &run.text("/status_ref"));
            }
            _ => settle(&dir, &run.text("/status_ref")),
        }
    }
    // The sweep reached the store's creation (2), the middle of the flow (1) and the
    // end (0): every class was exercised.
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
}

fn run_error_code(run: &Run) -> String {
    let value: Value = serde_json::from_str(run.stderr.trim_end()).unwrap();
    value["error"]["code"].as_str().unwrap().to_owned()
}

/// The answer cannot be written after commit C: exit 1 with nothing, never 2 (and
/// never 0, which promises an answer on stdout). The refund is done once.
#[test]
fn an_answer_that_cannot_be_written_exits_1_never_2() {
    let full = Dir::new();
    let mut command = full.command(&["--fixture", "case.json", "dispatch"]);
    command.stdout(std::fs::File::options().write(true).open("/dev/full").unwrap());
    let run = finish_to(&mut command);
    assert_eq!((run.code, run.stderr.as_str()), (1, ""), "{run:?}");
    assert_eq!(full.run(&["--fixture", "case.json", "dispatch"]).text("/delivery"), "local_replay");
    assert_eq!(full.db_int("SELECT count(*) FROM downstream_receipts"), 1);

    // A pipe whose reader is gone (EPIPE), and a descriptor open only for reading.
    for setup in ["pipe", "read-only"] {
        let dir = Dir::new();
        let run = match setup {
            "pipe" => {
                let mut command = Command::new("python3");
                command.current_dir(dir.path()).args([
                    "-c",
                    "import os, subprocess, sys\n\
                     r, w = os.pipe()\nos.close(r)\n\
                     sys.exit(subprocess.call(sys.argv[1:], stdout=w))",
                    BIN,
                    "--fixture",
                    "case.json",
                    "dispatch",
                ]);
                finish(command)
            }
            _ => finish(under_bash(&dir, "1</dev/null", &["--fixture", "case.json", "dispatch"])),
        };
        assert_eq!(run.code, 1, "{setup}: {run:?}");
        let replay = dir.run(&["--fixture", "case.json", "dispatch"]);
        assert_eq!(replay.text("/delivery"), "local_replay", "{setup}");
        assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 1, "{setup}");
    }

    // A closed stdout: Rust's runtime reopens a closed standard descriptor on
    // /dev/null before `main`, so the command runs as with `>/dev/null`: its exit code
    // is still the truth, and the refund happens once.
    let closed = Dir::new();
    let run = finish(under_bash(&closed, ">&-", &["--fixture", "case.json", "dispatch"]));
    assert_eq!(run.code, 0, "{run:?}");
    let replay = closed.run(&["--fixture", "case.json", "dispatch"]);
    assert_eq!(replay.text("/delivery"), "local_replay");
}

/// A connection holding the write lock (`BEGIN EXCLUSIVE`), or every lock
/// (`locking_mode=EXCLUSIVE`), for longer than the bound: each command answers
/// STORE_BUSY while the lock is still held, and nothing is accepted.
#[test]
fn a_stalled_lock_holder_is_answered_store_busy_within_the_bound() {
    let dir = Dir::new();
    let accepted =
        dir.run(&["--fixture", "case.json", "dispatch", "--failure", "after_intent_commit"]);
    let status_ref = accepted.text("/status_ref");
    dir.write_case("other.json", |case| {
        case["host_context"]["idempotency_key"] = Value::from("busy-key-2");
        case["host_context"]["provider_call_id"] = Value::from("call-busy-2");
    });
    for setup in ["BEGIN EXCLUSIVE;", "PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE;"] {
        let (release, released) = mpsc::channel::<()>();
        let (held, holding) = mpsc::channel::<()>();
        let path = dir.join("toolledger.sqlite3");
        let setup_sql = setup.to_owned();
        let holder = thread::spawn(move || {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute_batch(&setup_sql).unwrap();
            conn.execute_batch("UPDATE meta SET value = value WHERE key = 'schema_id'").unwrap();
            held.send(()).unwrap();
            // Hold far longer than any bound; the test releases it once it has its answers.
            let _ = released.recv_timeout(std::time::Duration::from_secs(120));
            conn.execute_batch("ROLLBACK").unwrap();
        });
        holding.recv().unwrap();
        let bound = ["--busy-timeout-ms", "300"];
        let mut commands: Vec<Vec<&str>> = vec![
            vec!["--fixture", "other.json", "dispatch"],
            vec!["--fixture", "case.json", "process", "--status-ref", &status_ref],
            vec!["--fixture", "case.json", "status", "--status-ref", &status_ref],
        ];
        if setup.contains("locking_mode") {
            commands.push(vec!["audit"]);
        }
        for args in commands {
            let mut all = bound.to_vec();
            all.extend_from_slice(&args);
            let mut command = Command::new(BIN);
            command.current_dir(dir.path()).args(&all).stdin(Stdio::null());
            let run = finish(command);
            run.assert_error("STORE_BUSY");
            assert!(holder_is_holding(&holder), "{setup} {args:?}: answered only after release");
        }
        release.send(()).unwrap();
        holder.join().unwrap();
    }
    assert_eq!(dir.db_int("SELECT count(*) FROM operations"), 1);
    assert_eq!(dir.db_int("SELECT count(*) FROM outbox WHERE attempt_count = 0"), 1);
}

fn holder_is_holding(holder: &thread::JoinHandle<()>) -> bool {
    !holder.is_finished()
}

/// Case and claims files are read at most one byte past the limit, and what is not a
/// regular file is refused before it is read: a FIFO does not block, /dev/zero and a
/// 2 GB sparse file do not fill memory. The message says why, never where.
#[test]
fn case_and_claims_reads_are_bounded() {
    let dir = Dir::new();
    assert!(Command::new("mkfifo").arg(dir.join("fifo")).status().unwrap().success());
    std::fs::File::create(dir.join("huge.json")).unwrap().set_len(2 << 30).unwrap();
    let memory = "ulimit -v 1000000"; // 1 GB of address space: a 2 GB read cannot fit
    for (path, why, code) in [
        ("fifo", "not a regular file", "FIXTURE_IO_ERROR"),
        ("/dev/zero", "not a regular file", "FIXTURE_IO_ERROR"),
        (".", "not a regular file", "FIXTURE_IO_ERROR"),
        ("missing.json", "not found", "FIXTURE_IO_ERROR"),
        ("huge.json", "larger than", "FIXTURE_INVALID"),
    ] {
        let run = finish(under_bash(&dir, memory, &["--fixture", path, "dispatch"]));
        run.assert_error(code);
        assert!(run.stderr.contains(why), "{path}: {}", run.stderr);
        let run = finish(under_bash(
            &dir,
            memory,
            &["--fixture", "case.json", "--claims", path, "dispatch"],
        ));
        let claims_code = code.replace("FIXTURE", "CLAIMS");
        run.assert_error(&claims_code);
        assert!(run.stderr.contains(why), "{path}: {}", run.stderr);
    }
    assert!(!dir.join("toolledger.sqlite3").exists());
}

/// Small edges: a panic with stderr unwritable, options a command does not use, a
/// stray positional argument, a non-canonical `--now`.
#[test]
fn small_edges_answer_cleanly() {
    let dir = Dir::new();
    let mut command = dir.command(&["--fixture", "case.json", "dispatch"]);
    command
        .env("TOOLLEDGER_TEST_PANIC", "1")
        .stderr(std::fs::File::options().write(true).open("/dev/full").unwrap())
        .stdout(Stdio::piped());
    let status = command.status().unwrap();
    assert_eq!(status.code(), Some(2), "a panic with stderr unwritable");

    for args in [
        &["--db", "x.sqlite3", "demo"][..],
        &["--fixture", "case.json", "demo"],
        &["--pretty", "demo"],
        &["--fixture", "case.json", "audit"],
        &["--claims", "claims.json", "audit"],
    ] {
        let run = dir.run(args);
        run.assert_error("USAGE_ERROR");
        assert!(run.stderr.contains("does not take"), "{args:?}: {}", run.stderr);
    }
    assert!(!dir.join("x.sqlite3").exists());

    let stray = dir.run(&["--fixture", "case.json", "dispatch", "stray"]);
    stray.assert_error("USAGE_ERROR");
    assert!(stray.stderr.contains("positional"), "{}", stray.stderr);
    assert!(!stray.stderr.contains("stray"), "{}", stray.stderr);

    for now in ["+1767225600", "01767225600", "-0", "1767225600.0", " 1767225600"] {
        dir.run(&["--fixture", "case.json", "dispatch", "--now", now]).assert_error("USAGE_ERROR");
    }
    assert!(!dir.join("toolledger.sqlite3").exists());
}
