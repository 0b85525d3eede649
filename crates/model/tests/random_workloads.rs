//! Random workloads through the model with every invariant of `debug_vm`
//! checked after every statement, and once more after every process exited.
//!
//! A workload is a list of operations (spawn, mmap, read, write, fork,
//! munmap, mprotect, madvise, pin, unpin, split, exit, khugepaged, reclaim,
//! tunables) rendered to `.hlw` text against a shadow of which processes and
//! regions exist, so that nearly every statement is one the parser accepts;
//! statements the model refuses as the kernel would (a write to unmapped
//! memory, a pin of a hole) are part of the test: the model must stay
//! consistent after a failure too. proptest shrinks a failing workload to a
//! short one and prints it.
//!
//! `HUGELAB_RANDOM_WORKLOADS` sets how many workloads run (default 10,000),
//! `HUGELAB_RANDOM_SEED` the seed (default fixed, so CI is deterministic).

use hugelab_model::vmstat::{MthpStat, VmEvent};
use hugelab_model::{debug_vm, InjectedBug, Model};
use hugelab_workload::mapped::Mapped;
use hugelab_workload::{parse, Backend, BackendErrorKind, StmtKind};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
use std::cell::RefCell;

mod prediction;

/// Region sizes, in 4K pages: below, at and above the mTHP and PMD sizes.
const SIZES: [u64; 9] = [1, 4, 16, 48, 256, 512, 512, 514, 1024];
const ALIGNS: [&str; 3] = ["", " align=64K", " align=2M"];
const PROTS: [&str; 3] = ["rw", "r", "none"];
const ADVICE: [&str; 7] = [
    "HUGEPAGE",
    "NOHUGEPAGE",
    "DONTNEED",
    "COLLAPSE",
    "FREE",
    "COLD",
    "PAGEOUT",
];
const MAX_PROCS: usize = 4;
const MAX_REGIONS: usize = 3;

/// Tunables a workload may set, at the start or in the middle.
const SETTINGS: [&str; 18] = [
    "transparent_hugepage/enabled always",
    "transparent_hugepage/enabled madvise",
    "transparent_hugepage/enabled never",
    "transparent_hugepage/hugepages-16kB/enabled always",
    "transparent_hugepage/hugepages-64kB/enabled always",
    "transparent_hugepage/hugepages-64kB/enabled inherit",
    "transparent_hugepage/hugepages-64kB/enabled never",
    "transparent_hugepage/hugepages-128kB/enabled madvise",
    "transparent_hugepage/hugepages-2048kB/enabled never",
    "transparent_hugepage/hugepages-2048kB/enabled inherit",
    "transparent_hugepage/use_zero_page 0",
    "transparent_hugepage/shrink_underused 1",
    "transparent_hugepage/shrink_underused 0",
    "transparent_hugepage/khugepaged/max_ptes_none 0",
    "transparent_hugepage/khugepaged/max_ptes_none 409",
    "transparent_hugepage/khugepaged/max_ptes_shared 0",
    "transparent_hugepage/defrag always",
    "transparent_hugepage/defrag defer",
];

/// A range inside a region: `off` and `len` are reduced modulo its size.
#[derive(Clone, Copy, Debug)]
struct Span {
    region: u8,
    off: u16,
    len: u16,
}

#[derive(Clone, Debug)]
enum Op {
    Spawn,
    Mmap {
        proc: u8,
        size: u8,
        align: u8,
        prot: u8,
        hugepage: bool,
        /// 0: anonymous private, 1: a private mapping of a file (`file=`),
        /// 2: shared anonymous.
        kind: u8,
    },
    Read {
        proc: u8,
        span: Span,
    },
    Write {
        proc: u8,
        span: Span,
        zero: bool,
    },
    Fork {
        proc: u8,
    },
    Munmap {
        proc: u8,
        span: Span,
    },
    Mprotect {
        proc: u8,
        span: Span,
        prot: u8,
    },
    Madvise {
        proc: u8,
        span: Span,
        advice: u8,
    },
    Pin {
        proc: u8,
        span: Span,
    },
    Unpin {
        pin: u8,
    },
    Split {
        proc: u8,
        span: Span,
    },
    ThpDisable {
        proc: u8,
        on: bool,
    },
    Exit {
        proc: u8,
    },
    /// Taken one time in `1 + skip % 2`: rare, as exec empties a process.
    Exec {
        proc: u8,
        skip: u8,
    },
    Khugepaged,
    Reclaim,
    /// Unmovable pages through memory: share in percent, clustered, seed.
    Fragment {
        share: u8,
        clustered: bool,
        seed: u8,
    },
    Set {
        setting: u8,
    },
    /// mremap of a whole region to `SIZES[size]` pages: in place (`to` 0),
    /// `maymove` (1), or `at=` one of `MREMAP_AT` (2 and up).
    Mremap {
        proc: u8,
        region: u8,
        size: u8,
        to: u8,
    },
}

/// Where `at=` moves a region: 2M-aligned, 4K and 64K past it, at the end
/// of a PMD, and the first placed region's address (replacing it).
const MREMAP_AT: [u64; 5] = [
    0x7e00_4000_0000,
    0x7e00_4000_1000,
    0x7e00_4001_0000,
    0x7e00_4001_f000,
    0x7e00_0060_0000,
];

fn span() -> impl Strategy<Value = Span> {
    (any::<u8>(), any::<u16>(), any::<u16>()).prop_map(|(region, off, len)| Span {
        region,
        off,
        len,
    })
}

/// An mmap, mostly PMD-aligned, mostly writable, often MADV_HUGEPAGE.
///
/// With `files`, now and then a file or a shared anonymous mapping; without,
/// the kind draws nothing (`Just`), so the workloads are those of before.
fn mmap(files: bool) -> impl Strategy<Value = Op> {
    let kind = if files {
        prop::sample::select(vec![0u8, 0, 0, 0, 1, 2]).boxed()
    } else {
        Just(0u8).boxed()
    };
    (
        any::<u8>(),
        0..SIZES.len() as u8,
        prop::sample::select(vec![0u8, 1, 2, 2]),
        prop::sample::select(vec![0u8, 0, 0, 0, 1, 2]),
        any::<bool>(),
        kind,
    )
        .prop_map(|(proc, size, align, prot, hugepage, kind)| Op::Mmap {
            proc,
            size,
            align,
            prot,
            hugepage,
            kind,
        })
}

fn op(files: bool) -> impl Strategy<Value = Op> {
    let p = any::<u8>;
    prop_oneof![
        1 => Just(Op::Spawn),
        3 => mmap(files),
        2 => (p(), span()).prop_map(|(proc, span)| Op::Read { proc, span }),
        6 => (p(), span(), prop::bool::weighted(0.2)).prop_map(|(proc, span, zero)| Op::Write { proc, span, zero }),
        2 => p().prop_map(|proc| Op::Fork { proc }),
        2 => (p(), span()).prop_map(|(proc, span)| Op::Munmap { proc, span }),
        2 => (p(), span(), 0..PROTS.len() as u8).prop_map(|(proc, span, prot)| Op::Mprotect { proc, span, prot }),
        3 => (p(), span(), 0..ADVICE.len() as u8).prop_map(|(proc, span, advice)| Op::Madvise { proc, span, advice }),
        2 => (p(), span()).prop_map(|(proc, span)| Op::Pin { proc, span }),
        1 => p().prop_map(|pin| Op::Unpin { pin }),
        1 => (p(), span()).prop_map(|(proc, span)| Op::Split { proc, span }),
        1 => (p(), any::<bool>()).prop_map(|(proc, on)| Op::ThpDisable { proc, on }),
        1 => p().prop_map(|proc| Op::Exit { proc }),
        1 => (p(), any::<u8>()).prop_map(|(proc, skip)| Op::Exec { proc, skip }),
        2 => Just(Op::Khugepaged),
        2 => Just(Op::Reclaim),
        1 => (0..15u8, any::<bool>(), any::<u8>())
            .prop_map(|(share, clustered, seed)| Op::Fragment { share, clustered, seed }),
        1 => (0..SETTINGS.len() as u8).prop_map(|setting| Op::Set { setting }),
    ]
}

/// `op()`, with mremap among the operations.
fn op_or_mremap() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => op(false),
        1 => (any::<u8>(), any::<u8>(), 0..SIZES.len() as u8, 0..8u8)
            .prop_map(|(proc, region, size, to)| Op::Mremap { proc, region, size, to }),
    ]
}

/// A workload: the tunables it starts with (a THP mode first) and its
/// operations, the first of which map memory.
fn workload(files: bool) -> impl Strategy<Value = (Vec<u8>, Vec<Op>)> {
    workload_of(files, op(files))
}

/// A workload whose operations after the first mmaps are `ops`'.
fn workload_of(
    files: bool,
    ops: impl Strategy<Value = Op>,
) -> impl Strategy<Value = (Vec<u8>, Vec<Op>)> {
    (
        prop::sample::select(vec![0u8, 0, 1, 1, 2]),
        prop::collection::vec(0..SETTINGS.len() as u8, 0..5),
        prop::collection::vec(mmap(files), 1..3),
        prop::collection::vec(ops, 1..40),
    )
        .prop_map(|(mode, mut settings, mut ops, more)| {
            settings.insert(0, mode);
            ops.extend(more);
            (settings, ops)
        })
}

/// A region: name, pages, and what of it is still mapped (a region fully
/// unmapped is gone, and its name free for the next mmap).
type ShadowRegion = (String, u64, Mapped);

/// What the parser knows: live processes and their regions.
#[derive(Default)]
struct Shadow {
    procs: Vec<(String, Vec<ShadowRegion>)>,
    spawned: usize,
    pins: Vec<(String, String)>,
    text: String,
}

impl Shadow {
    fn new_name(&mut self) -> String {
        self.spawned += 1;
        format!("p{}", self.spawned - 1)
    }

    fn proc(&self, i: u8) -> Option<usize> {
        (!self.procs.is_empty()).then(|| usize::from(i) % self.procs.len())
    }

    /// `<region>+<off>K:<len>K` of process `p`, if it has regions.
    fn range(&self, p: usize, s: Span) -> Option<String> {
        let (name, off, len) = self.pages(p, s)?;
        Some(format!("{name}+{}K:{}K", off * 4, len * 4))
    }

    /// The region `s` picks in process `p`, and its first page and page count.
    fn pages(&self, p: usize, s: Span) -> Option<(String, u64, u64)> {
        let regions = &self.procs[p].1;
        if regions.is_empty() {
            return None;
        }
        let (name, pages, _) = &regions[usize::from(s.region) % regions.len()];
        let off = u64::from(s.off) % pages;
        let len = 1 + u64::from(s.len) % (pages - off);
        Some((name.clone(), off, len))
    }

    fn line(&mut self, line: String) {
        self.text.push_str(&line);
        self.text.push('\n');
    }

    /// Appends the statement for `op`, or nothing when it cannot apply.
    fn render(&mut self, op: &Op) {
        match *op {
            Op::Spawn if self.procs.len() < MAX_PROCS => {
                let name = self.new_name();
                self.line(format!("spawn {name}"));
                self.procs.push((name, Vec::new()));
            }
            Op::Mmap {
                proc,
                size,
                align,
                prot,
                hugepage,
                kind,
            } => {
                let Some(p) = self.proc(proc) else { return };
                let n = self.procs[p].1.len();
                if n == MAX_REGIONS {
                    return;
                }
                let pages = SIZES[usize::from(size)];
                // The first free name: a gone region's name is used again.
                // The name says the kind: r anonymous, f file, s shared.
                let letter = ["r", "f", "s"][usize::from(kind % 3)];
                let name = (0..)
                    .map(|i| format!("{letter}{i}"))
                    .find(|name| self.procs[p].1.iter().all(|(n, _, _)| n != name))
                    .expect("a free name");
                let prot = match prot {
                    0 => String::new(),
                    p => format!(" prot={}", PROTS[usize::from(p)]),
                };
                let owner = self.procs[p].0.clone();
                let align = ALIGNS[usize::from(align)];
                let kind = match kind % 3 {
                    1 => format!(" file=lib{}.so offset={}K", pages % 3, (pages % 5) * 64),
                    2 => " shared".to_string(),
                    _ => String::new(),
                };
                self.line(format!(
                    "{owner} mmap {name} {}K{align}{kind}{prot}",
                    pages * 4
                ));
                if hugepage {
                    self.line(format!("{owner} madvise {name} HUGEPAGE"));
                }
                self.procs[p].1.push((name, pages, Mapped::whole(pages)));
            }
            Op::Read { proc, span } => self.on_range(proc, span, "read", ""),
            Op::Write { proc, span, zero } => {
                self.on_range(proc, span, "write", if zero { " zero" } else { "" })
            }
            Op::Fork { proc } if self.procs.len() < MAX_PROCS => {
                let Some(p) = self.proc(proc) else { return };
                let child = self.new_name();
                let (parent, regions) = self.procs[p].clone();
                self.line(format!("{parent} fork {child}"));
                self.procs.push((child, regions));
            }
            Op::Munmap { proc, span } => {
                let Some(p) = self.proc(proc) else { return };
                let Some((name, off, len)) = self.pages(p, span) else {
                    return;
                };
                let owner = self.procs[p].0.clone();
                self.line(format!("{owner} munmap {name}+{}K:{}K", off * 4, len * 4));
                let regions = &mut self.procs[p].1;
                let i = regions.iter().position(|(n, _, _)| *n == name).unwrap();
                regions[i].2.unmap(off, off + len);
                if regions[i].2.is_empty() {
                    regions.remove(i);
                    let prefix = format!("{name}+");
                    self.pins
                        .retain(|(o, range)| *o != owner || !range.starts_with(&prefix));
                }
            }
            // The model refuses mprotect of shared anonymous memory, and
            // pin, split, COLD, PAGEOUT and COLLAPSE of file and shared
            // regions (their names start with f and s).
            Op::Mprotect { proc, span, prot } if !self.picks(proc, span, "s") => self.on_range(
                proc,
                span,
                "mprotect",
                &format!(" {}", PROTS[usize::from(prot)]),
            ),
            Op::Madvise { proc, span, advice }
                if matches!(advice, 0 | 1 | 2 | 4)
                    || !(self.picks(proc, span, "f") || self.picks(proc, span, "s")) =>
            {
                self.on_range(
                    proc,
                    span,
                    "madvise",
                    &format!(" {}", ADVICE[usize::from(advice)]),
                )
            }
            Op::Pin { proc, span }
                if !(self.picks(proc, span, "f") || self.picks(proc, span, "s")) =>
            {
                let Some((owner, range)) = self.owner_range(proc, span) else {
                    return;
                };
                self.line(format!("{owner} pin {range}"));
                self.pins.push((owner, range));
            }
            Op::Unpin { pin } if !self.pins.is_empty() => {
                let (owner, range) = self.pins.remove(usize::from(pin) % self.pins.len());
                if self.procs.iter().any(|(name, _)| *name == owner) {
                    self.line(format!("{owner} unpin {range}"));
                }
            }
            Op::Split { proc, span }
                if !(self.picks(proc, span, "f") || self.picks(proc, span, "s")) =>
            {
                if let Some((owner, range)) = self.owner_range(proc, span) {
                    self.line(format!("split {owner} {range}"));
                }
            }
            Op::ThpDisable { proc, on } => {
                let Some(p) = self.proc(proc) else { return };
                let owner = self.procs[p].0.clone();
                self.line(format!(
                    "{owner} thp_disable {}",
                    if on { "on" } else { "off" }
                ));
            }
            Op::Exit { proc } => {
                let Some(p) = self.proc(proc) else { return };
                let (owner, _) = self.procs.remove(p);
                self.line(format!("{owner} exit"));
            }
            Op::Exec { proc, skip } => {
                let Some(p) = self.proc(proc).filter(|_| skip % 2 == 0) else {
                    return;
                };
                let owner = self.procs[p].0.clone();
                self.procs[p].1.clear();
                self.pins.retain(|(o, _)| *o != owner);
                self.line(format!("{owner} exec"));
            }
            Op::Khugepaged => self.line("khugepaged".into()),
            Op::Reclaim => self.line("reclaim".into()),
            Op::Fragment {
                share,
                clustered,
                seed,
            } => self.line(format!(
                "fragment unmovable={share}% pattern={} seed={seed}",
                if clustered { "clustered" } else { "spread" }
            )),
            Op::Set { setting } => self.line(format!("set {}", SETTINGS[usize::from(setting)])),
            Op::Mremap {
                proc,
                region,
                size,
                to,
            } => self.mremap(proc, region, size, to),
            _ => {}
        }
    }

    /// `<proc> mremap <region> <size> [maymove|at=]`; the region names the
    /// new size afterwards (the model may refuse the call: it is left as
    /// it was there, which later statements find out).
    fn mremap(&mut self, proc: u8, region: u8, size: u8, to: u8) {
        let Some(p) = self.proc(proc) else { return };
        let (owner, regions) = &mut self.procs[p];
        if regions.is_empty() {
            return;
        }
        let i = usize::from(region) % regions.len();
        let pages = SIZES[usize::from(size)];
        let tail = match to {
            0 => String::new(),
            1 => " maymove".to_string(),
            k => format!(" at={:#x}", MREMAP_AT[usize::from(k - 2) % MREMAP_AT.len()]),
        };
        let line = format!("{owner} mremap {} {}K{tail}", regions[i].0, pages * 4);
        // As the checker: a shrink or a same-size move keeps the holes.
        let old = regions[i].1;
        if pages <= old {
            regions[i].2.unmap(pages, old);
        } else {
            regions[i].2 = Mapped::whole(pages);
        }
        regions[i].1 = pages;
        // Its pins' ranges may not be in it any more.
        let (owner, prefix) = (owner.clone(), format!("{}+", regions[i].0));
        self.pins
            .retain(|(o, range)| *o != owner || !range.starts_with(&prefix));
        self.line(line);
    }

    /// The process `proc` picks and a range of one of its regions.
    fn owner_range(&self, proc: u8, span: Span) -> Option<(String, String)> {
        let p = self.proc(proc)?;
        let range = self.range(p, span)?;
        Some((self.procs[p].0.clone(), range))
    }

    /// Whether the region `span` picks in `proc` is named with `letter`.
    fn picks(&self, proc: u8, span: Span, letter: &str) -> bool {
        self.proc(proc)
            .and_then(|p| self.pages(p, span))
            .is_some_and(|(name, _, _)| name.starts_with(letter))
    }

    fn on_range(&mut self, proc: u8, span: Span, verb: &str, tail: &str) {
        if let Some((owner, range)) = self.owner_range(proc, span) {
            self.line(format!("{owner} {verb} {range}{tail}"));
        }
    }
}

/// The `.hlw` text of a generated workload; every process exits at the end.
fn render(settings: &[u8], ops: &[Op]) -> String {
    let mut s = Shadow::default();
    s.line("machine memory=256M".into());
    for &i in settings {
        s.line(format!("set {}", SETTINGS[usize::from(i)]));
    }
    s.render(&Op::Spawn);
    for op in ops {
        s.render(op);
    }
    for (name, _) in std::mem::take(&mut s.procs) {
        s.line(format!("{name} exit"));
    }
    s.text
}

/// What the random workloads exercised, summed over all of them.
#[derive(Default)]
struct Coverage {
    statements: u64,
    refused: u64,
    /// Per event: how many workloads counted it at least once.
    workloads_with: Vec<(&'static str, u64)>,
}

impl Coverage {
    fn saw(&mut self, name: &'static str, yes: bool) {
        match self.workloads_with.iter_mut().find(|(n, _)| *n == name) {
            Some((_, n)) => *n += u64::from(yes),
            None => self.workloads_with.push((name, u64::from(yes))),
        }
    }

    fn workloads_with(&self, name: &str) -> u64 {
        self.workloads_with
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, n)| *n)
    }
}

/// Folios split so far, every size.
fn all_splits(model: &Model) -> i64 {
    (2..=9)
        .map(|order| model.machine.stat.mthp_stat(order, MthpStat::Split))
        .sum()
}

/// Runs one workload, checking the invariants after each statement.
fn run_checked(
    text: &str,
    bug: Option<InjectedBug>,
    coverage: &RefCell<Coverage>,
) -> Result<(), TestCaseError> {
    let w = parse("random.hlw", text).map_err(|e| {
        TestCaseError::fail(format!("generated workload does not parse: {e}\n{text}"))
    })?;
    let mut model = Model::default();
    model.machine.injected_bug = bug;
    let mut cov = coverage.borrow_mut();
    let mut debugfs_splits = 0;
    for stmt in &w.stmts {
        if matches!(
            stmt.kind,
            StmtKind::Snapshot { .. } | StmtKind::Expect { .. }
        ) {
            continue;
        }
        // A statement the model refuses (as the kernel would) is fine; a
        // broken invariant after it is not.
        cov.statements += 1;
        let splits_before = all_splits(&model);
        match model.execute(stmt) {
            Ok(()) => {}
            // What mremap the model refuses: a lazily-freed folio mapped
            // outside the moved range too.
            Err(e)
                if e.kind == BackendErrorKind::Unsupported
                    && matches!(stmt.kind, StmtKind::Mremap(_)) =>
            {
                cov.refused += 1
            }
            Err(e) if e.kind == BackendErrorKind::Unsupported => {
                return Err(TestCaseError::fail(format!(
                    "the generator wrote a statement the model does not support: {}",
                    e.message
                )))
            }
            Err(_) => cov.refused += 1,
        }
        if matches!(stmt.kind, StmtKind::Split { .. }) {
            debugfs_splits += all_splits(&model) - splits_before;
        }
        // Fill the reading cache, so the next statement's check sees
        // whether it marked what it changed.
        model.read().map_err(|e| TestCaseError::fail(e.message))?;
        let broken = debug_vm::check(&model);
        if !broken.is_empty() {
            return Err(TestCaseError::fail(format!(
                "after line {} `{stmt}`:\n  {}\nworkload:\n{text}",
                stmt.pos.line,
                broken.join("\n  ")
            )));
        }
    }
    let stat = &model.machine.stat;
    for event in VmEvent::ALL {
        cov.saw(event.name(), stat.event(event) > 0);
    }
    cov.saw("split statement splitting", debugfs_splits > 0);
    for order in [2, 4] {
        cov.saw(
            if order == 2 {
                "16kB split"
            } else {
                "64kB split"
            },
            stat.mthp_stat(order, MthpStat::Split) > 0,
        );
    }
    Ok(())
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(env_u64("HUGELAB_RANDOM_SEED", 0x0068_7567_656c_6162)),
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..Config::default()
    })
}

#[test]
fn invariants_hold_in_random_workloads() {
    let cases = env_u64("HUGELAB_RANDOM_WORKLOADS", 10_000) as u32;
    let started = std::time::Instant::now();
    let coverage = RefCell::new(Coverage::default());
    let result = runner(cases).run(&workload(false), |(settings, ops)| {
        run_checked(&render(&settings, &ops), None, &coverage)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let cov = coverage.into_inner();
    eprintln!(
        "{cases} random workloads, {} statements ({} refused as the kernel would), \
         invariants checked after each: {:.1} s",
        cov.statements,
        cov.refused,
        started.elapsed().as_secs_f64()
    );
    for (name, n) in &cov.workloads_with {
        eprintln!("  {name}: in {n} workloads");
    }
    // The generator must reach the paths the invariants are about.
    for path in [
        "thp_fault_alloc",
        "thp_split_pmd",
        "thp_deferred_split_page",
        "thp_split_page",
        "thp_split_page_failed",
        "thp_collapse_alloc",
        "thp_underused_split_page",
        "64kB split",
        "split statement splitting",
    ] {
        assert!(
            cov.workloads_with(path) * 200 >= u64::from(cases),
            "only {} of {cases} workloads reached {path}",
            cov.workloads_with(path)
        );
    }
}

/// The random workloads with mremap among their operations (a separate
/// test, so that the generator of the others, and the workloads they
/// shrink to, stay as they were): the invariants hold after every move.
#[test]
fn invariants_hold_in_random_workloads_with_mremap() {
    let cases = env_u64("HUGELAB_RANDOM_WORKLOADS", 10_000) as u32 / 4;
    let coverage = RefCell::new(Coverage::default());
    let result = runner(cases).run(&workload_of(false, op_or_mremap()), |(settings, ops)| {
        run_checked(&render(&settings, &ops), None, &coverage)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let cov = coverage.into_inner();
    eprintln!(
        "{cases} random workloads with mremap, {} statements ({} refused)",
        cov.statements, cov.refused
    );
}

/// Random workloads with private file mappings and shared anonymous
/// mappings among the anonymous ones (a quarter of the default count):
/// every invariant after every statement, the page cache's among them.
#[test]
fn invariants_hold_with_file_and_shared_mappings() {
    let cases = (env_u64("HUGELAB_RANDOM_WORKLOADS", 10_000) / 4).max(1) as u32;
    let coverage = RefCell::new(Coverage::default());
    let result = runner(cases).run(&workload(true), |(settings, ops)| {
        run_checked(&render(&settings, &ops), None, &coverage)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Runs the random workloads with `bug` injected: they must fail, with a
/// message `caught` accepts, and shrink to a short workload. The message.
fn assert_injected_bug_caught(bug: InjectedBug, caught: fn(&str) -> bool) -> String {
    let result = runner(10_000).run(&workload(false), |(settings, ops)| {
        run_checked(&render(&settings, &ops), Some(bug), &RefCell::default())
    });
    match result {
        Err(TestError::Fail(why, (settings, ops))) => {
            let why = why.to_string();
            assert!(caught(&why), "{bug:?} caught, but not as expected: {why}");
            let text = render(&settings, &ops);
            eprintln!("the injected bug, shrunk to:\n{text}\n{why}");
            assert!(text.lines().count() < 20, "not shrunk: {text}");
            why
        }
        Err(e) => panic!("unexpected: {e}"),
        Ok(()) => panic!("10,000 random workloads missed the injected {bug:?}"),
    }
}

/// The same test with a mapcount update left out on purpose (fork forgets
/// one page's `_mapcount` when it shares a PTE-mapped large folio) must fail,
/// naming that page, and shrink to a short workload.
#[test]
fn a_skipped_mapcount_update_is_caught() {
    let why = assert_injected_bug_caught(InjectedBug::DupRmapPtesSkipsMapcount, |why| {
        why.contains("PTEs map it")
    });
    assert!(why.contains(" fork "), "{why}");
}

/// The same test with the child's anon_vma left unlinked from its parent's
/// at fork must fail: the reverse map then misses the child's mappings of
/// the parent's large folios, which the invariant checker sees before a
/// split could leave a stale PTE behind; and the fork family, which decides
/// whose cached readings a statement invalidates, misses the child, which
/// the checker sees as readings taken as fresh but out of date.
#[test]
fn an_unlinked_anon_vma_is_caught() {
    assert_injected_bug_caught(InjectedBug::ForkSkipsAnonVmaLink, |why| {
        why.contains("an rmap walk from its anon_vma")
            || why.contains("cached readings taken as fresh but out of date")
    });
}

/// A random workload made to leave THPs under-used: max_ptes_none 409 from
/// the start, and every other `write` one byte per 128K (4 pages per THP).
fn sparse(text: &str) -> String {
    let mut out = String::new();
    let mut writes = 0;
    for line in text.lines() {
        let mut words: Vec<&str> = line.split(' ').collect();
        if words.get(1) == Some(&"write") {
            writes += 1;
            if writes % 2 == 1 {
                words.insert(3, "step=128K");
            }
        }
        out.push_str(&words.join(" "));
        out.push('\n');
        if line.starts_with("machine ") {
            out.push_str("set transparent_hugepage/khugepaged/max_ptes_none 409\n");
        }
    }
    out
}

/// The utilization report's give-back prediction comes true at the first
/// `reclaim` of random workloads, for every process whose case meets the
/// prediction's stated assumptions (see `prediction`).
#[test]
fn utilization_prediction_comes_true_in_random_workloads() {
    let cases = env_u64("HUGELAB_RANDOM_WORKLOADS", 10_000) as u32;
    let totals = RefCell::new((0u64, 0u64, 0u64));
    let result = runner(cases).run(&workload(false), |(settings, ops)| {
        let text = sparse(&render(&settings, &ops));
        let out = prediction::check_predictions(&text);
        if let Some(check) = out.mismatches().next() {
            return Err(TestCaseError::fail(format!("{check}\nworkload:\n{text}")));
        }
        // Only the processes' own checks count: those of every process
        // are made at every reclaim, even with no process to check.
        let mut t = totals.borrow_mut();
        t.0 += out.process_checks().count() as u64;
        t.1 += out.process_checks().filter(|c| c.predicted > 0).count() as u64;
        t.2 += out.skipped;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (checked, giving, skipped) = totals.into_inner();
    eprintln!(
        "{cases} random workloads: {checked} process reclaims checked \
         ({giving} giving memory back), {skipped} left out by the assumptions"
    );
    // Not vacuous: many checks, and many with something to give back.
    assert!(checked * 2 >= u64::from(cases), "only {checked} checks");
    assert!(giving * 100 >= u64::from(cases), "only {giving} give-backs");
}
