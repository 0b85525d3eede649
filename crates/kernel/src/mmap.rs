//! `mmap` and `munmap` on the kernel (the system calls of mm/mmap.c): a
//! region placed where the model places it, and checked to be one VMA of
//! its own, or with `at=` at its address exactly (MAP_FIXED_NOREPLACE:
//! EEXIST over a region already there), merged as the kernel merges it and
//! relocated away from the agent's own mappings ([`crate::relocate`]); a region fully
//! unmapped is gone, its last counters kept.

use crate::agents::{Agents, Region};
use crate::call::failed;
use crate::measure::{read_region, Measurement};
use crate::mprotect::prot_bits;
use crate::protocol::Request;
use hugelab_workload::gone::Gone;
use hugelab_workload::mapped::Mapped;
use hugelab_workload::stmt::{Mmap, Munmap};
use hugelab_workload::units::PAGE_SIZE;
use hugelab_workload::{placement, BackendError, HugetlbSize, Prot, Stmt};
use std::collections::BTreeMap;

/// `<proc> mmap <region> <size> ...`
pub(crate) fn mmap(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Mmap,
) -> Result<(), BackendError> {
    let Mmap {
        proc,
        region,
        size,
        align,
        hugetlb,
        shared,
        prot,
        at,
    } = s;
    let len = size.bytes().next_multiple_of(PAGE_SIZE);
    let align = match (align, hugetlb) {
        (Some(a), _) => a.bytes().max(PAGE_SIZE),
        (None, Some(HugetlbSize::Size1G)) => 1 << 30,
        (None, _) => placement::default_align(len),
    };
    let p = agents.get_mut(stmt, proc)?;
    let mut cursor = p.cursor;
    let start = match at {
        Some(at) => {
            let at = crate::relocate::fixed_address(stmt, proc, p, *at, len)?;
            placement::after_fixed_region(&mut cursor, at, len);
            at
        }
        None => placement::place_region(&mut cursor, len, align),
    };
    let req = Request::Mmap {
        addr: start,
        len,
        prot: prot_bits(prot.unwrap_or(Prot::ReadWrite)),
        shared: *shared,
        hugetlb: *hugetlb,
    };
    let mut addr = 0;
    m.window(stmt, false, agents, |agents| {
        let (a, faults) = agents.request(stmt, proc, req)?;
        addr = a as u64;
        Ok(faults)
    })?;
    let p = agents.get_mut(stmt, proc)?;
    p.regions.insert(
        region.clone(),
        Region {
            start: addr,
            len,
            mapped: Mapped::whole(len),
        },
    );
    p.cursor = cursor;
    if at.is_some() {
        // A fixed region merges with a compatible neighbour as the kernel
        // decides; its counters are those of the VMAs it overlaps.
        return Ok(());
    }
    // THP eligibility depends on VMA bounds: a placed region must be
    // one VMA of its own, merged with nothing.
    let vmas = crate::smaps::region_smaps(p.agent.pid, addr, addr + len)
        .map_err(|e| failed(stmt, e))?
        .vmas;
    if vmas != 1 {
        return Err(failed(
            stmt,
            format!("region '{region}' is {vmas} VMAs in the kernel, not one"),
        ));
    }
    Ok(())
}

/// `<proc> munmap <range>`
pub(crate) fn munmap(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Munmap,
    gone: &mut Gone,
) -> Result<(), BackendError> {
    let Munmap { proc, range } = s;
    let (start, len) = agents.range(stmt, proc, range)?;
    let req = Request::Munmap { addr: start, len };
    m.window(stmt, false, agents, |agents| agents.call(stmt, proc, req))?;
    retire_region_if_unmapped(m, agents, stmt, proc, &range.region, start, len, gone)
}

/// After a munmap of `[start, start + len)` in `region` of `proc`: once
/// nothing of the region is mapped, it is gone (its name is free again)
/// and its counters as of now go to `gone`.
#[allow(clippy::too_many_arguments)]
fn retire_region_if_unmapped(
    m: &Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    proc: &str,
    region: &str,
    start: u64,
    len: u64,
    gone: &mut Gone,
) -> Result<(), BackendError> {
    let p = agents.get_mut(stmt, proc)?;
    let Some(r) = p.regions.get_mut(region) else {
        return Ok(());
    };
    r.mapped.unmap(start - r.start, start - r.start + len);
    if !r.mapped.is_empty() {
        return Ok(());
    }
    let (mut c, mut unknown) = (Default::default(), BTreeMap::new());
    let (pid, r_start, r_len) = (p.agent.pid, r.start, r.len);
    read_region(proc, pid, region, r_start, r_len, &mut c, &mut unknown)
        .map_err(|e| failed(stmt, e))?;
    p.regions.remove(region);
    gone.add(m.judge(c, unknown));
    Ok(())
}
