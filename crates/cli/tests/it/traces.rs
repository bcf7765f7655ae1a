//! The command line's traces, exported over OTLP/HTTP (the standard `OTEL_*` variables)
//! to a receiver decoding with the official `opentelemetry-proto` messages: the
//! caller's `TRACEPARENT` continued; a lost answer and the status query another process
//! makes later, two traces linked; a relay taking over the lease a crashed dispatch
//! left, its pass linked to the caller's trace; and no exported byte holding the key,
//! a digest or ref, the principal, an argument or the result.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{
    Dir,
    mcp::{Receiver, of_trace},
};

const NOW: i64 = 1_767_225_600;

/// The receiver's spans once `ready` holds of them (bounded).
fn received(receiver: &Receiver, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let spans = receiver.spans();
        if ready(&spans) {
            return spans;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "spans received: {spans:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The call span (`execute_tool …`) of trace `trace_id`.
fn call_span<'a>(spans: &'a [Value], trace_id: &str) -> &'a Value {
    let calls: Vec<&Value> = of_trace(spans, trace_id)
        .into_iter()
        .filter(|span| span["name"].as_str().unwrap().starts_with("execute_tool"))
        .collect();
    assert_eq!(calls.len(), 1, "{spans:#?}");
    calls[0]
}

/// No byte the receiver got holds any of `secrets`.
fn holds_none(receiver: &Receiver, secrets: &[String]) {
    let raw = receiver.raw();
    assert!(!raw.is_empty());
    let text = String::from_utf8_lossy(&raw);
    for secret in secrets {
        assert!(!secret.is_empty());
        assert!(!text.contains(secret.as_str()), "{secret} is in an exported byte");
    }
}

/// What the case file and the ledger hold that no span may carry: the key, the
/// principal, the arguments, the approval's id, and every digest and ref of the
/// operation.
fn secrets(dir: &Dir) -> Vec<String> {
    let mut secrets: Vec<String> =
        ["refund-ord-1001-a", "tenant-a", "user-1", "ord-1001", "2599", "damaged", "appr-001"]
            .map(str::to_owned)
            .to_vec();
    for column in ["request_sha256", "status_ref", "downstream_request_ref"] {
        let rows = dir.db_rows(&format!("SELECT {column} FROM operations"));
        secrets.push(rows[0][0].clone().unwrap());
    }
    secrets
}

#[test]
fn a_lost_answer_and_the_status_query_another_process_makes_later_are_two_linked_traces() {
    let dir = Dir::new();
    let receiver = Receiver::start(&dir);
    let (first, second) = ("0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736");
    let parent = |trace: &str| format!("00-{trace}-b7ad6b7169203331-01");
    let exporting = |trace: &str| {
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.clone()),
            ("OTEL_SERVICE_NAME", "toolledger-under-test".to_owned()),
            ("TRACEPARENT", parent(trace)),
        ]
    };
    let env =
        |pairs: &[(&'static str, String); 3]| -> Vec<(&'static str, String)> { pairs.to_vec() };
    let run = |args: &[&str], pairs: Vec<(&'static str, String)>| {
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        dir.run_with(args, &pairs)
    };
    let unknown = run(
        &["--fixture", "case.json", "dispatch", "--failure", "after_downstream_commit"],
        env(&exporting(first)),
    );
    assert_eq!((unknown.code, unknown.text("/code")), (1, "OUTCOME_UNKNOWN".to_owned()));
    let status_ref = unknown.text("/status_ref");
    // Later, another process: the explicit status query, in a trace of its own.
    let reconciled = run(
        &["--fixture", "case.json", "status", "--status-ref", &status_ref],
        env(&exporting(second)),
    );
    assert_eq!(
        (reconciled.code, reconciled.text("/delivery")),
        (0, "receipt_reconciled".to_owned()),
        "{reconciled:?}"
    );
    let spans = received(&receiver, |spans| {
        of_trace(spans, first).len() >= 3 && !of_trace(spans, second).is_empty()
    });
    let asked = call_span(&spans, first);
    assert_eq!(asked["parent_span_id"], "b7ad6b7169203331", "TRACEPARENT is the parent");
    assert_eq!(asked["attributes"]["toolledger.decision"], "outcome_unknown");
    assert_eq!(asked["attributes"]["gen_ai.tool.call.id"], "call-001");
    assert_eq!(asked["service"], "toolledger-under-test");
    let settled = call_span(&spans, second);
    assert_eq!(settled["attributes"]["toolledger.purpose"], "query_status");
    assert_eq!(settled["attributes"]["toolledger.decision"], "reconciled");
    assert_eq!(
        settled["links"],
        serde_json::json!([{"trace_id": first, "span_id": asked["span_id"]}]),
        "the later trace leads back to the call that asked"
    );
    let steps: Vec<&str> = of_trace(&spans, second)
        .into_iter()
        .filter(|span| span["parent_span_id"] == settled["span_id"])
        .map(|span| span["name"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["lookup", "commit C"], "asked, not performed again");
    let mut secrets = secrets(&dir);
    let answer = reconciled.answer();
    secrets.push(answer["result"]["model_view"]["refund_id"].as_str().unwrap().to_owned());
    for digest in ["call_binding_sha256", "result_sha256"] {
        secrets.push(answer["result"]["digests"][digest].as_str().unwrap().to_owned());
    }
    holds_none(&receiver, &secrets);
}

#[test]
fn a_relay_taking_over_a_crashed_dispatchs_lease_links_its_pass_to_the_callers_trace() {
    let dir = Dir::new();
    let receiver = Receiver::start(&dir);
    let caller = "5c0d4b3a29187f6e5d4c3b2a19080706";
    let traceparent = format!("00-{caller}-b7ad6b7169203331-01");
    let endpoint = receiver.endpoint.clone();
    let exporting = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let crashed = dir.run_with(
        &["--fixture", "case.json", "dispatch", "--failure", "after_claim"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("TRACEPARENT", &traceparent)],
    );
    assert_eq!(crashed.text("/code"), "OUTCOME_UNKNOWN");
    // Past the lease the dispatch left: the relay takes it over.
    let later = (NOW + 30).to_string();
    let relayed =
        dir.run_with(&["--fixture", "case.json", "relay", "--once", "--now", &later], &exporting);
    assert_eq!(relayed.code, 0, "{relayed:?}");
    assert_eq!(relayed.answer()["relay"]["delivered"], Value::from(1), "{relayed:?}");
    let spans = received(&receiver, |spans| {
        spans.iter().any(|span| span["name"] == "relay pass") && of_trace(spans, caller).len() >= 2
    });
    let asked = call_span(&spans, caller);
    let pass = spans.iter().find(|span| span["name"] == "relay pass").unwrap();
    assert_eq!(pass["kind"], "SPAN_KIND_CONSUMER");
    assert_eq!(pass["parent_span_id"], "", "a trace of its own");
    assert_ne!(pass["trace_id"], caller);
    assert_eq!(pass["attributes"]["toolledger.claimed"], 1);
    assert_eq!(
        pass["links"],
        serde_json::json!([{"trace_id": caller, "span_id": asked["span_id"]}]),
        "the pass leads back to the call whose lease it took over"
    );
    let steps: Vec<&str> = spans
        .iter()
        .filter(|span| span["parent_span_id"] == pass["span_id"])
        .map(|span| span["name"].as_str().unwrap())
        .collect();
    assert_eq!(steps.first(), Some(&"claim"), "{steps:?}");
    assert_eq!(steps.last(), Some(&"commit C"), "{steps:?}");
    holds_none(&receiver, &secrets(&dir));
}

/// The metric data points the receiver decoded so far.
fn metrics(receiver: &Receiver) -> Vec<Value> {
    std::fs::read_to_string(receiver.endpoint_dir().join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The value of the Prometheus sample `name{labels}` in `text`.
fn prometheus(text: &str, sample: &str) -> i64 {
    text.lines()
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{sample} is not in {text}"))
        .parse()
        .unwrap()
}

/// Where the commands export metrics, the figures `toolledger metrics` prints for
/// Prometheus are exported as OpenTelemetry metrics with the same values (read by the
/// long-running commands at each collection), with two the process measures itself:
/// calls by decision, and each commit point's duration.
#[test]
fn the_prometheus_figures_calls_by_decision_and_commit_durations_are_exported_as_metrics() {
    let dir = Dir::new();
    let receiver = Receiver::start(&dir);
    let endpoint = receiver.endpoint.clone();
    // Metrics alone: the spans' exporter is off.
    let exporting =
        [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_TRACES_EXPORTER", "none")];
    let lost = dir.run_with(
        &["--fixture", "case.json", "dispatch", "--failure", "after_downstream_commit"],
        &exporting,
    );
    assert_eq!(lost.text("/code"), "OUTCOME_UNKNOWN");
    let points = metrics_when(&receiver, |points| {
        points.iter().any(|point| point["name"] == "toolledger.commit.duration")
    });
    let calls: Vec<&Value> =
        points.iter().filter(|point| point["name"] == "toolledger.calls").collect();
    assert_eq!(calls.len(), 1, "{points:#?}");
    assert_eq!(calls[0]["value"], 1);
    assert_eq!(calls[0]["attributes"]["toolledger.decision"], "outcome_unknown");
    assert_eq!(calls[0]["attributes"]["toolledger.purpose"], "dispatch");
    let commits: Vec<&Value> =
        points.iter().filter(|point| point["name"] == "toolledger.commit.duration").collect();
    assert_eq!(commits.len(), 1, "commit A alone: the answer was lost before C");
    assert_eq!(commits[0]["attributes"]["toolledger.commit"], "A");
    assert_eq!(
        (commits[0]["kind"].as_str(), commits[0]["count"].as_i64()),
        (Some("histogram"), Some(1))
    );
    assert_eq!(commits[0]["unit"], "s");
    assert!(
        !points.iter().any(|point| point["name"] == "toolledger.operations"),
        "a one-shot command registers no figures"
    );

    // Two more accepted and pending; a relay that finds nothing due yet (its clock
    // before theirs) exports the figures as it stops.
    crate::operators::accepted(&dir, 2);
    let before = (NOW - 1).to_string();
    let relayed =
        dir.run_with(&["--fixture", "case.json", "relay", "--once", "--now", &before], &exporting);
    assert_eq!(relayed.code, 0, "{relayed:?}");
    let prometheus_text = dir.run(&["metrics"]).stdout;
    let points = metrics_when(&receiver, |points| {
        points.iter().any(|point| point["name"] == "toolledger.operations")
    });
    let point = |name: &str, state: Option<&str>| -> i64 {
        let found: Vec<&Value> = points
            .iter()
            .filter(|point| point["name"] == name)
            .filter(|point| {
                state.is_none_or(|state| point["attributes"]["toolledger.state"] == state)
            })
            .collect();
        assert_eq!(found.len(), 1, "{name} {state:?}: {points:#?}");
        found[0]["value"].as_i64().unwrap()
    };
    for state in ["pending", "processing", "unknown", "succeeded", "failed", "quarantined", "dead"]
    {
        assert_eq!(
            point("toolledger.operations", Some(state)),
            prometheus(&prometheus_text, &format!("toolledger_operations{{state=\"{state}\"}}")),
            "{state}"
        );
    }
    assert_eq!(point("toolledger.operations", Some("pending")), 2);
    assert_eq!(point("toolledger.operations", Some("unknown")), 1);
    assert_eq!(
        point("toolledger.outbox.events", Some("processing_lease_ended")),
        prometheus(&prometheus_text, "toolledger_outbox_events{state=\"processing_lease_ended\"}")
    );
    for (otel, prom) in [
        ("toolledger.dead_letters", "toolledger_dead_letters"),
        ("toolledger.claims", "toolledger_claims_total"),
        ("toolledger.lease_reclaims", "toolledger_lease_reclaims_total"),
        ("toolledger.fenced_writes", "toolledger_fenced_writes_total"),
        ("toolledger.reconciliations", "toolledger_reconciliations_total"),
        ("toolledger.retired", "toolledger_retired_total"),
    ] {
        assert_eq!(point(otel, None), prometheus(&prometheus_text, prom), "{otel}");
    }
    // The outbox's lag, by the wall clock of each reading: seconds apart at most.
    for (otel, prom) in [
        ("toolledger.outbox.oldest_pending.age", "toolledger_oldest_pending_age_seconds"),
        ("toolledger.outbox.oldest_unknown.age", "toolledger_oldest_unknown_age_seconds"),
    ] {
        let (exported, printed) = (point(otel, None), prometheus(&prometheus_text, prom));
        assert!(printed > 0 && (printed - exported).abs() <= 5, "{otel}: {exported} vs {printed}");
    }
}

/// The receiver's metric points once `ready` holds of them (bounded).
fn metrics_when(receiver: &Receiver, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let points = metrics(receiver);
        if ready(&points) {
            return points;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "points received: {points:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With no exporter and no caller's trace, a call keeps no trace context (nothing more
/// is written); with a caller's `TRACEPARENT` and still no exporter, the API's no-op
/// span carries the caller's context, and that is what commit A keeps: a later attempt
/// links to the caller's own span.
#[test]
fn a_command_outside_any_trace_keeps_no_context_and_one_in_its_callers_keeps_that() {
    let dir = Dir::new();
    let plain = dir.run(&["--fixture", "case.json", "dispatch"]);
    assert_eq!(plain.code, 0, "{plain:?}");
    assert_eq!(dir.db_int("SELECT count(*) FROM trace_contexts"), 0);
    dir.write_case("other.json", |case| {
        case["host_context"]["idempotency_key"] = Value::from("refund-ord-1001-b");
        case["host_context"]["provider_call_id"] = Value::from("call-002");
    });
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let traced = dir.run_with(
        &["--fixture", "other.json", "dispatch"],
        &[("TRACEPARENT", parent), ("TRACESTATE", "vendor=v1")],
    );
    assert_eq!(traced.code, 0, "{traced:?}");
    let rows = dir.db_rows("SELECT traceparent, tracestate FROM trace_contexts");
    assert_eq!(rows, [[Some(parent.to_owned()), Some("vendor=v1".to_owned())]]);
}
