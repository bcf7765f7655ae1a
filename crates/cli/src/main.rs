//! `toolledger`: the command a person runs first and an operator scripts against.
//!
//! Thin over the engine: parse the command line, read the case and claims files, call
//! the engine, print one canonical JSON object and a newline, and exit 0 (PASS), 1
//! (BLOCK) or 2 (an error, reported on stderr as one JSON line with a stable code).
//! This is the only crate that knows about paths, stdout and exit codes.
#![allow(clippy::print_stderr, reason = "a command: errors go to stderr as one JSON line")]

mod args;
mod claims;
mod clock;
mod demo;
mod run;

use std::process::ExitCode;

fn main() -> ExitCode {
    // A panic is a bug, but it still answers in the documented shape: no panic message,
    // no location, exit 2.
    std::panic::set_hook(Box::new(|_| {
        eprintln!("{}", run::error_line("INTERNAL_ERROR", "an internal error stopped the command"));
        std::process::exit(2);
    }));
    let outcome = run::run(std::env::args_os().collect());
    print!("{}", outcome.stdout);
    eprint!("{}", outcome.stderr);
    ExitCode::from(outcome.code)
}
