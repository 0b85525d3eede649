//! The conversion of a made-up event stream, checked line by line: what
//! each kind of event becomes.

use super::super::event::{Event, Kind};
use super::super::settings::SettingRead;
use super::super::spool;
use super::{convert, Header};

struct Stream {
    events: Vec<Event>,
    time: u64,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            events: Vec::new(),
            time: 1_000,
        }
    }

    fn at(&mut self, pid: u32, tid: u32, kind: Kind) -> &mut Stream {
        self.time += 1_000;
        self.events.push(Event {
            time: self.time,
            pid,
            tid,
            kind,
        });
        self
    }

    fn exec(&mut self, pid: u32, comm: &str, maps: &[(u64, u64, u64, u32, &str)]) -> &mut Stream {
        self.at(
            pid,
            pid,
            Kind::Comm {
                comm: comm.into(),
                exec: true,
            },
        );
        for &(addr, len, pgoff, prot, name) in maps {
            self.at(
                pid,
                pid,
                Kind::Mmap2 {
                    addr,
                    len,
                    pgoff,
                    prot,
                    flags: 2,
                    filename: name.into(),
                },
            );
        }
        self.at(
            pid,
            pid,
            Kind::Exec {
                filename: format!("/usr/bin/{comm}"),
                old_pid: pid,
            },
        )
    }

    fn syscall(&mut self, pid: u32, tid: u32, nr: i64, args: [u64; 6], ret: i64) -> &mut Stream {
        self.at(pid, tid, Kind::SysEnter { nr, args });
        self.at(pid, tid, Kind::SysExit { nr, ret })
    }

    fn fault(&mut self, pid: u32, tid: u32, addr: u64, error_code: u64) -> &mut Stream {
        self.at(
            pid,
            tid,
            Kind::Fault {
                addr,
                error_code,
                user: true,
            },
        )
    }

    fn workload(&self) -> Vec<String> {
        self.converted().0
    }

    /// The workload's statements and the conversion's stats.
    fn converted(&self) -> (Vec<String>, super::Stats) {
        let (text, stats) = self.text(Vec::new());
        let lines = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(String::from)
            .collect();
        (lines, stats)
    }

    /// The whole workload, its header naming `settings_read`.
    fn text(&self, settings_read: Vec<SettingRead>) -> (String, super::Stats) {
        let mut w = spool::Writer::create(&std::env::temp_dir()).unwrap();
        for e in &self.events {
            w.push(e).unwrap();
        }
        let mut s = w.finish().unwrap();
        let h = Header {
            command: vec!["prog".into()],
            date: "today".into(),
            kernel: "6.18".into(),
            interrupted: false,
            snapshot_at_exit: false,
            settings_read,
        };
        let mut out = Vec::new();
        let stats = convert(&mut s, &h, &mut out).unwrap();
        (String::from_utf8(out).unwrap(), stats)
    }
}

const STACK: (u64, u64, u64, u32, &str) = (0x7ffd_0000_0000, 0x21000, 0, 3, "[stack]");
const RW: u64 = 3;
const PRIVATE_ANON: u64 = 0x22;

#[test]
fn exec_segments_faults_and_an_anonymous_mapping() {
    let mut s = Stream::new();
    s.exec(
        10,
        "prog",
        &[
            // The loader's first mapping spans the whole image; the next
            // segment cuts it.
            (0x5555_0000_0000, 0x5000, 0, 1, "/usr/bin/prog"),
            (0x5555_0000_1000, 0x1000, 0x1000, 5, "/usr/bin/prog"),
            (0x5555_0000_2000, 0x1000, 0x2000, 3, "/usr/bin/prog"),
            (0x5555_0000_3000, 0x2000, 0, 3, "//anon"),
            STACK,
            (0x7ffd_0010_0000, 0x2000, 0, 5, "[vdso]"),
        ],
    )
    .fault(10, 10, 0x5555_0000_2010, 6)
    .fault(10, 10, 0x7ffd_0000_0000 - 0x2000 + 8, 6)
    .fault(10, 10, 0x7ffd_0010_0000, 4)
    .syscall(
        10,
        10,
        9,
        [0, 0x4000, RW, PRIVATE_ANON, u64::MAX, 0],
        0x7f00_0000_0000,
    )
    .fault(10, 10, 0x7f00_0000_0000, 6)
    .fault(10, 10, 0x7f00_0000_1000, 6)
    .fault(10, 10, 0x7f00_0000_3000, 4)
    .syscall(10, 10, 11, [0x7f00_0000_1000, 0x1000, 0, 0, 0, 0], 0)
    .at(10, 10, Kind::Exit { ppid: 1, ptid: 1 });
    let (workload, stats) = s.converted();
    // 6 fault events replayed (the vdso's as a `special` read), and the
    // page exec wrote the arguments into (its GUP fault counts in min_flt
    // without an event).
    assert_eq!(stats.faults_by_process["prog"], 7);
    assert_eq!(
        workload,
        [
            "spawn prog",
            "prog mmap prog-ro 4K file=prog prot=r at=0x555500000000",
            "prog mmap prog-text 4K file=prog offset=4K prot=rx at=0x555500001000",
            "prog mmap prog-data 4K file=prog offset=8K at=0x555500002000",
            "prog mmap prog-bss 8K at=0x555500003000",
            "prog mmap stack 140K at=0x7ffcffffe000 growsdown initial=132K",
            "prog madvise stack+136K:4K POPULATE_WRITE",
            "prog write prog-data:4K",
            "prog write stack:4K",
            "prog special vdso:4K",
            "prog mmap anon1 16K at=0x7f0000000000",
            "prog write anon1:8K",
            "prog read anon1+12K:4K",
            "prog munmap anon1+4K:4K",
            "prog exit",
        ]
    );
}

#[test]
fn fork_thread_vfork_spawn_brk_mremap_and_mprotect() {
    let mut s = Stream::new();
    s.exec(20, "make", &[STACK])
        .syscall(20, 20, 12, [0; 6], 0x5600_0000_0000)
        .syscall(
            20,
            20,
            12,
            [0x5600_0002_1000, 0, 0, 0, 0, 0],
            0x5600_0002_1000,
        )
        .fault(20, 20, 0x5600_0000_0000, 6)
        .syscall(
            20,
            20,
            9,
            [0, 0x2000, RW, PRIVATE_ANON, u64::MAX, 0],
            0x7f00_0000_0000,
        )
        .syscall(
            20,
            20,
            25,
            [0x7f00_0000_0000, 0x2000, 0x4000, 1, 0, 0],
            0x7f10_0000_0000,
        )
        .syscall(20, 20, 10, [0x7f10_0000_0000, 0x1000, 1, 0, 0, 0], 0)
        .at(
            20,
            20,
            Kind::NewTask {
                child: 21,
                comm: "make".into(),
                clone_flags: 0x1200011,
            },
        )
        .fault(21, 21, 0x7f10_0000_1000, 7)
        .at(21, 21, Kind::Exit { ppid: 20, ptid: 20 })
        .at(
            20,
            20,
            Kind::NewTask {
                child: 22,
                comm: "make".into(),
                clone_flags: 0x3d0f00,
            },
        )
        .fault(20, 22, 0x7f10_0000_2000, 6)
        .at(20, 22, Kind::Exit { ppid: 20, ptid: 20 })
        .at(
            20,
            20,
            Kind::NewTask {
                child: 23,
                comm: "make".into(),
                clone_flags: 0x4111,
            },
        )
        .exec(23, "cc1", &[])
        .at(23, 23, Kind::Exit { ppid: 20, ptid: 20 })
        .syscall(
            20,
            20,
            12,
            [0x5600_0001_0000, 0, 0, 0, 0, 0],
            0x5600_0001_0000,
        )
        .at(20, 20, Kind::Exit { ppid: 1, ptid: 1 });
    let w = s.workload();
    let after_stack: Vec<&str> = w.iter().skip(3).map(String::as_str).collect();
    assert_eq!(
        after_stack,
        [
            "make brk heap 132K at=0x560000000000",
            "make write heap:4K",
            "make mmap anon1 8K at=0x7f0000000000",
            "make mremap anon1:8K 16K at=0x7f1000000000",
            "make mprotect anon1:4K r",
            "make fork make-2",
            "make-2 write anon1+4K:4K",
            "make-2 exit",
            "make thread make-t2",
            "make-t2 write anon1+8K:4K",
            "make-t2 exit",
            "spawn cc1",
            "cc1 exit",
            "make brk heap 64K",
            "make exit",
        ],
        "{w:#?}"
    );
}

/// A stack growing below its start: the kernel's mapping record of the grown
/// stack (expand_downwards) is no new region, and the first pass's reach
/// counts the faults on both sides of it. Exec's mappings after a fault of
/// exec's own (padzero clearing the bss) are still exec's: the interpreter.
#[test]
fn a_stack_growing_is_the_same_region() {
    let len = STACK.1;
    let interp = |addr| Kind::Mmap2 {
        addr,
        len: 0x1000,
        pgoff: 0,
        prot: 3,
        flags: 2,
        filename: "/lib/ld.so".into(),
    };
    let mut s = Stream::new();
    s.exec(
        10,
        "prog",
        &[STACK, (0x5555_0000_0000, 0x1000, 0, 3, "/usr/bin/prog")],
    )
    .fault(10, 10, 0x5555_0000_0010, 2)
    .at(10, 10, interp(0x7f00_0000_0000))
    .fault(10, 10, STACK.0 - 8, 6);
    s.at(
        10,
        10,
        Kind::Mmap2 {
            addr: STACK.0 - 0x1000,
            len: len + 0x1000,
            pgoff: 0,
            prot: 3,
            flags: 2,
            filename: "[stack]".into(),
        },
    )
    .fault(10, 10, STACK.0 - 0x2000, 6)
    .at(10, 10, Kind::Exit { ppid: 1, ptid: 1 });
    let low = STACK.0 - 0x2000;
    assert_eq!(
        s.workload(),
        [
            "spawn prog".to_string(),
            format!("prog mmap stack 140K at={low:#x} growsdown initial=132K"),
            "prog madvise stack+136K:4K POPULATE_WRITE".into(),
            "prog mmap prog-data 4K file=prog at=0x555500000000".into(),
            "prog write prog-data:4K".into(),
            "prog mmap ld_so-data 4K file=ld.so at=0x7f0000000000".into(),
            // Two faults going down, coalesced.
            "prog write stack:8K".into(),
            "prog exit".into(),
        ]
    );
}

/// An exec whose arguments need more than a page: get_arg_page grows the
/// new mm's temporary stack at the top of the address space, and perf
/// reports that mapping before the exec's point of no return, from the
/// task still in the old image: it is not the old image's mapping.
#[test]
fn an_execs_argument_stack_is_not_a_mapping_of_the_old_image() {
    let mut s = Stream::new();
    s.exec(10, "prog", &[STACK])
        .fault(10, 10, STACK.0 + 0x20000, 6)
        .at(
            10,
            10,
            Kind::SysEnter {
                nr: 59,
                args: [0; 6],
            },
        )
        .at(
            10,
            10,
            Kind::Mmap2 {
                addr: 0x7fff_ffff_d000,
                len: 0x2000,
                pgoff: 0,
                prot: 3,
                flags: 2,
                filename: "//anon".into(),
            },
        )
        // copy_strings reading the next argument from the old image.
        .fault(10, 10, STACK.0 + 0x20000, 0);
    s.exec(10, "next", &[STACK])
        .at(10, 10, Kind::SysExit { nr: 59, ret: 0 })
        .at(10, 10, Kind::Exit { ppid: 1, ptid: 1 });
    let w = s.workload();
    assert!(w.iter().all(|l| !l.contains("0x7fffffffd000")), "{w:#?}");
    assert_eq!(
        w.iter().filter(|l| l.contains(" mmap ")).count(),
        2,
        "{w:#?}"
    );
    assert!(w.iter().any(|l| l == "prog exec"), "{w:#?}");
}

#[test]
fn a_kernel_fault_with_faults_disabled_and_its_retry_are_one_fault() {
    let page = STACK.0 + 0x1000;
    let mut s = Stream::new();
    s.exec(10, "prog", &[STACK])
        // The XSAVE of a signal frame onto the stack (not handled, page
        // faults disabled), then __clear_user's fault that maps the page.
        .fault(10, 10, page + 8, 2)
        .fault(10, 10, page + 16, 2)
        // A fault on the page after a syscall of the mm is a fault again.
        .syscall(
            10,
            10,
            9,
            [0, 0x1000, RW, PRIVATE_ANON, u64::MAX, 0],
            0x7f00_0000_0000,
        )
        .fault(10, 10, page + 8, 2)
        // A user fault on the page of a user fault before is kept.
        .fault(10, 10, page + 0x1000, 6)
        .fault(10, 10, page + 0x1000, 6)
        .at(10, 10, Kind::Exit { ppid: 1, ptid: 1 });
    let (workload, stats) = s.converted();
    assert_eq!(
        workload,
        [
            "spawn prog",
            "prog mmap stack 132K at=0x7ffd00000000 growsdown initial=132K",
            "prog madvise stack+128K:4K POPULATE_WRITE",
            "prog write stack+4K:4K",
            "prog mmap anon1 4K at=0x7f0000000000",
            "prog write stack+4K:8K",
            "prog write stack+8K:4K",
            "prog exit",
        ]
    );
    assert_eq!(
        stats.skipped["kernel faults with page faults disabled (retried)"],
        1
    );
    assert_eq!(stats.faults_by_process["prog"], 5);
}

/// Faults on the vDSO and its data are `special` reads at their offsets in
/// the mapping, in the parent, a fork child and after exec; a write to one
/// and a read of a page whose fault is SIGBUS are the program's signals,
/// not replayed.
#[test]
fn faults_on_the_vdso_and_vvar_are_special_reads() {
    const VVAR: (u64, u64, u64, u32, &str) = (0x7ffd_0010_0000, 0x4000, 0, 1, "[vvar]");
    const CLOCK: (u64, u64, u64, u32, &str) = (0x7ffd_0010_4000, 0x2000, 0, 1, "[vvar_vclock]");
    const VDSO: (u64, u64, u64, u32, &str) = (0x7ffd_0010_6000, 0x2000, 0, 5, "[vdso]");
    const OTHER: (u64, u64, u64, u32, &str) = (0x7ffd_0020_0000, 0x2000, 0, 5, "[vdso]");
    let mut s = Stream::new();
    s.exec(30, "sh", &[VVAR, CLOCK, VDSO])
        .fault(30, 30, VDSO.0 + 0x10, 4)
        .fault(30, 30, VVAR.0 + 0x2008, 4)
        .fault(30, 30, CLOCK.0, 4)
        // The time-namespace page outside a time namespace; a write.
        .fault(30, 30, VVAR.0 + 0x1000, 4)
        .fault(30, 30, VDSO.0 + 0x1000, 6)
        .at(
            30,
            30,
            Kind::NewTask {
                child: 31,
                comm: "sh".into(),
                clone_flags: 0x1200011,
            },
        )
        .fault(31, 31, VDSO.0 + 0x1000, 0x14)
        .exec(31, "ls", &[OTHER])
        .fault(31, 31, OTHER.0, 4)
        .at(31, 31, Kind::Exit { ppid: 30, ptid: 30 })
        .at(30, 30, Kind::Exit { ppid: 1, ptid: 1 });
    let (w, stats) = s.converted();
    let special: Vec<&str> = w
        .iter()
        .filter(|l| l.contains(" special "))
        .map(String::as_str)
        .collect();
    assert_eq!(
        special,
        [
            "sh special vdso:4K",
            "sh special vvar+8K:4K",
            "sh special vvar_vclock:4K",
            "sh-2 special vdso+4K:4K",
            "sh-2 special vdso:4K",
        ],
        "{w:#?}"
    );
    assert_eq!(stats.faults_by_process["sh"], 3, "{w:#?}");
    assert!(w.iter().all(|l| !l.contains("munmap")), "{w:#?}");
    hugelab_workload::parse("t.hlw", &(w.join("\n") + "\n")).expect("the workload checks");
}

#[test]
fn reads_of_a_file_down_stay_in_their_order_and_writes_down_coalesce() {
    // dash's text as kbuild's shells ran it: the page at a 64K boundary
    // faulted first (its fault-around window starts there), then the page
    // below it, whose window reaches up and would have mapped the first:
    // replayed upward, the second page would not fault.
    let text = (0x5555_0000_7000, 0x13000, 0x4000, 5, "/usr/bin/dash");
    let mut s = Stream::new();
    s.exec(10, "sh", &[STACK, text])
        .fault(10, 10, 0x5555_0001_0000 + 0x528, 0x14)
        .fault(10, 10, 0x5555_0000_f000 + 0x120, 0x14)
        .fault(10, 10, 0x5555_0001_1000, 0x4)
        .fault(10, 10, STACK.0 + 0x3000, 6)
        .fault(10, 10, STACK.0 + 0x2000, 6)
        .at(10, 10, Kind::Exit { ppid: 1, ptid: 1 });
    let (workload, stats) = s.converted();
    assert_eq!(
        workload,
        [
            "spawn sh",
            "sh mmap stack 132K at=0x7ffd00000000 growsdown initial=132K",
            "sh madvise stack+128K:4K POPULATE_WRITE",
            "sh mmap dash-text 76K file=dash offset=16K prot=rx at=0x555500007000",
            "sh read dash-text+36K:4K",
            "sh read dash-text+32K:4K",
            "sh read dash-text+40K:4K",
            "sh write stack+8K:8K",
            "sh exit",
        ]
    );
    assert_eq!(stats.faults_by_process["sh"], 6);
}

/// A library's text, 64K at a 64K boundary: one fault-around window.
const LIB: (u64, u64, u64, u32, &str) = (0x7f00_0001_0000, 0x10000, 0, 5, "/usr/lib/libx.so");

/// `prog` brings pages 0 and 1 of LIB into the page cache, forks
/// `prog-2`, then (when `race`) faults page 3 right before the child's
/// fault on page 0; the child then faults page 1.
fn fork_and_fault_around(race: bool) -> (Vec<String>, super::Stats) {
    let mut s = Stream::new();
    s.exec(10, "prog", &[STACK, LIB])
        .fault(10, 10, LIB.0, 0x14)
        .fault(10, 10, LIB.0 + 0x1000, 0x14)
        .at(
            10,
            10,
            Kind::NewTask {
                child: 11,
                comm: "prog".into(),
                clone_flags: 0x1200011,
            },
        );
    s.time += 1_000_000;
    if race {
        s.fault(10, 10, LIB.0 + 0x3000, 0x14);
    }
    s.fault(11, 11, LIB.0, 0x14);
    s.time += 1_000_000;
    s.fault(11, 11, LIB.0 + 0x1000, 0x14)
        .at(11, 11, Kind::Exit { ppid: 10, ptid: 10 })
        .at(10, 10, Kind::Exit { ppid: 1, ptid: 1 });
    s.converted()
}

#[test]
fn a_read_fault_on_a_page_a_raced_fault_around_skipped_is_not_a_first_touch() {
    const WHY: &str = super::mm::RACED;
    // Without a race, the child's fault on page 1 is the recorded kernel's
    // and stays (a replay agrees or disagrees on its own).
    let (workload, stats) = fork_and_fault_around(false);
    assert!(
        workload
            .iter()
            .any(|l| l == "prog-2 read libx_so-text+4K:4K"),
        "{workload:#?}"
    );
    assert!(!stats.skipped.contains_key(WHY));
    assert!(stats.raced_by_process.is_empty());
    // The parent faults the same pages at once: the child's fault-around
    // may have found page 1 locked, and its later fault there is that race.
    let (workload, stats) = fork_and_fault_around(true);
    assert_eq!(
        workload,
        [
            "spawn prog",
            "prog mmap stack 132K at=0x7ffd00000000 growsdown initial=132K",
            "prog madvise stack+128K:4K POPULATE_WRITE",
            "prog mmap libx_so-text 64K file=libx.so prot=rx at=0x7f0000010000",
            "prog read libx_so-text:8K",
            "prog fork prog-2",
            "sleep 1001us",
            "prog read libx_so-text+12K:4K",
            "prog-2 read libx_so-text:4K",
            "sleep 1002us",
            "prog-2 exit",
            "prog exit",
        ]
    );
    assert_eq!(stats.skipped[WHY], 1);
    assert_eq!(stats.faults_by_process["prog-2"], 1);
    // The kernel counted it in prog-2's min_flt.
    assert_eq!(stats.raced_by_process["prog-2"], 1);
}

/// The header names the settings each process read, right after the
/// counts, as `<proc> <path>` pairs once each; without reads, no line.
#[test]
fn the_header_names_the_thp_settings_read() {
    let mut s = Stream::new();
    s.exec(30, "sh", &[STACK])
        .at(
            30,
            30,
            Kind::NewTask {
                child: 31,
                comm: "sh".into(),
                clone_flags: 0x1200011,
            },
        )
        .exec(31, "cat", &[STACK])
        // Named after the program it faulted in most: cat.
        .fault(31, 31, 0x7ffd_0000_0000 - 0x1000, 6)
        .at(31, 31, Kind::Exit { ppid: 30, ptid: 30 })
        .at(30, 30, Kind::Exit { ppid: 1, ptid: 1 });
    let read = |pid, path: &str| SettingRead {
        pid,
        incarnation: 0,
        path: path.into(),
    };
    let (text, stats) = s.text(vec![
        read(31, "transparent_hugepage/enabled"),
        read(30, "transparent_hugepage/hpage_pmd_size"),
        read(31, "transparent_hugepage/enabled"),
        // The command before its exec is no process of the workload.
        SettingRead {
            incarnation: 1,
            ..read(30, "transparent_hugepage/defrag")
        },
    ]);
    let lines: Vec<&str> = text.lines().collect();
    let counts = lines
        .iter()
        .position(|l| l.contains(" events in "))
        .unwrap();
    assert_eq!(
        lines[counts + 1],
        "# THP settings read by the program: cat transparent_hugepage/enabled, \
         sh transparent_hugepage/hpage_pmd_size"
    );
    assert_eq!(stats.settings_read.len(), 2);
    let (none, stats) = s.text(Vec::new());
    assert!(!none.contains("THP settings"), "{none}");
    assert!(stats.settings_read.is_empty());
}
