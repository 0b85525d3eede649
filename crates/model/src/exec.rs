//! The model as a `Backend`: each workload statement runs as the system call
//! (or kernel event) it stands for.

use crate::fork::dup_mmap;
use crate::gup::{pin_user_pages, unpin_user_pages, Pin, PinError};
use crate::huge_memory::split_huge_pages_pid;
use crate::memory::{access_range, Access};
use crate::mm_types::{Fault, HPAGE_PMD_ORDER, PAGE_SIZE};
use crate::mmap::{do_munmap, exit_mmap, MmStruct, Vma};
use crate::pgtable::MAX_PFN;
use crate::vmstat::VmEvent;
use crate::{counters, hugetlb, madvise, mprotect, Machine, Model, Task};
use hugelab_workload::gone::{Gone, Shape};
use hugelab_workload::{
    stmt, Advice, Arch, Backend, BackendError, BackendErrorKind, Errno, HvoRuleName,
    KhugepagedKnob, MachineParam, Prot, Range, Reading, SetValue, Signal, Stmt, StmtKind, Tunable,
    VmSysctl,
};
use std::sync::{Arc, OnceLock};

const BACKEND: &str = "model";

/// The fields of every region's counters (see `Model::region_shape`).
static REGION_SHAPE: OnceLock<Arc<Shape>> = OnceLock::new();

/// The largest io_uring fixed buffer (SZ_1G in io_uring/rsrc.c).
const IO_URING_MAX_BUFFER: u64 = 1 << 30;

fn vm_prot(prot: Prot) -> u32 {
    match prot {
        Prot::ReadWrite => Vma::VM_READ | Vma::VM_WRITE,
        Prot::Read => Vma::VM_READ,
        Prot::None => 0,
    }
}

/// The errno madvise(MADV_COLLAPSE) returns for a failed collapse.
fn collapse_errno(e: crate::khugepaged::CollapseError) -> Errno {
    use crate::khugepaged::CollapseError;
    match e {
        CollapseError::Inval => Errno::EINVAL,
        CollapseError::NoMem => Errno::ENOMEM,
        CollapseError::Again => Errno::EAGAIN,
        CollapseError::Busy => Errno::EBUSY,
    }
}

fn failed(stmt: &Stmt, msg: impl Into<String>) -> BackendError {
    BackendError::failed(stmt.pos, msg)
}

/// Resolves `<region>[+off][:len]` to `[start, end)` in `mm`.
fn resolve(
    stmt: &Stmt,
    proc: &str,
    mm: &MmStruct,
    range: &Range,
) -> Result<(u64, u64), BackendError> {
    let region = mm.regions.get(&range.region).ok_or_else(|| {
        failed(
            stmt,
            format!("unknown region '{}' of process '{proc}'", range.region),
        )
    })?;
    range
        .resolve(region.start, region.len)
        .map_err(|e| failed(stmt, e))
}

fn set_tunable(
    m: &mut Machine,
    stmt: &Stmt,
    tunable: &Tunable,
    value: SetValue,
) -> Result<(), BackendError> {
    let thp = &mut m.thp;
    let unsupported =
        || BackendError::unsupported(stmt, BACKEND, format!("set {}", tunable.path()));
    match (tunable, value) {
        (Tunable::ThpEnabled, SetValue::Enabled(v)) => thp.enabled = v,
        (Tunable::ThpDefrag, SetValue::Defrag(v)) => thp.defrag = v,
        (Tunable::ThpUseZeroPage, SetValue::Num(v)) => thp.use_zero_page = v != 0,
        (Tunable::ThpShrinkUnderused, SetValue::Num(v)) => thp.shrink_underused = v != 0,
        (Tunable::ThpAnonBesideFull, SetValue::Num(0)) => thp.anon_beside_full = false,
        (Tunable::ThpAnonBesideFull, SetValue::Num(_)) => return Err(unsupported()),
        (Tunable::ThpSizeEnabled { size_kb }, SetValue::SizeEnabled(v)) => {
            let order = (size_kb * 1024 / PAGE_SIZE).trailing_zeros();
            let anon =
                size_kb * 1024 == PAGE_SIZE << order && (2..=HPAGE_PMD_ORDER).contains(&order);
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
fn hstate_of(stmt: &Stmt, size_kb: u64) -> Result<hugetlb::HstateIdx, BackendError> {
    hugetlb::size_to_hstate(size_kb << 10).ok_or_else(|| {
        failed(
            stmt,
            format!("hugepages/hugepages-{size_kb}kB does not exist: HugeTLB sizes are 2048kB and 1048576kB"),
        )
    })
}

impl Model {
    /// fork: a child with a copy of `parent`'s address space.
    fn fork(&mut self, stmt: &Stmt, parent: &str, child: &str) -> Result<(), BackendError> {
        if self.tasks.contains_key(child) {
            return Err(failed(stmt, format!("process '{child}' already exists")));
        }
        let mut mm = MmStruct::new(self.alloc_mm_id());
        let machine = &mut self.machine;
        let src = &mut self
            .tasks
            .get_mut(parent)
            .ok_or_else(|| failed(stmt, format!("no process '{parent}'")))?
            .mm;
        // The child is in its parent's memory cgroup.
        if let Some(memcg) = machine.memcg.mm_memcg(src.mm_id) {
            machine.memcg.attach(mm.mm_id, memcg);
        }
        if dup_mmap(machine, src, &mut mm).is_err() {
            // The kernel undoes a half-made child (dup_mmap's failure path,
            // then mmput): so does the model, and then refuses to go on,
            // where the kernel would have run its OOM killer.
            exit_mmap(machine, &mut mm);
            machine.anon_vmas.exit(mm.mm_id);
            machine.memcg.detach(mm.mm_id);
            return Err(failed(stmt, "fork failed: no memory for the child"));
        }
        self.tasks
            .insert(child.to_string(), Task { mm, min_flt: 0 });
        for pin in self.pins.iter_mut() {
            if pin.holders.iter().any(|h| h == parent) {
                pin.holders.push(child.to_string());
            }
        }
        Ok(())
    }

    /// pin: an io_uring fixed buffer over the range.
    fn pin(&mut self, stmt: &Stmt, proc: &str, range: &Range) -> Result<(), BackendError> {
        let (machine, task, start, end) = self.resolve_range(stmt, proc, range)?;
        // io_buffer_validate (io_uring/rsrc.c): "arbitrary limit, but we
        // need something".
        if end - start > IO_URING_MAX_BUFFER {
            return Err(BackendError::errno(
                stmt,
                Errno::EFAULT,
                "pin: io_uring refuses a fixed buffer over 1 GiB",
            ));
        }
        let faults_before = machine.stat.event(VmEvent::PgFault);
        let pages = pin_user_pages(machine, &mut task.mm, start, end).map_err(|e| match e {
            PinError::Efault => BackendError::errno(
                stmt,
                Errno::EFAULT,
                "pin: part of the range is unmapped or not writable",
            ),
            PinError::Oom => BackendError::errno(stmt, Errno::ENOMEM, "pin"),
        })?;
        task.min_flt += machine.stat.event(VmEvent::PgFault) - faults_before;
        self.pins.push(Pin {
            start,
            len: end - start,
            pages,
            holders: vec![proc.to_string()],
        });
        Ok(())
    }

    /// unpin: unregisters the buffer `pin` registered for exactly this range.
    fn unpin(&mut self, stmt: &Stmt, proc: &str, range: &Range) -> Result<(), BackendError> {
        let task = self.task(stmt, proc)?;
        let (start, end) = resolve(stmt, proc, &task.mm, range)?;
        let found = self.pins.iter().position(|p| {
            p.start == start && p.len == end - start && p.holders.iter().any(|h| h == proc)
        });
        let Some(i) = found else {
            // As the kernel backend's agent answers: no ring holds this range.
            return Err(BackendError::errno(
                stmt,
                Errno::ENOENT,
                format!("unpin: {proc} has no pin of exactly this range"),
            ));
        };
        let pin = self.pins.remove(i);
        unpin_user_pages(&mut self.machine, &pin.pages);
        Ok(())
    }

    /// split: debugfs split_huge_pages over the range, to order 0.
    fn split(&mut self, stmt: &Stmt, proc: &str, range: &Range) -> Result<(), BackendError> {
        let (start, end) = resolve(stmt, proc, &self.task(stmt, proc)?.mm, range)?;
        let target = self.task(stmt, proc)?.mm.mm_id;
        let mut mms = crate::rmap::MmList::new(self.tasks.values_mut().map(|t| &mut t.mm));
        split_huge_pages_pid(&mut self.machine, &mut mms, target, start, end);
        Ok(())
    }

    /// At exit the process's ring references go; a ring nobody holds any
    /// more releases its pins.
    fn release_pins(&mut self, proc: &str) {
        let mut i = 0;
        while i < self.pins.len() {
            self.pins[i].holders.retain(|h| h != proc);
            if self.pins[i].holders.is_empty() {
                let pin = self.pins.remove(i);
                unpin_user_pages(&mut self.machine, &pin.pages);
            } else {
                i += 1;
            }
        }
    }

    /// The machine, process `proc` and the `[start, end)` of `range` in it.
    fn resolve_range(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        range: &Range,
    ) -> Result<(&mut Machine, &mut Task, u64, u64), BackendError> {
        let task = self
            .tasks
            .get_mut(proc)
            .ok_or_else(|| failed(stmt, format!("no process '{proc}'")))?;
        let (start, end) = resolve(stmt, proc, &task.mm, range)?;
        Ok((&mut self.machine, task, start, end))
    }

    /// Lends the other processes' mms to the machine (`Machine::lent_mms`)
    /// for a write of `range` by `proc` that may run out of never-used
    /// memory, so that compaction can migrate their pages too: a statement
    /// that cannot exhaust it cannot have a failing allocation, and pays
    /// nothing. Returns the names to give them back to.
    fn lend_mms_for(&mut self, proc: &str, range: &Range, write: bool) -> Vec<String> {
        let len = self.tasks[proc]
            .mm
            .regions
            .get(&range.region)
            .map_or(0, |r| r.len);
        let pages = len / PAGE_SIZE;
        let short = self.machine.zone.never_used_frames() < pages + pages / 256 + 2048;
        if !write || !short || self.tasks.len() < 2 {
            return Vec::new();
        }
        let mut names = Vec::new();
        for (name, task) in &mut self.tasks {
            if name != proc {
                self.machine.lent_mms.push(std::mem::take(&mut task.mm));
                names.push(name.clone());
            }
        }
        names
    }

    /// Takes back what `lend_mms_for` lent.
    fn return_mms(&mut self, names: Vec<String>) {
        let mms = std::mem::take(&mut self.machine.lent_mms);
        for (name, mm) in names.into_iter().zip(mms) {
            self.tasks.get_mut(&name).expect("a lender").mm = mm;
        }
    }

    fn task(&mut self, stmt: &Stmt, proc: &str) -> Result<&mut Task, BackendError> {
        self.tasks.get_mut(proc).ok_or_else(|| {
            failed(
                stmt,
                format!("no process '{proc}' (never spawned, or exited)"),
            )
        })
    }

    fn machine_params(&mut self, stmt: &Stmt, params: &[MachineParam]) -> Result<(), BackendError> {
        if self.started {
            return Err(failed(stmt, "machine must come before the first process"));
        }
        for p in params {
            match p {
                MachineParam::Arch(Arch::X86_64) => {}
                MachineParam::BasePage(s) if s.bytes() == PAGE_SIZE => {}
                MachineParam::Arch(Arch::Arm64) => {
                    return Err(BackendError::unsupported(
                        stmt,
                        BACKEND,
                        "machine arch=arm64",
                    ))
                }
                MachineParam::BasePage(s) => {
                    return Err(BackendError::unsupported(
                        stmt,
                        BACKEND,
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
                    *self = Model::new(bytes).with_thp_settings(thp);
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
            self.exit_task(stmt, proc, gone)?;
        }
        result
    }

    /// `exit`, or a process killed by a signal: exit_mmap, the pins it
    /// held, and what it leaves to `gone`.
    fn exit_task(&mut self, stmt: &Stmt, proc: &str, gone: &mut Gone) -> Result<(), BackendError> {
        use crate::reading_cache::Touches;
        // Its fork family's readings change (pages it shared are no longer
        // shared): marked while the task still links the family.
        self.reading_cache
            .invalidate(Touches::Family(proc), &self.tasks, &self.machine.anon_vmas);
        let mut task = self
            .tasks
            .remove(proc)
            .ok_or_else(|| failed(stmt, format!("no process '{proc}'")))?;
        exit_mmap(&mut self.machine, &mut task.mm);
        self.machine.anon_vmas.exit(task.mm.mm_id);
        self.machine.memcg.detach(task.mm.mm_id);
        self.release_pins(proc);
        self.retire_task(proc, task, gone);
        Ok(())
    }

    /// Processes the memcg OOM killer killed while another one faulted:
    /// torn down already (memcontrol::out_of_memory); their pins and what
    /// they leave go as at exit. The kill of the last of them is the
    /// statement's outcome.
    fn retire_oom_victims(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        let killed = std::mem::take(&mut self.machine.memcg.killed);
        let mut outcome = Ok(());
        for (name, task) in killed {
            self.release_pins(&name);
            self.retire_task(&name, task, gone);
            outcome = Err(BackendError::killed(
                stmt,
                &name,
                Signal::SIGKILL,
                format!("{name} was killed by SIGKILL: the memcg OOM killer chose it when another process of its memory cgroup reached memory.max"),
            ));
        }
        outcome
    }

    /// A read or write of `[start, end)`, one byte every `step`, across the VMAs there.
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
        let task = self
            .tasks
            .get(proc)
            .ok_or_else(|| failed(stmt, format!("no process '{proc}'")))?;
        // A region is HugeTLB or not as a whole (such VMAs never merge).
        let hugetlb = task
            .mm
            .regions
            .get(&range.region)
            .is_some_and(|r| hugetlb::range_has_hugetlb(&task.mm, r.start, r.start + r.len));
        let faults_before = self.machine.stat.event(VmEvent::PgFault);
        let memcg = !hugetlb && self.machine.memcg.is_active();
        // The same accesses whichever way the other processes are reachable.
        let run = |machine: &mut Machine, task: &mut Task, others: &mut [&mut MmStruct]| {
            access_task(
                machine, memory_mib, stmt, proc, task, others, range, step, write, zero,
            )
        };
        let (result, task) = if memcg {
            // The other processes are parked in the machine for the
            // access, where limit reclaim and the OOM killer can reach them.
            let (key, mut task) = self.tasks.remove_entry(proc).expect("found above");
            self.machine.memcg.others = std::mem::take(&mut self.tasks);
            self.machine.memcg.current_killed = false;
            let result = run(&mut self.machine, &mut task, &mut []);
            self.tasks = std::mem::take(&mut self.machine.memcg.others);
            self.tasks.insert(key, task);
            (result, self.tasks.get_mut(proc).expect("put back"))
        } else if hugetlb {
            // The task leaves the map for the access, so that a HugeTLB
            // fault can reach the other processes (unmap_ref_private).
            let (key, mut task) = self.tasks.remove_entry(proc).expect("found above");
            let mut others: Vec<&mut MmStruct> =
                self.tasks.values_mut().map(|t| &mut t.mm).collect();
            let result = run(&mut self.machine, &mut task, &mut others);
            self.tasks.insert(key, task);
            (result, self.tasks.get_mut(proc).expect("put back"))
        } else {
            let lent = self.lend_mms_for(proc, range, write);
            let task = self.tasks.get_mut(proc).expect("found above");
            let result = run(&mut self.machine, task, &mut []);
            self.return_mms(lent);
            (result, self.tasks.get_mut(proc).expect("still there"))
        };
        let mut faults = self.machine.stat.event(VmEvent::PgFault) - faults_before;
        if let Err(BackendError {
            kind: BackendErrorKind::Killed { .. },
            ..
        }) = &result
        {
            // mm_account_fault counts a failed fault in PGFAULT but not in
            // the task's min_flt.
            faults -= 1;
        }
        task.min_flt += faults;
        result
    }
}

/// The accesses of `access`, VMA by VMA; `others` are the other processes'
/// mms, which only a HugeTLB fault needs.
#[allow(clippy::too_many_arguments)]
fn access_task(
    machine: &mut Machine,
    memory_mib: u64,
    stmt: &Stmt,
    proc: &str,
    task: &mut Task,
    others: &mut [&mut MmStruct],
    range: &Range,
    step: u64,
    write: bool,
    zero: bool,
) -> Result<(), BackendError> {
    let (start, end) = resolve(stmt, proc, &task.mm, range)?;
    let mut addr = start;
    while addr < end {
        let vma = task.mm.find_vma(addr).ok_or_else(|| {
            failed(
                stmt,
                format!(
                    "SIGSEGV: {proc} touched unmapped memory at {}",
                    describe(&task.mm, addr)
                ),
            )
        })?;
        let piece_end = end.min(vma.end);
        let done = if vma.hugetlb.is_some() {
            hugetlb::hugetlb_access(
                machine,
                &mut task.mm,
                others,
                &vma,
                addr..piece_end,
                step,
                write,
            )
        } else {
            access_range(
                machine,
                &mut task.mm,
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
                    describe(&task.mm, addr)
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
                    describe(&task.mm, addr),
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
    match flags & Vma::PROT_MASK {
        f if f == Vma::VM_READ | Vma::VM_WRITE => "rw",
        Vma::VM_READ => "r",
        _ => "none",
    }
}

impl Model {
    /// The regions of `proc` (name, start, length), None when the process
    /// does not exist.
    pub fn regions(&self, proc: &str) -> Option<Vec<(String, u64, u64)>> {
        let mm = &self.tasks.get(proc)?.mm;
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
        // Limit reclaim and the OOM killer reach every process of a memcg.
        let touches = if self.machine.memcg.is_active() {
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
                cache.invalidate(touches, &self.tasks, &self.machine.anon_vmas);
            }
            result?;
        } else {
            let cache = &mut self.reading_cache;
            cache.invalidate(touches, &self.tasks, &self.machine.anon_vmas);
            self.execute_stmt(stmt, gone)?;
        }
        if self.machine.kcompactd_max_order != 0 {
            // kcompactd, woken during the statement, runs as it ends.
            let mut mms: Vec<&mut MmStruct> = self.tasks.values_mut().map(|t| &mut t.mm).collect();
            crate::compaction::kcompactd_do_work(&mut self.machine, &mut mms);
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
            unknown: Default::default(),
        })
    }
}

impl Model {
    /// The per-process and per-region counters a reading reports for
    /// process `proc` with `task`, and `task` back: what a region or a
    /// process leaves behind when it goes, named as the readings named it.
    fn counters_alone(&mut self, proc: &str, task: Task) -> (Reading, Task) {
        let reading = Reading {
            counters: counters::process_counters(&self.machine, proc, &task)
                .into_iter()
                .collect(),
            unknown: Default::default(),
        };
        (reading, task)
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
        mut task: Task,
    ) -> (Result<Arc<Shape>, Reading>, Task) {
        if let (Some(shape), false) = (REGION_SHAPE.get(), cfg!(debug_assertions)) {
            return (Ok(Arc::clone(shape)), task);
        }
        let only = task
            .mm
            .regions
            .get(region)
            .map(|r| (region.to_string(), *r));
        let rest = std::mem::replace(&mut task.mm.regions, only.into_iter().collect());
        let (last, mut task) = self.counters_alone(proc, task);
        task.mm.regions = rest;
        let Some(learnt) = Shape::of_region(&last, proc, region) else {
            return (Err(last), task);
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
        (Ok(Arc::clone(shape)), task)
    }

    /// After a munmap in `region` of `proc`: once no VMA is left in it, the
    /// region is gone (its name is free again) and what it left, every
    /// counter 0, goes to `gone`.
    fn retire_region_if_unmapped(&mut self, proc: &str, region: &str, gone: &mut Gone) {
        let unmapped = self.tasks.get(proc).is_some_and(|t| {
            let r = t.mm.regions.get(region);
            r.is_some_and(|r| t.mm.vmas_in(r.start, r.start + r.len).is_empty())
        });
        if !unmapped {
            return;
        }
        let task = self.tasks.remove(proc).expect("just found");
        let (shape, mut task) = self.region_shape(proc, region, task);
        task.mm.regions.remove(region);
        self.tasks.insert(proc.to_string(), task);
        match shape {
            Ok(shape) => gone.add_zeroed_region(proc, region, &shape),
            Err(last) => gone.add(last),
        }
    }

    /// At exit, after exit_mmap: what the process and its regions leave.
    fn retire_task(&mut self, proc: &str, task: Task, gone: &mut Gone) {
        let Some(first) = task.mm.regions.keys().next().cloned() else {
            gone.add(self.counters_alone(proc, task).0);
            return;
        };
        let (shape, mut task) = self.region_shape(proc, &first, task);
        if let Ok(shape) = shape {
            for region in std::mem::take(&mut task.mm.regions).into_keys() {
                gone.add_zeroed_region(proc, &region, &shape);
            }
        }
        gone.add(self.counters_alone(proc, task).0);
    }

    fn execute_stmt(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        let unsupported = |what: &str| Err(BackendError::unsupported(stmt, BACKEND, what));
        if let StmtKind::Madvise(stmt::Madvise { proc, range, .. })
        | StmtKind::Mprotect(stmt::Mprotect { proc, range, .. })
        | StmtKind::Pin(stmt::Pin { proc, range })
        | StmtKind::Split(stmt::Split { proc, range }) = &stmt.kind
        {
            let mm = &self.task(stmt, proc)?.mm;
            let (start, end) = resolve(stmt, proc, mm, range)?;
            if hugetlb::range_has_hugetlb(mm, start, end) {
                return unsupported(&format!("{} of a HugeTLB region", stmt.kind.keyword()));
            }
        }
        // `current`: kernel memory (page tables) is charged to its memcg.
        self.machine.memcg.current = stmt
            .kind
            .process()
            .and_then(|p| self.tasks.get(p))
            .and_then(|t| self.machine.memcg.mm_memcg(t.mm.mm_id));
        self.machine.memcg.current_killed = false;
        match &stmt.kind {
            StmtKind::Set(stmt::Set { tunable, value }) => {
                set_tunable(&mut self.machine, stmt, tunable, *value)?
            }
            StmtKind::Machine(stmt::Machine { params }) => self.machine_params(stmt, params)?,
            StmtKind::Cgroup(stmt::Cgroup { cgroup, memory_max }) => {
                if self.machine.memcg.by_name(cgroup).is_some() {
                    return Err(failed(stmt, format!("cgroup '{cgroup}' already exists")));
                }
                // page_counter_memparse: whole pages, rounded down.
                let max = memory_max.map(|s| s.bytes() / PAGE_SIZE);
                self.machine.memcg.create(cgroup, max);
            }
            StmtKind::Spawn(stmt::Spawn { proc, cgroup }) => {
                if self.tasks.contains_key(proc) {
                    return Err(failed(stmt, format!("process '{proc}' already exists")));
                }
                let memcg = match cgroup {
                    Some(cg) => Some(
                        self.machine
                            .memcg
                            .by_name(cg)
                            .ok_or_else(|| failed(stmt, format!("no cgroup '{cg}'")))?,
                    ),
                    None => None,
                };
                self.started = true;
                let mm = MmStruct::new(self.alloc_mm_id());
                if let Some(memcg) = memcg {
                    self.machine.memcg.attach(mm.mm_id, memcg);
                }
                self.machine.anon_vmas.alloc(mm.mm_id);
                self.tasks.insert(proc.clone(), Task { mm, min_flt: 0 });
            }
            StmtKind::Mmap(stmt::Mmap {
                proc,
                region,
                size,
                align,
                hugetlb,
                shared,
                prot,
            }) => {
                if *shared && hugetlb.is_none() {
                    return unsupported("mmap shared without hugetlb=");
                }
                let task = self.task(stmt, proc)?;
                if task.mm.regions.contains_key(region) {
                    return Err(failed(
                        stmt,
                        format!("process '{proc}' already has a region '{region}'"),
                    ));
                }
                if let Some(hsize) = hugetlb {
                    let bytes = hsize.bytes().bytes();
                    let h = hugetlb::size_to_hstate(bytes).expect("2M or 1G");
                    let len = size.bytes().next_multiple_of(bytes);
                    if *shared
                        && !hugetlb::hstate_is_gigantic(h)
                        && len >= crate::mm_types::PUD_SIZE
                    {
                        return unsupported(
                            "a shared hugetlb=2M mapping of 1G or more (PMD sharing)",
                        );
                    }
                    let prot = vm_prot(prot.unwrap_or(Prot::ReadWrite));
                    let align = align.map_or(bytes, |a| a.bytes().max(bytes));
                    let hv = hugetlb::hugetlb_mmap(&mut self.machine, h, len, *shared).map_err(
                        |_| {
                            BackendError::errno(
                                stmt,
                                Errno::ENOMEM,
                                "mmap: the HugeTLB pool cannot reserve the mapping's pages",
                            )
                        },
                    )?;
                    let task = self.task(stmt, proc)?;
                    task.mm.do_mmap_hugetlb(region, len, align, prot, hv);
                    return Ok(());
                }
                let len = size.bytes().next_multiple_of(PAGE_SIZE);
                let prot = vm_prot(prot.unwrap_or(Prot::ReadWrite));
                task.mm
                    .do_mmap(region, len, align.map(|a| a.bytes().max(PAGE_SIZE)), prot);
            }
            StmtKind::Munmap(stmt::Munmap { proc, range }) => {
                let (machine, task, start, end) = self.resolve_range(stmt, proc, range)?;
                if do_munmap(machine, &mut task.mm, start, end).is_err() {
                    return Err(BackendError::errno(
                        stmt,
                        Errno::EINVAL,
                        "munmap: the range cuts a HugeTLB mapping inside a huge page",
                    ));
                }
                self.retire_region_if_unmapped(proc, &range.region, gone);
            }
            StmtKind::Mprotect(stmt::Mprotect { proc, range, prot }) => {
                let (machine, task, start, end) = self.resolve_range(stmt, proc, range)?;
                if !mprotect::do_mprotect(machine, &mut task.mm, start, end, vm_prot(*prot)) {
                    return Err(BackendError::errno(
                        stmt,
                        Errno::ENOMEM,
                        "mprotect: part of the range is not mapped",
                    ));
                }
            }
            StmtKind::Madvise(stmt::Madvise {
                proc,
                range,
                advice: advice @ (Advice::Free | Advice::Cold | Advice::Pageout),
            }) => {
                let (_, task, start, end) = self.resolve_range(stmt, proc, range)?;
                let id = task.mm.mm_id;
                let advice = match advice {
                    Advice::Free => madvise::LruAdvice::Free,
                    Advice::Cold => madvise::LruAdvice::Cold,
                    _ => madvise::LruAdvice::Pageout,
                };
                let mut mms = crate::rmap::MmList::new(self.tasks.values_mut().map(|t| &mut t.mm));
                if !madvise::madvise_lru(&mut self.machine, &mut mms, id, start, end, advice) {
                    return Err(BackendError::errno(
                        stmt,
                        Errno::ENOMEM,
                        "madvise: part of the range is not mapped",
                    ));
                }
            }
            StmtKind::Madvise(stmt::Madvise {
                proc,
                range,
                advice,
            }) => {
                let (machine, task, start, end) = self.resolve_range(stmt, proc, range)?;
                let covered = match advice {
                    Advice::Hugepage => {
                        madvise::hugepage_madvise(machine, &mut task.mm, start, end, true)
                    }
                    Advice::NoHugepage => {
                        madvise::hugepage_madvise(machine, &mut task.mm, start, end, false)
                    }
                    Advice::DontNeed => {
                        madvise::madvise_dontneed(machine, &mut task.mm, start, end)
                    }
                    Advice::Collapse => {
                        use crate::khugepaged::madvise_collapse;
                        match madvise_collapse(machine, &mut task.mm, start, end) {
                            Ok(()) => true,
                            Err(e) => {
                                return Err(BackendError::errno(
                                    stmt,
                                    collapse_errno(e),
                                    "madvise(MADV_COLLAPSE) failed",
                                ))
                            }
                        }
                    }
                    Advice::Free | Advice::Pageout | Advice::Cold => unreachable!("above"),
                };
                if !covered {
                    return Err(BackendError::errno(
                        stmt,
                        Errno::ENOMEM,
                        "madvise: part of the range is not mapped",
                    ));
                }
            }
            StmtKind::Read(stmt::Read { proc, range, step }) => {
                let step = step.map_or(PAGE_SIZE, |s| s.bytes().max(1));
                self.access_or_kill(stmt, proc, range, step, false, false, gone)?;
                self.retire_oom_victims(stmt, gone)?;
            }
            StmtKind::Write(stmt::Write {
                proc,
                range,
                step,
                zero,
            }) => {
                let step = step.map_or(PAGE_SIZE, |s| s.bytes().max(1));
                self.access_or_kill(stmt, proc, range, step, true, *zero, gone)?;
                self.retire_oom_victims(stmt, gone)?;
            }
            StmtKind::Pin(stmt::Pin { proc, range }) => {
                let pinned = self.pin(stmt, proc, range);
                if self.machine.memcg.current_killed {
                    // GUP's fault found the memcg full and the OOM killer
                    // chose the pinning process.
                    self.exit_task(stmt, proc, gone)?;
                    return Err(BackendError::killed(
                        stmt,
                        proc,
                        Signal::SIGKILL,
                        format!("{proc} was killed by SIGKILL: the memcg OOM killer chose it when its memory cgroup reached memory.max"),
                    ));
                }
                pinned?
            }
            StmtKind::Unpin(stmt::Unpin { proc, range }) => self.unpin(stmt, proc, range)?,
            StmtKind::Fork(stmt::Fork { proc, child }) => self.fork(stmt, proc, child)?,
            StmtKind::ThpDisable(stmt::ThpDisable { proc, on }) => {
                self.task(stmt, proc)?.mm.thp_disabled = *on
            }
            StmtKind::Exit(stmt::Exit { proc }) => self.exit_task(stmt, proc, gone)?,
            StmtKind::Split(stmt::Split { proc, range }) => self.split(stmt, proc, range)?,
            StmtKind::Khugepaged => {
                crate::khugepaged::khugepaged_do_scan(
                    &mut self.machine,
                    self.tasks.values_mut().map(|t| &mut t.mm),
                );
            }
            StmtKind::Fragment(stmt::Fragment {
                permille,
                pattern,
                seed,
            }) => {
                crate::fragment::fragment(&mut self.machine, *permille, *pattern, *seed);
            }
            StmtKind::Reclaim => {
                let mut mms = crate::rmap::MmList::new(self.tasks.values_mut().map(|t| &mut t.mm));
                crate::vmscan::drop_slab(&mut self.machine, &mut mms);
            }
            StmtKind::Snapshot { .. }
            | StmtKind::Expect { .. }
            | StmtKind::ExpectErrno { .. }
            | StmtKind::ExpectSignal { .. } => {
                unreachable!("run() handles snapshot and expect")
            }
        }
        Ok(())
    }
}
