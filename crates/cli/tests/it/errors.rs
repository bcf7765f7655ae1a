//! Every exit-2 code, reached from the command line. Each asserts that stdout
//! is empty and stderr is one JSON line holding neither a path nor OS error text.

use crate::{Dir, workspace};

#[test]
fn fixture_io_error() {
    let dir = Dir::new();
    dir.run(&["--fixture", "missing.json", "dispatch"]).assert_error("FIXTURE_IO_ERROR");
    std::fs::create_dir(dir.join("folder.json")).unwrap();
    dir.run(&["--fixture", "folder.json", "dispatch"]).assert_error("FIXTURE_IO_ERROR");
    assert!(!dir.join("toolledger.sqlite3").exists(), "a bad case created the database");
}

#[test]
fn fixture_invalid_for_every_bad_case_and_no_database_is_created() {
    let dir = Dir::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(workspace("fixtures/bad-cases")).unwrap() {
        let path = entry.unwrap().path();
        dir.write("bad.json", &std::fs::read(&path).unwrap());
        for command in
            [&["dispatch"][..], &["status", "--status-ref", "sr_00000000000000000000000000000000"]]
        {
            let mut args = vec!["--fixture", "bad.json"];
            args.extend_from_slice(command);
            dir.run(&args).assert_error("FIXTURE_INVALID");
        }
        checked += 1;
    }
    assert!(checked >= 25);
    assert!(!dir.join("toolledger.sqlite3").exists(), "a bad case created the database");
}

#[test]
fn claims_io_error_and_claims_invalid() {
    let dir = Dir::new();
    dir.run(&["--fixture", "case.json", "--claims", "missing.json", "dispatch"])
        .assert_error("CLAIMS_IO_ERROR");
    for bad in [
        &b"{\"subjects\":[],\"extra\":true}"[..],
        b"{\"subjects\":[{\"tenant_id\":\"t\",\"subject_id\":\"s\",\"roles\":[\"\"]}]}",
        b"not json",
    ] {
        dir.write("claims.json", bad);
        dir.run(&["--fixture", "case.json", "--claims", "claims.json", "dispatch"])
            .assert_error("CLAIMS_INVALID");
    }
    assert!(!dir.join("toolledger.sqlite3").exists());
}

#[test]
fn sqlite_error() {
    let dir = Dir::new();
    dir.write(
        "notes.sqlite3",
        &b"plain text, not a database at all; plain text, not a database".repeat(10),
    );
    dir.run(&["--db", "notes.sqlite3", "--fixture", "case.json", "dispatch"])
        .assert_error("STORE_ERROR");
    dir.run(&["--db", "notes.sqlite3", "audit"]).assert_error("STORE_ERROR");
    // audit never creates a store.
    dir.run(&["--db", "absent.sqlite3", "audit"]).assert_error("STORE_NOT_FOUND");
    assert!(!dir.join("absent.sqlite3").exists());
    dir.write("empty.sqlite3", b"");
    dir.run(&["--db", "empty.sqlite3", "audit"]).assert_error("STORE_NOT_FOUND");
    assert_eq!(std::fs::metadata(dir.join("empty.sqlite3")).unwrap().len(), 0);
    // A database path inside a folder that does not exist.
    dir.run(&["--db", "no/such/folder.sqlite3", "--fixture", "case.json", "dispatch"])
        .assert_error("STORE_ERROR");
}

#[test]
fn schema_unsupported_leaves_the_file_untouched() {
    let dir = Dir::new();
    let path = dir.join("foreign.sqlite3");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE notes (body TEXT)")
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    dir.run(&["--db", "foreign.sqlite3", "--fixture", "case.json", "dispatch"])
        .assert_error("SCHEMA_UNSUPPORTED");
    dir.run(&["--db", "foreign.sqlite3", "audit"]).assert_error("SCHEMA_UNSUPPORTED");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn store_contract_violation() {
    let dir = Dir::new();
    assert_eq!(dir.run(&["--fixture", "case.json", "dispatch"]).code, 0);
    rusqlite::Connection::open(dir.join("toolledger.sqlite3"))
        .unwrap()
        .execute_batch("UPDATE operations SET arguments_json = ' ' || arguments_json")
        .unwrap();
    dir.run(&["--fixture", "case.json", "dispatch"]).assert_error("STORE_CONTRACT_VIOLATION");
    let audit = dir.run(&["audit"]);
    assert_eq!((audit.code, audit.text("/code")), (1, "AUDIT_FAILED".to_owned()));
    assert!(!audit.stdout.contains("tenant-a") && !audit.stdout.contains("ord-1001"));
}

#[test]
fn usage_errors_name_the_option_and_never_echo_a_value() {
    let dir = Dir::new();
    // Bare `toolledger` (help, then the error line) is in `conventions`.
    let cases: [(&[&str], &str); 10] = [
        (&["frobnicate"], "unknown command"),
        (&["dispatch", "--bogus-flag"], "--bogus-flag"),
        (&["--fixture", "case.json", "dispatch", "--now", "soon-ish-secret"], "--now"),
        (&["--fixture", "case.json", "dispatch", "--now", "1.5"], "--now"),
        (&["--fixture", "case.json", "process"], "--status-ref"),
        (&["--fixture", "case.json", "status"], "--status-ref"),
        (&["--fixture", "case.json", "dispatch", "--failure", "mid-flight-secret"], "--failure"),
        (
            &[
                "--fixture",
                "case.json",
                "process",
                "--status-ref",
                "sr_x",
                "--failure",
                "after_intent_commit",
            ],
            "--failure",
        ),
        (
            &[
                "--fixture",
                "case.json",
                "process",
                "--status-ref",
                "sr_x",
                "--worker-id",
                "bad worker",
            ],
            "--worker-id",
        ),
        (&["dispatch"], "--case"),
    ];
    for (args, named) in cases {
        let run = dir.run(args);
        run.assert_error("USAGE_ERROR");
        assert!(run.stderr.contains(named), "{args:?}: {}", run.stderr);
        for value in ["soon-ish-secret", "mid-flight-secret", "bad worker", "1.5", "frobnicate"] {
            assert!(!run.stderr.contains(value), "{args:?} echoes {value}");
        }
    }
    assert!(!dir.join("toolledger.sqlite3").exists());
}

#[test]
fn a_panic_is_an_internal_error_without_its_message() {
    let dir = Dir::new();
    let run =
        dir.run_with(&["--fixture", "case.json", "dispatch"], &[("TOOLLEDGER_TEST_PANIC", "1")]);
    run.assert_error("INTERNAL_ERROR");
    assert!(!run.stderr.contains("TOOLLEDGER_TEST_PANIC"));
}

#[test]
fn a_malformed_status_ref_is_not_found() {
    let dir = Dir::new();
    dir.run(&["--fixture", "case.json", "dispatch"]);
    for status_ref in ["sr_short", "not-a-ref", "sr_00000000000000000000000000000000"] {
        let run = dir.run(&["--fixture", "case.json", "status", "--status-ref", status_ref]);
        assert_eq!((run.code, run.text("/code")), (1, "NOT_FOUND".to_owned()));
        assert!(!run.stdout.contains("not-a-ref"));
    }
}

/// An exporter the OTEL_* variables ask for that the command cannot honour is refused
/// before anything is done (`docs/observability.md`, "Exporting from the command
/// line"); `none` and `OTEL_SDK_DISABLED` turn exporting off, whatever else is set.
#[test]
fn an_unsupported_otel_exporter_is_a_usage_error_before_anything_is_done() {
    let dir = Dir::new();
    for env in [
        &[("OTEL_TRACES_EXPORTER", "zipkin")][..],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ],
        &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://collector.example:4318")],
    ] {
        let run = dir.run_with(&["dispatch"], env);
        run.assert_error("USAGE_ERROR");
        assert!(!dir.join("toolledger.sqlite3").exists(), "nothing is done: {env:?}");
    }
    for env in [
        &[("OTEL_TRACES_EXPORTER", "none"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")][..],
        &[("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "zipkin")],
    ] {
        let run = dir.run_with(&["--version"], env);
        assert_eq!(run.code, 0, "{env:?}: {run:?}");
    }
}
