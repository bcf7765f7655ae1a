//! The operator's commands: list, show, requeue, metrics (checked by Prometheus's own
//! `promtool`), gc with tombstones, and the relay's metrics endpoint.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    process::{Command, Stdio},
};

use serde_json::Value;

use crate::{Dir, Run};

const T: i64 = 1_767_225_600;

/// Accepts `count` intents (each its own key and model call), none worked.
pub(crate) fn accepted(dir: &Dir, count: usize) {
    for n in 0..count {
        let name = format!("op-{n}.json");
        dir.write_case(&name, |case| {
            case["host_context"]["idempotency_key"] = Value::from(format!("op-key-{n}"));
            case["host_context"]["provider_call_id"] = Value::from(format!("call-op-{n}"));
        });
        let run = dir.run(&["--fixture", &name, "dispatch", "--failure", "after_intent_commit"]);
        assert_eq!(run.text("/code"), "OUTCOME_UNKNOWN");
    }
}

fn relay(dir: &Dir, now: i64, extra: &[&str]) -> Run {
    let now = now.to_string();
    let mut args = vec!["--fixture", "case.json", "relay", "--once", "--now", &now];
    args.extend_from_slice(extra);
    let run = dir.run(&args);
    assert_eq!(run.code, 0, "{run:?}");
    run
}

/// `promtool check metrics` on `text`: Prometheus's own parser and linter. A machine
/// without promtool fails this test (`.ci/run` installs it).
pub(crate) fn promtool(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package) must be installed: .ci/run installs it");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "promtool: {output:?}\n{text}");
    assert!(output.stdout.is_empty() && output.stderr.is_empty(), "promtool lint: {output:?}");
}

/// `name{state="s"} value` samples of one family.
pub(crate) fn samples(text: &str, family: &str) -> BTreeMap<String, i64> {
    text.lines()
        .filter_map(|line| line.strip_prefix(&format!("{family}{{state=\"")))
        .filter_map(|rest| rest.split_once("\"} "))
        .map(|(state, value)| (state.to_owned(), value.parse().unwrap()))
        .collect()
}

pub(crate) fn scalar(text: &str, name: &str) -> i64 {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} missing"))
        .parse()
        .unwrap()
}

/// Counts by state from `list`, every line a canonical JSON object.
pub(crate) fn listed(dir: &Dir, now: i64) -> BTreeMap<String, i64> {
    let run = dir.run(&["list", "--limit", "10000", "--now", &now.to_string()]);
    assert_eq!(run.code, 0, "{run:?}");
    let mut counts = BTreeMap::new();
    for line in run.stdout.lines() {
        let value = toolledger_json::parse_strict(line.as_bytes(), &Default::default()).unwrap();
        assert_eq!(toolledger_json::canonicalize(&value), line);
        assert!(value.get("arguments").is_none(), "arguments shown unasked");
        *counts.entry(value["state"].as_str().unwrap().to_owned()).or_default() += 1;
    }
    counts
}

#[test]
fn dead_letters_are_listed_shown_requeued_and_counted() {
    let dir = Dir::new();
    accepted(&dir, 3);
    let unavailable = ["--simulate-unavailable", "100", "--max-attempts", "2"];
    assert_eq!(relay(&dir, T + 1, &unavailable).answer()["relay"]["retried"], Value::from(3));
    assert_eq!(relay(&dir, T + 1000, &unavailable).answer()["relay"]["dead"], Value::from(3));

    let dead = dir.run(&["list", "--state", "dead", "--now", &(T + 1000).to_string()]);
    assert_eq!(dead.stdout.lines().count(), 3, "{dead:?}");
    let first: Value = serde_json::from_str(dead.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(first["last_reason"], "the simulation was unavailable");
    let status_ref = first["status_ref"].as_str().unwrap().to_owned();
    let with_arguments = dir.run(&["list", "--state", "dead", "--show-arguments", "--limit", "1"]);
    let line: Value = serde_json::from_str(with_arguments.stdout.trim()).unwrap();
    assert_eq!(line["arguments"]["order_id"], "ord-1001");

    let metrics = dir.run(&["metrics", "--now", &(T + 1000).to_string()]);
    promtool(&metrics.stdout);
    assert_eq!(scalar(&metrics.stdout, "toolledger_dead_letters"), 3);
    assert_eq!(scalar(&metrics.stdout, "toolledger_claims_total"), 6);

    let requeued = dir.run(&[
        "requeue",
        "--status-ref",
        &status_ref,
        "--reason",
        "the simulation is back",
        "--now",
        &(T + 1500).to_string(),
    ]);
    assert_eq!(
        (requeued.code, requeued.text("/status")),
        (0, "pending".to_owned()),
        "{requeued:?}"
    );
    let again = dir.run(&["requeue", "--status-ref", &status_ref, "--reason", "twice"]);
    assert_eq!((again.code, again.text("/code")), (1, "NOT_REQUEUEABLE".to_owned()));
    let shown = dir.run(&["show", "--status-ref", &status_ref]).answer();
    assert_eq!(shown["status"], "pending");
    assert_eq!(shown["operator_log"][0]["reason"], "the simulation is back");
    assert_eq!(shown["operator_log"][0]["was"], "the simulation was unavailable");
    assert_eq!(shown["outbox"]["attempts_before_requeue"], 2);

    let drained = relay(&dir, T + 2000, &[]).answer();
    assert_eq!(drained["relay"]["delivered"], Value::from(1));
    let metrics = dir.run(&["metrics", "--now", &(T + 2000).to_string()]).stdout;
    promtool(&metrics);
    let by_state = samples(&metrics, "toolledger_operations");
    assert_eq!((by_state["succeeded"], by_state["dead"]), (1, 2));
    // What metrics counts is what list lists.
    let listed = listed(&dir, T + 2000);
    for (state, count) in &by_state {
        assert_eq!(listed.get(state).copied().unwrap_or(0), *count, "{state}");
    }
    assert_eq!(dir.run(&["audit"]).code, 0);
}

#[test]
fn gc_retires_finished_operations_behind_tombstones() {
    let dir = Dir::new();
    let pass = dir.run(&["--fixture", "case.json", "dispatch"]);
    let status_ref = pass.text("/status_ref");
    let kept = dir.run(&["gc", "--older-than-days", "30", "--now", &(T + 86_400).to_string()]);
    assert_eq!(kept.answer()["retired"], Value::from(0));
    let gc = dir.run(&["gc", "--older-than-days", "1", "--now", &(T + 2 * 86_400).to_string()]);
    assert_eq!(gc.answer()["retired"], Value::from(1));
    assert_eq!(dir.db_int("SELECT count(*) FROM operations"), 0);
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 0);
    // The same key again is a new business decision, never a second refund.
    for args in [
        &["--fixture", "case.json", "dispatch"][..],
        &["--fixture", "case.json", "status", "--status-ref", &status_ref],
    ] {
        let run = dir.run(args);
        assert_eq!((run.code, run.text("/code")), (1, "KEY_RETIRED".to_owned()), "{run:?}");
    }
    let shown = dir.run(&["show", "--status-ref", &status_ref]).answer();
    assert_eq!(shown["status"], "retired");
    assert_eq!(shown["tombstone"]["final_status"], "succeeded");
    assert_eq!(dir.run(&["audit"]).code, 0);
    let metrics = dir.run(&["metrics"]).stdout;
    promtool(&metrics);
    assert_eq!(scalar(&metrics, "toolledger_retired_total"), 1);
}

#[test]
fn the_relay_serves_metrics_on_loopback_only() {
    let dir = Dir::new();
    accepted(&dir, 2);
    dir.run(&["--fixture", "case.json", "relay", "--metrics-listen", "0.0.0.0:0"])
        .assert_error("USAGE_ERROR");
    let mut child = dir
        .command(&[
            "--fixture",
            "case.json",
            "relay",
            "--poll-ms",
            "20",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    let addr = first.trim().strip_prefix("relay metrics listening on ").unwrap().to_owned();
    let get = |path: &str| {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    };
    let response = get("/metrics");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("Content-Type: text/plain; version=0.0.4"));
    let body = response.split_once("\r\n\r\n").unwrap().1;
    promtool(body);
    assert!(get("/other").starts_with("HTTP/1.1 404"));
    assert!(
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success()
    );
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
