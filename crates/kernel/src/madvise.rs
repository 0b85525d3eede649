//! `madvise` on the kernel (the system call of mm/madvise.c). MADV_COLLAPSE
//! is the one advice whose window may see THPs collapse. MADV_POPULATE_READ
//! and MADV_POPULATE_WRITE fault in the agent's call: those faults are the
//! process's (`stat.<proc>.minflt`), measured around the call.

use crate::agents::Agents;
use crate::measure::Measurement;
use crate::protocol::Request;
use hugelab_workload::stmt::Madvise;
use hugelab_workload::{Advice, BackendError, Stmt};

const MADV_COLLAPSE: i32 = 25;

/// `<proc> madvise <range> <ADVICE>`
pub(crate) fn madvise(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Madvise,
) -> Result<(), BackendError> {
    let (start, len) = agents.range(stmt, &s.proc, &s.range)?;
    let req = Request::Madvise {
        addr: start,
        len,
        advice: advice_bits(s.advice),
    };
    let collapse = s.advice == Advice::Collapse;
    m.window(stmt, collapse, agents, |agents| {
        agents.call(stmt, &s.proc, req)
    })
}

fn advice_bits(a: Advice) -> i32 {
    match a {
        Advice::Hugepage => libc::MADV_HUGEPAGE,
        Advice::NoHugepage => libc::MADV_NOHUGEPAGE,
        Advice::DontNeed => libc::MADV_DONTNEED,
        Advice::Free => libc::MADV_FREE,
        Advice::Collapse => MADV_COLLAPSE,
        Advice::Pageout => libc::MADV_PAGEOUT,
        Advice::Cold => libc::MADV_COLD,
        Advice::PopulateRead => libc::MADV_POPULATE_READ,
        Advice::PopulateWrite => libc::MADV_POPULATE_WRITE,
    }
}
