//! Real I/O faults under the SQLite store: a write or sync failed by an `LD_PRELOAD` shim
//! at every point of a dispatch and of a worker's call, a filesystem that is really
//! full, and a WAL checkpoint stalled by a long reader. Each command answers cleanly
//! (exit 2 with nothing accepted, or `OUTCOME_UNKNOWN` once an intent is accepted), no
//! acknowledged result is lost, and once the fault is gone the audit passes and every
//! accepted call settles to exactly one downstream receipt.
//!
//! SQLite files only: `cargo xtask ci` does not run this module with PostgreSQL ledgers.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::Value;

use crate::{Dir, Run, SECRET, finish};

const LATER: &str = "1767225700"; // past every lease a failed call could hold

/// Text that must never reach an answer: the directory, the file names, SQL, the OS's
/// and SQLite's own error messages, a panic.
const LEAKS: [&str; 15] = [
    SECRET,
    "/tmp",
    ".sqlite3",
    "-wal",
    "os error",
    "Input/output error",
    "No space left",
    "disk I/O error",
    "database or disk is full",
    "SELECT",
    "INSERT",
    "UPDATE ",
    "panicked",
    "src/",
    "RUST_BACKTRACE",
];

/// Asserts that `run` ended by itself with a clean answer and returns what it says:
/// `Ok(status_ref)` for OK, `Err(Some(status_ref))` for `OUTCOME_UNKNOWN`, `Err(None)`
/// for an exit-2 error (whose shape and text `assert_error` checks).
fn answered(run: &Run, what: &str) -> Result<String, Option<String>> {
    for leak in LEAKS {
        assert!(!run.stdout.contains(leak), "{what}: stdout leaks {leak:?}: {run:?}");
        assert!(!run.stderr.contains(leak), "{what}: stderr leaks {leak:?}: {run:?}");
    }
    match run.code {
        0 => {
            assert_eq!(run.text("/code"), "OK", "{what}: {run:?}");
            Ok(run.text("/status_ref"))
        }
        1 => {
            assert_eq!(run.text("/code"), "OUTCOME_UNKNOWN", "{what}: {run:?}");
            Err(Some(run.text("/status_ref")))
        }
        2 => {
            let value: Value = serde_json::from_str(run.stderr.trim_end())
                .unwrap_or_else(|_| panic!("{what}: stderr is not one JSON line: {run:?}"));
            let code = value["error"]["code"].as_str().unwrap_or_default().to_owned();
            assert!(["STORE_ERROR", "STORE_BUSY"].contains(&code.as_str()), "{what}: {run:?}");
            run.assert_error(&code);
            Err(None)
        }
        _ => panic!("{what}: killed or an unknown exit code: {run:?}"),
    }
}

/// Writes `NAME.json`, the PASS case under its own idempotency key and model call.
fn case(dir: &Dir, name: &str) -> String {
    let file = format!("{name}.json");
    dir.write_case(&file, |case| {
        case["host_context"]["idempotency_key"] = Value::from(format!("key-{name}"));
        case["host_context"]["provider_call_id"] = Value::from(format!("call-{name}"));
    });
    file
}

/// The status_ref of the operation accepted under `NAME`'s key, if any.
fn accepted(dir: &Dir, name: &str) -> Option<String> {
    let rows = dir.db_rows(&format!(
        "SELECT status_ref FROM operations WHERE idempotency_key = 'key-{name}'"
    ));
    rows.into_iter().next().and_then(|row| row.into_iter().next().flatten())
}

/// Downstream receipts of the operation accepted under `NAME`'s key.
fn receipts(dir: &Dir, name: &str) -> i64 {
    dir.db_int(&format!(
        "SELECT count(*) FROM downstream_receipts d JOIN operations o \
         ON o.downstream_request_ref = d.downstream_request_ref WHERE o.idempotency_key = 'key-{name}'"
    ))
}

/// With the fault gone: the audit passes, and the call under `NAME` is driven to its
/// end through the public recovery path (dispatched again when nothing was accepted,
/// else a status query and, if that cannot settle it, a worker after the lease). It
/// ends with exactly one downstream receipt; its status_ref is returned.
fn settle(dir: &Dir, name: &str, what: &str) -> String {
    let audit = dir.run(&["audit"]);
    assert_eq!(audit.code, 0, "{what}: the audit after the fault: {audit:?}");
    let file = format!("{name}.json");
    let status_ref = match accepted(dir, name) {
        None => {
            let again = dir.run(&["--fixture", &file, "dispatch"]);
            assert_eq!(again.text("/code"), "OK", "{what}: dispatched again: {again:?}");
            again.text("/status_ref")
        }
        Some(status_ref) => {
            let ended = dir.recover(&file, &status_ref, LATER);
            assert_eq!(ended.text("/code"), "OK", "{what}: {ended:?}");
            status_ref
        }
    };
    assert_eq!(receipts(dir, name), 1, "{what}: downstream receipts");
    status_ref
}

/// Every acknowledged call is in the ledger as succeeded with its local receipt under
/// the status_ref it was acknowledged with (one in 16 is also replayed through the
/// command: `local_replay`), and the ledger holds one operation, one downstream receipt
/// and one local receipt per call.
fn assert_nothing_lost(dir: &Dir, acknowledged: &BTreeMap<String, String>, calls: usize) {
    let succeeded: std::collections::BTreeSet<String> = dir
        .db_rows(
            "SELECT o.status_ref FROM operations o JOIN local_receipts l ON l.op_id = o.id \
             WHERE o.status = 'succeeded'",
        )
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect();
    for (index, (name, status_ref)) in acknowledged.iter().enumerate() {
        assert!(succeeded.contains(status_ref), "{name}: acknowledged, then lost");
        if index % 16 == 0 {
            let replay = dir.run(&["--fixture", &format!("{name}.json"), "dispatch"]);
            assert_eq!(replay.text("/delivery"), "local_replay", "{name}: {replay:?}");
            assert_eq!(&replay.text("/status_ref"), status_ref, "{name}");
        }
    }
    let calls = i64::try_from(calls).unwrap();
    for table in ["operations", "downstream_receipts", "local_receipts"] {
        assert_eq!(dir.db_int(&format!("SELECT count(*) FROM {table}")), calls, "{table}");
    }
    assert_eq!(dir.run(&["audit"]).code, 0);
}

// --- I/O errors by LD_PRELOAD ---------------------------------------------------------

/// `iofault_shim.c` compiled for this test run (once), as a path to preload. Built under
/// a name of this process and renamed into place, so test runs side by side never load
/// a half-written library.
fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let building = target.join(format!("iofault_shim-{}.so", std::process::id()));
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/iofault_shim.c");
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&building)
            .arg(&source)
            .arg("-ldl")
            .output()
            .expect("a C compiler (cc) is needed to build the fault shim");
        assert!(built.status.success(), "the fault shim does not compile: {built:?}");
        let out = target.join("iofault_shim.so");
        std::fs::rename(&building, &out).unwrap();
        out
    })
}

/// One fault: the `after`th write or sync (`IOFAULT_OP=any`) on a file of the test's
/// directory fails with `errno`, or every one from it on when `sticky`.
#[derive(Clone, Copy, Debug)]
struct Fault {
    after: usize,
    sticky: bool,
    errno: &'static str,
}

/// Runs `toolledger <args>` with the shim preloaded; `after = 0` only counts. Returns
/// the run and how many writes and syncs it made on the directory's files.
fn under_shim(dir: &Dir, args: &[&str], fault: Fault) -> (Run, usize) {
    // Beside the test's directory, not in it: the report's own write is not counted.
    let report = dir.path().with_file_name("iofault-count");
    let _ = std::fs::remove_file(&report);
    let mut command = dir.command(args);
    command
        .env("LD_PRELOAD", shim())
        .env("IOFAULT_OP", "any")
        .env("IOFAULT_PATH", dir.path())
        .env("IOFAULT_AFTER", fault.after.to_string())
        .env("IOFAULT_STICKY", if fault.sticky { "1" } else { "0" })
        .env("IOFAULT_ERRNO", fault.errno)
        .env("IOFAULT_REPORT", &report);
    let run = finish(command);
    let count = std::fs::read_to_string(&report)
        .unwrap_or_else(|_| panic!("the shim reported no count: {run:?}"));
    (run, count.trim().parse().unwrap())
}

/// How one sweep's faulted runs were answered: OK, OUTCOME_UNKNOWN, exit 2.
#[derive(Debug, Default, PartialEq)]
struct Tally {
    ok: usize,
    unknown: usize,
    refused: usize,
}

impl Tally {
    fn add(&mut self, answer: &Result<String, Option<String>>) {
        match answer {
            Ok(_) => self.ok += 1,
            Err(Some(_)) => self.unknown += 1,
            Err(None) => self.refused += 1,
        }
    }
}

/// A dispatch of a new intent into a ledger that already holds acknowledged calls,
/// with each of its writes and syncs failed in turn: once (EIO, a transient error) and
/// from that call on (ENOSPC, a disk that stays full until the process ends).
#[test]
fn an_io_error_at_any_write_or_sync_of_a_dispatch_is_answered_honestly() {
    for (sticky, errno) in [(false, "EIO"), (true, "ENOSPC")] {
        let dir = Dir::new();
        let mut acknowledged = BTreeMap::new();
        let first = case(&dir, "first");
        let run = dir.run(&["--fixture", &first, "dispatch"]);
        acknowledged.insert("first".to_owned(), answered(&run, "first").unwrap());

        // Count the writes and syncs of one such dispatch: the points to fail.
        let counted = case(&dir, "counted");
        let no_fault = Fault { after: 0, sticky, errno };
        let (run, points) = under_shim(&dir, &["--fixture", &counted, "dispatch"], no_fault);
        acknowledged.insert("counted".to_owned(), answered(&run, "counted").unwrap());
        assert!(points >= 10, "a dispatch made only {points} writes and syncs");

        let mut tally = Tally::default();
        let mut in_doubt = 0;
        // Two points past the count: the sweep also ends where no fault is hit.
        for after in 1..=points + 2 {
            let what = format!("{errno} at write/sync {after} of {points}");
            let name = format!("fault-{after}");
            let file = case(&dir, &name);
            let fault = Fault { after, sticky, errno };
            let (run, _) = under_shim(&dir, &["--fixture", &file, "dispatch"], fault);
            let answer = answered(&run, &what);
            tally.add(&answer);
            let stored = accepted(&dir, &name);
            match &answer {
                Err(None) => assert_eq!(stored, None, "{what}: exit 2 after commit A"),
                // OUTCOME_UNKNOWN with no status: commit A failed while committing, so
                // whether it holds is unknown; the status_ref is the intent's either way.
                Err(Some(status_ref)) if run.text("/status").is_empty() => {
                    in_doubt += 1;
                    assert!(
                        stored.is_none() || stored.as_ref() == Some(status_ref),
                        "{what}: another operation under the key"
                    );
                }
                Ok(status_ref) | Err(Some(status_ref)) => {
                    assert_eq!(stored.as_ref(), Some(status_ref), "{what}: not in the ledger")
                }
            }
            let status_ref = settle(&dir, &name, &what);
            if let Ok(answered) = answer {
                assert_eq!(answered, status_ref, "{what}");
            }
            acknowledged.insert(name, status_ref);
        }
        println!("{errno} (sticky: {sticky}), {points} points: {tally:?}");
        // The sweep reached commit A (exit 2), the calls after it (OUTCOME_UNKNOWN) and
        // the end where nothing failed (OK): every class was exercised.
        assert!(tally.refused > 0 && tally.unknown > 0 && tally.ok > 0, "{errno}: {tally:?}");
        // A failed sync of commit A's own COMMIT: its frames may be in the WAL, so the
        // answer is OUTCOME_UNKNOWN, never exit 2.
        assert!(in_doubt > 0, "{errno}: no fault hit commit A's COMMIT");
        println!("{errno}: {in_doubt} answers with commit A in doubt");
        assert_nothing_lost(&dir, &acknowledged, acknowledged.len());
    }
}

/// A worker (`process`) taking over an accepted intent, with each of its writes and
/// syncs failed once: exit 2 only when it had claimed nothing, else `OUTCOME_UNKNOWN`;
/// the intent is never lost and settles to one receipt.
#[test]
fn an_io_error_at_any_write_or_sync_of_a_worker_is_answered_honestly() {
    let dir = Dir::new();
    let mut acknowledged = BTreeMap::new();
    // Commit A alone: a pending intent, the worker's to claim.
    let enqueue = |name: &str| {
        let file = case(&dir, name);
        let run = dir.run(&["--fixture", &file, "dispatch", "--failure", "after_intent_commit"]);
        assert_eq!(run.text("/code"), "OUTCOME_UNKNOWN", "{name}: {run:?}");
        (file, run.text("/status_ref"))
    };
    let (counted, status_ref) = enqueue("counted");
    let no_fault = Fault { after: 0, sticky: false, errno: "EIO" };
    let args = ["--fixture", &counted, "process", "--status-ref", &status_ref];
    let (run, points) = under_shim(&dir, &args, no_fault);
    acknowledged.insert("counted".to_owned(), answered(&run, "counted").unwrap());
    assert!(points >= 5, "a worker made only {points} writes and syncs");

    let mut tally = Tally::default();
    for after in 1..=points + 2 {
        let what = format!("EIO at write/sync {after} of {points} of a worker");
        let name = format!("worked-{after}");
        let (file, status_ref) = enqueue(&name);
        let fault = Fault { after, sticky: false, errno: "EIO" };
        let args = ["--fixture", &file, "process", "--status-ref", &status_ref];
        let (run, _) = under_shim(&dir, &args, fault);
        let answer = answered(&run, &what);
        tally.add(&answer);
        match &answer {
            Ok(answered) | Err(Some(answered)) => assert_eq!(answered, &status_ref, "{what}"),
            // Exit 2 says this worker did nothing: the intent is still pending, unclaimed.
            Err(None) => assert_eq!(
                dir.db_text(&format!(
                    "SELECT b.state || '/' || b.attempt_count FROM outbox b JOIN operations o \
                     ON o.id = b.op_id WHERE o.status_ref = '{status_ref}'"
                )),
                "pending/0",
                "{what}: exit 2 after the claim"
            ),
        }
        // The intent was accepted before the worker ran: whatever the worker answered,
        // it is still there.
        assert_eq!(accepted(&dir, &name), Some(status_ref.clone()), "{what}: intent lost");
        assert_eq!(settle(&dir, &name, &what), status_ref);
        acknowledged.insert(name, status_ref);
    }
    println!("worker, {points} points: {tally:?}");
    assert!(tally.refused > 0 && tally.unknown > 0 && tally.ok > 0, "{tally:?}");
    assert_nothing_lost(&dir, &acknowledged, acknowledged.len());
}

// --- A full disk ------------------------------------------------------------------------

/// How the full disk of [`a_full_disk_is_answered_honestly_and_loses_nothing`] is made.
enum Disk {
    /// A small filesystem (tmpfs, or else an ext4 image on a loop device) mounted over
    /// the test's directory: a real `ENOSPC`, from every file's writes together.
    Mounted { point: PathBuf, kind: &'static str },
    /// Mounting is not allowed here (no `CAP_SYS_ADMIN`): each command runs under a
    /// file-size limit (`ulimit -f`) of the room plus 32 KiB, the nearest fault an
    /// unprivileged process can make: `EFBIG` per file instead of `ENOSPC` for them all.
    FileSizeLimit,
}

impl Disk {
    /// Mounts a filesystem of `size_bytes` over `dir` (tmpfs first, then a loop-mounted
    /// ext4 image), or says that only a file-size limit is possible here.
    fn over(dir: &Dir, size_bytes: u64) -> Disk {
        let point = dir.path().to_owned();
        let tmpfs = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_bytes}"), "tmpfs"])
            .arg(&point)
            .output();
        if tmpfs.is_ok_and(|out| out.status.success()) {
            return Disk::Mounted { point, kind: "tmpfs" };
        }
        let image = point.with_file_name("disk.img");
        std::fs::File::create(&image).unwrap().set_len(size_bytes).unwrap();
        let made = Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image).output();
        if made.is_ok_and(|out| out.status.success()) {
            let mounted =
                Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&point).output();
            if mounted.is_ok_and(|out| out.status.success()) {
                return Disk::Mounted { point, kind: "loop-mounted ext4" };
            }
        }
        Disk::FileSizeLimit
    }

    fn kind(&self) -> &'static str {
        match self {
            Disk::Mounted { kind, .. } => kind,
            Disk::FileSizeLimit => "ulimit -f",
        }
    }

    /// Fills the disk but for `room_bytes` (a filler file beside the ledger).
    fn fill(&self, dir: &Dir, room_bytes: u64) {
        if let Disk::Mounted { .. } = self {
            let mut filler = std::fs::File::create(dir.join("filler")).unwrap();
            let mut written: u64 = 0;
            for chunk in [64 << 10, 4 << 10, 512] {
                let zeros = vec![0u8; chunk];
                // Bounded: the filesystem is a few MiB.
                for _ in 0..100_000 {
                    if filler.write_all(&zeros).is_err() {
                        break;
                    }
                    written += chunk as u64;
                }
            }
            filler.set_len(written.saturating_sub(room_bytes)).unwrap();
            filler.sync_all().unwrap();
        }
    }

    /// Frees what [`fill`](Self::fill) took.
    fn free(&self, dir: &Dir) {
        if let Disk::Mounted { .. } = self {
            std::fs::File::create(dir.join("filler")).unwrap();
        }
    }

    /// `toolledger <args>` on the full disk.
    fn run(&self, dir: &Dir, room_bytes: u64, args: &[&str]) -> Run {
        match self {
            Disk::Mounted { .. } => finish(dir.command(args)),
            Disk::FileSizeLimit => {
                // Each command starts a WAL of its own (the last to close the ledger
                // deletes it), so the limit is the room the WAL and the shared-memory
                // index (32 KiB) get; the ledger's main file, larger already, cannot grow.
                let kib = room_bytes / 1024 + 32;
                let mut command = Command::new("bash");
                command
                    .current_dir(dir.path())
                    .arg("-c")
                    .arg(format!("ulimit -f {kib}\nexec \"$0\" \"$@\""))
                    .arg(env!("CARGO_BIN_EXE_toolledger"))
                    .args(args);
                finish(command)
            }
        }
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        if let Disk::Mounted { point, .. } = self {
            // Lazy: a descriptor still open somewhere does not keep the mount alive.
            let _ = Command::new("umount").arg("-l").arg(&*point).status();
        }
    }
}

/// The ledger's filesystem fills up: in each round the disk is filled but for a little
/// room (0 to 120 KiB) and new calls are dispatched until one is not OK. Every answer is
/// clean; once the space is freed, the audit passes, the call that hit the full disk
/// settles to one receipt, and no acknowledged call is lost.
#[test]
fn a_full_disk_is_answered_honestly_and_loses_nothing() {
    let dir = Dir::new();
    let disk = Disk::over(&dir, 4 << 20);
    println!("full disk made by: {}", disk.kind());
    let mut acknowledged = BTreeMap::new();
    let first = case(&dir, "first");
    let run = disk.run(&dir, 1 << 20, &["--fixture", &first, "dispatch"]);
    acknowledged.insert("first".to_owned(), answered(&run, "first").unwrap());

    let mut tally = Tally::default();
    for room_kib in (0..=120).step_by(8) {
        // The case files are written while there is room for them.
        let names: Vec<String> = (0..6).map(|call| format!("full-{room_kib}-{call}")).collect();
        for name in &names {
            case(&dir, name);
        }
        disk.fill(&dir, room_kib << 10);
        let mut stopped = None;
        for (index, name) in names.iter().enumerate() {
            let what = format!("{} with {room_kib} KiB free, {name}", disk.kind());
            let args = ["--fixture", &format!("{name}.json"), "dispatch"];
            let answer = answered(&disk.run(&dir, room_kib << 10, &args), &what);
            tally.add(&answer);
            match answer {
                Ok(status_ref) => {
                    acknowledged.insert(name.clone(), status_ref);
                }
                Err(_) => {
                    stopped = Some((index, what));
                    break;
                }
            }
        }
        disk.free(&dir);
        let Some((index, what)) = stopped else {
            continue;
        };
        // Read only once the space is free: the test's own connection needs room too.
        let name = &names[index];
        let status_ref = settle(&dir, name, &what);
        acknowledged.insert(name.clone(), status_ref);
        for unused in &names[index + 1..] {
            assert_eq!(accepted(&dir, unused), None, "{unused} was never dispatched");
        }
    }
    println!("{}: {tally:?}", disk.kind());
    // Rounds with no room refused at commit A, rounds with room ended with OK, and some
    // ran out between commit A and commit C.
    assert!(tally.refused > 0 && tally.ok > 0 && tally.unknown > 0, "{tally:?}");
    assert_nothing_lost(&dir, &acknowledged, acknowledged.len());
    drop(disk);
}

// --- A WAL checkpoint stalled by a long reader ------------------------------------------

/// `PRAGMA wal_checkpoint(PASSIVE)` on `conn`: (busy, frames in the WAL, frames copied).
fn checkpoint(conn: &rusqlite::Connection) -> (i64, i64, i64) {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
    })
    .unwrap()
}

/// A reader holds one snapshot of the ledger while 200 calls are dispatched: no
/// checkpoint can copy a frame past it, so the WAL grows past the autocheckpoint size,
/// yet every dispatch answers OK. Once the reader ends, the next dispatch's process
/// checkpoints the whole WAL before it exits, the one after starts it over, and every
/// call is in the ledger.
#[test]
fn a_long_reader_stalls_the_wal_checkpoint_but_no_dispatch() {
    let dir = Dir::new();
    let mut acknowledged = BTreeMap::new();
    let first = case(&dir, "first");
    acknowledged.insert(
        "first".to_owned(),
        answered(&dir.run(&["--fixture", &first, "dispatch"]), "first").unwrap(),
    );
    let path = dir.join("toolledger.sqlite3");
    // An idle connection open throughout, so no command is the last to close the ledger
    // (which would checkpoint and delete the WAL): what happens to the WAL is the
    // commits' own doing.
    let observer = rusqlite::Connection::open(&path).unwrap();
    let page_bytes: i64 = observer.query_row("PRAGMA page_size", [], |row| row.get(0)).unwrap();
    let autocheckpoint_frames: i64 =
        observer.query_row("PRAGMA wal_autocheckpoint", [], |row| row.get(0)).unwrap();
    let reader = rusqlite::Connection::open(&path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let count = |conn: &rusqlite::Connection| -> i64 {
        conn.query_row("SELECT count(*) FROM operations", [], |row| row.get(0)).unwrap()
    };
    assert_eq!(count(&reader), 1);

    let calls: i64 = 200;
    for call in 0..calls {
        let name = format!("read-{call}");
        let file = case(&dir, &name);
        let run = dir.run(&["--fixture", &file, "dispatch"]);
        acknowledged.insert(
            name.clone(),
            answered(&run, &name).unwrap_or_else(|_| panic!("{name}: {run:?}")),
        );
    }
    // The stall, observed: the reader still sees its snapshot, the WAL holds more
    // frames than the autocheckpoint size, and a checkpoint copies none of them.
    assert_eq!(count(&reader), 1, "the reader's snapshot moved");
    let wal = dir.join("toolledger.sqlite3-wal");
    let wal_bytes = std::fs::metadata(&wal).unwrap().len();
    let stalled = checkpoint(&observer);
    println!("stalled: {wal_bytes} bytes of WAL, checkpoint {stalled:?}");
    assert!(stalled.1 > autocheckpoint_frames, "{stalled:?}");
    assert_eq!(stalled.2, 0, "a checkpoint copied frames past the reader: {stalled:?}");
    assert!(wal_bytes > u64::try_from(autocheckpoint_frames * page_bytes).unwrap());

    // The reader ends; the next dispatch's process, a lone writer, copies the whole WAL
    // once its commit is out of the writer gate, before the command exits, and the
    // dispatch after it starts the WAL over from its first frame.
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    let last = case(&dir, "last");
    acknowledged.insert(
        "last".to_owned(),
        answered(&dir.run(&["--fixture", &last, "dispatch"]), "last").unwrap(),
    );
    let caught_up = checkpoint(&observer);
    println!(
        "after the reader: {} bytes of WAL, checkpoint {caught_up:?}",
        std::fs::metadata(&wal).unwrap().len()
    );
    assert_eq!(caught_up.0, 0, "{caught_up:?}");
    assert_eq!(caught_up.1, caught_up.2, "the WAL was not copied: {caught_up:?}");
    let after = case(&dir, "after");
    acknowledged.insert(
        "after".to_owned(),
        answered(&dir.run(&["--fixture", &after, "dispatch"]), "after").unwrap(),
    );
    let started_over = checkpoint(&observer);
    println!("the next dispatch: checkpoint {started_over:?}");
    assert_eq!(started_over.0, 0, "{started_over:?}");
    assert!(
        started_over.1 < stalled.1 && started_over.1 < autocheckpoint_frames,
        "{started_over:?}"
    );
    assert_eq!(count(&observer), calls + 3);
    drop(observer);
    assert_nothing_lost(&dir, &acknowledged, acknowledged.len());
}

// --- Power loss ---------------------------------------------------------------------

/// Set in the power-loss test's child process: the directory its host works in.
const POWER_LOSS_HOST: &str = "TOOLLEDGER_TEST_POWER_LOSS_HOST";

/// What the power-loss host prints before each answer, among the test harness's lines.
const HOST_SAYS: &str = "power-loss-host: ";

/// Refund `key` of the power-loss test: one order per key, under the approval threshold.
fn power_loss_refund(key: usize) -> toolledger::Call {
    let order = format!("ord-{key}");
    toolledger::Call::new(
        "refund_order",
        serde_json::json!({"order_id": order, "amount_minor": 2599, "currency": "USD", "reason": "damaged"}),
    )
    .principal("tenant-a", "user-1")
    .idempotency_key(&format!("refund-{order}"))
    .model_call(toolledger::ModelCall::new(
        "openai",
        "responses",
        "openai-responses-2026-05",
        &format!("resp-{key}"),
        &format!("call-{key}"),
    ))
    .context(serde_json::json!({"orders": [{"order_id": order, "tenant_id": "tenant-a",
        "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]}))
    .at(1_767_225_600)
}

/// The power-loss test's ledger in `dir`: the refund tool (no approval under 50.00) and
/// the simulation's downstream, whose receipts (commit B) go to the same file.
fn power_loss_ledger(dir: &Path) -> toolledger::Ledger<toolledger::Simulated, toolledger::NoRoles> {
    toolledger::Ledger::builder(dir.join("toolledger.sqlite3"))
        .tool(toolledger::RefundOrder { approval_threshold_minor: Some(5_000) }.tool())
        .open_simulated(toolledger::NoRoles)
        .unwrap()
}

/// The host the power-loss test runs in a child process: three refunds dispatched and
/// acknowledged on stdout, then it holds the ledger open (a clean close would
/// checkpoint, and so sync, the WAL) until it is killed.
fn power_loss_host<D: toolledger::Downstream>(
    ledger: &toolledger::Ledger<D, toolledger::NoRoles>,
) -> ! {
    for key in 1..=3 {
        let reply = ledger.dispatch(&power_loss_refund(key)).unwrap();
        println!("{HOST_SAYS}{}", reply.canonical());
    }
    println!("{HOST_SAYS}done");
    loop {
        std::thread::park();
    }
}

/// The simulation, saying it cannot look its requests up: a downstream no status query
/// can reconcile a lost commit C from.
struct NoLookup(toolledger::Simulated);

impl toolledger::Downstream for NoLookup {
    fn identity(&self) -> &toolledger::DownstreamIdentity {
        self.0.identity()
    }

    fn is_simulation(&self) -> bool {
        true
    }

    fn execute(
        &self,
        request: &toolledger::DownstreamRequest,
        now: toolledger::Now,
    ) -> Result<toolledger::DownstreamReceipt, toolledger::DownstreamError> {
        self.0.execute(request, now)
    }

    fn lookup(
        &self,
        _: &toolledger::DownstreamRequest,
    ) -> Result<toolledger::Lookup, toolledger::DownstreamError> {
        Err(toolledger::DownstreamError::Unknown { reason: "no lookup".to_owned() })
    }

    fn can_look_up(&self, _: &str) -> bool {
        false
    }
}

/// The power-loss test's ledger in `dir` over a downstream that cannot look up.
fn power_loss_ledger_without_lookup(
    dir: &Path,
) -> toolledger::Ledger<NoLookup, toolledger::NoRoles> {
    let simulated = toolledger::simulated(dir.join("toolledger.sqlite3")).unwrap();
    toolledger::Ledger::builder(dir.join("toolledger.sqlite3"))
        .tool(toolledger::RefundOrder { approval_threshold_minor: Some(5_000) }.tool())
        .open(NoLookup(simulated), toolledger::NoRoles)
        .unwrap()
}

/// Runs the power-loss host of `test` (this binary again, the shim recording the WAL's
/// size at each real sync) until its three refunds are acknowledged, kills it, and
/// cuts the WAL back to its last sync, as a power loss would. Answers the
/// acknowledgements, and the WAL's bytes written and kept.
fn power_loss_after_three(dir: &Dir, test: &str) -> (Vec<Value>, u64, u64) {
    let synced = dir.path().with_file_name("synced-wal-bytes");
    let mut host = Host(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .env(POWER_LOSS_HOST, dir.path())
            .env("LD_PRELOAD", shim())
            .env("IOFAULT_OP", "sync")
            .env("IOFAULT_PATH", "toolledger.sqlite3-wal")
            .env("IOFAULT_AFTER", "0")
            .env("IOFAULT_SYNCED", &synced)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut acknowledged = Vec::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(host.0.stdout.take().unwrap())) {
        // The harness's own `test … ... ` may open the first line.
        let line = line.unwrap();
        let Some(said) = line.find(HOST_SAYS).map(|at| &line[at + HOST_SAYS.len()..]) else {
            continue;
        };
        if said == "done" {
            break;
        }
        let package: Value = serde_json::from_str(said).unwrap();
        assert_eq!((&package["code"], &package["delivery"]), (&"OK".into(), &"fresh".into()));
        acknowledged.push(package);
    }
    assert_eq!(acknowledged.len(), 3, "the host ended before its three refunds");
    drop(host);
    let wal = dir.join("toolledger.sqlite3-wal");
    let kept: u64 = std::fs::read_to_string(&synced).unwrap().trim().parse().unwrap();
    let written = std::fs::metadata(&wal).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&wal).unwrap().set_len(kept).unwrap();
    std::fs::remove_file(dir.join("toolledger.sqlite3-shm")).unwrap();
    (acknowledged, written, kept)
}

/// A downstream that cannot look its requests up could never reconcile a lost lazy
/// commit C: the acknowledged success would be an unknown only an operator can settle.
/// So each such success is synced before it is answered (`docs/schema.md`, "Lazy
/// commit C"). The same power loss as below takes nothing back: the WAL's last sync
/// holds every commit, and all three refunds replay as acknowledged.
#[test]
fn a_success_no_lookup_could_recover_is_synced_before_it_is_answered() {
    if let Some(dir) = std::env::var_os(POWER_LOSS_HOST) {
        power_loss_host(&power_loss_ledger_without_lookup(Path::new(&dir)));
    }
    let dir = Dir::new();
    let (acknowledged, written, kept) = power_loss_after_three(
        &dir,
        "iofaults::a_success_no_lookup_could_recover_is_synced_before_it_is_answered",
    );
    assert_eq!(kept, written, "every commit C reached the disk before it was answered");
    let statuses: Vec<String> = dir
        .db_rows("SELECT status FROM operations ORDER BY id")
        .into_iter()
        .map(|row| row[0].clone().unwrap())
        .collect();
    assert_eq!(statuses, ["succeeded", "succeeded", "succeeded"]);
    let ledger = power_loss_ledger_without_lookup(dir.path());
    for (key, package) in (1..=3).zip(&acknowledged) {
        let reply = ledger.dispatch(&power_loss_refund(key)).unwrap();
        let toolledger::Outcome::Replayed(receipt) = reply.outcome() else {
            panic!("not the acknowledged receipt: {:?}", reply.outcome());
        };
        assert_eq!(receipt.status_ref().as_str(), package["status_ref"]);
        assert_eq!(receipt.result_sha256(), package["result"]["digests"]["result_sha256"]);
    }
    drop(ledger);
    assert_eq!(dir.run(&["audit"]).code, 0);
}

/// The power-loss test's host process, killed with SIGKILL (and reaped) when dropped,
/// whatever the test's end.
struct Host(std::process::Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A success's commit C is lazy (`docs/schema.md`, "Commit points"): it reaches the OS
/// before the caller is answered, the disk with the next synced commit. Here the power
/// is cut after three acknowledged refunds: a host process (this test binary again,
/// with the shim preloaded to record the WAL's size at each of its real syncs)
/// dispatches them and is killed with SIGKILL, and the WAL is cut back to its size at
/// the last sync — exactly what a power loss keeps. The first two commits C were synced
/// by the next refund's commit A; the third is lost, leaving that refund as a crash
/// just after commit B would. Nothing contradicts an acknowledgement: the two replay
/// as answered, the third answers `OUTCOME_UNKNOWN` (never "nothing happened" nor
/// another receipt) until the status query reconciles it to the same receipt and
/// result digest, which every later replay repeats; the audit passes.
#[test]
fn an_acknowledged_success_is_reconciled_to_its_receipt_after_a_power_loss() {
    if let Some(dir) = std::env::var_os(POWER_LOSS_HOST) {
        power_loss_host(&power_loss_ledger(Path::new(&dir)));
    }
    let dir = Dir::new();
    // The power loss: what the disk holds is the WAL up to its last sync.
    let (acknowledged, written, kept) = power_loss_after_three(
        &dir,
        "iofaults::an_acknowledged_success_is_reconciled_to_its_receipt_after_a_power_loss",
    );
    assert!(kept < written, "the last commit C was synced ({kept} of {written} bytes)");
    let statuses = || {
        dir.db_rows("SELECT status FROM operations ORDER BY id")
            .into_iter()
            .map(|row| row[0].clone().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(statuses(), ["succeeded", "succeeded", "processing"]);
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 3);

    let ledger = power_loss_ledger(dir.path());
    let same = |reply: &toolledger::Reply, package: &Value| {
        let (toolledger::Outcome::Replayed(receipt) | toolledger::Outcome::Reconciled(receipt)) =
            reply.outcome()
        else {
            panic!("not the acknowledged receipt: {:?}", reply.outcome());
        };
        assert_eq!(receipt.status_ref().as_str(), package["status_ref"]);
        assert_eq!(receipt.result_sha256(), package["result"]["digests"]["result_sha256"]);
        assert_eq!(receipt.receipt_ref(), package["result"]["host_view"]["downstream_receipt_ref"]);
        assert_eq!(receipt.output(), &package["result"]["model_view"]);
    };
    for (key, package) in [1, 2].into_iter().zip(&acknowledged) {
        same(&ledger.dispatch(&power_loss_refund(key)).unwrap(), package);
    }
    let lost = &acknowledged[2];
    let call = power_loss_refund(3);
    let unknown = ledger.dispatch(&call).unwrap();
    let toolledger::Outcome::Unknown { status_ref } = unknown.outcome() else {
        panic!("the refund whose commit C was lost: {:?}", unknown.outcome());
    };
    assert_eq!(status_ref.as_str(), lost["status_ref"]);
    let reconciled = ledger.status(&call, status_ref).unwrap();
    assert!(matches!(reconciled.outcome(), toolledger::Outcome::Reconciled(_)));
    same(&reconciled, lost);
    same(&ledger.dispatch(&call).unwrap(), lost);
    drop(ledger);
    assert_eq!(statuses(), ["succeeded", "succeeded", "succeeded"]);
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 3);
    assert_eq!(dir.run(&["audit"]).code, 0);
}
