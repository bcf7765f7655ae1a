//! Tools as data over real processes: `toolledger` reads `examples/toolledger.toml`
//! (three tools from files) and works them against the reference service,
//! `toolledger-refundd --tools`, in its own process: dispatch, a retry, a conflict, a
//! commit whose answer is lost, the status query that reconciles it, `enqueue` and the
//! relay, the audit; one effect per key in the service's own store.

use serde_json::{Value, json};

use crate::{Dir, http::Refundd};

fn config() -> String {
    crate::workspace("examples/toolledger.toml").to_string_lossy().into_owned()
}

fn recipes() -> String {
    crate::workspace("fixtures/tools/refundd-recipes.json").to_string_lossy().into_owned()
}

/// A case for `tool` with `arguments`, by `subject`, under `key`, without an approval
/// (these tools' policies need none).
fn case(tool: &str, arguments: Value, subject: &str, key: &str, call: &str) -> Vec<u8> {
    let case = json!({
        "case_version": "persistence-case/v1",
        "clock": {"now": 1_767_225_600, "lease_seconds": 30},
        "principal": {"tenant_id": "tenant-a", "subject_id": subject},
        "host_context": {
            "provider_profile": {"provider": "openai", "api_family": "responses",
                "adapter_revision": "openai-responses-2026-05"},
            "provider_response_id": format!("resp-{call}"), "provider_call_id": format!("call-{call}"),
            "operation_id": format!("op-{call}"), "idempotency_key": key
        },
        "proposal": {"tool_name": tool, "arguments": arguments},
        "business_state": {}
    });
    serde_json::to_vec_pretty(&case).unwrap()
}

fn invoice(to: &str) -> Value {
    json!({"invoice_id": "inv_2041", "to": to, "cc": ["books@example.com"], "attach_pdf": true,
        "customer": {"customer_id": "cust-7", "name": "Ada L."}})
}

/// Effects the service committed, by tool, and the most any one key has.
fn effects(service: &Refundd, dir: &Dir, tool: &str) -> (i64, i64) {
    let conn = rusqlite::Connection::open(dir.join("refunds.sqlite3")).unwrap();
    let _ = service;
    let count = conn
        .query_row("SELECT count(*) FROM effects WHERE tool = ?1", [tool], |row| row.get(0))
        .unwrap();
    let most = conn
        .query_row(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM effects GROUP BY tool, key)",
            [],
            |row| row.get(0),
        )
        .unwrap();
    (count, most)
}

#[test]
fn three_tools_from_files_go_through_every_command_against_the_reference_service() {
    let dir = Dir::new();
    let service = Refundd::start(&dir, &["--tools", &recipes()]);
    let env = [("TOOLLEDGER_REFERENCE_URL", service.base.as_str())];
    let config = config();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--config", &config]);
        dir.run_with(&all, &env)
    };
    dir.write(
        "invoice.json",
        &case("send_invoice_email", invoice("ada@example.com"), "cust-7", "inv-2041-send", "1"),
    );
    // Fresh, then the model's retry replays it; the service sent one email.
    let first = run(&["dispatch", "--case", "invoice.json"]);
    assert_eq!((first.code, first.text("/delivery")), (0, "fresh".to_owned()), "{first:?}");
    assert_eq!(first.text("/result/model_view/to"), "ada@example.com");
    let again = run(&["dispatch", "--case", "invoice.json"]);
    assert_eq!(again.text("/delivery"), "local_replay", "{again:?}");
    assert_eq!(
        again.text("/result/digests/result_sha256"),
        first.text("/result/digests/result_sha256")
    );
    // The same key, another address, another model call: a conflict, nothing sent.
    dir.write(
        "other.json",
        &case("send_invoice_email", invoice("grace@example.com"), "cust-7", "inv-2041-send", "2"),
    );
    let conflict = run(&["dispatch", "--case", "other.json"]);
    assert_eq!((conflict.code, conflict.text("/code")), (1, "IDEMPOTENCY_CONFLICT".to_owned()));
    // Another customer's invoice: not found, alike for missing and not theirs.
    dir.write(
        "foreign.json",
        &case("send_invoice_email", invoice("ada@example.com"), "cust-8", "inv-2041-b", "3"),
    );
    assert_eq!(run(&["dispatch", "--case", "foreign.json"]).text("/code"), "NOT_FOUND");
    // Arguments the schema refuses: the pointer and keyword, nothing written.
    dir.write(
        "bad.json",
        &case("send_invoice_email", invoice("not an address"), "cust-7", "inv-bad", "4"),
    );
    let bad = run(&["dispatch", "--case", "bad.json"]);
    assert_eq!(bad.text("/code"), "INPUT_INVALID");
    assert_eq!(bad.answer()["detail"], json!({"pointer": "/to", "keyword": "format"}));
    assert_eq!(effects(&service, &dir, "send_invoice_email"), (1, 1));

    // A ticket whose answer is lost after the service committed: unknown, then the
    // status query reconciles it from the service's own record.
    service.faults(&json!({"drop_next": 1}));
    let ticket = json!({"queue": "billing", "summary": "refund not received", "priority": "high"});
    dir.write("ticket.json", &case("open_ticket", ticket, "user-9", "ticket-77", "5"));
    let lost = run(&["dispatch", "--case", "ticket.json"]);
    assert_eq!((lost.code, lost.text("/code")), (1, "OUTCOME_UNKNOWN".to_owned()), "{lost:?}");
    let status_ref = lost.text("/status_ref");
    let settled = run(&["status", "--case", "ticket.json", "--status-ref", &status_ref]);
    assert_eq!(settled.text("/delivery"), "receipt_reconciled", "{settled:?}");
    assert_eq!(settled.text("/result/model_view/state"), "open");
    assert_eq!(effects(&service, &dir, "open_ticket"), (1, 1));

    // The built-in refund, routed by the configuration to /refunds.
    let refund = run(&["dispatch", "--case", "case.json"]);
    assert_eq!(refund.text("/delivery"), "fresh", "{refund:?}");
    assert_eq!(service.refunds(), 1);

    // Accepted and not sent, then the relay (no case file: these rules need none).
    dir.write(
        "queued.json",
        &case("send_invoice_email", invoice("ada@example.com"), "cust-7", "inv-2041-again", "6"),
    );
    let accepted = run(&["enqueue", "--case", "queued.json"]);
    assert_eq!((accepted.code, accepted.text("/code")), (1, "ACCEPTED".to_owned()), "{accepted:?}");
    assert_eq!(accepted.text("/status"), "pending");
    assert_eq!(effects(&service, &dir, "send_invoice_email"), (1, 1), "nothing sent yet");
    let drained = run(&["relay", "--once", "--now", "1767225600"]);
    assert_eq!(drained.code, 0, "{drained:?}");
    assert_eq!(drained.answer()["relay"]["delivered"], 1, "{drained:?}");
    let replayed = run(&["dispatch", "--case", "queued.json"]);
    assert_eq!(replayed.text("/delivery"), "local_replay", "{replayed:?}");

    // One effect per key in the service's own store, and the ledger audits clean.
    assert_eq!(effects(&service, &dir, "send_invoice_email"), (2, 1));
    assert_eq!(service.refunds(), 1);
    let audit = dir.run(&["audit"]);
    assert_eq!(audit.code, 0, "{audit:?}");
}

#[test]
fn tools_list_and_check_show_the_declared_tools_and_a_bad_one_is_refused_naming_where() {
    let dir = Dir::new();
    let config = config();
    let listed = dir.run(&["tools", "list", "--config", &config]);
    assert_eq!(listed.code, 0, "{listed:?}");
    let names: Vec<String> = listed
        .stdout
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["name"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(names, ["send_invoice_email", "open_ticket", "refund_order"]);
    let checked = dir.run(&["tools", "check", "--config", &config]);
    assert_eq!((checked.code, checked.text("/code")), (0, "OK".to_owned()), "{checked:?}");
    assert_eq!(checked.answer()["environment"][0]["variable"], "TOOLLEDGER_REFERENCE_URL");
    // TOOLLEDGER_CONFIG names it too; without any, the built-in refund tool alone.
    let by_env = dir.run_with(&["tools", "list"], &[("TOOLLEDGER_CONFIG", &config)]);
    assert_eq!(by_env.stdout.lines().count(), 3);
    let none = dir.command(&["tools", "list"]).env_remove("TOOLLEDGER_CONFIG").output().unwrap();
    let none = String::from_utf8(none.stdout).unwrap();
    assert_eq!(none.lines().count(), 1);
    assert!(none.contains("\"name\":\"refund_order\""), "{none}");
    // ./toolledger.toml is read when present.
    dir.write(
        "toolledger.toml",
        br#"
[[tools]]
name = "open_ticket"
description = "Open a ticket."
input_schema = { type = "object", properties = { queue = { type = "string" } }, required = ["queue"] }
output_schema = { type = "object" }
"#,
    );
    let here = dir.command(&["tools", "list"]).env_remove("TOOLLEDGER_CONFIG").output().unwrap();
    assert!(String::from_utf8(here.stdout).unwrap().contains("\"name\":\"open_ticket\""));

    // A tool file with a remote $ref: every command refuses the configuration, naming
    // the file, the pointer and the reason, and creates no ledger.
    let mut tool =
        std::fs::read_to_string(crate::workspace("fixtures/tools/open_ticket.toml")).unwrap();
    tool = tool.replace(
        "summary = { type = \"string\", minLength = 1, maxLength = 200 }",
        "summary = { \"$ref\" = \"https://example.com/summary.json\" }",
    );
    dir.write("remote.toml", tool.as_bytes());
    dir.write("bad.toml", b"[[tools]]\nfile = \"remote.toml\"\n");
    for args in [
        vec!["tools", "check", "--config", "bad.toml"],
        vec!["dispatch", "--case", "case.json", "--config", "bad.toml", "--db", "fresh.sqlite3"],
        vec!["relay", "--once", "--config", "bad.toml", "--db", "fresh.sqlite3"],
    ] {
        let refused = dir.run(&args);
        assert_eq!(refused.code, 2, "{args:?}: {refused:?}");
        let error: Value = serde_json::from_str(refused.stderr.trim()).unwrap();
        assert_eq!(error["error"]["code"], "USAGE_ERROR");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("remote.toml"), "{message}");
        assert!(message.contains("/input_schema/properties/summary/$ref"), "{message}");
        assert!(message.contains("remote $ref"), "{message}");
        assert!(!dir.join("fresh.sqlite3").exists(), "nothing was created");
    }
    // A service whose URL variable is not set: refused before anything is accepted.
    let unset = dir
        .command(&["dispatch", "--case", "case.json", "--config", &config, "--db", "fresh.sqlite3"])
        .env_remove("TOOLLEDGER_REFERENCE_URL")
        .output()
        .unwrap();
    assert_eq!(unset.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unset.stderr).contains("TOOLLEDGER_REFERENCE_URL is not set"));
    assert!(!dir.join("fresh.sqlite3").exists());
}

#[test]
fn the_dashboard_shows_the_declared_tools_and_refuses_a_bad_configuration() {
    let dir = Dir::new();
    // A ledger to show: the built-in refund, dispatched once.
    assert_eq!(dir.run(&["dispatch", "--case", "case.json"]).code, 0);
    let config = config();
    let dashboard = crate::dashboard::Dashboard::start(&dir, &["--config", &config]);
    let (status, page) = dashboard.get("/tools");
    assert_eq!(status, 200, "{page}");
    for name in ["send_invoice_email", "open_ticket", "refund_order"] {
        assert!(page.contains(&format!("id=\"tool-{name}\"")), "{name}: {page}");
    }
    assert!(page.contains("reference-tools@1"), "who performs them: {page}");
    assert!(page.contains("refund_order.input.v2"), "{page}");
    drop(dashboard);
    // Without a configuration: the built-in tool, performed by the simulation.
    let plain = crate::dashboard::Dashboard::start(&dir, &[]);
    let (_, page) = plain.get("/tools");
    assert!(page.contains("id=\"tool-refund_order\"") && page.contains("the simulation"), "{page}");
    drop(plain);
    dir.write("bad.toml", b"[[tools]]\nfile = \"missing.toml\"\n");
    let refused = dir.run(&["serve", "--listen", "127.0.0.1:0", "--config", "bad.toml"]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("missing.toml was not found"), "{refused:?}");
}

#[test]
fn a_header_variable_holding_a_line_break_is_refused_before_anything_is_accepted() {
    let dir = Dir::new();
    dir.write(
        "case.json",
        &std::fs::read(crate::workspace("fixtures/persistence-case.json")).unwrap(),
    );
    dir.write(
        "headers.toml",
        b"[services.billing]\nbase_url = \"http://127.0.0.1:9\"\nidentity = \"billing@1\"\n\
          headers_from_env = { Authorization = \"BILLING_TOKEN\" }\n\n[[tools]]\n\
          builtin = \"refund_order\"\n\
          downstream = { service = \"billing\", execute = \"/refunds\", lookup = \"/refunds/by-key/{key}\" }\n",
    );
    for value in ["Bearer abc\r\nX-Forged: 1", "Bearer abc\n", "a\u{7f}b", " padded"] {
        let refused = dir.run_with(
            &["dispatch", "--case", "case.json", "--config", "headers.toml"],
            &[("BILLING_TOKEN", value)],
        );
        assert_eq!(refused.code, 2, "{value:?}: {refused:?}");
        assert!(refused.stderr.contains("USAGE_ERROR"), "{refused:?}");
        assert!(refused.stderr.contains("BILLING_TOKEN") && !refused.stderr.contains("abc"));
    }
    // Nothing was accepted for a request that could never be sent: no ledger was made.
    assert!(!crate::mcp::ledger_ready(&dir));
}

#[test]
fn tools_check_refuses_what_every_command_would_refuse() {
    let dir = Dir::new();
    let refusal = |config: &[u8]| {
        dir.write("check.toml", config);
        let refused = dir.run(&["tools", "check", "--config", "check.toml"]);
        assert_eq!(refused.code, 2, "{refused:?}");
        let error: Value = serde_json::from_str(refused.stderr.trim()).unwrap();
        assert_eq!(error["error"]["code"], "USAGE_ERROR");
        error["error"]["message"].as_str().unwrap().to_owned()
    };
    for url in
        ["https://127.0.0.1:9", "HTTPS://127.0.0.1:9", "ftp://127.0.0.1:9", "http://", "http:///x"]
    {
        let message =
            refusal(format!("[services.s]\nbase_url = {url:?}\nidentity = \"s@1\"\n").as_bytes());
        assert!(message.contains("at /services/s/base_url"), "{url}: {message}");
    }
    // A field no argument can ever fill with a fraction is not declared as if one could.
    let message = refusal(
        br#"
[[tools]]
name = "tip"
description = "Tip."
input_schema = { type = "object", properties = { amount = { type = ["number", "null"] } } }
output_schema = { type = "object" }
"#,
    );
    assert!(message.contains("/input_schema/properties/amount/type"), "{message}");
    assert!(message.contains("declare \"integer\""), "{message}");
}
