//! `hugelab scan` against the real kernel: a process with THPs of known
//! utilization; the scan must read exactly the zero-filled subpages the
//! workload left, must not change the process, and its prediction of the
//! under-used shrinker must come true when the shrinker runs.
//!
//! The expected figures come from what the workload writes and from Linux
//! 6.18's rules (mm/huge_memory.c `thp_underused`, `deferred_split_scan`),
//! never from the model; the kernel's own counters (smaps Rss,
//! thp_underused_split_page) are the judge.

mod common;

use hugelab_kernel::scan::{self, ScanOptions};
use hugelab_kernel::KernelBackend;
use hugelab_workload::utilization::{utilization_report, FolioUse, HPAGE_PMD_ORDER};
use hugelab_workload::{stmt, Backend, Stmt, StmtKind, Workload};
use std::path::PathBuf;

/// Seven THPs of 2 MiB (x86-64) at max_ptes_none 409, each written as
/// noted; T5 then loses its last 4 KiB to munmap (partially mapped).
const WORKLOAD: &str = concat!(
    pmd_thp_at_409!(),
    "\
set transparent_hugepage/use_zero_page 1
spawn a
a mmap buf 14M align=2M
a madvise buf HUGEPAGE
a write buf:2M step=512K
a write buf+2M:2M
a write buf+4M:412K
a write buf+6M:408K
a write buf+8M:4K
a write buf+10M:400K
a munmap buf+12284K:4K
a write buf+12M:2M step=8K
snapshot before
reclaim
snapshot after
set transparent_hugepage/khugepaged/max_ptes_none 100
snapshot lowered
reclaim
snapshot again
"
);

/// (zero-filled subpages, mapped subpages) of T0..T6, from the writes above:
/// 4, 512, 103, 102, 1, 100 and 256 pages written.
const KNOWN: [(u32, u32); 7] = [
    (508, 512),
    (0, 512),
    (409, 512),
    (410, 512),
    (511, 512),
    (411, 511),
    (256, 512),
];

/// One kernel backend at a time in this binary (a process may hold one
/// settings guard), with its own state directory.
static KERNEL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn kernel_state() -> (std::sync::MutexGuard<'static, ()>, PathBuf) {
    let lock = KERNEL.lock().unwrap_or_else(|p| p.into_inner());
    let state = std::env::temp_dir().join(format!("hugelab-test-scan-{}", std::process::id()));
    std::fs::create_dir_all(&state).unwrap();
    // The backend's guard reads it; every test of this binary sets the same.
    std::env::set_var("HUGELAB_STATE_DIR", &state);
    (lock, state)
}

fn cannot_run() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    let f = "/sys/kernel/mm/transparent_hugepage/shrink_underused";
    if !std::path::Path::new(f).exists() {
        return Some(format!("{f} does not exist (Linux < 6.12)"));
    }
    None
}

/// smaps of the process and its pagemap over the region: what a scan must
/// leave exactly as it found it.
fn fingerprint(pid: i32, start: u64, len: u64) -> (String, Vec<u8>) {
    use std::os::unix::fs::FileExt;
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let pm = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut buf = vec![0u8; (len / 4096 * 8) as usize];
    pm.read_exact_at(&mut buf, start / 4096 * 8).unwrap();
    (smaps, buf)
}

fn counter(kb: &mut KernelBackend, name: &str) -> i64 {
    let r = kb.read().expect("the kernel backend reads its counters");
    *r.counters
        .get(name)
        .unwrap_or_else(|| panic!("{name} was not read: {:?}", r.unknown.get(name)))
}

fn run_until(kb: &mut KernelBackend, stmts: &[Stmt], label: &str) -> usize {
    for (i, s) in stmts.iter().enumerate() {
        match &s.kind {
            StmtKind::Snapshot(stmt::Snapshot { label: l }) if l == label => return i + 1,
            StmtKind::Snapshot { .. } | StmtKind::Expect { .. } | StmtKind::ExpectErrno { .. } => {}
            _ => kb
                .execute(s)
                .unwrap_or_else(|e| panic!("line {}: {e:?}", s.pos.line)),
        }
    }
    panic!("no snapshot {label}");
}

#[test]
fn scan_predicts_what_the_underused_shrinker_gives_back() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let (_one_at_a_time, state) = kernel_state();
    let workload: Workload = hugelab_workload::parse("scan-test.hlw", WORKLOAD).unwrap();
    let mut kb = KernelBackend::new(PathBuf::from(env!("CARGO_BIN_EXE_hugelab"))).unwrap();
    kb.prepare(&hugelab_workload::Lookahead::of(&workload.stmts))
        .unwrap();
    let stmts = &workload.stmts;
    let mut at = run_until(&mut kb, stmts, "before");

    let procs = kb.processes();
    let pid = &procs[0].pid;
    let (start, len) = procs[0].regions["buf"];
    let whole = ScanOptions {
        content: true,
        cont_orders: vec![4],
        range: None,
        threads: 0,
        pace: None,
    };
    let seen = fingerprint(*pid, start, len);
    scan::scan_process(*pid, &whole).unwrap();
    assert_eq!(
        fingerprint(*pid, start, len),
        seen,
        "the scan changed the process"
    );
    // From here on the region alone: the agent's own memory may read 0 in
    // kpageflags too, and must not be taken for T5.
    let opts = ScanOptions {
        range: Some((start, start + len)),
        ..whole
    };
    let s = scan::scan_process(*pid, &opts).unwrap();

    // Utilization against the known content. kpageflags reads 0 for some
    // memory on these VMs: a PTE-mapped THP there is unclassified, and
    // then the test cannot check it.
    let thps: Vec<&FolioUse> = s
        .folios
        .iter()
        .filter(|f| f.order == HPAGE_PMD_ORDER)
        .collect();
    let mut got: Vec<(u32, u32)> = thps.iter().map(|f| (f.zero, f.mapped)).collect();
    got.sort_unstable();
    let mut want = KNOWN.to_vec();
    want.sort_unstable();
    // The six PMD-mapped THPs are classified from PAGEMAP_SCAN alone; T5,
    // PTE-mapped, needs kpageflags, which reads 0 for some 2 MiB blocks on
    // these VMs: then all its 511 mapped pages are unclassified, and the
    // scan says so instead of guessing.
    let t5_seen = s.unclassified_kb() == 0;
    if !t5_seen {
        eprintln!("T5 unclassified (kpageflags reads 0 for its block)");
        assert_eq!(s.unclassified_kb(), 511 * 4);
        want.retain(|w| *w != KNOWN[5]);
    }
    assert_eq!(got, want, "zero-filled and mapped subpages of each THP");
    assert_eq!(
        thps.iter().filter(|f| f.pmd_mapped).count(),
        6,
        "T5 alone lost its PMD"
    );

    let settings = scan::shrinker_settings().unwrap();
    assert_eq!(settings.max_ptes_none, 409);
    let report = utilization_report(s.folios.iter(), settings, 10);
    // T0, T3, T4 under-used (more than 409 zero-filled), T5 partially mapped.
    assert_eq!(report.give_back.underused_folios, 3);
    assert_eq!(report.give_back.underused_kb, (508 + 410 + 511) * 4);
    let t5_kb = 411 * 4;
    assert_eq!(report.give_back.partial_folios, u64::from(t5_seen));
    assert_eq!(report.give_back.partial_kb, if t5_seen { t5_kb } else { 0 });

    // The real shrinker: Rss drops by exactly the prediction.
    let rss = "smaps.a.buf.Rss";
    let splits = "vmstat.thp_underused_split_page";
    let (rss0, splits0) = (counter(&mut kb, rss), counter(&mut kb, splits));
    at += run_until(&mut kb, &stmts[at..], "after");
    let (rss1, splits1) = (counter(&mut kb, rss), counter(&mut kb, splits));
    // An unclassified T5 is missing from the prediction by exactly its
    // zero-filled pages (the kernel splits it all the same).
    let unseen = if t5_seen { 0 } else { t5_kb };
    assert_eq!(
        (rss0 - rss1) as u64,
        report.give_back.rss_kb + unseen,
        "predicted give-back vs measured Rss drop"
    );
    assert_eq!(
        (splits1 - splits0) as u64,
        report.give_back.underused_folios
    );

    // The shrinker examines a fully mapped THP once: T2 (409 zero-filled)
    // and T6 (256) were kept at 409 and left the queue, so at 100 they
    // would qualify, yet the kernel does not look at them again. The
    // prediction says what would happen if they were still queued.
    at += run_until(&mut kb, &stmts[at..], "lowered");
    let s = scan::scan_process(*pid, &opts).unwrap();
    let report = utilization_report(s.folios.iter(), scan::shrinker_settings().unwrap(), 10);
    assert_eq!(report.give_back.underused_folios, 2);
    run_until(&mut kb, &stmts[at..], "again");
    assert_eq!(
        counter(&mut kb, rss),
        rss1,
        "an examined THP was split again"
    );
    assert_eq!(counter(&mut kb, splits), splits1);

    kb.finish().unwrap();
    let _ = std::fs::remove_dir_all(&state);
}

/// Bad input: one sentence on stderr, exit 2, nothing on stdout.
#[test]
fn bad_scan_arguments_are_one_sentence() {
    let cases: [(&[&str], &str); 8] = [
        (&["scan"], "say what to scan"),
        (&["scan", "--pid", "1", "--all"], "exactly one"),
        (&["scan", "--pid", "1", "--cont", "12K"], "--cont 12K"),
        (&["scan", "--pid", "1", "--buckets", "0"], "--buckets"),
        (
            &["scan", "--pid", "1", "--max-ptes-none", "600"],
            "0 to 511",
        ),
        // No contents, no histogram to draw.
        (
            &[
                "scan",
                "--pid",
                "1",
                "--shape-only",
                "--svg",
                "/tmp/never.svg",
            ],
            "needs the page contents that --shape-only does not read",
        ),
        // --rollup prints no process or VMA on its own to choose from.
        (
            &["scan", "--all", "--rollup", "--top", "3"],
            "--top chooses what is printed per process, and --rollup prints one summary",
        ),
        (
            &["scan", "--pid", "1", "--rollup", "--vmas"],
            "--vmas chooses what is printed per process",
        ),
    ];
    for (args, want) in cases {
        let out = common::run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_user_who_is_not_root_is_told_so() {
    common::assert_refused_as_nobody(&["scan", "--pid", "1"]);
}

#[test]
fn a_process_that_does_not_exist_is_named() {
    if cannot_run().is_some() {
        return;
    }
    // pid_max is at most 2^22: this pid cannot exist.
    let out = common::run(&["scan", "--pid", "9999999"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("process 9999999 does not exist"), "{err}");
}

/// The bimodal workload at `before`: the model's report and the live scan of
/// the kernel's processes agree, and both predict the give-back derived in
/// the workload's header from Linux 6.18 (whose `expect` lines, checked by
/// the kernel test's `hugelab diff`, show the kernel's Rss dropping by it).
#[test]
fn model_and_kernel_reports_agree_on_the_bimodal_workload() {
    if cannot_run().is_some() {
        return;
    }
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../workloads/bimodal-utilization.hlw"
    );
    let out = common::run(&[
        "utilization",
        file,
        "--snapshot",
        "before",
        "--backend",
        "both",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (model, kernel) = (&v["model"], &v["kernel"]);
    for r in [model, kernel] {
        assert_eq!(r["give_back"]["underused_folios"], 16);
        assert_eq!(r["give_back"]["underused_kb"], 32084);
        let b = &r["sizes"][0]["buckets"];
        assert_eq!(
            (&b[0]["folios"], &b[2]["folios"], &b[9]["folios"]),
            (&15.into(), &2.into(), &13.into())
        );
    }
    assert_eq!(model["sizes"], kernel["sizes"]);
}

/// Two processes: `a` with four THPs (T0 written whole, T1 and T3 at one
/// page, T2 whole and then fragmented by 40 mprotects into 81 VMAs), `b`
/// with one THP written at two pages.
fn fragmented_workload() -> String {
    let mut w = String::from(concat!(
        pmd_thp_at_409!(),
        "\
spawn a
a mmap buf 8M align=2M
a madvise buf HUGEPAGE
a write buf:2M
a write buf+2M:4K
a write buf+4M:2M
a write buf+6M:4K
"
    ));
    for k in 0..40 {
        w.push_str(&format!("a mprotect buf+{}K:4K r\n", 4096 + 8 + 16 * k));
    }
    w.push_str(
        "spawn b\nb mmap buf 2M align=2M\nb madvise buf HUGEPAGE\nb write buf:8K\nsnapshot ready\n",
    );
    w
}

/// What `hugelab scan` prints, conclusion first: processes ranked by what
/// the shrinker would give back (thp_underused at max_ptes_none 409: a's T1
/// and T3 with 511 zero-filled subpages each, 4088 kB; b's THP with 510,
/// 2040 kB), each process's verdict before its histogram, its figures
/// before its VMAs, and 10 of a's 81 fragmented VMAs unless --vmas;
/// --shape-only shows no histogram; the SVG draws the threshold.
#[test]
fn scan_output_ranks_processes_and_puts_the_verdict_first() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let (_one_at_a_time, state) = kernel_state();
    let text = fragmented_workload();
    let workload: Workload = hugelab_workload::parse("fragmented.hlw", &text).unwrap();
    let mut kb = KernelBackend::new(PathBuf::from(env!("CARGO_BIN_EXE_hugelab"))).unwrap();
    kb.prepare(&hugelab_workload::Lookahead::of(&workload.stmts))
        .unwrap();
    run_until(&mut kb, &workload.stmts, "ready");
    let procs = kb.processes();
    let pid = |name: &str| {
        procs
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.pid.to_string())
            .unwrap()
    };
    let (a, b) = (pid("a"), pid("b"));
    let scan = |extra: &[&str]| {
        let mut args = vec!["scan", "--pid", &b, "--pid", &a];
        args.extend_from_slice(extra);
        let o = common::run(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", common::stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let check = || -> Result<(), String> {
        let out = scan(&[]);
        let at = |what: &str| {
            out.find(what)
                .ok_or_else(|| format!("no {what:?} in:\n{out}"))
        };
        // The ranking first: a (4088 kB) above b (2040 kB), as given last.
        let ranked = at("2 processes scanned, ranked by what the deferred split shrinker")?;
        let row_a = at(&format!("| {a} "))?;
        let row_b = at(&format!("| {b} "))?;
        let block_a = at(&format!("process {a} ("))?;
        let block_b = at(&format!("process {b} ("))?;
        let order = [ranked, row_a, row_b, block_a, block_b];
        if !order.windows(2).all(|w| w[0] < w[1]) {
            return Err(format!("ranking then a then b, got {order:?}:\n{out}"));
        }
        let of_a = &out[block_a..block_b];
        let find = |what: &str| {
            of_a.find(what)
                .ok_or_else(|| format!("no {what:?} in a's block:\n{of_a}"))
        };
        let verdict = find("it would split 2 THPs as under-used")?;
        let histogram = find("| 0-50 ")?;
        let figures = find("| anon-thp-")?;
        // 81 VMAs with THP memory: T2's 2M cut by the mprotects. VMAs whose
        // only memory kpageflags reads 0 for (whole 2 MiB blocks, on some
        // VMs) are counted apart; T2 is PTE-mapped, so if its block reads 0
        // its VMAs are among those.
        let vmas = find(" VMAs with THP memory")?;
        let vmas = of_a[..vmas].rfind('\n').map_or(0, |i| i + 1);
        let head = of_a[vmas..].lines().next().unwrap_or("");
        let number_before = |what: &str| -> usize {
            head.split_once(what)
                .and_then(|(l, _)| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0)
        };
        let (thp, unclassified) = (
            number_before(" VMAs with THP memory"),
            number_before(" with only memory kpageflags"),
        );
        let more = head
            .split_once("in address order (")
            .and_then(|(_, r)| r.split_once(" more")?.0.parse::<usize>().ok());
        // Besides T2's anonymous VMAs, the agent's own binary may sit in
        // large page-cache folios (file THP), as the page cache happens to
        // hold it: those VMAs count too, so the anonymous ones are counted
        // from --vmas below.
        let t2_unclassified = thp < 81 && thp + unclassified >= 81;
        if t2_unclassified {
            eprintln!("T2's VMAs not counted: kpageflags reads 0 for its block ({head})");
        } else if thp < 81 {
            return Err(format!("VMA line {head:?}:\n{of_a}"));
        }
        if !head.contains("the 10 with the most") || more != Some(thp + unclassified - 10) {
            return Err(format!("VMA line {head:?}:\n{of_a}"));
        }
        if !(verdict < histogram && histogram < figures && figures < vmas) {
            return Err(format!("verdict, histogram, figures, VMAs:\n{of_a}"));
        }
        let vma_rows = of_a[vmas..]
            .lines()
            .filter(|l| l.contains(" r-") || l.contains(" rw"))
            .count();
        if !(10..=40).contains(&vma_rows) {
            return Err(format!("{vma_rows} VMA rows:\n{of_a}"));
        }
        // Every VMA with --vmas.
        let all = scan(&["--vmas"]);
        let all_a = match (
            all.find(&format!("process {a} (")),
            all.find(&format!("process {b} (")),
        ) {
            (Some(i), Some(j)) if i < j => &all[i..j],
            _ => return Err(format!("--vmas: a then b:\n{all}")),
        };
        let anon_thp_vmas: std::collections::BTreeSet<&str> = all_a
            .lines()
            .filter_map(|l| {
                // A VMA row: | VMA | figure | kB | % |.
                let mut cells = l.split('|').skip(1);
                let (vma, figure) = (cells.next()?, cells.next()?);
                figure.trim().starts_with("anon-thp-").then_some(vma)
            })
            .collect();
        if !all.contains(&format!("by VMA ({thp} with THP memory"))
            || (!t2_unclassified && anon_thp_vmas.len() != 81)
        {
            return Err(format!(
                "--vmas: {} VMAs with anon THP:\n{all}",
                anon_thp_vmas.len()
            ));
        }
        // --top 1: a alone, and a line on b.
        let top = scan(&["--top", "1"]);
        if top.contains(&format!("process {b} ("))
            || !top.contains("1 more process wastes less and is left out")
        {
            return Err(format!("--top 1:\n{top}"));
        }
        let json: serde_json::Value =
            serde_json::from_str(&scan(&["--json", "--top", "1"])).unwrap();
        if json["processes"].as_array().map(Vec::len) != Some(1)
            || json["processes"][0]["pid"].as_i64() != a.parse().ok()
            || json["processes_left_out"] != 1
        {
            return Err(format!("--json --top 1: {json}"));
        }
        // No contents, no histogram, in text or JSON.
        let shape = scan(&["--shape-only"]);
        for fake in [
            "used subpages",
            "zero-filled",
            "Deferred split shrinker at",
            "| 0-50",
        ] {
            if shape.contains(fake) {
                return Err(format!("--shape-only shows {fake:?}:\n{shape}"));
            }
        }
        if !shape.contains("2 processes scanned, ranked by THP memory") {
            return Err(format!("--shape-only:\n{shape}"));
        }
        let shape_json = scan(&["--shape-only", "--json"]);
        if shape_json.contains("\"utilization\"") || shape_json.contains("\"buckets\"") {
            return Err(format!("--shape-only --json:\n{shape_json}"));
        }
        // The SVG: its title names the processes; the threshold at 409
        // (under-used below 512 - 409 = 103 subpages in use) and the give-back
        // of all three under-used THPs, (511 + 511 + 510) * 4 kB = 6.0 MiB.
        let svg = state.join("scan.svg");
        scan(&["--max-ptes-none", "409", "--svg", svg.to_str().unwrap()]);
        let drawn = std::fs::read_to_string(&svg).unwrap();
        for want in [
            format!("scan of processes {b} ("),
            "max_ptes_none=409: under-used below 103 subpages in use".to_string(),
            "the shrinker splits 3 THPs and gives back 6.0 MiB".to_string(),
        ] {
            if !drawn.contains(&want) {
                return Err(format!("no {want:?} in the SVG"));
            }
        }
        Ok(())
    };
    let result = check();
    kb.finish().unwrap();
    let _ = std::fs::remove_dir_all(&state);
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// `scan --all`: processes ranked by waste, --top of them shown, and how
/// many were left out.
#[test]
fn scan_all_is_ranked_and_says_how_many_it_left_out() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let o = common::run(&["scan", "--all", "--json", "--top", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let procs = v["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 3, "{v}");
    assert!(v["processes_left_out"].as_u64().unwrap() > 0, "{v}");
    // Ranked by what the shrinker gives back (freed_kb) first.
    let give_back =
        |p: &serde_json::Value| p["utilization"]["give_back"]["freed_kb"].as_u64().unwrap();
    let g: Vec<u64> = procs.iter().map(give_back).collect();
    assert!(g.windows(2).all(|w| w[0] >= w[1]), "not ranked: {g:?}");
    let o = common::run(&["scan", "--all", "--top", "2"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(" processes scanned, ranked by"), "{out}");
    assert!(
        out.contains(" more processes waste less and are left out")
            || out.contains("1 more process wastes less and is left out"),
        "{out}"
    );
    assert_eq!(out.matches("THP utilization: process ").count(), 2, "{out}");
}
