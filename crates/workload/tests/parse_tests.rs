//! Parser tests: every statement parses into the expected AST, and every kind
//! of bad input gets one error at the right line and column.

use hugelab_workload::*;

fn kinds(text: &str) -> Vec<StmtKind> {
    match parse("t.hlw", text) {
        Ok(w) => w.stmts.into_iter().map(|s| s.kind).collect(),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn one(text: &str) -> StmtKind {
    let mut k = kinds(text);
    k.pop().expect("at least one statement")
}

/// Parses `text`, which must fail, and checks the error's place and wording.
#[track_caller]
fn fails(text: &str, line: u32, col: u32, part: &str) -> ParseError {
    let e = match parse("buf.hlw", text) {
        Ok(w) => panic!("expected an error, got {w:?}"),
        Err(e) => e,
    };
    assert_eq!((e.line, e.col), (line, col), "wrong place for: {e}");
    assert!(
        e.message.contains(part),
        "message {:?} lacks {:?}",
        e.message,
        part
    );
    assert_eq!(
        e.to_string(),
        format!("buf.hlw:{line}:{col}: {}", e.message)
    );
    e
}

fn range(region: &str, offset: Option<u64>, len: Option<u64>) -> Range {
    Range {
        region: region.to_string(),
        offset: offset.map(Size),
        len: len.map(Size),
    }
}

const PRE: &str = "spawn a\na mmap buf 4M\n";

// ---- good input -------------------------------------------------------------

#[test]
fn empty_comments_and_blank_lines() {
    assert!(kinds("").is_empty());
    assert!(kinds("\n\n   \t\n# only a comment\n  # indented comment\n").is_empty());
    let w = parse("x.hlw", "\n# c\n  spawn a # trailing comment\r\n").unwrap();
    assert_eq!(w.file, "x.hlw");
    assert_eq!(w.stmts.len(), 1);
    assert_eq!(w.stmts[0].pos, Pos { line: 3, col: 3 });
}

#[test]
fn set_statements() {
    let cases: &[(&str, Tunable, SetValue)] = &[
        (
            "transparent_hugepage/enabled madvise",
            Tunable::ThpEnabled,
            SetValue::Enabled(ThpEnabled::Madvise),
        ),
        (
            "transparent_hugepage/defrag defer+madvise",
            Tunable::ThpDefrag,
            SetValue::Defrag(ThpDefrag::DeferMadvise),
        ),
        (
            "transparent_hugepage/use_zero_page 1",
            Tunable::ThpUseZeroPage,
            SetValue::Num(1),
        ),
        (
            "transparent_hugepage/shrink_underused 0",
            Tunable::ThpShrinkUnderused,
            SetValue::Num(0),
        ),
        (
            "transparent_hugepage/anon_beside_full 1",
            Tunable::ThpAnonBesideFull,
            SetValue::Num(1),
        ),
        (
            "transparent_hugepage/hugepages-64kB/enabled inherit",
            Tunable::ThpSizeEnabled { size_kb: 64 },
            SetValue::SizeEnabled(ThpSizeEnabled::Inherit),
        ),
        (
            "transparent_hugepage/khugepaged/max_ptes_none 409",
            Tunable::Khugepaged(KhugepagedKnob::MaxPtesNone),
            SetValue::Num(409),
        ),
        (
            "transparent_hugepage/khugepaged/scan_sleep_millisecs 10",
            Tunable::Khugepaged(KhugepagedKnob::ScanSleepMillisecs),
            SetValue::Num(10),
        ),
        (
            "hugepages/hugepages-2048kB/nr_hugepages 16",
            Tunable::HugetlbNrHugepages { size_kb: 2048 },
            SetValue::Num(16),
        ),
        (
            "hugepages/hugepages-1048576kB/nr_overcommit_hugepages 2",
            Tunable::HugetlbNrOvercommit { size_kb: 1048576 },
            SetValue::Num(2),
        ),
        (
            "vm.hugetlb_optimize_vmemmap 1",
            Tunable::Sysctl(VmSysctl::HugetlbOptimizeVmemmap),
            SetValue::Num(1),
        ),
        (
            "vm.nr_hugepages 8",
            Tunable::Sysctl(VmSysctl::NrHugepages),
            SetValue::Num(8),
        ),
        (
            "vm.overcommit_memory 2",
            Tunable::Sysctl(VmSysctl::OvercommitMemory),
            SetValue::Num(2),
        ),
        (
            "vm.compaction_proactiveness 20",
            Tunable::Sysctl(VmSysctl::CompactionProactiveness),
            SetValue::Num(20),
        ),
        (
            "vm.min_free_kbytes 67584",
            Tunable::Sysctl(VmSysctl::MinFreeKbytes),
            SetValue::Num(67584),
        ),
    ];
    for (text, tunable, value) in cases {
        let k = one(&format!("set {text}"));
        assert_eq!(
            k,
            StmtKind::Set(stmt::Set {
                tunable: tunable.clone(),
                value: *value
            }),
            "{text}"
        );
        assert_eq!(k.to_string(), format!("set {text}"));
    }
}

#[test]
fn machine_cgroup_spawn() {
    assert_eq!(
        one("machine arch=arm64 base_page=16K memory=16G"),
        StmtKind::Machine(stmt::Machine {
            params: vec![
                MachineParam::Arch(Arch::Arm64),
                MachineParam::BasePage(Size(16384)),
                MachineParam::Memory(Size(16 << 30)),
            ]
        })
    );
    assert_eq!(
        one("cgroup cg memory.max=512M"),
        StmtKind::Cgroup(stmt::Cgroup {
            cgroup: "cg".into(),
            memory_max: Some(Size(512 << 20))
        })
    );
    assert_eq!(
        one("cgroup cg"),
        StmtKind::Cgroup(stmt::Cgroup {
            cgroup: "cg".into(),
            memory_max: None
        })
    );
    assert_eq!(
        one("cgroup cg memory.max=max"),
        StmtKind::Cgroup(stmt::Cgroup {
            cgroup: "cg".into(),
            memory_max: None
        })
    );
    assert_eq!(
        one("spawn a"),
        StmtKind::Spawn(stmt::Spawn {
            proc: "a".into(),
            cgroup: None
        })
    );
    assert_eq!(
        one("cgroup cg\nspawn a-1_B cgroup=cg"),
        StmtKind::Spawn(stmt::Spawn {
            proc: "a-1_B".into(),
            cgroup: Some("cg".into())
        })
    );
}

#[test]
fn mmap_options_in_any_order() {
    let want = StmtKind::Mmap(stmt::Mmap {
        proc: "a".into(),
        region: "buf".into(),
        size: Size(4 << 30),
        align: Some(Size(1 << 30)),
        hugetlb: Some(HugetlbSize::Size1G),
        shared: true,
        file: None,
        offset: None,
        prot: Some(Prot::Read),
        at: None,
        populate: false,
        stack: false,
        growsdown: false,
        initial: None,
    });
    assert_eq!(
        one("spawn a\na mmap buf 4G align=1G hugetlb=1G shared prot=r"),
        want
    );
    assert_eq!(
        one("spawn a\na mmap buf 4g prot=r shared hugetlb=1G align=0x40000000"),
        want
    );
    assert_eq!(
        one("spawn a\na\tmmap   buf 0x1000"),
        StmtKind::Mmap(stmt::Mmap {
            proc: "a".into(),
            region: "buf".into(),
            size: Size(4096),
            align: None,
            hugetlb: None,
            shared: false,
            file: None,
            offset: None,
            prot: None,
            at: None,
            populate: false,
            stack: false,
            growsdown: false,
            initial: None,
        })
    );
    assert_eq!(
        one("spawn a\na mmap buf 1M at=0x7e00_0010_0000 prot=r"),
        StmtKind::Mmap(stmt::Mmap {
            proc: "a".into(),
            region: "buf".into(),
            size: Size(1 << 20),
            align: None,
            hugetlb: None,
            shared: false,
            file: None,
            offset: None,
            prot: Some(Prot::Read),
            at: Some(0x7e00_0010_0000),
            populate: false,
            stack: false,
            growsdown: false,
            initial: None,
        })
    );
    assert_eq!(
        one("spawn a
a mmap lib 64K prot=r offset=8K file=ld-linux-x86-64.so.2"),
        StmtKind::Mmap(stmt::Mmap {
            proc: "a".into(),
            region: "lib".into(),
            size: Size(64 << 10),
            align: None,
            hugetlb: None,
            shared: false,
            file: Some("ld-linux-x86-64.so.2".into()),
            offset: Some(Size(8 << 10)),
            prot: Some(Prot::Read),
            at: None,
            populate: false,
            stack: false,
            growsdown: false,
            initial: None,
        })
    );
    // The canonical order: file= and offset= after shared, before prot=.
    let w = hugelab_workload::parse(
        "t.hlw",
        "spawn a\na mmap lib 64K prot=r offset=8K file=libc.so.6\n",
    )
    .unwrap();
    assert_eq!(
        w.stmts[1].kind.to_string(),
        "a mmap lib 64K file=libc.so.6 offset=8K prot=r"
    );
    // A process may be called like a verb.
    assert!(matches!(
        one("spawn mmap\nmmap mmap mmap 2M"),
        StmtKind::Mmap { .. }
    ));
}

#[test]
fn range_statements() {
    let a = || "a".to_string();
    assert_eq!(
        one(&format!("{PRE}a munmap buf")),
        StmtKind::Munmap(stmt::Munmap {
            proc: a(),
            range: range("buf", None, None)
        })
    );
    assert_eq!(
        one(&format!("{PRE}a mprotect buf+1M:64K none")),
        StmtKind::Mprotect(stmt::Mprotect {
            proc: a(),
            range: range("buf", Some(1 << 20), Some(64 << 10)),
            prot: Prot::None
        })
    );
    assert_eq!(
        one(&format!("{PRE}a madvise buf:2M HUGEPAGE")),
        StmtKind::Madvise(stmt::Madvise {
            proc: a(),
            range: range("buf", None, Some(2 << 20)),
            advice: Advice::Hugepage
        })
    );
    assert_eq!(
        one(&format!("{PRE}a madvise buf+2M collapse")),
        StmtKind::Madvise(stmt::Madvise {
            proc: a(),
            range: range("buf", Some(2 << 20), None),
            advice: Advice::Collapse
        })
    );
    assert_eq!(
        one(&format!("{PRE}a read buf step=64K")),
        StmtKind::Read(stmt::Read {
            proc: a(),
            range: range("buf", None, None),
            step: Some(Size(65536))
        })
    );
    assert_eq!(
        one(&format!("{PRE}a read buf+1:3")),
        StmtKind::Read(stmt::Read {
            proc: a(),
            range: range("buf", Some(1), Some(3)),
            step: None
        })
    );
    assert_eq!(
        one(&format!("{PRE}a write buf zero step=2M")),
        StmtKind::Write(stmt::Write {
            proc: a(),
            range: range("buf", None, None),
            step: Some(Size(2 << 20)),
            zero: true
        })
    );
    assert_eq!(
        one(&format!("{PRE}a write buf")),
        StmtKind::Write(stmt::Write {
            proc: a(),
            range: range("buf", None, None),
            step: None,
            zero: false
        })
    );
    assert_eq!(
        one(&format!("{PRE}a pin buf:1M")),
        StmtKind::Pin(stmt::Pin {
            proc: a(),
            range: range("buf", None, Some(1 << 20))
        })
    );
    assert_eq!(
        one(&format!("{PRE}a unpin buf")),
        StmtKind::Unpin(stmt::Unpin {
            proc: a(),
            range: range("buf", None, None)
        })
    );
    assert_eq!(
        one(&format!("{PRE}split a buf+2M:2M")),
        StmtKind::Split(stmt::Split {
            proc: a(),
            range: range("buf", Some(2 << 20), Some(2 << 20))
        })
    );
}

#[test]
fn process_lifecycle_and_globals() {
    let k = kinds(&format!(
        "{PRE}a thp_disable on\na thp_disable off\na fork b\nb write buf\nb exit\nkhugepaged\nreclaim\nsnapshot after\n\
         expect vmstat.thp_fault_alloc >= 2\nexpect mthp.64kB.anon_fault_alloc == 0x10\nexpect smaps.a.buf.Rss <= 4096\na exit\n"
    ));
    assert_eq!(
        &k[2..],
        &[
            StmtKind::ThpDisable(stmt::ThpDisable {
                proc: "a".into(),
                on: true
            }),
            StmtKind::ThpDisable(stmt::ThpDisable {
                proc: "a".into(),
                on: false
            }),
            StmtKind::Fork(stmt::Fork {
                proc: "a".into(),
                child: "b".into()
            }),
            StmtKind::Write(stmt::Write {
                proc: "b".into(),
                range: range("buf", None, None),
                step: None,
                zero: false
            }),
            StmtKind::Exit(stmt::Exit { proc: "b".into() }),
            StmtKind::Khugepaged,
            StmtKind::Reclaim,
            StmtKind::Snapshot(stmt::Snapshot {
                label: "after".into()
            }),
            StmtKind::Expect(stmt::Expect {
                counters: vec!["vmstat.thp_fault_alloc".into()],
                op: CmpOp::Ge,
                value: 2
            }),
            StmtKind::Expect(stmt::Expect {
                counters: vec!["mthp.64kB.anon_fault_alloc".into()],
                op: CmpOp::Eq,
                value: 16
            }),
            StmtKind::Expect(stmt::Expect {
                counters: vec!["smaps.a.buf.Rss".into()],
                op: CmpOp::Le,
                value: 4096
            }),
            StmtKind::Exit(stmt::Exit { proc: "a".into() }),
        ]
    );
}

#[test]
fn base_page_from_machine() {
    // 16K pages: a 16K-aligned range is fine, a 4K-aligned one is not.
    let ok = "machine base_page=16K\nspawn a\na mmap buf 64K\na munmap buf+16K:16K\n";
    assert_eq!(kinds(ok).len(), 4);
    fails(
        "machine base_page=16K\nspawn a\na mmap buf 64K\na munmap buf+4K:16K\n",
        4,
        10,
        "it starts at 4096",
    );
    fails(
        "machine base_page=64K\nspawn a\na mmap buf 16K\n",
        3,
        12,
        "not a multiple of the base page (64K)",
    );
}

#[test]
fn a_region_fully_unmapped_is_gone_and_its_name_free() {
    // One munmap of all of it, or several that cover it.
    assert_eq!(
        kinds("spawn a\na mmap r 64K\na munmap r\na mmap r 128K\na write r+64K\n").len(),
        5
    );
    let several = "spawn a\na mmap r 64K\na munmap r+16K:16K\na munmap r:16K\na munmap r+32K\n";
    assert_eq!(kinds(&format!("{several}a mmap r 4K\n")).len(), 6);
    // Using it in between is an error, at the range.
    fails(
        &format!("{PRE}a munmap buf\na read buf\n"),
        4,
        8,
        "unknown region 'buf' of process 'a' (it was fully unmapped at line 3); it has no regions",
    );
    fails(
        &format!("{PRE}a munmap buf:2M\na munmap buf+2M\na munmap buf:4K\n"),
        5,
        10,
        "unknown region 'buf' of process 'a' (it was fully unmapped at line 4)",
    );
    // Part of it still mapped: the region is there, its name taken.
    assert_eq!(
        kinds(&format!(
            "{PRE}a munmap buf:2M\na munmap buf:4K\na read buf+2M\n"
        ))
        .len(),
        5
    );
    fails(
        &format!("{PRE}a munmap buf+4K\na mmap buf 4K\n"),
        4,
        8,
        "region 'buf' of process 'a' already exists (mapped at line 2)",
    );
    // A fork child has the regions that exist, not those that are gone.
    fails(
        &format!("{PRE}a mmap gone 4K\na munmap gone\na fork b\nb read gone\n"),
        6,
        8,
        "unknown region 'gone' of process 'b'; it has buf",
    );
}

#[test]
fn threads_share_their_process_regions() {
    let k = kinds(
        "spawn p\np mmap a 4K\np thread t\nt write a\nt mmap b 8K\np write b\n\
         t thread u\nu munmap a\nt exit\nu exit\np thread t\np exec\n",
    );
    assert_eq!(
        k[2],
        StmtKind::Thread(stmt::Thread {
            proc: "p".into(),
            thread: "t".into()
        })
    );
    assert_eq!(k[11], StmtKind::Exec(stmt::Exec { proc: "p".into() }));
    // A thread's name is a task name: no process or thread may take it.
    fails(
        "spawn p\np thread t\nspawn t\n",
        3,
        7,
        "'t' already names a thread of process 'p' (at line 2)",
    );
    fails(
        "spawn p\nspawn t\np thread t\n",
        3,
        10,
        "process 't' already exists",
    );
    fails("spawn p\np thread set\n", 2, 10, "statement keyword");
    // The process's exit ends its threads; a thread's exit ends it alone.
    fails(
        "spawn p\np thread t\np exit\nt write a\n",
        4,
        1,
        "unknown process 't'",
    );
    kinds("spawn p\np mmap a 4K\np thread t\nt exit\np write a\np thread t\n");
    // exec: from the process only; its threads end, its regions go.
    fails("spawn p\np thread t\nt exec\n", 3, 1, "exec from a thread");
    fails(
        "spawn p\np thread t\np exec\nt exit\n",
        4,
        1,
        "unknown process 't'",
    );
    fails(
        "spawn p\np mmap a 4K\np exec\np write a\n",
        4,
        9,
        "unknown region 'a' of process 'p' (it was gone with its address space, which exec replaced at line 3)",
    );
    kinds("spawn p\np mmap a 4K\np write a\np exec\nexpect smaps.p.a.Rss == 0\np mmap a 8K\n");
    // Threads have no counters of their own.
    fails(
        "spawn p\np thread t\nexpect stat.t.minflt == 0\n",
        3,
        8,
        "names process 't'",
    );
    fails("spawn p\np thread\n", 2, 9, "missing thread name");
    fails("spawn p\np exec now\n", 2, 8, "<proc> exec");
}

#[test]
fn an_exited_process_name_is_free() {
    assert_eq!(
        kinds("spawn a\na mmap r 4K\na exit\nspawn a\na mmap r 8K\na write r\n").len(),
        6
    );
    assert_eq!(
        kinds("spawn a\na fork b\nb exit\na fork b\nb exit\nspawn b\n").len(),
        6
    );
    // The new process has none of the old one's regions.
    fails(
        "spawn a\na mmap r 4K\na exit\nspawn a\na read r\n",
        5,
        8,
        "unknown region 'r' of process 'a' (it was gone with its process, which exited at line 3); it has no regions",
    );
    fails(
        "spawn a\nspawn b\na exit\nspawn b\n",
        4,
        7,
        "process 'b' already exists (spawned at line 2)",
    );
}

#[test]
fn expect_may_name_the_counters_of_what_is_gone() {
    let dead = "spawn a\na mmap r 64K\na write r\na munmap r\n";
    kinds(&format!(
        "{dead}expect smaps.a.r.Rss == 0\nexpect folios.a.r.64kB == 0\n"
    ));
    kinds(&format!(
        "{dead}a mmap r 4K\na munmap r\nexpect smaps.a.r.Rss == 0\n"
    ));
    kinds("spawn b\nb mmap r 4K\nb write r\nb exit\nexpect stat.b.minflt == 1\nexpect smaps.b.r.Rss == 0\n");
    // A process name used again: the old process's regions may be named.
    kinds("spawn b\nb mmap r 4K\nb exit\nspawn b\nexpect smaps.b.r.Rss == 0\n");
    // But only where the region or process existed.
    fails(
        &format!("{dead}expect smaps.a.q.Rss == 0\n"),
        5,
        8,
        "names region 'q' of 'a', which has no such region here",
    );
    fails(
        "expect smaps.a.r.Rss == 0\nspawn a\na mmap r 4K\n",
        1,
        8,
        "names process 'a', which no statement before it spawns or forks",
    );
    fails(
        &format!("{dead}a fork b\nexpect smaps.b.r.Rss == 0\n"),
        6,
        8,
        "names region 'r' of 'b', which has no such region here",
    );
}

#[test]
fn sizes() {
    for (text, bytes) in [
        ("0", 0u64),
        ("4096", 4096),
        ("4k", 4096),
        ("4KB", 4096),
        ("64K", 65536),
        ("2m", 2 << 20),
        ("1G", 1 << 30),
        ("3T", 3 << 40),
        ("0x1000", 4096),
        ("0XfF", 255),
        ("18446744073709551615", u64::MAX),
        ("0xffffffffffffffff", u64::MAX),
    ] {
        assert_eq!(text.parse::<Size>(), Ok(Size(bytes)), "{text}");
    }
    for bad in [
        "", "K", "+5", "-1", "1.5M", "12Q", "0x", "0x+1", "4KBB", "1 K", "٣",
    ] {
        assert!(
            matches!(bad.parse::<Size>(), Err(SizeError::Bad(_))),
            "{bad}"
        );
    }
    for big in ["18446744073709551616", "16777216T", "0x10000000000000000"] {
        assert!(
            matches!(big.parse::<Size>(), Err(SizeError::TooLarge(_))),
            "{big}"
        );
    }
    for (bytes, text) in [
        (0u64, "0"),
        (4095, "4095"),
        (4096, "4K"),
        (3 << 20, "3M"),
        (1536 << 20, "1536M"),
        (1 << 40, "1T"),
    ] {
        assert_eq!(Size(bytes).to_string(), text);
    }
}

#[test]
fn printing_is_canonical() {
    let text = "set transparent_hugepage/enabled always\nmachine arch=x86_64 base_page=4K memory=16G\ncgroup cg memory.max=1G\n\
                spawn a cgroup=cg\na mmap buf 4M align=2M hugetlb=2M shared prot=rw\na mprotect buf:2M r\n\
                a madvise buf+2M:2M NOHUGEPAGE\na read buf step=4K\na write buf+0 step=1 zero\na pin buf\na unpin buf\n\
                a fork b\na thp_disable on\nb exit\nsplit a buf\nkhugepaged\nreclaim\nsnapshot s\nexpect meminfo.MemFree >= 0\n\
                a munmap buf\n";
    let w = parse("t.hlw", text).unwrap();
    assert_eq!(w.to_string(), text);
    let messy = "  spawn   a\t# comment\na mmap buf 0x400000 prot=r align=0x200000\n";
    assert_eq!(
        parse("t.hlw", messy).unwrap().to_string(),
        "spawn a\na mmap buf 4M align=2M prot=r\n"
    );
}

#[test]
fn tunable_helpers() {
    let t: Tunable = "transparent_hugepage/hugepages-2048kB/enabled"
        .parse()
        .unwrap();
    assert_eq!(t, Tunable::ThpSizeEnabled { size_kb: 2048 });
    assert_eq!(t.path(), "transparent_hugepage/hugepages-2048kB/enabled");
    assert_eq!(
        t.parse_value("never"),
        Ok(SetValue::SizeEnabled(ThpSizeEnabled::Never))
    );
    assert!(t.parse_value("3").is_err());
    assert!("transparent_hugepage/hugepages-4kB/enabled"
        .parse::<Tunable>()
        .is_err());
    assert!("transparent_hugepage/hugepages-48kB/enabled"
        .parse::<Tunable>()
        .is_err());
}

/// The khugepaged stores' bounds (mm/khugepaged.c, Linux 6.18): an
/// out-of-range `set` is refused before the run, with the kernel's errno.
#[test]
fn khugepaged_bounds_are_the_kernels() {
    let knob = |k: &str| format!("set transparent_hugepage/khugepaged/{k}\n");
    for k in ["max_ptes_none", "max_ptes_swap", "max_ptes_shared"] {
        fails(
            &knob(&format!("{k} 512")),
            1,
            38 + k.len() as u32,
            "expected an integer from 0 to 511: the kernel refuses it with EINVAL",
        );
        let n = match one(&knob(&format!("{k} 511"))) {
            StmtKind::Set(stmt::Set { value, .. }) => value,
            other => panic!("{other:?}"),
        };
        assert_eq!(n, SetValue::Num(511));
    }
    fails(
        &knob("pages_to_scan 0"),
        1,
        51,
        "expected a positive integer up to 4294967295: the kernel refuses it with EINVAL",
    );
    fails(
        &knob("pages_to_scan 4294967296"),
        1,
        51,
        "the kernel refuses it with EINVAL",
    );
    fails(
        &knob("scan_sleep_millisecs 4294967296"),
        1,
        58,
        "expected an integer from 0 to 4294967295: the kernel refuses it with EINVAL",
    );
    one(&knob("alloc_sleep_millisecs 4294967295"));
    fails(
        &knob("defrag 2"),
        1,
        44,
        "expected 0 or 1: the kernel refuses it with EINVAL",
    );
}

#[test]
fn check_on_built_asts() {
    let stmt = |line, kind| Stmt {
        pos: Pos { line, col: 1 },
        kind,
    };
    let w = Workload {
        file: "gen".into(),
        stmts: vec![
            stmt(
                1,
                StmtKind::Spawn(stmt::Spawn {
                    proc: "a".into(),
                    cgroup: None,
                }),
            ),
            stmt(
                2,
                StmtKind::Read(stmt::Read {
                    proc: "a".into(),
                    range: range("x", None, None),
                    step: None,
                }),
            ),
        ],
    };
    let e = check::check(&w).unwrap_err();
    assert_eq!((e.line, e.col), (2, 1));
    assert!(
        e.message
            .contains("unknown region 'x' of process 'a'; it has no regions"),
        "{e}"
    );
    // Values the parser would never produce are refused too.
    let w = Workload {
        file: "gen".into(),
        stmts: vec![stmt(
            1,
            StmtKind::Set(stmt::Set {
                tunable: Tunable::ThpEnabled,
                value: SetValue::Num(3),
            }),
        )],
    };
    assert!(check::check(&w).is_err());
    // An out-of-range number: the kernel's store refuses it.
    let w = Workload {
        file: "gen".into(),
        stmts: vec![stmt(
            1,
            StmtKind::Set(stmt::Set {
                tunable: Tunable::Khugepaged(KhugepagedKnob::MaxPtesNone),
                value: SetValue::Num(512),
            }),
        )],
    };
    let e = check::check(&w).unwrap_err();
    assert_eq!(
        e.message,
        "bad value 512 for transparent_hugepage/khugepaged/max_ptes_none; \
         expected an integer from 0 to 511: the kernel refuses it with EINVAL"
    );
    let w = Workload {
        file: "gen".into(),
        stmts: vec![stmt(
            1,
            StmtKind::Machine(stmt::Machine {
                params: vec![MachineParam::BasePage(Size(0))],
            }),
        )],
    };
    assert!(check::check(&w).is_err());
}

#[test]
fn parse_file_errors() {
    let dir = std::env::temp_dir().join(format!("hugelab-parse-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.hlw");
    let e = parse_file(&missing).unwrap_err();
    assert_eq!(e.line, 0);
    assert!(
        e.to_string()
            .starts_with(&format!("{}: cannot read: ", missing.display())),
        "{e}"
    );
    let bad = dir.join("bad.hlw");
    std::fs::write(&bad, b"spawn a\nspawn \xc3b\xff\n").unwrap();
    let e = parse_file(&bad).unwrap_err();
    assert_eq!((e.line, e.col, e.message.as_str()), (2, 7, "invalid UTF-8"));
    let good = dir.join("good.hlw");
    std::fs::write(&good, "spawn a\n").unwrap();
    assert_eq!(parse_file(&good).unwrap().stmts.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- bad input --------------------------------------------------------------

#[test]
fn unknown_statement() {
    fails(
        "spawn a\nfoo\n",
        2,
        1,
        "unknown statement 'foo'; expected one of set, machine, cgroup, spawn",
    );
    fails(
        "  spwan a\n",
        1,
        3,
        "unknown statement 'spwan'; expected one of set, machine",
    );
    fails("9lives x\n", 1, 1, "unknown statement '9lives'");
    fails(
        "spawn a\na\n",
        2,
        2,
        "missing statement for process 'a'; expected one of mmap, munmap",
    );
    fails(
        "spawn a\na mmapp buf 4K\n",
        2,
        3,
        "unknown statement 'mmapp' for process 'a'; expected one of mmap, munmap, mprotect",
    );
}

/// `2MB`, `2MiB`, `1GB`: the common spellings, all binary.
#[test]
fn sizes_in_every_common_spelling() {
    let mmap = |size: &str| one(&format!("spawn a\na mmap buf {size} hugetlb=2MB\n"));
    for size in [
        "4M", "4m", "4MB", "4mb", "4MiB", "4096K", "4096kB", "4194304B",
    ] {
        assert_eq!(mmap(size), mmap("4194304"), "{size}");
    }
    assert_eq!(
        one("spawn a\na mmap buf 1GiB hugetlb=1GB\n"),
        one("spawn a\na mmap buf 1G hugetlb=1G\n")
    );
    assert_eq!(
        kinds("spawn a\na mmap buf 2MB\na read buf+1MiB:64KiB\n"),
        kinds("spawn a\na mmap buf 2M\na read buf+1M:64K\n")
    );
}

#[test]
fn bad_size() {
    fails(
        "spawn a\na mmap buf 12Q\n",
        2,
        12,
        "bad size '12Q'; expected bytes like 4096, 64K, 2M, 2MB, 1GiB or 0x1000",
    );
    fails("spawn a\na mmap buf 4K align=x\n", 2, 21, "bad size 'x'");
    fails(&format!("{PRE}a read buf+1Q:4K\n"), 3, 12, "bad size '1Q'");
    fails(&format!("{PRE}a read buf+1M:\n"), 3, 15, "bad size ''");
    fails(
        "spawn a\na mmap buf 99999999999T\n",
        2,
        12,
        "size too large",
    );
    fails("machine memory=0\n", 1, 16, "memory must be nonzero");
    fails(
        "machine base_page=8K\n",
        1,
        19,
        "bad base_page '8K'; expected one of 4K, 16K, 64K",
    );
}

#[test]
fn unknown_advice() {
    fails(
        &format!("{PRE}\n\n\n\na madvise buf HUGE\n"),
        7,
        15,
        "unknown advice 'HUGE'; expected one of HUGEPAGE, NOHUGEPAGE, DONTNEED, FREE, COLLAPSE, PAGEOUT, COLD",
    );
}

#[test]
fn mmap_at_errors() {
    fails(
        "spawn a\na mmap buf 4K at=7e0000000000\n",
        2,
        18,
        "bad address '7e0000000000'; expected a hex address",
    );
    fails("spawn a\na mmap buf 4K at=0x\n", 2, 18, "bad address '0x'");
    fails(
        "spawn a\na mmap buf 4K at=0x7e0000000800\n",
        2,
        18,
        "at=0x7e0000000800 is not a multiple of the base page (0x1000)",
    );
    fails(
        "machine base_page=16K\nspawn a\na mmap buf 16K at=0x7e0000001000\n",
        3,
        19,
        "not a multiple of the base page (0x4000)",
    );
    fails(
        "spawn a\na mmap buf 8K at=0x7ffffffff000\n",
        2,
        18,
        "ends above the user address-space limit (0x7ffffffff000)",
    );
    fails(
        "spawn a\na mmap buf 8K at=0xfffffffffffff000\n",
        2,
        18,
        "ends above the user address-space limit",
    );
    fails(
        "spawn a\na mmap buf 4K at=0x1000\n",
        2,
        18,
        "below vm.mmap_min_addr's default (0x10000)",
    );
    fails(
        "spawn a\na mmap buf 4K align=2M at=0x7e0000000000\n",
        2,
        21,
        "align= and at= exclude each other",
    );
    fails(
        "spawn a\na mmap buf 2M hugetlb=2M at=0x7e0000000000\n",
        2,
        29,
        "at= with hugetlb= is not supported yet",
    );
    // The last page below the limit is fine.
    one("spawn a\na mmap buf 4K at=0x7fffffffe000");
}

#[test]
fn mmap_file_errors() {
    fails(
        "spawn a\na mmap lib 4K file=/usr/lib/libc.so.6\n",
        2,
        20,
        "bad file name '/usr/lib/libc.so.6'",
    );
    fails(
        "spawn a\na mmap lib 4K offset=4K\n",
        2,
        22,
        "offset= needs file=",
    );
    fails(
        "spawn a\na mmap lib 8K file=f offset=100\n",
        2,
        29,
        "offset=0x64 is not a multiple of the base page",
    );
    fails(
        "spawn a\na mmap lib 2M hugetlb=2M file=f\n",
        2,
        31,
        "with hugetlb= is not supported",
    );
    fails(
        "spawn a\na mmap lib 4K shared file=f\n",
        2,
        27,
        "with shared is not supported yet",
    );
}

#[test]
fn unknown_and_duplicate_options() {
    fails(
        "spawn a\na mmap buf 4K huge\n",
        2,
        15,
        "unknown option 'huge' for mmap; expected one of align=<size>, hugetlb=2M|1G, shared, file=<name>, offset=<size>, prot=rw|r|none|rx|rwx|x, at=<hex address>",
    );
    fails(
        "spawn a\na mmap buf 4K shared shared\n",
        2,
        22,
        "duplicate option 'shared'; mmap accepts align=<size>",
    );
    fails(
        "spawn a\na mmap buf 4K align\n",
        2,
        15,
        "option 'align' needs a value: align=<size>",
    );
    fails(
        "spawn a\na mmap buf 4K shared=1\n",
        2,
        15,
        "option 'shared' takes no value",
    );
    fails(
        "spawn a\na mmap buf 4K hugetlb=4M\n",
        2,
        23,
        "bad hugetlb size '4M'; expected 2M or 1G",
    );
    fails(
        "spawn a\na mmap buf 4K prot=wx\n",
        2,
        20,
        "bad protection 'wx'; expected one of rw, r, none, rx, rwx, x",
    );
    fails(
        &format!("{PRE}a read buf zero\n"),
        3,
        12,
        "unknown option 'zero' for read; expected one of step=<size>",
    );
    fails(
        &format!("{PRE}a write buf step=4K step=8K\n"),
        3,
        21,
        "duplicate option 'step'",
    );
    fails(
        "spawn a cgrop=x\n",
        1,
        9,
        "unknown option 'cgrop' for spawn; expected one of cgroup=<cg>",
    );
    fails(
        "machine arch=x86_64 arch=arm64\n",
        1,
        21,
        "duplicate machine key 'arch'",
    );
    fails("machine cpus=4\n", 1, 9, "unknown machine key 'cpus'");
    fails(
        "machine arm64\n",
        1,
        9,
        "bad machine setting 'arm64'; expected arch=x86_64|arm64",
    );
    fails("machine arch=riscv\n", 1, 14, "unknown arch 'riscv'");
}

#[test]
fn unknown_tunable() {
    fails(
        "set transparent_hugepage/defarg always\n",
        1,
        5,
        "unknown tunable 'transparent_hugepage/defarg'; did you mean transparent_hugepage/defrag?",
    );
    fails(
        "set transparent_hugepage/colour always\n",
        1,
        5,
        "unknown tunable 'transparent_hugepage/colour'; expected one of transparent_hugepage/{enabled,",
    );
    fails(
        "set transparent_hugepage/hugepages-48kB/enabled always\n",
        1,
        5,
        "bad page size in hugepages-48kB",
    );
    fails(
        "set hugepages/hugepages-2048kB/free_hugepages 1\n",
        1,
        5,
        "'hugepages/hugepages-2048kB/free_hugepages' is a read-only kernel statistic, not a tunable",
    );
}

/// A typo gets the nearest tunable, one sentence, not the list of forms.
#[test]
fn tunable_typos_get_the_nearest_tunable() {
    for (typed, meant) in [
        (
            "transparent_hugepage/enable",
            "transparent_hugepage/enabled",
        ),
        (
            "transparent_hugepage/hugepages-64K/enabled",
            "transparent_hugepage/hugepages-64kB/enabled",
        ),
        (
            "transparent_hugepage/hugepages-2M/enabled",
            "transparent_hugepage/hugepages-2048kB/enabled",
        ),
        (
            "hugepages-64kB/enabled",
            "transparent_hugepage/hugepages-64kB/enabled",
        ),
        (
            "hugepages/hugepages-1G/nr_hugepages",
            "hugepages/hugepages-1048576kB/nr_hugepages",
        ),
        (
            "/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_non",
            "transparent_hugepage/khugepaged/max_ptes_none",
        ),
        ("vm.nr_hugepage", "vm.nr_hugepages"),
    ] {
        let e = fails(&format!("set {typed} 1\n"), 1, 5, "did you mean");
        assert_eq!(
            e.message,
            format!("unknown tunable '{typed}'; did you mean {meant}?")
        );
    }
}

/// A pasted file path names its tunable.
#[test]
fn tunable_file_paths_name_their_tunable() {
    for (path, name) in [
        (
            "/sys/kernel/mm/transparent_hugepage/enabled",
            "transparent_hugepage/enabled",
        ),
        (
            "/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled",
            "transparent_hugepage/hugepages-64kB/enabled",
        ),
        (
            "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "hugepages/hugepages-2048kB/nr_hugepages",
        ),
        ("/proc/sys/vm/nr_hugepages", "vm.nr_hugepages"),
    ] {
        let t: Tunable = path.parse().unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(t.path(), name);
        assert_eq!(Ok(t), name.parse::<Tunable>());
    }
}

/// A real kernel tunable hugelab does not model is said to be one.
#[test]
fn kernel_tunables_hugelab_does_not_model() {
    let e = fails("set vm.swappiness 10\n", 1, 5, "");
    assert_eq!(
        e.message,
        "'vm.swappiness' is a kernel tunable hugelab does not model; the vm. tunables it models are \
         vm.{hugetlb_optimize_vmemmap,nr_hugepages,nr_overcommit_hugepages,overcommit_memory,compaction_proactiveness,min_free_kbytes}"
    );
    fails(
        "set /proc/sys/vm/swappiness 10\n",
        1,
        5,
        "'/proc/sys/vm/swappiness' (vm.swappiness) is a kernel tunable hugelab does not model",
    );
    fails(
        "set transparent_hugepage/hugepages-64kB/shmem_enabled always\n",
        1,
        5,
        "'transparent_hugepage/hugepages-64kB/shmem_enabled' is a kernel tunable hugelab does not model; \
         `set` in docs/language.md lists the transparent_hugepage/ tunables it models",
    );
}

#[test]
fn bad_tunable_value() {
    fails(
        "set transparent_hugepage/enabled inherit\n",
        1,
        34,
        "bad value 'inherit' for transparent_hugepage/enabled; expected one of always, madvise, never",
    );
    fails(
        "set transparent_hugepage/defrag sometimes\n",
        1,
        33,
        "expected one of always, defer, defer+madvise, madvise, never",
    );
    fails(
        "set transparent_hugepage/use_zero_page 2\n",
        1,
        40,
        "expected 0 or 1",
    );
    fails(
        "set vm.nr_hugepages -1\n",
        1,
        21,
        "expected a non-negative integer",
    );
    fails(
        "set vm.overcommit_memory 3\n",
        1,
        26,
        "expected an integer from 0 to 2",
    );
    fails(
        "set transparent_hugepage/khugepaged/pages_to_scan 0\n",
        1,
        51,
        "expected a positive integer",
    );
}

#[test]
fn unknown_region() {
    fails(
        "spawn a\na mmap buf 4K\na mmap heap 8K\na read bux:4K\n",
        4,
        8,
        "unknown region 'bux' of process 'a'; it has buf, heap",
    );
    fails(
        "spawn a\na fork b\nb read buf\n",
        3,
        8,
        "unknown region 'buf' of process 'b'; it has no regions",
    );
}

#[test]
fn range_out_of_region() {
    fails(
        &format!("{PRE}a read buf+3M:2M\n"),
        3,
        8,
        "offset+length 5M > size 4M",
    );
    fails(
        &format!("{PRE}a read buf+4M\n"),
        3,
        8,
        "offset 4M >= size 4M",
    );
    fails(
        &format!("{PRE}a read buf+0xffffffffffffffff:4K\n"),
        3,
        8,
        "overflows",
    );
    fails(
        &format!("{PRE}a read buf:0\n"),
        3,
        12,
        "zero-length range 'buf:0'",
    );
    fails(
        &format!("{PRE}a madvise buf+1:4K HUGEPAGE\n"),
        3,
        11,
        "must start and end on base-page boundaries (4K): it starts at 1",
    );
    fails(&format!("{PRE}split a buf:100\n"), 3, 9, "it ends at 100");
}

#[test]
fn duplicate_names() {
    fails(
        "spawn a\na mmap buf 4K\n# again\na mmap buf 8K\n",
        4,
        8,
        "region 'buf' of process 'a' already exists (mapped at line 2)",
    );
    fails(
        "spawn a\nspawn a\n",
        2,
        7,
        "process 'a' already exists (spawned at line 1)",
    );
    fails(
        "spawn a\na fork b\na fork b\n",
        3,
        8,
        "process 'b' already exists (forked at line 2)",
    );
    fails(
        "cgroup x\ncgroup x\n",
        2,
        8,
        "cgroup 'x' already exists (at line 1)",
    );
    fails(
        "snapshot s\nsnapshot s\n",
        2,
        10,
        "snapshot 's' already taken (at line 1)",
    );
    fails("snapshot end\n", 1, 10, "reserved");
    fails("spawn split\n", 1, 7, "'split' is a statement keyword");
}

#[test]
fn process_that_exited() {
    fails(
        "spawn a\na mmap buf 4K\n\n\na exit\na read buf\n",
        6,
        1,
        "process 'a' has exited (at line 5)",
    );
    fails(
        "spawn a\na mmap buf 4K\na exit\nsplit a buf\n",
        4,
        7,
        "process 'a' has exited (at line 3)",
    );
}

#[test]
fn unknown_process_or_cgroup() {
    fails(
        "b mmap buf 4K\n",
        1,
        1,
        "unknown process 'b'; no process has been spawned",
    );
    fails(
        "spawn a\n  b exit\n",
        2,
        3,
        "unknown process 'b'; processes so far: a",
    );
    fails("spawn a\nsplit b buf\n", 2, 7, "unknown process 'b'");
    fails(
        "spawn a cgroup=cg\n",
        1,
        16,
        "unknown cgroup 'cg'; no cgroup has been declared",
    );
}

#[test]
fn missing_and_extra_arguments() {
    fails(
        "spawn a\na mmap buf\n",
        2,
        11,
        "missing size; usage: <proc> mmap <region> <size>",
    );
    fails("spawn\n", 1, 6, "missing process name; usage: spawn <proc>");
    fails("set transparent_hugepage/enabled\n", 1, 33, "missing value");
    fails(&format!("{PRE}a madvise buf\n"), 3, 14, "missing advice");
    fails("expect vmstat.x ==\n", 1, 19, "missing value");
    fails("machine\n", 1, 8, "missing machine key");
    fails(
        "spawn a\na exit now\n",
        2,
        8,
        "unexpected argument 'now'; usage: <proc> exit",
    );
    fails("reclaim all\n", 1, 9, "unexpected argument 'all'");
    fails("snapshot a b\n", 1, 12, "unexpected argument 'b'");
}

#[test]
fn other_bad_input() {
    fails(
        "spawn a\na mmap buf 0\n",
        2,
        12,
        "mmap size must be nonzero",
    );
    fails(
        "spawn a\na mmap buf 6K\n",
        2,
        12,
        "not a multiple of the base page (4K)",
    );
    fails(
        "spawn a\na mmap buf 4M hugetlb=1G\n",
        2,
        12,
        "not a multiple of its hugetlb page size (1G)",
    );
    fails(
        "spawn a\na mmap buf 4M align=12K\n",
        2,
        21,
        "align=12K must be a power of two of at least the base page",
    );
    // 2^63 bytes: found by the fuzz run (the model's placement overflowed).
    fails(
        "spawn a\na mmap buf 64K align=9223372036854775808\n",
        2,
        22,
        "align=8388608T is larger than the user address space (128T)",
    );
    fails(
        &format!("{PRE}a read buf step=0\n"),
        3,
        17,
        "step must be nonzero",
    );
    fails("spawn a\na thp_disable yes\n", 2, 15, "expected on or off");
    fails("expect .vmstat == 1\n", 1, 8, "bad counter name");
    fails("expect a..b == 1\n", 1, 8, "bad counter name");
    fails("expect vmstat.x != 1\n", 1, 17, "unknown comparison '!='");
    fails("expect vmstat.pgfault == --1\n", 1, 26, "bad value '--1'");
    fails("expect vmstat.pgfault == 1-\n", 1, 26, "bad value '1-'");
    fails(
        "spawn a\nmachine arch=arm64\n",
        2,
        1,
        "machine must come before 'spawn' at line 1",
    );
    fails(
        "machine arch=arm64\nmachine arch=x86_64\n",
        2,
        9,
        "machine key 'arch' already given at line 1",
    );
    fails("spawn a\na mmap 1buf 4K\n", 2, 8, "bad region name '1buf'");
    fails(&format!("{PRE}a read +4K\n"), 3, 8, "missing region name");
    // Columns count characters, not bytes.
    fails("spawn é\n", 1, 7, "bad process name 'é'");
    fails(
        "# ünïcödé\nspawn a\na mmap ünï 4K\n",
        3,
        8,
        "bad region name 'ünï'",
    );
    // The first error in file order wins, syntax or not.
    fails("a exit\nspawn 1\n", 1, 1, "unknown process 'a'");
}

#[test]
fn unknown_counter_gets_the_nearest_name() {
    fails(
        "spawn a\nexpect vmstat.thp_faul_alloc == 0\n",
        2,
        8,
        "unknown counter 'vmstat.thp_faul_alloc'; did you mean vmstat.thp_fault_alloc?",
    );
    fails(
        &format!("{PRE}expect smaps.a.buf.anonhugepages == 0\n"),
        3,
        8,
        "did you mean smaps.a.buf.AnonHugePages?",
    );
    fails(
        "expect nothing.like.this == 0\n",
        1,
        8,
        "unknown counter 'nothing.like.this'; counters are named vmstat.<field>, mthp.<size>.<stat>",
    );
}

#[test]
fn counter_naming_a_missing_process_region_or_cgroup() {
    fails(
        &format!("{PRE}expect smaps.b.Rss == 0\n"),
        3,
        8,
        "counter 'smaps.b.Rss' names process 'b', which no statement before it spawns or forks",
    );
    fails(
        &format!("{PRE}expect folios.a.heap.64kB == 0\n"),
        3,
        8,
        "names region 'heap' of 'a', which has no such region here",
    );
    fails(
        "expect memcg.g.memory.peak == 0\n",
        1,
        8,
        "names cgroup 'g', which no statement before it creates",
    );
}

#[test]
fn expect_signal() {
    let k = kinds(&format!(
        "{PRE}a fork b\nb write buf\nexpect signal == SIGBUS\na write buf\nexpect signal == 0\n"
    ));
    assert_eq!(
        k[k.len() - 3..],
        [
            StmtKind::ExpectSignal(stmt::ExpectSignal {
                signal: Signal::SIGBUS
            }),
            StmtKind::Write(stmt::Write {
                proc: "a".into(),
                range: Range {
                    region: "buf".into(),
                    offset: None,
                    len: None
                },
                step: None,
                zero: false
            }),
            StmtKind::ExpectSignal(stmt::ExpectSignal {
                signal: Signal::NONE
            })
        ]
    );
    // The process it declares killed is gone: its name is free, and it
    // can no longer be used; its counters can still be named.
    let killed = format!("{PRE}a fork b\nb write buf\nexpect signal == SIGBUS\n");
    kinds(&format!(
        "{killed}expect smaps.b.buf.Rss == 0\nspawn b\nb mmap buf 4K\n"
    ));
    fails(
        &format!("{killed}b read buf\n"),
        6,
        1,
        "process 'b' was killed by SIGBUS (at line 4)",
    );
    fails(
        &format!("{PRE}expect signal == SIGWHAT\n"),
        3,
        18,
        "unknown signal 'SIGWHAT'; expected 0 (not killed) or one of SIGHUP",
    );
    fails(
        &format!("{PRE}expect signal <= SIGBUS\n"),
        3,
        15,
        "a signal is compared with == only",
    );
    fails(
        "expect signal == 0\n",
        1,
        1,
        "expect signal checks the process of the statement before it, and there is none",
    );
    fails(
        &format!("{PRE}reclaim\nexpect signal == SIGBUS\n"),
        4,
        1,
        "the one at line 3 runs in no process",
    );
    fails(
        &format!("{PRE}expect signal + vmstat.pgfault == 0\n"),
        3,
        8,
        "signal is an outcome, not a counter",
    );
}

#[test]
fn expect_sums() {
    let k = kinds("expect vmstat.nr_memmap_pages + vmstat.nr_memmap_boot_pages == -112\n");
    assert_eq!(
        k,
        [StmtKind::Expect(stmt::Expect {
            counters: vec![
                "vmstat.nr_memmap_pages".into(),
                "vmstat.nr_memmap_boot_pages".into()
            ],
            op: CmpOp::Eq,
            value: -112
        })]
    );
    assert_eq!(
        kinds("expect vmstat.pgfault >= -0x10\n"),
        [StmtKind::Expect(stmt::Expect {
            counters: vec!["vmstat.pgfault".into()],
            op: CmpOp::Ge,
            value: -16
        })]
    );
    // Each part is checked against the registry, at its own column.
    fails(
        "expect vmstat.pgfault + vmstat.pgfualt == 1\n",
        1,
        25,
        "did you mean vmstat.pgfault?",
    );
    fails(
        "expect vmstat.pgfault + smaps.a.Rss == 1\n",
        1,
        25,
        "names process 'a'",
    );
    fails(
        "expect vmstat.pgfault+vmstat.thp_fault_alloc == 1\n",
        1,
        8,
        "a sum is written with spaces around each +",
    );
    fails(
        "expect vmstat.pgfault + == 1\n",
        1,
        25,
        "bad counter name '=='",
    );
    fails("expect vmstat.pgfault +\n", 1, 24, "missing counter");
    fails(
        "expect vmstat.pgfault == 9223372036854775808\n",
        1,
        26,
        "value too large",
    );
}

#[test]
fn expect_errno() {
    let k = kinds(&format!(
        "{PRE}a madvise buf COLLAPSE\nexpect errno == EAGAIN\nexpect errno == 0\n"
    ));
    assert_eq!(
        k[k.len() - 2..],
        [
            StmtKind::ExpectErrno(stmt::ExpectErrno {
                errno: Errno::EAGAIN
            }),
            StmtKind::ExpectErrno(stmt::ExpectErrno { errno: Errno::OK })
        ]
    );
    fails(
        &format!("{PRE}expect errno == EWHAT\n"),
        3,
        17,
        "unknown errno 'EWHAT'; expected 0 (success) or one of EPERM",
    );
    fails(
        &format!("{PRE}expect errno >= EAGAIN\n"),
        3,
        14,
        "an errno is compared with == only",
    );
    fails(
        "expect errno == 0\n",
        1,
        1,
        "expect errno checks the statement before it, and there is none",
    );
}

#[test]
fn fragment_statement() {
    assert_eq!(
        one("fragment unmovable=10%"),
        StmtKind::Fragment(stmt::Fragment {
            permille: 100,
            pattern: FragmentPattern::Spread,
            seed: 0
        })
    );
    assert_eq!(
        one("fragment seed=42 pattern=clustered unmovable=2.5%"),
        StmtKind::Fragment(stmt::Fragment {
            permille: 25,
            pattern: FragmentPattern::Clustered,
            seed: 42
        })
    );
    let text = "fragment unmovable=2.5% pattern=clustered seed=42\nfragment unmovable=10% pattern=spread\n";
    assert_eq!(parse("t.hlw", text).unwrap().to_string(), text);
    fails("fragment", 1, 9, "fragment needs unmovable=<percent>%");
    fails("fragment unmovable=10", 1, 20, "bad share '10'");
    fails("fragment unmovable=101%", 1, 20, "bad share");
    fails("fragment unmovable=1.25%", 1, 20, "at most one decimal");
    fails(
        "fragment unmovable=5% pattern=random",
        1,
        31,
        "bad pattern 'random'",
    );
    fails("fragment unmovable=5% seed=-1", 1, 28, "bad seed");
    fails(
        "fragment unmovable=5% colour=red",
        1,
        23,
        "unknown option 'colour'",
    );
    fails("spawn fragment", 1, 7, "fragment");
}

#[test]
fn populate_stack_growsdown_and_brk_print_and_parse_back() {
    let text = "spawn a\na mmap buf 4M populate\na mmap s 64K stack\n\
                a mmap stk 1M at=0x7e0000200000 growsdown initial=64K\na mmap g 8K growsdown\n\
                a madvise buf POPULATE_READ\na madvise buf:2M POPULATE_WRITE\n\
                a brk heap 0 at=0x555555a00000\na brk heap 132K\na write heap:4K\na brk heap 4097\n";
    let w = parse("t.hlw", text).unwrap();
    assert_eq!(w.to_string(), text);
    let again = parse("t.hlw", &w.to_string()).unwrap();
    let kinds = |w: &hugelab_workload::Workload| -> Vec<StmtKind> {
        w.stmts.iter().map(|s| s.kind.clone()).collect()
    };
    assert_eq!(kinds(&again), kinds(&w));
}

#[test]
fn populate_stack_growsdown_errors() {
    fails(
        "spawn a\na mmap buf 64K initial=8K\n",
        2,
        24,
        "initial= is the first VMA of a growsdown stack; it needs growsdown",
    );
    fails(
        "spawn a\na mmap buf 64K growsdown initial=128K\n",
        2,
        34,
        "initial=128K must be a nonzero multiple of the base page (4K) of at most the size (64K)",
    );
    fails(
        "spawn a\na mmap buf 2M hugetlb=2M populate\n",
        2,
        26,
        "populate is for anonymous memory; with hugetlb= it is not supported yet",
    );
    fails(
        "spawn a\na mmap buf 64K prot=none populate\n",
        2,
        26,
        "populate of a prot=none mapping is not supported",
    );
}

#[test]
fn brk_errors() {
    fails(
        "spawn a\na brk heap 4K\n",
        2,
        7,
        "the first brk of heap 'heap' needs at=<hex address>",
    );
    fails(
        "spawn a\na brk heap 4K at=0x555555a00000\na brk heap 8K at=0x555555a00000\n",
        3,
        18,
        "at= gives the start of a new brk area; heap 'heap' exists since line 2",
    );
    fails(
        "spawn a\na mmap heap 4K\na brk heap 8K\n",
        3,
        7,
        "region 'heap' of process 'a' is not a heap made by brk (mapped at line 2)",
    );
    fails(
        "spawn a\na brk heap 4K at=0x7ffffff00000\na brk heap 0xfffffffffffff000\n",
        3,
        12,
        "brk 0xfffffffffffff000 from 0x7ffffff00000 ends above the user address-space limit",
    );
    fails(
        "spawn a\na brk heap 0xffffffffffffffff at=0x10000\n",
        2,
        12,
        "ends above the user address-space limit",
    );
    fails(
        "spawn a\na brk heap 0 at=0x555555a00000\na write heap\n",
        3,
        9,
        "offset 0 >= size 0",
    );
}

/// `mremap`: the whole region, a nonzero base-page multiple, an `at=` the
/// checker can place; it names the new size afterwards.
#[test]
fn mremap_statements() {
    let w = parse(
        "buf.hlw",
        "spawn a\na mmap buf 2M\na mremap buf 1M\na mremap buf:1M 4M at=0x7e0000a00000 maymove\n\
         a write buf+3M:4K\n",
    )
    .unwrap();
    let StmtKind::Mremap(m) = &w.stmts[3].kind else {
        panic!("{:?}", w.stmts[3]);
    };
    assert_eq!(
        (m.new_size, m.at, m.maymove),
        (Size(4 << 20), Some(0x7e00_00a0_0000), true)
    );
    assert_eq!(
        w.stmts[3].kind.to_string(),
        "a mremap buf:1M 4M at=0x7e0000a00000 maymove"
    );
    fails(
        "spawn a\na mmap buf 2M\na mremap buf+1M 4M\n",
        3,
        10,
        "mremap takes a whole region: range 'buf+1M' is 1M of the 2M of region 'buf'",
    );
    fails(
        "spawn a\na mmap buf 2M\na mremap buf 0\n",
        3,
        14,
        "mremap new size must be nonzero",
    );
    fails(
        "spawn a\na mmap buf 2M\na mremap buf 6000\n",
        3,
        14,
        "is not a multiple of the base page",
    );
    fails(
        "spawn a\na mmap buf 2M\na mremap buf 4M at=0x7e0000000800\n",
        3,
        20,
        "at=0x7e0000000800 is not a multiple of the base page (0x1000)",
    );
    fails(
        "spawn a\na mmap buf 2M\na mremap buf\n",
        3,
        13,
        "<proc> mremap <range> <new-size>",
    );
    fails(
        "spawn a\na mmap buf 2M\na mremap buf 1M\na write buf+1M\n",
        4,
        9,
        "offset 1M >= size 1M",
    );
    // A shrink keeps the hole of what stays: unmapping the rest frees the name.
    parse(
        "buf.hlw",
        "spawn a\na mmap h 4M\na munmap h+1M:1M\na mremap h 3M\na munmap h:1M\n\
         a munmap h+2M:1M\na mmap h 1M\n",
    )
    .unwrap();
}

/// `sleep <duration>`: read in any unit, printed in the largest that divides
/// it; a bad duration is refused at its column.
#[test]
fn sleep_statements() {
    let w = hugelab_workload::parse("t.hlw", "spawn a\nsleep 1.5ms\nsleep 2000000us\n").unwrap();
    assert_eq!(w.stmts[1].kind.to_string(), "sleep 1500us");
    assert_eq!(w.stmts[2].kind.to_string(), "sleep 2s");
    fails(
        "sleep 3 ms\n",
        1,
        7,
        "bad duration '3'; expected a number with ns, us, ms or s",
    );
    fails("sleep -1s\n", 1, 7, "bad duration '-1s'");
    fails("sleep\n", 1, 6, "duration");
    fails("spawn sleep\n", 1, 7, "sleep");
}

#[test]
fn every_protection_parses_and_prints_back() {
    for p in Prot::ALL {
        let text = format!("{PRE}a mprotect buf:64K {p}");
        let want = StmtKind::Mprotect(stmt::Mprotect {
            proc: "a".into(),
            range: range("buf", None, Some(64 << 10)),
            prot: p,
        });
        assert_eq!(one(&text), want);
        assert_eq!(want.to_string(), format!("a mprotect buf:64K {p}"));
        let StmtKind::Mmap(m) = one(&format!("spawn a\na mmap t 8K file=lib prot={p}")) else {
            panic!("not an mmap");
        };
        assert_eq!(m.prot, Some(p));
    }
    let names: Vec<_> = Prot::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(names, ["rw", "r", "none", "rx", "rwx", "x"]);
    assert_eq!(Prot::from_bits(5), Prot::ReadExec);
    assert_eq!(Prot::from_bits(7), Prot::ReadWriteExec);
    assert_eq!(Prot::from_bits(4), Prot::Exec);
    assert_eq!(Prot::from_bits(2), Prot::ReadWrite);
    assert_eq!(Prot::from_bits(0), Prot::None);
}

#[test]
fn special_reads_and_their_errors() {
    let k = one("spawn a\na special vdso+4K:4K\n");
    let StmtKind::Special(s) = &k else {
        panic!("{k:?}")
    };
    assert_eq!(s.to_string(), "a special vdso+4K:4K");
    assert_eq!(s.pages(), Ok((0, 1, 2)));
    assert!(parse("t.hlw", "spawn a\na special vvar:4K\na special vvar+8K:4K\na special vvar_vclock:4K\na special vdso\n").is_ok());
    fails(
        "spawn a\na special heap:4K\n",
        2,
        11,
        "unknown special mapping 'heap'; expected vdso, vvar or vvar_vclock",
    );
    fails(
        "spawn a\na special vvar+4K:4K\n",
        2,
        11,
        "page 1 of vvar faults with SIGBUS",
    );
    fails(
        "spawn a\na special vdso+8K:4K\n",
        2,
        11,
        "is outside region 'vdso'",
    );
    fails(
        "spawn a\na special vdso+1K:4K\n",
        2,
        11,
        "is not whole pages of vdso",
    );
    fails("spawn a\na exit\na special vdso\n", 3, 1, "");
}
