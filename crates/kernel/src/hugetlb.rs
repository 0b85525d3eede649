//! HugeTLB pools on this machine, measured: the counters the HugeTLB Vmemmap
//! Optimization (HVO) moves, and timed cycles that grow a pool and shrink it
//! back with `vm.hugetlb_optimize_vmemmap` off and on (`hugelab hugetlb
//! measure`).
//!
//! Every write goes through the [`SettingsGuard`]: the pool and the sysctl
//! are journaled before the first cycle, so the timed writes are writes only,
//! and both go back to their values on every ending.
//!
//! The vmemmap HVO frees is counted in `nr_memmap_pages` or in
//! `nr_memmap_boot_pages`, depending on whether those pages came from boot
//! memory (the first cycle frees boot vmemmap; what a shrink allocates again
//! and a later grow frees is `nr_memmap_pages`), so only their sum is the
//! vmemmap. Both are node counters: each reading folds the per-cpu deltas
//! first ([`vmstat::stat_refresh`]).

use crate::error::{KernelError, Result};
use crate::guard::{refusal, SettingsGuard};
use crate::sysfs;
use crate::vmstat;
use hugelab_workload::{Tunable, VmSysctl};
use serde::Serialize;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `vm.hugetlb_optimize_vmemmap`: new HugeTLB pages are optimized while it is 1.
pub const HVO: Tunable = Tunable::Sysctl(VmSysctl::HugetlbOptimizeVmemmap);

/// Writes of the pool file, after the timed one, before a shrink that does
/// not reach the pool's old size is an error.
const SHRINK_ATTEMPTS: u32 = 5;

/// The directory of the pool of `size_kb` pages.
pub fn pool_dir(size_kb: u64) -> PathBuf {
    Path::new(sysfs::SYS_MM)
        .join("hugepages")
        .join(format!("hugepages-{size_kb}kB"))
}

/// The tunable `hugepages-<size_kb>kB/nr_hugepages`.
pub fn pool(size_kb: u64) -> Tunable {
    Tunable::HugetlbNrHugepages { size_kb }
}

/// The pool's size now (`nr_hugepages`: persistent and surplus pages).
pub fn pool_pages(size_kb: u64) -> Result<u64> {
    let file = sysfs::tunable_file(&pool(size_kb));
    let v = sysfs::read_value(&file)?;
    v.parse()
        .map_err(|_| KernelError::Refused(format!("{}: unexpected value {v:?}", file.display())))
}

/// The counters HVO moves, read together right after folding the per-cpu
/// deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Reading {
    pub nr_memmap_pages: i64,
    pub nr_memmap_boot_pages: i64,
    pub nr_free_pages: i64,
    /// Free pages on the per-cpu lists, which nr_free_pages leaves out
    /// ([`vmstat::pcp_pages`]).
    pub pcp_pages: i64,
    /// MemFree of /proc/meminfo, kB (vendor semantics on these VMs: it
    /// includes memory not yet initialised, see the live capabilities §5).
    pub mem_free_kb: i64,
}

impl Reading {
    /// Folds the per-cpu vmstat deltas and reads (root only: the fold is a
    /// write).
    pub fn now() -> Result<Reading> {
        vmstat::stat_refresh()?;
        let v = vmstat::read_fields(
            &["nr_memmap_pages", "nr_memmap_boot_pages", "nr_free_pages"],
            &["MemFree"],
        )?;
        Ok(Reading {
            nr_memmap_pages: v[0],
            nr_memmap_boot_pages: v[1],
            nr_free_pages: v[2],
            pcp_pages: vmstat::pcp_pages()?,
            mem_free_kb: v[3],
        })
    }

    /// Free pages: in the buddy lists and on the per-cpu lists.
    pub fn free(&self) -> i64 {
        self.nr_free_pages + self.pcp_pages
    }

    /// The vmemmap, in pages: both memmap counters.
    pub fn memmap(&self) -> i64 {
        self.nr_memmap_pages + self.nr_memmap_boot_pages
    }

    /// `later` minus this reading.
    pub fn delta(&self, later: &Reading) -> Delta {
        Delta {
            memmap: later.memmap() - self.memmap(),
            nr_memmap_pages: later.nr_memmap_pages - self.nr_memmap_pages,
            nr_memmap_boot_pages: later.nr_memmap_boot_pages - self.nr_memmap_boot_pages,
            free: later.free() - self.free(),
            nr_free_pages: later.nr_free_pages - self.nr_free_pages,
            mem_free_kb: later.mem_free_kb - self.mem_free_kb,
        }
    }
}

/// How the counters moved between two readings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Delta {
    /// nr_memmap_pages + nr_memmap_boot_pages.
    pub memmap: i64,
    pub nr_memmap_pages: i64,
    pub nr_memmap_boot_pages: i64,
    /// nr_free_pages + the per-cpu lists' pages.
    pub free: i64,
    pub nr_free_pages: i64,
    pub mem_free_kb: i64,
}

/// One grow of a pool from its old size to the target and shrink back, with
/// HVO off or on, then an idle interval as long as the grow.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cycle {
    /// `vm.hugetlb_optimize_vmemmap` during the cycle.
    pub hvo: bool,
    /// A warm-up (not for the statistics), else the repeat's number from 0.
    pub warmup: bool,
    pub repeat: u32,
    /// The timed write of the target to nr_hugepages, seconds.
    pub grow_s: f64,
    /// The timed write of the old size, seconds.
    pub shrink_s: f64,
    /// nr_hugepages read back after the grow.
    pub reached: u64,
    /// From the reading before the grow to the one after it.
    pub grow: Delta,
    /// From the reading after the grow to the one after the shrink.
    pub shrink: Delta,
    /// Seconds from the reading before the grow to the end of the one after.
    pub grow_window_s: f64,
    /// The counters over an idle interval right after the shrink, as long
    /// as the grow's window (one reading at each end, a sleep between):
    /// what nr_free_pages does on its own meanwhile.
    pub idle: Delta,
    pub idle_s: f64,
}

/// A pool's cycles.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolRun {
    pub size_kb: u64,
    /// nr_hugepages before (and after) the cycles.
    pub original: u64,
    /// The size each grow writes.
    pub target: u64,
    /// Every cycle that reached the target, in the order run.
    pub cycles: Vec<Cycle>,
    /// The first cycle whose grow fell short of the target: the pool
    /// cannot be measured at this size (its cycles so far are kept).
    pub short: Option<Cycle>,
}

/// Checks that the pool of `size_kb` pages and the HVO sysctl can be
/// written, writing nothing: not root, a read-only sysfs or procfs, or a
/// kernel without HVO is one [`KernelError::Refused`] sentence.
pub fn check_writable(size_kb: u64) -> Result<()> {
    let hvo = sysfs::tunable_file(&HVO);
    if !hvo.exists() {
        return Err(KernelError::Refused(format!(
            "this kernel has no {} (built without CONFIG_HUGETLB_PAGE_OPTIMIZE_VMEMMAP): there is no HVO to measure",
            hvo.display()
        )));
    }
    for file in [sysfs::tunable_file(&pool(size_kb)), hvo] {
        // Opening for write writes nothing, and fails as writing would.
        OpenOptions::new()
            .write(true)
            .open(&file)
            .map_err(|e| refusal(KernelError::io(&file, e)))?;
    }
    Ok(())
}

/// Grows the pool of `size_kb` pages from its size now to `target` and
/// shrinks it back, `warmup` then `repeat` times with HVO off then on (the
/// two interleaved, so that drift hits both alike). Stops at the first grow
/// that falls short of `target`, after shrinking back. Changes go through
/// `guard`; the pool is at its old size after every cycle, and HVO as the
/// last cycle left it (the guard puts it back).
pub fn measure_pool(
    guard: &mut SettingsGuard,
    size_kb: u64,
    target: u64,
    warmup: u32,
    repeat: u32,
) -> Result<PoolRun> {
    let pool = pool(size_kb);
    let original = pool_pages(size_kb)?;
    if original >= target {
        return Err(KernelError::Refused(format!(
            "the pool of {size_kb} kB pages already holds {original} pages, not fewer than the {target} asked for"
        )));
    }
    // Journaled now: the timed writes are then writes only. HVO first: the
    // guard restores last journaled first, so pools grown under the sysctl
    // shrink before it goes back.
    guard.journal(&HVO)?;
    guard.journal(&pool)?;
    let mut hvo_now = sysfs::read_tunable(&HVO)? == "1";
    let mut run = PoolRun {
        size_kb,
        original,
        target,
        cycles: Vec::new(),
        short: None,
    };
    for round in 0..warmup + repeat {
        for hvo in [false, true] {
            if hvo != hvo_now {
                guard.set(&HVO, if hvo { "1" } else { "0" })?;
                hvo_now = hvo;
            }
            let is_warmup = round < warmup;
            let r = if is_warmup { round } else { round - warmup };
            let cycle = pool_cycle(guard, size_kb, original, target, hvo, is_warmup, r)?;
            if cycle.reached < target {
                run.short = Some(cycle);
                return Ok(run);
            }
            run.cycles.push(cycle);
        }
    }
    Ok(run)
}

/// One grow to `target` and shrink to `original`, then the idle interval.
fn pool_cycle(
    guard: &mut SettingsGuard,
    size_kb: u64,
    original: u64,
    target: u64,
    hvo: bool,
    warmup: bool,
    repeat: u32,
) -> Result<Cycle> {
    let pool = pool(size_kb);
    let before = Reading::now()?;
    let window = Instant::now();
    let t = Instant::now();
    guard.set(&pool, &target.to_string())?;
    let grow_s = t.elapsed().as_secs_f64();
    let reached = pool_pages(size_kb)?;
    let grown = Reading::now()?;
    let grow_window = window.elapsed();
    let t = Instant::now();
    guard.set(&pool, &original.to_string())?;
    let shrink_s = t.elapsed().as_secs_f64();
    shrunk_back(guard, size_kb, original)?;
    let after = Reading::now()?;
    let (idle, idle_s) = idle_interval(grow_window)?;
    Ok(Cycle {
        hvo,
        warmup,
        repeat,
        grow_s,
        shrink_s,
        reached,
        grow: before.delta(&grown),
        shrink: grown.delta(&after),
        grow_window_s: grow_window.as_secs_f64(),
        idle,
        idle_s,
    })
}

/// Checks the shrink reached `original`, writing it again a few times (a
/// free with HVO needs memory for the vmemmap it restores, and a page that
/// could not get it goes back to the pool).
fn shrunk_back(guard: &mut SettingsGuard, size_kb: u64, original: u64) -> Result<()> {
    let mut now = pool_pages(size_kb)?;
    for attempt in 1..=SHRINK_ATTEMPTS {
        if now == original {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50 * u64::from(attempt)));
        guard.set(&pool(size_kb), &original.to_string())?;
        now = pool_pages(size_kb)?;
    }
    if now == original {
        return Ok(());
    }
    Err(KernelError::Refused(format!(
        "the pool of {size_kb} kB pages did not shrink back to {original} pages (it holds {now}); the settings guard retries when it restores"
    )))
}

/// The counters over `length` of doing nothing, and the interval's
/// seconds (a reading at each end, as a grow's window has).
fn idle_interval(length: Duration) -> Result<(Delta, f64)> {
    let t = Instant::now();
    let a = Reading::now()?;
    std::thread::sleep(length.saturating_sub(t.elapsed()));
    let b = Reading::now()?;
    Ok((a.delta(&b), t.elapsed().as_secs_f64()))
}

/// MemAvailable and MemTotal of /proc/meminfo, bytes.
pub fn mem_available() -> Result<(u64, u64)> {
    let v = vmstat::read_fields(&[], &["MemAvailable", "MemTotal"])?;
    let bytes = |kb: i64| u64::try_from(kb).unwrap_or(0) * 1024;
    Ok((bytes(v[0]), bytes(v[1])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memmap_is_both_counters_and_deltas_are_later_minus_earlier() {
        let a = Reading {
            nr_memmap_pages: 136,
            nr_memmap_boot_pages: 98168,
            nr_free_pages: 6_000_000,
            pcp_pages: 5000,
            mem_free_kb: 24_000_000,
        };
        // A first HVO grow of 16 2M pages, as measured here: all 8 boot
        // vmemmap pages of each freed, and a new page allocated for its head
        // struct pages (hugetlb_vmemmap.c keeps boot memory in whole blocks).
        let b = Reading {
            nr_memmap_pages: 152,
            nr_memmap_boot_pages: 98040,
            nr_free_pages: 6_000_000 - 16 * 512 + 112 - 512,
            pcp_pages: 5512,
            mem_free_kb: 24_000_000 - 16 * 2048 + 448,
        };
        let d = a.delta(&b);
        assert_eq!(d.memmap, -112);
        assert_eq!((d.nr_memmap_pages, d.nr_memmap_boot_pages), (16, -128));
        // A 2 MiB block moved from the buddy lists to a per-cpu list.
        assert_eq!(d.free, -16 * 505);
        assert_eq!(d.nr_free_pages, -16 * 505 - 512);
        assert_eq!(b.delta(&a).memmap, 112);
    }

    #[test]
    fn pool_files() {
        assert_eq!(
            sysfs::tunable_file(&pool(2048)),
            pool_dir(2048).join("nr_hugepages")
        );
        assert_eq!(
            sysfs::tunable_file(&HVO),
            Path::new("/proc/sys/vm/hugetlb_optimize_vmemmap")
        );
    }
}
