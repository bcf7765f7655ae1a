//! The ledger for tokio hosts: every call path as a future whose disk work runs on
//! the runtime's blocking pool, never on a runtime thread, and [`OnRuntime`], an
//! [`AsyncDownstream`] run on the host's own runtime.

use std::{future::Future, sync::Arc};

use toolledger_contract::{DownstreamIdentity, PrincipalResolver, StatusRef};
pub use toolledger_engine::AsyncDownstream;
use toolledger_engine::{
    Downstream, DownstreamError, DownstreamRequest, Evidence, Lookup, Resolution,
};
use toolledger_store::{DownstreamReceipt, Now};

use crate::{Call, Error, Ledger, LedgerBuilder, Reply, StatusQuery, traces::Parent};

/// An [`AsyncDownstream`] as the ledger calls a downstream: each `execute` and
/// `lookup` is a future run on the host's tokio runtime, from the blocking-pool thread
/// that works the call. Made by [`LedgerBuilder::open_async`].
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("toolledger-doc-or-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// use toolledger::{AsyncDownstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest, Lookup, Now};
/// struct Payments(DownstreamIdentity);
/// impl AsyncDownstream for Payments {
///     fn identity(&self) -> &DownstreamIdentity { &self.0 }
///     async fn execute(&self, request: &DownstreamRequest, _: Now) -> Result<DownstreamReceipt, DownstreamError> {
///         Ok(request.receipt(serde_json::json!({"payment_id": "pay-1"})))
///     }
///     async fn lookup(&self, _: &DownstreamRequest) -> Result<Lookup, DownstreamError> { Ok(Lookup::NotFound) }
/// }
/// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// runtime.block_on(async {
///     let payments = Payments(DownstreamIdentity::new("payments", "1").unwrap());
///     let ledger = toolledger::Ledger::builder(dir.join("async.sqlite3")).open_async(payments, toolledger::NoRoles)?;
///     assert_eq!(ledger.downstream().inner().identity().to_string(), "payments@1");
///     Ok::<(), toolledger::Error>(())
/// })?;
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
#[derive(Debug)]
pub struct OnRuntime<A> {
    inner: Arc<A>,
    runtime: tokio::runtime::Handle,
}

impl<A> OnRuntime<A> {
    /// The async downstream it runs (e.g. a test double's counters).
    ///
    /// ```
    /// # use toolledger::{AsyncDownstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest, Lookup, Now};
    /// # struct Payments(DownstreamIdentity);
    /// # impl AsyncDownstream for Payments {
    /// #     fn identity(&self) -> &DownstreamIdentity { &self.0 }
    /// #     async fn execute(&self, r: &DownstreamRequest, _: Now) -> Result<DownstreamReceipt, DownstreamError> { Ok(r.receipt(serde_json::json!({}))) }
    /// #     async fn lookup(&self, _: &DownstreamRequest) -> Result<Lookup, DownstreamError> { Ok(Lookup::NotFound) }
    /// # }
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-oi-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let _entered = runtime.enter();
    /// let payments = Payments(DownstreamIdentity::new("payments", "1").unwrap());
    /// let ledger = toolledger::Ledger::builder(dir.join("i.sqlite3")).open_async(payments, toolledger::NoRoles)?;
    /// assert_eq!(ledger.downstream().inner().0.name(), "payments");
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn inner(&self) -> &A {
        &self.inner
    }
}

impl<A: AsyncDownstream> Downstream for OnRuntime<A> {
    fn identity(&self) -> &DownstreamIdentity {
        self.inner.identity()
    }

    fn identity_for(&self, tool: &str) -> &DownstreamIdentity {
        self.inner.identity_for(tool)
    }

    fn identities(&self) -> Vec<DownstreamIdentity> {
        self.inner.identities()
    }

    fn execute(
        &self,
        request: &DownstreamRequest,
        now: Now,
    ) -> Result<DownstreamReceipt, DownstreamError> {
        self.runtime.block_on(self.inner.execute(request, now))
    }

    fn lookup(&self, request: &DownstreamRequest) -> Result<Lookup, DownstreamError> {
        self.runtime.block_on(self.inner.lookup(request))
    }

    fn can_look_up(&self, tool: &str) -> bool {
        self.inner.can_look_up(tool)
    }
}

impl LedgerBuilder {
    /// Opens the ledger with an [`AsyncDownstream`], run on the tokio runtime this is
    /// called on. Call it with the `*_async` methods ([`Ledger::dispatch_async`]…), on
    /// that runtime.
    ///
    /// # Errors
    ///
    /// As [`LedgerBuilder::open`]; `USAGE_ERROR` when called outside a tokio runtime.
    ///
    /// ```
    /// # let dir = std::env::temp_dir().join(format!("toolledger-doc-oa-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # use toolledger::{AsyncDownstream, DownstreamError, DownstreamIdentity, DownstreamReceipt, DownstreamRequest, Lookup, Now};
    /// # struct Payments(DownstreamIdentity);
    /// # impl AsyncDownstream for Payments {
    /// #     fn identity(&self) -> &DownstreamIdentity { &self.0 }
    /// #     async fn execute(&self, r: &DownstreamRequest, _: Now) -> Result<DownstreamReceipt, DownstreamError> { Ok(r.receipt(serde_json::json!({}))) }
    /// #     async fn lookup(&self, _: &DownstreamRequest) -> Result<Lookup, DownstreamError> { Ok(Lookup::NotFound) }
    /// # }
    /// let payments = Payments(DownstreamIdentity::new("payments", "1").unwrap());
    /// // Outside a runtime there is no runtime to run it on.
    /// let outside = toolledger::Ledger::builder(dir.join("a.sqlite3")).open_async(payments, toolledger::NoRoles);
    /// assert_eq!(outside.err().map(|error| error.code()), Some(toolledger::ErrorCode::UsageError));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// ```
    pub fn open_async<A: AsyncDownstream, R: PrincipalResolver>(
        self,
        downstream: A,
        resolver: R,
    ) -> Result<Ledger<OnRuntime<A>, R>, Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::invalid(
                "open_async runs the downstream on a tokio runtime: call it on one".to_owned(),
            )
        })?;
        self.open(OnRuntime { inner: Arc::new(downstream), runtime }, resolver)
    }
}

/// Runs `work` on the runtime's blocking pool and waits for it without blocking a
/// runtime thread, as every `*_async` method of [`Ledger`] does: for a host that wraps
/// a synchronous call in something of its own (a per-call context, say). A panic in it
/// (a host's downstream that panicked) goes on as the panic it was; a blocking task is
/// never cancelled once it has started, so a call handed to the ledger runs to its end
/// even if the future waiting on it is dropped.
///
/// # Errors
///
/// What `work` answers; `USAGE_ERROR` when the runtime shut down before it started
/// (nothing of it ran).
///
/// ```
/// # let (ledger, call, dir) = toolledger::doc_fixture("blocking");
/// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// let reply = runtime.block_on(toolledger::blocking(move || ledger.dispatch(&call)))?;
/// assert!(reply.outcome().is_done());
/// # std::fs::remove_dir_all(dir).unwrap();
/// # Ok::<(), toolledger::Error>(())
/// ```
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    match tokio::task::spawn_blocking(work).await {
        Ok(answer) => answer,
        Err(error) => match error.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(Error::invalid(
                "the runtime shut down before the call started: nothing was accepted".to_owned(),
            )),
        },
    }
}

/// Runs `work` (a call's read of what the ledger already holds, with the checks before
/// it) on the process's reading lane: one thread per core, each taking queued reads one
/// after another without sleeping between them, so that 64 tasks' replays neither start
/// 64 blocking threads nor pay a thread's wake-up each. A read that waits on more than
/// the disk (a role resolver on the network, a PostgreSQL store) would hold the queue
/// behind it: while the oldest read has waited longer than [`LANE_PATIENCE`] with no
/// thread free, the lane's watcher starts one more thread, which ends once idle. Off a
/// runtime thread, as [`blocking`] is; a panic goes on as the panic it was.
async fn reading<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let Some(lane) = Lane::get() else {
        // No lane thread could be started: the blocking pool reads it.
        return blocking(work).await;
    };
    let (answer, answered) = tokio::sync::oneshot::channel();
    lane.queue(Box::new(move || {
        let _ = answer.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)));
    }));
    match answered.await {
        Ok(Ok(answer)) => answer,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => {
            Err(Error::invalid("the reading lane dropped a read: nothing was accepted".to_owned()))
        }
    }
}

/// How long the oldest queued read may wait with every lane thread busy before the
/// lane starts another thread.
const LANE_PATIENCE: std::time::Duration = std::time::Duration::from_millis(10);

/// How long a thread the watcher started waits for work before it ends.
const LANE_EXTRA_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

type ReadJob = Box<dyn FnOnce() + Send>;

/// The process's reading lane (see [`reading`]).
struct Lane {
    state: std::sync::Mutex<LaneState>,
    /// Signalled when a read is queued and a thread is idle.
    ready: std::sync::Condvar,
    /// Signalled when a read is queued into an empty queue: for the watcher.
    watched: std::sync::Condvar,
}

struct LaneState {
    queue: std::collections::VecDeque<(std::time::Instant, ReadJob)>,
    /// Threads waiting for a read.
    idle: usize,
}

static LANE: Lane = Lane {
    state: std::sync::Mutex::new(LaneState { queue: std::collections::VecDeque::new(), idle: 0 }),
    ready: std::sync::Condvar::new(),
    watched: std::sync::Condvar::new(),
};

impl Lane {
    /// The lane, its threads (one per core) and its watcher started on first use;
    /// `None` when none could be.
    fn get() -> Option<&'static Lane> {
        static STARTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let started = STARTED.get_or_init(|| {
            let threads = std::thread::available_parallelism().map_or(1, usize::from);
            let spawned = (0..threads).map(|n| {
                std::thread::Builder::new()
                    .name(format!("toolledger-read-{n}"))
                    .spawn(|| LANE.work(None))
            });
            let watcher = std::thread::Builder::new()
                .name("toolledger-read-watch".to_owned())
                .spawn(|| LANE.watch());
            spawned.filter(Result::is_ok).count() > 0 && watcher.is_ok()
        });
        started.then_some(&LANE)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn queue(&self, job: ReadJob) {
        let mut state = self.state();
        let first = state.queue.is_empty();
        state.queue.push_back((std::time::Instant::now(), job));
        let idle = state.idle > 0;
        drop(state);
        if idle {
            self.ready.notify_one();
        }
        if first {
            self.watched.notify_one();
        }
    }

    /// A lane thread: takes queued reads until there are none, then waits; a thread
    /// the watcher started (`extra`) ends after waiting that long.
    fn work(&self, extra: Option<std::time::Duration>) {
        let mut state = self.state();
        loop {
            if let Some((_, job)) = state.queue.pop_front() {
                drop(state);
                job();
                state = self.state();
                continue;
            }
            state.idle += 1;
            let waited = match extra {
                None => (self.ready.wait(state), false),
                Some(idle) => {
                    let (state, waited) = self
                        .ready
                        .wait_timeout(state, idle)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    (Ok(state), waited.timed_out())
                }
            };
            state = waited.0.unwrap_or_else(std::sync::PoisonError::into_inner);
            state.idle -= 1;
            if waited.1 && state.queue.is_empty() {
                return;
            }
        }
    }

    /// The watcher: while reads are queued, looks every [`LANE_PATIENCE`]; when the
    /// oldest has waited that long and no thread is idle, starts one more.
    fn watch(&self) {
        let mut state = self.state();
        loop {
            let stale =
                state.queue.front().is_some_and(|(queued, _)| queued.elapsed() >= LANE_PATIENCE);
            if stale && state.idle == 0 {
                // A thread that cannot be started leaves the reads to the threads there
                // are; the next look tries again.
                let _ = std::thread::Builder::new()
                    .name("toolledger-read-extra".to_owned())
                    .spawn(|| LANE.work(Some(LANE_EXTRA_IDLE)));
            }
            state = if state.queue.is_empty() {
                self.watched.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner)
            } else {
                let waited = self.watched.wait_timeout(state, LANE_PATIENCE);
                waited.unwrap_or_else(std::sync::PoisonError::into_inner).0
            };
        }
    }
}

/// The call paths for tokio hosts. Each is the synchronous method of the same name,
/// run on the runtime's blocking pool: no runtime thread waits on the disk or on a
/// synchronous downstream, and many run at once. Call them on a tokio runtime.
impl<D, R> Ledger<D, R>
where
    D: Downstream + Send + Sync + 'static,
    R: PrincipalResolver + Send + Sync + 'static,
{
    /// [`Ledger::dispatch`], as a future.
    ///
    /// # Errors
    ///
    /// As [`Ledger::dispatch`].
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("dispatch-async");
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let reply = runtime.block_on(ledger.dispatch_async(&call))?;
    /// assert!(matches!(reply.outcome(), toolledger::Outcome::Fresh(_)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn dispatch_async(
        &self,
        call: &Call,
    ) -> impl Future<Output = Result<Reply, Error>> + Send + 'static {
        // The call's span starts here, under the context current where the host calls.
        let named = call.named(crate::traces::Purpose::Dispatch).capturing(self.shared.capture);
        let span = crate::traces::CallSpan::start(&named, self.shared.location.backend());
        let (ledger, call) = (self.clone(), Arc::new(call.clone()));
        async move {
            // A call the ledger already holds is answered by a read alone, on at most one
            // blocking thread per core: 64 tasks' replays in 64 threads spent their time
            // switching and in the allocator's locks.
            let (reader, read, on_lane) = (ledger.clone(), Arc::clone(&call), span.clone());
            let answer = match reading(move || on_lane.run(|| reader.known(&read))).await {
                Ok(crate::Known::Answered(reply)) => Ok(reply),
                // The door's work is not done twice: the dispatch takes the call it let
                // through.
                Ok(crate::Known::New(admitted)) => {
                    let on_pool = span.clone();
                    blocking(move || on_pool.run(|| ledger.dispatch_new(&call, admitted))).await
                }
                Err(error) => Err(error),
            };
            span.end(&answer);
            answer
        }
    }

    /// [`Ledger::enqueue`], as a future.
    ///
    /// # Errors
    ///
    /// As [`Ledger::enqueue`].
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("enqueue-async");
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let reply = runtime.block_on(ledger.enqueue_async(&call))?;
    /// assert!(matches!(reply.outcome(), toolledger::Outcome::Accepted { .. }));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn enqueue_async(
        &self,
        call: &Call,
    ) -> impl Future<Output = Result<Reply, Error>> + Send + 'static {
        let (ledger, call, parent) = (self.clone(), call.clone(), Parent::current());
        blocking(move || parent.run(|| ledger.enqueue(&call)))
    }

    /// [`Ledger::process`], as a future.
    ///
    /// # Errors
    ///
    /// As [`Ledger::process`].
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("process-async");
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let status_ref = ledger.enqueue(&call)?.status_ref().unwrap().clone();
    /// assert!(runtime.block_on(ledger.process_async(&status_ref, &call))?.outcome().is_done());
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn process_async(
        &self,
        status_ref: &StatusRef,
        call: &Call,
    ) -> impl Future<Output = Result<Reply, Error>> + Send + 'static {
        let (ledger, status_ref, call) = (self.clone(), status_ref.clone(), call.clone());
        let parent = Parent::current();
        blocking(move || parent.run(|| ledger.process(&status_ref, &call)))
    }

    /// [`Ledger::status`], as a future.
    ///
    /// # Errors
    ///
    /// As [`Ledger::status`].
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("status-async");
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let status_ref = ledger.dispatch(&call)?.status_ref().unwrap().clone();
    /// let reply = runtime.block_on(ledger.status_async(&call, &status_ref))?;
    /// assert!(matches!(reply.outcome(), toolledger::Outcome::Replayed(_)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn status_async(
        &self,
        call: &Call,
        status_ref: &StatusRef,
    ) -> impl Future<Output = Result<Reply, Error>> + Send + 'static {
        let (ledger, call, status_ref) = (self.clone(), call.clone(), status_ref.clone());
        let parent = Parent::current();
        blocking(move || parent.run(|| ledger.status(&call, &status_ref)))
    }

    /// [`Ledger::status_of`], as a future.
    ///
    /// # Errors
    ///
    /// As [`Ledger::status_of`].
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("status-of-async");
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let status_ref = ledger.dispatch(&call)?.status_ref().unwrap().clone();
    /// let query = toolledger::StatusQuery::new("tenant-a", "user-1")
    ///     .model_call(toolledger::ModelCall::new("openai", "responses", "openai-responses-2026-05", "resp-2", "call-2"))
    ///     .context(serde_json::json!({"orders": [{"order_id": "ord-1", "tenant_id": "tenant-a",
    ///         "owner_subject_id": "user-1", "status": "paid", "amount_minor": 2599, "currency": "USD"}]}));
    /// let reply = runtime.block_on(ledger.status_of_async(&query, &status_ref))?;
    /// assert!(matches!(reply.outcome(), toolledger::Outcome::Replayed(_)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn status_of_async(
        &self,
        query: &StatusQuery,
        status_ref: &StatusRef,
    ) -> impl Future<Output = Result<Reply, Error>> + Send + 'static {
        let (ledger, query, status_ref) = (self.clone(), query.clone(), status_ref.clone());
        let parent = Parent::current();
        blocking(move || parent.run(|| ledger.status_of(&query, &status_ref)))
    }

    /// [`Ledger::resolve`], as a future.
    ///
    /// # Errors
    ///
    /// As [`Ledger::resolve`].
    ///
    /// ```
    /// # let (ledger, call, dir) = toolledger::doc_fixture("resolve-async");
    /// use toolledger::{Evidence, Resolution, Resolved};
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let status_ref = ledger.enqueue(&call)?.status_ref().unwrap().clone();
    /// let settled = runtime.block_on(ledger.resolve_async(&status_ref, &Evidence::NotHappened, "no such refund", None))?;
    /// assert_eq!(settled, Resolution::Store(Resolved::Resolved(toolledger::OperationStatus::Failed)));
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # Ok::<(), toolledger::Error>(())
    /// ```
    pub fn resolve_async(
        &self,
        status_ref: &StatusRef,
        evidence: &Evidence,
        reason: &str,
        now: Option<i64>,
    ) -> impl Future<Output = Result<Resolution, Error>> + Send + 'static {
        let (ledger, status_ref, evidence) = (self.clone(), status_ref.clone(), evidence.clone());
        let (reason, parent) = (reason.to_owned(), Parent::current());
        blocking(move || parent.run(|| ledger.resolve(&status_ref, &evidence, &reason, now)))
    }
}
