//! `hugelab scan`: the huge pages of running processes — their shape as
//! `tools/mm/thpmaps` reports it ([`shape`]), and what no tool shows: how
//! many subpages of every large folio are zero-filled ([`content`]), which
//! is what the deferred split shrinker's under-used test and its remap to
//! the zero page act on.
//!
//! One pass per VMA, in chunks of 256 MiB of present memory read on every
//! CPU, so memory stays bounded by the chunks and the folio table:
//!
//! 1. `PAGEMAP_SCAN` finds the present ranges, which of them are mapped by
//!    huge PMDs, by the zero page or hold file pages: holes cost nothing, and
//!    the VMA's smaps fields (Rss, Anonymous, AnonHugePages) come from them
//!    (see [`vmas`]);
//! 2. `/proc/PID/pagemap` gives each present page its PFN;
//! 3. `/proc/kpageflags` gives each PTE-mapped page its flags (and the page
//!    after it, for thpmaps's partial-folio rule); a folio mapped whole and
//!    contiguously is resolved from those, others (partial, scattered) from
//!    a read of their whole 2 MiB PFN block;
//! 4. `/proc/PID/mem` reads the anon large-folio pages' content.
//!
//! kpageflags reads 0 for whole 2 MiB PFN blocks on these VMs (see
//! `pagemap.rs`): a PTE-mapped page reading 0 is counted as unclassified,
//! never guessed; a PMD-mapped THP is classified from PAGEMAP_SCAN alone.
//!
//! Needs root (PFNs, kpageflags, another process's mem). Reads only.

pub mod content;
pub mod report;
pub mod shape;
pub mod vmas;

use crate::error::{KernelError, Result};
use crate::pagemap::{block_layout, pread_u64s, PageRegion, Slot, HEAD, TAIL};
use crate::pagemap::{
    no_pfns, pagemap_scan_masked, read_flags, Pagemap, PfnBuild, KPAGEFLAGS, KPF_ANON, KPF_HUGE,
    PAGE_IS_FILE, PAGE_IS_HUGE, PAGE_IS_PFNZERO, PAGE_IS_PRESENT, PM_PFN_MASK, PM_PRESENT,
};
use crate::sysfs;
use content::ContentReader;
use hugelab_workload::units::{Pfn, HPAGE_PMD_NR, PAGE_KB, PAGE_SIZE};
use hugelab_workload::utilization::{
    set_subpage, subpage_words, FolioUse, ShrinkerSettings, HPAGE_PMD_ORDER as PMD_ORDER,
};
use hugelab_workload::{KhugepagedKnob, Tunable};
use serde::Serialize;
use shape::{Shape, ShapeWalker};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use vmas::Vma;

/// Present pages per chunk: 256 MiB.
const CHUNK: u64 = 64 * 1024;
/// Widest hole between present ranges still read through with one pread.
const MAX_HOLE: u64 = 512;

const ANON: u64 = 1 << KPF_ANON;

/// What to scan for.
#[derive(Clone, Debug, Default)]
pub struct ScanOptions {
    /// Read the content of large-folio pages (zero-filled subpages). Off:
    /// the shape only, thpmaps's work.
    pub content: bool,
    /// `--cont` block orders.
    pub cont_orders: Vec<u32>,
    /// Only the VMAs inside `[start, end)` (a workload's region).
    pub range: Option<(u64, u64)>,
    /// Threads reading pagemap, kpageflags and page contents: 0 for one per
    /// CPU (at most 8), the fastest scan; 1 for a scan that never takes more
    /// than one CPU (the exporter's).
    pub threads: usize,
    /// Called on the scanning thread after each wave of chunks (256 MiB of
    /// present memory per thread): where a caller that keeps to a CPU budget
    /// waits, so that a large process is not scanned in one burst.
    pub pace: Option<fn()>,
}

/// The threads a scan with `opts` reads on. Reading pagemap, kpageflags and
/// page contents is the kernel's work, one entry or page at a time (each
/// page copied twice, into a bounce page, then to us): that is the cost of a
/// scan, so by default it is spread over the CPUs.
pub fn scan_threads(opts: &ScanOptions) -> usize {
    match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
        n => n,
    }
}

/// One VMA's figures.
#[derive(Clone, Debug, Serialize)]
pub struct VmaScan {
    #[serde(flatten)]
    pub vma: Vma,
    pub shape: Shape,
    /// Present PTE-mapped pages whose kpageflags read 0: neither THP nor base
    /// page can be told, kB.
    pub unclassified_kb: u64,
    /// The shared zero page and huge zero PMDs mapped here, kB (not in Rss).
    pub zero_page_kb: u64,
}

/// One process.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessScan {
    pub pid: i32,
    pub comm: String,
    pub vmas: Vec<VmaScan>,
    /// Its anon large folios (order ≥ 2) once each, over all its VMAs.
    #[serde(skip)]
    pub folios: Vec<FolioUse>,
    /// Mapped pages of anon large folios, and how many of them were read
    /// (with `content`).
    pub folio_pages: u64,
}

impl ProcessScan {
    /// The shape summed over the VMAs.
    pub fn shape(&self, cont_orders: &[u32]) -> Shape {
        let mut s = Shape::new(cont_orders);
        for v in &self.vmas {
            s.add(&v.shape);
        }
        s
    }
    pub fn unclassified_kb(&self) -> u64 {
        self.vmas.iter().map(|v| v.unclassified_kb).sum()
    }
    pub fn zero_page_kb(&self) -> u64 {
        self.vmas.iter().map(|v| v.zero_page_kb).sum()
    }
}

/// Scans process `pid`.
pub fn scan_process(pid: i32, opts: &ScanOptions) -> Result<ProcessScan> {
    let comm_path = format!("/proc/{pid}/comm");
    let comm = std::fs::read_to_string(&comm_path)
        .map_err(|e| KernelError::io(&comm_path, e))?
        .trim_end()
        .to_string();
    let vmas = vmas::read_vmas(pid)?;
    let mut out = ProcessScan {
        pid,
        comm,
        vmas: Vec::new(),
        folios: Vec::new(),
        folio_pages: 0,
    };
    if vmas.is_empty() {
        // A kernel thread (no mm): nothing to scan, and its mem and
        // pagemap files refuse to open.
        return Ok(out);
    }
    let mut pagemap = Pagemap::open(pid)?;
    let kpf = File::open(KPAGEFLAGS).map_err(|e| KernelError::io(KPAGEFLAGS, e))?;
    let content = if opts.content {
        Some(ContentReader::open(pid, scan_threads(opts))?)
    } else {
        None
    };
    let mut folios: HashMap<u64, FolioUse, PfnBuild> = HashMap::default();
    for mut vma in vmas {
        // [vsyscall] is the gate area, above user space: not the process's
        // memory, and PAGEMAP_SCAN refuses it (EFAULT).
        if !vma.accessible() || vma.hugetlb || vma.name == "[vsyscall]" {
            continue;
        }
        if let Some((lo, hi)) = opts.range {
            if vma.start < lo || vma.end > hi {
                continue;
            }
        }
        // The present ranges and how each is mapped: the VMA's smaps fields
        // and what the walk reads, holes skipped.
        let present = pagemap_scan_masked(
            &pagemap,
            vma.start,
            vma.end,
            0,
            PAGE_IS_PRESENT | PAGE_IS_HUGE | PAGE_IS_PFNZERO | PAGE_IS_FILE,
        )?;
        for r in &present {
            vma.account_present(r.categories, (r.end - r.start) / PAGE_SIZE);
        }
        if vma.rss_kb == 0 {
            continue;
        }
        let mut v = VmaScan {
            shape: Shape::new(&opts.cont_orders),
            vma,
            unclassified_kb: 0,
            zero_page_kb: 0,
        };
        let mut walk = VmaWalk {
            pid,
            pagemap: &mut pagemap,
            kpf: &kpf,
            content: content.as_ref(),
            folios: &mut folios,
            folio_pages: &mut out.folio_pages,
            threads: scan_threads(opts),
            pace: opts.pace,
        };
        walk.vma(&mut v, &present)?;
        v.shape.anon.pmd_kb = v.vma.anon_huge_kb;
        v.shape.file.pmd_kb = v.vma.file_pmd_kb;
        v.shape.anon_total_kb = v.vma.anonymous_kb;
        v.shape.file_total_kb = v.vma.rss_kb.saturating_sub(v.vma.anonymous_kb);
        out.vmas.push(v);
    }
    let mut f: Vec<(u64, FolioUse)> = folios.into_iter().collect();
    f.sort_unstable_by_key(|x| x.0);
    out.folios = f.into_iter().map(|x| with_counts(x.1)).collect();
    Ok(out)
}

/// The walk keeps only the subpage bitmaps; the counts are theirs.
fn with_counts(mut f: FolioUse) -> FolioUse {
    let ones = |bits: &[u64]| bits.iter().map(|w| w.count_ones()).sum();
    f.mapped = ones(&f.mapped_bits);
    f.zero = ones(&f.zero_bits);
    // One process's view: each zero-filled subpage mapped once.
    f.zero_mappings = f.zero;
    f
}

/// Where a present page is mapped from, per PAGEMAP_SCAN.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Map {
    Pte,
    Pmd,
    Zero,
}

struct VmaWalk<'a> {
    pid: i32,
    pagemap: &'a mut Pagemap,
    kpf: &'a File,
    content: Option<&'a ContentReader>,
    folios: &'a mut HashMap<u64, FolioUse, PfnBuild>,
    folio_pages: &'a mut u64,
    threads: usize,
    pace: Option<fn()>,
}

/// A present page of a chunk.
#[derive(Clone, Copy)]
struct Page {
    vfn: u64,
    pfn: Pfn,
    map: Map,
}

impl VmaWalk<'_> {
    fn vma(&mut self, v: &mut VmaScan, present: &[PageRegion]) -> Result<()> {
        let anon_vma = v.vma.private_anon() && !v.vma.hugetlb;
        let mut shape = std::mem::take(&mut v.shape);
        let mut walker = ShapeWalker::new(&mut shape);
        // Chunks of at most CHUNK present pages, cut from the present ranges.
        let mut chunks: Vec<Vec<Piece>> = vec![Vec::new()];
        let mut filled = 0;
        for r in present {
            let mut at = r.start;
            while at < r.end {
                let n = ((r.end - at) / PAGE_SIZE).min(CHUNK - filled);
                chunks.last_mut().unwrap().push(Piece {
                    addr: at,
                    pages: n,
                    map: region_map(r),
                });
                filled += n;
                at += n * PAGE_SIZE;
                if filled == CHUNK {
                    chunks.push(Vec::new());
                    filled = 0;
                }
            }
        }
        // Reading pagemap and kpageflags is the kernel's work, one entry at a
        // time: read a wave of chunks on every CPU, then walk them in order.
        for wave in chunks.chunks(self.threads) {
            let read: Vec<Chunk> = if wave.len() == 1 {
                vec![read_chunk(self.pagemap, self.kpf, &wave[0])?]
            } else {
                let pid = self.pid;
                let kpf = self.kpf;
                std::thread::scope(|sc| {
                    let handles: Vec<_> = wave
                        .iter()
                        .map(|c| {
                            sc.spawn(move || {
                                let mut pm = Pagemap::open(pid)?;
                                read_chunk(&mut pm, kpf, c)
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("a pagemap reader thread panicked"))
                        .collect::<Result<Vec<Chunk>>>()
                })?
            };
            for chunk in read {
                self.walk_chunk(v, &mut walker, anon_vma, chunk)?;
            }
            if let Some(pace) = self.pace {
                pace();
            }
        }
        drop(walker);
        v.shape = shape;
        Ok(())
    }

    /// Classifies one chunk's pages, feeds the shape walker and the folio
    /// table, reading page contents when asked.
    fn walk_chunk(
        &mut self,
        v: &mut VmaScan,
        walker: &mut ShapeWalker<'_>,
        anon_vma: bool,
        chunk: Chunk,
    ) -> Result<()> {
        let Chunk { pages, slot, flags } = chunk;
        let (resolved, layouts) = if anon_vma {
            let resolved = resolve_in_runs(&pages, &slot, &flags);
            let layouts = self.layouts(&pages, &slot, &flags, &resolved)?;
            (resolved, layouts)
        } else {
            (vec![None; pages.len()], HashMap::default())
        };
        // Classify, then read the content of anon large-folio pages.
        let mut keys: Vec<Option<(u64, u8)>> = Vec::with_capacity(pages.len());
        for (i, p) in pages.iter().enumerate() {
            match p.map {
                Map::Zero => {
                    walker.close();
                    keys.push(None);
                    continue;
                }
                Map::Pmd => {
                    walker.close();
                    keys.push(anon_vma.then_some((p.pfn.0 & !(HPAGE_PMD_NR - 1), PMD_ORDER)));
                    continue;
                }
                Map::Pte => {}
            }
            let k = slot[i];
            let f = flags[k];
            // Entry k+1 is the physical page after: either looked up for
            // it, or the next page's own when that follows contiguously.
            let after = flags[k + 1];
            walker.page(p.vfn, p.pfn.0, f, after);
            keys.push(None);
            if f == 0 {
                v.unclassified_kb += PAGE_KB;
            } else if anon_vma
                && f & ANON != 0
                && f & (HEAD | TAIL) != 0
                && f & (1 << KPF_HUGE) == 0
            {
                if let Some(key) = resolved[i] {
                    *keys.last_mut().unwrap() = (key.1 >= 2).then_some(key);
                    continue;
                }
                let block = p.pfn.0 / HPAGE_PMD_NR;
                match layouts[&block][(p.pfn.0 % HPAGE_PMD_NR) as usize] {
                    Slot::Folio { head, order } if order >= 2 => {
                        *keys.last_mut().unwrap() =
                            Some((block * HPAGE_PMD_NR + u64::from(head), order));
                    }
                    Slot::Folio { .. } => {}
                    Slot::Unknown | Slot::Bad { .. } => v.unclassified_kb += PAGE_KB,
                }
            }
        }
        for p in &pages {
            if p.map == Map::Zero {
                v.zero_page_kb += PAGE_KB;
            }
        }
        self.account(&pages, &keys, v.vma.locked)?;
        Ok(())
    }

    /// The folio layout of every 2 MiB PFN block holding a PTE-mapped page
    /// of an anon large folio that the runs did not resolve, one pread of 512
    /// flags each.
    fn layouts(
        &self,
        pages: &[Page],
        slot: &[usize],
        flags: &[u64],
        resolved: &[Option<(u64, u8)>],
    ) -> Result<HashMap<u64, Vec<Slot>, PfnBuild>> {
        let mut out: HashMap<u64, Vec<Slot>, PfnBuild> = HashMap::default();
        let mut buf = vec![0u64; HPAGE_PMD_NR as usize];
        for (i, p) in pages.iter().enumerate() {
            if p.map != Map::Pte {
                continue;
            }
            let f = flags[slot[i]];
            if f & ANON == 0 || f & (HEAD | TAIL) == 0 || resolved[i].is_some() {
                continue;
            }
            let block = p.pfn.0 / HPAGE_PMD_NR;
            if let std::collections::hash_map::Entry::Vacant(e) = out.entry(block) {
                pread_u64s(self.kpf, &mut buf, block * HPAGE_PMD_NR)
                    .map_err(|e| KernelError::io(KPAGEFLAGS, e))?;
                e.insert(block_layout(&buf));
            }
        }
        Ok(out)
    }

    /// Adds the chunk's anon large-folio pages to their folios, their
    /// content read in runs of consecutive addresses.
    fn account(&mut self, pages: &[Page], keys: &[Option<(u64, u8)>], locked: bool) -> Result<()> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if k.is_none() {
                continue;
            }
            match runs.last_mut() {
                Some((_, end)) if *end == i && pages[i].vfn == pages[i - 1].vfn + 1 => *end += 1,
                _ => runs.push((i, i + 1)),
            }
        }
        let total: usize = runs.iter().map(|r| r.1 - r.0).sum();
        let mut zero = vec![false; total];
        if let Some(c) = self.content {
            let addrs: Vec<(u64, usize)> = runs
                .iter()
                .map(|&(i, j)| (pages[i].vfn * PAGE_SIZE, j - i))
                .collect();
            c.zero_pages(&addrs, &mut zero)?;
        }
        // One folio-table update per stretch of pages of the same folio.
        let mut z = 0;
        for &(i, j) in &runs {
            let mut k = i;
            while k < j {
                let key = keys[k];
                let mut m = k + 1;
                while m < j && keys[m] == key {
                    m += 1;
                }
                let (head, order) = key.expect("runs hold folio pages");
                // The bitmaps only: the counts are derived from them once
                // the process is walked (with_counts).
                let f = self.folios.entry(head).or_insert(FolioUse {
                    order,
                    pmd_mapped: pages[k].map == Map::Pmd,
                    locked,
                    pfn: Some(Pfn(head)),
                    mapped_bits: vec![0; subpage_words(order)],
                    zero_bits: vec![0; subpage_words(order)],
                    ..FolioUse::default()
                });
                // Which subpages, by PFN: what a rollup unites a folio that
                // several processes map by, and what tells the subpages no
                // process maps (the folio's extent came from kpageflags).
                for (n, p) in pages[k..m].iter().enumerate() {
                    let index = p.pfn.0.wrapping_sub(head) as usize;
                    if index >> order != 0 || f.mapped_bits[index / 64] & (1 << (index % 64)) != 0 {
                        continue;
                    }
                    set_subpage(&mut f.mapped_bits, index);
                    if zero[z + k - i + n] {
                        set_subpage(&mut f.zero_bits, index);
                    }
                }
                f.locked |= locked;
                k = m;
            }
            z += j - i;
        }
        *self.folio_pages += total as u64;
        Ok(())
    }
}

/// The present pages of a chunk and the kpageflags of the PTE-mapped ones.
struct Chunk {
    pages: Vec<Page>,
    /// Index into `flags` of each PTE-mapped page (`usize::MAX` otherwise);
    /// entry `slot + 1` is always the physical page after it.
    slot: Vec<usize>,
    flags: Vec<u64>,
}

/// A present range, or part of one, and how its pages are mapped.
struct Piece {
    addr: u64,
    pages: u64,
    map: Map,
}

/// Reads a chunk's pieces: pagemap for each page's PFN, kpageflags for the
/// PTE-mapped ones.
fn read_chunk(pagemap: &mut Pagemap, kpf: &File, pieces: &[Piece]) -> Result<Chunk> {
    let mut pages = Vec::new();
    let mut i = 0;
    while i < pieces.len() {
        // One pread for pieces close together: a hole costs 8 bytes of
        // pagemap, a pread far more (sparse memory is many short pieces).
        let span_start = pieces[i].addr;
        let mut j = i + 1;
        while j < pieces.len() {
            let prev_end = pieces[j - 1].addr + pieces[j - 1].pages * PAGE_SIZE;
            // The present ranges are sorted and do not overlap
            // (pagemap_scan_masked), and chunks cut them in order.
            debug_assert!(pieces[j].addr >= prev_end, "pieces out of order");
            let gap = (pieces[j].addr - prev_end) / PAGE_SIZE;
            let span = (pieces[j].addr + pieces[j].pages * PAGE_SIZE - span_start) / PAGE_SIZE;
            if gap > MAX_HOLE || span > CHUNK {
                break;
            }
            j += 1;
        }
        let span_end = pieces[j - 1].addr + pieces[j - 1].pages * PAGE_SIZE;
        let entries = pagemap.read(span_start, ((span_end - span_start) / PAGE_SIZE) as usize)?;
        for piece in &pieces[i..j] {
            let first = ((piece.addr - span_start) / PAGE_SIZE) as usize;
            for (k, &e) in entries[first..first + piece.pages as usize]
                .iter()
                .enumerate()
            {
                // Present a moment ago; gone now if the process unmapped it.
                if e & PM_PRESENT == 0 {
                    continue;
                }
                let pfn = e & PM_PFN_MASK;
                if pfn == 0 && piece.map != Map::Zero {
                    return Err(no_pfns(&pagemap.path));
                }
                pages.push(Page {
                    vfn: piece.addr / PAGE_SIZE + k as u64,
                    pfn: Pfn(pfn),
                    map: piece.map,
                });
            }
        }
        i = j;
    }
    // The flags of each PTE-mapped page, and of the physical page after
    // each that ends a contiguous stretch.
    let mut lookups = Vec::with_capacity(pages.len() + pages.len() / 8);
    let mut slot = Vec::with_capacity(pages.len());
    for (i, p) in pages.iter().enumerate() {
        if p.map != Map::Pte {
            slot.push(usize::MAX);
            continue;
        }
        slot.push(lookups.len());
        lookups.push(p.pfn.0);
        let next_follows = pages
            .get(i + 1)
            .is_some_and(|q| q.map == Map::Pte && q.vfn == p.vfn + 1 && q.pfn.0 == p.pfn.0 + 1);
        if !next_follows {
            lookups.push(p.pfn.0 + 1);
        }
    }
    let flags = read_flags(kpf, &lookups)?;
    Ok(Chunk { pages, slot, flags })
}

/// Head and order of the PTE-mapped pages of folios mapped whole and
/// contiguously (virtual and physical), from the flags already read: a head,
/// then tails, then a physical page that is no tail. Such a run needs no
/// more kpageflags reads; everything else (partial or scattered folios) is
/// left `None` for the block read.
///
/// A 0 after the tails ends the folio: kpageflags reads 0 for whole 2 MiB
/// PFN blocks, and a folio of up to 2 MiB is aligned, so its block is known
/// when its head is. The power-of-two and alignment checks guard the rest.
fn resolve_in_runs(pages: &[Page], slot: &[usize], flags: &[u64]) -> Vec<Option<(u64, u8)>> {
    let mut out = vec![None; pages.len()];
    let mut i = 0;
    while i < pages.len() {
        let p = pages[i];
        if p.map != Map::Pte || flags[slot[i]] & (ANON | HEAD) != (ANON | HEAD) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < pages.len() {
            let q = pages[j];
            let prev = pages[j - 1];
            if q.map != Map::Pte || q.vfn != prev.vfn + 1 || q.pfn.0 != prev.pfn.0 + 1 {
                break;
            }
            if flags[slot[j]] & (HEAD | TAIL) != TAIL {
                break;
            }
            j += 1;
        }
        let nr = (j - i) as u64;
        // Entry slot+1 holds the physical page after the run's last page.
        let after = flags[slot[j - 1] + 1];
        if after & TAIL == 0 && nr.is_power_of_two() && nr >= 2 && p.pfn.0.is_multiple_of(nr) {
            let key = (p.pfn.0, nr.trailing_zeros() as u8);
            out[i..j].fill(Some(key));
        }
        i = j;
    }
    out
}

fn region_map(r: &PageRegion) -> Map {
    if r.categories & PAGE_IS_PFNZERO != 0 {
        Map::Zero
    } else if r.categories & PAGE_IS_HUGE != 0 {
        Map::Pmd
    } else {
        Map::Pte
    }
}

/// The machine's under-used shrinker settings, as a prediction needs them.
pub fn shrinker_settings() -> Result<ShrinkerSettings> {
    let read_num = |t: Tunable| -> Result<u32> {
        let v = sysfs::read_tunable(&t)?;
        v.trim().parse().map_err(|_| {
            KernelError::io(
                sysfs::tunable_file(&t),
                io::Error::new(io::ErrorKind::InvalidData, format!("{v:?} is not a number")),
            )
        })
    };
    // Before Linux 6.12 there is no shrink_underused and no under-used split.
    let shrink_underused = sysfs::tunable_file(&Tunable::ThpShrinkUnderused).exists()
        && read_num(Tunable::ThpShrinkUnderused)? != 0;
    Ok(ShrinkerSettings {
        max_ptes_none: read_num(Tunable::Khugepaged(KhugepagedKnob::MaxPtesNone))?,
        shrink_underused,
    })
}

/// The processes of a cgroup (v1 or v2) and its descendants, as thpmaps
/// `--cgroup` walks them.
pub fn cgroup_pids(dir: &std::path::Path) -> Result<Vec<i32>> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let procs = d.join("cgroup.procs");
        let text = match std::fs::read_to_string(&procs) {
            Ok(text) => text,
            Err(e) if d == dir && e.kind() == io::ErrorKind::NotFound => {
                let why = if dir.is_dir() {
                    "it is a directory without cgroup.procs"
                } else {
                    "there is no such directory"
                };
                return Err(KernelError::Refused(format!(
                    "{} is not a cgroup: {why}; give a cgroup's directory under /sys/fs/cgroup",
                    dir.display()
                )));
            }
            Err(e) => return Err(KernelError::io(&procs, e)),
        };
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        let rd = std::fs::read_dir(&d).map_err(|e| KernelError::io(&d, e))?;
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// Every process of the machine.
pub fn all_pids() -> Result<Vec<i32>> {
    let rd = std::fs::read_dir("/proc").map_err(|e| KernelError::io("/proc", e))?;
    let mut pids: Vec<i32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// True if the kernel refused to let us read the process.
pub fn is_denied(e: &KernelError) -> bool {
    match e {
        KernelError::Io { err, .. } => {
            matches!(err.raw_os_error(), Some(libc::EACCES | libc::EPERM))
        }
        _ => false,
    }
}

/// Whether process `pid` has exited: gone from /proc, or a zombie (`Z`,
/// `X` in /proc/PID/stat), whose maps read empty like a kernel thread's.
pub fn has_exited(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The state follows the command, which is in parentheses and may hold any.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z' | 'X' | 'x'))
}

/// True if the error says the process is gone (it exited mid-scan).
pub fn is_gone(e: &KernelError) -> bool {
    match e {
        KernelError::Io { err, .. } => {
            err.raw_os_error() == Some(libc::ESRCH)
                || err.kind() == io::ErrorKind::NotFound
                || err.to_string().contains("(ESRCH)")
        }
        _ => false,
    }
}
