//! `hugelab scan --all` while a process forks and reaps children more than
//! 1000 times a second: every scan succeeds, and processes that exit between
//! the listing and their scan are counted as such (`exited_during_scan`),
//! never an error. The forking process holds THPs (and its children share
//! them), so the scans have work.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The churn helper: maps 16 MiB with MADV_HUGEPAGE and writes a page of
/// every 64 KiB of it, prints `ready`, then forks a child every 1/RATE s
/// (each child sleeps LIFE_US and exits), reaping as it goes, until SIGTERM;
/// then prints the children it forked and the seconds it took.
const CHURN: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double rate = atof(argv[1]);
    useconds_t life = (useconds_t)atoi(argv[2]);
    size_t len = 16 << 20, align = 2 << 20;
    char *p = mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    char *buf = (char *)(((unsigned long)p + align - 1) & ~(align - 1));
    madvise(buf, len, MADV_HUGEPAGE);
    for (size_t off = 0; off < len; off += 64 << 10) buf[off] = 1;
    signal(SIGTERM, on_term);
    printf("ready\n");
    fflush(stdout);
    long forks = 0;
    double start = now(), next = start;
    while (!stop) {
        pid_t pid = fork();
        if (pid == 0) { usleep(life); _exit(0); }
        if (pid > 0) forks++;
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        next += 1.0 / rate;
        double wait = next - now();
        if (wait > 0) {
            struct timespec t = { (time_t)wait, (long)((wait - (time_t)wait) * 1e9) };
            nanosleep(&t, NULL);
        }
    }
    double took = now() - start;
    while (wait(NULL) > 0) {}
    printf("%ld %.3f\n", forks, took);
    return 0;
}
"#;

/// Forks per second the helper aims at, and the least the test accepts.
const RATE: u32 = 1500;
const AT_LEAST: f64 = 1000.0;
const SCANS: usize = 12;

#[test]
fn scan_all_counts_processes_that_exit_under_fork_churn() {
    if let Some(why) = common::cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let bin = match common::compile_c("scan-churn", "churn", CHURN) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let mut churn = Command::new(&bin)
        .args([RATE.to_string(), "2000".to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the churn helper starts");
    let pid = churn.id() as i64;
    let mut out = BufReader::new(churn.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let t = Instant::now();
    let mut gone = 0;
    let mut failures = Vec::new();
    let mut holder_scanned = 0;
    for _ in 0..SCANS {
        let o = common::run(&["scan", "--all", "--json"]);
        if !o.status.success() {
            failures.push(common::stderr(&o));
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        gone += v["exited_during_scan"]
            .as_u64()
            .expect("exited_during_scan");
        let procs = v["processes"].as_array().unwrap();
        holder_scanned += procs
            .iter()
            .filter(|p| p["pid"].as_i64() == Some(pid))
            .count();
    }
    let scanning = t.elapsed().as_secs_f64();
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(churn.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
    let mut fields = line.split_whitespace();
    let forks: f64 = fields.next().unwrap().parse().unwrap();
    let secs: f64 = fields.next().unwrap().parse().unwrap();
    let rate = forks / secs;
    println!(
        "{SCANS} scans in {scanning:.1} s under {forks} forks in {secs:.1} s ({rate:.0}/s): \
         {gone} processes exited during the scans, {} scans failed",
        failures.len()
    );
    assert!(failures.is_empty(), "scan --all failed: {failures:#?}");
    assert!(
        rate >= AT_LEAST,
        "the helper forked only {rate:.0} times a second"
    );
    // The THP holder lives throughout: every scan found it.
    assert_eq!(holder_scanned, SCANS);
    // Children live 2 ms, a scan of every process far longer: some listed
    // ones are gone when their turn comes, and are counted.
    assert!(gone > 0, "no process exited during {SCANS} scans");
}
