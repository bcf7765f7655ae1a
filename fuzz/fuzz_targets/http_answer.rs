//! The HTTP downstream's reading of an answer (`execute_answer`, `lookup_answer`) on an
//! arbitrary status and body.
//!
//! The first two bytes are the status, the third picks how the rest is used, and the
//! rest is the body text (lossily UTF-8, as the client reads it). For a lookup, the
//! body, when it is a JSON object, may be given this request's fingerprint so the
//! answer gets past the fingerprint check.
//!
//! Never a panic; every reason carries at most 400 characters of the service's text;
//! and for `execute_answer`: a 2xx is always a receipt bound to the request (its
//! downstream request ref, request digest, tool and output revision), 409 is not sent,
//! 422 a conflict, any other 4xx refused and anything else unknown. For
//! `lookup_answer`: 404 is always not found, a status other than 200 and 404 is always
//! unknown, and a receipt found is bound to the request.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use toolledger_contract::{Sha256Hex, digest::sha256_canonical};
use toolledger_downstream_http::{body, execute_answer, lookup_answer};
use toolledger_engine::{DownstreamError, DownstreamRequest, Lookup};
use toolledger_json::{Limits, parse_strict};
use toolledger_store::DownstreamReceipt;

/// "HTTP 65535: " and 400 characters of the service's text.
const REASON_CHARS_MAX: usize = "HTTP 65535: ".len() + 400;

static REQUEST: LazyLock<DownstreamRequest> = LazyLock::new(|| DownstreamRequest {
    downstream_request_ref: toolledger_contract::DownstreamRequestRef::new(&format!(
        "dr_{}",
        "0a".repeat(16)
    ))
    .expect("dr_ and 32 lowercase hex digits"),
    request_sha256: Sha256Hex::new(&"1f".repeat(32)).expect("64 lowercase hex digits"),
    tool_name: "refund_order".to_owned(),
    output_revision: "refund_order.output.v1".to_owned(),
    arguments: json!({"amount_cents": 1250, "order_id": "ord-1"}),
});

/// The request's fingerprint as the reference service computes it: the SHA-256 of the
/// body's bytes, which are canonical.
static FINGERPRINT: LazyLock<String> = LazyLock::new(|| {
    let value = parse_strict(body(&REQUEST).as_bytes(), &Limits::default())
        .expect("the request body is strict JSON");
    sha256_canonical(&value).as_str().to_owned()
});

fn assert_bound(receipt: &DownstreamReceipt) {
    let request = &*REQUEST;
    assert_eq!(receipt.downstream_request_ref, request.downstream_request_ref);
    assert_eq!(receipt.request_sha256, request.request_sha256);
    let object = receipt.receipt();
    assert_eq!(object["tool_name"], request.tool_name.as_str());
    assert_eq!(object["output_revision"], request.output_revision.as_str());
}

fn assert_bounded(reason: &str) {
    assert!(reason.chars().count() <= REASON_CHARS_MAX, "a reason of {} chars", reason.len());
}

fn assert_error_bounded(err: &DownstreamError) {
    match err {
        DownstreamError::NotSent { reason }
        | DownstreamError::Refused { reason }
        | DownstreamError::Unknown { reason } => assert_bounded(reason),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let [high, low, how, rest @ ..] = data else {
        return;
    };
    let status = u16::from_be_bytes([*high, *low]);
    let text = String::from_utf8_lossy(rest);
    let request = &*REQUEST;

    if how % 2 == 0 {
        let answer = execute_answer(request, status, &text);
        match (&answer, status) {
            (Ok(receipt), 200..=299) => assert_bound(receipt),
            (Ok(_), _) => panic!("HTTP {status} gave a receipt"),
            (Err(err), 200..=299) => panic!("HTTP {status} gave no receipt: {err:?}"),
            (Err(DownstreamError::NotSent { .. }), 409)
            | (Err(DownstreamError::Conflict), 422)
            | (Err(DownstreamError::Refused { .. }), 400..=499)
            | (Err(DownstreamError::Unknown { .. }), 0..=199 | 300..=399 | 500..) => {}
            (Err(err), _) => panic!("HTTP {status} mapped to {err:?}"),
        }
        if let Err(err) = &answer {
            assert_error_bounded(err);
        }
        return;
    }

    let text = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(mut members)) if how % 4 == 1 => {
            members.insert("fingerprint".to_owned(), Value::String(FINGERPRINT.clone()));
            Value::Object(members).to_string()
        }
        _ => text.into_owned(),
    };
    match (lookup_answer(request, status, &text), status) {
        (Ok(Lookup::NotFound), 404) => {}
        (answer, 404) => panic!("HTTP 404 read as {answer:?}"),
        (Ok(Lookup::Done(receipt)), 200) => assert_bound(&receipt),
        (Ok(Lookup::Refused { reason }), 200) => assert_bounded(&reason),
        (Ok(Lookup::NotFound), 200) => panic!("HTTP 200 read as not found"),
        (Err(err @ (DownstreamError::Conflict | DownstreamError::Unknown { .. })), 200) => {
            assert_error_bounded(&err);
        }
        (Err(err @ DownstreamError::Unknown { .. }), _) => assert_error_bounded(&err),
        (answer, _) => panic!("HTTP {status} read as {answer:?}"),
    }
});
