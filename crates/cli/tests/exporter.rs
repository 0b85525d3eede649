//! `hugelab exporter` on this machine: a process with THPs of known content
//! in a memory cgroup of its own, the exporter serving on a free loopback
//! port, scraped until the cgroup's zero-filled figure is the one the
//! process's writes leave; the exposition checked by a parser of the text
//! format here (and by `promtool check metrics` where it is installed); the
//! textfile mode and every refusal.
//!
//! The expected figures come from what the workload writes and from Linux
//! 6.18's rules (`thp_underused` in mm/huge_memory.c), never from the
//! exporter's output. Everything started is stopped on every exit path: the
//! exporter by its guard's drop, the workload's process and cgroup by the
//! kernel backend's (which journals its settings and restores them).

mod common;

use hugelab_kernel::KernelBackend;
use hugelab_workload::{Backend, StmtKind};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Four THPs of 2 MiB in cgroup g, written as noted: 4, 512, 103 and 1
/// pages of each written (the writes are not zero).
const WORKLOAD: &str = concat!(
    pmd_thp_at_409!(),
    "\
cgroup g
spawn a cgroup=g
a mmap buf 8M align=2M
a madvise buf HUGEPAGE
a write buf:2M step=512K
a write buf+2M:2M
a write buf+4M:412K
a write buf+6M:4K
snapshot before
"
);

/// Zero-filled subpages of the four THPs: 512 - 4, 0, 512 - 103, 512 - 1.
const ZERO: [u64; 4] = [508, 0, 409, 511];
const PAGE: u64 = 4096;

/// One sample of an exposition.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Checks `text` against the Prometheus text format 0.0.4 and the
/// exposition's own rules: every sample's family has a HELP and a TYPE
/// before it, a family's samples are together, a counter's name ends in
/// `_total`, no series twice, names and labels well formed, values numbers.
fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    let valid_name = |n: &str| {
        !n.is_empty()
            && !n.starts_with(|c: char| c.is_ascii_digit())
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut help: BTreeMap<String, ()> = BTreeMap::new();
    let mut kind: BTreeMap<String, String> = BTreeMap::new();
    let mut done: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut series = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = |why: &str| format!("line {}: {why}: {line}", n + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !valid_name(name) || help.insert(name.to_string(), ()).is_some() {
                return Err(at("a bad or repeated HELP"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, k) = rest
                .split_once(' ')
                .ok_or_else(|| at("a TYPE without a type"))?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&k) {
                return Err(at("an unknown type"));
            }
            if kind.insert(name.to_string(), k.to_string()).is_some() {
                return Err(at("a repeated TYPE"));
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let sample = parse_sample(line).map_err(|e| at(&e))?;
        if !valid_name(&sample.name) {
            return Err(at("a bad metric name"));
        }
        match kind.get(&sample.name).map(String::as_str) {
            None => return Err(at("a sample before its TYPE")),
            Some("counter") if !sample.name.ends_with("_total") => {
                return Err(at("a counter not ending in _total"))
            }
            _ => {}
        }
        if !help.contains_key(&sample.name) {
            return Err(at("a sample without HELP"));
        }
        if sample.name != current {
            if done.contains(&sample.name) {
                return Err(at("a family's samples apart"));
            }
            done.push(std::mem::replace(&mut current, sample.name.clone()));
        }
        if !series.insert(format!("{}{:?}", sample.name, sample.labels)) {
            return Err(at("a series twice"));
        }
        out.push(sample);
    }
    Ok(out)
}

/// `name{k="v",...} value`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let end = line.find(['{', ' ']).ok_or("no value")?;
    let name = line[..end].to_string();
    let mut rest = &line[end..];
    let mut labels = BTreeMap::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices();
        let mut key = String::new();
        let close = loop {
            let (i, c) = chars.next().ok_or("an unclosed {")?;
            match c {
                '}' if key.is_empty() => break i,
                '=' => {
                    if chars.next().map(|x| x.1) != Some('"') {
                        return Err("a label value not quoted".into());
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next().ok_or("an unclosed label value")?.1 {
                            '"' => break,
                            '\\' => match chars.next().ok_or("a lone \\")?.1 {
                                'n' => value.push('\n'),
                                c @ ('\\' | '"') => value.push(c),
                                _ => return Err("a bad escape".into()),
                            },
                            c => value.push(c),
                        }
                    }
                    let k = std::mem::take(&mut key);
                    if k.is_empty() || labels.insert(k, value).is_some() {
                        return Err("an empty or repeated label name".into());
                    }
                    match chars.next().ok_or("an unclosed {")? {
                        (_, ',') => {}
                        (i, '}') => break i,
                        _ => return Err("labels not separated by commas".into()),
                    }
                }
                c if c.is_ascii_alphanumeric() || c == '_' => key.push(c),
                _ => return Err(format!("{c:?} in a label name")),
            }
        };
        rest = &r[close + 1..];
    }
    let value = rest
        .strip_prefix(' ')
        .ok_or("no space before the value")?
        .split(' ')
        .next()
        .unwrap_or("");
    let value: f64 = value.parse().map_err(|_| format!("value {value:?}"))?;
    Ok(Sample {
        name,
        labels,
        value,
    })
}

#[test]
fn the_parser_refuses_what_the_format_does_not_allow() {
    let ok = "# HELP a_total x\n# TYPE a_total counter\na_total{k=\"v\\\"\",l=\"w\"} 1\n";
    assert_eq!(parse_exposition(ok).unwrap()[0].labels["k"], "v\"");
    for bad in [
        "a 1\n",
        "# HELP a x\n# TYPE a counter\na 1\n",
        "# HELP a x\n# TYPE a gauge\na{k=v} 1\n",
        "# HELP a x\n# TYPE a gauge\na 1\na 2\n",
        "# HELP a x\n# TYPE a gauge\n# HELP b x\n# TYPE b gauge\na 1\nb 1\na{k=\"\"} 1\n",
        "# HELP a x\n# TYPE a gauge\na one\n",
    ] {
        assert!(parse_exposition(bad).is_err(), "{bad}");
    }
}

/// The exporter, stopped (SIGKILL: it changes nothing that needs undoing)
/// and reaped when dropped, on every exit path of the test.
struct Exporter {
    child: Child,
    addr: String,
}

impl Exporter {
    /// On a free loopback port, scanning every second under `budget` % of
    /// a CPU.
    fn every_second(budget: &str) -> Exporter {
        Exporter::start(&[
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "1s",
            "--cpu-budget",
            budget,
        ])
    }

    fn start(args: &[&str]) -> Exporter {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
            .arg("exporter")
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the hugelab binary runs");
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let mut e = Exporter {
            child,
            addr: String::new(),
        };
        e.addr = line
            .trim()
            .strip_prefix("hugelab exporter: serving http://")
            .and_then(|l| l.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("the first line names the address: {line:?}"))
            .to_string();
        e
    }

    /// GET `path`: (status line, body, how long the answer took).
    fn get(&self, path: &str) -> (String, String, Duration) {
        http_get(&self.addr, path).unwrap_or_else(|e| panic!("GET http://{}{path}: {e}", self.addr))
    }
}

/// GET `path` from `addr` over HTTP/1.0 (the answer whole, the connection
/// closed): (status line, body, how long the answer took).
fn http_get(addr: &str, path: &str) -> std::io::Result<(String, String, Duration)> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let took = t.elapsed();
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "an answer without a head")
    })?;
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
        took,
    ))
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The memory cgroup of `pid` as the exporter labels it at depth 2.
fn cgroup_label(pid: i32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = text
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then_some(path)
        })
        .or_else(|| text.lines().find_map(|l| l.strip_prefix("0::")))
        .unwrap();
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).take(2).collect();
    format!("/{}", parts.join("/"))
}

/// The sum of `name`'s samples whose labels include `with`.
fn sum(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && with
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
        })
        .map(|s| s.value)
        .sum()
}

/// `promtool check metrics` on `text` (promtool is Debian's `prometheus`
/// package, installed by the project's script when missing; where it cannot
/// be, the check is skipped and says why).
fn promtool(text: &str) {
    if let Err(why) = common::test_package("prometheus") {
        println!("promtool check metrics not run: {why}");
        return;
    }
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs once its package is installed");
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_exporter_serves_a_cgroups_zero_filled_thp_memory() {
    if let Some(why) = common::cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    with_known_thps("exporter", scrape_until_known);
}

/// Runs the workload's process (four THPs of known content in a cgroup of
/// its own) on the kernel backend, calls `f` with its pid, and ends the run
/// (process, cgroup, settings) whether `f` passes or panics.
fn with_known_thps(name: &str, f: impl FnOnce(i32)) {
    with_workload(name, WORKLOAD, |kb| {
        let pid = kb.processes()[0].pid;
        let thps = kb.read().unwrap().counters["folios.a.buf.2048kB.pmd"];
        assert_eq!(
            thps, 4,
            "the workload's 4 THPs were not all allocated as THPs"
        );
        f(pid)
    });
}

/// Runs `text` on the kernel backend up to its first snapshot, calls `f`
/// with the backend, and ends the run (processes, cgroups, settings)
/// whether `f` passes or panics; `f`'s result. One such run at a time in
/// this binary (the state directory is in the environment).
fn with_workload<T>(name: &str, text: &str, f: impl FnOnce(&mut KernelBackend) -> T) -> T {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let state = common::state_dir(name);
    std::env::set_var("HUGELAB_STATE_DIR", &*state);
    let workload = hugelab_workload::parse(&format!("{name}.hlw"), text).unwrap();
    // Dropped (and so ended) on a panic before `f` too.
    let mut kb = KernelBackend::new(PathBuf::from(env!("CARGO_BIN_EXE_hugelab"))).unwrap();
    kb.prepare(&hugelab_workload::Lookahead::of(&workload.stmts))
        .unwrap();
    for s in &workload.stmts {
        if matches!(s.kind, StmtKind::Snapshot { .. }) {
            break;
        }
        kb.execute(s)
            .unwrap_or_else(|e| panic!("line {}: {e:?}", s.pos.line));
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut kb)));
    kb.finish().unwrap();
    result.unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Scrapes until the exporter's figures for `pid`'s cgroup are those of
/// the workload's four THPs, and checks each scrape.
fn scrape_until_known(pid: i32) {
    let cg = cgroup_label(pid);
    // The run's group at the root, the workload's g inside it.
    assert!(cg.ends_with(".g"), "{cg}");
    let zero: u64 = ZERO.iter().sum::<u64>() * PAGE;
    // At max_ptes_none 409 (the workload's and the recommended) the THPs
    // with more than 409 zero-filled subpages are split: 508 and 511.
    let give_back = (508 + 511) * PAGE;
    let e = Exporter::every_second("50");
    let (status, _, _) = e.get("/nothing");
    assert!(status.contains(" 404 "), "{status}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, body, _) = e.get("/metrics");
        assert!(status.contains(" 200 "), "{status}");
        let samples = parse_exposition(&body).unwrap_or_else(|why| panic!("{why}"));
        let c = [("cgroup", cg.as_str())];
        let got = sum(
            &samples,
            "hugelab_cgroup_thp_utilization_zero_filled_bytes",
            &c,
        );
        if got == zero as f64 {
            let folios = |used| {
                sum(
                    &samples,
                    "hugelab_cgroup_thp_utilization_folios",
                    &[("cgroup", &cg), ("size", "2048kB"), ("used", used)],
                )
            };
            // Subpages in use 4 and 1, 103, 512: buckets 0-50, 102-152, 460-512.
            assert_eq!(
                [folios("0-50"), folios("102-152"), folios("460-512")],
                [2.0, 1.0, 1.0]
            );
            let at = |setting| {
                sum(
                    &samples,
                    "hugelab_cgroup_shrinker_give_back_bytes",
                    &[("cgroup", &cg), ("at", setting), ("max_ptes_none", "409")],
                )
            };
            assert_eq!([at("machine"), at("recommended")], [give_back as f64; 2]);
            assert_eq!(
                sum(
                    &samples,
                    "hugelab_cgroup_anon_folio_bytes",
                    &[("cgroup", &cg), ("size", "2048kB")]
                ),
                (8 << 20) as f64
            );
            assert!(sum(&samples, "hugelab_exporter_scan_processes", &[]) >= 1.0);
            assert!(samples
                .iter()
                .any(|s| s.name == "hugelab_vmstat_thp_fault_alloc_total"));
            promtool(&body);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cgroup's zero-filled memory read {got}, not {zero}, for 120 s:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    answers_while_a_scan_runs(&e);
}

/// The time to answer scrapes made while a scan runs (the exporter says
/// when one does): each within 50 ms, in the median at least (the machine
/// is shared with builds).
fn answers_while_a_scan_runs(e: &Exporter) {
    let mut during = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while during.len() < 20 && Instant::now() < deadline {
        let (_, body, took) = e.get("/metrics");
        let samples = parse_exposition(&body).unwrap_or_else(|why| panic!("{why}"));
        if sum(&samples, "hugelab_exporter_scan_running", &[]) == 1.0 {
            during.push(took);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        during.len() >= 5,
        "only {} scrapes during a scan in 60 s",
        during.len()
    );
    during.sort();
    let median = during[during.len() / 2];
    println!(
        "{} scrapes during a scan: median {median:?}, slowest {:?}",
        during.len(),
        during.last().unwrap()
    );
    assert!(median < Duration::from_millis(50), "{during:?}");
}

/// The exporter's CPU time (user and system, every thread) from
/// /proc/PID/stat, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the comm.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// At 10 % of a CPU with scans every second, the exporter's CPU time stays
/// within 10 % of the time it ran, by the kernel's count (its CPU time in
/// /proc/PID/stat) and by its own figures of each scan; the slack is a
/// scheduler tick per second and the start before the first scan.
/// Held by the tests whose exporters must complete a scan in a few
/// seconds: one of them must not scan the other's 4 GiB.
static SCANS_IN_SECONDS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn the_cpu_budget_holds() {
    if let Some(why) = common::cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let _alone = SCANS_IN_SECONDS.lock().unwrap_or_else(|e| e.into_inner());
    let start = Instant::now();
    let e = Exporter::every_second("10");
    let pid = e.child.id();
    let mut body = String::new();
    while start.elapsed() < Duration::from_secs(12) {
        std::thread::sleep(Duration::from_secs(2));
        body = e.get("/metrics").1;
    }
    let (cpu, wall) = (cpu_seconds(pid), start.elapsed().as_secs_f64());
    let samples = parse_exposition(&body).unwrap_or_else(|why| panic!("{why}"));
    let v = |name| sum(&samples, name, &[]);
    println!(
        "{cpu:.2} s of CPU in {wall:.1} s ({:.1} %); last scan: {:.3} s of CPU in {:.2} s, {} processes, {} scans",
        100.0 * cpu / wall,
        v("hugelab_exporter_scan_cpu_seconds"),
        v("hugelab_exporter_scan_duration_seconds"),
        v("hugelab_exporter_scan_processes"),
        v("hugelab_exporter_scans_total")
    );
    assert!(v("hugelab_exporter_scans_total") >= 1.0, "{body}");
    assert!(
        cpu <= 0.10 * wall + 0.01 * wall + 0.3,
        "{cpu} s of CPU in {wall} s"
    );
    let (scan_cpu, scan_wall) = (
        v("hugelab_exporter_scan_cpu_seconds"),
        v("hugelab_exporter_scan_duration_seconds"),
    );
    assert!(
        scan_cpu <= 0.10 * scan_wall + 0.02,
        "{scan_cpu} s of CPU in a scan of {scan_wall} s"
    );
    // Its own count is the kernel's (measured a moment apart).
    let own = v("hugelab_exporter_cpu_seconds_total");
    assert!((own - cpu).abs() < 0.1 + 0.01 * wall, "{own} vs {cpu}");
}

/// 4 GiB of MADV_HUGEPAGE memory, 2 MiB-aligned, every page written, in a
/// memory cgroup of its own limited to 4.5 GiB.
const BIG: &str = concat!(
    pmd_thp_at_409!(),
    "\
cgroup big memory.max=4608M
spawn a cgroup=big
a mmap buf 4G align=2M
a madvise buf HUGEPAGE
a write buf
snapshot written
"
);

/// `field` of /proc/PID/smaps_rollup, in bytes.
fn rollup_bytes(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix(" kB")?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {field} in smaps_rollup:\n{text}"))
        * 1024
}

/// The scan interval and budget of [`the_cpu_budget_holds_beside_a_4_gib_thp_process`].
const INTERVAL: u64 = 4;
const BUDGET: f64 = 0.20;

/// The test: beside a process with 4 GiB of THPs (in a memory
/// cgroup of its own, limited to 4.5 GiB), the exporter scans every
/// `INTERVAL` s at a budget of `BUDGET` of a CPU; over 5 intervals its CPU
/// time by the kernel's count (/proc/PID/stat, sampled at each interval's
/// end) stays within the budget of the wall time, and its own count agrees.
/// The slack is 0.3 s and 1 % of the wall time: the start before the first
/// scan paces itself, one chunk of a scan (256 MiB) read before the wait
/// that pays for it, the scrapes, and /proc's 10 ms ticks. The THP memory
/// was read: the last complete scan read at least the process's THP pages,
/// and the process's cgroup holds them. Nothing stays behind: the exporter,
/// the process and its cgroup are gone after the test.
#[test]
fn the_cpu_budget_holds_beside_a_4_gib_thp_process() {
    if let Some(why) = common::cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let _alone = SCANS_IN_SECONDS.lock().unwrap_or_else(|e| e.into_inner());
    let (pid, cgroup_dir, exporter) = with_workload("exporter-4g", BIG, |kb| {
        let pid = kb.processes()[0].pid;
        let (root, version) = hugelab_kernel::memcg::hierarchy().expect("memory cgroups");
        let dir = root.join(hugelab_kernel::memcg::memcg_of(pid, version).unwrap());
        let thp = rollup_bytes(pid, "AnonHugePages");
        println!(
            "process {pid} in {}: AnonHugePages {} MiB of {} MiB Anonymous",
            dir.display(),
            thp >> 20,
            rollup_bytes(pid, "Anonymous") >> 20
        );
        assert!(
            thp > 2 << 30,
            "the process got only {} MiB of its 4 GiB as THPs (smaps_rollup's AnonHugePages): \
             the machine's free memory is too fragmented for this test now",
            thp >> 20
        );
        let exporter = budget_over_five_intervals(&cgroup_label(pid), thp);
        (pid, dir, exporter)
    });
    for (what, path) in [
        ("the process", format!("/proc/{pid}")),
        ("the exporter", format!("/proc/{exporter}")),
        ("the cgroup", cgroup_dir.display().to_string()),
    ] {
        assert!(
            !std::path::Path::new(&path).exists(),
            "{what} is left behind: {path}"
        );
    }
}

/// Runs the exporter for 5 intervals beside the THP process of cgroup `cg`
/// (`thp` bytes of THPs), checks its CPU time and figures; its pid (it is
/// stopped on return).
fn budget_over_five_intervals(cg: &str, thp: u64) -> u32 {
    let start = Instant::now();
    let e = Exporter::start(&[
        "--listen",
        "127.0.0.1:0",
        "--interval",
        &format!("{INTERVAL}s"),
        "--cpu-budget",
        &format!("{}", BUDGET * 100.0),
    ]);
    let pid = e.child.id();
    let mut before = cpu_seconds(pid);
    let mut body = String::new();
    for i in 1..=5 {
        let end = Duration::from_secs(INTERVAL * i);
        std::thread::sleep(end.saturating_sub(start.elapsed()));
        let cpu = cpu_seconds(pid);
        body = e.get("/metrics").1;
        println!(
            "interval {i}: {:.2} s of CPU ({:.1} % of {INTERVAL} s)",
            cpu - before,
            100.0 * (cpu - before) / INTERVAL as f64
        );
        before = cpu;
    }
    let (cpu, wall) = (cpu_seconds(pid), start.elapsed().as_secs_f64());
    let samples = parse_exposition(&body).unwrap_or_else(|why| panic!("{why}"));
    let v = |name| sum(&samples, name, &[]);
    let (own, read) = (
        v("hugelab_exporter_cpu_seconds_total"),
        v("hugelab_exporter_scan_pages_read"),
    );
    let slack = 0.3 + 0.01 * wall;
    println!(
        "5 intervals: {cpu:.2} s of CPU in {wall:.1} s ({:.1} %; budget {:.0} %, allowed {:.2} s with \
         {slack:.2} s of slack); its own count {own:.2} s; {} scans; the last: {read} pages read \
         ({} MiB), {:.2} s of CPU in {:.1} s, {:.1} s waiting for the budget, {} processes",
        100.0 * cpu / wall,
        BUDGET * 100.0,
        BUDGET * wall + slack,
        v("hugelab_exporter_scans_total"),
        (read as u64 * PAGE) >> 20,
        v("hugelab_exporter_scan_cpu_seconds"),
        v("hugelab_exporter_scan_duration_seconds"),
        v("hugelab_exporter_scan_wait_seconds"),
        v("hugelab_exporter_scan_processes"),
    );
    assert!(
        v("hugelab_exporter_scans_total") >= 1.0,
        "no complete scan in 5 intervals:\n{body}"
    );
    assert!(
        read >= (thp / PAGE) as f64,
        "the last scan read {read} pages, fewer than the process's {} THP pages",
        thp / PAGE
    );
    let held = sum(
        &samples,
        "hugelab_cgroup_anon_folio_bytes",
        &[("cgroup", cg), ("size", "2048kB")],
    );
    assert!(
        held >= thp as f64,
        "{cg} holds {held} bytes of THPs by the scan, not {thp}"
    );
    assert!(cpu <= BUDGET * wall + slack, "{cpu} s of CPU in {wall} s");
    assert!(
        (own - cpu).abs() < 0.1 + 0.01 * wall,
        "its own count {own} s, /proc's {cpu} s"
    );
    pid
}

#[test]
fn the_textfile_is_written_whole_after_a_scan() {
    if let Some(why) = common::cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = common::state_dir("exporter-textfile");
    let o = common::run(&[
        "exporter",
        "--textfile",
        dir.to_str().unwrap(),
        "--once",
        "--interval",
        "1s",
        "--cpu-budget",
        "100",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let names: Vec<String> = std::fs::read_dir(&*dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["hugelab.prom"], "only the file, no temporary one");
    let text = std::fs::read_to_string(dir.join("hugelab.prom")).unwrap();
    let samples = parse_exposition(&text).unwrap_or_else(|why| panic!("{why}"));
    // After a complete scan: its figures, and this test's own cgroup.
    assert!(sum(&samples, "hugelab_exporter_scans_total", &[]) >= 1.0);
    let me = cgroup_label(std::process::id() as i32);
    assert!(
        sum(&samples, "hugelab_cgroup_processes", &[("cgroup", &me)]) >= 1.0,
        "{me}:\n{text}"
    );
    promtool(&text);
}

/// One sentence, exit 2, for each bad argument.
#[test]
fn bad_arguments_are_refused_in_one_sentence() {
    let file = common::TempWorkload::new("");
    for (args, says) in [
        (
            vec!["--listen", "localhost"],
            "--listen \"localhost\" is not an address and port",
        ),
        (vec!["--interval", "0s"], "at least 1s apart"),
        (
            vec!["--interval", "soon"],
            "--interval \"soon\" is not a duration",
        ),
        (vec!["--cpu-budget", "0"], "above 0 and at most 100"),
        (vec!["--cpu-budget", "250"], "above 0 and at most 100"),
        (
            vec!["--textfile", "/nonexistent-hugelab"],
            "there is no such directory",
        ),
        (vec!["--textfile", file.path()], "it is not a directory"),
    ] {
        let mut all = vec!["exporter"];
        all.extend(&args);
        let o = common::run(&all);
        let err = common::stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(says) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
    common::assert_refused_as_nobody(&["exporter"]);
}

#[test]
fn a_port_in_use_and_an_unwritable_directory_are_named() {
    if let Some(why) = common::cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = common::run(&["exporter", "--listen", &addr]);
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("{addr} is in use by another program")),
        "{err}"
    );
    // Root may write anywhere but where the kernel refuses everyone.
    let o = common::run(&["exporter", "--textfile", "/sys", "--once"]);
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--textfile /sys: cannot write there"), "{err}");
}

/// A Prometheus server (Debian's package) on a free loopback port, with a
/// generated configuration scraping one target every second and its storage
/// in a directory of the test's own. Dropped on every exit path of the test:
/// killed, reaped, and its directory removed.
struct Prometheus {
    child: Child,
    addr: String,
    dir: common::StateDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = common::state_dir("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: hugelab\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        // A free port: the kernel's pick, let go just before Prometheus binds it.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .to_string();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus runs once its package is installed");
        let p = Prometheus { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(http_get(&p.addr, "/-/ready"), Ok((s, _, _)) if s.contains(" 200 ")) {
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready in 60 s:\n{}",
                std::fs::read_to_string(p.dir.join("prometheus.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// The value of `promql` (an instant query of one series) through the
    /// HTTP API, or None while the result is empty.
    fn query(&self, promql: &str) -> Option<f64> {
        let encoded: String = promql
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body, _) = http_get(&self.addr, &format!("/api/v1/query?query={encoded}"))
            .unwrap_or_else(|e| panic!("Prometheus's API: {e}"));
        assert!(status.contains(" 200 "), "{promql}: {status}\n{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{body}");
        let result = v["data"]["result"].as_array().unwrap();
        assert!(result.len() <= 1, "{promql}: more than one series: {body}");
        let value = result.first()?["value"][1].as_str().unwrap();
        Some(value.parse().unwrap())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Processes whose command line mentions `text`.
fn processes_naming(text: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            e.file_name().to_str()?.parse::<u32>().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(text).then_some(cmd)
        })
        .collect()
}

/// The test: a real Prometheus scrapes the exporter every second,
/// and its HTTP API is queried until the per-cgroup zero-filled figure is the
/// one the workload's writes leave (1428 subpages of 4 KiB); then both are
/// stopped and no process of either is left.
#[test]
fn prometheus_scrapes_a_cgroups_zero_filled_thp_memory() {
    if let Some(why) = common::cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    if let Err(why) = common::test_package("prometheus") {
        eprintln!("skipped: {why}");
        return;
    }
    with_known_thps("exporter-prometheus", |pid| {
        let cg = cgroup_label(pid);
        let zero = (ZERO.iter().sum::<u64>() * PAGE) as f64;
        let query = format!(
            "sum(hugelab_cgroup_thp_utilization_zero_filled_bytes{{cgroup=\"{}\"}})",
            cg.replace('\\', "\\\\").replace('"', "\\\"")
        );
        let (pids, dir) = {
            let e = Exporter::every_second("50");
            let p = Prometheus::start(&e.addr);
            let start = Instant::now();
            let mut got = None;
            while got != Some(zero) {
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "Prometheus read {got:?} for {query}, not {zero}, for 120 s"
                );
                std::thread::sleep(Duration::from_millis(500));
                got = p.query(&query);
            }
            assert_eq!(p.query("up{job=\"hugelab\"}"), Some(1.0));
            println!(
                "Prometheus had {query} = {zero} after {:.1} s",
                start.elapsed().as_secs_f64()
            );
            (
                [e.child.id(), p.child.id()],
                p.dir.to_string_lossy().into_owned(),
            )
        };
        for pid in pids {
            assert!(
                !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "process {pid} is still there"
            );
        }
        assert_eq!(processes_naming(&dir), Vec::<String>::new());
        assert!(!std::path::Path::new(&dir).exists(), "{dir} is left");
    });
}
