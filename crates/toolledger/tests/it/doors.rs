//! The doors' corpus (`fixtures/doors/corpus.json`) through the Rust facade: the same
//! answers the Python package and the MCP gateway give it (`crates/python/tests/
//! test_doors.py` runs those, and the command line, on one ledger).

use serde_json::{Value, json};
use toolledger::{
    Call, Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest,
    Ledger, Lookup, ModelCall, NoRoles, Now, Outcome, Reply, ToolDefinition,
};

use crate::{TempDir, dump, workspace};

/// Pays in process, counting each payment.
struct Payments {
    identity: DownstreamIdentity,
    made: std::sync::atomic::AtomicU64,
}

impl Downstream for Payments {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let made = self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Ok(request.receipt(json!({"payment_id": format!("pay-{made}")})))
    }

    fn lookup(&self, _request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }
}

fn key_of(row: &Value) -> String {
    if let Some(key) = row.get("key").and_then(Value::as_str) {
        return key.to_owned();
    }
    let name = row.get("twin").unwrap_or(&row["name"]).as_str().unwrap();
    let name: String = name.chars().map(|c| if c.is_alphanumeric() { c } else { '-' }).collect();
    format!("rs-{name}")
}

#[test]
fn the_facade_answers_the_doors_corpus_as_every_other_door_does() {
    let corpus: Value =
        serde_json::from_slice(&std::fs::read(workspace("fixtures/doors/corpus.json")).unwrap())
            .unwrap();
    let dir = TempDir::new("doors");
    let db = dir.join("ledger.sqlite3");
    let tool = ToolDefinition::from_document(
        "pay.json",
        &json!({
            "name": "pay",
            "description": "Pay a payer, once per idempotency key.",
            "input_schema": {"type": "object", "required": ["payer", "amount_minor", "currency"],
                "properties": {"payer": {"type": "string"}, "currency": {"enum": ["EUR"]},
                    "amount_minor": {"type": "integer", "minimum": 1}, "note": {"type": "string"}}},
            "output_schema": {"type": "object", "required": ["payment_id"]},
        }),
    )
    .unwrap();
    let payments =
        Payments { identity: DownstreamIdentity::new("payments", "1").unwrap(), made: 0.into() };
    let ledger = Ledger::builder(&db).tool(tool.tool()).open(payments, NoRoles).unwrap();
    let mut answered: Vec<(String, Reply)> = Vec::new();
    for row in corpus["rows"].as_array().unwrap() {
        let mut arguments =
            json!({"payer": "bob", "currency": "EUR", "amount_minor": row["amount"]});
        if let Some(bytes) = row.get("note_bytes").and_then(Value::as_u64) {
            arguments["note"] = json!("x".repeat(usize::try_from(bytes).unwrap()));
        }
        let name = row["name"].as_str().unwrap().to_owned();
        let key = key_of(row);
        let before = dump(&db);
        let tool = row.get("tool").and_then(Value::as_str).unwrap_or("pay");
        // The model call is named by the row (one model call, one intent; a twin's
        // retry is another model call with the same key).
        let id: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let call = Call::new(tool, arguments)
            .principal("acme", "user-1")
            .idempotency_key(&key)
            .model_call(ModelCall::new(
                "openai",
                "responses",
                "openai-responses-2026-05",
                &format!("r{id}"),
                &format!("c{id}"),
            ));
        if let Some(codes) = row.get("by_door") {
            // An odd key or tool name: refused, with nothing written.
            let code = match ledger.dispatch(&call) {
                Ok(reply) => reply.package()["code"].as_str().unwrap().to_owned(),
                Err(refused) => refused.code().as_str().to_owned(),
            };
            assert_eq!(code, codes["rust"].as_str().unwrap(), "{name}");
            assert_eq!(dump(&db), before, "{name}: a refusal writes nothing");
            continue;
        }
        let reply = ledger.dispatch(&call).unwrap();
        if let Some(twin) = row.get("twin").and_then(Value::as_str) {
            let (_, first) = answered.iter().find(|(name, _)| name == twin).unwrap();
            let (Outcome::Replayed(again), Outcome::Fresh(fresh)) =
                (reply.outcome(), first.outcome())
            else {
                panic!("{name}: {:?}", reply.package());
            };
            assert_eq!(again.request_sha256(), fresh.request_sha256(), "{name}");
            assert_eq!(dump(&db), before, "{name}: a replay writes nothing");
        } else {
            let want = &row["expect"];
            assert_eq!(reply.package()["code"], want["code"], "{name}: {:?}", reply.package());
            if want["code"] == "INPUT_INVALID" {
                let detail = json!({"pointer": want["pointer"], "keyword": want["keyword"]});
                assert_eq!(reply.package()["detail"], detail, "{name}");
                assert_eq!(dump(&db), before, "{name}: a refusal writes nothing");
            }
        }
        answered.push((name, reply));
    }
    assert_eq!(ledger.downstream().made.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert!(toolledger::audit(&db).unwrap().passed());
}
