//! `pin` and `unpin` on the kernel: long-term pins taken and dropped by the
//! agent (mm/gup.c `pin_user_pages` with FOLL_LONGTERM, `unpin_user_pages`).

use crate::agents::Agents;
use crate::measure::Measurement;
use crate::protocol::Request;
use hugelab_workload::stmt::{Pin, Unpin};
use hugelab_workload::{BackendError, Range, Stmt};

/// `<proc> pin <range>`
pub(crate) fn pin(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Pin,
) -> Result<(), BackendError> {
    range_call(m, agents, stmt, (&s.proc, &s.range), |addr, len| {
        Request::Pin { addr, len }
    })
}

/// `<proc> unpin <range>`
pub(crate) fn unpin(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Unpin,
) -> Result<(), BackendError> {
    range_call(m, agents, stmt, (&s.proc, &s.range), |addr, len| {
        Request::Unpin { addr, len }
    })
}

/// The agent of `proc` runs the request made for `range`'s address and
/// length, inside a measurement window.
fn range_call(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    (proc, range): (&str, &Range),
    req: impl FnOnce(u64, u64) -> Request,
) -> Result<(), BackendError> {
    let (addr, len) = agents.range(stmt, proc, range)?;
    let req = req(addr, len);
    m.window(stmt, false, agents, |agents| agents.call(stmt, proc, req))
}
