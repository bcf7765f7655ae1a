//! The one integration-test binary of `toolledger-store-postgres`: every test on a fresh
//! database of a throwaway PostgreSQL cluster (or the server `TOOLLEDGER_PG_URL` names).
//! A test that cannot start or reach PostgreSQL fails; none is skipped.

mod claims;
mod clock;
mod connection;
mod load;
mod operator;
mod reserve;
mod schema;
mod tampering;

use std::sync::OnceLock;

use postgres::{Client, NoTls};
use serde_json::{Value, json};
use toolledger_contract::{
    HostCall, IdempotencyKey, Identifier, LeaseSeconds, Registry, StatusRef, UnixSeconds,
    digest::{downstream_receipt, downstream_request_ref, refund_id, result_sha256},
    load_case,
};
use toolledger_store::{
    CallIdentity, DownstreamReceipt, LocalReceipt, NewOperation, Now, STAND_IN_NAME,
    STAND_IN_REVISION, Waits,
};
use toolledger_store_postgres::{PgStore, StoreClock};
use toolledger_testkit::cluster::Cluster;

const CASE: &[u8] =
    include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/persistence-case.json"));

/// A new, empty database on the shared cluster. Panics (fails the test) when no server
/// can be started or reached.
pub fn fresh(prefix: &str) -> String {
    let cluster = match Cluster::shared() {
        Ok(cluster) => cluster,
        Err(err) => panic!("PostgreSQL could not be started: {err}"),
    };
    match cluster.fresh_database(prefix) {
        Ok(url) => url,
        Err(err) => panic!("a database could not be created: {err}"),
    }
}

/// A store on `url` whose writes use the instants handed in (time is simulated).
pub fn store(url: &str) -> PgStore {
    PgStore::connect(url, Waits::default()).unwrap().with_clock(StoreClock::Caller)
}

/// A plain client on `url`, for what a test does behind the store's back.
pub fn raw(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap()
}

/// The instant `seconds` after the case's clock.
pub fn at(seconds: i64) -> Now {
    UnixSeconds::new(1_767_225_600 + seconds).unwrap()
}

pub fn lease(seconds: i64) -> LeaseSeconds {
    LeaseSeconds::new(seconds).unwrap()
}

pub fn worker(name: &str) -> Identifier {
    Identifier::new(name).unwrap()
}

pub fn stand_in() -> toolledger_contract::DownstreamIdentity {
    toolledger_contract::DownstreamIdentity::new(STAND_IN_NAME, STAND_IN_REVISION).unwrap()
}

struct Cases {
    base: HostCall,
    registry: Registry,
}

fn cases() -> &'static Cases {
    static CASES: OnceLock<Cases> = OnceLock::new();
    CASES.get_or_init(|| Cases {
        base: load_case(CASE, &Registry::builtin(), None).unwrap(),
        registry: Registry::builtin(),
    })
}

/// The refund intent under idempotency key `key`, proposed by model call `call`, with
/// its approval bound to it; and that call's identity.
pub fn intent_by(key: &str, call: &str) -> (NewOperation, CallIdentity) {
    let cases = cases();
    let mut case = cases.base.clone();
    case.host.idempotency_key = IdempotencyKey::new(key).unwrap();
    case.host.provider_call_id = Identifier::new(call).unwrap();
    let tool = cases.registry.tool("refund_order").unwrap();
    toolledger_testkit::intent_of(&case, &tool.name, &tool.revisions, stand_in())
}

/// The intent under key `key`, its own model call `call-<key>`.
pub fn intent(key: &str) -> (NewOperation, CallIdentity) {
    intent_by(key, &format!("call-{key}"))
}

/// The stand-in's receipt for `intent` (commit B's row: the refund the command line's
/// simulation makes) and the local receipt that reconciles it (commit C's).
pub fn receipts(intent: &NewOperation) -> (DownstreamReceipt, LocalReceipt) {
    let dr_ref = downstream_request_ref(&intent.scope, &intent.request_sha256);
    let field = |name: &str| intent.arguments.get(name).cloned().unwrap_or(Value::Null);
    let output = json!({
        "refund_id": refund_id(dr_ref.as_str()),
        "order_id": field("order_id"),
        "amount_minor": field("amount_minor"),
        "currency": field("currency"),
        "status": "refunded",
    });
    let receipt = downstream_receipt(
        dr_ref.as_str(),
        &intent.request_sha256,
        &intent.scope.tool_name,
        &intent.revisions.output,
        &output,
    );
    let downstream = DownstreamReceipt::new(dr_ref, intent.request_sha256.clone(), &receipt);
    let local = LocalReceipt {
        result_sha256: result_sha256(&intent.scope.tool_name, &intent.revisions.output, &output),
        output,
        downstream: downstream.clone(),
    };
    (downstream, local)
}

/// The status ref of `intent`.
pub fn sr(intent: &NewOperation) -> StatusRef {
    intent.status_ref.clone()
}

/// The failed checks of the store's audit, with their findings, for assertion messages.
pub fn failed_checks(store: &mut PgStore) -> Vec<String> {
    use toolledger_store::LedgerStore;
    let report = store.audit().unwrap();
    report
        .checks
        .iter()
        .filter(|(_, passed)| !passed)
        .map(|(check, _)| (*check).to_owned())
        .chain(report.findings.iter().map(|finding| format!("{finding:?}")))
        .collect()
}

/// Asserts the store's audit passes.
pub fn assert_audit_passes(store: &mut PgStore) {
    let failed = failed_checks(store);
    assert!(failed.is_empty(), "audit failed: {failed:?}");
}

/// One number from `sql` on a plain client.
pub fn count(client: &mut Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).unwrap().get(0)
}
