//! `mmap` and `munmap` on the kernel (the system calls of mm/mmap.c): a
//! region placed where the model places it, and checked to be one VMA of
//! its own, or with `at=` at its address exactly (MAP_FIXED_NOREPLACE:
//! EEXIST over a region already there), merged as the kernel merges it and
//! refused where it would touch the agent's own mappings; a region fully
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
        at,
        ..
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
            refuse_agent_collision(stmt, p, *at, len)?;
            placement::after_fixed_region(&mut cursor, *at, len);
            *at
        }
        None => placement::place_region(&mut cursor, len, align),
    };
    let (req, pass) = mmap_request(agents, stmt, s, start, len)?;
    let mut addr = 0;
    m.window(stmt, false, agents, |agents| {
        let (a, faults) = agents.request_passing(stmt, proc, req, pass)?;
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

/// The request that maps `s` at `start`: anonymous memory, or a file's
/// memfd (passed with the request), whose pages are written before the
/// statement's window opens: they are in the page cache before the
/// mapping, as a cached library's are.
fn mmap_request(
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Mmap,
    start: u64,
    len: u64,
) -> Result<(Request, Option<std::os::fd::RawFd>), BackendError> {
    let prot = prot_bits(s.prot.unwrap_or(Prot::ReadWrite));
    if let Some(name) = &s.file {
        let offset = s.offset.map_or(0, |o| o.bytes());
        let fd = agents.files.at_least(stmt, name, offset + len)?;
        let req = Request::MmapFile {
            addr: start,
            len,
            prot,
            offset,
        };
        return Ok((req, Some(fd)));
    }
    if s.shared && s.hugetlb.is_none() {
        crate::filemap::refuse_large_shmem_folios(stmt)?;
    }
    let req = Request::Mmap {
        addr: start,
        len,
        prot,
        shared: s.shared,
        hugetlb: s.hugetlb,
    };
    Ok((req, None))
}

/// An `at=` region may not overlap, nor touch (it could merge with), a
/// mapping of the agent's own (its binary, heap, stack, libraries, vdso):
/// refused with one sentence. Relocating the program's mappings away from
/// them is a later step; an overlap with the workload's own regions is left
/// to the kernel (EEXIST).
fn refuse_agent_collision(
    stmt: &Stmt,
    p: &crate::agents::Proc,
    at: u64,
    len: u64,
) -> Result<(), BackendError> {
    let path = format!("/proc/{}/maps", p.agent.pid);
    let text = std::fs::read_to_string(&path).map_err(|e| failed(stmt, format!("{path}: {e}")))?;
    let regions: Vec<(u64, u64)> = p.regions.values().map(|r| (r.start, r.len)).collect();
    match agent_collision(&text, &regions, at, len) {
        None => Ok(()),
        Some(why) => Err(failed(stmt, why)),
    }
}

/// The sentence refusing `[at, at + len)` when it overlaps or touches a
/// mapping of `maps` (a /proc/PID/maps text) that is none of the workload's
/// `regions` (start, len).
fn agent_collision(maps: &str, regions: &[(u64, u64)], at: u64, len: u64) -> Option<String> {
    let end = at + len;
    let ours = |lo: u64, hi: u64| regions.iter().any(|&(s, l)| lo < s + l && hi > s);
    let (lo, hi, line) = maps.lines().find_map(|line| {
        let (lo, hi) = crate::smaps::vma_header(line)?;
        (lo <= end && hi >= at && !ours(lo, hi)).then_some((lo, hi, line))
    })?;
    let what = line
        .split_ascii_whitespace()
        .nth(5)
        .unwrap_or("anonymous memory");
    Some(format!(
        "mmap at={at:#x} ({len:#x} bytes) collides with the agent's own mapping \
         {lo:#x}-{hi:#x} ({what}); relocating a workload's fixed addresses is not \
         supported yet, so choose an address clear of it"
    ))
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

#[cfg(test)]
mod tests {
    use super::agent_collision;

    const MAPS: &str = "\
55d0c0000000-55d0c0200000 r-xp 00000000 08:01 1234                       /usr/bin/hugelab
7e0000200000-7e0000300000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd00100000-7ffd00102000 rw-p 00000000 00:00 0 
";

    #[test]
    fn an_agent_mapping_in_the_way_is_named() {
        let regions = [(0x7e00_0020_0000, 0x10_0000)];
        let e = agent_collision(MAPS, &regions, 0x7ffd_0001_0000, 0x1000).unwrap();
        assert!(
            e.contains(
                "collides with the agent's own mapping 0x7ffd00000000-0x7ffd00021000 ([stack])"
            ),
            "{e}"
        );
        // Touching an anonymous mapping of its own counts: it could merge.
        let e = agent_collision(MAPS, &regions, 0x7ffd_000f_f000, 0x1000).unwrap();
        assert!(e.contains("(anonymous memory)"), "{e}");
        assert!(agent_collision(MAPS, &regions, 0x55d0_c020_0000, 0x1000).is_some());
    }

    #[test]
    fn the_workloads_own_regions_and_free_space_pass() {
        let regions = [(0x7e00_0020_0000, 0x10_0000)];
        // Over a region (EEXIST is the kernel's), next to it, or in free space.
        assert_eq!(
            agent_collision(MAPS, &regions, 0x7e00_0020_0000, 0x1000),
            None
        );
        assert_eq!(
            agent_collision(MAPS, &regions, 0x7e00_0030_0000, 0x10_0000),
            None
        );
        assert_eq!(
            agent_collision(MAPS, &regions, 0x7e00_1000_0000, 0x1000),
            None
        );
    }
}
