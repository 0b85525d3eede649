//! Speed of `hugelab scan` against the kernel tree's `tools/mm/thpmaps` on the
//! same live processes (issue 10): `cargo bench -p hugelab --bench scan`.
//!
//! For each layout (4K pages only, 64K mTHP, PMD THP) and size (4 and 16 GiB;
//! `-- --quick` or `HUGELAB_BENCH_QUICK=1` for 4 GiB only) the benchmark starts
//! a target process (this binary, re-executed as `__target`) that maps that
//! much anonymous memory, 2 MiB aligned, and writes every page: three pages in
//! four are filled with non-zero bytes, every fourth page gets a single zero
//! byte written (allocated, zero-filled), so that a zero-page check has work.
//! The THP settings the layout needs are set through the project's settings
//! guard (journaled, restored on every exit), `madvise` modes with
//! MADV_HUGEPAGE (MADV_NOHUGEPAGE for 4K only; for PMD THP, MADV_COLLAPSE
//! afterwards for the few faults that found no free 2 MiB block). The layout
//! is checked from smaps (AnonHugePages) and the per-size `stats/nr_anon`
//! counters before anything is timed; a layout that came out differently is
//! measured anyway and flagged.
//!
//! Then, `--runs` times (3) each, interleaved, wall time and peak RSS
//! (`wait4` rusage of the child) of:
//!
//! - (a) `thpmaps --pid P --rollup` (Python + numpy from a venv the benchmark
//!   creates under `target/bench-venv`),
//! - (b) `hugelab scan --pid P --rollup --shape-only --json`,
//! - (c) `hugelab scan --pid P --rollup --json` (with the zero-filled subpage
//!   checks),
//!
//! and once each, untimed, with `--cont 64K` (and `--inc-empty` for thpmaps),
//! the agreement check: every label thpmaps prints against the same key of
//! hugelab's `"rollup"."shape"` object, and the zero-filled subpages hugelab's
//! full scan found against the known share. The table gives medians; the
//! growth exponent of time from 4 to 16 GiB is log(t16/t4)/log(4) (1 = linear).
//! Options after `--`: `--quick`, `--runs N`, `--layouts 4k,64k,pmd`.
//!
//! thpmaps itself is not committed (see benches/thpmaps/README.md); without it,
//! or without a `hugelab scan` subcommand, that half is skipped with a message.

use hugelab_kernel::guard::{self, SettingsGuard};
use hugelab_kernel::smaps;
use hugelab_workload::smaps::SmapsField;
use hugelab_workload::Tunable;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const GIB: u64 = 1 << 30;
const PAGE: u64 = 4096;
const PMD: u64 = 2 << 20;
/// Every `ZERO_EVERY`-th page of a target is left zero-filled.
const ZERO_EVERY: u64 = 4;
const THP: &str = "/sys/kernel/mm/transparent_hugepage";
const HUGELAB: &str = env!("CARGO_BIN_EXE_hugelab");

/// The target process of the layout being measured, for the guard's signal
/// path (which exits without unwinding).
static TARGET_PID: AtomicI32 = AtomicI32::new(0);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    FourK,
    Mthp64,
    Pmd,
}

impl Layout {
    const ALL: [Layout; 3] = [Layout::FourK, Layout::Mthp64, Layout::Pmd];

    fn key(self) -> &'static str {
        match self {
            Layout::FourK => "4k",
            Layout::Mthp64 => "64k",
            Layout::Pmd => "pmd",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Layout::FourK => "4K only",
            Layout::Mthp64 => "64K mTHP",
            Layout::Pmd => "PMD THP",
        }
    }

    fn parse(s: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.key() == s)
    }

    /// The per-size `enabled` value for a folio size, in kB.
    fn size_enabled(self, size_kb: u64) -> &'static str {
        match (self, size_kb) {
            (Layout::Mthp64, 64) => "madvise",
            (Layout::Pmd, 2048) => "inherit",
            _ => "never",
        }
    }

    fn advice(self) -> libc::c_int {
        match self {
            Layout::FourK => libc::MADV_NOHUGEPAGE,
            _ => libc::MADV_HUGEPAGE,
        }
    }
}

struct Options {
    sizes: Vec<u64>,
    layouts: Vec<Layout>,
    runs: usize,
}

fn options() -> Result<Options, String> {
    let mut quick = std::env::var("HUGELAB_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let mut layouts = Layout::ALL.to_vec();
    let mut runs = 3;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--quick" => quick = true,
            "--runs" => {
                runs = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--runs needs a positive number")?
            }
            "--layouts" => {
                let list = args.next().ok_or("--layouts needs a list: 4k,64k,pmd")?;
                layouts = list
                    .split(',')
                    .map(|s| Layout::parse(s).ok_or(format!("unknown layout {s}")))
                    .collect::<Result<_, _>>()?;
            }
            other if other.starts_with('-') => return Err(format!("unknown option {other}")),
            // A name filter from `cargo bench <filter>`: nothing to filter.
            _ => {}
        }
    }
    let sizes = if quick {
        vec![4 * GIB]
    } else {
        vec![4 * GIB, 16 * GIB]
    };
    Ok(Options {
        sizes,
        layouts,
        runs,
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__target") {
        target_main(&args[2..]);
    }
    // `cargo bench` passes --bench; a test build of the benches (`cargo test
    // --benches`, clippy --all-targets) only checks that this compiles.
    if !args.iter().any(|a| a == "--bench") {
        println!("scan benchmark: run it with `cargo bench -p hugelab --bench scan` (as root)");
        return ExitCode::SUCCESS;
    }
    let opts = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("scan bench: {e}");
            return ExitCode::from(2);
        }
    };
    match bench(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scan bench: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---- the target process ----

/// `__target <bytes> <layout>`: maps, advises and writes the region, prints
/// `ready <start> <len>` and waits for stdin to close (or its parent to die).
fn target_main(args: &[String]) -> ! {
    let bytes: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(0);
    let Some(layout) = args.get(1).and_then(|s| Layout::parse(s)) else {
        eprintln!("__target <bytes> <4k|64k|pmd>");
        std::process::exit(2);
    };
    // SAFETY: plain syscalls on our own memory; the region is ours alone.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        // PROT_NONE around the region keeps it one VMA of its own, 2 MiB aligned.
        let span = bytes + 2 * PMD;
        let base = libc::mmap(
            std::ptr::null_mut(),
            span as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if base == libc::MAP_FAILED {
            fail("mmap");
        }
        let start = (base as u64 + 1).next_multiple_of(PMD);
        let p = start as *mut u8;
        if libc::mprotect(p.cast(), bytes as usize, libc::PROT_READ | libc::PROT_WRITE) != 0 {
            fail("mprotect");
        }
        if libc::madvise(p.cast(), bytes as usize, layout.advice()) != 0 {
            fail("madvise");
        }
        for page in 0..bytes / PAGE {
            let at = p.add((page * PAGE) as usize);
            if page % ZERO_EVERY == ZERO_EVERY - 1 {
                std::ptr::write_volatile(at, 0);
            } else {
                std::ptr::write_bytes(at, 0xa5, PAGE as usize);
            }
        }
        // A PMD fault that finds no free 2 MiB block falls back to 4K pages
        // (seen for ~0.5% of a 16 GiB target): collapse those now, a request
        // of this process alone, not a machine setting. Best effort.
        if layout == Layout::Pmd {
            libc::madvise(p.cast(), bytes as usize, libc::MADV_COLLAPSE);
        }
        println!("ready {start} {bytes}");
    }
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    std::process::exit(0);
}

fn fail(what: &str) -> ! {
    eprintln!("__target: {what}: {}", std::io::Error::last_os_error());
    std::process::exit(1);
}

/// A live target; killed and reaped when dropped.
struct Target {
    child: Child,
    pid: i32,
    start: u64,
    len: u64,
}

impl Target {
    fn spawn(layout: Layout, bytes: u64) -> Result<Target, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = Command::new(exe)
            .arg("__target")
            .arg(bytes.to_string())
            .arg(layout.key())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the target: {e}"))?;
        let pid = child.id() as i32;
        TARGET_PID.store(pid, Ordering::SeqCst);
        let stdout = child.stdout.take().expect("piped");
        let mut target = Target {
            child,
            pid,
            start: 0,
            len: 0,
        };
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("target pid {pid}: {e}"))?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["ready", start, len] => {
                target.start = start.parse().map_err(|_| format!("bad line {line:?}"))?;
                target.len = len.parse().map_err(|_| format!("bad line {line:?}"))?;
                Ok(target)
            }
            _ => Err(format!(
                "target pid {pid} did not get ready (said {line:?}); out of memory?"
            )),
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // SAFETY: kills the child we started (and have not reaped yet).
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let _ = self.child.wait();
        TARGET_PID.store(0, Ordering::SeqCst);
    }
}

/// The guard's cleanup hook: SIGINT/SIGTERM/SIGHUP exit without unwinding.
fn kill_target() {
    let pid = TARGET_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kills our own target process.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

// ---- layout check ----

/// The anonymous THP sizes, kB (a `hugepages-8kB` directory for shmem alone
/// has no `enabled`).
fn thp_sizes_kb() -> Vec<u64> {
    let mut sizes = hugelab_kernel::sysfs::size_dirs(Path::new(THP));
    sizes.retain(|kb| Path::new(&format!("{THP}/hugepages-{kb}kB/enabled")).exists());
    sizes
}

fn nr_anon() -> BTreeMap<u64, i64> {
    thp_sizes_kb()
        .into_iter()
        .map(|kb| {
            let path = format!("{THP}/hugepages-{kb}kB/stats/nr_anon");
            let n = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            (kb, n)
        })
        .collect()
}

/// What the target got, and whether it is the layout asked for.
fn check_layout(
    layout: Layout,
    t: &Target,
    before: &BTreeMap<u64, i64>,
) -> Result<(bool, String), String> {
    let sm = smaps::region_smaps(t.pid, t.start, t.start + t.len).map_err(|e| e.to_string())?;
    let after = nr_anon();
    let mut folios_kb = 0u64;
    let mut by_size = String::new();
    for (&kb, &n) in &after {
        let d = n - before.get(&kb).copied().unwrap_or(0);
        if d != 0 {
            let _ = write!(by_size, " {kb}K:{d:+}");
        }
        if d > 0 {
            folios_kb += d as u64 * kb;
        }
    }
    let len_kb = t.len / KIB;
    let mthp64_kb = (after.get(&64).copied().unwrap_or(0) - before.get(&64).copied().unwrap_or(0))
        .max(0) as u64
        * 64;
    let ok = sm.get(SmapsField::Rss) == len_kb
        && match layout {
            Layout::FourK => sm.get(SmapsField::AnonHugePages) == 0 && folios_kb == 0,
            Layout::Mthp64 => sm.get(SmapsField::AnonHugePages) == 0 && mthp64_kb == len_kb,
            Layout::Pmd => sm.get(SmapsField::AnonHugePages) == len_kb,
        };
    let text = format!(
        "Rss {} MiB, AnonHugePages {} MiB, nr_anon change per size:{}",
        sm.get(SmapsField::Rss) >> 10,
        sm.get(SmapsField::AnonHugePages) >> 10,
        if by_size.is_empty() {
            " none"
        } else {
            &by_size
        }
    );
    Ok((ok, text))
}

// ---- timing children ----

struct Timed {
    secs: f64,
    maxrss_kb: i64,
    stdout: String,
}

/// Runs a command to completion: wall time from spawn to reaping, and the
/// child's peak RSS from wait4's rusage. A non-zero exit is an error.
fn timed(cmd: &mut Command) -> Result<Timed, String> {
    let what = format!("{cmd:?}");
    let t = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let mut err = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    let _ = child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut stdout);
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data, filled by wait4.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waits for our own child; std never waits for it after this.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("{what}: wait4: {e}"));
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let stderr = err_reader.join().unwrap_or_default();
    let exited_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    // thpmaps reports its errors on stdout and exits 1.
    if !exited_ok {
        return Err(format!(
            "{what} failed (wait status {status:#x}): {}{}",
            stderr.trim(),
            stdout.trim()
        ));
    }
    Ok(Timed {
        secs,
        maxrss_kb: ru.ru_maxrss,
        stdout,
    })
}

// ---- the tools ----

struct Thpmaps {
    python: PathBuf,
    script: PathBuf,
}

impl Thpmaps {
    fn cmd(&self, pid: i32, extra: &[&str]) -> Command {
        let mut c = Command::new(&self.python);
        c.arg(&self.script)
            .args(["--pid", &pid.to_string(), "--rollup"])
            .args(extra);
        c
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// thpmaps and a Python with numpy, or why not.
fn find_thpmaps() -> Result<Thpmaps, String> {
    // target/release/hugelab → target/bench-venv
    let target_dir = Path::new(HUGELAB)
        .parent()
        .and_then(Path::parent)
        .ok_or("no target directory")?;
    let mut script = workspace().join("benches/thpmaps/thpmaps");
    if !script.exists() {
        script = thpmaps_from_debian(&target_dir.join("bench-thpmaps"))?;
    }
    let venv = target_dir.join("bench-venv");
    let python = venv.join("bin/python");
    let has_numpy = |py: &Path| {
        Command::new(py)
            .args(["-c", "import numpy"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_numpy(&python) {
        println!(
            "creating {} and installing numpy into it (once)",
            venv.display()
        );
        let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
        if !python.exists() && !ok(Command::new("python3").arg("-m").arg("venv").arg(&venv)) {
            return Err(format!("`python3 -m venv {}` failed", venv.display()));
        }
        if !ok(Command::new(venv.join("bin/pip")).args(["install", "--quiet", "numpy"])) {
            return Err("`pip install numpy` into the bench venv failed".to_string());
        }
        if !has_numpy(&python) {
            return Err("numpy still does not import in the bench venv".to_string());
        }
    }
    Ok(Thpmaps { python, script })
}

/// Debian's package of the Linux 6.12 source carries `tools/mm/thpmaps`
/// (byte for byte the one of the README's commit): `apt-get download` it
/// (nothing is installed) and extract the script into `dir`, once.
fn thpmaps_from_debian(dir: &Path) -> Result<PathBuf, String> {
    const PACKAGE: &str = "linux-source-6.12";
    let script = dir.join("thpmaps");
    if script.exists() {
        return Ok(script);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    println!(
        "fetching tools/mm/thpmaps from the Debian package {PACKAGE} (apt-get download, once)"
    );
    let got = Command::new("apt-get")
        .args(["download", PACKAGE])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let deb = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"));
    let Some(deb) = deb.filter(|_| got) else {
        return Err(format!(
            "no thpmaps: benches/thpmaps/thpmaps is missing and `apt-get download {PACKAGE}` failed (see benches/thpmaps/README.md)"
        ));
    };
    let tmp = dir.join("thpmaps.part");
    let pipeline = format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -xO ./usr/src/{PACKAGE}.tar.xz | tar -xJO {PACKAGE}/tools/mm/thpmaps > '{}'",
        deb.display(),
        tmp.display()
    );
    let ok = Command::new("sh")
        .args(["-c", &pipeline])
        .status()
        .is_ok_and(|s| s.success());
    let _ = std::fs::remove_file(&deb);
    if !ok {
        return Err(format!("extracting thpmaps from {} failed", deb.display()));
    }
    std::fs::rename(&tmp, &script).map_err(|e| format!("{}: {e}", script.display()))?;
    Ok(script)
}

/// Whether this build of hugelab has the `scan` subcommand.
fn hugelab_has_scan() -> bool {
    Command::new(HUGELAB)
        .args(["scan", "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn hugelab_scan(pid: i32, extra: &[&str]) -> Command {
    let mut c = Command::new(HUGELAB);
    c.args(["scan", "--pid", &pid.to_string(), "--rollup"])
        .args(extra);
    c
}

// ---- agreement ----

/// `label:   value kB (pct)` lines of a thpmaps rollup, in its order.
fn parse_thpmaps(out: &str) -> Result<Vec<(String, u64)>, String> {
    let mut labels = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = line.split_once(':').and_then(|(label, rest)| {
            let mut w = rest.split_whitespace();
            let v = w.next()?.parse().ok()?;
            (w.next() == Some("kB")).then(|| (label.trim().to_string(), v))
        });
        labels.push(parsed.ok_or_else(|| format!("unexpected thpmaps line {line:?}"))?);
    }
    Ok(labels)
}

/// The `"rollup"."shape"` object of hugelab's JSON, as label → kB.
fn parse_hugelab_shape(out: &str) -> Result<BTreeMap<String, Value>, String> {
    let v: Value =
        serde_json::from_str(out).map_err(|e| format!("hugelab scan --json is not JSON: {e}"))?;
    let shape = v
        .get("rollup")
        .ok_or("no \"rollup\" member")?
        .get("shape")
        .ok_or("no \"rollup\".\"shape\" member")?
        .as_object()
        .ok_or("\"rollup\".\"shape\" is not an object")?;
    Ok(shape.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// Prints the agreement of one layout; returns (agreeing, total).
fn agreement(thpmaps_out: &str, hugelab_out: &str) -> Result<(usize, usize), String> {
    let theirs = parse_thpmaps(thpmaps_out)?;
    let ours = parse_hugelab_shape(hugelab_out)?;
    let mut agree = 0;
    let mut lines = String::new();
    for (label, kb) in &theirs {
        match ours.get(label) {
            Some(v) if v.as_u64() == Some(*kb) => agree += 1,
            Some(v) => {
                let _ = writeln!(lines, "    {label}: thpmaps {kb} kB, hugelab {v}");
            }
            None => {
                let _ = writeln!(
                    lines,
                    "    {label}: thpmaps {kb} kB, hugelab has no such key"
                );
            }
        }
    }
    for (label, v) in &ours {
        if !theirs.iter().any(|(l, _)| l == label) {
            let _ = writeln!(
                lines,
                "    {label}: hugelab {v}, thpmaps prints no such label"
            );
        }
    }
    let nonzero: Vec<String> = theirs
        .iter()
        .filter(|l| l.1 != 0)
        .map(|(l, kb)| format!("{l} {kb}"))
        .collect();
    println!(
        "  agreement (--cont 64K): {agree}/{} labels; thpmaps's non-zero ones (kB): {}",
        theirs.len(),
        if nonzero.is_empty() {
            "none".to_string()
        } else {
            nonzero.join(", ")
        }
    );
    print!("{lines}");
    Ok((agree, theirs.len()))
}

/// What hugelab's full scan says about zero-filled subpages: the rollup's
/// utilization, summed over folio sizes, and its other rollup figures.
fn zero_summary(hugelab_out: &str) -> Option<String> {
    let v: Value = serde_json::from_str(hugelab_out).ok()?;
    let rollup = v.get("rollup")?;
    let (mut zero_pages, mut folios) = (0, 0);
    for size in rollup.get("utilization")?.get("sizes")?.as_array()? {
        for b in size.get("buckets")?.as_array()? {
            zero_pages += b.get("zero_pages")?.as_u64()?;
            folios += b.get("folios")?.as_u64()?;
        }
        zero_pages += size.get("partial_zero_pages")?.as_u64()?;
        folios += size.get("partial_folios")?.as_u64()?;
    }
    Some(format!(
        "{} MiB zero-filled subpages in {folios} large folios (zero_page_kb {}, unclassified_kb {})",
        (zero_pages * PAGE) >> 20,
        rollup.get("zero_page_kb")?,
        rollup.get("unclassified_kb")?
    ))
}

// ---- the benchmark ----

#[derive(Default, Clone)]
struct Stat {
    runs: Vec<(f64, i64)>,
}

impl Stat {
    fn median(&self) -> Option<(f64, i64)> {
        if self.runs.is_empty() {
            return None;
        }
        let mut secs: Vec<f64> = self.runs.iter().map(|r| r.0).collect();
        secs.sort_by(f64::total_cmp);
        let rss = self.runs.iter().map(|r| r.1).max().unwrap_or(0);
        Some((secs[secs.len() / 2], rss))
    }

    fn show(&self) -> String {
        match self.median() {
            Some((s, kb)) => format!("{s:.3} / {}", kb >> 10),
            None => "-".to_string(),
        }
    }

    fn detail(&self) -> String {
        let v: Vec<String> = self.runs.iter().map(|r| format!("{:.3}", r.0)).collect();
        v.join(" ")
    }
}

struct Row {
    layout: Layout,
    bytes: u64,
    layout_ok: bool,
    thpmaps: Stat,
    shape: Stat,
    full: Stat,
}

fn bench(opts: &Options) -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (pagemap PFNs, kpageflags, THP settings)".to_string());
    }
    let thpmaps = match find_thpmaps() {
        Ok(t) => Some(t),
        Err(e) => {
            println!("thpmaps half skipped: {e}");
            None
        }
    };
    let has_scan = hugelab_has_scan();
    if !has_scan {
        println!(
            "hugelab half skipped: {HUGELAB} has no `scan` subcommand yet (`hugelab scan --help` fails)"
        );
    }
    if let Some(t) = &thpmaps {
        let base = timed(Command::new(&t.python).args(["-c", "import numpy"]))?;
        println!(
            "python + numpy import alone (part of every thpmaps time): {:.3} s / {} MiB",
            base.secs,
            base.maxrss_kb >> 10
        );
    }
    guard::set_cleanup_hook(kill_target);
    let mut rows = Vec::new();
    for &layout in &opts.layouts {
        for &bytes in &opts.sizes {
            rows.push(measure(
                layout,
                bytes,
                opts.runs,
                thpmaps.as_ref(),
                has_scan,
            )?);
        }
    }
    report(&rows, opts);
    Ok(())
}

fn measure(
    layout: Layout,
    bytes: u64,
    runs: usize,
    thpmaps: Option<&Thpmaps>,
    has_scan: bool,
) -> Result<Row, String> {
    println!("\n== {} , {} GiB", layout.label(), bytes / GIB);
    // One guard per target: the machine lock is held while the target exists
    // (khugepaged must not reshape it under other settings), not longer.
    let mut g = SettingsGuard::acquire().map_err(|e| e.to_string())?;
    let set = |g: &mut SettingsGuard, t: Tunable, v: &str| {
        g.set(&t, v)
            .map_err(|e| format!("setting {} to {v}: {e}", t.path()))
    };
    set(&mut g, Tunable::ThpEnabled, "madvise")?;
    set(&mut g, Tunable::ThpDefrag, "madvise")?;
    for size_kb in thp_sizes_kb() {
        set(
            &mut g,
            Tunable::ThpSizeEnabled { size_kb },
            layout.size_enabled(size_kb),
        )?;
    }
    let before = nr_anon();
    let t0 = Instant::now();
    let target = Target::spawn(layout, bytes)?;
    println!(
        "  target pid {} ready in {:.1} s: {} GiB at {:#x}, every {ZERO_EVERY}th page zero-filled",
        target.pid,
        t0.elapsed().as_secs_f64(),
        target.len / GIB,
        target.start
    );
    // Let the last faults' deferred work settle before reading the counters.
    std::thread::sleep(Duration::from_millis(200));
    let (layout_ok, got) = check_layout(layout, &target, &before)?;
    println!(
        "  layout {}: {got}",
        if layout_ok {
            "as asked"
        } else {
            "DIFFERENT FROM ASKED"
        }
    );
    let pid = target.pid;
    let mut row = Row {
        layout,
        bytes,
        layout_ok,
        thpmaps: Stat::default(),
        shape: Stat::default(),
        full: Stat::default(),
    };

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("  load average before timing: {}", load.trim());
    // The agreement runs, untimed, also warm the caches for the timed ones.
    let their_cont = match thpmaps {
        Some(t) => Some(timed(&mut t.cmd(pid, &["--inc-empty", "--cont", "64K"]))?),
        None => None,
    };
    let our_cont = if has_scan {
        Some(timed(&mut hugelab_scan(pid, &["--json", "--cont", "64K"]))?)
    } else {
        None
    };
    match (&their_cont, &our_cont) {
        (Some(a), Some(b)) => {
            if let Err(e) = agreement(&a.stdout, &b.stdout) {
                println!("  agreement: cannot compare: {e}");
            }
        }
        (Some(a), None) => {
            println!("  thpmaps rollup (--inc-empty --cont 64K), non-zero labels:");
            for (label, kb) in parse_thpmaps(&a.stdout)?.iter().filter(|l| l.1 != 0) {
                println!("    {label}: {kb} kB");
            }
        }
        _ => {}
    }
    if let Some(b) = &our_cont {
        // Only the subpages of large folios are checked: none for 4K only.
        let expect = match layout {
            Layout::FourK => 0,
            _ => (bytes / ZERO_EVERY) >> 20,
        };
        match zero_summary(&b.stdout) {
            Some(z) => println!("  hugelab full scan: {z}; expected {expect} MiB in the region"),
            None => println!("  hugelab full scan: no rollup.utilization in its JSON"),
        }
    }

    for _ in 0..runs {
        if let Some(t) = thpmaps {
            let r = timed(&mut t.cmd(pid, &[]))?;
            row.thpmaps.runs.push((r.secs, r.maxrss_kb));
        }
        if has_scan {
            let r = timed(&mut hugelab_scan(pid, &["--shape-only", "--json"]))?;
            row.shape.runs.push((r.secs, r.maxrss_kb));
            let r = timed(&mut hugelab_scan(pid, &["--json"]))?;
            row.full.runs.push((r.secs, r.maxrss_kb));
        }
    }
    println!(
        "  runs (s): thpmaps [{}]  shape-only [{}]  full [{}]",
        row.thpmaps.detail(),
        row.shape.detail(),
        row.full.detail()
    );
    drop(target);
    g.restore().map_err(|e| e.to_string())?;
    Ok(row)
}

fn report(rows: &[Row], opts: &Options) {
    println!(
        "\nmedian of {} runs; peak RSS is the maximum over the runs (wait4 ru_maxrss)",
        opts.runs
    );
    println!(
        "{:<9} {:>6} {:>16} {:>18} {:>8} {:>16} {:>9}",
        "layout",
        "size",
        "thpmaps s / MiB",
        "shape-only s / MiB",
        "speedup",
        "full s / MiB",
        "full GiB/s"
    );
    for r in rows {
        let speedup = match (r.thpmaps.median(), r.shape.median()) {
            (Some(a), Some(b)) => format!("{:.1}x", a.0 / b.0),
            _ => "-".to_string(),
        };
        let rate = r.full.median().map_or("-".to_string(), |f| {
            format!("{:.2}", r.bytes as f64 / GIB as f64 / f.0)
        });
        println!(
            "{:<9} {:>6} {:>16} {:>18} {:>8} {:>16} {:>9}{}",
            r.layout.label(),
            format!("{}G", r.bytes / GIB),
            r.thpmaps.show(),
            r.shape.show(),
            speedup,
            r.full.show(),
            rate,
            if r.layout_ok {
                ""
            } else {
                "  (layout differs from asked)"
            }
        );
    }
    if opts.sizes.len() > 1 {
        println!("\ngrowth exponent of time, 4 → 16 GiB (log(t16/t4)/log 4; 1 = linear)");
        for &layout in &opts.layouts {
            let find = |gib| {
                rows.iter()
                    .find(|r| r.layout == layout && r.bytes == gib * GIB)
            };
            let (Some(a), Some(b)) = (find(4), find(16)) else {
                continue;
            };
            let exp = |x: &Stat, y: &Stat| match (x.median(), y.median()) {
                (Some(p), Some(q)) => format!("{:.2}", (q.0 / p.0).ln() / 4f64.ln()),
                _ => "-".to_string(),
            };
            println!(
                "  {:<9} thpmaps {:>5}  shape-only {:>5}  full {:>5}",
                layout.label(),
                exp(&a.thpmaps, &b.thpmaps),
                exp(&a.shape, &b.shape),
                exp(&a.full, &b.full)
            );
        }
    }
    let measured: Vec<&Row> = rows.iter().filter(|r| r.shape.median().is_some()).collect();
    if measured.is_empty() {
        return;
    }
    println!("\ngoals: shape-only ≥ 5x faster than thpmaps; full scan ≥ 2 GiB/s");
    for r in measured {
        let speed = match (r.thpmaps.median(), r.shape.median()) {
            (Some(a), Some(b)) => {
                let x = a.0 / b.0;
                format!("{x:.1}x {}", if x >= 5.0 { "met" } else { "MISSED" })
            }
            _ => "-".to_string(),
        };
        let rate = r.full.median().map_or("-".to_string(), |f| {
            let g = r.bytes as f64 / GIB as f64 / f.0;
            format!("{g:.2} GiB/s {}", if g >= 2.0 { "met" } else { "MISSED" })
        });
        println!(
            "  {:<9} {:>3}G: speedup {speed}; full {rate}",
            r.layout.label(),
            r.bytes / GIB
        );
    }
}
