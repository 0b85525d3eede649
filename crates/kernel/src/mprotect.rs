//! `mprotect` on the kernel (the system call of mm/mprotect.c).

use crate::agents::Agents;
use crate::measure::Measurement;
use crate::protocol::Request;
use hugelab_workload::stmt::Mprotect;
use hugelab_workload::{BackendError, Prot, Stmt};

/// `<proc> mprotect <range> <prot>`
pub(crate) fn mprotect(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Mprotect,
) -> Result<(), BackendError> {
    let (start, len) = agents.range(stmt, &s.proc, &s.range)?;
    let req = Request::Mprotect {
        addr: start,
        len,
        prot: prot_bits(s.prot),
    };
    m.window(stmt, false, agents, |agents| {
        agents.call(stmt, &s.proc, req)
    })
}

/// The PROT_ bits of a protection.
pub(crate) fn prot_bits(p: Prot) -> i32 {
    [
        (p.read(), libc::PROT_READ),
        (p.write(), libc::PROT_WRITE),
        (p.exec(), libc::PROT_EXEC),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .fold(libc::PROT_NONE, |bits, (_, bit)| bits | bit)
}
