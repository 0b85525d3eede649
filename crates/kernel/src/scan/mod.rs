//! `hugelab scan`: the huge pages of running processes — their shape as
//! `tools/mm/thpmaps` reports it ([`shape`]), and what no tool shows: how
//! many subpages of every large folio are zero-filled ([`content`]), which
//! is what the under-used THP shrinker acts on.
//!
//! One pass per VMA, in chunks of 256 MiB of address space, so memory stays
//! bounded by the chunk and the folio table:
//!
//! 1. `PAGEMAP_SCAN` finds the ranges mapped by huge PMDs and the zero page;
//! 2. `/proc/PID/pagemap` gives each present page its PFN;
//! 3. `/proc/kpageflags` gives each PTE-mapped page its flags (and the page
//!    after it, for thpmaps's partial-folio rule), and, for pages of anon
//!    large folios, the whole 2 MiB PFN block so head and order are known;
//! 4. `/proc/PID/mem` reads the anon large-folio pages' content.
//!
//! kpageflags reads 0 for whole 2 MiB PFN blocks on these VMs (see
//! `pagemap.rs`): a PTE-mapped page reading 0 is counted as unclassified,
//! never guessed; a PMD-mapped THP is classified from PAGEMAP_SCAN alone.
//!
//! Needs root (PFNs, kpageflags, another process's mem). Reads only.

pub mod content;
pub mod shape;
pub mod vmas;

use crate::error::{KernelError, Result};
use crate::pagemap::{block_layout, pread_u64s, PageRegion, Slot};
use crate::pagemap::{
    no_pfns, pagemap_scan, read_flags, Pagemap, PfnBuild, KPAGEFLAGS, KPF_ANON, KPF_COMPOUND_HEAD,
    KPF_COMPOUND_TAIL, KPF_HUGE, PAGE_IS_HUGE, PAGE_IS_PFNZERO, PM_PFN_MASK, PM_PRESENT,
};
use crate::sysfs;
use content::ContentReader;
use hugelab_workload::units::{PAGE_SHIFT, PAGE_SIZE, PMD_SHIFT};
use hugelab_workload::utilization::{FolioUse, ShrinkerSettings};
use hugelab_workload::{KhugepagedKnob, Tunable};
use serde::Serialize;
use shape::{Shape, ShapeWalker};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use vmas::Vma;

const HPAGE_PMD_NR: u64 = 1 << (PMD_SHIFT - PAGE_SHIFT);
const PAGE_KB: u64 = PAGE_SIZE / 1024;
/// Pages of address space per chunk: 256 MiB.
const CHUNK: u64 = 64 * 1024;

const HEAD: u64 = 1 << KPF_COMPOUND_HEAD;
const TAIL: u64 = 1 << KPF_COMPOUND_TAIL;
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
        Some(ContentReader::open(pid)?)
    } else {
        None
    };
    let mut folios: HashMap<u64, FolioUse, PfnBuild> = HashMap::default();
    for vma in vmas {
        if !vma.accessible() || vma.rss_kb == 0 {
            continue;
        }
        if let Some((lo, hi)) = opts.range {
            if vma.start < lo || vma.end > hi {
                continue;
            }
        }
        let mut v = VmaScan {
            shape: Shape::new(&opts.cont_orders),
            vma,
            unclassified_kb: 0,
            zero_page_kb: 0,
        };
        let mut walk = VmaWalk {
            pagemap: &mut pagemap,
            kpf: &kpf,
            content: content.as_ref(),
            folios: &mut folios,
            folio_pages: &mut out.folio_pages,
        };
        walk.vma(&mut v)?;
        v.shape.anon.pmd_kb = v.vma.anon_huge_kb;
        v.shape.file.pmd_kb = v.vma.shmem_pmd_kb + v.vma.file_pmd_kb;
        v.shape.anon_total_kb = v.vma.anonymous_kb;
        v.shape.file_total_kb = v.vma.rss_kb.saturating_sub(v.vma.anonymous_kb);
        out.vmas.push(v);
    }
    let mut f: Vec<(u64, FolioUse)> = folios.into_iter().collect();
    f.sort_unstable_by_key(|x| x.0);
    out.folios = f.into_iter().map(|x| x.1).collect();
    Ok(out)
}

/// Where a present page is mapped from, per PAGEMAP_SCAN.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Map {
    Pte,
    Pmd,
    Zero,
}

struct VmaWalk<'a> {
    pagemap: &'a mut Pagemap,
    kpf: &'a File,
    content: Option<&'a ContentReader>,
    folios: &'a mut HashMap<u64, FolioUse, PfnBuild>,
    folio_pages: &'a mut u64,
}

/// A present page of a chunk.
#[derive(Clone, Copy)]
struct Page {
    vfn: u64,
    pfn: u64,
    map: Map,
}

impl VmaWalk<'_> {
    fn vma(&mut self, v: &mut VmaScan) -> Result<()> {
        let (start, end) = (v.vma.start, v.vma.end);
        let special = pagemap_scan(self.pagemap, start, end)?;
        let anon_vma = v.vma.private_anon() && !v.vma.hugetlb;
        let mut walker = ShapeWalker::new(&mut v.shape);
        let mut si = 0;
        let mut addr = start;
        while addr < end {
            let n = ((end - addr) / PAGE_SIZE).min(CHUNK);
            let chunk_end = addr + n * PAGE_SIZE;
            // 1-2: the present pages of the chunk and how each is mapped.
            let mut pages = Vec::new();
            {
                let entries = self.pagemap.read(addr, n as usize)?;
                for (i, &e) in entries.iter().enumerate() {
                    if e & PM_PRESENT == 0 {
                        continue;
                    }
                    let at = addr + i as u64 * PAGE_SIZE;
                    while si < special.len() && special[si].end <= at {
                        si += 1;
                    }
                    let map = match special.get(si) {
                        Some(r) if r.start <= at => region_map(r),
                        _ => Map::Pte,
                    };
                    let pfn = e & PM_PFN_MASK;
                    if pfn == 0 && map != Map::Zero {
                        return Err(no_pfns(&self.pagemap.path));
                    }
                    pages.push(Page {
                        vfn: at / PAGE_SIZE,
                        pfn,
                        map,
                    });
                }
            }
            // 3: the flags of each PTE-mapped page, and of the physical page
            // after each that ends a contiguous stretch.
            let mut lookups = Vec::with_capacity(pages.len() + pages.len() / 8);
            let mut slot = Vec::with_capacity(pages.len());
            for (i, p) in pages.iter().enumerate() {
                if p.map != Map::Pte {
                    slot.push(usize::MAX);
                    continue;
                }
                slot.push(lookups.len());
                lookups.push(p.pfn);
                let next_follows = pages
                    .get(i + 1)
                    .is_some_and(|q| q.map == Map::Pte && q.vfn == p.vfn + 1 && q.pfn == p.pfn + 1);
                if !next_follows {
                    lookups.push(p.pfn + 1);
                }
            }
            let flags = read_flags(self.kpf, &lookups)?;
            let layouts = if anon_vma {
                self.layouts(&pages, &slot, &flags)?
            } else {
                HashMap::default()
            };
            // 4: classify, then read the content of anon large-folio pages.
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
                        keys.push(anon_vma.then_some((p.pfn & !(HPAGE_PMD_NR - 1), 9)));
                        continue;
                    }
                    Map::Pte => {}
                }
                let k = slot[i];
                let f = flags[k];
                // Entry k+1 is the physical page after: either looked up for
                // it, or the next page's own when that follows contiguously.
                let after = flags[k + 1];
                walker.page(p.vfn, p.pfn, f, after);
                keys.push(None);
                if f == 0 {
                    v.unclassified_kb += PAGE_KB;
                } else if anon_vma
                    && f & ANON != 0
                    && f & (HEAD | TAIL) != 0
                    && f & (1 << KPF_HUGE) == 0
                {
                    let block = p.pfn / HPAGE_PMD_NR;
                    match layouts[&block][(p.pfn % HPAGE_PMD_NR) as usize] {
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
            addr = chunk_end;
        }
        walker.close();
        Ok(())
    }

    /// The folio layout of every 2 MiB PFN block holding a PTE-mapped page
    /// of an anon large folio in this chunk, one pread of 512 flags each.
    fn layouts(
        &self,
        pages: &[Page],
        slot: &[usize],
        flags: &[u64],
    ) -> Result<HashMap<u64, Vec<Slot>, PfnBuild>> {
        let mut out: HashMap<u64, Vec<Slot>, PfnBuild> = HashMap::default();
        let mut buf = vec![0u64; HPAGE_PMD_NR as usize];
        for (i, p) in pages.iter().enumerate() {
            if p.map != Map::Pte {
                continue;
            }
            let f = flags[slot[i]];
            if f & ANON == 0 || f & (HEAD | TAIL) == 0 {
                continue;
            }
            let block = p.pfn / HPAGE_PMD_NR;
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
                let f = self.folios.entry(head).or_insert(FolioUse {
                    order,
                    mapped: 0,
                    zero: 0,
                    pmd_mapped: pages[k].map == Map::Pmd,
                    locked,
                    cause: None,
                    never_written: None,
                    queued: None,
                });
                f.mapped += (m - k) as u32;
                f.zero += zero[z + k - i..z + m - i].iter().filter(|&&b| b).count() as u32;
                f.locked |= locked;
                k = m;
            }
            z += j - i;
        }
        *self.folio_pages += total as u64;
        Ok(())
    }
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
        let text = std::fs::read_to_string(&procs).map_err(|e| KernelError::io(&procs, e))?;
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
        KernelError::Io { source, .. } => {
            matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM))
        }
        _ => false,
    }
}

/// True if the error says the process is gone (it exited mid-scan).
pub fn is_gone(e: &KernelError) -> bool {
    match e {
        KernelError::Io { source, .. } => {
            source.raw_os_error() == Some(libc::ESRCH)
                || source.kind() == io::ErrorKind::NotFound
                || source.to_string().contains("(ESRCH)")
        }
        _ => false,
    }
}
