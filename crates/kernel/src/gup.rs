//! `pin` and `unpin` on the kernel: long-term pins taken and dropped by the
//! agent (mm/gup.c `pin_user_pages` with FOLL_LONGTERM, `unpin_user_pages`).

use crate::agents::Agents;
use crate::measure::Measurement;
use crate::protocol::Request;
use hugelab_workload::stmt::{Pin, Unpin};
use hugelab_workload::{BackendError, Stmt};

/// `<proc> pin <range>`
pub(crate) fn pin(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Pin,
) -> Result<(), BackendError> {
    let (addr, len) = agents.range(stmt, &s.proc, &s.range)?;
    let req = Request::Pin { addr, len };
    m.window(stmt, false, agents, |agents| {
        agents.call(stmt, &s.proc, req)
    })
}

/// `<proc> unpin <range>`
pub(crate) fn unpin(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Unpin,
) -> Result<(), BackendError> {
    let (addr, len) = agents.range(stmt, &s.proc, &s.range)?;
    let req = Request::Unpin { addr, len };
    m.window(stmt, false, agents, |agents| {
        agents.call(stmt, &s.proc, req)
    })
}
