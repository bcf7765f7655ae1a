//! Many callers on one ledger: threads and tokio tasks share one `Ledger` handle; their
//! downstreams run at once (the downstream records how many calls it holds at a time,
//! and waits, boundedly, for all of them to be inside together), and a key raced by
//! every caller is performed once.

use std::{
    collections::HashMap,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::json;
use toolledger::{
    AsyncDownstream, Call, Downstream, DownstreamError, DownstreamIdentity, DownstreamReceipt,
    DownstreamRequest, Identifier, Ledger, Lookup, ModelCall, NoRoles, Now, Outcome,
    PrincipalResolver, ResolverError, ToolDefinition,
};

use crate::TempDir;

/// How long a caller waits inside the downstream for the others: a bound, never a
/// measure. Callers serialized by a lock would each wait it out alone, and the
/// overlap recorded would be one.
const TOGETHER_BOUND: Duration = Duration::from_secs(20);

/// Who is inside the downstream now, the most ever inside at once, and the effects.
#[derive(Default)]
struct Inside {
    now: Mutex<usize>,
    /// Every caller that ever entered (never counted down: a waiter woken late still
    /// sees that all arrived).
    arrivals: Mutex<usize>,
    arrived: Condvar,
    most: AtomicUsize,
    effects: Mutex<HashMap<String, usize>>,
}

impl Inside {
    /// Enters; waits (at most [`TOGETHER_BOUND`]) until `together` callers arrived.
    fn enter(&self, together: usize) {
        {
            let mut now = self.now.lock().unwrap();
            *now += 1;
            self.most.fetch_max(*now, Ordering::SeqCst);
        }
        let mut arrivals = self.arrivals.lock().unwrap();
        *arrivals += 1;
        self.arrived.notify_all();
        let _ = self
            .arrived
            .wait_timeout_while(arrivals, TOGETHER_BOUND, |arrivals| *arrivals < together)
            .unwrap();
    }

    fn leave(&self, request: &DownstreamRequest) -> serde_json::Value {
        *self.now.lock().unwrap() -= 1;
        let mut effects = self.effects.lock().unwrap();
        let key = request.downstream_request_ref.as_str().to_owned();
        *effects.entry(key).or_default() += 1;
        json!({"payment_id": format!("pay-{}", effects.len())})
    }

    fn effects(&self) -> Vec<usize> {
        self.effects.lock().unwrap().values().copied().collect()
    }
}

/// A payment service reached by a blocking client.
struct Payments {
    identity: DownstreamIdentity,
    inside: Arc<Inside>,
    together: usize,
}

impl Downstream for Payments {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        self.inside.enter(self.together);
        Ok(request.receipt(self.inside.leave(request)))
    }

    fn lookup(&self, _: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }
}

/// The same service reached by an async client, run on the host's runtime.
struct AsyncPayments {
    identity: DownstreamIdentity,
    inside: Arc<Inside>,
    gate: Arc<tokio::sync::Barrier>,
}

impl AsyncDownstream for AsyncPayments {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    async fn execute(
        &self,
        request: &DownstreamRequest,
        _: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        {
            let mut now = self.inside.now.lock().unwrap();
            *now += 1;
            self.inside.most.fetch_max(*now, Ordering::SeqCst);
        }
        // Only the first round's calls (amount 100) meet; a racer performs alone.
        if request.arguments["amount_minor"] == 100 {
            let _ = tokio::time::timeout(TOGETHER_BOUND, self.gate.wait()).await;
        }
        Ok(request.receipt(self.inside.leave(request)))
    }

    async fn lookup(&self, _: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }
}

/// A payment tool, as a definition: one amount in, one payment id out.
pub(crate) fn pay() -> toolledger::ToolSpec {
    ToolDefinition::from_document(
        "pay.json",
        &json!({
            "name": "pay",
            "description": "Pay, once per idempotency key.",
            "input_schema": {"type": "object", "required": ["amount_minor"],
                "properties": {"amount_minor": {"type": "integer", "minimum": 1}}},
            "output_schema": {"type": "object", "required": ["payment_id"]},
        }),
    )
    .unwrap()
    .tool()
}

fn call(key: &str, n: usize) -> Call {
    paying(key, n, 100)
}

fn paying(key: &str, n: usize, amount: u64) -> Call {
    Call::new("pay", json!({"amount_minor": amount}))
        .principal("acme", "user-1")
        .idempotency_key(key)
        .model_call(ModelCall::new(
            "openai",
            "responses",
            "openai-responses-2026-05",
            "r-1",
            &format!("c-{key}-{n}"),
        ))
}

fn identity() -> DownstreamIdentity {
    DownstreamIdentity::new("payments", "1").unwrap()
}

/// What the handle promises a host: shared across threads, cloned cheaply.
#[test]
fn a_ledger_is_a_send_and_sync_handle() {
    fn shared<T: Send + Sync + Clone + 'static>() {}
    shared::<Ledger<toolledger::http::HttpDownstream, NoRoles>>();
    shared::<Ledger<toolledger::Simulated, toolledger::Claims>>();
    shared::<Ledger<toolledger::OnRuntime<AsyncPayments>, NoRoles>>();
}

#[test]
fn threads_on_one_ledger_run_their_downstreams_at_once() {
    const THREADS: usize = 8;
    let dir = TempDir::new("many-threads");
    let inside = Arc::new(Inside::default());
    let payments =
        Payments { identity: identity(), inside: Arc::clone(&inside), together: THREADS };
    let ledger =
        Ledger::builder(dir.join("ledger.sqlite3")).tool(pay()).open(payments, NoRoles).unwrap();
    let replies: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|n| {
                let ledger = &ledger;
                scope.spawn(move || ledger.dispatch(&call(&format!("pay-{n}"), 0)).unwrap())
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    assert!(replies.iter().all(|reply| matches!(reply.outcome(), Outcome::Fresh(_))));
    assert_eq!(inside.most.load(Ordering::SeqCst), THREADS, "every downstream call inside at once");
    assert_eq!(inside.effects(), vec![1; THREADS]);
    // And each replays, with no second effect.
    for n in 0..THREADS {
        let again = ledger.dispatch(&call(&format!("pay-{n}"), 0)).unwrap();
        assert!(matches!(again.outcome(), Outcome::Replayed(_)));
    }
    assert_eq!(inside.effects(), vec![1; THREADS]);
}

#[test]
fn threads_racing_one_key_make_one_effect() {
    const THREADS: usize = 8;
    let dir = TempDir::new("many-race");
    let inside = Arc::new(Inside::default());
    // No rendezvous: the racers cannot all be inside, there is one effect to make.
    let payments = Payments { identity: identity(), inside: Arc::clone(&inside), together: 1 };
    let ledger =
        Ledger::builder(dir.join("ledger.sqlite3")).tool(pay()).open(payments, NoRoles).unwrap();
    let replies: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let ledger = ledger.clone();
                scope.spawn(move || ledger.dispatch(&call("pay-once", 0)).unwrap())
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    // One performs it; each other waits for it in this process and replays it (none
    // finds it in flight and answers unknown).
    let fresh = replies.iter().filter(|reply| matches!(reply.outcome(), Outcome::Fresh(_))).count();
    let replayed =
        replies.iter().filter(|reply| matches!(reply.outcome(), Outcome::Replayed(_))).count();
    assert_eq!(
        (fresh, replayed),
        (1, THREADS - 1),
        "{:?}",
        replies.iter().map(|reply| reply.canonical()).collect::<Vec<_>>()
    );
    assert_eq!(inside.effects(), vec![1]);
    assert!(matches!(
        ledger.dispatch(&call("pay-once", 0)).unwrap().outcome(),
        Outcome::Replayed(_)
    ));
    assert_eq!(inside.effects(), vec![1]);
    assert!(toolledger::audit(dir.join("ledger.sqlite3")).unwrap().passed());
}

#[test]
fn tokio_tasks_share_one_ledger_and_an_async_downstream() {
    const TASKS: usize = 8;
    let dir = TempDir::new("many-tokio");
    let inside = Arc::new(Inside::default());
    // A current-thread runtime: the ledger's disk work runs on the blocking pool, the
    // async downstream on this one thread, and both at once for every task.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let fresh = runtime.block_on(async {
        let payments = AsyncPayments {
            identity: identity(),
            inside: Arc::clone(&inside),
            gate: Arc::new(tokio::sync::Barrier::new(TASKS)),
        };
        let ledger = Ledger::builder(dir.join("ledger.sqlite3"))
            .tool(pay())
            .open_async(payments, NoRoles)
            .unwrap();
        let tasks: Vec<_> = (0..TASKS)
            .map(|n| tokio::spawn(ledger.dispatch_async(&call(&format!("pay-{n}"), 0))))
            .collect();
        let mut fresh = 0;
        for task in tasks {
            fresh +=
                usize::from(matches!(task.await.unwrap().unwrap().outcome(), Outcome::Fresh(_)));
        }
        // Eight racers on one key: one more effect.
        let racers: Vec<_> = (0..TASKS)
            .map(|n| tokio::spawn(ledger.dispatch_async(&paying("pay-race", n, 200))))
            .collect();
        let mut raced = Vec::new();
        for racer in racers {
            raced.push(racer.await.unwrap().unwrap());
        }
        assert_eq!(
            raced.iter().filter(|reply| matches!(reply.outcome(), Outcome::Fresh(_))).count(),
            1
        );
        assert!(raced.iter().all(|reply| reply.outcome().is_done()), "none unknown");
        let replay = ledger.dispatch_async(&paying("pay-race", 0, 200)).await.unwrap();
        assert!(matches!(replay.outcome(), Outcome::Replayed(_)), "{}", replay.canonical());
        fresh
    });
    assert_eq!(fresh, TASKS);
    assert_eq!(inside.most.load(Ordering::SeqCst), TASKS, "every downstream call inside at once");
    assert_eq!(inside.effects(), vec![1; TASKS + 1]);
    assert!(toolledger::audit(dir.join("ledger.sqlite3")).unwrap().passed());
}

/// A downstream that dispatches again, from inside its own execute.
struct Reentrant {
    identity: DownstreamIdentity,
    again: std::sync::OnceLock<Box<dyn Fn() -> String + Send + Sync>>,
    seen: Mutex<Vec<String>>,
}

impl Downstream for Reentrant {
    fn identity(&self) -> &DownstreamIdentity {
        &self.identity
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        _: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        let seen = self.again.get().map(|again| again()).unwrap_or_default();
        self.seen.lock().unwrap().push(seen);
        Ok(request.receipt(json!({"payment_id": "pay-1"})))
    }

    fn lookup(&self, _: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        Ok(Lookup::NotFound)
    }
}

/// A call of a key made from inside the call that holds the key's turn does not wait
/// for itself (it would wait forever): it finds the operation in flight.
#[test]
fn a_call_from_inside_its_own_key_does_not_wait_for_itself() {
    let dir = TempDir::new("many-reentrant");
    let reentrant = Reentrant {
        identity: identity(),
        again: std::sync::OnceLock::new(),
        seen: Mutex::default(),
    };
    let ledger =
        Ledger::builder(dir.join("ledger.sqlite3")).tool(pay()).open(reentrant, NoRoles).unwrap();
    let inner = ledger.clone();
    let _ = ledger.downstream().again.set(Box::new(move || {
        let reply = inner.dispatch(&call("pay-self", 0)).unwrap();
        reply.package()["code"].as_str().unwrap().to_owned()
    }));
    let (sent, answered) = std::sync::mpsc::channel();
    let outer = ledger.clone();
    std::thread::spawn(move || {
        let _ = sent.send(outer.dispatch(&call("pay-self", 0)).unwrap());
    });
    let reply =
        answered.recv_timeout(TOGETHER_BOUND).expect("the call answered, not waiting for itself");
    assert!(matches!(reply.outcome(), Outcome::Fresh(_)));
    assert_eq!(*ledger.downstream().seen.lock().unwrap(), ["OUTCOME_UNKNOWN"]);
}

/// A role resolver on the network: it waits (boundedly) until `together` lookups are
/// inside it at once.
struct Directory {
    inside: Arc<Inside>,
    together: usize,
}

impl PrincipalResolver for Directory {
    fn current_roles(&self, _: &Identifier, _: &Identifier) -> Result<Vec<String>, ResolverError> {
        self.inside.enter(self.together);
        *self.inside.now.lock().unwrap() -= 1;
        Ok(Vec::new())
    }
}

/// An async call first reads what the ledger holds on the reading lane, one thread per
/// core, and the role resolver is asked there. A resolver that waits on the network must
/// not hold the calls queued behind it: the lane starts more threads while its oldest
/// read waits. Were it to stay at one thread per core, the lookups inside at once would
/// stop there, each waiting out the bound.
#[test]
fn a_slow_role_resolver_holds_no_async_call_behind_the_reading_lane() {
    let together = std::thread::available_parallelism().map_or(1, usize::from) + 2;
    let dir = TempDir::new("many-directory");
    let inside = Arc::new(Inside::default());
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let replies = runtime.block_on(async {
        let payments =
            Payments { identity: identity(), inside: Arc::new(Inside::default()), together: 1 };
        let directory = Directory { inside: Arc::clone(&inside), together };
        let ledger = Ledger::builder(dir.join("ledger.sqlite3"))
            .tool(pay())
            .open(payments, directory)
            .unwrap();
        let calls: Vec<_> = (0..together)
            .map(|n| tokio::spawn(ledger.dispatch_async(&call(&format!("pay-{n}"), 0))))
            .collect();
        let mut replies = Vec::new();
        for call in calls {
            replies.push(call.await.unwrap().unwrap());
        }
        replies
    });
    assert!(replies.iter().all(|reply| matches!(reply.outcome(), Outcome::Fresh(_))));
    assert!(inside.most.load(Ordering::SeqCst) >= together, "the lookups were inside at once");
}
