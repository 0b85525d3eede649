//! Per-region memory use from `/proc/PID/smaps` (Linux 6.18
//! `fs/proc/task_mmu.c`: `show_smap` → `__show_smap`), the source of the
//! `smaps.<proc>.<region>.<field>` counters.
//!
//! A region of a workload starts as one VMA but becomes several after
//! `mprotect` or `madvise` of part of it, so the fields are summed over every
//! VMA inside the region; an `at=` region merged with its neighbour shares
//! one VMA with it, which each of them reports whole. The kernel prints each VMA's fields already rounded
//! down to kB (Pss from its PSS_SHIFT fixed point), so a sum over n VMAs can be
//! up to n-1 kB below a Pss truncated once over the whole region; the other
//! fields are whole pages and sum exactly.

use crate::error::{KernelError, Result};
use hugelab_workload::smaps::SmapsField;
use hugelab_workload::units::PAGE_KB;
use std::io;

/// The smaps fields of one region, summed over its VMAs, in kB as printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmapsSum {
    /// How many VMAs lie inside the region.
    pub vmas: u32,
    /// Each field of [`SmapsField::ALL`], indexed by the field.
    pub kb: [u64; FIELDS],
    /// How many of the VMAs are HugeTLB mappings (`KernelPageSize` above
    /// the base page: `vma_kernel_pagesize`), whose pages are HugeTLB
    /// folios, never THPs or small folios.
    pub hugetlb_vmas: u32,
}

/// How many smaps fields a region reports.
pub const FIELDS: usize = SmapsField::ALL.len();

impl SmapsSum {
    /// One field's sum, kB.
    pub fn get(&self, f: SmapsField) -> u64 {
        self.kb[f as usize]
    }

    /// (field, kB) pairs in the order and spelling of [`SmapsField::ALL`],
    /// as the model's `MemSizeStats::fields` gives them.
    pub fn fields(&self) -> [(&'static str, u64); FIELDS] {
        SmapsField::ALL.map(|f| (f.name(), self.get(f)))
    }
}

/// Sums Rss, Pss, Shared_/Private_Clean/Dirty, Anonymous, AnonHugePages and
/// Shared_/Private_Hugetlb over the VMAs of process `pid` that overlap
/// `[start, end)`, and counts those that are HugeTLB mappings.
///
/// A VMA that straddles a bound counts whole rather than clipped: its fields
/// cannot be split by address. A region's VMAs leave it only when an
/// `at=` region merged with a neighbour, and then each region reports the
/// merged VMA (the model's rule too: `task_mmu`'s walk of a region's VMAs).
/// A region with no VMA left (all unmapped) gives `vmas == 0` and zeros.
pub fn region_smaps(pid: i32, start: u64, end: u64) -> Result<SmapsSum> {
    Ok(SmapsSum::of(&region_smaps_vmas(pid, start, end)?))
}

/// The VMA header `start-end perms offset dev inode [path]`, or None for a
/// field line. Field names such as `AnonHugePages` begin with hex digits too,
/// so the whole first word must parse as two hex numbers.
pub(crate) fn vma_header(line: &str) -> Option<(u64, u64)> {
    let word = line.split_ascii_whitespace().next()?;
    let (a, b) = word.split_once('-')?;
    let a = u64::from_str_radix(a, 16).ok()?;
    let b = u64::from_str_radix(b, 16).ok()?;
    Some((a, b))
}

/// RssAnon and VmPTE of /proc/PID/status, kB: the process's anonymous
/// pages (MM_ANONPAGES, as smaps_rollup's Anonymous counts them: every
/// mapped anonymous page, a PMD-mapped THP as its 512 pages, the zero page
/// and HugeTLB pages not) and its page tables (mm->pgtables_bytes: its PTE,
/// PMD and PUD tables, deposited ones too). Since Linux 6.16 `task_mem`
/// reads the RSS counters with `get_mm_counter_sum`, exact at the reading
/// like the page walk of smaps_rollup, which costs a walk of every page
/// table of the process.
pub fn status_anon_pte_kb(pid: i32) -> Result<(i64, i64)> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| KernelError::io(&path, e))?;
    status_anon_pte_of(&path, &text)
}

/// AnonHugePages of process `pid`, kB: its PMD-mapped anonymous THPs, from
/// /proc/PID/smaps_rollup (a walk of its page tables: read only when
/// needed).
pub fn rollup_anon_huge_kb(pid: i32) -> Result<i64> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let text = std::fs::read_to_string(&path).map_err(|e| KernelError::io(&path, e))?;
    status_field_kb(&path, &text, "AnonHugePages")
}

/// RssAnon and VmPTE, kB, of the /proc/PID/status file `path` read as
/// `text` (see [`status_anon_pte_kb`]).
pub fn status_anon_pte_of(path: &str, text: &str) -> Result<(i64, i64)> {
    Ok((
        status_field_kb(path, text, "RssAnon")?,
        status_field_kb(path, text, "VmPTE")?,
    ))
}

/// One `Name:   123 kB` line of the /proc file `path` read as `text`.
fn status_field_kb(path: &str, text: &str, name: &str) -> Result<i64> {
    text.lines()
        .filter_map(field)
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| {
            KernelError::io(
                path,
                io::Error::new(io::ErrorKind::InvalidData, format!("no {name} line")),
            )
        })
}

/// `Rss:                 256 kB` → ("Rss", 256).
pub(crate) fn field(line: &str) -> Option<(&str, &str)> {
    let (name, rest) = line.split_once(':')?;
    let mut words = rest.split_ascii_whitespace();
    let value = words.next()?;
    (words.next() == Some("kB")).then_some((name, value))
}

/// One VMA's smaps fields, in kB as printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmaSmaps {
    pub start: u64,
    pub end: u64,
    /// Each field of [`SmapsField::ALL`], indexed by the field.
    pub kb: [u64; FIELDS],
    /// A HugeTLB mapping (`KernelPageSize` above the base page).
    pub hugetlb: bool,
}

impl SmapsSum {
    /// The sum over these VMAs.
    pub fn of(vmas: &[VmaSmaps]) -> SmapsSum {
        let mut sum = SmapsSum::default();
        for v in vmas {
            sum.vmas += 1;
            sum.hugetlb_vmas += u32::from(v.hugetlb);
            for (total, kb) in sum.kb.iter_mut().zip(v.kb) {
                *total += kb;
            }
        }
        sum
    }
}

/// The VMAs of process `pid` that overlap `[start, end)`, each whole, with
/// their fields (see [`parse_smaps_vmas`]).
pub fn region_smaps_vmas(pid: i32, start: u64, end: u64) -> Result<Vec<VmaSmaps>> {
    let path = format!("/proc/{pid}/smaps");
    let text = std::fs::read_to_string(&path).map_err(|e| KernelError::io(&path, e))?;
    parse_smaps_vmas(&text, start, end)
        .map_err(|msg| KernelError::io(&path, io::Error::new(io::ErrorKind::InvalidData, msg)))
}

/// The VMAs of `vmas` (in address order, as an smaps file lists them) that
/// overlap `[start, end)`, whole: what [`region_smaps_vmas`] reads for that
/// range.
pub fn overlapping(vmas: &[VmaSmaps], start: u64, end: u64) -> Vec<VmaSmaps> {
    vmas.iter()
        .filter(|v| v.start < end && v.end > start)
        .copied()
        .collect()
}

/// The parser behind [`region_smaps`], on the text of an smaps file.
pub fn parse_smaps(text: &str, start: u64, end: u64) -> std::result::Result<SmapsSum, String> {
    Ok(SmapsSum::of(&parse_smaps_vmas(text, start, end)?))
}

/// Every VMA of an smaps text that overlaps `[start, end)`, whole: a VMA
/// that straddles a bound (two regions merged into one VMA) cannot have its
/// fields split by address, so each region it touches reports all of it.
pub fn parse_smaps_vmas(
    text: &str,
    start: u64,
    end: u64,
) -> std::result::Result<Vec<VmaSmaps>, String> {
    let mut vmas: Vec<VmaSmaps> = Vec::new();
    let mut inside = false;
    for (n, line) in text.lines().enumerate() {
        if let Some((lo, hi)) = vma_header(line) {
            inside = lo < end && hi > start;
            if inside {
                vmas.push(VmaSmaps {
                    start: lo,
                    end: hi,
                    ..VmaSmaps::default()
                });
            }
            continue;
        }
        if !inside {
            continue;
        }
        let Some((name, value)) = field(line) else {
            continue;
        };
        let vma = vmas.last_mut().expect("a header before its fields");
        let slot = match SmapsField::from_name(name) {
            Some(f) => &mut vma.kb[f as usize],
            None if name == "KernelPageSize" => {
                // Not summed: a HugeTLB VMA's page size is its hstate's.
                vma.hugetlb = value.parse::<u64>().is_ok_and(|kb| kb > PAGE_KB);
                continue;
            }
            None => continue,
        };
        *slot += value
            .parse::<u64>()
            .map_err(|_| format!("line {}: {name}: {value:?} is not a number of kB", n + 1))?;
    }
    Ok(vmas)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_rss_anon_is_smaps_rollup_anonymous() {
        // A process asleep does not change its memory between the readings.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let pid = child.id() as i32;
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
        let (anon, pte) = status_anon_pte_kb(pid).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let path = "smaps_rollup";
        assert_eq!(anon, status_field_kb(path, &rollup, "Anonymous").unwrap());
        assert!(anon > 0 && pte > 0, "RssAnon {anon} kB, VmPTE {pte} kB");
    }

    const SAMPLE: &str = "\
7f0000000000-7f0000200000 rw-p 00000000 00:00 0 
Size:               2048 kB
KernelPageSize:        4 kB
Rss:                2048 kB
Pss:                1024 kB
Pss_Dirty:          1024 kB
Shared_Clean:          0 kB
Shared_Dirty:       2048 kB
Private_Clean:         0 kB
Private_Dirty:         0 kB
Anonymous:          2048 kB
AnonHugePages:      2048 kB
VmFlags: rd wr mr mw me ac hg
7f0000200000-7f0000400000 r--p 00000000 00:00 0 
Rss:                   8 kB
Pss:                   3 kB
Shared_Dirty:          4 kB
Private_Dirty:         4 kB
Anonymous:             8 kB
AnonHugePages:         0 kB
VmFlags: rd mr mw me ac
7f0000400000-7f0000401000 ---p 00000000 00:00 0 
Rss:                   4 kB
Pss:                   4 kB
Anonymous:             4 kB
AnonHugePages:         0 kB
VmFlags: mr mw me
";

    #[test]
    fn sums_the_vmas_inside() {
        let s = parse_smaps(SAMPLE, 0x7f0000000000, 0x7f0000400000).unwrap();
        assert_eq!(
            s,
            SmapsSum {
                vmas: 2,
                kb: [2056, 1027, 0, 2052, 0, 4, 2056, 0, 2048, 0, 0],
                hugetlb_vmas: 0,
            }
        );
        assert_eq!(
            s.fields(),
            [
                ("Rss", 2056),
                ("Pss", 1027),
                ("Shared_Clean", 0),
                ("Shared_Dirty", 2052),
                ("Private_Clean", 0),
                ("Private_Dirty", 4),
                ("Anonymous", 2056),
                ("LazyFree", 0),
                ("AnonHugePages", 2048),
                ("Shared_Hugetlb", 0),
                ("Private_Hugetlb", 0)
            ]
        );
    }

    #[test]
    fn the_vmas_of_a_range_are_those_a_reading_of_that_range_gives() {
        // A process's smaps read once serves each of its regions.
        let all = parse_smaps_vmas(SAMPLE, 0, u64::MAX).unwrap();
        assert_eq!(all.len(), 3);
        for (start, end) in [
            (0x7f0000000000, 0x7f0000400000),
            (0x7f0000100000, 0x7f0000201000),
            (0x7f0000400000, 0x7f0000401000),
            (0x7f0000401000, 0x7f0000402000),
            (0x7eff00000000, 0x7f0000000000),
        ] {
            assert_eq!(
                overlapping(&all, start, end),
                parse_smaps_vmas(SAMPLE, start, end).unwrap(),
                "{start:#x}-{end:#x}"
            );
        }
    }

    /// Two VMAs of a HugeTLB region as Linux 6.18 prints them
    /// (`show_smap`: Rss counts no HugeTLB page; `smaps_hugetlb_range` puts
    /// each in Shared_ or Private_Hugetlb).
    const HUGETLB: &str = "\
7f0040000000-7f0040400000 rw-p 00000000 00:10 4242                       /anon_hugepage (deleted)
Size:               4096 kB
KernelPageSize:     2048 kB
MMUPageSize:        2048 kB
Rss:                   0 kB
Pss:                   0 kB
Anonymous:             0 kB
AnonHugePages:         0 kB
Shared_Hugetlb:     2048 kB
Private_Hugetlb:    2048 kB
VmFlags: rd wr mr mw me de ht
7f0040400000-7f0040600000 rw-p 00400000 00:10 4242                       /anon_hugepage (deleted)
KernelPageSize:     2048 kB
Rss:                   0 kB
Shared_Hugetlb:        0 kB
Private_Hugetlb:    2048 kB
VmFlags: rd wr mr mw me de ht
";

    #[test]
    fn sums_hugetlb_fields_and_counts_hugetlb_vmas() {
        let s = parse_smaps(HUGETLB, 0x7f0040000000, 0x7f0040600000).unwrap();
        assert_eq!(
            s,
            SmapsSum {
                vmas: 2,
                kb: [0, 0, 0, 0, 0, 0, 0, 0, 0, 2048, 4096],
                hugetlb_vmas: 2,
            }
        );
        assert_eq!(
            s.fields()[9..],
            [("Shared_Hugetlb", 2048), ("Private_Hugetlb", 4096)]
        );
        // Base-page VMAs are not HugeTLB ones.
        let s = parse_smaps(SAMPLE, 0x7f0000000000, 0x7f0000400000).unwrap();
        assert_eq!(s.hugetlb_vmas, 0);
    }

    #[test]
    fn no_vma_is_zero() {
        let s = parse_smaps(SAMPLE, 0x1000, 0x2000).unwrap();
        assert_eq!(s, SmapsSum::default());
    }

    #[test]
    fn a_straddling_vma_counts_whole() {
        let s = parse_smaps(SAMPLE, 0x7f0000100000, 0x7f0000300000).unwrap();
        assert_eq!(
            s,
            parse_smaps(SAMPLE, 0x7f0000000000, 0x7f0000400000).unwrap()
        );
        let v = parse_smaps_vmas(SAMPLE, 0x7f0000100000, 0x7f0000201000).unwrap();
        assert_eq!(
            v.iter().map(|v| (v.start, v.end)).collect::<Vec<_>>(),
            [
                (0x7f0000000000, 0x7f0000200000),
                (0x7f0000200000, 0x7f0000400000)
            ]
        );
        assert_eq!(v[1].kb[0], 8);
    }

    #[test]
    fn field_names_starting_with_hex_digits_are_not_headers() {
        assert_eq!(vma_header("AnonHugePages:      2048 kB"), None);
        assert_eq!(
            vma_header("ffff-10000 rw-p 0 0:0 0"),
            Some((0xffff, 0x10000))
        );
    }
}
