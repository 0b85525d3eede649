//! Errors of the kernel backend. Every error names the file it concerns and
//! the errno the kernel returned, so that "Permission denied" is never seen
//! without the path that refused it; a refused read of another process's
//! /proc file also says why (see [`Refusal`]).

use hugelab_workload::Errno;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A kernel file (sysfs, procfs, a journal) could not be read or written.
    /// The io::Error is not exposed as the error's source: the message
    /// already says all it says, and `{:#}` would print it twice ("No such
    /// file or directory (ENOENT): No such file or directory (os error 2)").
    /// `why`: the reason, worked out when the error was made (a refused
    /// /proc/PID file).
    #[error("{}: {}{}", .path.display(), describe(.err), because(.why))]
    Io {
        path: PathBuf,
        err: io::Error,
        why: Option<String>,
    },
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
        Some(errno) => format!("{} ({})", strip_os(e), Errno(errno)),
        None => e.to_string(),
    }
}

fn because(why: &Option<String>) -> String {
    why.as_deref().map_or(String::new(), |w| format!(": {w}"))
}

/// Capability bit of CAP_SYS_PTRACE (include/uapi/linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;

/// What decides whether the kernel lets us read another process's memory
/// files: /proc/PID/maps, smaps, pagemap and mem go through `mm_access`,
/// whose `__ptrace_may_access` (kernel/ptrace.c, Linux 6.18) allows the
/// caller whose fsuid and fsgid equal the target's uid, euid, suid and gid,
/// egid, sgid, or who has CAP_SYS_PTRACE (in the target's user namespace,
/// which these facts take to be ours); then, unless the caller has
/// CAP_SYS_PTRACE, the target must be dumpable; then the security modules
/// decide. A refusal is EACCES.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadFacts {
    /// Our fsuid.
    pub uid: u32,
    /// CAP_SYS_PTRACE is in our effective set (CapEff of /proc/self/status).
    pub cap_sys_ptrace: bool,
    /// The target's euid, if its status could be read.
    pub target_uid: Option<u32>,
    /// The target's uids and gids all equal our fsuid and fsgid (the
    /// ptrace check's "same user"), if its status could be read.
    pub same_user: Option<bool>,
    /// Whether the target is dumpable, if that can be told (see
    /// [`dumpable`]).
    pub dumpable: Option<bool>,
    /// The file was /proc/PID/mem, which asks for ptrace attach access
    /// (Yama judges attach only).
    pub attach: bool,
}

/// Why the kernel refused a read of another process's /proc file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// We are not root and the process is another user's (its euid, if
    /// known).
    AnotherUser { uid: Option<u32> },
    /// The process is another user's and we lack CAP_SYS_PTRACE (root in a
    /// container's default capability set).
    NoCapSysPtrace { uid: Option<u32> },
    /// The process is not dumpable and we lack CAP_SYS_PTRACE.
    NotDumpable,
    /// We lack CAP_SYS_PTRACE and the process may not be dumpable (its
    /// /proc files would be root's either way).
    MaybeNotDumpable,
    /// Uids, capabilities and dumpability allow it: a security module
    /// refused.
    SecurityModule { attach: bool },
}

/// The reason for a refusal, from the facts alone: the ptrace check's
/// tests in its order.
pub fn refusal(f: &ReadFacts) -> Refusal {
    if f.cap_sys_ptrace {
        return Refusal::SecurityModule { attach: f.attach };
    }
    if f.same_user != Some(true) {
        let uid = f.target_uid;
        return if f.uid != 0 {
            Refusal::AnotherUser { uid }
        } else {
            Refusal::NoCapSysPtrace { uid }
        };
    }
    match f.dumpable {
        Some(false) => Refusal::NotDumpable,
        None => Refusal::MaybeNotDumpable,
        Some(true) => Refusal::SecurityModule { attach: f.attach },
    }
}

impl Refusal {
    /// One clause saying why `who` ("process 1 (init)") could not be read.
    pub fn sentence(self, who: &str) -> String {
        const NO_CAP: &str = "CAP_SYS_PTRACE, which hugelab runs without (a container's default capabilities lack it)";
        match self {
            Refusal::AnotherUser { uid: Some(uid) } => format!(
                "{who} runs as uid {uid}, another user's, and reading another user's process needs root"
            ),
            Refusal::AnotherUser { uid: None } => {
                format!("{who} is not this user's, and reading another user's process needs root")
            }
            Refusal::NoCapSysPtrace { uid: Some(uid) } => format!(
                "{who} runs as uid {uid}, and reading another user's process needs {NO_CAP}"
            ),
            Refusal::NoCapSysPtrace { uid: None } => {
                format!("reading {who}, which may be another user's, needs {NO_CAP}")
            }
            Refusal::NotDumpable => format!(
                "{who} is not dumpable (its /proc files are root's: it changed its credentials or called prctl(PR_SET_DUMPABLE, 0)), and reading it needs {NO_CAP}"
            ),
            Refusal::MaybeNotDumpable => format!(
                "reading {who} needs {NO_CAP}, if it is not dumpable (a root process's /proc files do not show that); else a security module refused it"
            ),
            Refusal::SecurityModule { attach } => {
                let modules = if attach {
                    "Landlock, SELinux, AppArmor, Yama"
                } else {
                    "Landlock, SELinux, AppArmor"
                };
                format!(
                    "the kernel's uid, CAP_SYS_PTRACE and dumpable checks let hugelab read {who}, so a security module ({modules}) refused it"
                )
            }
        }
    }
}

/// Why a read of `path` failed with `e`, if it is a process's /proc file
/// that the kernel refused: the facts are read once, here.
fn why_refused(path: &Path, e: &io::Error) -> Option<String> {
    if !matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
        return None;
    }
    let mut parts = path.strip_prefix("/proc").ok()?.components();
    let pid = parts.next()?.as_os_str().to_str()?;
    let file = parts.next()?.as_os_str().to_str()?;
    if !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| format!(" ({})", c.trim_end()))
        .unwrap_or_default();
    let facts = read_facts(pid, file == "mem");
    Some(refusal(&facts).sentence(&format!("process {pid}{comm}")))
}

/// The `Uid:` or `Gid:` line of a status file: real, effective, saved, fs.
fn ids(status: &str, key: &str) -> Option<[u32; 4]> {
    let line = status.lines().find_map(|l| l.strip_prefix(key))?;
    let mut v = line.split_whitespace().map(|x| x.parse::<u32>().ok());
    Some([v.next()??, v.next()??, v.next()??, v.next()??])
}

fn read_facts(pid: &str, attach: bool) -> ReadFacts {
    let me = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let (my_uid, my_gid) = (ids(&me, "Uid:"), ids(&me, "Gid:"));
    let cap_sys_ptrace = me
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|c| u64::from_str_radix(c.trim(), 16).ok())
        .is_some_and(|c| c & (1 << CAP_SYS_PTRACE) != 0);
    let target = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let (uid, gid) = (ids(&target, "Uid:"), ids(&target, "Gid:"));
    let same_user = match (my_uid, my_gid, uid, gid) {
        (Some(mu), Some(mg), Some(u), Some(g)) => {
            Some(u[..3].iter().all(|&x| x == mu[3]) && g[..3].iter().all(|&x| x == mg[3]))
        }
        _ => None,
    };
    let owner = |p: String| std::fs::metadata(p).ok().map(|m| m.uid());
    ReadFacts {
        // SAFETY: geteuid cannot fail.
        uid: my_uid.map_or_else(|| unsafe { libc::geteuid() }, |u| u[3]),
        cap_sys_ptrace,
        target_uid: uid.map(|u| u[1]),
        same_user,
        dumpable: dumpable(
            owner(format!("/proc/{pid}")),
            owner(format!("/proc/{pid}/status")),
        ),
        attach,
    }
}

/// Whether a process is dumpable, from the owners of its /proc directory
/// and of a file in it: the directory is always owned by the process's
/// euid, its files by root when it is not dumpable (`task_dump_owner`,
/// fs/proc/base.c). A process whose euid is root cannot be told.
pub fn dumpable(dir_uid: Option<u32>, file_uid: Option<u32>) -> Option<bool> {
    match (dir_uid?, file_uid?) {
        (0, _) => None,
        (d, f) => Some(d == f),
    }
}

fn strip_os(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

impl KernelError {
    /// An I/O error on `path`; a refused /proc/PID file gets its reason
    /// now, once.
    pub fn io(path: impl Into<PathBuf>, err: io::Error) -> Self {
        let path = path.into();
        let why = why_refused(&path, &err);
        KernelError::Io { path, err, why }
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
        // The reason is worked out when the error is made, not printed.
        assert!(matches!(&e, KernelError::Io { why: Some(_), .. }), "{e:?}");
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

    /// Root with CAP_SYS_PTRACE, reading a root process of the same user.
    const ROOT: ReadFacts = ReadFacts {
        uid: 0,
        cap_sys_ptrace: true,
        target_uid: Some(0),
        same_user: Some(true),
        dumpable: None,
        attach: false,
    };

    #[test]
    fn a_user_without_the_capability_is_refused_another_users_process() {
        let user = ReadFacts {
            uid: 1000,
            cap_sys_ptrace: false,
            same_user: Some(false),
            ..ROOT
        };
        assert_eq!(refusal(&user), Refusal::AnotherUser { uid: Some(0) });
        // Its own process, not dumpable: not "another user's".
        let own = ReadFacts {
            target_uid: Some(1000),
            same_user: Some(true),
            dumpable: Some(false),
            ..user
        };
        assert_eq!(refusal(&own), Refusal::NotDumpable);
        // Its own, dumpable: only a security module is left.
        let open = ReadFacts {
            dumpable: Some(true),
            ..own
        };
        assert_eq!(refusal(&open), Refusal::SecurityModule { attach: false });
    }

    #[test]
    fn root_without_cap_sys_ptrace_is_told_so() {
        let container = ReadFacts {
            cap_sys_ptrace: false,
            ..ROOT
        };
        let other = ReadFacts {
            target_uid: Some(33),
            same_user: Some(false),
            ..container
        };
        assert_eq!(refusal(&other), Refusal::NoCapSysPtrace { uid: Some(33) });
        // A root process: dumpable or not cannot be told.
        assert_eq!(refusal(&container), Refusal::MaybeNotDumpable);
        let not_dumpable = ReadFacts {
            dumpable: Some(false),
            ..container
        };
        assert_eq!(refusal(&not_dumpable), Refusal::NotDumpable);
        assert!(Refusal::NotDumpable
            .sentence("process 7 (x)")
            .contains("CAP_SYS_PTRACE, which hugelab runs without"));
    }

    #[test]
    fn root_with_cap_sys_ptrace_is_refused_only_by_a_security_module() {
        for f in [
            ROOT,
            ReadFacts {
                same_user: Some(false),
                dumpable: Some(false),
                ..ROOT
            },
        ] {
            assert_eq!(refusal(&f), Refusal::SecurityModule { attach: false });
        }
        // Yama judges attach (/proc/PID/mem), not reads.
        let mem = ReadFacts {
            attach: true,
            ..ROOT
        };
        let why = refusal(&mem).sentence("process 1 (init)");
        assert!(
            why.contains("Yama") && why.contains("process 1 (init)"),
            "{why}"
        );
        let maps = refusal(&ROOT).sentence("process 1 (init)");
        assert!(
            maps.contains("security module") && !maps.contains("Yama"),
            "{maps}"
        );
    }

    #[test]
    fn dumpable_is_read_from_who_owns_the_proc_files() {
        assert_eq!(dumpable(Some(1000), Some(1000)), Some(true));
        assert_eq!(dumpable(Some(1000), Some(0)), Some(false));
        assert_eq!(dumpable(Some(0), Some(0)), None);
        assert_eq!(dumpable(None, Some(0)), None);
    }

    #[test]
    fn status_ids_are_real_effective_saved_fs() {
        let s = "Name:\tx\nUid:\t1000\t0\t1000\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!(ids(s, "Uid:"), Some([1000, 0, 1000, 0]));
        assert_eq!(ids(s, "Gid:"), Some([5; 4]));
        assert_eq!(ids(s, "Groups:"), None);
    }
}
