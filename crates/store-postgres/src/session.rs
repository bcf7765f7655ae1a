//! One server connection with the store's session settings, and the statement runner
//! every module uses: statements are prepared once per connection and kept.

use std::{collections::HashMap, time::Duration};

use postgres::{
    Client, Config, GenericClient, NoTls, Row, Statement, Transaction,
    types::{FromSql, ToSql},
};
use toolledger_contract::UnixSeconds;

use crate::{
    Now, StoreError, Waits,
    error::{self, pg},
};

/// The application name every store session reports (`pg_stat_activity`).
pub(crate) const APPLICATION_NAME: &str = "toolledger";

/// A parameter list.
pub(crate) type Params<'p> = [&'p (dyn ToSql + Sync)];

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
    /// would mean no bound at all).
    pub(crate) fn arm(&mut self, wait: Duration) -> Result<(), StoreError> {
        self.client.batch_execute(&format!("SET lock_timeout = {}", millis(wait))).map_err(pg)
    }
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
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(waits.next_wait().max(Duration::from_secs(1)));
    }
    let mut client = config.connect(NoTls).map_err(error::connect)?;
    client
        .batch_execute(&format!(
            "SET lock_timeout = {}; SET synchronous_commit = on; SET application_name = '{APPLICATION_NAME}'; \
             SET plan_cache_mode = force_generic_plan",
            millis(waits.next_wait())
        ))
        .map_err(pg)?;
    let synchronous: String = client
        .query_one("SELECT current_setting('synchronous_commit')", &[])
        .map_err(pg)
        .and_then(|row| get(&row, 0))?;
    if synchronous != "on" {
        return Err(error::failed("a session setting did not take effect"));
    }
    Ok(Conn { client, cache: HashMap::new() })
}

/// Parses a connection string (a `postgres://` URL or `key=value` pairs).
pub(crate) fn config(url: &str) -> Result<Config, StoreError> {
    let config = url.parse::<Config>().map_err(|err| {
        StoreError::caused(error::BACKEND, "the connection string is not valid", err)
    })?;
    // No TLS stack is compiled in: a connection string that requires TLS is refused
    // here, in words that say so, not answered "could not connect" after a handshake.
    if config.get_ssl_mode() == postgres::config::SslMode::Require {
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
        let statement = self.c.prepare(sql).map_err(pg)?;
        self.cache.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    /// Every row of `sql`.
    pub(crate) fn query(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, StoreError> {
        let statement = self.statement(sql)?;
        self.c.query(&statement, params).map_err(pg)
    }

    /// The row of `sql`, if there is one.
    pub(crate) fn opt(
        &mut self,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Option<Row>, StoreError> {
        let statement = self.statement(sql)?;
        self.c.query_opt(&statement, params).map_err(pg)
    }

    /// The one row of `sql`.
    pub(crate) fn one(&mut self, sql: &str, params: &Params<'_>) -> Result<Row, StoreError> {
        let statement = self.statement(sql)?;
        self.c.query_one(&statement, params).map_err(pg)
    }

    /// Runs `sql`; the number of rows it touched.
    pub(crate) fn exec(&mut self, sql: &str, params: &Params<'_>) -> Result<u64, StoreError> {
        let statement = self.statement(sql)?;
        self.c.execute(&statement, params).map_err(pg)
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
        let mut savepoint = self.c.transaction().map_err(pg)?;
        let (value, keep) = work(&mut Db { c: &mut savepoint, cache: &mut *self.cache })?;
        if keep {
            savepoint.commit().map_err(pg)?;
        } else {
            savepoint.rollback().map_err(pg)?;
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
