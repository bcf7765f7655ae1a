//! Connections lost under the store, and the pool.

use std::time::{Duration, Instant};

use postgres::Client;
use toolledger_store::{LedgerStore, Reservation, StoreError, Waits};
use toolledger_store_postgres::{PgPool, StoreClock};

use crate::{assert_audit_passes, at, count, fresh, intent, raw, store};

/// Terminates the server process `pid` and waits until it is gone.
fn terminate(client: &mut Client, pid: i32) {
    let done: bool = client.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap().get(0);
    assert!(done);
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(client, &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}")) > 0 {
        assert!(Instant::now() < deadline, "the backend did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `err` is the fixed answer for a lost connection, with nothing of the
/// server's text in its message.
fn is_clean_loss(err: &StoreError) -> bool {
    matches!(err, StoreError::Backend { backend: "postgres", what, .. }
        if *what == "the connection to the server was lost")
        && err.to_string() == "postgres failed: the connection to the server was lost"
        && err.failure_kind() == Some(toolledger_store::FailureKind::LostConnection)
}

#[test]
fn a_connection_terminated_between_calls_is_made_again() {
    let url = fresh("terminated");
    let mut store = store(&url);
    let mut admin = raw(&url);
    let (first, call) = intent("k-1");
    store.reserve(&first, &call, at(0)).unwrap();

    // Terminated while idle: the next write finds it lost before its transaction
    // begins, reconnects, and runs.
    let pid = store.backend_pid().unwrap();
    terminate(&mut admin, pid);
    let (second, second_call) = intent("k-2");
    match store.reserve(&second, &second_call, at(1)) {
        Ok(reservation) => assert!(matches!(reservation, Reservation::Reserved(_))),
        Err(err) => {
            assert!(is_clean_loss(&err), "{err:?}");
            // Unknown whether it committed: asking again says.
            let again = store.reserve(&second, &second_call, at(1)).unwrap();
            assert!(matches!(again, Reservation::Reserved(_) | Reservation::Exists(_)));
        }
    }
    assert_ne!(store.backend_pid().unwrap(), pid);

    // Terminated again: a read reconnects too.
    let pid = store.backend_pid().unwrap();
    terminate(&mut admin, pid);
    match store.operation_by_status_ref(&first.status_ref) {
        Ok(found) => assert!(found.is_some()),
        Err(err) => assert!(is_clean_loss(&err), "{err:?}"),
    }
    assert!(store.operation_by_status_ref(&first.status_ref).unwrap().is_some());

    assert_eq!(count(&mut admin, "SELECT count(*) FROM operations"), 2);
    assert_eq!(count(&mut admin, "SELECT count(*) FROM outbox"), 2);
    assert_eq!(count(&mut admin, "SELECT count(*) FROM call_identities"), 2);
    assert_audit_passes(&mut store);
}

#[test]
fn a_server_that_cannot_be_reached_is_a_clean_error() {
    // Nothing listens on port 1.
    let err = toolledger_store_postgres::PgStore::connect(
        "postgres://postgres@127.0.0.1:1/none?connect_timeout=2",
        Waits::default(),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "postgres failed: could not connect to the server");
    assert_eq!(err.code(), toolledger_contract::ErrorCode::StoreError);
}

#[test]
fn the_pool_lends_at_most_its_size_and_takes_connections_back() {
    let url = fresh("pool");
    let waits = Waits { busy_timeout: Duration::from_millis(300), deadline: None };
    let pool = PgPool::new(&url, 2, waits).unwrap().with_clock(StoreClock::Caller);
    assert_eq!(pool.open(), (1, 1));
    let mut first = pool.store().unwrap();
    let second = pool.store().unwrap();
    assert_eq!(pool.open(), (2, 0));
    let started = Instant::now();
    assert_eq!(pool.store().unwrap_err(), StoreError::Busy);
    assert!(started.elapsed() >= Duration::from_millis(250));
    let (new, call) = intent("k-1");
    assert!(matches!(first.reserve(&new, &call, at(0)).unwrap(), Reservation::Reserved(_)));
    drop(first);
    assert_eq!(pool.open(), (2, 1));

    // Stores on several threads, each lent and given back.
    let threads: Vec<_> = (0..6)
        .map(|index| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut store = loop {
                    match pool.store() {
                        Ok(store) => break store,
                        Err(StoreError::Busy) => continue,
                        Err(err) => panic!("{err:?}"),
                    }
                };
                let (new, call) = intent(&format!("k-thread-{index}"));
                store.reserve(&new, &call, at(1)).unwrap()
            })
        })
        .collect();
    drop(second);
    for thread in threads {
        assert!(matches!(thread.join().unwrap(), Reservation::Reserved(_)));
    }
    assert_eq!(pool.open(), (2, 2));

    // A lent connection that is lost is not given back; the pool makes another.
    let mut lent = pool.store().unwrap();
    let pid = lent.backend_pid().unwrap();
    terminate(&mut raw(&url), pid);
    match lent.operation_by_scope(&new.scope) {
        Ok(found) => assert!(found.is_some()),
        Err(err) => assert!(is_clean_loss(&err), "{err:?}"),
    }
    drop(lent);
    assert_audit_passes(&mut pool.store().unwrap());
    assert_audit_passes(&mut store(&url));
}

#[test]
fn stores_and_pools_cross_threads() {
    fn send<T: Send>() {}
    fn shared<T: Send + Sync + Clone>() {}
    send::<toolledger_store_postgres::PgStore>();
    shared::<PgPool>();
}

#[test]
fn a_refused_write_is_answered_in_fixed_words_with_the_cause_kept() {
    let url = fresh("refused");
    let mut store = store(&url);
    let (new, _) = intent("k-1");
    let (downstream, _) = crate::receipts(&new);
    // A row a CHECK refuses. (A malformed receipt ref, which the table's own CHECK
    // refuses, can no longer be built: `ReceiptRef` checks it first.)
    raw(&url)
        .batch_execute(
            "ALTER TABLE downstream_receipts ADD CONSTRAINT refuse_all CHECK (created_at < 0)",
        )
        .unwrap();
    let err = toolledger_engine::StandInReceipts::record_downstream_receipt(
        &mut store,
        &downstream,
        at(0),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "postgres failed: a constraint or trigger refused the write");
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(!err.to_string().contains(&cause));
    assert_eq!(count(&mut raw(&url), "SELECT count(*) FROM downstream_receipts"), 0);
    raw(&url).batch_execute("ALTER TABLE downstream_receipts DROP CONSTRAINT refuse_all").unwrap();
    // The store goes on.
    assert_audit_passes(&mut store);
}

/// Sends `signal` (`STOP`, `CONT`) to the process `pid`.
fn signal(signal: &str, pid: i32) {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// A server process stopped (`SIGSTOP`) under an open connection says nothing at all:
/// each exchange is bounded by the wait bound and a second, so the write and the read
/// are answered `Busy` (before: they waited for ever), and once the server runs again
/// the store makes a new connection and goes on.
#[test]
fn a_stopped_server_is_answered_busy_within_the_bound() {
    let url = fresh("stopped");
    let waits = Waits { busy_timeout: Duration::from_millis(500), deadline: None };
    let mut store = toolledger_store_postgres::PgStore::connect(&url, waits).unwrap();
    let (first, call) = intent("k-1");
    store.reserve(&first, &call, at(0)).unwrap();
    let pid = store.backend_pid().unwrap();
    signal("STOP", pid);
    let (second, second_call) = intent("k-2");
    let started = Instant::now();
    let written = store.reserve(&second, &second_call, at(1));
    let read = store.operation_by_status_ref(&first.status_ref);
    let waited = started.elapsed();
    signal("CONT", pid);
    assert_eq!(written.unwrap_err(), StoreError::Busy);
    // The abandoned connection is never used again: the read connected anew, to the
    // server's other processes, which were never stopped.
    assert!(read.unwrap().is_some());
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert_ne!(store.backend_pid().unwrap(), pid);
    let again = store.reserve(&second, &second_call, at(1)).unwrap();
    assert!(matches!(again, Reservation::Reserved(_)));
    assert_audit_passes(&mut store);
}

/// Something that accepts connections and then says nothing (a stopped server's
/// listening socket, a port held by another program): the connect is bounded too, and
/// answered `STORE_ERROR` in fixed words, never waited on for ever.
#[test]
fn a_server_that_accepts_and_says_nothing_is_answered_within_the_bound() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming().take(4) {
            open.push(stream);
        }
        std::thread::sleep(Duration::from_secs(30));
    });
    let url = format!("postgres://postgres@127.0.0.1:{port}/none?connect_timeout=2");
    let started = Instant::now();
    let refused = toolledger_store_postgres::PgStore::connect(
        &url,
        Waits::total(Duration::from_millis(1_500)),
    )
    .unwrap_err();
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert_eq!(refused.code().as_str(), "STORE_ERROR");
    assert_eq!(
        refused.to_string(),
        "postgres failed: the server did not answer within the wait bound"
    );
    drop(held);
}

/// A connection string that requires TLS is refused in words that say why: no TLS stack
/// is built in (before: "could not connect to the server", after a handshake).
#[test]
fn sslmode_require_is_refused_saying_tls_is_not_built_in() {
    let url = format!("{}?sslmode=require", fresh("tls"));
    let refused = toolledger_store_postgres::PgStore::connect(&url, Waits::default()).unwrap_err();
    assert_eq!(refused.code().as_str(), "STORE_ERROR");
    assert!(refused.to_string().contains("TLS, which is not built in"), "{refused}");
}
