//! exec's half of the mm's life: the process gets a new, empty mm and the
//! old one is dropped.
//!
//! Follows Linux 6.18 `fs/exec.c` (`begin_new_exec`: `de_thread`, then
//! `exec_mmap`, whose `mmput` of the old mm is its last: `exit_mmap`); the
//! new mm is `bprm_mm_init`'s `mm_alloc`, whose `mm_init` copies the old
//! mm's MMF_INIT_MASK flags (MMF_DISABLE_THP among them). The statement
//! itself (`de_thread`, the regions' readings) is `Model::exec_task`.
//!
//! Simplifications: no binary is loaded (the new mm has no mapping: the
//! program's own image is not the workload's), and only a thread group
//! leader execs (de_thread's switch of the leader to the exec'ing thread
//! is not modelled).

use crate::mm_types::MmId;
use crate::mmap::exit_mmap;
use crate::Machine;

impl Machine {
    /// fs/exec.c `exec_mmap` for process `proc`, whose other threads
    /// `de_thread` ended: a fresh mm (`mm_alloc`: no mappings, the
    /// `thp_disable` flag kept as MMF_INIT_MASK keeps it, in the same
    /// memory cgroup) replaces its mm, and the old one is torn down as at
    /// exit (`mmput`: `exit_mmap`). Returns the old mm's id, still in the
    /// table with its regions, for the caller to retire and free.
    pub fn exec_mmap(&mut self, proc: &str) -> Option<MmId> {
        let old = self.tasks.get(proc)?.mm;
        let thp_disabled = self.mms.get(old)?.thp_disabled;
        let memcg = self.memcg.mm_memcg(old);
        self.with_mm(old, exit_mmap);
        self.anon_vmas.exit(old);
        self.memcg.detach(old);
        let new = self.mms.alloc();
        if let Some(memcg) = memcg {
            self.memcg.attach(new, memcg);
        }
        self.anon_vmas.alloc(new);
        self.mms.get_mut(new).expect("just allocated").thp_disabled = thp_disabled;
        self.tasks.get_mut(proc).expect("found above").mm = new;
        Some(old)
    }
}
