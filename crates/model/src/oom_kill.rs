//! The memcg OOM killer: choosing the process to kill and killing it.
//!
//! Follows Linux 6.18 `mm/oom_kill.c` (`out_of_memory` for a memcg,
//! `select_bad_process`, `oom_badness`, `oom_kill_process`,
//! `__oom_kill_process`: the OOM_KILL vmstat event and the memcg's
//! MEMCG_OOM_KILL), with `task_is_dying` from `mm/memcontrol.c`, which
//! reads the mark the killer leaves. Simplifications (see memcontrol too):
//! `oom_score_adj` is 0 for every process and v2's memory.oom.group is not
//! modelled; a victim other than the faulting process is torn down at once
//! (`exit_mmap`), where the kernel's victim exits on its own and the OOM
//! reaper unmaps its memory meanwhile.

use crate::memcontrol::MemcgId;
use crate::mm_types::{MmId, MmStruct};
use crate::trace::Step;
use crate::vmstat::VmEvent;
use crate::Machine;

/// task_is_dying for the task of the mm at hand: the OOM killer chose it.
pub(crate) fn task_is_dying(m: &Machine, mm: Option<&MmStruct>) -> bool {
    mm.is_some_and(|mm| m.memcg.killed.contains(&mm.mm_id))
}

/// oom_badness: the pages the process would give back (get_mm_rss and its
/// page tables; no swap entries, oom_score_adj 0).
pub fn oom_badness(mm: &MmStruct) -> u64 {
    // A PTE table, or the one a PMD mapping keeps deposited.
    let tables = mm.pmds.range(0..=u64::MAX).count() as u64
        + mm.pmd_tables.len() as u64
        + mm.pud_tables.len() as u64;
    mm.anon_rss + tables
}

/// out_of_memory for a memcg: select_bad_process over the group's
/// processes (oldest first; a later one with as many points wins, as
/// css_task_iter meets them), then oom_kill_process: SIGKILL, OOM_KILL and
/// MEMCG_OOM_KILL. The faulting process is only marked (it dies when its
/// fault returns); another is torn down at once. False when the group has
/// no process to kill.
pub(crate) fn out_of_memory(m: &mut Machine, mm: Option<&mut MmStruct>, memcg: MemcgId) -> bool {
    let at_hand = mm.as_deref();
    let candidates = at_hand
        .into_iter()
        .filter(|mm| !task_is_dying(m, Some(mm)))
        .chain(m.mms.iter())
        .filter(|mm| m.memcg.mm_memcg(mm.mm_id) == Some(memcg))
        .map(|mm| (mm.mm_id, oom_badness(mm)));
    let mut chosen: Option<(MmId, u64)> = None;
    let mut sorted: Vec<(MmId, u64)> = candidates.collect();
    sorted.sort_by_key(|c| c.0);
    for c in sorted {
        if chosen.is_none_or(|ch| c.1 >= ch.1) {
            chosen = Some(c);
        }
    }
    let Some((victim, points)) = chosen else {
        return false;
    };
    let current = at_hand.is_some_and(|mm| mm.mm_id == victim);
    if m.tracing() {
        // Recorded after the charge step that called the OOM killer.
        let name = m.tasks_of(victim).next().map(str::to_string);
        m.memcg.traced_kill = Some(Step::OomKill {
            memcg: m.memcg.groups[memcg].name.clone(),
            victim: name.filter(|_| !current),
            points,
        });
    }
    m.stat.count_vm_event(VmEvent::OomKill);
    m.memcg.groups[memcg].events.oom_kill += 1;
    m.memcg.killed.push(victim);
    if !current {
        // Torn down at once; exec retires its tasks.
        m.with_mm(victim, crate::mmap::exit_mmap);
        m.anon_vmas.exit(victim);
        m.memcg.detach(victim);
    }
    true
}
