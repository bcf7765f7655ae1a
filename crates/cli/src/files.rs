//! Reading the case and claims files: bounded, and only regular files.
//!
//! A file is opened without blocking (a FIFO would otherwise wait for a writer), checked
//! to be a regular file on the open descriptor (a device, a directory or a FIFO is
//! refused before a byte is read), and read at most one byte past the limit, so a
//! 2 GB file or `/dev/zero` costs no more memory than a file just over the limit.

use std::{
    fs::{File, OpenOptions},
    io::{ErrorKind, Read},
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

/// Why a file could not be read. The reason class is safe to print; the path and the
/// OS's text are not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreadable {
    NotFound,
    PermissionDenied,
    NotRegular,
    TooLarge,
    Failed,
}

impl Unreadable {
    /// The reason, for a message such as `the case file is not a regular file`.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Unreadable::NotFound => "was not found",
            Unreadable::PermissionDenied => "could not be read: permission denied",
            Unreadable::NotRegular => "is not a regular file",
            Unreadable::TooLarge => "is larger than the 65536-byte limit",
            Unreadable::Failed => "could not be read",
        }
    }
}

/// The whole file at `path`, if it is a regular file of at most `limit` bytes.
pub(crate) fn read_bounded(path: &Path, limit: usize) -> Result<Vec<u8>, Unreadable> {
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
    let is_file = file.metadata().map_err(|_| Unreadable::Failed)?.is_file();
    if !is_file {
        return Err(Unreadable::NotRegular);
    }
    let mut bytes = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    Read::take(&file, cap).read_to_end(&mut bytes).map_err(|_| Unreadable::Failed)?;
    drop::<File>(file);
    if bytes.len() > limit {
        return Err(Unreadable::TooLarge);
    }
    Ok(bytes)
}
