//! The PostgreSQL backend of the suite.

use toolledger_engine::EngineError;
use toolledger_store::Waits;
use toolledger_store_postgres::{PgStore, StoreClock};
use toolledger_testkit::cluster::Cluster;

use crate::StoreUnderTest;

/// A ledger in a fresh database of the PostgreSQL server the harness started (or of
/// `TOOLLEDGER_PG_URL`). Stores judge time by the instants they are handed, as the
/// suite's simulated clock needs.
#[derive(Debug)]
pub struct Postgres {
    url: String,
}

impl Postgres {
    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A raw connection.
    pub fn raw(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls).unwrap()
    }
}

impl StoreUnderTest for Postgres {
    type Store = PgStore;
    const NAME: &'static str = "postgres";

    fn fresh() -> Postgres {
        let cluster = Cluster::shared()
            .unwrap_or_else(|err| panic!("PostgreSQL must run for this test: {err}"));
        let url = cluster
            .fresh_database("ledger")
            .unwrap_or_else(|err| panic!("a fresh PostgreSQL database: {err}"));
        Postgres { url }
    }

    fn open(&self) -> Result<PgStore, EngineError> {
        Ok(PgStore::connect(&self.url, Waits::default())?.with_clock(StoreClock::Caller))
    }

    fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let messages = self.raw().simple_query(sql).unwrap_or_else(|err| panic!("{sql}: {err:?}"));
        messages
            .into_iter()
            .filter_map(|message| match message {
                postgres::SimpleQueryMessage::Row(row) => {
                    Some((0..row.len()).map(|index| row.get(index).map(str::to_owned)).collect())
                }
                _ => None,
            })
            .collect()
    }

    fn execute(&self, sql: &str) {
        self.raw().batch_execute(sql).unwrap_or_else(|err| panic!("{sql}: {err:?}"));
    }
}
