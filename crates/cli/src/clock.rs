//! The one place the command reads the wall clock.
//!
//! toolledger judges every call at the case's `clock.now` (or `--now`); the wall clock
//! is used to name things uniquely (the default worker id, the demo's temporary
//! directory) and by the dashboard, which shows ages as of now.

/// `<pid>-<nanoseconds since the epoch, hex>`: unique to this process and this moment.
pub(crate) fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!("{}-{nanos:x}", std::process::id())
}

/// Seconds since the epoch, now (0 if the clock is before it).
pub(crate) fn wall_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
}
