//! `toolledger-refundd --listen 127.0.0.1:PORT --db FILE [--tools FILE] [--threads N]
//! [--drop-percent P] [--fail-percent P] [--delay-ms N] [--jitter-ms N] [--answer-delay-ms N]
//! [--seed S] [--refuse-order ID]... [--refuse-resource VALUE]...`
//!
//! Prints `listening on 127.0.0.1:PORT` as its first line on stdout, then serves until
//! it is killed. `--tools FILE` is a JSON file of tool recipes (the crate's docs): the
//! tools served under `/tools/<tool>` besides `/refunds`. Exit 2 with one line on stderr
//! when the arguments, the recipe file (the line names the tool and what is wrong) or
//! the database file are bad.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

use toolledger_refundd::{Faults, Recipes, Service, bind};

const USAGE: &str = "usage: toolledger-refundd --listen 127.0.0.1:PORT --db FILE [--tools FILE] \
    [--threads N] [--drop-percent P] [--fail-percent P] [--delay-ms N] [--jitter-ms N] \
    [--answer-delay-ms N] [--seed S] [--refuse-order ID]... [--refuse-resource VALUE]...";

struct Options {
    listen: String,
    db: PathBuf,
    tools: Option<PathBuf>,
    threads: usize,
    faults: Faults,
}

fn options(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut listen, mut db, mut tools, mut threads) = (None, None, None, 8);
    let mut faults = Faults::default();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number =
            |text: String| text.parse::<u64>().map_err(|_| format!("{flag}: not a number"));
        let within = |text: String, max: u64| match text.parse::<u64>() {
            Ok(value) if value <= max => Ok(value),
            _ => Err(format!("{flag}: a whole number from 0 to {max}")),
        };
        match flag.as_str() {
            "--listen" => listen = Some(value()?),
            "--db" => db = Some(PathBuf::from(value()?)),
            "--tools" => tools = Some(PathBuf::from(value()?)),
            "--threads" => {
                threads = usize::try_from(number(value()?)?.clamp(1, 64)).unwrap_or(8);
            }
            "--drop-percent" => faults.drop_percent = within(value()?, 100)?,
            "--fail-percent" => faults.fail_percent = within(value()?, 100)?,
            "--delay-ms" => faults.delay_ms = within(value()?, 60_000)?,
            "--jitter-ms" => faults.jitter_ms = within(value()?, 60_000)?,
            "--answer-delay-ms" => faults.answer_delay_ms = within(value()?, 60_000)?,
            "--seed" => faults.seed = number(value()?)?,
            "--refuse-order" => faults.refuse_orders.push(value()?),
            "--refuse-resource" => faults.refuse_resources.push(value()?),
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Options {
        listen: listen.ok_or("--listen is required")?,
        db: db.ok_or("--db is required")?,
        tools,
        threads,
        faults,
    })
}

fn main() -> ExitCode {
    let options = match options(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            return fail(&format!("{message}\n{USAGE}"));
        }
    };
    // The recipes are judged before the database file is touched.
    let recipes = match options.tools.as_deref().map(recipes).transpose() {
        Ok(recipes) => recipes.unwrap_or_default(),
        Err(message) => return fail(&message),
    };
    let service = match Service::open_with_tools(&options.db, options.faults, recipes) {
        Ok(service) => Arc::new(service),
        Err(_) => return fail("the database file cannot be opened"),
    };
    let (server, bound) = match bind(&options.listen) {
        Ok(bound) => bound,
        Err(message) => return fail(&message),
    };
    println!("listening on {bound}");
    let _ = std::io::stdout().flush();
    match service.serve(&server, options.threads) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => fail("the database file cannot be opened"),
    }
}

/// The recipes of the file at `path`, or one line saying what is wrong with it.
fn recipes(path: &Path) -> Result<Recipes, String> {
    let at = path.display();
    let text = std::fs::read(path).map_err(|_| format!("--tools {at}: cannot be read"))?;
    let value =
        serde_json::from_slice(&text).map_err(|err| format!("--tools {at}: not JSON ({err})"))?;
    Recipes::from_json(&value).map_err(|message| format!("--tools {at}: {message}"))
}

/// One line on stderr, exit 2.
fn fail(message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "refundd: {message}");
    ExitCode::from(2)
}
