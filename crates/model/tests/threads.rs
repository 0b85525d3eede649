//! Threads (`<proc> thread <name>`): two tasks on one mm, a fork from the
//! thread, a thread's exit (the mm stays), the process's exit (exit_group:
//! its threads end, then the mm goes), and `exec` (a new empty mm, the
//! threads ended, minflt kept), with the invariant checker on after every
//! statement (`Model::with_invariant_checks`, what `--check` turns on).

use hugelab_model::{debug_vm, Model};
use hugelab_workload::{parse, Backend};

fn counter(model: &mut Model, name: &str) -> Option<i64> {
    let reading = model.read().expect("a reading");
    reading.counters.get(name).copied()
}

fn assert_consistent(model: &Model) {
    let broken = debug_vm::check(model);
    assert!(broken.is_empty(), "{broken:?}");
}

/// A model with the invariant checks on that ran `text`.
fn model_after(text: &str) -> Model {
    let mut model = Model::default().with_invariant_checks();
    for s in &parse("threads.hlw", text).expect("parses").stmts {
        model
            .execute(s)
            .unwrap_or_else(|e| panic!("{}: {}", s.kind, e.message));
    }
    model
}

#[test]
fn a_thread_shares_the_mm_and_counts_at_its_process() {
    let mut model = model_after(
        "set transparent_hugepage/enabled always\nspawn p\np mmap buf 4M\np write buf:2M\n\
         p thread t\nt write buf+2M:2M\n",
    );
    assert_consistent(&model);
    assert_eq!(model.machine.tasks["p"].mm, model.machine.tasks["t"].mm);
    assert_eq!(model.machine.mms.len(), 1);
    assert_eq!(counter(&mut model, "smaps.p.Rss"), Some(4096));
    // Two PMD faults, one by each task: both in the process's minflt.
    assert_eq!(counter(&mut model, "stat.p.minflt"), Some(2));
    // A thread has no counters of its own.
    assert_eq!(counter(&mut model, "smaps.t.Rss"), None);
    assert_eq!(counter(&mut model, "stat.t.minflt"), None);
}

#[test]
fn a_thread_forks_exits_and_the_process_exit_ends_everything() {
    let mut model = model_after(
        "set transparent_hugepage/enabled always\nspawn p\np mmap buf 4M\np write buf:2M\n\
         p thread t\nt fork c\nc write buf:4K\nt exit\n",
    );
    assert_consistent(&model);
    assert_eq!(model.machine.mms.len(), 2);
    assert!(!model.machine.tasks.contains_key("t"));
    assert_eq!(counter(&mut model, "smaps.c.Rss"), Some(2048));
    let model = model_after(
        "spawn p\np mmap buf 4M\np write buf:64K\np thread t\np thread u\nu write buf:4K\n\
         p exit\n",
    );
    assert_consistent(&model);
    let m = &model.machine;
    assert!(m.tasks.is_empty() && m.mms.is_empty());
}

#[test]
fn exec_gives_a_new_empty_mm_and_keeps_minflt() {
    let mut model = model_after(
        "spawn p\np mmap buf 4M\np write buf:64K\np thread t\np thp_disable on\np exec\n",
    );
    assert_consistent(&model);
    let m = &model.machine;
    assert_eq!(m.tasks.len(), 1, "de_thread ended t");
    assert_eq!(m.mms.len(), 1);
    let mm = m.mms.get(m.tasks["p"].mm).expect("the new mm");
    assert!(mm.regions.is_empty() && mm.thp_disabled);
    assert_eq!(m.stat.nr_anon_mapped, 0);
    assert_eq!(counter(&mut model, "stat.p.minflt"), Some(16));
    assert_eq!(counter(&mut model, "smaps.p.Rss"), Some(0));
}

#[test]
fn a_kill_during_a_threads_statement_ends_its_process() {
    let mut model = Model::default().with_invariant_checks();
    let text = "cgroup g memory.max=4M\nspawn p cgroup=g\np mmap buf 8M\np thread t\n\
                p thread u\nt write buf\n";
    let w = parse("threads.hlw", text).expect("parses");
    let (last, first) = w.stmts.split_last().expect("statements");
    for s in first {
        model.execute(s).expect("runs");
    }
    let e = model.execute(last).expect_err("the memcg OOM killer kills");
    assert!(e.message.contains("SIGKILL"), "{}", e.message);
    assert_consistent(&model);
    let m = &model.machine;
    assert!(
        m.tasks.is_empty() && m.mms.is_empty(),
        "p, t and u are gone"
    );
}
