//! The model as a `Backend`: each workload statement runs as the system call
//! (or kernel event) it stands for.
//!
//! hugelab's own, not a kernel file: the entry of every statement. `execute_stmt`
//! is a table from statement to handler, and the handlers live in the module
//! of their mechanism, as `SYSCALL_DEFINE` does in `mm/mmap.c` or
//! `mm/madvise.c` (`mmap::sys_mmap`, `madvise::sys_madvise`,
//! `mprotect::sys_mprotect`, `fork::sys_fork`, `gup::sys_pin`, ...); what
//! stays here is what the backend adds around them: reads and writes (user
//! accesses, `memory::access_range`), exit and the OOM killer's victims, and
//! the readings a process or a region leaves behind when it goes.

use crate::memory::{access_range, Access};
use crate::mm_types::{Fault, HstateIdx, MmStruct, Vma, HPAGE_PMD_ORDER, PAGE_SIZE};
use crate::mmap::exit_mmap;
use crate::pgtable::MAX_PFN;
use crate::syscall::{failed, mm_id_of_ranged, resolve, BACKEND};
use crate::vmstat::VmEvent;
use crate::{counters, hugetlb, Machine, Model, Task};
use hugelab_workload::gone::{Gone, Shape};
use hugelab_workload::units::PAGE_KB;
use hugelab_workload::{
    stmt, Arch, Backend, BackendError, BackendErrorKind, Errno, HvoRuleName, KhugepagedKnob,
    MachineParam, Prot, Range, Reading, SetValue, Signal, Stmt, StmtKind, Tunable, VmSysctl,
};
use std::sync::{Arc, OnceLock};

/// The fields of every region's counters (see `Model::region_shape`).
static REGION_SHAPE: OnceLock<Arc<Shape>> = OnceLock::new();

fn set_tunable(
    m: &mut Machine,
    stmt: &Stmt,
    tunable: &Tunable,
    value: SetValue,
) -> Result<(), BackendError> {
    let thp = &mut m.thp;
    let unsupported = || crate::syscall::unsupported(stmt, format!("set {}", tunable.path()));
    match (tunable, value) {
        (Tunable::ThpEnabled, SetValue::Enabled(v)) => thp.enabled = v,
        (Tunable::ThpDefrag, SetValue::Defrag(v)) => thp.defrag = v,
        (Tunable::ThpUseZeroPage, SetValue::Num(v)) => thp.use_zero_page = v != 0,
        (Tunable::ThpShrinkUnderused, SetValue::Num(v)) => thp.shrink_underused = v != 0,
        (Tunable::ThpAnonBesideFull, SetValue::Num(0)) => thp.anon_beside_full = false,
        (Tunable::ThpAnonBesideFull, SetValue::Num(_)) => return Err(unsupported()),
        (Tunable::ThpSizeEnabled { size_kb }, SetValue::SizeEnabled(v)) => {
            let order = (size_kb / PAGE_KB).trailing_zeros();
            let anon = *size_kb == PAGE_KB << order && (2..=HPAGE_PMD_ORDER).contains(&order);
            if !anon {
                return Err(failed(
                    stmt,
                    format!(
                        "transparent_hugepage/hugepages-{size_kb}kB/enabled does not exist: anonymous THP sizes are 16kB to 2048kB"
                    ),
                ));
            }
            thp.size_enabled[order as usize] = v;
        }
        (Tunable::Khugepaged(knob), SetValue::Num(v)) => {
            let k = &mut thp.khugepaged;
            match knob {
                KhugepagedKnob::Defrag => k.defrag = v,
                KhugepagedKnob::MaxPtesNone => k.max_ptes_none = v,
                KhugepagedKnob::MaxPtesSwap => k.max_ptes_swap = v,
                KhugepagedKnob::MaxPtesShared => k.max_ptes_shared = v,
                KhugepagedKnob::PagesToScan => k.pages_to_scan = v,
                KhugepagedKnob::ScanSleepMillisecs => k.scan_sleep_millisecs = v,
                KhugepagedKnob::AllocSleepMillisecs => k.alloc_sleep_millisecs = v,
            }
            // scan_sleep_millisecs_store, alloc_sleep_millisecs_store: wake
            // khugepaged for a pass now.
            if matches!(
                knob,
                KhugepagedKnob::ScanSleepMillisecs | KhugepagedKnob::AllocSleepMillisecs
            ) {
                crate::khugepaged_thread::khugepaged_sleep_store(m);
            }
        }
        (Tunable::HugetlbNrHugepages { size_kb }, SetValue::Num(v)) => {
            let h = hstate_of(stmt, *size_kb)?;
            hugetlb::set_max_huge_pages(m, h, v);
        }
        (Tunable::Sysctl(VmSysctl::NrHugepages), SetValue::Num(v)) => {
            hugetlb::set_max_huge_pages(m, 0, v);
        }
        (Tunable::HugetlbNrOvercommit { size_kb }, SetValue::Num(v)) => {
            let h = hstate_of(stmt, *size_kb)?;
            if hugetlb::hstate_is_gigantic(h) {
                return Err(BackendError::errno(
                    stmt,
                    Errno::EINVAL,
                    "gigantic pages have no surplus pages (nr_overcommit_hugepages_store)",
                ));
            }
            m.hugetlb.hstates[h].nr_overcommit_huge_pages = v;
        }
        (Tunable::Sysctl(VmSysctl::NrOvercommitHugepages), SetValue::Num(v)) => {
            m.hugetlb.hstates[0].nr_overcommit_huge_pages = v;
        }
        (Tunable::Sysctl(VmSysctl::HugetlbOptimizeVmemmap), SetValue::Num(v)) => {
            m.vmemmap.optimize = v != 0;
        }
        _ => return Err(unsupported()),
    }
    Ok(())
}

/// The hstate of `hugepages/hugepages-<size_kb>kB/`.
fn hstate_of(stmt: &Stmt, size_kb: u64) -> Result<HstateIdx, BackendError> {
    hugetlb::size_to_hstate(size_kb << 10).ok_or_else(|| {
        failed(
            stmt,
            format!("hugepages/hugepages-{size_kb}kB does not exist: HugeTLB sizes are 2048kB and 1048576kB"),
        )
    })
}

impl Model {
    fn machine_params(&mut self, stmt: &Stmt, params: &[MachineParam]) -> Result<(), BackendError> {
        if self.started {
            return Err(failed(stmt, "machine must come before the first process"));
        }
        for p in params {
            match p {
                MachineParam::Arch(Arch::X86_64) => {}
                MachineParam::BasePage(s) if s.bytes() == PAGE_SIZE => {}
                MachineParam::Arch(Arch::Arm64) => {
                    return Err(crate::syscall::unsupported(stmt, "machine arch=arm64"))
                }
                MachineParam::BasePage(s) => {
                    return Err(crate::syscall::unsupported(
                        stmt,
                        format!("machine base_page={}", s),
                    ))
                }
                MachineParam::Hvo(rule) => {
                    self.machine.vmemmap.rule = match rule {
                        HvoRuleName::Linux618 => crate::hugetlb_vmemmap::HvoRule::Linux618,
                        HvoRuleName::Series2021 => crate::hugetlb_vmemmap::HvoRule::Series2021,
                    }
                }
                MachineParam::StructPage(n) => self.machine.vmemmap.geometry.struct_page = *n,
                MachineParam::Pkeys(on) => self.machine.pkeys = *on,
                MachineParam::Memory(s) => {
                    let bytes = s.bytes();
                    if bytes < 4 << 20 || bytes / PAGE_SIZE > MAX_PFN || bytes % PAGE_SIZE != 0 {
                        return Err(failed(
                            stmt,
                            format!("machine memory={s} is outside what the model handles: 4M to 8T, in whole pages"),
                        ));
                    }
                    let thp = self.machine.thp.clone();
                    let (check, bug) = (self.check_invariants, self.machine.injected_bug);
                    let pkeys = self.machine.pkeys;
                    let trace = self.machine.trace.take();
                    let v = &self.machine.vmemmap;
                    let (optimize, rule, geometry) = (v.optimize, v.rule, v.geometry);
                    let pools: Vec<(u64, u64)> = self
                        .machine
                        .hugetlb
                        .hstates
                        .iter()
                        .map(|h| (h.max_huge_pages, h.nr_overcommit_huge_pages))
                        .collect();
                    *self = Model::new(bytes).with_thp_settings(thp).with_pkeys(pkeys);
                    self.check_invariants = check;
                    self.machine.injected_bug = bug;
                    self.machine.trace = trace;
                    // The settings so far apply to the new machine: pools
                    // set before `machine` are allocated from its memory.
                    let v = &mut self.machine.vmemmap;
                    (v.optimize, v.rule, v.geometry) = (optimize, rule, geometry);
                    for (h, (pages, overcommit)) in pools.into_iter().enumerate() {
                        self.machine.hugetlb.hstates[h].nr_overcommit_huge_pages = overcommit;
                        hugetlb::set_max_huge_pages(&mut self.machine, h, pages);
                    }
                }
            }
        }
        Ok(())
    }

    /// A read or write (see [`Model::access`]); when a fault kills the
    /// process (SIGBUS), the task is torn down as `exit` does and what it
    /// leaves goes to `gone`, before the Killed outcome is returned.
    #[allow(clippy::too_many_arguments)]
    fn access_or_kill(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        range: &Range,
        step: u64,
        write: bool,
        zero: bool,
        gone: &mut Gone,
    ) -> Result<(), BackendError> {
        let result = self.access(stmt, proc, range, step, write, zero);
        if let Err(BackendError {
            kind: BackendErrorKind::Killed { .. },
            ..
        }) = &result
        {
            // A fatal signal kills the whole thread group: the process
            // (the kill is reported as the statement's task's).
            let leader = self.machine.group_leader(proc).unwrap_or(proc).to_string();
            self.exit_task(stmt, &leader, gone)?;
        }
        result
    }

    /// `exit`, or a process killed by a signal. A thread's exit (`do_exit`)
    /// ends the thread alone: its mm stays, no reading changes. A
    /// process's (`do_group_exit`) ends its threads first, then the
    /// process: with the last task of its mm, the mm goes too (mmput:
    /// exit_mmap), and the pins it held, and what it leaves goes to `gone`.
    fn exit_task(&mut self, stmt: &Stmt, proc: &str, gone: &mut Gone) -> Result<(), BackendError> {
        match self.machine.tasks.get(proc) {
            Some(t) if !t.leader => {
                self.machine.tasks.remove(proc);
                return Ok(());
            }
            Some(t) => {
                let mm = t.mm;
                for thread in self.machine.threads_of(mm) {
                    self.machine.tasks.remove(&thread);
                }
            }
            None => {}
        }
        use crate::reading_cache::Touches;
        // Its fork family's readings change (pages it shared are no longer
        // shared): marked while the task still links the family.
        let m = &self.machine;
        self.reading_cache
            .invalidate(Touches::Family(proc), &m.tasks, &m.anon_vmas);
        let task = self
            .machine
            .tasks
            .remove(proc)
            .ok_or_else(|| failed(stmt, format!("no process '{proc}'")))?;
        let m = &mut self.machine;
        let last = m.tasks_of(task.mm).next().is_none();
        if last {
            m.with_mm(task.mm, exit_mmap);
            m.anon_vmas.exit(task.mm);
            m.memcg.detach(task.mm);
        }
        crate::gup::release_pins(self, proc);
        if last {
            self.retire_task(proc, &task, gone);
            self.machine.mms.free(task.mm);
        } else {
            gone.add(self.counters_alone(proc, &task));
        }
        Ok(())
    }

    /// After a statement during which the memcg OOM killer ran: the
    /// statement's own process, if chosen, dies (SIGKILL when its fault
    /// returns, exit as above); the other processes it killed, torn down
    /// already (oom_kill::out_of_memory), leave their pins and readings
    /// as at exit. A kill is the statement's outcome unless it failed
    /// otherwise first (the last kill, of several).
    fn retire_oom_victims(
        &mut self,
        stmt: &Stmt,
        result: Result<(), BackendError>,
        gone: &mut Gone,
    ) -> Result<(), BackendError> {
        let killed = std::mem::take(&mut self.machine.memcg.killed);
        let mut result = result;
        if let Some(proc) = stmt.kind.process() {
            let mm = self.machine.tasks.get(proc).map(|t| t.mm);
            if mm.is_some_and(|mm| killed.contains(&mm)) {
                // Its whole thread group dies (the statement's task may be
                // a thread).
                let leader = self.machine.group_leader(proc).unwrap_or(proc).to_string();
                self.exit_task(stmt, &leader, gone)?;
                result = Err(BackendError::killed(
                    stmt,
                    proc,
                    Signal::SIGKILL,
                    format!("{proc} was killed by SIGKILL: the memcg OOM killer chose it when its memory cgroup reached memory.max"),
                ));
            }
        }
        let mut outcome = Ok(());
        for id in killed {
            let names: Vec<String> = self.machine.tasks_of(id).map(str::to_string).collect();
            for name in &names {
                let task = self.machine.tasks.remove(name).expect("just found");
                if !task.leader {
                    continue; // killed with its thread group, leaves nothing
                }
                crate::gup::release_pins(self, name);
                self.retire_task(name, &task, gone);
                outcome = Err(BackendError::killed(
                    stmt,
                    name,
                    Signal::SIGKILL,
                    format!("{name} was killed by SIGKILL: the memcg OOM killer chose it when another process of its memory cgroup reached memory.max"),
                ));
            }
            if !names.is_empty() {
                self.machine.mms.free(id);
            }
        }
        result.and(outcome)
    }

    /// A read or write of `[start, end)`, one byte every `step`, across the
    /// VMAs there. The mm is taken out of the machine's table for it: what
    /// reaches the other mms (compaction, memcg reclaim and the OOM killer,
    /// HugeTLB's unmap_ref_private) finds them there.
    fn access(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        range: &Range,
        step: u64,
        write: bool,
        zero: bool,
    ) -> Result<(), BackendError> {
        let memory_mib = self.memory_bytes >> 20;
        let m = &mut self.machine;
        let id = mm_id_of_ranged(m, stmt, proc)?;
        let faults_before = m.stat.event(VmEvent::PgFault);
        let access = |m: &mut Machine, mm: &mut MmStruct| {
            access_task(m, memory_mib, stmt, proc, mm, range, step, write, zero)
        };
        let result = m.with_mm(id, access);
        let mut faults = m.stat.event(VmEvent::PgFault) - faults_before;
        if let Err(BackendError {
            kind: BackendErrorKind::Killed { .. },
            ..
        }) = &result
        {
            // mm_account_fault counts a failed fault in PGFAULT but not in
            // the task's min_flt.
            faults -= 1;
        }
        m.account_min_flt(proc, faults);
        result
    }
}

/// The accesses of `access`, VMA by VMA, in `mm` (`proc`'s).
#[allow(clippy::too_many_arguments)]
fn access_task(
    machine: &mut Machine,
    memory_mib: u64,
    stmt: &Stmt,
    proc: &str,
    mm: &mut MmStruct,
    range: &Range,
    step: u64,
    write: bool,
    zero: bool,
) -> Result<(), BackendError> {
    let (start, end) = resolve(stmt, proc, mm, range)?;
    // A step past the range touches its first byte only: clamped to the
    // range, so that no `addr + step` below can wrap (`step=16E`).
    let step = step.min(end - start).max(1);
    let mut addr = start;
    while addr < end {
        // A fault below a VM_GROWSDOWN stack grows it (expand_stack).
        let found = mm
            .find_vma(addr)
            .or_else(|| crate::mmap::expand_stack(machine, mm, addr));
        let vma = found.ok_or_else(|| {
            failed(
                stmt,
                format!(
                    "SIGSEGV: {proc} touched unmapped memory at {}",
                    describe(mm, addr)
                ),
            )
        })?;
        let piece_end = end.min(vma.end);
        let done = if vma.hugetlb.is_some() {
            hugetlb::hugetlb_access(machine, mm, &vma, addr..piece_end, step, write)
        } else {
            access_range(
                machine,
                mm,
                &vma,
                addr,
                piece_end,
                Access {
                    step,
                    write,
                    zero,
                    stores: write,
                },
            )
        };
        done.map_err(|f| match f {
            Fault::Sigbus { addr } => BackendError::killed(
                stmt,
                proc,
                Signal::SIGBUS,
                format!(
                    "{proc} was killed by SIGBUS: its fault at {} could not be served",
                    describe(mm, addr)
                ),
            ),
            Fault::OomKilled => BackendError::killed(
                stmt,
                proc,
                Signal::SIGKILL,
                format!("{proc} was killed by SIGKILL: the memcg OOM killer chose it when its memory cgroup reached memory.max"),
            ),
            Fault::Sigsegv { addr, write } => failed(
                stmt,
                format!(
                    "SIGSEGV: {proc} {} {} which is mapped {}",
                    if write { "wrote" } else { "read" },
                    describe(mm, addr),
                    prot_name(vma.flags)
                ),
            ),
            Fault::Oom => failed(
                stmt,
                format!(
                    "out of memory: no free page for {proc}'s fault (machine memory is {} MiB)",
                    memory_mib
                ),
            ),
        })?;
        addr += (piece_end - addr).div_ceil(step) * step;
    }
    Ok(())
}

fn prot_name(flags: u32) -> &'static str {
    let bit = |b: u32| flags & b != 0;
    let (r, w, x) = (bit(Vma::VM_READ), bit(Vma::VM_WRITE), bit(Vma::VM_EXEC));
    Prot::from_bits(u64::from(r) | u64::from(w) << 1 | u64::from(x) << 2).name()
}

impl Model {
    /// The regions of `proc` (name, start, length), None when the process
    /// does not exist.
    pub fn regions(&self, proc: &str) -> Option<Vec<(String, u64, u64)>> {
        let mm = self.machine.mm_of(proc)?;
        Some(
            mm.regions
                .iter()
                .map(|(name, r)| (name.clone(), r.start, r.len))
                .collect(),
        )
    }
}

/// `region+offset` for an address, for error messages.
fn describe(mm: &MmStruct, addr: u64) -> String {
    mm.regions
        .iter()
        .find(|(_, r)| addr >= r.start && addr < r.start + r.len)
        .map_or(format!("{addr:#x}"), |(name, r)| {
            format!("{name}+{:#x}", addr - r.start)
        })
}

impl Backend for Model {
    fn name(&self) -> &str {
        BACKEND
    }

    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        self.execute_retiring(stmt, &mut Gone::default())
    }

    fn execute_retiring(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        use crate::reading_cache::{touches, Touches};
        // Limit reclaim and the OOM killer reach every process of a memcg;
        // a page cache page is shared by processes of any family (and a
        // store through a shared mapping's clean PTE dirties it, no fault).
        let touches = if self.machine.memcg.is_active() || !self.machine.page_cache.is_empty() {
            Touches::Everything
        } else {
            touches(&stmt.kind)
        };
        let faults = self.machine.stat.event(VmEvent::PgFault);
        if let Touches::FamilyIfFaulting(_) = touches {
            let result = self.execute_stmt(stmt, gone);
            // A store to a lazily-freed folio's clean mapping dirties it
            // without a fault (smaps' Private_Clean and LazyFree move).
            let redirties =
                matches!(stmt.kind, StmtKind::Write { .. }) && !self.machine.lru.is_empty();
            if self.machine.stat.event(VmEvent::PgFault) != faults || redirties {
                let cache = &mut self.reading_cache;
                let m = &self.machine;
                cache.invalidate(touches, &m.tasks, &m.anon_vmas);
            }
            result?;
        } else {
            let cache = &mut self.reading_cache;
            let m = &self.machine;
            cache.invalidate(touches, &m.tasks, &m.anon_vmas);
            self.execute_stmt(stmt, gone)?;
        }
        if self.machine.kcompactd_max_order != 0 {
            // kcompactd, woken during the statement, runs as it ends.
            crate::compaction::kcompactd_do_work(&mut self.machine);
        }
        if self.check_invariants {
            let broken = crate::debug_vm::check(self);
            if !broken.is_empty() {
                return Err(failed(
                    stmt,
                    format!(
                        "model invariant broken after this statement (a bug in the model): {}",
                        broken.join("; ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A machine-wide counter costs a lookup; a process's comes from the
    /// reading cache (`reading_cache`), computed for that process alone if a
    /// statement since made it stale.
    fn read_counter(&mut self, name: &str) -> Option<Result<Reading, BackendError>> {
        let value = counters::machine_counter(&self.machine, name).or_else(|| {
            let mut cache = std::mem::take(&mut self.reading_cache);
            let v = counters::process_counter(self, &mut cache, name);
            self.reading_cache = cache;
            v
        });
        let mut reading = Reading::default();
        if let Some(v) = value {
            reading.counters.insert(name.to_string(), v);
        }
        Some(Ok(reading))
    }

    fn read(&mut self) -> Result<Reading, BackendError> {
        let mut cache = std::mem::take(&mut self.reading_cache);
        let counters = counters::collect(self, &mut cache);
        self.reading_cache = cache;
        Ok(Reading {
            counters,
            ..Reading::default()
        })
    }
}

impl Model {
    /// The per-process and per-region counters a reading reports for
    /// process `proc` with `task`: what a region or a process leaves behind
    /// when it goes, named as the readings named it.
    fn counters_alone(&self, proc: &str, task: &Task) -> Reading {
        Reading {
            counters: counters::process_counters(&self.machine, proc, task)
                .into_iter()
                .collect(),
            ..Reading::default()
        }
    }

    /// The fields of a region's counters, the same for every region
    /// (`counters::collect` reports every smaps field and folio size of
    /// each): learnt from `collect` for region `region` of `task` the first
    /// time and, in debug builds, checked every time, with all of them 0
    /// (the region has nothing mapped). Should `collect` report none for
    /// it, what it reported instead.
    fn region_shape(
        &mut self,
        proc: &str,
        region: &str,
        task: &Task,
    ) -> Result<Arc<Shape>, Reading> {
        if let (Some(shape), false) = (REGION_SHAPE.get(), cfg!(debug_assertions)) {
            return Ok(Arc::clone(shape));
        }
        let mm = self.machine.mms.get_mut(task.mm).expect("a task's mm");
        let only = mm.regions.get(region).map(|r| (region.to_string(), *r));
        let rest = std::mem::replace(&mut mm.regions, only.into_iter().collect());
        let last = self.counters_alone(proc, task);
        self.machine
            .mms
            .get_mut(task.mm)
            .expect("a task's mm")
            .regions = rest;
        let Some(learnt) = Shape::of_region(&last, proc, region) else {
            return Err(last);
        };
        let shape = REGION_SHAPE.get_or_init(|| learnt.clone());
        debug_assert_eq!(**shape, *learnt, "the counters of a region changed shape");
        let prefix = [
            format!("smaps.{proc}.{region}."),
            format!("folios.{proc}.{region}."),
        ];
        debug_assert!(
            last.counters
                .iter()
                .all(|(n, v)| *v == 0 || !prefix.iter().any(|p| n.starts_with(p.as_str()))),
            "a region with nothing mapped has counters that are not 0"
        );
        Ok(Arc::clone(shape))
    }

    /// After a munmap in `region` of `proc`: once no VMA is left in it, the
    /// region is gone (its name is free again) and what it left, every
    /// counter 0, goes to `gone`.
    /// A growsdown stack's region counts as mapped until munmaps covered
    /// all of it (`MmStruct::stack_regions`): `[start, end)` is this one's.
    fn retire_region_if_unmapped(
        &mut self,
        proc: &str,
        region: &str,
        (start, end): (u64, u64),
        gone: &mut Gone,
    ) {
        let unmapped = self.machine.mm_of_mut(proc).is_some_and(|mm| {
            let Some(r) = mm.regions.get(region).copied() else {
                return false;
            };
            if let Some(mapped) = mm.stack_regions.get_mut(region) {
                mapped.unmap(start.saturating_sub(r.start), end.saturating_sub(r.start));
                let empty = mapped.is_empty();
                if empty {
                    mm.stack_regions.remove(region);
                }
                return empty;
            }
            mm.vmas_in(r.start, r.start + r.len).is_empty()
        });
        if !unmapped {
            return;
        }
        let task = self.machine.tasks[proc];
        let shape = self.region_shape(proc, region, &task);
        let mm = self.machine.mms.get_mut(task.mm).expect("a task's mm");
        mm.regions.remove(region);
        match shape {
            Ok(shape) => gone.add_zeroed_region(proc, region, &shape),
            Err(last) => gone.add(last),
        }
    }

    /// At exit, after exit_mmap (the mm still in the table): what the
    /// process and its regions leave.
    fn retire_task(&mut self, proc: &str, task: &Task, gone: &mut Gone) {
        self.retire_regions(proc, task, gone);
        gone.add(self.counters_alone(proc, task));
    }

    /// After exit_mmap of `task`'s mm (still in the table): its regions
    /// leave their counters, every one 0, and their names.
    fn retire_regions(&mut self, proc: &str, task: &Task, gone: &mut Gone) {
        let mm = self.machine.mms.get(task.mm).expect("a task's mm");
        let Some(first) = mm.regions.keys().next().cloned() else {
            return;
        };
        if let Ok(shape) = self.region_shape(proc, &first, task) {
            let mm = self.machine.mms.get_mut(task.mm).expect("a task's mm");
            for region in std::mem::take(&mut mm.regions).into_keys() {
                gone.add_zeroed_region(proc, &region, &shape);
            }
        }
    }

    /// `exec` (fs/exec.c): `de_thread` ends the process's other threads,
    /// the io_uring rings it holds close (their files are O_CLOEXEC), and
    /// `exec_mmap` gives it a new, empty mm, the old one torn down as at
    /// exit; its regions leave as at exit, and the process keeps its name
    /// and its minflt (`signal->min_flt` and its own survive exec).
    fn exec_task(&mut self, stmt: &Stmt, proc: &str, gone: &mut Gone) -> Result<(), BackendError> {
        use crate::reading_cache::Touches;
        let m = &self.machine;
        self.reading_cache
            .invalidate(Touches::Family(proc), &m.tasks, &m.anon_vmas);
        let task = match self.machine.tasks.get(proc) {
            Some(t) if t.leader => *t,
            Some(_) => {
                return Err(failed(
                    stmt,
                    format!("'{proc}' is a thread: exec from a thread is not supported"),
                ))
            }
            None => return Err(failed(stmt, format!("no process '{proc}'"))),
        };
        for thread in self.machine.threads_of(task.mm) {
            self.machine.tasks.remove(&thread);
        }
        crate::gup::release_pins(self, proc);
        let old = self.machine.exec_mmap(proc).expect("a live process");
        let old_task = Task { mm: old, ..task };
        self.retire_regions(proc, &old_task, gone);
        self.machine.mms.free(old);
        Ok(())
    }

    /// The statement's handler: a thin table from statement to the module
    /// of its mechanism. Handlers take the statement's fields as arguments.
    fn execute_stmt(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        let m = &mut self.machine;
        // `current`: kernel memory (page tables) is charged to its memcg.
        m.current = stmt
            .kind
            .process()
            .and_then(|p| m.tasks.get(p))
            .map(|t| t.mm);
        let result = self.dispatch(stmt, gone);
        if self.machine.memcg.killed.is_empty() {
            return result;
        }
        self.retire_oom_victims(stmt, result, gone)
    }

    fn dispatch(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        use crate::{fork, gup, huge_memory, madvise, memcontrol, mmap, mms, mprotect};
        let m = &mut self.machine;
        match &stmt.kind {
            StmtKind::Set(stmt::Set { tunable, value }) => set_tunable(m, stmt, tunable, *value),
            StmtKind::Machine(stmt::Machine { params }) => self.machine_params(stmt, params),
            StmtKind::Cgroup(stmt::Cgroup { cgroup, memory_max }) => {
                memcontrol::sys_cgroup(m, stmt, cgroup, *memory_max)
            }
            StmtKind::Spawn(stmt::Spawn { proc, cgroup }) => {
                mms::sys_spawn(m, stmt, proc, cgroup.as_deref())?;
                self.started = true;
                Ok(())
            }
            StmtKind::Mmap(s) => {
                mmap::sys_mmap(m, stmt, s)?;
                if s.populate {
                    // vm_mmap_pgoff: mm_populate of what the mmap mapped.
                    let id = crate::syscall::mm_id_of(m, stmt, &s.proc)?;
                    let r = m.mms.get(id).expect("a task's mm").regions[&s.region];
                    let end = r.start + r.len;
                    let mapped = s.mapped_at_first(PAGE_SIZE);
                    crate::gup::mm_populate(m, id, &s.proc, end - mapped, end);
                }
                Ok(())
            }
            StmtKind::Brk(s) => mmap::sys_brk(m, stmt, s),
            StmtKind::Munmap(stmt::Munmap { proc, range }) => {
                let (_, start, end) = crate::syscall::resolve_range(m, stmt, proc, range)?;
                mmap::sys_munmap(m, stmt, proc, range)?;
                self.retire_region_if_unmapped(proc, &range.region, (start, end), gone);
                Ok(())
            }
            StmtKind::Mprotect(stmt::Mprotect { proc, range, prot }) => {
                mprotect::sys_mprotect(m, stmt, proc, range, *prot)
            }
            StmtKind::Mremap(s) => crate::mremap::sys_mremap(m, stmt, s),
            StmtKind::Madvise(stmt::Madvise {
                proc,
                range,
                advice,
            }) => madvise::sys_madvise(m, stmt, proc, range, *advice),
            StmtKind::Read(stmt::Read { proc, range, step }) => {
                let step = step.map_or(PAGE_SIZE, |s| s.bytes().max(1));
                self.access_or_kill(stmt, proc, range, step, false, false, gone)
            }
            StmtKind::Write(stmt::Write {
                proc,
                range,
                step,
                zero,
            }) => {
                let step = step.map_or(PAGE_SIZE, |s| s.bytes().max(1));
                self.access_or_kill(stmt, proc, range, step, true, *zero, gone)
            }
            StmtKind::Special(s) => crate::special_mapping::sys_special_read(m, stmt, s),
            // The rings are the process's (files are shared by threads).
            StmtKind::Pin(stmt::Pin { proc, range }) => {
                let proc = &m.group_leader(proc).unwrap_or(proc).to_string();
                gup::sys_pin(self, stmt, proc, range)
            }
            StmtKind::Unpin(stmt::Unpin { proc, range }) => {
                let proc = &m.group_leader(proc).unwrap_or(proc).to_string();
                gup::sys_unpin(self, stmt, proc, range)
            }
            // From a thread too: the child copies the process's mm and
            // holds the process's rings.
            StmtKind::Fork(stmt::Fork { proc, child }) => {
                let proc = &m.group_leader(proc).unwrap_or(proc).to_string();
                fork::sys_fork(self, stmt, proc, child)
            }
            StmtKind::ThpDisable(stmt::ThpDisable { proc, on }) => {
                huge_memory::sys_prctl_thp_disable(m, stmt, proc, *on)
            }
            StmtKind::Thread(stmt::Thread { proc, thread }) => {
                m.clone_thread(proc, thread).map_err(|e| failed(stmt, e))
            }
            StmtKind::Exit(stmt::Exit { proc }) => self.exit_task(stmt, proc, gone),
            StmtKind::Exec(stmt::Exec { proc }) => self.exec_task(stmt, proc, gone),
            StmtKind::Split(stmt::Split { proc, range }) => {
                huge_memory::sys_split(m, stmt, proc, range)
            }
            StmtKind::Khugepaged => {
                crate::khugepaged_thread::khugepaged_statement(m);
                Ok(())
            }
            // Time passes, and khugepaged makes the passes due in it.
            StmtKind::Sleep(stmt::Sleep { ns }) => {
                crate::khugepaged_thread::khugepaged_sleep(m, *ns);
                Ok(())
            }
            StmtKind::Fragment(stmt::Fragment {
                permille,
                pattern,
                seed,
            }) => {
                crate::fragment::fragment(m, *permille, *pattern, *seed);
                Ok(())
            }
            StmtKind::Reclaim => {
                crate::vmscan::drop_slab(m);
                Ok(())
            }
            StmtKind::Snapshot { .. }
            | StmtKind::Expect { .. }
            | StmtKind::ExpectErrno { .. }
            | StmtKind::ExpectSignal { .. } => {
                unreachable!("run() handles snapshot and expect")
            }
        }
    }
}
