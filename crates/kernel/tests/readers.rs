//! The smaps and pagemap readers against the real kernel, on memory mapped in
//! this test process itself.
//!
//! They change no tunable (other kernel runs on the machine depend on them):
//! they need the machine's defaults, THP `enabled=madvise` with
//! `hugepages-2048kB` at `inherit` or `madvise`, and skip, saying why, when
//! not root or when the defaults differ. Settings are read again before the
//! checks, so that a run of another engineer changing them mid-test skips
//! instead of failing.

use hugelab_kernel::pagemap::{scan_folios, FolioScan};
use hugelab_kernel::smaps::{region_smaps, SmapsSum};
use hugelab_workload::smaps::SmapsField;
use std::fs;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const PMD: usize = 2 << 20;

fn thp_file(name: &str) -> String {
    fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{name}"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

fn selected(s: &str) -> &str {
    match (s.find('['), s.find(']')) {
        (Some(a), Some(b)) if a < b => &s[a + 1..b],
        _ => s,
    }
}

/// Every THP file these tests depend on, to notice a change during a test.
fn thp_state() -> Vec<String> {
    let mut files = vec!["enabled".to_string(), "use_zero_page".to_string()];
    let mut sizes: Vec<String> = fs::read_dir("/sys/kernel/mm/transparent_hugepage")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("hugepages-"))
                .map(|n| format!("{n}/enabled"))
                .filter(|f| {
                    fs::metadata(format!("/sys/kernel/mm/transparent_hugepage/{f}")).is_ok()
                })
                .collect()
        })
        .unwrap_or_default();
    sizes.sort();
    files.extend(sizes);
    files
        .iter()
        .map(|f| format!("{f}={}", thp_file(f)))
        .collect()
}

/// Why the kernel tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: pagemap PFNs and /proc/kpageflags need root".into());
    }
    let enabled = thp_file("enabled");
    if selected(&enabled) != "madvise" {
        return Some(format!(
            "transparent_hugepage/enabled is {enabled:?}, these tests expect the default madvise"
        ));
    }
    let pmd = thp_file("hugepages-2048kB/enabled");
    if !matches!(selected(&pmd), "inherit" | "madvise") {
        return Some(format!(
            "hugepages-2048kB/enabled is {pmd:?}, these tests expect inherit or madvise"
        ));
    }
    if let Err(e) = fs::File::open("/proc/kpageflags") {
        return Some(format!("/proc/kpageflags: {e}"));
    }
    None
}

macro_rules! require_kernel {
    () => {
        if let Some(why) = skip_reason() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// Panics unless the THP settings are still those seen at the start; a
/// concurrent change is reported as a skip, since the counts then say
/// nothing about the readers.
fn settings_unchanged(before: &[String]) -> bool {
    let now = thp_state();
    if now != before {
        eprintln!("skipped: THP settings changed during the test: {before:?} -> {now:?}");
        return false;
    }
    true
}

/// A 2 MiB-aligned anonymous region with a PROT_NONE guard page on each
/// side: the guards keep the region's VMAs from merging with neighbouring
/// mappings of the same flags (other tests' regions, the allocator's), which
/// would make its smaps VMA straddle the region.
struct Region {
    start: usize,
    size: usize,
}

impl Region {
    fn new(size: usize, advice: libc::c_int) -> Region {
        let len = size + PMD + 2 * PAGE;
        // SAFETY: an anonymous private mapping at an address of the kernel's
        // choice; every part of it is unmapped or kept by this Region.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(
                base,
                libc::MAP_FAILED,
                "mmap: {}",
                std::io::Error::last_os_error()
            );
            let base = base as usize;
            let start = (base + PAGE + PMD - 1) & !(PMD - 1);
            let guard_lo = start - PAGE;
            let guard_hi = start + size;
            let end = base + len;
            if guard_lo > base {
                assert_eq!(libc::munmap(base as *mut _, guard_lo - base), 0);
            }
            if guard_hi + PAGE < end {
                assert_eq!(
                    libc::munmap((guard_hi + PAGE) as *mut _, end - guard_hi - PAGE),
                    0
                );
            }
            assert_eq!(libc::mprotect(guard_lo as *mut _, PAGE, libc::PROT_NONE), 0);
            assert_eq!(libc::mprotect(guard_hi as *mut _, PAGE, libc::PROT_NONE), 0);
            assert_eq!(
                libc::madvise(start as *mut _, size, advice),
                0,
                "madvise: {}",
                std::io::Error::last_os_error()
            );
            Region { start, size }
        }
    }

    fn range(&self) -> (u64, u64) {
        (self.start as u64, (self.start + self.size) as u64)
    }

    fn write(&self, offset: usize, step: usize, count: usize) {
        for i in 0..count {
            let at = offset + i * step;
            assert!(at < self.size);
            // SAFETY: inside the mapping, which is readable and writable.
            unsafe { std::ptr::write_volatile((self.start + at) as *mut u8, 1) };
        }
    }

    fn read(&self, offset: usize, step: usize, count: usize) {
        let mut sum = 0u8;
        for i in 0..count {
            let at = offset + i * step;
            assert!(at < self.size);
            // SAFETY: inside the mapping, which is readable.
            sum = sum
                .wrapping_add(unsafe { std::ptr::read_volatile((self.start + at) as *const u8) });
        }
        assert_eq!(sum, 0, "fresh anonymous memory reads zero");
    }

    fn madvise(&self, offset: usize, len: usize, advice: libc::c_int) {
        // SAFETY: a range inside this Region's mapping.
        let rc = unsafe { libc::madvise((self.start + offset) as *mut _, len, advice) };
        assert_eq!(rc, 0, "madvise: {}", std::io::Error::last_os_error());
    }

    fn scan(&self) -> FolioScan {
        let (s, e) = self.range();
        scan_folios(pid(), s, e).expect("scan_folios")
    }

    fn smaps(&self) -> SmapsSum {
        let (s, e) = self.range();
        region_smaps(pid(), s, e).expect("region_smaps")
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the region and its two guard pages, all mapped by new().
        unsafe { libc::munmap((self.start - PAGE) as *mut _, self.size + 2 * PAGE) };
    }
}

fn pid() -> i32 {
    std::process::id() as i32
}

#[test]
fn base_pages() {
    require_kernel!();
    let before = thp_state();
    let r = Region::new(4 << 20, libc::MADV_NOHUGEPAGE);
    r.write(0, PAGE, 64);
    let scan = r.scan();
    let sm = r.smaps();
    // Two VMAs once part of the region changes protection.
    // SAFETY: the second half of the region, mapped by Region::new.
    let rc = unsafe { libc::mprotect((r.start + (2 << 20)) as *mut _, 2 << 20, libc::PROT_READ) };
    assert_eq!(rc, 0);
    let split = r.smaps();
    eprintln!("4K pages: {scan:?} {sm:?}; after mprotect: {split:?}");
    if !settings_unchanged(&before) {
        return;
    }
    assert_eq!(scan.total[0] + scan.unknown_pages, 64, "{scan:?}");
    assert_eq!(scan.total[1..], [0; 9], "{scan:?}");
    assert_eq!((scan.pmd_mapped, scan.zero_pages), (0, 0), "{scan:?}");
    assert_eq!(sm.vmas, 1);
    assert_eq!(
        sm.fields(),
        [
            ("Rss", 256),
            ("Pss", 256),
            ("Shared_Clean", 0),
            ("Shared_Dirty", 0),
            ("Private_Clean", 0),
            ("Private_Dirty", 256),
            ("Anonymous", 256),
            ("LazyFree", 0),
            ("AnonHugePages", 0),
            ("Shared_Hugetlb", 0),
            ("Private_Hugetlb", 0)
        ]
    );
    assert_eq!(sm.hugetlb_vmas, 0);
    assert_eq!(split.vmas, 2);
    assert_eq!(split.get(SmapsField::Rss), 256);
}

#[test]
fn pmd_thp_then_pte_mapped() {
    require_kernel!();
    let before = thp_state();
    let r = Region::new(4 << 20, libc::MADV_HUGEPAGE);
    r.write(0, PMD, 2);
    // The THPs exist now; NOHUGEPAGE keeps khugepaged (which may scan this
    // process at any time) from collapsing the split THP back under a PMD.
    r.madvise(0, r.size, libc::MADV_NOHUGEPAGE);
    let scan = r.scan();
    let sm = r.smaps();
    // Zapping one page of a PMD-mapped THP splits the PMD, not the folio
    // (capability 3c): 511 PTEs keep mapping the order-9 folio.
    r.madvise(5 * PAGE, PAGE, libc::MADV_DONTNEED);
    let after = r.scan();
    let sm_after = r.smaps();
    eprintln!("PMD THP: {scan:?} {sm:?}; after DONTNEED of one page: {after:?} {sm_after:?}");
    if !settings_unchanged(&before) {
        return;
    }
    assert_eq!(scan.total, [0, 0, 0, 0, 0, 0, 0, 0, 0, 2], "{scan:?}");
    assert_eq!(
        (scan.pmd_mapped, scan.unknown_pages, scan.zero_pages),
        (2, 0, 0)
    );
    assert_eq!(sm.get(SmapsField::AnonHugePages), 4096);
    assert_eq!(sm.get(SmapsField::Rss), 4096);

    assert_eq!(after.pmd_mapped, 1, "{after:?}");
    assert_eq!(after.total[..9], [0; 9], "{after:?}");
    // The PTE-mapped THP is known, or all 511 of its pages are unknown
    // (its 2 MiB PFN block reads 0 in kpageflags).
    match after.unknown_pages {
        0 => assert_eq!(after.total[9], 2, "{after:?}"),
        511 => assert_eq!(after.total[9], 1, "{after:?}"),
        n => panic!("{n} unknown pages: a folio is partly known: {after:?}"),
    }
    assert_eq!(after.pte_mapped(9), after.total[9] - 1);
    assert_eq!(sm_after.get(SmapsField::Rss), 4092);
    assert_eq!(sm_after.get(SmapsField::AnonHugePages), 2048);
}

#[test]
fn read_maps_the_zero_page() {
    require_kernel!();
    let before = thp_state();
    let r = Region::new(4 << 20, libc::MADV_NOHUGEPAGE);
    r.read(0, PAGE, 100);
    let scan = r.scan();
    let sm = r.smaps();
    eprintln!("zero page: {scan:?} {sm:?}");
    if !settings_unchanged(&before) {
        return;
    }
    assert_eq!(
        scan,
        FolioScan {
            zero_pages: 100,
            ..FolioScan::default()
        }
    );
    assert_eq!(sm.get(SmapsField::Rss), 0);
}

#[test]
fn read_maps_the_huge_zero_folio() {
    require_kernel!();
    if thp_file("use_zero_page") != "1" {
        eprintln!("skipped: transparent_hugepage/use_zero_page is not 1");
        return;
    }
    let before = thp_state();
    let r = Region::new(4 << 20, libc::MADV_HUGEPAGE);
    r.read(0, PMD, 2);
    let scan = r.scan();
    let sm = r.smaps();
    eprintln!("huge zero folio: {scan:?} {sm:?}");
    if !settings_unchanged(&before) {
        return;
    }
    assert_eq!(
        scan,
        FolioScan {
            zero_pages: 1024,
            ..FolioScan::default()
        }
    );
    assert_eq!(
        (sm.get(SmapsField::Rss), sm.get(SmapsField::AnonHugePages)),
        (0, 0)
    );
}

#[test]
fn gone_process_names_the_file() {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let dead = child.id() as i32;
    child.wait().expect("wait");
    let e = region_smaps(dead, 0, 4096).unwrap_err().to_string();
    assert!(
        e.contains(&format!("/proc/{dead}/smaps")) && e.contains("ENOENT"),
        "{e}"
    );
    let e = scan_folios(dead, 0, 4096).unwrap_err().to_string();
    assert!(
        e.contains(&format!("/proc/{dead}/pagemap")) && e.contains("ENOENT"),
        "{e}"
    );
}

fn timed_scan(r: &Region) -> (FolioScan, Duration, Duration) {
    let t = Instant::now();
    let first = r.scan();
    let cold = t.elapsed();
    let t = Instant::now();
    let second = r.scan();
    let warm = t.elapsed();
    assert_eq!(first, second, "two scans of a quiescent region differ");
    (first, cold, warm)
}

/// Scanning 1 GiB, of 4K pages and of PMD THPs, stays well under a second.
#[test]
fn one_gib_scans_fast() {
    require_kernel!();
    const GIB: usize = 1 << 30;
    let before = thp_state();

    let small = Region::new(GIB, libc::MADV_NOHUGEPAGE);
    small.write(0, PAGE, GIB / PAGE);
    let (s, s_cold, s_warm) = timed_scan(&small);
    drop(small);

    let huge = Region::new(GIB, libc::MADV_HUGEPAGE);
    huge.write(0, PMD, GIB / PMD);
    // Keeps khugepaged from collapsing the split THPs below between scans.
    huge.madvise(0, GIB, libc::MADV_NOHUGEPAGE);
    let (h, h_cold, h_warm) = timed_scan(&huge);
    let h_smaps = huge.smaps();
    // One page zapped per THP: 512 order-9 folios mapped by 511 PTEs each,
    // the case that needs whole kpageflags blocks.
    for i in 0..GIB / PMD {
        huge.madvise(i * PMD + PAGE, PAGE, libc::MADV_DONTNEED);
    }
    let (p, p_cold, p_warm) = timed_scan(&huge);
    drop(huge);

    eprintln!(
        "1 GiB of 4K pages: {s_cold:?} first, {s_warm:?} again; total[0]={} unknown={} ({:.1} %)",
        s.total[0],
        s.unknown_pages,
        100.0 * s.unknown_pages as f64 / (GIB / PAGE) as f64
    );
    eprintln!(
        "1 GiB of PMD THPs: {h_cold:?} first, {h_warm:?} again; total[9]={} pmd_mapped={} \
         AnonHugePages={} kB",
        h.total[9],
        h.pmd_mapped,
        h_smaps.get(SmapsField::AnonHugePages)
    );
    eprintln!(
        "1 GiB of PTE-mapped THPs: {p_cold:?} first, {p_warm:?} again; total[9]={} \
         pmd_mapped={} unknown={}",
        p.total[9], p.pmd_mapped, p.unknown_pages
    );
    if !settings_unchanged(&before) {
        return;
    }
    assert_eq!(s.total[0] + s.unknown_pages, (GIB / PAGE) as u64, "{s:?}");
    assert_eq!(s.total[1..], [0; 9]);
    assert_eq!(
        h.pmd_mapped * 2048,
        h_smaps.get(SmapsField::AnonHugePages),
        "{h:?}"
    );
    assert_eq!(h.total[9], h.pmd_mapped);
    // A debug build on a shared 2-vCPU VM; a release build takes about a
    // tenth of this.
    let budget = Duration::from_secs(1);
    assert!(
        s_cold < budget && h_cold < budget,
        "too slow: {s_cold:?} {h_cold:?}"
    );
}
