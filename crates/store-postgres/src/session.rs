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

/// A connection to the server, every exchange bounded (see the module's doc).
pub(crate) struct Client {
    // Dropped before the runtime: the connection's task then ends with the runtime.
    inner: tokio_postgres::Client,
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
    runtime: &'a Runtime,
    bound: Duration,
    abandoned: &'a Cell<bool>,
}

/// Runs one exchange with the server within `bound`, or abandons the connection.
fn exchange<T>(
    runtime: &Runtime,
    bound: Duration,
    abandoned: &Cell<bool>,
    work: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, StoreError> {
    if abandoned.get() {
        return Err(error::abandoned());
    }
    match runtime.block_on(async { tokio::time::timeout(bound, work).await }) {
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
        let (inner, connection) = match connected {
            Ok(connected) => connected.map_err(error::connect)?,
            Err(_) => return Err(error::failed(error::UNANSWERED)),
        };
        // Driven whenever the client waits on the runtime, as the `postgres` crate does.
        runtime.spawn(async move {
            let _ = connection.await;
        });
        Ok(Client { inner, runtime, bound, abandoned: Cell::new(false) })
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
        self.abandoned.get() || self.inner.is_closed()
    }

    /// Begins a transaction at `isolation`, read-only when asked.
    pub(crate) fn begin(
        &mut self,
        isolation: IsolationLevel,
        read_only: bool,
    ) -> Result<Transaction<'_>, StoreError> {
        let Client { inner, runtime, bound, abandoned } = self;
        let started = exchange(runtime, *bound, abandoned, async {
            inner.build_transaction().isolation_level(isolation).read_only(read_only).start().await
        })?;
        Ok(Transaction { inner: started, runtime, bound: *bound, abandoned })
    }
}

impl Transaction<'_> {
    /// Commits.
    pub(crate) fn commit(self) -> Result<(), StoreError> {
        let Transaction { inner, runtime, bound, abandoned } = self;
        exchange(runtime, bound, abandoned, inner.commit())
    }

    /// Rolls back.
    pub(crate) fn rollback(self) -> Result<(), StoreError> {
        let Transaction { inner, runtime, bound, abandoned } = self;
        exchange(runtime, bound, abandoned, inner.rollback())
    }

    /// Up to `max_rows` more rows of `portal`.
    pub(crate) fn query_portal(
        &mut self,
        portal: &tokio_postgres::Portal,
        max_rows: i32,
    ) -> Result<Vec<Row>, StoreError> {
        exchange(
            self.runtime,
            self.bound,
            self.abandoned,
            self.inner.query_portal(portal, max_rows),
        )
    }

    /// A portal over `sql`'s rows, read a page at a time by [`Transaction::query_portal`].
    pub(crate) fn bind(&mut self, sql: &str) -> Result<tokio_postgres::Portal, StoreError> {
        let inner = &self.inner;
        exchange(self.runtime, self.bound, self.abandoned, async move {
            let statement = inner.prepare(sql).await?;
            inner.bind(&statement, &[]).await
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

/// The trait for a connection and for a transaction, each over its own inner client.
macro_rules! runs_statements {
    ($type:ty, $parts:ident => $runtime:expr, $bound:expr, $abandoned:expr, $inner:expr) => {
        impl GenericClient for $type {
            fn prepare(&mut self, sql: &str) -> Result<Statement, StoreError> {
                let $parts = self;
                exchange($runtime, $bound, $abandoned, $inner.prepare(sql))
            }

            fn query(
                &mut self,
                statement: &Statement,
                params: &Params<'_>,
            ) -> Result<Vec<Row>, StoreError> {
                let $parts = self;
                exchange($runtime, $bound, $abandoned, $inner.query(statement, params))
            }

            fn query_opt(
                &mut self,
                statement: &Statement,
                params: &Params<'_>,
            ) -> Result<Option<Row>, StoreError> {
                let $parts = self;
                exchange($runtime, $bound, $abandoned, $inner.query_opt(statement, params))
            }

            fn execute(
                &mut self,
                statement: &Statement,
                params: &Params<'_>,
            ) -> Result<u64, StoreError> {
                let $parts = self;
                exchange($runtime, $bound, $abandoned, $inner.execute(statement, params))
            }

            fn batch_execute(&mut self, sql: &str) -> Result<(), StoreError> {
                let $parts = self;
                exchange($runtime, $bound, $abandoned, $inner.batch_execute(sql))
            }

            fn transaction(&mut self) -> Result<Transaction<'_>, StoreError> {
                let $parts = self;
                let started = exchange($runtime, $bound, $abandoned, $inner.transaction())?;
                Ok(Transaction {
                    inner: started,
                    runtime: $runtime,
                    bound: $bound,
                    abandoned: $abandoned,
                })
            }
        }
    };
}

runs_statements!(Client, this => &this.runtime, this.bound, &this.abandoned, this.inner);
runs_statements!(Transaction<'_>, this => this.runtime, this.bound, this.abandoned, this.inner);

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
        StoreError::caused(error::BACKEND, "the connection string is not valid", err)
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
