//! The memory a workload can need at most, from its statements alone,
//! before anything runs: what `run`, `diff` and `utilization` on the
//! kernel check against MemAvailable, and the memory limit of the cgroup
//! the workload's processes run in.
//!
//! **Design: a first pass over the file.** A workload is run as a stream
//! (a statement runs as soon as it is read), so the bound cannot be
//! maintained beside the run and still refuse before anything changes: a
//! statement late in a recording would be refused after tunables were set
//! and half the workload ran. Files can be read twice, so [`of_file`]
//! reads the whole file first (streamed, with the memory of its live
//! regions only, so a recording of millions of lines costs a pass of
//! parsing and no more), and the run reads it again. A workload that can
//! be read once only (a pipe) has no bound: the caller says so and takes
//! its limit from MemAvailable alone.
//!
//! **What is counted** (each figure a bound, loose where exactness would
//! need the kernel's state; a workload that stays inside it is never
//! refused):
//! - a region's memory is at most its extent: the largest size it ever had
//!   (`mmap` size, `brk` and `mremap` growth). A `munmap` of the whole
//!   region frees it; a partial one frees nothing (a THP across the cut
//!   stays whole on the deferred split queue until split);
//! - `fork` doubles the parent's private memory at most (each page can be
//!   copied on write): the child's regions are counted again; `shared`
//!   regions are one object, counted once while any process maps it;
//! - a file region (`file=`) adds the file's page cache (up to the largest
//!   end any mapping of it had, kept for the whole run: the file outlives
//!   its mappings) to the private copies of the region;
//! - `pin` keeps its pages after a `munmap` until `unpin`: pinned bytes
//!   are counted beside the regions while pinned;
//! - `exit` and `exec` free every region of the process;
//! - HugeTLB regions take their pages from the pools, so they are not
//!   counted as regions: the pools are, as the largest total
//!   `nr_hugepages` + `nr_overcommit_hugepages` (× page size) the
//!   workload's `set`s ever ask for together (`vm.nr_hugepages` is the
//!   2048 kB pool). Pools the machine already has are already out of
//!   MemAvailable;
//! - the regions' peak and the pools' peak are added, even if they are
//!   not reached at the same time.
//!
//! Not counted here but in the margin the kernel backend adds
//! ([`Bound::margin`]): page tables (a 4 kB table maps 2 MiB: 1/512 of a
//! region), the agents' own memory, a collapse's new THP beside the pages
//! it replaces.

use crate::ast::{Range, SetValue, Tunable, VmSysctl};
use crate::parse::{stream_file, ParseError};
use crate::stmt::{Stmt, StmtKind};
use std::collections::BTreeMap;
use std::path::Path;

/// The memory a workload can need at most (see the module doc), bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bound {
    /// The largest total of its regions (anonymous, shared, page cache,
    /// pinned) at any point.
    pub regions: u64,
    /// The largest total of the HugeTLB pools it sets.
    pub pools: u64,
    /// The largest number of its processes alive at once.
    pub processes: u64,
}

impl Bound {
    /// Everything: regions and pools.
    pub fn total(&self) -> u64 {
        self.regions.saturating_add(self.pools)
    }

    /// What a memory cgroup around the workload must allow beyond its
    /// regions: page tables (1/256 of the regions, twice what 4 kB tables
    /// mapping every page take), 32 MiB per process (an agent's own memory
    /// it touches or copies once in the group), and 64 MiB more.
    pub fn margin(&self) -> u64 {
        (64 << 20) + self.processes.saturating_mul(32 << 20) + self.regions / 256
    }
}

/// How a region holds memory.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Private: its own pages (anonymous or copies of a file's).
    Private,
    /// `shared`: one object for every process that maps it.
    Shared(u64),
    /// `hugetlb=`: pages from the pools.
    Hugetlb,
}

#[derive(Clone, Copy, Debug)]
struct Region {
    extent: u64,
    kind: Kind,
}

/// The bound as statements arrive ([`Tracker::step`]), for [`of_file`]
/// and [`of_stmts`].
#[derive(Default)]
pub struct Tracker {
    procs: BTreeMap<String, BTreeMap<String, Region>>,
    /// The process of each thread.
    thread_of: BTreeMap<String, String>,
    /// Shared objects: (extent, how many regions map it).
    shared: BTreeMap<u64, (u64, u64)>,
    next_shared: u64,
    /// Each file's largest mapped end.
    files: BTreeMap<String, u64>,
    pinned: u64,
    /// (nr_hugepages, nr_overcommit_hugepages) by page size in kB.
    pools: BTreeMap<u64, (u64, u64)>,
    bound: Bound,
}

impl Tracker {
    /// The bound so far.
    pub fn bound(&self) -> Bound {
        self.bound
    }

    /// Takes one statement into the bound.
    pub fn step(&mut self, stmt: &Stmt) {
        self.apply(&stmt.kind);
        self.update();
    }

    fn apply(&mut self, kind: &StmtKind) {
        match kind {
            StmtKind::Set(s) => self.set(&s.tunable, &s.value),
            StmtKind::Spawn(s) => {
                self.procs.insert(s.proc.clone(), BTreeMap::new());
            }
            StmtKind::Mmap(s) => {
                let kind = match (s.hugetlb, s.shared) {
                    (Some(_), _) => Kind::Hugetlb,
                    (None, true) => {
                        self.next_shared += 1;
                        self.shared.insert(self.next_shared, (s.size.bytes(), 1));
                        Kind::Shared(self.next_shared)
                    }
                    (None, false) => Kind::Private,
                };
                if let Some(file) = &s.file {
                    let end = s.offset.map_or(0, |o| o.bytes()) + s.size.bytes();
                    let f = self.files.entry(file.clone()).or_default();
                    *f = (*f).max(end);
                }
                let extent = s.size.bytes();
                self.insert(&s.proc, &s.region, Region { extent, kind });
            }
            StmtKind::Brk(s) => self.grow(&s.proc, &s.region, s.size.bytes(), true),
            StmtKind::Mremap(s) => {
                let old = self.range_len(&s.proc, &s.range);
                let growth = s.new_size.bytes().saturating_sub(old);
                self.grow(&s.proc, &s.range.region, growth, false);
            }
            StmtKind::Munmap(s) => {
                if self.whole(&s.proc, &s.range) {
                    self.remove(&s.proc, &s.range.region);
                }
            }
            StmtKind::Pin(s) => self.pinned += self.range_len(&s.proc, &s.range),
            StmtKind::Unpin(s) => {
                let len = self.range_len(&s.proc, &s.range);
                self.pinned = self.pinned.saturating_sub(len);
            }
            StmtKind::Fork(s) => self.fork(&s.proc, &s.child),
            StmtKind::Thread(s) => {
                let proc = self.process_of(&s.proc).to_string();
                self.thread_of.insert(s.thread.clone(), proc);
            }
            StmtKind::Exit(s) => self.exit(&s.proc),
            StmtKind::Exec(s) => {
                let proc = self.process_of(&s.proc).to_string();
                self.clear(&proc);
                self.thread_of.retain(|_, p| *p != proc);
            }
            StmtKind::Machine(_)
            | StmtKind::Cgroup(_)
            | StmtKind::Mprotect(_)
            | StmtKind::Madvise(_)
            | StmtKind::Read(_)
            | StmtKind::Write(_)
            | StmtKind::Special(_)
            | StmtKind::ThpDisable(_)
            | StmtKind::Split(_)
            | StmtKind::Khugepaged
            | StmtKind::Reclaim
            | StmtKind::Fragment(_)
            | StmtKind::Sleep(_)
            | StmtKind::Snapshot(_)
            | StmtKind::Expect(_)
            | StmtKind::ExpectErrno(_)
            | StmtKind::ExpectSignal(_) => {}
        }
    }

    fn set(&mut self, t: &Tunable, value: &SetValue) {
        let SetValue::Num(n) = *value else {
            return;
        };
        match t {
            Tunable::HugetlbNrHugepages { size_kb } => {
                self.pools.entry(*size_kb).or_default().0 = n
            }
            Tunable::HugetlbNrOvercommit { size_kb } => {
                self.pools.entry(*size_kb).or_default().1 = n
            }
            Tunable::Sysctl(VmSysctl::NrHugepages) => self.pools.entry(2048).or_default().0 = n,
            Tunable::Sysctl(VmSysctl::NrOvercommitHugepages) => {
                self.pools.entry(2048).or_default().1 = n
            }
            _ => {}
        }
    }

    fn process_of<'a>(&'a self, task: &'a str) -> &'a str {
        self.thread_of.get(task).map_or(task, String::as_str)
    }

    fn region(&self, task: &str, region: &str) -> Option<&Region> {
        self.procs.get(self.process_of(task))?.get(region)
    }

    fn insert(&mut self, task: &str, name: &str, region: Region) {
        let proc = self.process_of(task).to_string();
        let regions = self.procs.entry(proc).or_default();
        if let Some(old) = regions.insert(name.to_string(), region) {
            // A region named again replaces the old one (as after munmap).
            self.release(old);
        }
    }

    /// A region's extent grows by `by` (`to`: grows to `by`), or it is made.
    fn grow(&mut self, task: &str, name: &str, by: u64, to: bool) {
        let proc = self.process_of(task).to_string();
        let regions = self.procs.entry(proc).or_default();
        let r = regions.entry(name.to_string()).or_insert(Region {
            extent: 0,
            kind: Kind::Private,
        });
        let new = if to { r.extent.max(by) } else { r.extent + by };
        r.extent = new;
        if let Kind::Shared(id) = r.kind {
            if let Some(o) = self.shared.get_mut(&id) {
                o.0 = o.0.max(new);
            }
        }
    }

    /// The bytes `range` covers, from its region's extent.
    fn range_len(&self, task: &str, range: &Range) -> u64 {
        let extent = self.region(task, &range.region).map_or(0, |r| r.extent);
        let offset = range.offset.map_or(0, |o| o.bytes());
        range
            .len
            .map_or(extent.saturating_sub(offset), |l| l.bytes())
    }

    /// Whether `range` is the whole region.
    fn whole(&self, task: &str, range: &Range) -> bool {
        let extent = self.region(task, &range.region).map_or(0, |r| r.extent);
        range.offset.map_or(0, |o| o.bytes()) == 0 && self.range_len(task, range) >= extent
    }

    fn remove(&mut self, task: &str, name: &str) {
        let proc = self.process_of(task).to_string();
        if let Some(r) = self.procs.get_mut(&proc).and_then(|rs| rs.remove(name)) {
            self.release(r);
        }
    }

    fn release(&mut self, r: Region) {
        if let Kind::Shared(id) = r.kind {
            if let Some(o) = self.shared.get_mut(&id) {
                o.1 -= 1;
                if o.1 == 0 {
                    self.shared.remove(&id);
                }
            }
        }
    }

    fn clear(&mut self, proc: &str) {
        let regions = self.procs.get_mut(proc).map(std::mem::take);
        for r in regions.into_iter().flat_map(|rs| rs.into_values()) {
            self.release(r);
        }
    }

    fn fork(&mut self, task: &str, child: &str) {
        let parent = self.process_of(task).to_string();
        let regions = self.procs.get(&parent).cloned().unwrap_or_default();
        for r in regions.values() {
            if let Kind::Shared(id) = r.kind {
                if let Some(o) = self.shared.get_mut(&id) {
                    o.1 += 1;
                }
            }
        }
        self.procs.insert(child.to_string(), regions);
    }

    /// `exit` of a thread ends the thread; of a process, the process.
    fn exit(&mut self, task: &str) {
        if self.thread_of.remove(task).is_some() {
            return;
        }
        self.clear(task);
        self.procs.remove(task);
        self.thread_of.retain(|_, p| p != task);
    }

    /// The totals now, into the peaks.
    fn update(&mut self) {
        let private: u64 = self
            .procs
            .values()
            .flat_map(|rs| rs.values())
            .filter(|r| matches!(r.kind, Kind::Private))
            .map(|r| r.extent)
            .sum();
        let shared: u64 = self.shared.values().map(|o| o.0).sum();
        let files: u64 = self.files.values().sum();
        let regions = private + shared + files + self.pinned;
        let pools: u64 = self
            .pools
            .iter()
            .map(|(kb, (nr, over))| (nr + over).saturating_mul(kb * 1024))
            .sum();
        let b = &mut self.bound;
        b.regions = b.regions.max(regions);
        b.pools = b.pools.max(pools);
        b.processes = b.processes.max(self.procs.len() as u64);
    }
}

/// The bound of statements already read (a workload in memory).
pub fn of_stmts<'a>(stmts: impl IntoIterator<Item = &'a Stmt>) -> Bound {
    let mut t = Tracker::default();
    for s in stmts {
        t.step(s);
    }
    t.bound()
}

/// The bound of a workload file, in a first pass over it (see the module
/// doc); a parse error is the file's, as the run would report it.
pub fn of_file(path: &Path) -> Result<Bound, ParseError> {
    let mut t = Tracker::default();
    for stmt in stream_file(path)? {
        t.step(&stmt?);
    }
    Ok(t.bound())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    const M: u64 = 1 << 20;

    fn bound(text: &str) -> Bound {
        of_stmts(&parse("t.hlw", text).unwrap().stmts)
    }

    #[test]
    fn regions_add_and_whole_munmaps_free() {
        let b = bound("spawn p\np mmap a 4M\np mmap b 2M\np munmap b\np mmap c 1M\n");
        // a + b = 6M at the peak; after b goes, a + c = 5M.
        assert_eq!(b.regions, 6 * M);
        assert_eq!(b.pools, 0);
        assert_eq!(b.processes, 1);
    }

    #[test]
    fn a_partial_munmap_frees_nothing() {
        let b = bound("spawn p\np mmap a 4M\np munmap a+2M:2M\np mmap c 1M\n");
        assert_eq!(b.regions, 5 * M);
    }

    #[test]
    fn fork_doubles_private_but_not_shared() {
        let b = bound("spawn p\np mmap a 4M\np mmap s 2M shared\np fork c\n");
        // p: 4M private + 2M shared; c: 4M more private, the same 2M.
        assert_eq!(b.regions, 10 * M);
        assert_eq!(b.processes, 2);
    }

    #[test]
    fn exit_and_exec_free_a_process_regions() {
        let b = bound("spawn p\np mmap a 4M\np fork c\nc exit\np exec\np mmap b 3M\n");
        assert_eq!(b.regions, 8 * M);
    }

    #[test]
    fn mremap_and_brk_grow_the_extent() {
        let b = bound(
            "spawn p\np mmap a 2M\np mremap a 6M maymove\np brk h 1M at=0x20000000\np brk h 3M\n",
        );
        assert_eq!(b.regions, 6 * M + 3 * M);
    }

    #[test]
    fn pools_count_hugetlb_regions_do_not() {
        let b = bound(
            "set hugepages/hugepages-2048kB/nr_hugepages 10\n\
             set vm.nr_overcommit_hugepages 2\n\
             spawn p\np mmap h 8M hugetlb=2M\n\
             set hugepages/hugepages-2048kB/nr_hugepages 0\n",
        );
        assert_eq!(b.pools, 12 * 2 * M);
        assert_eq!(b.regions, 0);
        assert_eq!(b.total(), 24 * M);
    }

    #[test]
    fn pins_outlive_the_munmap() {
        let b = bound("spawn p\np mmap a 4M\np pin a:1M\np munmap a\np mmap b 4M\n");
        // a + 1M pinned, then b + the 1M still pinned.
        assert_eq!(b.regions, 5 * M);
    }

    #[test]
    fn margin_is_arithmetic_on_the_bound() {
        let b = Bound {
            regions: 256 * M,
            pools: 0,
            processes: 2,
        };
        assert_eq!(b.margin(), 64 * M + 64 * M + M);
    }
}
