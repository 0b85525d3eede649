//! `reclaim` on the kernel: `drop_caches=2`, which runs the slab shrinkers
//! (mm/vmscan.c `drop_slab`), the deferred split shrinker among them.

use crate::agents::Agents;
use crate::call::{failed, Call};
use crate::error::KernelError;
use crate::measure::Measurement;
use crate::sysfs;
use hugelab_workload::{BackendError, Stmt};

/// `reclaim`
pub(crate) fn reclaim(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
) -> Result<(), BackendError> {
    // drop_caches=2 runs the slab shrinkers, the deferred split
    // shrinker (with its under-used check) among them.
    m.window(stmt, false, agents, |_| {
        drop_slab().map_err(|e| failed(stmt, e))?;
        Ok(Call::ok(0))
    })
}

/// `echo 2 > /proc/sys/vm/drop_caches`: the slab shrinkers, the deferred
/// split shrinker (with its under-used check) among them.
pub(crate) fn drop_slab() -> Result<(), KernelError> {
    let path = std::path::Path::new(sysfs::PROC_VM).join("drop_caches");
    sysfs::write_value(&path, "2")
}
