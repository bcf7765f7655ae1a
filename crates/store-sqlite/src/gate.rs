//! One writer gate per database file, per process, and group commit behind it.
//!
//! SQLite allows one writer at a time. Connections of one process that contend for the
//! write lock otherwise meet `SQLITE_BUSY` and sleep in SQLite's busy handler, whose
//! back-off leaves the file idle while they sleep (8 threads saw waits of up to a
//! second). Every write of this process passes this gate instead, in arrival order.
//!
//! A write arrives either as a **job** (a commit point: a closure over a connection, run
//! inside a transaction by whichever thread holds the gate) or **solo** (an operator's
//! write that needs the gate and its own connection for a whole transaction). The thread
//! that finds the gate open holds it; writers arriving meanwhile queue. A holder with a
//! job is the *combiner* (flat combining): once its `BEGIN IMMEDIATE` has the write lock
//! it takes the jobs queued behind it, up to [`MAX_BATCH`] in all and never past a solo
//! writer, runs each in its own savepoint, commits once, and only then answers each
//! caller. Nobody waits for company: a lone caller's batch is itself, committed at once.
//! A batch whose combiner's job is lazy (a success's commit C) holds only lazy jobs and
//! commits without a sync; the first job that needs one waits for the next batch.
//! Releasing hands the gate to the next queued writer (a job's thread becomes the next
//! combiner). Writers in other processes still rely on `busy_timeout`.
//!
//! The group commits' connection does not checkpoint inside the gate. SQLite's own
//! automatic checkpoint did the whole copy inside the commit that left the log at
//! [`CHECKPOINT_PAGES`], gate held, and every caller queued behind that batch waited
//! for it (the tail of eight contending threads was 2.2 times their mean latency; 1.5
//! without any checkpoint). Now a combiner with nobody queued behind it copies the log
//! itself once it has left the gate (on its store's own connection, before it
//! answers: a lone writer pays what SQLite's checkpoint cost it, and eight processes
//! writing one file each alone keep their pace). When writers are queued, the file's
//! **checkpointer** thread copies the log while they go on. Once the log has passed
//! [`RESTART_PAGES`] without starting over (a copier is woken for it either way), the
//! checkpointer holds the gate to copy what was written meanwhile and to let readers
//! on the log's last frames finish, so the next write starts the log over: writers and
//! readers that never pause otherwise keep it from ever starting over.

use std::{
    any::Any,
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, OnceLock, PoisonError, Weak,
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender},
    },
    time::Duration,
};

use rusqlite::Connection;

use crate::StoreError;

/// The most commit points one group commit holds: bounds the combiner's own latency and
/// the work one failed commit takes back.
pub(crate) const MAX_BATCH: usize = 64;

/// The log's size, in pages, at which a commit wakes the checkpointer: SQLite's own
/// automatic checkpoint threshold.
pub(crate) const CHECKPOINT_PAGES: i32 = 1000;

/// The log's size, in pages, from which the checkpointer takes the gate to copy the
/// rest: twice the threshold, so the log has passed it once already without starting
/// over on its own (see [`checkpoints`]).
const RESTART_PAGES: i64 = 2 * CHECKPOINT_PAGES as i64;

/// How long the checkpointer waits for the gate to copy the rest of the log; when it
/// does not get it, the next commit's wake-up tries again.
const CHECKPOINT_WAIT: Duration = Duration::from_secs(1);

/// How long the checkpointer, holding the gate, waits for readers on the log's last
/// frames once it has copied the whole log: a dispatch's reads last microseconds, and
/// a reader that starts meanwhile reads the database, not the log.
const RESTART_WAIT: Duration = Duration::from_millis(20);

/// How many more copies outside the gate precede the one inside it (see [`catch_up`]).
const CATCH_UP_COPIES: usize = 3;

/// How many pages left uncopied the checkpointer takes into the gate without trying to
/// copy them outside first.
const CATCH_UP_PAGES: i64 = 64;

/// How long each wait for those readers sleeps.
const RESTART_STEP: Duration = Duration::from_micros(20);

/// How many times the checkpointer sleeps [`RESTART_STEP`] for those readers.
/// SQLite counts the handler's calls from zero.
const RESTART_STEPS: i32 = (RESTART_WAIT.as_micros() / RESTART_STEP.as_micros()) as i32;

/// What a job answers: its value (downcast by the caller who queued it) or its error.
pub(crate) type Answer = Result<Box<dyn Any + Send>, StoreError>;

/// What a job's run answers: its value and whether what it wrote is kept, or its error.
pub(crate) type Ran = Result<(Box<dyn Any + Send>, bool), StoreError>;

/// One commit point's work, run inside the combiner's transaction.
pub(crate) struct Job {
    /// Whether its commit may reach the disk with a later one
    /// (`toolledger_store::driver::Durability::Lazy`).
    pub(crate) lazy: bool,
    /// The work.
    pub(crate) run: Box<dyn FnOnce(&Connection) -> Ran + Send>,
}

/// What a queued writer is told.
enum Reply {
    /// The job ran and its transaction ended: committed (durable) unless the answer is
    /// an error.
    Answer(Answer),
    /// The gate is this writer's now; a job comes back to be run by its own thread.
    Turn(Option<Job>),
}

/// A writer waiting in the queue.
enum Waiting {
    Job(Job, SyncSender<Reply>),
    Solo(SyncSender<Reply>),
}

/// Who holds the gate and who waits for it, in arrival order.
#[derive(Default)]
struct State {
    held: bool,
    next_ticket: u64,
    queue: VecDeque<(u64, Waiting)>,
}

struct Shared {
    state: Mutex<State>,
    /// The file, as an absolute path when it could be resolved.
    path: PathBuf,
    /// The connection group commits run on, opened by the first combiner. One
    /// connection for all of them keeps its page cache: SQLite drops a connection's cache
    /// whenever another connection has written, so combiners on their own connections
    /// each started cold.
    writer: Mutex<Option<Connection>>,
    /// Transactions committed by combiners, and the jobs they held.
    batches: AtomicU64,
    batched: AtomicU64,
    /// This file's checkpointer thread, started by the first commit that needs it.
    checkpointer: Mutex<Option<Checkpointer>>,
    /// Copies of the log back into the database finished in this process: by a lone
    /// combiner ([`Gate::checkpoint`]) or by the checkpointer.
    checkpoints: AtomicU64,
}

/// A file's checkpointer thread (see [`checkpoints`]).
struct Checkpointer {
    /// The process that started it: a forked child has no such thread and starts its own.
    process: u32,
    wake: SyncSender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Drop for Shared {
    /// The file's last store in this process has closed: a checkpoint it was woken for
    /// finishes before the process goes on (a command about to exit would otherwise
    /// leave the log as long as SQLite's own checkpoint would have made it short).
    fn drop(&mut self) {
        let checkpointer = self.checkpointer.get_mut().unwrap_or_else(PoisonError::into_inner);
        let Some(Checkpointer { process, wake, thread }) = checkpointer.take() else { return };
        drop(wake);
        if process == std::process::id() && thread.thread().id() != std::thread::current().id() {
            let _ = thread.join();
        }
    }
}

/// The gate of one file.
#[derive(Clone)]
pub(crate) struct Gate(Arc<Shared>);

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("waiting", &self.waiting()).finish()
    }
}

/// Holding the gate; dropping it hands it to the next writer, or opens it.
pub(crate) struct Entered<'a>(&'a Shared);

/// The group commits' connection, held by the combiner: opened on first use, dropped
/// (to be opened again) after a failure that may have left it inside a transaction.
pub(crate) struct Writer<'a> {
    /// The file.
    pub(crate) path: &'a Path,
    /// The connection, when open.
    pub(crate) connection: std::sync::MutexGuard<'a, Option<Connection>>,
}

/// A combiner's hold on the gate: the jobs it commits together and where their answers
/// go.
pub(crate) struct Combining<'a> {
    entered: Entered<'a>,
    own: Option<Job>,
    replies: Vec<SyncSender<Reply>>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Gate {
    /// The gate of the file at `path`, shared by every connection of this process to
    /// that file (however the path is spelled).
    pub(crate) fn of(path: &Path) -> Gate {
        static GATES: OnceLock<Mutex<HashMap<PathBuf, Weak<Shared>>>> = OnceLock::new();
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut gates =
            GATES.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(gate) = gates.get(&key).and_then(Weak::upgrade) {
            return Gate(gate);
        }
        gates.retain(|_, gate| gate.strong_count() > 0);
        let gate = Arc::new(Shared {
            state: Mutex::default(),
            // Absolute (when the file exists): the process may change directory later.
            path: key.clone(),
            writer: Mutex::default(),
            batches: AtomicU64::default(),
            batched: AtomicU64::default(),
            checkpointer: Mutex::default(),
            checkpoints: AtomicU64::default(),
        });
        gates.insert(key, Arc::downgrade(&gate));
        Gate(gate)
    }

    /// How many writers wait behind the holder.
    pub(crate) fn waiting(&self) -> usize {
        self.0.state().queue.len()
    }

    /// Group commits so far in this process (on this file): transactions, and the commit
    /// points they held.
    pub(crate) fn batches(&self) -> (u64, u64) {
        (self.0.batches.load(Ordering::Relaxed), self.0.batched.load(Ordering::Relaxed))
    }

    /// Copies of this file's log finished in this process: by lone combiners and by the
    /// checkpointer.
    pub(crate) fn checkpoints(&self) -> u64 {
        self.0.checkpoints.load(Ordering::Relaxed)
    }

    /// A commit left the log at `pages`. From [`CHECKPOINT_PAGES`] on, the log is
    /// copied back: by the combiner itself once it has left the gate (`true`) when no
    /// writer waits, as SQLite's own checkpoint would but without the gate; else by
    /// the file's checkpointer, woken (and started in this process when none runs), so
    /// the writers queued behind go on. Never waits: a checkpointer already awake takes
    /// the log as it finds it.
    pub(crate) fn committed(&self, pages: i32) -> bool {
        if pages < CHECKPOINT_PAGES {
            return false;
        }
        if self.waiting() == 0 {
            return true;
        }
        self.wake_checkpointer();
        false
    }

    /// Wakes the file's checkpointer, starting one in this process when none runs.
    /// Never waits: a checkpointer already awake takes the log as it finds it.
    fn wake_checkpointer(&self) {
        let mut checkpointer = self.0.checkpointer.lock().unwrap_or_else(PoisonError::into_inner);
        let process = std::process::id();
        if let Some(running) = &*checkpointer
            && running.process == process
            && !matches!(running.wake.try_send(()), Err(mpsc::TrySendError::Disconnected(())))
        {
            return;
        }
        let (wake, woken) = mpsc::sync_channel(1);
        let (gate, path) = (Arc::downgrade(&self.0), self.0.path.clone());
        let started = std::thread::Builder::new()
            .name("toolledger-checkpoint".to_owned())
            .spawn(move || checkpoints(&gate, &path, &woken));
        // A thread that cannot be started leaves the log to grow until one can: the next
        // commit past the threshold tries again, and SQLite checkpoints when the last
        // connection closes.
        if let Ok(thread) = started {
            let _ = wake.try_send(());
            *checkpointer = Some(Checkpointer { process, wake, thread });
        }
    }

    /// Copies the log back on `conn` (a store's own connection), as [`Gate::committed`]
    /// asked of a combiner once out of the gate; a copy that fails is left to the next.
    /// A log past [`RESTART_PAGES`] has not started over since its last copies: readers
    /// or writers held it. The checkpointer is woken to start it over.
    pub(crate) fn checkpoint(&self, conn: &Connection) {
        if let Ok((log, _)) = passive_checkpoint(conn) {
            self.0.checkpoints.fetch_add(1, Ordering::Relaxed);
            if log >= RESTART_PAGES {
                self.wake_checkpointer();
            }
        }
    }

    /// Waits for this caller's turn to write alone: at once when the gate is open, else
    /// behind every writer that came before. `None` when the turn has not come within
    /// `timeout`: the caller left the queue and holds nothing.
    pub(crate) fn enter(&self, timeout: Duration) -> Option<Entered<'_>> {
        let shared = &*self.0;
        let mut state = shared.state();
        if !state.held {
            state.held = true;
            return Some(Entered(shared));
        }
        let (reply, answer) = mpsc::sync_channel(1);
        let ticket = queue(&mut state, Waiting::Solo(reply));
        drop(state);
        match wait(shared, ticket, &answer, timeout) {
            Some(Reply::Turn(_)) => Some(Entered(shared)),
            // A solo writer is only ever handed the turn; a closed channel means the
            // holder vanished without handing over.
            Some(Reply::Answer(_)) | None => None,
        }
    }

    /// Runs `job` in a group commit and answers once its transaction has ended. When the
    /// gate is open this thread combines: `commit` runs the batch (see [`Combining`]).
    /// Otherwise the job queues, and either a combiner runs it or the turn comes back to
    /// this thread with it. [`StoreError::Busy`] when nobody took the job within
    /// `timeout`: it left the queue, nothing of it ran.
    pub(crate) fn run(
        &self,
        job: Job,
        timeout: Duration,
        commit: impl FnOnce(&mut Writer<'_>, &mut Combining<'_>) -> Vec<Answer>,
    ) -> Answer {
        let shared = &*self.0;
        let mut state = shared.state();
        let own = if state.held {
            let (reply, answer) = mpsc::sync_channel(1);
            let ticket = queue(&mut state, Waiting::Job(job, reply));
            drop(state);
            match wait(shared, ticket, &answer, timeout) {
                Some(Reply::Answer(answer)) => return answer,
                Some(Reply::Turn(Some(job))) => job,
                Some(Reply::Turn(None)) => {
                    return Err(StoreError::Internal("the writer gate lost a queued write"));
                }
                None => return Err(StoreError::Busy),
            }
        } else {
            state.held = true;
            drop(state);
            job
        };
        let mut combining = Combining { entered: Entered(shared), own: Some(own), replies: vec![] };
        let mut writer = Writer {
            path: &shared.path,
            connection: shared.writer.lock().unwrap_or_else(PoisonError::into_inner),
        };
        let mut answers = commit(&mut writer, &mut combining).into_iter();
        drop(writer);
        let mine = answers
            .next()
            .unwrap_or(Err(StoreError::Internal("the group commit returned no answer")));
        combining.answer(answers);
        mine
    }
}

impl Combining<'_> {
    /// Sends each queued writer of the last batch its answer, in batch order.
    fn answer(&mut self, mut answers: impl Iterator<Item = Answer>) {
        for reply in self.replies.drain(..) {
            let answer = answers
                .next()
                .unwrap_or(Err(StoreError::Internal("the group commit returned no answer")));
            // A waiter is blocked on its channel until it is answered: sending cannot fail
            // while it lives.
            let _ = reply.send(Reply::Answer(answer));
        }
    }

    /// Whether the batch is lazy (its commit need not be synced): so when the combiner's
    /// own job is, and [`Combining::jobs`] then takes only lazy jobs. Known before the
    /// transaction begins, since SQLite changes its sync level only between
    /// transactions.
    pub(crate) fn lazy(&self) -> bool {
        self.own.as_ref().is_some_and(|job| job.lazy)
    }

    /// The batch: the combiner's own job first, then the jobs queued behind it in
    /// arrival order, at most [`MAX_BATCH`] in all, stopping at a solo writer — and, in
    /// a lazy batch, at the first job that must be synced, which waits for the next
    /// batch. Called once the combiner holds the database's write lock, so writers that
    /// arrived while it waited for the lock share its commit. The answers `commit`
    /// returns must follow this order.
    pub(crate) fn jobs(&mut self) -> Vec<Job> {
        let lazy = self.lazy();
        let mut jobs: Vec<Job> = self.own.take().into_iter().collect();
        let mut state = self.entered.0.state();
        while jobs.len() < MAX_BATCH {
            match state.queue.pop_front() {
                Some((_, Waiting::Job(job, reply))) if job.lazy || !lazy => {
                    jobs.push(job);
                    self.replies.push(reply);
                }
                Some(other) => {
                    state.queue.push_front(other);
                    break;
                }
                None => break,
            }
        }
        drop(state);
        self.entered.0.batches.fetch_add(1, Ordering::Relaxed);
        self.entered.0.batched.fetch_add(jobs.len() as u64, Ordering::Relaxed);
        jobs
    }
}

/// A file's checkpointer: each time it is woken, copies the log into the database
/// outside the gate; then, when the log has passed [`RESTART_PAGES`] without starting
/// over, starts it over ([`start_over`]).
/// Ends once the file's last store in this process has closed, after the copy it was
/// woken for (with no store left, no writer of this process can come between the
/// copies, and starting over needs no gate). A copy that fails is left to the next
/// wake-up; the log stays valid either way.
fn checkpoints(gate: &Weak<Shared>, path: &Path, woken: &Receiver<()>) {
    let mut connection: Option<Connection> = None;
    while woken.recv().is_ok() {
        if connection.is_none() {
            connection = crate::schema::open_checkpointer(path).ok();
        }
        let Some(conn) = &connection else { continue };
        let copied = match passive_checkpoint(conn) {
            Ok((log, _)) if log >= RESTART_PAGES => {
                catch_up(conn);
                match gate.upgrade() {
                    Some(shared) => {
                        let gate = Gate(shared);
                        let Some(_entered) = gate.enter(CHECKPOINT_WAIT) else { continue };
                        start_over(conn)
                    }
                    None => start_over(conn),
                }
            }
            copied => copied.map(|_| ()),
        };
        match copied {
            Ok(()) => {
                if let Some(shared) = gate.upgrade() {
                    shared.checkpoints.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Opened again for the next wake-up.
            Err(_) => connection = None,
        }
    }
}

/// Copies again, outside the gate, what the writers wrote during the last copy, up to
/// [`CATCH_UP_COPIES`] times while more than [`CATCH_UP_PAGES`] are left: each copy is
/// shorter than the one before, and what is left is copied with the gate held.
fn catch_up(conn: &Connection) {
    for _ in 0..CATCH_UP_COPIES {
        match passive_checkpoint(conn) {
            Ok((log, copied)) if log - copied > CATCH_UP_PAGES => {}
            _ => return,
        }
    }
}

/// With no writer of this process between (the gate held, or no store left): copies
/// what was written since the copy outside the gate, and when that leaves the whole log
/// copied, waits up to [`RESTART_WAIT`] for readers still on the log's last frames so
/// that the next commit starts it over (`wal_checkpoint(RESTART)`). Both copies stop
/// at the oldest reader's snapshot and never wait for it: with writers that never
/// pause, every copy outside the gate ends behind their last commit, and with readers
/// that never pause one of them always holds the log's last frames, so without this
/// the log would never start over. A long reader leaves the log whole, as it did
/// SQLite's own checkpoint.
fn start_over(conn: &Connection) -> Result<(), rusqlite::Error> {
    let (log, copied) = passive_checkpoint(conn)?;
    if copied < log {
        return Ok(());
    }
    // Only this mode waits (`PASSIVE` never calls the busy handler), and in steps far
    // shorter than SQLite's own handler's first sleep of a millisecond, gate held.
    conn.busy_handler(Some(reader_wait))?;
    conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
}

/// The checkpointer's busy handler while it starts the log over: waits in steps of
/// [`RESTART_STEP`], [`RESTART_WAIT`] in all.
fn reader_wait(retries: i32) -> bool {
    if retries >= RESTART_STEPS {
        return false;
    }
    std::thread::sleep(RESTART_STEP);
    true
}

/// `PRAGMA wal_checkpoint(PASSIVE)`: the log's frames, and how many of them are now
/// copied into the database.
fn passive_checkpoint(conn: &Connection) -> Result<(i64, i64), rusqlite::Error> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| Ok((row.get(1)?, row.get(2)?)))
}

/// Queues a writer; its ticket.
fn queue(state: &mut State, waiting: Waiting) -> u64 {
    state.next_ticket += 1;
    let ticket = state.next_ticket;
    state.queue.push_back((ticket, waiting));
    ticket
}

/// Waits for a queued writer's reply. `None` when `timeout` passed while the writer was
/// still queued (it leaves the queue: nothing of it ran), or when the channel closed.
fn wait(
    shared: &Shared,
    ticket: u64,
    answer: &Receiver<Reply>,
    timeout: Duration,
) -> Option<Reply> {
    match answer.recv_timeout(timeout) {
        Ok(reply) => return Some(reply),
        Err(RecvTimeoutError::Disconnected) => return None,
        Err(RecvTimeoutError::Timeout) => {}
    }
    let mut state = shared.state();
    if let Some(at) = state.queue.iter().position(|(queued, _)| *queued == ticket) {
        state.queue.remove(at);
        return None;
    }
    drop(state);
    // Taken already (by a combiner, or handed the turn): the reply is on its way, and
    // must be waited for — a job taken may be committing.
    answer.recv().ok()
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        match state.queue.pop_front() {
            // Hand the gate straight over; it stays held.
            Some((_, Waiting::Job(job, reply))) => {
                drop(state);
                let _ = reply.send(Reply::Turn(Some(job)));
            }
            Some((_, Waiting::Solo(reply))) => {
                drop(state);
                let _ = reply.send(Reply::Turn(None));
            }
            None => state.held = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        thread,
        time::Duration,
    };

    use super::{Answer, Gate, Job};

    #[test]
    fn writers_hold_the_gate_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.sqlite3");
        let inside = Arc::new(Mutex::new((0usize, 0usize)));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (gate, inside) = (Gate::of(&path), Arc::clone(&inside));
                thread::spawn(move || {
                    for _ in 0..200 {
                        let _entered = gate.enter(Duration::MAX).unwrap();
                        let mut counts = inside.lock().unwrap();
                        counts.0 += 1;
                        counts.1 = counts.1.max(counts.0);
                        drop(counts);
                        thread::yield_now();
                        inside.lock().unwrap().0 -= 1;
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        assert_eq!(*inside.lock().unwrap(), (0, 1), "two writers were inside at once");
    }

    /// A writer whose turn does not come in time leaves the queue holding nothing, and
    /// the gate still passes from the holder to the next writer in line.
    #[test]
    fn a_writer_that_times_out_leaves_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let gate = Gate::of(&dir.path().join("gate.sqlite3"));
        let held = gate.enter(Duration::ZERO).unwrap();
        assert!(gate.enter(Duration::from_millis(20)).is_none());
        assert!(gate.enter(Duration::ZERO).is_none());
        assert_eq!(gate.waiting(), 0);
        let waiter = {
            let gate = gate.clone();
            thread::spawn(move || gate.enter(Duration::from_secs(60)).is_some())
        };
        while gate.waiting() == 0 {
            thread::yield_now();
        }
        drop(held);
        assert!(waiter.join().unwrap());
        assert!(gate.enter(Duration::ZERO).is_some());
    }

    /// A lazy combiner commits only the lazy jobs queued behind it, up to the first that
    /// must be synced; that one leads the next batch, which takes lazy jobs too.
    #[test]
    fn a_lazy_batch_stops_at_the_first_job_that_must_be_synced() {
        let dir = tempfile::tempdir().unwrap();
        let gate = Gate::of(&dir.path().join("gate.sqlite3"));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let held = gate.enter(Duration::ZERO).unwrap();
        let mut threads = Vec::new();
        for (name, lazy) in [("lazy-1", true), ("synced", false), ("lazy-2", true)] {
            let waiting = gate.waiting();
            let (queued, batches) = (gate.clone(), Arc::clone(&batches));
            threads.push(thread::spawn(move || {
                let job = Job {
                    lazy,
                    run: Box::new(move |_| {
                        Ok((Box::new(name) as Box<dyn std::any::Any + Send>, true))
                    }),
                };
                queued
                    .run(job, Duration::from_secs(60), |_, combining| {
                        let lazy = combining.lazy();
                        let conn = rusqlite::Connection::open_in_memory().unwrap();
                        let answers: Vec<Answer> = combining
                            .jobs()
                            .into_iter()
                            .map(|job| (job.run)(&conn).map(|(value, _)| value))
                            .collect();
                        let names: Vec<&str> = answers
                            .iter()
                            .map(|answer| *answer.as_ref().unwrap().downcast_ref::<&str>().unwrap())
                            .collect();
                        batches.lock().unwrap().push((lazy, names));
                        answers
                    })
                    .unwrap();
            }));
            while gate.waiting() == waiting {
                thread::yield_now();
            }
        }
        drop(held);
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(
            *batches.lock().unwrap(),
            [(true, vec!["lazy-1"]), (false, vec!["synced", "lazy-2"])]
        );
    }
}
