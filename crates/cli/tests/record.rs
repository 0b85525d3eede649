//! `hugelab record`: a C program of known behaviour recorded on this
//! machine's kernel (root; skipped with a reason otherwise), checked
//! against what the program does; bad input; the machine left as found.

mod common;

use hugelab_kernel::record::{self, summary, tracefs, Event, Kind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The recorder reaps every child of the process: tests that start
/// processes run one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const PAGE: u64 = 4096;

const PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096
static volatile char *r3;

static void *thread(void *arg) {
    for (int i = 0; i < 4; i++) r3[i * PAGE] = 1;
    return arg;
}

int main(void) {
    volatile char *r1 = mmap(0, 64 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < 64; i++) r1[i * PAGE] = 1;
    volatile char *r2 = mmap(0, 16 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int sum = 0;
    for (int i = 0; i < 16; i++) sum += r2[i * PAGE];
    for (int i = 0; i < 16; i++) r2[i * PAGE] = 1;
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 8; i++) r1[i * PAGE] = 2;
        _exit(0);
    }
    waitpid(pid, 0, 0);
    r3 = mmap(0, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pthread_t t;
    pthread_create(&t, 0, thread, 0);
    pthread_join(t, 0);
    void *moved = mremap((void *)r2, 16 * PAGE, 32 * PAGE, MREMAP_MAYMOVE);
    void *brk0 = sbrk(16 * PAGE);
    void *brk1 = sbrk(0);
    madvise((void *)r1, 64 * PAGE, MADV_DONTNEED);
    dprintf(2, "r1=%p r2=%p moved=%p r3=%p brk0=%p brk1=%p\n", r1, r2, moved, r3, brk0, brk1);
    execl("/bin/true", "true", (char *)0);
    return 1 + sum;
}
"#;

/// The test's turn to record (one at a time) and the compiled program, or
/// None, said on stderr, where this machine cannot record or compile it.
fn recordable_program() -> Option<(std::sync::MutexGuard<'static, ()>, PathBuf)> {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let why = match cannot_record().map(Err).unwrap_or_else(compile) {
        Ok(bin) => return Some((one, bin)),
        Err(why) => why,
    };
    eprintln!("skipped: {why}");
    None
}

/// Why the recorder cannot run here, if it cannot.
fn cannot_record() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    None
}

/// The test program, compiled with `cc`; Err (why) without a compiler.
fn compile() -> Result<PathBuf, String> {
    common::compile_c("record", "known", PROGRAM)
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn no_children_left() -> bool {
    // SAFETY: a non-blocking wait for any child.
    let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG | libc::__WALL) };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD)
}

/// The address an mmap of `len` anonymous bytes in `pid` returned: its
/// sys_exit following its sys_enter in the same task.
fn mmap_of(events: &[Event], pid: u32, len: u64) -> u64 {
    let enter = events
        .iter()
        .position(|e| {
            e.pid == pid
                && matches!(e.kind, Kind::SysEnter { nr: 9, args } if args[1] == len && args[4] as i32 == -1)
        })
        .unwrap_or_else(|| panic!("no mmap of {len:#x} in {pid}"));
    let tid = events[enter].tid;
    events[enter..]
        .iter()
        .find_map(|e| match e.kind {
            Kind::SysExit { nr: 9, ret } if e.tid == tid => Some(ret as u64),
            _ => None,
        })
        .expect("the mmap's exit")
}

fn faults(events: &[Event], tid: u32, range: (u64, u64), code: u64) -> usize {
    events
        .iter()
        .filter(|e| {
            e.tid == tid
                && matches!(e.kind, Kind::Fault { addr, error_code, user: true }
                    if error_code == code && addr >= range.0 && addr < range.1)
        })
        .count()
}

fn syscall_args(events: &[Event], pid: u32, nr: i64) -> Vec<[u64; 6]> {
    events
        .iter()
        .filter(|e| e.pid == pid)
        .filter_map(|e| match e.kind {
            Kind::SysEnter { nr: n, args } if n == nr => Some(args),
            _ => None,
        })
        .collect()
}

fn record_known(bin: &Path) -> (Vec<Event>, record::Outcome) {
    let mut events = Vec::new();
    let opts = record::Options {
        command: vec![bin.to_str().unwrap().to_string()],
        buffer: 4 << 20,
        watch_settings: None,
    };
    let outcome = record::record(&opts, |e| events.push(e.clone()), |_| {}).expect("records");
    (events, outcome)
}

#[test]
fn a_program_of_known_behaviour_is_recorded_as_it_ran() {
    let Some((_one, bin)) = recordable_program() else {
        return;
    };
    let (mounted, fds) = (tracefs::is_mounted().unwrap(), fd_count());
    let (events, outcome) = record_known(&bin);
    assert_eq!(tracefs::is_mounted().unwrap(), mounted, "tracefs as found");
    assert_eq!(fd_count(), fds, "no perf descriptor left open");
    assert!(no_children_left());
    assert_eq!(outcome.lost, 0);
    assert_eq!(outcome.status, Some(0), "/bin/true's status");
    assert!(
        events.windows(2).all(|w| w[0].time <= w[1].time),
        "in time order"
    );

    // The command is the first task seen (its exec's COMM record).
    let root = events[0].pid;
    let r1 = mmap_of(&events, root, 64 * PAGE);
    let r1 = (r1, r1 + 64 * PAGE);
    assert!(
        faults(&events, root, r1, 0x6) >= 64,
        "a first write per page"
    );
    let r2 = mmap_of(&events, root, 16 * PAGE);
    let r2 = (r2, r2 + 16 * PAGE);
    assert_eq!(faults(&events, root, r2, 0x4), 16, "a first read per page");
    assert_eq!(
        faults(&events, root, r2, 0x7),
        16,
        "then a write over the zero page"
    );
    let last_read = events.iter().rposition(|e| e.tid == root && matches!(e.kind, Kind::Fault { addr, error_code: 4, .. } if addr >= r2.0 && addr < r2.1));
    let first_wp = events.iter().position(|e| e.tid == root && matches!(e.kind, Kind::Fault { addr, error_code: 7, .. } if addr >= r2.0 && addr < r2.1));
    assert!(last_read < first_wp, "reads, then writes");

    let new_tasks: Vec<(u32, u64)> = events
        .iter()
        .filter_map(|e| match e.kind {
            Kind::NewTask {
                child, clone_flags, ..
            } if e.pid == root => Some((child, clone_flags)),
            _ => None,
        })
        .collect();
    assert_eq!(new_tasks.len(), 2, "the fork and the thread: {new_tasks:?}");
    let (child, flags) = new_tasks[0];
    assert_eq!(flags & summary::CLONE_VM, 0, "fork: a new mm");
    assert_eq!(faults(&events, child, r1, 0x7), 8, "the child's COW faults");
    let (thread, flags) = new_tasks[1];
    assert_ne!(flags & summary::CLONE_VM, 0);
    assert_eq!(flags & summary::CLONE_VFORK, 0);
    let r3 = mmap_of(&events, root, 8 * PAGE);
    assert_eq!(faults(&events, thread, (r3, r3 + 8 * PAGE), 0x6), 4);
    assert!(
        events
            .iter()
            .filter(|e| e.tid == thread && matches!(e.kind, Kind::Fault { .. }))
            .all(|e| e.pid == root),
        "the thread's faults are in the shared mm"
    );

    let mremap = syscall_args(&events, root, 25);
    assert!(
        mremap
            .iter()
            .any(|a| a[0] == r2.0 && a[1] == 16 * PAGE && a[2] == 32 * PAGE && a[3] == 1),
        "{mremap:x?}"
    );
    let brk = syscall_args(&events, root, 12);
    let grown = brk.windows(2).any(|w| w[0][0] == 0 && w[1][0] != 0);
    assert!(
        brk.iter().any(|a| a[0] != 0) && (grown || brk.len() >= 2),
        "{brk:x?}"
    );
    let madvise = syscall_args(&events, root, 28);
    assert!(
        madvise
            .iter()
            .any(|a| a[0] == r1.0 && a[1] == 64 * PAGE && a[2] == 4),
        "{madvise:x?}"
    );
    assert!(
        events.iter().any(|e| e.pid == root
            && matches!(&e.kind, Kind::Exec { filename, .. } if filename == "/bin/true")),
        "the exec of /bin/true"
    );
    assert!(events
        .iter()
        .any(|e| e.pid == root
            && matches!(&e.kind, Kind::Comm { comm, exec: true } if comm == "true")));
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
}

#[test]
fn the_summary_counts_the_programs_faults() {
    let Some((_one, bin)) = recordable_program() else {
        return;
    };
    let state = common::state_dir("record-summary");
    let mounted = tracefs::is_mounted().unwrap();
    let out = common::hugelab(
        &["record", "--summary", "--json", "--", bin.to_str().unwrap()],
        &state,
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["totals"]["lost"], 0);
    let tasks = v["tasks"].as_array().unwrap();
    assert_eq!(
        tasks.len(),
        3,
        "the program, its child, its thread: {tasks:?}"
    );
    assert_eq!(tasks[0]["kind"], "command");
    assert!(tasks[0]["faults"]["write"].as_u64().unwrap() >= 64 + 16);
    assert_eq!(
        tasks[0]["execs"].as_array().unwrap().last().unwrap(),
        "/bin/true"
    );
    assert_eq!(tasks[0]["syscalls"]["mremap"], 1);
    assert_eq!(tasks[1]["kind"], "process");
    assert_eq!(tasks[2]["kind"], "thread");
    // Its four pages, and its own stack.
    assert!(tasks[2]["faults"]["write"].as_u64().unwrap() >= 4);
    assert_eq!(tracefs::is_mounted().unwrap(), mounted);
    // The table, first.
    let out = common::hugelab(
        &["record", "--summary", "--", bin.to_str().unwrap()],
        &state,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("| pid/tid"), "{text}");
    assert!(text.contains(" 0 lost"), "{text}");
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn bad_input_is_one_sentence_and_leaves_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    common::assert_refused_as_nobody(&["record", "--summary", "--", "/bin/true"]);
    common::assert_refused_as_nobody(&["record", "-o", "/tmp/never.hlw", "--", "/bin/true"]);
    if let Some(why) = cannot_record() {
        eprintln!("skipped the rest: {why}");
        return;
    }
    let state = common::state_dir("record-bad");
    let mounted = tracefs::is_mounted().unwrap();
    let out = common::hugelab(
        &["record", "--summary", "--", "no-such-command-here"],
        &state,
    );
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no command no-such-command-here found"),
        "{err}"
    );
    assert_eq!(tracefs::is_mounted().unwrap(), mounted);
    assert!(no_children_left());
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn a_recording_that_lost_events_is_refused() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = cannot_record() {
        eprintln!("skipped: {why}");
        return;
    }
    let state = common::state_dir("record-lost");
    let mounted = tracefs::is_mounted().unwrap();
    // dd's 1G buffer takes 262144 first-touch faults in well under a
    // second: far more than a one-page ring per CPU can hold between drains,
    // almost always (a CI run here once kept up): up to 5 tries, each
    // either a whole recording or refused.
    let mut tries = 0;
    let out = loop {
        tries += 1;
        let out = common::hugelab(
            &[
                "record",
                "--summary",
                "--buffer",
                "4K",
                "--",
                "dd",
                "if=/dev/zero",
                "of=/dev/null",
                "bs=1G",
                "status=none",
                "count=1",
            ],
            &state,
        );
        if out.status.code() == Some(0) && tries < 5 {
            assert!(
                !out.stdout.is_empty(),
                "a recording that lost nothing has its summary"
            );
            continue;
        }
        break out;
    };
    let err = common::stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "no loss in {tries} tries: {err}"
    );
    assert!(err.contains("lost") && err.contains("--buffer"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
    assert!(out.stdout.is_empty(), "no summary of a partial recording");
    assert_eq!(tracefs::is_mounted().unwrap(), mounted);
    let _ = std::fs::remove_dir_all(state);
}

/// The address `name=0x...` in the program's report line.
fn reported(line: &str, name: &str) -> u64 {
    let v = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line}"));
    u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap()
}

/// The offsets of the pages of `region` that `who`'s `write` lines write,
/// each once (a page written twice fails).
fn written(lines: &[&str], who: &str, region: &str) -> std::collections::BTreeSet<u64> {
    let mut pages = std::collections::BTreeSet::new();
    for l in lines {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() == 3 && w[0] == who && w[1] == "write" {
            if let Some((off, len)) = region_range(w[2], region) {
                for p in (off..off + len).step_by(PAGE as usize) {
                    assert!(pages.insert(p), "page {p:#x} written twice: {l}");
                }
            }
        }
    }
    pages
}

/// The offsets of the first `n` pages.
fn pages(n: u64) -> std::collections::BTreeSet<u64> {
    (0..n).map(|p| p * PAGE).collect()
}

/// `REGION[+OFF]:LEN` of `region` as (offset, length) in bytes.
fn region_range(range: &str, region: &str) -> Option<(u64, u64)> {
    let kib = |t: &str| -> u64 {
        let (n, unit) = t.split_at(t.len() - 1);
        n.parse::<u64>().unwrap() << if unit == "M" { 20 } else { 10 }
    };
    let (place, len) = range.split_once(':')?;
    let off = match place.split_once('+') {
        Some((name, off)) if name == region => kib(off),
        None if place == region => 0,
        _ => return None,
    };
    Some((off, kib(len)))
}

/// Finds, from `from` on, the first line matching `want`; panics with the
/// workload otherwise. Returns its index and its words.
fn next_line<'a>(
    lines: &[&'a str],
    from: usize,
    what: &str,
    want: impl Fn(&[&str]) -> bool,
) -> (usize, Vec<&'a str>) {
    for (i, l) in lines.iter().enumerate().skip(from) {
        let w: Vec<&str> = l.split_whitespace().collect();
        if want(&w) {
            return (i, w);
        }
    }
    panic!("no {what} after line {from} in:\n{}", lines.join("\n"));
}

#[test]
fn a_recorded_program_becomes_its_workload_statement_by_statement() {
    let Some((_one, bin)) = recordable_program() else {
        return;
    };
    let dir = bin.parent().unwrap().to_path_buf();
    let state = common::state_dir("record-workload");
    let file = dir.join("known.hlw");
    let (mounted, _) = (tracefs::is_mounted().unwrap(), ());
    let out = common::hugelab(
        &[
            "record",
            "-o",
            file.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
        ],
        &state,
    );
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(tracefs::is_mounted().unwrap(), mounted, "tracefs as found");
    assert!(no_children_left());
    let line = err
        .lines()
        .find(|l| l.starts_with("r1="))
        .expect("the program's report");
    let at = |name| format!("at={:#x}", reported(line, name));
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines[0], "spawn known", "{text}");

    // 64 pages written one by one: one mmap at the address the program
    // got, one write of the whole region.
    let (i, w) = next_line(&lines, 0, "r1's mmap", |w| {
        w[1] == "mmap" && w.contains(&at("r1").as_str())
    });
    assert_eq!(w[3], "256K", "{w:?}");
    let r1 = w[2];
    let (i, _) = next_line(&lines, i, "r1's writes", |w| {
        w == ["known", "write", &format!("{r1}:256K")]
    });
    // 16 pages read, then written: the zero page, then a write over it.
    let (i, w) = next_line(&lines, i, "r2's mmap", |w| {
        w[1] == "mmap" && w.contains(&at("r2").as_str())
    });
    let r2 = w[2];
    let (i, _) = next_line(&lines, i, "r2's reads", |w| {
        w == ["known", "read", &format!("{r2}:64K")]
    });
    let (i, _) = next_line(&lines, i, "r2's writes", |w| {
        w == ["known", "write", &format!("{r2}:64K")]
    });
    // The child copies 8 of r1's pages on write, and exits.
    let (i, w) = next_line(&lines, i, "the fork", |w| {
        w.len() == 3 && w[0] == "known" && w[1] == "fork"
    });
    let child = w[2];
    let (exit, _) = next_line(&lines, i, "the child's exit", |w| w == [child, "exit"]);
    // The parent's own faults after fork (breaking COW on its stack and
    // data) can fall between the child's, which then come as several
    // writes: together they cover r1's first 32K, each page once.
    assert_eq!(
        written(&lines[i..exit], child, r1),
        pages(8),
        "the child's writes to {r1}:\n{}",
        lines.join("\n")
    );
    let i = exit;
    // A thread writes 4 pages of r3, mapped before it was created.
    let (i, w) = next_line(&lines, i, "r3's mmap", |w| {
        w[1] == "mmap" && w.contains(&at("r3").as_str())
    });
    let r3 = w[2];
    let (i, w) = next_line(&lines, i, "the thread", |w| {
        w.len() == 3 && w[0] == "known" && w[1] == "thread"
    });
    let thread = w[2];
    let (exit, _) = next_line(&lines, i, "the thread's exit", |w| w == [thread, "exit"]);
    assert_eq!(
        written(&lines[i..exit], thread, r3),
        pages(4),
        "the thread's writes to {r3}:\n{}",
        lines.join("\n")
    );
    let i = exit;
    // r2 grown to 32 pages, where the kernel put it.
    let moved = reported(line, "moved");
    let mut mremap = vec!["known", "mremap", &*format!("{r2}:64K"), "128K"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    if moved != reported(line, "r2") {
        mremap.push(format!("at={moved:#x}"));
    }
    let (i, _) = next_line(&lines, i, "the mremap", |w| w == mremap);
    // The break moved up by 16 pages.
    let grown = reported(line, "brk1") - reported(line, "brk0");
    assert_eq!(grown, 16 * PAGE);
    let (i, _) = next_line(&lines, i, "the brk", |w| {
        w.len() >= 4 && w[1] == "brk" && w[2] == "heap"
    });
    let (i, _) = next_line(&lines, i, "the DONTNEED", |w| {
        w == ["known", "madvise", &format!("{r1}:256K"), "DONTNEED"]
    });
    let (i, _) = next_line(&lines, i, "the exec", |w| w == ["known", "exec"]);
    let (_, _) = next_line(&lines, i, "true's libc", |w| {
        w[1] == "mmap" && w.contains(&"file=libc.so.6")
    });
    assert_eq!(*lines.last().unwrap(), "known exit");
    // The workload replays on the model, statement by statement: every
    // mapping, touch, fork, thread, mremap, brk and exec of it is one the
    // language has.
    let run = common::run(&["run", "--counter", "vmstat.pgfault", file.to_str().unwrap()]);
    assert!(run.status.success(), "{}", common::stderr(&run));
    let _ = std::fs::remove_dir_all(state);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_recording_stopped_by_ctrl_c_is_still_a_workload_and_says_so() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = cannot_record() {
        eprintln!("skipped: {why}");
        return;
    }
    let state = common::state_dir("record-interrupted");
    let file = state.join("sleep.hlw");
    let mounted = tracefs::is_mounted().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["record", "-o", file.to_str().unwrap(), "--", "sleep", "60"])
        .env("HUGELAB_STATE_DIR", &state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Until sleep runs: its exec is the recording's first event.
    let started = std::time::Instant::now();
    while !std::fs::read_dir("/proc").unwrap().any(|e| {
        let pid = e.unwrap().file_name();
        std::fs::read_to_string(format!("/proc/{}/stat", pid.to_string_lossy()))
            .is_ok_and(|s| s.contains("(sleep)") && s.contains(&format!(" {} ", child.id())))
    }) {
        assert!(started.elapsed().as_secs() < 30, "sleep never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: signals the hugelab we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(started.elapsed().as_secs() < 30, "it stopped at the signal");
    assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
    assert!(err.contains("interrupted"), "{err}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\n# INTERRUPTED: "), "{text}");
    assert!(text.contains("\nspawn sleep_\n"), "{text}");
    assert!(
        text.trim_end().lines().any(|l| l == "sleep_ exit"),
        "{text}"
    );
    assert_eq!(tracefs::is_mounted().unwrap(), mounted, "tracefs as found");
    assert!(no_children_left());
    // `sleep` is a keyword of the language: the process is `sleep_`. The
    // recorder SIGKILLs it; the kernel may still be tearing it down (its
    // cmdline readable until exit_mm) for a moment after the recorder ends.
    let recorded_sleep_lives = || {
        std::fs::read_dir("/proc").unwrap().any(|e| {
            let pid = e.unwrap().file_name();
            std::fs::read(format!("/proc/{}/cmdline", pid.to_string_lossy()))
                .is_ok_and(|c| c == b"sleep\x0060\x00")
        })
    };
    let killed = std::time::Instant::now();
    while recorded_sleep_lives() && killed.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!recorded_sleep_lives(), "the recorded sleep is gone");
    let _ = std::fs::remove_dir_all(state);
}

/// The known program's workload with `expect` lines of the anonymous memory
/// the recorder measured, after each process's exit snapshot (as `record
/// --snapshot-at-exit` writes them), and the replayed faults per process.
fn workload_with_measured_expects(
    events: &[Event],
    exits: &[record::MmStat],
) -> (String, std::collections::BTreeMap<String, u64>) {
    use record::{convert, spool};
    let mut w = spool::Writer::create(&std::env::temp_dir()).unwrap();
    for e in events {
        w.push(e).unwrap();
    }
    let mut spool = w.finish().unwrap();
    let header = convert::Header {
        command: vec!["known".into()],
        date: "now".into(),
        kernel: "test".into(),
        interrupted: false,
        snapshot_at_exit: true,
        settings_read: Vec::new(),
    };
    let mut names = Vec::new();
    let mut text = Vec::new();
    let stats =
        convert::convert_named(&mut spool, &header, &mut text, |n| names = n.to_vec()).unwrap();
    let mut out = String::new();
    for line in String::from_utf8(text).unwrap().lines() {
        out += line;
        out.push('\n');
        let Some(name) = line
            .strip_prefix("snapshot ")
            .and_then(|l| l.strip_suffix("-exit"))
        else {
            continue;
        };
        let pid = names.iter().find(|(_, n)| n == name).unwrap().0;
        let last = exits
            .iter()
            .filter(|s| s.pid == pid)
            .max_by_key(|s| s.generation);
        let anon = last.unwrap().anon_kb;
        out += &format!("expect smaps.{name}.Anonymous == {anon}\n");
    }
    (out, stats.faults_by_process)
}

/// The faults recorded in process `pid` (all its tasks), in its mm number
/// `generation` (counted by its execs after the first).
fn faults_in_mm(events: &[Event], pid: u32, generation: usize) -> u64 {
    let mut execs = 0;
    let mut n = 0;
    for e in events.iter().filter(|e| e.pid == pid) {
        match e.kind {
            Kind::Comm { exec: true, .. } => execs += 1,
            Kind::Fault { .. } if execs.max(1) - 1 == generation => n += 1,
            _ => {}
        }
    }
    n
}

#[test]
fn each_process_is_measured_at_its_exit_and_exec() {
    let Some((_one, bin)) = recordable_program() else {
        return;
    };
    let (events, outcome) = record_known(&bin);
    assert!(no_children_left());
    let root = events[0].pid;
    let mm = |pid: u32, generation: u32| {
        outcome
            .exits
            .iter()
            .find(|s| s.pid == pid && s.generation == generation)
            .unwrap_or_else(|| {
                panic!(
                    "no reading of {pid}'s mm {generation}: {:#?}",
                    outcome.exits
                )
            })
    };
    let child = events
        .iter()
        .find_map(|e| match e.kind {
            Kind::NewTask {
                child, clone_flags, ..
            } if clone_flags & summary::CLONE_VM == 0 => Some(child),
            _ => None,
        })
        .expect("the fork");
    assert_eq!(outcome.exits.len(), 3, "{:#?}", outcome.exits);
    // Anonymous memory. The program's own: r1 256K, r2 64K (grown to 128K,
    // untouched beyond), r3 16K; the C runtime's: ld.so's and libc's data
    // and bss, the stack, the heap, the thread's stack (what /bin/true,
    // the same runtime without the program, has at its exit: ~100K here).
    let known = mm(root, 0);
    let true_ = mm(root, 1);
    let forked = mm(child, 0);
    let runtime = true_.anon_kb;
    assert!((16..=256).contains(&runtime), "{true_:?}");
    assert_eq!((known.ended_by, known.comm.as_str()), ("exec", "known"));
    assert_eq!((true_.ended_by, true_.comm.as_str()), ("exit", "true"));
    assert_eq!(forked.ended_by, "exit");
    // At its exec: r1 dropped (DONTNEED), r2 64K, r3 16K, the runtime (its
    // size varies by a few pages with the environment and the stack) and
    // the thread's stack and TLS (a few pages).
    assert!(
        known.anon_kb >= 64 + 16 + runtime / 2 && known.anon_kb <= 64 + 16 + runtime + 64,
        "{known:?} runtime {runtime}"
    );
    // The fork child maps all its parent had at the fork (r1 and r2
    // written, shared or copied) and copies 8 pages of r1: no more pages.
    assert!(
        forked.anon_kb >= 256 + 64 + runtime / 2 && forked.anon_kb <= 256 + 64 + runtime + 64,
        "{forked:?}"
    );
    // Minor faults: every fault recorded in the mm, and the kernel's own
    // faults that raise no page-fault event: an exec copies argv and the
    // environment into the new stack through get_user_pages (a page or
    // two), which counts in the exec'ing task's minflt.
    for (s, execd) in [(known, true), (true_, true), (forked, false)] {
        let recorded = faults_in_mm(&events, s.pid, s.generation as usize);
        let extra = s.minflt as i64 - recorded as i64;
        let allowed = if execd { 1..=3 } else { 0..=0 };
        assert!(allowed.contains(&extra), "{s:?}: {recorded} recorded");
    }
    assert!(
        known.minflt >= 64 + 16 + 16 + 4,
        "the program's own: {known:?}"
    );
    assert!(forked.minflt >= 8, "the child's COW: {forked:?}");
    // The tree's minflt: these, and hugelab's own child before its exec.
    let sum: u64 = outcome.exits.iter().map(|s| s.minflt).sum();
    assert!(
        outcome.minflt >= sum && outcome.minflt < sum + 64,
        "{} {sum}",
        outcome.minflt
    );

    // The replay: the model's anonymous memory at each exit snapshot is
    // the measured one (the `expect` lines `record --snapshot-at-exit`
    // writes).
    let (text, _) = workload_with_measured_expects(&events, &outcome.exits);
    let file = bin.parent().unwrap().join("measured.hlw");
    std::fs::write(&file, &text).unwrap();
    let run = common::run(&["run", "--json", file.to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let expects = doc["expects"].as_array().unwrap();
    assert_eq!(expects.len(), 2, "{text}");
    for e in expects {
        assert_eq!(e["passed"], true, "{e:#}");
    }
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
}
