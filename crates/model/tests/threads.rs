//! Threads: two tasks on one mm, through fork of the other task, exit of
//! one and exit of both, with the invariant checker on after every
//! statement (`Model::with_invariant_checks`, what `--check` turns on).
//! The workload language has no thread statement yet: the thread is made
//! through the model's API (`Machine::clone_thread`), and its statements are
//! written as a process's.

use hugelab_model::{debug_vm, Model};
use hugelab_workload::gone::Gone;
use hugelab_workload::{parse, Backend, Stmt};

/// The last statement of `text` (the statements before it declare what it
/// names, for the parser's checks; they are not run).
fn stmt(text: &str) -> Stmt {
    let w = parse("threads.hlw", text).expect("parses");
    w.stmts.last().expect("a statement").clone()
}

/// Runs `line` as the statement of process `proc`, whose buffer `buf` of
/// 4M was mapped: every invariant must hold after it.
fn run(model: &mut Model, proc: &str, line: &str) {
    let s = stmt(&format!("spawn {proc}\n{proc} mmap buf 4M\n{line}\n"));
    model
        .execute_retiring(&s, &mut Gone::default())
        .unwrap_or_else(|e| panic!("{line}: {}", e.message));
}

fn rss_kb(model: &mut Model, proc: &str) -> i64 {
    let reading = model.read().expect("a reading");
    reading.counters[&format!("smaps.{proc}.Rss")]
}

fn assert_consistent(model: &Model) {
    let broken = debug_vm::check(model);
    assert!(broken.is_empty(), "{broken:?}");
}

/// A model with the invariant checks on that ran `text`.
fn model_after(text: &str) -> Model {
    let mut model = Model::default().with_invariant_checks();
    for s in &parse("threads.hlw", text).expect("parses").stmts {
        model.execute(s).expect("runs");
    }
    model
}

#[test]
fn two_tasks_on_one_mm_through_fork_and_exits() {
    let mut model = model_after(
        "set transparent_hugepage/enabled always\nspawn p\np mmap buf 4M\np write buf:2M\n",
    );
    model.machine.clone_thread("p", "t").unwrap();
    assert_consistent(&model);
    assert_eq!(model.machine.tasks["p"].mm, model.machine.tasks["t"].mm);
    assert_eq!(model.machine.mms.len(), 1);

    // The thread writes the other half of the shared address space: both
    // tasks see it.
    run(&mut model, "t", "t write buf+2M:2M");
    assert_eq!(rss_kb(&mut model, "p"), 4096);
    assert_eq!(rss_kb(&mut model, "t"), 4096);

    // The other task forks: the child copies the one mm.
    run(&mut model, "p", "p fork c");
    assert_eq!(model.machine.mms.len(), 2);
    run(&mut model, "c", "c write buf:4K");
    run(&mut model, "t", "t write buf+2M:4K");
    assert_eq!(rss_kb(&mut model, "c"), 4096);

    // One task of the shared mm exits: the mm stays, the thread goes on.
    let mm = model.machine.tasks["t"].mm;
    run(&mut model, "p", "p exit");
    assert!(model.machine.mms.get(mm).is_some());
    run(&mut model, "t", "t write buf+1M:64K");
    assert_eq!(rss_kb(&mut model, "t"), 4096);

    // Both exit: the mm is torn down and freed; so is the child's.
    run(&mut model, "t", "t exit");
    assert!(model.machine.mms.get(mm).is_none());
    run(&mut model, "c", "c exit");
    assert!(model.machine.mms.is_empty() && model.machine.tasks.is_empty());
    assert_consistent(&model);
    let m = &model.machine;
    let zero = m.huge_zero_folio.map_or(0, |_| 512);
    assert_eq!(m.zone.nr_free_pages() + zero, m.zone.spanned_pages());
}

#[test]
fn a_thread_exit_leaves_its_readings_and_keeps_the_mm() {
    let mut model = model_after("spawn p\np mmap buf 4M\np write buf:64K\n");
    model.machine.clone_thread("p", "t").unwrap();
    let mut gone = Gone::default();
    let exit = stmt("spawn t\nt exit\n");
    model.execute_retiring(&exit, &mut gone).unwrap();
    assert_consistent(&model);
    assert_eq!(rss_kb(&mut model, "p"), 64);
    assert!(!model.machine.tasks.contains_key("t"));
    assert_eq!(model.machine.mms.len(), 1);
}
