//! A throwaway PostgreSQL server for tests and benches.
//!
//! [`Cluster::start`] runs `initdb` into a fresh temp dir and starts `postgres` on a free
//! loopback port. The server is not a child of this process: a small `sh` supervisor
//! starts it and then blocks reading a pipe whose write end only this process holds. When
//! that pipe closes — the [`Cluster`] is dropped, or the process exits or is SIGKILLed —
//! the supervisor stops the server (fast shutdown) and removes the temp dir. So a cluster
//! kept in a static ([`Cluster::shared`]) leaves nothing behind either.
//!
//! `initdb` and `postgres` refuse to run as root; when the effective uid is 0, the
//! supervisor (and so the server) runs as the system user `postgres`, and the temp dir is
//! chowned to it.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{DirBuilderExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls};

/// Environment variable naming an existing server to use instead of a private cluster.
pub const URL_ENV: &str = "TOOLLEDGER_PG_URL";
/// Environment variable naming the directory holding `initdb` and `postgres`.
pub const BINDIR_ENV: &str = "TOOLLEDGER_PG_BINDIR";
const DEFAULT_BINDIR: &str = "/usr/lib/postgresql/15/bin";
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);
const LOG_TAIL: usize = 2048;

/// The supervisor: `$1` temp dir, `$2` bindir, `$3` port, `$4` unix socket dir (may be
/// empty). Prints `initdb-failed` and the log tail, or `started PID`; then waits for EOF
/// on stdin, stops the server and removes the temp dir. It ignores HUP, INT and TERM: a
/// signal sent to everything must not kill it before the pipe's EOF lets it clean up.
const SUPERVISOR: &str = include_str!("supervisor.sh");

/// Why a cluster could not be started or used.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClusterError {
    /// No `initdb`/`postgres` in the directory found (`TOOLLEDGER_PG_BINDIR`,
    /// `pg_config --bindir`, or the Debian default).
    BinariesMissing(PathBuf),
    /// Running as root, but there is no `postgres` user in `/etc/passwd` to run the server as.
    NoServerUser,
    /// `initdb` failed; the tail of its output.
    InitdbFailed(String),
    /// The server exited before accepting connections; the tail of its log.
    ServerExited(String),
    /// The server did not accept connections in time; the tail of its log.
    StartTimeout(String),
    /// An I/O error (temp dir, supervisor process).
    Io(std::io::Error),
    /// An error from the server (connect, `CREATE DATABASE`).
    Sql(postgres::Error),
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BinariesMissing(dir) => write!(f, "no initdb/postgres in {}", dir.display()),
            Self::NoServerUser => f.write_str("running as root but no postgres user"),
            Self::InitdbFailed(tail) => write!(f, "initdb failed:\n{tail}"),
            Self::ServerExited(tail) => write!(f, "postgres exited at start; log tail:\n{tail}"),
            Self::StartTimeout(tail) => write!(f, "postgres start timed out; log tail:\n{tail}"),
            Self::Io(e) => write!(f, "cluster i/o error: {e}"),
            Self::Sql(e) => write!(f, "cluster sql error: {e}"),
        }
    }
}

impl std::error::Error for ClusterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            Self::Sql(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ClusterError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<postgres::Error> for ClusterError {
    fn from(e: postgres::Error) -> Self {
        Self::Sql(e)
    }
}

/// A PostgreSQL server to run tests against: a private one started by [`Cluster::start`],
/// or the external one named by `TOOLLEDGER_PG_URL` (see [`Cluster::shared`]).
#[derive(Debug)]
pub struct Cluster {
    url: String,
    server: Option<Server>,
}

/// A running private server; dropping it closes the supervisor's pipe and waits for it.
#[derive(Debug)]
struct Server {
    dir: PathBuf,
    port: u16,
    pid: String,
    stdin: Option<ChildStdin>,
    supervisor: Child,
}

impl Cluster {
    /// Starts a private cluster in a fresh temp dir on a free loopback port and waits
    /// (at most 30 s) until it accepts connections.
    pub fn start() -> Result<Cluster, ClusterError> {
        let bindir = bindir()?;
        let owner = if effective_uid()? == 0 { Some(postgres_user()?) } else { None };
        let dir = std::env::temp_dir().join(format!("tl-pg-{}", unique_suffix()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let mut server = Server::spawn(dir.clone(), &bindir, owner).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        // From here on dropping `server` cleans up. The supervisor's first line is
        // `started PID`, or `initdb-failed` followed by initdb's output.
        if let Some(stdout) = server.supervisor.stdout.take() {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let Some(pid) = line.trim().strip_prefix("started ") else {
                let mut tail = String::new();
                reader.read_to_string(&mut tail)?;
                return Err(ClusterError::InitdbFailed(tail));
            };
            server.pid = pid.to_owned();
        }
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", server.port);
        let deadline = Instant::now() + START_TIMEOUT;
        let mut config: postgres::Config = url.parse()?;
        config.connect_timeout(Duration::from_secs(2));
        loop {
            if config.connect(NoTls).is_ok() {
                return Ok(Cluster { url, server: Some(server) });
            }
            let log = server.dir.join("server.log");
            if !process_alive(&server.pid) {
                return Err(ClusterError::ServerExited(file_tail(&log)));
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::StartTimeout(file_tail(&log)));
            }
            sleep(POLL);
        }
    }

    /// The server a test should use: the one named by `TOOLLEDGER_PG_URL` when that is set
    /// (no cluster is started), else one private cluster per process, started on first use.
    pub fn shared() -> Result<&'static Cluster, ClusterError> {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        static INIT: Mutex<()> = Mutex::new(());
        if let Some(cluster) = SHARED.get() {
            return Ok(cluster);
        }
        let _guard = INIT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cluster) = SHARED.get() {
            return Ok(cluster);
        }
        let cluster = match std::env::var(URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Cluster { url, server: None },
            _ => Cluster::start()?,
        };
        Ok(SHARED.get_or_init(|| cluster))
    }

    /// Creates a new, empty database named `PREFIX_PID_COUNTER_NANOS` (the prefix reduced
    /// to `[a-z0-9_]`) and returns its URL.
    pub fn fresh_database(&self, prefix: &str) -> Result<String, ClusterError> {
        let clean: String = prefix
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
            .take(30)
            .collect();
        let name = format!("{clean}_{}", unique_suffix().replace('-', "_"));
        let mut client = Client::connect(&self.url, NoTls)?;
        client.batch_execute(&format!("CREATE DATABASE \"{name}\""))?;
        Ok(with_dbname(&self.url, &name))
    }

    /// URL of the maintenance database `postgres` (for an external server, `TOOLLEDGER_PG_URL`
    /// as given).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The loopback TCP port of a private cluster; `None` for an external server.
    pub fn port(&self) -> Option<u16> {
        self.server.as_ref().map(|s| s.port)
    }

    /// The temp dir of a private cluster (removed when it stops); `None` for an external server.
    pub fn dir(&self) -> Option<&Path> {
        self.server.as_ref().map(|s| s.dir.as_path())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        while let Ok(None) = self.supervisor.try_wait() {
            if Instant::now() >= deadline {
                let _ = self.supervisor.kill();
                let _ = self.supervisor.wait();
                let _ = Command::new("kill").args(["-KILL", &self.pid]).status();
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            sleep(Duration::from_millis(10));
        }
    }
}

impl Server {
    /// Picks a free port and spawns the supervisor (as `owner`, after chowning `dir` to it).
    fn spawn(dir: PathBuf, bin: &Path, owner: Option<(u32, u32)>) -> Result<Server, ClusterError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        // A unix socket path is limited to ~107 bytes; without one the server still listens on TCP.
        let sockdir = if dir.as_os_str().len() < 80 { dir.as_os_str() } else { "".as_ref() };
        let mut cmd = Command::new("sh");
        let script = [SUPERVISOR.as_ref(), "sh".as_ref(), dir.as_os_str(), bin.as_os_str()];
        cmd.arg("-c").args(script).arg(port.to_string()).arg(sockdir);
        cmd.current_dir(&dir).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        // Its own process group: a terminal's Ctrl-C reaches the tests, not the supervisor,
        // which then cleans up on the pipe's EOF.
        cmd.process_group(0);
        if let Some((uid, gid)) = owner {
            chown(&dir, Some(uid), Some(gid))?;
            cmd.uid(uid).gid(gid);
        }
        let mut supervisor = cmd.spawn()?;
        let stdin = supervisor.stdin.take();
        Ok(Server { dir, port, pid: String::new(), stdin, supervisor })
    }
}

/// `TOOLLEDGER_PG_BINDIR`, else `pg_config --bindir`, else the Debian PostgreSQL 15 path;
/// the first that holds `initdb` and `postgres`.
fn bindir() -> Result<PathBuf, ClusterError> {
    let has_binaries = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(dir) = std::env::var_os(BINDIR_ENV) {
        let dir = PathBuf::from(dir);
        return if has_binaries(&dir) { Ok(dir) } else { Err(ClusterError::BinariesMissing(dir)) };
    }
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let fallback = PathBuf::from(DEFAULT_BINDIR);
    from_pg_config
        .into_iter()
        .chain([fallback.clone()])
        .find(|d| has_binaries(d))
        .ok_or(ClusterError::BinariesMissing(fallback))
}

/// The effective uid, from the `Uid:` line of `/proc/self/status` (real, effective, saved, fs).
fn effective_uid() -> Result<u32, ClusterError> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
        .ok_or_else(|| std::io::Error::other("no Uid line in /proc/self/status").into())
}

/// The uid and gid of user `postgres`, from `/etc/passwd`.
fn postgres_user() -> Result<(u32, u32), ClusterError> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            if fields.next()? != "postgres" {
                return None;
            }
            let uid = fields.nth(1)?.parse().ok()?;
            let gid = fields.next()?.parse().ok()?;
            Some((uid, gid))
        })
        .ok_or(ClusterError::NoServerUser)
}

/// Whether process `pid` still runs (exists and is not a zombie).
fn process_alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("State:"))
            .is_some_and(|s| !s.trim_start().starts_with('Z'))
    })
}

/// The last ~2 KB of a log file, or a note why it could not be read.
fn file_tail(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(LOG_TAIL);
            String::from_utf8_lossy(bytes.get(start..).unwrap_or_default()).into_owned()
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// `PID-COUNTER-NANOS`, unique within the machine for the life of a process.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{}-{n}-{nanos}", std::process::id())
}

/// `url` with its database replaced by `name`: the path of a `postgres://` URL, or a
/// `dbname=` appended to a key/value connection string (the last one wins).
fn with_dbname(url: &str, name: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return format!("{url} dbname={name}");
    };
    let authority = rest.get(..rest.find(['/', '?']).unwrap_or(rest.len())).unwrap_or(rest);
    let query = rest.find('?').and_then(|i| rest.get(i..)).unwrap_or_default();
    format!("{scheme}://{authority}/{name}{query}")
}

#[cfg(test)]
mod tests {
    use super::with_dbname;

    #[test]
    fn dbname_is_replaced() {
        assert_eq!(
            with_dbname("postgres://u@h:1/db?sslmode=disable", "x"),
            "postgres://u@h:1/x?sslmode=disable"
        );
        assert_eq!(with_dbname("postgresql://u@h", "x"), "postgresql://u@h/x");
        assert_eq!(with_dbname("postgres://h?x=1", "y"), "postgres://h/y?x=1");
        assert_eq!(with_dbname("host=h user=u dbname=d", "x"), "host=h user=u dbname=d dbname=x");
    }
}
