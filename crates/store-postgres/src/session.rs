//! One server connection with the store's session settings, and the statement runner
//! every module uses: statements are prepared once per connection and kept.
//!
//! The connection is `tokio-postgres` on a private current-thread runtime (what the
//! `postgres` crate does too), driven here so that **every exchange with the server has
//! a bound**: connecting (the TCP connect and the whole startup), each statement, each
//! `BEGIN`, `COMMIT` and `ROLLBACK`. A server that accepts and then says nothing, or one
//! that was stopped (`SIGSTOP`), is answered within the wait bound plus
//! [`ANSWER_GRACE`], never waited on for ever. An exchange past its bound abandons the
//! connection (its state is unknown, so it is never used again; the next call makes a
//! new one) and is [`StoreError::Busy`]; past it in a `COMMIT`, whether the server
//! committed is unknown, which the store answers as a commit in doubt.

use std::{cell::Cell, collections::HashMap, future::Future, time::Duration};

use tokio::runtime::Runtime;
use tokio_postgres::{
    Config, IsolationLevel, NoTls, Row, Statement,
    types::{FromSql, ToSql},
};
use toolledger_contract::UnixSeconds;
use toolledger_store::FailureKind;

use crate::{
    Now, StoreError, Waits,
    error::{self, pg},
};

/// The application name every store session reports (`pg_stat_activity`).
pub(crate) const APPLICATION_NAME: &str = "toolledger";

/// How much longer than the lock-wait bound the client waits for any answer: the server
/// answers a lock wait past `lock_timeout` itself (`STORE_BUSY`), so the client's own
/// bound only ever ends an exchange with a server that says nothing.
pub(crate) const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// A parameter list.
pub(crate) type Params<'p> = [&'p (dyn ToSql + Sync)];

/// The socket side of a connection: messages between the server and the client. It
/// is driven inside each exchange, as the `postgres` crate drives it (a task of its own
/// on the runtime costs a scheduler hop per message: half the audit's throughput).
type Wire = tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>;

/// A connection to the server, every exchange bounded (see the module's doc).
pub(crate) struct Client {
    inner: tokio_postgres::Client,
    /// `None` once the server or the network ended the connection.
    wire: Option<Wire>,
    runtime: Runtime,
    /// The longest one exchange may take.
    bound: Duration,
    /// An exchange ran past its bound: the connection is never used again.
    abandoned: Cell<bool>,
}

/// A transaction (or a savepoint inside one) on a [`Client`], rolled back when dropped
/// unless committed.
pub(crate) struct Transaction<'a> {
    inner: tokio_postgres::Transaction<'a>,
    wire: &'a mut Option<Wire>,
    runtime: &'a Runtime,
    bound: Duration,
    abandoned: &'a Cell<bool>,
}

/// Runs one exchange with the server within `bound`, driving the connection while it
/// waits, or abandons the connection.
fn exchange<T>(
    runtime: &Runtime,
    bound: Duration,
    abandoned: &Cell<bool>,
    wire: &mut Option<Wire>,
    work: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, StoreError> {
    if abandoned.get() {
        return Err(error::abandoned());
    }
    let mut work = std::pin::pin!(work);
    let driven = std::future::poll_fn(|cx| {
        if let Some(connection) = wire.as_mut() {
            // Ended (closed, or failed): dropped, so what waits on it learns at once.
            if std::pin::Pin::new(connection).poll(cx).is_ready() {
                *wire = None;
            }
        }
        work.as_mut().poll(cx)
    });
    match runtime.block_on(async { tokio::time::timeout(bound, driven).await }) {
        Ok(answered) => answered.map_err(pg),
        Err(_) => {
            abandoned.set(true);
            Err(StoreError::Busy)
        }
    }
}

impl Client {
    /// Connects within `bound`: the TCP connect, TLS negotiation (refused: none is built
    /// in) and the whole startup exchange.
    fn connect(config: &Config, bound: Duration) -> Result<Client, StoreError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|_| error::failed("the client's runtime could not start"))?;
        let connected =
            runtime.block_on(async { tokio::time::timeout(bound, config.connect(NoTls)).await });
        let (inner, wire) = match connected {
            Ok(connected) => connected.map_err(error::connect)?,
            Err(_) => {
                return Err(error::fail(FailureKind::Unreachable, error::UNANSWERED));
            }
        };
        Ok(Client { inner, wire: Some(wire), runtime, bound, abandoned: Cell::new(false) })
    }

    /// The longest one exchange may take.
    pub(crate) fn bound(&self) -> Duration {
        self.bound
    }

    /// Sets the longest one exchange may take.
    pub(crate) fn set_bound(&mut self, bound: Duration) {
        self.bound = bound;
    }

    /// Whether the connection is gone: closed by the server or the network, or abandoned
    /// after an exchange ran past its bound.
    pub(crate) fn is_closed(&self) -> bool {
        self.abandoned.get() || self.wire.is_none() || self.inner.is_closed()
    }

    /// Begins a transaction at `isolation`, read-only when asked.
    pub(crate) fn begin(
        &mut self,
        isolation: IsolationLevel,
        read_only: bool,
    ) -> Result<Transaction<'_>, StoreError> {
        let Client { inner, wire, runtime, bound, abandoned } = self;
        let started = exchange(runtime, *bound, abandoned, wire, async {
            inner.build_transaction().isolation_level(isolation).read_only(read_only).start().await
        })?;
        Ok(Transaction { inner: started, wire, runtime, bound: *bound, abandoned })
    }
}

impl Transaction<'_> {
    /// Commits.
    pub(crate) fn commit(self) -> Result<(), StoreError> {
        let Transaction { inner, wire, runtime, bound, abandoned } = self;
        exchange(runtime, bound, abandoned, wire, inner.commit())
    }

    /// Rolls back.
    pub(crate) fn rollback(self) -> Result<(), StoreError> {
        let Transaction { inner, wire, runtime, bound, abandoned } = self;
        exchange(runtime, bound, abandoned, wire, inner.rollback())
    }

    /// Hands each row of `sql` (no parameters) to `each` as the server sends it: one
    /// exchange, the rows never all held. (A portal read a page at a time would let the
    /// planner choose a fast-start plan, which halved the audit's throughput.)
    pub(crate) fn stream(
        &mut self,
        sql: &str,
        mut each: impl FnMut(&Row),
    ) -> Result<(), StoreError> {
        use futures_core::Stream;
        let Transaction { inner, wire, runtime, bound, abandoned } = self;
        let inner = &*inner;
        exchange(runtime, *bound, abandoned, wire, async move {
            let rows = inner.query_raw(sql, std::iter::empty::<&str>()).await?;
            let mut rows = std::pin::pin!(rows);
            while let Some(row) = std::future::poll_fn(|cx| rows.as_mut().poll_next(cx)).await {
                each(&row?);
            }
            Ok(())
        })
    }
}

/// What runs statements: a connection or a transaction, every exchange bounded.
pub(crate) trait GenericClient {
    fn prepare(&mut self, sql: &str) -> Result<Statement, StoreError>;
    fn query(&mut self, statement: &Statement, params: &Params<'_>)
    -> Result<Vec<Row>, StoreError>;
    fn query_opt(
        &mut self,
        statement: &Statement,
        params: &Params<'_>,
    ) -> Result<Option<Row>, StoreError>;
    fn execute(&mut self, statement: &Statement, params: &Params<'_>) -> Result<u64, StoreError>;
    fn batch_execute(&mut self, sql: &str) -> Result<(), StoreError>;
    /// A savepoint (inside a transaction) or a transaction (on a connection).
    fn transaction(&mut self) -> Result<Transaction<'_>, StoreError>;
}

/// The trait for a connection and for a transaction, each over its own parts.
macro_rules! runs_statements {
    ($type:ty, $this:ident => $runtime:expr, $bound:expr, $abandoned:expr, $wire:expr) => {
        impl GenericClient for $type {
            fn prepare(&mut self, sql: &str) -> Result<Statement, StoreError> {
                let $this = self;
                exchange($runtime, $bound, $abandoned, $wire, $this.inner.prepare(sql))
            }

            fn query(
                &mut self,
                statement: &Statement,
                params: &Params<'_>,
            ) -> Result<Vec<Row>, StoreError> {
                let $this = self;
                exchange($runtime, $bound, $abandoned, $wire, $this.inner.query(statement, params))
            }

            fn query_opt(
                &mut self,
                statement: &Statement,
                params: &Params<'_>,
            ) -> Result<Option<Row>, StoreError> {
                let $this = self;
                let work = $this.inner.query_opt(statement, params);
                exchange($runtime, $bound, $abandoned, $wire, work)
            }

            fn execute(
                &mut self,
                statement: &Statement,
                params: &Params<'_>,
            ) -> Result<u64, StoreError> {
                let $this = self;
                let work = $this.inner.execute(statement, params);
                exchange($runtime, $bound, $abandoned, $wire, work)
            }

            fn batch_execute(&mut self, sql: &str) -> Result<(), StoreError> {
                let $this = self;
                exchange($runtime, $bound, $abandoned, $wire, $this.inner.batch_execute(sql))
            }

            fn transaction(&mut self) -> Result<Transaction<'_>, StoreError> {
                let $this = self;
                let started =
                    exchange($runtime, $bound, $abandoned, $wire, $this.inner.transaction())?;
                Ok(Transaction {
                    inner: started,
                    wire: $wire,
                    runtime: $runtime,
                    bound: $bound,
                    abandoned: $abandoned,
                })
            }
        }
    };
}

runs_statements!(Client, this => &this.runtime, this.bound, &this.abandoned, &mut this.wire);
runs_statements!(Transaction<'_>, this => this.runtime, this.bound, this.abandoned, &mut *this.wire);

/// A connection and the statements prepared on it.
pub(crate) struct Conn {
    pub(crate) client: Client,
    pub(crate) cache: HashMap<String, Statement>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("closed", &self.client.is_closed())
            .field("prepared", &self.cache.len())
            .finish()
    }
}

impl Conn {
    /// The runner over the connection itself (autocommit: one statement, one snapshot).
    pub(crate) fn db(&mut self) -> Db<'_, Client> {
        Db { c: &mut self.client, cache: &mut self.cache }
    }

    /// Sets how long a lock wait may take on this session: `wait`, at least 1 ms (0
    /// would mean no bound at all); and how long any answer may take: `wait` and
    /// [`ANSWER_GRACE`].
    pub(crate) fn arm(&mut self, wait: Duration) -> Result<(), StoreError> {
        self.client.set_bound(answer_bound(wait));
        self.client.batch_execute(&format!("SET lock_timeout = {}", millis(wait)))
    }
}

/// The longest any answer may take when lock waits are bounded by `wait`.
fn answer_bound(wait: Duration) -> Duration {
    wait.saturating_add(ANSWER_GRACE)
}

/// `wait` in whole milliseconds for `lock_timeout`: at least 1, at most `i32::MAX`.
fn millis(wait: Duration) -> i64 {
    i64::try_from(wait.as_millis()).unwrap_or(i64::MAX).clamp(1, i64::from(i32::MAX))
}

/// Connects to `config` and sets the store's session: `lock_timeout` (the next wait of
/// `waits`), `synchronous_commit = on` (read back), `application_name`.
pub(crate) fn open(config: &Config, waits: &Waits) -> Result<Conn, StoreError> {
    let mut config = config.clone();
    config.application_name(APPLICATION_NAME);
    // The whole connect is bounded below; a `connect_timeout` in the URL still bounds
    // the TCP connect alone, for each host it names.
    let wait = waits.next_wait().max(Duration::from_secs(1));
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(wait);
    }
    let mut client = Client::connect(&config, answer_bound(wait))?;
    client.bound = answer_bound(waits.next_wait());
    client.batch_execute(&format!(
        "SET lock_timeout = {}; SET synchronous_commit = on; SET application_name = '{APPLICATION_NAME}'; \
         SET plan_cache_mode = force_generic_plan",
        millis(waits.next_wait())
    ))?;
    let mut conn = Conn { client, cache: HashMap::new() };
    let synchronous: String =
        get(&conn.db().one("SELECT current_setting('synchronous_commit')", &[])?, 0)?;
    if synchronous != "on" {
        return Err(error::failed("a session setting did not take effect"));
    }
    Ok(conn)
}

/// Parses a connection string (a `postgres://` URL or `key=value` pairs).
pub(crate) fn config(url: &str) -> Result<Config, StoreError> {
    let config = url.parse::<Config>().map_err(|err| {
        StoreError::caused(
            error::BACKEND,
            FailureKind::Other,
            "the connection string is not valid",
            err,
        )
    })?;
    // No TLS stack is compiled in: a connection string that requires TLS is refused
    // here, in words that say so, not answered "could not connect" after a handshake.
    if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
        return Err(error::failed(
            "sslmode=require asks for TLS, which is not built in: connect over a private \
             network or a local TLS-terminating proxy with sslmode=disable or prefer",
        ));
    }
    Ok(config)
}

/// Column `idx` of `row` as `T`; a value of another type is a contract violation.
pub(crate) fn get<'r, T: FromSql<'r>>(row: &'r Row, idx: usize) -> Result<T, StoreError> {
    row.try_get(idx).map_err(error::decode)
}

/// Runs statements on a connection or inside a transaction, each prepared once per
/// connection.
pub(crate) struct Db<'a, C: GenericClient> {
    pub(crate) c: &'a mut C,
    cache: &'a mut HashMap<String, Statement>,
}

impl<'a, C: GenericClient> Db<'a, C> {
    /// A runner over `c`, keeping prepared statements in `cache`.
    pub(crate) fn new(c: &'a mut C, cache: &'a mut HashMap<String, Statement>) -> Db<'a, C> {
        Db { c, cache }
    }

    fn statement(&mut self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(statement) = self.cache.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.c.prepare(sql)?;
        self.cache.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    /// Every row of `sql`.
    pub(crate) fn query(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, StoreError> {
        let statement = self.statement(sql)?;
        self.c.query(&statement, params)
    }

    /// The row of `sql`, if there is one.
    pub(crate) fn opt(
        &mut self,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Option<Row>, StoreError> {
        let statement = self.statement(sql)?;
        self.c.query_opt(&statement, params)
    }

    /// The one row of `sql`.
    pub(crate) fn one(&mut self, sql: &str, params: &Params<'_>) -> Result<Row, StoreError> {
        self.opt(sql, params)?.ok_or(StoreError::Internal("a statement answered no row"))
    }

    /// Runs `sql`; the number of rows it touched.
    pub(crate) fn exec(&mut self, sql: &str, params: &Params<'_>) -> Result<u64, StoreError> {
        let statement = self.statement(sql)?;
        self.c.execute(&statement, params)
    }

    /// Column 0 of the row of `sql`, if there is one.
    pub(crate) fn value<T: for<'r> FromSql<'r>>(
        &mut self,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Option<T>, StoreError> {
        self.opt(sql, params)?.map(|row| get(&row, 0)).transpose()
    }

    /// Runs `work` in a savepoint: released when it answers `(_, true)`, rolled back to
    /// (nothing of it kept) when it answers `(_, false)` or fails.
    pub(crate) fn savepoint<T>(
        &mut self,
        work: impl FnOnce(&mut Db<'_, Transaction<'_>>) -> Result<(T, bool), StoreError>,
    ) -> Result<T, StoreError> {
        let mut savepoint = self.c.transaction()?;
        let (value, keep) = work(&mut Db { c: &mut savepoint, cache: &mut *self.cache })?;
        if keep {
            savepoint.commit()?;
        } else {
            savepoint.rollback()?;
        }
        Ok(value)
    }
}

/// The database's clock, whole seconds: `now()` is the transaction's start, so every
/// statement of one transaction judges by the same instant.
pub(crate) const DATABASE_NOW: &str = "SELECT floor(extract(epoch FROM now()))::bigint";

/// Reads the database's clock inside the current transaction.
pub(crate) fn database_now<C: GenericClient>(db: &mut Db<'_, C>) -> Result<Now, StoreError> {
    let seconds: i64 = get(&db.one(DATABASE_NOW, &[])?, 0)?;
    UnixSeconds::new(seconds).map_err(|_| error::failed("the database clock is out of range"))
}
