//! A perf ring buffer: the metadata page and 2^n data pages mapped from a
//! CPU's leader event, read record by record (`data_head` read with acquire,
//! `data_tail` written with release, as tools/perf's mmap reader does).

use crate::error::{KernelError, Result};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

// Offsets in struct perf_event_mmap_page (include/uapi/linux/perf_event.h).
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;

pub struct Ring {
    base: *mut u8,
    len: usize,
    data: usize,
    size: u64,
    /// One record, copied out when it wraps around the end of the buffer.
    scratch: Vec<u8>,
}

// SAFETY: the mapping is owned by the Ring and only read through &mut self.
unsafe impl Send for Ring {}

impl Ring {
    /// Maps `bytes` of data (rounded up to a power of two of pages) for `fd`.
    pub fn map(fd: &OwnedFd, bytes: u64) -> Result<Ring> {
        let page = page_size();
        let len = bytes
            .div_ceil(page)
            .max(1)
            .checked_next_power_of_two()
            .and_then(|pages| (pages + 1).checked_mul(page))
            .and_then(|len| usize::try_from(len).ok())
            .ok_or_else(|| KernelError::Refused(format!("a ring of {bytes} bytes is too large")))?;
        // SAFETY: a new shared mapping of the perf event.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(KernelError::Refused(format!(
                "cannot map a {} perf ring buffer: {}",
                len - page as usize,
                io::Error::last_os_error()
            )));
        }
        let base = base.cast::<u8>();
        // SAFETY: the metadata page is mapped; the kernel fills these in.
        let (data, size) = unsafe {
            (
                std::ptr::read_volatile(base.add(DATA_OFFSET).cast::<u64>()) as usize,
                std::ptr::read_volatile(base.add(DATA_SIZE).cast::<u64>()),
            )
        };
        Ok(Ring {
            base,
            len,
            data,
            size,
            scratch: Vec::new(),
        })
    }

    /// The bytes of data the ring holds.
    pub fn capacity(&self) -> u64 {
        self.size
    }

    /// Hands every record written since the last call to `each`, then
    /// gives their room back to the kernel. Returns the bytes read.
    pub fn drain(&mut self, mut each: impl FnMut(&[u8])) -> u64 {
        // SAFETY: both words are in the mapped metadata page, 8-byte aligned.
        let (head, tail) = unsafe {
            (
                &*self.base.add(DATA_HEAD).cast::<AtomicU64>(),
                &*self.base.add(DATA_TAIL).cast::<AtomicU64>(),
            )
        };
        let end = head.load(Ordering::Acquire);
        let start = tail.load(Ordering::Relaxed);
        let mut at = start;
        while at + 8 <= end {
            let mut header = [0u8; 8];
            self.copy(at, &mut header);
            let size = u64::from(u16::from_ne_bytes([header[6], header[7]]));
            if size < 8 || at + size > end {
                break;
            }
            let mut record = std::mem::take(&mut self.scratch);
            record.resize(size as usize, 0);
            self.copy(at, &mut record);
            each(&record);
            self.scratch = record;
            at += size;
        }
        tail.store(at, Ordering::Release);
        at - start
    }

    /// Copies `out.len()` bytes from ring position `at`, across the wrap.
    fn copy(&self, at: u64, out: &mut [u8]) {
        let off = (at % self.size) as usize;
        let first = out.len().min(self.size as usize - off);
        // SAFETY: both ranges lie within the data area of the mapping.
        unsafe {
            let data = self.base.add(self.data);
            std::ptr::copy_nonoverlapping(data.add(off), out.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(data, out.as_mut_ptr().add(first), out.len() - first);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps what map() mapped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}
