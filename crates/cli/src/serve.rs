//! `toolledger serve`: the operator's dashboard over HTTP, rendered on the server.
//!
//! Pages: `/` (the overview: counts by state, the oldest pending and unknown ages, the
//! relay's lag over time, dead letters, quarantined and unknown operations),
//! `/operations` (filter by state, tool and age; keyset pages; a `status_ref` search),
//! `/operations/REF` (its whole history), `/metrics` (the `metrics` command's text) and
//! `/healthz`. With `--allow-actions`, `POST /operations/REF/requeue` puts a dead or
//! failed operation back to pending through the same library call and operator log as
//! `toolledger requeue`.
//!
//! Security: loopback by default; another address needs `--allow-remote` and a token,
//! and then every request carries it. Read-only unless `--allow-actions`, and an action
//! needs the token (a header or a form field) and must come from the dashboard's own
//! origin: every browser mark it carries must say so, and a cross-site form post is
//! refused even with the token. Pages carry a policy that allows no script, frame or
//! foreign form target, and show no path, SQL or token. Connections, their bounds and
//! the `Host` rule are [`listener`]'s, which `relay --metrics-listen` serves on too.

use std::{
    collections::VecDeque,
    io::Write,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use toolledger::{ListFilter, Location, STATES, StatusRef};

use toolledger::read_bounded;

use crate::{
    html::{age, cell, escape, operation_link, page, plot, query_value, state as tag},
    run::{Failure, Printed},
};

use self::listener::{Limits, Listener, Refusal, Request, Served};

/// How `serve` was started.
#[derive(Debug)]
pub(crate) struct Options {
    /// The declared tools, one JSON object each, as `tools list` prints them.
    pub(crate) tools: Vec<serde_json::Value>,
    pub(crate) listen: SocketAddr,
    pub(crate) allow_remote: bool,
    pub(crate) allow_actions: bool,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) show_arguments: bool,
    pub(crate) sample_seconds: u64,
    pub(crate) now: Option<i64>,
}

/// Operations per list page.
const PAGE: usize = 50;
/// Lag samples kept: six hours at the default period of 10 s.
const SAMPLES: usize = 2_160;
/// The longest request body read (a requeue form).
const BODY_MAX: usize = 8_192;
/// Connections held at once. Past it the oldest one not being answered is closed to make
/// room (`listener`), so idle connections lock nobody out; the cap keeps the descriptors
/// they hold well below the usual limit of 1024, which the ledger's own files need too.
const CONNECTIONS_MAX: usize = 256;

/// What the server shares between its threads.
struct State {
    db: Location,
    options: Options,
    token: Option<String>,
    /// `(instant, oldest pending age)`, oldest first: what the lag plot draws.
    samples: Mutex<VecDeque<(i64, i64)>>,
    started: Instant,
}

impl State {
    /// The instant pages are judged at: the wall clock, or `--now` advanced by the time
    /// the server has run (a drill's clock moves too).
    fn now(&self) -> Option<i64> {
        let elapsed = i64::try_from(self.started.elapsed().as_secs()).unwrap_or(i64::MAX);
        self.options.now.map(|now| now.saturating_add(elapsed))
    }
}

/// Runs the dashboard until SIGTERM or SIGINT.
pub(crate) fn run(db: &Location, options: Options) -> Result<Printed, Failure> {
    let refused = |message: &str| Failure { code: "USAGE_ERROR", message: message.to_owned() };
    let token = match &options.token_file {
        Some(path) => Some(read_token(path)?),
        None => None,
    };
    let remote_allowed = options.allow_remote && token.is_some();
    if !(options.listen.ip().is_loopback() || remote_allowed) {
        return Err(refused(
            "--listen on a non-loopback address needs --allow-remote and --token-file",
        ));
    }
    if options.allow_actions && token.is_none() {
        return Err(refused("--allow-actions needs --token-file"));
    }
    // The ledger must exist: the dashboard creates nothing.
    opens(db)?;
    let limits = Limits { body_bytes_max: BODY_MAX, connections_max: CONNECTIONS_MAX };
    let listener = Listener::bind(options.listen, limits)
        .map_err(|_| refused("--listen could not be bound"))?;
    let bound = listener.bound();
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).map_err(|_| Failure {
            code: "INTERNAL_ERROR",
            message: "the server could not set up its signal handling".to_owned(),
        })?;
    }
    let state = Arc::new(State {
        db: db.clone(),
        options,
        token,
        samples: Mutex::new(VecDeque::new()),
        started: Instant::now(),
    });
    let sampler = {
        let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
        std::thread::spawn(move || sample(&state, &stop))
    };
    // The first line on stdout, as the reference service prints it: callers wait for it.
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "listening on {bound}");
    let _ = stdout.flush();
    let served = listener.serve(Arc::new(Dashboard { state, bound }), &stop);
    // The sampler ends with the flag.
    stop.store(true, Ordering::SeqCst);
    let _ = sampler.join();
    Ok(Printed::Package(json!({"gate": "PASS", "code": "OK", "served": served}), true))
}

/// Whether the ledger opens as a store of this version, creating nothing: what start-up
/// and `/healthz` check (a connection and the schema, no count of a 1M-row table).
fn opens(db: &Location) -> Result<(), toolledger::Error> {
    toolledger::Store::open_existing(
        db,
        toolledger::Waits::default(),
        toolledger::StoreClock::Database,
    )
    .map(drop)
}

/// The token in `path`: its first line, at least 16 bytes of visible ASCII.
fn read_token(path: &std::path::Path) -> Result<String, Failure> {
    let bytes = read_bounded(path, 4_096).map_err(|why| Failure {
        code: "USAGE_ERROR",
        message: format!("the token file {}", why.reason()),
    })?;
    let text = String::from_utf8(bytes).unwrap_or_default();
    let token = text.lines().next().unwrap_or_default().trim();
    if token.len() < 16 || !token.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(Failure {
            code: "USAGE_ERROR",
            message: "the token file must hold one line of at least 16 visible ASCII characters"
                .to_owned(),
        });
    }
    Ok(token.to_owned())
}

/// Samples the relay's lag every `--sample-seconds` until `stop`.
fn sample(state: &State, stop: &AtomicBool) {
    let period = Duration::from_secs(state.options.sample_seconds.max(1));
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() >= next {
            next += period;
            let now = state.now();
            if let Ok(figures) = toolledger::figures(&state.db, now) {
                let at = now.unwrap_or_else(crate::clock::wall_seconds);
                let mut samples = state.samples.lock().unwrap_or_else(|poison| poison.into_inner());
                if samples.len() == SAMPLES {
                    samples.pop_front();
                }
                samples.push_back((at, figures.oldest_pending_age));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One answer.
struct Page {
    status: u16,
    content_type: &'static str,
    body: String,
    location: Option<String>,
}

impl Page {
    fn html(status: u16, body: String) -> Page {
        Page { status, content_type: "text/html; charset=utf-8", body, location: None }
    }

    fn text(status: u16, content_type: &'static str, body: String) -> Page {
        Page { status, content_type, body, location: None }
    }

    fn see_other(location: String) -> Page {
        Page {
            status: 303,
            content_type: "text/plain; charset=utf-8",
            body: String::new(),
            location: Some(location),
        }
    }

    /// An error page: a stable code and a fixed message, never the input.
    fn error(status: u16, code: &str, message: &str) -> Page {
        let body = format!(
            "<h1>{}</h1><p class=\"error\"><code>{}</code>: {}</p>",
            escape(title(status)),
            escape(code),
            escape(message)
        );
        Page::html(status, page(title(status), &body))
    }
}

fn title(status: u16) -> &'static str {
    match status {
        400 => "Bad request",
        403 => "Forbidden",
        404 => "Not found",
        405 => "Method not allowed",
        408 => "Request timeout",
        409 => "Conflict",
        411 => "Length required",
        413 => "Request too large",
        421 => "Misdirected request",
        501 => "Not implemented",
        _ => "Unavailable",
    }
}

impl From<toolledger::Error> for Page {
    fn from(err: toolledger::Error) -> Page {
        let status = match err.code().as_str() {
            "USAGE_ERROR" => 400,
            _ => 503,
        };
        Page::error(status, err.code().as_str(), &err.to_string())
    }
}

/// The dashboard as a listener's service: each answer with the pages' security headers.
struct Dashboard {
    state: Arc<State>,
    bound: SocketAddr,
}

impl listener::Service for Dashboard {
    fn answer(&self, request: &Request) -> Served {
        secured(respond(&self.state, self.bound, request))
    }

    fn refuse(&self, refusal: Refusal) -> Served {
        secured(Page::error(refusal.status, refusal.code, refusal.message))
    }
}

/// The answer to `request`.
fn respond(state: &State, bound: SocketAddr, request: &Request) -> Page {
    let header = |name: &str| request.header(name).map(str::to_owned);
    let headers = Headers {
        origin: header("Origin"),
        referer: header("Referer"),
        host: header("Host"),
        fetch_site: header("Sec-Fetch-Site"),
        token: header("X-Toolledger-Token").or_else(|| {
            header("Authorization")
                .and_then(|value| value.strip_prefix("Bearer ").map(str::to_owned))
        }),
        form: header("Content-Type")
            .is_some_and(|value| value.starts_with("application/x-www-form-urlencoded")),
    };
    handle(state, bound, request.method(), request.target(), &headers, request.body())
}

/// `reply` with the headers every page carries.
fn secured(reply: Page) -> Served {
    let mut headers = vec![
        ("Content-Type", reply.content_type.to_owned()),
        ("Cache-Control", "no-store".to_owned()),
        ("X-Content-Type-Options", "nosniff".to_owned()),
        ("Referrer-Policy", "same-origin".to_owned()),
        (
            "Content-Security-Policy",
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'"
                .to_owned(),
        ),
    ];
    if let Some(location) = reply.location {
        headers.push(("Location", location));
    }
    Served { status: reply.status, headers, body: reply.body.into_bytes() }
}

/// The request headers the server judges.
struct Headers {
    host: Option<String>,
    origin: Option<String>,
    referer: Option<String>,
    fetch_site: Option<String>,
    token: Option<String>,
    form: bool,
}

/// Whether `given` is the token, compared in time independent of where they differ.
fn token_matches(token: &str, given: &str) -> bool {
    token.len() == given.len()
        && token.bytes().zip(given.bytes()).fold(0_u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

fn handle(
    state: &State,
    bound: SocketAddr,
    method: &str,
    url: &str,
    headers: &Headers,
    body: &[u8],
) -> Page {
    // (A loopback listener has already refused a request whose `Host` is not ours.)
    if !bound.ip().is_loopback() {
        let given = headers.token.as_deref().unwrap_or_default();
        if !state.token.as_deref().is_some_and(|token| token_matches(token, given)) {
            return Page::error(
                403,
                "TOKEN_REQUIRED",
                "this server needs its token on every request",
            );
        }
    }
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let Some(query) = parse_form(query.as_bytes()) else {
        return Page::error(400, "USAGE_ERROR", "the query is not valid form encoding");
    };
    match (method, path) {
        ("GET", "/") => overview(state),
        ("GET", "/operations") => operations(state, &query),
        ("GET", "/tools") => tools(state),
        ("GET", "/healthz") => match opens(&state.db) {
            Ok(_) => Page::text(200, "text/plain; charset=utf-8", "ok\n".to_owned()),
            Err(_) => Page::text(503, "text/plain; charset=utf-8", "unavailable\n".to_owned()),
        },
        ("GET", "/metrics") => match toolledger::metrics(&state.db, state.now()) {
            Ok(text) => Page::text(200, "text/plain; version=0.0.4; charset=utf-8", text),
            Err(err) => err.into(),
        },
        ("GET", "/style.css") => {
            Page::text(200, "text/css; charset=utf-8", crate::html::STYLE.to_owned())
        }
        ("GET", path) if path.starts_with("/operations/") => {
            let wanted = percent_decode(&path.as_bytes()["/operations/".len()..]);
            operation(state, wanted.as_deref().unwrap_or_default())
        }
        ("POST", path) if path.starts_with("/operations/") && path.ends_with("/requeue") => {
            let status_ref = &path.as_bytes()["/operations/".len()..path.len() - "/requeue".len()];
            let wanted = percent_decode(status_ref);
            requeue(state, bound, wanted.as_deref().unwrap_or_default(), headers, body)
        }
        ("GET" | "POST", _) => Page::error(404, "NOT_FOUND", "no such page"),
        _ => Page::error(405, "METHOD_NOT_ALLOWED", "only GET, and POST for actions"),
    }
}

/// The tools this dashboard's configuration declares: what each does, its revisions,
/// and who performs it.
fn tools(state: &State) -> Page {
    let text = |tool: &serde_json::Value, pointer: &str| {
        escape(tool.pointer(pointer).and_then(serde_json::Value::as_str).unwrap_or(""))
    };
    let mut body = String::from(
        "<h1>Tools</h1><table class=\"tools\"><tr><th>tool</th><th>description</th>\
         <th>input</th><th>output</th><th>policy</th><th>performed by</th></tr>",
    );
    for tool in &state.options.tools {
        let performer =
            match tool.pointer("/downstream/identity").and_then(serde_json::Value::as_str) {
                Some(identity) => escape(identity),
                None => "the simulation".to_owned(),
            };
        body.push_str(&format!(
            "<tr id=\"tool-{name}\"><td><code>{name}</code></td><td>{}</td><td><code>{}</code></td>\
             <td><code>{}</code></td><td><code>{}</code></td><td>{performer}</td></tr>",
            text(tool, "/description"),
            text(tool, "/revisions/input"),
            text(tool, "/revisions/output"),
            text(tool, "/revisions/policy"),
            name = text(tool, "/name"),
        ));
    }
    body.push_str("</table>");
    Page::html(200, crate::html::page("Tools", &body))
}

fn overview(state: &State) -> Page {
    let now = state.now();
    let figures = match toolledger::figures(&state.db, now) {
        Ok(figures) => figures,
        Err(err) => return err.into(),
    };
    let mut body = String::from("<h1>Overview</h1><section id=\"counts\">");
    for (name, count) in &figures.by_state {
        body.push_str(&format!(
            "<a class=\"figure\" href=\"/operations?state={name}\" id=\"count-{name}\">{} <b>{count}</b></a>",
            tag(name)
        ));
    }
    body.push_str(&format!(
        "</section><p><span class=\"figure\" id=\"oldest-pending\">oldest pending <b>{}</b></span>\
         <span class=\"figure\" id=\"oldest-unknown\">oldest unknown <b>{}</b></span></p>",
        age(figures.oldest_pending_age),
        age(figures.oldest_unknown_age)
    ));
    let samples: Vec<(i64, i64)> =
        state.samples.lock().map(|samples| samples.iter().copied().collect()).unwrap_or_default();
    body.push_str(&format!(
        "<h2>Relay lag: the oldest pending operation's age, sampled every {} s</h2>{}",
        state.options.sample_seconds,
        plot(&samples, "the oldest pending operation's age over time")
    ));
    for (name, heading, hint) in [
        (
            "unknown",
            "Unknown outcomes",
            "The downstream may have acted: settle each with an explicit status query \
             (<code>toolledger status --status-ref REF</code>) or let a relay take it.",
        ),
        (
            "dead",
            "Dead letters",
            "Used up their attempts without being sent: requeue once the cause is fixed.",
        ),
        (
            "quarantined",
            "Quarantined",
            "A downstream answer broke the tool's output contract: never retried.",
        ),
    ] {
        let filter = ListFilter { state: Some(name), limit: 20, ..ListFilter::default() };
        let listed = match toolledger::list(&state.db, &filter, false, now) {
            Ok(listed) => listed,
            Err(err) => return err.into(),
        };
        body.push_str(&format!("<h2 id=\"{name}\">{heading}</h2><p>{hint}</p>"));
        body.push_str(&table(&listed, false));
        if listed.len() == 20 {
            body.push_str(&format!(
                "<p><a href=\"/operations?state={name}\">All {name} operations</a></p>"
            ));
        }
    }
    Page::html(200, page("Overview", &body))
}

/// Listed operations as a table, or a line saying there are none.
fn table(listed: &[toolledger::Listed], arguments: bool) -> String {
    if listed.is_empty() {
        return "<p class=\"empty\">None.</p>".to_owned();
    }
    let mut out = String::from(
        "<table class=\"operations\"><tr><th>status_ref</th><th>tool</th><th>state</th>\
         <th>attempts</th><th>age</th><th>unchanged for</th><th>last reason</th>",
    );
    if arguments {
        out.push_str("<th>arguments</th>");
    }
    out.push_str("</tr>");
    for item in listed {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td>",
            operation_link(&item.status_ref),
            escape(&item.tool),
            tag(item.state),
            item.attempts,
            age(item.age),
            age(item.idle),
            item.reason.as_deref().map_or_else(|| "–".to_owned(), escape),
        ));
        if arguments {
            out.push_str(&format!(
                "<td><code>{}</code></td>",
                escape(item.arguments.as_deref().unwrap_or("–"))
            ));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

fn operations(state: &State, query: &[(String, String)]) -> Page {
    let get = |name: &str| {
        query
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.trim())
            .filter(|value| !value.is_empty())
    };
    if let Some(wanted) = get("q") {
        return match StatusRef::new(wanted) {
            Ok(status_ref) => {
                Page::see_other(format!("/operations/{}", query_value(status_ref.as_str())))
            }
            Err(_) => {
                Page::error(404, "NOT_FOUND", "that is not a status_ref (sr_ and 32 hex digits)")
            }
        };
    }
    let chosen = get("state");
    if chosen.is_some_and(|chosen| !STATES.contains(&chosen)) {
        return Page::error(400, "USAGE_ERROR", "unknown state");
    }
    let tool = get("tool");
    if tool.is_some_and(|tool| tool.len() > 128) {
        return Page::error(400, "USAGE_ERROR", "the tool name is too long");
    }
    let minutes = match get("older_than_minutes").map(str::parse::<i64>) {
        None => 0,
        Some(Ok(minutes)) if (0..=5_256_000).contains(&minutes) => minutes,
        Some(_) => {
            return Page::error(400, "USAGE_ERROR", "older_than_minutes must be 0 to 5256000");
        }
    };
    let filter = ListFilter {
        state: chosen,
        tool,
        older_than: minutes * 60,
        limit: PAGE,
        after: get("after"),
    };
    let show_arguments = state.options.show_arguments;
    let listed = match toolledger::list(&state.db, &filter, show_arguments, state.now()) {
        Ok(listed) => listed,
        Err(err) => return err.into(),
    };
    let mut body = String::from(
        "<h1>Operations</h1><form class=\"filter\" method=\"get\" action=\"/operations\">",
    );
    body.push_str(
        "<label>state<select name=\"state\" id=\"filter-state\"><option value=\"\">any</option>",
    );
    for known in STATES {
        let selected = if chosen == Some(known) { " selected" } else { "" };
        body.push_str(&format!("<option value=\"{known}\"{selected}>{known}</option>"));
    }
    body.push_str(&format!(
        "</select></label><label>tool<input name=\"tool\" id=\"filter-tool\" value=\"{}\"></label>\
         <label>unchanged for at least (minutes)<input name=\"older_than_minutes\" id=\"filter-age\" \
         inputmode=\"numeric\" value=\"{}\"></label><button id=\"filter-apply\">Filter</button></form>\
         <form class=\"filter\" method=\"get\" action=\"/operations\"><label>status_ref\
         <input name=\"q\" id=\"search-ref\" placeholder=\"sr_…\"></label><button id=\"search-go\">Open</button></form>",
        escape(tool.unwrap_or_default()),
        if minutes == 0 { String::new() } else { minutes.to_string() },
    ));
    body.push_str(&table(&listed, show_arguments));
    if let (true, Some(last)) = (listed.len() == PAGE, listed.last()) {
        let mut next = format!("/operations?after={}", query_value(&last.cursor));
        for (name, value) in [("state", chosen), ("tool", tool)] {
            if let Some(value) = value {
                next.push_str(&format!("&{name}={}", query_value(value)));
            }
        }
        if minutes > 0 {
            next.push_str(&format!("&older_than_minutes={minutes}"));
        }
        body.push_str(&format!(
            "<p><a id=\"next-page\" href=\"{}\">Next page</a></p>",
            escape(&next)
        ));
    }
    Page::html(200, page("Operations", &body))
}

fn operation(state: &State, wanted: &str) -> Page {
    let Ok(status_ref) = StatusRef::new(wanted) else {
        return Page::error(404, "NOT_FOUND", "no such operation");
    };
    let shown = match toolledger::show(&state.db, &status_ref, state.options.show_arguments) {
        Ok(Some(shown)) => shown,
        Ok(None) => return Page::error(404, "NOT_FOUND", "no such operation"),
        Err(err) => return err.into(),
    };
    let status = shown["status"].as_str().unwrap_or_default();
    let mut body = format!(
        "<h1>Operation <span class=\"ref\">{}</span></h1><p id=\"status\">{}</p>",
        escape(status_ref.as_str()),
        state_of(status, &shown, state.now().unwrap_or_else(crate::clock::wall_seconds))
    );
    body.push_str("<table id=\"history\">");
    for (label, value) in [
        ("tool", &shown["tool"]),
        ("created at", &shown["created_at"]),
        ("downstream", &shown["downstream"]),
        ("downstream request ref", &shown["downstream_request_ref"]),
        ("request sha256", &shown["request_sha256"]),
        ("approval", &shown["approval_id"]),
        ("revisions", &shown["revisions"]),
        ("outbox state", &shown["outbox"]["state"]),
        ("attempts", &shown["outbox"]["attempts"]),
        ("attempts before the last requeue", &shown["outbox"]["attempts_before_requeue"]),
        ("lease owner", &shown["outbox"]["lease_owner"]),
        ("lease until", &shown["outbox"]["lease_until"]),
        ("next attempt at", &shown["outbox"]["next_attempt_at"]),
        ("last reason", &shown["outbox"]["last_reason"]),
        ("receipt", &shown["receipt"]),
        ("how it ended", &shown["ended"]),
        ("tombstone", &shown["tombstone"]),
        ("arguments", &shown["arguments"]),
    ] {
        if label == "arguments" && !state.options.show_arguments {
            continue;
        }
        body.push_str(&format!("<tr><th>{label}</th><td>{}</td></tr>", cell(value)));
    }
    body.push_str("</table><h2>Operator actions</h2>");
    match shown["operator_log"].as_array() {
        Some(log) if !log.is_empty() => {
            body.push_str("<table id=\"operator-log\"><tr><th>at</th><th>action</th><th>from</th><th>reason</th></tr>");
            for entry in log {
                body.push_str(&format!(
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    cell(&entry["at"]),
                    cell(&entry["action"]),
                    cell(&entry["from"]),
                    cell(&entry["reason"])
                ));
            }
            body.push_str("</table>");
        }
        _ => body.push_str("<p class=\"empty\">None.</p>"),
    }
    if matches!(status, "dead" | "failed") {
        if state.options.allow_actions {
            body.push_str(&format!(
                "<h2>Requeue</h2><form method=\"post\" action=\"/operations/{}/requeue\" id=\"requeue\">\
                 <label>reason (kept in the operator log)<input name=\"reason\" id=\"requeue-reason\" \
                 required maxlength=\"512\"></label><label>token<input type=\"password\" name=\"token\" \
                 id=\"requeue-token\" autocomplete=\"off\"></label><button id=\"requeue-go\">Requeue</button></form>",
                query_value(status_ref.as_str())
            ));
        } else {
            body.push_str(
                "<p class=\"empty\">Read-only: start the server with --allow-actions to requeue.</p>",
            );
        }
    }
    Page::html(200, page("Operation", &body))
}

/// The operation's state as the list names it: `unknown` for a processing operation
/// whose lease has ended.
fn state_of(status: &str, shown: &Value, now: i64) -> String {
    // As `list` judges it: nobody is working it when its lease has ended or a relay set
    // its attempt aside (the reason kept).
    let outbox = &shown["outbox"];
    let unknown = status == "processing"
        && outbox["state"].as_str() == Some("processing")
        && (outbox["lease_until"].as_i64().is_some_and(|until| until <= now)
            || outbox["last_reason"].is_string());
    tag(if unknown { "unknown" } else { status })
}

fn requeue(state: &State, bound: SocketAddr, wanted: &str, headers: &Headers, body: &[u8]) -> Page {
    if !state.options.allow_actions {
        return Page::error(
            403,
            "READ_ONLY",
            "actions are disabled: start the server with --allow-actions",
        );
    }
    if !same_origin(bound, headers) {
        return Page::error(
            403,
            "CROSS_SITE",
            "actions are accepted only from this dashboard's own pages",
        );
    }
    let form = match (headers.form, parse_form(body)) {
        (false, _) => Vec::new(),
        (true, Some(form)) => form,
        (true, None) => {
            return Page::error(400, "USAGE_ERROR", "the form is not valid form encoding");
        }
    };
    let field =
        |name: &str| form.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str());
    let given = headers.token.as_deref().or_else(|| field("token")).unwrap_or_default();
    if !state.token.as_deref().is_some_and(|token| token_matches(token, given)) {
        return Page::error(
            403,
            "TOKEN_REQUIRED",
            "the token is missing or wrong: nothing was changed",
        );
    }
    // The library's rule, as the command line applies it: refused, never shortened.
    let Some(reason) = toolledger::operator_reason(field("reason").unwrap_or_default()) else {
        return Page::error(
            400,
            "USAGE_ERROR",
            "a reason of 1 to 512 bytes without control characters is required",
        );
    };
    let Ok(status_ref) = StatusRef::new(wanted) else {
        return Page::error(404, "NOT_FOUND", "no such operation");
    };
    match toolledger::requeue(&state.db, &status_ref, reason, state.now()) {
        Ok(toolledger::Requeued::Requeued) => {
            Page::see_other(format!("/operations/{}", query_value(status_ref.as_str())))
        }
        Ok(toolledger::Requeued::Missing) => Page::error(404, "NOT_FOUND", "no such operation"),
        Ok(toolledger::Requeued::Refused(status)) => Page::error(
            409,
            "NOT_REQUEUEABLE",
            &format!(
                "only a dead or failed operation is requeued; this one is {}",
                status.as_str()
            ),
        ),
        Err(err) => err.into(),
    }
}

/// Whether a request to act comes from the dashboard's own pages. Every browser mark
/// present must say so: `Sec-Fetch-Site` only `same-origin` (`none`, a typed or
/// bookmarked request, is not a form of ours), `Origin` this server's, `Referer` a page
/// of this server. With no mark at all (a script, not a browser), the token must be in a
/// header, where no form can put it.
fn same_origin(bound: SocketAddr, headers: &Headers) -> bool {
    let origins = [
        Some(format!("http://{bound}")),
        headers.host.as_ref().map(|host| format!("http://{host}")),
    ];
    let ours = |url: &str, exact: bool| {
        origins.iter().flatten().any(|origin| match url.strip_prefix(origin.as_str()) {
            Some(rest) => {
                if exact {
                    rest.is_empty()
                } else {
                    rest.starts_with('/')
                }
            }
            None => false,
        })
    };
    let (site, origin, referer) = (&headers.fetch_site, &headers.origin, &headers.referer);
    if site.is_none() && origin.is_none() && referer.is_none() {
        return headers.token.is_some();
    }
    site.as_deref().is_none_or(|site| site == "same-origin")
        && origin.as_deref().is_none_or(|origin| ours(origin, true))
        && referer.as_deref().is_none_or(|referer| ours(referer, false))
}

/// `a=1&b=x%20y` as pairs (at most 32), `+` as a space, percent escapes decoded; `None`
/// when an escape is malformed or the decoded bytes are not UTF-8 (a refusal, never a
/// replacement character).
fn parse_form(text: &[u8]) -> Option<Vec<(String, String)>> {
    text.split(|&byte| byte == b'&')
        .filter(|pair| !pair.is_empty())
        .take(32)
        .map(|pair| {
            let (key, value) = match pair.iter().position(|&byte| byte == b'=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => (pair, &[][..]),
            };
            let plus = |part: &[u8]| -> Vec<u8> {
                part.iter().map(|&byte| if byte == b'+' { b' ' } else { byte }).collect()
            };
            Some((percent_decode(&plus(key))?, percent_decode(&plus(value))?))
        })
        .collect()
}

/// `text` with its `%XX` escapes decoded, strictly: a `%` not followed by two hex digits,
/// or bytes that are not UTF-8, are `None`.
fn percent_decode(text: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&byte, after)) = rest.split_first() {
        if byte == b'%' {
            let hex = |at: usize| after.get(at).and_then(|digit| char::from(*digit).to_digit(16));
            let (high, low) = (hex(0)?, hex(1)?);
            out.push(u8::try_from(high * 16 + low).ok()?);
            rest = after.get(2..).unwrap_or_default();
        } else {
            out.push(byte);
            rest = after;
        }
    }
    String::from_utf8(out).ok()
}

/// The command's HTTP listener, the dashboard's and `relay --metrics-listen`'s: hyper's
/// HTTP/1.1 on a tokio runtime of its own (as the MCP gateway serves), each connection a
/// task, one request per connection, bounded against clients that are slow, stalled, idle
/// or hostile.
///
/// Invariants:
/// - the request line and headers must arrive within [`HEAD_DEADLINE`] of the connection
///   (hyper's header read timeout on tokio's timer: the connection is closed), the body
///   within [`BODY_DEADLINE`] of the headers (408), and an answer is read by the client
///   within [`WRITE_DEADLINE`] of its being ready (else the connection is closed);
/// - the request line and headers are at most [`HEAD_BYTES_MAX`] bytes and
///   [`HEADERS_MAX`] headers (hyper answers 431); a body at most the listener's
///   [`Limits::body_bytes_max`] (413, refused before any of it is read and before a
///   `100 Continue`), framed by `Content-Length` only: a `Transfer-Encoding` is 411 when
///   chunked, 501 for another coding ending in chunked (hyper refuses any other as 400);
/// - a request is 400 when its target is not a path in visible ASCII, an HTTP/1.1 request names no
///   `Host`, a header of [`SINGLE`] is repeated, a header value holds a byte outside
///   visible ASCII, space and tab, or hyper cannot parse it;
/// - at most [`Limits::connections_max`] connections are held. A new one past the cap
///   closes the oldest held connection whose answer is not being computed (one still
///   sending its request, or slow to read its answer): idle connections lock nobody out,
///   whoever connects last is answered. Only when every held connection is being
///   answered is the newcomer closed unanswered;
/// - a listener on a loopback address answers only requests whose `Host` names it
///   ([`addressed_to_us`]): a page of another site whose name resolves to 127.0.0.1 (DNS
///   rebinding) is refused 421 before the service sees the request;
/// - [`Listener::serve`] returns within [`STOP_POLL`] + [`STOP_GRACE`] of the stop flag,
///   whatever the clients do: a connection still sending its request is closed, and only
///   an answer already being computed or written gets the grace.
///
/// It does not do keep-alive, pipelining, chunked bodies, TLS or HTTP/2: each answer says
/// `Connection: close`. The listener's own refusals are a status, a stable code and a
/// fixed sentence ([`Refusal`]), rendered by the service, never the input; those hyper
/// makes before any service is reached (400, 431) have no body.
pub(crate) mod listener {
    use std::{
        collections::BTreeMap,
        convert::Infallible,
        future::Future,
        io,
        net::SocketAddr,
        pin::Pin,
        sync::{
            Arc, Mutex, MutexGuard, PoisonError,
            atomic::{AtomicBool, AtomicU64, Ordering},
        },
        time::Duration,
    };

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, Limited};
    use hyper::{
        Response, StatusCode, Version,
        body::{Body, Incoming},
        header::{self, HeaderName, HeaderValue},
        server::conn::http1,
    };
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tokio::{
        io::AsyncWrite,
        net::{TcpListener, TcpStream},
        runtime::Runtime,
        sync::watch,
        time::Instant,
    };

    /// The request line and headers, the blank line that ends them included.
    const HEAD_BYTES_MAX: usize = 16 * 1024;
    /// Header lines in one request.
    const HEADERS_MAX: usize = 64;
    /// From the connection's start to the end of its headers.
    const HEAD_DEADLINE: Duration = Duration::from_secs(10);
    /// From the end of the headers to the end of the body.
    const BODY_DEADLINE: Duration = Duration::from_secs(10);
    /// From an answer's being ready to its last byte's being written.
    const WRITE_DEADLINE: Duration = Duration::from_secs(10);
    /// How often the stop flag is looked at.
    const STOP_POLL: Duration = Duration::from_millis(50);
    /// How long a stopping listener waits for the answers it is computing or writing.
    const STOP_GRACE: Duration = Duration::from_secs(3);
    /// After an answer, what is still read and discarded (so that closing with unread
    /// bytes does not reset the connection before the client has read the answer), and
    /// for how long at most.
    const LINGER: Duration = Duration::from_secs(1);
    const LINGER_BYTES_MAX: usize = 64 * 1024;
    /// Answers computed at once, each on a thread of the runtime's blocking pool (they
    /// read the ledger); more wait for one of them.
    const ANSWERS_AT_ONCE: usize = 8;
    /// Headers that decide something and so may appear once: a second `Host` or
    /// `Content-Length` is how requests are smuggled, a second `Origin` or token how a
    /// check is confused.
    const SINGLE: [&str; 9] = [
        "host",
        "content-length",
        "transfer-encoding",
        "content-type",
        "authorization",
        "origin",
        "referer",
        "sec-fetch-site",
        "x-toolledger-token",
    ];

    /// What one listener accepts.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Limits {
        /// The longest body read; a longer `Content-Length` is 413.
        pub(crate) body_bytes_max: usize,
        /// Connections held at once; past it, the oldest not being answered is closed.
        pub(crate) connections_max: usize,
    }

    /// One request, read whole and checked against the limits.
    #[derive(Debug)]
    pub(crate) struct Request {
        method: String,
        target: String,
        /// Every value visible ASCII, spaces and tabs; a name of [`SINGLE`] at most once.
        headers: header::HeaderMap,
        body: Bytes,
    }

    impl Request {
        pub(crate) fn method(&self) -> &str {
            &self.method
        }

        /// The origin-form target: a path, maybe with a query.
        pub(crate) fn target(&self) -> &str {
            &self.target
        }

        /// The value of the header `name` (any case).
        pub(crate) fn header(&self, name: &str) -> Option<&str> {
            self.headers.get(name).and_then(|value| value.to_str().ok())
        }

        pub(crate) fn body(&self) -> &[u8] {
            &self.body
        }
    }

    /// One answer; the listener adds `Content-Length` and `Connection: close`.
    #[derive(Debug)]
    pub(crate) struct Served {
        pub(crate) status: u16,
        pub(crate) headers: Vec<(&'static str, String)>,
        pub(crate) body: Vec<u8>,
    }

    /// A request the listener refused before any service answered it.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Refusal {
        pub(crate) status: u16,
        pub(crate) code: &'static str,
        pub(crate) message: &'static str,
    }

    const fn refusal(status: u16, code: &'static str, message: &'static str) -> Refusal {
        Refusal { status, code, message }
    }

    const MALFORMED: Refusal =
        refusal(400, "BAD_REQUEST", "the request is not well-formed HTTP/1.1");
    const TIMEOUT: Refusal = refusal(408, "TIMEOUT", "the request did not arrive in time");
    const CHUNKED: Refusal =
        refusal(411, "LENGTH_REQUIRED", "a body must be sent with a Content-Length, not chunked");
    const TOO_LARGE: Refusal = refusal(413, "TOO_LARGE", "the request body is too large");
    const MISDIRECTED: Refusal =
        refusal(421, "MISDIRECTED", "this server answers only its own address");
    const ENCODED: Refusal =
        refusal(501, "NOT_IMPLEMENTED", "a body must be sent with a Content-Length, not encoded");
    const STOPPING: Refusal = refusal(503, "STOPPING", "the server is stopping");

    /// What a listener serves: the answer to a request, and how its refusals look.
    pub(crate) trait Service: Send + Sync + 'static {
        fn answer(&self, request: &Request) -> Served;
        fn refuse(&self, refusal: Refusal) -> Served;
    }

    /// Whether `host`, a request's `Host`, names the server bound at `bound`: that
    /// address itself, `localhost:PORT` or `127.0.0.1:PORT`. Every listener on a loopback
    /// address applies this rule.
    pub(crate) fn addressed_to_us(bound: SocketAddr, host: Option<&str>) -> bool {
        let port = bound.port();
        host.is_some_and(|host| {
            [bound.to_string(), format!("localhost:{port}"), format!("127.0.0.1:{port}")]
                .iter()
                .any(|ours| ours.eq_ignore_ascii_case(host))
        })
    }

    /// A bound socket and the runtime that will serve it, not yet serving.
    #[derive(Debug)]
    pub(crate) struct Listener {
        runtime: Runtime,
        socket: TcpListener,
        bound: SocketAddr,
        limits: Limits,
    }

    /// Where one held connection is.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Phase {
        /// Waiting for the client's request, its head or its body.
        Waiting,
        /// Its answer being computed: the one phase a newcomer never cuts short.
        Answering,
        /// Its answer ready, to be written by this instant.
        Answered(Instant),
        /// Closed by the listener, to make room or because it stops.
        Dropped,
    }

    /// What the acceptor and the connections share.
    #[derive(Debug)]
    struct Shared {
        bound: SocketAddr,
        limits: Limits,
        http: http1::Builder,
        closing: AtomicBool,
        served: AtomicU64,
        /// The connections held, oldest first (ids only grow); one is removed when it
        /// ends or is dropped.
        held: Mutex<BTreeMap<u64, watch::Sender<Phase>>>,
    }

    impl Shared {
        fn held(&self) -> MutexGuard<'_, BTreeMap<u64, watch::Sender<Phase>>> {
            self.held.lock().unwrap_or_else(PoisonError::into_inner)
        }

        /// Holds connection `id`, first dropping the oldest held connection not being
        /// answered when the cap is reached; `None` (the newcomer is closed) when every
        /// held connection is being answered.
        fn admit(&self, id: u64) -> Option<watch::Sender<Phase>> {
            let mut held = self.held();
            if held.len() >= self.limits.connections_max {
                let oldest = held.iter().find(|(_, phase)| {
                    phase.send_if_modified(|now| {
                        let cut = *now != Phase::Answering;
                        if cut {
                            *now = Phase::Dropped;
                        }
                        cut
                    })
                });
                let oldest = *oldest?.0;
                held.remove(&oldest);
            }
            let (phase, _) = watch::channel(Phase::Waiting);
            held.insert(id, phase.clone());
            Some(phase)
        }

        /// Stops: every connection still waiting for its request is dropped.
        fn stop(&self) {
            self.closing.store(true, Ordering::SeqCst);
            self.held().retain(|_, phase| {
                !phase.send_if_modified(|now| {
                    let cut = *now == Phase::Waiting;
                    if cut {
                        *now = Phase::Dropped;
                    }
                    cut
                })
            });
        }
    }

    /// Moves a connection to `to`, unless the listener dropped it: then false.
    fn advance(phase: &watch::Sender<Phase>, to: Phase) -> bool {
        phase.send_if_modified(|now| {
            let moves = *now != Phase::Dropped;
            if moves {
                *now = to;
            }
            moves
        })
    }

    impl Listener {
        pub(crate) fn bind(addr: SocketAddr, limits: Limits) -> io::Result<Listener> {
            // One thread accepts and speaks HTTP for every connection (each is a task);
            // the answers, which read the ledger, run on the blocking pool.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .max_blocking_threads(ANSWERS_AT_ONCE)
                .thread_name("toolledger-http")
                .build()?;
            let socket = runtime.block_on(TcpListener::bind(addr))?;
            let bound = socket.local_addr()?;
            Ok(Listener { runtime, socket, bound, limits })
        }

        /// The address bound (the port chosen, for `:0`).
        pub(crate) fn bound(&self) -> SocketAddr {
            self.bound
        }

        /// Serves `service` until `stop`, then returns the number of requests read
        /// whole. The stop flag is looked at every [`STOP_POLL`]; then accepting stops,
        /// connections still sending their request are closed, answers being computed or
        /// written get [`STOP_GRACE`], and it returns regardless.
        pub(crate) fn serve<S: Service>(self, service: Arc<S>, stop: &AtomicBool) -> u64 {
            let Listener { runtime, socket, bound, limits } = self;
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEAD_DEADLINE)
                .max_header_size(HEAD_BYTES_MAX)
                .max_buf_size(2 * HEAD_BYTES_MAX)
                .max_headers(HEADERS_MAX)
                .keep_alive(false)
                // A client may end its side once its request is sent.
                .half_close(true)
                .title_case_headers(true);
            let shared = Arc::new(Shared {
                bound,
                limits,
                http,
                closing: AtomicBool::new(false),
                served: AtomicU64::new(0),
                held: Mutex::new(BTreeMap::new()),
            });
            runtime.block_on(async {
                let mut poll = tokio::time::interval(STOP_POLL);
                let mut id = 0_u64;
                loop {
                    tokio::select! {
                        accepted = socket.accept() => {
                            let Ok((stream, _)) = accepted else {
                                // Out of descriptors, most likely: wait for connections to end.
                                tokio::time::sleep(STOP_POLL).await;
                                continue;
                            };
                            id += 1;
                            // Not admitted, the stream is dropped: closed unanswered.
                            if let Some(phase) = shared.admit(id) {
                                let (shared, service) = (Arc::clone(&shared), Arc::clone(&service));
                                tokio::spawn(connection(stream, id, phase, shared, service));
                            }
                        }
                        _ = poll.tick() => if stop.load(Ordering::SeqCst) {
                            break;
                        }
                    }
                }
                drop(socket);
                shared.stop();
                let started = Instant::now();
                while !shared.held().is_empty() && started.elapsed() < STOP_GRACE {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
            // Whatever is left (an answer past the grace) ends with the process.
            runtime.shutdown_background();
            shared.served.load(Ordering::SeqCst)
        }
    }

    type Answering =
        Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

    /// One connection, until hyper has answered its request (then a bounded linger), or
    /// the listener cuts it.
    async fn connection<S: Service>(
        stream: TcpStream,
        id: u64,
        phase: watch::Sender<Phase>,
        shared: Arc<Shared>,
        service: Arc<S>,
    ) {
        // The answer goes out in one write; Nagle would only hold its tail back.
        let _ = stream.set_nodelay(true);
        let cut = cut(phase.subscribe());
        let handler = {
            let shared = Arc::clone(&shared);
            hyper::service::service_fn(move |request| -> Answering {
                let (shared, service, phase) =
                    (Arc::clone(&shared), Arc::clone(&service), phase.clone());
                Box::pin(async move { Ok(respond(request, &shared, service, &phase).await) })
            })
        };
        let mut http = shared.http.serve_connection(TokioIo::new(stream), handler);
        let done = tokio::select! {
            _ = std::future::poll_fn(|cx| http.poll_without_shutdown(cx)) => true,
            () = cut => false,
        };
        if done {
            linger(http.into_parts().io.into_inner()).await;
        }
        shared.held().remove(&id);
    }

    /// Resolves when the listener cuts the connection: dropped, or its answer not
    /// written by its deadline.
    async fn cut(mut phase: watch::Receiver<Phase>) {
        loop {
            let deadline = match *phase.borrow_and_update() {
                Phase::Dropped => return,
                Phase::Answered(by) => Some(by),
                Phase::Waiting | Phase::Answering => None,
            };
            let overdue = async {
                match deadline {
                    Some(by) => tokio::time::sleep_until(by).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = overdue => return,
                changed = phase.changed() => if changed.is_err() {
                    return;
                },
            }
        }
    }

    /// The answer to one request: the listener's refusal, or the service's answer,
    /// computed on the blocking pool.
    async fn respond<S: Service>(
        request: hyper::Request<Incoming>,
        shared: &Shared,
        service: Arc<S>,
        phase: &watch::Sender<Phase>,
    ) -> Response<Full<Bytes>> {
        let answer = match read(request, shared.limits.body_bytes_max).await {
            Err(refusal) => service.refuse(refusal),
            Ok(request) => {
                shared.served.fetch_add(1, Ordering::SeqCst);
                let bound = shared.bound;
                if bound.ip().is_loopback() && !addressed_to_us(bound, request.header("host")) {
                    service.refuse(MISDIRECTED)
                // Marked answering before the stop flag is read: a stopping listener either
                // waits for this answer or sees it refused, never leaves it half done.
                } else if !advance(phase, Phase::Answering) || shared.closing.load(Ordering::SeqCst)
                {
                    service.refuse(STOPPING)
                } else {
                    let answering = Arc::clone(&service);
                    tokio::task::spawn_blocking(move || answering.answer(&request))
                        .await
                        // Only a runtime shutting down cancels it (a panic ends the process).
                        .unwrap_or_else(|_| service.refuse(STOPPING))
                }
            }
        };
        advance(phase, Phase::Answered(Instant::now() + WRITE_DEADLINE));
        encode(answer)
    }

    /// The request whole, checked; its body read by [`BODY_DEADLINE`].
    async fn read(
        request: hyper::Request<Incoming>,
        body_bytes_max: usize,
    ) -> Result<Request, Refusal> {
        let (head, body) = request.into_parts();
        let uri = &head.uri;
        let target = match uri.path_and_query() {
            // A path, in visible ASCII (hyper lets UTF-8 through).
            Some(target)
                if uri.scheme().is_none()
                    && uri.authority().is_none()
                    && target.as_str().starts_with('/')
                    && target.as_str().bytes().all(|byte| byte.is_ascii_graphic()) =>
            {
                target.as_str().to_owned()
            }
            _ => return Err(MALFORMED),
        };
        let headers = head.headers;
        if head.method.as_str().len() > 16
            || (head.version == Version::HTTP_11 && !headers.contains_key(header::HOST))
            || headers.values().any(|value| value.to_str().is_err())
            || SINGLE.iter().any(|name| headers.get_all(*name).iter().nth(1).is_some())
        {
            return Err(MALFORMED);
        }
        match headers.get(header::TRANSFER_ENCODING) {
            Some(coding) if coding.as_bytes().eq_ignore_ascii_case(b"chunked") => {
                return Err(CHUNKED);
            }
            Some(_) => return Err(ENCODED),
            None => {}
        }
        // hyper has checked the `Content-Length`: the body's exact length.
        let length = body.size_hint().upper().unwrap_or(u64::MAX);
        if usize::try_from(length).map_or(true, |length| length > body_bytes_max) {
            return Err(TOO_LARGE);
        }
        // Reading the body is what tells hyper to send a `100 Continue` to a client that
        // asked for one.
        let body =
            match tokio::time::timeout(BODY_DEADLINE, Limited::new(body, body_bytes_max).collect())
                .await
            {
                Ok(Ok(collected)) => collected.to_bytes(),
                // A body cut short: the client went away.
                Ok(Err(_)) => return Err(MALFORMED),
                Err(_) => return Err(TIMEOUT),
            };
        Ok(Request { method: head.method.as_str().to_owned(), target, headers, body })
    }

    /// The answer as hyper writes it. A header value holding a control character is left
    /// out: nothing a service puts in a header can start another.
    fn encode(answer: Served) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from(answer.body)));
        *response.status_mut() =
            StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        for (name, value) in answer.headers {
            if value.chars().any(char::is_control) {
                continue;
            }
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value))
            {
                headers.append(name, value);
            }
        }
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }

    /// Ends the answer and reads what the client still sends, bounded, until it closes.
    async fn linger(mut stream: TcpStream) {
        if std::future::poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx)).await.is_err() {
            return;
        }
        let drain = async {
            let mut sink = [0_u8; 4096];
            let mut drained = 0;
            while drained < LINGER_BYTES_MAX {
                if stream.readable().await.is_err() {
                    return;
                }
                match stream.try_read(&mut sink) {
                    Ok(0) => return,
                    Ok(read) => drained += read,
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn only_the_server_s_own_names_are_ours() {
            let bound: SocketAddr = "127.0.0.1:8780".parse().unwrap();
            for host in ["127.0.0.1:8780", "localhost:8780", "LOCALHOST:8780"] {
                assert!(addressed_to_us(bound, Some(host)), "{host}");
            }
            for host in [None, Some("evil.example:8780"), Some("localhost"), Some("127.0.0.1:8781")]
            {
                assert!(!addressed_to_us(bound, host), "{host:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_strictly_and_tokens_compare_whole() {
        assert_eq!(
            parse_form(b"reason=the+API%20is+back&token=abc%2B1&e=%C3%A9&flag"),
            Some(vec![
                ("reason".to_owned(), "the API is back".to_owned()),
                ("token".to_owned(), "abc+1".to_owned()),
                ("e".to_owned(), "\u{e9}".to_owned()),
                ("flag".to_owned(), String::new()),
            ])
        );
        for bad in [&b"a=%zz"[..], b"a=%f", b"a=%", b"a=%ff", b"a=%C3", b"%zz=a", b"a=\xff"] {
            assert_eq!(parse_form(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert!(token_matches("0123456789abcdef", "0123456789abcdef"));
        assert!(!token_matches("0123456789abcdef", "0123456789abcdeF"));
        assert!(!token_matches("0123456789abcdef", "0123456789abcde"));
        assert!(!token_matches("0123456789abcdef", ""));
    }
}
