//! Ledger calls awaited on an asyncio event loop (`adispatch` and the other `a…`
//! methods). Each is worked on a thread of the package's own [`Pool`], which takes the
//! GIL only to run the host's Python code (a downstream, a role resolver), never to
//! hand its answer back: a finished call waits in its loop's [`Completions`] and wakes
//! the loop through a socket the loop watches (`loop.add_reader`), and the loop's own
//! thread turns each into its reply. So the loop thread competes for the GIL with the
//! host's own code alone, not with the package's bookkeeping of 64 calls in flight.

use std::{
    collections::VecDeque,
    io::{Read, Write},
    os::{fd::AsRawFd, unix::net::UnixStream},
    panic::AssertUnwindSafe,
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use pyo3::{exceptions::PyRuntimeError, panic::PanicException, prelude::*};
use toolledger::{Resolution, StatusRef};

use crate::{
    errors::{blocked, invalid, raise_caused, take_cause},
    reply,
};

/// How a call worked on the pool ended, before it is a Python value.
pub(crate) enum Finished {
    /// A reply (`dispatch`, `enqueue`, `process`, `status`).
    Reply(toolledger::Reply),
    /// How `resolve` settled the operation.
    Resolved(StatusRef, Resolution),
    /// A facade error, with the host's exception behind it (a role resolver's).
    Failed(toolledger::Error, Option<PyErr>),
    /// The work panicked (a fault of the package's, never the host's: a host's
    /// exceptions are answers). What it said.
    Panicked(String),
}

impl Finished {
    /// What a facade call answered, with the cause this thread kept for its error.
    pub(crate) fn of<T>(
        answer: Result<T, toolledger::Error>,
        ok: impl FnOnce(T) -> Finished,
    ) -> Finished {
        match answer {
            Ok(value) => ok(value),
            Err(error) => Finished::Failed(error, take_cause()),
        }
    }

    /// The Python value it answers: the reply (or `resolve`'s status), or the exception
    /// it raises.
    pub(crate) fn answer(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self {
            Finished::Reply(answer) => Ok(Py::new(py, reply::Reply::new(py, answer)?)?.into_any()),
            Finished::Resolved(status_ref, resolution) => {
                // One rendering for every door: the facade's package, raised when it
                // refuses.
                let package = toolledger::resolve_package(&status_ref, &resolution);
                let text = |member: &str| package[member].as_str().unwrap_or_default().to_owned();
                if package["gate"] == "PASS" {
                    Ok(text("status").into_pyobject(py)?.into_any().unbind())
                } else {
                    Err(blocked(&text("code"), &text("message")))
                }
            }
            Finished::Failed(error, cause) => Err(raise_caused(&error, cause)),
            Finished::Panicked(said) => Err(PanicException::new_err(said)),
        }
    }
}

/// Where one event loop's calls arrive when they finish: a queue, and a socket pair
/// whose reading end the loop watches. A call that finishes into an empty queue writes
/// one byte; the loop's reader reads every byte, then takes the whole queue.
#[pyclass(frozen, name = "_Completions", module = "toolledger")]
pub(crate) struct Completions {
    inbox: Arc<Inbox>,
}

/// Held by the completions and by every call in flight: both ends of the socket live
/// as long as a call may still write to it (a write to a closed one could raise
/// `SIGPIPE` in a host that does not ignore it).
struct Inbox {
    done: Mutex<Vec<(u64, Finished)>>,
    reader: UnixStream,
    waker: UnixStream,
}

impl Inbox {
    fn put(&self, id: u64, finished: Finished) {
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        let first = done.is_empty();
        done.push((id, finished));
        drop(done);
        if first {
            // A full socket already holds a byte the reader has not read: nothing lost.
            let _ = (&self.waker).write(&[1]);
        }
    }
}

#[pymethods]
impl Completions {
    #[new]
    fn new() -> PyResult<Completions> {
        let opened = || {
            let (reader, waker) = UnixStream::pair()?;
            reader.set_nonblocking(true)?;
            waker.set_nonblocking(true)?;
            Ok::<_, std::io::Error>((reader, waker))
        };
        let (reader, waker) = opened().map_err(|_| {
            PyRuntimeError::new_err("no socket pair for the loop's wake-ups (out of descriptors?)")
        })?;
        Ok(Completions { inbox: Arc::new(Inbox { done: Mutex::default(), reader, waker }) })
    }

    /// The descriptor the loop watches.
    fn fileno(&self) -> i32 {
        self.inbox.reader.as_raw_fd()
    }

    /// Every call finished since the last drain: `(id, value, ok)`, where `value` is the
    /// reply (or `resolve`'s status) when `ok`, else the exception to raise.
    fn drain(&self, py: Python<'_>) -> Vec<(u64, Py<PyAny>, bool)> {
        let mut bytes = [0_u8; 256];
        while matches!((&self.inbox.reader).read(&mut bytes), Ok(read) if read > 0) {}
        let done =
            std::mem::take(&mut *self.inbox.done.lock().unwrap_or_else(PoisonError::into_inner));
        done.into_iter()
            .map(|(id, finished)| match finished.answer(py) {
                Ok(value) => (id, value, true),
                Err(raised) => (id, raised.into_value(py).into_any(), false),
            })
            .collect()
    }
}

impl Completions {
    /// Works `work` on the pool (at most `size` threads at once) in the host's
    /// `context`, and puts what it answers under `id`.
    pub(crate) fn start(
        &self,
        id: u64,
        context: Py<PyAny>,
        size: usize,
        work: impl FnOnce() -> Finished + Send + 'static,
    ) -> PyResult<()> {
        let inbox = Arc::clone(&self.inbox);
        let job = Box::new(move || {
            let finished = crate::downstream::in_context(context, || {
                std::panic::catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|panic| {
                    let said = panic
                        .downcast_ref::<&str>()
                        .map(|said| (*said).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "the call panicked".to_owned());
                    Finished::Panicked(said)
                })
            });
            inbox.put(id, finished);
        });
        Pool::current().submit(job, size.max(1)).map_err(|_| {
            invalid("no thread could be started for the call: nothing was accepted".to_owned())
        })
    }
}

/// The package's threads for awaited calls, shared by every ledger of the process: a
/// thread is started when a call finds none idle (up to the size asked, not counting
/// threads parked while an `async def` tool awaits on its loop), and ends after [`IDLE`]
/// without work.
#[derive(Default)]
struct Pool {
    state: Mutex<PoolState>,
    ready: Condvar,
}

#[derive(Default)]
struct PoolState {
    queue: VecDeque<Job>,
    /// Threads waiting for work, not yet woken for any.
    idle: usize,
    /// Wake-ups sent and not yet taken by a waiting thread (counted as working).
    wakes: usize,
    threads: usize,
    /// Threads waiting for an `async def` tool's coroutine on its loop ([`_park`]): they
    /// hold no share of the pool's size meanwhile.
    parked: usize,
    /// The size last asked.
    size: usize,
}

impl PoolState {
    /// Threads working a call now, and not parked.
    fn working(&self) -> usize {
        self.threads - self.idle - self.parked
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The pool of this process, with the process's id: a child made by `fork` has none of
/// its parent's threads (and maybe a lock one of them held), so it makes its own.
static POOL: Mutex<Option<(u32, &'static Pool)>> = Mutex::new(None);

impl Pool {
    /// This process's pool, made on first use (one small leak per forked child).
    fn current() -> &'static Pool {
        let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
        let me = std::process::id();
        match *pool {
            Some((pid, current)) if pid == me => current,
            _ => {
                let current: &'static Pool = Box::leak(Box::default());
                *pool = Some((me, current));
                current
            }
        }
    }

    fn state(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job`: an idle thread takes it, or a new one, while fewer than `size`
    /// work. `Err` when no thread runs and none could be started (the job is dropped).
    fn submit(&'static self, job: Job, size: usize) -> Result<(), ()> {
        let mut state = self.state();
        state.size = size;
        state.queue.push_back(job);
        if self.more(&mut state) {
            return Ok(());
        }
        state.queue.pop_back();
        Err(())
    }

    /// Puts one more thread on the queue's work when fewer than the size work: an idle
    /// one woken, or a new one. `false` when work waits with no thread alive and none
    /// could be started.
    fn more(&'static self, state: &mut PoolState) -> bool {
        if state.queue.is_empty() || state.working() >= state.size {
            return true;
        }
        if state.idle > 0 {
            state.idle -= 1;
            state.wakes += 1;
            self.ready.notify_one();
            return true;
        }
        state.threads += 1;
        let started = std::thread::Builder::new().name("toolledger".to_owned()).spawn(|| {
            ON_POOL.set(true);
            self.work();
        });
        if started.is_err() {
            state.threads -= 1;
            return state.threads > 0;
        }
        true
    }

    fn work(&self) {
        let mut state = self.state();
        loop {
            // Past the size (it was lowered, or a parked thread came back): wait.
            if state.working() <= state.size {
                if let Some(job) = state.queue.pop_front() {
                    drop(state);
                    job();
                    state = self.state();
                    continue;
                }
            }
            state.idle += 1;
            let (woken, waited) =
                self.ready.wait_timeout(state, IDLE).unwrap_or_else(PoisonError::into_inner);
            state = woken;
            if state.wakes > 0 {
                // Woken for work (or woken as the wake-up was sent): counted working.
                state.wakes -= 1;
            } else {
                state.idle -= 1;
                if waited.timed_out() {
                    state.threads -= 1;
                    return;
                }
            }
        }
    }
}

thread_local! {
    /// Whether this thread is one of the pool's.
    static ON_POOL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the pool thread calling it as parked while an `async def` tool's coroutine
/// runs on its loop (`true`), or back at work (`false`): while parked it holds no share
/// of the pool's size, so other awaited calls start meanwhile. A no-op on any other
/// thread.
#[pyfunction]
pub(crate) fn _park(parked: bool) {
    if !ON_POOL.get() {
        return;
    }
    let pool = Pool::current();
    let mut state = pool.state();
    if parked {
        state.parked += 1;
        // Queued work may start on the share this thread let go.
        let _ = pool.more(&mut state);
    } else {
        state.parked = state.parked.saturating_sub(1);
    }
}

/// How long a thread of the pool waits for work before it ends.
const IDLE: Duration = Duration::from_secs(10);
