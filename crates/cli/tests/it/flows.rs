//! The flows of README "Use it", through the real binary: PASS and replay, BLOCK →
//! status → PASS, every failure point, leases via `--now`, revocation via `--claims`.

use serde_json::Value;

use crate::Dir;

const NOW: i64 = 1_767_225_600;

#[test]
fn pass_then_replay_with_byte_identical_digests() {
    let dir = Dir::new();
    let fresh = dir.run(&["--fixture", "case.json", "dispatch"]);
    assert_eq!(fresh.code, 0, "{fresh:?}");
    assert_eq!(fresh.text("/delivery"), "fresh");
    assert_eq!(fresh.stderr, "");
    let replay = dir.run(&["dispatch", "--fixture", "case.json"]);
    assert_eq!(replay.code, 0);
    assert_eq!(replay.text("/delivery"), "local_replay");
    for digest in ["/result/digests/request_sha256", "/result/digests/result_sha256"] {
        assert_eq!(fresh.text(digest), replay.text(digest), "{digest}");
    }
    assert_eq!(fresh.answer()["result"]["model_view"], replay.answer()["result"]["model_view"]);
    assert_eq!(toolledger_contract::verify_package(&replay.answer()), Ok(()));
    // --pretty is for people: the same object, indented.
    let pretty = dir.run(&["--pretty", "--fixture", "case.json", "dispatch"]);
    let value: Value = serde_json::from_str(&pretty.stdout).unwrap();
    assert!(pretty.stdout.contains("\n  \""));
    assert_eq!(value["result"]["digests"], replay.answer()["result"]["digests"]);
}

#[test]
fn block_then_status_then_pass() {
    let dir = Dir::new();
    let unknown =
        dir.run(&["--fixture", "case.json", "dispatch", "--failure", "after_downstream_commit"]);
    assert_eq!(unknown.code, 1, "{unknown:?}");
    assert_eq!(unknown.text("/code"), "OUTCOME_UNKNOWN");
    let status_ref = unknown.text("/status_ref");
    assert!(status_ref.starts_with("sr_"));

    let again = dir.run(&["--fixture", "case.json", "dispatch"]);
    assert_eq!((again.code, again.text("/code")), (1, "OUTCOME_UNKNOWN".to_owned()));

    let audit = dir.run(&["audit"]);
    assert_eq!(audit.code, 0, "{audit:?}");
    assert_eq!(audit.answer()["unreconciled_downstream_receipts"].as_array().unwrap().len(), 1);

    let reconciled = dir.run(&["--fixture", "case.json", "status", "--status-ref", &status_ref]);
    assert_eq!(
        (reconciled.code, reconciled.text("/delivery")),
        (0, "receipt_reconciled".to_owned())
    );
    let replay = dir.run(&["status", "--status-ref", &status_ref, "--fixture", "case.json"]);
    assert_eq!((replay.code, replay.text("/delivery")), (0, "local_replay".to_owned()));
    let audit = dir.run(&["audit"]);
    assert_eq!(audit.answer()["unreconciled_downstream_receipts"], Value::Array(vec![]));
}

#[test]
fn every_failure_point_answers_unknown_and_a_worker_recovers_it() {
    for point in ["after_intent_commit", "after_claim", "after_downstream_commit"] {
        let dir = Dir::new();
        let unknown = dir.run(&["--fixture", "case.json", "dispatch", "--failure", point]);
        assert_eq!(
            (unknown.code, unknown.text("/code")),
            (1, "OUTCOME_UNKNOWN".to_owned()),
            "{point}"
        );
        let status_ref = unknown.text("/status_ref");
        // Past any lease the dispatch took, a worker finishes it, once.
        let later = (NOW + 30).to_string();
        let worked = dir.run(&[
            "--fixture",
            "case.json",
            "process",
            "--status-ref",
            &status_ref,
            "--now",
            &later,
            "--worker-id",
            "w-2",
        ]);
        assert_eq!(
            (worked.code, worked.text("/delivery")),
            (0, "fresh".to_owned()),
            "{point}: {worked:?}"
        );
        assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 1, "{point}");
    }
}

#[test]
fn a_lease_is_held_until_now_reaches_its_end() {
    let dir = Dir::new();
    let unknown = dir.run(&["--fixture", "case.json", "dispatch", "--failure", "after_claim"]);
    let status_ref = unknown.text("/status_ref");
    for (now, code) in [(NOW + 29, "LEASE_HELD"), (NOW + 30, "OK")] {
        let now = now.to_string();
        let run = dir.run(&[
            "process",
            "--fixture",
            "case.json",
            "--status-ref",
            &status_ref,
            "--now",
            &now,
        ]);
        assert_eq!(run.text("/code"), code, "{run:?}");
    }
    let failed = dir.run(&[
        "--fixture",
        "case.json",
        "process",
        "--status-ref",
        &status_ref,
        "--failure",
        "after_downstream_commit",
    ]);
    assert_eq!(failed.text("/delivery"), "local_replay", "a finished operation replays");
}

#[test]
fn a_role_revoked_between_acceptance_and_the_worker_is_seen_by_the_worker() {
    let dir = Dir::new();
    dir.write_case("admin.json", |case| case["principal"]["subject_id"] = Value::from("agent-7"));
    let granted = br#"{"subjects":[{"tenant_id":"tenant-a","subject_id":"agent-7","roles":["support_admin"]}]}"#;
    dir.write("claims.json", granted);
    let unknown = dir.run(&[
        "--fixture",
        "admin.json",
        "--claims",
        "claims.json",
        "dispatch",
        "--failure",
        "after_intent_commit",
    ]);
    assert_eq!(unknown.text("/code"), "OUTCOME_UNKNOWN", "{unknown:?}");
    let status_ref = unknown.text("/status_ref");

    dir.write("claims.json", br#"{"subjects":[]}"#);
    let denied = dir.run(&[
        "--fixture",
        "admin.json",
        "--claims",
        "claims.json",
        "process",
        "--status-ref",
        &status_ref,
    ]);
    assert_eq!(
        (denied.code, denied.text("/code")),
        (1, "AUTHORIZATION_DENIED".to_owned()),
        "{denied:?}"
    );
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 0);
    let hidden = dir.run(&[
        "--fixture",
        "admin.json",
        "--claims",
        "claims.json",
        "status",
        "--status-ref",
        &status_ref,
    ]);
    assert_eq!(hidden.text("/code"), "NOT_FOUND");

    dir.write("claims.json", granted);
    let later = (NOW + 30).to_string();
    let fresh = dir.run(&[
        "--fixture",
        "admin.json",
        "--claims",
        "claims.json",
        "process",
        "--status-ref",
        &status_ref,
        "--now",
        &later,
    ]);
    assert_eq!(fresh.text("/delivery"), "fresh", "{fresh:?}");
}

#[test]
fn help_version_and_the_demo_exit_zero() {
    let dir = Dir::new();
    let help = dir.run(&["--help"]);
    assert_eq!(help.code, 0);
    for word in [
        "dispatch",
        "process",
        "status",
        "audit",
        "demo",
        "Exit codes",
        "OUTCOME_UNKNOWN",
        "USAGE_ERROR",
    ] {
        assert!(help.stdout.contains(word), "--help does not mention {word}");
    }
    let version = dir.run(&["--version"]);
    assert_eq!(
        (version.code, version.stdout.trim()),
        (0, concat!("toolledger ", env!("CARGO_PKG_VERSION")))
    );
    let demo = dir.run(&["demo"]);
    assert_eq!(demo.code, 0, "{}\n{}", demo.stdout, demo.stderr);
    assert!(
        demo.stdout.contains("receipt_reconciled")
            && demo.stdout.contains("Every step behaved as documented")
    );
}
