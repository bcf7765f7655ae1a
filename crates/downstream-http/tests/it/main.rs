//! The outcome table, row by row, against a scripted server on loopback: each test
//! serves one exchange exactly as a service might misbehave and checks the answer.

use std::{
    io::{Read, Write},
    net::TcpListener,
    sync::mpsc,
    time::Duration,
};

use serde_json::{Value, json};
use toolledger_contract::{DownstreamIdentity, Sha256Hex};
use toolledger_downstream::Now;
use toolledger_downstream::{Downstream, DownstreamError, DownstreamRequest, Lookup};
use toolledger_downstream_http::{Endpoint, HttpDownstream, Timeouts, body};

/// What the scripted server does with the one request it reads.
enum Script {
    /// Answer with these bytes.
    Answer(String),
    /// Close the connection without a byte.
    Hang,
    /// Say nothing for this long.
    Stall(Duration),
}

/// Serves one exchange; the request's text comes back on the channel.
fn serve_once(script: Script) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (sent, received) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut buffer = [0_u8; 4096];
        // Headers, then as many body bytes as Content-Length says.
        loop {
            let read = stream.read(&mut buffer).unwrap_or(0);
            request.extend_from_slice(&buffer[..read]);
            let text = String::from_utf8_lossy(&request).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text
                    .lines()
                    .find_map(|line| {
                        line.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if request.len() >= end + 4 + length {
                    break;
                }
            }
            if read == 0 {
                break;
            }
        }
        let _ = sent.send(String::from_utf8_lossy(&request).to_string());
        match script {
            Script::Answer(bytes) => {
                let _ = stream.write_all(bytes.as_bytes());
            }
            Script::Hang => {}
            Script::Stall(time) => std::thread::sleep(time),
        }
    });
    (base, received)
}

fn answer(status: &str, body: &Value) -> Script {
    let text = body.to_string();
    Script::Answer(format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    ))
}

fn request() -> DownstreamRequest {
    DownstreamRequest {
        downstream_request_ref: toolledger_contract::DownstreamRequestRef::new(&format!(
            "dr_{}",
            "a".repeat(32)
        ))
        .unwrap(),
        request_sha256: Sha256Hex::new(&"1".repeat(64)).unwrap(),
        tool_name: "refund_order".to_owned(),
        output_revision: "refund_order.output.v1".to_owned(),
        arguments: json!({"order_id": "ord-1", "amount_minor": 2599, "currency": "USD", "reason": "damaged"}),
    }
}

fn downstream(base: &str) -> HttpDownstream {
    HttpDownstream::new(
        DownstreamIdentity::new("refunds-http", "1").unwrap(),
        Timeouts { connect: Duration::from_millis(500), total: Duration::from_millis(700) },
    )
    .endpoint("refund_order", Endpoint::refunds(base))
}

fn execute(
    script: Script,
) -> (Result<toolledger_downstream::DownstreamReceipt, DownstreamError>, String) {
    let (base, sent) = serve_once(script);
    let result = downstream(&base).execute(&request(), Now::new(1_767_225_600).unwrap());
    (result, sent.recv_timeout(Duration::from_secs(5)).unwrap_or_default())
}

fn not_sent(result: &Result<toolledger_downstream::DownstreamReceipt, DownstreamError>) -> bool {
    matches!(result, Err(DownstreamError::NotSent { .. }))
}

fn unknown(result: &Result<toolledger_downstream::DownstreamReceipt, DownstreamError>) -> bool {
    matches!(result, Err(DownstreamError::Unknown { .. }))
}

#[test]
fn a_2xx_is_the_receipt_and_the_request_carries_the_key_and_the_canonical_body() {
    let output = json!({"refund_id": format!("rf_{}", "b".repeat(32)), "order_id": "ord-1",
        "amount_minor": 2599, "currency": "USD", "status": "refunded"});
    let (result, sent) = execute(answer("201 Created", &json!({"output": output})));
    let receipt = result.unwrap();
    assert_eq!(receipt.receipt()["output"], output);
    assert_eq!(receipt.downstream_request_ref, request().downstream_request_ref);
    assert!(sent.starts_with("POST /refunds HTTP/1.1\r\n"), "{sent}");
    let lower = sent.to_ascii_lowercase();
    assert!(lower.contains(&format!("idempotency-key: \"dr_{}\"\r\n", "a".repeat(32))), "{sent}");
    assert!(lower.contains("connection: close\r\n"));
    assert!(sent.ends_with(&body(&request())), "{sent}");
}

#[test]
fn no_connection_is_not_sent() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let result = downstream(&format!("http://127.0.0.1:{port}"))
        .execute(&request(), Now::new(1_767_225_600).unwrap());
    assert!(not_sent(&result), "{result:?}");
    // The reason names the failure's kind, never an address or OS text.
    let Err(DownstreamError::NotSent { reason }) = result else { unreachable!() };
    assert!(!reason.contains("127.0.0.1") && !reason.contains("os error"), "{reason}");
}

#[test]
fn an_https_url_is_not_sent_without_tls() {
    // No TLS stack is compiled in: the handshake never starts, nothing is sent.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let result = downstream(&base).execute(&request(), Now::new(1_767_225_600).unwrap());
    assert!(not_sent(&result), "{result:?}");
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "a connection was made");
    let looked_up = downstream(&base).lookup(&request());
    assert!(matches!(looked_up, Err(DownstreamError::NotSent { .. })), "{looked_up:?}");
}

#[test]
fn a_tool_without_an_endpoint_is_not_sent() {
    let mut other = request();
    other.tool_name = "open_ticket".to_owned();
    let result = downstream("http://127.0.0.1:9").execute(&other, Now::new(1_767_225_600).unwrap());
    assert!(not_sent(&result), "{result:?}");
}

#[test]
fn a_connection_closed_after_sending_is_unknown() {
    let (result, sent) = execute(Script::Hang);
    assert!(
        sent.contains("Idempotency-Key") || sent.to_ascii_lowercase().contains("idempotency-key")
    );
    assert!(unknown(&result), "{result:?}");
}

#[test]
fn a_timeout_after_sending_is_unknown() {
    let (result, _) = execute(Script::Stall(Duration::from_millis(1500)));
    assert!(unknown(&result), "{result:?}");
}

#[test]
fn a_5xx_is_unknown() {
    let (result, _) = execute(answer("503 Service Unavailable", &json!({"error": "unavailable"})));
    assert!(unknown(&result), "{result:?}");
}

#[test]
fn a_409_is_not_sent_and_retried_later() {
    let (result, _) = execute(answer("409 Conflict", &json!({"error": "in_flight"})));
    assert!(not_sent(&result), "{result:?}");
}

#[test]
fn a_422_is_a_conflict_never_a_retry() {
    let (result, _) =
        execute(answer("422 Unprocessable Content", &json!({"error": "fingerprint_mismatch"})));
    assert_eq!(result.unwrap_err(), DownstreamError::Conflict);
}

#[test]
fn another_4xx_is_refused_with_the_services_reason() {
    let (result, _) = execute(answer(
        "402 Payment Required",
        &json!({"reason": "order ord-1 cannot be refunded"}),
    ));
    assert_eq!(
        result.unwrap_err(),
        DownstreamError::Refused { reason: "HTTP 402: order ord-1 cannot be refunded".to_owned() }
    );
}

#[test]
fn a_2xx_that_is_not_the_contract_is_kept_for_quarantine() {
    let (result, _) = execute(Script::Answer(
        "HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot json!".to_owned(),
    ));
    let receipt = result.unwrap();
    assert_eq!(receipt.receipt()["output"], json!({"unreadable_answer": "not json!"}));
}

#[test]
fn a_2xx_whose_body_breaks_off_is_unknown() {
    let (result, _) = execute(Script::Answer(
        "HTTP/1.1 200 OK\r\nContent-Length: 500\r\nConnection: close\r\n\r\n{\"output\":"
            .to_owned(),
    ));
    assert!(unknown(&result), "{result:?}");
}

fn lookup(script: Script) -> Result<Lookup, DownstreamError> {
    let (base, sent) = serve_once(script);
    let result = downstream(&base).lookup(&request());
    let sent = sent.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    assert!(sent.starts_with(&format!("GET /refunds/by-key/dr_{} ", "a".repeat(32))), "{sent}");
    result
}

fn fingerprint() -> String {
    use sha2::Digest;
    sha2::Sha256::digest(body(&request()).as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_lookup_reads_what_the_service_holds() {
    assert_eq!(
        lookup(answer("404 Not Found", &json!({"error": "not_found"}))).unwrap(),
        Lookup::NotFound
    );
    let output = json!({"refund_id": format!("rf_{}", "c".repeat(32)), "order_id": "ord-1",
        "amount_minor": 2599, "currency": "USD", "status": "refunded"});
    let done = lookup(answer(
        "200 OK",
        &json!({"state": "done", "fingerprint": fingerprint(), "status": 201, "response": {"output": output}}),
    ));
    let Ok(Lookup::Done(receipt)) = done else { panic!("{done:?}") };
    assert_eq!(receipt.receipt()["output"], output);
    let refused = lookup(answer(
        "200 OK",
        &json!({"state": "refused", "fingerprint": fingerprint(), "status": 402,
            "response": {"reason": "order ord-1 cannot be refunded"}}),
    ));
    assert_eq!(
        refused.unwrap(),
        Lookup::Refused { reason: "HTTP 402: order ord-1 cannot be refunded".to_owned() }
    );
    let running =
        lookup(answer("200 OK", &json!({"state": "running", "fingerprint": fingerprint()})));
    assert!(matches!(running, Err(DownstreamError::Unknown { .. })), "{running:?}");
    // Another request under the key: a conflict, whatever its state.
    let forged = lookup(answer(
        "200 OK",
        &json!({"state": "done", "fingerprint": "0".repeat(64), "response": {}}),
    ));
    assert_eq!(forged.unwrap_err(), DownstreamError::Conflict);
    let broken = lookup(answer("500 Internal Server Error", &json!({})));
    assert!(matches!(broken, Err(DownstreamError::Unknown { .. })), "{broken:?}");
}

/// A 200 that is not a lookup's answer — a proxy's HTML error page, an empty body, `{}`,
/// garbage, a fingerprint that is not a digest — says nothing about the key: unknown,
/// to be asked again (before: a conflict, and the operation quarantined for good).
#[test]
fn a_200_that_is_not_an_answer_is_unknown_never_a_conflict() {
    use toolledger_downstream_http::lookup_answer;
    let html = "<html><body><h1>502 Bad Gateway</h1></body></html>";
    let page = Script::Answer(format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
        html.len()
    ));
    let proxied = lookup(page);
    assert!(matches!(proxied, Err(DownstreamError::Unknown { .. })), "{proxied:?}");
    let request = request();
    for body in [
        "",
        "{}",
        "null",
        "[1,2]",
        "\u{1}garbage",
        r#"{"state":"done"}"#,
        r#"{"fingerprint":7,"state":"done"}"#,
        r#"{"fingerprint":"other","state":"done"}"#,
        r#"{"fingerprint":"ABCDEF","state":"done"}"#,
    ] {
        let answered = lookup_answer(&request, 200, body);
        assert!(matches!(answered, Err(DownstreamError::Unknown { .. })), "{body}: {answered:?}");
    }
}

/// The answer mapping without a server: what the transport hands `execute_answer` and
/// `lookup_answer` is a status and a body text, and the table holds for any of them.
#[test]
fn answers_are_read_from_status_and_body_alone_with_bounded_reasons() {
    use toolledger_downstream_http::{execute_answer, lookup_answer};

    let request = request();
    let long = "x".repeat(5000);
    let said = format!(r#"{{"reason":"{long}"}}"#);
    let bounded = format!("HTTP 400: {}", "x".repeat(400));
    assert_eq!(
        execute_answer(&request, 400, &said),
        Err(DownstreamError::Refused { reason: bounded })
    );
    assert_eq!(
        execute_answer(&request, 599, "not json"),
        Err(DownstreamError::Unknown { reason: "HTTP 599: no reason given".to_owned() })
    );
    // A 2xx is a receipt whatever its body says: here the body is not JSON at all.
    let receipt = execute_answer(&request, 204, "").unwrap();
    assert_eq!(receipt.receipt()["output"], json!({"unreadable_answer": ""}));
    assert_eq!(receipt.downstream_request_ref, request.downstream_request_ref);

    assert_eq!(lookup_answer(&request, 404, "anything"), Ok(Lookup::NotFound));
    let other = format!(r#"{{"fingerprint":"{}","state":"done"}}"#, "0".repeat(64));
    assert_eq!(lookup_answer(&request, 200, &other), Err(DownstreamError::Conflict));
    assert_eq!(
        lookup_answer(&request, 502, &said),
        Err(DownstreamError::Unknown { reason: format!("HTTP 502: {}", "x".repeat(400)) })
    );
}

#[test]
fn a_dot_segment_in_a_preconditions_path_is_refused_and_never_asked() {
    use toolledger_downstream_http::{Filled, HttpPrecondition};
    let ask = HttpPrecondition::new(
        "http://127.0.0.1:9/inv/{invoice}/ok?as={who}",
        Vec::new(),
        Timeouts::default(),
    );
    for segment in ["", ".", ".."] {
        let arguments = json!({"invoice": segment, "who": "ops"});
        assert_eq!(ask.url_of(&arguments), Filled::DotSegment, "{segment:?}");
        let (tenant, subject) = (
            toolledger_contract::Identifier::new("t").unwrap(),
            toolledger_contract::Identifier::new("s").unwrap(),
        );
        let rules = toolledger_contract::RuleCall {
            tenant_id: &tenant,
            subject_id: &subject,
            roles: &[],
            arguments: &arguments,
            context: &Value::Null,
        };
        assert!(matches!(
            toolledger_contract::Precondition::ask(&ask, &rules),
            toolledger_contract::Verdict::Refuse { .. }
        ));
    }
    // Dots inside a segment, and any argument in the query, are data.
    assert_eq!(
        ask.url_of(&json!({"invoice": "...", "who": ".."})),
        Filled::Url("http://127.0.0.1:9/inv/.../ok?as=..".to_owned())
    );
    assert_eq!(ask.url_of(&json!({"who": "x"})), Filled::Missing);
}
