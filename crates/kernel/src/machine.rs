//! `machine` and `fragment` on the kernel: the backend runs only on the
//! machine it is on, so `machine` checks this one has the shape asked for,
//! and `fragment` (placing unmovable kernel pages) is refused.

use hugelab_workload::stmt::Machine;
use hugelab_workload::{BackendError, BackendErrorKind, HvoRuleName, MachineParam, Stmt};

/// `machine <key>=<value>...`
pub(crate) fn machine(stmt: &Stmt, s: &Machine) -> Result<(), BackendError> {
    for p in &s.params {
        let ok = match p {
            MachineParam::Arch(a) => {
                format!("{a:?}").to_lowercase() == std::env::consts::ARCH.replace('-', "_")
            }
            // SAFETY: sysconf has no preconditions.
            MachineParam::BasePage(s) => {
                s.bytes() == unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
            }
            MachineParam::Memory(_) => false,
            // The rule and struct page of Linux 6.18 on x86_64.
            MachineParam::Hvo(r) => *r == HvoRuleName::Linux618,
            MachineParam::StructPage(n) => *n == 64,
            MachineParam::Pkeys(on) => *on == protection_keys(),
        };
        if !ok {
            return Err(BackendError {
                pos: stmt.pos,
                kind: BackendErrorKind::Unsupported,
                message: format!(
                    "this machine does not have the shape `{}` asks for; the kernel backend runs only on the machine it is on",
                    stmt.kind
                ),
            });
        }
    }
    Ok(())
}

/// Whether this machine's processes have x86 memory protection keys: the
/// CPU flag `ospke` in /proc/cpuinfo (the kernel enabled PKU), with which
/// an execute-only mapping is unreadable. False where the file or the flag
/// is missing (not x86, or no PKU).
pub fn protection_keys() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == "ospke"))
    })
}

/// `fragment ...`: model-only.
pub(crate) fn fragment(stmt: &Stmt) -> Result<(), BackendError> {
    Err(BackendError {
        pos: stmt.pos,
        kind: BackendErrorKind::Unsupported,
        message: "fragment is model-only: the kernel's memory cannot be fragmented on demand on these machines (the generator places unmovable kernel pages at chosen physical frames, which no user-space call can do)".into(),
    })
}
