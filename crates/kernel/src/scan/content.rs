//! Which present pages of another process are zero-filled, read through
//! `/proc/PID/mem` (Linux 6.18 `fs/proc/base.c`: `mem_rw` →
//! `access_remote_vm`, a GUP with FOLL_FORCE and without FOLL_PIN).
//!
//! Why not `process_vm_readv`: it pins (`pin_user_pages_remote`, FOLL_PIN),
//! and a read pin of an anon page that is not exclusive — shared with a
//! fork — makes GUP unshare it (`gup_must_unshare`), a copy-on-write in the
//! target: the scan would change the process it measures. `mem_rw` takes
//! plain references, which never unshare and never set the accessed bit
//! (no FOLL_TOUCH).
//!
//! Only pages pagemap showed present are read, so nothing is faulted in —
//! unless the target unmaps a page between the pagemap read and this read:
//! then the read fault maps the shared zero page there (no memory is
//! allocated). A quiescent target is never changed.
//!
//! "Zero-filled" is the kernel's test (`thp_underused`, and
//! `try_to_map_unused_to_zeropage` in mm/migrate.c: `memchr_inv(page, 0,
//! PAGE_SIZE)`): every byte of the 4 KiB page is 0.

use crate::error::{KernelError, Result};
use hugelab_workload::units::PAGE_SIZE;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Largest read in one pread: 2 MiB, one PMD-sized THP.
const READ_PAGES: usize = 512;
const WORDS: usize = PAGE_SIZE as usize / 8;

pub struct ContentReader {
    file: File,
    path: String,
    threads: usize,
}

impl ContentReader {
    /// A reader of process `pid`'s pages on `threads` threads (see
    /// [`super::scan_threads`]).
    pub fn open(pid: i32, threads: usize) -> Result<ContentReader> {
        let path = format!("/proc/{pid}/mem");
        let file = File::open(&path).map_err(|e| KernelError::io(&path, e))?;
        Ok(ContentReader {
            file,
            path,
            threads,
        })
    }

    /// For runs `(addr, n)` of present pages, fills `zero` (one entry per
    /// page, the runs one after another) with whether each is zero-filled.
    pub fn zero_pages(&self, runs: &[(u64, usize)], zero: &mut [bool]) -> Result<()> {
        // Cut the runs into reads of at most READ_PAGES, each with its slice
        // of `zero`, and deal them out to the threads round-robin.
        let mut pieces: Vec<(u64, &mut [bool])> = Vec::new();
        let mut rest = zero;
        for &(addr, n) in runs {
            let mut done = 0;
            while done < n {
                let k = (n - done).min(READ_PAGES);
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(k);
                pieces.push((addr + done as u64 * PAGE_SIZE, head));
                rest = tail;
                done += k;
            }
        }
        let threads = self.threads.min(pieces.len()).max(1);
        let mut shares: Vec<Vec<(u64, &mut [bool])>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, p) in pieces.into_iter().enumerate() {
            shares[i % threads].push(p);
        }
        let work = |share: Vec<(u64, &mut [bool])>| -> Result<()> {
            let mut buf = vec![0u64; READ_PAGES * WORDS];
            for (at, out) in share {
                let buf = &mut buf[..out.len() * WORDS];
                read_exact_at(&self.file, buf, at).map_err(|e| read_error(&self.path, at, e))?;
                for (z, page) in out.iter_mut().zip(buf.chunks_exact(WORDS)) {
                    *z = is_zero(page);
                }
            }
            Ok(())
        };
        if threads == 1 {
            return shares.into_iter().try_for_each(work);
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = shares.into_iter().map(|sh| s.spawn(|| work(sh))).collect();
            handles
                .into_iter()
                .try_for_each(|h| h.join().expect("a content reader thread panicked"))
        })
    }
}

fn read_error(path: &str, at: u64, e: io::Error) -> KernelError {
    // mem_rw reads nothing once the mm is gone: the process exited.
    // An exited process's mem reads nothing, or fails with ESRCH: either
    // keeps its errno, which is how `is_gone` knows it (a process that exits
    // during `scan --all` is counted, not an error).
    if e.kind() == io::ErrorKind::UnexpectedEof || e.raw_os_error() == Some(libc::ESRCH) {
        return KernelError::Io {
            path: path.into(),
            err: io::Error::from_raw_os_error(libc::ESRCH),
            why: Some(format!("the process exited while {at:#x} was read")),
        };
    }
    KernelError::io(
        path,
        io::Error::new(e.kind(), format!("reading {at:#x}: {e}")),
    )
}

fn read_exact_at(file: &File, buf: &mut [u64], at: u64) -> io::Result<()> {
    // SAFETY: a u64 slice viewed as its bytes; every byte pattern is valid.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) };
    let mut done = 0;
    while done < bytes.len() {
        match file.read_at(&mut bytes[done..], at + done as u64) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// All 512 words zero. OR-folding in chunks lets the compiler vectorise
/// and still stops early on the (common) used page.
fn is_zero(page: &[u64]) -> bool {
    page.chunks_exact(64)
        .all(|c| c.iter().fold(0, |acc, &w| acc | w) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_test() {
        let mut p = vec![0u64; 512];
        assert!(is_zero(&p));
        p[511] = 1 << 63;
        assert!(!is_zero(&p));
    }

    #[test]
    fn reads_own_pages() {
        // Our own memory through /proc/self/mem: one zero page, one not.
        let mut mem = vec![0u8; 4 * PAGE_SIZE as usize];
        let base = (mem.as_ptr() as u64).next_multiple_of(PAGE_SIZE);
        let off = (base - mem.as_ptr() as u64) as usize;
        mem[off + PAGE_SIZE as usize + 7] = 1;
        let r = ContentReader::open(std::process::id() as i32, 2).unwrap();
        let mut got = [false; 3];
        r.zero_pages(&[(base, 1), (base + PAGE_SIZE, 2)], &mut got)
            .unwrap();
        assert_eq!(got, [true, false, true]);
        std::hint::black_box(&mem);
    }
}
