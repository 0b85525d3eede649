//! A process killed by a signal is an outcome of the workload, and a sum of
//! counters is checked as one number: `run` against a backend that kills
//! the process writing a region called `hole` (as the kernel sends SIGBUS
//! to a HugeTLB fault with an empty pool).

use hugelab_workload::gone::Gone;
use hugelab_workload::*;
use std::collections::BTreeSet;

/// Processes by name; a write to region `hole` kills its process with
/// SIGBUS. Every statement it executes is recorded, as written.
#[derive(Default)]
struct Fake {
    procs: BTreeSet<String>,
    executed: Vec<String>,
}

/// What a process leaves: its minflt, 3 when it was killed and 1 when it exited.
fn left(proc: &str, minflt: i64) -> Reading {
    let mut r = Reading::default();
    r.counters.insert(format!("stat.{proc}.minflt"), minflt);
    r
}

impl Backend for Fake {
    fn name(&self) -> &str {
        "fake"
    }

    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        self.execute_retiring(stmt, &mut Gone::default())
    }

    fn execute_retiring(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        self.executed.push(stmt.kind.to_string());
        match &stmt.kind {
            StmtKind::Spawn(stmt::Spawn { proc, .. })
            | StmtKind::Fork(stmt::Fork { child: proc, .. }) => {
                assert!(self.procs.insert(proc.clone()), "{proc} exists already");
            }
            StmtKind::Exit(stmt::Exit { proc }) => {
                assert!(self.procs.remove(proc), "{proc} is not alive");
                gone.add(left(proc, 1));
            }
            StmtKind::Write(stmt::Write { proc, range, .. }) if range.region == "hole" => {
                assert!(self.procs.remove(proc), "{proc} is not alive");
                gone.add(left(proc, 3));
                return Err(BackendError::killed(
                    stmt,
                    proc,
                    Signal::SIGBUS,
                    format!("{proc} was killed by SIGBUS"),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    fn read(&mut self) -> Result<Reading, BackendError> {
        let mut r = Reading::default();
        for p in &self.procs {
            r.counters.insert(format!("stat.{p}.minflt"), 0);
        }
        r.counters.insert("vmstat.nr_memmap_pages".into(), -120);
        r.counters.insert("vmstat.nr_memmap_boot_pages".into(), 8);
        r.unknown
            .insert("vmstat.pgfault".into(), "another process faulted".into());
        Ok(r)
    }
}

fn run_text(text: &str) -> (Fake, Result<Observation, RunError>) {
    let w = parse("k.hlw", text).expect("the workload parses");
    let mut fake = Fake::default();
    let obs = run(&mut fake, &w);
    (fake, obs)
}

const KILLS_B: &str = "spawn a\n\
     a mmap hole 2M\n\
     a fork b\n\
     b write hole\n";

#[test]
fn a_kill_is_an_outcome_and_the_process_is_gone() {
    let (fake, obs) = run_text(&format!(
        "{KILLS_B}expect signal == SIGBUS\n\
         expect stat.b.minflt == 3\n\
         spawn b\n\
         expect stat.b.minflt == 0\n\
         a write hole\n\
         expect signal == SIGBUS\n"
    ));
    let obs = obs.unwrap();
    assert_eq!(
        obs.kills,
        [
            Kill {
                line: 4,
                col: 1,
                statement: "b write hole".into(),
                process: "b".into(),
                signal: Signal::SIGBUS,
                message: "b was killed by SIGBUS".into(),
            },
            Kill {
                line: 9,
                col: 1,
                statement: "a write hole".into(),
                process: "a".into(),
                signal: Signal::SIGBUS,
                message: "a was killed by SIGBUS".into(),
            }
        ]
    );
    assert!(obs.failed_calls.is_empty());
    assert!(obs.expects.iter().all(|e| e.passed), "{:?}", obs.expects);
    assert_eq!(obs.expects[0].counter, SIGNAL);
    assert_eq!(
        obs.expects[0].show(obs.expects[0].actual.unwrap()),
        "SIGBUS"
    );
    // Only the new b is alive at the end; a is gone, killed too.
    assert_eq!(fake.procs, BTreeSet::from(["b".to_string()]));
    let end = obs.snapshot("end").unwrap();
    assert!(!end.counters.contains_key("stat.a.minflt"));
    assert_eq!(end.counters.get("stat.b.minflt"), Some(&0));
    let json = serde_json::to_value(&obs).unwrap();
    assert_eq!(json["kills"][0]["signal"], "SIGBUS");
    assert_eq!(json["kills"][0]["process"], "b");
}

#[test]
fn expect_signal_checks_the_process_of_the_statement_before() {
    let (_, obs) = run_text(&format!(
        "{KILLS_B}expect signal == 0\n\
         expect signal == SIGKILL\n"
    ));
    let obs = obs.unwrap();
    let got: Vec<(bool, Option<String>)> = obs
        .expects
        .iter()
        .map(|e| (e.passed, e.actual.map(|a| e.show(a))))
        .collect();
    assert_eq!(
        got,
        [
            (false, Some("SIGBUS".into())),
            (false, Some("SIGBUS".into()))
        ]
    );
    assert_eq!(
        obs.failed_expects().next().unwrap().failure("k.hlw"),
        "k.hlw:5:1: expect signal == 0 failed: actual SIGBUS"
    );
}

#[test]
fn a_kill_no_line_declares_stops_the_statement_that_names_the_process() {
    let (fake, obs) = run_text(&format!("{KILLS_B}snapshot s\nb read hole\n"));
    let e = obs.unwrap_err().to_string();
    assert_eq!(
        e,
        "k.hlw:6:1: process 'b' was killed by SIGBUS at line 4; a workload that expects it says \
         `expect signal == SIGBUS` right after that line, and then no longer names 'b' (or gives \
         the name to a new process)"
    );
    assert_eq!(fake.executed.last().unwrap(), "b write hole");
}

#[test]
fn a_process_declared_killed_but_alive_is_ended_as_by_exit() {
    let (fake, obs) = run_text(
        "spawn a\n\
         a mmap buf 2M\n\
         a write buf\n\
         expect signal == SIGBUS\n\
         spawn a\n",
    );
    let obs = obs.unwrap();
    assert!(!obs.expects[0].passed);
    assert_eq!(obs.expects[0].actual, Some(0));
    assert!(obs.kills.is_empty());
    assert_eq!(
        fake.executed,
        [
            "spawn a",
            "a mmap buf 2M",
            "a write buf",
            "a exit",
            "spawn a"
        ]
    );
}

#[test]
fn sums_of_counters() {
    let (_, obs) = run_text(
        "expect vmstat.nr_memmap_pages + vmstat.nr_memmap_boot_pages == -112\n\
         expect vmstat.nr_memmap_pages + vmstat.nr_memmap_boot_pages >= -111\n\
         expect vmstat.nr_memmap_pages + vmstat.pgfault == 0\n\
         expect vmstat.nr_memmap_pages + vmstat.thp_fault_alloc == -120\n",
    );
    let obs = obs.unwrap();
    let e = &obs.expects;
    assert_eq!(
        e[0].counter,
        "vmstat.nr_memmap_pages + vmstat.nr_memmap_boot_pages"
    );
    assert_eq!((e[0].passed, e[0].actual), (true, Some(-112)));
    assert_eq!((e[1].passed, e[1].actual), (false, Some(-112)));
    // A part the backend could not read makes the sum unknown...
    assert_eq!(e[2].actual, None);
    assert_eq!(
        e[2].unknown.as_deref(),
        Some("vmstat.pgfault: another process faulted")
    );
    // ...and one it does not report makes it not reported (a failure).
    assert_eq!((e[3].actual, e[3].unknown.as_deref()), (None, None));
    assert_eq!(obs.failed_expects().count(), 2);
    assert_eq!(obs.unknown_expects().count(), 1);
}

/// A backend that cannot run `set` here now.
struct Busy;

impl Backend for Busy {
    fn name(&self) -> &str {
        "busy"
    }
    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        Err(BackendError::unavailable(
            stmt,
            "the kernel gave 1 of 2 1 GiB pages",
        ))
    }
    fn read(&mut self) -> Result<Reading, BackendError> {
        Ok(Reading::default())
    }
}

#[test]
fn a_machine_that_cannot_run_the_workload_now_stops_it_as_unavailable() {
    let w = parse(
        "g.hlw",
        "set hugepages/hugepages-1048576kB/nr_hugepages 2\n",
    )
    .unwrap();
    let e = run(&mut Busy, &w).unwrap_err();
    assert!(e.is_unavailable());
    assert_eq!(
        e.to_string(),
        "g.hlw:1:1: cannot run on this machine now: the kernel gave 1 of 2 1 GiB pages"
    );
    let other = run(
        &mut Fake::default(),
        &parse("g.hlw", "b read x\n").unwrap_or_else(|e| {
            // A parse error is no skip either.
            assert!(!RunError::Parse(e.clone()).is_unavailable());
            Workload {
                file: "g.hlw".into(),
                stmts: Vec::new(),
            }
        }),
    );
    assert!(other.is_ok());
}
