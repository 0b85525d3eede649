//! perf records parsed into typed events. Samples are told apart by their
//! raw data's `common_type` (the tracepoint's id); side-band records by
//! their header type. The tracepoints' field offsets are those of their
//! `format` files on Linux 6.18 (x86-64).

use serde::Serialize;

// Record types (enum perf_event_type).
const RECORD_LOST: u32 = 2;
const RECORD_COMM: u32 = 3;
const RECORD_EXIT: u32 = 4;
const RECORD_FORK: u32 = 7;
const RECORD_SAMPLE: u32 = 9;
const RECORD_MMAP2: u32 = 10;
const RECORD_LOST_SAMPLES: u32 = 13;
/// PERF_RECORD_MISC_COMM_EXEC: the COMM record of an exec.
const MISC_COMM_EXEC: u16 = 0x2000;

/// The ids of the tracepoints the recorder opens.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ids {
    pub fault_user: u64,
    pub fault_kernel: u64,
    pub sys_enter: u64,
    pub sys_exit: u64,
    pub newtask: u64,
    pub exec: u64,
}

/// One thing that happened to the recorded tree, at `time` (CLOCK_MONOTONIC
/// ns) in task `tid` of process `pid`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    pub time: u64,
    pub pid: u32,
    pub tid: u32,
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Kind {
    /// exceptions:page_fault_user / page_fault_kernel.
    Fault {
        addr: u64,
        error_code: u64,
        user: bool,
    },
    /// raw_syscalls:sys_enter of a syscall the filter lets through.
    SysEnter { nr: i64, args: [u64; 6] },
    /// raw_syscalls:sys_exit.
    SysExit { nr: i64, ret: i64 },
    /// task:task_newtask, in the parent: the new task `child` and its flags.
    NewTask {
        child: u32,
        comm: String,
        clone_flags: u64,
    },
    /// sched:sched_process_exec (after the new image's MMAP2 records).
    Exec { filename: String, old_pid: u32 },
    /// PERF_RECORD_MMAP2: a mapping as it is after the change (merged).
    Mmap2 {
        addr: u64,
        len: u64,
        pgoff: u64,
        prot: u32,
        flags: u32,
        filename: String,
    },
    /// PERF_RECORD_COMM; `exec`: the one exec sends, before the new image's mappings.
    Comm { comm: String, exec: bool },
    /// PERF_RECORD_FORK.
    Fork { ppid: u32, ptid: u32 },
    /// PERF_RECORD_EXIT.
    Exit { ppid: u32, ptid: u32 },
    /// PERF_RECORD_LOST / LOST_SAMPLES: events the kernel could not write.
    Lost { count: u64 },
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A NUL-terminated string starting at `at`, ending at `end` at the latest.
fn str_at(b: &[u8], at: usize, end: usize) -> String {
    let s = b.get(at..end.min(b.len())).unwrap_or(&[]);
    let n = s.iter().position(|&c| c == 0).unwrap_or(s.len());
    String::from_utf8_lossy(&s[..n]).into_owned()
}

/// Parses one record; None for a record of another type or a short one.
pub fn parse(record: &[u8], ids: &Ids) -> Option<Event> {
    let kind = u32_at(record, 0)?;
    let misc = u16_at(record, 4)?;
    if kind == RECORD_SAMPLE {
        return parse_sample(record, ids);
    }
    // The sample_id_all trailer: pid, tid, time.
    let n = record.len();
    let trailer = n.checked_sub(16)?;
    let (pid, tid, time) = (
        u32_at(record, trailer)?,
        u32_at(record, trailer + 4)?,
        u64_at(record, trailer + 8)?,
    );
    let event = |kind| {
        Some(Event {
            time,
            pid,
            tid,
            kind,
        })
    };
    match kind {
        RECORD_MMAP2 => event(Kind::Mmap2 {
            addr: u64_at(record, 16)?,
            len: u64_at(record, 24)?,
            pgoff: u64_at(record, 32)?,
            prot: u32_at(record, 64)?,
            flags: u32_at(record, 68)?,
            filename: str_at(record, 72, trailer),
        }),
        RECORD_COMM => event(Kind::Comm {
            comm: str_at(record, 16, trailer),
            exec: misc & MISC_COMM_EXEC != 0,
        }),
        RECORD_FORK | RECORD_EXIT => {
            // Their own pid and tid, at 8 and 16, are the task's.
            let (pid, ppid) = (u32_at(record, 8)?, u32_at(record, 12)?);
            let (tid, ptid) = (u32_at(record, 16)?, u32_at(record, 20)?);
            let kind = if kind == RECORD_FORK {
                Kind::Fork { ppid, ptid }
            } else {
                Kind::Exit { ppid, ptid }
            };
            Some(Event {
                time,
                pid,
                tid,
                kind,
            })
        }
        RECORD_LOST => event(Kind::Lost {
            count: u64_at(record, 16)?,
        }),
        RECORD_LOST_SAMPLES => event(Kind::Lost {
            count: u64_at(record, 8)?,
        }),
        _ => None,
    }
}

/// A sample: header, pid, tid, time, raw size, raw data.
fn parse_sample(record: &[u8], ids: &Ids) -> Option<Event> {
    let (pid, tid, time) = (u32_at(record, 8)?, u32_at(record, 12)?, u64_at(record, 16)?);
    let size = u32_at(record, 24)? as usize;
    let raw = record.get(28..28 + size)?;
    let id = u64::from(u16_at(raw, 0)?);
    let kind = if id == ids.fault_user || id == ids.fault_kernel {
        Kind::Fault {
            addr: u64_at(raw, 8)?,
            error_code: u64_at(raw, 24)?,
            user: id == ids.fault_user,
        }
    } else if id == ids.sys_enter {
        let mut args = [0u64; 6];
        for (i, a) in args.iter_mut().enumerate() {
            *a = u64_at(raw, 16 + 8 * i)?;
        }
        Kind::SysEnter {
            nr: u64_at(raw, 8)? as i64,
            args,
        }
    } else if id == ids.sys_exit {
        Kind::SysExit {
            nr: u64_at(raw, 8)? as i64,
            ret: u64_at(raw, 16)? as i64,
        }
    } else if id == ids.newtask {
        Kind::NewTask {
            child: u32_at(raw, 8)?,
            comm: str_at(raw, 12, 28),
            clone_flags: u64_at(raw, 32)?,
        }
    } else if id == ids.exec {
        // __data_loc: offset in the low 16 bits, length in the high 16.
        let loc = u32_at(raw, 8)? as usize;
        let (at, len) = (loc & 0xffff, loc >> 16);
        Kind::Exec {
            filename: str_at(raw, at, at + len),
            old_pid: u32_at(raw, 16)?,
        }
    } else {
        return None;
    };
    Some(Event {
        time,
        pid,
        tid,
        kind,
    })
}

/// x86-64 syscall numbers the recorder filters on, with their names.
pub const SYSCALLS: [(i64, &str); 14] = [
    (9, "mmap"),
    (10, "mprotect"),
    (11, "munmap"),
    (12, "brk"),
    (25, "mremap"),
    (28, "madvise"),
    (56, "clone"),
    (57, "fork"),
    (58, "vfork"),
    (59, "execve"),
    (60, "exit"),
    (231, "exit_group"),
    (322, "execveat"),
    (435, "clone3"),
];

/// The mm syscalls among [`SYSCALLS`] (the summary counts these).
pub const MM_SYSCALLS: [&str; 6] = ["mmap", "munmap", "mremap", "brk", "mprotect", "madvise"];

pub fn syscall_name(nr: i64) -> Option<&'static str> {
    SYSCALLS.iter().find(|(n, _)| *n == nr).map(|(_, s)| *s)
}

/// The kernel-side filter of raw_syscalls: `id == 9 || id == 10 || …`.
pub fn syscall_filter() -> String {
    let ids: Vec<String> = SYSCALLS.iter().map(|(n, _)| format!("id == {n}")).collect();
    ids.join(" || ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDS: Ids = Ids {
        fault_user: 190,
        fault_kernel: 191,
        sys_enter: 443,
        sys_exit: 442,
        newtask: 205,
        exec: 365,
    };

    fn sample(raw: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend(RECORD_SAMPLE.to_ne_bytes());
        r.extend(0u16.to_ne_bytes());
        r.extend(0u16.to_ne_bytes()); // size, unused by parse
        r.extend(100u32.to_ne_bytes());
        r.extend(101u32.to_ne_bytes());
        r.extend(5000u64.to_ne_bytes());
        r.extend((raw.len() as u32).to_ne_bytes());
        r.extend(raw);
        r
    }

    #[test]
    fn a_user_fault_sample() {
        let mut raw = vec![0u8; 32];
        raw[0..2].copy_from_slice(&190u16.to_ne_bytes());
        raw[8..16].copy_from_slice(&0x7f00_0000_1000u64.to_ne_bytes());
        raw[24..32].copy_from_slice(&6u64.to_ne_bytes());
        let e = parse(&sample(&raw), &IDS).unwrap();
        assert_eq!((e.pid, e.tid, e.time), (100, 101, 5000));
        assert_eq!(
            e.kind,
            Kind::Fault {
                addr: 0x7f00_0000_1000,
                error_code: 6,
                user: true
            }
        );
    }

    #[test]
    fn an_exec_sample_reads_its_data_loc() {
        let mut raw = vec![0u8; 20];
        raw[0..2].copy_from_slice(&365u16.to_ne_bytes());
        let name = b"/bin/true\0";
        raw[8..12].copy_from_slice(&((20u32) | ((name.len() as u32) << 16)).to_ne_bytes());
        raw[16..20].copy_from_slice(&7u32.to_ne_bytes());
        raw.extend(name);
        let e = parse(&sample(&raw), &IDS).unwrap();
        assert_eq!(
            e.kind,
            Kind::Exec {
                filename: "/bin/true".into(),
                old_pid: 7
            }
        );
    }

    #[test]
    fn a_comm_record_of_an_exec_with_its_trailer() {
        let mut r = Vec::new();
        r.extend(RECORD_COMM.to_ne_bytes());
        r.extend(MISC_COMM_EXEC.to_ne_bytes());
        r.extend(40u16.to_ne_bytes());
        r.extend(7u32.to_ne_bytes());
        r.extend(7u32.to_ne_bytes());
        r.extend(b"true\0\0\0\0");
        r.extend(7u32.to_ne_bytes());
        r.extend(8u32.to_ne_bytes());
        r.extend(99u64.to_ne_bytes());
        let e = parse(&r, &IDS).unwrap();
        assert_eq!((e.pid, e.tid, e.time), (7, 8, 99));
        assert_eq!(
            e.kind,
            Kind::Comm {
                comm: "true".into(),
                exec: true
            }
        );
    }

    #[test]
    fn the_filter_names_every_syscall() {
        let f = syscall_filter();
        assert!(f.starts_with("id == 9 || id == 10"));
        assert_eq!(f.matches("||").count(), SYSCALLS.len() - 1);
        assert_eq!(syscall_name(25), Some("mremap"));
    }
}
