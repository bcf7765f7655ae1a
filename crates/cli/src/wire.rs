//! The command line's downstream: the simulation (the default), a service over HTTP
//! (`--downstream URL`), or, for a relay, the MCP upstreams of the configuration's
//! `[mcp]` table, each behind the recovery-drill switch.

use std::{sync::Arc, time::Duration};

use toolledger::{
    Config, Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest,
    Faults, Location, Lookup, Simulated, UnixSeconds, drill,
    http::{Endpoint, HttpDownstream, Timeouts},
};

use crate::{args::DownstreamArgs, run::Failure};

/// Either downstream.
#[derive(Debug)]
pub(crate) enum Wire {
    Simulated(Simulated),
    Http(drill::Interrupt<HttpDownstream>),
    Mcp(drill::Interrupt<toolledger_mcp::McpDownstream>),
}

/// Which downstream a command uses, parsed once.
#[derive(Debug, Clone)]
pub(crate) enum Chosen {
    Simulated(Faults),
    Http {
        base_url: String,
        identity: DownstreamIdentity,
        timeouts: Timeouts,
    },
    /// The configuration's services, and `--downstream` for `refund_order` when the
    /// configuration routes it nowhere.
    Configured {
        config: Box<Config>,
        refunds: Option<(String, Timeouts)>,
        identity: DownstreamIdentity,
    },
    /// The gateway's upstreams, started (a relay over the gateway's operations).
    Mcp(Arc<toolledger_mcp::Upstreams>),
}

impl Chosen {
    /// From the command's options: `--downstream` is an `http://` URL.
    pub(crate) fn from_args(
        args: &DownstreamArgs,
        faults: Faults,
        config: Option<Config>,
    ) -> Result<Chosen, Failure> {
        let chosen = Chosen::from_flags(args, faults)?;
        let Some(config) = config.filter(Config::has_routes) else { return Ok(chosen) };
        let identity = identity(&args.downstream_identity, "--downstream-identity")?;
        // Every service's URL and headers are read now, so a variable that is not set is
        // refused before anything is accepted.
        drop(config.downstream(identity.clone())?);
        let routes_refunds = config
            .tools()
            .iter()
            .any(|tool| tool.definition.name == "refund_order" && tool.route.is_some());
        let refunds = match chosen {
            Chosen::Http { base_url, timeouts, .. } if !routes_refunds => {
                Some((base_url, timeouts))
            }
            _ => None,
        };
        Ok(Chosen::Configured { config: Box::new(config), refunds, identity })
    }

    fn from_flags(args: &DownstreamArgs, faults: Faults) -> Result<Chosen, Failure> {
        let Some(url) = &args.downstream else { return Ok(Chosen::Simulated(faults)) };
        let usage = |message: &str| Failure { code: "USAGE_ERROR", message: message.to_owned() };
        if url.starts_with("https://") {
            return Err(usage(
                "invalid value for --downstream: TLS is not built in; use http://HOST:PORT \
                 (a local proxy can terminate TLS)",
            ));
        }
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            usage("invalid value for --downstream: expected http://HOST:PORT (plain HTTP)")
        })?;
        if rest.is_empty() || rest.contains(char::is_whitespace) {
            return Err(usage("invalid value for --downstream: expected http://HOST:PORT"));
        }
        let identity = identity(&args.downstream_identity, "--downstream-identity")?;
        let total = Duration::from_millis(args.downstream_timeout_ms);
        let timeouts = Timeouts { connect: total.min(Duration::from_secs(2)), total };
        Ok(Chosen::Http { base_url: url.clone(), identity, timeouts })
    }

    /// A downstream for the ledger at `db`.
    pub(crate) fn open(&self, db: &Location) -> Result<Wire, toolledger::Error> {
        Ok(match self {
            Chosen::Mcp(upstreams) => {
                Wire::Mcp(drill::Interrupt::new(upstreams.downstream(), drill::Switch::default()))
            }
            Chosen::Simulated(faults) => Wire::Simulated(toolledger::simulated_with(db, *faults)?),
            Chosen::Http { base_url, identity, timeouts } => {
                let http = HttpDownstream::new(identity.clone(), *timeouts)
                    .endpoint("refund_order", Endpoint::refunds(base_url));
                Wire::Http(drill::Interrupt::new(http, drill::Switch::default()))
            }
            Chosen::Configured { config, refunds, identity } => {
                let mut http = config.downstream(identity.clone())?;
                if let Some((base_url, timeouts)) = refunds {
                    let endpoint = Endpoint {
                        identity: Some(identity.clone()),
                        timeouts: Some(*timeouts),
                        ..Endpoint::refunds(base_url)
                    };
                    http = http.endpoint("refund_order", endpoint);
                }
                Wire::Http(drill::Interrupt::new(http, drill::Switch::default()))
            }
        })
    }
}

/// A downstream identity written `NAME@REVISION`, as the option `flag` takes it.
pub(crate) fn identity(text: &str, flag: &str) -> Result<DownstreamIdentity, Failure> {
    text.split_once('@')
        .and_then(|(name, revision)| DownstreamIdentity::new(name, revision).ok())
        .ok_or_else(|| Failure {
            code: "USAGE_ERROR",
            message: format!("invalid value for {flag}: expected NAME@REVISION"),
        })
}

impl Wire {
    /// The drill switch of either downstream.
    pub(crate) fn switch(&self) -> &drill::Switch {
        match self {
            Wire::Simulated(simulated) => simulated.switch(),
            Wire::Http(http) => http.switch(),
            Wire::Mcp(mcp) => mcp.switch(),
        }
    }
}

impl Downstream for Wire {
    fn identity(&self) -> &DownstreamIdentity {
        match self {
            Wire::Simulated(simulated) => simulated.identity(),
            Wire::Http(http) => http.identity(),
            Wire::Mcp(mcp) => mcp.identity(),
        }
    }

    fn is_simulation(&self) -> bool {
        match self {
            Wire::Simulated(simulated) => simulated.is_simulation(),
            Wire::Http(http) => http.is_simulation(),
            Wire::Mcp(mcp) => mcp.is_simulation(),
        }
    }

    fn identity_for(&self, tool: &str) -> &DownstreamIdentity {
        match self {
            Wire::Simulated(simulated) => simulated.identity_for(tool),
            Wire::Http(http) => http.identity_for(tool),
            Wire::Mcp(mcp) => mcp.identity_for(tool),
        }
    }

    fn identities(&self) -> Vec<DownstreamIdentity> {
        match self {
            Wire::Simulated(simulated) => simulated.identities(),
            Wire::Http(http) => http.identities(),
            Wire::Mcp(mcp) => mcp.identities(),
        }
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        now: UnixSeconds,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        match self {
            Wire::Simulated(simulated) => simulated.execute(request, now),
            Wire::Http(http) => http.execute(request, now),
            Wire::Mcp(mcp) => mcp.execute(request, now),
        }
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        match self {
            Wire::Simulated(simulated) => simulated.lookup(request),
            Wire::Http(http) => http.lookup(request),
            Wire::Mcp(mcp) => mcp.lookup(request),
        }
    }

    fn execute_batch(
        &self,
        requests: &[DownstreamRequest],
        now: UnixSeconds,
    ) -> Vec<Result<DownstreamReceipt, DownstreamError>> {
        match self {
            Wire::Simulated(simulated) => simulated.execute_batch(requests, now),
            Wire::Http(http) => http.execute_batch(requests, now),
            Wire::Mcp(mcp) => mcp.execute_batch(requests, now),
        }
    }
}
