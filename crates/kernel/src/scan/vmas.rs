//! The VMAs of a process, from `/proc/PID/maps` (Linux 6.18
//! `fs/proc/task_mmu.c`: `show_map_vma`), with the smaps fields a scan needs.
//!
//! `/proc/PID/smaps` walks every page table to sum its fields: for a large
//! process that costs as much as the scan itself, so the scan computes
//! `Rss`, `Anonymous` and the PMD-mapped amounts from its own PAGEMAP_SCAN
//! ranges instead ([`Vma::account_present`]). smaps is read only for
//! `VmFlags` (`lo`, `ht`), and only when `/proc/PID/status` says some memory
//! is locked or hugetlb.

use crate::error::{KernelError, Result};
use crate::smaps::{field, vma_header};
use serde::Serialize;
use std::io;

/// One VMA: its header line, its VmFlags and the smaps fields the scan uses, in kB.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// `rwxp` as printed.
    pub perms: String,
    pub offset: u64,
    /// `major:minor` as printed (hex).
    pub dev: String,
    pub inode: u64,
    /// The path or `[heap]`-style name; empty for anonymous memory.
    pub name: String,
    /// smaps `Rss`, `Anonymous`, `AnonHugePages` and `ShmemPmdMapped +
    /// FilePmdMapped`, as [`Vma::account_present`] computes them.
    pub rss_kb: u64,
    pub anonymous_kb: u64,
    pub anon_huge_kb: u64,
    pub file_pmd_kb: u64,
    /// `VmFlags` has `lo` (VM_LOCKED).
    pub locked: bool,
    /// `VmFlags` has `ht` (a HugeTLB VMA: its pages are no THPs).
    pub hugetlb: bool,
}

impl Vma {
    /// thpmaps scans only VMAs that are accessible and have resident pages.
    pub fn accessible(&self) -> bool {
        self.perms.as_bytes()[..3].iter().any(|&c| c != b'-')
    }
    /// Private anonymous memory (no file, not shared): where the under-used
    /// shrinker's folios live, and where a PMD maps an anon THP.
    pub fn private_anon(&self) -> bool {
        self.inode == 0 && self.perms.as_bytes().get(3) == Some(&b'p')
    }
}

/// The VMAs of process `pid`, their smaps fields still zero.
pub fn read_vmas(pid: i32) -> Result<Vec<Vma>> {
    let mut vmas = read_parsed(&format!("/proc/{pid}/maps"))?;
    let status = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&status).map_err(|e| KernelError::io(&status, e))?;
    let nonzero = |name: &str| {
        text.lines()
            .filter_map(field)
            .any(|(n, v)| n == name && v != "0")
    };
    if nonzero("VmLck") || nonzero("HugetlbPages") {
        let flagged = read_parsed(&format!("/proc/{pid}/smaps"))?;
        for v in &mut vmas {
            if let Some(f) = flagged
                .iter()
                .find(|f| f.start == v.start && f.end == v.end)
            {
                v.locked = f.locked;
                v.hugetlb = f.hugetlb;
            }
        }
    }
    Ok(vmas)
}

fn read_parsed(path: &str) -> Result<Vec<Vma>> {
    let text = std::fs::read_to_string(path).map_err(|e| KernelError::io(path, e))?;
    parse_vmas(&text)
        .map_err(|msg| KernelError::io(path, io::Error::new(io::ErrorKind::InvalidData, msg)))
}

impl Vma {
    /// Adds the smaps fields of a present range of `pages` with PAGEMAP_SCAN
    /// categories `cat`: as `smaps_account` counts them, the zero page is
    /// in no field, a PMD-mapped anon THP is `AnonHugePages`, a PMD-mapped
    /// file or shmem one `FilePmdMapped` (the scan only needs their sum).
    pub fn account_present(&mut self, cat: u64, pages: u64) {
        use crate::pagemap::{PAGE_IS_FILE, PAGE_IS_HUGE, PAGE_IS_PFNZERO};
        if cat & PAGE_IS_PFNZERO != 0 {
            return;
        }
        let kb = pages * hugelab_workload::units::PAGE_KB;
        self.rss_kb += kb;
        let file = cat & PAGE_IS_FILE != 0;
        if !file {
            self.anonymous_kb += kb;
        }
        if cat & PAGE_IS_HUGE != 0 {
            if file {
                self.file_pmd_kb += kb;
            } else {
                self.anon_huge_kb += kb;
            }
        }
    }
}

/// The parser behind [`read_vmas`], on the text of a maps or smaps file.
pub fn parse_vmas(text: &str) -> std::result::Result<Vec<Vma>, String> {
    let mut vmas: Vec<Vma> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let bad = |what: &str| format!("line {}: {what}: {line:?}", n + 1);
        if let Some((start, end)) = vma_header(line) {
            let mut w = line.split_ascii_whitespace().skip(1);
            let perms = w
                .next()
                .filter(|p| p.len() == 4)
                .ok_or_else(|| bad("no permissions"))?;
            let offset = w
                .next()
                .and_then(|o| u64::from_str_radix(o, 16).ok())
                .ok_or_else(|| bad("no offset"))?;
            let dev = w.next().ok_or_else(|| bad("no device"))?;
            let inode = w
                .next()
                .and_then(|i| i.parse().ok())
                .ok_or_else(|| bad("no inode"))?;
            let name = w.collect::<Vec<_>>().join(" ");
            vmas.push(Vma {
                start,
                end,
                perms: perms.to_string(),
                offset,
                dev: dev.to_string(),
                inode,
                name,
                ..Vma::default()
            });
            continue;
        }
        let Some(vma) = vmas.last_mut() else {
            return Err(bad("a field before the first VMA"));
        };
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            vma.locked = flags.split_ascii_whitespace().any(|f| f == "lo");
            vma.hugetlb = flags.split_ascii_whitespace().any(|f| f == "ht");
            continue;
        }
    }
    Ok(vmas)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c0a00000-55d0c0a21000 r-xp 00002000 fd:01 1183 /usr/bin/cat
Rss:                 132 kB
Anonymous:             0 kB
AnonHugePages:         0 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
VmFlags: rd ex mr mw me
7f0000000000-7f0000400000 rw-p 00000000 00:00 0 
Rss:                4096 kB
Anonymous:          4096 kB
AnonHugePages:      2048 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
VmFlags: rd wr mr mw me lo ac hg
7ffc00000000-7ffc00021000 ---p 00000000 00:00 0 [stack guard]
Rss:                   0 kB
VmFlags: mr mw me
";

    #[test]
    fn parses_headers_and_flags() {
        let v = parse_vmas(SAMPLE).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].name, "/usr/bin/cat");
        assert_eq!(
            (v[0].offset, v[0].inode, v[0].dev.as_str()),
            (0x2000, 1183, "fd:01")
        );
        assert!(!v[0].private_anon() && v[0].accessible());
        assert!(v[1].locked && v[1].private_anon() && !v[1].hugetlb);
        assert_eq!(v[2].name, "[stack guard]");
        assert!(!v[2].accessible());
    }

    #[test]
    fn present_ranges_make_the_smaps_fields() {
        use crate::pagemap::{PAGE_IS_FILE, PAGE_IS_HUGE, PAGE_IS_PFNZERO, PAGE_IS_PRESENT};
        let mut v = Vma::default();
        v.account_present(PAGE_IS_PRESENT, 3);
        v.account_present(PAGE_IS_PRESENT | PAGE_IS_HUGE, 512);
        v.account_present(PAGE_IS_PRESENT | PAGE_IS_PFNZERO, 10);
        v.account_present(PAGE_IS_PRESENT | PAGE_IS_HUGE | PAGE_IS_PFNZERO, 512);
        v.account_present(PAGE_IS_PRESENT | PAGE_IS_FILE, 2);
        assert_eq!(
            (v.rss_kb, v.anonymous_kb, v.anon_huge_kb, v.file_pmd_kb),
            (517 * 4, 515 * 4, 2048, 0)
        );
    }

    #[test]
    fn a_field_before_any_vma_is_an_error() {
        let e = parse_vmas("Rss: 4 kB\n").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
    }
}
