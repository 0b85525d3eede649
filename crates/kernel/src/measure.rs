//! How the kernel backend measures a statement, and which readings it trusts.
//!
//! Every statement that acts on the machine runs inside a *window*: the
//! system-wide counters are folded (stat_refresh) and read right before it and
//! right after it, and the workload's system-wide counters are the sum of the
//! windows' changes. So the runner's own work between statements, process
//! start-up and the teardown of an agent's own memory at exit are not counted;
//! the model's machine, empty at the start, reports the same quantities as
//! absolute values. Hugetlb pool files are the exception: they are reported as
//! read (both sides start from the machine's pools). Page tables freed by RCU
//! callbacks (MMU_GATHER_RCU_TABLE_FREE) leave NR_PAGETABLE after the
//! statement returns, so windows that freed some wait for RCU first (see
//! [`TableFrees`]: the agents' own page-table bytes say at once whether a
//! munmap freed any). The runner keeps its own heap
//! (`agent::hold_runner_memory`): a page table of its own freed between
//! windows would leave the counter in the next one.
//!
//! A `read` or `write` right after another starts from the reading the
//! window before ended with, instead of a reading of its own (see
//! [`Chain`]): nothing of the workload runs between them, and the runner's
//! own faults there, the one thing that would count, break the chain.
//!
//! [`Measurement`] owns all of it: the two readers, the windows' sums, and
//! the record of what disturbed them, from which it says which counters are
//! unknown and why. Per-process counters are read fresh at each reading
//! ([`read_process`]).
//!
//! A noisy window does not make everything unknown: what the agents' own
//! /proc files count (their faults, RssAnon, VmPTE) and the per-size
//! counters of a size no other process holds stay the workload's (see
//! [`crate::attribute`]). The /proc/meminfo fields that print a vmstat item
//! (AnonPages, PageTables, AnonHugePages) follow that item. The gauges of
//! anonymous large folios (`mthp.<size>.nr_anon`, NR_ANON_THPS) are also
//! counted in the workload's own mappings at each reading
//! ([`crate::census`]): that count stands where the sums are unknown, and
//! a trusted sum it contradicts is unknown.
//!
//! What is not trusted:
//! - Another process faulting during a window (detected: the window's pgfault
//!   exceeds the faults the agents and the runner themselves took) makes the
//!   system-wide counters it could move unknown from then on, each with the
//!   window's reason (see [`taint`]): every system-wide gauge, whatever the
//!   THP modes (a process that got THPs earlier splits and frees them in
//!   any mode, without a fault), and every event counter that moved in the
//!   window. An event counter only grows, so one that did not move there
//!   counted no one's event, the other process's neither, and stays known.
//! - The LRU counters (pgdeactivate, pglazyfree, pglazyfreed) moving in a
//!   window whose statement cannot move them (see [`moves_lru`]): kswapd or
//!   another process's madvise or reclaim, which take no fault of theirs
//!   in the window; those counters are unknown from then on.
//! - A noisy window also makes unknown the event counters the window before
//!   it moved ([`Measurement::straddled`]): a fault counts its allocation
//!   while it runs and its pgfault when it ends, so another process's fault
//!   that ended in the noisy window may have allocated in the one before.
//! - Faults an agent takes in a window outside the workload's accesses (its
//!   request's faults beyond its access loop's: a text page of its own
//!   reclaimed, a page of its own under migration, both on a busy machine)
//!   are its own, not the workload's: they leave pgfault, as a fork's do, and
//!   make the anonymous-memory and page-table gauges unknown (the page may be
//!   a new one of the agent's own).
//! - THP collapse outside a `khugepaged` statement or MADV_COLLAPSE (khugepaged
//!   ran on its own) makes every counter after it unknown: the snapshot would
//!   not be stable.
//! - `fork` copies the agent's own memory and page tables, not only the
//!   regions': after a fork the anonymous-memory and page-table gauges are
//!   unknown, and the faults the agents take inside it (unsharing their own
//!   memory) are left out of pgfault.
//! - A window in which the agents faulted and some fault fell back for want
//!   of a free block of its size (not a failed charge) makes every counter
//!   after it unknown ([`starved`]): the machine's memory, full of other
//!   processes' page cache or fragmented, is not the model's.
//! - folios.* of a region are unknown when kpageflags read 0 for its pages.
//! - With vm.hugetlb_optimize_vmemmap 1, the page-table gauges are unknown
//!   from then on: the first HVO in a 128 MiB range splits the vmemmap PMD
//!   there (a kernel page table counted in NR_PAGETABLE), and which ranges
//!   an earlier run split already only the machine's history says.

use crate::agents::Agents;
use crate::attribute::{self, Touched};
use crate::call::{failed, Call};
use crate::census::Census;
use crate::error::KernelError;
use crate::modes::{Modes, ThpModes};
use crate::procfile::ProcFile;
use crate::taints::Taints;
use crate::vmstat::{is_absolute, SystemReader};
use crate::{pagemap, smaps};
use hugelab_workload::counters::{self, CounterKind, Reported, Scope};
use hugelab_workload::units::{HPAGE_PMD_ORDER, PAGE_KB, PMD_SIZE};
use hugelab_workload::{BackendError, Counters, Errno, Reading, Stmt, StmtKind};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// The measurement of a workload on the kernel: the system-wide counters
/// summed over the windows, and what makes them untrusted.
pub(crate) struct Measurement {
    /// Two readers, so that the reading before a statement is parsed only
    /// after the reading after it.
    before: SystemReader,
    after: SystemReader,
    /// The THP modes and HVO, read around each window.
    modes: Modes,
    /// Sum of the windows' changes, per system-wide counter.
    totals: Counters,
    /// Latest value of the counters reported as read.
    absolute: Counters,
    /// The reading after the latest window, to see khugepaged collapse
    /// between two windows.
    last: Option<Counters>,
    /// The system-wide counters another process may have moved, each with
    /// the reason of the first window that disturbed it (see [`taint`]).
    tainted: Taints,
    /// The totals at the latest snapshot (see [`Measurement::mark`]).
    mark_totals: Counters,
    /// THP collapse outside a `khugepaged` statement or MADV_COLLAPSE: every
    /// counter after it is unknown.
    unstable: Option<String>,
    /// The line of the first `fork`: the anonymous-memory and page-table
    /// gauges are unknown after it.
    forked: Option<u32>,
    /// Why the page-table gauges are unknown: a process's fixed address
    /// shares page-table pages with the agent's own mappings.
    shared_tables: Option<String>,
    /// The first window that ran with vm.hugetlb_optimize_vmemmap 1: the
    /// page-table gauges are unknown after it (see `distrust`).
    hvo_on: Option<u32>,
    /// mTHP sizes enabled at some point of the workload (see `close`).
    mthp_sizes_used: BTreeSet<u64>,
    /// The first process killed by a signal, and the line: its own memory
    /// and page tables went with its regions, inside that window, so the
    /// anonymous-memory and page-table gauges are unknown after it.
    killed: Option<(u32, String)>,
    /// The first process the memcg OOM killer killed (SIGKILL), and the line.
    oom_killed: Option<(u32, String)>,
    /// What the latest window left for the next one to start from (see
    /// [`Chain`]); None when the next window must read afresh.
    chain: Option<Chain>,
    /// The agents' status files, kept open.
    status: StatusFiles,
    /// What the registry says of each system-wide counter read.
    kinds: Kinds,
    /// The THP modes as the latest window read them after its statement.
    modes_after: Option<ThpModes>,
    /// The system-wide event counters the latest window moved (see
    /// [`Measurement::straddled`]).
    moved_last: Vec<String>,
    /// Whether another process disturbed the latest window (see
    /// [`Measurement::after_noisy`]).
    last_noisy: bool,
    /// Whether a `pin` ran in this workload (see
    /// [`attribute::leaves_folios`]).
    pinned: bool,
    /// The fresh range the current window's `read` or `write` touches (see
    /// [`Measurement::touch_window`]).
    touched: Option<Touched>,
    /// The agents' faults in the latest window.
    last_faults: i64,
}

/// What a window needs to know of a system-wide counter, looked up in the
/// registry once per name (a lookup parses the name; a window has a few
/// hundred counters).
#[derive(Clone, Copy)]
struct Kind {
    /// Reported as read, not as a change (see [`is_absolute`]).
    absolute: bool,
    /// A system-wide change since the start: something another process can
    /// move (hugetlb pools, set by the workload and read as they are,
    /// cannot).
    foreign: bool,
    /// Counts events: it only grows (see [`taint`]).
    event: bool,
    /// The size of a per-size mTHP counter (see [`mthp_size_kb`]).
    mthp_size_kb: Option<u64>,
}

#[derive(Default)]
struct Kinds(HashMap<String, Kind>);

impl Kinds {
    fn of(&mut self, name: &str) -> Kind {
        if let Some(k) = self.0.get(name) {
            return *k;
        }
        let c = counters::lookup(name);
        let k = Kind {
            absolute: is_absolute(name),
            foreign: c.is_some_and(|c| {
                c.family.scope == Scope::System && c.field.reported == Reported::SinceStart
            }),
            event: c.is_some_and(|c| c.field.kind == CounterKind::Event),
            mthp_size_kb: mthp_size_kb(name),
        };
        self.0.insert(name.to_string(), k);
        k
    }
}

/// The end of a window whose reading after may serve as the reading before
/// the next one: a `read` or `write` that returned normally. Between two
/// such statements nothing of the workload runs (its agents wait for their
/// next request; no handler acts outside a window), so the counters move
/// only by the runner's own faults (checked: `runner_minflt`) or by other
/// processes, which the next window's noise rules see as in any window.
/// The windows then telescope: each counter's changes still add up to the
/// change from the first reading to the last, and one reading is saved per
/// statement. The backend breaks the chain ([`Measurement::unchain`]) at
/// every other statement and at every reading of the counters.
struct Chain {
    /// The runner's own minor faults when the reading after was taken.
    runner_minflt: i64,
    /// The agents' own memory after the window.
    own: Option<Own>,
}

/// The LRU counters: the workload moves them only by the statements of
/// [`moves_lru`] (the agents drain their CPU's LRU batches after each
/// MADV_FREE and MADV_COLD, so none is counted later), or by reclaim inside
/// a memory cgroup's limit.
const LRU_COUNTERS: [&str; 3] = [
    "vmstat.pgdeactivate",
    "vmstat.pglazyfree",
    "vmstat.pglazyfreed",
];

/// Whether a statement may move the [`LRU_COUNTERS`] outside a memory
/// cgroup: MADV_FREE (lru_lazyfree), MADV_COLD and MADV_PAGEOUT
/// (lru_deactivate, reclaim of lazy-free folios), MADV_COLLAPSE and
/// khugepaged (they drain the LRU batches), `reclaim`, and what changes the
/// machine (`set`, `machine`, `fragment`, `sleep` with khugepaged's passes,
/// `split`).
fn moves_lru(kind: &StmtKind) -> bool {
    use hugelab_workload::Advice;
    match kind {
        StmtKind::Madvise(m) => matches!(
            m.advice,
            Advice::Free | Advice::Cold | Advice::Pageout | Advice::Collapse
        ),
        StmtKind::Read(_)
        | StmtKind::Write(_)
        | StmtKind::Special(_)
        | StmtKind::Mmap(_)
        | StmtKind::Munmap(_)
        | StmtKind::Mprotect(_)
        | StmtKind::Mremap(_)
        | StmtKind::Brk(_)
        | StmtKind::Pin(_)
        | StmtKind::Unpin(_)
        | StmtKind::Fork(_)
        | StmtKind::ThpDisable(_)
        | StmtKind::Exit(_)
        | StmtKind::Exec(_) => false,
        _ => true,
    }
}

/// The [`LRU_COUNTERS`] that moved in the window of `stmt`, a statement
/// that cannot move them, are another's: unknown from then on.
fn lru_moved_alone(tainted: &mut Taints, stmt: &Stmt, (before, after): (&Counters, &Counters)) {
    for name in LRU_COUNTERS {
        let (Some(b), Some(a)) = (before.get(name), after.get(name)) else {
            continue;
        };
        if a != b {
            let why = format!(
                "{} {:+} during line {}, a `{}`, which moves no folio between the LRU lists: kswapd's or another process's",
                name.trim_start_matches("vmstat."),
                a - b,
                stmt.pos.line,
                stmt.kind.keyword()
            );
            tainted.insert(name.to_string(), why);
        }
    }
}

/// pgfault and the gauges of anonymous memory and page tables: what any
/// other process's fault, or an agent's fault of its own, can move.
const ANON_GAUGES: [&str; 5] = [
    "vmstat.pgfault",
    "vmstat.nr_anon_pages",
    "vmstat.nr_page_table_pages",
    "meminfo.AnonPages",
    "meminfo.PageTables",
];

/// Marks unknown, with `why`, the system-wide counters of a window (read
/// `before` and `after` it) that another process's activity in it could
/// have moved, unless an earlier window did: every gauge another process
/// can move (its THPs split and freed, in any THP mode, take no fault),
/// and every event counter that moved in the window. An event counter only
/// grows: one that did not move in the window counted no event of anyone
/// there, so the other process added nothing to it (a gauge can be moved up
/// by one and down by the other, so it is not cleared that way).
fn taint(
    tainted: &mut Taints,
    kinds: &mut Kinds,
    why: &str,
    (before, after): (&Counters, &Counters),
    known: &BTreeSet<String>,
) {
    for (name, v) in after {
        if known.contains(name) {
            continue;
        }
        let k = kinds.of(name);
        let moved = before.get(name) != Some(v);
        // The vmemmap's pages move only with HugeTLB pools (HVO), which a
        // sysfs write by root changes, not another process's faults.
        let memmap = name.starts_with("vmstat.nr_memmap");
        let hit =
            ANON_GAUGES.contains(&name.as_str()) || (k.foreign && !memmap && (!k.event || moved));
        if hit {
            tainted.insert(name.clone(), why.to_string());
        }
    }
}

/// What a window read before its statement besides the system-wide counters.
struct Opened {
    /// The runner's own minor faults so far.
    runner_minflt: i64,
    /// The agents' own memory (see [`agents_own`]).
    own: Option<Own>,
    /// The reading before is the latest window's reading after
    /// ([`Chain`]), not a capture of its own.
    chained: bool,
}

/// What the workload's processes themselves hold, from their own /proc files.
#[derive(Clone, PartialEq, Eq)]
struct Own {
    /// The live agents, sorted.
    pids: Vec<i32>,
    /// The sum of their RssAnon, kB.
    anon_kb: i64,
    /// The sum of their VmPTE, kB.
    pte_kb: i64,
}

impl Measurement {
    pub(crate) fn new() -> Measurement {
        Measurement {
            before: SystemReader::new(),
            after: SystemReader::new(),
            modes: Modes::new(),
            totals: Counters::new(),
            absolute: Counters::new(),
            last: None,
            tainted: Taints::default(),
            mark_totals: Counters::new(),
            unstable: None,
            forked: None,
            shared_tables: None,
            hvo_on: None,
            mthp_sizes_used: BTreeSet::new(),
            killed: None,
            oom_killed: None,
            chain: None,
            status: StatusFiles::new(),
            kinds: Kinds::default(),
            modes_after: None,
            moved_last: Vec::new(),
            last_noisy: false,
            touched: None,
            last_faults: 0,
            pinned: false,
        }
    }

    /// The next window reads its counters afresh: something other than a
    /// `read` or `write` runs, or the counters are read (see [`Chain`]).
    pub(crate) fn unchain(&mut self) {
        self.chain = None;
    }

    /// One reading through each reader, so that the first window runs warm
    /// code on warm buffers.
    pub(crate) fn warm_up(&mut self) -> Result<(), KernelError> {
        for reader in [&mut self.before, &mut self.after] {
            reader.capture(true)?;
            reader.parse()?;
        }
        Ok(())
    }

    /// Runs `f` (the statement, against the agents) inside a measurement
    /// window; `f` returns the faults the agents took, to compare with the
    /// system's pgfault, and the errno of the statement's system call.
    pub(crate) fn window(
        &mut self,
        stmt: &Stmt,
        collapse_allowed: bool,
        agents: &mut Agents,
        f: impl FnOnce(&mut Agents) -> Result<Call, BackendError>,
    ) -> Result<(), BackendError> {
        let opened = self.open(stmt, agents)?;
        let call = f(agents)?;
        self.close(stmt, collapse_allowed, opened, call, agents)
    }

    /// Whether an agent forked in this workload.
    pub(crate) fn forked(&self) -> bool {
        self.forked.is_some()
    }

    /// [`Measurement::window`] for a `read` or `write` whose folios before
    /// it are known (`touched`): in a noisy window its allocations are told
    /// from its folios after it (see [`crate::attribute`]).
    pub(crate) fn touch_window(
        &mut self,
        stmt: &Stmt,
        agents: &mut Agents,
        touched: Option<Touched>,
        f: impl FnOnce(&mut Agents) -> Result<Call, BackendError>,
    ) -> Result<(), BackendError> {
        if std::env::var_os("HUGELAB_DEBUG_WINDOWS").is_some() {
            eprintln!("touch line {}: {touched:?}", stmt.pos.line);
        }
        self.touched = touched;
        let done = self.window(stmt, false, agents, f);
        self.touched = None;
        done
    }

    /// The agents' faults in the latest window.
    pub(crate) fn last_faults(&self) -> i64 {
        self.last_faults
    }

    /// Counter `name` is unknown from now on, for `why` (unless it already
    /// is, for another reason).
    pub(crate) fn taint_from_now(&mut self, name: &str, why: &str) {
        self.tainted
            .insert_with(name.to_string(), || why.to_string());
    }

    /// Every counter from now on is unknown, for `why` (the first reason
    /// given stays).
    pub(crate) fn distrust_all(&mut self, why: String) {
        self.unstable.get_or_insert(why);
    }

    /// The reading before a statement.
    fn open(&mut self, stmt: &Stmt, agents: &Agents) -> Result<Opened, BackendError> {
        if let Some(chain) = self.chain.take() {
            // The modes, HVO and the agents are as the latest window left
            // them: nothing but reads and writes ran since.
            if is_touch(&stmt.kind) && crate::agent::own_minflt() == chain.runner_minflt {
                return Ok(Opened {
                    runner_minflt: chain.runner_minflt,
                    own: chain.own,
                    chained: true,
                });
            }
        }
        if matches!(stmt.kind, StmtKind::Fork { .. }) {
            self.forked.get_or_insert(stmt.pos.line);
        }
        self.pinned |= matches!(stmt.kind, StmtKind::Pin { .. });
        if self.hvo_on.is_none() && self.modes.hvo_enabled() {
            self.hvo_on = Some(stmt.pos.line);
        }
        // The runner's own faults around the two readings (first use of a
        // code path, heap growth), counted from before the first reading to
        // after the second: an upper bound, reported with the noise.
        let runner_minflt = crate::agent::own_minflt();
        let own = agents_own(agents, &mut self.status);
        let sizes = self.mthp_sizes_enabled();
        self.mthp_sizes_used.extend(sizes);
        self.before.capture(true).map_err(|e| failed(stmt, e))?;
        Ok(Opened {
            runner_minflt,
            own,
            chained: false,
        })
    }

    /// The reading after a statement: its changes are added to the totals,
    /// and what disturbed it is recorded. A failed system call is reported
    /// as the statement's errno once its window is measured.
    fn close(
        &mut self,
        stmt: &Stmt,
        collapse_allowed: bool,
        opened: Opened,
        call: Call,
        agents: &Agents,
    ) -> Result<(), BackendError> {
        let kerr = |e: KernelError| failed(stmt, e);
        let agent_faults = call.faults;
        if self.shared_tables.is_none() {
            self.shared_tables = agents.shared_tables().cloned();
        }
        self.note_killed(stmt, &call);
        let own_after = self.capture_after(stmt, &opened, &call, agents)?;
        let runner_minflt = crate::agent::own_minflt();
        let runner_faults = runner_minflt - opened.runner_minflt;
        let before = self.reading_before(opened.chained).map_err(kerr)?;
        let after = self.after.parse().map_err(kerr)?;
        for (name, v) in &after {
            if self.kinds.of(name).absolute {
                self.absolute.insert(name.clone(), *v);
            } else {
                *self.totals.entry(name.clone()).or_default() += v - before.get(name).unwrap_or(v);
            }
        }
        self.gap_collapse(stmt, agents, &before);
        if self.unstable.is_none() && agent_faults > 0 {
            self.unstable = starved(stmt, (&before, &after));
        }
        let sys_faults = after["vmstat.pgfault"] - before["vmstat.pgfault"];
        let own_why = if matches!(stmt.kind, StmtKind::Fork { .. }) {
            // The agents' faults inside fork are their own housekeeping
            // (breaking COW on their own memory), not the workload's.
            *self.totals.entry("vmstat.pgfault".into()).or_default() -= agent_faults;
            None
        } else {
            self.leave_out_own_faults(stmt, call.own_faults)
        };
        debug_window(
            stmt,
            (&before, &after),
            (sys_faults, agent_faults, runner_faults),
        );
        // Faults beyond the agents' are another process's or the runner's
        // own between the two readings: neither is the workload's, and
        // both are in the totals, so the window is noisy either way. (The
        // runner's count is an upper bound that includes faults outside the
        // readings, so it cannot be subtracted; it is reported.)
        let faulted = (sys_faults > agent_faults).then(|| {
            format!(
                "another process faulted during line {} (pgfault +{sys_faults}; the agents' own +{agent_faults}, the runner's +{runner_faults})",
                stmt.pos.line
            )
        });
        // A chained window's modes are those the window before read: only
        // reads and writes ran since.
        let modes = match (opened.chained, self.modes_after.take()) {
            (true, Some(m)) => Some(m),
            _ => self.modes.thp(),
        };
        let window = (&before, &after);
        let sizes_why = self.foreign_sizes(stmt, modes.as_ref(), window);
        if !moves_lru(&stmt.kind) && !agents.in_memcg() {
            lru_moved_alone(&mut self.tainted, stmt, window);
        }
        let noisy =
            faulted.or_else(|| own_changes(stmt, self.forked, (&opened.own, &own_after), window));
        // Another process faulted in the window, or changed anonymous
        // memory or page tables in it.
        let others_faulted = noisy.is_some();
        let others_collapse = self.others_collapse(stmt, collapse_allowed, agents, window);
        let reasons = [
            sizes_why,
            noisy,
            own_why,
            self.after_noisy(stmt, opened.chained),
            others_collapse,
        ];
        let known = if reasons.iter().any(Option::is_some) {
            self.still_own(stmt, &call, (&opened.own, &own_after), window)
        } else {
            BTreeSet::new()
        };
        self.last_faults = call.faults;
        self.straddled(stmt, others_faulted, window, &known);
        self.last_noisy = others_faulted;
        for why in reasons.into_iter().flatten() {
            taint(&mut self.tainted, &mut self.kinds, &why, window, &known);
        }
        self.mirror_meminfo();
        self.last = Some(after);
        self.modes_after = modes;
        self.chain = (call.killed.is_none() && call.errno == Errno::OK && is_touch(&stmt.kind))
            .then_some(Chain {
                runner_minflt,
                own: own_after,
            });
        if let Some(k) = call.killed {
            // A process the kernel killed is the workload's outcome, measured
            // above like any other.
            return Err(BackendError::killed(stmt, &k.proc, k.signal, k.message));
        }
        if call.errno != Errno::OK {
            // A program sees the errno and goes on; so does the workload,
            // with what the call did before failing measured above.
            return Err(BackendError::errno(
                stmt,
                call.errno,
                format!("{} failed in the kernel", stmt.kind.keyword()),
            ));
        }
        Ok(())
    }

    /// A fault counts its events while it runs (an mTHP allocation in
    /// `alloc_anon_folio`) and its pgfault when it ends (`mm_account_fault`,
    /// after `__handle_mm_fault`): another process's fault that ended in
    /// this window (`noisy`) may have counted its allocation in the window
    /// before, which then looked clean. The event counters that window moved
    /// are unknown from then on. Then notes the ones this window moved, for
    /// the next (not pgfault, nor those whose change was the agents' own).
    /// (A fault that ends in the gap between two windows is not seen:
    /// agents start up there, so pgfault moving there says nothing.)
    fn straddled(
        &mut self,
        stmt: &Stmt,
        noisy: bool,
        (before, after): (&Counters, &Counters),
        known: &BTreeSet<String>,
    ) {
        let moved_last = std::mem::take(&mut self.moved_last);
        if noisy {
            for name in moved_last {
                self.tainted.insert_with(name, || {
                    format!(
                        "another process's fault may have begun in the window before line {} and counted its events there",
                        stmt.pos.line
                    )
                });
            }
        }
        // pgfault is counted when a fault ends, and the window's `known`
        // changes are the agents' own: neither holds another's event.
        self.moved_last = after
            .iter()
            .filter(|(name, v)| {
                let k = self.kinds.of(name);
                k.foreign
                    && k.event
                    && before.get(*name) != Some(*v)
                    && *name != "vmstat.pgfault"
                    && !known.contains(*name)
            })
            .map(|(name, _)| name.clone())
            .collect();
    }

    /// Faults of the agents' own in the window of `stmt`, outside the
    /// workload's accesses (see the module doc): out of pgfault; the page
    /// may be a new one of their own memory.
    /// A fault of its own may allocate a folio of any size enabled then
    /// and count its events, as another process's does: the reason, which
    /// makes the window noisy (pgfault stays known: the faults are left out
    /// exactly).
    fn leave_out_own_faults(&mut self, stmt: &Stmt, own_faults: i64) -> Option<String> {
        if own_faults <= 0 {
            return None;
        }
        *self.totals.entry("vmstat.pgfault".into()).or_default() -= own_faults;
        Some(format!(
            "an agent took {own_faults} fault(s) of its own outside the workload's accesses during line {} (left out of pgfault; a page of its own may have come)",
            stmt.pos.line
        ))
    }

    /// khugepaged collapsing between two windows: harmless when it was
    /// another process's memory (the agents' THPs are still the windows'
    /// sum, this one's included); else every counter from then on is
    /// unknown.
    fn gap_collapse(&mut self, stmt: &Stmt, agents: &Agents, before: &Counters) {
        let gap = self
            .last
            .as_ref()
            .is_some_and(|last| collapsed(last, before));
        if self.unstable.is_none() && gap && !self.agents_uncollapsed(agents, 0) {
            self.unstable = Some(format!(
                "khugepaged collapsed memory on its own before line {}",
                stmt.pos.line
            ));
        }
    }

    /// khugepaged collapsing on its own inside the window of a statement
    /// that does not collapse: the reason, when the collapse was another
    /// process's memory (then the counters it moved are unknown as for any
    /// noise); else every counter from then on is unknown (`unstable`).
    fn others_collapse(
        &mut self,
        stmt: &Stmt,
        collapse_allowed: bool,
        agents: &Agents,
        (before, after): (&Counters, &Counters),
    ) -> Option<String> {
        if collapse_allowed || self.unstable.is_some() || !collapsed(before, after) {
            return None;
        }
        let n = after["vmstat.thp_collapse_alloc"] - before["vmstat.thp_collapse_alloc"];
        if self.agents_uncollapsed(agents, n) {
            return Some(format!(
                "khugepaged collapsed another process's memory during line {}",
                stmt.pos.line
            ));
        }
        self.unstable = Some(format!(
            "khugepaged collapsed memory during line {}",
            stmt.pos.line
        ));
        None
    }

    /// Whether a collapse khugepaged made on its own left the agents'
    /// memory alone: their PMD-mapped THPs (smaps_rollup, read now) are
    /// exactly the workload's so far (the windows' sum of
    /// nr_anon_transparent_hugepages, less the `in_window` collapses of
    /// the current window, which the sum holds). A collapse of theirs would
    /// add one. Unknown (a fork shares THPs, the sum is not known, an
    /// agent's file cannot be read) is not alone.
    fn agents_uncollapsed(&self, agents: &Agents, in_window: i64) -> bool {
        const ITEM: &str = "vmstat.nr_anon_transparent_hugepages";
        if self.forked.is_some() || self.tainted.contains_key(ITEM) {
            return false;
        }
        let Some(workload) = self.totals.get(ITEM).map(|t| t - in_window) else {
            return false;
        };
        let mut kb = 0;
        for pid in agents.pids() {
            match smaps::rollup_anon_huge_kb(pid) {
                Ok(v) => kb += v,
                Err(_) => return false,
            }
        }
        kb == workload * (PMD_SIZE >> 10) as i64
    }

    /// A window chained to a noisy one starts from that window's reading
    /// after, whose sysfs files were read before its /proc/vmstat: another
    /// process's fault that counted an event between the two and ended
    /// before the second made the window before noisy, and its event is in
    /// this one's change. The reason, for the events this window moved.
    fn after_noisy(&self, stmt: &Stmt, chained: bool) -> Option<String> {
        (chained && self.last_noisy).then(|| {
            format!(
                "another process's fault in the reading before line {} may have counted its events in this window",
                stmt.pos.line
            )
        })
    }

    /// The /proc/meminfo fields that are a /proc/vmstat item in other units
    /// (`show_mem`/`meminfo_proc_show` print the same node counter): their
    /// sums and trust are the vmstat item's. The two files are read one
    /// after the other, and another process's change between the reads
    /// would otherwise reach one of them only.
    fn mirror_meminfo(&mut self) {
        const HPAGE_PMD_KB: i64 = (PMD_SIZE >> 10) as i64;
        const MIRRORS: [(&str, &str, i64); 3] = [
            ("meminfo.AnonPages", "vmstat.nr_anon_pages", PAGE_KB as i64),
            (
                "meminfo.PageTables",
                "vmstat.nr_page_table_pages",
                PAGE_KB as i64,
            ),
            (
                "meminfo.AnonHugePages",
                "vmstat.nr_anon_transparent_hugepages",
                HPAGE_PMD_KB,
            ),
        ];
        for (mirror, item, kb) in MIRRORS {
            let Some(v) = self.totals.get(item).copied() else {
                continue;
            };
            self.totals.insert(mirror.to_string(), v * kb);
            self.tainted.mirror(item, mirror);
        }
    }

    /// The first process killed, and the first the memcg OOM killer killed.
    fn note_killed(&mut self, stmt: &Stmt, call: &Call) {
        if let Some(k) = &call.killed {
            self.killed.get_or_insert((stmt.pos.line, k.proc.clone()));
            if k.signal == hugelab_workload::Signal::SIGKILL {
                self.oom_killed
                    .get_or_insert((stmt.pos.line, k.proc.clone()));
            }
        }
    }

    /// The reading before the statement: the latest window's reading after
    /// when `chained`, else its own.
    fn reading_before(&mut self, chained: bool) -> Result<Counters, KernelError> {
        match (chained, self.last.take()) {
            (true, Some(last)) => Ok(last),
            (_, last) => {
                self.last = last;
                self.before.parse()
            }
        }
    }

    /// The reading after a statement, once the page tables it freed have
    /// left the counters (see [`TableFrees`]); the agents' own memory after
    /// it.
    fn capture_after(
        &mut self,
        stmt: &Stmt,
        opened: &Opened,
        call: &Call,
        agents: &Agents,
    ) -> Result<Option<Own>, BackendError> {
        // The agents' own tables, read before the wait when they decide
        // it (the agents are the same as at the opening, their status
        // files open: the runner takes no fault here).
        let rule = table_frees(&stmt.kind);
        let early = (rule == TableFrees::IfTablesShrank && call.killed.is_none())
            .then(|| agents_own(agents, &mut self.status));
        let settle = call.killed.is_some()
            || match (rule, &early) {
                (TableFrees::Never, _) => false,
                (TableFrees::IfTablesShrank, Some(after)) => !tables_kept(&opened.own, after),
                _ => true,
            };
        if settle {
            rcu_settle();
        }
        self.after.capture(false).map_err(|e| failed(stmt, e))?;
        Ok(match early {
            Some(own) => own,
            None => agents_own(agents, &mut self.status),
        })
    }

    /// The counters of a noisy window whose change is still the workload's
    /// (see [`crate::attribute`]): those the agents' own counts stand for,
    /// their change in the totals replaced by the agents', and the per-size
    /// gauges of sizes no other process holds.
    fn still_own(
        &mut self,
        stmt: &Stmt,
        call: &Call,
        (own_before, own_after): (&Option<Own>, &Option<Own>),
        (before, after): (&Counters, &Counters),
    ) -> BTreeSet<String> {
        let fork = matches!(stmt.kind, StmtKind::Fork { .. });
        let plain = call.killed.is_none() && !fork;
        let same = match (own_before, own_after) {
            (Some(b), Some(a)) if plain && b.pids == a.pids => Some((b, a)),
            _ => None,
        };
        let own = attribute::OwnChange {
            // A fork's faults are all the agents' own housekeeping (left out
            // of pgfault whole): the workload's are none.
            faults: if fork {
                call.killed.is_none().then_some(0)
            } else {
                plain.then_some(call.faults - call.own_faults.max(0))
            },
            anon_kb: same
                .filter(|_| self.forked.is_none() && call.own_faults <= 0)
                .map(|(b, a)| a.anon_kb - b.anon_kb),
            pte_kb: same.map(|(b, a)| a.pte_kb - b.pte_kb),
        };
        let mut deltas: Vec<(String, i64)> = attribute::own_deltas(&own)
            .into_iter()
            .map(|(n, d)| (n.to_string(), d))
            .collect();
        let clean_call = plain && call.errno == Errno::OK && call.own_faults <= 0;
        if let Some(t) = self.touched.as_ref().filter(|_| clean_call) {
            let sizes: Vec<u64> = after
                .keys()
                .filter(|n| n.ends_with(".anon_fault_alloc"))
                .filter_map(|n| self.kinds.of(n).mthp_size_kb)
                .collect();
            let told = attribute::touched_deltas(t, &sizes);
            if std::env::var_os("HUGELAB_DEBUG_WINDOWS").is_some() {
                eprintln!("touched line {}: {t:?} -> {told:?}", stmt.pos.line);
            }
            deltas.extend(told.unwrap_or_default());
        }
        let no_faults = fork || call.faults == 0;
        if call.killed.is_none() && no_faults && attribute::leaves_folios(&stmt.kind, self.pinned) {
            deltas.extend(attribute::untouched(after.keys().cloned()));
        } else if call.killed.is_none() && !fork && call.faults == 0 {
            deltas.extend(attribute::faultless(after.keys().cloned()));
        }
        // The size rule reads the totals before any change is replaced.
        let sizes: BTreeSet<u64> = after
            .keys()
            .filter(|n| n.ends_with(".nr_anon"))
            .filter_map(|n| self.kinds.of(n).mthp_size_kb)
            .collect();
        let tainted = &self.tainted;
        let mut known: BTreeSet<String> = BTreeSet::new();
        known.extend(attribute::sizes_alone(
            sizes,
            (before, after),
            &self.totals,
            &|n| tainted.contains_key(n),
            &self.moved_last,
        ));
        for (name, delta) in attribute::agreed(deltas) {
            let name = name.as_str();
            let (Some(b), Some(a)) = (before.get(name), after.get(name)) else {
                continue;
            };
            // The totals hold the system's change (pgfault less the agents'
            // own faults, already left out): the agents' takes its place.
            let system = if name == "vmstat.pgfault" {
                // As the totals hold it: less the faults left out.
                a - b
                    - if fork {
                        call.faults
                    } else {
                        call.own_faults.max(0)
                    }
            } else {
                a - b
            };
            *self.totals.entry(name.to_string()).or_default() += delta - system;
            known.insert(name.to_string());
        }
        known
    }

    /// mTHPs below the PMD size come only from faults while their size is
    /// enabled: a size never enabled in this workload that changes in the
    /// window is another process's folio (see `close`).
    fn foreign_sizes(
        &mut self,
        stmt: &Stmt,
        modes: Option<&ThpModes>,
        (before, after): (&Counters, &Counters),
    ) -> Option<String> {
        // Freed, say, when MADV_COLLAPSE drains the LRU caches. A `set`
        // that enables a size enables it inside its own window: other
        // processes' faults may take one there.
        self.mthp_sizes_used
            .extend(modes.map(ThpModes::sizes_enabled).unwrap_or_default());
        let kinds = &mut self.kinds;
        let foreign = after.iter().find(|(name, v)| {
            kinds.of(name).mthp_size_kb.is_some_and(|kb| {
                kb < PMD_SIZE >> 10
                    && !self.mthp_sizes_used.contains(&kb)
                    && before.get(*name).is_some_and(|b| b != *v)
            })
        });
        foreign.map(|(name, _)| {
            format!(
                "another process's folios changed {name} during line {}, a size this workload never enabled",
                stmt.pos.line
            )
        })
    }
}

/// Why no reading is trusted from a window on in which the agents faulted
/// and a fault of some size fell back for want of a free block of that
/// size (Linux 6.18: `alloc_anon_folio` and `vma_alloc_anon_folio_pmd`
/// count `anon_fault_fallback` / thp_fault_fallback for a failed
/// allocation and for a failed charge, `*_fallback_charge` for the second
/// only): whoever's fault it was, the machine had no free block of that
/// size, which the model's machine has, so the agents' faults may have
/// fallen back too, and every folio after it differs. Other processes'
/// memory (page cache, most often) is what fills or fragments it: noise, a
/// re-run may find free blocks.
fn starved(stmt: &Stmt, (before, after): (&Counters, &Counters)) -> Option<String> {
    let delta = |name: &str| {
        after
            .get(name)
            .zip(before.get(name))
            .map_or(0, |(a, b)| a - b)
    };
    after.keys().find_map(|name| {
        let base = name
            .strip_suffix(".anon_fault_fallback")
            .or_else(|| name.strip_suffix("thp_fault_fallback"))?;
        let charge = format!("{name}_charge");
        let n = delta(name) - delta(&charge);
        let size = base
            .strip_prefix("mthp.")
            .map_or(format!("{}kB", PMD_SIZE >> 10), str::to_string);
        (n > 0).then(|| {
            format!(
                "another process's memory left no free {size} block during line {} ({name} +{n} beyond failed charges): the agents' faults may have fallen back where the model's machine has free blocks",
                stmt.pos.line
            )
        })
    })
}

/// With HUGELAB_DEBUG_WINDOWS set, one line per window on stderr: pgfault
/// against the agents' and the runner's faults, and the anonymous-memory and
/// page-table changes.
fn debug_window(
    stmt: &Stmt,
    (before, after): (&Counters, &Counters),
    (sys_faults, agent_faults, runner_faults): (i64, i64, i64),
) {
    if std::env::var_os("HUGELAB_DEBUG_WINDOWS").is_some() {
        eprintln!(
            "window line {}: pgfault +{sys_faults} agents +{agent_faults} runner +{runner_faults} nr_anon_pages {:+} nr_page_table_pages {:+}",
            stmt.pos.line,
            after["vmstat.nr_anon_pages"] - before["vmstat.nr_anon_pages"],
            after["vmstat.nr_page_table_pages"] - before["vmstat.nr_page_table_pages"]
        );
    }
}

/// Whether the system-wide anonymous memory and page tables moved in a
/// window (read `before` and `after` it) as the workload's own processes'
/// did (`own`: before and after the window); when not, another process
/// disturbed the window: the reason. `forked`: the line of the first fork
/// so far, after which the agents share pages.
fn own_changes(
    stmt: &Stmt,
    forked: Option<u32>,
    own: (&Option<Own>, &Option<Own>),
    (before, after): (&Counters, &Counters),
) -> Option<String> {
    let (Some(b), Some(a)) = own else {
        return None;
    };
    if b.pids != a.pids {
        return None;
    }
    // (system counter, what moves it, the agents' own change in
    // pages, whether the comparison holds in this window)
    let checks = [
        // Without shared pages (no fork yet), the workload's
        // processes' Anonymous memory moves exactly as NR_ANON_MAPPED
        // does; when it does not, another process mapped or freed
        // anonymous memory meanwhile.
        (
            "vmstat.nr_anon_pages",
            "another process changed anonymous memory",
            (a.anon_kb - b.anon_kb) / PAGE_KB as i64,
            forked.is_none(),
        ),
        // Page tables are per mm, shared by no one: NR_PAGETABLE
        // moves as the agents' VmPTE does (both after RCU has freed
        // what the statement unmapped). When it does not, another
        // process's page tables came or went: one that exited just
        // before, its tables freed by an RCU callback inside this
        // window, leaves no fault. (A fork's child, not an agent
        // until its window closes, is judged by the fork rule in
        // `distrust`.)
        (
            "vmstat.nr_page_table_pages",
            "another process's page tables changed",
            (a.pte_kb - b.pte_kb) / PAGE_KB as i64,
            !matches!(stmt.kind, StmtKind::Fork { .. }),
        ),
    ];
    checks
        .into_iter()
        .find_map(|(counter, what, own, applies)| {
            let system = after[counter] - before[counter];
            let field = counter.trim_start_matches("vmstat.");
            (applies && own != system).then(|| {
                format!(
                    "{what} during line {} ({field} {system:+}, the workload's own {own:+})",
                    stmt.pos.line
                )
            })
        })
}

/// The live agents' own anonymous memory and page tables; None when one
/// cannot be read. From /proc/PID/status, which counts them as
/// smaps_rollup's Anonymous does without walking the page tables (see
/// [`smaps::status_anon_pte_kb`]).
/// Each agent's status file is kept open (see [`ProcFile`]) while the agent
/// lives.
fn agents_own(agents: &Agents, files: &mut StatusFiles) -> Option<Own> {
    let pids = agents.pids();
    files.retain(|pid, _| pids.binary_search(pid).is_ok());
    let (mut anon_kb, mut pte_kb) = (0, 0);
    for pid in &pids {
        let (anon, pte) = status_anon_pte(*pid, files).ok()?;
        anon_kb += anon;
        pte_kb += pte;
    }
    Some(Own {
        pids,
        anon_kb,
        pte_kb,
    })
}

/// The open /proc/PID/status of each live agent, and a buffer for it.
type StatusFiles = HashMap<i32, (ProcFile, Vec<u8>)>;

/// RssAnon and VmPTE of agent `pid` through its kept-open status file;
/// a file that cannot be read (its process gone, the pid since taken by a
/// new agent) is opened again once.
fn status_anon_pte(pid: i32, files: &mut StatusFiles) -> Result<(i64, i64), KernelError> {
    let path = || format!("/proc/{pid}/status");
    for _ in 0..2 {
        let (file, buf) = files
            .entry(pid)
            .or_insert_with(|| (ProcFile::single(path()), Vec::with_capacity(4096)));
        if file.read_into(buf).is_ok() {
            return smaps::status_anon_pte_of(&path(), &String::from_utf8_lossy(buf));
        }
        files.remove(&pid);
    }
    smaps::status_anon_pte_kb(pid)
}

/// Whether a statement only touches memory (`read`, `write`): what may
/// chain its window to the one before (see [`Chain`]).
fn is_touch(kind: &StmtKind) -> bool {
    matches!(kind, StmtKind::Read(_) | StmtKind::Write(_))
}

/// Whether a statement may free page tables. Freed page tables leave
/// NR_PAGETABLE only in an RCU callback (MMU_GATHER_RCU_TABLE_FREE), after
/// the statement has returned: the reading after it must wait for that
/// (a wait of a grace period or more, the largest part of a window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TableFrees {
    /// It cannot free a page table.
    Never,
    /// It may free page tables or allocate them, never both: it freed
    /// some exactly when its process's page-table bytes (VmPTE,
    /// `mm->pgtables_bytes`, which every freed PTE, PMD and PUD table
    /// leaves at once through `mm_dec_nr_ptes`/`mm_dec_nr_pmds`/
    /// `mm_dec_nr_puds`) went down.
    IfTablesShrank,
    /// It may free and allocate page tables, or free another mm's.
    Always,
}

fn table_frees(kind: &StmtKind) -> TableFrees {
    use hugelab_workload::Advice;
    match kind {
        // munmap, brk and the unmapping of every region at exit and exec
        // (zap_pte_range, free_pgtables; a PMD-mapped THP split at a
        // bound takes the table deposited for it); MADV_DONTNEED may free
        // empty PTE tables (CONFIG_PT_RECLAIM); MADV_FREE only zaps and
        // splits; populating faults tables in; (NO)HUGEPAGE only flags.
        StmtKind::Munmap(_) | StmtKind::Brk(_) | StmtKind::Exit(_) | StmtKind::Exec(_) => {
            TableFrees::IfTablesShrank
        }
        StmtKind::Madvise(m) => match m.advice {
            Advice::DontNeed
            | Advice::Free
            | Advice::PopulateRead
            | Advice::PopulateWrite
            | Advice::Hugepage
            | Advice::NoHugepage => TableFrees::IfTablesShrank,
            Advice::Collapse | Advice::Pageout | Advice::Cold => TableFrees::Always,
        },
        StmtKind::Mremap(_) | StmtKind::Khugepaged | StmtKind::Reclaim | StmtKind::Split(_) => {
            TableFrees::Always
        }
        _ => TableFrees::Never,
    }
}

/// Whether no page table of the agents was freed between the readings
/// `before` and `after` of a statement that frees or allocates (see
/// [`TableFrees::IfTablesShrank`]): the same agents, their page-table bytes
/// not down. Unknown is not kept.
fn tables_kept(before: &Option<Own>, after: &Option<Own>) -> bool {
    matches!((before, after), (Some(b), Some(a)) if a.pids == b.pids && a.pte_kb >= b.pte_kb)
}

/// Waits until the RCU callbacks queued so far have run, so that page tables
/// they free have left the counters: rcu_barrier() through the rcutree
/// module's `do_rcu_barrier` parameter (it reads back 0; nothing is changed),
/// else two grace periods (membarrier(MEMBARRIER_CMD_GLOBAL) is
/// synchronize_rcu) and a moment for the callbacks, which is usually enough.
pub fn rcu_settle() {
    const DO_RCU_BARRIER: &str = "/sys/module/rcutree/parameters/do_rcu_barrier";
    if std::fs::write(DO_RCU_BARRIER, "1\n").is_ok() {
        return;
    }
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    for _ in 0..2 {
        // SAFETY: membarrier takes no pointers.
        let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
        if rc != 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    std::thread::sleep(Duration::from_millis(2));
}

/// After a process exits (or re-executes itself), until its page tables have
/// all left NR_PAGETABLE: a CPU that ran it may keep its mm as the lazy TLB
/// mm of the idle task, and the mm's PGD is freed only when that reference
/// drops, at the CPU's next switch to another mm (x86 `__mmdrop` from
/// `finish_task_switch`) — possibly inside a later window. Running the runner
/// once on every CPU it may use makes each switch now; then the RCU callbacks
/// of the freed tables are waited for.
pub fn settle_dead_mms() {
    // SAFETY: cpu_set_t is plain data; the calls take this thread's id (0)
    // and a pointer to a set of the size passed.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut allowed) == 0 {
            for cpu in 0..libc::CPU_SETSIZE as usize {
                if !libc::CPU_ISSET(cpu, &allowed) {
                    continue;
                }
                let mut one: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut one);
                if libc::sched_setaffinity(0, size, &one) == 0 {
                    libc::sched_yield();
                }
            }
            libc::sched_setaffinity(0, size, &allowed);
        }
    }
    rcu_settle();
}

/// Whether anything was collapsed between two readings.
fn collapsed(a: &Counters, b: &Counters) -> bool {
    ["vmstat.thp_collapse_alloc", "khugepaged.pages_collapsed"]
        .iter()
        .any(|k| a.get(*k) != b.get(*k))
}

/// The size of a per-size counter `mthp.<size>kB.<item>`.
fn mthp_size_kb(name: &str) -> Option<u64> {
    counters::lookup(name)
        .filter(|c| c.family.name == "mthp")?
        .size_kb
}

impl Measurement {
    /// The mTHP sizes the page-fault path may allocate now.
    fn mthp_sizes_enabled(&mut self) -> Vec<u64> {
        self.modes
            .thp()
            .map(|m| m.sizes_enabled())
            .unwrap_or_default()
    }
}

impl Measurement {
    /// The system-wide counters as of now: the windows' sums, and the
    /// counters reported as read.
    pub(crate) fn system_counters(&self) -> Counters {
        let mut c = self.totals.clone();
        c.extend(self.absolute.clone());
        c
    }

    /// A reading of the counters in `c`: those that cannot be trusted are
    /// removed, with the reason (also those already in `unknown`).
    pub(crate) fn judge(&self, mut c: Counters, mut unknown: BTreeMap<String, String>) -> Reading {
        for name in c.keys() {
            if let Some(why) = self.distrust(name) {
                unknown.entry(name.clone()).or_insert(why);
            }
        }
        c.retain(|k, _| !unknown.contains_key(k));
        let changes = self.changes(&unknown);
        Reading {
            counters: c,
            unknown,
            changes,
        }
    }

    /// A snapshot was taken: the changes of later readings are from here.
    pub(crate) fn mark(&mut self) {
        self.mark_totals = self.totals.clone();
        self.tainted.mark();
    }

    /// Of the `unknown` counters, those unknown only for a window's noise
    /// before the latest mark, none since: their change since the mark.
    fn changes(&self, unknown: &BTreeMap<String, String>) -> Counters {
        if self.unstable.is_some() {
            return Counters::new();
        }
        unknown
            .iter()
            .filter(|(name, why)| {
                self.tainted.get(name) == Some(why)
                    && self.tainted.clean_since_mark(name)
                    && self.by_construction(name).is_none()
            })
            .filter_map(|(name, _)| {
                let now = self.totals.get(name)?;
                let then = self.mark_totals.get(name).copied().unwrap_or(0);
                Some((name.clone(), now - then))
            })
            .collect()
    }

    /// [`Measurement::judge`], with the workload's own count of its large
    /// folios (see [`crate::census`]) standing in for the gauges the
    /// windows' sums cannot give, and checking those they can: a trusted
    /// sum the count contradicts is unknown.
    pub(crate) fn judge_counted(
        &self,
        c: Counters,
        mut unknown: BTreeMap<String, String>,
        census: &Census,
    ) -> Reading {
        let mut counted = Vec::new();
        if let (None, Some(gauges)) = (&self.unstable, census.gauges()) {
            for (name, n) in gauges {
                let Some(&sum) = c.get(&name) else { continue };
                if self.distrust(&name).is_some() {
                    counted.push((name, n));
                } else if sum != n {
                    unknown.insert(
                        name,
                        format!(
                            "the windows' sum is {sum}, but the workload's mappings hold {n}: another process's folios moved it unseen (freed or split without a fault of its own)"
                        ),
                    );
                }
            }
        }
        let mut r = self.judge(c, unknown);
        for (name, n) in counted {
            r.unknown.remove(&name);
            r.changes.remove(&name);
            r.counters.insert(name, n);
        }
        r
    }

    /// Whether a `pin` ran so far.
    pub(crate) fn ever_pinned(&self) -> bool {
        self.pinned
    }

    /// Why a system-wide counter cannot be trusted now, if it cannot. A
    /// reason every run has (by construction) comes before noise: a
    /// counter unknown by construction is unknown in a quiet re-run too,
    /// so calling it noise would only have `diff` re-run for it.
    fn distrust(&self, name: &str) -> Option<String> {
        if let Some(why) = self.by_construction(name) {
            return Some(why);
        }
        if let Some(why) = &self.unstable {
            return Some(why.clone());
        }
        self.tainted.get(name).cloned()
    }

    /// Why a system-wide counter cannot be trusted now, besides noise.
    fn by_construction(&self, name: &str) -> Option<String> {
        let anon_gauge = ANON_GAUGES.contains(&name);
        if let (Some((line, proc)), "vmstat.pgfault") = (&self.oom_killed, name) {
            return Some(format!(
                "the memcg OOM killer killed {proc} at line {line}: how many pages its group's processes faulted in before the group reached memory.max depends on kernel memory the model does not charge (the slab objects of their VMAs and anon_vmas, charged a page at a time through the per-cpu object stock)"
            ));
        }
        if !anon_gauge || name == "vmstat.pgfault" {
            return None;
        }
        let page_tables = matches!(name, "vmstat.nr_page_table_pages" | "meminfo.PageTables");
        if let (Some(line), true) = (self.hvo_on, page_tables) {
            return Some(format!(
                "HVO is on from line {line}: optimizing a HugeTLB page in a 128 MiB range whose vmemmap is still PMD-mapped splits that PMD (vmemmap_split_pmd: a kernel page table, in NR_PAGETABLE), and which ranges are split is the machine's history"
            ));
        }
        if let (Some(why), true) = (&self.shared_tables, page_tables) {
            return Some(why.clone());
        }
        if let Some(line) = self.forked {
            return Some(format!(
                "fork (line {line}) copied the agent's own memory and page tables too"
            ));
        }
        let (line, proc) = self.killed.as_ref()?;
        Some(format!(
            "{proc} was killed at line {line}: the agent's own memory and page tables went with its regions"
        ))
    }
}

/// The per-process counters of the agent `name` (pid `pid`, `minflt` faults
/// of its accesses) into `c`: smaps of each region and of all of them, and
/// the region's folios; those whose folios are not known go to `unknown`.
pub(crate) fn read_process<'a>(
    name: &str,
    pid: i32,
    minflt: i64,
    regions: impl IntoIterator<Item = (&'a String, (u64, u64))>,
    c: &mut Counters,
    unknown: &mut BTreeMap<String, String>,
) -> Result<(), KernelError> {
    c.insert(format!("stat.{name}.minflt"), minflt);
    // The smaps file is read once for all the regions: a reading of it
    // walks every page table of the process.
    let all = smaps::region_smaps_vmas(pid, 0, u64::MAX)?;
    // Each VMA once, though two regions merged into one both report it.
    let mut vmas = BTreeMap::new();
    for (region, (start, len)) in regions {
        let overlapping = smaps::overlapping(&all, start, start + len);
        for v in region_counters(name, pid, region, (start, len), overlapping, c, unknown)? {
            vmas.insert(v.start, v);
        }
    }
    // The rollup of the workload's own mappings: smaps_rollup also
    // holds the agent's memory, which is not the workload's.
    let rollup: Vec<_> = vmas.into_values().collect();
    for (field, kb) in smaps::SmapsSum::of(&rollup).fields() {
        c.insert(format!("smaps.{name}.{field}"), kb as i64);
    }
    Ok(())
}

/// The per-process counters of `name`, an agent that is gone (killed), as
/// [`read_process`] would read them with nothing mapped: every smaps field
/// and folio count 0, and the faults of its accesses.
pub(crate) fn zeroed_process<'a>(
    name: &str,
    minflt: i64,
    regions: impl IntoIterator<Item = (&'a String, (u64, u64))>,
    c: &mut Counters,
) {
    c.insert(format!("stat.{name}.minflt"), minflt);
    let (s, f) = (smaps::SmapsSum::default(), pagemap::FolioScan::default());
    let mut unknown = BTreeMap::new();
    for (region, _) in regions {
        insert_region(name, region, &s, &f, c, &mut unknown);
    }
    for (field, kb) in s.fields() {
        c.insert(format!("smaps.{name}.{field}"), kb as i64);
    }
}

/// The counters of region `region` of the agent `name` (pid `pid`) at
/// `[start, start + len)` into `c` (the smaps fields of the VMAs it
/// overlaps, whole, which it also returns for the process's sum, and their
/// folios); those whose folios are not known go to `unknown`.
///
/// `folios.*` counts anonymous THPs, mTHPs and small folios: a HugeTLB
/// region's pages are HugeTLB folios (KPF_HUGE, not KPF_THP), reported by
/// smaps `*_Hugetlb` and the pool counters, so its folio counts are all 0
/// and its pages are not scanned.
pub(crate) fn read_region(
    name: &str,
    pid: i32,
    region: &str,
    start: u64,
    len: u64,
    c: &mut Counters,
    unknown: &mut BTreeMap<String, String>,
) -> Result<Vec<smaps::VmaSmaps>, KernelError> {
    let vmas = smaps::region_smaps_vmas(pid, start, start + len)?;
    region_counters(name, pid, region, (start, len), vmas, c, unknown)
}

/// [`read_region`] with the smaps of the VMAs the region overlaps, `vmas`,
/// already read.
fn region_counters(
    name: &str,
    pid: i32,
    region: &str,
    (start, len): (u64, u64),
    vmas: Vec<smaps::VmaSmaps>,
    c: &mut Counters,
    unknown: &mut BTreeMap<String, String>,
) -> Result<Vec<smaps::VmaSmaps>, KernelError> {
    let s = smaps::SmapsSum::of(&vmas);
    // The folios of the same whole VMAs.
    let lo = vmas.first().map_or(start, |v| v.start.min(start));
    let hi = vmas.last().map_or(start + len, |v| v.end.max(start + len));
    let f = if s.vmas > 0 && s.hugetlb_vmas == s.vmas {
        pagemap::FolioScan::default()
    } else {
        pagemap::scan_folios(pid, lo, hi)?
    };
    insert_region(name, region, &s, &f, c, unknown);
    Ok(vmas)
}

/// The counters of region `region` of `name` with these smaps sums and
/// folios, into `c` (and those whose folios are not known into `unknown`).
pub(crate) fn insert_region(
    name: &str,
    region: &str,
    s: &smaps::SmapsSum,
    f: &pagemap::FolioScan,
    c: &mut Counters,
    unknown: &mut BTreeMap<String, String>,
) {
    for (field, kb) in s.fields() {
        c.insert(format!("smaps.{name}.{region}.{field}"), kb as i64);
    }
    for (order, n) in f.total.iter().enumerate() {
        if order == 1 {
            continue; // anonymous memory has no order-1 folios
        }
        let key = format!("folios.{name}.{region}.{}kB", PAGE_KB << order);
        let pmd_order = order == HPAGE_PMD_ORDER as usize;
        let pmd = if pmd_order { f.pmd_mapped } else { 0 };
        c.insert(key.clone(), *n as i64);
        c.insert(format!("{key}.pte"), (*n - pmd) as i64);
        if pmd_order {
            c.insert(format!("{key}.pmd"), pmd as i64);
        }
    }
    if f.unknown_pages > 0 {
        let why = format!(
            "/proc/kpageflags read 0 for {} pages of {name}'s region {region}, so their folios are not known",
            f.unknown_pages
        );
        let prefix = format!("folios.{name}.{region}.");
        for k in c.keys().filter(|k| k.starts_with(&prefix)) {
            unknown.insert(k.clone(), why.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds of the statements of `text` (a process `p` with regions).
    fn kinds(text: &str) -> Vec<StmtKind> {
        let w = hugelab_workload::parse::parse("t.hlw", text).unwrap();
        w.stmts.into_iter().map(|s| s.kind).collect()
    }

    #[test]
    fn only_reads_and_writes_chain() {
        let k = kinds("spawn p\np mmap a 8K\np read a\np write a\np munmap a\n");
        let chained: Vec<bool> = k.iter().map(is_touch).collect();
        assert_eq!(chained, [false, false, true, true, false]);
    }

    #[test]
    fn the_wait_for_freed_tables_follows_what_a_statement_can_do() {
        use TableFrees::*;
        let k = kinds(
            "spawn p\np mmap a 4M\np write a\np madvise a POPULATE_WRITE\np madvise a DONTNEED\n\
             p madvise a COLLAPSE\np mremap a 8M\np munmap a\np exit\n",
        );
        let rules: Vec<TableFrees> = k.iter().map(table_frees).collect();
        assert_eq!(
            rules,
            [
                Never,
                Never,
                Never,
                IfTablesShrank,
                IfTablesShrank,
                Always,
                Always,
                IfTablesShrank,
                IfTablesShrank
            ]
        );
    }

    #[test]
    fn tables_are_kept_while_the_same_agents_hold_as_many() {
        let own = |pids: &[i32], pte_kb| {
            Some(Own {
                pids: pids.to_vec(),
                anon_kb: 0,
                pte_kb,
            })
        };
        assert!(tables_kept(&own(&[1, 2], 40), &own(&[1, 2], 40)));
        assert!(tables_kept(&own(&[1, 2], 40), &own(&[1, 2], 44)));
        assert!(!tables_kept(&own(&[1, 2], 40), &own(&[1, 2], 36)));
        assert!(!tables_kept(&own(&[1, 2], 40), &own(&[1], 40)));
        assert!(!tables_kept(&None, &own(&[1], 40)));
        assert!(!tables_kept(&own(&[1], 40), &None));
    }

    #[test]
    fn a_kept_open_status_file_reads_as_a_fresh_one() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(std::time::Duration::from_millis(100));
        let mut files = StatusFiles::new();
        for _ in 0..2 {
            let kept = status_anon_pte(pid, &mut files).unwrap();
            assert_eq!(kept, smaps::status_anon_pte_kb(pid).unwrap());
        }
        assert_eq!(files.len(), 1);
        child.kill().unwrap();
        child.wait().unwrap();
        // Gone: the kept file and a new one both fail.
        assert!(status_anon_pte(pid, &mut files).is_err());
        assert!(files.is_empty());
    }

    /// A reading of the counters `pairs`.
    fn reading(pairs: &[(&str, i64)]) -> Counters {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// What [`taint`] marks unknown in a window read `before` and `after`.
    fn tainted_by(before: &Counters, after: &Counters) -> Vec<String> {
        let mut tainted = Taints::default();
        taint(
            &mut tainted,
            &mut Kinds::default(),
            "why",
            (before, after),
            &BTreeSet::new(),
        );
        tainted.keys().cloned().collect()
    }

    #[test]
    fn a_fallback_for_want_of_a_block_is_noise_a_failed_charge_is_not() {
        let stmt = &hugelab_workload::parse::parse("t.hlw", "spawn a\n")
            .unwrap()
            .stmts[0];
        let before = reading(&[
            ("mthp.64kB.anon_fault_fallback", 3),
            ("mthp.64kB.anon_fault_fallback_charge", 1),
            ("vmstat.thp_fault_fallback", 5),
            ("vmstat.thp_fault_fallback_charge", 5),
        ]);
        // Charges failed: what the model's memory cgroups do too.
        let charged = reading(&[
            ("mthp.64kB.anon_fault_fallback", 4),
            ("mthp.64kB.anon_fault_fallback_charge", 2),
            ("vmstat.thp_fault_fallback", 6),
            ("vmstat.thp_fault_fallback_charge", 6),
        ]);
        assert_eq!(starved(stmt, (&before, &charged)), None);
        let no_block = reading(&[
            ("mthp.64kB.anon_fault_fallback", 3),
            ("mthp.64kB.anon_fault_fallback_charge", 1),
            ("vmstat.thp_fault_fallback", 7),
            ("vmstat.thp_fault_fallback_charge", 5),
        ]);
        let why = starved(stmt, (&before, &no_block)).unwrap();
        assert!(
            why.starts_with("another process's memory left no free 2048kB block during line 1 (vmstat.thp_fault_fallback +2"),
            "{why}"
        );
    }

    #[test]
    fn a_noisy_window_taints_only_what_another_process_could_move() {
        // thp_fault_alloc and anon_fault_alloc moved: someone's events;
        // the split counters and pgdeactivate did not: no one's, the other
        // process's neither. The gauges may be up and down at once; the
        // pool is the workload's own.
        let before = reading(&[
            ("vmstat.pgfault", 100),
            ("vmstat.nr_anon_pages", 50),
            ("vmstat.thp_fault_alloc", 7),
            ("vmstat.thp_split_page", 3),
            ("vmstat.pgdeactivate", 9),
            ("mthp.64kB.anon_fault_alloc", 1),
            ("mthp.64kB.nr_anon", 2),
            ("mthp.64kB.split", 0),
            ("hugetlb.2048kB.nr_hugepages", 4),
        ]);
        let mut after = before.clone();
        for (k, d) in [
            ("vmstat.pgfault", 3),
            ("vmstat.thp_fault_alloc", 1),
            ("mthp.64kB.anon_fault_alloc", 2),
        ] {
            *after.get_mut(k).unwrap() += d;
        }
        assert_eq!(
            tainted_by(&before, &after),
            [
                "mthp.64kB.anon_fault_alloc",
                "mthp.64kB.nr_anon",
                "vmstat.nr_anon_pages",
                "vmstat.pgfault",
                "vmstat.thp_fault_alloc",
            ]
        );
    }

    #[test]
    fn the_first_window_s_reason_stays() {
        let before = reading(&[("vmstat.pgfault", 1), ("vmstat.thp_fault_alloc", 0)]);
        let after = reading(&[("vmstat.pgfault", 2), ("vmstat.thp_fault_alloc", 1)]);
        let (mut tainted, mut kinds) = (Taints::default(), Kinds::default());
        taint(
            &mut tainted,
            &mut kinds,
            "first",
            (&before, &after),
            &BTreeSet::new(),
        );
        let later = reading(&[("vmstat.pgfault", 3), ("vmstat.thp_split_page", 1)]);
        let after_later = reading(&[("vmstat.pgfault", 4), ("vmstat.thp_split_page", 2)]);
        taint(
            &mut tainted,
            &mut kinds,
            "second",
            (&later, &after_later),
            &BTreeSet::new(),
        );
        assert_eq!(tainted["vmstat.pgfault"], "first");
        assert_eq!(tainted["vmstat.thp_fault_alloc"], "first");
        assert_eq!(tainted["vmstat.thp_split_page"], "second");
    }

    /// mTHP allocations of a window whose next window is noisy are
    /// unknown (the foreign fault may have begun in the first); those of a
    /// window followed by a clean one stay known.
    #[test]
    fn a_noisy_window_taints_the_events_the_window_before_moved() {
        let w = hugelab_workload::parse::parse(
            "t.hlw",
            "spawn p\np mmap a 64K\np write a\np write a\n",
        )
        .unwrap();
        let mut m = Measurement::new();
        let alloc = "mthp.64kB.anon_fault_alloc";
        let r = |n| reading(&[("vmstat.pgfault", n), (alloc, n)]);
        m.straddled(&w.stmts[2], false, (&r(0), &r(1)), &BTreeSet::new());
        m.straddled(&w.stmts[3], false, (&r(1), &r(1)), &BTreeSet::new());
        assert!(m.tainted.is_empty(), "{:?}", m.tainted);
        m.straddled(&w.stmts[2], false, (&r(1), &r(2)), &BTreeSet::new());
        m.straddled(&w.stmts[3], true, (&r(2), &r(2)), &BTreeSet::new());
        assert!(
            m.tainted[alloc]
                .starts_with("another process's fault may have begun in the window before line 4"),
            "{:?}",
            m.tainted
        );
    }

    #[test]
    fn lru_counters_moved_by_a_statement_that_cannot_are_another_s() {
        let w = hugelab_workload::parse::parse(
            "t.hlw",
            "spawn p\np mmap a 8K\np write a\np madvise a FREE\np madvise a DONTNEED\nreclaim\n",
        )
        .unwrap();
        let moves: Vec<bool> = w.stmts.iter().map(|s| moves_lru(&s.kind)).collect();
        assert_eq!(moves, [true, false, false, true, false, true]);
        let before = reading(&[("vmstat.pgdeactivate", 9), ("vmstat.pglazyfree", 4)]);
        let after = reading(&[("vmstat.pgdeactivate", 10), ("vmstat.pglazyfree", 4)]);
        let mut tainted = Taints::default();
        lru_moved_alone(&mut tainted, &w.stmts[2], (&before, &after));
        assert_eq!(tainted.keys().collect::<Vec<_>>(), ["vmstat.pgdeactivate"]);
        assert!(
            tainted["vmstat.pgdeactivate"].starts_with("pgdeactivate +1 during line 3, a `write`"),
            "{tainted:?}"
        );
    }

    #[test]
    fn anonymous_memory_must_move_as_the_agents_own() {
        let w =
            hugelab_workload::parse::parse("t.hlw", "spawn p\np mmap a 8K\np write a\n").unwrap();
        let stmt = |i: usize| &w.stmts[i];
        let own = |anon_kb, pte_kb| {
            Some(Own {
                pids: vec![1],
                anon_kb,
                pte_kb,
            })
        };
        let before = reading(&[
            ("vmstat.nr_anon_pages", 10),
            ("vmstat.nr_page_table_pages", 5),
        ]);
        let after = reading(&[
            ("vmstat.nr_anon_pages", 12),
            ("vmstat.nr_page_table_pages", 5),
        ]);
        let window = (&before, &after);
        // The agents' own 8 kB are the 2 pages.
        assert_eq!(
            own_changes(stmt(2), None, (&own(0, 4), &own(8, 4)), window),
            None
        );
        // 4 kB of theirs: another process's page.
        let why = own_changes(stmt(2), None, (&own(0, 4), &own(4, 4)), window).unwrap();
        assert!(
            why.contains("line 3 (nr_anon_pages +2, the workload's own +1)"),
            "{why}"
        );
        // After a fork the agents share pages: not compared.
        assert_eq!(
            own_changes(stmt(2), Some(4), (&own(0, 4), &own(4, 4)), window),
            None
        );
        // Page tables: VmPTE moved by 4 kB, the system's not at all.
        let why = own_changes(stmt(2), None, (&own(0, 4), &own(8, 8)), window).unwrap();
        assert!(
            why.starts_with("another process's page tables changed"),
            "{why}"
        );
    }

    #[test]
    fn kinds_are_the_registry_s() {
        let mut k = Kinds::default();
        for name in [
            "vmstat.pgfault",
            "mthp.64kB.anon_fault_alloc",
            "hugetlb.2048kB.nr_hugepages",
            "meminfo.AnonPages",
        ] {
            for _ in 0..2 {
                let got = k.of(name);
                assert_eq!(got.absolute, is_absolute(name), "{name}");
                assert_eq!(got.mthp_size_kb, mthp_size_kb(name), "{name}");
            }
        }
        assert_eq!(k.of("mthp.64kB.anon_fault_alloc").mthp_size_kb, Some(64));
    }
}
