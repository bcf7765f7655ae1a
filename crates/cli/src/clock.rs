//! The one place the command reads the wall clock.
//!
//! toolledger judges every call at the case's `clock.now` (or `--now`); the wall clock
//! is used only to name things uniquely: the default worker id and the demo's
//! temporary directory.

/// `<pid>-<nanoseconds since the epoch, hex>`: unique to this process and this moment.
pub(crate) fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!("{}-{nanos:x}", std::process::id())
}
