//! The command's two HTTP listeners (`serve`, `relay --metrics-listen`) under slow and
//! hostile clients, written by hand on `TcpStream`: a body that never arrives, headers
//! that never end, too much of either, a foreign `Host`. Each time the server goes on
//! answering everyone else, keeps its memory, and stops on SIGTERM within a bound.
//!
//! The time bounds are liveness bounds, not benchmarks: an answer within 10 s while a
//! stalled client holds a connection (the server answers in milliseconds; before the
//! listeners were bounded it did not answer at all), a stop within 5 s.

use std::{
    io::{BufRead, BufReader, ErrorKind, Read, Write},
    net::TcpStream,
    process::{Child, ChildStderr, ChildStdout, Stdio},
    sync::{
        Arc, Barrier,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    Dir,
    dashboard::{NOW, TOKEN},
    operators::accepted,
};

/// How long a client waits for an answer before the test calls the server stalled.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// How long SIGTERM may take to stop a server.
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// A listening `toolledger` process, killed when dropped. Its output pipes are kept open,
/// so what it prints when it stops is not lost.
pub(crate) struct Listening {
    child: Child,
    pub(crate) addr: String,
    stdout: Option<BufReader<ChildStdout>>,
    _stderr: Option<BufReader<ChildStderr>>,
}

impl Listening {
    /// `toolledger serve --listen LISTEN EXTRA…`; a server on every address is reached
    /// on loopback.
    fn serve(dir: &Dir, listen: &str, extra: &[&str]) -> Listening {
        let mut args = vec!["serve", "--listen", listen, "--now", NOW];
        args.extend_from_slice(extra);
        let mut child =
            dir.command(&args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{line:?}"));
        let addr = addr.replace("0.0.0.0", "127.0.0.1");
        Listening { child, addr, stdout: Some(stdout), _stderr: None }
    }

    /// `toolledger relay --metrics-listen 127.0.0.1:0` over two accepted intents.
    pub(crate) fn relay(dir: &Dir) -> Listening {
        accepted(dir, 2);
        let mut child = dir
            .command(&[
                "--fixture",
                "case.json",
                "relay",
                "--poll-ms",
                "20",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("relay metrics listening on ");
        let addr = addr.unwrap_or_else(|| panic!("{line:?}")).to_owned();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Listening { child, addr, stdout: Some(stdout), _stderr: Some(stderr) }
    }

    /// The process's resident memory, from /proc.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Sends SIGTERM and waits at most [`STOP_WITHIN`] for the exit: its code and the
    /// answer the process printed last.
    pub(crate) fn terminate(&mut self) -> (Option<i32>, Value) {
        let status = crate::sigterm(&mut self.child, STOP_WITHIN);
        let mut rest = String::new();
        self.stdout.take().unwrap().read_to_string(&mut rest).unwrap();
        let last = rest.lines().last().unwrap_or_else(|| panic!("no answer: {rest:?}"));
        (status.code(), serde_json::from_str(last).unwrap())
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `request` on a fresh connection, and the answer read to the server's close: panics if
/// it takes longer than [`ANSWER_WITHIN`].
fn exchange(addr: &str, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    stream.write_all(request).unwrap();
    let mut answer = Vec::new();
    if let Err(err) = stream.read_to_end(&mut answer) {
        assert!(!answer.is_empty(), "no answer within {ANSWER_WITHIN:?}: {err}");
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// `GET path` addressed to `addr`, with `extra` header lines.
pub(crate) fn get(addr: &str, path: &str, extra: &str) -> String {
    exchange(addr, format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}\r\n").as_bytes())
}

/// The status code of an answer (in HTTP/1.0 to an HTTP/1.0 request).
fn status(answer: &str) -> u16 {
    let code = answer
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| answer.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3));
    code.and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("not an answer: {answer:?}"))
}

/// A connection that sent `bytes` and then nothing, held open by the test.
fn stalled(addr: &str, bytes: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(bytes.as_bytes()).unwrap();
    stream
}

/// `/healthz` answers `ok` within [`ANSWER_WITHIN`].
fn assert_healthy(addr: &str, extra: &str) {
    let answer = get(addr, "/healthz", extra);
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.ends_with("\r\n\r\nok\n"), "{answer}");
}

#[test]
fn a_stalled_body_neither_silences_the_dashboard_nor_outlasts_sigterm() {
    let dir = Dir::new();
    dir.run(&["dispatch", "--case", "case.json"]);
    let mut server = Listening::serve(&dir, "127.0.0.1:0", &[]);
    let addr = server.addr.clone();
    let post = |length: usize| {
        format!(
            "POST /operations/x/requeue HTTP/1.1\r\nHost: {addr}\r\nContent-Type: \
             application/x-www-form-urlencoded\r\nContent-Length: {length}\r\n\r\nreason="
        )
    };
    // Past the body limit, within it, and a head that never ends: each holds a connection.
    let mut over = stalled(&addr, &post(1_000_000));
    let within = stalled(&addr, &post(4_000));
    let head = stalled(&addr, &format!("GET / HTTP/1.1\r\nHost: {addr}\r\nX-Slow: "));
    for _ in 0..3 {
        assert_healthy(&addr, "");
    }
    // The announced million bytes are refused before they are read: 413 while the client
    // has sent seven of them.
    over.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    let mut refused = String::new();
    let _ = over.read_to_string(&mut refused);
    assert_eq!(status(&refused), 413, "{refused}");
    assert!(refused.contains("Connection: close\r\n"), "{refused}");
    assert!(refused.contains("Content-Security-Policy: default-src 'none'"), "{refused}");

    let (code, answer) = server.terminate();
    assert_eq!(code, Some(0), "{answer}");
    assert_eq!(answer["code"], "OK", "{answer}");
    assert!(answer["served"].as_u64().unwrap() >= 3, "{answer}");
    drop((within, head, over));
}

#[test]
fn an_unauthenticated_stalled_client_does_not_lock_the_token_holder_out() {
    let dir = Dir::new();
    dir.run(&["dispatch", "--case", "case.json"]);
    dir.write("token", format!("{TOKEN}\n").as_bytes());
    let mut server =
        Listening::serve(&dir, "0.0.0.0:0", &["--allow-remote", "--token-file", "token"]);
    let addr = server.addr.clone();
    let holders: Vec<TcpStream> = (0..4)
        .map(|_| {
            stalled(
                &addr,
                &format!(
                    "POST /operations/x/requeue HTTP/1.1\r\nHost: {addr}\r\n\
                     Content-Length: 4000\r\n\r\nreason="
                ),
            )
        })
        .collect();
    let refused = get(&addr, "/healthz", "");
    assert_eq!(status(&refused), 403, "{refused}");
    assert!(refused.contains("TOKEN_REQUIRED"), "{refused}");
    assert_healthy(&addr, &format!("Authorization: Bearer {TOKEN}\r\n"));
    let (code, answer) = server.terminate();
    assert_eq!((code, &answer["code"]), (Some(0), &Value::from("OK")), "{answer}");
    drop(holders);
}

/// What a client sending header bytes without end met.
#[derive(Debug)]
enum Met {
    /// An answer, after this many bytes were sent.
    Answer(String, usize),
    /// The connection closed or reset, after this many bytes.
    Closed(usize),
    /// Neither, after sending the whole megabyte it had.
    Nothing,
}

/// Sends a head that never ends in 1 KiB writes: `held` bytes slowly, then waits at
/// `barrier` twice (the test looks at the server in between), then more until the
/// server cuts it off, at most 1 MiB.
fn endless_head(addr: &str, held: usize, barrier: &Barrier) -> Met {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_write_timeout(Some(ANSWER_WITHIN)).unwrap();
    let mut sent = 0;
    let start = format!("GET / HTTP/1.1\r\nHost: {addr}\r\nX-Pad: ");
    let mut early = send_and_look(&mut stream, start.as_bytes(), &mut sent);
    let chunk = [b'a'; 1024];
    while early.is_none() && sent < held {
        early = send_and_look(&mut stream, &chunk, &mut sent);
        thread::sleep(Duration::from_millis(5));
    }
    barrier.wait();
    barrier.wait();
    if let Some(met) = early {
        return met;
    }
    while sent < 1 << 20 {
        if let Some(met) = send_and_look(&mut stream, &chunk, &mut sent) {
            return met;
        }
        thread::sleep(Duration::from_millis(5));
    }
    Met::Nothing
}

/// Writes `bytes` and looks, without waiting, whether the server has answered or closed.
fn send_and_look(stream: &mut TcpStream, bytes: &[u8], sent: &mut usize) -> Option<Met> {
    if stream.write_all(bytes).is_err() {
        return Some(Met::Closed(*sent));
    }
    *sent += bytes.len();
    stream.set_nonblocking(true).unwrap();
    let mut answer = vec![0_u8; 4096];
    let met = match stream.read(&mut answer) {
        Ok(0) => Some(Met::Closed(*sent)),
        Ok(read) => Some(Met::Answer(String::from_utf8_lossy(&answer[..read]).into(), *sent)),
        Err(err) if err.kind() == ErrorKind::WouldBlock => None,
        Err(_) => Some(Met::Closed(*sent)),
    };
    stream.set_nonblocking(false).unwrap();
    met
}

#[test]
fn endless_headers_are_cut_off_and_the_server_s_memory_stays_bounded() {
    let dir = Dir::new();
    dir.run(&["dispatch", "--case", "case.json"]);
    let server = Listening::serve(&dir, "127.0.0.1:0", &[]);
    let addr = server.addr.clone();
    const CLIENTS: usize = 60;
    const RSS_MAX_KIB: u64 = 64 * 1024;
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (addr, barrier) = (addr.clone(), Arc::clone(&barrier));
            thread::spawn(move || endless_head(&addr, 12 * 1024, &barrier))
        })
        .collect();
    // Sixty unfinished heads of 12 KiB each are held: others are answered, and the
    // server holds no more than its bounds.
    barrier.wait();
    assert_healthy(&addr, "");
    let held = server.rss_kib();
    assert!(held < RSS_MAX_KIB, "{held} KiB resident while {CLIENTS} heads are held");
    barrier.wait();
    for client in clients {
        // Cut off at 16 KiB: what a client has sent by the time it sees that is the
        // limit plus what was in flight (a kilobyte each 5 ms), far below the megabyte
        // it would send.
        match client.join().unwrap() {
            Met::Answer(answer, sent) if sent <= 256 * 1024 => {
                assert!(matches!(status(&answer), 431 | 408), "{answer}");
            }
            Met::Closed(sent) if sent <= 256 * 1024 => {}
            met => panic!("a head without end was not cut off: {met:?}"),
        }
    }
    let after = server.rss_kib();
    assert!(after < RSS_MAX_KIB, "{after} KiB resident after {CLIENTS} endless heads");
    assert_healthy(&addr, "");

    // One header too large at once, and one header too many: 431.
    let huge = get(&addr, "/healthz", &format!("X-Huge: {}\r\n", "a".repeat(20 * 1024)));
    assert_eq!(status(&huge), 431, "{huge}");
    let many = get(&addr, "/healthz", &"X-Many: y\r\n".repeat(64));
    assert_eq!(status(&many), 431, "{many}");
    let enough = get(&addr, "/healthz", &"X-Many: y\r\n".repeat(63));
    assert_eq!(status(&enough), 200, "{enough}");
}

#[test]
fn bodies_past_the_limit_or_without_a_length_are_refused_unread() {
    let dir = Dir::new();
    let [_, dead, ..] = crate::dashboard::ledger(&dir);
    dir.write("token", format!("{TOKEN}\n").as_bytes());
    let server =
        Listening::serve(&dir, "127.0.0.1:0", &["--allow-actions", "--token-file", "token"]);
    let addr = &server.addr;
    let path = format!("/operations/{dead}/requeue");
    let post = |headers: &str, body: &str| {
        exchange(
            addr,
            format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nX-Toolledger-Token: {TOKEN}\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\n{headers}\r\n{body}"
            )
            .as_bytes(),
        )
    };
    for (headers, body, code) in [
        // One byte past the 8 KiB limit, announced and none of it sent.
        ("Content-Length: 8193\r\n", "", 413),
        // A client that asks first is refused before it sends anything.
        ("Content-Length: 1000000\r\nExpect: 100-continue\r\n", "", 413),
        ("Transfer-Encoding: chunked\r\n", "6\r\nreason\r\n0\r\n\r\n", 411),
        ("Transfer-Encoding: gzip, chunked\r\n", "6\r\nreason\r\n0\r\n\r\n", 501),
        // A coding that does not end in chunked leaves the body unframed: malformed.
        ("Transfer-Encoding: gzip\r\nContent-Length: 6\r\n", "reason", 400),
        ("Content-Length: 6\r\nContent-Length: 7\r\n", "reason", 400),
        ("Content-Length: -6\r\n", "reason", 400),
    ] {
        let answer = post(headers, body);
        assert_eq!(status(&answer), code, "{headers}: {answer}");
        assert!(!answer.contains("100 Continue"), "{headers}: {answer}");
        assert_eq!(
            dir.db_text(&format!("SELECT status FROM operations WHERE status_ref = '{dead}'")),
            "dead"
        );
    }
    // Within the limit, a client that asks first is told to go on, then answered.
    let reason = "reason=back";
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nX-Toolledger-Token: {TOKEN}\r\nContent-Type: \
         application/x-www-form-urlencoded\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        reason.len()
    )
    .unwrap();
    let mut go_on = [0_u8; 25];
    stream.read_exact(&mut go_on).unwrap();
    assert_eq!(&go_on, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(reason.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert_eq!(status(&answer), 303, "{answer}");
    assert_eq!(
        dir.db_text(&format!("SELECT status FROM operations WHERE status_ref = '{dead}'")),
        "pending"
    );
}

/// The head rules `listen.rs` enforced byte by byte, now split between hyper's parser
/// and the listener's checks after it: each refused 400 (421 without a `Host` on
/// loopback), and the page or the plain 400 carries no echo of the input.
#[test]
fn heads_that_are_not_strict_http_1_1_are_refused() {
    let dir = Dir::new();
    dir.run(&["dispatch", "--case", "case.json"]);
    let server = Listening::serve(&dir, "127.0.0.1:0", &[]);
    let addr = &server.addr;
    for (head, code) in [
        (String::from("GET /healthz HTTP/1.1\r\n"), 400),
        (String::from("GET /healthz HTTP/1.0\r\n"), 421),
        (format!("GET http://{addr}/healthz HTTP/1.1\r\nHost: {addr}\r\n"), 400),
        (format!("GET * HTTP/1.1\r\nHost: {addr}\r\n"), 400),
        (format!("GET /\u{e9} HTTP/1.1\r\nHost: {addr}\r\n"), 400),
        // hyper speaks HTTP/1.x only; another version is malformed (was 505).
        (format!("GET /healthz HTTP/2.0\r\nHost: {addr}\r\n"), 400),
        (format!("GET  /healthz HTTP/1.1\r\nHost: {addr}\r\n"), 400),
        (format!("ABCDEFGHIJKLMNOPQ /healthz HTTP/1.1\r\nHost: {addr}\r\n"), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n folded\r\n"), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost : {addr}\r\n"), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nHost: {addr}\r\n"), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nOrigin: a\r\nOrigin: a\r\n"), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX: \u{e9}\r\n"), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX: a\0\r\n"), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nContent-Length: +0\r\n"), 400),
        (format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX: a\tb\r\n"), 200),
        // A bare LF ends a line for hyper, as RFC 9112 (2.2) lets a recipient read it;
        // `listen.rs` refused it. Nothing stands between client and listener to read the
        // same bytes otherwise (no proxy: loopback or a token).
        (format!("GET /healthz HTTP/1.1\r\nHost: {addr}\nX: y\r\n"), 200),
    ] {
        let answer = exchange(addr, format!("{head}\r\n").as_bytes());
        assert_eq!(status(&answer), code, "{head:?}: {answer}");
        assert!(!answer.contains("folded") && !answer.contains("ABCDEF"), "{answer}");
    }
}

/// A client that sends a head one byte every 200 ms until `stop` or 15 s, as a slow
/// scraper would: each byte restarts a per-read timeout, never the head's deadline.
fn trickle(addr: &str, stop: &AtomicBool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let start = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ");
    if stream.write_all(start.as_bytes()).is_err() {
        return;
    }
    let started = Instant::now();
    while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(15) {
        if stream.write_all(b"a").is_err() {
            return;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_metrics_listener_answers_only_its_own_address_and_outlives_a_slow_client() {
    let dir = Dir::new();
    let mut relay = Listening::relay(&dir);
    let addr = relay.addr.clone();
    let port = addr.rsplit(':').next().unwrap().to_owned();
    for (host, code) in [
        (addr.clone(), 200),
        (format!("localhost:{port}"), 200),
        (format!("evil.example:{port}"), 421),
        ("localhost".to_owned(), 421),
    ] {
        let answer =
            exchange(&addr, format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
        assert_eq!(status(&answer), code, "{host}: {answer}");
        if code == 200 {
            assert!(answer.contains("toolledger_operations{state="), "{answer}");
        } else {
            assert!(!answer.contains("toolledger_"), "{host}: {answer}");
        }
    }
    let no_host = exchange(&addr, b"GET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(status(&no_host), 421, "{no_host}");

    let stop = Arc::new(AtomicBool::new(false));
    let slow = {
        let (addr, stop) = (addr.clone(), Arc::clone(&stop));
        thread::spawn(move || trickle(&addr, &stop))
    };
    thread::sleep(Duration::from_millis(500));
    let answer = get(&addr, "/metrics", "");
    assert_eq!(status(&answer), 200, "{answer}");
    let body = exchange(
        &addr,
        format!("POST /metrics HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1\r\n\r\nx").as_bytes(),
    );
    assert_eq!(status(&body), 413, "{body}");
    // SIGTERM while the slow client is still sending: the relay stops all the same.
    let (code, answer) = relay.terminate();
    assert_eq!((code, &answer["code"]), (Some(0), &Value::from("OK")), "{answer}");
    stop.store(true, Ordering::SeqCst);
    slow.join().unwrap();
}

/// Idle loopback connections opened to `addr` and held by the test: each connected and
/// then silent, as any local process can open them.
fn idle_connections(addr: &str, count: usize) -> Vec<TcpStream> {
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    (0..count).map(|_| TcpStream::connect_timeout(&addr, ANSWER_WITHIN).unwrap()).collect()
}

/// Whether the server has closed `stream` within `within`: an end of stream, having sent
/// nothing.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut byte = [0_u8; 1];
    match stream.read(&mut byte) {
        Ok(read) => read == 0,
        Err(err) => matches!(err.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted),
    }
}

/// Regression: 300 idle connections made `/healthz` and every page (and the relay's
/// `/metrics`) answer 503 for as long as they were held (a thread per connection, at
/// most 128, then 503), a lockout any local process could repeat. Now the oldest
/// connection not being answered is closed to make room, so whoever connects last is
/// answered, and an idle connection is closed by the header read timeout (10 s) anyway.
#[test]
fn three_hundred_idle_connections_lock_nobody_out_of_healthz_or_metrics() {
    const IDLE: usize = 300;
    let dir = Dir::new();
    dir.run(&["dispatch", "--case", "case.json"]);
    let mut server = Listening::serve(&dir, "127.0.0.1:0", &[]);
    let relay_dir = Dir::new();
    let mut relay = Listening::relay(&relay_dir);
    let mut held = idle_connections(&server.addr, IDLE);
    let mut held_by_relay = idle_connections(&relay.addr, IDLE);
    for _ in 0..3 {
        assert_healthy(&server.addr, "");
        let answer = get(&relay.addr, "/metrics", "");
        assert_eq!(status(&answer), 200, "{answer}");
        assert!(answer.contains("toolledger_operations{state="), "{answer}");
    }
    // The oldest were closed to make room; the newest, still idle, by the header read
    // timeout: none is held for ever.
    for held in [&mut held, &mut held_by_relay] {
        assert!(closed_within(held.first_mut().unwrap(), ANSWER_WITHIN), "the oldest is held");
        let last = held.last_mut().unwrap();
        assert!(closed_within(last, ANSWER_WITHIN + STOP_WITHIN), "an idle connection lives on");
    }
    let (code, answer) = server.terminate();
    assert_eq!((code, &answer["code"]), (Some(0), &Value::from("OK")), "{answer}");
    assert!(answer["served"].as_u64().unwrap() >= 3, "{answer}");
    let (code, answer) = relay.terminate();
    assert_eq!((code, &answer["code"]), (Some(0), &Value::from("OK")), "{answer}");
}
