//! The reference service as a client sees it, over real HTTP on loopback: every answer
//! the Idempotency-Key draft prescribes, and each fault switch.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::{Value, json};

/// The service in its own process, killed when dropped.
struct Refundd {
    child: Child,
    base: String,
    dir: std::path::PathBuf,
}

impl Refundd {
    fn start(name: &str, extra: &[&str]) -> Refundd {
        let dir = scratch(name);
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolledger-refundd"))
            .args(["--listen", "127.0.0.1:0", "--db"])
            .arg(dir.join("refunds.sqlite3"))
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Refundd { base: toolledger_testkit::listening_base(&mut child), child, dir }
    }

    fn refunds(&self) -> i64 {
        rusqlite_count(&self.dir.join("refunds.sqlite3"))
    }

    /// The service with the recipes `recipes` (written to its directory as `tools.json`).
    fn with_tools(name: &str, recipes: &Value, extra: &[&str]) -> Refundd {
        let file = scratch(name).join("tools.json");
        std::fs::write(&file, recipes.to_string()).unwrap();
        let mut args = vec!["--tools", file.to_str().unwrap()];
        args.extend_from_slice(extra);
        Refundd::start(name, &args)
    }

    /// The rows of the service's `effects` table for `tool` and `key`.
    fn effects(&self, tool: &str, key: &str) -> i64 {
        self.sql(&format!("SELECT count(*) FROM effects WHERE tool = '{tool}' AND key = '{key}'"))
    }

    /// One number the service's own file answers, read with plain SQL.
    fn sql(&self, query: &str) -> i64 {
        rusqlite::Connection::open(self.dir.join("refunds.sqlite3"))
            .unwrap()
            .query_row(query, [], |row| row.get(0))
            .unwrap()
    }
}

/// The directory of one test's files (made if absent).
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("refundd-it-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rusqlite_count(path: &std::path::Path) -> i64 {
    // The service's own file, read the way an auditor would: plain SQL.
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("SELECT count(*) FROM refunds", [], |row| row.get(0))
        .unwrap()
}

impl Drop for Refundd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

fn body(order: &str, amount: i64) -> String {
    json!({"arguments": {"order_id": order, "amount_minor": amount, "currency": "USD"},
        "request_sha256": "0".repeat(64), "tool_name": "refund_order"})
    .to_string()
}

fn post(service: &Refundd, key: Option<&str>, body: &str) -> (u16, Value) {
    let mut request = agent().post(format!("{}/refunds", service.base));
    if let Some(key) = key {
        request = request.header("Idempotency-Key", format!("\"{key}\""));
    }
    answer(request.header("Connection", "close").send(body))
}

fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Value) {
    let mut response = response.unwrap();
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn get(service: &Refundd, path: &str) -> (u16, Value) {
    answer(agent().get(format!("{}{path}", service.base)).call())
}

fn faults(service: &Refundd, faults: Value) {
    let set =
        answer(agent().post(format!("{}/admin/faults", service.base)).send(faults.to_string()));
    assert_eq!(set.0, 200, "{set:?}");
}

#[test]
fn the_draft_holds_key_by_key() {
    let service = Refundd::start("draft", &[]);
    // No key: 400, nothing stored.
    assert_eq!(post(&service, None, &body("ord-1", 100)).0, 400);
    // A new key commits once; the same request again is the stored answer.
    let (status, first) = post(&service, Some("k-1"), &body("ord-1", 100));
    assert_eq!(status, 201, "{first}");
    assert!(first["output"]["refund_id"].as_str().unwrap().starts_with("rf_"));
    assert_eq!(first["output"]["status"], "refunded");
    assert_eq!(post(&service, Some("k-1"), &body("ord-1", 100)), (201, first.clone()));
    // The same key with another payload: 422, and nothing changes.
    assert_eq!(post(&service, Some("k-1"), &body("ord-1", 999)).0, 422);
    assert_eq!(service.refunds(), 1);
    // The status endpoint by key.
    let (status, held) = get(&service, "/refunds/by-key/k-1");
    assert_eq!(
        (status, held["state"].clone(), held["response"].clone()),
        (200, json!("done"), first)
    );
    assert_eq!(get(&service, "/refunds/by-key/k-none").0, 404);
    assert_eq!(get(&service, "/nothing").0, 404);
}

#[test]
fn a_key_in_flight_answers_409_to_every_other_request() {
    let service = Refundd::start("inflight", &["--delay-ms", "400"]);
    let answers: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| post(&service, Some("k-hot"), &body("ord-2", 200)).0))
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    assert_eq!(answers.iter().filter(|status| **status == 201).count(), 1, "{answers:?}");
    assert_eq!(answers.iter().filter(|status| **status == 409).count(), 7, "{answers:?}");
    assert_eq!(service.refunds(), 1);
}

#[test]
fn each_fault_switch_does_what_it_says() {
    let service = Refundd::start("faults", &[]);
    // 503 before the commit: the key is released, and a retry commits.
    faults(&service, json!({"fail_next": 1}));
    assert_eq!(post(&service, Some("k-503"), &body("ord-3", 300)).0, 503);
    assert_eq!(get(&service, "/refunds/by-key/k-503").0, 404);
    assert_eq!(post(&service, Some("k-503"), &body("ord-3", 300)).0, 201);
    // Commit, then the connection drops: no answer, but the refund is there.
    faults(&service, json!({"drop_next": 1}));
    let lost = agent()
        .post(format!("{}/refunds", service.base))
        .header("Idempotency-Key", "\"k-drop\"")
        .header("Connection", "close")
        .send(body("ord-4", 400));
    assert!(lost.is_err(), "{lost:?}");
    assert_eq!(get(&service, "/refunds/by-key/k-drop").1["state"], "done");
    // A refused order: 402 with the reason, stored like any answer.
    faults(&service, json!({"refuse_orders": ["ord-5"]}));
    let (status, refused) = post(&service, Some("k-402"), &body("ord-5", 500));
    assert_eq!(status, 402);
    assert_eq!(refused["reason"], "order ord-5 cannot be refunded");
    faults(&service, json!({}));
    assert_eq!(post(&service, Some("k-402"), &body("ord-5", 500)), (402, refused));
    assert_eq!(service.refunds(), 2);
    // Bad switches are refused.
    let bad = answer(agent().post(format!("{}/admin/faults", service.base)).send("{\"x\":1}"));
    assert_eq!(bad.0, 400);
}

/// `POST /admin/faults` sets the members it names and keeps the rest (before: every switch
/// left out was reset, the `--refuse-order` set included), and a value out of its range is
/// refused with nothing changed (before: `drop_percent: 150` was taken as 100).
#[test]
fn a_fault_update_keeps_what_it_leaves_out_and_refuses_what_is_out_of_range() {
    let service = Refundd::start("merge", &["--refuse-order", "ord-7"]);
    faults(&service, json!({"fail_percent": 0}));
    assert_eq!(post(&service, Some("k-m1"), &body("ord-7", 700)).0, 402);
    for bad in
        [json!({"drop_percent": 150}), json!({"fail_percent": 101}), json!({"delay_ms": 60_001})]
    {
        let refused =
            answer(agent().post(format!("{}/admin/faults", service.base)).send(bad.to_string()));
        assert_eq!(refused.0, 400, "{bad}");
        assert_eq!(refused.1["error"], "bad_faults");
    }
    // Nothing of a refused update took: no request is dropped, ord-7 is still refused.
    assert_eq!(post(&service, Some("k-m2"), &body("ord-8", 800)).0, 201);
    assert_eq!(post(&service, Some("k-m3"), &body("ord-7", 700)).0, 402);
    // The flags refuse out-of-range values too.
    let out = Command::new(env!("CARGO_BIN_EXE_toolledger-refundd"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--db",
            "/nonexistent/x.sqlite3",
            "--drop-percent",
            "150",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn it_listens_on_loopback_only() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolledger-refundd"))
        .args(["--listen", "0.0.0.0:0", "--db", "/nonexistent/x.sqlite3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let dir = std::env::temp_dir().join(format!("refundd-it-lo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolledger-refundd"))
        .args(["--listen", "0.0.0.0:0", "--db"])
        .arg(dir.join("r.sqlite3"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback only"));
    let _ = std::fs::remove_dir_all(dir);
}

/// The example recipes of `fixtures/tools/`.
fn example_recipes() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tools/refundd-recipes.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A request body as toolledger sends it, for `tool`.
fn tool_body(tool: &str, arguments: Value) -> String {
    json!({"arguments": arguments, "output_revision": "r1", "request_sha256": "0".repeat(64),
        "tool_name": tool})
    .to_string()
}

fn invoice(invoice_id: &str, to: &str) -> String {
    tool_body(
        "send_invoice_email",
        json!({"invoice_id": invoice_id, "to": to, "attach_pdf": true,
            "customer": {"customer_id": "cus_1", "name": "Ada"}}),
    )
}

/// `POST /tools/<tool>`: the status and the answer's text as it came.
fn call_raw(service: &Refundd, tool: &str, key: Option<&str>, body: &str) -> (u16, String) {
    let mut request = agent().post(format!("{}/tools/{tool}", service.base));
    if let Some(key) = key {
        request = request.header("Idempotency-Key", format!("\"{key}\""));
    }
    let mut response = request.header("Connection", "close").send(body).unwrap();
    (response.status().as_u16(), response.body_mut().read_to_string().unwrap())
}

fn call(service: &Refundd, tool: &str, key: Option<&str>, body: &str) -> (u16, Value) {
    let (status, text) = call_raw(service, tool, key, body);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[test]
fn a_recipe_tool_holds_the_draft_key_by_key() {
    let service = Refundd::with_tools("tool-draft", &example_recipes(), &[]);
    let body = invoice("inv-1", "ada@example.com");
    // No key: 400, nothing stored.
    assert_eq!(
        call(&service, "send_invoice_email", None, &body),
        (400, json!({"error": "idempotency_key_missing"}))
    );
    // A new key: 201 with the recipe's output, one effect.
    let (status, first) = call_raw(&service, "send_invoice_email", Some("dr_1"), &body);
    assert_eq!(status, 201, "{first}");
    let message_id = format!("msg_{}", &hex_sha256(b"dr_1")[..32]);
    assert_eq!(
        serde_json::from_str::<Value>(&first).unwrap(),
        json!({"output": {"message_id": message_id, "invoice_id": "inv-1",
            "to": "ada@example.com", "status": "sent"}})
    );
    assert_eq!(service.effects("send_invoice_email", "dr_1"), 1);
    // The same key and body: the stored answer, byte for byte, and no second effect.
    assert_eq!(call_raw(&service, "send_invoice_email", Some("dr_1"), &body), (201, first.clone()));
    // The same key, another body: 422, nothing changes.
    let other = invoice("inv-1", "eve@example.com");
    assert_eq!(
        call(&service, "send_invoice_email", Some("dr_1"), &other),
        (422, json!({"error": "fingerprint_mismatch"}))
    );
    assert_eq!(service.effects("send_invoice_email", "dr_1"), 1);
    // The lookup: done, the fingerprint of the body's bytes, the stored answer.
    let (status, held) = get(&service, "/tools/send_invoice_email/by-key/dr_1");
    assert_eq!(status, 200, "{held}");
    assert_eq!(
        held,
        json!({"key": "dr_1", "state": "done", "fingerprint": hex_sha256(body.as_bytes()),
            "status": 201, "response": serde_json::from_str::<Value>(&first).unwrap()})
    );
    assert_eq!(
        get(&service, "/tools/send_invoice_email/by-key/dr_none"),
        (404, json!({"error": "not_found"}))
    );
    // Keys are per tool: the same key under another tool is another key, and refunds
    // know nothing of it.
    let ticket = tool_body("open_ticket", json!({"queue": "billing", "priority": 2}));
    let (status, opened) = call(&service, "open_ticket", Some("dr_1"), &ticket);
    assert_eq!(status, 201, "{opened}");
    assert_eq!(
        opened,
        json!({"output": {"ticket_id": format!("tk_{}", &hex_sha256(b"dr_1")[..32]),
            "queue": "billing", "priority": 2, "state": "open"}})
    );
    assert_eq!(service.effects("open_ticket", "dr_1"), 1);
    assert_eq!(get(&service, "/refunds/by-key/dr_1").0, 404);
    assert_eq!(service.refunds(), 0);
    // Bodies that are not this tool's call: 400, nothing stored.
    for bad in [
        "not json".to_owned(),
        "[1]".to_owned(),
        tool_body("open_ticket", json!({"queue": "billing"})),
        tool_body("send_invoice_email", json!(["inv-1"])),
        json!({"tool_name": "send_invoice_email"}).to_string(),
    ] {
        let (status, answer) = call(&service, "send_invoice_email", Some("dr_bad"), &bad);
        assert_eq!((status, answer["error"].clone()), (400, json!("bad_body")), "{bad}");
    }
    assert_eq!(get(&service, "/tools/send_invoice_email/by-key/dr_bad").0, 404);
    // A tool the recipes do not name: 404 on each of its routes.
    let none = json!({"error": "no_such_tool"});
    assert_eq!(call(&service, "refund_order", Some("dr_2"), &body), (404, none.clone()));
    assert_eq!(get(&service, "/tools/refund_order/by-key/dr_2"), (404, none.clone()));
    assert_eq!(get(&service, "/tools/refund_order/allow/ord-1"), (404, none.clone()));
    assert_eq!(get(&service, "/tools/no%20such/allow/x"), (404, none));
    assert_eq!(get(&service, "/tools/send_invoice_email/other").0, 404);
    assert_eq!(service.sql("SELECT count(*) FROM effects"), 2);
}

#[test]
fn a_recipe_builds_nested_values_and_leaves_absent_arguments_out() {
    let recipes = json!({"notify": {"output": {
        "id": {"$id": "n_"},
        "to": {"$arg": "/to"},
        "cc": {"$arg": "/cc"},
        "delivery": {
            "recipients": [{"$arg": "/to"}, {"$arg": "/cc/0"}, "audit@example.com"],
            "pdf": {"$arg": "/attach_pdf"},
            "customer": {"id": {"$arg": "/customer/customer_id"}, "name": {"$arg": "/customer/name"}},
            "odd~key": {"$arg": "/we~1ird~0"}
        },
        "literal": {"$id": "not an id", "because": "two members"},
        "fixed": [1, true, null, {"kind": "note"}, []],
        "status": "sent"
    }}});
    let service = Refundd::with_tools("tool-nested", &recipes, &[]);
    // Every argument present.
    let full = tool_body(
        "notify",
        json!({"to": "ada@example.com", "cc": ["bob@example.com"], "attach_pdf": false,
            "customer": {"customer_id": "cus_1", "name": "Ada"}, "we/ird~": 7}),
    );
    let (status, answer) = call(&service, "notify", Some("k-full"), &full);
    assert_eq!(status, 201, "{answer}");
    assert_eq!(
        answer["output"],
        json!({
            "id": format!("n_{}", &hex_sha256(b"k-full")[..32]),
            "to": "ada@example.com",
            "cc": ["bob@example.com"],
            "delivery": {
                "recipients": ["ada@example.com", "bob@example.com", "audit@example.com"],
                "pdf": false,
                "customer": {"id": "cus_1", "name": "Ada"},
                "odd~key": 7
            },
            "literal": {"$id": "not an id", "because": "two members"},
            "fixed": [1, true, null, {"kind": "note"}, []],
            "status": "sent"
        })
    );
    // The optional arguments absent: their members (and array elements) are left out,
    // never null.
    let bare = tool_body(
        "notify",
        json!({"to": "ada@example.com", "attach_pdf": true, "customer": {"customer_id": "cus_2"}}),
    );
    let (status, answer) = call(&service, "notify", Some("k-bare"), &bare);
    assert_eq!(status, 201, "{answer}");
    assert_eq!(
        answer["output"],
        json!({
            "id": format!("n_{}", &hex_sha256(b"k-bare")[..32]),
            "to": "ada@example.com",
            "delivery": {
                "recipients": ["ada@example.com", "audit@example.com"],
                "pdf": true,
                "customer": {"id": "cus_2"}
            },
            "literal": {"$id": "not an id", "because": "two members"},
            "fixed": [1, true, null, {"kind": "note"}, []],
            "status": "sent"
        })
    );
    // What the effect row holds is the output answered.
    let stored: String = rusqlite::Connection::open(service.dir.join("refunds.sqlite3"))
        .unwrap()
        .query_row(
            "SELECT output FROM effects WHERE tool = 'notify' AND key = 'k-bare'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(serde_json::from_str::<Value>(&stored).unwrap(), answer["output"]);
}

#[test]
fn a_tool_key_in_flight_answers_409_to_every_other_request() {
    let service = Refundd::with_tools("tool-inflight", &example_recipes(), &["--delay-ms", "400"]);
    let body = tool_body("open_ticket", json!({"queue": "billing", "priority": 1}));
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| call(&service, "open_ticket", Some("dr_hot"), &body)))
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    assert_eq!(answers.iter().filter(|(status, _)| *status == 201).count(), 1, "{answers:?}");
    let busy: Vec<_> = answers.iter().filter(|(status, _)| *status == 409).collect();
    assert_eq!(busy.len(), 7, "{answers:?}");
    assert!(busy.iter().all(|(_, answer)| *answer == json!({"error": "in_flight"})), "{busy:?}");
    assert_eq!(service.effects("open_ticket", "dr_hot"), 1);
}

#[test]
fn each_fault_switch_applies_to_tools_too() {
    let service =
        Refundd::with_tools("tool-faults", &example_recipes(), &["--refuse-resource", "inv-9"]);
    let tool = "send_invoice_email";
    // 503 before the commit: the key is released, and a retry commits.
    faults(&service, json!({"fail_next": 1}));
    let sent = invoice("inv-3", "ada@example.com");
    assert_eq!(call(&service, tool, Some("dr_503"), &sent).0, 503);
    assert_eq!(get(&service, "/tools/send_invoice_email/by-key/dr_503").0, 404);
    assert_eq!(service.effects(tool, "dr_503"), 0);
    assert_eq!(call(&service, tool, Some("dr_503"), &sent).0, 201);
    // One shared count: the refund takes the one failure set, the tool's call commits.
    faults(&service, json!({"fail_next": 1}));
    assert_eq!(post(&service, Some("k-shared"), &body("ord-shared", 100)).0, 503);
    assert_eq!(call(&service, tool, Some("dr_shared"), &sent).0, 201);
    // Commit, then the connection drops: no answer, but the effect is there, and the
    // lookup shows it done with the fingerprint of the body's bytes.
    faults(&service, json!({"drop_next": 1}));
    let dropped = invoice("inv-4", "ada@example.com");
    let lost = agent()
        .post(format!("{}/tools/{tool}", service.base))
        .header("Idempotency-Key", "\"dr_drop\"")
        .header("Connection", "close")
        .send(&dropped);
    assert!(lost.is_err(), "{lost:?}");
    let (status, held) = get(&service, "/tools/send_invoice_email/by-key/dr_drop");
    assert_eq!(status, 200, "{held}");
    assert_eq!(held["state"], "done");
    assert_eq!(held["status"], 201);
    assert_eq!(held["fingerprint"], hex_sha256(dropped.as_bytes()));
    assert_eq!(service.effects(tool, "dr_drop"), 1);
    // The retry is the stored answer, and no second effect.
    assert_eq!(call(&service, tool, Some("dr_drop"), &dropped), (201, held["response"].clone()));
    assert_eq!(service.effects(tool, "dr_drop"), 1);
    // A refused resource (the flag): 402 with the reason, stored like any answer, no effect.
    let refused_body = invoice("inv-9", "ada@example.com");
    let (status, refused) = call(&service, tool, Some("dr_402"), &refused_body);
    assert_eq!(
        (status, refused.clone()),
        (402, json!({"error": "refused", "reason": "send_invoice_email refuses inv-9"}))
    );
    assert_eq!(get(&service, "/tools/send_invoice_email/allow/inv-9").1["allow"], false);
    faults(&service, json!({"refuse_resources": []}));
    assert_eq!(call(&service, tool, Some("dr_402"), &refused_body), (402, refused));
    let (_, held) = get(&service, "/tools/send_invoice_email/by-key/dr_402");
    assert_eq!((held["state"].clone(), held["status"].clone()), (json!("refused"), json!(402)));
    assert_eq!(service.effects(tool, "dr_402"), 0);
    // Through the switches: an integer argument is compared as its decimal text, and the
    // precondition says the same, percent-decoded.
    faults(&service, json!({"refuse_resources": ["42", "billing desk"]}));
    let ticket = tool_body("open_ticket", json!({"queue": 42, "priority": "high"}));
    assert_eq!(call(&service, "open_ticket", Some("dr_int"), &ticket).0, 402);
    assert_eq!(
        get(&service, "/tools/open_ticket/allow/billing%20desk"),
        (200, json!({"allow": false, "reason": "open_ticket refuses billing desk"}))
    );
    assert_eq!(get(&service, "/tools/open_ticket/allow/billing"), (200, json!({"allow": true})));
    // The list is one for every tool, and setting it replaces it: inv-9 is allowed
    // again, 42 is refused for any tool whose resource it is.
    assert_eq!(
        get(&service, "/tools/send_invoice_email/allow/inv-9"),
        (200, json!({"allow": true}))
    );
    assert_eq!(get(&service, "/tools/send_invoice_email/allow/42").1["allow"], false);
    // A malformed escape or bytes that are not UTF-8: 400.
    assert_eq!(get(&service, "/tools/open_ticket/allow/bad%zz").0, 400);
    assert_eq!(get(&service, "/tools/open_ticket/allow/%ff").0, 400);
    // refuse_orders still refuses refunds alone.
    faults(&service, json!({"refuse_resources": [], "refuse_orders": ["inv-5"]}));
    assert_eq!(call(&service, tool, Some("dr_ord"), &invoice("inv-5", "ada@example.com")).0, 201);
    assert_eq!(service.sql("SELECT count(*) FROM effects"), 4);
}

/// Through random drops and 503s, every key retried until it is answered: one effect row
/// per key, each the same output the lookup shows.
#[test]
fn retries_through_random_faults_leave_one_effect_per_key() {
    let service = Refundd::with_tools(
        "tool-retries",
        &example_recipes(),
        &["--drop-percent", "30", "--fail-percent", "30", "--seed", "7"],
    );
    for index in 0..20 {
        let key = format!("dr_{index}");
        let body =
            tool_body("open_ticket", json!({"queue": format!("q-{index}"), "priority": index}));
        let mut answered = None;
        for _ in 0..200 {
            let response = agent()
                .post(format!("{}/tools/open_ticket", service.base))
                .header("Idempotency-Key", format!("\"{key}\""))
                .header("Connection", "close")
                .send(&body);
            if let Ok(response) = response {
                let (status, answer) = answer(Ok(response));
                if status == 201 {
                    answered = Some(answer);
                    break;
                }
                assert_eq!(status, 503, "{answer}");
            }
        }
        let answered = answered.unwrap_or_else(|| panic!("{key} was never answered"));
        assert_eq!(answered["output"]["queue"], format!("q-{index}"));
        assert_eq!(
            get(&service, &format!("/tools/open_ticket/by-key/{key}")).1["response"],
            answered
        );
        assert_eq!(service.effects("open_ticket", &key), 1, "{key}");
    }
    assert_eq!(service.sql("SELECT count(*) FROM effects"), 20);
    assert_eq!(service.sql("SELECT count(DISTINCT key) FROM effects"), 20);
}

#[test]
fn a_malformed_recipe_file_is_refused_at_start() {
    let dir = scratch("tool-bad");
    let cases = [
        (json!({"open_ticket": {"output": {"ticket_id": {"$id": 5}}}}), "open_ticket", "$id"),
        (
            json!({"open_ticket": {"output": {"q": {"$arg": "queue"}}}}),
            "open_ticket",
            "JSON pointer",
        ),
        (
            json!({"open_ticket": {"output": {"q": [{"$arg": "/a~2"}]}}}),
            "open_ticket",
            "/output/q/0",
        ),
        (json!({"open_ticket": {"resource": 3, "output": {}}}), "open_ticket", "resource"),
        (json!({"open_ticket": {"resource": "", "output": {}}}), "open_ticket", "resource"),
        (json!({"open_ticket": {"output": {}, "extra": 1}}), "open_ticket", "extra"),
        (json!({"open_ticket": {"resource": "/queue"}}), "open_ticket", "output"),
        (json!({"open_ticket": {"output": "ticket"}}), "open_ticket", "output"),
        (json!({"open_ticket": {"output": {"$id": "tk_"}}}), "open_ticket", "output"),
        (json!({"open_ticket": []}), "open_ticket", "recipe"),
        (json!({"open ticket": {"output": {}}}), "open ticket", "name"),
        (json!({"line\nbreak": {"output": {}}}), "line\\nbreak", "name"),
        (json!(["open_ticket"]), "recipes", "object"),
    ];
    for (index, (recipes, names, says)) in cases.iter().enumerate() {
        let file = dir.join(format!("bad-{index}.json"));
        std::fs::write(&file, recipes.to_string()).unwrap();
        let db = dir.join(format!("bad-{index}.sqlite3"));
        let out = Command::new(env!("CARGO_BIN_EXE_toolledger-refundd"))
            .args(["--listen", "127.0.0.1:0", "--db"])
            .arg(&db)
            .arg("--tools")
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{recipes}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{recipes}: {stderr}");
        assert!(stderr.contains(names) && stderr.contains(says), "{recipes}: {stderr}");
        assert!(!db.exists(), "{recipes}: the database file was made");
    }
    for (text, says) in [("{\"open_ticket\": ", "not JSON"), ("", "not JSON")] {
        let file = dir.join("truncated.json");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_toolledger-refundd"))
            .args(["--listen", "127.0.0.1:0", "--db"])
            .arg(dir.join("truncated.sqlite3"))
            .arg("--tools")
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!((out.status.code(), stderr.lines().count()), (Some(2), 1), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_toolledger-refundd"))
        .args(["--listen", "127.0.0.1:0", "--db"])
        .arg(dir.join("absent.sqlite3"))
        .arg("--tools")
        .arg(dir.join("absent.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), stderr.lines().count()), (Some(2), 1), "{stderr}");
    assert!(stderr.contains("cannot be read"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The library's own server: `Service::open_with_tools` over a recipe value, bound on
/// loopback, with the switches given as a value.
#[test]
fn the_library_serves_the_tools_of_its_recipes() {
    use toolledger_refundd::{Faults, Recipes, Service, bind};
    let refused =
        Recipes::from_json(&json!({"ok": {"output": {}}, "bad": {"output": {"a": {"$arg": 1}}}}))
            .unwrap_err();
    assert!(refused.starts_with("tool \"bad\": at \"/output/a\""), "{refused}");
    let recipes = Recipes::from_json(&example_recipes()).unwrap();
    assert_eq!(recipes.names().collect::<Vec<_>>(), ["open_ticket", "send_invoice_email"]);

    let dir = scratch("tool-library");
    let faults = Faults { refuse_resources: vec!["inv-7".to_owned()], ..Faults::default() };
    let service = std::sync::Arc::new(
        Service::open_with_tools(&dir.join("refunds.sqlite3"), faults, recipes).unwrap(),
    );
    let (server, addr) = bind("127.0.0.1:0").unwrap();
    let serving = {
        let (service, server) = (std::sync::Arc::clone(&service), std::sync::Arc::clone(&server));
        std::thread::spawn(move || service.serve(&server, 1))
    };
    let url = format!("http://{addr}");
    let send = |key: &str, body: &str| {
        answer(
            agent()
                .post(format!("{url}/tools/send_invoice_email"))
                .header("Idempotency-Key", format!("\"{key}\""))
                .header("Connection", "close")
                .send(body),
        )
    };
    let (status, sent) = send("dr_lib", &invoice("inv-1", "ada@example.com"));
    assert_eq!((status, sent["output"]["status"].clone()), (201, json!("sent")), "{sent}");
    assert_eq!(send("dr_lib7", &invoice("inv-7", "ada@example.com")).0, 402);
    assert_eq!(
        answer(agent().get(format!("{url}/tools/send_invoice_email/allow/inv-7")).call()),
        (200, json!({"allow": false, "reason": "send_invoice_email refuses inv-7"}))
    );
    server.unblock();
    serving.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
