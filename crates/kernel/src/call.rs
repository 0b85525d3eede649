//! What one statement's system call did inside a measurement window
//! ([`Call`]), and the errors every statement's handler reports.

use crate::error::KernelError;
use crate::process::AgentProc;
use crate::protocol::Request;
use hugelab_workload::{BackendError, Errno, Signal, Stmt};

/// What one statement's system call did inside a window: the faults the
/// agents took, its errno (0: it succeeded), and the process the kernel
/// killed during it, if one.
pub(crate) struct Call {
    pub(crate) faults: i64,
    /// Of `faults`, those the agents took outside the workload's own
    /// accesses (a request's faults beyond its loop's: the agent's own code
    /// or memory, say a text page reclaimed or a page under migration on a
    /// busy machine). They are in the window's pgfault, not the workload's.
    pub(crate) own_faults: i64,
    pub(crate) errno: Errno,
    pub(crate) killed: Option<Killed>,
}

/// A process killed by a signal during a statement: gone when the window
/// closes, its memory freed inside it.
pub(crate) struct Killed {
    pub(crate) proc: String,
    pub(crate) signal: Signal,
    /// How, for people.
    pub(crate) message: String,
}

impl Call {
    pub(crate) fn ok(faults: i64) -> Call {
        Call {
            faults,
            own_faults: 0,
            errno: Errno::OK,
            killed: None,
        }
    }
}

pub(crate) fn failed(stmt: &Stmt, e: impl std::fmt::Display) -> BackendError {
    BackendError::failed(stmt.pos, e.to_string())
}

/// Sends `req` outside any window: its value, or an error if it failed.
pub(crate) fn req_ok(agent: &mut AgentProc, req: Request) -> Result<i64, KernelError> {
    let reply = agent.request(req)?;
    if reply.errno != Errno::OK {
        return Err(KernelError::Agent(format!(
            "agent request {req:?} failed: {}",
            reply.errno
        )));
    }
    Ok(reply.value)
}
