//! Fault-around in the recorded run: the read faults the replay cannot
//! reproduce because the recorded kernel's fault-around left a cached page
//! unmapped.
//!
//! A read fault on a private file page maps, besides its own page, every
//! page of the 64 KiB window around it that is in the page cache
//! (Linux 6.18 `do_fault_around` and `filemap_map_pages`: the window
//! aligned down, moved up to the VMA's start, cut at the VMA's and the
//! page table's end). `next_uptodate_folio` skips a cached folio that is
//! locked (another task faulting it or mapping it around at that moment:
//! `folio_trylock`), not uptodate, or marked PG_readahead. A locked folio
//! is what the recordings show: two processes started side by side on two
//! CPUs (kbuild's `cat` and `rm`) fault the same window of libc's text
//! within microseconds, each taking the folio locks of the other's pages
//! while it maps them, and each later faults a page its own fault-around
//! skipped. No replay has that race: a replay maps the page around, and the
//! recorded program's later fault on it is no fault there. Such a fault is
//! not written as a first touch when what the recording shows proves the
//! race: a read fault on a page an earlier read fault of the same mm should
//! have mapped around (the page in the page cache then, nothing having
//! unmapped it since), that earlier fault taken while another process
//! faulted the same pages of the file ([`RACE_NS`] apart at most).
//!
//! "In the page cache" is as a replay sees it: a file page some earlier
//! replayed fault (of any process) touched, as the model's and the kernel
//! backend's page caches start empty. A forked child starts with nothing
//! mapped around (a VMA without an anon_vma is not copied by fork; one
//! with is, but either way its pages are not counted as mapped around).
//! Simplifications: the converter's extent stands for the VMA (adjacent
//! mappings of one file that the kernel merges give a smaller window
//! here, so fewer faults are left out, never more).

use super::out::PAGE;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// fault_around_bytes' default, in pages.
const FAULT_AROUND_PAGES: u64 = 16;
/// Two faults on the same file pages this close (ns) ran side by side.
pub const RACE_NS: u64 = 100_000;
/// The span of one PTE table.
const PMD_SPAN: u64 = 512 * PAGE;

/// The file pages some replayed fault touched: the replay's page cache.
#[derive(Default)]
pub struct PageCache {
    pages: HashSet<(Rc<str>, u64)>,
    /// The last read fault's time and task on each 16-page block of a file.
    last_read: HashMap<(Rc<str>, u64), (u64, String)>,
}

/// The process of a task name (`proc-tN` is a thread of `proc`).
fn proc_of(task: &str) -> &str {
    match task.rsplit_once("-t") {
        Some((p, n)) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => p,
        _ => task,
    }
}

/// One mm's view: which region maps which file at which offset, and the
/// pages fault-around mapped.
#[derive(Default, Clone)]
pub struct Around {
    /// Region name -> (file, file offset of the region's base).
    files: HashMap<Rc<str>, (Rc<str>, u64)>,
    mapped: HashSet<u64>,
}

impl Around {
    /// A private file mapping named `region`, of `file` from `offset`.
    pub fn file_region(&mut self, region: Rc<str>, file: &str, offset: u64) {
        self.files.insert(region, (file.into(), offset));
    }

    /// `[start, end)` was unmapped or zapped.
    pub fn forget(&mut self, start: u64, end: u64) {
        self.mapped.retain(|&p| p < start || p >= end);
    }

    /// A fork's child: nothing of its own mapped around yet.
    pub fn forked(&mut self) {
        self.mapped.clear();
    }

    /// Whether a read fault on `page` is one the replay does not take:
    /// fault-around mapped the page earlier.
    pub fn mapped_around(&self, page: u64) -> bool {
        self.mapped.contains(&page)
    }

    /// A replayed fault on `page` of file region `region` (whose offset 0
    /// is at `base`, its extent `[vma_start, vma_end)`): the page enters
    /// the page cache; a read fault maps the cached pages of its window.
    #[allow(clippy::too_many_arguments)]
    pub fn fault(
        &mut self,
        cache: &mut PageCache,
        (time, task): (u64, &str),
        region: &str,
        base: u64,
        (vma_start, vma_end): (u64, u64),
        page: u64,
        write: bool,
    ) {
        let Some((file, offset)) = self.files.get(region) else {
            return;
        };
        let index = |p: u64| (offset + (p - base)) / PAGE;
        if !write {
            // Another process faulted the same block of the file just now.
            let block = (file.clone(), index(page) / FAULT_AROUND_PAGES);
            let raced = matches!(cache.last_read.get(&block),
                Some((t, other)) if time.abs_diff(*t) <= RACE_NS && proc_of(other) != proc_of(task));
            cache.last_read.insert(block, (time, task.to_string()));
            if !raced {
                cache.pages.insert((file.clone(), index(page)));
                return;
            }
            let from = (page & !(FAULT_AROUND_PAGES * PAGE - 1)).max(vma_start);
            let to = (from + FAULT_AROUND_PAGES * PAGE)
                .min((page & !(PMD_SPAN - 1)) + PMD_SPAN)
                .min(vma_end);
            for p in (from..to).step_by(PAGE as usize) {
                if p != page && cache.pages.contains(&(file.clone(), index(p))) {
                    self.mapped.insert(p);
                }
            }
        }
        cache.pages.insert((file.clone(), index(page)));
    }
}
