//! System-wide counters: /proc/vmstat, the per-size mTHP stats under
//! /sys/kernel/mm/transparent_hugepage/hugepages-<size>/stats/, /proc/meminfo,
//! khugepaged's counters and the hugetlb pool files: the fields the counter
//! registry (`hugelab_workload::counters`) lists, those that exist here.
//!
//! Node counters (nr_anon_pages, ...) are per-cpu batched: [`stat_refresh`]
//! folds them first. Reading must not fault in the runner itself between two
//! readings of pgfault, which is how noise from other processes is detected:
//! files are read into buffers kept from one reading to the next. In a
//! measurement window /proc/vmstat is read first on the way into a statement
//! and last on the way out, so that the window's pgfault spans the reading of
//! every other file: another process's fault that counts an event there is
//! in the window's pgfault too.

use crate::error::{KernelError, Result};
use crate::procfile::ProcFile;
use crate::sysfs::{size_dirs, SYS_MM};
use hugelab_workload::counters::{self, Reported};
use hugelab_workload::Counters;
use std::collections::HashSet;
use std::path::Path;

/// Registry fields the kernel backend leaves out: total and free memory on
/// these VMs follow vendor semantics (lazy init, free page reporting to the
/// host) and free memory moves with everything else on the machine
/// (reference: this-machine-live-capabilities §5), so neither is the
/// workload's.
const NOT_READ: [&str; 3] = ["nr_free_pages", "MemFree", "MemTotal"];

const VMSTAT: &str = "/proc/vmstat";
const MEMINFO: &str = "/proc/meminfo";

/// The registry's fields of `family`, less those in [`NOT_READ`].
fn fields(family: &'static str) -> impl Iterator<Item = &'static str> {
    counters::field_names(family).filter(|f| !NOT_READ.contains(f))
}

/// Counters whose value is reported as read, not as a change: pools the
/// workload sets itself, so both sides start from the same value.
pub fn is_absolute(name: &str) -> bool {
    counters::lookup(name).is_some_and(|c| c.field.reported == Reported::Absolute)
}

struct Source {
    file: ProcFile,
    name: String,
    buf: Vec<u8>,
}

/// Reads the system-wide counters again and again without allocating.
pub struct SystemReader {
    /// The fields read, looked up for each line of the files.
    vmstat_fields: HashSet<&'static str>,
    meminfo_fields: HashSet<&'static str>,
    vmstat: Vec<u8>,
    meminfo: Vec<u8>,
    /// The files, kept open (see [`ProcFile`]).
    vmstat_file: ProcFile,
    meminfo_file: ProcFile,
    refresh: ProcFile,
    /// One file, one counter: mthp stats, pages_collapsed, hugetlb pools.
    files: Vec<Source>,
}

impl SystemReader {
    pub fn new() -> SystemReader {
        let thp = Path::new(SYS_MM).join("transparent_hugepage");
        let mut files = Vec::new();
        for kb in size_dirs(&thp) {
            let stats = thp.join(format!("hugepages-{kb}kB/stats"));
            for stat in fields("mthp") {
                let path = stats.join(stat);
                if path.exists() && thp.join(format!("hugepages-{kb}kB/enabled")).exists() {
                    files.push(Source {
                        file: ProcFile::single(path),
                        name: format!("mthp.{kb}kB.{stat}"),
                        buf: touched(64),
                    });
                }
            }
        }
        for f in fields("khugepaged") {
            files.push(Source {
                file: ProcFile::single(thp.join("khugepaged").join(f)),
                name: format!("khugepaged.{f}"),
                buf: touched(64),
            });
        }
        let pools = Path::new(SYS_MM).join("hugepages");
        for kb in size_dirs(&pools) {
            for f in fields("hugetlb") {
                files.push(Source {
                    file: ProcFile::single(pools.join(format!("hugepages-{kb}kB/{f}"))),
                    name: format!("hugetlb.{kb}kB.{f}"),
                    buf: touched(64),
                });
            }
        }
        SystemReader {
            vmstat_fields: fields("vmstat").collect(),
            meminfo_fields: fields("meminfo").collect(),
            vmstat: touched(64 << 10),
            meminfo: touched(16 << 10),
            vmstat_file: ProcFile::new(VMSTAT),
            meminfo_file: ProcFile::single(MEMINFO),
            refresh: ProcFile::writable(STAT_REFRESH),
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
        self.refresh.write(b"1\n")?;
        if vmstat_first {
            self.vmstat_file.read_into(&mut self.vmstat)?;
            self.meminfo_file.read_into(&mut self.meminfo)?;
            self.read_files()
        } else {
            self.meminfo_file.read_into(&mut self.meminfo)?;
            self.vmstat_file.read_into(&mut self.vmstat)
        }
    }

    /// Reads every file without folding the per-cpu deltas first (no write:
    /// what a read-only reader such as the exporter does). Node counters
    /// then lag by what the CPUs have not folded yet (at most
    /// `stat_threshold` pages per CPU and counter, folded every second by
    /// vmstat_update).
    pub fn capture_unfolded(&mut self) -> Result<()> {
        self.read_files()?;
        self.meminfo_file.read_into(&mut self.meminfo)?;
        self.vmstat_file.read_into(&mut self.vmstat)
    }

    fn read_files(&mut self) -> Result<()> {
        for s in &mut self.files {
            s.file.read_into(&mut s.buf)?;
        }
        Ok(())
    }

    /// The counters of the last [`SystemReader::capture`].
    pub fn parse(&self) -> Result<Counters> {
        let mut c = Counters::new();
        for (name, v) in vmstat_lines(&String::from_utf8_lossy(&self.vmstat)) {
            if self.vmstat_fields.contains(&name) {
                c.insert(format!("vmstat.{name}"), number(VMSTAT, v)?);
            }
        }
        for (name, v) in meminfo_lines(&String::from_utf8_lossy(&self.meminfo)) {
            if self.meminfo_fields.contains(&name) {
                c.insert(format!("meminfo.{name}"), number(MEMINFO, v)?);
            }
        }
        for s in &self.files {
            let text = String::from_utf8_lossy(&s.buf);
            c.insert(
                s.name.clone(),
                number(&s.file.path().display().to_string(), &text)?,
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

/// A counter as a signed number. The kernel prints some `unsigned long`
/// counters that can wrap below zero (`HugePages_Rsvd` after a private
/// mapping's owner unmaps a page its child still maps: hugetlb_vm_op_close
/// returns a reservation the zap already gave back); those read as the
/// negative number they stand for, as the model reports them.
fn number(file: &str, v: &str) -> Result<i64> {
    let v = v.trim();
    v.parse::<i64>()
        .or_else(|_| v.parse::<u64>().map(|u| u as i64))
        .map_err(|_| KernelError::Refused(format!("{file}: unexpected value {v:?}")))
}

/// The `name value` lines of /proc/vmstat.
fn vmstat_lines(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines().filter_map(|line| line.split_once(' '))
}

/// The `Name:   value kB` lines of /proc/meminfo, the value without its unit
/// (kB for sizes, none for page counts such as HugePages_Total).
fn meminfo_lines(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines().filter_map(|line| {
        let (name, rest) = line.split_once(':')?;
        Some((name, rest.trim().trim_end_matches(" kB")))
    })
}

/// The values of the /proc/vmstat fields `vmstat` and the /proc/meminfo
/// fields `meminfo` (kB for sizes), in that order. Node counters need a
/// [`stat_refresh`] first to be exact. Unlike [`SystemReader`] this
/// allocates, and reads any field, those the registry leaves out
/// ([`NOT_READ`]) too. A field this kernel does not have is an error naming
/// it.
pub fn read_fields(vmstat: &[&str], meminfo: &[&str]) -> Result<Vec<i64>> {
    let vm = std::fs::read_to_string(VMSTAT).map_err(|e| KernelError::io(VMSTAT, e))?;
    let mi = std::fs::read_to_string(MEMINFO).map_err(|e| KernelError::io(MEMINFO, e))?;
    pick(VMSTAT, vmstat_lines(&vm), vmstat).and_then(|mut v| {
        v.extend(pick(MEMINFO, meminfo_lines(&mi), meminfo)?);
        Ok(v)
    })
}

/// Free pages waiting on the per-cpu lists (`pagesets`, every zone and
/// CPU): /proc/zoneinfo's `count:` lines. nr_free_pages leaves them out,
/// and since Linux 5.14 the lists hold PMD-order pages too, so each 2 MiB
/// block freed to them or taken from them is 512 pages nr_free_pages
/// misses.
pub fn pcp_pages() -> Result<i64> {
    const ZONEINFO: &str = "/proc/zoneinfo";
    let text = std::fs::read_to_string(ZONEINFO).map_err(|e| KernelError::io(ZONEINFO, e))?;
    pcp_count(&text)
}

fn pcp_count(zoneinfo: &str) -> Result<i64> {
    zoneinfo
        .lines()
        .filter_map(|l| l.trim().strip_prefix("count:"))
        .map(|v| number("/proc/zoneinfo", v))
        .sum()
}

/// The values of `names` among `lines`, in the order of `names`.
fn pick<'a>(
    file: &str,
    lines: impl Iterator<Item = (&'a str, &'a str)>,
    names: &[&str],
) -> Result<Vec<i64>> {
    let mut found: Vec<Option<i64>> = vec![None; names.len()];
    for (name, v) in lines {
        if let Some(i) = names.iter().position(|n| *n == name) {
            found[i] = Some(number(file, v)?);
        }
    }
    names
        .iter()
        .zip(found)
        .map(|(name, v)| {
            v.ok_or_else(|| KernelError::Refused(format!("{file} has no {name} on this kernel")))
        })
        .collect()
}

/// Folds the per-cpu vmstat deltas into the global counters (root only).
pub fn stat_refresh() -> Result<()> {
    std::fs::write(STAT_REFRESH, "1\n").map_err(|e| KernelError::io(STAT_REFRESH, e))
}

const STAT_REFRESH: &str = "/proc/sys/vm/stat_refresh";

#[cfg(test)]
mod tests {
    use super::*;

    const VM: &str = "nr_free_pages 6122357\nnr_memmap_pages 136\nnr_memmap_boot_pages 98168\n";
    const MI: &str =
        "MemTotal:       24949768 kB\nMemFree:        24489376 kB\nHugePages_Total:       0\n";

    #[test]
    fn fields_are_picked_in_the_order_asked() {
        let got = pick(
            VMSTAT,
            vmstat_lines(VM),
            &["nr_memmap_boot_pages", "nr_free_pages"],
        );
        assert_eq!(got.unwrap(), vec![98168, 6122357]);
        let got = pick(MEMINFO, meminfo_lines(MI), &["MemFree", "HugePages_Total"]);
        assert_eq!(got.unwrap(), vec![24489376, 0]);
    }

    #[test]
    fn pcp_pages_sum_every_cpu_of_every_zone() {
        let zi = "Node 0, zone    DMA32\n      nr_free_pages 772915\n  pagesets\n    cpu: 0\n              count:    3\n              high:     696\n    cpu: 1\n              count:    0\n\
                  Node 0, zone   Normal\n  pagesets\n    cpu: 0\n              count:    5518\n              high:     22302\n    cpu: 1\n              count:    9451\n";
        assert_eq!(pcp_count(zi).unwrap(), 3 + 5518 + 9451);
        assert!(pcp_count("              count:    x\n").is_err());
    }

    #[test]
    fn a_missing_or_bad_field_is_named() {
        let e = pick(VMSTAT, vmstat_lines(VM), &["nr_memmap"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/proc/vmstat has no nr_memmap on this kernel"
        );
        let e = pick(
            VMSTAT,
            vmstat_lines("nr_free_pages x\n"),
            &["nr_free_pages"],
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "/proc/vmstat: unexpected value \"x\"");
    }
}
