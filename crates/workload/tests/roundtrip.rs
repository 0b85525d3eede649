//! Property tests: printing then parsing a valid workload gives back the same
//! statements, and the parser never panics, whatever it is fed.

use hugelab_workload::*;
use proptest::prelude::*;

/// One random step of a workload, as raw numbers; [`build`] turns a list of
/// them into statements that are valid at their place (a process exists
/// before it maps, regions exist before ranges name them, ranges are in
/// bounds and base-page aligned where they must be). Raw numbers rather than
/// a recursive strategy keep the generator simple and shrinking effective.
#[derive(Clone, Debug)]
struct Raw {
    op: u8,
    a: u64,
    b: u64,
    c: u64,
}

fn raw() -> impl Strategy<Value = Raw> {
    (any::<u8>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(op, a, b, c)| Raw {
        op,
        a,
        b,
        c,
    })
}

struct Proc {
    name: String,
    alive: bool,
    /// Name, size and what is still mapped: a region fully unmapped is gone.
    regions: Vec<(String, u64, mapped::Mapped)>,
}

/// Process names, some of them verbs or odd-looking, none a keyword.
const PROC_NAMES: &[&str] = &[
    "a", "b", "mmap", "read", "exit", "_p", "p-1", "P_2-x", "fork", "zero",
];

const TUNABLES: &[&str] = &[
    "transparent_hugepage/enabled",
    "transparent_hugepage/defrag",
    "transparent_hugepage/use_zero_page",
    "transparent_hugepage/shrink_underused",
    "transparent_hugepage/anon_beside_full",
    "transparent_hugepage/hugepages-16kB/enabled",
    "transparent_hugepage/hugepages-2048kB/enabled",
    "transparent_hugepage/khugepaged/defrag",
    "transparent_hugepage/khugepaged/max_ptes_none",
    "transparent_hugepage/khugepaged/max_ptes_swap",
    "transparent_hugepage/khugepaged/max_ptes_shared",
    "transparent_hugepage/khugepaged/pages_to_scan",
    "transparent_hugepage/khugepaged/scan_sleep_millisecs",
    "transparent_hugepage/khugepaged/alloc_sleep_millisecs",
    "hugepages/hugepages-2048kB/nr_hugepages",
    "hugepages/hugepages-1048576kB/nr_overcommit_hugepages",
    "vm.hugetlb_optimize_vmemmap",
    "vm.nr_hugepages",
    "vm.nr_overcommit_hugepages",
    "vm.overcommit_memory",
    "vm.compaction_proactiveness",
    "vm.min_free_kbytes",
];

/// A value this tunable accepts, found by trying candidates in turn.
fn set_value(t: &Tunable, pick: u64) -> SetValue {
    let words = [
        "always",
        "inherit",
        "madvise",
        "never",
        "defer",
        "defer+madvise",
    ];
    let nums = [
        pick.to_string(),
        (pick % 101).to_string(),
        (pick % 3).to_string(),
        (pick % 2).to_string(),
        "1".to_string(),
    ];
    let start = (pick % words.len() as u64) as usize;
    let candidates = words
        .iter()
        .cycle()
        .skip(start)
        .take(words.len())
        .map(|s| s.to_string())
        .chain(nums);
    for c in candidates {
        if let Ok(v) = t.parse_value(&c) {
            return v;
        }
    }
    unreachable!("no value for {t}")
}

fn pick<T>(v: &[T], n: u64) -> Option<&T> {
    if v.is_empty() {
        None
    } else {
        v.get((n % v.len() as u64) as usize)
    }
}

/// A range of a region of `size` bytes; `aligned` keeps both ends on `base`.
fn gen_range(region: &str, size: u64, base: u64, aligned: bool, r: &Raw) -> Range {
    let unit = if aligned { base } else { 1 };
    let units = size / unit;
    let off_units = r.a % units;
    let len_units = 1 + r.b % (units - off_units);
    let (offset, len) = match r.c % 5 {
        0 => (None, None),
        1 => (Some(off_units * unit), None),
        2 => (None, Some(len_units.min(units) * unit)),
        3 => (Some(0), Some(size)),
        _ => (Some(off_units * unit), Some(len_units * unit)),
    };
    // A ":len" without offset starts at 0, so any len up to the size is fine.
    Range {
        region: region.to_string(),
        offset: offset.map(Size),
        len: len.map(Size),
    }
}

fn build(machine: Option<(u8, u8, u64)>, raws: &[Raw]) -> Workload {
    let mut kinds = Vec::new();
    let mut base = 4096u64;
    if let Some((arch, bp, mem)) = machine {
        base = [4096u64, 16384, 65536][(bp % 3) as usize];
        let mut params = vec![MachineParam::BasePage(Size(base))];
        if arch % 2 == 0 {
            params.insert(
                0,
                MachineParam::Arch(if arch % 4 == 0 {
                    Arch::X86_64
                } else {
                    Arch::Arm64
                }),
            );
        }
        if mem % 3 != 0 {
            params.push(MachineParam::Memory(Size((1 + mem % 64) << 30)));
        }
        kinds.push(StmtKind::Machine(stmt::Machine { params }));
    }
    let mut procs: Vec<Proc> = Vec::new();
    let mut cgroups: Vec<String> = Vec::new();
    let mut counter = 0u64;
    for r in raws {
        counter += 1;
        let live: Vec<usize> = (0..procs.len()).filter(|&i| procs[i].alive).collect();
        let with_regions: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&i| !procs[i].regions.is_empty())
            .collect();
        let new_proc_name = |procs: &Vec<Proc>, n: u64| {
            let base = PROC_NAMES[(n % PROC_NAMES.len() as u64) as usize];
            // The name of a process that exited is free again.
            if procs.iter().any(|p| p.name == base && p.alive) {
                format!("{base}{counter}")
            } else {
                base.to_string()
            }
        };
        let kind = match r.op % 18 {
            0 => {
                let t: Tunable = TUNABLES[(r.a % TUNABLES.len() as u64) as usize]
                    .parse()
                    .unwrap();
                let value = set_value(&t, r.b);
                StmtKind::Set(stmt::Set { tunable: t, value })
            }
            1 => {
                let cg = format!("cg{counter}");
                cgroups.push(cg.clone());
                StmtKind::Cgroup(stmt::Cgroup {
                    cgroup: cg,
                    memory_max: (r.a % 2 == 0).then_some(Size((r.b % 4096) << 20)),
                })
            }
            2 | 3 => {
                let name = new_proc_name(&procs, r.a);
                procs.push(Proc {
                    name: name.clone(),
                    alive: true,
                    regions: Vec::new(),
                });
                let cgroup = if r.b % 2 == 0 {
                    pick(&cgroups, r.c).cloned()
                } else {
                    None
                };
                StmtKind::Spawn(stmt::Spawn { proc: name, cgroup })
            }
            4..=6 => {
                let Some(&i) = pick(&live, r.a) else { continue };
                let region = format!("r{counter}");
                let hugetlb = match r.b % 8 {
                    0 => Some(HugetlbSize::Size2M),
                    1 => Some(HugetlbSize::Size1G),
                    _ => None,
                };
                let size = match hugetlb {
                    Some(h) => h.bytes().0 * (1 + r.c % 3),
                    None => base * (1 + r.c % 1024),
                };
                let align = (r.b % 3 == 0).then(|| Size(base << (r.a % 10)));
                let prot = Prot::ALL.get(((r.b / 8) % 7) as usize).copied();
                procs[i]
                    .regions
                    .push((region.clone(), size, mapped::Mapped::whole(size)));
                // A file mapping now and then (private, no hugetlb=), the
                // anonymous mmap flags elsewhere.
                let file = hugetlb.is_none() && r.c % 5 == 1;
                let grows = !file && growsdown(hugetlb, r);
                StmtKind::Mmap(stmt::Mmap {
                    proc: procs[i].name.clone(),
                    region,
                    size: Size(size),
                    align,
                    hugetlb,
                    shared: (r.b / 32) % 2 == 0 && r.c % 5 != 1,
                    file: file.then(|| "libc.so.6".to_string()),
                    offset: (hugetlb.is_none() && r.c % 10 == 1).then(|| Size((r.a % 64) * base)),
                    prot,
                    // A fixed address where neither align= nor hugetlb=
                    // excludes it: base-page aligned, well below the limit.
                    at: (align.is_none() && hugetlb.is_none() && r.c % 4 == 0)
                        .then(|| 0x1000_0000_0000 + (r.a % 4096) * base),
                    // The anonymous mmap flags, where the checker allows them.
                    populate: hugetlb.is_none() && prot != Some(Prot::None) && r.c % 5 == 3,
                    stack: !file && hugetlb.is_none() && r.c % 7 == 2,
                    growsdown: grows,
                    initial: (grows && r.a % 2 == 0)
                        .then(|| Size(base * (1 + r.a % (size / base)))),
                })
            }
            op @ 7..=13 => {
                let Some(&i) = pick(&with_regions, r.a) else {
                    continue;
                };
                let Some((region, size, _)) = pick(&procs[i].regions, r.b).cloned() else {
                    continue;
                };
                let proc = procs[i].name.clone();
                if op == 13 && r.c % 3 == 0 {
                    // mremap takes the whole region; it names the new size after.
                    let new = base * (1 + r.a % 1024);
                    let regions = &mut procs[i].regions;
                    let at = regions.iter().position(|(n, ..)| *n == region).unwrap();
                    // As the checker: a shrink or a same-size move keeps the holes.
                    let mut m = regions[at].2.clone();
                    if new <= size {
                        m.unmap(new, size);
                    } else {
                        m = mapped::Mapped::whole(new);
                    }
                    regions[at] = (region.clone(), new, m);
                    let range = Range {
                        region,
                        offset: None,
                        len: (r.b % 2 == 0).then_some(Size(size)),
                    };
                    let fixed = r.b % 3 == 0;
                    let mremap = StmtKind::Mremap(stmt::Mremap {
                        proc,
                        range,
                        new_size: Size(new),
                        at: fixed.then(|| 0x2000_0000_0000 + (r.a % 4096) * base),
                        maymove: r.c % 2 == 0,
                    });
                    kinds.push(mremap);
                    continue;
                }
                let aligned = !matches!(op, 10 | 11);
                let range = gen_range(&region, size, base, aligned, r);
                if op == 7 {
                    let (start, end) = range.resolve(0, size).unwrap();
                    let regions = &mut procs[i].regions;
                    let at = regions.iter().position(|(n, ..)| *n == region).unwrap();
                    regions[at].2.unmap(start, end);
                    if regions[at].2.is_empty() {
                        regions.remove(at);
                    }
                }
                let step = (r.c % 3 == 0).then(|| Size(1 + (r.a >> 8) % (4 << 20)));
                match op {
                    7 => StmtKind::Munmap(stmt::Munmap { proc, range }),
                    8 => {
                        let prot = Prot::ALL[(r.c % 6) as usize];
                        StmtKind::Mprotect(stmt::Mprotect { proc, range, prot })
                    }
                    9 => {
                        let advice = Advice::ALL[(r.c % Advice::ALL.len() as u64) as usize];
                        StmtKind::Madvise(stmt::Madvise {
                            proc,
                            range,
                            advice,
                        })
                    }
                    10 => StmtKind::Read(stmt::Read { proc, range, step }),
                    11 => StmtKind::Write(stmt::Write {
                        proc,
                        range,
                        step,
                        zero: r.b % 2 == 0,
                    }),
                    12 if r.c % 2 == 0 => StmtKind::Pin(stmt::Pin { proc, range }),
                    12 => StmtKind::Unpin(stmt::Unpin { proc, range }),
                    _ => StmtKind::Split(stmt::Split { proc, range }),
                }
            }
            14 => {
                let Some(&i) = pick(&live, r.a) else { continue };
                match r.b % 5 {
                    0 => {
                        procs[i].alive = false;
                        StmtKind::Exit(stmt::Exit {
                            proc: procs[i].name.clone(),
                        })
                    }
                    4 => {
                        procs[i].regions.clear();
                        StmtKind::Exec(stmt::Exec {
                            proc: procs[i].name.clone(),
                        })
                    }
                    1 => StmtKind::ThpDisable(stmt::ThpDisable {
                        proc: procs[i].name.clone(),
                        on: r.c % 2 == 0,
                    }),
                    _ => {
                        let child = new_proc_name(&procs, r.c);
                        let regions = procs[i].regions.clone();
                        let parent = procs[i].name.clone();
                        procs.push(Proc {
                            name: child.clone(),
                            alive: true,
                            regions,
                        });
                        StmtKind::Fork(stmt::Fork {
                            proc: parent,
                            child,
                        })
                    }
                }
            }
            15 => match r.a % 3 {
                0 => StmtKind::Khugepaged,
                1 => StmtKind::Reclaim,
                _ => StmtKind::Fragment(stmt::Fragment {
                    permille: (r.b % 1001) as u32,
                    pattern: if r.c % 2 == 0 {
                        FragmentPattern::Spread
                    } else {
                        FragmentPattern::Clustered
                    },
                    seed: r.c % 3 * (r.c >> 8),
                }),
            },
            16 => StmtKind::Snapshot(stmt::Snapshot {
                label: format!("s{counter}"),
            }),
            // Only `0`: a signal would make the process gone for the
            // checker, and later statements here may still name it.
            _ if r.b % 7 == 1 && kinds.last().is_some_and(|k| k.process().is_some()) => {
                StmtKind::ExpectSignal(stmt::ExpectSignal {
                    signal: Signal::NONE,
                })
            }
            _ if r.b % 5 == 0 && kinds.last().is_some_and(|k| !is_check(k)) => {
                let names = ["0", "EAGAIN", "EINVAL", "ENOMEM", "EFAULT"];
                StmtKind::ExpectErrno(stmt::ExpectErrno {
                    errno: Errno::from_name(names[(r.a % names.len() as u64) as usize]).unwrap(),
                })
            }
            _ => {
                let mut counters = vec![
                    "vmstat.thp_fault_alloc".to_string(),
                    "mthp.64kB.anon_fault_alloc".to_string(),
                    "meminfo.MemFree".to_string(),
                ];
                if let Some(&i) = pick(&with_regions, r.c) {
                    let p = &procs[i];
                    let region = &p.regions[(r.c % p.regions.len() as u64) as usize].0;
                    counters.push(format!("smaps.{}.{region}.Rss", p.name));
                    counters.push(format!("folios.{}.{region}.64kB.pte", p.name));
                    counters.push(format!("stat.{}.minflt", p.name));
                }
                if let Some(cg) = pick(&cgroups, r.c) {
                    counters.push(format!("memcg.{cg}.memory.peak"));
                }
                let first = counters[(r.a % counters.len() as u64) as usize].clone();
                let mut sum = vec![first];
                if r.b % 4 == 3 {
                    sum.push(counters[(r.c % counters.len() as u64) as usize].clone());
                }
                let magnitude = (r.c >> (r.a % 64)) as i64;
                StmtKind::Expect(stmt::Expect {
                    counters: sum,
                    op: [CmpOp::Eq, CmpOp::Le, CmpOp::Ge][(r.b % 3) as usize],
                    value: if r.a % 3 == 0 {
                        magnitude.wrapping_neg()
                    } else {
                        magnitude
                    },
                })
            }
        };
        kinds.push(kind);
    }
    let stmts = kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Stmt {
            pos: Pos {
                line: i as u32 + 1,
                col: 1,
            },
            kind,
        })
        .collect();
    Workload {
        file: "gen.hlw".to_string(),
        stmts,
    }
}

fn workload() -> impl Strategy<Value = Workload> {
    (
        proptest::option::of((any::<u8>(), any::<u8>(), any::<u64>())),
        proptest::collection::vec(raw(), 0..60),
    )
        .prop_map(|(m, raws)| build(m, &raws))
}

fn kinds(w: &Workload) -> Vec<&StmtKind> {
    w.stmts.iter().map(|s| &s.kind).collect()
}

/// Words the crude fuzzer builds lines from: every keyword, verb and option,
/// plus near misses and hostile bytes.
const VOCAB: &[&str] = &[
    "set",
    "machine",
    "cgroup",
    "spawn",
    "split",
    "khugepaged",
    "reclaim",
    "snapshot",
    "expect",
    "mmap",
    "munmap",
    "mprotect",
    "madvise",
    "read",
    "write",
    "pin",
    "unpin",
    "fork",
    "thp_disable",
    "exit",
    "a",
    "b",
    "buf",
    "heap",
    "buf+4K",
    "buf:4K",
    "buf+1M:64K",
    "buf+",
    "buf:",
    "+:",
    "buf+0xffffffffffffffff:1",
    "4K",
    "2M",
    "1G",
    "0x1000",
    "0",
    "99999999999999999999T",
    "align=2M",
    "at=0x7e0000200000",
    "at=0x1001",
    "at=",
    "hugetlb=2M",
    "hugetlb=1G",
    "shared",
    "prot=rw",
    "prot=",
    "step=4K",
    "step=0",
    "zero",
    "cgroup=cg",
    "memory.max=1G",
    "arch=arm64",
    "base_page=16K",
    "memory=0",
    "HUGEPAGE",
    "COLD",
    "on",
    "off",
    "==",
    "<=",
    ">=",
    "vmstat.thp_fault_alloc",
    "transparent_hugepage/enabled",
    "transparent_hugepage/hugepages-64kB/enabled",
    "hugepages/hugepages-kB/nr_hugepages",
    "vm.nr_hugepages",
    "always",
    "never",
    "defer+madvise",
    "#",
    "é",
    "\u{0}",
    "\r",
    "=",
    "==",
    "\u{feff}",
    "日本",
    "end",
];

fn vocab_text() -> impl Strategy<Value = String> {
    let line =
        proptest::collection::vec(proptest::sample::select(VOCAB), 0..7).prop_map(|w| w.join(" "));
    proptest::collection::vec(line, 0..12).prop_map(|l| l.join("\n"))
}

#[derive(Clone, Debug)]
enum Mutation {
    Delete(usize, usize),
    Insert(usize, String),
    InsertWord(usize, &'static str),
    SwapLines(usize, usize),
    DupLine(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0usize..8).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (any::<usize>(), "\\PC{0,3}|[ \t\n#:+=.]").prop_map(|(a, s)| Mutation::Insert(a, s)),
        (any::<usize>(), proptest::sample::select(VOCAB))
            .prop_map(|(a, w)| Mutation::InsertWord(a, w)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        any::<usize>().prop_map(Mutation::DupLine),
    ]
}

/// Applies mutations on characters (never splitting one) and on lines.
fn mutate(text: &str, muts: &[Mutation]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for m in muts {
        let at = |a: usize, len: usize| a % (len + 1);
        match m {
            Mutation::Delete(a, n) => {
                let s = at(*a, chars.len());
                let e = (s + n).min(chars.len());
                chars.drain(s..e);
            }
            Mutation::Insert(a, s) => {
                let p = at(*a, chars.len());
                chars.splice(p..p, s.chars());
            }
            Mutation::InsertWord(a, w) => {
                let p = at(*a, chars.len());
                chars.splice(p..p, format!(" {w} ").chars());
            }
            Mutation::SwapLines(a, b) => {
                let s: String = chars.iter().collect();
                let mut lines: Vec<&str> = s.split('\n').collect();
                let n = lines.len();
                lines.swap(a % n, b % n);
                chars = lines.join("\n").chars().collect();
            }
            Mutation::DupLine(a) => {
                let s: String = chars.iter().collect();
                let mut lines: Vec<&str> = s.split('\n').collect();
                let i = a % lines.len();
                lines.insert(i, lines[i]);
                chars = lines.join("\n").chars().collect();
            }
        }
    }
    chars.into_iter().collect()
}

/// Whatever parses also survives print → parse unchanged (printing is canonical).
fn reparse_is_stable(text: &str) -> Result<(), TestCaseError> {
    if let Ok(w) = parse("fuzz.hlw", text) {
        let printed = w.to_string();
        let again = parse("fuzz.hlw", &printed)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{printed}")))?;
        prop_assert_eq!(kinds(&w), kinds(&again));
        prop_assert_eq!(printed, again.to_string());
    }
    Ok(())
}

proptest! {
    // At least 512 cases; PROPTEST_CASES raises it for a longer fuzzing run.
    #![proptest_config(ProptestConfig {
        cases: ProptestConfig::default().cases.max(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn generated_workloads_are_valid(w in workload()) {
        if let Err(e) = check::check(&w) {
            return Err(TestCaseError::fail(format!("{e}\n{w}")));
        }
    }

    #[test]
    fn print_then_parse_round_trips(w in workload()) {
        let text = w.to_string();
        let back = parse("gen.hlw", &text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(kinds(&w), kinds(&back));
        // Printing is a fixed point.
        prop_assert_eq!(text, back.to_string());
    }

    #[test]
    fn never_panics_on_arbitrary_strings(s in any::<String>()) {
        reparse_is_stable(&s)?;
    }

    #[test]
    fn never_panics_on_printable_ascii(s in "[ -~\t\r\n]{0,300}") {
        reparse_is_stable(&s)?;
    }

    #[test]
    fn never_panics_on_token_soup(s in vocab_text()) {
        reparse_is_stable(&s)?;
    }

    #[test]
    fn never_panics_on_mutated_workloads(
        w in workload(),
        muts in proptest::collection::vec(mutation(), 1..6),
    ) {
        let text = mutate(&w.to_string(), &muts);
        reparse_is_stable(&text)?;
    }
}

/// `snapshot` and `expect` lines: `expect errno` checks the statement before
/// the first of them.
fn is_check(k: &StmtKind) -> bool {
    k.checks()
}

/// Whether a generated mmap is a growsdown stack (never with hugetlb= or
/// shared, which the checker refuses with it).
fn growsdown(hugetlb: Option<HugetlbSize>, r: &Raw) -> bool {
    hugetlb.is_none() && (r.b / 32) % 2 == 1 && r.c.is_multiple_of(3)
}
