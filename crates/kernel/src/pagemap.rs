//! Folio shapes of a range of another process, the source of the
//! `folios.<proc>.<region>.<size>[.pmd|.pte]` counters: how many distinct
//! folios of each order map into the range, and of the PMD-sized ones how many
//! by a PMD. Same meaning as the model's `FolioCounts` (model/src/task_mmu.rs).
//!
//! Three kernel interfaces of Linux 6.18 are combined:
//!
//! - `/proc/PID/pagemap` (`fs/proc/task_mmu.c`: `pagemap_read`,
//!   `pagemap_pmd_range`, `pte_to_pagemap_entry`): one u64 per 4 KiB page,
//!   bit 63 present, bits 0-54 the PFN (zero unless the reader has
//!   CAP_SYS_ADMIN). It tells where each page is, not how it is mapped.
//! - the `PAGEMAP_SCAN` ioctl on that file (`do_pagemap_scan`,
//!   `pagemap_page_category`, `pagemap_thp_category`; uapi in
//!   `include/uapi/linux/fs.h`, Linux ≥ 6.7): `PAGE_IS_HUGE` marks ranges
//!   mapped by a huge PMD (THP, hugetlb, the huge zero folio) and never
//!   PTE-mapped mTHP; `PAGE_IS_PFNZERO` marks the shared zero page and the
//!   huge zero PMD. Neither depends on kpageflags.
//! - `/proc/kpageflags` (`fs/proc/page.c`: `kpageflags_read`,
//!   `stable_page_flags`; bits in `include/uapi/linux/kernel-page-flags.h`):
//!   one u64 per PFN; a large folio is a `KPF_COMPOUND_HEAD` page followed by
//!   `KPF_COMPOUND_TAIL` pages, which gives each PTE-mapped page its folio
//!   and order.
//!
//! The kpageflags caveat (../shared/reference/this-machine-live-capabilities.md,
//! caveat 4): on these VMs whole 2 MiB PFN blocks read 0 — no flags at all, not
//! even `KPF_NOPAGE` — including pages that are mapped and in use. 0 therefore
//! means "unknown", never "order-0 page". A folio of order ≤ 9 is naturally
//! aligned and so lies inside one 2 MiB PFN block: its pages are all known or
//! all unknown. PMD-mapped ranges are known to be one order-9 folio per PMD
//! from `PAGE_IS_HUGE` alone; PTE-mapped pages with unknown flags are reported
//! in `unknown_pages` and not guessed from physical contiguity, because order-0
//! pages are often physically contiguous too.

use crate::error::{KernelError, Result};
use hugelab_workload::units::{Pfn, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PAGE_SIZE, PMD_SIZE};
use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

pub const KPAGEFLAGS: &str = "/proc/kpageflags";

/// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
pub(crate) const PM_PRESENT: u64 = 1 << 63;
pub(crate) const PM_PFN_MASK: u64 = (1 << 55) - 1;

/// kpageflags bits (include/uapi/linux/kernel-page-flags.h).
pub const KPF_ANON: u32 = 12;
pub const KPF_COMPOUND_HEAD: u32 = 15;
pub const KPF_COMPOUND_TAIL: u32 = 16;
pub const KPF_HUGE: u32 = 17;
pub const KPF_THP: u32 = 22;
pub const KPF_ZERO_PAGE: u32 = 24;

pub(crate) const HEAD: u64 = 1 << KPF_COMPOUND_HEAD;
pub(crate) const TAIL: u64 = 1 << KPF_COMPOUND_TAIL;
const ZERO: u64 = 1 << KPF_ZERO_PAGE;

/// PAGEMAP_SCAN categories (include/uapi/linux/fs.h).
pub const PAGE_IS_WPALLOWED: u64 = 1 << 0;
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
pub const PAGE_IS_FILE: u64 = 1 << 2;
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
pub const PAGE_IS_SWAPPED: u64 = 1 << 4;
pub const PAGE_IS_PFNZERO: u64 = 1 << 5;
pub const PAGE_IS_HUGE: u64 = 1 << 6;
pub const PAGE_IS_SOFT_DIRTY: u64 = 1 << 7;

/// `struct pm_scan_arg`: twelve __u64, 96 bytes; the kernel refuses any
/// other `size` with EINVAL.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PageRegion {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) categories: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`, spelled out because the libc crate
/// (like the installed linux-libc-dev 6.1) predates it.
const fn iowr(ty: u8, nr: u8, size: usize) -> u64 {
    const IOC_READ_WRITE: u64 = 3;
    (IOC_READ_WRITE << 30) | ((size as u64) << 16) | ((ty as u64) << 8) | nr as u64
}
const PAGEMAP_SCAN: u64 = iowr(b'f', 16, size_of::<PmScanArg>());

const _: () = assert!(size_of::<PmScanArg>() == 96);
const _: () = assert!(size_of::<PageRegion>() == 24);
const _: () = assert!(PAGEMAP_SCAN == 0xc060_6610);

/// Folios mapped in a range, as pagemap + PAGEMAP_SCAN + kpageflags show them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FolioScan {
    /// distinct folios with at least one page mapped in [start,end), by order 0..=9 (index = order)
    pub total: [u64; 10],
    /// of those of order 9, how many are mapped by a PMD (present in the range as a huge PMD)
    pub pmd_mapped: u64,
    /// present pages (not the zero page) whose folio could not be determined because /proc/kpageflags read 0
    pub unknown_pages: u64,
    /// present PTEs mapping the shared zero page, and PMDs mapping the huge zero folio (counts in 4K pages)
    pub zero_pages: u64,
    /// the large folios (order ≥ 2) among `total`, each once, with the
    /// pages of each the range maps, so that scans of several ranges and
    /// processes can be joined (`crate::census`)
    pub large: Vec<LargeFolio>,
    /// the order-0 folios among `total`, each once
    pub small: Vec<Pfn>,
}

/// One large folio seen by [`scan_folios`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LargeFolio {
    pub head: Pfn,
    pub order: u8,
    /// The first address the scan found it at.
    pub addr: u64,
    /// Seen mapped by a huge PMD.
    pub pmd: bool,
    /// Which of its pages are mapped (bit i: the page at head + i).
    pub mapped: PageBits,
}

/// One bit per page of a folio of order ≤ 9.
pub type PageBits = [u64; HPAGE_PMD_NR as usize / 64];

/// Refuses a huge PMD whose PFN is not the head of a 2 MiB folio by its
/// flags `f` and those of the PFN 2 MiB on, `next` (unknown flags pass).
fn pmd_head(e: &Event, f: u64, next: u64) -> Result<()> {
    if f != 0 && (f & HEAD == 0 || next & (HEAD | TAIL) == TAIL) {
        return Err(invalid(
            KPAGEFLAGS,
            format!(
                "the huge PMD at {:#x} maps PFN {:#x} (flags {f:#x}, next 2 MiB {next:#x}), \
                 which is not the head of a 2 MiB folio",
                e.addr, e.pfn.0
            ),
        ));
    }
    Ok(())
}

/// The large folios of a scan, each once (see [`FolioScan::large`]).
#[derive(Default)]
struct LargeFolios {
    index: HashMap<u64, usize, PfnBuild>,
}

impl LargeFolios {
    /// Marks page `pfn` of the folio `head` of `order` mapped at `addr`
    /// (all its pages when `pmd`).
    fn map(&mut self, scan: &mut FolioScan, head: u64, order: u8, addr: u64, pfn: u64, pmd: bool) {
        let i = *self.index.entry(head).or_insert_with(|| {
            scan.large.push(LargeFolio {
                head: Pfn(head),
                order,
                addr,
                pmd: false,
                mapped: [0; HPAGE_PMD_NR as usize / 64],
            });
            scan.large.len() - 1
        });
        let f = &mut scan.large[i];
        if pmd {
            f.pmd = true;
            f.mapped = [u64::MAX; HPAGE_PMD_NR as usize / 64];
        } else {
            let page = (pfn - head) as usize;
            f.mapped[page / 64] |= 1 << (page % 64);
        }
    }
}

impl FolioScan {
    /// Folios of `order` mapped by PTEs only: for order 9 the THPs whose PMD
    /// was split while the folio was not.
    pub fn pte_mapped(&self, order: usize) -> u64 {
        let pmd = if order == HPAGE_PMD_ORDER as usize {
            self.pmd_mapped
        } else {
            0
        };
        self.total[order] - pmd
    }
}

/// The folio shapes of `[start, end)` (page aligned) in process `pid`.
///
/// Needs root: PFNs are hidden without CAP_SYS_ADMIN, and /proc/kpageflags is
/// root-only. The target should be quiescent while it is read (a workload
/// agent between statements); a mapping that changes under the scan gives an
/// error, not a mixture.
pub fn scan_folios(pid: i32, start: u64, end: u64) -> Result<FolioScan> {
    let path = format!("/proc/{pid}/pagemap");
    if (start | end) & (PAGE_SIZE - 1) != 0 || start > end {
        return Err(KernelError::io(
            &path,
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("range {start:#x}-{end:#x} is not a page-aligned range"),
            ),
        ));
    }
    let file = File::open(&path).map_err(|e| KernelError::io(&path, e))?;
    let pagemap = Pagemap {
        file,
        path,
        buf: Vec::new(),
    };
    let special = pagemap_scan(&pagemap, start, end)?;

    let mut scan = FolioScan::default();
    let mut walk = Walk {
        pagemap,
        events: Vec::new(),
    };
    let mut addr = start;
    for r in &special {
        let (lo, hi) = (r.start.max(start), r.end.min(end));
        if lo >= hi {
            continue;
        }
        walk.ptes(addr, lo)?;
        if r.categories & PAGE_IS_PFNZERO != 0 {
            scan.zero_pages += (hi - lo) / PAGE_SIZE;
        } else {
            walk.pmds(lo, hi)?;
        }
        addr = hi;
    }
    walk.ptes(addr, end)?;

    let Walk { pagemap, events } = walk;
    let kpf = File::open(KPAGEFLAGS).map_err(|e| KernelError::io(KPAGEFLAGS, e))?;
    count(&kpf, &events, &mut scan).map_err(|e| match e {
        // The folio layout contradicts itself most likely because the target
        // changed while it was read: say which process.
        KernelError::Io { path, err, .. } if err.kind() == io::ErrorKind::InvalidData => {
            KernelError::io(
                path,
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{err} (while scanning {})", pagemap.path),
                ),
            )
        }
        e => e,
    })?;
    Ok(scan)
}

fn invalid(path: &str, msg: String) -> KernelError {
    KernelError::io(path, io::Error::new(io::ErrorKind::InvalidData, msg))
}

/// The present ranges of `[start, end)` that are PMD-mapped or map a zero
/// page, in address order. Everything else present is an ordinary PTE.
pub(crate) fn pagemap_scan(pagemap: &Pagemap, start: u64, end: u64) -> Result<Vec<PageRegion>> {
    pagemap_scan_masked(
        pagemap,
        start,
        end,
        PAGE_IS_HUGE | PAGE_IS_PFNZERO,
        PAGE_IS_PRESENT | PAGE_IS_HUGE | PAGE_IS_PFNZERO,
    )
}

/// Whether any page of `[start, end)` (page aligned) of process `pid` is
/// mapped or swapped out: one PAGEMAP_SCAN call that stops at the first
/// such page. A range where none is has only pte_none entries (or none
/// at all), so every fault in it allocates a new folio or maps a zero page.
pub fn anything_in(pid: i32, start: u64, end: u64) -> Result<bool> {
    first_of(pid, start, end, PAGE_IS_PRESENT | PAGE_IS_SWAPPED)
}

/// Whether any page of `[start, end)` of process `pid` has one of the
/// PAGEMAP_SCAN `categories`: one call that stops at the first.
fn first_of(pid: i32, start: u64, end: u64, categories: u64) -> Result<bool> {
    let path = format!("/proc/{pid}/pagemap");
    let file = File::open(&path).map_err(|e| KernelError::io(&path, e))?;
    let mut vec = [PageRegion::default(); 1];
    let mut arg = PmScanArg {
        size: size_of::<PmScanArg>() as u64,
        start,
        end,
        vec: vec.as_mut_ptr() as u64,
        vec_len: 1,
        max_pages: 1,
        category_anyof_mask: categories,
        return_mask: categories,
        ..PmScanArg::default()
    };
    // SAFETY: `arg` is a live, correctly sized pm_scan_arg and `vec` has
    // room for the one page_region it asks for.
    let n = unsafe { libc::ioctl(file.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
    if n < 0 {
        return Err(KernelError::io(&path, io::Error::last_os_error()));
    }
    Ok(n > 0)
}

/// Whether any page of `[start, end)` of process `pid` is swapped out.
pub fn swapped_in(pid: i32, start: u64, end: u64) -> Result<bool> {
    first_of(pid, start, end, PAGE_IS_SWAPPED)
}

/// Regions per PAGEMAP_SCAN call: the kernel's bounce buffer
/// (`PAGEMAP_WALK_SIZE >> PAGE_SHIFT`, 512 entries with 4K pages). With a
/// longer vec, a call whose bounce buffer fills once and whose next walk
/// then reaches the end returns every region but the `walk_end` of the
/// fill (fs/proc/task_mmu.c, Linux 6.18: `do_pagemap_scan` sets walk_end
/// only on ENOSPC and never clears it), so the next call reports the
/// regions after it again. With a vec no longer than the bounce buffer, a
/// fill ends the call and walk_end is right.
const SCAN_VEC_LEN: usize = 512;

/// Adds one PAGEMAP_SCAN call's regions to `out`, which stays sorted and
/// non-overlapping: a region that starts before the last one ends is
/// trimmed to start there, or dropped if it ends there too.
fn append_regions(out: &mut Vec<PageRegion>, got: &[PageRegion]) {
    for r in got {
        let mut r = *r;
        if let Some(last) = out.last() {
            if r.end <= last.end {
                continue;
            }
            r.start = r.start.max(last.end);
        }
        out.push(r);
    }
}

/// The present ranges of `[start, end)` that have any of `anyof` (0: all),
/// with the categories of `returned`, in address order and not
/// overlapping; consecutive pages of the same categories form one range
/// (two, where one call's vec filled between them).
pub(crate) fn pagemap_scan_masked(
    pagemap: &Pagemap,
    start: u64,
    end: u64,
    anyof: u64,
    returned: u64,
) -> Result<Vec<PageRegion>> {
    let mut out = Vec::new();
    let mut vec = vec![PageRegion::default(); SCAN_VEC_LEN];
    let mut from = start;
    while from < end {
        let mut arg = PmScanArg {
            size: size_of::<PmScanArg>() as u64,
            start: from,
            end,
            vec: vec.as_mut_ptr() as u64,
            vec_len: vec.len() as u64,
            category_mask: PAGE_IS_PRESENT,
            category_anyof_mask: anyof,
            return_mask: returned,
            ..PmScanArg::default()
        };
        // SAFETY: `arg` is a live, correctly sized pm_scan_arg and `vec`
        // has room for `vec_len` page_regions; the kernel writes nothing else.
        let n = unsafe { libc::ioctl(pagemap.file.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOTTY) {
                return Err(KernelError::Refused(format!(
                    "{}: the PAGEMAP_SCAN ioctl is not supported (it needs Linux 6.7 or later).",
                    pagemap.path
                )));
            }
            return Err(KernelError::io(&pagemap.path, e));
        }
        append_regions(&mut out, &vec[..n as usize]);
        // A full vec stops the walk early at walk_end, after the last
        // region returned: the next call goes on from there.
        if arg.walk_end <= from || arg.walk_end > end {
            return Err(invalid(
                &pagemap.path,
                format!(
                    "PAGEMAP_SCAN from {from:#x} returned walk_end {:#x} (end {end:#x})",
                    arg.walk_end
                ),
            ));
        }
        from = arg.walk_end;
    }
    Ok(out)
}

pub(crate) struct Pagemap {
    file: File,
    pub(crate) path: String,
    buf: Vec<u64>,
}

impl Pagemap {
    pub(crate) fn open(pid: i32) -> Result<Pagemap> {
        let path = format!("/proc/{pid}/pagemap");
        let file = File::open(&path).map_err(|e| KernelError::io(&path, e))?;
        Ok(Pagemap {
            file,
            path,
            buf: Vec::new(),
        })
    }

    /// Reads the entries of `n` pages from `addr` into `buf`. pagemap reads
    /// nothing once the target's mm is gone, so a short read means the
    /// process exited.
    pub(crate) fn read(&mut self, addr: u64, n: usize) -> Result<&[u64]> {
        self.buf.resize(n, 0);
        let got = pread_u64s(&self.file, &mut self.buf, addr / PAGE_SIZE)
            .map_err(|e| KernelError::io(&self.path, e))?;
        if got < n {
            return Err(KernelError::io(
                &self.path,
                io::Error::from_raw_os_error(libc::ESRCH),
            ));
        }
        Ok(&self.buf)
    }
}

/// Reads the u64 entries from entry `index` until `buf` is full or end of
/// file; returns how many were read and zeroes the rest.
pub(crate) fn pread_u64s(file: &File, buf: &mut [u64], index: u64) -> io::Result<usize> {
    // SAFETY: a u64 slice viewed as its bytes: same memory, u8 alignment is
    // weaker, and every byte pattern is a valid u64.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let offset = index * 8;
    let mut done = 0;
    while done < bytes.len() {
        match file.read_at(&mut bytes[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes[done..].fill(0);
    Ok(done / 8)
}

/// A present mapping met while walking the range, in address order, so that
/// a folio met twice is counted as the model counts it: once, the way it
/// was first seen.
#[derive(Clone, Copy)]
struct Event {
    addr: u64,
    /// The PTE's page, or for a PMD the folio's head.
    pfn: Pfn,
    pmd: bool,
}

struct Walk {
    pagemap: Pagemap,
    events: Vec<Event>,
}

/// Pages of pagemap read per pread: 512 KiB.
const PAGEMAP_BATCH: u64 = 64 * 1024;

impl Walk {
    /// Present PTEs of `[lo, hi)`, a part known to hold no huge PMD and no
    /// zero page.
    fn ptes(&mut self, lo: u64, hi: u64) -> Result<()> {
        let mut addr = lo;
        while addr < hi {
            let n = ((hi - addr) / PAGE_SIZE).min(PAGEMAP_BATCH);
            let entries = self.pagemap.read(addr, n as usize)?;
            for (i, &e) in entries.iter().enumerate() {
                if e & PM_PRESENT == 0 {
                    continue;
                }
                let at = addr + i as u64 * PAGE_SIZE;
                let pfn = e & PM_PFN_MASK;
                if pfn == 0 {
                    return Err(no_pfns(&self.pagemap.path));
                }
                self.events.push(Event {
                    addr: at,
                    pfn: Pfn(pfn),
                    pmd: false,
                });
            }
            addr += n * PAGE_SIZE;
        }
        Ok(())
    }

    /// One event per PMD of `[lo, hi)`, a range PAGEMAP_SCAN found mapped by
    /// huge PMDs; `lo` and `hi` may cut a PMD when the range does.
    fn pmds(&mut self, lo: u64, hi: u64) -> Result<()> {
        let mut slot = lo & !(PMD_SIZE - 1);
        while slot < hi {
            let at = slot.max(lo);
            let e = self.pagemap.read(at, 1)?[0];
            let path = &self.pagemap.path;
            if e & PM_PRESENT == 0 {
                return Err(invalid(
                    path,
                    format!("{at:#x} was PMD-mapped for PAGEMAP_SCAN but is not present now"),
                ));
            }
            let pfn = e & PM_PFN_MASK;
            if pfn == 0 {
                return Err(no_pfns(path));
            }
            let head = pfn.wrapping_sub((at - slot) / PAGE_SIZE);
            if head & (HPAGE_PMD_NR - 1) != 0 {
                return Err(invalid(
                    path,
                    format!(
                        "the huge PMD at {slot:#x} maps PFN {head:#x}, which is not 2 MiB aligned"
                    ),
                ));
            }
            self.events.push(Event {
                addr: slot,
                pfn: Pfn(head),
                pmd: true,
            });
            slot += PMD_SIZE;
        }
        Ok(())
    }
}

pub(crate) fn no_pfns(path: &str) -> KernelError {
    KernelError::Refused(format!(
        "{path} shows no page frame numbers: reading them needs CAP_SYS_ADMIN (run as root)."
    ))
}

/// Flags of selected PFN runs of /proc/kpageflags, read with one pread per run.
#[derive(Default)]
pub(crate) struct Flags {
    /// (first pfn, offset into `flags`, length), sorted by pfn, disjoint.
    runs: Vec<(u64, usize, usize)>,
    flags: Vec<u64>,
}

impl Flags {
    /// Reads the runs `(first pfn, length)`, sorted and disjoint. PFNs past
    /// the end of memory read as nothing, that is as 0, like holes do.
    fn read(kpf: &File, runs: &[(u64, usize)]) -> Result<Flags> {
        let total = runs.iter().map(|r| r.1).sum();
        let mut out = Flags {
            runs: Vec::with_capacity(runs.len()),
            flags: vec![0; total],
        };
        let mut off = 0;
        for &(pfn, len) in runs {
            pread_u64s(kpf, &mut out.flags[off..off + len], pfn)
                .map_err(|e| KernelError::io(KPAGEFLAGS, e))?;
            out.runs.push((pfn, off, len));
            off += len;
        }
        Ok(out)
    }

    /// The 512 flags of a PFN block that was read whole.
    fn block(&self, block: u64) -> Option<&[u64]> {
        let pfn = block * HPAGE_PMD_NR;
        let i = self.runs.partition_point(|r| r.0 <= pfn).checked_sub(1)?;
        let (first, off, len) = self.runs[i];
        let k = (pfn - first) as usize;
        (k + HPAGE_PMD_NR as usize <= len)
            .then(|| &self.flags[off + k..off + k + HPAGE_PMD_NR as usize])
    }
}

/// Longest window read with one pread (entries), and the widest gap
/// between wanted PFNs still read through rather than split into two
/// preads: a syscall costs about as much as a few dozen entries.
pub(crate) const MAX_RUN: u64 = 8192;
const MAX_GAP: u64 = 64;

/// Groups consecutive lookups whose PFNs lie close together, in whatever
/// order, into windows `(first lookup, end lookup, lowest pfn, highest pfn)`
/// read with one pread each. Pages faulted one after another mostly come
/// from a few physical runs, so this needs no sort of the PFNs, which would
/// cost more than the reads.
fn windows(lookups: &[u64]) -> Vec<(usize, usize, u64, u64)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lookups.len() {
        let (mut lo, mut hi) = (lookups[i], lookups[i]);
        let mut j = i + 1;
        while j < lookups.len() {
            let p = lookups[j];
            let (nlo, nhi) = (lo.min(p), hi.max(p));
            if nhi - nlo >= MAX_RUN || p + MAX_GAP < lo || p > hi + MAX_GAP {
                break;
            }
            (lo, hi) = (nlo, nhi);
            j += 1;
        }
        out.push((i, j, lo, hi));
        i = j;
    }
    out
}

/// The kpageflags of each PFN of `lookups`, in the same order. PFNs past
/// the end of memory read as nothing, that is as 0, like holes do.
pub(crate) fn read_flags(kpf: &File, lookups: &[u64]) -> Result<Vec<u64>> {
    let mut out = vec![0; lookups.len()];
    let mut buf = Vec::new();
    for (i, j, lo, hi) in windows(lookups) {
        buf.resize((hi - lo + 1) as usize, 0);
        pread_u64s(kpf, &mut buf, lo).map_err(|e| KernelError::io(KPAGEFLAGS, e))?;
        for k in i..j {
            out[k] = buf[(lookups[k] - lo) as usize];
        }
    }
    Ok(out)
}

/// Where a page of a 2 MiB PFN block belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Flags read 0 for it or for part of its folio.
    Unknown,
    /// In the folio whose head is at this index of the block.
    Folio { head: u16, order: u8 },
    /// The flags contradict the folio invariants (power-of-two size, natural
    /// alignment, a tail behind a head); `nr` is what the head's run spans.
    Bad { head: u16, nr: u16 },
}

/// The folios of one 2 MiB PFN block, from its 512 flags, in one pass.
/// A run of tails cut short by a 0 is unknown rather than a smaller folio:
/// the 0s might hide the rest of the tails.
pub(crate) fn block_layout(flags: &[u64]) -> Vec<Slot> {
    let n = flags.len();
    let mut slots = vec![Slot::Unknown; n];
    let mut i = 0;
    while i < n {
        let f = flags[i];
        if f == 0 {
            i += 1;
        } else if f & HEAD != 0 {
            let mut j = i + 1;
            while j < n && flags[j] & (HEAD | TAIL) == TAIL {
                j += 1;
            }
            let nr = j - i;
            let slot = if j < n && flags[j] == 0 {
                Slot::Unknown
            } else if nr >= 2 && nr.is_power_of_two() && i % nr == 0 {
                Slot::Folio {
                    head: i as u16,
                    order: nr.trailing_zeros() as u8,
                }
            } else {
                Slot::Bad {
                    head: i as u16,
                    nr: nr as u16,
                }
            };
            slots[i..j].fill(slot);
            i = j;
        } else if f & TAIL != 0 {
            // No head before it in this block: the head is hidden by a 0, or
            // lies in an earlier block (a folio over 2 MiB, never PTE-mapped
            // on x86).
            slots[i] = if i > 0 && flags[i - 1] == 0 {
                Slot::Unknown
            } else {
                Slot::Bad {
                    head: i as u16,
                    nr: 0,
                }
            };
            i += 1;
        } else {
            slots[i] = Slot::Folio {
                head: i as u16,
                order: 0,
            };
            i += 1;
        }
    }
    slots
}

/// Hashes PFNs by one multiply: they are already well spread integers, and
/// the default SipHash would dominate the time of a 1 GiB scan.
#[derive(Default)]
pub(crate) struct PfnHasher(u64);

impl Hasher for PfnHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(crate) type PfnBuild = BuildHasherDefault<PfnHasher>;

/// The set of folio heads already counted: open addressing on a plain
/// vector, because a 1 GiB range of base pages inserts 262144 of them and
/// the generic HashSet costs several times more, above all in debug builds
/// (the tests).
struct PfnSet {
    slots: Vec<u64>,
    len: usize,
}

impl PfnSet {
    const EMPTY: u64 = u64::MAX;

    fn with_capacity(n: usize) -> PfnSet {
        PfnSet {
            slots: vec![Self::EMPTY; (2 * n).next_power_of_two().max(16)],
            len: 0,
        }
    }

    /// True if `pfn` was not in the set.
    fn insert(&mut self, pfn: u64) -> bool {
        if 2 * (self.len + 1) > self.slots.len() {
            let bigger = vec![Self::EMPTY; 2 * self.slots.len()];
            let old = std::mem::replace(&mut self.slots, bigger);
            self.len = 0;
            for p in old.into_iter().filter(|&p| p != Self::EMPTY) {
                self.insert(p);
            }
        }
        let mask = self.slots.len() - 1;
        let mut i = (pfn.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20) as usize & mask;
        loop {
            let s = self.slots[i];
            if s == pfn {
                return false;
            }
            if s == Self::EMPTY {
                self.slots[i] = pfn;
                self.len += 1;
                return true;
            }
            i = (i + 1) & mask;
        }
    }
}

/// The PFNs whose flags `count` reads first: each event's, and for a PMD
/// also the one just past its 2 MiB.
fn first_lookups(events: &[Event]) -> Vec<u64> {
    let mut lookups: Vec<u64> = Vec::with_capacity(events.len());
    for e in events {
        lookups.push(e.pfn.0);
        if e.pmd {
            lookups.push(e.pfn.0 + HPAGE_PMD_NR);
        }
    }
    lookups
}

/// Resolves each event's folio through /proc/kpageflags and counts them.
fn count(kpf: &File, events: &[Event], scan: &mut FolioScan) -> Result<()> {
    // Pass 1: the flags of every PTE-mapped page, and of each PMD head and
    // the PFN just past its 2 MiB (a tail there would mean a larger folio).
    let flags = read_flags(kpf, &first_lookups(events))?;

    // Pass 2: whole blocks around PTE-mapped pages of large folios, read
    // once per block, since their heads and tails are needed.
    let mut block_index: HashMap<u64, usize, PfnBuild> = HashMap::default();
    let mut blocks: Vec<u64> = Vec::new();
    let mut last_block = u64::MAX;
    let mut k = 0;
    for e in events {
        let f = flags[k];
        k += 1 + usize::from(e.pmd);
        let block = e.pfn.0 / HPAGE_PMD_NR;
        if !e.pmd && f & (HEAD | TAIL) != 0 && block != last_block {
            last_block = block;
            block_index.entry(block).or_insert_with(|| {
                blocks.push(block);
                blocks.len() - 1
            });
        }
    }
    let mut sorted = blocks.clone();
    sorted.sort_unstable();
    let mut block_runs: Vec<(u64, usize)> = Vec::new();
    for &b in &sorted {
        let pfn = b * HPAGE_PMD_NR;
        match block_runs.last_mut() {
            Some((first, len)) if *first + *len as u64 == pfn && (*len as u64) < MAX_RUN * 8 => {
                *len += HPAGE_PMD_NR as usize;
            }
            _ => block_runs.push((pfn, HPAGE_PMD_NR as usize)),
        }
    }
    let whole = Flags::read(kpf, &block_runs)?;
    let layouts: Vec<Vec<Slot>> = blocks
        .iter()
        .map(|&b| block_layout(whole.block(b).expect("every large-folio block was read")))
        .collect();

    let mut seen = PfnSet::with_capacity(events.len());
    let mut large = LargeFolios::default();
    let mut last = (u64::MAX, 0);
    let mut k = 0;
    for e in events {
        let f = flags[k];
        k += 1;
        if e.pmd {
            let next = flags[k];
            k += 1;
            pmd_head(e, f, next)?;
            if seen.insert(e.pfn.0) {
                scan.total[HPAGE_PMD_ORDER as usize] += 1;
                scan.pmd_mapped += 1;
            }
            let (pfn, order) = (e.pfn.0, HPAGE_PMD_ORDER as u8);
            large.map(scan, pfn, order, e.addr, pfn, true);
            continue;
        }
        if f == 0 {
            scan.unknown_pages += 1;
            continue;
        }
        if f & ZERO != 0 {
            // PAGEMAP_SCAN did not call it PFNZERO, yet the page is the zero
            // page: both are the kernel's word, and a zero page is no folio.
            scan.zero_pages += 1;
            continue;
        }
        let (head, order) = if f & (HEAD | TAIL) == 0 {
            (e.pfn.0, 0)
        } else {
            let block = e.pfn.0 / HPAGE_PMD_NR;
            if last.0 != block {
                last = (block, block_index[&block]);
            }
            match layouts[last.1][(e.pfn.0 % HPAGE_PMD_NR) as usize] {
                Slot::Unknown => {
                    scan.unknown_pages += 1;
                    continue;
                }
                Slot::Folio { head, order } => (block * HPAGE_PMD_NR + u64::from(head), order),
                Slot::Bad { head, nr } => {
                    let head = block * HPAGE_PMD_NR + u64::from(head);
                    return Err(invalid(
                        KPAGEFLAGS,
                        if nr == 0 {
                            format!(
                                "PFN {:#x} (mapped at {:#x}) is a compound tail with no head \
                                 in its 2 MiB block",
                                e.pfn.0, e.addr
                            )
                        } else {
                            format!(
                                "PFN {:#x} (mapped at {:#x}) is in a compound page of {nr} pages \
                                 headed at PFN {head:#x}: not a naturally aligned power of two",
                                e.pfn.0, e.addr
                            )
                        },
                    ));
                }
            }
        };
        if seen.insert(head) {
            scan.total[order as usize] += 1;
            if order == 0 {
                scan.small.push(Pfn(head));
            }
        }
        if order >= 2 {
            large.map(scan, head, order, e.addr, e.pfn.0, false);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(start: u64, end: u64) -> PageRegion {
        PageRegion {
            start,
            end,
            categories: PAGE_IS_PRESENT,
        }
    }

    #[test]
    fn regions_reported_again_are_trimmed_or_dropped() {
        let mut out = vec![region(0, 4)];
        append_regions(&mut out, &[region(2, 3), region(3, 6), region(8, 9)]);
        assert_eq!(out, vec![region(0, 4), region(4, 6), region(8, 9)]);
    }

    /// 600 present pages, every other one of 1200: 600 regions, more than
    /// the kernel's bounce buffer holds. With a 1024-region vec the kernel
    /// returned all 600 with the walk_end of its first bounce-buffer fill
    /// (page 1024), and the next call reported the 88 after it again.
    #[test]
    fn a_scan_past_the_bounce_buffer_reports_each_region_once() {
        const PAGES: u64 = 1200;
        let len = (PAGES * PAGE_SIZE) as usize;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the range is the mapping just made.
        unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        let base = p as u64;
        for i in (0..PAGES).step_by(2) {
            // SAFETY: inside the mapping.
            unsafe { *((base + i * PAGE_SIZE) as *mut u8) = 1 };
        }
        let pagemap = Pagemap::open(std::process::id() as i32).unwrap();
        let got = pagemap_scan_masked(&pagemap, base, base + len as u64, 0, PAGE_IS_PRESENT);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(p, len) };
        let got = got.unwrap();
        assert_eq!(got.len() as u64, PAGES / 2);
        assert!(got.windows(2).all(|w| w[0].end < w[1].start));
        assert!(got.iter().enumerate().all(
            |(i, r)| r.start == base + 2 * i as u64 * PAGE_SIZE && r.end == r.start + PAGE_SIZE
        ));
    }

    fn block(parts: &[(u64, usize)]) -> Vec<u64> {
        let mut v = Vec::new();
        for &(f, n) in parts {
            v.resize(v.len() + n, f);
        }
        assert_eq!(v.len(), 512);
        v
    }

    const THP: u64 = 1 << KPF_THP;
    const ANON: u64 = 1 << KPF_ANON;

    #[test]
    fn pmd_sized_folio() {
        let f = block(&[(HEAD | THP, 1), (TAIL | THP, 511)]);
        let s = block_layout(&f);
        assert!(s.iter().all(|s| *s == Slot::Folio { head: 0, order: 9 }));
    }

    #[test]
    fn mthp_and_order0() {
        let f = block(&[
            (HEAD | THP, 1),
            (TAIL | THP, 15),
            (ANON, 16),
            (HEAD | THP, 1),
            (TAIL | THP, 15),
            (ANON, 464),
        ]);
        let s = block_layout(&f);
        assert_eq!(s[5], Slot::Folio { head: 0, order: 4 });
        assert_eq!(s[16], Slot::Folio { head: 16, order: 0 });
        assert_eq!(s[40], Slot::Folio { head: 32, order: 4 });
    }

    #[test]
    fn zeros_make_folios_unknown_not_smaller() {
        let f = block(&[(HEAD | THP, 1), (TAIL | THP, 255), (0, 256)]);
        let s = block_layout(&f);
        assert_eq!(s[10], Slot::Unknown);
        assert_eq!(s[300], Slot::Unknown);
    }

    #[test]
    fn misshapen_compound_is_bad() {
        let f = block(&[(HEAD | THP, 1), (TAIL | THP, 2), (ANON, 509)]);
        assert_eq!(block_layout(&f)[1], Slot::Bad { head: 0, nr: 3 });
        let f = block(&[(TAIL | THP, 4), (ANON, 508)]);
        assert_eq!(block_layout(&f)[0], Slot::Bad { head: 0, nr: 0 });
    }

    #[test]
    fn windows_group_near_pfns_in_any_order() {
        assert_eq!(
            windows(&[5, 3, 4, 60, 1000, 999, 5]),
            vec![(0, 4, 3, 60), (4, 6, 999, 1000), (6, 7, 5, 5)]
        );
        assert_eq!(windows(&[]), vec![]);
    }

    #[test]
    fn pfn_set_grows_and_dedups() {
        let mut set = PfnSet::with_capacity(1);
        for p in 0..1000 {
            assert!(set.insert(p * 512));
        }
        assert!(!set.insert(512));
        assert!(set.insert(1));
        assert_eq!(set.len, 1001);
    }

    /// A sparse stand-in for /proc/kpageflags holding `(pfn, flags)`.
    fn fake_kpageflags(name: &str, pages: &[(u64, u64)]) -> File {
        let path = std::env::temp_dir().join(format!("hugelab-kpf-{}-{name}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        for &(pfn, f) in pages {
            file.write_all_at(&f.to_ne_bytes(), pfn * 8).unwrap();
        }
        file
    }

    /// The page bits of `pages`.
    fn bits(pages: std::ops::Range<usize>) -> PageBits {
        let mut b = PageBits::default();
        for p in pages {
            b[p / 64] |= 1 << (p % 64);
        }
        b
    }

    fn pte(pfn: u64) -> Event {
        Event {
            addr: pfn << 12,
            pfn: Pfn(pfn),
            pmd: false,
        }
    }

    #[test]
    fn count_resolves_folios_and_keeps_zeros_unknown() {
        let mut pages = vec![(0x1000, HEAD | THP)];
        pages.extend((0x1001..0x1200).map(|p| (p, TAIL | THP)));
        pages.push((0x4000, ANON));
        pages.push((0x5010, HEAD | THP));
        pages.extend((0x5011..0x5020).map(|p| (p, TAIL | THP)));
        pages.push((0x5020, ANON));
        pages.push((0x6000, ZERO));
        let kpf = fake_kpageflags("count", &pages);
        let mut events: Vec<Event> = (0x1001..0x1010).map(pte).collect();
        // Block 0x2000 reads 0 throughout, like the VMs' uninitialised blocks.
        events.extend((0x2000..0x2004).map(pte));
        // A PMD-mapped THP whose block reads 0 is still one order-9 folio.
        events.push(Event {
            addr: 0x3000 << 12,
            pfn: Pfn(0x3000),
            pmd: true,
        });
        // An order-0 page mapped twice (KSM) is one folio.
        events.extend([
            pte(0x4000),
            pte(0x4000),
            pte(0x5012),
            pte(0x5013),
            pte(0x6000),
        ]);
        let mut scan = FolioScan::default();
        count(&kpf, &events, &mut scan).unwrap();
        let mut total = [0; 10];
        total[0] = 1;
        total[4] = 1;
        total[9] = 2;
        assert_eq!(
            scan,
            FolioScan {
                total,
                pmd_mapped: 1,
                unknown_pages: 4,
                zero_pages: 1,
                // Each large folio once, where first seen, in scan order,
                // with the pages mapped.
                large: vec![
                    LargeFolio {
                        head: Pfn(0x1000),
                        order: 9,
                        addr: 0x1001 << 12,
                        pmd: false,
                        mapped: bits(1..0x10),
                    },
                    LargeFolio {
                        head: Pfn(0x3000),
                        order: 9,
                        addr: 0x3000 << 12,
                        pmd: true,
                        mapped: bits(0..512),
                    },
                    LargeFolio {
                        head: Pfn(0x5010),
                        order: 4,
                        addr: 0x5012 << 12,
                        pmd: false,
                        mapped: bits(2..4),
                    },
                ],
                small: vec![Pfn(0x4000)],
            }
        );
        assert_eq!(scan.pte_mapped(9), 1);
    }

    #[test]
    fn count_refuses_a_pmd_on_a_non_head() {
        let kpf = fake_kpageflags("pmd", &[(0x3000, ANON)]);
        let events = [Event {
            addr: 0x7f00_0000_0000,
            pfn: Pfn(0x3000),
            pmd: true,
        }];
        let e = count(&kpf, &events, &mut FolioScan::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(KPAGEFLAGS) && e.contains("not the head"),
            "{e}"
        );
    }

    #[test]
    fn nonexistent_process_names_the_path() {
        let e = scan_folios(i32::MAX, 0, 4096).unwrap_err().to_string();
        assert!(e.contains(&format!("/proc/{}/pagemap", i32::MAX)), "{e}");
        assert!(e.contains("ENOENT"), "{e}");
    }
}
