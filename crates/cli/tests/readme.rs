//! The README's examples, run as written: every command of its `sh` code
//! blocks is either run here and its output checked for what the README says
//! it shows; the root-only ones (`sudo hugelab …`) by a test of their own,
//! on this machine where it allows them (root, a writable THP sysfs), else
//! listed as skipped with the reason (the root-only live tools,
//! which change or read this machine). A README command this file does not
//! know fails the test: a new example gets a check, and a renamed flag or
//! file in either the README or the binary is caught.
//!
//! Checks are on properties (a row's share, a sum of faults, a line's
//! presence and order), not on whole outputs, so that layout changes do not
//! break them; expected figures are derived from the kernel's rules, in the
//! comment of each check.

mod common;

use hugelab_workload::Backend;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The commands of the README's `sh` blocks: continuation lines joined,
/// comments cut, whitespace collapsed.
fn readme_commands() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block && line.trim() == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let code = line.split(" #").next().unwrap_or("");
        if code.trim_start().starts_with('#') {
            continue;
        }
        let (code, more) = match code.trim_end().strip_suffix('\\') {
            Some(c) => (c, true),
            None => (code, false),
        };
        pending.push_str(code);
        pending.push(' ');
        if !more {
            let cmd = pending.split_whitespace().collect::<Vec<_>>().join(" ");
            if !cmd.is_empty() {
                commands.push(cmd);
            }
            pending.clear();
        }
    }
    commands
}

/// `hugelab ARGS` in the repository's root, where the README's paths are,
/// with a settings journal of this test's own: `settings restore` then
/// answers for what this test's runs left, not for an earlier killed run's.
fn hugelab(args: &[&str]) -> Output {
    let state = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-state");
    std::fs::create_dir_all(&state).expect("a state directory");
    Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(args)
        .env("HUGELAB_STATE_DIR", &state)
        .current_dir(repo())
        .output()
        .expect("the hugelab binary runs")
}

/// Runs `args`, which must succeed; its stdout.
fn ok(args: &[&str]) -> String {
    let o = hugelab(args);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert_eq!(o.status.code(), Some(0), "hugelab {args:?}: {err}\n{out}");
    out
}

/// The cells of a `|`-table row.
fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_string())
        .collect()
}

/// The cell in column `column` of the row whose first cell is `row`, in the
/// first table of `out` that has that column.
fn cell(out: &str, column: &str, row: &str) -> String {
    let mut lines = out.lines();
    let header = lines
        .by_ref()
        .find(|l| l.starts_with('|') && cells(l).iter().any(|c| c == column))
        .unwrap_or_else(|| panic!("no table with a column '{column}':\n{out}"));
    let at = cells(header).iter().position(|c| c == column).unwrap();
    let line = lines
        .take_while(|l| l.starts_with('|'))
        .find(|l| cells(l)[0] == row)
        .unwrap_or_else(|| panic!("no row '{row}' under '{column}':\n{out}"));
    cells(line)[at].clone()
}

const SCENARIO: &str = "scenarios/mthp-64k-only-8m.hlw";
/// A second workload, for the examples that take several files.
const SCENARIO_2: &str = "scenarios/exit-frees-everything.hlw";

/// `hugelab run FILE`: the counters at each snapshot and the `expect` lines
/// checked; exit 0 when all pass. mthp-64k-only-8m writes 8 MiB with only
/// 64kB enabled: 8M / 64K = 128 folios of 64K (alloc_anon_folio), so
/// `mthp.64kB.nr_anon` is 128.
fn check_run(out: &str) {
    assert_eq!(cell(out, "end", "mthp.64kB.nr_anon"), "128", "{out}");
    assert!(out.contains("15 passed, 0 failed"), "{out}");
}

/// `run --counter vmstat.pgfault`: that counter's row and no other.
fn check_run_counter(out: &str) {
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains('.'))
        .collect();
    assert!(
        !rows.is_empty() && rows.iter().all(|l| l.starts_with("| vmstat.pgfault ")),
        "{out}"
    );
}

/// The JSON of a run: its snapshots and their counters.
fn check_run_json(out: &str, files: &[&str]) {
    // JSON Lines, as the README says: a document per workload, one per line.
    let docs: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line one JSON document"))
        .collect();
    assert_eq!(docs.len(), files.len(), "one document per file: {out}");
    for (doc, file) in docs.iter().zip(files) {
        assert_eq!(doc["workload"], *file);
        let end = doc["snapshots"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["label"] == "end"))
            .unwrap_or_else(|| panic!("no snapshot end: {doc}"));
        assert!(end["counters"].as_object().is_some_and(|c| !c.is_empty()));
        let expects = doc["expects"].as_array().expect("expects");
        assert!(!expects.is_empty());
    }
    assert_eq!(
        docs[0]["snapshots"][0]["counters"]["mthp.64kB.nr_anon"],
        128
    );
}

/// The README's compare example: the summary first, then the full table; the
/// 4K row really is 4K pages (64kB never, which wins over the workload's own
/// line 32; every other size never: 0 % in large folios), the 64K row all in
/// 64K folios; and the override is said.
fn check_compare_example(out: &str) {
    let summary = out.find("Summary").expect("a summary");
    let full = out.find("| counter").expect("the full table");
    assert!(summary < full, "summary first:\n{out}");
    assert_eq!(cell(out, "in large folios", "4K"), "0.0%", "{out}");
    assert_eq!(cell(out, "in 64K", "64K"), "100.0%", "{out}");
    assert!(
        out.contains("setting 4K overrides line 32"),
        "the override is said:\n{out}"
    );
}

/// `compare` without arguments: the built-in workload under the multi-size
/// THP series' settings, summary first; 4K has nothing in large folios, PMD
/// (enabled always, 2048kB inherit) has part of it in 2M folios.
fn check_compare_default(out: &str) {
    let summary = out.find("Summary").expect("a summary");
    let full = out.find("| counter").expect("the full table");
    assert!(summary < full, "summary first:\n{out}");
    assert_eq!(cell(out, "in large folios", "4K"), "0.0%", "{out}");
    assert_ne!(cell(out, "in 2M", "PMD"), "0.0%", "{out}");
}

/// `explain FILE:41`: the faults of line 41 grouped by their decisions. The
/// write of 8M with only 64kB enabled takes 128 faults, one per 64K folio
/// (the other 15 writes of each block find their PTE present): the groups'
/// fault counts add up to 128, in fewer rows than faults, each a 64K folio.
fn check_explain(out: &str) {
    let counts: Vec<u64> = out
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let n = words.next()?.parse().ok()?;
            words.next()?.starts_with("buf").then_some(n)
        })
        .collect();
    assert_eq!(counts.iter().sum::<u64>(), 128, "{out}");
    assert!(counts.len() < 128, "grouped:\n{out}");
    assert!(out.contains("64K folio"), "{out}");
}

/// `hugetlb plan 1T`: 1 TiB of 2 MiB pages is 524288 pages of 512 struct
/// pages of 64 bytes: 16 GiB of vmemmap without HVO; Linux 6.18 keeps one of
/// each page's 8 vmemmap pages: 2 GiB with it. Both are printed.
fn check_hugetlb_plan(out: &str) {
    assert!(out.contains("HVO"), "{out}");
    let row = out
        .lines()
        .find(|l| l.contains("2M") && l.contains("6.18"))
        .unwrap_or_else(|| panic!("no 2M row under Linux 6.18:\n{out}"));
    let row = row.replace(".00 ", " ");
    assert!(row.contains("524288"), "{row}");
    assert!(row.contains("16 GiB") && row.contains("2 GiB"), "{row}");
}

/// `utilization FILE --snapshot before --why`: how full each large folio is
/// (a histogram per size), what the under-used shrinker would give back, and
/// why each folio exists (bimodal-utilization has faulted THPs and
/// MADV_COLLAPSE'd ones).
fn check_utilization(out: &str) {
    assert!(out.contains("'before'"), "{out}");
    assert!(out.contains("2048 kB"), "{out}");
    assert!(out.contains("max_ptes_none"), "{out}");
    assert!(out.to_lowercase().contains("shrinker"), "{out}");
    assert!(
        out.contains("madvise_collapse") && out.contains("fault"),
        "{out}"
    );
}

/// `counters [FAMILY] [--json]`: the families, one family's counters, JSON.
fn check_counters() {
    let all = ok(&["counters"]);
    for family in ["vmstat", "mthp", "smaps", "meminfo"] {
        assert!(all.contains(family), "{family}:\n{all}");
    }
    let vmstat = ok(&["counters", "vmstat"]);
    assert!(vmstat.contains("vmstat.thp_fault_alloc"), "{vmstat}");
    // FAMILY narrows the JSON too: every family, then vmstat alone.
    let families = |args: &[&str]| -> Vec<String> {
        let out = ok(args);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        let list = v.as_array().unwrap_or_else(|| panic!("a list: {out}"));
        list.iter()
            .map(|f| f["name"].as_str().unwrap().to_string())
            .collect()
    };
    let all = families(&["counters", "--json"]);
    assert!(all.len() > 1 && all.iter().any(|f| f == "mthp"), "{all:?}");
    assert_eq!(families(&["counters", "vmstat", "--json"]), ["vmstat"]);
}

/// `settings show`: every tunable with the machine's value, read only.
fn check_settings_show(out: &str) {
    let enabled = out
        .lines()
        .find_map(|l| l.strip_prefix("transparent_hugepage/enabled "))
        .unwrap_or_else(|| panic!("no transparent_hugepage/enabled:\n{out}"));
    assert!(
        ["always", "madvise", "never"].contains(&enabled.trim()),
        "{enabled}"
    );
    assert!(out.contains("transparent_hugepage/hugepages-64kB/enabled"));
}

/// `settings show --json`: `{tunables: [{tunable, file, value}],
/// activity}`, as the README says.
fn check_settings_show_json(out: &str) {
    let v: Value = serde_json::from_str(out).expect("settings show --json is JSON");
    assert!(v["activity"].is_object(), "{out}");
    let enabled = v["tunables"]
        .as_array()
        .expect("a list")
        .iter()
        .find(|t| t["tunable"] == "transparent_hugepage/enabled")
        .unwrap_or_else(|| panic!("no transparent_hugepage/enabled:\n{out}"));
    assert_eq!(
        enabled["file"],
        "/sys/kernel/mm/transparent_hugepage/enabled"
    );
    assert!(["always", "madvise", "never"].contains(&enabled["value"].as_str().unwrap()));
}

/// `run trace.hlw.zst`: a zstd-compressed workload runs as the plain one does.
fn check_run_zst() {
    let text = std::fs::read(repo().join(SCENARIO)).unwrap();
    let zst = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-trace.hlw.zst");
    std::fs::write(&zst, zstd::encode_all(&text[..], 3).unwrap()).unwrap();
    let out = ok(&["run", zst.to_str().unwrap()]);
    check_run(&out);
}

/// `predict prog.hlw.zst` under the default settings, of 4 MiB written
/// 2 MiB-aligned: at 4K 4M / 4K = 1024 faults; with PMD THP 2, which is
/// (2 - 1024) / 1024 = -99.8 % against the first setting.
fn check_predict() {
    let text = "spawn a\na mmap buf 4M align=2M\na write buf\n";
    let zst = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-prog.hlw.zst");
    std::fs::write(&zst, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
    let out = ok(&["predict", zst.to_str().unwrap()]);
    // The page-fault cell of a setting's row.
    let row = |name: &str| {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("| {name} ")))
            .unwrap_or_else(|| panic!("no row {name}: {out}"));
        line.split('|').nth(2).unwrap().trim().to_string()
    };
    assert_eq!(row("4K"), "1024", "{out}");
    assert_eq!(row("PMD"), "2 (-99.8%)", "{out}");
    for name in ["16K", "32K+16K", "64K+32K+16K"] {
        row(name);
    }
}

/// `sweep -o rows.parquet FILE...`: compare's five settings over two
/// workloads, 10 cells: a summary of five rows per workload, a Parquet
/// file, and a re-run that finds all 10 cells in it.
fn check_sweep() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-rows.parquet");
    let _ = std::fs::remove_file(&out);
    let args = ["sweep", "-o", out.to_str().unwrap(), SCENARIO, SCENARIO_2];
    let text = ok(&args);
    for file in [SCENARIO, SCENARIO_2] {
        assert!(text.contains(&format!("# {file} on machine own")), "{text}");
    }
    for setting in ["4K", "16K", "32K+16K", "64K+32K+16K", "PMD"] {
        let rows = text
            .lines()
            .filter(|l| l.starts_with('|') && cells(l)[0] == setting);
        assert_eq!(rows.count(), 2, "{setting}: {text}");
    }
    assert!(std::fs::read(&out).unwrap().starts_with(b"PAR1"));
    let again = hugelab(&args);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("resuming: 10 cells already in"), "{err}");
}

#[test]
fn every_readme_example_runs_and_shows_what_the_readme_says() {
    let commands = readme_commands();
    assert!(commands.len() >= 20, "README commands: {commands:#?}");
    let mut checked = 0;
    for cmd in &commands {
        if let Some(rest) = cmd.strip_prefix("sudo ") {
            println!("left to every_root_readme_example_runs_on_this_machine: {rest}");
            continue;
        }
        let args: Vec<&str> = cmd.split_whitespace().skip(1).collect();
        match cmd.as_str() {
            "cargo run --release -- compare" => {
                // The same binary, without a release build.
                check_compare_default(&ok(&["compare"]));
            }
            "cargo test --workspace" | ".ci/run" => {
                println!("skipped (the whole suite, which this test is part of): {cmd}");
                continue;
            }
            "pip install './crates/python[ray]'" => {
                // The package .ci/run builds (scripts/python-env) and tests
                // with pytest; here, that it is where the README says.
                let pyproject = repo().join("crates/python/pyproject.toml");
                let text = std::fs::read_to_string(&pyproject).expect("pyproject.toml");
                assert!(text.contains("name = \"hugelab\""), "{text}");
                assert!(text.contains("ray = [\"ray>=2.9\"]"), "{text}");
                println!("checked that {cmd} names the package; .ci/run installs and tests it");
            }
            "hugelab run scenarios/mthp-64k-only-8m.hlw" => check_run(&ok(&args)),
            "hugelab run --json FILE..." => {
                let files = [SCENARIO, SCENARIO_2];
                check_run_json(&ok(&[&["run", "--json"], &files[..]].concat()), &files);
            }
            "hugelab run --counter vmstat.pgfault FILE" => {
                check_run_counter(&ok(&["run", "--counter", "vmstat.pgfault", SCENARIO]));
            }
            "hugelab run --check FILE..." => {
                ok(&["run", "--check", SCENARIO, SCENARIO_2]);
            }
            "hugelab run trace.hlw.zst" => check_run_zst(),
            "hugelab run --backend kernel --dry-run FILE..." => {
                // Needs no root: it changes nothing.
                let out = ok(&["run", "--backend", "kernel", "--dry-run", SCENARIO]);
                assert!(
                    out.contains(" needs up to ") && out.contains("would run in memory cgroup "),
                    "{out}"
                );
            }
            c if c.starts_with("hugelab compare --setting 4K:") => {
                check_compare_example(&ok(&args));
            }
            "hugelab predict prog.hlw.zst" => check_predict(),
            "hugelab explain scenarios/mthp-64k-only-8m.hlw:41" => check_explain(&ok(&args)),
            "hugelab counters [FAMILY] [--json]" => check_counters(),
            "hugelab utilization workloads/bimodal-utilization.hlw --snapshot before --why" => {
                check_utilization(&ok(&args));
            }
            "hugelab sweep -o rows.parquet FILE..." => check_sweep(),
            "hugelab sweep --ray HEAD:6379 -o rows.parquet FILE..." => {
                println!(
                    "skipped (needs a Ray cluster: crates/python/tests/test_ray.py starts one \
                     and runs it): {cmd}"
                );
                continue;
            }
            "hugelab hugetlb plan 1T" => check_hugetlb_plan(&ok(&args)),
            "hugelab settings show [--json]" => {
                check_settings_show(&ok(&["settings", "show"]));
                check_settings_show_json(&ok(&["settings", "show", "--json"]));
            }
            _ => panic!(
                "README example not covered by crates/cli/tests/readme.rs: {cmd}\n\
                 (run it and check what the README says it shows, or skip it with a reason)"
            ),
        }
        println!("checked: {cmd}");
        checked += 1;
    }
    assert!(checked >= 10, "{checked} examples checked");
}

/// A process to scan, held by a kernel-backend run: one THP written whole,
/// one at a single page (511 zero-filled subpages: under-used at
/// max_ptes_none 409, since 511 > 409; thp_underused in mm/huge_memory.c).
const SCAN_TARGET: &str = "\
set transparent_hugepage/enabled madvise
set transparent_hugepage/hugepages-2048kB/enabled inherit
set transparent_hugepage/shrink_underused 1
spawn p
p mmap buf 4M align=2M
p madvise buf HUGEPAGE
p write buf:2M
p write buf+2M:4K
snapshot ready
";

/// `scan --pid PID`: conclusion first — the shrinker's verdict, then how
/// full each large folio is, then thpmaps's figures, then the VMAs.
fn check_scan_pid(out: &str) {
    let at = |what: &str| {
        out.find(what)
            .unwrap_or_else(|| panic!("no {what:?}:\n{out}"))
    };
    let order = [
        at("Deferred split shrinker at max_ptes_none="),
        at("| used subpages "),
        at("| anon-thp-pmd-aligned-2048kB "),
        // Every VMA, or the 10 largest when there are more (file THP of
        // the agent's binary in the page cache can add some).
        out.find("by VMA (")
            .or_else(|| out.find(" VMAs with THP memory"))
            .unwrap_or_else(|| panic!("no VMA rows:\n{out}")),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}:\n{out}");
}

/// `scan --all --top 5`: processes ranked by waste, at most 5 of them shown.
fn check_scan_top(out: &str) {
    assert!(
        out.contains("scanned, ranked by what the deferred split shrinker would give back"),
        "{out}"
    );
    let shown = out
        .lines()
        .filter(|l| l.starts_with("THP utilization: process "))
        .count();
    assert!((1..=5).contains(&shown), "{shown} processes shown:\n{out}");
}

/// `scan --all --rollup --json`: every process, and one summary with what
/// the shrinker gives back, the target among the processes.
fn check_scan_rollup(out: &str, pid: i32) {
    let v: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let give_back = &v["rollup"]["utilization"]["give_back"];
    assert!(
        give_back["freed_kb"].is_u64() && give_back["rss_kb"].is_u64(),
        "{give_back}"
    );
    let procs = v["processes"].as_array().expect("processes");
    assert!(
        procs.iter().any(|p| p["pid"] == pid),
        "{pid} not among {} processes",
        procs.len()
    );
}

/// `scan --pid PID --max-ptes-none 409 --svg util.svg`: the drawing has the
/// threshold (under-used below 512 - 409 = 103 subpages in use) and the
/// give-back: the one-page THP's 511 zero-filled subpages, 2044 kB (2.0 MiB).
fn check_scan_svg(svg: &Path, pid: i32) {
    let text = std::fs::read_to_string(svg).expect("the SVG was written");
    for want in [
        format!("scan of process {pid} ("),
        "max_ptes_none=409: under-used below 103 subpages in use".to_string(),
        "the shrinker splits 1 THP and gives back 2.0 MiB".to_string(),
    ] {
        assert!(text.contains(&want), "no {want:?} in the SVG");
    }
}

/// `utilization FILE --snapshot S --backend both --svg s.svg`: the model's
/// report and the kernel's, side by side; the bimodal heap's 16 THPs with
/// 1-2 pages written are under-used on both (32084 kB, the workload's own
/// figure from thp_underused at 409).
fn check_utilization_both(out: &str, svg: &Path) {
    for backend in ["(model)", "(kernel)"] {
        let at = out
            .find(&format!("at snapshot 'before' {backend}"))
            .unwrap_or_else(|| panic!("no {backend} report:\n{out}"));
        assert!(out[at..].contains("it would give back 32084 kB"), "{out}");
    }
    let text = std::fs::read_to_string(svg).expect("the SVG was written");
    assert!(
        text.contains("model") && text.contains("kernel"),
        "one legend entry each"
    );
}

/// `bench --setting 4K:… --setting THP:… --runs 10 -- CMD ARGS`: the
/// summary first, a column per setting, each run counted.
fn check_bench(out: &str, runs: u32) {
    let mut lines = out.lines().filter(|l| !l.trim().is_empty());
    // Who the command ran as comes first.
    let who = lines.next().unwrap_or("");
    assert!(who.contains("` ran as "), "{out}");
    let first = lines.next().unwrap_or("");
    assert!(first.starts_with("change of the mean vs 4K"), "{out}");
    assert!(
        first.contains(&format!("{runs} runs per setting")),
        "{first}"
    );
    assert!(out.contains("| THP ") || out.contains(" THP "), "{out}");
    assert!(out.contains("memory"), "{out}");
}

/// `hugelab exporter` on a free loopback port (9853 may be taken): the
/// first line names the address, `/metrics` has the machine's THP counters
/// by their kernel names; stopped (it changes nothing) and reaped.
fn check_exporter() {
    use std::io::{BufRead, Read, Write};
    let mut child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let read = std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    let body = read.ok().and_then(|_| {
        let addr = line
            .trim()
            .strip_prefix("hugelab exporter: serving http://")?;
        let mut s = std::net::TcpStream::connect(addr.strip_suffix("/metrics")?).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        Some(body)
    });
    let _ = child.kill();
    let _ = child.wait();
    let body = body.unwrap_or_else(|| panic!("no /metrics from the address printed: {line:?}"));
    assert!(
        body.contains("\nhugelab_vmstat_thp_fault_alloc_total "),
        "{body}"
    );
}

/// The README's root-only examples, as written but for their placeholders:
/// PID is a process of a kernel-backend run, FILE and S a workload and its
/// snapshot, CMD ARGS a small command. Three run smaller than written, to
/// keep the suite short: `bench` 2 runs and no warm-up (not 10), `diff` one
/// scenario (the kernel test diffs every one), `hugetlb measure` one cycle
/// of 8 pages of 2M.
#[test]
fn every_root_readme_example_runs_on_this_machine() {
    if let Some(why) = common::cannot_run() {
        println!("skipped: the root-only README examples: {why}");
        return;
    }
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // Commands that take the settings lock themselves first; the scans then
    // run against a process a run in this test holds (it holds the lock).
    let mut scans = Vec::new();
    let mut checked = 0;
    for cmd in readme_commands() {
        let Some(rest) = cmd.strip_prefix("sudo ") else {
            continue;
        };
        match rest {
            "hugelab hugetlb measure" => {
                let out = ok(&[
                    "hugetlb", "measure", "--size", "2M", "--pages", "8", "--repeat", "1",
                    "--warmup", "0", "--json",
                ]);
                let v: Value = serde_json::from_str(&out).unwrap();
                let s = &v["sizes"][0];
                if !s["short"].is_null() {
                    println!("not compared: the 2M pool did not grow to 8 pages here ({})", s["short"]);
                } else {
                    // 512 struct pages of 64 bytes are 8 vmemmap pages; HVO
                    // keeps one (mm/hugetlb_vmemmap.c), so 7 go back.
                    assert_eq!(s["hvo_on"]["memmap_given_back_per_page"]["median"].as_f64(),
                        Some(7.0), "{s}");
                    assert_eq!(s["hvo_off"]["memmap_given_back_per_page"]["median"].as_f64(),
                        Some(0.0), "{s}");
                }
            }
            "hugelab run --backend kernel FILE..." => {
                let out = ok(&["run", "--backend", "kernel", SCENARIO, SCENARIO_2]);
                assert!(out.contains("kernel backend"), "{out}");
                assert!(out.contains(" passed, 0 failed"), "{out}");
            }
            "hugelab diff scenarios/*.hlw" => {
                let out = ok(&["diff", SCENARIO]);
                assert!(out.contains(" 0 mismatches, "), "{out}");
            }
            "hugelab settings restore" => {
                let out = ok(&["settings", "restore"]);
                assert!(out.contains("nothing to restore"), "{out}");
            }
            "hugelab settings init-memory [--dry-run]" => {
                // The dry run: the whole run touches most of the machine's
                // memory (tests/init_memory.rs runs a bounded one).
                let out = ok(&["settings", "init-memory", "--dry-run"]);
                assert!(
                    out.contains("every online memory block is initialised")
                        || (out.contains("not yet initialised by the kernel")
                            && out.contains("/proc/kpageflags reads 0")
                            && out.contains("nothing changed")),
                    "{out}"
                );
            }
            "hugelab utilization FILE --snapshot S --backend both --svg s.svg" => {
                let svg = tmp.join("readme-s.svg");
                let out = ok(&[
                    "utilization",
                    "workloads/bimodal-utilization.hlw",
                    "--snapshot",
                    "before",
                    "--backend",
                    "both",
                    "--svg",
                    svg.to_str().unwrap(),
                ]);
                check_utilization_both(&out, &svg);
            }
            c if c.starts_with("hugelab bench --setting 4K:transparent_hugepage/enabled=never --setting THP:transparent_hugepage/enabled=always --runs 10 -- CMD ARGS") => {
                let out = ok(&[
                    "bench",
                    "--setting",
                    "4K:transparent_hugepage/enabled=never",
                    "--setting",
                    "THP:transparent_hugepage/enabled=always",
                    "--runs",
                    "2",
                    "--warmup",
                    "0",
                    "--",
                    "dd",
                    "if=/dev/zero",
                    "of=/dev/null",
                    "bs=64M",
                    "count=2",
                ]);
                check_bench(&out, 2);
            }
            "hugelab record --summary -- CMD ARGS" => {
                let out = ok(&["record", "--summary", "--", "dd", "if=/dev/zero", "of=/dev/null", "bs=1M", "count=4"]);
                assert!(out.starts_with("| pid/tid"), "a table first: {out}");
                assert!(out.contains(" dd ") && out.contains(" 0 lost"), "{out}");
            }
            "hugelab record -o prog.hlw.zst -- CMD ARGS" => {
                let file = std::env::temp_dir().join(format!("hugelab-readme-{}.hlw.zst", std::process::id()));
                let path = file.to_str().unwrap();
                let out = ok(&["record", "-o", path, "--", "dd", "if=/dev/zero", "of=/dev/null", "bs=1M", "count=4"]);
                assert!(out.starts_with(&format!("wrote {path} (")), "what it wrote: {out}");
                // What it wrote is a workload the model replays: dd's 1M buffer written.
                let run = ok(&["run", "--counter", "vmstat.pgfault", path]);
                assert!(run.contains("vmstat.pgfault"), "{run}");
                let _ = std::fs::remove_file(&file);
            }
            "hugelab validate prog.hlw.zst -- prog ARGS" => {
                let file = std::env::temp_dir()
                    .join(format!("hugelab-readme-v-{}.hlw.zst", std::process::id()));
                let path = file.to_str().unwrap();
                let dd = ["dd", "if=/dev/zero", "of=/dev/null", "bs=4M", "count=4"];
                ok(&[&["record", "-o", path, "--"][..], &dd[..]].concat());
                let out = ok(&[
                    &[
                        "validate",
                        "--setting",
                        "4K:transparent_hugepage/enabled=never",
                        "--setting",
                        "THP:transparent_hugepage/enabled=always",
                        "--runs",
                        "1",
                        "--warmup",
                        "0",
                        path,
                        "--",
                    ][..],
                    &dd[..],
                ]
                .concat());
                // Predicted beside measured, per setting and figure, then the times.
                assert!(out.contains("figures within the goal"), "{out}");
                assert!(out.contains("| THP ") && out.contains("page faults"), "{out}");
                assert!(out.contains("predict:") && out.contains("faster than that"), "{out}");
                let _ = std::fs::remove_file(&file);
            }
            "hugelab exporter" => check_exporter(),
            c if c.starts_with("hugelab scan ") => {
                scans.push(c.to_string());
                continue;
            }
            _ => panic!(
                "root README example not covered by crates/cli/tests/readme.rs: {cmd}\n\
                 (run it and check what the README says it shows)"
            ),
        }
        println!("checked: {cmd}");
        checked += 1;
    }

    let workload = hugelab_workload::parse("scan-target.hlw", SCAN_TARGET).unwrap();
    let mut kb =
        hugelab_kernel::KernelBackend::new(PathBuf::from(env!("CARGO_BIN_EXE_hugelab"))).unwrap();
    kb.prepare(&hugelab_workload::Lookahead::of(&workload.stmts))
        .unwrap();
    for s in &workload.stmts {
        if matches!(s.kind, hugelab_workload::StmtKind::Snapshot { .. }) {
            break;
        }
        kb.execute(s)
            .unwrap_or_else(|e| panic!("line {}: {e:?}", s.pos.line));
    }
    let pid = kb.processes()[0].pid;
    let p = pid.to_string();
    let svg = tmp.join("readme-util.svg");
    let result = std::panic::catch_unwind(|| {
        for cmd in &scans {
            match cmd.as_str() {
                "hugelab scan --pid 1234" => check_scan_pid(&ok(&["scan", "--pid", &p])),
                "hugelab scan --all --top 5" => {
                    check_scan_top(&ok(&["scan", "--all", "--top", "5"]))
                }
                "hugelab scan --all --rollup --json" => {
                    check_scan_rollup(&ok(&["scan", "--all", "--rollup", "--json"]), pid);
                }
                "hugelab scan --pid 1234 --max-ptes-none 409 --svg util.svg" => {
                    ok(&[
                        "scan",
                        "--pid",
                        &p,
                        "--max-ptes-none",
                        "409",
                        "--svg",
                        svg.to_str().unwrap(),
                    ]);
                    check_scan_svg(&svg, pid);
                }
                _ => panic!(
                    "root README example not covered by crates/cli/tests/readme.rs: sudo {cmd}"
                ),
            }
            println!("checked: sudo {cmd}");
        }
    });
    kb.finish().unwrap();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    checked += scans.len();
    assert!(checked >= 10, "{checked} root examples checked");
}
