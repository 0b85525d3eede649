//! Long-term pins: `pin` and `unpin`, as io_uring fixed buffers take them;
//! and the GUP faults without pins of MADV_POPULATE_READ/WRITE
//! (`faultin_page_range`) and MAP_POPULATE (`mm_populate`).
//!
//! Follows Linux 6.18 `mm/gup.c` (`pin_user_pages` with FOLL_WRITE |
//! FOLL_LONGTERM, `faultin_page`, `try_grab_folio`, `unpin_user_pages`):
//! every page of the range is faulted in for writing first (a write fault,
//! counted as one, copy-on-write included), then pinned: a large folio's
//! `_pincount` and refcount grow by one per page, a small folio's refcount by
//! GUP_PIN_COUNTING_BIAS. Pinning marks the mm MMF_HAS_PINNED for good.
//!
//! Simplifications: FOLL_TOUCH on a page GUP finds mapped is not modelled
//! (`follow_page_pte` marks it accessed and, for FOLL_WRITE through a
//! clean PTE, marks its folio dirty: a lazily-freed folio pinned or
//! populated for writing is kept by reclaim on the kernel, discarded in the
//! model). io_uring afterwards drops all but one pin per large
//! folio (`io_coalesce_buffer`); nothing the model reports depends on how
//! many pins a pinned folio holds, so the model keeps the per-page count.
//! The pins belong to the ring, which a forked child shares: they go when
//! the range is unpinned or the last process holding the ring exits.

use crate::memory::{access_range, Access};
use crate::mm_types::{Fault, MmStruct, Pfn, PAGE_SIZE};
use crate::page_alloc::free_folio;
use crate::pagewalk::follow_page;
use crate::rmap::{self, GUP_PIN_COUNTING_BIAS};
use crate::sparse::page_folio;
use crate::syscall::{mm_id_of, resolve, resolve_range_no_hugetlb};
use crate::vmstat::VmEvent;
use crate::{Machine, Model};
use hugelab_workload::{BackendError, Errno, Range, Stmt};

/// One pinned range: the pages it pinned, and the processes holding its ring.
#[derive(Clone, Debug)]
pub struct Pin {
    pub start: u64,
    pub len: u64,
    pub pages: Vec<Pfn>,
    pub holders: Vec<String>,
}

/// Why a pin failed, as io_uring_register reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinError {
    /// Part of the range is unmapped or not writable.
    Efault,
    Oom,
}

/// pin_user_pages(FOLL_WRITE | FOLL_LONGTERM) over `[start, end)`.
pub fn pin_user_pages(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
) -> Result<Vec<Pfn>, PinError> {
    let mut addr = start;
    while addr < end {
        let vma = mm.find_vma(addr).ok_or(PinError::Efault)?;
        let piece_end = end.min(vma.end);
        // A store of nothing: faults like a write, leaves the data alone.
        let write = Access {
            step: PAGE_SIZE,
            write: true,
            zero: true,
            stores: false,
        };
        access_range(m, mm, &vma, addr, piece_end, write).map_err(|f| match f {
            // vm_fault_to_errno: VM_FAULT_SIGBUS is -EFAULT for GUP.
            Fault::Sigsegv { .. } | Fault::Sigbus { .. } => PinError::Efault,
            Fault::Oom | Fault::OomKilled => PinError::Oom,
        })?;
        addr = piece_end;
    }
    let mut pages = Vec::with_capacity(((end - start) / PAGE_SIZE) as usize);
    let mut addr = start;
    while addr < end {
        let page = follow_page(mm, addr).expect("a page faulted in for writing is mapped");
        try_grab_folio(m, page_folio(m, page), 1);
        pages.push(page);
        addr += PAGE_SIZE;
    }
    mm.has_pinned = true;
    Ok(pages)
}

/// What a populate found in its way (`__get_user_pages` with no pages
/// array: faults only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PopulateError {
    /// No VMA at an address of the range (-ENOMEM).
    NoVma,
    /// A VMA whose protection forbids the access (check_vma_flags: -EINVAL
    /// for FOLL_MADV_POPULATE).
    Permission,
    /// A fault that failed (-EFAULT), or no memory (-ENOMEM).
    Fault(Fault),
}

/// GUP faults, no pages taken, over `[start, end)` of `vma`: a write
/// fault (FOLL_WRITE, which stores nothing: the pages stay zero-filled) or
/// a read fault for every page not mapped so (`faultin_page`); one fault
/// per folio, as a user access, and counted as one (mm_account_fault with
/// regs NULL counts PGFAULT and the task's min_flt, not perf events).
fn faultin_vma_range(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &crate::mm_types::Vma,
    start: u64,
    end: u64,
    write: bool,
) -> Result<(), Fault> {
    let access = Access {
        step: PAGE_SIZE,
        write,
        zero: true,
        stores: false,
    };
    access_range(m, mm, vma, start, end, access)
}

/// faultin_page_range (mm/gup.c) for MADV_POPULATE_READ/WRITE: FOLL_TOUCH |
/// FOLL_MADV_POPULATE (| FOLL_WRITE), VMA by VMA; a hole is -ENOMEM, a VMA
/// without the permission -EINVAL (no FOLL_FORCE), a VM_GROWSDOWN stack is
/// not grown (GUP never expands a stack in 6.18). What was faulted in
/// before the error stays.
pub fn faultin_page_range(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
    write: bool,
) -> Result<(), PopulateError> {
    let mut addr = start;
    while addr < end {
        let vma = mm.find_vma(addr).ok_or(PopulateError::NoVma)?;
        if !vma.gup_allows(write) {
            return Err(PopulateError::Permission);
        }
        let piece_end = end.min(vma.end);
        faultin_vma_range(m, mm, &vma, addr, piece_end, write).map_err(PopulateError::Fault)?;
        addr = piece_end;
    }
    Ok(())
}

/// __mm_populate(start, len, ignore_errors = 1) after an mmap with
/// MAP_POPULATE (mm/gup.c `populate_vma_page_range`): each VMA of the range
/// faulted in for writing when it is writable and private (FOLL_WRITE, to
/// break COW), else for reading (FOLL_FORCE); errors are ignored, the next
/// VMA goes on. The faults count in `proc`'s min_flt.
pub fn mm_populate(m: &mut Machine, id: crate::mm_types::MmId, proc: &str, start: u64, end: u64) {
    let faults_before = m.stat.event(VmEvent::PgFault);
    m.with_mm(id, |m, mm| {
        for vma in mm.vmas_in(start, end) {
            let write = vma.flags & crate::mm_types::Vma::VM_WRITE != 0;
            let (lo, hi) = (start.max(vma.start), end.min(vma.end));
            let _ignored = faultin_vma_range(m, mm, &vma, lo, hi, write);
        }
    });
    let faults = m.stat.event(VmEvent::PgFault) - faults_before;
    m.tasks.get_mut(proc).expect("the mapping task").min_flt += faults;
}

/// try_grab_folio with FOLL_PIN: `refs` pins of one folio.
fn try_grab_folio(m: &mut Machine, folio: Pfn, refs: u32) {
    if m.zone.memmap.page(folio).order() > 0 {
        m.zone.memmap.page_mut(folio).private += refs;
        m.zone.memmap.page_mut(Pfn(folio.0 + 3)).private += refs;
    } else {
        m.zone.memmap.page_mut(folio).private += refs * GUP_PIN_COUNTING_BIAS;
    }
}

/// unpin_user_pages: drops the pins of `pages`, freeing folios whose last
/// reference they were.
pub fn unpin_user_pages(m: &mut Machine, pages: &[Pfn]) {
    for &page in pages {
        let folio = page_folio(m, page);
        let refs = if m.zone.memmap.page(folio).order() > 0 {
            m.zone.memmap.page_mut(Pfn(folio.0 + 3)).private -= 1;
            1
        } else {
            GUP_PIN_COUNTING_BIAS
        };
        if rmap::folio_put_refs(m, folio, refs) {
            free_folio(m, folio);
        }
    }
}

/// The largest io_uring fixed buffer (SZ_1G in io_uring/rsrc.c).
const IO_URING_MAX_BUFFER: u64 = 1 << 30;

/// The `pin` statement: an io_uring fixed buffer over the range
/// (io_uring_register IORING_REGISTER_BUFFERS, `io_sqe_buffer_register`).
pub fn sys_pin(
    model: &mut Model,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
) -> Result<(), BackendError> {
    let m = &mut model.machine;
    let (id, start, end) = resolve_range_no_hugetlb(m, stmt, proc, range)?;
    crate::syscall::refuse_file_range(m, stmt, id, start, end, "pin")?;
    // io_buffer_validate (io_uring/rsrc.c): "arbitrary limit, but we
    // need something".
    if end - start > IO_URING_MAX_BUFFER {
        return Err(BackendError::errno(
            stmt,
            Errno::EFAULT,
            "pin: io_uring refuses a fixed buffer over 1 GiB",
        ));
    }
    let faults_before = m.stat.event(VmEvent::PgFault);
    let pinned = m.with_mm(id, |m, mm| pin_user_pages(m, mm, start, end));
    let pages = pinned.map_err(|e| match e {
        PinError::Efault => BackendError::errno(
            stmt,
            Errno::EFAULT,
            "pin: part of the range is unmapped or not writable",
        ),
        PinError::Oom => BackendError::errno(stmt, Errno::ENOMEM, "pin"),
    })?;
    let faults = m.stat.event(VmEvent::PgFault) - faults_before;
    m.account_min_flt(proc, faults);
    model.pins.push(Pin {
        start,
        len: end - start,
        pages,
        holders: vec![proc.to_string()],
    });
    Ok(())
}

/// The `unpin` statement: unregisters the buffer `pin` registered for
/// exactly this range (IORING_UNREGISTER_BUFFERS).
pub fn sys_unpin(
    model: &mut Model,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
) -> Result<(), BackendError> {
    let m = &model.machine;
    let mm = m.mms.get(mm_id_of(m, stmt, proc)?).expect("a task's mm");
    let (start, end) = resolve(stmt, proc, mm, range)?;
    let found = model.pins.iter().position(|p| {
        p.start == start && p.len == end - start && p.holders.iter().any(|h| h == proc)
    });
    let Some(i) = found else {
        // As the kernel backend's agent answers: no ring holds this range.
        return Err(BackendError::errno(
            stmt,
            Errno::ENOENT,
            format!("unpin: {proc} has no pin of exactly this range"),
        ));
    };
    let pin = model.pins.remove(i);
    unpin_user_pages(&mut model.machine, &pin.pages);
    Ok(())
}

/// At exit the process's ring references go; a ring nobody holds any
/// more releases its pins.
pub fn release_pins(model: &mut Model, proc: &str) {
    let mut i = 0;
    while i < model.pins.len() {
        model.pins[i].holders.retain(|h| h != proc);
        if model.pins[i].holders.is_empty() {
            let pin = model.pins.remove(i);
            unpin_user_pages(&mut model.machine, &pin.pages);
        } else {
            i += 1;
        }
    }
}
