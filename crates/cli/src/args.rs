//! The command line (README and `toolledger --help`), with clap's derive API.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  PASS: the operation succeeded (fresh, receipt_reconciled or local_replay), or the audit passed
  1  BLOCK: a business answer on stdout, e.g. OUTCOME_UNKNOWN, IDEMPOTENCY_CONFLICT, NOT_FOUND,
     LEASE_HELD, DOWNSTREAM_REFUSED, RECEIPT_QUARANTINED, DOWNSTREAM_MISMATCH, KEY_RETIRED,
     AUDIT_FAILED, or ACCEPTED (enqueue: accepted, nothing sent yet).
     OUTCOME_UNKNOWN means the side effect may have happened: query it with `status`, never
     retry it under a new key
  2  error, and nothing was accepted: stdout is empty and stderr holds one line
     {\"error\":{\"code\":...,\"message\":...}} with code FIXTURE_IO_ERROR, FIXTURE_INVALID,
     CLAIMS_IO_ERROR, CLAIMS_INVALID, STORE_ERROR, STORE_BUSY, STORE_NOT_FOUND,
     SCHEMA_UNSUPPORTED, STORE_CONTRACT_VIOLATION, USAGE_ERROR or INTERNAL_ERROR

Once a command has accepted an intent, no later failure is exit 2: it is OUTCOME_UNKNOWN
(exit 1) with the status_ref. An answer that cannot be written to stdout is exit 1 with
nothing printed: query the status, never retry under a new key.";

/// Durable idempotency, outbox and receipt reconciliation for an agent's side-effecting
/// tool calls, on one SQLite file or one PostgreSQL database (--db postgres://…).
///
/// Every command prints exactly one JSON object (RFC 8785 canonical form) and a newline.
/// toolledger is not exactly-once: it never guesses an unknown outcome, and the
/// downstream must be idempotent on the scope it is handed.
///
/// The downstream of this command is a SIMULATION unless --downstream names a service:
/// a stand-in refund API (toolledger-stand-in@1) that records its receipts in the ledger
/// itself, for trying the contract. No money moves. Operations a host accepted for its own
/// downstream are refused here (DOWNSTREAM_MISMATCH); hosts embed the `toolledger`
/// library with their own downstream.
///
/// `toolledger help COMMAND` (or `toolledger COMMAND --help`) lists the options each
/// command takes.
#[derive(Debug, Parser)]
#[command(name = "toolledger", version, after_help = EXIT_CODES, arg_required_else_help = true)]
pub(crate) struct Cli {
    // The shared options are also accepted before the command, as versions before 0.2
    // wrote them (`toolledger --db L dispatch`). They are hidden here: each command's
    // help lists the ones it takes, and one it does not take is refused.
    #[command(flatten)]
    pub(crate) ledger: LedgerArgs,
    #[command(flatten)]
    pub(crate) clock: ClockArgs,
    #[command(flatten)]
    pub(crate) case: CaseArgs,
    #[command(flatten)]
    pub(crate) output: OutputArgs,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The ledger's location and how long to wait for it.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct LedgerArgs {
    /// The ledger: a SQLite file's path (or sqlite:PATH) [default: toolledger.sqlite3],
    /// or a PostgreSQL database's URL (postgres://USER@HOST:PORT/DB)
    #[arg(long, value_name = "PATH|URL")]
    pub(crate) db: Option<String>,

    /// The longest the whole command waits for locks other connections hold, in
    /// milliseconds [default: 5000]. Past it: STORE_BUSY (or OUTCOME_UNKNOWN once an
    /// intent was accepted)
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub(crate) busy_timeout_ms: Option<u64>,
}

/// `--store-clock`, for the commands that take leases.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct ClockArgs {
    /// Whose clock a PostgreSQL ledger judges leases and due times by: the database
    /// server's (relays on several hosts need no trusted clock), or the instant each
    /// command is handed (the case file's clock, --now), as a SQLite ledger always does
    #[arg(long, value_enum, value_name = "CLOCK")]
    pub(crate) store_clock: Option<StoreClockArg>,
}

/// The case file and the claims file.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct CaseArgs {
    /// The case file (persistence-case/v1): the call, its approval, the clock and the
    /// order's business state. Required (optional for the relay)
    #[arg(long = "case", visible_alias = "fixture", value_name = "PATH")]
    pub(crate) case: Option<PathBuf>,

    /// A claims file with the principals' current roles, re-read at every check.
    /// Without it nobody holds a role
    #[arg(long, value_name = "PATH")]
    pub(crate) claims: Option<PathBuf>,
}

/// `--pretty`, for the commands that answer with one JSON object.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct OutputArgs {
    /// Indent the JSON answer for people (the default is the canonical single line)
    #[arg(long)]
    pub(crate) pretty: bool,
}

/// `--store-clock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StoreClockArg {
    /// The database server's clock [default]
    Database,
    /// The instant the command is handed
    Caller,
}

/// Which downstream a command that works operations calls, and which tools it knows.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DownstreamArgs {
    /// A configuration file (toolledger.toml) declaring the tools and the services that
    /// perform them [default: $TOOLLEDGER_CONFIG, else ./toolledger.toml when present].
    /// Without one: refund_order alone, on the simulation or --downstream
    #[arg(long, value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,
    /// A refund service over HTTP (http://HOST:PORT) that implements the Idempotency-Key
    /// header, instead of the simulation: POST /refunds, GET /refunds/by-key/KEY
    #[arg(long, value_name = "URL")]
    pub(crate) downstream: Option<String>,
    /// The HTTP downstream's identity, recorded with every operation it is to perform
    #[arg(long, value_name = "NAME@REVISION", default_value = "refunds-http@1")]
    pub(crate) downstream_identity: String,
    /// The longest one HTTP exchange may take; past it, once connected: OUTCOME_UNKNOWN
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub(crate) downstream_timeout_ms: u64,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Dispatch the case's tool call: a new intent is accepted and worked now; a known
    /// one replays (local_replay) or stays OUTCOME_UNKNOWN; a different one under the
    /// same key is IDEMPOTENCY_CONFLICT
    Dispatch {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        clock: ClockArgs,
        #[command(flatten)]
        case: CaseArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// Judge the call at this Unix time instead of the case's clock.now
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
        /// Stop right after this commit, as a crash would (for recovery drills)
        #[arg(long, value_name = "POINT")]
        failure: Option<DispatchFailure>,
        #[command(flatten)]
        downstream: DownstreamArgs,
    },
    /// Accept the case's tool call (commit A) and stop: ACCEPTED with its status_ref,
    /// nothing sent; `process` or the relay performs it. A known intent answers as
    /// `dispatch` would
    Enqueue {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        clock: ClockArgs,
        #[command(flatten)]
        case: CaseArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// Judge the call at this Unix time instead of the case's clock.now
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
        #[command(flatten)]
        downstream: DownstreamArgs,
    },
    /// Work one accepted operation as a worker: claim its lease, recheck contract,
    /// authorization and business state, call the downstream, record the receipt.
    /// Reads only clock and business_state from the case
    Process {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        clock: ClockArgs,
        #[command(flatten)]
        case: CaseArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// The operation's status_ref (sr_…)
        #[arg(long, value_name = "R")]
        status_ref: String,
        /// Judge the call at this Unix time instead of the case's clock.now
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
        /// This worker's id [default: unique per process]
        #[arg(long, value_name = "W")]
        worker_id: Option<String>,
        /// Stop right after this commit, as a crash would
        #[arg(long, value_name = "POINT")]
        failure: Option<ProcessFailure>,
        #[command(flatten)]
        downstream: DownstreamArgs,
    },
    /// Ask what became of an operation and reconcile a downstream receipt
    /// (receipt_reconciled), under a derived, purpose-bound call identity
    Status {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        clock: ClockArgs,
        #[command(flatten)]
        case: CaseArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// The operation's status_ref (sr_…)
        #[arg(long, value_name = "R")]
        status_ref: String,
        /// Judge the call at this Unix time instead of the case's clock.now
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
        #[command(flatten)]
        downstream: DownstreamArgs,
    },
    /// Check the ledger from one read snapshot: integrity, foreign keys, WAL, FULL,
    /// invariants, counts, unreconciled downstream receipts. Creates nothing
    Audit {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Drain the outbox: claim due events in batches (pending ones, and processing ones
    /// whose lease ended), work each as `process` would, retry what was not sent after a
    /// backoff, and mark dead what used up its attempts. Reads business_state from the case
    /// file when one is given (else every event's rules judge an empty context). Runs until SIGTERM/SIGINT (finishing what it holds), or with --once until
    /// nothing is due; progress goes to stderr, the totals to stdout
    Relay {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        clock: ClockArgs,
        #[command(flatten)]
        case: CaseArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// Stop once a pass finds nothing due
        #[arg(long)]
        once: bool,
        /// How long an idle worker waits before its next pass
        #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
        poll_ms: u64,
        /// How many workers, each with its own connections
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
        concurrency: u64,
        /// How long a worker's lease lasts; live leases are renewed at a third of it
        #[arg(long, value_name = "S", default_value_t = 30, value_parser = clap::value_parser!(i64).range(1..=3600))]
        lease_seconds: i64,
        /// How many due events one claim takes
        #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1000))]
        batch: u64,
        /// Progress lines on stderr: text, or one JSON object per line
        #[arg(long, value_name = "FORMAT", default_value = "text")]
        log_format: LogFormat,
        /// Judge every pass at this Unix time instead of the wall clock (for drills)
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
        /// Serve `metrics` at http://ADDR/metrics while the relay runs (a loopback address)
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<std::net::SocketAddr>,
        /// How many sends that did not go out before an event is dead, for every tool
        /// [default: each tool's own max_attempts; 5 for refund_order]
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
        max_attempts: Option<u32>,
        /// Drill: percent of the simulation's requests answered "not sent"
        #[arg(long, value_name = "PERCENT", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
        simulate_unavailable: u8,
        /// Drill: milliseconds the simulation takes per request
        #[arg(long, value_name = "MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=60_000))]
        simulate_delay_ms: u64,
        /// Drill: the seed of the simulation's faults
        #[arg(long, value_name = "N", default_value_t = 0)]
        simulate_seed: u64,
        #[command(flatten)]
        downstream: DownstreamArgs,
    },
    /// List operations by state, oldest change first: one JSON object per line with the
    /// status_ref, tool, state, attempts, ages and last reason (arguments only with
    /// --show-arguments). States: pending, processing, unknown (processing with an ended
    /// lease), succeeded, failed, quarantined, dead. Creates nothing
    List {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// Only this state
        #[arg(long, value_name = "STATE", value_parser = clap::builder::PossibleValuesParser::new(["pending", "processing", "unknown", "succeeded", "failed", "quarantined", "dead"]))]
        state: Option<String>,
        /// Only operations unchanged for at least this many seconds
        #[arg(long, value_name = "SECONDS", default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..=315_360_000))]
        older_than: i64,
        /// At most this many lines
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        limit: u64,
        /// Include each operation's arguments
        #[arg(long)]
        show_arguments: bool,
        /// Judge ages at this Unix time instead of the wall clock
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
    },
    /// Show one operation's whole history: state, attempts, owner and lease, refs and
    /// digests, how it ended, every operator action. Creates nothing
    Show {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// The operation's status_ref (sr_…)
        #[arg(long, value_name = "R")]
        status_ref: String,
        /// Include its arguments
        #[arg(long)]
        show_arguments: bool,
    },
    /// Put a dead or failed operation back to pending with a fresh attempt budget,
    /// recorded with the reason in the append-only operator log
    Requeue {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// The operation's status_ref (sr_…)
        #[arg(long, value_name = "R")]
        status_ref: String,
        /// Why (kept in the operator log): 1–512 bytes, no control characters; anything
        /// else is refused, never shortened
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Record the action at this Unix time instead of the wall clock
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
    },
    /// Settle by hand an operation whose outcome no status query could tell, on the
    /// evidence you hold: the downstream's result (--receipt, checked against the tool's
    /// output schema; it succeeds) or that it did not happen (--not-happened; it ends
    /// failed, and `requeue` sends it again). Only a pending or unknown operation that no
    /// worker holds is settled; the action and reason go to the append-only operator log
    Resolve {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        clock: ClockArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// The operation's status_ref (sr_…)
        #[arg(long, value_name = "R")]
        status_ref: String,
        /// A JSON file holding the downstream's result: the tool's output (for a tool of
        /// the MCP gateway, the upstream's `tools/call` result)
        #[arg(long, value_name = "FILE", required_unless_present = "not_happened")]
        receipt: Option<PathBuf>,
        /// The operator found it did not happen
        #[arg(long, conflicts_with = "receipt")]
        not_happened: bool,
        /// Why (kept in the operator log): 1–512 bytes, no control characters; anything
        /// else is refused, never shortened
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Record the action at this Unix time instead of the wall clock
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
        #[command(flatten)]
        downstream: DownstreamArgs,
    },
    /// Print the ledger's figures in the Prometheus text format (0.0.4): operations and
    /// events by state, oldest pending and unknown ages, dead letters, claims, lease
    /// reclaims, fenced writes, reconciliations, retired operations. Creates nothing
    Metrics {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// Judge ages at this Unix time instead of the wall clock
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
    },
    /// Retire finished operations unchanged for N days: each leaves a tombstone, so a
    /// reused key answers KEY_RETIRED instead of causing a second effect
    Gc {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// How many days a finished operation is kept
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(0..=36_500))]
        older_than_days: i64,
        /// Judge ages at this Unix time instead of the wall clock
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
    },
    /// Upgrade an older store to the current schema: an online backup to a sibling file
    /// first, then one transaction. Every other command refuses an older store
    Migrate {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// The downstream the store's existing operations belong to, as NAME@REVISION
        /// (older stores did not record it). This command's own simulation is
        /// toolledger-stand-in@1
        #[arg(long, value_name = "NAME@REVISION")]
        downstream: String,
    },
    /// Serve the operator's dashboard over HTTP: the overview (counts by state, oldest
    /// pending and unknown ages, the relay's lag over time, dead letters, quarantined and
    /// unknown operations), a filtered, paged list of operations, each operation's whole
    /// history, /metrics and /healthz. Read-only unless --allow-actions. Prints
    /// `listening on ADDR` first; runs until SIGTERM/SIGINT. Creates nothing
    Serve {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// The address to listen on; port 0 chooses a free one
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8780")]
        listen: std::net::SocketAddr,
        /// Allow a non-loopback --listen address; every request must then carry the token
        /// (Authorization: Bearer TOKEN)
        #[arg(long)]
        allow_remote: bool,
        /// Enable actions (requeue a dead or failed operation); each needs the token
        #[arg(long)]
        allow_actions: bool,
        /// A file whose first line is the token (at least 16 visible ASCII characters)
        #[arg(long, value_name = "PATH")]
        token_file: Option<PathBuf>,
        /// Show operations' arguments (hidden by default)
        #[arg(long)]
        show_arguments: bool,
        /// How often the relay's lag is sampled for the overview's plot
        #[arg(long, value_name = "S", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
        sample_seconds: u64,
        /// Judge ages from this Unix time instead of the wall clock (for drills)
        #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = unix_time)]
        now: Option<i64>,
        /// The configuration whose tools the Tools page shows [default: $TOOLLEDGER_CONFIG,
        /// else ./toolledger.toml when present; without one: the built-in refund_order]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Serve an MCP host over stdio as a durable gateway to the MCP servers the
    /// configuration's [mcp] table names: every tool that changes something takes an
    /// idempotency key and goes through the ledger; the rest passes through
    /// (docs/mcp.md). Nothing but MCP is written to stdout
    Mcp {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// The configuration with the [mcp] table [default: $TOOLLEDGER_CONFIG, else
        /// ./toolledger.toml]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// Serve Streamable HTTP at http://ADDR/mcp instead of stdio, until SIGTERM or
        /// SIGINT. An address that is not loopback needs the configuration's
        /// [[mcp.tokens]]: every request then presents one as a bearer token
        #[arg(long, value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
    },
    /// Check or list the tools a configuration declares (toolledger.toml and the tool
    /// files it names): schemas, bindings, revisions, policies, routes. Creates nothing
    Tools {
        #[command(subcommand)]
        action: ToolsAction,
    },
    /// Tell the whole story in a fresh temporary directory, narrated for a person:
    /// PASS, replay, conflict, a crash with OUTCOME_UNKNOWN, reconciliation, audit
    Demo,
    /// Print a completion script for a shell on stdout, e.g.
    /// `toolledger completions bash > ~/.local/share/bash-completion/completions/toolledger`
    Completions {
        /// The shell
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

/// `toolledger tools …`.
#[derive(Debug, Subcommand)]
pub(crate) enum ToolsAction {
    /// Check every definition, route and service of the configuration: PASS with the
    /// tools and the environment variables it reads, or one error naming the file, a
    /// JSON pointer into it and the reason
    Check {
        #[command(flatten)]
        output: OutputArgs,
        /// The configuration [default: $TOOLLEDGER_CONFIG, else ./toolledger.toml]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// One JSON object per declared tool: name, description, source, revisions,
    /// policies and where its effects are performed (without a configuration: the
    /// built-in refund_order)
    List {
        /// The configuration [default: $TOOLLEDGER_CONFIG, else ./toolledger.toml]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
}

/// The shared options a command takes, wherever they were written.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Takes<'a> {
    pub(crate) ledger: Option<&'a LedgerArgs>,
    pub(crate) clock: Option<&'a ClockArgs>,
    pub(crate) case: Option<&'a CaseArgs>,
    pub(crate) output: Option<&'a OutputArgs>,
}

impl Command {
    /// The command's name, as typed.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Command::Dispatch { .. } => "dispatch",
            Command::Enqueue { .. } => "enqueue",
            Command::Process { .. } => "process",
            Command::Status { .. } => "status",
            Command::Audit { .. } => "audit",
            Command::Relay { .. } => "relay",
            Command::List { .. } => "list",
            Command::Show { .. } => "show",
            Command::Requeue { .. } => "requeue",
            Command::Resolve { .. } => "resolve",
            Command::Metrics { .. } => "metrics",
            Command::Gc { .. } => "gc",
            Command::Migrate { .. } => "migrate",
            Command::Serve { .. } => "serve",
            Command::Tools { .. } => "tools",
            Command::Mcp { .. } => "mcp",
            Command::Demo => "demo",
            Command::Completions { .. } => "completions",
        }
    }

    /// The shared options this command takes, as given after its name.
    pub(crate) fn takes(&self) -> Takes<'_> {
        match self {
            Command::Dispatch { ledger, clock, case, output, .. }
            | Command::Enqueue { ledger, clock, case, output, .. }
            | Command::Process { ledger, clock, case, output, .. }
            | Command::Status { ledger, clock, case, output, .. }
            | Command::Relay { ledger, clock, case, output, .. } => Takes {
                ledger: Some(ledger),
                clock: Some(clock),
                case: Some(case),
                output: Some(output),
            },
            Command::Resolve { ledger, clock, output, .. } => Takes {
                ledger: Some(ledger),
                clock: Some(clock),
                output: Some(output),
                ..Takes::default()
            },
            Command::Audit { ledger, output }
            | Command::Show { ledger, output, .. }
            | Command::Requeue { ledger, output, .. }
            | Command::Gc { ledger, output, .. }
            | Command::Migrate { ledger, output, .. } => {
                Takes { ledger: Some(ledger), output: Some(output), ..Takes::default() }
            }
            Command::List { ledger, .. }
            | Command::Metrics { ledger, .. }
            | Command::Serve { ledger, .. }
            | Command::Mcp { ledger, .. } => Takes { ledger: Some(ledger), ..Takes::default() },
            Command::Tools { action: ToolsAction::Check { output, .. } } => {
                Takes { output: Some(output), ..Takes::default() }
            }
            Command::Tools { action: ToolsAction::List { .. } }
            | Command::Demo
            | Command::Completions { .. } => Takes::default(),
        }
    }
}

/// The shared options written before the command: accepted where the command takes
/// them, hidden from help.
const BEFORE_COMMAND: [&str; 6] =
    ["db", "busy_timeout_ms", "store_clock", "case", "claims", "pretty"];

/// The command line's definition, as parsing, help, completions and the man page see it.
pub(crate) fn command() -> clap::Command {
    use clap::CommandFactory;
    BEFORE_COMMAND
        .iter()
        .fold(Cli::command(), |command, id| command.mut_arg(*id, |arg| arg.hide(true)))
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum DispatchFailure {
    #[value(name = "after_intent_commit")]
    IntentCommit,
    #[value(name = "after_claim")]
    Claim,
    #[value(name = "after_downstream_commit")]
    DownstreamCommit,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ProcessFailure {
    #[value(name = "after_claim")]
    Claim,
    #[value(name = "after_downstream_commit")]
    DownstreamCommit,
}

/// The last instant `--now` may name: the end of year 9999 (the ledger's timestamp range)
/// less the longest lease, so a lease taken at it still ends in range.
pub(crate) const NOW_MAX: i64 = 253_402_300_799 - 3_600;

/// Why `--now` was refused: the only value-parser reasons a usage message repeats.
pub(crate) const NOW_REASONS: [&str; 2] = [
    "not a canonical integer",
    "outside the timestamp range 0..=253402297199 (1970 to 9999, less the longest lease)",
];

/// A Unix time written the one way JSON would: `(0|[1-9][0-9]*)`, no `+`, no leading
/// zero, no spaces, within `0..=NOW_MAX`. Anything else is refused, never read as a near
/// value.
fn unix_time(text: &str) -> Result<i64, String> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|byte| byte.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && text != "-0";
    if !canonical {
        return Err(NOW_REASONS[0].to_owned());
    }
    match text.parse::<i64>() {
        Ok(seconds) if (0..=NOW_MAX).contains(&seconds) => Ok(seconds),
        _ => Err(NOW_REASONS[1].to_owned()),
    }
}
