//! The messages between the runner ([`crate::process`]) and a process agent
//! ([`crate::agent`]): a [`Request`] one way, a [`Reply`] the other.
//!
//! On the wire both are fixed-size arrays of words (a SOCK_SEQPACKET message
//! each), so that the agent receives into a buffer on its pre-touched stack
//! and never allocates after start-up; this module is the only place that
//! knows which word means what.

use hugelab_workload::{Errno, HugetlbSize};

/// Words in a request on the wire: the opcode, then the arguments.
pub const REQUEST_WORDS: usize = 8;
/// A request as sent: `[op, a0..a6]`.
pub type RequestWire = [u64; REQUEST_WORDS];
/// A reply as sent: `[errno, value, loop_faults, all_faults, signal]`.
pub type ReplyWire = [i64; 5];

/// Opcodes (word 0 of a request).
mod op {
    pub const MMAP: u64 = 1;
    pub const MUNMAP: u64 = 2;
    pub const MPROTECT: u64 = 3;
    pub const MADVISE: u64 = 4;
    pub const TOUCH: u64 = 5;
    pub const FORK: u64 = 6;
    pub const THP_DISABLE: u64 = 7;
    pub const EXIT: u64 = 8;
    pub const PIN: u64 = 9;
    pub const UNPIN: u64 = 10;
    pub const MMAP_FILE: u64 = 11;
}

/// MMAP flags (a3).
mod map {
    pub const SHARED: u64 = 1;
    pub const HUGETLB_2M: u64 = 2;
    pub const HUGETLB_1G: u64 = 4;
}

/// TOUCH flags (a3).
mod touch {
    pub const WRITE: u64 = 1;
    pub const ZERO: u64 = 2;
}

/// What an agent is asked to do. Addresses and lengths are bytes in the
/// agent's address space; `prot` and `advice` are the kernel's PROT_* and
/// MADV_* values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// mmap of anonymous memory at exactly `addr` (MAP_FIXED_NOREPLACE),
    /// private unless `shared`, from a hugetlb pool if `hugetlb`; the reply's
    /// value is the address.
    Mmap {
        addr: u64,
        len: u64,
        prot: i32,
        shared: bool,
        hugetlb: Option<HugetlbSize>,
    },
    /// mmap(MAP_PRIVATE|MAP_FIXED_NOREPLACE) at exactly `addr` of the file
    /// whose descriptor arrives with the request (SCM_RIGHTS; the agent
    /// closes it once mapped), from byte `offset`; the reply's value is the
    /// address.
    MmapFile {
        addr: u64,
        len: u64,
        prot: i32,
        offset: u64,
    },
    Munmap {
        addr: u64,
        len: u64,
    },
    Mprotect {
        addr: u64,
        len: u64,
        prot: i32,
    },
    Madvise {
        addr: u64,
        len: u64,
        advice: i32,
    },
    /// One byte every `step` bytes of the range; the reply's loop_faults are
    /// the faults of this loop alone.
    Touch {
        addr: u64,
        len: u64,
        step: u64,
        access: Access,
    },
    /// Long-term pin of a range: an io_uring fixed buffer.
    Pin {
        addr: u64,
        len: u64,
    },
    /// Unpins a range pinned by `Pin` with the same start and length.
    Unpin {
        addr: u64,
        len: u64,
    },
    /// PR_SET_THP_DISABLE.
    ThpDisable {
        on: bool,
    },
    /// Forks; the new process's channel arrives with the request
    /// (SCM_RIGHTS), and the reply's value is the child's pid.
    Fork,
    /// Exits at once, without a reply.
    Exit,
}

/// How a [`Request::Touch`] accesses each byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Stores a non-zero byte.
    Write,
    /// Stores a zero byte.
    WriteZero,
}

/// What an agent answers. The first message a new process sends (after
/// spawn or fork) is a hello: `value` its pid, `all_faults` its faults so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The system call's errno ([`Errno::OK`]: it succeeded).
    pub errno: Errno,
    /// The call's result (an address, a pid), 0 if it has none.
    pub value: i64,
    /// Faults of the access loop only (getrusage around it).
    pub loop_faults: i64,
    /// Faults of the whole request, which the runner compares with the
    /// system-wide pgfault to detect other processes.
    pub all_faults: i64,
    /// Not 0: the agent got this signal during the request (SIGBUS, SIGSEGV)
    /// and is dying of it; this reply is its last word, sent from its
    /// signal handler, with `value` the faulting address and the faults
    /// counted up to the fault that killed it.
    pub signal: i32,
}

impl Request {
    pub fn encode(&self) -> RequestWire {
        let words: [u64; 5] = match *self {
            Request::Mmap {
                addr,
                len,
                prot,
                shared,
                hugetlb,
            } => {
                let mut flags = if shared { map::SHARED } else { 0 };
                flags |= match hugetlb {
                    Some(HugetlbSize::Size2M) => map::HUGETLB_2M,
                    Some(HugetlbSize::Size1G) => map::HUGETLB_1G,
                    None => 0,
                };
                [op::MMAP, addr, len, u64::from(prot as u32), flags]
            }
            Request::MmapFile {
                addr,
                len,
                prot,
                offset,
            } => [op::MMAP_FILE, addr, len, u64::from(prot as u32), offset],
            Request::Munmap { addr, len } => [op::MUNMAP, addr, len, 0, 0],
            Request::Mprotect { addr, len, prot } => {
                [op::MPROTECT, addr, len, u64::from(prot as u32), 0]
            }
            Request::Madvise { addr, len, advice } => {
                [op::MADVISE, addr, len, u64::from(advice as u32), 0]
            }
            Request::Touch {
                addr,
                len,
                step,
                access,
            } => {
                let flags = match access {
                    Access::Read => 0,
                    Access::Write => touch::WRITE,
                    Access::WriteZero => touch::WRITE | touch::ZERO,
                };
                [op::TOUCH, addr, len, step, flags]
            }
            Request::Pin { addr, len } => [op::PIN, addr, len, 0, 0],
            Request::Unpin { addr, len } => [op::UNPIN, addr, len, 0, 0],
            Request::ThpDisable { on } => [op::THP_DISABLE, u64::from(on), 0, 0, 0],
            Request::Fork => [op::FORK, 0, 0, 0, 0],
            Request::Exit => [op::EXIT, 0, 0, 0, 0],
        };
        let mut wire = [0; REQUEST_WORDS];
        wire[..words.len()].copy_from_slice(&words);
        wire
    }

    /// The request in `wire`, or None for an unknown opcode or flag (the
    /// agent answers ENOSYS). Runs in the agent: must not allocate.
    pub fn decode(wire: &RequestWire) -> Option<Request> {
        let [code, a0, a1, a2, a3, ..] = *wire;
        let int = |w: u64| u32::try_from(w).ok().map(|v| v as i32);
        Some(match code {
            op::MMAP => Request::Mmap {
                addr: a0,
                len: a1,
                prot: int(a2)?,
                shared: a3 & map::SHARED != 0,
                hugetlb: match a3 & !map::SHARED {
                    0 => None,
                    map::HUGETLB_2M => Some(HugetlbSize::Size2M),
                    map::HUGETLB_1G => Some(HugetlbSize::Size1G),
                    _ => return None,
                },
            },
            op::MMAP_FILE => Request::MmapFile {
                addr: a0,
                len: a1,
                prot: int(a2)?,
                offset: a3,
            },
            op::MUNMAP => Request::Munmap { addr: a0, len: a1 },
            op::MPROTECT => Request::Mprotect {
                addr: a0,
                len: a1,
                prot: int(a2)?,
            },
            op::MADVISE => Request::Madvise {
                addr: a0,
                len: a1,
                advice: int(a2)?,
            },
            op::TOUCH => Request::Touch {
                addr: a0,
                len: a1,
                step: a2,
                access: match a3 {
                    0 => Access::Read,
                    touch::WRITE => Access::Write,
                    f if f == touch::WRITE | touch::ZERO => Access::WriteZero,
                    _ => return None,
                },
            },
            op::PIN => Request::Pin { addr: a0, len: a1 },
            op::UNPIN => Request::Unpin { addr: a0, len: a1 },
            op::THP_DISABLE => Request::ThpDisable {
                on: match a0 {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
            },
            op::FORK => Request::Fork,
            op::EXIT => Request::Exit,
            _ => return None,
        })
    }
}

impl Reply {
    /// The first message of a new agent: its pid and the faults it took so far.
    pub fn hello(pid: i64, faults: i64) -> Reply {
        Reply {
            errno: Errno::OK,
            value: pid,
            loop_faults: 0,
            all_faults: faults,
            signal: 0,
        }
    }

    pub fn encode(&self) -> ReplyWire {
        [
            i64::from(self.errno.0),
            self.value,
            self.loop_faults,
            self.all_faults,
            i64::from(self.signal),
        ]
    }

    pub fn decode(wire: &ReplyWire) -> Reply {
        let [errno, value, loop_faults, all_faults, signal] = *wire;
        Reply {
            errno: Errno(errno as i32),
            value,
            loop_faults,
            all_faults,
            signal: signal as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of every request, with every flag combination the type allows.
    fn every_request() -> Vec<Request> {
        let (addr, len) = (0x7f12_3440_0000, 3 << 20);
        let mut all = Vec::new();
        for shared in [false, true] {
            for hugetlb in [None, Some(HugetlbSize::Size2M), Some(HugetlbSize::Size1G)] {
                all.push(Request::Mmap {
                    addr,
                    len,
                    prot: libc::PROT_READ | libc::PROT_WRITE,
                    shared,
                    hugetlb,
                });
            }
        }
        for access in [Access::Read, Access::Write, Access::WriteZero] {
            all.push(Request::Touch {
                addr,
                len,
                step: 4096,
                access,
            });
        }
        all.extend([
            Request::MmapFile {
                addr,
                len,
                prot: libc::PROT_READ,
                offset: 1 << 20,
            },
            Request::Munmap { addr, len },
            Request::Mprotect {
                addr,
                len,
                prot: libc::PROT_NONE,
            },
            Request::Madvise {
                addr,
                len,
                advice: libc::MADV_HUGEPAGE,
            },
            Request::Pin { addr, len },
            Request::Unpin { addr, len },
            Request::ThpDisable { on: false },
            Request::ThpDisable { on: true },
            Request::Fork,
            Request::Exit,
        ]);
        all
    }

    #[test]
    fn every_request_round_trips() {
        let all = every_request();
        // Every variant is there: a new one fails to compile here until it
        // is numbered, and fails the count until it is added above.
        let variant = |r: &Request| match r {
            Request::Mmap { .. } => 0,
            Request::Munmap { .. } => 1,
            Request::Mprotect { .. } => 2,
            Request::Madvise { .. } => 3,
            Request::Touch { .. } => 4,
            Request::Pin { .. } => 5,
            Request::Unpin { .. } => 6,
            Request::ThpDisable { .. } => 7,
            Request::Fork => 8,
            Request::Exit => 9,
            Request::MmapFile { .. } => 10,
        };
        let variants: std::collections::BTreeSet<u32> = all.iter().map(variant).collect();
        assert_eq!(variants, (0..11).collect());
        for req in all {
            assert_eq!(Request::decode(&req.encode()), Some(req), "{req:?}");
        }
    }

    #[test]
    fn unknown_requests_do_not_decode() {
        let mut wire = Request::Fork.encode();
        wire[0] = 99;
        assert_eq!(Request::decode(&wire), None);
        let mut wire = Request::ThpDisable { on: true }.encode();
        wire[1] = 2;
        assert_eq!(Request::decode(&wire), None);
    }

    #[test]
    fn replies_round_trip() {
        for reply in [
            Reply::hello(4242, 17),
            Reply {
                errno: Errno::EAGAIN,
                value: 0,
                loop_faults: 3,
                all_faults: 5,
                signal: 0,
            },
            Reply {
                errno: Errno::OK,
                value: 0x7f12_3440_0000,
                loop_faults: 0,
                all_faults: -1,
                signal: 0,
            },
            Reply {
                errno: Errno::OK,
                value: 0x7f12_3440_0000,
                loop_faults: 2,
                all_faults: 3,
                signal: libc::SIGBUS,
            },
        ] {
            assert_eq!(Reply::decode(&reply.encode()), reply);
        }
    }
}
