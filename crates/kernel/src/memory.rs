//! `read` and `write` on the kernel: the agent touches the range one step at
//! a time, taking the faults of mm/memory.c; `special`: the same on the
//! agent's own vDSO and vvar.

use crate::agents::Agents;
use crate::attribute::Touched;
use crate::call::failed;
use crate::measure::Measurement;
use crate::protocol::{Access, Request};
use crate::spurious::{self, HugeBefore};
use hugelab_workload::stmt::{Read, Special, Write, SPECIAL_MAPPINGS};
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
    // Its folios before, to tell its allocations in a noisy window (see
    // `attribute::Touched`).
    // Not inside a memory cgroup of the workload's: a charge there may
    // reclaim (split, free) folios outside the range.
    let p = agents.get_mut(stmt, proc)?;
    let anon = p.regions.get(&range.region).is_some_and(|r| r.anon);
    let (pid, alone) = (p.agent.pid, anon && !p.workload_memcg);
    let touched = alone
        .then(|| Touched::before(pid, start, start + len, m.forked()))
        .flatten();
    // A write may make a huge page writable in place (see `spurious`); an
    // error reading pagemap leaves it unknown whether one was there.
    let write = !matches!(access, Access::Read);
    let huge = write.then(|| HugeBefore::scan(pid, start, start + len));
    let done = m.touch_window(stmt, agents, touched, |agents| agents.call(stmt, proc, req));
    if let (Some(huge), Ok(())) = (huge, &done) {
        let in_place = spurious::in_place(huge);
        if let Some(why) = spurious::why(stmt.pos.line, m.last_faults(), in_place) {
            m.taint_from_now("vmstat.pgfault", &why);
            agents
                .get_mut(stmt, proc)?
                .minflt_unknown
                .get_or_insert(why);
        }
    }
    done
}

/// `<proc> special <mapping>[+off][:len]`: the agent reads the pages at the
/// same offsets of its own mapping of that name (its vDSO is wherever its
/// exec put it), found in its /proc/PID/maps. The agent zaps its own vDSO
/// text at start, and never touches its vvar pages (see
/// [`crate::agent`]), so its PTEs are a fresh program's; they are checked
/// (pagemap) against those the workload's reads made before each read.
pub(crate) fn special(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Special,
) -> Result<(), BackendError> {
    let (index, first, end) = s.pages().map_err(|e| failed(stmt, e))?;
    let mapping = &SPECIAL_MAPPINGS[index];
    let pid = agents.get_mut(stmt, &s.proc)?.agent.pid;
    let (start, len) = special_mapping_of(pid, mapping.maps_name)
        .map_err(|e| failed(stmt, format!("the agent of '{}': {e}", s.proc)))?;
    if len != mapping.pages * PAGE_SIZE {
        return Err(failed(
            stmt,
            format!(
                "this kernel's {} is {len:#x} bytes, not the {:#x} of x86-64 Linux 6.18 the language knows",
                mapping.maps_name,
                mapping.pages * PAGE_SIZE
            ),
        ));
    }
    let req = Request::Touch {
        addr: start + first * PAGE_SIZE,
        len: (end - first) * PAGE_SIZE,
        step: PAGE_SIZE,
        access: Access::Read,
    };
    m.window(stmt, false, agents, |agents| {
        agents.call(stmt, &s.proc, req)
    })
}

/// The start and length of the mapping named `name` (`[vdso]`) in process
/// `pid`'s /proc/PID/maps.
pub(crate) fn special_mapping_of(pid: i32, name: &str) -> Result<(u64, u64), String> {
    let path = format!("/proc/{pid}/maps");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    for line in text.lines() {
        if line.split_whitespace().nth(5) != Some(name) {
            continue;
        }
        let span = line.split_whitespace().next().unwrap_or("");
        let parse = |h: &str| u64::from_str_radix(h, 16).ok();
        if let Some((lo, hi)) = span.split_once('-') {
            if let (Some(lo), Some(hi)) = (parse(lo), parse(hi)) {
                return Ok((lo, hi - lo));
            }
        }
        return Err(format!("{path}: unreadable line {line:?}"));
    }
    Err(format!("{path} has no {name}"))
}
