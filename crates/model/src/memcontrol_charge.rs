//! Charging a new folio to its memcg: the page counter, and when the limit
//! is reached, limit reclaim and the memcg OOM killer.
//!
//! Follows Linux 6.18 `mm/memcontrol.c` (`mem_cgroup_charge`,
//! `try_charge_memcg` with its retry loop, `mem_cgroup_oom`). The charge
//! half of that file, in a module of its own: a charge reclaims (`vmscan`,
//! which splits folios) and kills (`oom_kill`, which tears an mm down), and
//! both call down into the counting half (`memcontrol`: uncharge, migrate,
//! split). The simplifications are memcontrol's.

use crate::gfp::Gfp;
use crate::memcontrol::{MemcgId, MAX_RECLAIM_RETRIES};
use crate::mm_types::{Fault, MmId, MmStruct, Pfn};
use crate::mmzone::PAGE_ALLOC_COSTLY_ORDER;
use crate::oom_kill::{out_of_memory, task_is_dying};
use crate::trace::Step;
use crate::vmscan::try_to_free_mem_cgroup_pages;
use crate::Machine;

/// mem_cgroup_charge of a new anonymous folio of `order` for `mm`: nothing
/// without a memcg; else try_charge_memcg with `gfp` (limit reclaim, and
/// the OOM killer for cheap orders). Err(Fault::Oom) is -ENOMEM (a large
/// folio falls back; an order-0 fault fails with VM_FAULT_OOM), and
/// Err(Fault::OomKilled) says the OOM killer chose the faulting process.
/// The caller frees the folio on failure.
pub fn mem_cgroup_charge(
    m: &mut Machine,
    mm: Option<&mut MmStruct>,
    mm_id: MmId,
    folio: Pfn,
    order: u32,
    gfp: Gfp,
) -> Result<(), Fault> {
    let Some(memcg) = m.memcg.mm_memcg(mm_id) else {
        return Ok(());
    };
    let nr = 1u64 << order;
    let usage_before = m.memcg.groups[memcg].memory.usage;
    let result = try_charge_memcg(m, mm, memcg, nr, order, gfp);
    if result.is_ok() {
        m.memcg.commit_charge(folio, memcg, nr);
        m.memcg.anon_charged(memcg);
    }
    if m.tracing() {
        let name = m.memcg.groups[memcg].name.clone();
        let charged = if result.is_ok() { nr } else { 0 };
        let reclaimed = (usage_before + charged).saturating_sub(m.memcg.groups[memcg].memory.usage);
        let ok = result.is_ok();
        m.trace(move || Step::Charge {
            order,
            memcg: name,
            ok,
            reclaimed,
        });
        if let Some(kill) = m.memcg.traced_kill.take() {
            m.trace(move || kill);
        }
    }
    result
}

/// try_charge_memcg: the page counter, then as long as the gfp lets it
/// block: limit reclaim, a retry after draining the (empty) stock,
/// MAX_RECLAIM_RETRIES more, and for an order up to
/// PAGE_ALLOC_COSTLY_ORDER the OOM killer, whose kill lets it retry.
fn try_charge_memcg(
    m: &mut Machine,
    mut mm: Option<&mut MmStruct>,
    memcg: MemcgId,
    nr: u64,
    order: u32,
    gfp: Gfp,
) -> Result<(), Fault> {
    let mut nr_retries = MAX_RECLAIM_RETRIES;
    let mut drained = false;
    let mut passed_oom = false;
    loop {
        if m.memcg.groups[memcg].memory.try_charge(nr) {
            return Ok(());
        }
        if !gfp.allows_blocking() {
            // nomem without MEMCG_MAX: only a forced charge raises it there.
            return Err(Fault::Oom);
        }
        m.memcg.groups[memcg].events.max += 1;
        let nr_reclaimed = try_to_free_mem_cgroup_pages(m, mm.as_deref_mut(), memcg, nr);
        if m.memcg.margin(memcg) >= nr {
            continue;
        }
        if !drained {
            // drain_all_stock: the model keeps no per-cpu stock.
            drained = true;
            continue;
        }
        if gfp.noretry {
            return Err(Fault::Oom);
        }
        if nr_reclaimed > 0 && order <= PAGE_ALLOC_COSTLY_ORDER {
            continue;
        }
        if nr_retries > 0 {
            nr_retries -= 1;
            continue;
        }
        // task_is_dying: the OOM killer chose the faulting process.
        if passed_oom && task_is_dying(m, mm.as_deref()) {
            return Err(Fault::OomKilled);
        }
        if mem_cgroup_oom(m, mm.as_deref_mut(), memcg, order) {
            passed_oom = true;
            nr_retries = MAX_RECLAIM_RETRIES;
            continue;
        }
        return Err(Fault::Oom);
    }
}

/// mem_cgroup_oom: only for cheap orders; counts MEMCG_OOM and runs
/// mem_cgroup_out_of_memory. True when the charge should be retried.
fn mem_cgroup_oom(m: &mut Machine, mm: Option<&mut MmStruct>, memcg: MemcgId, order: u32) -> bool {
    if order > PAGE_ALLOC_COSTLY_ORDER {
        return false;
    }
    m.memcg.groups[memcg].events.oom += 1;
    if m.memcg.margin(memcg) >= 1 << order {
        return true;
    }
    // The faulting process was killed by an earlier charge of this fault
    // (an mTHP order, then the next): mem_cgroup_out_of_memory's
    // mutex_lock_killable fails on its pending SIGKILL and kills no one;
    // the retried charge then ends at task_is_dying.
    if task_is_dying(m, mm.as_deref()) {
        return true;
    }
    out_of_memory(m, mm, memcg)
}
