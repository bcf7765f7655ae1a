//! `toolledger relay`: the relay's workers over the simulated downstream, progress on
//! stderr, the totals on stdout, and a clean stop on SIGTERM or SIGINT.

use std::{
    io::Write,
    path::Path,
    sync::{Arc, atomic::AtomicBool},
};

use serde_json::{Value, json};
use toolledger::{Drained, Relay, RelayEvent, Until};

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

pub(crate) fn run(
    relay: &Relay,
    db: &Path,
    claims: Claims,
    context: &Value,
    once: bool,
    format: LogFormat,
) -> Result<Printed, Failure> {
    let stop = Arc::new(AtomicBool::new(false));
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
    let totals =
        relay.run(|| toolledger::simulated(db), || claims.clone(), context, until, &log)?;
    Ok(Printed::Package(json!({"gate": "PASS", "code": "OK", "relay": counts(&totals)}), true))
}
