//! `toolledger relay`: the relay's workers over the simulated downstream, progress on
//! stderr, the totals on stdout, and a clean stop on SIGTERM or SIGINT.

use std::{
    io::Write,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use serde_json::{Value, json};
use toolledger::{Drained, Location, Relay, RelayEvent, Until};

use crate::{
    args::LogFormat,
    claims::Claims,
    run::{Failure, Printed},
    serve::listener::{self, Limits, Listener, Refusal, Request, Served},
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
/// `stop`, on the listener `serve` uses (hyper on tokio, its bounds, its `Host` rule: a
/// request not addressed to this address is 421). Any other request is 404; a body is
/// 413.
fn serve_metrics(
    addr: SocketAddr,
    db: &Location,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, Failure> {
    let refused = |message: &str| Failure { code: "USAGE_ERROR", message: message.to_owned() };
    if !addr.ip().is_loopback() {
        return Err(refused("--metrics-listen must be a loopback address"));
    }
    // A scraper or two: a few connections (past them the oldest not being answered is
    // closed, so idle ones lock no scraper out), and no request has a body.
    let limits = Limits { body_bytes_max: 0, connections_max: 16 };
    let listener =
        Listener::bind(addr, limits).map_err(|_| refused("--metrics-listen could not be bound"))?;
    let _ = writeln!(std::io::stderr(), "relay metrics listening on {}", listener.bound());
    let metrics = Arc::new(Metrics { db: db.clone() });
    std::thread::Builder::new()
        .name("toolledger-metrics".to_owned())
        .spawn(move || {
            listener.serve(metrics, &stop);
        })
        .map_err(|_| Failure {
            code: "INTERNAL_ERROR",
            message: "the relay could not start its metrics listener".to_owned(),
        })
}

/// The metrics listener's service.
struct Metrics {
    db: Location,
}

fn text(status: u16, content_type: &str, body: String) -> Served {
    Served {
        status,
        headers: vec![
            ("Content-Type", content_type.to_owned()),
            ("X-Content-Type-Options", "nosniff".to_owned()),
        ],
        body: body.into_bytes(),
    }
}

impl listener::Service for Metrics {
    fn answer(&self, request: &Request) -> Served {
        let path = request.target().split_once('?').map_or(request.target(), |(path, _)| path);
        if (request.method(), path) != ("GET", "/metrics") {
            return text(404, "text/plain; charset=utf-8", "not found\n".to_owned());
        }
        match toolledger::metrics(&self.db, None) {
            Ok(figures) => text(200, "text/plain; version=0.0.4; charset=utf-8", figures),
            Err(_) => {
                text(503, "text/plain; charset=utf-8", "the ledger could not be read\n".to_owned())
            }
        }
    }

    fn refuse(&self, refusal: Refusal) -> Served {
        text(refusal.status, "text/plain; charset=utf-8", format!("{}\n", refusal.message))
    }
}
