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
use hugelab_workload::stmt::{Brk, Mmap, Munmap};
use hugelab_workload::units::PAGE_SIZE;
use hugelab_workload::{placement, BackendError, Errno, HugetlbSize, Prot, Stmt};
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
        growsdown,
        ..
    } = s;
    let len = size.bytes().next_multiple_of(PAGE_SIZE);
    // A growsdown stack maps its top part only; the rest is what it grows into.
    let below = len - s.mapped_at_first(PAGE_SIZE);
    let align = match (align, hugetlb) {
        (Some(a), _) => a.bytes().max(PAGE_SIZE),
        (None, Some(HugetlbSize::Size1G)) => 1 << 30,
        (None, _) => placement::default_align(len),
    };
    let p = agents.get_mut(stmt, proc)?;
    let mut cursor = p.cursor;
    let start = match at {
        Some(at) => {
            let below = if *growsdown {
                STACK_GUARD_GAP.min(*at)
            } else {
                0
            };
            let low = crate::relocate::fixed_address(stmt, proc, p, at - below, len + below)?;
            let at = low + below;
            placement::after_fixed_region(&mut cursor, at, len);
            at
        }
        None => placement::place_region(&mut cursor, len, align),
    };
    if below > 0 {
        refuse_taken_stack_range(stmt, p, start, below)?;
    }
    let (req, pass) = mmap_request(agents, stmt, s, start + below, len - below)?;
    let mut addr = 0;
    m.window(stmt, false, agents, |agents| {
        let (a, faults) = agents.request_passing(stmt, proc, req, pass)?;
        addr = (a as u64).wrapping_sub(below);
        Ok(faults)
    })?;
    let p = agents.get_mut(stmt, proc)?;
    p.regions.insert(
        region.clone(),
        Region {
            start: addr,
            len,
            mapped: Mapped::whole(len),
            anon: s.file.is_none() && !s.shared && s.hugetlb.is_none(),
            private_file: s.file.is_some() && !s.shared,
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
        populate: s.populate,
        stack: s.stack,
        growsdown: s.growsdown,
    };
    Ok((req, None))
}

/// `<proc> brk <region> <new-size> [at=]`. The agent cannot move its own
/// program break to a recorded address (its break is its own heap's), so a
/// brk is replayed on the mappings it makes: growing maps the new pages
/// `[PAGE_ALIGN(old break), PAGE_ALIGN(new break))` anonymous rw private
/// with MAP_FIXED_NOREPLACE, which the kernel merges into the heap's VMA as
/// brk's `do_brk_flags` expands it (an anonymous rw private mapping's
/// flags are VM_READ|VM_WRITE|VM_MAYREAD|VM_MAYWRITE|VM_MAYEXEC|VM_ACCOUNT,
/// which is brk's VM_DATA_DEFAULT_FLAGS|VM_ACCOUNT on x86_64; VM_SOFTDIRTY,
/// which differs, is ignored by the merge); shrinking unmaps the tail.
/// As brk does, growing fails (ENOMEM) when a mapping lies in the new part
/// or within a page above it.
pub(crate) fn brk(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Brk,
) -> Result<(), BackendError> {
    let p = agents.get_mut(stmt, &s.proc)?;
    let (start, old) = match (p.regions.get(&s.region), s.at) {
        (Some(r), _) => (r.start, r.len),
        (None, Some(at)) => (
            crate::relocate::fixed_address(stmt, &s.proc, p, at, PAGE_SIZE)?,
            0,
        ),
        (None, None) => {
            return Err(failed(
                stmt,
                format!("process '{}' has no heap '{}'", s.proc, s.region),
            ))
        }
    };
    let new = s.size.bytes();
    let oldbrk = (start + old).next_multiple_of(PAGE_SIZE);
    let newbrk = (start + new).next_multiple_of(PAGE_SIZE);
    let req = if newbrk > oldbrk {
        crate::relocate::refuse_own_collision(stmt, p, oldbrk, newbrk - oldbrk)?;
        let path = format!("/proc/{}/smaps", p.agent.pid);
        let text =
            std::fs::read_to_string(&path).map_err(|e| failed(stmt, format!("{path}: {e}")))?;
        if brk_in_the_way(&text, oldbrk, newbrk) {
            return Err(BackendError::errno(
                stmt,
                Errno::ENOMEM,
                format!(
                    "brk: the heap cannot grow to {:#x}: a mapping is in the way (or within a page of it)",
                    start + new
                ),
            ));
        }
        Some(Request::Mmap {
            addr: oldbrk,
            len: newbrk - oldbrk,
            prot: libc::PROT_READ | libc::PROT_WRITE,
            shared: false,
            hugetlb: None,
            populate: false,
            stack: false,
            growsdown: false,
        })
    } else if newbrk < oldbrk {
        Some(Request::Munmap {
            addr: newbrk,
            len: oldbrk - newbrk,
        })
    } else {
        None
    };
    if let Some(req) = req {
        m.window(stmt, false, agents, |agents| {
            agents.call(stmt, &s.proc, req)
        })?;
    }
    let p = agents.get_mut(stmt, &s.proc)?;
    if s.at.is_some() {
        placement::after_fixed_region(&mut p.cursor, start, newbrk - start);
    }
    p.regions.insert(
        s.region.clone(),
        Region {
            start,
            len: new,
            mapped: Mapped::whole(newbrk - start),
            anon: true,
            private_file: false,
        },
    );
    Ok(())
}

/// Whether brk's check refuses to grow the heap from `oldbrk` to `newbrk`
/// (page-aligned), given the process's smaps text: a VMA overlaps the new
/// part, or starts less than a page above it (`vm_start_gap`: a growsdown
/// stack, VmFlags `gd`, less than a page plus its guard gap above it).
fn brk_in_the_way(smaps: &str, oldbrk: u64, newbrk: u64) -> bool {
    let mut vmas: Vec<(u64, u64, bool)> = Vec::new();
    for line in smaps.lines() {
        if let Some((lo, hi)) = crate::smaps::vma_header(line) {
            vmas.push((lo, hi, false));
        } else if let (Some(flags), Some(last)) = (line.strip_prefix("VmFlags:"), vmas.last_mut()) {
            last.2 = flags.split_ascii_whitespace().any(|f| f == "gd");
        }
    }
    // brk looks at the first VMA above the old break only (`vma_find`).
    vmas.iter()
        .find(|&&(_, hi, _)| hi > oldbrk)
        .is_some_and(|&(lo, _, gd)| {
            let gap = if gd { STACK_GUARD_GAP } else { 0 };
            lo.saturating_sub(gap) < newbrk + PAGE_SIZE
        })
}

/// stack_guard_gap (mm/mmap.c): 256 pages.
const STACK_GUARD_GAP: u64 = 256 * PAGE_SIZE;

/// A growsdown stack's region below its first VMA, `[start, start + below)`,
/// is what it grows into: the model refuses a stack whose region overlaps a
/// mapping (EEXIST, as MAP_FIXED_NOREPLACE over it), and so does this
/// backend, which the kernel would not (it maps the top part only).
fn refuse_taken_stack_range(
    stmt: &Stmt,
    p: &crate::agents::Proc,
    start: u64,
    below: u64,
) -> Result<(), BackendError> {
    let path = format!("/proc/{}/maps", p.agent.pid);
    let text = std::fs::read_to_string(&path).map_err(|e| failed(stmt, format!("{path}: {e}")))?;
    let taken = text
        .lines()
        .filter_map(crate::smaps::vma_header)
        .any(|(lo, hi)| lo < start + below && hi > start);
    if taken {
        return Err(BackendError::errno(
            stmt,
            Errno::EEXIST,
            format!("mmap growsdown at={start:#x}: the range the stack grows into overlaps a mapping already there"),
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

#[cfg(test)]
mod tests {
    #[test]
    fn brk_is_refused_next_to_a_mapping_and_within_a_stacks_guard_gap() {
        use super::brk_in_the_way;
        let smaps = "\
7e0000400000-7e0000500000 rw-p 00000000 00:00 0 
Rss:                   0 kB
VmFlags: rd wr mr mw me ac 
7e0001000000-7e0001010000 rw-p 00000000 00:00 0 
VmFlags: rd wr mr mw me gd ac 
";
        let (heap, m) = (0x7e00_0010_0000u64, 1u64 << 20);
        assert!(!brk_in_the_way(smaps, heap, heap + m));
        // Up to a page below the mapping, not closer.
        assert!(!brk_in_the_way(smaps, heap, 0x7e00_003f_f000));
        assert!(brk_in_the_way(smaps, heap, 0x7e00_0040_0000));
        // Above it: the stack at 0x7e0001000000 keeps 256 pages clear.
        let above = 0x7e00_0050_0000;
        assert!(!brk_in_the_way(smaps, above, 0x7e00_00ef_f000));
        assert!(brk_in_the_way(smaps, above, 0x7e00_00f0_0000));
    }
}
