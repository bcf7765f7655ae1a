//! `toolledger-refundd`: a small refund service over HTTP, with its own SQLite file,
//! implementing the IETF Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header)
//! exactly. It is somebody else's service: it shares no code with toolledger. Besides
//! refunds it serves any tool declared by a recipe ([`Recipes`]), under the same draft.
//!
//! - `POST /refunds` with `Idempotency-Key: "<key>"` and a JSON body whose `arguments`
//!   hold `order_id`, `amount_minor` and `currency`. The fingerprint is the SHA-256 of
//!   the body's bytes. A new key: the refund and its stored response commit together
//!   (201). The same key and fingerprint: the stored response again. The same key and
//!   another fingerprint: 422. The same key while the first request still runs: 409.
//!   No key: 400. A refused order: 402 with a reason, stored like any response.
//! - `GET /refunds/by-key/<key>`: what became of a key (200 with its state, fingerprint
//!   and stored response; 404 when the key was never committed).
//! - `POST /tools/<tool>` for a tool of the recipes: the same flow, keys per tool. The
//!   body is JSON whose `tool_name` is `<tool>` and whose `arguments` is an object (else
//!   400 `bad_body`); a new key commits the effect (a row of `effects`) with its stored
//!   answer, 201 `{"output": …}` built by the tool's recipe. A refused resource: 402
//!   `{"error": "refused", "reason": "<tool> refuses <resource>"}`, stored like any
//!   answer. A tool not in the recipes: 404 `no_such_tool`.
//! - `GET /tools/<tool>/by-key/<key>`: the answer `/refunds/by-key/` gives, for the tool.
//! - `GET /tools/<tool>/allow/<resource>` (percent-decoded): the business precondition,
//!   200 `{"allow": true}` or `{"allow": false, "reason": …}`.
//! - `POST /admin/faults` (the listener is loopback only): switches for tests.
//!
//! A recipe file is a JSON object of tools by name (`[A-Za-z0-9_-]{1,64}`), each
//! `{"resource": "<JSON pointer>", "output": {…}}` (`resource` optional): in the output,
//! `{"$id": "<prefix>"}` becomes the prefix and the first 32 hex digits of the SHA-256 of
//! the key, `{"$arg": "<JSON pointer>"}` the argument there (its member left out when
//! the argument is absent), and anything else is literal.
//!
//! The fault switches, shared by every route that commits an effect: commit, then drop
//! the connection without an answer; hold a request for N ms before its commit; answer
//! 503 without committing; refuse orders (refunds) or resources (tools).

use std::{
    io::{Read, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tiny_http::{Header, Method, Request, Response, Server};

mod recipes;

use recipes::Recipe;
pub use recipes::Recipes;

/// The largest request body the service reads.
const BODY_LIMIT: u64 = 64 * 1024;

/// Fault switches: counts of the next requests to fault, random shares, and refused
/// orders.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// The next this many new requests commit, then lose their connection.
    pub drop_next: u64,
    /// The next this many new requests answer 503 without committing.
    pub fail_next: u64,
    /// Percent (0–100) of new requests that commit, then lose their connection.
    pub drop_percent: u64,
    /// Percent (0–100) of new requests that answer 503 without committing.
    pub fail_percent: u64,
    /// Milliseconds each new request is held, as running, before its commit.
    pub delay_ms: u64,
    /// Up to this many more milliseconds, drawn per request.
    pub jitter_ms: u64,
    /// Milliseconds a committed request waits before its answer is written.
    pub answer_delay_ms: u64,
    /// Orders refused with 402 (by `POST /refunds`).
    pub refuse_orders: Vec<String>,
    /// Resources refused with 402 by every tool whose recipe names a `resource`: the
    /// argument there, a string or an integer's decimal text, is compared with these.
    pub refuse_resources: Vec<String>,
    /// The seed of the random shares.
    pub seed: u64,
}

impl Faults {
    /// Reads the switches from a JSON object; a member left out is off.
    ///
    /// # Errors
    ///
    /// As [`Faults::merged`].
    pub fn from_json(value: &Value) -> Result<Faults, String> {
        Faults::default().merged(value)
    }

    /// These switches with the members of a JSON object set: a member left out keeps its
    /// value (what `POST /admin/faults` does).
    ///
    /// # Errors
    ///
    /// A message when a member has the wrong type or is out of its range (percents
    /// 0–100, milliseconds 0–60000): the switches are then left as they were, never
    /// clamped.
    pub fn merged(&self, value: &Value) -> Result<Faults, String> {
        let mut faults = self.clone();
        let Some(members) = value.as_object() else {
            return Err("the faults must be a JSON object".to_owned());
        };
        for (name, member) in members {
            let number = || member.as_u64().ok_or_else(|| format!("{name} must be a whole number"));
            let within = |max: u64| match member.as_u64() {
                Some(value) if value <= max => Ok(value),
                _ => Err(format!("{name} must be a whole number from 0 to {max}")),
            };
            let strings = || {
                member
                    .as_array()
                    .and_then(|items| {
                        items.iter().map(|item| item.as_str().map(str::to_owned)).collect()
                    })
                    .ok_or_else(|| format!("{name} must be a list of strings"))
            };
            match name.as_str() {
                "drop_next" => faults.drop_next = number()?,
                "fail_next" => faults.fail_next = number()?,
                "drop_percent" => faults.drop_percent = within(100)?,
                "fail_percent" => faults.fail_percent = within(100)?,
                "delay_ms" => faults.delay_ms = within(60_000)?,
                "jitter_ms" => faults.jitter_ms = within(60_000)?,
                "answer_delay_ms" => faults.answer_delay_ms = within(60_000)?,
                "seed" => faults.seed = number()?,
                "refuse_orders" => faults.refuse_orders = strings()?,
                "refuse_resources" => faults.refuse_resources = strings()?,
                other => return Err(format!("unknown fault switch {other}")),
            }
        }
        Ok(faults)
    }
}

/// What a new request does, drawn from the switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Commit,
    CommitThenDrop,
    FailBeforeCommit,
}

/// A fate and how long the request is held before its commit.
#[derive(Debug, Clone, Copy)]
struct Drawn {
    fate: Fate,
    delay_ms: u64,
}

/// The service: its file, its switches, a count of draws, and the tools it serves.
#[derive(Debug)]
pub struct Service {
    db: PathBuf,
    faults: Mutex<Faults>,
    draws: AtomicU64,
    recipes: Recipes,
}

/// An error of the service's own store, for the log line; never sent to a client.
#[derive(Debug)]
pub struct StoreFailed(pub String);

fn failed(err: rusqlite::Error) -> StoreFailed {
    StoreFailed(err.to_string())
}

const SCHEMA: &str = "
    PRAGMA journal_mode = WAL;
    CREATE TABLE IF NOT EXISTS requests (
        key TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('running', 'done', 'refused')),
        status INTEGER,
        body TEXT
    ) STRICT;
    CREATE TABLE IF NOT EXISTS refunds (
        refund_id TEXT PRIMARY KEY,
        key TEXT NOT NULL UNIQUE REFERENCES requests (key),
        order_id TEXT NOT NULL,
        amount_minor INTEGER NOT NULL,
        currency TEXT NOT NULL
    ) STRICT;
    CREATE TABLE IF NOT EXISTS tool_requests (
        tool TEXT NOT NULL,
        key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('running', 'done', 'refused')),
        status INTEGER,
        body TEXT,
        PRIMARY KEY (tool, key)
    ) STRICT;
    CREATE TABLE IF NOT EXISTS effects (
        tool TEXT NOT NULL,
        key TEXT NOT NULL,
        output TEXT NOT NULL,
        PRIMARY KEY (tool, key),
        FOREIGN KEY (tool, key) REFERENCES tool_requests (tool, key)
    ) STRICT;
    -- A request still running when the service stopped never committed: forget it.
    DELETE FROM requests WHERE state = 'running';
    DELETE FROM tool_requests WHERE state = 'running';";

/// Opens a connection with the service's pragmas.
fn connect(db: &Path) -> Result<Connection, StoreFailed> {
    let conn = Connection::open(db).map_err(failed)?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(failed)?;
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;").map_err(failed)?;
    Ok(conn)
}

impl Service {
    /// The service over the SQLite file at `db` (created if absent), serving refunds
    /// alone.
    ///
    /// # Errors
    ///
    /// [`StoreFailed`] when the file cannot be opened or its tables made.
    pub fn open(db: &Path, faults: Faults) -> Result<Service, StoreFailed> {
        Service::open_with_tools(db, faults, Recipes::default())
    }

    /// The service over the SQLite file at `db` (created if absent), serving refunds and
    /// the tools of `recipes` under `/tools/<tool>`.
    ///
    /// # Errors
    ///
    /// [`StoreFailed`] when the file cannot be opened or its tables made.
    pub fn open_with_tools(
        db: &Path,
        faults: Faults,
        recipes: Recipes,
    ) -> Result<Service, StoreFailed> {
        connect(db)?.execute_batch(SCHEMA).map_err(failed)?;
        Ok(Service {
            db: db.to_owned(),
            faults: Mutex::new(faults),
            draws: AtomicU64::new(0),
            recipes,
        })
    }

    fn switches(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Draws the fate of a new request and its delay.
    fn draw(&self, key: &str) -> Drawn {
        let mut faults = self.switches();
        let draw = self.draws.fetch_add(1, Ordering::Relaxed);
        let digest = Sha256::digest(format!("{}:{key}:{draw}", faults.seed).as_bytes());
        let roll = |at: usize| {
            u64::from(digest.get(at).copied().unwrap_or(0)) * 256
                + u64::from(digest.get(at + 1).copied().unwrap_or(0))
        };
        let delay_ms = faults.delay_ms + roll(2) % (faults.jitter_ms + 1);
        let percent = roll(0) % 100;
        let fate = if faults.drop_next > 0 {
            faults.drop_next -= 1;
            Fate::CommitThenDrop
        } else if faults.fail_next > 0 {
            faults.fail_next -= 1;
            Fate::FailBeforeCommit
        } else if percent < faults.drop_percent {
            Fate::CommitThenDrop
        } else if percent < faults.drop_percent + faults.fail_percent {
            Fate::FailBeforeCommit
        } else {
            Fate::Commit
        };
        Drawn { fate, delay_ms }
    }

    /// Serves `server` on `threads` threads until it is unblocked; each thread has its
    /// own connection to the file.
    ///
    /// # Errors
    ///
    /// [`StoreFailed`] when a thread cannot open the file.
    pub fn serve(
        self: &Arc<Self>,
        server: &Arc<Server>,
        threads: usize,
    ) -> Result<(), StoreFailed> {
        let mut handles = Vec::new();
        for _ in 0..threads.max(1) {
            let (service, server) = (Arc::clone(self), Arc::clone(server));
            let mut conn = connect(&self.db)?;
            handles.push(std::thread::spawn(move || {
                while let Ok(request) = server.recv() {
                    if let Err(StoreFailed(message)) = service.handle(&mut conn, request) {
                        let _ = writeln!(std::io::stderr(), "refundd: store failed: {message}");
                    }
                }
            }));
        }
        for handle in handles {
            let _ = handle.join();
        }
        Ok(())
    }

    fn handle(&self, conn: &mut Connection, mut request: Request) -> Result<(), StoreFailed> {
        let url = request.url().to_owned();
        let method = request.method().clone();
        match (method, url.as_str()) {
            (Method::Post, "/refunds") => self.refund(conn, request),
            (Method::Get, path) if path.starts_with("/refunds/by-key/") => {
                let key = &path["/refunds/by-key/".len()..];
                let answer = by_key(conn, Keys::Refunds, key)?;
                respond(request, answer);
                Ok(())
            }
            (method, path) if path.starts_with("/tools/") => {
                self.tool(conn, request, &method, &path["/tools/".len()..])
            }
            (Method::Post, "/admin/faults") => {
                let answer = match read_body(&mut request)
                    .and_then(|body| serde_json::from_slice(&body).map_err(|_| "not JSON".into()))
                {
                    // Merged under the lock: a member left out keeps what it was set to.
                    Ok(value) => {
                        let mut switches = self.switches();
                        match switches.merged(&value) {
                            Ok(faults) => {
                                *switches = faults;
                                (200, json!({"faults": "set"}))
                            }
                            Err(message) => {
                                (400, json!({"error": "bad_faults", "reason": message}))
                            }
                        }
                    }
                    Err(message) => (400, json!({"error": "bad_faults", "reason": message})),
                };
                respond(request, answer);
                Ok(())
            }
            _ => {
                respond(request, (404, json!({"error": "no_such_endpoint"})));
                Ok(())
            }
        }
    }

    fn refund(&self, conn: &mut Connection, mut request: Request) -> Result<(), StoreFailed> {
        let (key, body, fingerprint) = match keyed_body(&mut request) {
            Ok(keyed) => keyed,
            Err(answer) => {
                respond(request, (400, answer));
                return Ok(());
            }
        };
        let Some(order) = order_of(&body) else {
            respond(request, (400, json!({"error": "bad_body", "reason": "not a refund"})));
            return Ok(());
        };
        let decide = |faults: &Faults| {
            if faults.refuse_orders.contains(&order.order_id) {
                (
                    402,
                    json!({"error": "refused", "reason": format!("order {} cannot be refunded", order.order_id)}),
                )
            } else {
                let refund_id = format!("rf_{}", &hex(&Sha256::digest(key.as_bytes()))[..32]);
                (
                    201,
                    json!({"output": {"refund_id": refund_id, "order_id": order.order_id,
                        "amount_minor": order.amount_minor, "currency": order.currency, "status": "refunded"}}),
                )
            }
        };
        let effect = |tx: &Connection, answer: &Value| {
            tx.execute(
                "INSERT INTO refunds (refund_id, key, order_id, amount_minor, currency) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    answer["output"]["refund_id"].as_str(),
                    key,
                    order.order_id,
                    order.amount_minor,
                    order.currency
                ],
            )
            .map(drop)
        };
        self.once(conn, request, (Keys::Refunds, &key, &fingerprint), decide, effect)
    }

    /// The routes under `/tools/`: `rest` is the path after it.
    fn tool(
        &self,
        conn: &mut Connection,
        request: Request,
        method: &Method,
        rest: &str,
    ) -> Result<(), StoreFailed> {
        let (name, tail) = match rest.split_once('/') {
            Some((name, tail)) => (name, Some(tail)),
            None => (rest, None),
        };
        let route = match (method, tail) {
            (Method::Post, None) => Some(ToolRoute::Call),
            (Method::Get, Some(tail)) => tail
                .strip_prefix("by-key/")
                .map(ToolRoute::ByKey)
                .or_else(|| tail.strip_prefix("allow/").map(ToolRoute::Allow)),
            _ => None,
        };
        let Some(route) = route else {
            respond(request, (404, json!({"error": "no_such_endpoint"})));
            return Ok(());
        };
        let Some(recipe) = self.recipes.get(name) else {
            respond(request, (404, json!({"error": "no_such_tool"})));
            return Ok(());
        };
        match route {
            ToolRoute::Call => self.call(conn, request, name, recipe),
            ToolRoute::ByKey(key) => {
                let answer = by_key(conn, Keys::Tool(name), key)?;
                respond(request, answer);
                Ok(())
            }
            ToolRoute::Allow(segment) => {
                let answer = match percent_decoded(segment) {
                    Ok(resource) => {
                        let refused = recipe.has_resource()
                            && self.switches().refuse_resources.contains(&resource);
                        if refused {
                            (
                                200,
                                json!({"allow": false, "reason": format!("{name} refuses {resource}")}),
                            )
                        } else {
                            (200, json!({"allow": true}))
                        }
                    }
                    Err(reason) => (400, json!({"error": "bad_resource", "reason": reason})),
                };
                respond(request, answer);
                Ok(())
            }
        }
    }

    /// `POST /tools/<tool>` of a tool in the recipes.
    fn call(
        &self,
        conn: &mut Connection,
        mut request: Request,
        name: &str,
        recipe: &Recipe,
    ) -> Result<(), StoreFailed> {
        let (key, body, fingerprint) = match keyed_body(&mut request) {
            Ok(keyed) => keyed,
            Err(answer) => {
                respond(request, (400, answer));
                return Ok(());
            }
        };
        let arguments = match arguments_of(&body, name) {
            Ok(arguments) => arguments,
            Err(reason) => {
                respond(request, (400, json!({"error": "bad_body", "reason": reason})));
                return Ok(());
            }
        };
        let resource = recipe.resource(&arguments);
        let decide = |faults: &Faults| match resource
            .as_ref()
            .filter(|resource| faults.refuse_resources.contains(resource))
        {
            Some(resource) => {
                (402, json!({"error": "refused", "reason": format!("{name} refuses {resource}")}))
            }
            None => (201, json!({"output": recipe.output(&key, &arguments)})),
        };
        let effect = |tx: &Connection, answer: &Value| {
            tx.execute(
                "INSERT INTO effects (tool, key, output) VALUES (?1, ?2, ?3)",
                params![name, key, answer["output"].to_string()],
            )
            .map(drop)
        };
        self.once(conn, request, (Keys::Tool(name), &key, &fingerprint), decide, effect)
    }

    /// The draft's flow for a request that passed its checks: answer from what its key
    /// holds, or reserve the key, draw the request's fate, and commit the effect (when
    /// `decide` answers 201) with the stored answer. `decide` reads the switches.
    fn once(
        &self,
        conn: &mut Connection,
        request: Request,
        (keys, key, fingerprint): (Keys<'_>, &str, &str),
        decide: impl FnOnce(&Faults) -> (u16, Value),
        effect: impl FnOnce(&Connection, &Value) -> rusqlite::Result<()>,
    ) -> Result<(), StoreFailed> {
        // Reserve the key, or answer from what it holds.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(failed)?;
        let held = keys.held(&tx, key).map_err(failed)?;
        if let Some((held_fingerprint, state, status, stored)) = held {
            drop(tx);
            let answer = if held_fingerprint != fingerprint {
                (422, json!({"error": "fingerprint_mismatch"}))
            } else if state == "running" {
                (409, json!({"error": "in_flight"}))
            } else {
                let body = stored.and_then(|body| serde_json::from_str(&body).ok());
                (
                    status.and_then(|code| u16::try_from(code).ok()).unwrap_or(500),
                    body.unwrap_or(Value::Null),
                )
            };
            respond(request, answer);
            return Ok(());
        }
        keys.reserve(&tx, key, fingerprint).map_err(failed)?;
        tx.commit().map_err(failed)?;

        let Drawn { fate, delay_ms } = self.draw(key);
        let (answer_delay, (status, answer)) = {
            let faults = self.switches();
            (faults.answer_delay_ms, decide(&faults))
        };
        std::thread::sleep(Duration::from_millis(delay_ms));
        if fate == Fate::FailBeforeCommit {
            keys.release(conn, key).map_err(failed)?;
            respond(request, (503, json!({"error": "unavailable"})));
            return Ok(());
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(failed)?;
        if status == 201 {
            effect(&tx, &answer).map_err(failed)?;
        }
        keys.settle(
            &tx,
            key,
            (if status == 201 { "done" } else { "refused" }, status, &answer.to_string()),
        )
        .map_err(failed)?;
        tx.commit().map_err(failed)?;
        std::thread::sleep(Duration::from_millis(answer_delay));
        if fate == Fate::CommitThenDrop {
            // The effect is committed; the client never hears of it. (The client asked
            // for `Connection: close`, so dropping the writer closes the socket.)
            drop(request.into_writer());
            return Ok(());
        }
        respond(request, (status, answer));
        Ok(())
    }
}

/// A route under `/tools/<tool>`.
#[derive(Debug, Clone, Copy)]
enum ToolRoute<'a> {
    /// `POST /tools/<tool>`.
    Call,
    /// `GET /tools/<tool>/by-key/<key>`.
    ByKey(&'a str),
    /// `GET /tools/<tool>/allow/<resource>`, the resource still percent-encoded.
    Allow(&'a str),
}

/// Where a flow keeps its keys: the refunds' `requests`, or a tool's rows of
/// `tool_requests` (keys are per tool).
#[derive(Debug, Clone, Copy)]
enum Keys<'a> {
    Refunds,
    Tool(&'a str),
}

/// A key's row: its fingerprint, state, and stored status and answer.
type Held = (String, String, Option<i64>, Option<String>);

impl Keys<'_> {
    fn held(self, conn: &Connection, key: &str) -> rusqlite::Result<Option<Held>> {
        let row =
            |row: &rusqlite::Row<'_>| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?));
        match self {
            Keys::Refunds => conn.query_row(
                "SELECT fingerprint, state, status, body FROM requests WHERE key = ?1",
                [key],
                row,
            ),
            Keys::Tool(tool) => conn.query_row(
                "SELECT fingerprint, state, status, body FROM tool_requests \
                 WHERE tool = ?1 AND key = ?2",
                [tool, key],
                row,
            ),
        }
        .optional()
    }

    fn reserve(self, conn: &Connection, key: &str, fingerprint: &str) -> rusqlite::Result<()> {
        match self {
            Keys::Refunds => conn.execute(
                "INSERT INTO requests (key, fingerprint, state) VALUES (?1, ?2, 'running')",
                params![key, fingerprint],
            ),
            Keys::Tool(tool) => conn.execute(
                "INSERT INTO tool_requests (tool, key, fingerprint, state) \
                 VALUES (?1, ?2, ?3, 'running')",
                params![tool, key, fingerprint],
            ),
        }
        .map(drop)
    }

    /// Forgets a reservation that committed nothing.
    fn release(self, conn: &Connection, key: &str) -> rusqlite::Result<()> {
        match self {
            Keys::Refunds => {
                conn.execute("DELETE FROM requests WHERE key = ?1 AND state = 'running'", [key])
            }
            Keys::Tool(tool) => conn.execute(
                "DELETE FROM tool_requests WHERE tool = ?1 AND key = ?2 AND state = 'running'",
                [tool, key],
            ),
        }
        .map(drop)
    }

    /// Stores the answer: the key's final state, status and body.
    fn settle(
        self,
        conn: &Connection,
        key: &str,
        (state, status, body): (&str, u16, &str),
    ) -> rusqlite::Result<()> {
        match self {
            Keys::Refunds => conn.execute(
                "UPDATE requests SET state = ?2, status = ?3, body = ?4 WHERE key = ?1",
                params![key, state, status, body],
            ),
            Keys::Tool(tool) => conn.execute(
                "UPDATE tool_requests SET state = ?3, status = ?4, body = ?5 \
                 WHERE tool = ?1 AND key = ?2",
                params![tool, key, state, status, body],
            ),
        }
        .map(drop)
    }
}

/// A request that commits: its key, its body and the body's fingerprint (the SHA-256 of
/// its bytes, lowercase hex); or the 400 answer when it has no key or no readable body.
fn keyed_body(request: &mut Request) -> Result<(String, Vec<u8>, String), Value> {
    let key =
        idempotency_key(request).ok_or_else(|| json!({"error": "idempotency_key_missing"}))?;
    let body =
        read_body(request).map_err(|reason| json!({"error": "bad_body", "reason": reason}))?;
    let fingerprint = hex(&Sha256::digest(&body));
    Ok((key, body, fingerprint))
}

/// A refund's order, from the request body.
#[derive(Debug)]
struct Order {
    order_id: String,
    amount_minor: i64,
    currency: String,
}

fn order_of(body: &[u8]) -> Option<Order> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let arguments = value.get("arguments")?;
    Some(Order {
        order_id: arguments.get("order_id")?.as_str()?.to_owned(),
        amount_minor: arguments.get("amount_minor")?.as_i64()?,
        currency: arguments.get("currency")?.as_str()?.to_owned(),
    })
}

/// A tool request's arguments: the body is a JSON object whose `tool_name` is `tool` and
/// whose `arguments` is an object.
fn arguments_of(body: &[u8], tool: &str) -> Result<Value, String> {
    let value: Value = serde_json::from_slice(body).map_err(|_| "not JSON".to_owned())?;
    let Value::Object(mut members) = value else {
        return Err("not a JSON object".to_owned());
    };
    if members.get("tool_name").and_then(Value::as_str) != Some(tool) {
        return Err(format!("tool_name is not {tool}"));
    }
    match members.remove("arguments") {
        Some(arguments) if arguments.is_object() => Ok(arguments),
        _ => Err("arguments is not an object".to_owned()),
    }
}

/// A path segment, percent-decoded strictly: a raw `/` or `?`, a malformed escape or
/// bytes that are not UTF-8 are refused.
fn percent_decoded(segment: &str) -> Result<String, String> {
    let bytes = segment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'%' => {
                let digit = |at: usize| {
                    bytes
                        .get(at)
                        .and_then(|byte| char::from(*byte).to_digit(16))
                        .and_then(|d| u8::try_from(d).ok())
                };
                let (Some(high), Some(low)) = (digit(at + 1), digit(at + 2)) else {
                    return Err("a malformed percent escape".to_owned());
                };
                decoded.push(high * 16 + low);
                at += 3;
            }
            b'/' | b'?' => return Err("the resource is not one path segment".to_owned()),
            other => {
                decoded.push(other);
                at += 1;
            }
        }
    }
    String::from_utf8(decoded).map_err(|_| "the resource is not UTF-8".to_owned())
}

/// What became of `key`.
fn by_key(conn: &Connection, keys: Keys<'_>, key: &str) -> Result<(u16, Value), StoreFailed> {
    let held = keys.held(conn, key).map_err(failed)?;
    Ok(match held {
        None => (404, json!({"error": "not_found"})),
        Some((fingerprint, state, status, body)) => {
            let body: Value =
                body.and_then(|body| serde_json::from_str(&body).ok()).unwrap_or(Value::Null);
            (
                200,
                json!({"key": key, "state": state, "fingerprint": fingerprint, "status": status, "response": body}),
            )
        }
    })
}

/// The `Idempotency-Key` header's value: a structured-field string (`"…"`); a bare token
/// is taken as it is. Empty or absent: none.
fn idempotency_key(request: &Request) -> Option<String> {
    let header = request.headers().iter().find(|h| h.field.equiv("Idempotency-Key"))?;
    let raw = header.value.as_str().trim();
    let key = raw.strip_prefix('"').and_then(|k| k.strip_suffix('"')).unwrap_or(raw);
    (!key.is_empty() && key.len() <= 255 && key.bytes().all(|b| b.is_ascii_graphic() && b != b'"'))
        .then(|| key.to_owned())
}

fn read_body(request: &mut Request) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    request
        .as_reader()
        .take(BODY_LIMIT + 1)
        .read_to_end(&mut body)
        .map_err(|_| "the body could not be read".to_owned())?;
    if body.len() as u64 > BODY_LIMIT {
        return Err("the body is over 64 KiB".to_owned());
    }
    Ok(body)
}

fn respond(request: Request, (status, body): (u16, Value)) {
    let mut response = Response::from_string(body.to_string()).with_status_code(status);
    if let Ok(header) = Header::from_bytes("Content-Type", "application/json") {
        response.add_header(header);
    }
    // A client that hung up is not the service's failure.
    let _ = request.respond(response);
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
        out.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(byte & 15)]));
        out
    })
}

/// Binds `listen` (loopback only; port 0 picks one).
///
/// # Errors
///
/// A message when the address is not loopback or cannot be bound.
pub fn bind(listen: &str) -> Result<(Arc<Server>, SocketAddr), String> {
    let addr: SocketAddr =
        listen.parse().map_err(|_| format!("--listen {listen}: not an IP address and port"))?;
    if !addr.ip().is_loopback() {
        return Err(format!("--listen {listen}: the service listens on loopback only"));
    }
    let server = Server::http(addr).map_err(|_| format!("--listen {listen}: cannot bind"))?;
    let bound = server.server_addr().to_ip().ok_or_else(|| "no IP address bound".to_owned())?;
    Ok((Arc::new(server), bound))
}
