//! System-wide counters: /proc/vmstat, the per-size mTHP stats under
//! /sys/kernel/mm/transparent_hugepage/hugepages-<size>/stats/, /proc/meminfo,
//! khugepaged's pages_collapsed and the hugetlb pool files.
//!
//! Node counters (nr_anon_pages, ...) are per-cpu batched: [`stat_refresh`]
//! folds them first. Reading must not fault in the runner itself between two
//! readings of pgfault, which is how noise from other processes is detected:
//! files are read into buffers kept from one reading to the next, /proc/vmstat
//! last on the way into a statement and first on the way out.

use crate::error::{KernelError, Result};
use crate::sysfs::{size_dirs, SYS_MM};
use hugelab_workload::Counters;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The /proc/vmstat fields hugelab reports: the THP events and the node
/// counters of anonymous memory and page tables.
fn vmstat_wanted(name: &str) -> bool {
    name.starts_with("thp_")
        || matches!(
            name,
            "pgfault" | "nr_anon_pages" | "nr_anon_transparent_hugepages" | "nr_page_table_pages"
        )
}

/// The /proc/meminfo fields hugelab reports (kB). MemFree and MemTotal are
/// left out: on these VMs they follow vendor semantics (lazy init, page
/// reporting) and do not add up (reference: this-machine-live-capabilities §5).
const MEMINFO: [&str; 7] = [
    "AnonPages",
    "AnonHugePages",
    "PageTables",
    "HugePages_Total",
    "HugePages_Free",
    "HugePages_Rsvd",
    "HugePages_Surp",
];

/// Counters whose value is the pool's absolute size, not a change: hugetlb
/// pools are set by the workload, so both sides start from the same value.
pub fn is_absolute(name: &str) -> bool {
    name.starts_with("hugetlb.") || name.starts_with("meminfo.HugePages_")
}

/// The mTHP stats of anonymous memory (the shmem ones are left out).
const MTHP_STATS: [&str; 13] = [
    "anon_fault_alloc",
    "anon_fault_fallback",
    "anon_fault_fallback_charge",
    "anon_fault_declined",
    "split",
    "split_failed",
    "split_deferred",
    "nr_anon",
    "nr_anon_partially_mapped",
    "swpout",
    "swpout_fallback",
    "swpin",
    "swpin_fallback",
];

const HUGETLB_FILES: [&str; 5] = [
    "nr_hugepages",
    "free_hugepages",
    "resv_hugepages",
    "surplus_hugepages",
    "nr_overcommit_hugepages",
];

struct Source {
    path: PathBuf,
    name: String,
    buf: Vec<u8>,
}

/// Reads the system-wide counters again and again without allocating.
pub struct SystemReader {
    vmstat: Vec<u8>,
    meminfo: Vec<u8>,
    /// One file, one counter: mthp stats, pages_collapsed, hugetlb pools.
    files: Vec<Source>,
}

impl SystemReader {
    pub fn new() -> SystemReader {
        let thp = Path::new(SYS_MM).join("transparent_hugepage");
        let mut files = Vec::new();
        for kb in size_dirs(&thp) {
            let stats = thp.join(format!("hugepages-{kb}kB/stats"));
            for stat in MTHP_STATS {
                let path = stats.join(stat);
                if path.exists() && thp.join(format!("hugepages-{kb}kB/enabled")).exists() {
                    files.push(Source {
                        path,
                        name: format!("mthp.{kb}kB.{stat}"),
                        buf: touched(64),
                    });
                }
            }
        }
        files.push(Source {
            path: thp.join("khugepaged/pages_collapsed"),
            name: "khugepaged.pages_collapsed".into(),
            buf: touched(64),
        });
        let pools = Path::new(SYS_MM).join("hugepages");
        for kb in size_dirs(&pools) {
            for f in HUGETLB_FILES {
                files.push(Source {
                    path: pools.join(format!("hugepages-{kb}kB/{f}")),
                    name: format!("hugetlb.{kb}kB.{f}"),
                    buf: touched(64),
                });
            }
        }
        SystemReader {
            vmstat: touched(64 << 10),
            meminfo: touched(16 << 10),
            files,
        }
    }

    /// Reads every file into this reader's buffers, /proc/vmstat first
    /// (`vmstat_first`) or last; [`SystemReader::parse`] turns them into
    /// counters later, outside the measured interval, since parsing allocates.
    /// The per-cpu deltas are folded right before /proc/vmstat is read, so
    /// that nothing between the fold and the read is left out.
    pub fn capture(&mut self, vmstat_first: bool) -> Result<()> {
        if !vmstat_first {
            self.read_files()?;
        }
        // Folded once, then both node-counter files read back to back.
        stat_refresh()?;
        if vmstat_first {
            read_into(Path::new("/proc/vmstat"), &mut self.vmstat)?;
            read_into(Path::new("/proc/meminfo"), &mut self.meminfo)?;
            self.read_files()
        } else {
            read_into(Path::new("/proc/meminfo"), &mut self.meminfo)?;
            read_into(Path::new("/proc/vmstat"), &mut self.vmstat)
        }
    }

    fn read_files(&mut self) -> Result<()> {
        for s in &mut self.files {
            read_into(&s.path, &mut s.buf)?;
        }
        Ok(())
    }

    /// The counters of the last [`SystemReader::capture`].
    pub fn parse(&self) -> Result<Counters> {
        let mut c = Counters::new();
        for line in String::from_utf8_lossy(&self.vmstat).lines() {
            if let Some((name, v)) = line.split_once(' ') {
                if vmstat_wanted(name) {
                    c.insert(format!("vmstat.{name}"), number("/proc/vmstat", v)?);
                }
            }
        }
        for line in String::from_utf8_lossy(&self.meminfo).lines() {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            if MEMINFO.contains(&name) {
                let v = rest.trim().trim_end_matches(" kB");
                c.insert(format!("meminfo.{name}"), number("/proc/meminfo", v)?);
            }
        }
        for s in &self.files {
            let text = String::from_utf8_lossy(&s.buf);
            c.insert(
                s.name.clone(),
                number(&s.path.display().to_string(), &text)?,
            );
        }
        Ok(c)
    }
}

impl Default for SystemReader {
    fn default() -> Self {
        SystemReader::new()
    }
}

/// An empty buffer whose capacity has been written once: the first read into
/// it must not fault, or the faults would land between two pgfault readings.
fn touched(capacity: usize) -> Vec<u8> {
    let mut v = vec![1u8; capacity];
    v.clear();
    v
}

fn number(file: &str, v: &str) -> Result<i64> {
    v.trim()
        .parse()
        .map_err(|_| KernelError::Refused(format!("{file}: unexpected value {:?}", v.trim())))
}

fn read_into(path: &Path, buf: &mut Vec<u8>) -> Result<()> {
    buf.clear();
    File::open(path)
        .and_then(|mut f| f.read_to_end(buf))
        .map_err(|e| KernelError::io(path, e))?;
    Ok(())
}

/// Folds the per-cpu vmstat deltas into the global counters (root only).
pub fn stat_refresh() -> Result<()> {
    const PATH: &str = "/proc/sys/vm/stat_refresh";
    std::fs::write(PATH, "1\n").map_err(|e| KernelError::io(PATH, e))
}
