//! The relay: workers that drain the outbox, each claiming a batch of due events at a
//! time, with a heartbeat that keeps their live leases from running out while a slow
//! downstream call is under way.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use serde_json::Value;
use toolledger_contract::{
    Clock, Identifier, LeaseSeconds, PrincipalResolver, ProviderProfile, Registry, ToolSpec,
    UnixSeconds,
};
use toolledger_engine::{Backoff, Downstream, Drained, Engine};
use toolledger_store::{LedgerStore, Waits};

use crate::{Error, Location, Store, StoreClock, wall_clock};

/// When a relay stops.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// // A signal handler raises the flag; the relay finishes what it holds and returns.
/// static STOP: AtomicBool = AtomicBool::new(false);
/// let until = toolledger::Until::Stopped(&STOP);
/// STOP.store(true, Ordering::SeqCst);
/// assert!(matches!(until, toolledger::Until::Stopped(flag) if flag.load(Ordering::SeqCst)));
/// ```
#[derive(Debug, Clone, Copy)]
pub enum Until<'a> {
    /// When a pass of every worker finds nothing due (`--once`).
    Drained,
    /// When the flag is raised (SIGTERM, SIGINT): no new claims; what is claimed is
    /// finished first.
    Stopped(&'a AtomicBool),
}

/// What a relay reports as it goes.
///
/// ```
/// // A log callback a host might pass to `Relay::run`: one line per pass that did work.
/// let log = |event: toolledger::RelayEvent| match event {
///     toolledger::RelayEvent::Pass { worker, drained } if drained.claimed > 0 => {
///         eprintln!("worker {worker}: {} delivered", drained.delivered)
///     }
///     toolledger::RelayEvent::Failed { worker, code } => eprintln!("worker {worker}: {code}"),
///     toolledger::RelayEvent::Pass { .. } => {}
/// };
/// log(toolledger::RelayEvent::Failed { worker: 0, code: "STORE_BUSY" });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayEvent {
    /// One worker's pass over a batch.
    Pass {
        /// Which worker (0-based).
        worker: usize,
        /// What the pass did.
        drained: Drained,
    },
    /// A pass that could not claim (the store was busy or failed); the worker goes on
    /// after its poll interval.
    Failed {
        /// Which worker.
        worker: usize,
        /// The stable code.
        code: &'static str,
    },
}

/// A relay over a ledger: how many workers, how big a batch, how long a
/// lease, how long to wait between empty passes, how to back off.
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("relay");
/// ledger.enqueue(&call)?;
/// let relay = toolledger::Relay::new(dir.join("ledger.sqlite3"))
///     .tool(toolledger::RefundOrder { approval_threshold_minor: Some(5_000) }.tool())
///     .at(1_767_225_600);
/// let drained = relay.run(
///     || toolledger::simulated(&dir.join("ledger.sqlite3")),
///     || toolledger::NoRoles,
///     &call_context(),
///     toolledger::Until::Drained,
///     &|_| {},
/// )?;
/// assert_eq!(drained.delivered, 1);
/// # fn call_context() -> serde_json::Value {
/// #     serde_json::json!({"orders": [{"order_id": "ord-1", "tenant_id": "tenant-a",
/// #         "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]})
/// # }
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Relay {
    location: Location,
    tools: Vec<ToolSpec>,
    profiles: Vec<ProviderProfile>,
    waits: Waits,
    lease_seconds: i64,
    batch: usize,
    concurrency: usize,
    poll: Duration,
    backoff: Backoff,
    now: Option<i64>,
    clock: Option<StoreClock>,
}

impl Relay {
    /// A relay over the ledger at `location` (a SQLite path or a PostgreSQL URL): one
    /// worker, batches of 32, 30 s leases, a pass a second when idle, the default backoff,
    /// the wall clock.
    ///
    /// ```
    /// let relay = toolledger::Relay::new("ledger.sqlite3");
    /// # let _ = relay;
    /// ```
    pub fn new(location: impl Into<Location>) -> Relay {
        Relay {
            location: location.into(),
            tools: Vec::new(),
            profiles: toolledger_contract::builtin_profiles(),
            waits: Waits::default(),
            lease_seconds: 30,
            batch: 32,
            concurrency: 1,
            poll: Duration::from_secs(1),
            backoff: Backoff::default(),
            now: None,
            clock: None,
        }
    }

    /// Registers a tool whose events this relay works.
    ///
    /// ```
    /// let relay = toolledger::Relay::new("l.sqlite3").tool(toolledger::RefundOrder::default().tool());
    /// # let _ = relay;
    /// ```
    pub fn tool(mut self, tool: ToolSpec) -> Relay {
        self.tools.retain(|known| known.name != tool.name);
        self.tools.push(tool);
        self
    }

    /// Registers a provider profile beyond the built-in ones, as
    /// [`LedgerBuilder::profile`](crate::LedgerBuilder::profile) does for the ledger
    /// that accepted the operations.
    ///
    /// ```
    /// let relay = toolledger::Relay::new("l.sqlite3")
    ///     .profile(toolledger::ProviderProfile::new("mcp", "tools_call", "toolledger-mcp-1"));
    /// # let _ = relay;
    /// ```
    pub fn profile(mut self, profile: ProviderProfile) -> Relay {
        if !self.profiles.contains(&profile) {
            self.profiles.push(profile);
        }
        self
    }

    /// How many workers (threads), each with its own connections (1–64).
    ///
    /// ```
    /// let relay = toolledger::Relay::new("l.sqlite3").concurrency(4);
    /// # let _ = relay;
    /// ```
    pub fn concurrency(mut self, workers: usize) -> Relay {
        self.concurrency = workers.clamp(1, 64);
        self
    }

    /// How many due events one claim takes (1–1000).
    ///
    /// ```
    /// let relay = toolledger::Relay::new("l.sqlite3").batch(100);
    /// # let _ = relay;
    /// ```
    pub fn batch(mut self, events: usize) -> Relay {
        self.batch = events.clamp(1, 1000);
        self
    }

    /// How long a worker's lease lasts (1–3600 s); the heartbeat renews live leases at a
    /// third of it.
    ///
    /// ```
    /// let relay = toolledger::Relay::new("l.sqlite3").lease_seconds(60);
    /// # let _ = relay;
    /// ```
    pub fn lease_seconds(mut self, seconds: i64) -> Relay {
        self.lease_seconds = seconds;
        self
    }

    /// How long an idle worker waits before its next pass.
    ///
    /// ```
    /// let relay = toolledger::Relay::new("l.sqlite3").poll(std::time::Duration::from_millis(200));
    /// # let _ = relay;
    /// ```
    pub fn poll(mut self, interval: Duration) -> Relay {
        self.poll = interval;
        self
    }

    /// How long each wait for another connection's lock may take (default 5 s; a relay
    /// has no overall deadline).
    ///
    /// ```
    /// let relay = toolledger::Relay::new("l.sqlite3").waits(toolledger::Waits::default());
    /// # let _ = relay;
    /// ```
    pub fn waits(mut self, waits: Waits) -> Relay {
        self.waits = waits;
        self
    }

    /// How a request that was not sent is retried.
    ///
    /// ```
    /// let relay = toolledger::Relay::new("l.sqlite3")
    ///     .backoff(toolledger::Backoff { base_seconds: 1, max_seconds: 60 });
    /// # let _ = relay;
    /// ```
    pub fn backoff(mut self, backoff: Backoff) -> Relay {
        self.backoff = backoff;
        self
    }

    /// Judges every pass at this instant instead of the wall clock (for tests and
    /// drills; a relay that runs for long reads the wall clock).
    ///
    /// ```
    /// let relay = toolledger::Relay::new("l.sqlite3").at(1_767_225_600);
    /// # let _ = relay;
    /// ```
    pub fn at(mut self, now: i64) -> Relay {
        self.now = Some(now);
        self
    }

    /// Whose clock a PostgreSQL ledger judges leases and due times by (default: the
    /// database's, or the relay's own instant when [`Relay::at`] gave one).
    ///
    /// ```
    /// let relay = toolledger::Relay::new("ledger.sqlite3").store_clock(toolledger::StoreClock::Caller);
    /// # let _ = relay;
    /// ```
    pub fn store_clock(mut self, clock: StoreClock) -> Relay {
        self.clock = Some(clock);
        self
    }

    /// Runs the workers until `until`, each with its own downstream and resolver, and a
    /// heartbeat beside them; `log` hears of every pass. The totals of every pass.
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("relay-run");
    /// # let context = serde_json::json!({"orders": [{"order_id": "ord-1", "tenant_id": "tenant-a",
    /// #     "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]});
    /// ledger.enqueue(&call)?;
    /// let path = dir.join("ledger.sqlite3");
    /// let drained = toolledger::Relay::new(&path)
    ///     .tool(toolledger::RefundOrder { approval_threshold_minor: Some(5_000) }.tool())
    ///     .concurrency(2)
    ///     .at(1_767_225_600)
    ///     .run(|| toolledger::simulated(&path), || toolledger::NoRoles, &context,
    ///         toolledger::Until::Drained, &|_| {})?;
    /// assert_eq!((drained.claimed, drained.delivered), (1, 1));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// An [`Error`] when a setting is invalid or a worker's store cannot be opened.
    pub fn run<D, R>(
        &self,
        downstream: impl Fn() -> Result<D, Error> + Sync,
        resolver: impl Fn() -> R + Sync,
        context: &Value,
        until: Until<'_>,
        log: &(dyn Fn(RelayEvent) + Sync),
    ) -> Result<Drained, Error>
    where
        D: Downstream + Send,
        R: PrincipalResolver + Send,
    {
        let lease = LeaseSeconds::new(self.lease_seconds)
            .map_err(|_| Error::invalid("the lease must last 1 to 3600 seconds".to_owned()))?;
        let registry = Registry::new(self.tools.clone(), self.profiles.clone());
        let stamp = unique_stamp();
        // Each pass claims under an owner of its own, `relay-<stamp>-<worker>-<pass>`, and
        // the heartbeat renews only the owner of a pass in progress: once a pass returns,
        // nothing renews what it left (an attempt set aside, or one a failure stopped).
        let owner_of = |worker: usize, pass: u64| {
            Identifier::new(&format!("relay-{stamp}-{worker}-{pass}"))
                .map_err(|_| Error::invalid("a worker id is not an identifier".to_owned()))
        };
        owner_of(self.concurrency, u64::MAX)?;
        let in_flight: Vec<std::sync::Mutex<Option<Identifier>>> =
            (0..self.concurrency).map(|_| std::sync::Mutex::new(None)).collect();
        // Each worker's downstream, judged before any store is opened: one declaring the
        // simulation's identity is refused with nothing created.
        let downstreams = (0..self.concurrency)
            .map(|_| {
                let downstream = downstream()?;
                crate::refuse_reserved(&downstream)?;
                Ok(downstream)
            })
            .collect::<Result<Vec<D>, Error>>()?;
        // One connection per worker and one for the heartbeat (a PostgreSQL ledger's
        // come from one pool).
        let mut stores =
            Store::open_many(&self.location, self.concurrency + 1, self.waits, self.judged_by())?;
        let mut heart =
            stores.pop().ok_or(Error::invalid("no connection for the heartbeat".to_owned()))?;
        let mut engines = Vec::new();
        for (store, downstream) in stores.into_iter().zip(downstreams) {
            // The downstream's calls are steps of the pass's span (`execute`, `lookup`).
            let downstream = crate::traces::Traced(downstream);
            engines.push(Engine::new(store, downstream, resolver(), registry.clone()));
        }
        // Dropped once every worker has finished: the heartbeat wakes and stops at once.
        let (finished, workers_running) = std::sync::mpsc::channel::<()>();
        let totals = std::thread::scope(|scope| {
            let workers: Vec<_> = engines
                .into_iter()
                .zip(&in_flight)
                .enumerate()
                .map(|(worker, (mut engine, slot))| {
                    let owner_of = &owner_of;
                    scope.spawn(move || {
                        let mut totals = Drained::default();
                        for pass in 0_u64.. {
                            if let Until::Stopped(stop) = until {
                                if stop.load(Ordering::SeqCst) {
                                    break;
                                }
                            }
                            let Ok(clock) = self.clock(lease) else { break };
                            let Ok(owner) = owner_of(worker, pass) else { break };
                            *lock(slot) = Some(owner.clone());
                            // A pass that claims something is a trace of its own.
                            let passed = crate::traces::relay_pass(
                                self.location.backend(),
                                || {
                                    engine.relay_batch(
                                        &owner,
                                        &clock,
                                        context,
                                        self.batch,
                                        self.backoff,
                                    )
                                },
                                |passed| match passed {
                                    Ok(drained) => (drained.claimed, None),
                                    Err(err) => (0, Some(err.code().as_str())),
                                },
                            );
                            // Under the slot's lock: a beat in progress finishes first, and
                            // no later beat renews this pass's leases.
                            *lock(slot) = None;
                            match passed {
                                Ok(drained) => {
                                    totals.add(&drained);
                                    let idle = drained.claimed == 0;
                                    log(RelayEvent::Pass { worker, drained });
                                    if idle {
                                        if matches!(until, Until::Drained) {
                                            break;
                                        }
                                        self.idle(until);
                                    }
                                }
                                Err(err) => {
                                    log(RelayEvent::Failed { worker, code: err.code().as_str() });
                                    if matches!(until, Until::Drained) {
                                        break;
                                    }
                                    self.idle(until);
                                }
                            }
                        }
                        totals
                    })
                })
                .collect();
            // The heartbeat: every third of a lease, the calls in flight are renewed: the
            // live leases of each pass in progress, but for the attempts it has set aside
            // (fenced by owner: a lease that ended or was taken over is not touched).
            let beat = Duration::from_secs(u64::try_from(self.lease_seconds).unwrap_or(1)) / 3;
            let (heart, in_flight) = (&mut heart, &in_flight);
            let heartbeat = scope.spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    workers_running.recv_timeout(beat)
                {
                    if let Ok(clock) = self.clock(lease) {
                        for slot in in_flight {
                            let pass = lock(slot);
                            if let Some(owner) = pass.as_ref() {
                                let _ = heart.heartbeat(owner, clock.now, lease);
                            }
                        }
                    }
                }
            });
            let mut totals = Drained::default();
            for worker in workers {
                if let Ok(drained) = worker.join() {
                    totals.add(&drained);
                }
            }
            drop(finished);
            let _ = heartbeat.join();
            totals
        });
        Ok(totals)
    }

    /// A relay given an instant ([`Relay::at`]) runs on a simulated clock, and a
    /// PostgreSQL ledger judges by it; otherwise by the database's clock.
    fn judged_by(&self) -> StoreClock {
        match (self.clock, self.now) {
            (Some(clock), _) => clock,
            (None, Some(_)) => StoreClock::Caller,
            (None, None) => StoreClock::Database,
        }
    }

    fn clock(&self, lease: LeaseSeconds) -> Result<Clock, Error> {
        let now = UnixSeconds::new(self.now.unwrap_or_else(wall_clock))
            .map_err(|_| Error::invalid("the relay's instant is out of range".to_owned()))?;
        Ok(Clock { now, lease_seconds: lease })
    }

    /// Waits out the poll interval, waking early when asked to stop.
    fn idle(&self, until: Until<'_>) {
        let started = Instant::now();
        while started.elapsed() < self.poll {
            if let Until::Stopped(stop) = until {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
            }
            std::thread::sleep(self.poll.min(Duration::from_millis(50)));
        }
    }
}

/// The slot, whatever a panicking holder left in it (an owner id, or none).
fn lock<T>(slot: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The command line's simulated downstream on its own connection to `path`: what a
/// relay over a simulated ledger hands each worker.
///
/// # Errors
///
/// As [`crate::LedgerBuilder::open`].
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("toolledger-doc-sim-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let downstream = toolledger::simulated(&dir.join("ledger.sqlite3"))?;
/// # drop(downstream);
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn simulated(location: impl Into<Location>) -> Result<crate::Simulated, Error> {
    simulated_with(location, toolledger_engine::Faults::default())
}

/// [`simulated`], injecting `faults` (requests not sent, delays): for drills.
///
/// # Errors
///
/// As [`simulated`].
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("toolledger-doc-simf-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let faults = toolledger::Faults { unavailable_percent: 30, delay_ms: 0, seed: 7 };
/// let downstream = toolledger::simulated_with(&dir.join("ledger.sqlite3"), faults)?;
/// # drop(downstream);
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub fn simulated_with(
    location: impl Into<Location>,
    faults: toolledger_engine::Faults,
) -> Result<crate::Simulated, Error> {
    let store = Store::open(&location.into(), Waits::default(), StoreClock::Database)?;
    let stand_in = toolledger_engine::StandIn::new(store).with_faults(faults);
    Ok(toolledger_engine::drill::Interrupt::new(
        stand_in,
        toolledger_engine::drill::Switch::default(),
    ))
}

/// `<pid>-<nanoseconds, hex>`: unique to this process and this moment.
fn unique_stamp() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!("{}-{nanos:x}", std::process::id())
}
