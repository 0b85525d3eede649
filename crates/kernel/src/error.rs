//! Errors of the kernel backend. Every error names the file it concerns and
//! the errno the kernel returned, so that "Permission denied" is never seen
//! without the path that refused it.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A kernel file (sysfs, procfs, a journal) could not be read or written.
    #[error("{}: {}", .path.display(), describe(.source))]
    Io { path: PathBuf, source: io::Error },
    /// The machine does not allow what was asked (not root, read-only sysfs,
    /// debugfs locked down...). The message is one complete sentence.
    #[error("{0}")]
    Refused(String),
    /// A process agent failed or died.
    #[error("{0}")]
    Agent(String),
    /// A process agent was killed by `signal` (the message says how) and
    /// is gone; `faults`: the minor faults it took during its last request
    /// (from its rusage), where known.
    #[error("{message}")]
    Killed {
        signal: i32,
        message: String,
        faults: Option<i64>,
    },
}

/// `Permission denied (os error 13)` → `Permission denied (EACCES)`.
fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(errno) => format!("{} ({})", strip_os(e), errno_name(errno)),
        None => e.to_string(),
    }
}

fn strip_os(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// The symbolic name of the errnos hugelab meets; the number otherwise.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

impl KernelError {
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        KernelError::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = KernelError> = std::result::Result<T, E>;
