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
    pub const MREMAP: u64 = 11;
    pub const THREAD: u64 = 12;
    pub const EXEC: u64 = 13;
    pub const MMAP_FILE: u64 = 14;
}

/// MREMAP modes (a4).
mod remap {
    pub const FIXED: u64 = 1;
    pub const FALLBACK: u64 = 2;
}

/// MMAP flags (a3).
mod map {
    pub const SHARED: u64 = 1;
    pub const HUGETLB_2M: u64 = 2;
    pub const HUGETLB_1G: u64 = 4;
    pub const POPULATE: u64 = 8;
    pub const STACK: u64 = 16;
    pub const GROWSDOWN: u64 = 32;
    pub const ALL: u64 = SHARED | HUGETLB_2M | HUGETLB_1G | POPULATE | STACK | GROWSDOWN;
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
    /// private unless `shared`, from a hugetlb pool if `hugetlb`, with
    /// MAP_POPULATE, MAP_STACK, MAP_GROWSDOWN as asked; the reply's value
    /// is the address, its loop_faults the faults MAP_POPULATE took.
    Mmap {
        addr: u64,
        len: u64,
        prot: i32,
        shared: bool,
        hugetlb: Option<HugetlbSize>,
        populate: bool,
        stack: bool,
        growsdown: bool,
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
    /// mremap of `[addr, addr + old_len)` to `new_len` bytes; the reply's
    /// value is the address it ends at.
    Mremap {
        addr: u64,
        old_len: u64,
        new_len: u64,
        to: RemapTo,
    },
    /// PR_SET_THP_DISABLE.
    ThpDisable {
        on: bool,
    },
    /// Forks; the new process's channel arrives with the request
    /// (SCM_RIGHTS), and the reply's value is the child's pid.
    Fork,
    /// Exits at once, without a reply: the process (exit_group) on its
    /// first task's channel, the thread alone on a thread's.
    Exit,
    /// Starts a thread (clone with CLONE_VM | CLONE_THREAD); its channel
    /// arrives with the request (SCM_RIGHTS), on which it says hello with
    /// its tid as the value.
    Thread,
    /// execve of the agent itself, keeping the channel: no reply from this
    /// image (unless execve fails); the new image says hello.
    Exec,
}

/// Where a [`Request::Mremap`] may move the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemapTo {
    /// Nowhere: resized in place or not at all (no flags).
    InPlace,
    /// MREMAP_MAYMOVE|MREMAP_FIXED to this address.
    Fixed(u64),
    /// In place when it can be (no flags), else, when that fails with
    /// ENOMEM, MREMAP_MAYMOVE|MREMAP_FIXED to this address: a MREMAP_MAYMOVE
    /// whose new place is the placement rule's, as the model's is.
    Fallback(u64),
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
                populate,
                stack,
                growsdown,
            } => {
                let mut flags = if shared { map::SHARED } else { 0 };
                flags |= match hugetlb {
                    Some(HugetlbSize::Size2M) => map::HUGETLB_2M,
                    Some(HugetlbSize::Size1G) => map::HUGETLB_1G,
                    None => 0,
                };
                for (on, bit) in [
                    (populate, map::POPULATE),
                    (stack, map::STACK),
                    (growsdown, map::GROWSDOWN),
                ] {
                    if on {
                        flags |= bit;
                    }
                }
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
            Request::Mremap {
                addr,
                old_len,
                new_len,
                to,
            } => {
                let (mode, new_addr) = match to {
                    RemapTo::InPlace => (0, 0),
                    RemapTo::Fixed(a) => (remap::FIXED, a),
                    RemapTo::Fallback(a) => (remap::FALLBACK, a),
                };
                let mut wire = [0; REQUEST_WORDS];
                wire[..6].copy_from_slice(&[op::MREMAP, addr, old_len, new_len, new_addr, mode]);
                return wire;
            }
            Request::Unpin { addr, len } => [op::UNPIN, addr, len, 0, 0],
            Request::ThpDisable { on } => [op::THP_DISABLE, u64::from(on), 0, 0, 0],
            Request::Fork => [op::FORK, 0, 0, 0, 0],
            Request::Exit => [op::EXIT, 0, 0, 0, 0],
            Request::Thread => [op::THREAD, 0, 0, 0, 0],
            Request::Exec => [op::EXEC, 0, 0, 0, 0],
        };
        let mut wire = [0; REQUEST_WORDS];
        wire[..words.len()].copy_from_slice(&words);
        wire
    }

    /// The request in `wire`, or None for an unknown opcode or flag (the
    /// agent answers ENOSYS). Runs in the agent: must not allocate.
    pub fn decode(wire: &RequestWire) -> Option<Request> {
        let [code, a0, a1, a2, a3, a4, ..] = *wire;
        let int = |w: u64| u32::try_from(w).ok().map(|v| v as i32);
        Some(match code {
            op::MMAP if a3 & !map::ALL == 0 => Request::Mmap {
                addr: a0,
                len: a1,
                prot: int(a2)?,
                shared: a3 & map::SHARED != 0,
                hugetlb: match a3 & (map::HUGETLB_2M | map::HUGETLB_1G) {
                    0 => None,
                    map::HUGETLB_2M => Some(HugetlbSize::Size2M),
                    map::HUGETLB_1G => Some(HugetlbSize::Size1G),
                    _ => return None,
                },
                populate: a3 & map::POPULATE != 0,
                stack: a3 & map::STACK != 0,
                growsdown: a3 & map::GROWSDOWN != 0,
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
            op::MREMAP => Request::Mremap {
                addr: a0,
                old_len: a1,
                new_len: a2,
                to: match a4 {
                    0 => RemapTo::InPlace,
                    remap::FIXED => RemapTo::Fixed(a3),
                    remap::FALLBACK => RemapTo::Fallback(a3),
                    _ => return None,
                },
            },
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
            op::THREAD => Request::Thread,
            op::EXEC => Request::Exec,
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
                    populate: false,
                    stack: false,
                    growsdown: false,
                });
            }
        }
        for bits in 1..8u8 {
            all.push(Request::Mmap {
                addr,
                len,
                prot: libc::PROT_READ,
                shared: false,
                hugetlb: None,
                populate: bits & 1 != 0,
                stack: bits & 2 != 0,
                growsdown: bits & 4 != 0,
            });
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
            Request::Mremap {
                addr,
                old_len: len,
                new_len: len / 2,
                to: RemapTo::InPlace,
            },
            Request::Mremap {
                addr,
                old_len: len,
                new_len: len * 2,
                to: RemapTo::Fixed(addr << 1),
            },
            Request::Mremap {
                addr,
                old_len: len,
                new_len: len * 2,
                to: RemapTo::Fallback(addr << 1),
            },
            Request::ThpDisable { on: false },
            Request::ThpDisable { on: true },
            Request::Fork,
            Request::Exit,
            Request::Thread,
            Request::Exec,
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
            Request::Mremap { .. } => 10,
            Request::Thread => 11,
            Request::Exec => 12,
            Request::MmapFile { .. } => 13,
        };
        let variants: std::collections::BTreeSet<u32> = all.iter().map(variant).collect();
        assert_eq!(variants, (0..14).collect());
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
        let mut wire = Request::Fork.encode();
        wire[0] = 1; // MMAP
        wire[4] = 64; // no such flag
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
