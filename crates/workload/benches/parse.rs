//! Streaming parse rate (`cargo bench -p hugelab-workload --bench parse`).
//!
//! Parses and checks a generated workload of simple statements
//! (`a write r+<off>K:4K`) through [`Statements`], as `hugelab run` reads a
//! file, and prints statements per second and the peak resident set, against
//! the budget of issue 12: at least 5 M statements/s, memory that does not
//! grow with the workload. With a path argument
//! (`cargo bench -p hugelab-workload --bench parse -- FILE`), parses that
//! file instead (plain, .gz or .zst). Timings are wall-clock on one core:
//! quote them with the machine they were taken on.

use hugelab_workload::{stream_file, ParseError, Statements, Stmt};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// Peak resident set of this process, from /proc/self/status (VmHWM), in kB.
fn vm_hwm_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmHWM:"));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// The statements of a stream, which must all be good.
fn count(stmts: impl Iterator<Item = Result<Stmt, ParseError>>) -> u64 {
    let mut n = 0;
    for s in stmts {
        s.unwrap_or_else(|e| panic!("{e}"));
        n += 1;
    }
    n
}

fn report(what: &str, n: u64, secs: f64, bytes: u64) {
    println!(
        "{what}: {n} statements in {secs:.2} s: {:.2} M statements/s, {:.0} MB/s; peak RSS {} MB",
        n as f64 / secs / 1e6,
        bytes as f64 / secs / 1e6,
        vm_hwm_kb() / 1024
    );
}

fn main() {
    // `cargo bench` passes --bench; a path is any other argument.
    let path = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    if let Some(path) = path {
        let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
        let t = Instant::now();
        let n = count(stream_file(Path::new(&path)).unwrap_or_else(|e| panic!("{e}")));
        report(&path, n, t.elapsed().as_secs_f64(), bytes);
        return;
    }
    const N: u64 = 10_000_000;
    let mut text = String::from("spawn a\na mmap r 1G\n");
    for i in 0..N {
        let off = (i * 7919) % 262_143;
        writeln!(text, "a write r+{}K:4K", off * 4).unwrap();
    }
    let bytes = text.len() as u64;
    let before = vm_hwm_kb();
    // The best of a few runs: wall-clock time on a shared machine varies.
    let mut times = Vec::new();
    let mut n = 0;
    for _ in 0..5 {
        let t = Instant::now();
        n = count(Statements::new("bench.hlw", text.as_bytes()));
        times.push(t.elapsed().as_secs_f64());
    }
    let all: Vec<String> = times.iter().map(|t| format!("{t:.2}")).collect();
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    report("10M generated writes, best of 5", n, best, bytes);
    println!("(all runs, s: {})", all.join(" "));
    println!(
        "(the text itself is {} MB of that peak; before parsing: {} MB)",
        bytes >> 20,
        before / 1024
    );
}
