//! `toolledger mcp` end to end, against software nobody here wrote: the host is the
//! official Python MCP SDK's client (PyPI `mcp`, in a venv under `target/mcp`), the
//! upstreams are a payments server written with that SDK (it counts its effects and
//! can fail in every way that matters) and the published `@modelcontextprotocol/
//! server-memory` (from npm, into `target/mcp/node`).
//!
//! Every test starts its own processes: host → gateway → upstream.

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{Dir, workspace};

/// The SDK version the tests drive the gateway with (the peers' one pin, shared with the bench).
const MCP_SDK: &str = include_str!("../../../mcp/tests/peers/requirements.txt").trim_ascii();
/// The official OpenTelemetry protobuf messages, which the OTLP receiver of the trace
/// tests decodes with (`crates/cli/tests/peers/otlp.py`), and the official Python SDK
/// with its OTLP/HTTP exporter, with which the payments upstream exports its own span.
const OTLP_PROTO: &str = "opentelemetry-proto==1.45.2";
const OTEL_SDK: &str = "opentelemetry-sdk==1.45.2";
const OTLP_EXPORTER: &str = "opentelemetry-exporter-otlp-proto-http==1.45.2";
/// The published upstream.
const SERVER_MEMORY: &str = "@modelcontextprotocol/server-memory@2026.8.31";
/// The official conformance suite: 0.1.13 is its last release that runs on Node 20
/// (later ones import `fs.globSync`, Node 22's).
const CONFORMANCE: &str = "@modelcontextprotocol/conformance@0.1.13";

/// The venv's python, installed once per test binary (and kept between runs).
pub(crate) fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let venv = workspace("target/mcp/venv");
        let python = venv.join("bin/python");
        let ready = venv.join(format!(".ready-{MCP_SDK}-{OTLP_PROTO}-{OTLP_EXPORTER}"));
        if !ready.exists() {
            let status = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().unwrap();
            assert!(status.success(), "python3 -m venv failed");
            let status = Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                .args([MCP_SDK, OTLP_PROTO, OTEL_SDK, OTLP_EXPORTER])
                .status()
                .unwrap();
            assert!(status.success(), "pip install {MCP_SDK} and OpenTelemetry's failed");
            std::fs::write(&ready, b"").unwrap();
        }
        python
    })
}

/// The gateway's command line for `config`, run through a shell that writes the
/// gateway's pid to the returned file first (so a test can SIGKILL the gateway itself).
fn pid_wrapped(dir: &Dir, config: &Path) -> (PathBuf, Vec<String>) {
    let pid_file = dir.join("gateway.pid");
    let mut wrapped = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        format!("echo $$ > '{}'; exec \"$@\"", pid_file.display()),
        "sh".to_owned(),
    ];
    wrapped.extend(gateway(dir, config));
    (pid_file, wrapped)
}

/// The SDK host over stdio of `server`, its steps to be written to its stdin.
fn host_of(server: &[String]) -> std::process::Child {
    Command::new(python())
        .arg(peer("host.py"))
        .arg("--")
        .args(server)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The npm packages' directory, installed once (and kept between runs).
fn node_modules() -> &'static Path {
    static MODULES: OnceLock<PathBuf> = OnceLock::new();
    MODULES.get_or_init(|| {
        let node = workspace("target/mcp/node");
        let marker = [SERVER_MEMORY, CONFORMANCE].join("-").replace('/', "_");
        let ready = node.join(format!(".ready-{marker}"));
        if !ready.exists() {
            std::fs::create_dir_all(&node).unwrap();
            let manifest = br#"{"name":"toolledger-mcp-peers","private":true}"#;
            std::fs::write(node.join("package.json"), manifest).unwrap();
            let status = Command::new("npm")
                .current_dir(&node)
                .args([
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--silent",
                    SERVER_MEMORY,
                    CONFORMANCE,
                ])
                .status()
                .unwrap();
            assert!(status.success(), "npm install {SERVER_MEMORY} {CONFORMANCE} failed");
            std::fs::write(&ready, b"").unwrap();
        }
        node.join("node_modules")
    })
}

/// server-memory's entry point.
fn server_memory() -> PathBuf {
    node_modules().join("@modelcontextprotocol/server-memory/dist/index.js")
}

fn peer(name: &str) -> PathBuf {
    workspace(&format!("crates/mcp/tests/peers/{name}"))
}

/// A gateway configuration over the payments server, its state and faults in `dir`.
fn payments_config(dir: &Dir, extra: &str) -> PathBuf {
    let text = format!(
        r#"[mcp]
tenant = "acme"
subject = "agent-1"

[mcp.upstreams.payments]
command = [{python:?}, {server:?}]
env = {{ PAYMENTS_STATE = {state:?}, PAYMENTS_FAULTS = {faults:?}, PAYMENTS_REPORT = "1" }}
timeout_ms = 3000

[mcp.upstreams.payments.tools.create_payment]
lookup = {{ tool = "get_payment_by_key", key_argument = "key", result = "/payment" }}
{extra}
"#,
        python = python().display().to_string(),
        server = peer("payments.py").display().to_string(),
        state = dir.join("payments.sqlite3").display().to_string(),
        faults = dir.join("faults.json").display().to_string(),
    );
    dir.write("toolledger.toml", text.as_bytes());
    dir.join("toolledger.toml")
}

/// The faults the payments server reads at every call.
fn faults(dir: &Dir, faults: Value) {
    dir.write("faults.json", faults.to_string().as_bytes());
}

/// The payments the upstream made, read from its own state: the effects.
fn payments(dir: &Dir) -> Vec<(String, String)> {
    let path = dir.join("payments.sqlite3");
    if !path.exists() {
        return Vec::new();
    }
    let connection = rusqlite::Connection::open(path).unwrap();
    let mut statement = connection
        .prepare("SELECT order_id, coalesce(idempotency_key, '') FROM payments ORDER BY rowid")
        .unwrap();
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// How many operations the test's ledger holds (none before it exists).
fn operations(dir: &Dir) -> usize {
    if !ledger_ready(dir) {
        return 0;
    }
    usize::try_from(dir.db_int("SELECT count(*) FROM operations")).unwrap_or(0)
}

/// Whether the test's ledger has its tables yet (the gateway creates them at start).
pub(crate) fn ledger_ready(dir: &Dir) -> bool {
    if crate::on_postgres() {
        !dir.db_rows("SELECT 1 FROM pg_tables WHERE tablename = 'operations'").is_empty()
    } else {
        dir.join("toolledger.sqlite3").exists()
            && !dir
                .db_rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'operations'")
                .is_empty()
    }
}

/// The gateway command a host runs: `toolledger mcp --config C --db D`.
fn gateway(dir: &Dir, config: &Path) -> Vec<String> {
    vec![
        env!("CARGO_BIN_EXE_toolledger").to_owned(),
        "mcp".to_owned(),
        "--config".to_owned(),
        config.display().to_string(),
        "--db".to_owned(),
        dir.db(),
    ]
}

/// Runs the SDK host over `steps` against `command`; one answer per step. Bounded: a
/// host that is still running after `limit` is killed and the test fails.
fn host(command: &[String], steps: &Value, limit: Duration) -> Vec<Value> {
    host_with(&[], command, steps, limit)
}

/// [`host`], with the host driver's own options (`--elicit`, `--protocol`).
fn host_with(options: &[&str], command: &[String], steps: &Value, limit: Duration) -> Vec<Value> {
    host_raw(options, command, steps, &[], limit)
}

/// [`host_with`], each string `"@name"` of `steps` written as the raw JSON text `raw`
/// gives it: numbers no `serde_json::Value` holds as the host writes them.
fn host_raw(
    options: &[&str],
    command: &[String],
    steps: &Value,
    raw: &[(&str, &str)],
    limit: Duration,
) -> Vec<Value> {
    let mut text = steps.to_string();
    for (name, number) in raw {
        text = text.replace(&format!("\"@{name}\""), number);
    }
    let mut child = Command::new(python())
        .arg(peer("host.py"))
        .args(options)
        .arg("--")
        .args(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "the host did not finish in {limit:?}; stdout: {}; stderr: {}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "host failed: {stdout}\n{stderr}");
    let answers: Vec<Value> =
        stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(answers.len(), steps.as_array().unwrap().len(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    answers
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"op": "call", "name": name, "arguments": arguments})
}

fn pay(order: &str, amount: i64, key: &str) -> Value {
    call(
        "create_payment",
        json!({"order_id": order, "amount_minor": amount, "currency": "USD", "idempotency_key": key}),
    )
}

/// The code of a tool error (`isError: true`), or "OK".
fn code(answer: &Value) -> String {
    assert!(answer.get("error").is_none(), "a protocol error, not a tool result: {answer}");
    if answer["isError"] == json!(true) {
        answer["structuredContent"]["code"].as_str().unwrap_or_default().to_owned()
    } else {
        "OK".to_owned()
    }
}

/// The wall clock, in Unix seconds.
fn unix_now() -> i64 {
    let elapsed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(elapsed.as_secs()).unwrap()
}

/// The ledger's own audit of the test's ledger passes.
fn audit_passes(dir: &Dir) {
    let audit = dir.run(&["audit"]);
    assert_eq!((audit.code, audit.answer()["code"].clone()), (0, json!("OK")), "{}", audit.stdout);
}

const LIMIT: Duration = Duration::from_secs(90);

#[test]
fn a_retry_replays_the_stored_result_without_calling_the_upstream_and_another_intent_conflicts() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let steps = json!([
        {"op": "list_tools"},
        pay("ord-1", 2599, "pay-ord-1"),
        pay("ord-1", 2599, "pay-ord-1"),
        pay("ord-1", 9999, "pay-ord-1"),
        call("list_payments", json!({})),
    ]);
    let answers = host(&gateway(&dir, &config), &steps, LIMIT);
    let tools = answers[0]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["create_payment", "get_payment_by_key", "list_payments", "toolledger_status"]
    );
    // The ledgered tool asks for a key; the read-only ones pass through untouched.
    let create = &tools[0];
    assert!(
        create["inputSchema"]["required"].as_array().unwrap().contains(&json!("idempotency_key"))
    );
    assert!(create["description"].as_str().unwrap().contains("toolledger_status"));
    assert!(tools[1]["inputSchema"]["properties"].get("idempotency_key").is_none());

    let (fresh, replay, conflict) = (&answers[1], &answers[2], &answers[3]);
    assert_eq!(code(fresh), "OK", "{fresh}");
    assert_eq!(fresh["structuredContent"]["status"], "captured");
    assert_eq!(fresh["meta"]["io.toolledger/replayed"], false);
    assert_eq!(code(replay), "OK");
    assert_eq!(replay["structuredContent"], fresh["structuredContent"]);
    assert_eq!(replay["content"], fresh["content"]);
    assert_eq!(replay["meta"]["io.toolledger/replayed"], true);
    assert_eq!(
        replay["meta"]["io.toolledger/status_ref"],
        fresh["meta"]["io.toolledger/status_ref"]
    );
    assert_eq!(code(conflict), "IDEMPOTENCY_CONFLICT", "{conflict}");
    // One payment, handed the operation's request ref as its own key, never the model's.
    assert_eq!(answers[4]["structuredContent"]["count"], 1);
    let made = payments(&dir);
    assert_eq!(made.len(), 1);
    assert!(made[0].1.starts_with("dr_"), "{made:?}");
    // The operation is the ledger's like any other: listed, shown, counted, on the
    // dashboard, audited.
    let listed = dir.run(&["list", "--state", "succeeded"]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert!(listed.stdout.contains("payments-create_payment"), "{}", listed.stdout);
    let status_ref = fresh["meta"]["io.toolledger/status_ref"].as_str().unwrap();
    let shown = dir.run(&["show", "--status-ref", status_ref]).answer();
    assert_eq!(shown["tool"], "payments-create_payment", "{shown}");
    assert_eq!(shown["status"], "succeeded", "{shown}");
    let metrics = dir.run(&["metrics"]).stdout;
    assert_eq!(crate::operators::samples(&metrics, "toolledger_operations")["succeeded"], 1);
    let dashboard = crate::dashboard::Dashboard::with(&dir, &[]);
    let (status, page) = dashboard.get(&format!("/operations/{status_ref}"));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("payments-create_payment") && page.contains("succeeded"), "{page}");
    audit_passes(&dir);
}

#[test]
fn the_configuration_decides_policies_schemas_and_keys_and_colliding_names_are_prefixed() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let text = std::fs::read_to_string(&config).unwrap();
    let (declared, tools) = text.split_once("[mcp.upstreams.payments.tools").unwrap();
    // A second payments server, `backup`, lists the same tools: each is then named
    // UPSTREAM.TOOL. Its create_payment is passed through by the configuration, and
    // the first's read-only list_payments is ledgered; the first's create_payment takes
    // its key from the arguments and a stricter input schema.
    let backup = declared.split_once("[mcp.upstreams.payments]").unwrap().1;
    let text = format!(
        r#"{declared}[mcp.upstreams.payments.tools.create_payment]
key_from_arguments = true
input_schema = {{ type = "object", required = ["order_id", "amount_minor", "currency"], additionalProperties = false, properties = {{ order_id = {{ type = "string" }}, amount_minor = {{ type = "integer", minimum = 1, maximum = 500 }}, currency = {{ type = "string", pattern = "^[A-Z]{{3}}$" }} }} }}

[mcp.upstreams.payments.tools.list_payments]
policy = "ledgered"

[mcp.upstreams.backup]{backup}
[mcp.upstreams.backup.tools.create_payment]
policy = "passthrough"
"#
    );
    assert!(tools.contains("lookup"), "{tools}");
    dir.write("toolledger.toml", text.as_bytes());
    let order = |order: &str, amount: i64| json!({"order_id": order, "amount_minor": amount, "currency": "USD"});
    let steps = json!([
        {"op": "list_tools"},
        call("payments.create_payment", order("ord-90", 100)),
        call("payments.create_payment", order("ord-90", 100)),
        call("payments.create_payment", order("ord-91", 100)),
        call("payments.create_payment", order("ord-92", 900)),
        call("backup.create_payment", order("ord-93", 100)),
        call("backup.create_payment", order("ord-93", 100)),
        call("payments.list_payments", json!({})),
        call("payments.list_payments", json!({"idempotency_key": "count-1"})),
    ]);
    let answers = host(&gateway(&dir, &config), &steps, LIMIT);
    let tools = answers[0]["tools"].as_array().unwrap();
    let listed = |name: &str| {
        tools
            .iter()
            .find(|tool| tool["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed"))
    };
    for tool in ["create_payment", "get_payment_by_key", "list_payments"] {
        listed(&format!("payments.{tool}"));
        listed(&format!("backup.{tool}"));
    }
    let required = |name: &str| listed(name)["inputSchema"]["required"].clone();
    // Keyed by its arguments: the key is offered, not required; the override is listed.
    let keyed = listed("payments.create_payment");
    assert!(keyed["inputSchema"]["properties"].get("idempotency_key").is_some(), "{keyed}");
    assert!(!required("payments.create_payment").to_string().contains("idempotency_key"));
    assert_eq!(keyed["inputSchema"]["properties"]["amount_minor"]["maximum"], 500, "{keyed}");
    // Passed through: the upstream's own schema, untouched; ledgered: a key required.
    let passed = listed("backup.create_payment");
    assert!(passed["inputSchema"]["properties"]["amount_minor"].get("maximum").is_none());
    assert!(required("payments.list_payments").to_string().contains("idempotency_key"));

    // The same arguments are one action, replayed; other arguments another action.
    assert_eq!(code(&answers[1]), "OK", "{}", answers[1]);
    assert_eq!(answers[2]["meta"]["io.toolledger/replayed"], true, "{}", answers[2]);
    assert_eq!(code(&answers[3]), "OK", "{}", answers[3]);
    assert_eq!(answers[3]["meta"]["io.toolledger/replayed"], false, "{}", answers[3]);
    // The configured schema is enforced before anything is sent.
    assert_eq!(code(&answers[4]), "INPUT_INVALID", "{}", answers[4]);
    // Passed through twice: two payments, as the upstream alone would make.
    assert_eq!(code(&answers[5]), "OK", "{}", answers[5]);
    assert!(answers[5]["meta"].get("io.toolledger/replayed").is_none(), "{}", answers[5]);
    // The read-only tool the configuration ledgers needs its key.
    assert_eq!(code(&answers[7]), "INPUT_INVALID", "{}", answers[7]);
    assert_eq!(code(&answers[8]), "OK", "{}", answers[8]);
    let made: Vec<String> = payments(&dir).into_iter().map(|(order, _)| order).collect();
    assert_eq!(made, ["ord-90", "ord-91", "ord-93", "ord-93"]);
    let ledgered = dir.db_rows("SELECT tool_name FROM operations ORDER BY tool_name");
    let names: Vec<&str> = ledgered.iter().filter_map(|row| row[0].as_deref()).collect();
    assert_eq!(
        names,
        ["payments-create_payment", "payments-create_payment", "payments-list_payments"]
    );
    audit_passes(&dir);
}

#[test]
fn the_key_in_meta_comes_first_and_a_missing_or_malformed_key_is_a_tool_error_with_nothing_written()
{
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let mut by_meta = call(
        "create_payment",
        json!({"order_id": "ord-2", "amount_minor": 100, "currency": "USD", "idempotency_key": "ignored-1"}),
    );
    by_meta["meta"] = json!({"io.toolledger/idempotency_key": "host-key-2"});
    let mut again = by_meta.clone();
    again["arguments"]["idempotency_key"] = json!("ignored-2");
    let steps = json!([
        call(
            "create_payment",
            json!({"order_id": "ord-3", "amount_minor": 100, "currency": "USD"})
        ),
        pay("ord-3", 100, &"k".repeat(129)),
        pay("ord-3", 100, "no spaces"),
        pay("ord-3", -5, "pay-ord-3"),
        call(
            "create_payment",
            json!({"order_id": "ord-3", "amount_minor": 100, "currency": "USD", "idempotency_key": 7})
        ),
        by_meta,
        again,
    ]);
    let answers = host(&gateway(&dir, &config), &steps, LIMIT);
    assert_eq!(code(&answers[0]), "INPUT_INVALID");
    assert_eq!(answers[0]["structuredContent"]["detail"]["pointer"], "/idempotency_key");
    assert_eq!(code(&answers[1]), "INPUT_INVALID");
    assert_eq!(code(&answers[2]), "INPUT_INVALID");
    assert_eq!(code(&answers[3]), "INPUT_INVALID", "{}", answers[3]);
    assert_eq!(answers[3]["structuredContent"]["detail"]["pointer"], "/amount_minor");
    assert_eq!(code(&answers[4]), "INPUT_INVALID");
    // None of them reached the upstream or the ledger.
    assert_eq!(code(&answers[5]), "OK", "{}", answers[5]);
    assert_eq!(code(&answers[6]), "OK");
    assert_eq!(answers[6]["meta"]["io.toolledger/replayed"], true, "the _meta key decides");
    let made = payments(&dir);
    assert_eq!(made.iter().filter(|(order, _)| order == "ord-2").count(), 1);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(dir.db_int("SELECT count(*) FROM operations"), 1);
}

#[test]
fn an_upstream_that_commits_and_drops_the_stream_is_unknown_until_its_lookup_reconciles_it() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    faults(&dir, json!({"drop_after_commit": ["ord-4"]}));
    let first = host(&gateway(&dir, &config), &json!([pay("ord-4", 700, "pay-ord-4")]), LIMIT);
    assert_eq!(code(&first[0]), "OUTCOME_UNKNOWN", "{}", first[0]);
    let status_ref =
        first[0]["structuredContent"]["detail"]["status_ref"].as_str().unwrap().to_owned();
    assert!(first[0]["content"][0]["text"].as_str().unwrap().contains("new key"));
    assert_eq!(payments(&dir).len(), 1, "the upstream committed before it dropped");
    // The retry with the same key touches nothing; the status query asks the upstream's
    // lookup tool, which finds the payment; after that the key replays it.
    faults(&dir, json!({}));
    let later = host(
        &gateway(&dir, &config),
        &json!([
            pay("ord-4", 700, "pay-ord-4"),
            call("toolledger_status", json!({"status_ref": status_ref})),
            pay("ord-4", 700, "pay-ord-4"),
        ]),
        LIMIT,
    );
    assert_eq!(code(&later[0]), "OUTCOME_UNKNOWN");
    assert_eq!(later[0]["structuredContent"]["detail"]["status_ref"], json!(status_ref));
    assert_eq!(code(&later[1]), "OK", "{}", later[1]);
    assert_eq!(later[1]["structuredContent"]["order_id"], "ord-4");
    assert_eq!(code(&later[2]), "OK");
    assert_eq!(later[2]["meta"]["io.toolledger/replayed"], true);
    assert_eq!(payments(&dir).len(), 1, "exactly one effect for the key");
    audit_passes(&dir);
}

/// The W3C trace contexts the upstream received, one per `create_payment` or
/// `get_payment_by_key` call, in order: (tool, trace id, tracestate), the trace id empty
/// when the request carried no `traceparent`.
fn upstream_traces(dir: &Dir) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(dir.join("payments.sqlite3.traces")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).unwrap();
            let parent = line["traceparent"].as_str().unwrap_or_default();
            let fields: Vec<&str> = parent.split('-').collect();
            if !parent.is_empty() {
                assert_eq!(fields.len(), 4, "a W3C traceparent: {parent}");
                assert_eq!((fields[0], fields[3]), ("00", "01"), "{parent}");
                assert_eq!(fields[2].len(), 16, "{parent}");
            }
            let trace_id = fields.get(1).copied().unwrap_or_default();
            let state = line["tracestate"].as_str().unwrap_or_default();
            (line["tool"].as_str().unwrap().to_owned(), trace_id.to_owned(), state.to_owned())
        })
        .collect()
}

/// A step with the host's trace context in its request's `_meta`.
fn traced(mut step: Value, traceparent: &str) -> Value {
    step["meta"] = json!({"traceparent": traceparent, "tracestate": "vendor=v1"});
    step
}

/// The host's trace goes on to the upstream (`docs/observability.md`): a ledgered call's
/// `_meta.traceparent` reaches the upstream's request in its `_meta`, in the same trace
/// with the vendors' `tracestate`; a replay sends nothing; a malformed `traceparent` is
/// dropped (the upstream gets none, as W3C asks); a status query's lookup carries the
/// trace of the query; over Streamable HTTP the request's `traceparent` header is taken.
#[test]
fn the_hosts_trace_context_reaches_the_upstream_and_a_replay_sends_nothing() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    faults(&dir, json!({"drop_after_commit": ["ord-83"]}));
    let (first, second, third, fourth) = (
        "0af7651916cd43dd8448eb211c80319c",
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "5c0d4b3a29187f6e5d4c3b2a19080706",
        "6d1e5c4b3a29180f7e6d5c4b3a291807",
    );
    let parent = |trace: &str| format!("00-{trace}-b7ad6b7169203331-01");
    let answers = host(
        &gateway(&dir, &config),
        &json!([
            traced(pay("ord-81", 100, "pay-ord-81"), &parent(first)),
            traced(pay("ord-81", 100, "pay-ord-81"), &parent(second)),
            traced(pay("ord-82", 200, "pay-ord-82"), "00-not-a-trace-01"),
            traced(pay("ord-83", 300, "pay-ord-83"), &parent(second)),
        ]),
        LIMIT,
    );
    let codes: Vec<String> = answers.iter().map(code).collect();
    assert_eq!(codes, ["OK", "OK", "OK", "OUTCOME_UNKNOWN"], "{answers:?}");
    assert_eq!(answers[1]["meta"]["io.toolledger/replayed"], true);
    let status_ref = answers[3]["structuredContent"]["detail"]["status_ref"].clone();
    faults(&dir, json!({}));
    let query = call("toolledger_status", json!({"status_ref": status_ref}));
    let later = host(&gateway(&dir, &config), &json!([traced(query, &parent(third))]), LIMIT);
    assert_eq!(code(&later[0]), "OK", "{}", later[0]);
    let (gateway, url) = listening(&dir, &config, &[]);
    let mut child = Command::new(python())
        .arg(peer("host.py"))
        .args(["--url", &url, "--traceparent", &parent(fourth)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let steps = json!([pay("ord-84", 400, "pay-ord-84")]).to_string();
    child.stdin.take().unwrap().write_all(steps.as_bytes()).unwrap();
    let over_http = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(over_http.stdout).unwrap();
    assert!(over_http.status.success(), "{stdout}");
    let answer: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(code(&answer), "OK", "{answer}");
    stop_cleanly(&dir, gateway);
    let seen = |tool: &str, trace: &str, state: &str| {
        (tool.to_owned(), trace.to_owned(), state.to_owned())
    };
    assert_eq!(
        upstream_traces(&dir),
        [
            seen("create_payment", first, "vendor=v1"),
            seen("create_payment", "", ""),
            seen("create_payment", second, "vendor=v1"),
            seen("get_payment_by_key", third, "vendor=v1"),
            seen("create_payment", fourth, ""),
        ],
        "one upstream request a call sent, each in its caller's trace; none for the replay"
    );
    assert_eq!(payments(&dir).len(), 4);
    audit_passes(&dir);
}

/// An OTLP/HTTP receiver in its own process (`crates/cli/tests/peers/otlp.py`, the
/// official `opentelemetry-proto` messages), killed when dropped.
pub(crate) struct Receiver {
    child: std::process::Child,
    dir: PathBuf,
    pub(crate) endpoint: String,
}

impl Receiver {
    pub(crate) fn start(dir: &Dir) -> Receiver {
        let out = dir.join("otlp");
        std::fs::create_dir_all(&out).unwrap();
        let child = Command::new(python())
            .arg(workspace("crates/cli/tests/peers/otlp.py"))
            .arg(&out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let port = loop {
            if let Ok(port) = std::fs::read_to_string(out.join("port")) {
                break port;
            }
            assert!(started.elapsed() < LIMIT, "the OTLP receiver did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        Receiver { child, dir: out, endpoint: format!("http://127.0.0.1:{}", port.trim()) }
    }

    /// The spans received so far, one JSON object each.
    pub(crate) fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("spans.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// The directory the receiver writes what it decoded to.
    pub(crate) fn endpoint_dir(&self) -> &Path {
        &self.dir
    }

    /// Every byte every export request carried.
    pub(crate) fn raw(&self) -> Vec<u8> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "bin") {
                all.extend(std::fs::read(path).unwrap());
            }
        }
        all
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The exported spans of trace `trace_id`.
pub(crate) fn of_trace<'a>(spans: &'a [Value], trace_id: &str) -> Vec<&'a Value> {
    spans.iter().filter(|span| span["trace_id"] == trace_id).collect()
}

/// The SDK host over stdio of `command`, with `env` (which the gateway it starts
/// inherits), through `steps`.
fn host_env(command: &[String], env: &[(&str, &str)], steps: &Value) -> Vec<Value> {
    let mut child = Command::new(python());
    child.arg(peer("host.py")).arg("--").args(command);
    for (name, value) in env {
        child.env(name, value);
    }
    let mut child =
        child.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(steps.to_string().as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// The gateway exports its spans where the standard variables say (OTLP over HTTP with
/// protobuf bodies, to a receiver decoding with the official `opentelemetry-proto`
/// messages): a fresh call is one trace from the host's span through the ledger's to
/// the upstream, whose request names the ledger's `execute` span as its parent; a
/// replay is the call span alone; and no exported byte holds the key, a digest or ref
/// derived from it, the principal, an argument or the result.
#[test]
fn the_gateways_spans_reach_an_otlp_receiver_in_the_hosts_trace_and_hold_no_secret() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let receiver = Receiver::start(&dir);
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "gateway-under-test"),
    ];
    let (fresh, replay) = ("0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736");
    let host_span = "b7ad6b7169203331";
    let parent = |trace: &str| format!("00-{trace}-{host_span}-01");
    let key = "pay-5e1f7a-key";
    let order = "ord-5e1f7a";
    let answers = host_env(
        &gateway(&dir, &config),
        &env,
        &json!([
            traced(pay(order, 42_424_242, key), &parent(fresh)),
            traced(pay(order, 42_424_242, key), &parent(replay)),
        ]),
    );
    assert_eq!((code(&answers[0]), code(&answers[1])), ("OK".to_owned(), "OK".to_owned()));
    let payment_id = answers[0]["structuredContent"]["payment_id"].as_str().unwrap().to_owned();
    // The gateway exited when the host closed its input: its last spans left first (the
    // gateway's four of the fresh call, the upstream's one, the replay's call span).
    let started = Instant::now();
    let spans = loop {
        let spans = receiver.spans();
        if of_trace(&spans, replay).len() == 1 && of_trace(&spans, fresh).len() == 5 {
            break spans;
        }
        assert!(started.elapsed() < LIMIT, "spans received: {spans:#?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let call = of_trace(&spans, fresh)
        .into_iter()
        .find(|span| span["name"] == "execute_tool payments-create_payment")
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(call["parent_span_id"], host_span, "the host's span is the parent");
    assert_eq!(
        (call["kind"].as_str(), call["scope"].as_str()),
        (Some("SPAN_KIND_INTERNAL"), Some("toolledger"))
    );
    assert_eq!(call["service"], "gateway-under-test", "OTEL_SERVICE_NAME");
    assert_eq!(call["attributes"]["toolledger.decision"], "fresh");
    assert_eq!(
        call["attributes"]["gen_ai.tool.name"], "payments-create_payment",
        "the ledger's name"
    );
    assert!(call["attributes"].get("gen_ai.tool.call.id").is_none(), "a key-derived id");
    let children: Vec<(&str, &str)> = of_trace(&spans, fresh)
        .into_iter()
        .filter(|span| span["parent_span_id"] == call["span_id"])
        .map(|span| (span["name"].as_str().unwrap(), span["kind"].as_str().unwrap()))
        .collect();
    let mut children = children;
    children.sort_unstable();
    assert_eq!(
        children,
        [
            ("commit A", "SPAN_KIND_INTERNAL"),
            ("commit C", "SPAN_KIND_INTERNAL"),
            ("execute", "SPAN_KIND_CLIENT")
        ]
    );
    let execute =
        of_trace(&spans, fresh).into_iter().find(|span| span["name"] == "execute").unwrap();
    // The upstream's request named the ledger's `execute` span: its own span of the
    // request is that span's child, in the host's trace.
    let received = std::fs::read_to_string(dir.join("payments.sqlite3.traces")).unwrap();
    let received: Vec<Value> =
        received.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(received.len(), 1, "the replay sent the upstream nothing: {received:?}");
    let expected = format!("00-{fresh}-{}-01", execute["span_id"].as_str().unwrap());
    assert_eq!(received[0]["traceparent"], expected);
    // The upstream's own span of the call (the official Python SDK's, exported by the
    // upstream's process), the `execute` span's child: host → ledger → upstream.
    let served: Vec<&Value> = spans.iter().filter(|span| span["service"] == "payments").collect();
    assert_eq!(served.len(), 1, "one upstream span, none for the replay: {served:#?}");
    assert_eq!(served[0]["name"], "tools/call create_payment");
    assert_eq!(served[0]["kind"], "SPAN_KIND_SERVER");
    assert_eq!(
        (&served[0]["trace_id"], &served[0]["parent_span_id"]),
        (&json!(fresh), &execute["span_id"])
    );

    let replayed = of_trace(&spans, replay);
    assert_eq!(replayed[0]["attributes"]["toolledger.decision"], "replay");
    assert_eq!(replayed[0]["parent_span_id"], host_span);

    let raw = receiver.raw();
    let text = String::from_utf8_lossy(&raw);
    let ledger = |column: &str| {
        dir.db_rows(&format!("SELECT {column} FROM operations"))[0][0].clone().unwrap()
    };
    let keyed = ledger("provider_call_id");
    for secret in [
        key.to_owned(),
        order.to_owned(),
        "42424242".to_owned(),
        payment_id,
        ledger("request_sha256"),
        ledger("status_ref"),
        ledger("downstream_request_ref"),
        keyed,
        "acme".to_owned(),
        "agent-1".to_owned(),
    ] {
        assert!(!secret.is_empty());
        assert!(!text.contains(&secret), "{secret} is in an exported byte");
    }
}

/// An upstream without a lookup tool: the status query answers unknown, honestly, and an
/// operator settles it with the upstream's result they found (`toolledger resolve`,
/// checked against the tool's output schema); the key then replays that result.
#[test]
fn an_unknown_no_lookup_can_tell_is_settled_by_an_operator_with_the_upstreams_result() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let text = std::fs::read_to_string(&config).unwrap();
    let lookup = text.lines().find(|line| line.starts_with("lookup = ")).unwrap().to_owned();
    dir.write("toolledger.toml", text.replace(&lookup, "").as_bytes());
    faults(&dir, json!({"drop_after_commit": ["ord-7"]}));
    let first = host(&gateway(&dir, &config), &json!([pay("ord-7", 900, "pay-ord-7")]), LIMIT);
    assert_eq!(code(&first[0]), "OUTCOME_UNKNOWN", "{}", first[0]);
    let status_ref =
        first[0]["structuredContent"]["detail"]["status_ref"].as_str().unwrap().to_owned();
    faults(&dir, json!({}));
    let asked = host(
        &gateway(&dir, &config),
        &json!([call("toolledger_status", json!({"status_ref": status_ref}))]),
        LIMIT,
    );
    assert_eq!(code(&asked[0]), "OUTCOME_UNKNOWN", "{}", asked[0]);

    // The operator finds the payment in the provider's own records.
    let found = rusqlite::Connection::open(dir.join("payments.sqlite3"))
        .unwrap()
        .query_row(
            "SELECT payment_id, amount_minor FROM payments WHERE order_id = 'ord-7'",
            [],
            |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)),
        )
        .unwrap();
    let payment = json!({"payment_id": found.0, "order_id": "ord-7", "amount_minor": found.1,
        "currency": "USD", "status": "captured"});
    let result = json!({"content": [{"type": "text", "text": payment.to_string()}],
        "structuredContent": payment, "isError": false});
    let later = (unix_now() + 3600).to_string();
    let resolve = |file: &str| {
        dir.run(&[
            "resolve",
            "--config",
            &config.display().to_string(),
            "--status-ref",
            &status_ref,
            "--receipt",
            file,
            "--reason",
            "the provider's dashboard shows the payment",
            // Past the lease the gateway's call held (its call may be in flight until then).
            "--now",
            &later,
        ])
    };
    let mut off = result.clone();
    off["structuredContent"]["amount_minor"] = json!("900");
    dir.write("off.json", off.to_string().as_bytes());
    let refused = resolve("off.json");
    assert_eq!(
        (refused.code, refused.text("/code")),
        (1, "INPUT_INVALID".to_owned()),
        "{refused:?}"
    );
    dir.write("result.json", result.to_string().as_bytes());
    let settled = resolve("result.json");
    assert_eq!((settled.code, settled.text("/status")), (0, "succeeded".to_owned()), "{settled:?}");

    let replayed = host(&gateway(&dir, &config), &json!([pay("ord-7", 900, "pay-ord-7")]), LIMIT);
    assert_eq!(code(&replayed[0]), "OK", "{}", replayed[0]);
    assert_eq!(replayed[0]["structuredContent"], payment);
    assert_eq!(replayed[0]["meta"]["io.toolledger/replayed"], true);
    assert_eq!(payments(&dir).len(), 1, "exactly one effect for the key");
    audit_passes(&dir);
    assert_eq!(dir.run(&["audit"]).answer()["resolved_by_operator"], json!([status_ref]));
}

/// The payments server over Streamable HTTP (the SDK's own app under uvicorn), on a
/// port of its choosing: the child, and its `/mcp` URL. Killed when the test ends.
struct HttpUpstream(std::process::Child, String);

impl HttpUpstream {
    fn start(dir: &Dir) -> HttpUpstream {
        let port_file = dir.join("payments.port");
        let _ = std::fs::remove_file(&port_file);
        let child = Command::new(python())
            .arg(peer("payments.py"))
            .env("PAYMENTS_STATE", dir.join("payments.sqlite3"))
            .env("PAYMENTS_REPORT", "1")
            .env("PAYMENTS_FAULTS", dir.join("faults.json"))
            .env("PAYMENTS_HTTP_PORT_FILE", &port_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let port = loop {
            if let Ok(port) = std::fs::read_to_string(&port_file) {
                break port;
            }
            assert!(started.elapsed() < LIMIT, "the HTTP upstream never listened");
            std::thread::sleep(Duration::from_millis(20));
        };
        HttpUpstream(child, format!("http://127.0.0.1:{}/mcp", port.trim()))
    }
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The payments configuration with the upstream at `url` instead of a command.
fn http_config(dir: &Dir, url: &str) -> PathBuf {
    let config = payments_config(dir, "");
    let text = std::fs::read_to_string(&config).unwrap();
    let command = text.lines().find(|line| line.starts_with("command = ")).unwrap().to_owned();
    let env = text.lines().find(|line| line.starts_with("env = ")).unwrap().to_owned();
    let text = text.replace(&command, &format!("url = {url:?}")).replace(&env, "");
    dir.write("toolledger.toml", text.as_bytes());
    config
}

/// An upstream at a Streamable HTTP URL is fronted as one over stdio is: a retry replays
/// without a second payment, another intent conflicts; a server that commits and dies
/// mid-answer is unknown until, back up, its lookup reconciles it.
#[test]
fn an_upstream_over_streamable_http_is_ledgered_and_its_lost_answer_reconciled() {
    let dir = Dir::new();
    faults(&dir, json!({"drop_after_commit": ["ord-9"]}));
    let upstream = HttpUpstream::start(&dir);
    let config = http_config(&dir, &upstream.1);
    let answers = host(
        &gateway(&dir, &config),
        &json!([
            pay("ord-8", 1200, "pay-ord-8"),
            pay("ord-8", 1200, "pay-ord-8"),
            pay("ord-8", 1300, "pay-ord-8"),
            call("list_payments", json!({})),
            pay("ord-9", 1400, "pay-ord-9"),
        ]),
        LIMIT,
    );
    assert_eq!(code(&answers[0]), "OK", "{}", answers[0]);
    assert_eq!(answers[1]["structuredContent"], answers[0]["structuredContent"]);
    assert_eq!(answers[1]["meta"]["io.toolledger/replayed"], true);
    assert_eq!(code(&answers[2]), "IDEMPOTENCY_CONFLICT");
    assert_eq!(answers[3]["structuredContent"]["count"], 1, "a read passes through");
    assert_eq!(code(&answers[4]), "OUTCOME_UNKNOWN", "{}", answers[4]);
    let status_ref =
        answers[4]["structuredContent"]["detail"]["status_ref"].as_str().unwrap().to_owned();
    drop(upstream);

    faults(&dir, json!({}));
    let upstream = HttpUpstream::start(&dir);
    let config = http_config(&dir, &upstream.1);
    let later = host(
        &gateway(&dir, &config),
        &json!([
            call("toolledger_status", json!({"status_ref": status_ref})),
            pay("ord-9", 1400, "pay-ord-9"),
        ]),
        LIMIT,
    );
    assert_eq!(code(&later[0]), "OK", "{}", later[0]);
    assert_eq!(later[0]["structuredContent"]["order_id"], "ord-9");
    assert_eq!(later[1]["meta"]["io.toolledger/replayed"], true);
    let made = payments(&dir);
    assert_eq!(
        made.iter().map(|(order, _)| order.as_str()).collect::<Vec<_>>(),
        ["ord-8", "ord-9"]
    );
    audit_passes(&dir);
}

/// An upstream URL the gateway cannot use is refused at start, saying why.
#[test]
fn an_https_or_malformed_upstream_url_is_refused_at_start() {
    let dir = Dir::new();
    for (url, why) in [("https://payments.example/mcp", "TLS"), ("ftp://x/mcp", "http://")] {
        let config = http_config(&dir, url);
        let run = dir.run(&["mcp", "--config", &config.display().to_string()]);
        assert_eq!(run.code, 2, "{run:?}");
        assert!(run.stderr.contains(why), "{}", run.stderr);
    }
}

/// The upstream's progress and log messages during a call reach the host that waits on
/// it, under the host's own progress token, in both protocol eras; a replay calls
/// nothing, so it reports nothing.
#[test]
fn an_upstreams_progress_and_logs_reach_the_host_whose_call_it_is() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    for (protocol, order) in [("legacy", "ord-21"), ("2026-07-28", "ord-22")] {
        let key = format!("pay-{order}");
        let answers = host_with(
            &["--observe", "--protocol", protocol],
            &gateway(&dir, &config),
            &json!([pay(order, 500, &key), pay(order, 500, &key)]),
            LIMIT,
        );
        assert_eq!(code(&answers[0]), "OK", "{protocol}: {}", answers[0]);
        let progress: Vec<&Value> = answers[0]["progress"].as_array().unwrap().iter().collect();
        assert_eq!(
            progress,
            [
                &json!({"progress": 1.0, "total": 2.0, "message": "authorizing"}),
                &json!({"progress": 2.0, "total": 2.0, "message": "captured"})
            ],
            "{protocol}: {}",
            answers[0]
        );
        let steps: Vec<&Value> =
            answers[0]["logs"].as_array().unwrap().iter().map(|log| &log["data"]["step"]).collect();
        assert_eq!(
            steps,
            [&json!("authorizing"), &json!("captured")],
            "{protocol}: {}",
            answers[0]
        );
        assert_eq!(answers[0]["logs"][0]["data"]["order_id"], json!(order));
        assert_eq!(answers[1]["meta"]["io.toolledger/replayed"], true);
        assert_eq!(answers[1]["progress"], json!([]), "a replay calls nothing upstream");
    }
    assert_eq!(payments(&dir).len(), 2);
}

/// `completion/complete` reaches the upstream that listed the prompt, and a handshake-era
/// host's `logging/setLevel` reaches every upstream that logs: unchanged, both ways.
/// [`payments_config`] with the payments server asking its client during calls
/// (`PAYMENTS_ASKS=1`): `create_payment` asks the payer to confirm, and the tools the
/// conformance suite calls to see a server ask are listed.
fn asking_config(dir: &Dir) -> PathBuf {
    let config = payments_config(dir, "");
    let text = std::fs::read_to_string(&config).unwrap();
    let asking =
        text.replace("PAYMENTS_REPORT = \"1\"", "PAYMENTS_REPORT = \"1\", PAYMENTS_ASKS = \"1\"");
    assert_ne!(asking, text);
    dir.write("toolledger.toml", asking.as_bytes());
    config
}

#[test]
fn an_upstream_that_asks_mid_call_asks_the_host_waiting_on_it_and_its_effect_stays_one() {
    let dir = Dir::new();
    let command = gateway(&dir, &asking_config(&dir));
    let answers = host_with(
        &[
            "--protocol",
            "legacy",
            "--elicit",
            "approve",
            "--sample",
            "It is sunny",
            "--roots",
            "file:///srv/a,file:///srv/b",
        ],
        &command,
        &json!([
            pay("ord-60", 100, "pay-ord-60"),
            pay("ord-60", 100, "pay-ord-60"),
            call("test_sampling", json!({"prompt": "What is the weather?"})),
            call("test_roots", json!({})),
            call("test_elicitation", json!({"message": "Who are you?"})),
        ]),
        LIMIT,
    );
    // A ledgered call: the upstream's question reached the person, their answer the
    // upstream, which paid once; the retry replays and asks nobody.
    assert_eq!(code(&answers[0]), "OK", "{}", answers[0]);
    assert_eq!(answers[0]["elicited"], json!(["Charge 100 USD for order ord-60?"]));
    assert_eq!(answers[1]["meta"]["io.toolledger/replayed"], true, "{}", answers[1]);
    assert_eq!(answers[1]["elicited"], json!([]));
    // Calls passed through: sampling, roots and elicitation, each answered by the host.
    assert_eq!(answers[2]["content"][0]["text"], "LLM response: It is sunny", "{}", answers[2]);
    assert_eq!(answers[2]["sampled"], json!(["What is the weather?"]));
    assert_eq!(answers[3]["content"][0]["text"], r#"["file:///srv/a", "file:///srv/b"]"#);
    assert_eq!(answers[3]["rooted"], 1);
    assert_eq!(answers[4]["elicited"], json!(["Who are you?"]), "{}", answers[4]);
    assert!(
        answers[4]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("User response: action=accept")
    );

    // A payer who declines: the upstream refuses, nothing was paid, and the retry says
    // so again without asking or sending.
    let declined = host_with(
        &["--protocol", "legacy", "--elicit", "decline"],
        &command,
        &json!([pay("ord-61", 100, "pay-ord-61"), pay("ord-61", 100, "pay-ord-61")]),
        LIMIT,
    );
    assert_eq!(code(&declined[0]), "DOWNSTREAM_REFUSED", "{}", declined[0]);
    assert_eq!(declined[0]["elicited"].as_array().unwrap().len(), 1);
    assert_eq!(code(&declined[1]), "DOWNSTREAM_REFUSED", "{}", declined[1]);
    assert_eq!(declined[1]["elicited"], json!([]));

    // A host that cannot be asked, and a 2026-07-28 host (no requests from a server
    // mid-call): the upstream is told why, and says so. The payments server passes the
    // gateway's error on as its answer to create_payment, an answer that does not say
    // the payment was not made: it stays unknown (the retry asks the lookup, which finds
    // none yet), never taken as not made.
    let unable = host_with(
        &["--protocol", "legacy"],
        &command,
        &json!([
            pay("ord-62", 100, "pay-ord-62"),
            call("test_sampling", json!({"prompt": "hi"})),
            pay("ord-62", 100, "pay-ord-62"),
        ]),
        LIMIT,
    );
    assert_eq!(code(&unable[0]), "OUTCOME_UNKNOWN", "{}", unable[0]);
    assert_eq!(code(&unable[2]), "OUTCOME_UNKNOWN", "{}", unable[2]);
    let status_ref = &unable[0]["structuredContent"]["detail"]["status_ref"];
    assert_eq!(&unable[2]["structuredContent"]["detail"]["status_ref"], status_ref);
    let said = unable[1].to_string();
    assert!(said.contains("not relayed") && said.contains("did not declare"), "{said}");
    // A 2026-07-28 host: a call passed through is answered input_required with the
    // upstream's question, and the host's retry with the answer resumes the same
    // upstream call. A ledgered call cannot wait so: its upstream is told why.
    let modern = host_with(
        &["--protocol", "2026-07-28", "--sample", "It is sunny", "--elicit", "approve"],
        &command,
        &json!([
            call("test_sampling", json!({"prompt": "What is the weather?"})),
            call("test_elicitation", json!({"message": "Who are you?"})),
            pay("ord-64", 100, "pay-ord-64"),
        ]),
        LIMIT,
    );
    assert_eq!(modern[0]["content"][0]["text"], "LLM response: It is sunny", "{}", modern[0]);
    assert_eq!(modern[0]["sampled"], json!(["What is the weather?"]));
    assert_eq!(modern[1]["elicited"], json!(["Who are you?"]), "{}", modern[1]);
    assert_eq!(code(&modern[2]), "OUTCOME_UNKNOWN", "{}", modern[2]);
    assert_eq!(modern[2]["elicited"], json!([]), "{}", modern[2]);

    let made = payments(&dir);
    assert!(made.len() == 1 && made[0].0 == "ord-60", "{made:?}");
    audit_passes(&dir);
}

#[test]
fn an_upstream_request_while_two_host_sessions_wait_on_that_upstream_is_refused_not_guessed() {
    let dir = Dir::new();
    let config = asking_config(&dir);
    // Each payment waits 1 s before its commit and 1 s after it: the window in which a
    // second host session calls the same upstream.
    faults(&dir, json!({"delay_ms": 1000}));
    let (gateway, url) = listening(&dir, &config, &[]);
    let paying = {
        let url = url.clone();
        std::thread::spawn(move || {
            host_with(
                &["--url", &url, "--protocol", "legacy", "--elicit", "approve"],
                &[],
                &json!([pay("ord-63", 100, "pay-ord-63")]),
                LIMIT,
            )
        })
    };
    let asking = host_with(
        &["--url", &url, "--protocol", "legacy", "--sample", "It is sunny"],
        &[],
        &json!([{"op": "sleep", "seconds": 0.7}, call("test_sampling", json!({"prompt": "hi"}))]),
        LIMIT,
    );
    let paid = paying.join().unwrap();
    assert_eq!(code(&paid[0]), "OK", "{}", paid[0]);
    // Alone on the upstream, a 2026-07-28 host over HTTP is asked through its retry.
    let modern = host_with(
        &["--url", &url, "--protocol", "2026-07-28", "--sample", "It is sunny"],
        &[],
        &json!([call("test_sampling", json!({"prompt": "hi"}))]),
        LIMIT,
    );
    assert_eq!(modern[0]["content"][0]["text"], "LLM response: It is sunny", "{}", modern[0]);
    let said = asking[1].to_string();
    assert!(said.contains("several host sessions"), "{said}");
    // The upstream passed the gateway's refusal on, as its own error: the host's
    // sampling callback never ran.
    assert_eq!(asking[1]["error"]["code"], json!(-1), "{said}");
    assert_eq!(payments(&dir).len(), 1);
    stop_cleanly(&dir, gateway);
}

#[test]
fn completion_and_the_log_level_are_forwarded_to_the_upstreams_that_serve_them() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let answers = host_with(
        &["--observe", "--protocol", "legacy"],
        &gateway(&dir, &config),
        &json!([
            pay("ord-31", 100, "pay-ord-31"),
            pay("ord-32", 100, "pay-ord-32"),
            pay("other-1", 100, "pay-other-1"),
            {"op": "list_prompts"},
            {"op": "complete", "prompt": "refund_policy", "argument": "order_id", "value": "ord-3"},
            {"op": "set_level", "level": "warning"},
            pay("ord-33", 100, "pay-ord-33"),
        ]),
        LIMIT,
    );
    assert_eq!(answers[4]["values"], json!(["ord-31", "ord-32"]), "{}", answers[4]);
    assert_eq!(answers[5]["set"], "warning", "{}", answers[5]);
    assert_eq!(answers[0]["logs"].as_array().unwrap().len(), 2, "{}", answers[0]);
    assert_eq!(code(&answers[6]), "OK", "{}", answers[6]);
    assert_eq!(answers[6]["logs"], json!([]), "info is below warning: {}", answers[6]);
    assert_eq!(answers[6]["progress"].as_array().unwrap().len(), 2);
}

#[test]
fn a_hanging_upstream_is_bounded_by_its_timeout_and_stays_unknown_without_a_second_send() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    faults(&dir, json!({"hang": ["ord-5"]}));
    let started = Instant::now();
    let answers = host(
        &gateway(&dir, &config),
        &json!([
            pay("ord-5", 700, "pay-ord-5"),
            pay("ord-5", 700, "pay-ord-5"),
            pay("ord-6", 800, "pay-ord-6"),
        ]),
        LIMIT,
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(code(&answers[0]), "OUTCOME_UNKNOWN", "{}", answers[0]);
    assert_eq!(code(&answers[1]), "OUTCOME_UNKNOWN");
    // The gateway went on serving (the hung request did not hold the next one).
    assert_eq!(code(&answers[2]), "OK", "{}", answers[2]);
    let status_ref = answers[0]["structuredContent"]["detail"]["status_ref"].as_str().unwrap();
    // The upstream never committed: the lookup finds nothing, and nothing guesses.
    let status = host(
        &gateway(&dir, &config),
        &json!([call("toolledger_status", json!({"status_ref": status_ref}))]),
        LIMIT,
    );
    assert_eq!(code(&status[0]), "OUTCOME_UNKNOWN", "{}", status[0]);
    let made = payments(&dir);
    assert_eq!(made.iter().filter(|(order, _)| order == "ord-5").count(), 0, "{made:?}");
    let listed = dir.run(&["list"]);
    assert!(listed.stdout.contains(status_ref), "an unknown is listed: {}", listed.stdout);
}

#[test]
fn an_upstream_frozen_with_its_process_alive_is_restarted_after_a_ping_goes_unanswered() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    faults(&dir, json!({"freeze": ["ord-7"]}));
    let answers = host(
        &gateway(&dir, &config),
        &json!([
            pay("ord-7", 700, "pay-ord-7"),
            pay("ord-8", 800, "pay-ord-8"),
            pay("ord-9", 900, "pay-ord-9"),
        ]),
        LIMIT,
    );
    // The frozen call may have happened: unknown, as a hang is.
    assert_eq!(code(&answers[0]), "OUTCOME_UNKNOWN", "{}", answers[0]);
    // The next calls find the upstream dead to a ping and start it again: they are
    // performed, not timed out one after another.
    assert_eq!(code(&answers[1]), "OK", "{}", answers[1]);
    assert_eq!(code(&answers[2]), "OK", "{}", answers[2]);
    let made = payments(&dir);
    assert_eq!(
        made.iter().map(|(order, _)| order.as_str()).collect::<Vec<_>>(),
        ["ord-8", "ord-9"]
    );
}

#[test]
fn an_upstream_slower_to_start_than_its_timeout_is_waited_for_when_the_gateway_starts() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let text = std::fs::read_to_string(&config).unwrap();
    dir.write("toolledger.toml", text.replace("timeout_ms = 3000", "timeout_ms = 1000").as_bytes());
    // The server takes 2.5 s before it answers anything, its requests 1 s at most: the
    // gateway's start waits for it, and its call is bounded by the request timeout.
    faults(&dir, json!({"start_delay_ms": 2500}));
    let answers = host(&gateway(&dir, &config), &json!([pay("ord-8", 100, "pay-ord-8")]), LIMIT);
    assert_eq!(code(&answers[0]), "OK", "{}", answers[0]);
    assert_eq!(payments(&dir).len(), 1);
}

#[test]
fn a_refusal_ends_failed_and_answers_refused_again_without_a_second_send() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    faults(&dir, json!({"refuse": ["ord-7"]}));
    let answers = host(
        &gateway(&dir, &config),
        &json!([pay("ord-7", 700, "pay-ord-7"), pay("ord-7", 700, "pay-ord-7")]),
        LIMIT,
    );
    assert_eq!(code(&answers[0]), "DOWNSTREAM_REFUSED", "{}", answers[0]);
    assert_eq!(answers[0]["structuredContent"]["detail"]["reason"], "card declined");
    assert_eq!(code(&answers[1]), "DOWNSTREAM_REFUSED");
    assert_eq!(answers[1]["structuredContent"]["detail"]["reason"], "card declined");
    assert!(payments(&dir).is_empty());
}

#[test]
fn an_off_schema_result_or_a_lying_tools_list_is_quarantined_not_returned() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    faults(&dir, json!({"off_schema": ["ord-8"]}));
    let answers = host(&gateway(&dir, &config), &json!([pay("ord-8", 700, "pay-ord-8")]), LIMIT);
    assert_eq!(code(&answers[0]), "RECEIPT_QUARANTINED", "{}", answers[0]);
    assert!(
        answers[0]["structuredContent"]["detail"]["reason"]
            .as_str()
            .unwrap()
            .contains("output schema")
    );
    // An upstream whose tools/list promises a member its results never have.
    let lying = Dir::new();
    let config = payments_config(&lying, "");
    let mut command = gateway(&lying, &config);
    command.splice(0..0, ["env".to_owned(), "PAYMENTS_LIE=1".to_owned()]);
    let answers = host(&command, &json!([pay("ord-9", 700, "pay-ord-9")]), LIMIT);
    assert_eq!(code(&answers[0]), "RECEIPT_QUARANTINED", "{}", answers[0]);
    // Neither result is trusted: each operation is set aside for an operator, listed,
    // and named by the audit; the upstream's effect is not lost.
    for dir in [&dir, &lying] {
        let listed = dir.run(&["list", "--state", "quarantined"]);
        assert_eq!(listed.stdout.lines().count(), 1, "{}", listed.stdout);
        let audit = dir.run(&["audit"]).answer();
        assert_eq!(audit["findings"].as_array().unwrap().len(), 1, "{audit}");
        assert_eq!(audit["findings"][0]["check"], "operations_quarantined");
        assert!(listed.stdout.contains(audit["findings"][0]["ref"].as_str().unwrap()));
        assert_eq!(payments(dir).len(), 1);
    }
}

#[test]
fn duplicate_concurrent_calls_with_one_key_make_one_payment() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let same = pay("ord-10", 1200, "pay-ord-10");
    let steps = json!([{"op": "concurrent", "calls": [same, same, same, same]}]);
    let answers = host(&gateway(&dir, &config), &steps, LIMIT);
    let results = answers[0]["results"].as_array().unwrap();
    let done: Vec<&Value> = results.iter().filter(|answer| code(answer) == "OK").collect();
    assert_eq!(done.len(), 4, "{results:?}");
    assert!(done.iter().all(|answer| answer["structuredContent"] == done[0]["structuredContent"]));
    assert_eq!(payments(&dir).len(), 1);
}

/// Eight `tools/call`s in flight at once on one host connection, each of its own key,
/// reach the upstream together: it holds all eight at once (each waits, boundedly, for
/// the others), where a gateway working one call at a time would hand it one.
#[test]
fn concurrent_calls_with_distinct_keys_reach_the_upstream_at_once() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    faults(&dir, json!({"meet": 8}));
    let calls: Vec<Value> =
        (0..8).map(|n| pay(&format!("ord-{}", 20 + n), 100 + n, &format!("pay-ord-{n}"))).collect();
    let steps = json!([{"op": "concurrent", "calls": calls}]);
    let answers = host(&gateway(&dir, &config), &steps, LIMIT);
    let results = answers[0]["results"].as_array().unwrap();
    assert!(results.iter().all(|answer| code(answer) == "OK"), "{results:?}");
    let most = std::fs::read_to_string(dir.join("payments.sqlite3.most")).unwrap();
    assert_eq!(most, "8", "the upstream held every call at once");
    assert_eq!(payments(&dir).len(), 8);
}

/// The gateway as a library on the host's own runtime (a current-thread one, as a
/// small host's `#[tokio::main(flavor = "current_thread")]` is): served over HTTP until
/// the host stops it, its concurrent calls still reaching the upstream at once.
#[test]
fn the_gateway_serves_on_the_hosts_own_runtime_until_the_host_stops_it() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    faults(&dir, json!({"meet": 4}));
    let address: std::net::SocketAddr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let options = toolledger_mcp::Options {
        config: Some(config),
        ledger: dir.join("gateway.sqlite3").display().to_string(),
        busy_timeout_ms: None,
        listen: Some(address),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let host = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(toolledger_mcp::serve_until(&options, async {
            let _ = stopped.await;
        }))
    });
    // Bounded: the gateway starts its upstream, then listens.
    let deadline = std::time::Instant::now() + LIMIT;
    while std::net::TcpStream::connect(address).is_err() {
        assert!(std::time::Instant::now() < deadline, "the gateway never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let calls: Vec<Value> =
        (0..4).map(|n| pay(&format!("ord-{}", 40 + n), 300 + n, &format!("lib-ord-{n}"))).collect();
    let answers = http_host(
        &format!("http://{address}/mcp"),
        None,
        &json!([{"op": "concurrent", "calls": calls}]),
    );
    let results = answers[0]["results"].as_array().unwrap();
    assert!(results.iter().all(|answer| code(answer) == "OK"), "{results:?}");
    assert_eq!(std::fs::read_to_string(dir.join("payments.sqlite3.most")).unwrap(), "4");
    stop.send(()).unwrap();
    host.join().unwrap().unwrap();
    assert_eq!(payments(&dir).len(), 4);
}

#[test]
fn a_published_server_is_fronted_ledgered_calls_replay_and_read_only_tools_pass_through() {
    let dir = Dir::new();
    let text = format!(
        r#"[mcp]
tenant = "acme"
subject = "agent-1"

[mcp.upstreams.memory]
command = ["node", {entry:?}]
env = {{ MEMORY_FILE_PATH = {memory:?} }}
"#,
        entry = server_memory().display().to_string(),
        memory = dir.join("memory.jsonl").display().to_string(),
    );
    dir.write("toolledger.toml", text.as_bytes());
    let ada = json!({"entities": [{"name": "Ada", "entityType": "person", "observations": ["writes programs"]}], "idempotency_key": "remember-ada"});
    let steps = json!([
        {"op": "list_tools"},
        call("create_entities", ada.clone()),
        call("delete_entities", json!({"entityNames": ["Ada"], "idempotency_key": "forget-ada"})),
        // The retry of the first call replays its result: the upstream is not called, so
        // Ada stays deleted.
        call("create_entities", ada),
        call("read_graph", json!({})),
    ]);
    let answers = host(&gateway(&dir, &dir.join("toolledger.toml")), &steps, LIMIT);
    let tools = answers[0]["tools"].as_array().unwrap();
    let find = |name: &str| tools.iter().find(|tool| tool["name"] == name).unwrap();
    assert!(find("create_entities")["inputSchema"]["properties"].get("idempotency_key").is_some());
    assert!(find("read_graph")["inputSchema"]["properties"].get("idempotency_key").is_none());
    assert_eq!(code(&answers[1]), "OK", "{}", answers[1]);
    assert_eq!(code(&answers[2]), "OK", "{}", answers[2]);
    assert_eq!(code(&answers[3]), "OK");
    assert_eq!(answers[3]["meta"]["io.toolledger/replayed"], true);
    assert_eq!(answers[3]["structuredContent"], answers[1]["structuredContent"]);
    assert_eq!(answers[4]["structuredContent"]["entities"], json!([]), "{}", answers[4]);
    audit_passes(&dir);
}

/// Rounds of the gateway's crash campaign: a short smoke here, as many as
/// `TOOLLEDGER_MCP_CRASH_ROUNDS` says in the long mode (`docs/reliability.md`).
fn crash_rounds() -> u64 {
    std::env::var("TOOLLEDGER_MCP_CRASH_ROUNDS")
        .ok()
        .and_then(|rounds| rounds.parse().ok())
        .unwrap_or(4)
}

#[test]
fn a_gateway_killed_at_random_instants_never_pays_twice_and_every_answer_it_gave_stays_true() {
    let dir = Dir::new();
    // A lease of 4 s (twice the 2 s timeout): a claim of a killed gateway runs out soon.
    let config = payments_config(&dir, "");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("subject = \"agent-1\"", "subject = \"agent-1\"\nlease_seconds = 4")
        .replace("timeout_ms = 3000", "timeout_ms = 2000");
    dir.write("toolledger.toml", text.as_bytes());
    // Every payment takes 250 ms before and after its commit: the kills land anywhere.
    faults(&dir, json!({"delay_ms": 250}));
    let mut seed: u64 = std::env::var("TOOLLEDGER_MCP_CRASH_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(20_261_201);
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (pid_file, wrapped) = pid_wrapped(&dir, &config);
    // (key, the payment an OK answer named)
    let mut acknowledged: Vec<(String, String)> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    for round in 0..crash_rounds() {
        let round_keys: Vec<String> = (0..4).map(|call| format!("crash-{round}-{call}")).collect();
        let steps: Vec<Value> =
            round_keys.iter().flat_map(|key| [pay(key, 100, key), pay(key, 100, key)]).collect();
        keys.extend(round_keys);
        let _ = std::fs::remove_file(&pid_file);
        let before = operations(&dir);
        let mut child = host_of(&wrapped);
        child
            .stdin
            .take()
            .unwrap()
            .write_all(Value::Array(steps.clone()).to_string().as_bytes())
            .unwrap();
        // Somewhere after the round's first call was accepted, before its last answer:
        // counted from the ledger, not the clock, so a slow machine moves nothing.
        let waiting = Instant::now();
        while operations(&dir) <= before && waiting.elapsed() < LIMIT {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(next() % 2500));
        if let Ok(pid) = std::fs::read_to_string(&pid_file) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(started.elapsed() < LIMIT, "the host did not end after its gateway was killed");
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        for (answer, step) in
            stdout.lines().map(|line| serde_json::from_str::<Value>(line).unwrap()).zip(&steps)
        {
            if answer.get("isError") == Some(&json!(false)) {
                let key = step["arguments"]["idempotency_key"].as_str().unwrap().to_owned();
                let payment =
                    answer["structuredContent"]["payment_id"].as_str().unwrap().to_owned();
                acknowledged.push((key, payment));
            }
        }
    }
    // Recovery: a new gateway, once every claim of the killed ones has run out; its
    // relay delivers what was accepted, reconciles what was claimed (the lookup tool),
    // and every key then answers.
    let mut steps = vec![json!({"op": "sleep", "seconds": 7})];
    steps.extend(keys.iter().map(|key| pay(key, 100, key)));
    let answers = host(&gateway(&dir, &config), &Value::Array(steps), LIMIT);
    let made = payments(&dir);
    for (key, answer) in keys.iter().zip(&answers[1..]) {
        let effects = made.iter().filter(|(order, _)| order == key).count();
        assert!(effects <= 1, "{key}: {effects} payments");
        match code(answer).as_str() {
            "OK" => {
                assert_eq!(effects, 1, "{key}: answered OK with no payment");
                let payment = answer["structuredContent"]["payment_id"].as_str().unwrap();
                for (acked, was) in acknowledged.iter().filter(|(acked, _)| acked == key) {
                    assert_eq!(was, payment, "{acked}: an acknowledged answer changed");
                }
            }
            // Still unknown: listed for an operator, never guessed.
            "OUTCOME_UNKNOWN" => {
                let status_ref =
                    answer["structuredContent"]["detail"]["status_ref"].as_str().unwrap();
                assert!(dir.run(&["list"]).stdout.contains(status_ref));
            }
            other => panic!("{key}: {other}: {answer}"),
        }
    }
    assert!(!acknowledged.is_empty() || crash_rounds() == 0, "no answer came back before a kill");
    audit_passes(&dir);
}

/// A call the host cancels after it reached the upstream is kept (the upstream acted);
/// one the host cancels before it was sent ends not sent. Calls no longer wait for one
/// another, so the second waits on the ledger itself: the test holds the ledger's write
/// lock while that call arrives and is cancelled, and lets it go after.
#[test]
fn a_cancelled_call_that_was_not_sent_ends_not_sent_and_one_already_sent_is_kept() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    faults(&dir, json!({"delay_ms": 1000}));
    let mut slow = pay("ord-20", 100, "pay-ord-20");
    slow["timeout_s"] = json!(0.5);
    let mut waiting = pay("ord-21", 100, "pay-ord-21");
    waiting["timeout_s"] = json!(0.5);
    // ord-20 reaches the upstream and is cancelled while the upstream works (1 s each
    // side of its commit). Once it has ended, the test takes the ledger's write lock for
    // 2.5 s; ord-21 comes 3 s after ord-20 was cancelled, waits on the lock, and is
    // cancelled there, before anything is sent.
    let steps = json!([
        slow,
        {"op": "sleep", "seconds": 3},
        waiting,
        {"op": "sleep", "seconds": 3},
        pay("ord-20", 100, "pay-ord-20"),
        pay("ord-21", 100, "pay-ord-21"),
    ]);
    let db = PathBuf::from(dir.db());
    // On PostgreSQL: one client to watch the ledger, one to lock it.
    let mut postgres = dir.1.as_ref().map(|postgres| (postgres.raw(), postgres.raw()));
    let locker = std::thread::spawn(move || {
        let succeeded = "SELECT count(*) FROM operations WHERE status = 'succeeded'";
        let mut ended = || match &mut postgres {
            Some((watch, _)) => {
                watch.query_one(succeeded, &[]).ok().map(|row| row.get::<_, i64>(0))
            }
            None => rusqlite::Connection::open(&db)
                .ok()
                .and_then(|conn| conn.query_row(succeeded, [], |row| row.get::<_, i64>(0)).ok()),
        };
        let deadline = Instant::now() + LIMIT;
        while ended() != Some(1) {
            assert!(Instant::now() < deadline, "ord-20 never ended");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The ledger's write lock: SQLite's writer, PostgreSQL's lock on the table
        // commit A inserts into.
        match &mut postgres {
            Some((_, client)) => {
                let mut lock = client.transaction().unwrap();
                lock.batch_execute("LOCK TABLE operations IN EXCLUSIVE MODE").unwrap();
                std::thread::sleep(Duration::from_millis(2500));
                lock.commit().unwrap();
            }
            None => {
                let mut conn = rusqlite::Connection::open(&db).unwrap();
                conn.busy_timeout(LIMIT).unwrap();
                let lock = conn
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .unwrap();
                std::thread::sleep(Duration::from_millis(2500));
                lock.commit().unwrap();
            }
        }
    });
    let answers = host(&gateway(&dir, &config), &steps, LIMIT);
    locker.join().unwrap();
    for cancelled in [&answers[0], &answers[2]] {
        assert_eq!(cancelled["error"]["code"], json!(-32001), "{cancelled}");
    }
    let made = payments(&dir);
    let (sent, waited) = (&answers[4], &answers[5]);
    assert_eq!(code(sent), "OK", "{sent}");
    assert_eq!(made.iter().filter(|(order, _)| order == "ord-20").count(), 1);
    assert_eq!(code(waited), "DOWNSTREAM_REFUSED", "{waited}");
    assert!(
        waited["structuredContent"]["detail"]["reason"].as_str().unwrap().contains("cancelled")
    );
    assert_eq!(made.iter().filter(|(order, _)| order == "ord-21").count(), 0);
    audit_passes(&dir);
}

/// The conformance suite's server scenarios that apply to a gateway: its own server
/// side (the handshakes of both protocol eras, ping, the tool list, streams, DNS
/// rebinding protection) and `logging/setLevel`, forwarded to the payments upstream.
/// The others call the reference server's own fixtures
/// (`test_simple_text`, `test://static-text`, …) or need upstream-to-host requests
/// relayed mid-call; `docs/mcp.md` lists each and why.
const CONFORMANCE_SCENARIOS: [&str; 10] = [
    "logging-set-level",
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
    "server-initialize",
    "ping",
    "tools-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
];

#[test]
fn the_official_conformance_suite_passes_the_server_scenarios_that_apply_over_streamable_http() {
    let dir = Dir::new();
    let config = asking_config(&dir);
    let (gateway, url) = listening(&dir, &config, &[]);
    let suite = node_modules().join("@modelcontextprotocol/conformance/dist/index.js");
    for scenario in CONFORMANCE_SCENARIOS {
        let output = Command::new("node")
            .arg(&suite)
            .args(["server", "--url", &url, "--scenario", scenario])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{scenario}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            stdout.contains("0 failed") && !stdout.contains(" 0 passed"),
            "{scenario}: {stdout}"
        );
    }
    stop_cleanly(&dir, gateway);
}

/// A listening gateway, stopped with SIGTERM when dropped still running (a test that
/// fails before [`stop_cleanly`] leaves no gateway, and no upstream of it, behind).
struct Listening(std::process::Child);

impl Drop for Listening {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = Command::new("kill").arg(self.0.id().to_string()).status();
            let _ = self.0.wait();
        }
    }
}

/// Starts `toolledger mcp --listen 127.0.0.1:0` with `env`; the gateway and its URL.
fn listening(dir: &Dir, config: &Path, env: &[(&str, &str)]) -> (Listening, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolledger"));
    command
        .args(["mcp", "--config"])
        .arg(config)
        .args(["--db", &dir.db(), "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut gateway = command.spawn().unwrap();
    let mut stderr = std::io::BufReader::new(gateway.stderr.take().unwrap());
    let url = loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() == 0 {
            let status = gateway.wait().unwrap();
            panic!("the gateway ended before it listened: {status}");
        }
        if let Some(url) = line.trim().strip_prefix("toolledger mcp: listening on ") {
            break url.to_owned();
        }
    };
    // Keep draining its log into the test's directory, so the gateway never blocks on a
    // full pipe and a failure can show what it said.
    let mut log = std::fs::File::create(dir.join("gateway.log")).unwrap();
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut log));
    (Listening(gateway), url)
}

/// SIGTERM ends a listening gateway, cleanly (exit 0).
fn stop_cleanly(dir: &Dir, mut gateway: Listening) {
    let _ = Command::new("kill").arg(gateway.0.id().to_string()).status();
    let status = gateway.0.wait().unwrap();
    let log = std::fs::read_to_string(dir.join("gateway.log")).unwrap_or_default();
    assert!(status.success(), "SIGTERM ends the gateway cleanly: {status}\n{log}");
}

/// The configuration at `config` with the `[[mcp.tokens]]` entries `tokens` added.
fn with_tokens(dir: &Dir, config: &Path, tokens: &str) -> PathBuf {
    let text = std::fs::read_to_string(config).unwrap().replacen(
        "\n[mcp.upstreams.payments]",
        &format!("{tokens}\n[mcp.upstreams.payments]"),
        1,
    );
    dir.write("toolledger.toml", text.as_bytes());
    dir.join("toolledger.toml")
}

/// The SDK host over Streamable HTTP at `url`, with the token in `$TOKEN` when given.
fn http_host(url: &str, token: Option<&str>, steps: &Value) -> Vec<Value> {
    let mut command = vec!["--url".to_owned(), url.to_owned()];
    let mut child = Command::new(python());
    if let Some(token) = token {
        command.extend(["--bearer-env".to_owned(), "TOKEN".to_owned()]);
        child.env("TOKEN", token);
    }
    let output = {
        let mut child = child
            .arg(peer("host.py"))
            .args(&command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(steps.to_string().as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

#[test]
fn over_http_each_bearer_token_is_its_own_principal_and_a_request_without_one_is_refused() {
    let dir = Dir::new();
    let tokens = r#"
[[mcp.tokens]]
token_env = "GATEWAY_TOKEN_OPS"
tenant = "acme"
subject = "ops-agent"

[[mcp.tokens]]
token_env = "GATEWAY_TOKEN_BILLING"
tenant = "acme"
subject = "billing-agent"
"#;
    let config = with_tokens(&dir, &payments_config(&dir, ""), tokens);
    let (ops, billing) = ("ops-token-0123456789abcdef", "billing-token-0123456789abcdef");
    let env = [("GATEWAY_TOKEN_OPS", ops), ("GATEWAY_TOKEN_BILLING", billing)];
    let (gateway, url) = listening(&dir, &config, &env);
    // No token, or one nobody configured: 401 before anything reaches MCP.
    for header in [None, Some("Bearer not-a-configured-token-at-all")] {
        let mut request = ureq::post(&url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream");
        if let Some(header) = header {
            request = request.header("Authorization", header);
        }
        let refused = request
            .config()
            .http_status_as_error(false)
            .build()
            .send(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
            .unwrap();
        assert_eq!(refused.status(), 401);
    }
    // The same key under two tokens is two principals' two actions.
    let first = http_host(&url, Some(ops), &json!([pay("ord-30", 100, "same-key")]));
    let second = http_host(&url, Some(billing), &json!([pay("ord-30", 100, "same-key")]));
    assert_eq!(code(&first[0]), "OK", "{}", first[0]);
    assert_eq!(code(&second[0]), "OK");
    assert_eq!(second[0]["meta"]["io.toolledger/replayed"], false);
    assert_ne!(
        first[0]["meta"]["io.toolledger/status_ref"],
        second[0]["meta"]["io.toolledger/status_ref"]
    );
    // One principal cannot ask after the other's operation.
    let status_ref = first[0]["meta"]["io.toolledger/status_ref"].clone();
    let asked = http_host(
        &url,
        Some(billing),
        &json!([call("toolledger_status", json!({"status_ref": status_ref}))]),
    );
    assert_eq!(code(&asked[0]), "NOT_FOUND", "{}", asked[0]);
    let subjects = dir.db_rows("SELECT subject_id FROM operations ORDER BY subject_id");
    assert_eq!(subjects, [[Some("billing-agent".to_owned())], [Some("ops-agent".to_owned())]]);
    stop_cleanly(&dir, gateway);
    // An address that is not loopback is refused without tokens.
    let open = Dir::new();
    let config = payments_config(&open, "");
    let refused = open.run(&["mcp", "--config", config.to_str().unwrap(), "--listen", "0.0.0.0:0"]);
    assert_eq!(refused.code, 2);
    assert!(
        refused.stderr.contains("USAGE_ERROR") && refused.stderr.contains("[[mcp.tokens]]"),
        "{}",
        refused.stderr
    );
}

#[test]
fn resources_and_prompts_pass_through_to_the_upstream_that_serves_them_unchanged() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let steps = json!([
        pay("ord-40", 100, "pay-ord-40"),
        {"op": "list_resources"},
        {"op": "read_resource", "uri": "payments://summary"},
        {"op": "list_prompts"},
        {"op": "get_prompt", "name": "refund_policy", "arguments": {"order_id": "ord-40"}},
        {"op": "read_resource", "uri": "payments://nothing-here"},
    ]);
    let answers = host(&gateway(&dir, &config), &steps, LIMIT);
    assert_eq!(code(&answers[0]), "OK");
    assert_eq!(answers[1]["resources"][0]["uri"], "payments://summary", "{}", answers[1]);
    assert_eq!(answers[2]["contents"][0]["text"], "1 payments", "{}", answers[2]);
    assert_eq!(answers[3]["prompts"][0]["name"], "refund_policy");
    let text = answers[4]["messages"][0]["content"]["text"].as_str().unwrap();
    assert!(text.contains("ord-40"), "{}", answers[4]);
    // The upstream's own error, as it gave it.
    assert_eq!(answers[5]["error"]["code"], json!(-32602), "{}", answers[5]);
    assert!(answers[5]["error"]["message"].as_str().unwrap().contains("Unknown resource"));
}

#[test]
fn a_subscribed_resources_updates_and_changed_lists_reach_the_hosts_even_after_a_reconnect() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    // The payments server exits right after ord-72's commit: the next call connects
    // again, and the subscription is made again on the new connection.
    faults(&dir, json!({"drop_after_commit": ["ord-72"]}));
    let summary = "payments://summary";
    let notices = json!({"op": "notices"});
    let pause = json!({"op": "sleep", "seconds": 0.3});
    let answers = host_with(
        &["--protocol", "legacy"],
        &gateway(&dir, &config),
        &json!([
            {"op": "subscribe", "uri": summary},
            pay("ord-70", 100, "pay-ord-70"),
            pause, notices,
            {"op": "list_resources"},
            pay("ord-72", 100, "pay-ord-72"),
            pay("ord-73", 100, "pay-ord-73"),
            pause, notices,
            {"op": "unsubscribe", "uri": summary},
            pay("ord-74", 100, "pay-ord-74"),
            pause, notices,
        ]),
        LIMIT,
    );
    let listed = json!({"method": "notifications/resources/list_changed"});
    let updated = json!({"method": "notifications/resources/updated", "uri": summary});
    assert_eq!(answers[0]["subscribed"], summary, "{}", answers[0]);
    assert_eq!(code(&answers[1]), "OK");
    assert_eq!(answers[3]["notices"], json!([listed, updated]), "{}", answers[3]);
    let uris: Vec<&str> = answers[4]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|resource| resource["uri"].as_str().unwrap())
        .collect();
    assert_eq!(uris, [summary, "payments://payment/pay_1"], "{}", answers[4]);
    // ord-72 committed and dropped before it could announce it; ord-73 came through
    // the new connection, still subscribed.
    assert_eq!(code(&answers[5]), "OUTCOME_UNKNOWN", "{}", answers[5]);
    assert_eq!(code(&answers[6]), "OK", "{}", answers[6]);
    assert_eq!(answers[8]["notices"], json!([listed, updated]), "{}", answers[8]);
    // Unsubscribed: the list still changes, the summary's updates stop.
    assert_eq!(answers[9]["unsubscribed"], summary);
    assert_eq!(answers[12]["notices"], json!([listed]), "{}", answers[12]);
}

#[test]
fn a_2026_host_listens_for_a_resources_updates_and_changed_lists() {
    let dir = Dir::new();
    let summary = "payments://summary";
    let answers = host_with(
        &["--protocol", "2026-07-28"],
        &gateway(&dir, &payments_config(&dir, "")),
        &json!([
            {"op": "listen", "uris": [summary, "payments://nothing-here"]},
            pay("ord-80", 100, "pay-ord-80"),
            {"op": "sleep", "seconds": 0.3},
            {"op": "notices"},
        ]),
        LIMIT,
    );
    // The stream takes the changed lists and the summary; the tool list (fixed at the
    // gateway's start) is not offered.
    let honored = &answers[0]["listening"];
    assert_eq!(honored["resourcesListChanged"], true, "{}", answers[0]);
    assert!(honored.get("toolsListChanged").is_none(), "{}", answers[0]);
    assert!(
        honored["resourceSubscriptions"].as_array().unwrap().contains(&json!(summary)),
        "{}",
        answers[0]
    );
    assert_eq!(code(&answers[1]), "OK", "{}", answers[1]);
    let listed = json!({"method": "notifications/resources/list_changed"});
    let updated = json!({"method": "notifications/resources/updated", "uri": summary});
    assert_eq!(answers[3]["notices"], json!([listed, updated]), "{}", answers[3]);
}

#[test]
fn over_http_a_resources_update_reaches_only_the_sessions_subscribed_to_it() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let (gateway, url) = listening(&dir, &config, &[]);
    let summary = "payments://summary";
    let watching = {
        let url = url.clone();
        std::thread::spawn(move || {
            host_with(
                &["--url", &url, "--protocol", "legacy"],
                &[],
                &json!([
                    {"op": "subscribe", "uri": summary},
                    {"op": "sleep", "seconds": 2.5},
                    {"op": "notices"},
                ]),
                LIMIT,
            )
        })
    };
    let paying = host_with(
        &["--url", &url, "--protocol", "legacy"],
        &[],
        &json!([
            {"op": "sleep", "seconds": 1.0},
            pay("ord-75", 100, "pay-ord-75"),
            {"op": "sleep", "seconds": 0.3},
            {"op": "notices"},
        ]),
        LIMIT,
    );
    let watched = watching.join().unwrap();
    let listed = json!({"method": "notifications/resources/list_changed"});
    let updated = json!({"method": "notifications/resources/updated", "uri": summary});
    assert_eq!(code(&paying[1]), "OK", "{}", paying[1]);
    assert_eq!(paying[3]["notices"], json!([listed]), "{}", paying[3]);
    assert_eq!(watched[2]["notices"], json!([listed, updated]), "{}", watched[2]);
    stop_cleanly(&dir, gateway);
}

#[test]
fn a_tool_a_person_approves_asks_through_elicitation_in_both_protocol_eras_and_binds_the_answer() {
    let dir = Dir::new();
    let config =
        payments_config(&dir, "approval = { approver = \"ops-lead\", max_validity_seconds = 300 }");
    let command = gateway(&dir, &config);
    // 2026-07-28: the call answers input_required, the SDK's driver asks the person
    // and retries the call with the answer. The retry of the action asks nobody.
    let modern = host_with(
        &["--elicit", "approve"],
        &command,
        &json!([pay("ord-50", 100, "pay-ord-50"), pay("ord-50", 100, "pay-ord-50")]),
        LIMIT,
    );
    assert_eq!(code(&modern[0]), "OK", "{}", modern[0]);
    let asked = modern[0]["elicited"][0].as_str().unwrap();
    assert!(asked.contains("create_payment") && asked.contains("pay-ord-50"), "{asked}");
    assert_eq!(modern[1]["meta"]["io.toolledger/replayed"], true);
    assert_eq!(modern[1]["elicited"], json!([]));
    // The handshake era: the gateway asks mid-call.
    let legacy = host_with(
        &["--protocol", "legacy", "--elicit", "approve"],
        &command,
        &json!([pay("ord-51", 100, "pay-ord-51")]),
        LIMIT,
    );
    assert_eq!(code(&legacy[0]), "OK", "{}", legacy[0]);
    assert_eq!(legacy[0]["elicited"].as_array().unwrap().len(), 1);
    // A person who declines, and a host that cannot ask: nothing accepted, nothing sent.
    let declined = host_with(
        &["--elicit", "decline"],
        &command,
        &json!([pay("ord-52", 100, "pay-ord-52")]),
        LIMIT,
    );
    assert_eq!(code(&declined[0]), "APPROVAL_REQUIRED", "{}", declined[0]);
    let unable = host(&command, &json!([pay("ord-53", 100, "pay-ord-53")]), LIMIT);
    assert_eq!(code(&unable[0]), "APPROVAL_REQUIRED", "{}", unable[0]);
    let told = unable[0]["content"][0]["text"].as_str().unwrap();
    assert!(told.contains("elicitation") && told.contains("io.toolledger/approval"), "{told}");
    // The host presents an approval it obtained itself; one by somebody not eligible is
    // refused.
    let now = unix_now();
    let grant = |approver: &str| {
        json!({"io.toolledger/approval": {"approval_id": "appr-53", "approver_id": approver,
            "approved_at": now - 5, "expires_at": now + 60}})
    };
    let mut by_stranger = pay("ord-53", 100, "pay-ord-53");
    by_stranger["meta"] = grant("somebody-else");
    let mut by_lead = pay("ord-53", 100, "pay-ord-53");
    by_lead["meta"] = grant("ops-lead");
    let presented = host(&command, &json!([by_stranger, by_lead]), LIMIT);
    assert_eq!(code(&presented[0]), "APPROVAL_INVALID", "{}", presented[0]);
    assert_eq!(code(&presented[1]), "OK", "{}", presented[1]);
    let made: Vec<String> = payments(&dir).into_iter().map(|(order, _)| order).collect();
    assert_eq!(made, ["ord-50", "ord-51", "ord-53"]);
    // Each approval is the ledger's, bound to its call like a case file's.
    let approvers = dir.db_rows("SELECT approver_id FROM operations ORDER BY approver_id");
    assert_eq!(approvers, vec![vec![Some("ops-lead".to_owned())]; 3]);
    // With its expiry: the configured 300 s for the two the gateway asked for, the
    // presented one's own 65 s.
    let lasting = |seconds: i64| {
        dir.db_int(&format!(
            "SELECT count(*) FROM operations WHERE approval_expires_at - approved_at = {seconds}"
        ))
    };
    assert_eq!((lasting(300), lasting(65)), (2, 1));
    audit_passes(&dir);
}

#[test]
fn toolledger_relay_learns_the_upstreams_and_settles_what_a_killed_gateway_left() {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("subject = \"agent-1\"", "subject = \"agent-1\"\nlease_seconds = 4")
        .replace("timeout_ms = 3000", "timeout_ms = 2000");
    dir.write("toolledger.toml", text.as_bytes());
    // The payment commits 1.5 s into its call, and the gateway is killed 2.5 s after the
    // host starts it, before the gateway could record it.
    faults(&dir, json!({"delay_ms": 1500}));
    let (pid_file, wrapped) = pid_wrapped(&dir, &config);
    let mut child = host_of(&wrapped);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json!([pay("ord-60", 100, "pay-ord-60")]).to_string().as_bytes())
        .unwrap();
    // The call is accepted and claimed (commit A) before the upstream is called, and
    // the upstream waits 1.5 s before it commits: the kill lands inside the call.
    let started = Instant::now();
    while operations(&dir) == 0 {
        assert!(started.elapsed() < LIMIT, "the call was never accepted: {}", dir.db());
        if let Some(status) = child.try_wait().unwrap() {
            let mut told = String::new();
            child.stdout.take().unwrap().read_to_string(&mut told).unwrap();
            panic!("the host ended ({status}) before its call was accepted: {told}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    assert!(Command::new("kill").args(["-KILL", pid.trim()]).status().unwrap().success());
    let output = child.wait_with_output().unwrap();
    let answer: Value =
        serde_json::from_str(String::from_utf8(output.stdout).unwrap().trim()).unwrap();
    assert!(answer.get("error").is_some(), "the host saw its gateway die: {answer}");
    // Whether the upstream finished its payment when its caller died is its own affair
    // (the Python SDK cancels a call whose stdin closed); the ledger holds an operation
    // claimed by a dead gateway, and nothing claims it succeeded.
    std::thread::sleep(Duration::from_secs(2));
    let before = payments(&dir).len();
    assert!(before <= 1);
    let succeeded = "SELECT count(*) FROM operations WHERE status = 'succeeded'";
    assert_eq!(dir.db_int(succeeded), 0);
    // Past the lease, a relay over the same configuration asks the lookup tool first:
    // it records the payment it finds, or sends the one that was never made.
    faults(&dir, json!({}));
    std::thread::sleep(Duration::from_secs(3));
    // The relay's requests have a longer bound (and a lease twice as long, as the
    // configuration requires): the 2 s above was for the killed call, and under the
    // suite's load a lookup can take longer than that.
    let relaxed = text
        .replace("timeout_ms = 2000", "timeout_ms = 5000")
        .replace("lease_seconds = 4", "lease_seconds = 10");
    dir.write("toolledger.toml", relaxed.as_bytes());
    // A relay runs pass after pass; on a loaded machine one pass's lookup may outlast
    // the upstream's timeout and leave it unknown for the next (at most ten passes here).
    for _ in 0..10 {
        let relayed = dir.run(&["relay", "--once", "--config", config.to_str().unwrap()]);
        assert_eq!(relayed.code, 0, "{}\n{}", relayed.stdout, relayed.stderr);
        if dir.db_int(succeeded) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(dir.db_int(succeeded), 1, "the relay settled it");
    assert_eq!(payments(&dir).len(), 1, "one payment for the key, made {before} time(s) before");
    // The key now replays what the upstream did.
    let again = host(&gateway(&dir, &config), &json!([pay("ord-60", 100, "pay-ord-60")]), LIMIT);
    assert_eq!(code(&again[0]), "OK", "{}", again[0]);
    assert_eq!(again[0]["meta"]["io.toolledger/replayed"], true);
    audit_passes(&dir);
}

#[test]
fn out_of_domain_arguments_are_input_invalid_with_nothing_written_and_an_integral_float_is_its_integer()
 {
    let dir = Dir::new();
    let config = payments_config(&dir, "");
    let amount = |value: &str, key: &str| {
        call(
            "create_payment",
            json!({"order_id": "ord-1", "amount_minor": format!("@{value}"), "currency": "USD",
                "idempotency_key": key}),
        )
    };
    // Each value, as the host's JSON writes it, and the rule the facade's door names.
    let hostile = [
        ("9007199254740992", "integer_range"),
        ("9007199254740993", "integer_range"),
        ("-9007199254740992", "integer_range"),
        ("18446744073709551621", "integer_range"),
        ("1e300", "integer_range"),
        ("19.99", "fraction"),
        ("-1.5", "fraction"),
    ];
    let mut steps: Vec<Value> = hostile
        .iter()
        .enumerate()
        .map(|(at, (value, _))| amount(value, &format!("k-{at}")))
        .collect();
    let deep = (0..40).fold(json!(1), |inner, _| json!([inner]));
    steps.push(call(
        "create_payment",
        json!({"order_id": "ord-1", "amount_minor": deep, "currency": "USD", "idempotency_key": "k-deep"}),
    ));
    steps.push(call(
        "create_payment",
        json!({"order_id": "x".repeat(10 << 20), "amount_minor": 1, "currency": "USD",
            "idempotency_key": "k-big"}),
    ));
    // An integral float is its integer: one intent, whichever way the host writes it.
    steps.extend([amount("2599.0", "k-f"), amount("2599", "k-f"), amount("2.599e3", "k-f")]);
    let raw: Vec<(&str, &str)> = hostile
        .iter()
        .map(|(value, _)| (*value, *value))
        .chain([("2599.0", "2599.0"), ("2599", "2599"), ("2.599e3", "2.599e3")])
        .collect();
    let answers = host_raw(&[], &gateway(&dir, &config), &json!(steps), &raw, LIMIT);
    for (answer, (value, keyword)) in answers.iter().zip(&hostile) {
        assert_eq!(code(answer), "INPUT_INVALID", "{value}: {answer}");
        assert_eq!(
            answer["structuredContent"]["detail"],
            json!({"pointer": "/amount_minor", "keyword": keyword}),
            "{value}"
        );
    }
    let deep = &answers[hostile.len()];
    assert_eq!(code(deep), "INPUT_INVALID", "{deep}");
    assert_eq!(deep["structuredContent"]["detail"]["keyword"], "depth");
    let big = &answers[hostile.len() + 1];
    assert_eq!(code(big), "INPUT_INVALID");
    assert_eq!(big["structuredContent"]["detail"], json!({"pointer": "", "keyword": "size"}));
    let [fresh, replay, again] = &answers[hostile.len() + 2..] else { panic!("{answers:?}") };
    assert_eq!((code(fresh), code(replay), code(again)), ("OK".into(), "OK".into(), "OK".into()));
    assert_eq!(fresh["meta"]["io.toolledger/replayed"], false);
    assert_eq!(replay["meta"]["io.toolledger/replayed"], true, "{replay}");
    assert_eq!(again["meta"]["io.toolledger/replayed"], true, "{again}");
    // Nothing the door refused was written or sent: one operation, one payment.
    assert_eq!((operations(&dir), payments(&dir).len()), (1, 1));
    audit_passes(&dir);
}

#[test]
fn over_http_only_a_token_declared_for_an_approver_presents_that_approvers_approval() {
    let dir = Dir::new();
    let tokens = r#"
[[mcp.tokens]]
token_env = "GATEWAY_TOKEN_AGENT"
tenant = "acme"
subject = "agent-1"

[[mcp.tokens]]
token_env = "GATEWAY_TOKEN_CONSOLE"
tenant = "acme"
subject = "agent-1"
approver = "ops-lead"
"#;
    let approval = "approval = { approver = \"ops-lead\", max_validity_seconds = 300 }";
    let config = with_tokens(&dir, &payments_config(&dir, approval), tokens);
    let (agent, console) = ("agent-token-0123456789abcdef", "console-token-0123456789abcdef");
    let env = [("GATEWAY_TOKEN_AGENT", agent), ("GATEWAY_TOKEN_CONSOLE", console)];
    let (gateway, url) = listening(&dir, &config, &env);
    let now = unix_now();
    let approved = |order: &str, approver: &str| {
        let mut call = pay(order, 100, &format!("pay-{order}"));
        call["meta"] = json!({"io.toolledger/approval": {"approval_id": "appr-60",
            "approver_id": approver, "approved_at": now - 5, "expires_at": now + 60}});
        call
    };
    // The agent's own token cannot write itself an approval by the person's name.
    let forged = http_host(&url, Some(agent), &json!([approved("ord-60", "ops-lead")]));
    assert_eq!(code(&forged[0]), "APPROVAL_INVALID", "{}", forged[0]);
    // The console's token presents its approver's approval, and no one else's.
    let other = http_host(&url, Some(console), &json!([approved("ord-61", "someone-else")]));
    assert_eq!(code(&other[0]), "APPROVAL_INVALID", "{}", other[0]);
    let presented = http_host(&url, Some(console), &json!([approved("ord-62", "ops-lead")]));
    assert_eq!(code(&presented[0]), "OK", "{}", presented[0]);
    let made: Vec<String> = payments(&dir).into_iter().map(|(order, _)| order).collect();
    assert_eq!(made, ["ord-62"]);
    assert_eq!(operations(&dir), 1);
    stop_cleanly(&dir, gateway);
    audit_passes(&dir);
}
