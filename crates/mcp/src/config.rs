//! The `[mcp]` table of `toolledger.toml`: who calls over stdio, the upstream servers,
//! and each upstream tool's policy (`docs/mcp.md`, "Configuration").

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde_json::{Map, Value};

use crate::upstream_http::HttpClient;

/// The most upstream servers one gateway fronts.
const UPSTREAMS_MAX: usize = 16;

/// An upstream's request timeout unless its `timeout_ms` says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The gateway's settings, checked.
#[derive(Debug, Clone)]
pub(crate) struct McpConfig {
    /// The principal of every call over stdio.
    pub(crate) tenant: String,
    pub(crate) subject: String,
    pub(crate) upstreams: Vec<UpstreamDecl>,
    /// How long a worker's claim on an operation lasts: at least twice the longest
    /// upstream timeout, so no claim runs out while its call may still be answered.
    pub(crate) lease_seconds: i64,
    /// The bearer tokens HTTP callers present, each mapped to its principal.
    pub(crate) tokens: Vec<TokenDecl>,
}

/// One bearer token (read from the environment variable the configuration names, so
/// no secret is written in the file) and the principal it stands for.
#[derive(Clone)]
pub(crate) struct TokenDecl {
    pub(crate) token: String,
    pub(crate) tenant: String,
    pub(crate) subject: String,
    /// The approver this token stands for, when it may present approvals in `_meta`
    /// (an approvals console's token, never an agent's).
    pub(crate) approver: Option<String>,
}

impl std::fmt::Debug for TokenDecl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenDecl")
            .field("tenant", &self.tenant)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

/// One upstream MCP server.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamDecl {
    pub(crate) name: String,
    pub(crate) transport: Transport,
    /// The downstream identity recorded with every intent it performs.
    pub(crate) identity: (String, String),
    pub(crate) timeout: Duration,
    pub(crate) tools: BTreeMap<String, ToolPolicy>,
}

/// How the gateway reaches an upstream.
#[derive(Debug, Clone)]
pub(crate) enum Transport {
    /// A child process spoken to over its stdin and stdout.
    Child {
        program: String,
        args: Vec<String>,
        /// Relative paths in the command resolve here (the configuration's directory).
        dir: PathBuf,
        env: Vec<(String, String)>,
    },
    /// A server at a Streamable HTTP URL (`http://` only).
    Http {
        url: String,
        /// The client of `url`, checked when the configuration was read.
        client: HttpClient,
        /// The bearer token it expects, read from the environment variable the
        /// configuration names (no secret is written in the file).
        bearer: Option<String>,
    },
}

/// Whether calls of a tool go through the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    Ledgered,
    Passthrough,
}

/// What the configuration says of one upstream tool; every member optional.
#[derive(Debug, Clone, Default)]
pub(crate) struct ToolPolicy {
    pub(crate) policy: Option<Policy>,
    /// The upstream's own idempotency argument, handed the operation's request ref.
    pub(crate) key_argument: Option<String>,
    /// Derive the key from the arguments' digest when a call brings none.
    pub(crate) key_from_arguments: bool,
    pub(crate) lookup: Option<LookupDecl>,
    pub(crate) input_schema: Option<Value>,
    pub(crate) output_schema: Option<Value>,
    pub(crate) max_attempts: Option<u32>,
    /// A person approves each new call before it is accepted (through elicitation).
    pub(crate) approval: Option<ApprovalDecl>,
}

/// Who approves a tool's calls, and how long an approval lasts.
#[derive(Debug, Clone)]
pub(crate) struct ApprovalDecl {
    /// The approver's id, as the ledger records it: the person at the host.
    pub(crate) approver: String,
    pub(crate) validity_seconds: i64,
}

/// The upstream's read-only tool that finds an effect by its request ref.
#[derive(Debug, Clone)]
pub(crate) struct LookupDecl {
    pub(crate) tool: String,
    pub(crate) key_argument: String,
    /// A JSON pointer into the lookup's structured result: `true` found, `false` not.
    pub(crate) found: String,
    /// A JSON pointer to the tool's own structured result inside the lookup's.
    pub(crate) result: String,
}

fn refused(file: &str, at: &str, reason: impl Into<String>) -> String {
    format!("{file}: at {at}: {}", reason.into())
}

fn table<'a>(
    file: &str,
    at: &str,
    value: &'a Value,
    allowed: &[&str],
) -> Result<&'a Map<String, Value>, String> {
    let members = value.as_object().ok_or_else(|| refused(file, at, "must be a table"))?;
    if let Some(name) = members.keys().find(|name| !allowed.contains(&name.as_str())) {
        return Err(refused(
            file,
            &format!("{at}/{name}"),
            format!("unknown member {name:?}; allowed: {}", allowed.join(", ")),
        ));
    }
    Ok(members)
}

fn text(file: &str, at: &str, value: Option<&Value>) -> Result<Option<String>, String> {
    match value {
        None => Ok(None),
        Some(Value::String(text)) if !text.is_empty() && text.len() <= 4096 => {
            Ok(Some(text.clone()))
        }
        Some(_) => Err(refused(file, at, "must be a string of 1 to 4096 bytes")),
    }
}

/// `^[A-Za-z0-9_-]{1,32}$`: an upstream's name, the prefix of its tools on a collision.
pub(crate) fn is_upstream_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

impl McpConfig {
    /// The `[mcp]` table of the configuration `file` (read from `dir`).
    pub(crate) fn parse(file: &str, dir: &std::path::Path, mcp: &Value) -> Result<Self, String> {
        let top = table(
            file,
            "/mcp",
            mcp,
            &["tenant", "subject", "lease_seconds", "tokens", "upstreams", "$comment"],
        )?;
        let tenant = text(file, "/mcp/tenant", top.get("tenant"))?
            .ok_or_else(|| refused(file, "/mcp", "names no tenant (the stdio caller's)"))?;
        let subject = text(file, "/mcp/subject", top.get("subject"))?
            .ok_or_else(|| refused(file, "/mcp", "names no subject (the stdio caller's)"))?;
        let declared = match top.get("upstreams") {
            Some(Value::Object(declared)) if !declared.is_empty() => declared,
            _ => return Err(refused(file, "/mcp/upstreams", "declare at least one upstream")),
        };
        if declared.len() > UPSTREAMS_MAX {
            return Err(refused(file, "/mcp/upstreams", format!("at most {UPSTREAMS_MAX}")));
        }
        let upstreams = declared
            .iter()
            .map(|(name, value)| upstream(file, dir, name, value))
            .collect::<Result<Vec<_>, _>>()?;
        let longest = upstreams.iter().map(|upstream| upstream.timeout).max().unwrap_or_default();
        let least = i64::try_from(longest.as_millis().div_ceil(1000) * 2).unwrap_or(i64::MAX);
        let lease_seconds = match top.get("lease_seconds") {
            None => least.max(30),
            Some(value) => {
                let seconds = value
                    .as_i64()
                    .filter(|seconds| (1..=3600).contains(seconds))
                    .ok_or_else(|| refused(file, "/mcp/lease_seconds", "must be 1 to 3600"))?;
                if seconds < least {
                    return Err(refused(
                        file,
                        "/mcp/lease_seconds",
                        format!(
                            "a lease must last at least twice the longest upstream timeout ({least} s), or another worker could take over a call still in flight"
                        ),
                    ));
                }
                seconds
            }
        };
        let tokens = match top.get("tokens") {
            None => Vec::new(),
            Some(Value::Array(tokens)) => tokens
                .iter()
                .enumerate()
                .map(|(index, value)| token(file, &format!("/mcp/tokens/{index}"), value))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => {
                return Err(refused(file, "/mcp/tokens", "must be an array ([[mcp.tokens]])"));
            }
        };
        Ok(McpConfig { tenant, subject, upstreams, lease_seconds, tokens })
    }
}

fn token(file: &str, at: &str, value: &Value) -> Result<TokenDecl, String> {
    let members = table(file, at, value, &["token_env", "tenant", "subject", "approver"])?;
    let named = |member: &str| {
        text(file, &format!("{at}/{member}"), members.get(member))?
            .ok_or_else(|| refused(file, at, format!("names no {member}")))
    };
    let variable = named("token_env")?;
    let token =
        std::env::var(&variable).ok().filter(|token| token.len() >= 16).ok_or_else(|| {
            refused(
                file,
                &format!("{at}/token_env"),
                format!("the environment variable {variable} holds no token of at least 16 bytes"),
            )
        })?;
    let approver = text(file, &format!("{at}/approver"), members.get("approver"))?;
    Ok(TokenDecl { token, tenant: named("tenant")?, subject: named("subject")?, approver })
}

fn upstream(
    file: &str,
    dir: &std::path::Path,
    name: &str,
    value: &Value,
) -> Result<UpstreamDecl, String> {
    let at = format!("/mcp/upstreams/{name}");
    if !is_upstream_name(name) {
        return Err(refused(file, &at, "an upstream's name is 1 to 32 bytes of [A-Za-z0-9_-]"));
    }
    let members = table(
        file,
        &at,
        value,
        &["command", "env", "url", "bearer_env", "identity", "timeout_ms", "tools", "$comment"],
    )?;
    let transport = match (members.get("command"), members.get("url")) {
        (Some(_), None) => child(file, dir, &at, members)?,
        (None, Some(_)) => http(file, &at, members)?,
        _ => {
            return Err(refused(
                file,
                &at,
                "name either a command (a child process over stdio) or a url (Streamable HTTP)",
            ));
        }
    };
    let identity = match text(file, &format!("{at}/identity"), members.get("identity"))? {
        None => (format!("mcp-{name}"), "1".to_owned()),
        Some(identity) => match identity.split_once('@') {
            Some((who, revision)) if !who.is_empty() && !revision.is_empty() => {
                (who.to_owned(), revision.to_owned())
            }
            _ => return Err(refused(file, &format!("{at}/identity"), "must be NAME@REVISION")),
        },
    };
    let timeout = match members.get("timeout_ms") {
        None => DEFAULT_TIMEOUT,
        Some(value) => value
            .as_u64()
            .filter(|ms| (1..=600_000).contains(ms))
            .map(Duration::from_millis)
            .ok_or_else(|| refused(file, &format!("{at}/timeout_ms"), "must be 1 to 600000"))?,
    };
    let mut tools = BTreeMap::new();
    if let Some(declared) = members.get("tools") {
        let declared = declared
            .as_object()
            .ok_or_else(|| refused(file, &format!("{at}/tools"), "must be a table"))?;
        for (tool, value) in declared {
            tools.insert(tool.clone(), policy(file, &format!("{at}/tools/{tool}"), value)?);
        }
    }
    Ok(UpstreamDecl { name: name.to_owned(), transport, identity, timeout, tools })
}

/// A child process's command and environment.
fn child(
    file: &str,
    dir: &std::path::Path,
    at: &str,
    members: &Map<String, Value>,
) -> Result<Transport, String> {
    let command = match members.get("command") {
        Some(Value::Array(words)) if !words.is_empty() && words.len() <= 64 => words
            .iter()
            .map(|word| word.as_str().filter(|word| !word.is_empty()).map(str::to_owned))
            .collect::<Option<Vec<_>>>(),
        _ => None,
    }
    .ok_or_else(|| {
        refused(file, &format!("{at}/command"), "must be the program and its arguments, strings")
    })?;
    let env = match members.get("env") {
        None => Vec::new(),
        Some(Value::Object(env)) => env
            .iter()
            .map(|(key, value)| value.as_str().map(|value| (key.clone(), value.to_owned())))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| refused(file, &format!("{at}/env"), "values must be strings"))?,
        Some(_) => return Err(refused(file, &format!("{at}/env"), "must be a table")),
    };
    let mut words = command.into_iter();
    let program = words.next().unwrap_or_default();
    Ok(Transport::Child { program, args: words.collect(), dir: dir.to_path_buf(), env })
}

/// A Streamable HTTP server's URL and bearer token.
fn http(file: &str, at: &str, members: &Map<String, Value>) -> Result<Transport, String> {
    if members.contains_key("env") {
        return Err(refused(file, &format!("{at}/env"), "is for a command, not a url"));
    }
    let url = text(file, &format!("{at}/url"), members.get("url"))?.unwrap_or_default();
    let client = HttpClient::new(&url).map_err(|why| refused(file, &format!("{at}/url"), why))?;
    let bearer = match text(file, &format!("{at}/bearer_env"), members.get("bearer_env"))? {
        None => None,
        Some(variable) => {
            let token = std::env::var(&variable).ok().filter(|token| !token.is_empty());
            Some(token.ok_or_else(|| {
                refused(
                    file,
                    &format!("{at}/bearer_env"),
                    format!("the environment variable {variable} holds no token"),
                )
            })?)
        }
    };
    Ok(Transport::Http { url, client, bearer })
}

fn policy(file: &str, at: &str, value: &Value) -> Result<ToolPolicy, String> {
    let members = table(
        file,
        at,
        value,
        &[
            "policy",
            "key_argument",
            "key_from_arguments",
            "lookup",
            "input_schema",
            "output_schema",
            "max_attempts",
            "approval",
            "$comment",
        ],
    )?;
    let policy = match text(file, &format!("{at}/policy"), members.get("policy"))?.as_deref() {
        None => None,
        Some("ledgered") => Some(Policy::Ledgered),
        Some("passthrough") => Some(Policy::Passthrough),
        Some(_) => {
            return Err(refused(file, &format!("{at}/policy"), "is ledgered or passthrough"));
        }
    };
    let key_from_arguments = match members.get("key_from_arguments") {
        None => false,
        Some(Value::Bool(flag)) => *flag,
        Some(_) => return Err(refused(file, &format!("{at}/key_from_arguments"), "a boolean")),
    };
    let lookup = match members.get("lookup") {
        None => None,
        Some(value) => {
            let lookup_at = format!("{at}/lookup");
            let lookup =
                table(file, &lookup_at, value, &["tool", "key_argument", "found", "result"])?;
            let named =
                |member: &str| text(file, &format!("{lookup_at}/{member}"), lookup.get(member));
            Some(LookupDecl {
                tool: named("tool")?.ok_or_else(|| refused(file, &lookup_at, "names no tool"))?,
                key_argument: named("key_argument")?
                    .ok_or_else(|| refused(file, &lookup_at, "names no key_argument"))?,
                found: named("found")?.unwrap_or_else(|| "/found".to_owned()),
                result: named("result")?.unwrap_or_default(),
            })
        }
    };
    let schema = |member: &str| match members.get(member) {
        None => Ok(None),
        Some(value @ Value::Object(_)) => Ok(Some(value.clone())),
        Some(_) => Err(refused(file, &format!("{at}/{member}"), "must be a JSON Schema table")),
    };
    let max_attempts = match members.get("max_attempts") {
        None => None,
        Some(value) => Some(
            value
                .as_u64()
                .and_then(|attempts| u32::try_from(attempts).ok())
                .filter(|attempts| (1..=100).contains(attempts))
                .ok_or_else(|| refused(file, &format!("{at}/max_attempts"), "must be 1 to 100"))?,
        ),
    };
    let approval = match members.get("approval") {
        None => None,
        Some(value) => {
            let approval_at = format!("{at}/approval");
            let approval = table(file, &approval_at, value, &["approver", "max_validity_seconds"])?;
            let approver =
                text(file, &format!("{approval_at}/approver"), approval.get("approver"))?
                    .ok_or_else(|| refused(file, &approval_at, "names no approver"))?;
            let validity_seconds = match approval.get("max_validity_seconds") {
                None => 300,
                Some(value) => value
                    .as_i64()
                    .filter(|seconds| (1..=86_400).contains(seconds))
                    .ok_or_else(|| {
                        refused(
                            file,
                            &format!("{approval_at}/max_validity_seconds"),
                            "must be 1 to 86400",
                        )
                    })?,
            };
            Some(ApprovalDecl { approver, validity_seconds })
        }
    };
    Ok(ToolPolicy {
        approval,
        policy,
        key_argument: text(file, &format!("{at}/key_argument"), members.get("key_argument"))?,
        key_from_arguments,
        lookup,
        input_schema: schema("input_schema")?,
        output_schema: schema("output_schema")?,
        max_attempts,
    })
}
