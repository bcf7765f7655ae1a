//! A [`Downstream`] over HTTP, for services that implement the IETF Idempotency-Key
//! header (draft-ietf-httpapi-idempotency-key-header).
//!
//! Each request goes to its tool's [`Endpoint`] as `POST` with
//! `Idempotency-Key: "<downstream_request_ref>"` (a structured-field string) and a
//! canonical JSON body: the arguments, the request digest (the fingerprint toolledger
//! binds the receipt to), the tool and the output revision. The service's fingerprint
//! is its own (the reference service hashes the body's bytes); the body is canonical,
//! so the same intent always sends the same bytes.
//!
//! What comes back is mapped to the engine's three honest answers (the table is in
//! `docs/http.md`):
//!
//! | what happened | answer |
//! | --- | --- |
//! | no connection (refused, DNS, connect timeout), an `https://` URL (no TLS is compiled in), or a bad URL: nothing was sent | not sent |
//! | 409: the same key is still in flight | not sent, retried later |
//! | 2xx | the receipt (quarantined by the engine if it breaks the output contract) |
//! | 422: the service holds another request under this key | conflict, never retried under a new key |
//! | other 4xx | refused definitively, with the service's reason |
//! | 5xx, a timeout or a reset after connecting, an unreadable answer | unknown |
//!
//! The status lookup is `GET <lookup_url>` with `{key}` replaced by the key (or the key
//! appended): 200 with the stored answer, 404 when the service never committed the key.
//!
//! A tool's business precondition may be asked of the service too ([`HttpPrecondition`]):
//! `GET` a URL templated over the arguments, answered `{"allow": true}` or
//! `{"allow": false, "reason": …}`.
//!
//! Reading an answer is kept apart from fetching it: [`execute_answer`] and
//! [`lookup_answer`] take a status and a body text and do no I/O, so the mapping above
//! is one pure function pair that the transport calls and a fuzz target can drive.
//!
//! The client is `ureq` with its default features off: plain HTTP, no TLS stack. A
//! host that needs TLS terminates it in a local proxy or implements [`Downstream`] over
//! its own client.

use std::{collections::BTreeMap, io::ErrorKind, time::Duration};

use serde_json::{Value, json};
use toolledger_contract::{DownstreamIdentity, Sha256Hex, digest::sha256_canonical};
use toolledger_downstream::{Downstream, DownstreamError, DownstreamRequest, Lookup};
use toolledger_downstream::{DownstreamReceipt, Now};
use toolledger_json::canonicalize;

/// The largest answer read from a service.
const ANSWER_LIMIT: u64 = 1024 * 1024;

/// Where one tool's requests go.
///
/// ```
/// let endpoint = toolledger_downstream_http::Endpoint::refunds("http://127.0.0.1:8080");
/// assert_eq!(endpoint.execute_url, "http://127.0.0.1:8080/refunds");
/// assert_eq!(endpoint.lookup_url, "http://127.0.0.1:8080/refunds/by-key/");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Where a request is `POST`ed.
    pub execute_url: String,
    /// The status lookup, `GET`: `{key}` is replaced by the key, or, without it, the key
    /// is appended.
    pub lookup_url: String,
    /// Headers sent with every request (an API key, a tenant header).
    pub headers: Vec<(String, String)>,
    /// Who performs this tool's effects, when not the downstream's own identity.
    pub identity: Option<DownstreamIdentity>,
    /// This tool's timeouts, when not the downstream's.
    pub timeouts: Option<Timeouts>,
}

impl Endpoint {
    /// The lookup URL of `key`.
    ///
    /// ```
    /// let mut endpoint = toolledger_downstream_http::Endpoint::refunds("http://127.0.0.1:8080");
    /// assert_eq!(endpoint.lookup_url_of("dr_1"), "http://127.0.0.1:8080/refunds/by-key/dr_1");
    /// endpoint.lookup_url = "http://127.0.0.1:8080/keys/{key}/status".to_owned();
    /// assert_eq!(endpoint.lookup_url_of("dr_1"), "http://127.0.0.1:8080/keys/dr_1/status");
    /// ```
    pub fn lookup_url_of(&self, key: &str) -> String {
        if self.lookup_url.contains("{key}") {
            self.lookup_url.replace("{key}", key)
        } else {
            format!("{}{key}", self.lookup_url)
        }
    }
}

impl Endpoint {
    /// The reference service's refund endpoints under `base_url`
    /// (`POST /refunds`, `GET /refunds/by-key/<key>`).
    pub fn refunds(base_url: &str) -> Endpoint {
        let base = base_url.trim_end_matches('/');
        Endpoint {
            execute_url: format!("{base}/refunds"),
            lookup_url: format!("{base}/refunds/by-key/"),
            headers: Vec::new(),
            identity: None,
            timeouts: None,
        }
    }
}

/// How long a request may take.
///
/// ```
/// let timeouts = toolledger_downstream_http::Timeouts::default();
/// assert!(timeouts.connect < timeouts.total);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To connect (past it: not sent).
    pub connect: Duration,
    /// For the whole exchange (past it, once connected: unknown).
    pub total: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts { connect: Duration::from_secs(2), total: Duration::from_secs(10) }
    }
}

/// A [`Downstream`] over HTTP, with an [`Endpoint`] per tool.
///
/// ```
/// use toolledger_contract::DownstreamIdentity;
/// use toolledger_downstream_http::{Endpoint, HttpDownstream, Timeouts};
///
/// let identity = DownstreamIdentity::new("refunds-http", "1").unwrap();
/// let downstream = HttpDownstream::new(identity, Timeouts::default())
///     .endpoint("refund_order", Endpoint::refunds("http://127.0.0.1:8080"));
/// # let _ = downstream;
/// ```
#[derive(Debug)]
pub struct HttpDownstream {
    identity: DownstreamIdentity,
    agent: ureq::Agent,
    endpoints: BTreeMap<String, (Endpoint, ureq::Agent)>,
}

impl HttpDownstream {
    /// A downstream with no endpoints yet. Connections are not reused: a pooled
    /// connection the service has closed would turn a request that was never sent into
    /// an unknown outcome.
    pub fn new(identity: DownstreamIdentity, timeouts: Timeouts) -> HttpDownstream {
        HttpDownstream { identity, agent: agent(timeouts), endpoints: BTreeMap::new() }
    }

    /// Sends `tool`'s requests to `endpoint`.
    ///
    /// ```
    /// # use toolledger_downstream_http::{Endpoint, HttpDownstream, Timeouts};
    /// # let identity = toolledger_contract::DownstreamIdentity::new("refunds-http", "1").unwrap();
    /// let downstream = HttpDownstream::new(identity, Timeouts::default())
    ///     .endpoint("refund_order", Endpoint::refunds("http://127.0.0.1:8080"));
    /// # let _ = downstream;
    /// ```
    #[must_use]
    pub fn endpoint(mut self, tool: &str, endpoint: Endpoint) -> HttpDownstream {
        let agent = endpoint.timeouts.map_or_else(|| self.agent.clone(), agent);
        self.endpoints.insert(tool.to_owned(), (endpoint, agent));
        self
    }

    /// The tool's endpoint, when it has one this client can reach: plain `http://` only
    /// (no TLS is compiled in; an `https://` URL is refused here, before any connection,
    /// rather than left to the client library).
    fn endpoint_of(
        &self,
        request: &DownstreamRequest,
    ) -> Result<&(Endpoint, ureq::Agent), DownstreamError> {
        let routed =
            self.endpoints.get(&request.tool_name).ok_or_else(|| DownstreamError::NotSent {
                reason: format!("no HTTP endpoint is configured for {}", request.tool_name),
            })?;
        let endpoint = &routed.0;
        if ![&endpoint.execute_url, &endpoint.lookup_url]
            .iter()
            .all(|url| url.starts_with("http://"))
        {
            return Err(DownstreamError::NotSent {
                reason: "only http:// URLs are supported (no TLS is compiled in)".to_owned(),
            });
        }
        Ok(routed)
    }
}

/// A client of these timeouts: no pooled connections (a pooled connection the service
/// has closed would turn a request that was never sent into an unknown outcome), no
/// redirects, statuses as answers.
fn agent(timeouts: Timeouts) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(timeouts.connect))
        .timeout_global(Some(timeouts.total))
        .max_idle_connections(0)
        .max_redirects(0)
        .build()
        .into()
}

/// The canonical body of `request`: the same intent always sends the same bytes.
///
/// ```
/// # use serde_json::json;
/// # let request = toolledger_downstream::DownstreamRequest {
/// #     downstream_request_ref: toolledger_contract::DownstreamRequestRef::new(&format!("dr_{}", "0".repeat(32))).unwrap(),
/// #     request_sha256: toolledger_contract::Sha256Hex::new(&"1".repeat(64)).unwrap(),
/// #     tool_name: "refund_order".to_owned(),
/// #     output_revision: "refund_order.output.v1".to_owned(),
/// #     arguments: json!({"order_id": "ord-1"}),
/// # };
/// let body = toolledger_downstream_http::body(&request);
/// assert!(body.starts_with("{\"arguments\":{\"order_id\":\"ord-1\"}"));
/// ```
pub fn body(request: &DownstreamRequest) -> String {
    canonicalize(&body_value(request))
}

/// The body as a value: [`body`] is its canonical form.
fn body_value(request: &DownstreamRequest) -> Value {
    json!({
        "arguments": request.arguments,
        "output_revision": request.output_revision,
        "request_sha256": request.request_sha256.as_str(),
        "tool_name": request.tool_name,
    })
}

/// The SHA-256 of the body's bytes: the reference service's fingerprint of it. The body
/// is canonical, so this is the contract's `H` of the body's value.
fn fingerprint(request: &DownstreamRequest) -> Sha256Hex {
    sha256_canonical(&body_value(request))
}

/// `call` with `Connection: close`, the trace context ([`traced`]) and the service's own
/// `headers` (an endpoint's, a precondition's).
fn headers<B>(
    call: ureq::RequestBuilder<B>,
    headers: &[(String, String)],
) -> ureq::RequestBuilder<B> {
    headers.iter().fold(traced(call.header("Connection", "close")), |call, (name, value)| {
        call.header(name, value)
    })
}

/// `call` with the W3C trace context of the span current on this thread (`traceparent`,
/// and `tracestate` when it holds any): with the `otel` feature, the service's span of
/// the request is then a child of the ledger's (`docs/observability.md`). Nothing
/// without the feature, or outside a trace.
fn traced<B>(call: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt;
        let context = opentelemetry::Context::current();
        let span = context.span();
        let span = span.span_context();
        if !span.is_valid() {
            return call;
        }
        let parent =
            format!("00-{}-{}-{:02x}", span.trace_id(), span.span_id(), span.trace_flags().to_u8());
        let state = span.trace_state().header();
        let call = call.header("traceparent", parent);
        if state.is_empty() { call } else { call.header("tracestate", state) }
    }
    #[cfg(not(feature = "otel"))]
    {
        call
    }
}

/// A transport failure: not sent only when no connection was made.
fn transport(err: &ureq::Error) -> DownstreamError {
    let not_sent = match err {
        ureq::Error::ConnectionFailed
        | ureq::Error::HostNotFound
        | ureq::Error::BadUri(_)
        | ureq::Error::Http(_)
        | ureq::Error::Timeout(ureq::Timeout::Resolve | ureq::Timeout::Connect) => true,
        ureq::Error::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionRefused | ErrorKind::AddrNotAvailable | ErrorKind::NotFound
        ),
        _ => false,
    };
    if not_sent {
        DownstreamError::NotSent { reason: format!("no connection: {}", short(err)) }
    } else {
        DownstreamError::Unknown { reason: format!("the exchange broke off: {}", short(err)) }
    }
}

/// A failure's kind, without addresses or OS text.
fn short(err: &ureq::Error) -> &'static str {
    match err {
        ureq::Error::ConnectionFailed => "connection failed",
        ureq::Error::HostNotFound => "host not found",
        ureq::Error::BadUri(_) | ureq::Error::Http(_) => "bad URL or header",
        ureq::Error::Timeout(_) => "timed out",
        ureq::Error::Io(io) if io.kind() == ErrorKind::ConnectionRefused => "connection refused",
        ureq::Error::Io(_) => "I/O error",
        ureq::Error::Protocol(_) => "not HTTP",
        _ => "transport error",
    }
}

/// Reads an answer's status and body text, at most [`ANSWER_LIMIT`] bytes of it.
fn read(mut response: ureq::http::Response<ureq::Body>) -> Result<(u16, String), ureq::Error> {
    let status = response.status().as_u16();
    let text = response.body_mut().with_config().limit(ANSWER_LIMIT).read_to_string()?;
    Ok((status, text))
}

/// An answer's body as JSON: `Null` when it is not JSON.
fn json_body(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// Whether `text` is a fingerprint as the lookup answers one: 64 lower-case hex digits.
fn is_digest(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

/// The service's reason in an answer, bounded.
fn reason(status: u16, body: &Value) -> String {
    let said =
        body["reason"].as_str().or_else(|| body["error"].as_str()).unwrap_or("no reason given");
    let said: String = said.chars().take(400).collect();
    format!("HTTP {status}: {said}")
}

/// The receipt of a 2xx answer: its `output`, or, when the answer has none, what it
/// said instead (which breaks the output contract, so the engine quarantines it and
/// keeps it).
fn receipt(request: &DownstreamRequest, body: &Value, text: &str) -> DownstreamReceipt {
    match body.get("output") {
        Some(output) => request.receipt(output.clone()),
        None => request
            .receipt(json!({"unreadable_answer": text.chars().take(2000).collect::<String>()})),
    }
}

/// What an answer to [`Downstream::execute`]'s `POST` means, from its status and body
/// text alone (the table in this crate's doc):
///
/// - 2xx: always a receipt, of the body's `output` member, or, when the body has none
///   (or is not JSON), of what the body said instead (at most 2,000 characters), which
///   the engine quarantines and keeps;
/// - 409: not sent (the same key is still in flight); 422: conflict;
/// - other 4xx: refused, with the service's `reason` (or `error`) member, at most 400
///   characters of it;
/// - anything else: unknown, with the same bounded reason.
///
/// No transport is involved, so hosts and tests can check an answer without a server.
///
/// ```
/// # use serde_json::json;
/// # use toolledger_downstream::DownstreamError;
/// # let request = toolledger_downstream::DownstreamRequest {
/// #     downstream_request_ref: toolledger_contract::DownstreamRequestRef::new(&format!("dr_{}", "0".repeat(32))).unwrap(),
/// #     request_sha256: toolledger_contract::Sha256Hex::new(&"1".repeat(64)).unwrap(),
/// #     tool_name: "refund_order".to_owned(),
/// #     output_revision: "refund_order.output.v1".to_owned(),
/// #     arguments: json!({"order_id": "ord-1"}),
/// # };
/// use toolledger_downstream_http::execute_answer;
///
/// let receipt = execute_answer(&request, 201, r#"{"output":{"refund_id":"rf_1"}}"#)?;
/// assert_eq!(receipt.receipt()["output"], json!({"refund_id": "rf_1"}));
/// assert_eq!(
///     execute_answer(&request, 400, r#"{"reason":"order is closed"}"#),
///     Err(DownstreamError::Refused { reason: "HTTP 400: order is closed".to_owned() }),
/// );
/// # Ok::<(), DownstreamError>(())
/// ```
///
/// # Errors
///
/// The [`DownstreamError`] the status maps to, as above.
pub fn execute_answer(
    request: &DownstreamRequest,
    status: u16,
    body: &str,
) -> Result<DownstreamReceipt, DownstreamError> {
    let value = json_body(body);
    match status {
        200..=299 => Ok(receipt(request, &value, body)),
        409 => Err(DownstreamError::NotSent {
            reason: "HTTP 409: the same key is still in flight".to_owned(),
        }),
        422 => Err(DownstreamError::Conflict),
        400..=499 => Err(DownstreamError::Refused { reason: reason(status, &value) }),
        _ => Err(DownstreamError::Unknown { reason: reason(status, &value) }),
    }
}

/// What an answer to [`Downstream::lookup`]'s `GET` means, from its status and body
/// text alone:
///
/// - 404: the service never committed the key;
/// - 200 that is not an answer (not JSON, or no `fingerprint` of 64 hex digits: a
///   proxy's error page, an empty body, `{}`): unknown, asked again later;
/// - 200 whose `fingerprint` is another request's body digest: conflict;
/// - 200 with `state` `"done"`: a receipt of `response.output` (or of what `response`
///   said instead); `"refused"`: refused with `response`'s bounded reason and the
///   answered `status`; any other state: unknown (still in progress);
/// - anything else: unknown, with the service's bounded reason.
///
/// # Errors
///
/// [`DownstreamError::Conflict`] or [`DownstreamError::Unknown`], as above.
pub fn lookup_answer(
    request: &DownstreamRequest,
    status: u16,
    body: &str,
) -> Result<Lookup, DownstreamError> {
    let value = json_body(body);
    match status {
        404 => Ok(Lookup::NotFound),
        200 => {
            // Only a well-formed answer that names another request is a conflict: a
            // proxy's error page, an empty body, `{}` or garbage says nothing about the
            // key, so the outcome stays unknown and is asked again later.
            let Some(named) = value["fingerprint"].as_str().filter(|named| is_digest(named)) else {
                return Err(DownstreamError::Unknown {
                    reason: "HTTP 200: the status lookup's answer is not one (no fingerprint)"
                        .to_owned(),
                });
            };
            if named != fingerprint(request).as_str() {
                return Err(DownstreamError::Conflict);
            }
            let answer = &value["response"];
            let answered = value["status"].as_u64().unwrap_or(0);
            match value["state"].as_str() {
                Some("done") => Ok(Lookup::Done(receipt(request, answer, &answer.to_string()))),
                Some("refused") => Ok(Lookup::Refused {
                    reason: reason(u16::try_from(answered).unwrap_or(0), answer),
                }),
                _ => Err(DownstreamError::Unknown {
                    reason: "the service is still working on the request".to_owned(),
                }),
            }
        }
        _ => Err(DownstreamError::Unknown { reason: reason(status, &value) }),
    }
}

impl Downstream for HttpDownstream {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn identity_for(&self, tool: &str) -> &DownstreamIdentity {
        self.endpoints
            .get(tool)
            .and_then(|(endpoint, _)| endpoint.identity.as_ref())
            .unwrap_or(&self.identity)
    }

    fn identities(&self) -> Vec<DownstreamIdentity> {
        let mut identities: Vec<DownstreamIdentity> = Vec::new();
        let own = self.endpoints.is_empty()
            || self.endpoints.values().any(|(endpoint, _)| endpoint.identity.is_none());
        let named = self.endpoints.values().filter_map(|(endpoint, _)| endpoint.identity.clone());
        for identity in own.then(|| self.identity.clone()).into_iter().chain(named) {
            if !identities.contains(&identity) {
                identities.push(identity);
            }
        }
        identities
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let (endpoint, agent) = self.endpoint_of(request)?;
        let call = agent
            .post(&endpoint.execute_url)
            .header("Idempotency-Key", format!("\"{}\"", request.downstream_request_ref))
            .header("Content-Type", "application/json");
        let response =
            headers(call, &endpoint.headers).send(body(request)).map_err(|err| transport(&err))?;
        let (status, text) = read(response).map_err(|err| match transport(&err) {
            // An answer whose body breaks off was sent and maybe committed.
            DownstreamError::NotSent { reason } => DownstreamError::Unknown { reason },
            other => other,
        })?;
        execute_answer(request, status, &text)
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        let (endpoint, agent) = self.endpoint_of(request)?;
        let call = agent.get(endpoint.lookup_url_of(request.downstream_request_ref.as_str()));
        let unknown = |err: &ureq::Error| DownstreamError::Unknown {
            reason: format!("the status lookup failed: {}", short(err)),
        };
        let response = headers(call, &endpoint.headers).call().map_err(|err| unknown(&err))?;
        let (status, text) = read(response).map_err(|err| unknown(&err))?;
        lookup_answer(request, status, &text)
    }
}

/// A tool's business precondition asked of its service over HTTP: `GET` the URL
/// template with each `{name}` replaced by the argument of that name (a string,
/// percent-encoded, or an integer), answered 200 `{"allow": true}` or
/// `{"allow": false, "reason": …}` ([`precondition_answer`]).
///
/// In the URL's path, an argument that is empty, `.` or `..` is refused
/// ([`Filled::DotSegment`]): it would not name a resource but move to another one
/// (`/orders/../admin`), and the model chooses the arguments.
///
/// ```
/// use toolledger_contract::Precondition;
/// use toolledger_downstream_http::{Filled, HttpPrecondition, Timeouts};
///
/// let ask = HttpPrecondition::new("http://127.0.0.1:9/orders/{order_id}/refundable", Vec::new(), Timeouts::default());
/// assert_eq!(ask.url_of(&serde_json::json!({"order_id": "ord 1/2"})),
///     Filled::Url("http://127.0.0.1:9/orders/ord%201%2F2/refundable".to_owned()));
/// assert_eq!(ask.url_of(&serde_json::json!({"order_id": ".."})), Filled::DotSegment);
/// # let _: &dyn Precondition = &ask;
/// ```
#[derive(Debug)]
pub struct HttpPrecondition {
    url: String,
    headers: Vec<(String, String)>,
    agent: ureq::Agent,
}

/// A precondition's URL template filled from a call's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filled {
    /// The URL to ask.
    Url(String),
    /// A placeholder names no string or integer argument.
    Missing,
    /// A placeholder in the path was given an empty, `.` or `..` argument.
    DotSegment,
}

impl HttpPrecondition {
    /// Asks `url` (a template over the arguments) with `headers`, within `timeouts`.
    pub fn new(url: &str, headers: Vec<(String, String)>, timeouts: Timeouts) -> HttpPrecondition {
        HttpPrecondition { url: url.to_owned(), headers, agent: agent(timeouts) }
    }

    /// The URL asked for these arguments.
    pub fn url_of(&self, arguments: &Value) -> Filled {
        let mut url = String::with_capacity(self.url.len() + 32);
        let mut rest = self.url.as_str();
        while let Some(open) = rest.find('{') {
            let (head, tail) = rest.split_at(open);
            url.push_str(head);
            let (Some(close), in_path) = (tail.find('}'), !url.contains(['?', '#'])) else {
                return Filled::Missing;
            };
            let Some(name) = tail.get(1..close) else { return Filled::Missing };
            match arguments.get(name) {
                Some(Value::String(text))
                    if in_path && matches!(text.as_str(), "" | "." | "..") =>
                {
                    return Filled::DotSegment;
                }
                Some(Value::String(text)) => percent_encode(text, &mut url),
                Some(Value::Number(number)) if number.is_i64() || number.is_u64() => {
                    url.push_str(&number.to_string());
                }
                _ => return Filled::Missing,
            }
            rest = tail.get(close + 1..).unwrap_or_default();
        }
        url.push_str(rest);
        Filled::Url(url)
    }
}

/// Every byte but RFC 3986's unreserved ones, percent-encoded.
fn percent_encode(text: &str, out: &mut String) {
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[usize::from(byte >> 4)]));
            out.push(char::from(b"0123456789ABCDEF"[usize::from(byte & 15)]));
        }
    }
}

impl toolledger_contract::Precondition for HttpPrecondition {
    fn ask(&self, call: &toolledger_contract::RuleCall<'_>) -> toolledger_contract::Verdict {
        use toolledger_contract::Verdict;
        let url = match self.url_of(call.arguments) {
            Filled::Url(url) => url,
            Filled::Missing => {
                return Verdict::Unavailable {
                    reason: "the precondition's URL names an argument the call lacks".to_owned(),
                };
            }
            Filled::DotSegment => {
                return Verdict::Refuse {
                    reason: Some(
                        "an argument of the precondition's URL path is empty, . or ..".to_owned(),
                    ),
                };
            }
        };
        if !url.starts_with("http://") {
            return Verdict::Unavailable {
                reason: "only http:// URLs are supported (no TLS is compiled in)".to_owned(),
            };
        }
        match headers(self.agent.get(&url), &self.headers).call().and_then(read) {
            Ok((status, text)) => precondition_answer(status, &text),
            Err(err) => Verdict::Unavailable {
                reason: format!("the precondition could not be asked: {}", short(&err)),
            },
        }
    }
}

/// What a precondition lookup's answer means, from its status and body alone: 200
/// with `{"allow": true}` allows; 200 with `{"allow": false}` refuses, with its
/// `reason` (at most 400 characters); anything else decides nothing.
///
/// ```
/// use toolledger_contract::Verdict;
/// use toolledger_downstream_http::precondition_answer;
///
/// assert_eq!(precondition_answer(200, r#"{"allow":true}"#), Verdict::Allow);
/// assert_eq!(
///     precondition_answer(200, r#"{"allow":false,"reason":"order 7 is not paid"}"#),
///     Verdict::Refuse { reason: Some("order 7 is not paid".to_owned()) },
/// );
/// assert!(matches!(precondition_answer(503, ""), Verdict::Unavailable { .. }));
/// assert!(matches!(precondition_answer(200, "<html>"), Verdict::Unavailable { .. }));
/// ```
pub fn precondition_answer(status: u16, body: &str) -> toolledger_contract::Verdict {
    use toolledger_contract::Verdict;
    let value = json_body(body);
    match (status, value.get("allow").and_then(Value::as_bool)) {
        (200, Some(true)) => Verdict::Allow,
        (200, Some(false)) => Verdict::Refuse {
            reason: value
                .get("reason")
                .and_then(Value::as_str)
                .map(|reason| reason.chars().take(400).collect()),
        },
        _ => Verdict::Unavailable { reason: format!("HTTP {status}: not a precondition's answer") },
    }
}
