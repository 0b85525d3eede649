//! `read` and `write` on the kernel: the agent touches the range one step at
//! a time, taking the faults of mm/memory.c.

use crate::agents::Agents;
use crate::measure::Measurement;
use crate::protocol::{Access, Request};
use hugelab_workload::stmt::{Read, Write};
use hugelab_workload::units::PAGE_SIZE;
use hugelab_workload::{BackendError, Range, Size, Stmt};

/// `<proc> read <range> [step=]`
pub(crate) fn read(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Read,
) -> Result<(), BackendError> {
    touch(m, agents, stmt, &s.proc, &s.range, s.step, Access::Read)
}

/// `<proc> write <range> [step=] [zero]`
pub(crate) fn write(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Write,
) -> Result<(), BackendError> {
    let access = if s.zero {
        Access::WriteZero
    } else {
        Access::Write
    };
    touch(m, agents, stmt, &s.proc, &s.range, s.step, access)
}

fn touch(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
    step: Option<Size>,
    access: Access,
) -> Result<(), BackendError> {
    let (start, len) = agents.range(stmt, proc, range)?;
    let step = step.map_or(PAGE_SIZE, |s| s.bytes().max(1));
    let req = Request::Touch {
        addr: start,
        len,
        step,
        access,
    };
    m.window(stmt, false, agents, |agents| agents.call(stmt, proc, req))
}
