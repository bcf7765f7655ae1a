//! Where the command line meets operations it did not make: a host's operation (another
//! downstream) is refused by the simulation, and an older store is refused until
//! `migrate` upgrades it.

use serde_json::Value;
use toolledger::{
    Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest, Ledger,
    Lookup, NoRoles, RefundOrder, Registry, UnixSeconds, load_case,
};

use crate::{Dir, workspace};

/// A host's payment client that always loses its response after committing.
#[derive(Debug)]
struct Payments(DownstreamIdentity);

impl Downstream for Payments {
    fn identity(&self) -> &DownstreamIdentity {
        &self.0
    }

    fn execute(
        &self,
        _request: &DownstreamRequest,
        _now: UnixSeconds,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        Err(DownstreamError::Unknown { reason: "the response was lost".to_owned() })
    }

    fn lookup(&self, _request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }
}

#[test]
fn the_simulation_refuses_an_operation_of_another_downstream_and_writes_nothing() {
    let dir = Dir::new();
    let case = load_case(
        &std::fs::read(workspace("fixtures/persistence-case.json")).unwrap(),
        &Registry::builtin(),
        None,
    )
    .unwrap();
    let payments = Payments(DownstreamIdentity::new("acme-payments", "3").unwrap());
    let host = Ledger::builder(dir.location())
        .tool(RefundOrder::default().tool())
        .store_clock(toolledger::StoreClock::Caller)
        .worker_id("host-worker")
        .open(payments, NoRoles)
        .unwrap();
    let unknown = host.dispatch_loaded(&case).unwrap();
    assert_eq!(unknown.package()["code"], "OUTCOME_UNKNOWN");
    let status_ref = unknown.package()["status_ref"].as_str().unwrap().to_owned();
    drop(host);
    let rows = |dir: &Dir| {
        dir.db_rows(
            "SELECT o.status, b.state, b.attempt_count FROM operations o JOIN outbox b ON b.op_id = o.id",
        )
    };
    let rows_before = rows(&dir);
    for args in [
        &["--fixture", "case.json", "process", "--status-ref", &status_ref, "--now", "1767229999"]
            [..],
        &["--fixture", "case.json", "status", "--status-ref", &status_ref],
        &["--fixture", "case.json", "dispatch"],
    ] {
        let run = dir.run(args);
        assert_eq!((run.code, run.text("/code")), (1, "DOWNSTREAM_MISMATCH".to_owned()), "{run:?}");
    }
    assert_eq!(rows(&dir), rows_before);
    assert_eq!(dir.db_int("SELECT count(*) FROM downstream_receipts"), 0);
    assert_eq!(dir.db_int("SELECT count(*) FROM call_identities"), 1);
}

#[test]
fn an_older_store_is_refused_until_migrate_upgrades_it() {
    let dir = Dir::new();
    std::fs::copy(workspace("fixtures/v1-store.sqlite3"), dir.join("toolledger.sqlite3")).unwrap();
    let original = std::fs::read(dir.join("toolledger.sqlite3")).unwrap();
    for args in [&["--fixture", "case.json", "dispatch"][..], &["audit"]] {
        let run = dir.run(args);
        run.assert_error("SCHEMA_UNSUPPORTED");
        assert!(run.stderr.contains("toolledger migrate"), "{}", run.stderr);
    }
    assert_eq!(std::fs::read(dir.join("toolledger.sqlite3")).unwrap(), original);

    dir.run(&["migrate"]).assert_error("USAGE_ERROR");
    dir.run(&["migrate", "--downstream", "no-revision"]).assert_error("USAGE_ERROR");
    let migrated = dir.run(&["migrate", "--downstream", "toolledger-stand-in@1"]);
    assert_eq!(migrated.code, 0, "{migrated:?}");
    let answer = migrated.answer();
    assert_eq!(answer["migrated"], Value::Bool(true));
    assert_eq!(
        (answer["from_version"].as_i64(), answer["to_version"].as_i64()),
        (Some(1), Some(6))
    );
    assert_eq!(answer["operations"].as_i64(), Some(5));
    let backup = answer["backup_file"].as_str().unwrap();
    assert!(backup.starts_with("toolledger.sqlite3.v1-backup-"), "{backup}");
    assert!(dir.join(backup).exists());
    assert_eq!(dir.run(&["audit"]).code, 0);
    // The PASS case was never dispatched into the v1 store: a fresh refund now.
    assert_eq!(dir.run(&["--fixture", "case.json", "dispatch"]).text("/delivery"), "fresh");
    let again = dir.run(&["migrate", "--downstream", "toolledger-stand-in@1"]);
    assert_eq!(again.answer()["migrated"], Value::Bool(false));
}

/// The simulation's identity belongs to the simulation: no HTTP downstream and no host
/// downstream may declare it (before: `--downstream-identity toolledger-stand-in@1` with
/// `--downstream http://…` sent the simulation's operations to the service, and the
/// simulation finished the service's with nothing sent). And the audit names an
/// operation finished by a downstream other than the one it was accepted for.
#[test]
fn no_downstream_but_the_simulation_may_declare_its_identity() {
    let dir = Dir::new();
    let impostor = ["--downstream", "http://127.0.0.1:9", "--downstream-identity"];
    for identity in ["toolledger-stand-in@1", "toolledger-stand-in@2"] {
        for command in [
            &["--fixture", "case.json", "dispatch"][..],
            &["--fixture", "case.json", "relay", "--once"],
        ] {
            let mut args = command.to_vec();
            args.extend_from_slice(&impostor);
            args.push(identity);
            dir.run(&args).assert_error("USAGE_ERROR");
        }
    }
    // An https:// service is refused before anything is accepted, saying why.
    let https =
        dir.run(&["--fixture", "case.json", "dispatch", "--downstream", "https://127.0.0.1:9"]);
    https.assert_error("USAGE_ERROR");
    assert!(https.stderr.contains("TLS is not built in"), "{https:?}");
    assert!(dir.ledger_is_empty());
    let stand_in = || DownstreamIdentity::new("toolledger-stand-in", "1").unwrap();
    let opened = Ledger::builder(dir.location())
        .tool(RefundOrder::default().tool())
        .open(Payments(stand_in()), NoRoles);
    assert_eq!(opened.unwrap_err().code(), toolledger::ErrorCode::UsageError);
    let http = toolledger::http::HttpDownstream::new(stand_in(), Default::default());
    let opened =
        Ledger::builder(dir.location()).tool(RefundOrder::default().tool()).open(http, NoRoles);
    assert_eq!(opened.unwrap_err().code(), toolledger::ErrorCode::UsageError);
    let relayed = toolledger::Relay::new(dir.location()).tool(RefundOrder::default().tool()).run(
        || Ok(Payments(stand_in())),
        || NoRoles,
        &Value::Null,
        toolledger::Until::Drained,
        &|_| {},
    );
    assert_eq!(relayed.unwrap_err().code(), toolledger::ErrorCode::UsageError);

    // An operation the simulation finished, recorded as another downstream's: the audit
    // names it.
    let pass = dir.run(&["--fixture", "case.json", "dispatch"]);
    assert_eq!(pass.code, 0, "{pass:?}");
    dir.db_execute("UPDATE operations SET downstream_name = 'refunds-http'");
    let audit = dir.run(&["audit"]);
    assert_eq!(audit.code, 1, "{audit:?}");
    let answer = audit.answer();
    assert_eq!(answer["checks"]["finished_by_accepted_downstream"], false, "{answer}");
    let named: Vec<&Value> = answer["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|finding| finding["check"] == "finished_by_accepted_downstream")
        .map(|finding| &finding["ref"])
        .collect();
    assert_eq!(named, [&Value::from(pass.text("/status_ref"))]);
}

/// A host's role resolver that cannot answer, or answers nonsense.
#[derive(Debug)]
struct BrokenRoles(toolledger::ResolverError);

impl toolledger::PrincipalResolver for BrokenRoles {
    fn current_roles(
        &self,
        _tenant_id: &toolledger::Identifier,
        _subject_id: &toolledger::Identifier,
    ) -> Result<Vec<String>, toolledger::ResolverError> {
        Err(self.0.clone())
    }
}

/// A host's resolver failure is the host's roles code, not the command line's claims
/// file codes (its own resolver is its claims file); nothing is written.
#[test]
fn a_host_resolver_failure_is_a_roles_code_and_writes_nothing() {
    use toolledger::{ErrorCode, ResolverError};
    let (_fixture, call, fixture_dir) = toolledger::doc_fixture("roles-codes");
    for (why, code) in [
        (ResolverError::Unavailable, ErrorCode::RolesUnavailable),
        (ResolverError::Invalid("roles[] must hold strings".to_owned()), ErrorCode::RolesInvalid),
    ] {
        let dir = Dir::new();
        let host = Ledger::builder(dir.location())
            .tool(RefundOrder { approval_threshold_minor: Some(5_000) }.tool())
            .open_simulated(BrokenRoles(why))
            .unwrap();
        let err = host.dispatch(&call).unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        assert_eq!(err.code().as_str(), code.as_str());
        assert!(err.code().as_str().starts_with("ROLES_"), "{err:?}");
        drop(host);
        assert_eq!(dir.db_rows("SELECT count(*) FROM operations"), [[Some("0".to_owned())]]);
    }
    std::fs::remove_dir_all(fixture_dir).unwrap();
}
