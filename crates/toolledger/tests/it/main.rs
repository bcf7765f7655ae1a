//! The one integration-test binary of `toolledger`: a host's own tool and downstream
//! through every state, migrations of real v1 and v2 stores, and many callers at once.

#[path = "../../examples/tickets/mod.rs"]
mod tickets;

mod definitions;
mod doors;
mod host;
mod many;
mod migrate;
mod relay;
#[cfg(feature = "otel")]
mod traces;

use std::path::{Path, PathBuf};

use toolledger::{BlockCode, Outcome};

/// A directory removed when dropped.
pub use toolledger_testkit::TempDir;

pub fn workspace(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// Every row of every table, as text: what "writes nothing" compares.
pub fn dump(path: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut rows = Vec::new();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for table in tables {
        let mut statement = conn.prepare(&format!("SELECT * FROM {table}")).unwrap();
        let columns = statement.column_count();
        let mut query = statement.query([]).unwrap();
        while let Some(row) = query.next().unwrap() {
            let values: Vec<String> =
                (0..columns).map(|i| format!("{:?}", row.get_ref(i).unwrap())).collect();
            rows.push(format!("{table}: {}", values.join(", ")));
        }
    }
    rows
}

pub fn text(path: &Path, sql: &str) -> String {
    rusqlite::Connection::open(path).unwrap().query_row(sql, [], |row| row.get(0)).unwrap()
}

pub fn int(path: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(path).unwrap().query_row(sql, [], |row| row.get(0)).unwrap()
}

/// The code of a BLOCK outcome; any other outcome fails the test.
pub fn blocked(outcome: &Outcome) -> BlockCode {
    match outcome {
        Outcome::Blocked { code, .. } => *code,
        other => panic!("not blocked: {other:?}"),
    }
}
