//! `toolledger.toml`: the tools a ledger serves and the services that perform their
//! effects, as data (`docs/tools.md`, "One configuration file").

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use serde_json::{Map, Value};
use toolledger_contract::{
    DownstreamIdentity, Precondition, REFUND_ORDER_DEFINITION, RefundOrder, ToolDefinition,
    ToolSpec, parse_document, placeholders,
};
use toolledger_downstream_http::{Endpoint, HttpDownstream, HttpPrecondition, Timeouts};

use crate::{Error, definitions::read_file};

/// The environment variable naming the configuration file when `--config` does not.
///
/// ```
/// assert_eq!(toolledger::CONFIG_ENV, "TOOLLEDGER_CONFIG");
/// ```
pub const CONFIG_ENV: &str = "TOOLLEDGER_CONFIG";

/// The file a command reads when neither `--config` nor [`CONFIG_ENV`] names one and it
/// is present in the working directory.
///
/// ```
/// assert_eq!(toolledger::CONFIG_FILE, "toolledger.toml");
/// ```
pub const CONFIG_FILE: &str = "toolledger.toml";

/// The most tools one configuration declares.
const TOOLS_MAX: usize = 256;

/// Where one tool's effects are performed: a service and the paths under its base URL.
///
/// ```
/// # let config = toolledger::Config::load(std::path::Path::new(concat!(
/// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
/// let refunds = config.tools().iter().find(|tool| tool.definition.name == "refund_order").unwrap();
/// assert_eq!(refunds.route.as_ref().unwrap().execute, "/refunds");
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The service's name in `[services]`.
    pub service: String,
    /// The path a request is `POST`ed to.
    pub execute: String,
    /// The status lookup's path, `{key}` standing for the key.
    pub lookup: String,
}

/// A service that performs effects, as declared.
///
/// ```
/// # let config = toolledger::Config::load(std::path::Path::new(concat!(
/// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
/// let reference = &config.services()["reference"];
/// assert_eq!(reference.identity.to_string(), "reference-tools@1");
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceDecl {
    /// Its name in `[services]`.
    pub name: String,
    /// `base_url`, or the environment variable `base_url_env` names.
    pub base_url: Setting,
    /// Who performs the effects, recorded with every intent it is to perform.
    pub identity: DownstreamIdentity,
    /// Connect and whole-exchange timeouts.
    pub timeouts: Timeouts,
    /// Header names and the environment variables their values come from.
    pub headers_from_env: Vec<(String, String)>,
}

/// A value written in the file, or read from an environment variable when used.
///
/// ```
/// # let config = toolledger::Config::load(std::path::Path::new(concat!(
/// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
/// let reference = &config.services()["reference"];
/// assert_eq!(reference.base_url, toolledger::Setting::Env("TOOLLEDGER_REFERENCE_URL".to_owned()));
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// Written in the file.
    Literal(String),
    /// The environment variable of this name.
    Env(String),
}

/// One declared tool: its definition, where it was read from, and its route.
///
/// ```
/// # let config = toolledger::Config::load(std::path::Path::new(concat!(
/// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
/// let invoice = &config.tools()[0];
/// assert!(invoice.source.ends_with("send_invoice_email.toml"));
/// assert!(!invoice.builtin);
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Declared {
    /// The definition.
    pub definition: ToolDefinition,
    /// The file it was read from (the configuration itself for an inline tool).
    pub source: String,
    /// Where its effects are performed; `None`: the simulation (refunds only).
    pub route: Option<Route>,
    /// Whether it is the built-in `refund_order`, composed with [`RefundOrder`]'s rules.
    pub builtin: bool,
}

/// A configuration file, read and checked: every tool's definition and every route.
///
/// ```
/// # let config = toolledger::Config::load(std::path::Path::new(concat!(
/// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
/// assert_eq!(config.tools().len(), 3);
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    file: String,
    dir: PathBuf,
    tools: Vec<Declared>,
    services: BTreeMap<String, ServiceDecl>,
    mcp: Option<Value>,
}

fn refused(file: &str, pointer: &str, reason: impl Into<String>) -> Error {
    let at = if pointer.is_empty() { "the top" } else { pointer };
    Error::invalid(format!("{file}: at {at}: {}", reason.into()))
}

fn only(
    file: &str,
    at: &str,
    value: &Value,
    allowed: &[&str],
) -> Result<Map<String, Value>, Error> {
    let members = value.as_object().ok_or_else(|| refused(file, at, "must be a table"))?;
    if let Some(name) = members.keys().find(|name| !allowed.contains(&name.as_str())) {
        return Err(refused(
            file,
            &format!("{at}/{name}"),
            format!("unknown member {name:?}; allowed: {}", allowed.join(", ")),
        ));
    }
    Ok(members.clone())
}

impl Config {
    /// The configuration a command uses: `explicit` (`--config`), else the file
    /// [`CONFIG_ENV`] names, else `./toolledger.toml` when present; `None` when there is
    /// none (the command behaves as without a configuration).
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    ///
    /// ```
    /// let explicit = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml"));
    /// assert!(toolledger::Config::discover(Some(explicit))?.is_some());
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn discover(explicit: Option<&Path>) -> Result<Option<Config>, Error> {
        if let Some(path) = explicit {
            return Config::load(path).map(Some);
        }
        if let Some(path) = std::env::var_os(CONFIG_ENV).filter(|path| !path.is_empty()) {
            return Config::load(Path::new(&path)).map(Some);
        }
        let here = Path::new(CONFIG_FILE);
        if here.is_file() { Config::load(here).map(Some) } else { Ok(None) }
    }

    /// Reads the configuration at `path` and every tool file it names (relative to its
    /// own directory), checking each definition, each route and each service.
    ///
    /// # Errors
    ///
    /// `USAGE_ERROR` naming the file, a JSON pointer into it and the reason.
    ///
    /// # Example
    ///
    /// ```
    /// let config = toolledger::Config::load(std::path::Path::new(concat!(
    ///     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// let names: Vec<&str> = config.tools().iter().map(|tool| tool.definition.name.as_str()).collect();
    /// assert_eq!(names, ["send_invoice_email", "open_ticket", "refund_order"]);
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn load(path: &Path) -> Result<Config, Error> {
        let file = path.display().to_string();
        let bytes = read_file(&file, path, toolledger_contract::DEFINITION_BYTES_MAX)?;
        let document =
            parse_document(&file, &bytes).map_err(crate::definitions::definition_error)?;
        let top = only(&file, "", &document, &["services", "tools", "mcp", "$comment"])?;
        let mut services = BTreeMap::new();
        if let Some(declared) = top.get("services") {
            let declared = declared
                .as_object()
                .ok_or_else(|| refused(&file, "/services", "must be a table"))?;
            for (name, value) in declared {
                let service = service(&file, name, value)?;
                services.insert(name.clone(), service);
            }
        }
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let entries = match top.get("tools") {
            None => Vec::new(),
            Some(Value::Array(entries)) => entries.clone(),
            Some(_) => {
                return Err(refused(&file, "/tools", "must be an array of tables ([[tools]])"));
            }
        };
        if entries.len() > TOOLS_MAX {
            return Err(refused(&file, "/tools", format!("at most {TOOLS_MAX} tools")));
        }
        let mut tools: Vec<Declared> = Vec::new();
        for (index, entry) in entries.iter().enumerate() {
            let at = format!("/tools/{index}");
            let declared = tool(&file, &at, entry, &base, &services)?;
            if tools.iter().any(|tool| tool.definition.name == declared.definition.name) {
                return Err(refused(
                    &file,
                    &at,
                    format!("the tool {} is declared twice", declared.definition.name),
                ));
            }
            tools.push(declared);
        }
        let mcp = top.get("mcp").cloned();
        if mcp.as_ref().is_some_and(|mcp| !mcp.is_object()) {
            return Err(refused(&file, "/mcp", "must be a table"));
        }
        Ok(Config { file, dir: base, tools, services, mcp })
    }

    /// The directory it was read from: what its relative paths (tool files, an MCP
    /// upstream's command) are relative to.
    ///
    /// ```
    /// # let config = toolledger::Config::load(std::path::Path::new(concat!(
    /// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// assert!(config.dir().ends_with("examples"));
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `[mcp]` table as written, for the MCP gateway (`toolledger mcp`), which
    /// checks it member by member (`docs/mcp.md`); `None` when the file has none.
    ///
    /// ```
    /// # let config = toolledger::Config::load(std::path::Path::new(concat!(
    /// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// assert!(config.mcp().is_none());
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn mcp(&self) -> Option<&Value> {
        self.mcp.as_ref()
    }

    /// The file it was read from.
    ///
    /// ```
    /// # let config = toolledger::Config::load(std::path::Path::new(concat!(
    /// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// assert!(config.file().ends_with("toolledger.toml"));
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The declared tools, in the file's order.
    ///
    /// ```
    /// # let config = toolledger::Config::load(std::path::Path::new(concat!(
    /// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// assert_eq!(config.tools()[2].definition.name, "refund_order");
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn tools(&self) -> &[Declared] {
        &self.tools
    }

    /// The declared services, by name.
    ///
    /// ```
    /// # let config = toolledger::Config::load(std::path::Path::new(concat!(
    /// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// assert!(config.services().contains_key("reference"));
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn services(&self) -> &BTreeMap<String, ServiceDecl> {
        &self.services
    }

    /// Whether any tool's effects are performed by a declared service (else the
    /// simulation performs them).
    ///
    /// ```
    /// # let config = toolledger::Config::load(std::path::Path::new(concat!(
    /// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// assert!(config.has_routes());
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn has_routes(&self) -> bool {
        self.tools.iter().any(|tool| tool.route.is_some())
    }

    /// Each tool as the ledger registers it: `refund_order` composed with
    /// [`RefundOrder`]'s rules, every precondition asked of its tool's service.
    ///
    /// # Errors
    ///
    /// `USAGE_ERROR` naming an environment variable a service needs that is not set.
    ///
    /// ```
    /// # let config = toolledger::Config::load(std::path::Path::new(concat!(
    /// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// let tools = config.tool_specs()?;
    /// assert!(tools.iter().any(|tool| tool.name == "send_invoice_email"));
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn tool_specs(&self) -> Result<Vec<ToolSpec>, Error> {
        self.tools
            .iter()
            .map(|tool| {
                let code: Option<Arc<dyn toolledger_contract::ToolRules>> =
                    tool.builtin.then(|| Arc::new(RefundOrder::default()) as _);
                let precondition = match (&tool.definition.precondition, &tool.route) {
                    (Some(template), Some(route)) => {
                        let service = self.service_of(route)?;
                        let url = format!("{}{template}", service.base_url()?);
                        let ask = HttpPrecondition::new(&url, service.headers()?, service.timeouts);
                        Some(Arc::new(ask) as Arc<dyn Precondition>)
                    }
                    _ => None,
                };
                Ok(tool.definition.tool_with(code, precondition))
            })
            .collect()
    }

    /// The HTTP downstream of every routed tool, each endpoint of its service's URL,
    /// identity, timeouts and headers. `fallback` is the identity of tools of no service.
    ///
    /// # Errors
    ///
    /// `USAGE_ERROR` naming an environment variable that is not set, or a base URL that
    /// is not `http://`.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-config-{}-{}", std::process::id(), line!()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # let path = dir.join("toolledger.toml");
    /// let tool = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tools/open_ticket.toml");
    /// std::fs::write(&path, r#"
    /// [services.tickets]
    /// base_url = "http://127.0.0.1:8080"
    /// identity = "tickets-http@1"
    /// headers_from_env = { Authorization = "TICKETS_TOKEN_UNSET_IN_DOCS" }
    /// [[tools]]
    /// file = "TOOL_FILE"
    /// downstream = { service = "tickets", execute = "/tickets", lookup = "/tickets/by-key/{key}" }
    /// "#.replace("TOOL_FILE", tool)).unwrap();
    /// # let _ = &path;
    /// let config = toolledger::Config::load(&path)?;
    /// // The header's variable is not set: refused, naming it.
    /// let fallback = toolledger::DownstreamIdentity::new("unrouted", "1").unwrap();
    /// let refused = config.downstream(fallback).unwrap_err();
    /// assert!(refused.to_string().contains("TICKETS_TOKEN_UNSET_IN_DOCS is not set"));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn downstream(&self, fallback: DownstreamIdentity) -> Result<HttpDownstream, Error> {
        let mut http = HttpDownstream::new(fallback, Timeouts::default());
        for tool in &self.tools {
            let Some(route) = &tool.route else { continue };
            let service = self.service_of(route)?;
            let base = service.base_url()?;
            http = http.endpoint(
                &tool.definition.name,
                Endpoint {
                    execute_url: format!("{base}{}", route.execute),
                    lookup_url: format!("{base}{}", route.lookup),
                    headers: service.headers()?,
                    identity: Some(service.identity.clone()),
                    timeouts: Some(service.timeouts),
                },
            );
        }
        Ok(http)
    }

    fn service_of(&self, route: &Route) -> Result<&ServiceDecl, Error> {
        self.services.get(&route.service).ok_or_else(|| {
            refused(&self.file, "/services", format!("no service {}", route.service))
        })
    }
}

impl ServiceDecl {
    /// The base URL, read from its environment variable where the file says so.
    ///
    /// # Errors
    ///
    /// `USAGE_ERROR` when the variable is not set, or the URL is not `http://HOST…`.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-config-{}-{}", std::process::id(), line!()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # let path = dir.join("toolledger.toml");
    /// let tool = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tools/open_ticket.toml");
    /// std::fs::write(&path, r#"
    /// [services.tickets]
    /// base_url = "http://127.0.0.1:8080"
    /// identity = "tickets-http@1"
    /// headers_from_env = { Authorization = "TICKETS_TOKEN_UNSET_IN_DOCS" }
    /// [[tools]]
    /// file = "TOOL_FILE"
    /// downstream = { service = "tickets", execute = "/tickets", lookup = "/tickets/by-key/{key}" }
    /// "#.replace("TOOL_FILE", tool)).unwrap();
    /// # let _ = &path;
    /// let config = toolledger::Config::load(&path)?;
    /// assert_eq!(config.services()["tickets"].base_url()?, "http://127.0.0.1:8080");
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn base_url(&self) -> Result<String, Error> {
        let url = resolve(&self.base_url, &format!("services.{}.base_url", self.name))?;
        checked_base_url(&url)
            .map_err(|reason| Error::invalid(format!("services.{}.base_url: {reason}", self.name)))
    }

    /// The headers, each value read from its environment variable.
    ///
    /// # Errors
    ///
    /// `USAGE_ERROR` naming the first variable that is not set, or that holds no header
    /// value (a control character, a line break, whitespace at an end).
    ///
    /// ```
    /// # let config = toolledger::Config::load(std::path::Path::new(concat!(
    /// #     env!("CARGO_MANIFEST_DIR"), "/../../examples/toolledger.toml")))?;
    /// assert_eq!(config.services()["reference"].headers()?, Vec::new());
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn headers(&self) -> Result<Vec<(String, String)>, Error> {
        self.headers_from_env
            .iter()
            .map(|(header, variable)| {
                let at = format!("services.{}.headers_from_env.{header}", self.name);
                let value = resolve(&Setting::Env(variable.clone()), &at)?;
                if !is_header_value(&value) {
                    // The variable's name, never its value.
                    return Err(Error::invalid(format!(
                        "{at}: the environment variable {variable} does not hold a header value (a control character, a line break, or whitespace at an end)"
                    )));
                }
                Ok((header.clone(), value))
            })
            .collect()
    }
}

/// A service's base URL as requests are made to it (no trailing `/`), or why it cannot
/// be one: one rule for a URL written in the file (checked when it is read) and one
/// read from the environment (checked when it is used).
fn checked_base_url(url: &str) -> Result<String, &'static str> {
    if url.get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://")) {
        return Err("TLS is not built in; use http:// (a local proxy can terminate TLS)");
    }
    match url.strip_prefix("http://") {
        Some(rest)
            if !rest.is_empty()
                && !rest.starts_with('/')
                && rest.bytes().all(|byte| byte.is_ascii_graphic()) =>
        {
            Ok(url.trim_end_matches('/').to_owned())
        }
        _ => Err("expected http://HOST:PORT"),
    }
}

fn resolve(setting: &Setting, at: &str) -> Result<String, Error> {
    match setting {
        Setting::Literal(text) => Ok(text.clone()),
        Setting::Env(variable) => match std::env::var(variable) {
            Ok(value) if !value.is_empty() => Ok(value),
            // The variable's name, never a value.
            _ => {
                Err(Error::invalid(format!("{at}: the environment variable {variable} is not set")))
            }
        },
    }
}

fn is_env_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

fn is_header_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The headers the HTTP downstream writes itself, or that frame the message: a
/// configuration naming one would send it twice (a second `Idempotency-Key`, forged
/// from the environment) or break every request's framing.
const RESERVED_HEADERS: [&str; 10] = [
    "Idempotency-Key",
    "Content-Type",
    "Content-Length",
    "Transfer-Encoding",
    "Connection",
    "Host",
    "Expect",
    "TE",
    "Trailer",
    "Upgrade",
];

/// A header value RFC 9110 allows: visible ASCII or obs-text, spaces and tabs, and
/// no leading or trailing whitespace; never a CR, an LF or another control character.
fn is_header_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7F))
        && !bytes.first().is_some_and(|b| matches!(b, b' ' | b'\t'))
        && !bytes.last().is_some_and(|b| matches!(b, b' ' | b'\t'))
}

fn service(file: &str, name: &str, value: &Value) -> Result<ServiceDecl, Error> {
    let at = format!("/services/{name}");
    let members = only(
        file,
        &at,
        value,
        &[
            "base_url",
            "base_url_env",
            "identity",
            "connect_timeout_ms",
            "timeout_ms",
            "headers_from_env",
        ],
    )?;
    if !toolledger_contract::is_tool_name(name) {
        return Err(refused(file, &at, "a service name is 1-64 bytes of [A-Za-z0-9_-]"));
    }
    let text = |member: &str| -> Result<Option<String>, Error> {
        match members.get(member) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(refused(file, &format!("{at}/{member}"), "must be a string")),
        }
    };
    let base_url = match (text("base_url")?, text("base_url_env")?) {
        (Some(url), None) => {
            checked_base_url(&url)
                .map_err(|reason| refused(file, &format!("{at}/base_url"), reason))?;
            Setting::Literal(url)
        }
        (None, Some(variable)) if is_env_name(&variable) => Setting::Env(variable),
        (None, Some(_)) => {
            return Err(refused(
                file,
                &format!("{at}/base_url_env"),
                "an environment variable's name, [A-Z0-9_]",
            ));
        }
        _ => return Err(refused(file, &at, "exactly one of base_url and base_url_env")),
    };
    let identity = text("identity")?
        .ok_or_else(|| refused(file, &format!("{at}/identity"), "is required (NAME@REVISION)"))?;
    let identity = identity
        .split_once('@')
        .and_then(|(name, revision)| DownstreamIdentity::new(name, revision).ok())
        .filter(|identity| identity.name() != toolledger_store::STAND_IN_NAME)
        .ok_or_else(|| {
            refused(
                file,
                &format!("{at}/identity"),
                "NAME@REVISION, each 1-128 bytes of [A-Za-z0-9._:/-], and not the simulation's",
            )
        })?;
    let millis = |member: &str, default: u64| -> Result<Duration, Error> {
        match members.get(member) {
            None => Ok(Duration::from_millis(default)),
            Some(value) => value
                .as_u64()
                .filter(|ms| (1..=600_000).contains(ms))
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    refused(file, &format!("{at}/{member}"), "milliseconds from 1 to 600000")
                }),
        }
    };
    let total = millis("timeout_ms", 10_000)?;
    let connect = millis("connect_timeout_ms", 2_000)?.min(total);
    let mut headers_from_env = Vec::new();
    if let Some(value) = members.get("headers_from_env") {
        let headers = value
            .as_object()
            .ok_or_else(|| refused(file, &format!("{at}/headers_from_env"), "must be a table"))?;
        for (header, variable) in headers {
            let here = format!("{at}/headers_from_env/{header}");
            let variable = variable.as_str().filter(|variable| is_env_name(variable)).ok_or_else(
                || refused(file, &here, "the name of the environment variable holding the value (never the value itself)"),
            )?;
            if !is_header_name(header) {
                return Err(refused(file, &here, "a header name is 1-64 bytes of [A-Za-z0-9-]"));
            }
            if RESERVED_HEADERS.iter().any(|reserved| reserved.eq_ignore_ascii_case(header)) {
                return Err(refused(
                    file,
                    &here,
                    format!(
                        "the HTTP downstream writes this header itself or it frames the message; none of {} may be configured",
                        RESERVED_HEADERS.join(", ")
                    ),
                ));
            }
            headers_from_env.push((header.clone(), variable.to_owned()));
        }
    }
    Ok(ServiceDecl {
        name: name.to_owned(),
        base_url,
        identity,
        timeouts: Timeouts { connect, total },
        headers_from_env,
    })
}

fn tool(
    file: &str,
    at: &str,
    entry: &Value,
    base: &Path,
    services: &BTreeMap<String, ServiceDecl>,
) -> Result<Declared, Error> {
    let members = entry.as_object().ok_or_else(|| refused(file, at, "must be a table"))?;
    let (definition, source, builtin) = if let Some(path) = members.get("file") {
        only(file, at, entry, &["file", "downstream"])?;
        let path =
            path.as_str().ok_or_else(|| refused(file, &format!("{at}/file"), "must be a path"))?;
        let full: PathBuf = base.join(path);
        let definition = crate::load_tool(&full)?;
        (definition, full.display().to_string(), false)
    } else if let Some(name) = members.get("builtin") {
        only(file, at, entry, &["builtin", "downstream"])?;
        if name.as_str() != Some("refund_order") {
            return Err(refused(
                file,
                &format!("{at}/builtin"),
                "the one built-in tool is \"refund_order\"",
            ));
        }
        let document = parse_document("refund_order.toml", REFUND_ORDER_DEFINITION.as_bytes())
            .map_err(crate::definitions::definition_error)?;
        let definition = ToolDefinition::from_document("refund_order.toml", &document)
            .map_err(crate::definitions::definition_error)?;
        (definition, "refund_order (built in)".to_owned(), true)
    } else {
        let definition = ToolDefinition::from_document(file, entry)
            .map_err(|err| refused(file, &format!("{at}{}", err.pointer), err.reason))?;
        (definition, file.to_owned(), false)
    };
    // A route written beside a file's definition wins over the file's own.
    let downstream = members.get("downstream").or(definition.downstream.as_ref());
    let route = match downstream {
        None => None,
        Some(value) => Some(route(file, &format!("{at}/downstream"), value, services)?),
    };
    if definition.precondition.is_some() && route.is_none() {
        return Err(refused(
            file,
            at,
            format!(
                "{} declares a precondition, asked of its downstream, and has none",
                definition.name
            ),
        ));
    }
    if let Some(template) = &definition.precondition {
        if !template.starts_with('/') {
            return Err(refused(file, at, "a precondition is a path under the service, \"/…\""));
        }
    }
    Ok(Declared { definition, source, route, builtin })
}

fn route(
    file: &str,
    at: &str,
    value: &Value,
    services: &BTreeMap<String, ServiceDecl>,
) -> Result<Route, Error> {
    let members = only(file, at, value, &["service", "execute", "lookup"])?;
    let text = |member: &str| -> Result<String, Error> {
        members
            .get(member)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| refused(file, &format!("{at}/{member}"), "is required (a string)"))
    };
    let service = text("service")?;
    if !services.contains_key(&service) {
        return Err(refused(
            file,
            &format!("{at}/service"),
            format!("no service {service:?} in [services]"),
        ));
    }
    let execute = text("execute")?;
    let lookup = text("lookup")?;
    for (member, path) in [("execute", &execute), ("lookup", &lookup)] {
        if !path.starts_with('/') || path.contains(char::is_whitespace) {
            return Err(refused(
                file,
                &format!("{at}/{member}"),
                "a path under the service, \"/…\"",
            ));
        }
    }
    let names =
        placeholders(&lookup).map_err(|reason| refused(file, &format!("{at}/lookup"), reason))?;
    if names != ["key"] {
        return Err(refused(
            file,
            &format!("{at}/lookup"),
            "the lookup path holds {key} once, and no other placeholder",
        ));
    }
    Ok(Route { service, execute, lookup })
}
