//! One command, from arguments to an [`Outcome`]: what to print and the exit code.
//!
//! Nothing here prints or exits, so the demo can run commands and read their answers.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use clap::{
    FromArgMatches,
    error::{ContextKind, ContextValue, ErrorKind},
};
use serde_json::{Value, json};
use toolledger::read_bounded;
use toolledger::{
    Config, ContractError, EngineError, ErrorCode, HostCall, Identifier, Ledger, Location,
    Migrated, RefundOrder, Registry, Reply, StatusRef, StoreClock, ToolSpec, Waits,
    drill::FailurePoint, load_case,
};
use toolledger_json::{Limits, canonicalize};

use crate::{
    args::{Cli, Command, DispatchFailure, DownstreamArgs, ProcessFailure, StoreClockArg},
    claims::Claims,
    wire::{Chosen, Wire},
};

/// What a command printed and how it exits.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) code: u8,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Outcome {
    fn error(code: &str, message: &str) -> Outcome {
        Outcome {
            code: 2,
            stdout: String::new(),
            stderr: format!("{}\n", error_line(code, message)),
        }
    }

    /// The printed JSON answer, parsed back (for the demo and tests).
    pub(crate) fn answer(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or(Value::Null)
    }
}

/// `{"error":{"code":C,"message":M}}` in canonical form.
pub(crate) fn error_line(code: &str, message: &str) -> String {
    canonicalize(&json!({"error": {"code": code, "message": message}}))
}

/// A failure that ends the command with exit 2.
pub(crate) struct Failure {
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

/// The command line's code for `code`: its role resolver is the claims file, so a
/// resolver failure is the claims file's (`CLAIMS_IO_ERROR`, `CLAIMS_INVALID`).
pub(crate) fn cli_code(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::RolesUnavailable => ErrorCode::ClaimsIoError.as_str(),
        ErrorCode::RolesInvalid => ErrorCode::ClaimsInvalid.as_str(),
        other => other.as_str(),
    }
}

impl From<toolledger::Error> for Failure {
    fn from(err: toolledger::Error) -> Failure {
        Failure { code: cli_code(err.code()), message: err.to_string() }
    }
}

impl From<EngineError> for Failure {
    fn from(err: EngineError) -> Failure {
        Failure { code: cli_code(err.code()), message: err.to_string() }
    }
}

impl From<ContractError> for Failure {
    fn from(err: ContractError) -> Failure {
        Failure { code: err.code().as_str(), message: err.to_string() }
    }
}

fn usage(message: String) -> Failure {
    Failure { code: "USAGE_ERROR", message }
}

/// Runs the command `argv` (program name first).
pub(crate) fn run(argv: Vec<OsString>) -> Outcome {
    if std::env::var_os("TOOLLEDGER_TEST_PANIC").is_some() {
        // A deliberate fault, so tests can prove the panic hook's answer.
        panic!("TOOLLEDGER_TEST_PANIC is set");
    }
    let cli = match crate::args::command()
        .try_get_matches_from(argv)
        .and_then(|matches| Cli::from_arg_matches(&matches))
    {
        Ok(cli) => cli,
        Err(err) => {
            return match err.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    Outcome { code: 0, stdout: err.to_string(), stderr: String::new() }
                }
                // Bare `toolledger`: the help for a person, then the error line a
                // machine caller reads (the last line of stderr, as for every error).
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => Outcome {
                    code: 2,
                    stdout: String::new(),
                    stderr: format!(
                        "{}\n{}\n",
                        err.render().to_string().trim_end(),
                        error_line("USAGE_ERROR", &usage_message(&err))
                    ),
                },
                _ => Outcome::error("USAGE_ERROR", &usage_message(&err)),
            };
        }
    };
    let settings = match Settings::of(&cli) {
        Ok(settings) => settings,
        Err(failure) => return Outcome::error(failure.code, &failure.message),
    };
    match &cli.command {
        Command::Demo => return crate::demo::demo(),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut crate::args::command(), "toolledger", &mut script);
            return Outcome {
                code: 0,
                stdout: String::from_utf8_lossy(&script).into_owned(),
                stderr: String::new(),
            };
        }
        _ => {}
    }
    match execute(&cli.command, &settings) {
        Ok(Printed::Reply(reply)) => {
            let code = if reply.outcome().is_done() { 0 } else { 1 };
            printed(&settings, reply.package(), code)
        }
        Ok(Printed::Package(package, passed)) => {
            printed(&settings, &package, if passed { 0 } else { 1 })
        }
        Ok(Printed::Text(text)) => Outcome { code: 0, stdout: text, stderr: String::new() },
        Err(failure) => Outcome::error(failure.code, &failure.message),
    }
}

/// The shared options of one command, wherever they were written: after the command's
/// name, or before it (as versions before 0.2 wrote them).
pub(crate) struct Settings {
    db: Option<String>,
    busy_timeout_ms: Option<u64>,
    store_clock: Option<StoreClockArg>,
    case: Option<PathBuf>,
    claims: Option<PathBuf>,
    pretty: bool,
}

impl Settings {
    /// Merges the options written before the command into the command's own, refusing
    /// one the command does not take (rather than ignoring it: `--db` given to `demo`
    /// would otherwise look as if it chose the demo's store) and one written twice.
    fn of(cli: &Cli) -> Result<Settings, Failure> {
        let command = cli.command.name();
        let takes = cli.command.takes();
        let before = [
            ("--db", cli.ledger.db.is_some(), takes.ledger.is_some()),
            ("--busy-timeout-ms", cli.ledger.busy_timeout_ms.is_some(), takes.ledger.is_some()),
            ("--store-clock", cli.clock.store_clock.is_some(), takes.clock.is_some()),
            ("--case", cli.case.case.is_some(), takes.case.is_some()),
            ("--claims", cli.case.claims.is_some(), takes.case.is_some()),
            ("--pretty", cli.output.pretty, takes.output.is_some()),
        ];
        if let Some((name, ..)) = before.iter().find(|(_, given, taken)| *given && !*taken) {
            return Err(usage(format!("{command} does not take {name}")));
        }
        fn one<T: Clone>(
            name: &str,
            before: &Option<T>,
            after: Option<&Option<T>>,
        ) -> Result<Option<T>, Failure> {
            match (before, after.and_then(Option::as_ref)) {
                (Some(_), Some(_)) => {
                    Err(usage(format!("{name} is given both before and after the command")))
                }
                (Some(value), None) | (None, Some(value)) => Ok(Some(value.clone())),
                (None, None) => Ok(None),
            }
        }
        let pretty_after = takes.output.is_some_and(|output| output.pretty);
        if cli.output.pretty && pretty_after {
            return Err(usage("--pretty is given both before and after the command".to_owned()));
        }
        Ok(Settings {
            db: one("--db", &cli.ledger.db, takes.ledger.map(|ledger| &ledger.db))?,
            busy_timeout_ms: one(
                "--busy-timeout-ms",
                &cli.ledger.busy_timeout_ms,
                takes.ledger.map(|ledger| &ledger.busy_timeout_ms),
            )?,
            store_clock: one(
                "--store-clock",
                &cli.clock.store_clock,
                takes.clock.map(|clock| &clock.store_clock),
            )?,
            case: one("--case", &cli.case.case, takes.case.map(|case| &case.case))?,
            claims: one("--claims", &cli.case.claims, takes.case.map(|case| &case.claims))?,
            pretty: cli.output.pretty || pretty_after,
        })
    }

    fn busy_timeout(&self) -> Duration {
        Duration::from_millis(self.busy_timeout_ms.unwrap_or(toolledger::DEFAULT_BUSY_TIMEOUT_MS))
    }
}

/// What a command answered: the facade's reply to a call, or another package (audit,
/// migrate) and whether it passed.
pub(crate) enum Printed {
    Reply(Reply),
    Package(Value, bool),
    /// Text printed as it is (list's lines, metrics' exposition), exit 0.
    Text(String),
}

fn printed(settings: &Settings, package: &Value, code: u8) -> Outcome {
    let text = if settings.pretty {
        serde_json::to_string_pretty(package).unwrap_or_default()
    } else {
        canonicalize(package)
    };
    Outcome { code, stdout: format!("{text}\n"), stderr: String::new() }
}

/// A usage message that names the option but never echoes a value.
fn usage_message(err: &clap::Error) -> String {
    let option = match err.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(text)) => option_name(text),
        Some(ContextValue::Strings(texts)) => texts.first().and_then(|text| option_name(text)),
        _ => None,
    };
    let option = option.as_deref().unwrap_or("an argument");
    let message = match err.kind() {
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            // Only the reasons of this command's own parsers are repeated: clap's may
            // quote the value.
            let reason = std::error::Error::source(err)
                .map(ToString::to_string)
                .filter(|reason| crate::args::NOW_REASONS.contains(&reason.as_str()));
            match reason {
                Some(reason) => format!("invalid value for {option}: {reason}"),
                None => format!("invalid value for {option}"),
            }
        }
        ErrorKind::MissingRequiredArgument => format!("missing required option {option}"),
        ErrorKind::UnknownArgument if !is_option(err) => {
            "unexpected positional argument: no command takes one".to_owned()
        }
        ErrorKind::UnknownArgument => format!("unknown option {option}"),
        ErrorKind::InvalidSubcommand => "unknown command".to_owned(),
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            format!("missing command: one of {}", command_names().join(", "))
        }
        _ => format!("invalid use of {option}"),
    };
    // clap's suggestion names a command or an option that exists, never the input.
    let suggestion =
        match (err.get(ContextKind::SuggestedSubcommand), err.get(ContextKind::SuggestedArg)) {
            (Some(ContextValue::String(name)), _) | (_, Some(ContextValue::String(name))) => {
                Some(name.clone())
            }
            (Some(ContextValue::Strings(names)), _) | (_, Some(ContextValue::Strings(names))) => {
                names.first().cloned()
            }
            _ => None,
        };
    match suggestion.filter(|name| known_name(name)) {
        Some(name) => format!("{message}; did you mean '{name}'?"),
        None => message,
    }
}

/// Every command's name, in the order of `--help`.
fn command_names() -> Vec<String> {
    crate::args::command().get_subcommands().map(|command| command.get_name().to_owned()).collect()
}

/// Whether `name` is a command or an option of the command line (`--name`), so a
/// suggestion can be repeated without repeating input.
fn known_name(name: &str) -> bool {
    let command = crate::args::command();
    let mut commands = std::iter::once(&command).chain(command.get_subcommands());
    commands.any(|command| {
        command.get_name() == name
            || command.get_arguments().any(|arg| {
                arg.get_long().is_some_and(|long| name.strip_prefix("--") == Some(long))
                    || arg.get_all_aliases().is_some_and(|aliases| {
                        aliases.iter().any(|alias| name.strip_prefix("--") == Some(*alias))
                    })
            })
    })
}

/// Whether the argument clap refused was written as an option (`-x`, `--name`).
fn is_option(err: &clap::Error) -> bool {
    match err.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(text)) => text.starts_with('-'),
        Some(ContextValue::Strings(texts)) => texts.iter().any(|text| text.starts_with('-')),
        _ => true,
    }
}

/// `--now <T>` → `--now`; anything not shaped like an option name → `None`.
fn option_name(text: &str) -> Option<String> {
    let name: String = text
        .split([' ', '='])
        .next()
        .unwrap_or_default()
        .chars()
        .take_while(|ch| ch.is_ascii_alphanumeric() || *ch == '-' || *ch == '_')
        .take(40)
        .collect();
    (name.starts_with('-') && name.len() > 1).then_some(name)
}

fn execute(command: &Command, settings: &Settings) -> Result<Printed, Failure> {
    // One bound for the whole command, from here: the open and every transaction.
    let waits = Waits::total(settings.busy_timeout());
    let db = Location::parse(settings.db.as_deref().unwrap_or("toolledger.sqlite3"));
    let clock = match settings.store_clock {
        Some(StoreClockArg::Caller) => StoreClock::Caller,
        Some(StoreClockArg::Database) | None => StoreClock::Database,
    };
    match command {
        Command::Audit { .. } => {
            let audit = toolledger::audit_with(&db, waits)?;
            Ok(Printed::Package(audit.package(), audit.passed()))
        }
        Command::Migrate { downstream, .. } => migrate(&db, downstream, waits),
        Command::List { state, older_than, limit, show_arguments, now, .. } => {
            let filter = toolledger::ListFilter {
                state: state.as_deref(),
                older_than: *older_than,
                limit: usize::try_from(*limit).unwrap_or(100),
                ..Default::default()
            };
            let listed = toolledger::list(&db, &filter, *show_arguments, *now)?;
            let lines: String = listed
                .iter()
                .map(|listed| format!("{}\n", canonicalize(&toolledger::listed_json(listed))))
                .collect();
            Ok(Printed::Text(lines))
        }
        Command::Show { status_ref, show_arguments, .. } => {
            let Ok(status_ref) = StatusRef::new(status_ref) else {
                return Ok(Printed::Reply(Reply::not_found()));
            };
            match toolledger::show(&db, &status_ref, *show_arguments)? {
                Some(shown) => Ok(Printed::Package(shown, true)),
                None => Ok(Printed::Reply(Reply::not_found())),
            }
        }
        Command::Requeue { status_ref, reason, now, .. } => {
            let Ok(status_ref) = StatusRef::new(status_ref) else {
                return Ok(Printed::Reply(Reply::not_found()));
            };
            kept_reason(reason)?;
            let requeued = toolledger::requeue(&db, &status_ref, reason, *now)?;
            Ok(gated(toolledger::requeue_package(&status_ref, &requeued)))
        }
        Command::Resolve { status_ref, receipt, reason, now, downstream, .. } => {
            kept_reason(reason)?;
            let result = receipt.as_deref().map(receipt_file).transpose()?;
            let config = configured(downstream)?;
            let mut tools = tools_of(config.as_ref())?;
            // It settles what exists; it never creates a ledger.
            drop(toolledger::Store::open_existing(&db, waits, clock)?);
            let Ok(status_ref) = StatusRef::new(status_ref) else {
                return Ok(Printed::Reply(Reply::not_found()));
            };
            // A tool of the MCP gateway is learned from its upstream, as the gateway does.
            let mcp = started(config.as_ref())?;
            let chosen = match &mcp {
                Some(upstreams) => {
                    tools.extend(upstreams.tools().iter().cloned());
                    Chosen::Mcp(Arc::clone(upstreams))
                }
                None => Chosen::from_args(downstream, toolledger::Faults::default(), config)?,
            };
            let evidence = match result {
                None => toolledger::Evidence::NotHappened,
                Some(result) => {
                    let tool = toolledger::show(&db, &status_ref, false)?.and_then(|shown| {
                        shown.get("tool").and_then(Value::as_str).map(str::to_owned)
                    });
                    let output = match (&mcp, tool) {
                        (Some(upstreams), Some(tool)) => {
                            upstreams.output_of(&tool, &result).unwrap_or(result)
                        }
                        _ => result,
                    };
                    toolledger::Evidence::Output(output)
                }
            };
            let builder =
                tools.into_iter().fold(Ledger::builder(&db), toolledger::LedgerBuilder::tool);
            let ledger = builder
                .waits(waits)
                .store_clock(clock)
                .open(chosen.open(&db)?, claims_of(settings)?)?;
            let resolution = ledger.resolve(&status_ref, &evidence, reason, *now)?;
            Ok(gated(toolledger::resolve_package(&status_ref, &resolution)))
        }
        Command::Metrics { now, .. } => Ok(Printed::Text(toolledger::metrics(&db, *now)?)),
        Command::Gc { older_than_days, now, .. } => {
            let retired = toolledger::gc(&db, *older_than_days, *now)?;
            Ok(Printed::Package(json!({"gate": "PASS", "code": "OK", "retired": retired}), true))
        }
        Command::Relay {
            once,
            poll_ms,
            concurrency,
            lease_seconds,
            batch,
            log_format,
            now,
            metrics_listen,
            max_attempts,
            simulate_unavailable,
            simulate_delay_ms,
            simulate_seed,
            downstream,
            ..
        } => {
            let config = configured(downstream)?;
            let mut tools = tools_of(config.as_ref())?;
            // A configuration with an [mcp] table: the gateway's upstreams, started, and
            // the relay works the gateway's operations (docs/mcp.md).
            let mcp = started(config.as_ref())?;
            if let Some(upstreams) = &mcp {
                tools.extend(upstreams.tools().iter().cloned());
            }
            // Without a case file, each event's rules judge an empty business context:
            // a definition's precondition is asked of its service per event, and the
            // refund tool's rules, which read the case's orders, refuse.
            let (context, claims) = match settings.case {
                Some(_) => {
                    let (case, claims) = inputs(settings, None, &registry_of(&tools))?;
                    (case.business_state, claims)
                }
                None => (json!({}), claims_of(settings)?),
            };
            // A relay runs for long: every wait is bounded, but there is no overall deadline.
            let per_wait = settings.busy_timeout();
            let tools = tools.into_iter().map(|tool| match max_attempts {
                Some(max) => tool.with_max_attempts(*max),
                None => tool,
            });
            let mut relay = tools
                .fold(toolledger::Relay::new(&db), toolledger::Relay::tool)
                .store_clock(clock)
                .concurrency(usize::try_from(*concurrency).unwrap_or(1))
                .batch(usize::try_from(*batch).unwrap_or(32))
                .lease_seconds(match &mcp {
                    Some(upstreams) => (*lease_seconds).max(upstreams.lease_seconds()),
                    None => *lease_seconds,
                })
                .poll(Duration::from_millis(*poll_ms))
                .waits(Waits { busy_timeout: per_wait, deadline: None });
            if let Some(now) = now {
                relay = relay.at(*now);
            }
            if mcp.is_some() {
                relay = relay.profile(toolledger_mcp::Upstreams::profile());
            }
            {
                let faults = toolledger::Faults {
                    unavailable_percent: *simulate_unavailable,
                    delay_ms: *simulate_delay_ms,
                    seed: *simulate_seed,
                };
                let options = crate::relay::Options {
                    once: *once,
                    format: *log_format,
                    metrics_listen: *metrics_listen,
                    downstream: match mcp {
                        Some(upstreams) => Chosen::Mcp(upstreams),
                        None => Chosen::from_args(downstream, faults, config)?,
                    },
                };
                crate::otel::observe(&db);
                crate::relay::run(&relay, &db, claims, &context, &options)
            }
        }
        Command::Serve {
            listen,
            allow_remote,
            allow_actions,
            token_file,
            show_arguments,
            sample_seconds,
            now,
            config,
            ..
        } => {
            crate::otel::observe(&db);
            crate::serve::run(
                &db,
                crate::serve::Options {
                    tools: crate::tools::rows(Config::discover(config.as_deref())?.as_ref()),
                    listen: *listen,
                    allow_remote: *allow_remote,
                    allow_actions: *allow_actions,
                    token_file: token_file.clone(),
                    show_arguments: *show_arguments,
                    sample_seconds: *sample_seconds,
                    now: *now,
                },
            )
        }
        Command::Tools { action } => crate::tools::run(action),
        Command::Mcp { config, listen, .. } => {
            let options = toolledger_mcp::Options {
                config: config.clone(),
                ledger: settings.db.clone().unwrap_or_else(|| "toolledger.sqlite3".to_owned()),
                busy_timeout_ms: settings.busy_timeout_ms,
                listen: *listen,
            };
            crate::otel::observe(&Location::parse(&options.ledger));
            toolledger_mcp::serve(&options)
                .map_err(|err| Failure { code: cli_code(err.code()), message: err.to_string() })?;
            Ok(Printed::Text(String::new()))
        }
        Command::Demo | Command::Completions { .. } => {
            Err(usage("this command runs on its own".to_owned()))
        }
        Command::Dispatch { now, failure, downstream, .. } => {
            let config = configured(downstream)?;
            let tools = tools_of(config.as_ref())?;
            let (case, claims) = inputs(settings, *now, &registry_of(&tools))?;
            let worker = default_worker();
            let ledger = open(&db, clock, claims, waits, downstream, config, tools, &worker)?;
            let reply = match failure {
                // A crash right after commit A: the host learns nothing, so the drill
                // answers what a host must assume, OUTCOME_UNKNOWN with the ref.
                Some(DispatchFailure::IntentCommit) => ledger.enqueue_loaded(&case)?.as_if_lost(),
                Some(DispatchFailure::Claim) => {
                    ledger.downstream().switch().arm(FailurePoint::AfterClaim);
                    ledger.dispatch_loaded(&case)?
                }
                Some(DispatchFailure::DownstreamCommit) => {
                    ledger.downstream().switch().arm(FailurePoint::AfterDownstreamCommit);
                    ledger.dispatch_loaded(&case)?
                }
                None => ledger.dispatch_loaded(&case)?,
            };
            Ok(Printed::Reply(reply))
        }
        Command::Enqueue { now, downstream, .. } => {
            let config = configured(downstream)?;
            let tools = tools_of(config.as_ref())?;
            let (case, claims) = inputs(settings, *now, &registry_of(&tools))?;
            let worker = default_worker();
            let ledger = open(&db, clock, claims, waits, downstream, config, tools, &worker)?;
            Ok(Printed::Reply(ledger.enqueue_loaded(&case)?))
        }
        Command::Process { status_ref, now, worker_id, failure, downstream, .. } => {
            let worker = match worker_id {
                Some(text) => Identifier::new(text)
                    .map_err(|_| usage("invalid value for --worker-id".to_owned()))?,
                None => default_worker(),
            };
            let config = configured(downstream)?;
            let tools = tools_of(config.as_ref())?;
            let (case, claims) = inputs(settings, *now, &registry_of(&tools))?;
            // A worker takes an operation that exists; it never creates a ledger.
            drop(toolledger::Store::open_existing(&db, waits, clock)?);
            let Ok(status_ref) = StatusRef::new(status_ref) else {
                return Ok(Printed::Reply(Reply::not_found()));
            };
            let ledger = open(&db, clock, claims, waits, downstream, config, tools, &worker)?;
            match failure {
                Some(ProcessFailure::Claim) => {
                    ledger.downstream().switch().arm(FailurePoint::AfterClaim);
                }
                Some(ProcessFailure::DownstreamCommit) => {
                    ledger.downstream().switch().arm(FailurePoint::AfterDownstreamCommit);
                }
                None => {}
            }
            Ok(Printed::Reply(ledger.process_loaded(&status_ref, &case)?))
        }
        Command::Status { status_ref, now, downstream, .. } => {
            let config = configured(downstream)?;
            let tools = tools_of(config.as_ref())?;
            let (case, claims) = inputs(settings, *now, &registry_of(&tools))?;
            // A status query reconciles what exists; it never creates a ledger.
            drop(toolledger::Store::open_existing(&db, waits, clock)?);
            let Ok(status_ref) = StatusRef::new(status_ref) else {
                return Ok(Printed::Reply(Reply::not_found()));
            };
            let worker = default_worker();
            let ledger = open(&db, clock, claims, waits, downstream, config, tools, &worker)?;
            Ok(Printed::Reply(ledger.status_loaded(&case, &status_ref)?))
        }
    }
}

/// The upstreams of the configuration's `[mcp]` table, started; `None` without one.
fn started(config: Option<&Config>) -> Result<Option<Arc<toolledger_mcp::Upstreams>>, Failure> {
    let Some(config) = config else { return Ok(None) };
    Ok(toolledger_mcp::Upstreams::start(config)
        .map_err(|err| Failure { code: cli_code(err.code()), message: err.to_string() })?
        .map(Arc::new))
}

/// `--reason` as an operator action keeps it, else the `USAGE_ERROR` that says why.
fn kept_reason(reason: &str) -> Result<(), Failure> {
    if toolledger::operator_reason(reason).is_none() {
        return Err(usage(format!(
            "invalid value for --reason: 1 to {} bytes of text without control characters",
            toolledger::REASON_BYTES_MAX
        )));
    }
    Ok(())
}

/// The bytes of an input file (`what`: the case, a receipt), bounded, a regular file.
fn input_file(path: &Path, what: &str) -> Result<Vec<u8>, Failure> {
    read_bounded(path, Limits::default().size_bytes_max).map_err(|why| Failure {
        code: match why {
            toolledger::Unreadable::TooLarge { .. } => "FIXTURE_INVALID",
            _ => "FIXTURE_IO_ERROR",
        },
        message: format!("the {what} file {}", why.reason()),
    })
}

/// The JSON of `resolve --receipt`, read as a case file is.
fn receipt_file(path: &Path) -> Result<Value, Failure> {
    let bytes = input_file(path, "receipt")?;
    toolledger_json::parse_strict(&bytes, &Limits::default()).map_err(|err| Failure {
        code: "FIXTURE_INVALID",
        message: format!("the receipt file is not valid JSON: {err}"),
    })
}

/// An operator action's package, as the facade renders it for every door: it passed
/// when its gate is PASS.
fn gated(package: Value) -> Printed {
    let passed = package["gate"] == "PASS";
    Printed::Package(package, passed)
}

/// The configuration `--config` (or the environment, or the working directory) names.
fn configured(downstream: &DownstreamArgs) -> Result<Option<Config>, Failure> {
    Ok(Config::discover(downstream.config.as_deref())?)
}

/// The tools a command serves: the configuration's, or the built-in refund tool.
fn tools_of(config: Option<&Config>) -> Result<Vec<ToolSpec>, Failure> {
    match config {
        Some(config) => Ok(config.tool_specs()?),
        None => Ok(vec![RefundOrder::default().tool()]),
    }
}

fn registry_of(tools: &[ToolSpec]) -> Registry {
    Registry::new(tools.to_vec(), toolledger::builtin_profiles())
}

/// The command line's ledger: its tools, and the simulated downstream, the
/// configuration's services, or the one `--downstream` names.
#[allow(clippy::too_many_arguments, reason = "each is one of the command's own settings")]
fn open(
    db: &Location,
    clock: StoreClock,
    claims: Claims,
    waits: Waits,
    downstream: &DownstreamArgs,
    config: Option<Config>,
    tools: Vec<ToolSpec>,
    worker: &Identifier,
) -> Result<Ledger<Wire, Claims>, Failure> {
    let wire = Chosen::from_args(downstream, toolledger::Faults::default(), config)?.open(db)?;
    let builder = tools.into_iter().fold(Ledger::builder(db), toolledger::LedgerBuilder::tool);
    Ok(builder.waits(waits).store_clock(clock).worker_id(worker.as_str()).open(wire, claims)?)
}

/// `migrate`: upgrades the store, naming the downstream its older operations belong to.
fn migrate(db: &Location, downstream: &str, waits: Waits) -> Result<Printed, Failure> {
    let identity = crate::wire::identity(downstream, "--downstream")?;
    let package = match toolledger::migrate(db, &identity, waits)? {
        Migrated::Current => json!({
            "gate": "PASS",
            "code": "OK",
            "migrated": false,
            "schema": toolledger::SCHEMA_ID,
        }),
        Migrated::Upgraded { from, to, backup, operations } => json!({
            "gate": "PASS",
            "code": "OK",
            "migrated": true,
            "from_version": from,
            "to_version": to,
            "schema": toolledger::SCHEMA_ID,
            "operations": operations,
            // The backup sits beside the store; its name alone, never a path (PostgreSQL
            // migrates in one transaction and makes none).
            "backup_file": backup.as_deref().and_then(std::path::Path::file_name)
                .map(|name| name.to_string_lossy().into_owned()),
        }),
    };
    Ok(Printed::Package(package, true))
}

/// Reads and validates the case and claims files, before the store is opened: a bad
/// case creates no database. Each is read at most one byte past the parser's limit.
fn inputs(
    settings: &Settings,
    now: Option<i64>,
    registry: &Registry,
) -> Result<(HostCall, Claims), Failure> {
    let path: &Path = settings
        .case
        .as_deref()
        .ok_or_else(|| usage("missing required option --case".to_owned()))?;
    let bytes = input_file(path, "case")?;
    let case = load_case(&bytes, registry, now)?;
    Ok((case, claims_of(settings)?))
}

/// The claims file, checked before the store is opened.
fn claims_of(settings: &Settings) -> Result<Claims, Failure> {
    let claims = settings.claims.clone().map_or(Claims::None, Claims::File);
    claims.check().map_err(|why| Failure {
        code: match why {
            crate::claims::Refused::Unreadable(toolledger::Unreadable::TooLarge { .. }) => {
                "CLAIMS_INVALID"
            }
            crate::claims::Refused::Unreadable(_) => "CLAIMS_IO_ERROR",
            crate::claims::Refused::Invalid(ref err) => err.code().as_str(),
        },
        message: match why {
            crate::claims::Refused::Unreadable(why) => format!("the claims file {}", why.reason()),
            crate::claims::Refused::Invalid(err) => err.to_string(),
        },
    })?;
    Ok(claims)
}

/// A worker id unique to this process: its pid and the instant it started.
fn default_worker() -> Identifier {
    Identifier::new(&format!("worker-{}", crate::clock::unique_suffix()))
        .unwrap_or_else(|_| unreachable!("digits, '-' and hex form an identifier"))
}
