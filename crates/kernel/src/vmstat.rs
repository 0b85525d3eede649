//! System-wide counters: /proc/vmstat, the per-size mTHP stats under
//! /sys/kernel/mm/transparent_hugepage/hugepages-<size>/stats/, /proc/meminfo,
//! khugepaged's counters and the hugetlb pool files: the fields the counter
//! registry (`hugelab_workload::counters`) lists, those that exist here.
//!
//! Node counters (nr_anon_pages, ...) are per-cpu batched: [`stat_refresh`]
//! folds them first. Reading must not fault in the runner itself between two
//! readings of pgfault, which is how noise from other processes is detected:
//! files are read into buffers kept from one reading to the next, /proc/vmstat
//! last on the way into a statement and first on the way out.

use crate::error::{KernelError, Result};
use crate::sysfs::{size_dirs, SYS_MM};
use hugelab_workload::counters::{self, Reported};
use hugelab_workload::Counters;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Registry fields the kernel backend leaves out: total and free memory on
/// these VMs follow vendor semantics (lazy init, free page reporting to the
/// host) and free memory moves with everything else on the machine
/// (reference: this-machine-live-capabilities §5), so neither is the
/// workload's.
const NOT_READ: [&str; 3] = ["nr_free_pages", "MemFree", "MemTotal"];

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
    path: PathBuf,
    name: String,
    buf: Vec<u8>,
}

/// Reads the system-wide counters again and again without allocating.
pub struct SystemReader {
    vmstat_fields: Vec<&'static str>,
    meminfo_fields: Vec<&'static str>,
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
            for stat in fields("mthp") {
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
        for f in fields("khugepaged") {
            files.push(Source {
                path: thp.join("khugepaged").join(f),
                name: format!("khugepaged.{f}"),
                buf: touched(64),
            });
        }
        let pools = Path::new(SYS_MM).join("hugepages");
        for kb in size_dirs(&pools) {
            for f in fields("hugetlb") {
                files.push(Source {
                    path: pools.join(format!("hugepages-{kb}kB/{f}")),
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
                if self.vmstat_fields.contains(&name) {
                    c.insert(format!("vmstat.{name}"), number("/proc/vmstat", v)?);
                }
            }
        }
        for line in String::from_utf8_lossy(&self.meminfo).lines() {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            if self.meminfo_fields.contains(&name) {
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
