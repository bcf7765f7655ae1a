//! The reference service as a client sees it, over real HTTP on loopback: every answer
//! the Idempotency-Key draft prescribes, and each fault switch.

use std::{
    io::{BufRead, BufReader},
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
        let dir = std::env::temp_dir().join(format!("refundd-it-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolledger-refundd"))
            .args(["--listen", "127.0.0.1:0", "--db"])
            .arg(dir.join("refunds.sqlite3"))
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{line}"));
        Refundd { child, base: format!("http://{addr}"), dir }
    }

    fn refunds(&self) -> i64 {
        rusqlite_count(&self.dir.join("refunds.sqlite3"))
    }
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
