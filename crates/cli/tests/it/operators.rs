//! The operator's commands: list, show, requeue, metrics (checked by Prometheus's own
//! `promtool`), gc with tombstones, and the relay's metrics endpoint.

use std::{
    collections::BTreeMap,
    io::Write,
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
    dir.run(&["--fixture", "case.json", "relay", "--metrics-listen", "0.0.0.0:0"])
        .assert_error("USAGE_ERROR");
    let mut relay = crate::listeners::Listening::relay(&dir);
    let get = |path: &str| crate::listeners::get(&relay.addr, path, "");
    let response = get("/metrics");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("Content-Type: text/plain; version=0.0.4"));
    let body = response.split_once("\r\n\r\n").unwrap().1;
    promtool(body);
    assert!(get("/other").starts_with("HTTP/1.1 404"));
    assert_eq!(relay.terminate().0, Some(0));
}

/// A ledger whose schema was changed by hand is refused by every command but `audit`,
/// before it reads or writes (before: `list`, `show`, `metrics` and `serve` answered as
/// if healthy, `requeue` and `gc` wrote into it, and PostgreSQL's `migrate` passed it).
#[test]
fn every_command_but_audit_refuses_a_damaged_store() {
    let tampers: [&[&str]; 4] = if crate::on_postgres() {
        [
            &["DROP INDEX outbox_due"],
            &["DROP TRIGGER operator_log_no_update ON operator_log"],
            &["ALTER TABLE outbox ADD COLUMN note TEXT"],
            &["DROP TABLE counters"],
        ]
    } else {
        [
            &["DROP INDEX outbox_due"],
            &["DROP TRIGGER operator_log_no_update", "DROP TRIGGER operator_log_no_delete"],
            &["CREATE TABLE notes (id INTEGER PRIMARY KEY)"],
            &["DROP TABLE counters"],
        ]
    };
    for tamper in tampers {
        let dir = Dir::new();
        let pass = dir.run(&["--fixture", "case.json", "dispatch"]);
        let status_ref = pass.text("/status_ref");
        accepted(&dir, 1);
        let unavailable = ["--simulate-unavailable", "100", "--max-attempts", "1"];
        assert_eq!(relay(&dir, T + 1, &unavailable).answer()["relay"]["dead"], Value::from(1));
        for sql in tamper {
            dir.db_execute(sql);
        }
        let rows = |dir: &Dir| {
            ["operations", "outbox", "operator_log", "tombstones"]
                .map(|table| dir.db_int(&format!("SELECT count(*) FROM {table}")))
        };
        let before = rows(&dir);
        let dead = dir.db_text("SELECT status_ref FROM operations WHERE status = 'dead'");
        let later = (T + 400 * 86_400).to_string();
        for args in [
            &["list"][..],
            &["list", "--state", "succeeded"],
            &["show", "--status-ref", &status_ref],
            &["metrics"],
            &["requeue", "--status-ref", &dead, "--reason", "try again"],
            &["gc", "--older-than-days", "1", "--now", &later],
            &["migrate", "--downstream", "toolledger-stand-in@1"],
            &["--fixture", "case.json", "dispatch"],
            &["--fixture", "case.json", "status", "--status-ref", &status_ref],
            &["--fixture", "case.json", "process", "--status-ref", &dead],
            &["--fixture", "case.json", "relay", "--once"],
        ] {
            dir.run(args).assert_error("SCHEMA_UNSUPPORTED");
        }
        // The dashboard refuses to start on it rather than report it healthy.
        let mut serve = dir.command(&["serve", "--listen", "127.0.0.1:0"]);
        serve.stdout(Stdio::piped()).stderr(Stdio::piped());
        let served = crate::finish(serve);
        assert_eq!(served.code, 2, "{served:?}");
        assert!(served.stderr.contains("SCHEMA_UNSUPPORTED"), "{served:?}");
        assert_eq!(rows(&dir), before, "{tamper:?}");
        // The audit reads it and names what differs.
        let audit = dir.run(&["audit"]);
        assert_eq!(audit.code, 1, "{audit:?}");
        assert_eq!(audit.answer()["checks"]["schema_matches"], false, "{audit:?}");
    }
}

/// `list` with no age filter lists every operation, whenever it changed (before: one
/// changed after the caller's `--now`, or by a database clock ahead of the host's, was
/// hidden while `metrics` counted it), and ages are never negative.
#[test]
fn list_shows_what_changed_after_the_callers_clock() {
    let dir = Dir::new();
    let pass = dir.run(&["--fixture", "case.json", "dispatch", "--now", &(T + 100).to_string()]);
    assert_eq!(pass.code, 0, "{pass:?}");
    let early = (T + 50).to_string();
    let listed = dir.run(&["list", "--state", "succeeded", "--now", &early]);
    assert_eq!(listed.stdout.lines().count(), 1, "{listed:?}");
    let line: Value = serde_json::from_str(listed.stdout.trim()).unwrap();
    assert_eq!((line["age_seconds"].as_i64(), line["idle_seconds"].as_i64()), (Some(0), Some(0)));
    let metrics = dir.run(&["metrics", "--now", &early]).stdout;
    assert_eq!(samples(&metrics, "toolledger_operations")["succeeded"], 1);
    // An age filter still filters: unchanged for 10 s is judged at the given instant.
    let aged = |now: i64| {
        let run = dir.run(&["list", "--older-than", "10", "--now", &now.to_string()]);
        run.stdout.lines().count()
    };
    assert_eq!((aged(T + 50), aged(T + 105), aged(T + 110)), (0, 0, 1));
}

/// A requeue reason is 1–512 bytes of text without control characters: anything else is
/// refused, never cut (before: 513 and 514 bytes were stored as 512).
#[test]
fn requeue_refuses_a_reason_it_would_have_to_cut() {
    let dir = Dir::new();
    accepted(&dir, 1);
    let unavailable = ["--simulate-unavailable", "100", "--max-attempts", "1"];
    assert_eq!(relay(&dir, T + 1, &unavailable).answer()["relay"]["dead"], Value::from(1));
    let dead = dir.db_text("SELECT status_ref FROM operations WHERE status = 'dead'");
    for reason in
        ["x".repeat(513), "é".repeat(257), "line\nbreak".to_owned(), "bell\u{7}".to_owned()]
    {
        let refused = dir.run(&["requeue", "--status-ref", &dead, "--reason", &reason]);
        refused.assert_error("USAGE_ERROR");
    }
    assert_eq!(dir.db_int("SELECT count(*) FROM operator_log"), 0);
    let longest = "y".repeat(512);
    let kept = dir.run(&["requeue", "--status-ref", &dead, "--reason", &longest]);
    assert_eq!(kept.code, 0, "{kept:?}");
    assert_eq!(dir.db_text("SELECT reason FROM operator_log"), longest);
}

/// Retiring an operation frees its model call's identity with it (`docs/decisions.md`,
/// "Retention"): before `gc`, the same model call under another key is `CALL_REUSED`;
/// after it, the call is new to the ledger, while the retired key stays `KEY_RETIRED`.
#[test]
fn gc_frees_the_call_identity_with_the_key() {
    let dir = Dir::new();
    assert_eq!(dir.run(&["--fixture", "case.json", "dispatch"]).code, 0);
    dir.write_case("other-key.json", |case| {
        case["host_context"]["idempotency_key"] = Value::from("refund-ord-1001-after-gc");
    });
    let reused = dir.run(&["--fixture", "other-key.json", "dispatch"]);
    assert_eq!((reused.code, reused.text("/code")), (1, "CALL_REUSED".to_owned()), "{reused:?}");
    let gc = dir.run(&["gc", "--older-than-days", "1", "--now", &(T + 2 * 86_400).to_string()]);
    assert_eq!(gc.answer()["retired"], Value::from(1));
    let retired = dir.run(&["--fixture", "case.json", "dispatch"]);
    assert_eq!(retired.text("/code"), "KEY_RETIRED");
    let fresh = dir.run(&["--fixture", "other-key.json", "dispatch"]);
    assert_eq!((fresh.code, fresh.text("/delivery")), (0, "fresh".to_owned()), "{fresh:?}");
    assert_eq!(dir.run(&["audit"]).code, 0);
}

/// `resolve` settles an unknown operation on the operator's word, only once no worker
/// holds it, logs it, and the audit lists it; everything else is refused, nothing written.
#[test]
fn resolve_settles_an_unknown_operation_by_hand_and_the_audit_lists_it() {
    let dir = Dir::new();
    let unknown = dir.run(&["--fixture", "case.json", "dispatch", "--failure", "after_claim"]);
    assert_eq!(unknown.text("/code"), "OUTCOME_UNKNOWN");
    let status_ref = unknown.text("/status_ref");
    let resolve = |extra: &[&str]| {
        let mut args = vec!["resolve", "--status-ref", &status_ref];
        args.extend_from_slice(extra);
        dir.run(&args)
    };
    let later = (T + 3600).to_string();
    // While the worker's lease lives its call may be in flight: left alone.
    let held =
        resolve(&["--not-happened", "--reason", "checked the bank", "--now", &T.to_string()]);
    assert_eq!((held.code, held.text("/code")), (1, "LEASE_HELD".to_owned()), "{held:?}");
    // Bad input: no evidence, both, a reason it would have to cut, a receipt that is not
    // a readable JSON file, an unknown ref.
    for (args, code) in [
        (vec!["--reason", "x"], "USAGE_ERROR"),
        (vec!["--not-happened", "--receipt", "case.json", "--reason", "x"], "USAGE_ERROR"),
        (vec!["--not-happened", "--reason", "a\u{1b}b"], "USAGE_ERROR"),
        (vec!["--receipt", "missing.json", "--reason", "x"], "FIXTURE_IO_ERROR"),
    ] {
        resolve(&args).assert_error(code);
    }
    dir.write("not-json.json", b"{\"content\": [");
    resolve(&["--receipt", "not-json.json", "--reason", "x", "--now", &later])
        .assert_error("FIXTURE_INVALID");
    // The refund's output schema holds the receipt to the contract: nothing written.
    dir.write("off-schema.json", br#"{"refund_id": 7}"#);
    let off = resolve(&["--receipt", "off-schema.json", "--reason", "x", "--now", &later]);
    assert_eq!((off.code, off.text("/code")), (1, "INPUT_INVALID".to_owned()), "{off:?}");
    let missing = dir.run(&[
        "resolve",
        "--status-ref",
        "sr_00000000000000000000000000000000",
        "--not-happened",
        "--reason",
        "x",
    ]);
    assert_eq!((missing.code, missing.text("/code")), (1, "NOT_FOUND".to_owned()));
    assert_eq!(dir.run(&["show", "--status-ref", &status_ref]).answer()["status"], "processing");

    let settled =
        resolve(&["--not-happened", "--reason", "the bank has no such refund", "--now", &later]);
    assert_eq!((settled.code, settled.text("/status")), (0, "failed".to_owned()), "{settled:?}");
    let again = resolve(&["--not-happened", "--reason", "twice", "--now", &later]);
    assert_eq!((again.code, again.text("/code")), (1, "NOT_RESOLVABLE".to_owned()));
    assert_eq!(again.text("/status"), "failed");

    let shown = dir.run(&["show", "--status-ref", &status_ref]).answer();
    assert_eq!(shown["operator_log"][0]["action"], "resolve");
    assert_eq!(shown["operator_log"][0]["from"], "processing");
    assert_eq!(shown["operator_log"][0]["reason"], "the bank has no such refund");
    assert_eq!(
        shown["ended"]["reason"],
        "an operator found it did not happen: the bank has no such refund"
    );
    let audit = dir.run(&["audit"]);
    assert_eq!(audit.code, 0, "{audit:?}");
    assert_eq!(audit.answer()["resolved_by_operator"], serde_json::json!([status_ref]));
    // The key answers how it ended; a requeue sends it again.
    let replay = dir.run(&["--fixture", "case.json", "dispatch"]);
    assert_eq!(replay.code, 1, "{replay:?}");
    assert_eq!(replay.text("/status"), "failed");
    let requeued = dir.run(&["requeue", "--status-ref", &status_ref, "--reason", "send it"]);
    assert_eq!(requeued.text("/status"), "pending");
}
