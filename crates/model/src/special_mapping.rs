//! Faults on the special mappings exec makes: the vDSO's text and its data
//! (`[vdso]`, `[vvar]`, `[vvar_vclock]`), after Linux 6.18 mm/mmap.c
//! (`_install_special_mapping`, `special_mapping_fault`),
//! arch/x86/entry/vdso/vma.c (`vvar_vclock_fault`) and lib/vdso/datastore.c
//! (`vvar_fault`), read by the `special` statement.
//!
//! What is modelled: which pages of each mapping the mm has a PTE for
//! ([`MmStruct::special_ptes`]). A read of a page without one is a minor
//! fault (PGFAULT and the task's min_flt, as `handle_mm_fault` and
//! `mm_account_fault` count any fault); a read of one with a PTE is none.
//! A new mm (spawn, exec) has none. Fork copies the PTEs of the VM_PFNMAP
//! mappings (`vvar`, `vvar_vclock`: `vma_needs_copy` is true for
//! VM_PFNMAP) and not the vDSO's text (no VM_PFNMAP, no anon_vma:
//! `copy_page_range` skips it, and the child faults it again).
//!
//! Simplifications, each deliberate:
//! - no memory: the vDSO's text pages are the kernel image's (a fault maps
//!   a struct page and counts it in MM_FILEPAGES, which the model keeps no
//!   counter for), the data pages are PFNs (`vmf_insert_pfn`, no RSS);
//! - no page tables: the kernel backend's agent has its own vDSO where its
//!   own start-up put it, at the top of its address space next to its
//!   other special mappings, and the page tables above those PTEs were made
//!   when its dynamic loader read the vDSO's ELF header; a workload's
//!   page-table gauges count the page tables of its regions only;
//! - the pages that fault with SIGBUS (no time namespace, no Hyper-V clock)
//!   are refused by the checker, so a read here always maps its page.

use crate::mm_types::MmStruct;
use crate::syscall::mm_id_of;
use crate::vmstat::VmEvent;
use crate::Machine;
use hugelab_workload::stmt::{Special, SPECIAL_MAPPINGS};
use hugelab_workload::{BackendError, Stmt};

/// `<proc> special <mapping>[+off][:len]`: the task reads each page once,
/// faulting those its mm has no PTE for.
pub fn sys_special_read(m: &mut Machine, stmt: &Stmt, s: &Special) -> Result<(), BackendError> {
    let (mapping, first, end) = s.pages().map_err(|e| crate::syscall::failed(stmt, e))?;
    let id = mm_id_of(m, stmt, &s.proc)?;
    let mm = m.mms.get_mut(id).expect("a task's mm exists");
    let mut faults = 0;
    for page in first..end {
        let bit = 1u64 << page;
        if mm.special_ptes[mapping] & bit == 0 {
            mm.special_ptes[mapping] |= bit;
            faults += 1;
        }
    }
    for _ in 0..faults {
        m.stat.count_vm_event(VmEvent::PgFault);
    }
    m.account_min_flt(&s.proc, faults);
    Ok(())
}

/// The special-mapping PTEs fork copies into the child (`copy_page_range`
/// for each VMA `vma_needs_copy` accepts): those of the VM_PFNMAP ones.
pub fn dup_special_ptes(src: &MmStruct, dst: &mut MmStruct) {
    for (i, mapping) in SPECIAL_MAPPINGS.iter().enumerate() {
        dst.special_ptes[i] = if mapping.pfnmap {
            src.special_ptes[i]
        } else {
            0
        };
    }
}

#[cfg(test)]
mod tests {
    use crate::Model;
    use hugelab_workload::{parse, Backend};

    fn minflt(text: &str, proc: &str) -> i64 {
        let w = parse("t.hlw", text).unwrap();
        let mut model = Model::default();
        for stmt in &w.stmts {
            model.execute(stmt).unwrap();
        }
        model.read().unwrap().counters[&format!("stat.{proc}.minflt")]
    }

    /// A page faults once per mm; fork copies vvar's PTEs and not the
    /// vDSO's; exec starts again with none.
    #[test]
    fn fork_copies_vvar_ptes_and_not_the_vdsos_and_exec_has_none() {
        let parent = "spawn p\np special vdso\np special vvar:4K\np special vdso+4K:4K\n";
        assert_eq!(minflt(parent, "p"), 3);
        let child = format!("{parent}p fork c\nc special vdso\nc special vvar:4K\n");
        assert_eq!(minflt(&child, "c"), 2);
        let exec = format!("{parent}p exec\np special vdso\np special vvar:4K\n");
        assert_eq!(minflt(&exec, "p"), 6);
    }
}
