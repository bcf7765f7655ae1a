//! The crash drill's switch: `TOOLLEDGER_CRASH_AFTER_COMMIT=N` makes the process abort
//! right after its `N`th ledger commit, before anything of that commit is answered —
//! as a power cut or a `SIGKILL` at the worst moment would leave it.
//!
//! Every store calls [`committed`] after each commit of a ledger write: a commit point
//! of `docs/schema.md` (A, the claim, the stand-in's B, C, their batched forms in the
//! relay) or a group commit holding several of them. Creating or migrating the schema
//! is not counted. The switch is read once per process; unset, empty, `0` or not a
//! number, it does nothing, and the cost of a commit is one atomic add.
//!
//! With `TOOLLEDGER_CRASH_HOLD=1` as well, the thread that made that commit does not
//! abort: it writes `toolledger: holding after commit N` on stderr and waits there,
//! answering nothing, for its supervisor to send `SIGKILL` (the Python package's crash
//! tests do). Other threads go on meanwhile, so a drill that holds runs one thread.
//!
//! `cargo xtask crash` sets it on the processes it supervises to stop each of them at
//! every commit point in turn (`docs/reliability.md`). It is a drill, like `dispatch
//! --failure`: nothing in a deployment sets it.

use std::sync::{
    OnceLock,
    atomic::{AtomicU64, Ordering},
};

/// The environment variable that arms the switch.
pub const CRASH_AFTER_COMMIT_ENV: &str = "TOOLLEDGER_CRASH_AFTER_COMMIT";

/// The environment variable that makes the switch hold for a `SIGKILL` instead of
/// aborting.
pub const CRASH_HOLD_ENV: &str = "TOOLLEDGER_CRASH_HOLD";

/// Counts one ledger commit of this process and aborts it (or holds it, under
/// [`CRASH_HOLD_ENV`]) when that is the commit [`CRASH_AFTER_COMMIT_ENV`] names.
pub fn committed() {
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    static COMMITS: AtomicU64 = AtomicU64::new(0);
    let at = AT.get_or_init(|| {
        std::env::var(CRASH_AFTER_COMMIT_ENV)
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .filter(|at| *at > 0)
    });
    let Some(at) = *at else { return };
    if COMMITS.fetch_add(1, Ordering::Relaxed) + 1 != at {
        return;
    }
    if std::env::var_os(CRASH_HOLD_ENV).is_some_and(|hold| hold == "1") {
        #[allow(
            clippy::print_stderr,
            reason = "the drill's one line to its supervisor, which no deployment arms"
        )]
        {
            eprintln!("toolledger: holding after commit {at}");
        }
        loop {
            std::thread::park();
        }
    }
    std::process::abort();
}
