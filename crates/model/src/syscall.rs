//! What every statement handler shares: the process a statement names,
//! resolved to its mm, a `<region>[+off][:len]` resolved to addresses, a
//! protection to VMA flags, and the errors a handler returns.
//!
//! hugelab's own, not a kernel file: it stands for the syscall entry
//! (`current->mm`, the user addresses a system call is given), which in the
//! kernel is the caller's registers. The handlers themselves live in the
//! module of their mechanism, as `SYSCALL_DEFINE` does (`mmap::sys_mmap`,
//! `madvise::sys_madvise`, `mprotect::sys_mprotect`, `fork::sys_fork`,
//! `gup::sys_pin`, ...); `exec` dispatches to them.

use crate::mm_types::{MmId, MmStruct, Vma};
use crate::Machine;
use hugelab_workload::{BackendError, Prot, Range, Stmt};

/// The backend's name in errors.
pub const BACKEND: &str = "model";

pub fn failed(stmt: &Stmt, msg: impl Into<String>) -> BackendError {
    BackendError::failed(stmt.pos, msg)
}

/// The statement's feature the model does not have.
pub fn unsupported(stmt: &Stmt, what: impl std::fmt::Display) -> BackendError {
    BackendError::unsupported(stmt, BACKEND, what)
}

/// The mm of process `proc`.
pub fn mm_id_of(m: &Machine, stmt: &Stmt, proc: &str) -> Result<MmId, BackendError> {
    m.tasks.get(proc).map(|t| t.mm).ok_or_else(|| {
        failed(
            stmt,
            format!("no process '{proc}' (never spawned, or exited)"),
        )
    })
}

/// The mm of process `proc`, as statements that name a range report a
/// missing one.
pub fn mm_id_of_ranged(m: &Machine, stmt: &Stmt, proc: &str) -> Result<MmId, BackendError> {
    m.tasks
        .get(proc)
        .map(|t| t.mm)
        .ok_or_else(|| failed(stmt, format!("no process '{proc}'")))
}

/// Resolves `<region>[+off][:len]` to `[start, end)` in `mm`.
pub fn resolve(
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

/// The mm of `proc` and the `[start, end)` of `range` in it.
pub fn resolve_range(
    m: &Machine,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
) -> Result<(MmId, u64, u64), BackendError> {
    let id = mm_id_of_ranged(m, stmt, proc)?;
    let mm = m.mms.get(id).expect("a task's mm exists");
    let (start, end) = resolve(stmt, proc, mm, range)?;
    Ok((id, start, end))
}

/// The VMA flags of a protection (calc_vm_prot_bits).
pub fn vm_prot(prot: Prot) -> u32 {
    [
        (prot.read(), Vma::VM_READ),
        (prot.write(), Vma::VM_WRITE),
        (prot.exec(), Vma::VM_EXEC),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .fold(0, |flags, (_, bit)| flags | bit)
}

/// `resolve_range` for a statement the model does not run on HugeTLB
/// memory (madvise, mprotect, pin, split): refused there.
pub fn resolve_range_no_hugetlb(
    m: &Machine,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
) -> Result<(MmId, u64, u64), BackendError> {
    let id = mm_id_of(m, stmt, proc)?;
    let mm = m.mms.get(id).expect("a task's mm exists");
    let (start, end) = resolve(stmt, proc, mm, range)?;
    if crate::mm_types::range_has_hugetlb(mm, start, end) {
        let what = format!("{} of a HugeTLB region", stmt.kind.keyword());
        return Err(unsupported(stmt, what));
    }
    Ok((id, start, end))
}

/// Refuses a statement the model does not run on `file=` regions (page
/// cache pages: pin, split, MADV_COLD, MADV_PAGEOUT) when `[start, end)`
/// of mm `id` touches one.
pub fn refuse_file_range(
    m: &Machine,
    stmt: &Stmt,
    id: MmId,
    start: u64,
    end: u64,
    what: &str,
) -> Result<(), BackendError> {
    let mm = m.mms.get(id).expect("a task's mm exists");
    if mm.vmas_in(start, end).iter().any(|v| v.file.is_some()) {
        return Err(unsupported(stmt, format!("{what} of a file= region")));
    }
    Ok(())
}
