//! `hugelab record` notes the recorded program's reads of the THP settings
//! (root; skipped with a reason otherwise): the workload's header, the
//! human output and `--json` name each process and the file it read.

mod common;

use std::path::PathBuf;

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

/// A recording holds the machine's lock: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Why this machine cannot record, if it cannot.
fn cannot_record() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !std::path::Path::new(THP).is_dir() {
        return Some(format!("{THP} is missing (a kernel without THP)"));
    }
    None
}

/// Records `sh -c SCRIPT` to a workload; returns its text and the command's
/// stdout (human or `--json`).
fn record(name: &str, script: &str, json: bool) -> (String, String) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let state = common::state_dir(name);
    let file: PathBuf = state.join(format!("{name}.hlw"));
    let mut args = vec!["record", "-o", file.to_str().unwrap()];
    if json {
        args.push("--json");
    }
    args.extend(["--", "sh", "-c", script]);
    let out = common::hugelab(&args, &state);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_dir_all(&state);
    (text, String::from_utf8(out.stdout).unwrap())
}

/// The name the workload gives its `n`th process made with an exec
/// (`spawn X`: the command, then a vfork child's exec, as the shell runs
/// `cat`).
fn spawned(text: &str, n: usize) -> String {
    text.lines()
        .filter_map(|l| l.strip_prefix("spawn "))
        .nth(n)
        .unwrap_or_else(|| panic!("no spawn {n} in\n{text}"))
        .to_string()
}

#[test]
fn reads_of_the_thp_settings_are_named_in_the_header_and_the_output() {
    if let Some(why) = cannot_record() {
        eprintln!("skipped: {why}");
        return;
    }
    // cat reads `enabled` in a child; the shell's builtin `read` reads
    // `hpage_pmd_size` itself, twice (noted once).
    let script = format!(
        "cat {THP}/enabled >/dev/null; read a < {THP}/hpage_pmd_size; read a < {THP}/hpage_pmd_size"
    );
    let (text, stdout) = record("record-settings", &script, false);
    let sh = spawned(&text, 0);
    let cat = spawned(&text, 1);
    let expected = format!(
        "THP settings read by the program: {cat} transparent_hugepage/enabled, \
         {sh} transparent_hugepage/hpage_pmd_size"
    );
    let lines: Vec<&str> = text.lines().collect();
    let counts = lines
        .iter()
        .position(|l| l.starts_with("# ") && l.contains(" events in "))
        .expect("the counts line");
    assert_eq!(lines[counts + 1], format!("# {expected}"), "{text}");
    assert_eq!(
        text.matches("THP settings read").count(),
        1,
        "one line: {text}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with(&expected)),
        "the human output says so: {stdout}"
    );
}

#[test]
fn a_program_that_reads_no_thp_setting_has_no_line() {
    if let Some(why) = cannot_record() {
        eprintln!("skipped: {why}");
        return;
    }
    // Reads a file of /sys/kernel/mm/ outside the watched tree.
    let (text, stdout) = record(
        "record-no-settings",
        "cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages >/dev/null; true",
        true,
    );
    assert!(!text.contains("THP settings read"), "{text}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["thp_settings_read"], serde_json::json!([]), "{doc}");
}

#[test]
fn json_lists_each_process_and_setting() {
    if let Some(why) = cannot_record() {
        eprintln!("skipped: {why}");
        return;
    }
    let script = format!("read a < {THP}/khugepaged/max_ptes_none");
    let (text, stdout) = record("record-settings-json", &script, true);
    let sh = spawned(&text, 0);
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        doc["thp_settings_read"],
        serde_json::json!([{ "process": sh, "path": "transparent_hugepage/khugepaged/max_ptes_none" }]),
        "{doc}"
    );
}

#[test]
fn the_summary_lists_the_reads_by_pid() {
    if let Some(why) = cannot_record() {
        eprintln!("skipped: {why}");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let state = common::state_dir("record-settings-summary");
    let script = format!("read a < {THP}/defrag");
    let out = common::hugelab(
        &["record", "--summary", "--json", "--", "sh", "-c", &script],
        &state,
    );
    let _ = std::fs::remove_dir_all(&state);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pid = &doc["tasks"][0]["pid"];
    assert_eq!(
        doc["thp_settings_read"],
        serde_json::json!([{ "pid": pid, "incarnation": 0, "path": "transparent_hugepage/defrag" }]),
        "{doc}"
    );
}
