//! `toolledger`: the command a person runs first and an operator scripts against.
//!
//! Thin over the facade: parse the command line, read the case and claims files, hand
//! the loaded call to the facade, print one canonical JSON object and a newline, and exit 0 (PASS), 1
//! (BLOCK) or 2 (an error, reported on stderr as one JSON line with a stable code).
//! This is the only crate that knows about paths, stdout and exit codes.
#![allow(clippy::print_stderr, reason = "a command: errors go to stderr as one JSON line")]

mod args;
mod claims;
mod clock;
mod demo;
mod html;
mod otel;
mod relay;
mod run;
mod serve;
mod tools;
mod wire;

use std::{
    fs::File,
    io::Write,
    os::fd::AsFd,
    process::ExitCode,
    sync::{Arc, atomic::AtomicBool},
};

fn main() -> ExitCode {
    // A panic is a bug, but it still answers in the documented shape: no panic message,
    // no location, exit 2. Writing that line may itself fail (stderr closed or full):
    // the failure is ignored, never a second panic.
    std::panic::set_hook(Box::new(|_| {
        let line = run::error_line("INTERNAL_ERROR", "an internal error stopped the command");
        let _ = writeln!(std::io::stderr(), "{line}");
        std::process::exit(2);
    }));
    // A file-size limit (`ulimit -f`) sends SIGXFSZ, whose default action kills the
    // process without an answer, possibly after an intent was accepted. Caught, the
    // write fails with EFBIG instead and is answered like any other I/O error.
    if signal_hook::flag::register(signal_hook::consts::SIGXFSZ, Arc::new(AtomicBool::new(false)))
        .is_err()
    {
        return failed("INTERNAL_ERROR", "the command could not set up its signal handling");
    }
    // The answer is written through a duplicate of the standard output descriptor, so
    // every write error is seen (Rust's own stdout treats EBADF as a sink). A descriptor
    // closed by the caller was already reopened on /dev/null by Rust's runtime; one
    // that cannot even be duplicated is refused before anything is done.
    let mut stdout = match std::io::stdout().as_fd().try_clone_to_owned() {
        Ok(fd) => File::from(fd),
        Err(_) => {
            return failed("USAGE_ERROR", "standard output is unusable: no answer could be given");
        }
    };
    // Spans are exported only when the standard OTEL_* variables ask; a request this
    // command cannot honour is refused before anything is done.
    let exporting = match otel::start(&std::env::vars().collect()) {
        Ok(exporting) => exporting,
        Err(message) => return failed("USAGE_ERROR", &message),
    };
    // A caller's trace, handed over in the environment as OpenTelemetry's carriers
    // name it (TRACEPARENT, TRACESTATE): every call of this command continues it.
    let handed = std::env::var("TRACEPARENT").ok().and_then(|parent| {
        toolledger::TraceContext::parse(&parent, &std::env::var("TRACESTATE").unwrap_or_default())
    });
    let entered = handed.as_ref().map(toolledger::TraceContext::enter);
    let outcome = run::run(std::env::args_os().collect());
    drop(entered);
    // The last call's spans leave before the process does.
    drop(exporting);
    let written = stdout.write_all(outcome.stdout.as_bytes()).and_then(|()| stdout.flush());
    let _ = std::io::stderr().write_all(outcome.stderr.as_bytes());
    if written.is_err() && !outcome.stdout.is_empty() {
        // The answer is lost, and the command may have accepted an intent or caused the
        // side effect: exit 1 ("not known to the caller: query it"), never 0 (which
        // promises an answer on stdout) and never 2 (which says nothing happened).
        return ExitCode::from(1);
    }
    ExitCode::from(outcome.code)
}

/// Exit 2 with one JSON error line, written on a best-effort basis.
fn failed(code: &str, message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "{}", run::error_line(code, message));
    ExitCode::from(2)
}
