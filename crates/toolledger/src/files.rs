//! Reading a file a user names (a configuration, a tool definition, a case or claims
//! file, a token file): bounded, and only a regular file.
//!
//! A file is opened without blocking (a FIFO would otherwise wait for a writer, for
//! ever), checked to be a regular file on the open descriptor (a device, a directory or
//! a FIFO is refused before a byte is read), and read at most one byte past the limit,
//! so a 2 GB file or `/dev/zero` costs no more memory than a file just over the limit.

use std::{
    fs::OpenOptions,
    io::{ErrorKind, Read},
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

/// Why a file could not be read. The reason is safe to print; the path and the OS's
/// text are not in it.
///
/// ```
/// assert_eq!(toolledger::Unreadable::NotRegular.reason(), "is not a regular file");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// No such file.
    NotFound,
    /// Permission denied.
    PermissionDenied,
    /// A directory, a device, a FIFO, a socket.
    NotRegular,
    /// Longer than the limit, in bytes.
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// Any other failure.
    Failed,
}

impl Unreadable {
    /// The reason, for a message such as `the case file is not a regular file`.
    ///
    /// ```
    /// let why = toolledger::Unreadable::TooLarge { limit: 4096 };
    /// assert_eq!(why.reason(), "is larger than the 4096-byte limit");
    /// ```
    #[must_use]
    pub fn reason(self) -> String {
        match self {
            Unreadable::NotFound => "was not found".to_owned(),
            Unreadable::PermissionDenied => "could not be read: permission denied".to_owned(),
            Unreadable::NotRegular => "is not a regular file".to_owned(),
            Unreadable::TooLarge { limit } => format!("is larger than the {limit}-byte limit"),
            Unreadable::Failed => "could not be read".to_owned(),
        }
    }
}

/// The whole file at `path`, if it is a regular file of at most `limit` bytes.
///
/// # Errors
///
/// [`Unreadable`], saying why, never with the OS's text.
///
/// ```
/// assert_eq!(toolledger::read_bounded(std::path::Path::new("/dev/null"), 10),
///     Err(toolledger::Unreadable::NotRegular));
/// ```
pub fn read_bounded(path: &Path, limit: usize) -> Result<Vec<u8>, Unreadable> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|err| match err.kind() {
            ErrorKind::NotFound => Unreadable::NotFound,
            ErrorKind::PermissionDenied => Unreadable::PermissionDenied,
            // Opening a directory for reading succeeds on Linux; other systems say so here.
            ErrorKind::IsADirectory => Unreadable::NotRegular,
            _ => Unreadable::Failed,
        })?;
    if !file.metadata().map_err(|_| Unreadable::Failed)?.is_file() {
        return Err(Unreadable::NotRegular);
    }
    let mut bytes = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    Read::take(&file, cap).read_to_end(&mut bytes).map_err(|_| Unreadable::Failed)?;
    if bytes.len() > limit {
        return Err(Unreadable::TooLarge { limit });
    }
    Ok(bytes)
}
