//! `toolledger relay`: the relay's workers over the simulated downstream, progress on
//! stderr, the totals on stdout, and a clean stop on SIGTERM or SIGINT.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use toolledger::{Drained, Location, Relay, RelayEvent, Until};

use crate::{
    args::LogFormat,
    claims::Claims,
    run::{Failure, Printed},
};

fn counts(drained: &Drained) -> Value {
    json!({
        "claimed": drained.claimed,
        "delivered": drained.delivered,
        "failed": drained.failed,
        "quarantined": drained.quarantined,
        "retried": drained.retried,
        "dead": drained.dead,
        "unknown": drained.unknown,
        "refused": drained.refused,
        "fenced": drained.fenced,
        "skipped": drained.skipped,
    })
}

/// One progress line: a JSON object, or `key=value` words. Never a path or a secret:
/// counts and codes only.
fn line(format: LogFormat, event: &RelayEvent) -> String {
    let (kind, worker, fields) = match event {
        RelayEvent::Pass { worker, drained } => ("pass", *worker, counts(drained)),
        RelayEvent::Failed { worker, code } => ("failed", *worker, json!({"code": code})),
    };
    match format {
        LogFormat::Json => {
            let mut object = json!({"event": kind, "worker": worker});
            if let (Some(object), Some(fields)) = (object.as_object_mut(), fields.as_object()) {
                object.extend(fields.clone());
            }
            toolledger_json::canonicalize(&object)
        }
        LogFormat::Text => {
            let words: Vec<String> = fields
                .as_object()
                .map(|fields| {
                    fields
                        .iter()
                        .map(|(name, value)| {
                            format!(
                                "{name}={}",
                                value.as_str().map_or_else(|| value.to_string(), str::to_owned)
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            format!("relay {kind} worker={worker} {}", words.join(" "))
        }
    }
}

/// How the command runs its relay.
pub(crate) struct Options {
    pub(crate) once: bool,
    pub(crate) format: LogFormat,
    pub(crate) metrics_listen: Option<SocketAddr>,
    pub(crate) downstream: crate::wire::Chosen,
}

pub(crate) fn run(
    relay: &Relay,
    db: &Location,
    claims: Claims,
    context: &Value,
    options: &Options,
) -> Result<Printed, Failure> {
    let Options { once, format, metrics_listen, ref downstream } = *options;
    let stop = Arc::new(AtomicBool::new(false));
    let server = match metrics_listen {
        Some(addr) => Some(serve_metrics(addr, db, Arc::clone(&stop))?),
        None => None,
    };
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).map_err(|_| Failure {
            code: "INTERNAL_ERROR",
            message: "the relay could not set up its signal handling".to_owned(),
        })?;
    }
    let until = if once { Until::Drained } else { Until::Stopped(&stop) };
    // Quiet passes (nothing claimed) are not logged: an idle relay writes nothing.
    let log = |event: RelayEvent| {
        if matches!(&event, RelayEvent::Pass { drained, .. } if drained.claimed == 0 && drained.skipped == 0)
        {
            return;
        }
        let _ = writeln!(std::io::stderr(), "{}", line(format, &event));
    };
    let totals = relay.run(|| downstream.open(db), || claims.clone(), context, until, &log);
    stop.store(true, Ordering::SeqCst);
    if let Some(server) = server {
        let _ = server.join();
    }
    Ok(Printed::Package(json!({"gate": "PASS", "code": "OK", "relay": counts(&totals?)}), true))
}

/// Serves `GET /metrics` (the `metrics` command's text) on a loopback address until
/// `stop`. Any other request is 404; a request is read at most 8 KiB and 2 s.
fn serve_metrics(
    addr: SocketAddr,
    db: &Location,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, Failure> {
    let refused = |message: &str| Failure { code: "USAGE_ERROR", message: message.to_owned() };
    if !addr.ip().is_loopback() {
        return Err(refused("--metrics-listen must be a loopback address"));
    }
    let listener =
        TcpListener::bind(addr).map_err(|_| refused("--metrics-listen could not be bound"))?;
    listener.set_nonblocking(true).map_err(|_| refused("--metrics-listen could not be set up"))?;
    if let Ok(bound) = listener.local_addr() {
        let _ = writeln!(std::io::stderr(), "relay metrics listening on {bound}");
    }
    let db = db.clone();
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => answer(stream, &db),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }))
}

fn answer(mut stream: TcpStream, db: &Location) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut request = Vec::new();
    let mut chunk = [0_u8; 1024];
    while request.len() < 8192 && !request.windows(4).any(|window| window == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => request.extend_from_slice(chunk.get(..read).unwrap_or_default()),
        }
    }
    let wanted = request.starts_with(b"GET /metrics ") || request.starts_with(b"GET /metrics?");
    let (status, body) = match (wanted, toolledger::metrics(db, None)) {
        (true, Ok(text)) => ("200 OK", text),
        (true, Err(_)) => ("503 Service Unavailable", "the ledger could not be read\n".to_owned()),
        (false, _) => ("404 Not Found", "not found\n".to_owned()),
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
