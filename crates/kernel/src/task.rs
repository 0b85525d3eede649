//! The workload's processes on the kernel: `spawn` starts an agent (in a
//! memory cgroup if asked), `fork` forks one (kernel/fork.c), `thread`
//! starts a thread in one, `exit` ends a thread or a process (kernel/exit.c),
//! `exec` re-executes one (fs/exec.c), `thp_disable` is its
//! prctl(PR_SET_THP_DISABLE) (kernel/sys.c); a process the kernel killed is
//! retired as after `exit`.
//!
//! `spawn` and `thread` run outside any measurement window: what they
//! change is the agent's own memory (a new agent, glibc's thread set-up on
//! a stack the agent mapped at start-up), none of the workload's. `exit` and
//! `exec` unmap the regions inside a window, as `exit_mmap` would take them,
//! and end the process or its image outside it.

use crate::agents::{Agents, Proc};
use crate::call::{failed, Call};
use crate::measure::{read_process, settle_dead_mms, zeroed_process, Measurement};
use crate::memcg::{Memcg, RunMemcg};
use crate::process::AgentProc;
use crate::protocol::Request;
use hugelab_workload::gone::Gone;
use hugelab_workload::stmt::{Exec, Exit, Fork, Spawn, ThpDisable, Thread, SPECIAL_MAPPINGS};
use hugelab_workload::{BackendError, Errno, Stmt};
use std::collections::BTreeMap;
use std::path::Path;

/// `spawn <proc> [cgroup=]`: `exe` is the `hugelab` binary the agent runs.
pub(crate) fn spawn(
    exe: &Path,
    cgroups: &mut BTreeMap<String, Memcg>,
    run: Option<&mut RunMemcg>,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Spawn,
) -> Result<(), BackendError> {
    let agent = AgentProc::spawn(exe).map_err(|e| failed(stmt, e))?;
    // The agent re-executed itself: the page tables of its first
    // image are freed later (lazy TLB mm, RCU callbacks), which
    // must not land in the next window.
    settle_dead_mms();
    let mut memcg_dir = None;
    if let Some(cg) = &s.cgroup {
        let memcg = cgroups
            .get_mut(cg)
            .ok_or_else(|| failed(stmt, format!("no cgroup '{cg}'")))?;
        memcg.attach(agent.pid).map_err(|e| failed(stmt, e))?;
        memcg_dir = Some(memcg.dir().to_path_buf());
    } else if let Some(run) = run {
        // In none of the workload's groups: in the run's own.
        run.attach(agent.pid).map_err(|e| failed(stmt, e))?;
        memcg_dir = Some(run.agents_dir().to_path_buf());
    }
    let mut p = Proc::new(agent, BTreeMap::new());
    p.memcg_dir = memcg_dir;
    p.workload_memcg = s.cgroup.is_some();
    agents.procs.insert(s.proc.clone(), p);
    Ok(())
}

/// `<proc> fork <child>`
pub(crate) fn fork(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Fork,
) -> Result<(), BackendError> {
    let mut forked = None;
    m.window(stmt, false, agents, |agents| {
        let p = agents.get_mut(stmt, &s.proc)?;
        let chan = p.channel(&s.proc);
        let (agent, reply) = chan.fork().map_err(|e| failed(stmt, e))?;
        let faults = reply.all_faults + agent.hello_faults;
        let mut child = Proc::new(agent, p.regions.clone());
        child.cursor = p.cursor;
        child.memcg_dir = p.memcg_dir.clone();
        child.workload_memcg = p.workload_memcg;
        child.shift = p.shift;
        child.shared_tables.clone_from(&p.shared_tables);
        // fork copies the PTEs of the VM_PFNMAP special mappings only.
        for (i, mapping) in SPECIAL_MAPPINGS.iter().enumerate() {
            if mapping.pfnmap {
                child.special_ptes[i] = p.special_ptes[i];
            }
        }
        forked = Some(child);
        Ok(Call::ok(faults))
    })?;
    if let Some(p) = forked {
        agents.procs.insert(s.child.clone(), p);
    }
    Ok(())
}

/// `<proc> thread <name>`: a thread of `<proc>`'s process, started by
/// `<proc>` (the process's first task or one of its threads).
pub(crate) fn thread(agents: &mut Agents, stmt: &Stmt, s: &Thread) -> Result<(), BackendError> {
    let proc = agents.process_of(&s.proc).to_string();
    let p = agents.get_mut(stmt, &s.proc)?;
    let thread = p.channel(&s.proc).thread().map_err(|e| failed(stmt, e))?;
    p.threads.insert(s.thread.clone(), thread);
    agents.thread_of.insert(s.thread.clone(), proc);
    Ok(())
}

/// `<proc> thp_disable on|off`
pub(crate) fn thp_disable(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &ThpDisable,
) -> Result<(), BackendError> {
    let req = Request::ThpDisable { on: s.on };
    m.window(stmt, false, agents, |agents| {
        agents.call(stmt, &s.proc, req)
    })
}

/// `<proc> exit`: its counters with nothing mapped go to `gone`.
pub(crate) fn exit(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Exit,
    gone: &mut Gone,
) -> Result<(), BackendError> {
    let proc = &s.proc;
    if let Some(process) = agents.thread_of.remove(proc) {
        // A thread: it ends, the process and its memory stay.
        let p = agents.get_mut(stmt, &process)?;
        if let Some(thread) = p.threads.remove(proc) {
            thread.exit().map_err(|e| failed(stmt, e))?;
        }
        return Ok(());
    }
    unmap_all(m, agents, stmt, proc)?;
    // exit_group: its threads end with it.
    agents.end_threads(proc);
    if let Some(p) = agents.procs.remove(proc) {
        // What it leaves: its counters with nothing mapped.
        let (mut c, mut unknown) = (Default::default(), BTreeMap::new());
        read_process(proc, p.agent.pid, p.minflt, p.spans(), &mut c, &mut unknown)
            .map_err(|e| failed(stmt, e))?;
        gone.add(m.judge(c, unknown));
        p.agent.exit().map_err(|e| failed(stmt, e))?;
        settle_dead_mms(); // its own page tables, as after spawn
    }
    Ok(())
}

/// `<proc> exec`: its regions are unmapped inside the window, as at exit
/// (exec's mmput of the old mm); then, outside it, the agent executes
/// itself again (its threads end: de_thread) and sets itself up as at
/// start. The process keeps its name, channel, cgroup and minflt; its
/// regions leave their counters, with nothing mapped, to `gone`, and the
/// next region is placed as in a new process.
pub(crate) fn exec(
    m: &mut Measurement,
    agents: &mut Agents,
    cgroups: &mut BTreeMap<String, Memcg>,
    run: Option<&mut RunMemcg>,
    stmt: &Stmt,
    s: &Exec,
    gone: &mut Gone,
) -> Result<(), BackendError> {
    let proc = &s.proc;
    unmap_all(m, agents, stmt, proc)?;
    agents.end_threads(proc);
    let p = agents.get_mut(stmt, proc)?;
    let (mut c, mut unknown) = (Default::default(), BTreeMap::new());
    read_process(proc, p.agent.pid, p.minflt, p.spans(), &mut c, &mut unknown)
        .map_err(|e| failed(stmt, e))?;
    gone.add(m.judge(c, unknown));
    // The new image sets itself up outside the process's memory cgroup and
    // joins it again, as a spawned agent does: its own memory is not the
    // workload's.
    let memcg = cgroups
        .values_mut()
        .find(|cg| p.memcg_dir.as_deref() == Some(cg.dir()));
    let run = run.filter(|r| p.memcg_dir.as_deref() == Some(r.agents_dir()));
    let pid = p.agent.pid;
    if let Some(cg) = &memcg {
        cg.detach(pid).map_err(|e| failed(stmt, e))?;
    } else if let Some(r) = &run {
        r.detach(pid).map_err(|e| failed(stmt, e))?;
    }
    p.agent.exec().map_err(|e| failed(stmt, e))?;
    if let Some(cg) = memcg {
        cg.attach(pid).map_err(|e| failed(stmt, e))?;
    } else if let Some(r) = run {
        r.attach(pid).map_err(|e| failed(stmt, e))?;
    }
    p.regions.clear();
    p.cursor = 0;
    p.special_ptes = [0; 3];
    settle_dead_mms(); // the old image's own page tables, as after spawn
    Ok(())
}

/// Unmaps every region of `proc` inside a window, as exit_mmap would take
/// them (the agent's own memory goes outside it). Regions that touch (`at=`
/// neighbours, perhaps one VMA) go in one munmap, so that a THP across them
/// is zapped whole, as exit_mmap zaps it, not split.
fn unmap_all(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    proc: &str,
) -> Result<(), BackendError> {
    let regions = coalesce(agents.get_mut(stmt, proc)?.spans().map(|(_, span)| span));
    m.window(stmt, false, agents, |agents| {
        let mut all = Call::ok(0);
        for (start, len) in regions {
            let call = agents.call(stmt, proc, Request::Munmap { addr: start, len })?;
            all.faults += call.faults;
            all.own_faults += call.own_faults;
            if call.errno != Errno::OK {
                return Err(failed(
                    stmt,
                    format!("munmap at exit failed: {}", call.errno),
                ));
            }
        }
        Ok(all)
    })
}

/// The spans (start, len) in address order, those that touch joined.
fn coalesce(spans: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = spans.collect();
    spans.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (start, len) in spans {
        match out.last_mut() {
            Some((s, l)) if *s + *l >= start => *l = (*l).max(start + len - *s),
            _ => out.push((start, len)),
        }
    }
    out
}

/// After `proc` (a process, or a thread of one: its whole process) was
/// killed during `stmt`: it is gone as after `exit`,
/// its counters with nothing mapped going to `gone` (its memory was
/// freed when it died).
pub(crate) fn retire_killed(
    m: &Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    proc: &str,
    gone: &mut Gone,
) -> Result<(), BackendError> {
    // A fatal signal kills the thread group: a thread's kill is its
    // process's.
    let proc = &agents.process_of(proc).to_string();
    agents.end_threads(proc);
    let Some(p) = agents.procs.remove(proc) else {
        return Err(failed(stmt, format!("no process '{proc}' to retire")));
    };
    let mut c = Default::default();
    zeroed_process(proc, p.minflt, p.spans(), &mut c);
    gone.add(m.judge(c, BTreeMap::new()));
    drop(p);
    settle_dead_mms(); // its mm's last page tables, as after exit
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::coalesce;

    #[test]
    fn touching_spans_are_one_munmap() {
        let spans = [
            (0x30_0000, 0x10_0000),
            (0x20_0000, 0x10_0000),
            (0x60_0000, 0x1000),
        ];
        assert_eq!(
            coalesce(spans.into_iter()),
            [(0x20_0000, 0x20_0000), (0x60_0000, 0x1000)]
        );
    }
}
