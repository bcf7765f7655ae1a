//! The command's exporters (`toolledger-otlp`, from the standard `OTEL_*` variables),
//! and the ledger's figures registered as metrics by the long-running commands when
//! this process exports metrics (`docs/observability.md`, "Metrics").

use std::{
    collections::HashMap,
    sync::atomic::{AtomicBool, Ordering},
};

/// Whether this process exports metrics.
static METRICS: AtomicBool = AtomicBool::new(false);

/// Installs the exporters the environment asks for ([`toolledger_otlp::start`]).
///
/// # Errors
///
/// A sentence for `USAGE_ERROR` when the variables ask for what this command cannot do.
pub(crate) fn start(env: &HashMap<String, String>) -> Result<toolledger_otlp::Exporting, String> {
    let exporting = toolledger_otlp::start(env)?;
    METRICS.store(exporting.metrics(), Ordering::SeqCst);
    Ok(exporting)
}

/// Registers the figures of the ledger at `db` as metrics, when this process exports
/// them: what a long-running command (the relay, the gateway, the dashboard) does.
pub(crate) fn observe(db: &toolledger::Location) {
    if METRICS.load(Ordering::SeqCst) {
        toolledger::observe_figures(db);
    }
}
