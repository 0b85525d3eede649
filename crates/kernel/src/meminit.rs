//! Memory the kernel has not finished initialising: deferred struct-page
//! initialisation (mm/mm_init.c, Linux 6.18: `deferred_init_memmap`, and
//! `deferred_grow_zone`, which initialises more of a zone when an
//! allocation finds it short). Some vendor kernels (these VMs boot with
//! `deferred_init=lazy`) leave part of every zone to be initialised on
//! demand, long after boot.
//!
//! Why hugelab cares: /proc/kpageflags reads 0 for every page of a memory
//! block whose initialisation has not finished, including pages already
//! handed out and mapped (seen here: blocks 150–199 of this VM, 6.25 GiB,
//! read 0 in full, and the agents' pages there too; after one process
//! touched 20 GiB no block read 0 in full). A region whose folios landed
//! there has unknown folio counts ("kpageflags read 0 ..."), in every
//! re-run that gets the same memory.
//!
//! [`uninitialised`] finds those blocks: online memory blocks
//! (/sys/devices/system/memory) none of whose pages has a flag. An
//! initialised page always has one (a free page `KPF_BUDDY`, a used one its
//! use), so a whole 128 MiB block of zeros is memory the kernel has not
//! initialised (single pages with no flag exist; whole blocks of them do
//! not). [`initialise`] makes the kernel finish: it touches free memory in
//! steps until no such block is left or `MemAvailable` reaches the reserve,
//! then frees it all. That evicts clean page cache, as `drop_caches` does,
//! and cannot be undone, nor does it need to be: initialised memory is what
//! the kernel ends with anyway. Simplification: the check reads flags, not
//! the kernel's own record of what is initialised, which it does not export.

use crate::error::{KernelError, Result};
use crate::pagemap::KPAGEFLAGS;
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

/// The memory block directory of sysfs (drivers/base/memory.c).
pub const MEMORY_BLOCKS: &str = "/sys/devices/system/memory";
/// Bytes touched per step of [`initialise`].
const STEP: u64 = 128 << 20;
/// Steps between two looks at the blocks still uninitialised.
const STEPS_PER_CHECK: u32 = 8;

/// The online memory blocks whose pages all read 0 in /proc/kpageflags.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Uninitialised {
    pub block_bytes: u64,
    /// Their numbers (`memoryN`), ascending.
    pub blocks: Vec<u64>,
}

impl Uninitialised {
    pub fn bytes(&self) -> u64 {
        self.block_bytes * self.blocks.len() as u64
    }
}

/// This machine's uninitialised memory blocks. Needs root (kpageflags).
pub fn uninitialised() -> Result<Uninitialised> {
    let dir = Path::new(MEMORY_BLOCKS);
    let size_file = dir.join("block_size_bytes");
    let text = fs::read_to_string(&size_file).map_err(|e| KernelError::io(&size_file, e))?;
    let block_bytes = u64::from_str_radix(text.trim(), 16).map_err(|_| {
        KernelError::Refused(format!(
            "{}: not a hexadecimal size: {:?}",
            size_file.display(),
            text.trim()
        ))
    })?;
    let mut online = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| KernelError::io(dir, e))? {
        let entry = entry.map_err(|e| KernelError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix("memory")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let state = fs::read_to_string(entry.path().join("state")).unwrap_or_default();
        if state.trim() == "online" {
            online.push(n);
        }
    }
    online.sort_unstable();
    zero_blocks(block_bytes, &online)
}

/// Those of the memory blocks `candidates` (of `block_bytes` each) whose
/// pages all read 0.
fn zero_blocks(block_bytes: u64, candidates: &[u64]) -> Result<Uninitialised> {
    let kpf = File::open(KPAGEFLAGS).map_err(|e| KernelError::io(KPAGEFLAGS, e))?;
    let pages = block_bytes / 4096;
    let mut blocks = Vec::new();
    for &n in candidates {
        if all_zero(&kpf, n * pages, pages)? {
            blocks.push(n);
        }
    }
    Ok(Uninitialised {
        block_bytes,
        blocks,
    })
}

/// Whether every page of `pages` pages from PFN `first` reads 0; stops at
/// the first that does not.
fn all_zero(kpf: &File, first: u64, pages: u64) -> Result<bool> {
    const CHUNK: u64 = 4096;
    let mut buf = vec![0u8; (CHUNK * 8) as usize];
    let mut pfn = first;
    while pfn < first + pages {
        let n = CHUNK.min(first + pages - pfn);
        let want = &mut buf[..(n * 8) as usize];
        let got = kpf
            .read_at(want, pfn * 8)
            .map_err(|e| KernelError::io(KPAGEFLAGS, e))?;
        if got == 0 {
            return Ok(true); // past the end of memory
        }
        if want[..got].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        pfn += (got / 8) as u64;
    }
    Ok(true)
}

/// What [`initialise`] did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Initialised {
    pub before: Uninitialised,
    pub after: Uninitialised,
    /// The most it held at once.
    pub touched_bytes: u64,
    pub seconds: f64,
    /// Why it stopped before every block was initialised, if it did.
    pub stopped: Option<String>,
}

/// Touches free memory until no uninitialised block is left, or until
/// `MemAvailable` would drop below `reserve` bytes, then frees it. This
/// process is the OOM killer's first choice meanwhile (oom_score_adj 1000,
/// put back after).
pub fn initialise(reserve: u64) -> Result<Initialised> {
    let t = Instant::now();
    let before = uninitialised()?;
    let mut left = before.clone();
    let _victim = OomVictim::become_one();
    let mut held = Held::default();
    let mut stopped = None;
    let mut steps = 0;
    while !left.blocks.is_empty() {
        if crate::hugetlb::mem_available()?.0 < reserve + STEP {
            stopped = Some(format!(
                "MemAvailable reached the reserve of {} MiB",
                reserve >> 20
            ));
            break;
        }
        if let Err(e) = held.grow(STEP) {
            stopped = Some(format!("mapping {} MiB more failed: {e}", STEP >> 20));
            break;
        }
        steps += 1;
        if steps % STEPS_PER_CHECK == 0 {
            left = zero_blocks(left.block_bytes, &left.blocks)?;
        }
    }
    let touched_bytes = held.bytes();
    drop(held);
    Ok(Initialised {
        after: uninitialised()?,
        before,
        touched_bytes,
        seconds: t.elapsed().as_secs_f64(),
        stopped,
    })
}

/// Anonymous mappings written in full (MADV_POPULATE_WRITE), unmapped on
/// drop.
#[derive(Default)]
pub struct Held {
    maps: Vec<(usize, usize)>,
}

/// Takes `bytes` of free memory now (in 2 MiB THPs where the machine's THP
/// setting allows, MADV_HUGEPAGE, else in pages) and holds it until
/// dropped. The page allocator hands out what was freed last first, so a
/// workload run again right after gets the pages its last run freed: where
/// those read 0 in /proc/kpageflags (a 2 MiB block the kernel is
/// reporting to the host, or has not initialised), its folios are unknown
/// again. Held across a re-run, this takes those pages first.
pub fn hold_recently_freed(bytes: u64) -> std::io::Result<Held> {
    let mut held = Held::default();
    held.grow_advised(bytes, libc::MADV_HUGEPAGE)?;
    Ok(held)
}

impl Held {
    fn grow(&mut self, len: u64) -> std::io::Result<()> {
        self.grow_advised(len, libc::MADV_NORMAL)
    }

    fn grow_advised(&mut self, len: u64, advice: libc::c_int) -> std::io::Result<()> {
        let len = len as usize;
        // SAFETY: a new private anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        self.maps.push((p as usize, len));
        // SAFETY: advises the mapping made above, within its bounds (a
        // refused MADV_HUGEPAGE leaves it in pages).
        unsafe { libc::madvise(p, len, advice) };
        // SAFETY: as above.
        if unsafe { libc::madvise(p, len, libc::MADV_POPULATE_WRITE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn bytes(&self) -> u64 {
        self.maps.iter().map(|&(_, len)| len as u64).sum()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for &(p, len) in &self.maps {
            // SAFETY: unmaps a mapping this value made and nothing else uses.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
        }
    }
}

/// This process's oom_score_adj at 1000 while it lives, the old value
/// after.
struct OomVictim {
    old: Option<String>,
}

const OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";

impl OomVictim {
    fn become_one() -> OomVictim {
        let old = fs::read_to_string(OOM_SCORE_ADJ).ok();
        if old.is_some() {
            let _ = fs::write(OOM_SCORE_ADJ, "1000");
        }
        OomVictim { old }
    }
}

impl Drop for OomVictim {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            let _ = fs::write(OOM_SCORE_ADJ, old.trim());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A fake kpageflags file of `flags`, one u64 per PFN (unlinked once
    /// open).
    fn fake(flags: &[u64]) -> File {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "hugelab-meminit-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        fs::remove_file(&path).unwrap();
        for v in flags {
            f.write_all(&v.to_ne_bytes()).unwrap();
        }
        f
    }

    #[test]
    fn a_block_is_all_zero_only_when_no_page_has_a_flag() {
        let mut flags = vec![0u64; 10_000];
        let f = fake(&flags);
        assert!(all_zero(&f, 0, 10_000).unwrap());
        flags[9_999] = 1 << 10; // KPF_BUDDY, on the last page
        let f = fake(&flags);
        assert!(!all_zero(&f, 0, 10_000).unwrap());
        assert!(all_zero(&f, 0, 9_999).unwrap());
        assert!(!all_zero(&f, 5_000, 5_000).unwrap());
    }

    #[test]
    fn reading_past_the_end_of_memory_is_no_flag() {
        let f = fake(&[0, 0]);
        assert!(all_zero(&f, 0, 8).unwrap());
    }
}
