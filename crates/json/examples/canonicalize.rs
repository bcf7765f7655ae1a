//! Reads a JSON file strictly and prints its RFC 8785 canonical form.
//!
//! ```text
//! cargo run -p toolledger-json --example canonicalize -- fixtures/proposal.json
//! ```
//!
//! On refusal it prints `{"error":{"code":…,"offset":…}}` on stderr and exits 2; the
//! input itself is never echoed.

#![allow(clippy::print_stderr, reason = "a command: refusals go to stderr")]

use std::process::ExitCode;

use toolledger_json::{Limits, canonicalize, check_v2_domain, parse_strict};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: canonicalize FILE");
        return ExitCode::from(2);
    };
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!("{{\"error\":{{\"code\":\"io_error\",\"offset\":null}}}}");
        return ExitCode::from(2);
    };
    let checked = parse_strict(&bytes, &Limits::default())
        .and_then(|value| check_v2_domain(&value).map(|()| value));
    match checked {
        Ok(value) => {
            println!("{}", canonicalize(&value));
            ExitCode::SUCCESS
        }
        Err(err) => {
            let offset = err.offset().map_or("null".to_owned(), |offset| offset.to_string());
            eprintln!("{{\"error\":{{\"code\":\"{}\",\"offset\":{offset}}}}}", err.code());
            ExitCode::from(2)
        }
    }
}
