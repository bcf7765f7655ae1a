//! The command's HTTP listeners (`serve`'s dashboard and `relay --metrics-listen`):
//! HTTP/1.1 on `std::net`, one request per connection, bounded against clients that are
//! slow, stalled or hostile.
//!
//! Invariants:
//! - every read has a timeout ([`READ_TIMEOUT`]), the request line and headers a
//!   deadline ([`HEAD_DEADLINE`]) and the body another ([`BODY_DEADLINE`]); every answer
//!   is written by a deadline ([`WRITE_DEADLINE`]);
//! - the request line and headers are at most [`HEAD_BYTES_MAX`] bytes and
//!   [`HEADERS_MAX`] headers (431), a body at most the listener's
//!   [`Limits::body_bytes_max`] (413, refused before any of it is read), and a body is
//!   framed by `Content-Length` only (a `Transfer-Encoding` is refused);
//! - each connection has its own thread, and at most [`Limits::connections_max`] are in
//!   flight: past that a connection is answered 503 at once and closed, so a slow client
//!   holds one slot, never the server;
//! - a listener on a loopback address answers only requests whose `Host` names it
//!   ([`addressed_to_us`]): a page of another site whose name resolves to 127.0.0.1 (DNS
//!   rebinding) is refused 421 before any service sees it;
//! - [`Listener::serve`] returns within [`STOP_POLL`] + [`STOP_GRACE`] of the stop flag,
//!   whatever the clients do: a connection still reading its request is abandoned, and
//!   only a request already being answered gets the grace.
//!
//! It does not do keep-alive, pipelining, chunked bodies, TLS or HTTP/2: each answer says
//! `Connection: close`. The listener's own refusals are a status, a stable code and a
//! fixed sentence ([`Refusal`]), rendered by the service, never the input.

use std::{
    io::{self, Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

/// The request line and headers, the blank line that ends them included.
pub(crate) const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Header lines in one request.
pub(crate) const HEADERS_MAX: usize = 64;
/// The longest one read may wait for a byte.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// From the connection's start to the end of its headers.
pub(crate) const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// From the end of the headers to the end of the body.
pub(crate) const BODY_DEADLINE: Duration = Duration::from_secs(10);
/// From the first byte of an answer to its last.
pub(crate) const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// How often the stop flag is looked at.
pub(crate) const STOP_POLL: Duration = Duration::from_millis(50);
/// How long a stopping listener waits for the requests it is answering.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(3);
/// After an answer, what is still read and discarded (so that closing with unread bytes
/// does not reset the connection before the client has read the answer), and for how
/// long at most.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES_MAX: usize = 64 * 1024;
/// Headers that decide something and so may appear once: a second `Host` or
/// `Content-Length` is how requests are smuggled, a second `Origin` or token how a
/// check is confused.
const SINGLE: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "content-type",
    "authorization",
    "origin",
    "referer",
    "sec-fetch-site",
    "x-toolledger-token",
];

/// What one listener accepts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The longest body read; a longer `Content-Length` is 413.
    pub(crate) body_bytes_max: usize,
    /// Connections handled at once; past it, 503.
    pub(crate) connections_max: usize,
}

/// One request, read whole and checked against the limits.
#[derive(Debug)]
pub(crate) struct Request {
    method: String,
    target: String,
    /// Names in lower case, values without surrounding spaces; a name of [`SINGLE`]
    /// appears at most once.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    pub(crate) fn method(&self) -> &str {
        &self.method
    }

    /// The origin-form target: a path, maybe with a query.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// The value of the header `name` (any case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    pub(crate) fn body(&self) -> &[u8] {
        &self.body
    }
}

/// One answer; the listener adds `Content-Length` and `Connection: close`.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Vec<u8>,
}

/// A request the listener refused before any service saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refusal {
    pub(crate) status: u16,
    pub(crate) code: &'static str,
    pub(crate) message: &'static str,
}

const fn refusal(status: u16, code: &'static str, message: &'static str) -> Refusal {
    Refusal { status, code, message }
}

const MALFORMED: Refusal = refusal(400, "BAD_REQUEST", "the request is not well-formed HTTP/1.1");
const TIMEOUT: Refusal = refusal(408, "TIMEOUT", "the request did not arrive in time");
const CHUNKED: Refusal =
    refusal(411, "LENGTH_REQUIRED", "a body must be sent with a Content-Length, not chunked");
const TOO_LARGE: Refusal = refusal(413, "TOO_LARGE", "the request body is too large");
const MISDIRECTED: Refusal =
    refusal(421, "MISDIRECTED", "this server answers only its own address");
const HEAD_TOO_LARGE: Refusal =
    refusal(431, "HEADERS_TOO_LARGE", "the request's headers are too large or too many");
const ENCODED: Refusal =
    refusal(501, "NOT_IMPLEMENTED", "a body must be sent with a Content-Length, not encoded");
const BUSY: Refusal = refusal(503, "BUSY", "the server is answering as many requests as it may");
const STOPPING: Refusal = refusal(503, "STOPPING", "the server is stopping");
const VERSION: Refusal = refusal(505, "HTTP_VERSION", "only HTTP/1.0 and HTTP/1.1 are spoken");

/// What a listener serves: the answer to a request, and how its refusals look.
pub(crate) trait Service: Send + Sync + 'static {
    fn answer(&self, request: &Request) -> Answer;
    fn refuse(&self, refusal: Refusal) -> Answer;
}

/// Whether `host`, a request's `Host`, names the server bound at `bound`: that address
/// itself, `localhost:PORT` or `127.0.0.1:PORT`. Every listener on a loopback address
/// applies this rule.
pub(crate) fn addressed_to_us(bound: SocketAddr, host: Option<&str>) -> bool {
    let port = bound.port();
    host.is_some_and(|host| {
        [bound.to_string(), format!("localhost:{port}"), format!("127.0.0.1:{port}")]
            .iter()
            .any(|ours| ours.eq_ignore_ascii_case(host))
    })
}

/// A bound socket, not yet serving.
#[derive(Debug)]
pub(crate) struct Listener {
    socket: TcpListener,
    bound: SocketAddr,
    limits: Limits,
}

/// What the acceptor and the connections share.
#[derive(Debug, Default)]
struct Shared {
    closing: AtomicBool,
    in_flight: AtomicUsize,
    answering: AtomicUsize,
    served: AtomicU64,
}

/// One connection in flight, counted until dropped (also when its thread never starts).
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Listener {
    pub(crate) fn bind(addr: SocketAddr, limits: Limits) -> io::Result<Listener> {
        let socket = TcpListener::bind(addr)?;
        let bound = socket.local_addr()?;
        Ok(Listener { socket, bound, limits })
    }

    /// The address bound (the port chosen, for `:0`).
    pub(crate) fn bound(&self) -> SocketAddr {
        self.bound
    }

    /// Serves `service` until `stop`, then returns the number of requests read whole.
    /// The stop flag is looked at every [`STOP_POLL`]; then accepting stops, requests
    /// being answered get [`STOP_GRACE`], and it returns regardless. Fails only when the
    /// accepting thread cannot be started.
    pub(crate) fn serve<S: Service>(self, service: Arc<S>, stop: &AtomicBool) -> io::Result<u64> {
        let Listener { socket, bound, limits } = self;
        let shared = Arc::new(Shared::default());
        // A blocking accept on a thread of its own: an idle server answers its next
        // connection at once (a nonblocking loop that sleeps would add its sleep to the
        // first request after every pause), and a connection to itself wakes it to stop.
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("toolledger-accept".to_owned())
                .spawn(move || accept(&socket, bound, limits, &service, &shared))?
        };
        while !stop.load(Ordering::SeqCst) {
            thread::sleep(STOP_POLL);
        }
        shared.closing.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&reachable(bound), STOP_POLL);
        let started = Instant::now();
        while shared.answering.load(Ordering::SeqCst) > 0 && started.elapsed() < STOP_GRACE {
            thread::sleep(Duration::from_millis(10));
        }
        // The acceptor has seen the wake-up connection by now, unless it could not be
        // made; then it is left blocked, and ends with the process.
        if acceptor.is_finished() {
            let _ = acceptor.join();
        }
        Ok(shared.served.load(Ordering::SeqCst))
    }
}

/// An address the listener bound at `bound` can be reached on from this host.
fn reachable(bound: SocketAddr) -> SocketAddr {
    let ip = match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, bound.port())
}

fn accept<S: Service>(
    socket: &TcpListener,
    bound: SocketAddr,
    limits: Limits,
    service: &Arc<S>,
    shared: &Arc<Shared>,
) {
    for stream in socket.incoming() {
        if shared.closing.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else {
            // Out of descriptors, most likely: wait for connections to end.
            thread::sleep(STOP_POLL);
            continue;
        };
        let slot = Slot(Arc::clone(shared));
        if shared.in_flight.fetch_add(1, Ordering::SeqCst) >= limits.connections_max {
            busy(stream, &**service);
            drop(slot);
            continue;
        }
        let (service, shared) = (Arc::clone(service), Arc::clone(shared));
        // A thread that cannot start drops its closure: the slot is given back and the
        // connection closed.
        let _ = thread::Builder::new().name("toolledger-http".to_owned()).spawn(move || {
            let _slot = slot;
            connection(stream, bound, limits, &*service, &shared);
        });
    }
}

/// Answers 503 without reading and without ever blocking the acceptor.
fn busy<S: Service>(mut stream: TcpStream, service: &S) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = stream.write(&encode(&service.refuse(BUSY)));
    }
    let _ = stream.shutdown(Shutdown::Write);
}

fn connection<S: Service>(
    mut stream: TcpStream,
    bound: SocketAddr,
    limits: Limits,
    service: &S,
    shared: &Shared,
) {
    // The answer goes out in one write; Nagle would only hold its tail back.
    let _ = stream.set_nodelay(true);
    let answer = match read_request(&mut stream, limits.body_bytes_max) {
        Ok(request) => {
            shared.served.fetch_add(1, Ordering::SeqCst);
            if bound.ip().is_loopback() && !addressed_to_us(bound, request.header("host")) {
                service.refuse(MISDIRECTED)
            } else {
                // Counted before the stop flag is read: a stopping listener either waits
                // for this answer or sees it refused, never leaves it half done.
                shared.answering.fetch_add(1, Ordering::SeqCst);
                let answer = if shared.closing.load(Ordering::SeqCst) {
                    service.refuse(STOPPING)
                } else {
                    service.answer(&request)
                };
                shared.answering.fetch_sub(1, Ordering::SeqCst);
                answer
            }
        }
        Err(Cut::Refused(refusal)) => service.refuse(refusal),
        Err(Cut::Gone) => return,
    };
    if write_by(&mut stream, &encode(&answer), Instant::now() + WRITE_DEADLINE).is_ok() {
        linger(&mut stream);
    }
}

/// Why no request was read.
#[derive(Debug)]
enum Cut {
    /// Answered with this refusal.
    Refused(Refusal),
    /// The client went away, or the connection failed: nobody to answer.
    Gone,
}

/// One read of at most `buffer.len()` bytes by `deadline`: 408 when it passes, `Gone` at
/// the end of the stream or on an error.
fn read_by(stream: &mut TcpStream, buffer: &mut [u8], deadline: Instant) -> Result<usize, Cut> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Cut::Refused(TIMEOUT));
        }
        if stream.set_read_timeout(Some(left.min(READ_TIMEOUT))).is_err() {
            return Err(Cut::Gone);
        }
        return match stream.read(buffer) {
            Ok(0) => Err(Cut::Gone),
            Ok(read) => Ok(read),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err)
                if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
            {
                Err(Cut::Refused(TIMEOUT))
            }
            Err(_) => Err(Cut::Gone),
        };
    }
}

fn write_by(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left.min(READ_TIMEOUT)))?;
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => bytes = bytes.get(written..).unwrap_or_default(),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Ends the answer and reads what the client still sends, bounded, until it closes.
fn linger(stream: &mut TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + LINGER;
    let mut sink = [0_u8; 4096];
    let mut drained = 0;
    while drained < LINGER_BYTES_MAX {
        match read_by(stream, &mut sink, deadline) {
            Ok(read) => drained += read,
            Err(_) => break,
        }
    }
}

fn read_request(stream: &mut TcpStream, body_bytes_max: usize) -> Result<Request, Cut> {
    let head_deadline = Instant::now() + HEAD_DEADLINE;
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            if at + 4 > HEAD_BYTES_MAX {
                return Err(Cut::Refused(HEAD_TOO_LARGE));
            }
            break at;
        }
        if buffer.len() >= HEAD_BYTES_MAX {
            return Err(Cut::Refused(HEAD_TOO_LARGE));
        }
        let read = read_by(stream, &mut chunk, head_deadline)?;
        buffer.extend_from_slice(chunk.get(..read).unwrap_or_default());
    };
    let (head, rest) = buffer.split_at(head_end);
    let mut request = parse_head(head).map_err(Cut::Refused)?;
    let length = match (request.header("transfer-encoding"), request.header("content-length")) {
        (Some(coding), _) if coding.eq_ignore_ascii_case("chunked") => {
            return Err(Cut::Refused(CHUNKED));
        }
        (Some(_), _) => return Err(Cut::Refused(ENCODED)),
        (None, None) => 0,
        (None, Some(length)) => parse_length(length).ok_or(Cut::Refused(MALFORMED))?,
    };
    if length > body_bytes_max {
        return Err(Cut::Refused(TOO_LARGE));
    }
    let mut body = rest.get(4..).unwrap_or_default().to_vec();
    body.truncate(length);
    if body.len() < length
        && request
            .header("expect")
            .is_some_and(|expect| expect.eq_ignore_ascii_case("100-continue"))
    {
        write_by(stream, b"HTTP/1.1 100 Continue\r\n\r\n", Instant::now() + WRITE_DEADLINE)
            .map_err(|_| Cut::Gone)?;
    }
    let body_deadline = Instant::now() + BODY_DEADLINE;
    while body.len() < length {
        let want = (length - body.len()).min(chunk.len());
        let read = read_by(stream, chunk.get_mut(..want).unwrap_or_default(), body_deadline)?;
        body.extend_from_slice(chunk.get(..read).unwrap_or_default());
    }
    request.body = body;
    Ok(request)
}

/// A `Content-Length`: decimal digits only, no sign, no list.
fn parse_length(text: &str) -> Option<usize> {
    if text.is_empty() || text.len() > 18 || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A token (RFC 9110 `tchar`s): methods and header names.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}

/// The request line and headers, without the blank line: visible ASCII, spaces and tabs
/// on `\r\n`-separated lines; no folded lines, no bare CR or LF.
fn parse_head(head: &[u8]) -> Result<Request, Refusal> {
    let allowed = |byte: u8| matches!(byte, b' ' | b'\t' | b'\r' | b'\n' | 0x21..=0x7e);
    if !head.iter().all(|&byte| allowed(byte)) {
        return Err(MALFORMED);
    }
    let head = std::str::from_utf8(head).map_err(|_| MALFORMED)?;
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(MALFORMED);
    };
    if !is_token(method) || method.len() > 16 || !target.starts_with('/') {
        return Err(MALFORMED);
    }
    let http_11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ if version.starts_with("HTTP/") => return Err(VERSION),
        _ => return Err(MALFORMED),
    };
    let mut headers: Vec<(String, String)> = Vec::new();
    for line in lines {
        if headers.len() == HEADERS_MAX {
            return Err(HEAD_TOO_LARGE);
        }
        let (name, value) = line.split_once(':').ok_or(MALFORMED)?;
        if !is_token(name) || value.contains(['\r', '\n']) {
            return Err(MALFORMED);
        }
        let name = name.to_ascii_lowercase();
        if SINGLE.contains(&name.as_str()) && headers.iter().any(|(seen, _)| *seen == name) {
            return Err(MALFORMED);
        }
        headers.push((name, value.trim_matches([' ', '\t']).to_owned()));
    }
    if line.contains(['\r', '\n', '\t'])
        || (http_11 && !headers.iter().any(|(name, _)| name == "host"))
    {
        return Err(MALFORMED);
    }
    Ok(Request { method: method.to_owned(), target: target.to_owned(), headers, body: Vec::new() })
}

/// The answer's bytes. A header value holding a control character is left out: nothing
/// a service puts in a header can start another.
fn encode(answer: &Answer) -> Vec<u8> {
    let mut out = Vec::with_capacity(answer.body.len() + 512);
    let _ = write!(out, "HTTP/1.1 {} {}\r\n", answer.status, phrase(answer.status));
    for (name, value) in &answer.headers {
        if !value.chars().any(char::is_control) {
            let _ = write!(out, "{name}: {value}\r\n");
        }
    }
    let _ = write!(out, "Content-Length: {}\r\nConnection: close\r\n\r\n", answer.body.len());
    out.extend_from_slice(&answer.body);
    out
}

fn phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "Service Unavailable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_strictly() {
        let request = parse_head(b"GET /x?a=1 HTTP/1.1\r\nHost: h:1\r\nX-A:  b \t").unwrap();
        assert_eq!((request.method(), request.target()), ("GET", "/x?a=1"));
        assert_eq!((request.header("HOST"), request.header("x-a")), (Some("h:1"), Some("b")));
        for (head, status) in [
            (&b"GET /x HTTP/1.1"[..], 400),
            (b"GET /x HTTP/1.0", 200),
            (b"GET /x HTTP/2.0\r\nHost: h", 505),
            (b"GET x HTTP/1.1\r\nHost: h", 400),
            (b"GET  /x HTTP/1.1\r\nHost: h", 400),
            (b"GET /x HTTP/1.1\r\nHost: h\r\n folded", 400),
            (b"GET /x HTTP/1.1\r\nHost : h", 400),
            (b"GET /x HTTP/1.1\r\nHost: h\r\nHost: i", 400),
            (b"GET /x HTTP/1.1\r\nHost: h\nX: y", 400),
            (b"GET /x HTTP/1.1\r\nHost: h\r\nX: \xc3\xa9", 400),
            (b"GET /x HTTP/1.1\r\nHost: h\r\nX: a\0", 400),
        ] {
            let got = parse_head(head).map_or_else(|refusal| refusal.status, |_| 200);
            assert_eq!(got, status, "{}", String::from_utf8_lossy(head));
        }
        let many = format!("GET / HTTP/1.1\r\nHost: h{}", "\r\nX: y".repeat(HEADERS_MAX));
        assert_eq!(parse_head(many.as_bytes()).map(drop).unwrap_err().status, 431);
        for (text, length) in [("0", Some(0)), ("12", Some(12)), ("+1", None), ("1,1", None)] {
            assert_eq!(parse_length(text), length, "{text}");
        }
    }

    #[test]
    fn only_the_server_s_own_names_are_ours() {
        let bound: SocketAddr = "127.0.0.1:8780".parse().unwrap();
        for host in ["127.0.0.1:8780", "localhost:8780", "LOCALHOST:8780"] {
            assert!(addressed_to_us(bound, Some(host)), "{host}");
        }
        for host in [None, Some("evil.example:8780"), Some("localhost"), Some("127.0.0.1:8781")] {
            assert!(!addressed_to_us(bound, host), "{host:?}");
        }
    }
}
