//! `hugelab predict`: its figures on small workloads, derived by hand from
//! what Linux 6.18 does (mm/memory.c, mm/huge_memory.c, mm/memcontrol.c),
//! not from the model's output; parallel runs equal to sequential ones; and
//! each bad input refused in one sentence with nothing on stdout.

mod common;
use common::TempWorkload;

use serde_json::Value;
use std::process::{Command, Output};

fn predict(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .arg("predict")
        .args(args)
        .output()
        .expect("the hugelab binary runs")
}

/// `predict --json` of `args`, which must succeed.
fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let o = predict(&all);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    serde_json::from_slice(&o.stdout).expect("predict --json prints JSON")
}

/// The figures of `setting` in a `--json` document.
fn figures<'a>(doc: &'a Value, setting: &str) -> &'a Value {
    doc["settings"]
        .as_array()
        .expect("a settings array")
        .iter()
        .find(|s| s["setting"] == setting)
        .map(|s| &s["figures"])
        .unwrap_or_else(|| panic!("no setting {setting}: {doc}"))
}

/// kB in folios of `size` at the peak.
fn at_peak(f: &Value, size: &str) -> i64 {
    f["peak_mapped"]["by_size"]
        .as_array()
        .expect("by_size")
        .iter()
        .find(|s| s["size"] == size)
        .map_or(0, |s| s["value"].as_i64().unwrap())
}

/// A refused run: exit 2, nothing on stdout, one line on stderr.
fn refused(args: &[&str]) -> String {
    let o = predict(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

const NEVER: &str = "4K:transparent_hugepage/enabled=never";
const PMD: &str = "PMD:transparent_hugepage/enabled=always";

/// 4 MiB written, 2 MiB-aligned: at 4K every page faults (4M / 4K = 1024
/// faults), with PMD THP one fault per 2M (2); either way 4096 kB mapped,
/// under PMD all of it AnonHugePages in two 2M folios. The cgroup holds the
/// same 4096 kB of anonymous memory.
#[test]
fn four_mib_written_at_4k_and_at_pmd() {
    let w = TempWorkload::new("spawn a\na mmap buf 4M align=2M\na write buf\n");
    let doc = json(&[w.path(), "--setting", NEVER, "--setting", PMD]);
    let (k4, pmd) = (figures(&doc, "4K"), figures(&doc, "PMD"));
    assert_eq!(k4["page_faults"], 1024);
    assert_eq!(pmd["page_faults"], 2);
    for f in [k4, pmd] {
        assert_eq!(f["peak_mapped"]["rss_anon_kb"], 4096);
        assert_eq!(f["peak_charged"]["anon_kb"], 4096);
        assert_eq!(f["oom_kills"], 0);
    }
    assert_eq!(k4["peak_mapped"]["anon_huge_kb"], 0);
    assert_eq!(at_peak(k4, "4kB"), 4096);
    assert_eq!(pmd["peak_mapped"]["anon_huge_kb"], 4096);
    assert_eq!(at_peak(pmd, "2048kB"), 4096);
    assert_eq!(at_peak(pmd, "4kB"), 0);
    // The table says the same, with the change against the first setting:
    // (2 - 1024) / 1024 = -99.8 %.
    let o = predict(&[w.path(), "--setting", NEVER, "--setting", PMD]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| PMD "), "{out}");
    assert!(out.contains("2 (-99.8%)"), "{out}");
}

/// memory.max=2M and 4 MiB written at 4K: no swap, nothing to reclaim, so
/// the order-0 charge that finds the limit reached calls the OOM killer,
/// which kills the only process: one OOM kill, and the cgroup never holds
/// more than its 2048 kB (page tables included).
#[test]
fn a_limit_below_what_the_program_writes_is_one_oom_kill() {
    let w = TempWorkload::new("spawn a\na mmap buf 4M align=2M\na write buf\n");
    let limited = "small:transparent_hugepage/enabled=never,memory.max=2M";
    let doc = json(&[w.path(), "--setting", NEVER, "--setting", limited]);
    assert_eq!(figures(&doc, "4K")["oom_kills"], 0);
    let f = figures(&doc, "small");
    assert_eq!(f["oom_kills"], 1);
    assert!(
        f["peak_charged"]["peak_kb"].as_i64().unwrap() <= 2048,
        "{f}"
    );
    assert!(
        f["peak_mapped"]["rss_anon_kb"].as_i64().unwrap() < 2048,
        "{f}"
    );
    let settings = doc["settings"].as_array().unwrap();
    assert_eq!(settings[1]["memory_max"], "2M");
}

/// A THP half given back by MADV_DONTNEED: RssAnon falls by half at once,
/// but the folio stays charged whole on the deferred split queue. 2 MiB
/// written as a THP, its second 1 MiB dropped, then 1 MiB written in a
/// region too small for a THP: the processes map at most 2048 kB at once,
/// the cgroup holds 2048 + 1024 = 3072 kB. At 4K pages the dropped pages
/// are freed at once, and both views peak at 2048 kB.
#[test]
fn madv_dontneed_of_half_a_thp_leaves_rss_but_not_the_cgroup() {
    let w = TempWorkload::new(
        "spawn a\n\
         a mmap thp 2M align=2M\n\
         a write thp\n\
         a madvise thp+1M:1M DONTNEED\n\
         a mmap small 1M\n\
         a write small\n",
    );
    let doc = json(&[w.path(), "--setting", NEVER, "--setting", PMD]);
    let pmd = figures(&doc, "PMD");
    assert_eq!(pmd["peak_mapped"]["rss_anon_kb"], 2048);
    assert_eq!(pmd["peak_charged"]["anon_kb"], 3072);
    let k4 = figures(&doc, "4K");
    assert_eq!(k4["peak_mapped"]["rss_anon_kb"], 2048);
    assert_eq!(k4["peak_charged"]["anon_kb"], 2048);
}

/// A page shared by fork counts in both processes' RssAnon but is charged
/// once: 1 MiB written, then forked: the sum of RssAnon is 2048 kB, the
/// cgroup holds 1024 kB.
#[test]
fn fork_doubles_rss_not_the_charge() {
    let w = TempWorkload::new("spawn a\na mmap buf 1M\na write buf\na fork b\n");
    let doc = json(&[w.path(), "--setting", NEVER]);
    let f = figures(&doc, "4K");
    assert_eq!(f["peak_mapped"]["rss_anon_kb"], 2048);
    assert_eq!(f["peak_mapped"]["anon_kb"], 1024);
    assert_eq!(f["peak_charged"]["anon_kb"], 1024);
}

/// Settings on threads give what they give one after the other.
#[test]
fn parallel_equals_sequential() {
    let w = TempWorkload::new(
        "spawn a\n\
         a mmap buf 8M align=2M\n\
         a write buf\n\
         a madvise buf+1M:3M DONTNEED\n\
         a fork b\n\
         b write buf+4M:2M\n\
         a mmap heap 3M\n\
         a write heap\n\
         b exit\n\
         sleep 20s\n",
    );
    let args = [
        w.path(),
        "--setting",
        NEVER,
        "--setting",
        "64K:transparent_hugepage/enabled=never,transparent_hugepage/hugepages-64kB/enabled=always",
        "--setting",
        PMD,
        "--setting",
        "PMD-2M:transparent_hugepage/enabled=always,memory.max=6M",
    ];
    let mut one = args.to_vec();
    one.extend(["--jobs", "1"]);
    let mut four = args.to_vec();
    four.extend(["--jobs", "4"]);
    assert_eq!(json(&one), json(&four));
}

/// The recording's header: the THP settings files a process read, and a
/// clock that lets khugepaged run (scan_sleep_millisecs is 10 s by default;
/// the workload sleeps 20 s) under a setting that enables the PMD size.
#[test]
fn what_a_recording_cannot_carry_is_said() {
    let w = TempWorkload::new(
        "# A program recorded by `hugelab record` on 2026-11-27T17:38:59Z, Linux 6.18.44, with THP off for its whole tree:\n\
         #   ./prog\n\
         # 3 events in 0.001 s: 1 page faults, 1 processes, 0 threads, 0 execs.\n\
         # THP settings read by the program: prog transparent_hugepage/enabled\n\
         spawn prog\n\
         prog mmap buf 64K\n\
         prog write buf\n\
         sleep 20s\n",
    );
    let o = predict(&[w.path(), "--setting", NEVER, "--setting", PMD]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(
        "note: prog read transparent_hugepage/enabled while recorded: a program that adapts to \
         the setting it sees behaves here as it did under the recording's (THP off)"
    ), "{out}");
    let clock: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("follow the recording's clock"))
        .collect();
    assert_eq!(clock.len(), 1, "{out}");
    assert!(
        clock[0].contains("under PMD") && !clock[0].contains("4K"),
        "{out}"
    );
    let doc = json(&[w.path(), "--setting", NEVER]);
    assert_eq!(doc["recorded"]["kernel"], "6.18.44");
    assert!(!doc["notes"].to_string().contains("clock"), "{doc}");
}

#[test]
fn why_and_plot() {
    let w = TempWorkload::new("spawn a\na mmap buf 4M align=2M\na write buf\n");
    let svg = std::env::temp_dir().join(format!("hugelab-predict-{}.svg", std::process::id()));
    let svg_path = svg.to_str().unwrap();
    let o = predict(&[
        w.path(),
        "--setting",
        NEVER,
        "--setting",
        PMD,
        "--why",
        "--plot",
        svg_path,
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0));
    // 1024 faults in buf at 4K, 2 with PMD: 1022 fewer, because the PMD
    // fault path mapped a 2M folio.
    assert!(out.contains("Why PMD differs from 4K:"), "{out}");
    assert!(
        out.contains("a buf: 1024 faults under 4K, 2 under PMD (-1022)"),
        "{out}"
    );
    assert!(
        out.contains("mapped a 2M folio") || out.contains("2M"),
        "{out}"
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_file(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{text}");
    assert!(text.contains("page faults") && text.contains("PMD"));
}

#[test]
fn bad_input_is_one_sentence() {
    let w = TempWorkload::new("spawn a\na mmap buf 4M\na write buf\n");
    let err = refused(&[
        w.path(),
        "--setting",
        "x:transparent_hugepage/enable=always",
    ]);
    assert!(
        err.contains("unknown tunable 'transparent_hugepage/enable'"),
        "{err}"
    );
    let err = refused(&[
        w.path(),
        "--setting",
        "x:transparent_hugepage/enabled=sometimes",
    ]);
    assert!(err.contains("bad value 'sometimes'"), "{err}");
    let err = refused(&[w.path(), "--setting", "x:memory.max=lots"]);
    assert!(
        err.contains("memory.max") && err.contains("'lots'"),
        "{err}"
    );
    let err = refused(&[w.path(), "--setting", "x:memory.max=1M,memory.max=2M"]);
    assert!(err.contains("sets memory.max twice"), "{err}");
    let err = refused(&[w.path(), "--setting", NEVER, "--setting", NEVER]);
    assert!(err.contains("the name '4K' is already used"), "{err}");
    let err = refused(&[w.path(), "--jobs", "0"]);
    assert!(err.contains("--jobs 0"), "{err}");
    let own = TempWorkload::new("cgroup predicted\nspawn a cgroup=predicted\n");
    let err = refused(&[own.path(), "--setting", NEVER]);
    assert!(err.contains("cgroup 'predicted' already exists"), "{err}");
    let err = refused(&["/nonexistent/x.hlw"]);
    assert!(err.contains("no such workload file"), "{err}");

    let other = TempWorkload::new(
        "# A program recorded by `hugelab record` on 2026-01-01T00:00:00Z, Linux 6.12.9, with THP off for its whole tree:\n\
         #   ./prog\n\
         spawn prog\n",
    );
    let err = refused(&[other.path()]);
    assert!(
        err.contains("Linux 6.12.9") && err.contains("Linux 6.18"),
        "{err}"
    );

    // A .zst cut short: the frame ends early.
    let text: String = (0..20000)
        .map(|i| format!("a mmap r{i} 4K\na write r{i}\n"))
        .collect();
    let whole = zstd::encode_all(format!("spawn a\n{text}").as_bytes(), 3).unwrap();
    let path = std::env::temp_dir().join(format!(
        "hugelab-predict-cut-{}.hlw.zst",
        std::process::id()
    ));
    std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
    let err = refused(&[path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    assert!(err.contains("cannot read after line"), "{err}");
}

/// A program the OOM killer ended does nothing more: the recording's later
/// statements of it, and of the child it would have forked, are left out,
/// and the other processes go on (c's 1 MiB: 256 faults at 4K).
#[test]
fn an_oom_killed_process_is_left_out_after_its_kill() {
    let w = TempWorkload::new(
        "spawn a\n\
         a mmap buf 4M align=2M\n\
         a write buf\n\
         a fork b\n\
         b write buf:1M\n\
         spawn c\n\
         c mmap buf 1M\n\
         c write buf\n",
    );
    let limited = "small:transparent_hugepage/enabled=never,memory.max=2M";
    let doc = json(&[w.path(), "--setting", limited]);
    let f = figures(&doc, "small");
    assert_eq!(f["oom_kills"], 1);
    let kills = doc["settings"][0]["kills"].as_array().unwrap();
    assert_eq!(kills.len(), 1);
    assert!(
        kills[0].as_str().unwrap().starts_with("line 3:"),
        "{kills:?}"
    );
    // a faulted until the limit, once more for the fault that killed it,
    // then c took its 256.
    let a_faults = f["page_faults"].as_i64().unwrap() - 256;
    assert!((1..=512).contains(&a_faults), "{f}");
}

/// A 4M+4K region at an address 4K past a 2M boundary, every page of its
/// first 2M written and then one page every 64K: under PMD `always` each 2M range wholly inside the VMA takes
/// one THP fault, a page outside such a range one fault of its own. Where
/// the VMA starts modulo 2M moves with the layout (`--layouts`): the
/// expected faults of each layout come from that arithmetic on the
/// addresses the layout gives the `mmap` (the workload crate's `Relayout`),
/// and predict's mean and range must be theirs.
#[test]
fn layouts_move_the_vma_and_the_faults_follow_its_alignment() {
    use hugelab_workload::layout::Relayout;
    const PMD_SIZE: u64 = 2 << 20;
    let (at, size) = (0x7f00_0000_1000u64, (4 << 20) + 4096);
    let written: Vec<u64> = (0..size)
        .step_by(4096)
        .filter(|off| *off < PMD_SIZE || off % (64 << 10) == 0)
        .collect();
    let mut text = format!("spawn a\na mmap r {}K at={at:#x}\n", size >> 10);
    for off in &written {
        text.push_str(&format!("a write r+{}K:4K\n", off >> 10));
    }
    let w = TempWorkload::new(&text);
    let layouts = 8;
    let faults = |start: u64| -> i64 {
        let inside = |r: u64| r >= start && r + PMD_SIZE <= start + size;
        let mut ranges = std::collections::BTreeSet::new();
        let mut small = 0;
        for off in &written {
            let r = (start + off) / PMD_SIZE * PMD_SIZE;
            if inside(r) {
                ranges.insert(r);
            } else {
                small += 1;
            }
        }
        small + ranges.len() as i64
    };
    let expected: Vec<i64> = (0..layouts)
        .map(|l| {
            let mut r = Relayout::new(l);
            let parsed = hugelab_workload::parse("t.hlw", &text).expect("parses");
            let mut start = at;
            for mut s in parsed.stmts {
                r.apply(&mut s.kind);
                if let hugelab_workload::StmtKind::Mmap(m) = s.kind {
                    start = m.at.expect("at=");
                }
            }
            faults(start)
        })
        .collect();
    assert!(
        expected.iter().min() != expected.iter().max(),
        "8 layouts all aligned alike: {expected:?}"
    );
    let doc = json(&[w.path(), "--setting", PMD, "--layouts", "8"]);
    let s = &doc["settings"][0];
    assert_eq!(s["figures"]["page_faults"], expected[0], "{doc}");
    let l = &s["layouts"];
    assert_eq!(l["layouts"], 8);
    assert_eq!(l["page_faults"]["min"], *expected.iter().min().unwrap());
    assert_eq!(l["page_faults"]["max"], *expected.iter().max().unwrap());
    let mean = expected.iter().sum::<i64>() as f64 / layouts as f64;
    assert_eq!(l["page_faults"]["mean"].as_f64(), Some(mean));
    // One layout: no spread in the JSON; 0 layouts is refused.
    let doc = json(&[w.path(), "--setting", PMD]);
    assert!(doc["settings"][0].get("layouts").is_none(), "{doc}");
    let err = refused(&[w.path(), "--setting", PMD, "--layouts", "0"]);
    assert!(err.contains("--layouts 0"), "{err}");
}
