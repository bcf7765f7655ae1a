//! The ledger's OpenTelemetry metrics (the cargo feature `otel`;
//! `docs/observability.md`, "Metrics"): the figures `toolledger metrics` prints for
//! Prometheus, as instruments on the host's global meter provider, and two the process
//! itself measures — calls by decision, and each commit point's duration. The
//! OpenTelemetry API alone; a no-op without a provider, nothing without the feature.

use crate::Location;

/// Registers the figures of the ledger at `location` on the global meter provider (the
/// instrumentation scope `toolledger`): read from the store at each collection, once
/// for all of them, the same figures [`metrics`](crate::metrics) prints.
///
/// | instrument | kind | attributes | Prometheus |
/// | --- | --- | --- | --- |
/// | `toolledger.operations` | gauge | `toolledger.state` | `toolledger_operations` |
/// | `toolledger.outbox.events` | gauge | `toolledger.state` | `toolledger_outbox_events` |
/// | `toolledger.outbox.oldest_pending.age` (s) | gauge | | `toolledger_oldest_pending_age_seconds` |
/// | `toolledger.outbox.oldest_unknown.age` (s) | gauge | | `toolledger_oldest_unknown_age_seconds` |
/// | `toolledger.dead_letters` | gauge | | `toolledger_dead_letters` |
/// | `toolledger.claims` … `toolledger.retired` | counter | | `toolledger_claims_total` … `toolledger_retired_total` |
///
/// The instruments live as long as the provider: register once per ledger. A
/// collection while the ledger cannot be read (not created yet, or its server down)
/// reports none of them, and the next one reads again.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("observe-figures");
/// # ledger.dispatch(&call)?;
/// toolledger::observe_figures(dir.join("ledger.sqlite3"));
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn observe_figures(location: impl Into<Location>) {
    let location = location.into();
    #[cfg(feature = "otel")]
    on::observe(location);
    #[cfg(not(feature = "otel"))]
    let _ = location;
}

/// Counts a call that ended with `decision` (`toolledger.calls`).
#[cfg_attr(not(feature = "otel"), allow(dead_code, reason = "read by the meters alone"))]
pub(crate) fn call_ended(purpose: &'static str, store: &'static str, decision: &'static str) {
    #[cfg(feature = "otel")]
    on::call_ended(purpose, store, decision);
    #[cfg(not(feature = "otel"))]
    let _ = (purpose, store, decision);
}

/// Records how long a commit point took (`toolledger.commit.duration`).
#[cfg_attr(not(feature = "otel"), allow(dead_code, reason = "read by the meters alone"))]
pub(crate) fn commit_took(point: &'static str, seconds: f64) {
    #[cfg(feature = "otel")]
    on::commit_took(point, seconds);
    #[cfg(not(feature = "otel"))]
    let _ = (point, seconds);
}

#[cfg(feature = "otel")]
mod on {
    use std::{
        sync::{Arc, Mutex},
        time::{Duration, Instant},
    };

    use opentelemetry::{KeyValue, metrics::Meter};
    use toolledger_store::Figures;

    use crate::Location;

    /// The instrumentation scope of every instrument of the ledger.
    const SCOPE: &str = "toolledger";

    /// How long one reading of the figures serves the instruments of a collection.
    const FRESH: Duration = Duration::from_millis(500);

    /// Commit durations' bucket bounds, in seconds: a lazy commit's tens of
    /// microseconds to a contended synced one's hundreds of milliseconds.
    const BOUNDS: [f64; 12] =
        [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

    fn meter() -> Meter {
        opentelemetry::global::meter(SCOPE)
    }

    pub(super) fn call_ended(purpose: &'static str, store: &'static str, decision: &'static str) {
        meter()
            .u64_counter("toolledger.calls")
            .with_description("Calls of the ledger, by what it decided.")
            .with_unit("{call}")
            .build()
            .add(
                1,
                &[
                    KeyValue::new("toolledger.purpose", purpose),
                    KeyValue::new("toolledger.store", store),
                    KeyValue::new("toolledger.decision", decision),
                ],
            );
    }

    pub(super) fn commit_took(point: &'static str, seconds: f64) {
        meter()
            .f64_histogram("toolledger.commit.duration")
            .with_description("How long a commit point's transaction took, queueing included.")
            .with_unit("s")
            .with_boundaries(BOUNDS.to_vec())
            .build()
            .record(seconds, &[KeyValue::new("toolledger.commit", point)]);
    }

    /// The figures, read at most once per [`FRESH`] for every instrument.
    struct Reading {
        location: Location,
        last: Mutex<Option<(Instant, Figures)>>,
    }

    impl Reading {
        fn figures(&self) -> Option<Figures> {
            let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((at, figures)) = last.as_ref() {
                if at.elapsed() < FRESH {
                    return Some(figures.clone());
                }
            }
            // A store that cannot be read now reports nothing this time.
            let figures = crate::figures(self.location.clone(), None).ok()?;
            *last = Some((Instant::now(), figures.clone()));
            Some(figures)
        }
    }

    /// An instrument read off the figures: its name, description, unit and value.
    type Figure = (&'static str, &'static str, &'static str, fn(&Figures) -> i64);

    fn state(state: &str) -> KeyValue {
        KeyValue::new("toolledger.state", state.to_owned())
    }

    pub(super) fn observe(location: Location) {
        let reading = Arc::new(Reading { location, last: Mutex::new(None) });
        let meter = meter();
        let read = Arc::clone(&reading);
        meter
            .i64_observable_gauge("toolledger.operations")
            .with_description("Operations by state; unknown is processing with an ended lease.")
            .with_unit("{operation}")
            .with_callback(move |observer| {
                for (name, count) in read.figures().map(|f| f.by_state).unwrap_or_default() {
                    observer.observe(count, &[state(name)]);
                }
            })
            .build();
        let read = Arc::clone(&reading);
        meter
            .i64_observable_gauge("toolledger.outbox.events")
            .with_description("Outbox events by state; each moves with its operation.")
            .with_unit("{event}")
            .with_callback(move |observer| {
                for (name, count) in read.figures().map(|f| f.by_state).unwrap_or_default() {
                    observer.observe(count, &[state(crate::operate::event_state(name))]);
                }
            })
            .build();
        let gauges: [Figure; 3] = [
            (
                "toolledger.outbox.oldest_pending.age",
                "Seconds since the oldest pending operation last changed: the outbox's lag.",
                "s",
                |figures| figures.oldest_pending_age,
            ),
            (
                "toolledger.outbox.oldest_unknown.age",
                "Seconds since the oldest unknown operation's lease ended.",
                "s",
                |figures| figures.oldest_unknown_age,
            ),
            (
                "toolledger.dead_letters",
                "Dead events awaiting an operator.",
                "{event}",
                crate::operate::dead,
            ),
        ];
        for (name, description, unit, value) in gauges {
            let read = Arc::clone(&reading);
            meter
                .i64_observable_gauge(name)
                .with_description(description)
                .with_unit(unit)
                .with_callback(move |observer| {
                    if let Some(figures) = read.figures() {
                        observer.observe(value(&figures), &[]);
                    }
                })
                .build();
        }
        let counters: [Figure; 5] = [
            ("toolledger.claims", "Claims made: attempts, every operation ever.", "{claim}", |f| {
                f.attempts
            }),
            (
                "toolledger.lease_reclaims",
                "Expired leases taken over by another worker.",
                "{claim}",
                |f| f.lease_reclaims,
            ),
            (
                "toolledger.fenced_writes",
                "Worker writes refused because their lease was taken over.",
                "{write}",
                |f| f.fenced_writes,
            ),
            (
                "toolledger.reconciliations",
                "Unknown outcomes settled by a status query.",
                "{operation}",
                |f| f.reconciliations,
            ),
            (
                "toolledger.retired",
                "Finished operations retired by gc, each leaving a tombstone.",
                "{operation}",
                |f| f.tombstones,
            ),
        ];
        for (name, description, unit, value) in counters {
            let read = Arc::clone(&reading);
            meter
                .u64_observable_counter(name)
                .with_description(description)
                .with_unit(unit)
                .with_callback(move |observer| {
                    if let Some(figures) = read.figures() {
                        observer.observe(u64::try_from(value(&figures)).unwrap_or(0), &[]);
                    }
                })
                .build();
        }
    }
}
