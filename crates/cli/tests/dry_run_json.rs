//! `--json` where a person could script it: `settings show`, `bench
//! --dry-run` and `hugetlb measure --dry-run` (none changes the machine).

mod common;
use common::{read, run as hugelab, stderr};

fn json(args: &[&str]) -> serde_json::Value {
    let o = hugelab(args);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON: {e}"))
}

#[test]
fn settings_show_json_is_the_table() {
    let all = json(&["settings", "show", "--json"]);
    let list = all["tunables"].as_array().expect("a list");
    assert!(all["activity"].is_object(), "{all}");
    let o = hugelab(&["settings", "show"]);
    let text = String::from_utf8(o.stdout).unwrap();
    // The tunables, then a blank line and the machine's activity.
    let tunables: Vec<&str> = text.lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(list.len(), tunables.len());
    assert!(text.contains("\nwhat else on this machine acts on huge pages:\n"));
    for (t, line) in list.iter().zip(tunables) {
        let (tunable, value) = (t["tunable"].as_str().unwrap(), t["value"].as_str().unwrap());
        assert_eq!(line, format!("{tunable} {value}"));
        let file = t["file"].as_str().unwrap();
        assert!(
            file == format!("/sys/kernel/mm/{tunable}")
                || Some(file)
                    == tunable
                        .strip_prefix("vm.")
                        .map(|n| format!("/proc/sys/vm/{n}"))
                        .as_deref(),
            "{file} for {tunable}"
        );
        // Volatile ones aside (see common::machine_state), the file holds it.
        if tunable != "vm.min_free_kbytes" {
            assert_eq!(read(file), value, "{tunable}");
        }
    }
}

#[test]
fn bench_dry_run_json_lists_the_settings_and_runs() {
    let now = read("/sys/kernel/mm/transparent_hugepage/enabled");
    let doc = json(&[
        "bench",
        "--setting",
        "4K:transparent_hugepage/enabled=never",
        "--setting",
        "THP:transparent_hugepage/enabled=always",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--dry-run",
        "--json",
        "--",
        "true",
    ]);
    assert_eq!(doc["dry_run"], true);
    assert!(doc["command"][0].as_str().unwrap().ends_with("/true"));
    let settings = doc["settings"].as_array().unwrap();
    assert_eq!(settings.len(), 2);
    assert_eq!(settings[0]["name"], "4K");
    assert_eq!(settings[0]["baseline"], true);
    assert_eq!(
        settings[1]["tunables"],
        serde_json::json!([{ "tunable": "transparent_hugepage/enabled", "value": "always", "now": now }])
    );
    assert!(settings[1]["memory_max"].is_null(), "no limit given");
    // One warm-up and three runs per setting, each round through both.
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8);
    assert_eq!(
        runs[0],
        serde_json::json!({ "setting": "4K", "warmup": true, "run": 1 })
    );
    assert_eq!(
        runs[7],
        serde_json::json!({ "setting": "THP", "warmup": false, "run": 3 })
    );
}

#[test]
fn hugetlb_measure_dry_run_json_lists_the_pools() {
    let o = hugelab(&[
        "hugetlb",
        "measure",
        "--size",
        "2M",
        "--pages",
        "4",
        "--dry-run",
        "--json",
    ]);
    if o.status.code() != Some(0) {
        eprintln!("skipped: hugetlb measure cannot plan here: {}", stderr(&o));
        return;
    }
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let now: u64 = read("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
        .parse()
        .unwrap();
    if now >= 4 {
        eprintln!("skipped: the 2M pool already holds {now} pages");
        return;
    }
    assert_eq!(doc["dry_run"], true);
    assert_eq!(
        doc["sizes"],
        serde_json::json!([{
            "size": "2M",
            "size_bytes": 2u64 << 20,
            "pool": "hugepages/hugepages-2048kB/nr_hugepages",
            "now": now,
            "target": 4,
            "bytes_needed": (4 - now) * (2 << 20),
        }])
    );
    assert_eq!(doc["repeat"], 5);
    assert_eq!(doc["warmup"], 1);
    assert_eq!(
        doc["hugetlb_optimize_vmemmap"].as_str(),
        Some(read("/proc/sys/vm/hugetlb_optimize_vmemmap").as_str())
    );
}

/// The dry run's text and its JSON are one plan: every setting's value of
/// every tunable, and every run, the text says as the JSON has them.
#[test]
fn bench_dry_run_text_says_what_its_json_has() {
    let args = [
        "bench",
        "--setting",
        "4K:transparent_hugepage/enabled=never",
        "--setting",
        "THP:transparent_hugepage/enabled=always,transparent_hugepage/defrag=madvise,memory.max=20M",
        "--runs",
        "2",
        "--warmup",
        "1",
        "--dry-run",
    ];
    let mut with_json = args.to_vec();
    with_json.extend(["--json", "--", "true"]);
    let doc = json(&with_json);
    let mut plain = args.to_vec();
    plain.extend(["--", "true"]);
    let o = hugelab(&plain);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    for s in doc["settings"].as_array().unwrap() {
        let name = s["name"].as_str().unwrap();
        let role = if s["baseline"] == true {
            " (baseline)"
        } else {
            ""
        };
        let block = text
            .split(&format!("setting {name}{role}:\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("no setting {name} in {text}"));
        for t in s["tunables"].as_array().unwrap() {
            let (tunable, value, now) = (
                t["tunable"].as_str().unwrap(),
                t["value"].as_str().unwrap(),
                t["now"].as_str().unwrap(),
            );
            let change = if value == now {
                "(unchanged)".to_string()
            } else {
                format!("(now {now})")
            };
            let line = format!("  {tunable} = {value} {change}\n");
            assert!(block.contains(&line), "{line:?} not in {text}");
        }
        // The limit of each run's cgroup: 20 MiB, the THP setting's only.
        let block = block.split("\nsetting ").next().unwrap();
        match s["memory_max"].as_u64() {
            Some(max) => {
                assert_eq!((name, max), ("THP", 20 << 20));
                assert!(
                    block.contains("  memory.max = 20M (each run's cgroup: "),
                    "{text}"
                );
                assert!(block.contains(&format!(" = {max})\n")), "{text}");
            }
            None => assert!(!block.contains("memory.max"), "{text}"),
        }
    }
    let runs = doc["runs"].as_array().unwrap();
    assert!(
        text.contains(&format!("\n{} runs, each `", runs.len())),
        "{text}"
    );
    for r in runs {
        let kind = if r["warmup"] == true {
            "warm-up"
        } else {
            "run"
        };
        let line = format!("  {} {kind} {}\n", r["setting"].as_str().unwrap(), r["run"]);
        assert!(text.contains(&line), "{line:?} not in {text}");
    }
}
