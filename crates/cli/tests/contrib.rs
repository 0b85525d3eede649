//! contrib/hugelab-exporter.service: the hardening the unit promises is in
//! it, `systemd-analyze verify` accepts it (where systemd-analyze is), and
//! the capabilities it keeps are the ones the exporter needs: as root with
//! only those in its bounding set, a scan reads every process a full root
//! reads, another user's too; without CAP_DAC_READ_SEARCH it cannot read
//! that user's. (contrib/grafana/hugelab.json is checked against the
//! exposition by the exporter's own unit tests: src/exporter/dashboard_check.rs.)

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};

const UNIT: &str = include_str!("../../../contrib/hugelab-exporter.service");

/// Section -> key -> values (a key may be given more than once).
fn parse_unit(text: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not a key=value line: {line}"));
        assert!(!section.is_empty(), "a key before any section: {line}");
        out.entry(section.clone())
            .or_default()
            .entry(k.trim().to_string())
            .or_default()
            .push(v.trim().to_string());
    }
    out
}

/// The unit's capabilities, as setpriv spells them (`sys_admin`).
fn unit_capabilities() -> Vec<String> {
    let unit = parse_unit(UNIT);
    unit["Service"]["CapabilityBoundingSet"][0]
        .split_whitespace()
        .map(|c| c.strip_prefix("CAP_").unwrap().to_lowercase())
        .collect()
}

#[test]
fn the_unit_is_hardened_as_it_says() {
    let unit = parse_unit(UNIT);
    let service = &unit["Service"];
    let one = |k: &str| match service.get(k).map(Vec::as_slice) {
        Some([v]) => v.as_str(),
        other => panic!("[Service] {k}: {other:?}"),
    };
    assert!(
        one("ExecStart").starts_with("/usr/local/bin/hugelab exporter --listen 127.0.0.1:9853"),
        "loopback by default"
    );
    for (k, v) in [
        ("User", "root"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectControlGroups", "yes"),
        ("AmbientCapabilities", ""),
    ] {
        assert_eq!(one(k), v, "[Service] {k}");
    }
    // No ReadWritePaths: the exporter writes nothing.
    assert!(!service.contains_key("ReadWritePaths"));
    let mut caps = unit_capabilities();
    caps.sort();
    assert_eq!(caps, ["dac_read_search", "sys_admin", "sys_ptrace"]);
    assert_eq!(unit["Install"]["WantedBy"], ["multi-user.target"]);
    assert!(unit["Unit"].contains_key("Description"));
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        println!("skipped: systemd-analyze is not installed (the keys are checked by the_unit_is_hardened_as_it_says)");
        return;
    }
    // The unit as installed, but its ExecStart the binary under test (verify
    // checks that the program exists).
    let dir = common::state_dir("contrib-unit");
    let unit = dir.join("hugelab-exporter.service");
    std::fs::write(
        &unit,
        UNIT.replace("/usr/local/bin/hugelab", env!("CARGO_BIN_EXE_hugelab")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", unit.to_str().unwrap()])
        .current_dir(&*dir)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A process of user nobody (uid 65534), killed and reaped when dropped.
struct Nobody(Child);

impl Drop for Nobody {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The bounding set of only `caps`, as setpriv takes it.
fn only(caps: &[String]) -> String {
    let set: String = caps.iter().map(|c| format!(",+{c}")).collect();
    format!("-all{set}")
}

/// One scan by the exporter as root with the bounding set `set`: the
/// processes it read and those the kernel denied it.
fn scan_with(set: &str) -> (f64, f64) {
    let dir = common::state_dir(&format!("contrib-caps-{}", set.len()));
    let out = Command::new("/usr/bin/setpriv")
        .arg(format!("--bounding-set={set}"))
        .arg(env!("CARGO_BIN_EXE_hugelab"))
        .args([
            "exporter",
            "--once",
            "--interval",
            "1s",
            "--cpu-budget",
            "100",
        ])
        .arg("--textfile")
        .arg(&*dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = std::fs::read_to_string(dir.join("hugelab.prom")).unwrap();
    let value = |line: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {line} in:\n{text}"))
    };
    (
        value("hugelab_exporter_scan_processes"),
        value("hugelab_exporter_scan_skipped_processes{reason=\"denied\"}"),
    )
}

#[test]
fn the_units_capabilities_are_what_the_exporter_needs() {
    if let Some(why) = common::cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    if !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("skipped: no /usr/bin/setpriv to limit the capabilities with");
        return;
    }
    let _other_user = Nobody(
        Command::new("/usr/bin/setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(["sleep", "60"])
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    let caps = unit_capabilities();
    let (read_all, denied_all) = scan_with("+all");
    let (read, denied) = scan_with(&only(&caps));
    let without_dac: Vec<String> = caps
        .iter()
        .filter(|c| *c != "dac_read_search")
        .cloned()
        .collect();
    let (_, denied_without) = scan_with(&only(&without_dac));
    println!(
        "as root: {read_all} read, {denied_all} denied; the unit's: {read} read, {denied} denied; without dac_read_search: {denied_without} denied"
    );
    assert!(read >= 2.0, "the scan read {read} processes");
    assert!(
        denied <= denied_all,
        "the unit's capabilities left {denied} processes unreadable, root's {denied_all}"
    );
    assert!(
        denied_without > denied,
        "without CAP_DAC_READ_SEARCH, nobody's process was read"
    );
}
