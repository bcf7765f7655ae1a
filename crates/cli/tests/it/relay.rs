//! `toolledger relay`: drains what is due and exits with --once; otherwise runs until
//! SIGTERM, finishing what it holds, and exits 0 with its totals.

use std::{
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use serde_json::Value;

use crate::{Dir, operators::accepted};

#[test]
fn relay_once_drains_what_is_due_and_reports_its_totals() {
    let dir = Dir::new();
    accepted(&dir, 12);
    let run = dir.run(&[
        "--fixture",
        "case.json",
        "relay",
        "--once",
        "--concurrency",
        "3",
        "--batch",
        "5",
        "--log-format",
        "json",
        "--now",
        "1767225601",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.answer()["relay"]["delivered"], Value::from(12));
    // Progress lines are JSON objects naming counts, never paths.
    for line in run.stderr.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        assert_eq!(event["event"], "pass", "{line}");
        assert!(!line.contains(crate::SECRET));
    }
    assert_eq!(dir.db_int("SELECT count(*) FROM local_receipts"), 12);
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 12);
    assert_eq!(dir.run(&["audit"]).code, 0);
}

#[test]
fn a_running_relay_stops_cleanly_on_sigterm() {
    let dir = Dir::new();
    accepted(&dir, 3);
    let child = dir
        .command(&["--fixture", "case.json", "relay", "--poll-ms", "20", "--now", "1767225601"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the backlog is drained, then ask the relay to stop.
    for _ in 0..600 {
        if dir.db_int("SELECT count(*) FROM local_receipts") == 3 {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert!(
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success()
    );
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let totals: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(totals["relay"]["delivered"], Value::from(3));
    assert_eq!(dir.run(&["audit"]).code, 0);
}
