//! Bad input gets one sentence with its cause: tunable typos get the nearest
//! tunable, sizes take the common spellings, a missing cgroup or an
//! unreadable process says which file and why.

mod common;
use common::{run as hugelab, stderr};

const SCENARIO: &str = "../../scenarios/cow-fork-base-page.hlw";

/// `compare --setting A:<tunable>=<value>`: exit 2 and its one-line message.
fn refused_setting(setting: &str) -> String {
    let o = hugelab(&["compare", "--setting", setting, SCENARIO]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{setting}: {err}");
    assert_eq!(err.lines().count(), 1, "{setting}: {err}");
    err
}

#[test]
fn tunable_typos_get_the_nearest_tunable() {
    for (typed, meant) in [
        (
            "transparent_hugepage/enable",
            "transparent_hugepage/enabled",
        ),
        (
            "transparent_hugepage/hugepages-64K/enabled",
            "transparent_hugepage/hugepages-64kB/enabled",
        ),
        (
            "hugepages-64kB/enabled",
            "transparent_hugepage/hugepages-64kB/enabled",
        ),
        (
            "/sys/kernel/mm/transparent_hugepage/enable",
            "transparent_hugepage/enabled",
        ),
    ] {
        let err = refused_setting(&format!("A:{typed}=always"));
        assert!(
            err.ends_with(&format!(
                "unknown tunable '{typed}'; did you mean {meant}?\n"
            )),
            "{err}"
        );
        assert!(err.len() < 200, "{err}");
    }
}

#[test]
fn a_kernel_tunable_hugelab_does_not_model_is_said_to_be_one() {
    let err = refused_setting("A:vm.swappiness=10");
    assert!(
        err.contains("'vm.swappiness' is a kernel tunable hugelab does not model; the vm. tunables it models are vm.{"),
        "{err}"
    );
}

#[test]
fn a_pasted_file_path_names_its_tunable() {
    let o = hugelab(&[
        "compare",
        "--setting",
        "4K:/sys/kernel/mm/transparent_hugepage/enabled=never",
        "--setting",
        "THP:/sys/kernel/mm/transparent_hugepage/enabled=always",
        SCENARIO,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn command_line_sizes_take_the_common_spellings() {
    for (total, size) in [("512GB", "1GiB"), ("512G", "1G"), ("524288MiB", "1gb")] {
        let o = hugelab(&["hugetlb", "plan", total, "--size", size, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{total} {size}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        for p in v.as_array().unwrap() {
            assert_eq!(p["hpage_size"], 1u64 << 30);
            assert_eq!(p["huge_pages"], 512);
        }
    }
}

#[test]
fn a_missing_cgroup_says_so_once() {
    let o = hugelab(&["scan", "--cgroup", "/nonexistent/cg"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(
        err,
        "hugelab: /nonexistent/cg is not a cgroup: there is no such directory; give a cgroup's directory under /sys/fs/cgroup\n"
    );
}

/// A process hugelab may not read: the file, the errno once, and why.
#[test]
fn an_unreadable_process_says_why() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root");
        return;
    }
    if std::fs::read("/proc/1/maps").is_ok() {
        eprintln!("skipped: process 1 is readable here");
        return;
    }
    let o = hugelab(&["scan", "--pid", "1"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("hugelab: scanning process 1: /proc/1/maps: Permission denied (EACCES): "),
        "{err}"
    );
    // The cause: one of the kernel's ptrace checks, or a security module
    // once they pass (which one depends on the machine).
    assert!(
        [
            "another user's",
            "CAP_SYS_PTRACE, which hugelab runs without",
            "security module"
        ]
        .iter()
        .any(|why| err.contains(why))
            && err.contains("process 1 (")
            && !err.contains("os error"),
        "{err}"
    );
}
