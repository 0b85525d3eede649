//! Errors of the kernel backend. Every error names the file it concerns and
//! the errno the kernel returned, so that "Permission denied" is never seen
//! without the path that refused it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub enum KernelError {
    /// A kernel file (sysfs, procfs, a journal) could not be read or written.
    Io { path: PathBuf, source: io::Error },
    /// The machine does not allow what was asked (not root, read-only sysfs,
    /// debugfs locked down...). The message is one complete sentence.
    Refused(String),
    /// A process agent failed or died.
    Agent(String),
    /// A process agent was killed by `signal` (the message says how) and
    /// is gone; `faults`: the minor faults it took during its last request
    /// (from its rusage), where known.
    Killed {
        signal: i32,
        message: String,
        faults: Option<i64>,
    },
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::Io { path, source } => {
                write!(f, "{}: {}", path.display(), describe(source))?;
                match why_denied(path, source) {
                    Some(why) => write!(f, ": {why}"),
                    None => Ok(()),
                }
            }
            KernelError::Refused(m) | KernelError::Agent(m) => f.write_str(m),
            KernelError::Killed { message, .. } => f.write_str(message),
        }
    }
}

/// No `source()`: an `Io` error's message already says all its io::Error
/// says (see [`describe`]); reported as the cause too, `{:#}` printed it
/// twice ("No such file or directory (ENOENT): No such file or directory
/// (os error 2)").
impl std::error::Error for KernelError {}

/// `Permission denied (os error 13)` → `Permission denied (EACCES)`.
fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(errno) => format!("{} ({})", strip_os(e), errno_name(errno)),
        None => e.to_string(),
    }
}

/// Why a process's /proc file was refused: /proc/PID/maps, smaps, pagemap
/// and the like are open to whoever passes the kernel's ptrace read check
/// (`mm_access`, PTRACE_MODE_READ_FSCREDS), which fails with EACCES. Not
/// root: only the process's own user may. Root, which has CAP_SYS_PTRACE,
/// is refused only by a security module. On the development VMs, process 1
/// (the VM's init, `process_api`) is closed this way to everything it
/// starts, though those run as root with CAP_SYS_PTRACE, without Yama and
/// with no BPF program loaded: the likely refuser is a Landlock domain its
/// children run in (a Landlock-restricted task may not read a task outside
/// its domain), while its children read one another.
fn why_denied(path: &Path, e: &io::Error) -> Option<String> {
    if !matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
        return None;
    }
    let mut parts = path.strip_prefix("/proc").ok()?.components();
    let pid = parts.next()?.as_os_str().to_str()?;
    if !pid.bytes().all(|b| b.is_ascii_digit()) || parts.next().is_none() {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| format!(" ({})", c.trim_end()))
        .unwrap_or_default();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some(format!(
            "process {pid}{comm} is not this user's; reading another user's process needs root"
        ));
    }
    Some(format!(
        "the kernel's ptrace read check refused process {pid}{comm} to root, \
         so a security module (a sandbox's Landlock domain, SELinux, AppArmor) keeps it closed"
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Once: `{:#}` of an anyhow error (the CLI's) walks `source()` too.
    #[test]
    fn an_io_error_says_its_errno_once() {
        let e = KernelError::io(
            "/sys/fs/cgroup/x/cgroup.procs",
            io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert_eq!(
            e.to_string(),
            "/sys/fs/cgroup/x/cgroup.procs: No such file or directory (ENOENT)"
        );
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn a_refused_proc_file_says_why() {
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        let e = KernelError::io("/proc/1/maps", denied);
        assert!(
            e.to_string()
                .starts_with("/proc/1/maps: Permission denied (EACCES): "),
            "{e}"
        );
        let other = KernelError::io(
            "/sys/kernel/mm/x",
            io::Error::from_raw_os_error(libc::EACCES),
        );
        assert_eq!(
            other.to_string(),
            "/sys/kernel/mm/x: Permission denied (EACCES)"
        );
    }
}
