//! `toolledger mcp`: a durable gateway between an MCP host and MCP servers.
//!
//! The host (an agent, an IDE, a desktop app) spawns the gateway as its MCP server; the
//! gateway spawns the upstream servers the configuration's `[mcp]` table names, and
//! lists their tools as its own. A tool that changes something (every tool not
//! annotated read-only, unless the configuration says otherwise) is **ledgered**: its
//! calls take an idempotency key and go through the toolledger ledger — one row per
//! key, the upstream's result recorded before it is returned, a retry answered from
//! the ledger without calling the upstream again, `OUTCOME_UNKNOWN` when the upstream
//! may have acted and no result came back. Every other request passes through.
//!
//! The whole story, the configuration and every answer are in `docs/mcp.md`.
//!
//! ```no_run
//! let options = toolledger_mcp::Options {
//!     config: Some("toolledger.toml".into()),
//!     ledger: "gateway.sqlite3".into(),
//!     busy_timeout_ms: None,
//!     listen: None,
//! };
//! toolledger_mcp::serve(&options)?;
//! # Ok::<(), toolledger_mcp::Error>(())
//! ```

#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

mod config;
mod downstream;
mod gateway;
mod hosts;
mod http;
mod relay;
mod tools;
mod upstream;
mod upstream_http;

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use rmcp::ServiceExt;
use toolledger::{
    Config, DownstreamIdentity, ErrorCode, Ledger, Location, NoRoles, ProviderProfile, Relay,
    RelayEvent, ToolSpec, Until, Waits,
};

pub use crate::downstream::McpDownstream;
use crate::{
    config::McpConfig,
    downstream::{Route, Routes},
    gateway::{Gateway, PROFILE},
    upstream::Upstream,
};

/// How `toolledger mcp` was asked to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The configuration (`--config`); else `TOOLLEDGER_CONFIG`, else `./toolledger.toml`.
    pub config: Option<PathBuf>,
    /// The ledger: a SQLite path or a PostgreSQL URL.
    pub ledger: String,
    /// The longest a store call waits for another connection's locks.
    pub busy_timeout_ms: Option<u64>,
    /// Serve Streamable HTTP on this address instead of stdio. An address that is not
    /// loopback needs the configuration's `[[mcp.tokens]]`.
    pub listen: Option<SocketAddr>,
}

/// Why the gateway could not start or stopped: a stable code and a message that names
/// no path of the machine beyond what the configuration itself says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

impl Error {
    fn usage(message: impl Into<String>) -> Error {
        Error { code: ErrorCode::UsageError, message: message.into() }
    }

    /// The stable code.
    ///
    /// ```
    /// let options = toolledger_mcp::Options {
    ///     config: Some("/nonexistent/toolledger.toml".into()),
    ///     ledger: "gateway.sqlite3".into(),
    ///     busy_timeout_ms: None,
    ///     listen: None,
    /// };
    /// let error = toolledger_mcp::serve(&options).unwrap_err();
    /// assert_eq!(error.code(), toolledger::ErrorCode::UsageError);
    /// ```
    pub fn code(&self) -> ErrorCode {
        self.code
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<toolledger::Error> for Error {
    fn from(error: toolledger::Error) -> Error {
        Error { code: error.code(), message: error.to_string() }
    }
}

/// How often the gateway's relay looks for due operations (ones accepted before a
/// crash, or whose lease ran out).
const RELAY_POLL: Duration = Duration::from_secs(2);

/// Serves the host over stdin and stdout until it closes them (or, with
/// [`Options::listen`], over Streamable HTTP until SIGTERM or SIGINT); the upstreams are
/// shut down before returning.
///
/// # Errors
///
/// An [`Error`] when the configuration is missing or wrong, an upstream cannot be
/// started or listed, the ledger cannot be opened, or the address cannot be listened on.
pub fn serve(options: &Options) -> Result<(), Error> {
    let mcp = configured(options)?;
    runtime()?.block_on(run(options, mcp, terminated()))
}

/// The gateway as a library, served on the host's own tokio runtime (this future runs
/// on it; the ledger's work goes to the runtime's blocking pool): over Streamable HTTP
/// at [`Options::listen`] until `stop` resolves, or over stdin and stdout until the
/// host closes them. The upstreams are shut down before it returns. Concurrent
/// `tools/call`s run at once, each of its own key.
///
/// # Errors
///
/// As [`serve`].
///
/// ```no_run
/// # async fn host() -> Result<(), toolledger_mcp::Error> {
/// let options = toolledger_mcp::Options {
///     config: Some("toolledger.toml".into()),
///     ledger: "gateway.sqlite3".into(),
///     listen: Some("127.0.0.1:8931".parse().unwrap()),
///     busy_timeout_ms: None,
/// };
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// # drop(stop);
/// toolledger_mcp::serve_until(&options, async { let _ = stopped.await; }).await?;
/// # Ok(())
/// # }
/// ```
pub async fn serve_until(
    options: &Options,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mcp = configured(options)?;
    run(options, mcp, stop).await
}

/// The `[mcp]` table of the configuration `options` name, checked against where it is
/// to listen.
fn configured(options: &Options) -> Result<McpConfig, Error> {
    let config = Config::discover(options.config.as_deref())?
        .ok_or_else(|| Error::usage("toolledger mcp needs a configuration with an [mcp] table (--config, TOOLLEDGER_CONFIG or ./toolledger.toml)"))?;
    let section = config
        .mcp()
        .ok_or_else(|| Error::usage(format!("{}: has no [mcp] table", config.file())))?;
    let mcp = McpConfig::parse(config.file(), config.dir(), section).map_err(Error::usage)?;
    if let Some(address) = options.listen {
        if !http::is_loopback(&address) && mcp.tokens.is_empty() {
            return Err(Error::usage(format!(
                "{address} is not a loopback address: declare [[mcp.tokens]] so every caller presents a bearer token"
            )));
        }
    }
    Ok(mcp)
}

/// The upstreams started and listed: what the host sees, and what the ledger holds.
struct Prepared {
    upstreams: Vec<Arc<Upstream>>,
    /// The host sessions the upstreams' announcements go to (none without a gateway).
    hosts: Arc<hosts::Hosts>,
    plan: tools::Plan,
    serves: Vec<upstream::Serves>,
    routes: Routes,
    specs: Vec<ToolSpec>,
}

/// Starts every upstream, lists its tools, and plans them; the upstreams are shut down
/// again on failure.
async fn prepare(mcp: &McpConfig) -> Result<Prepared, Error> {
    let hosts = Arc::new(hosts::Hosts::default());
    let upstreams: Vec<Arc<Upstream>> = mcp
        .upstreams
        .iter()
        .map(|decl| Arc::new(Upstream::new(decl.clone(), Arc::clone(&hosts))))
        .collect();
    let mut listings = Vec::new();
    let mut serves = Vec::new();
    for upstream in &upstreams {
        let listed = async {
            upstream.start().await?;
            let tools = upstream.list_tools().await?;
            Ok::<_, String>((tools, upstream.serves().await?))
        }
        .await;
        match listed {
            Ok((tools, served)) => {
                listings.push(tools);
                serves.push(served);
            }
            Err(reason) => {
                shutdown(&upstreams).await;
                return Err(Error::usage(reason));
            }
        }
    }
    let plan = tools::plan(mcp, &listings);
    if !plan.misnamed.is_empty() {
        shutdown(&upstreams).await;
        return Err(Error::usage(format!("the configuration: {}", plan.misnamed.join("; "))));
    }
    for refused in &plan.refused {
        log(&format!("not listed: {refused}"));
    }
    let mut routes = HashMap::new();
    let mut specs = Vec::new();
    for exposed in &plan.tools {
        let (Some(ledgered), Some(upstream)) = (&exposed.ledgered, upstreams.get(exposed.upstream))
        else {
            continue;
        };
        let (name, revision) = &upstream.decl.identity;
        let Ok(identity) = DownstreamIdentity::new(name, revision) else {
            shutdown(&upstreams).await;
            return Err(Error::usage(format!(
                "upstream {}: identity {name}@{revision} is not one",
                upstream.decl.name
            )));
        };
        let structured = exposed.listing.get("outputSchema").is_some();
        routes.insert(
            ledgered.ledger_name.clone(),
            Route {
                upstream: Arc::clone(upstream),
                tool: exposed.upstream_tool.clone(),
                identity,
                key_argument: ledgered.key_argument.clone(),
                lookup: ledgered.lookup.clone(),
                structured,
            },
        );
        specs.push(ledgered.spec.clone());
    }
    Ok(Prepared { upstreams, hosts, plan, serves, routes: Arc::new(routes), specs })
}

/// The gateway's runtime: one async worker. Its async side only carries messages
/// between the host and the upstreams; the ledger's work runs off it
/// (`block_in_place`, which hands the worker's tasks to another thread meanwhile), so
/// one worker loses no parallelism, and it keeps a host's request, its handler and the
/// answer on one thread instead of waking another for each (`docs/performance.md`:
/// the gateway's own fresh cost went from 0.54–0.57 ms with two workers to 0.38–0.40).
fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|_| Error::usage("could not start the gateway's runtime"))
}

/// The identity a downstream answers for a tool no upstream serves.
fn fallback_identity() -> Result<DownstreamIdentity, Error> {
    DownstreamIdentity::new("toolledger-mcp", "1")
        .map_err(|_| Error::usage("the gateway's identity"))
}

/// The upstreams of a configuration's `[mcp]` table, started and listed, for a relay
/// that works the gateway's operations outside the gateway (`toolledger relay`): the
/// tools as the ledger holds them, the provider profile their calls were recorded
/// under, the lease they need, and a downstream over the upstreams. Dropping it stops
/// the upstreams.
///
/// ```no_run
/// let config = toolledger::Config::load(std::path::Path::new("toolledger.toml"))?;
/// if let Some(upstreams) = toolledger_mcp::Upstreams::start(&config)? {
///     let relay = upstreams.tools().iter().cloned().fold(
///         toolledger::Relay::new("gateway.sqlite3").profile(toolledger_mcp::Upstreams::profile()),
///         toolledger::Relay::tool,
///     );
///     relay.lease_seconds(upstreams.lease_seconds()).run(
///         || Ok(upstreams.downstream()), || toolledger::NoRoles, &serde_json::json!({}),
///         toolledger::Until::Drained, &|_| {})?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Upstreams {
    runtime: tokio::runtime::Runtime,
    prepared: Prepared,
    lease_seconds: i64,
    fallback: DownstreamIdentity,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("tools", &self.specs.len()).finish_non_exhaustive()
    }
}

impl Upstreams {
    /// Starts the upstreams `config`'s `[mcp]` table declares; `None` when it has none.
    ///
    /// # Errors
    ///
    /// An [`Error`] when the table is wrong, or an upstream cannot be started or listed.
    pub fn start(config: &Config) -> Result<Option<Upstreams>, Error> {
        let Some(section) = config.mcp() else { return Ok(None) };
        let mcp = McpConfig::parse(config.file(), config.dir(), section).map_err(Error::usage)?;
        let fallback = fallback_identity()?;
        let runtime = runtime()?;
        let prepared = runtime.block_on(prepare(&mcp))?;
        Ok(Some(Upstreams { runtime, prepared, lease_seconds: mcp.lease_seconds, fallback }))
    }

    /// The ledgered tools, as the gateway's ledger holds them.
    pub fn tools(&self) -> &[ToolSpec] {
        &self.prepared.specs
    }

    /// The provider profile every gateway call is recorded under.
    pub fn profile() -> ProviderProfile {
        ProviderProfile::new(PROFILE.0, PROFILE.1, PROFILE.2)
    }

    /// The lease the configuration gives a claim: at least twice the longest upstream
    /// timeout.
    pub fn lease_seconds(&self) -> i64 {
        self.lease_seconds
    }

    /// The output the ledger records for `result`, an upstream's `tools/call` result,
    /// of the ledgered tool named `tool` in the ledger (`content`, and
    /// `structuredContent` when the tool declares an output schema); `None` when no
    /// upstream serves it.
    pub fn output_of(&self, tool: &str, result: &serde_json::Value) -> Option<serde_json::Value> {
        let route = self.prepared.routes.get(tool)?;
        Some(tools::recorded(result, route.structured))
    }

    /// A downstream over the upstreams: one per relay worker.
    pub fn downstream(&self) -> McpDownstream {
        McpDownstream::new(
            self.fallback.clone(),
            Arc::clone(&self.prepared.routes),
            self.runtime.handle().clone(),
        )
    }
}

impl Drop for Upstreams {
    fn drop(&mut self) {
        self.runtime.block_on(shutdown(&self.prepared.upstreams));
    }
}

async fn run(
    options: &Options,
    mcp: McpConfig,
    stop_serving: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let Prepared { upstreams, hosts, plan, serves, routes, specs } = prepare(&mcp).await?;
    let fallback = fallback_identity()?;
    let handle = tokio::runtime::Handle::current();
    let location = Location::parse(&options.ledger);
    let waits = options
        .busy_timeout_ms
        .map(|ms| Waits { busy_timeout: Duration::from_millis(ms), deadline: None })
        .unwrap_or_default();
    let profile = ProviderProfile::new(PROFILE.0, PROFILE.1, PROFILE.2);
    let lease = mcp.lease_seconds;
    let opened = {
        let (location, specs, routes, fallback, handle, profile) = (
            location.clone(),
            specs.clone(),
            Arc::clone(&routes),
            fallback.clone(),
            handle.clone(),
            profile.clone(),
        );
        tokio::task::spawn_blocking(move || {
            specs
                .into_iter()
                .fold(
                    Ledger::builder(location).profile(profile).waits(waits).lease_seconds(lease),
                    |builder, spec| builder.tool(spec),
                )
                .open(McpDownstream::new(fallback, routes, handle), NoRoles)
        })
        .await
        .map_err(|_| Error::usage("the ledger could not be opened"))?
    };
    let ledger = match opened {
        Ok(ledger) => Arc::new(gateway::Held::new(ledger)),
        Err(error) => {
            shutdown(&upstreams).await;
            return Err(error.into());
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let relay = {
        let relay = specs
            .iter()
            .cloned()
            .fold(
                Relay::new(location).profile(profile).waits(waits).lease_seconds(lease),
                Relay::tool,
            )
            .poll(RELAY_POLL);
        let (routes, fallback, handle, stop) =
            (Arc::clone(&routes), fallback, handle.clone(), Arc::clone(&stop));
        tokio::task::spawn_blocking(move || {
            let downstream =
                || Ok(McpDownstream::new(fallback.clone(), Arc::clone(&routes), handle.clone()));
            let report = |event: RelayEvent| {
                if let RelayEvent::Pass { drained, .. } = event {
                    if drained.claimed > 0 {
                        log(&format!(
                            "relay: {} claimed, {} delivered",
                            drained.claimed, drained.delivered
                        ));
                    }
                }
            };
            let _ = relay.run(
                downstream,
                || NoRoles,
                &serde_json::Value::Null,
                Until::Stopped(&stop),
                &report,
            );
        })
    };
    let gateway = Gateway::new(
        (mcp.tenant.clone(), mcp.subject.clone()),
        upstreams.clone(),
        hosts,
        plan.tools,
        ledger,
        &serves,
    );
    let served = match options.listen {
        None => match gateway.session().serve(rmcp::transport::io::stdio_pipes()).await {
            Ok(running) => running
                .waiting()
                .await
                .map(|_| ())
                .map_err(|_| Error::usage("the host's connection failed")),
            Err(_) => Err(Error::usage("the host's connection failed before it was initialized")),
        },
        Some(address) => match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => {
                let stopped = tokio_util::sync::CancellationToken::new();
                let on_signal = stopped.clone();
                tokio::spawn(async move {
                    stop_serving.await;
                    on_signal.cancel();
                });
                log(&format!(
                    "listening on http://{}/mcp",
                    listener.local_addr().map_or(address, |bound| bound)
                ));
                let remote = !http::is_loopback(&address);
                http::serve(
                    listener,
                    gateway.clone(),
                    Arc::new(mcp.tokens.clone()),
                    remote,
                    stopped,
                )
                .await;
                Ok(())
            }
            Err(err) => Err(Error::usage(format!("could not listen on {address}: {}", err.kind()))),
        },
    };
    stop.store(true, Ordering::SeqCst);
    gateway.shutdown().await;
    let _ = relay.await;
    served
}

/// Resolves on SIGTERM or SIGINT.
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

async fn shutdown(upstreams: &[Arc<Upstream>]) {
    for upstream in upstreams {
        upstream.shutdown().await;
    }
}

/// One line on stderr: the host's log of its MCP server.
fn log(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "toolledger mcp: {line}");
}
