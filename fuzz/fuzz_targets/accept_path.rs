//! The facade's one door and what follows it (`toolledger::door::admit`,
//! `Ledger::dispatch`) on arbitrary host JSON.
//!
//! The input is read as a host's JSON reader reads it (serde_json: any number it can
//! hold, integral floats, any depth it takes), as Python's conversion and the MCP gateway
//! hand it over. Never a panic; and:
//!
//! - the door holds a value exactly when the store's own read check passes the value's
//!   canonical text, and then holds that text's value;
//! - a held value, dispatched as a call's arguments to a ledger on SQLite (a tool whose
//!   input schema is any object, performed in process), is fresh; its retry replays with
//!   the same request digest and output; the ledger stores exactly the held value;
//! - a refused value is `INPUT_INVALID`, and nothing is written or performed;
//! - every 64 operations, the ledger's audit passes.
#![no_main]

use std::sync::{LazyLock, Mutex};

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use toolledger::{
    BlockCode, Call, Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt,
    DownstreamRequest, Ledger, Lookup, ModelCall, NoRoles, Outcome, ToolDefinition,
};
use toolledger_json::{Limits, canonicalize, is_canonical_v2};

/// Performs every request in process, counting effects.
struct Notes {
    identity: DownstreamIdentity,
    effects: std::sync::atomic::AtomicU64,
}

impl Downstream for Notes {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _now: toolledger::Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let effect = self.effects.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Ok(request.receipt(json!({"effect": effect})))
    }

    fn lookup(&self, _request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }
}

struct Host {
    dir: std::path::PathBuf,
    ledger: Ledger<Notes, NoRoles>,
    keys: u64,
}

static HOST: LazyLock<Mutex<Host>> = LazyLock::new(|| {
    let dir = std::env::temp_dir().join(format!("toolledger-fuzz-accept-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let definition = ToolDefinition::from_document(
        "note.json",
        &json!({
            "name": "note",
            "description": "Write anything down, once per key.",
            "input_schema": {"type": "object"},
            "output_schema": {"type": "object", "required": ["effect"],
                "properties": {"effect": {"type": "integer"}}},
        }),
    )
    .expect("the note tool");
    let identity = DownstreamIdentity::new("notes", "1").expect("an identity");
    let ledger = Ledger::builder(dir.join("ledger.sqlite3"))
        .tool(definition.tool())
        .open(Notes { identity, effects: 0.into() }, NoRoles)
        .expect("a ledger");
    Mutex::new(Host { dir, ledger, keys: 0 })
});

fn call(arguments: Value, key: &str) -> Call {
    Call::new("note", arguments)
        .principal("acme", "user-1")
        .idempotency_key(key)
        .model_call(ModelCall::new("openai", "responses", "openai-responses-2026-05", key, key))
        .at(1_767_225_600)
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let text = canonicalize(&value);
    let held = toolledger::door::admit(&value);
    assert_eq!(held.is_ok(), is_canonical_v2(&text, &Limits::default()), "{text}");
    if let Ok(held) = &held {
        assert_eq!(canonicalize(held), text);
        let read: Value = serde_json::from_str(&text).expect("canonical text reads back");
        assert_eq!(&read, held);
    }
    // Arguments are an object: anything else is the schema's to refuse.
    let Value::Object(_) = value else { return };
    let mut host = HOST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    host.keys += 1;
    let key = format!("k-{}", host.keys);
    let before = host.ledger.downstream().effects.load(std::sync::atomic::Ordering::Relaxed);
    let first = host.ledger.dispatch(&call(value.clone(), &key)).expect("an answer");
    match (&held, first.outcome()) {
        (Ok(held), Outcome::Fresh(fresh)) => {
            let again = host.ledger.dispatch(&call(held.clone(), &key)).expect("an answer");
            let Outcome::Replayed(replayed) = again.outcome() else {
                panic!("a held value did not replay: {:?}", again.package());
            };
            assert_eq!(replayed.request_sha256(), fresh.request_sha256());
            assert_eq!(replayed.output(), fresh.output());
            let shown = toolledger::show(host.dir.join("ledger.sqlite3"), fresh.status_ref(), true)
                .expect("shown")
                .expect("the operation");
            assert_eq!(&shown["arguments"], held);
            assert_eq!(
                host.ledger.downstream().effects.load(std::sync::atomic::Ordering::Relaxed),
                before + 1
            );
        }
        (Err(_), Outcome::Blocked { code: BlockCode::InputInvalid, status_ref: None }) => {
            assert_eq!(
                host.ledger.downstream().effects.load(std::sync::atomic::Ordering::Relaxed),
                before
            );
        }
        (held, other) => panic!("door {:?}, answer {other:?}", held.as_ref().map(drop)),
    }
    if host.keys % 64 == 0 {
        let audit = toolledger::audit(host.dir.join("ledger.sqlite3")).expect("an audit");
        assert!(audit.passed(), "the audit failed after {} calls", host.keys);
    }
});
