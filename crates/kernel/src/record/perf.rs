//! perf_event_open(2): the attribute block and the calls the recorder makes
//! (include/uapi/linux/perf_event.h, Linux 6.18). Only the fields the
//! recorder sets are named; the rest stay zero.

use crate::error::{KernelError, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// PERF_TYPE_TRACEPOINT: `config` is a tracepoint's id from tracefs.
const PERF_TYPE_TRACEPOINT: u32 = 2;
/// PERF_ATTR_SIZE_VER8: up to `config3`.
const ATTR_SIZE: u32 = 136;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// sample_type bits: the sample holds pid/tid, time and the raw tracepoint data.
const SAMPLE_TID: u64 = 1 << 1;
const SAMPLE_TIME: u64 = 1 << 2;
const SAMPLE_RAW: u64 = 1 << 10;

// The attribute's flag bits (the bitfield after read_format).
const DISABLED: u64 = 1 << 0;
const INHERIT: u64 = 1 << 1;
const MMAP: u64 = 1 << 8;
const COMM: u64 = 1 << 9;
const ENABLE_ON_EXEC: u64 = 1 << 12;
const TASK: u64 = 1 << 13;
const WATERMARK: u64 = 1 << 14;
const MMAP_DATA: u64 = 1 << 17;
const SAMPLE_ID_ALL: u64 = 1 << 18;
const MMAP2: u64 = 1 << 23;
const COMM_EXEC: u64 = 1 << 24;
const USE_CLOCKID: u64 = 1 << 25;

// ioctls: _IO('$', n) and _IOW('$', 6, char *).
const IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
const IOC_SET_FILTER: libc::c_ulong = 0x4008_2406;

/// struct perf_event_attr as of PERF_ATTR_SIZE_VER8.
#[repr(C)]
#[derive(Default)]
struct Attr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_watermark: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    reserved_3: u32,
    sig_data: u64,
    config3: u64,
}

/// What one event of the recorder is opened with.
pub struct Open {
    /// The tracepoint's id.
    pub tracepoint: u64,
    pub pid: libc::pid_t,
    pub cpu: i32,
    /// The CPU's leader: also reports MMAP2, COMM, FORK and EXIT records,
    /// and wakes the reader once `wakeup` bytes are in its buffer.
    pub leader: bool,
    pub wakeup: u32,
}

/// Opens a tracepoint counting every hit (`sample_period` 1) of `pid` and
/// every task it later creates (`inherit`), on one CPU, disabled until the
/// task's next exec (`enable_on_exec`), timed on CLOCK_MONOTONIC.
pub fn open(o: &Open) -> Result<OwnedFd> {
    let mut flags = DISABLED | INHERIT | ENABLE_ON_EXEC | SAMPLE_ID_ALL | USE_CLOCKID | WATERMARK;
    if o.leader {
        flags |= MMAP | MMAP2 | MMAP_DATA | COMM | COMM_EXEC | TASK;
    }
    let attr = Attr {
        type_: PERF_TYPE_TRACEPOINT,
        size: ATTR_SIZE,
        config: o.tracepoint,
        sample_period: 1,
        sample_type: SAMPLE_TID | SAMPLE_TIME | SAMPLE_RAW,
        read_format: FORMAT_LOST,
        flags,
        wakeup_watermark: o.wakeup,
        clockid: libc::CLOCK_MONOTONIC,
        ..Attr::default()
    };
    // SAFETY: attr is a valid perf_event_attr of the size it claims.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const Attr,
            o.pid,
            o.cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(KernelError::Refused(format!(
            "perf_event_open of tracepoint {} on CPU {} failed: {}",
            o.tracepoint,
            o.cpu,
            io::Error::last_os_error()
        )));
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// PERF_FORMAT_LOST: a read of the event gives, after its count, the
/// samples it lost (its inherited children's included). A ring that fills
/// near the end of a run never writes the PERF_RECORD_LOST it owes.
const FORMAT_LOST: u64 = 1 << 4;

/// The samples `fd`'s event lost (PERF_FORMAT_LOST), read after the run.
pub fn lost(fd: &OwnedFd) -> Result<u64> {
    let mut v = [0u64; 2];
    // SAFETY: reads at most 16 bytes into v (value, lost).
    let n = unsafe { libc::read(fd.as_raw_fd(), v.as_mut_ptr().cast(), 16) };
    if n != 16 {
        return Err(KernelError::Refused(format!(
            "read of a perf event's lost count failed: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(v[1])
}

/// Sends `fd`'s records to `leader`'s ring buffer (same CPU).
pub fn set_output(fd: &OwnedFd, leader: &OwnedFd) -> Result<()> {
    // SAFETY: both are perf event descriptors we own.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), IOC_SET_OUTPUT, leader.as_raw_fd()) };
    check(r, "PERF_EVENT_IOC_SET_OUTPUT")
}

/// Filters the event in the kernel (the tracefs filter syntax).
pub fn set_filter(fd: &OwnedFd, filter: &str) -> Result<()> {
    let c = std::ffi::CString::new(filter).expect("filters hold no NUL");
    // SAFETY: a NUL-terminated string the kernel copies.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), IOC_SET_FILTER, c.as_ptr()) };
    check(r, &format!("PERF_EVENT_IOC_SET_FILTER {filter:?}"))
}

fn check(r: libc::c_int, what: &str) -> Result<()> {
    if r < 0 {
        return Err(KernelError::Refused(format!(
            "{what} failed: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// The CPUs events can be opened on (/sys/devices/system/cpu/online).
pub fn online_cpus() -> Result<Vec<i32>> {
    let path = "/sys/devices/system/cpu/online";
    let text = std::fs::read_to_string(path).map_err(|e| KernelError::io(path, e))?;
    Ok(parse_cpu_list(text.trim()))
}

/// `0-3,6` → [0, 1, 2, 3, 6].
fn parse_cpu_list(s: &str) -> Vec<i32> {
    let mut cpus = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.splitn(2, '-').map(|n| n.parse::<i32>().ok());
        match (ends.next().flatten(), ends.next()) {
            (Some(a), None) => cpus.push(a),
            (Some(a), Some(Some(b))) => cpus.extend(a..=b),
            _ => {}
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_has_the_size_of_version_8() {
        assert_eq!(std::mem::size_of::<Attr>(), ATTR_SIZE as usize);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1"), vec![0, 1]);
        assert_eq!(parse_cpu_list("0,2-3,7"), vec![0, 2, 3, 7]);
        assert_eq!(parse_cpu_list("0"), vec![0]);
    }
}
