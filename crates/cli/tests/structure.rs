//! The shape of the sources (issue 22): no cycle between the files of any
//! crate, as `scripts/file-cycles.py` reads them (and the script does see a
//! cycle when there is one), and no function over 120 lines.

use std::path::Path;
use std::process::Command;

fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn file_cycles(args: &[&Path]) -> (bool, String) {
    let out = Command::new("python3")
        .arg(repo_root().join("scripts/file-cycles.py"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("python3 runs scripts/file-cycles.py");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn no_cycle_between_the_files_of_any_crate() {
    let (ok, out) = file_cycles(&[]);
    assert!(ok, "scripts/file-cycles.py found a cycle:\n{out}");
    for krate in ["model", "workload", "kernel", "cli"] {
        assert!(out.contains(&format!("crates/{krate}/src")), "{out}");
    }
}

#[test]
fn the_script_sees_a_cycle_through_a_use_group_and_a_path() {
    let dir = std::env::temp_dir().join(format!("hugelab-test-cycles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.as_path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{b::Thing, c};\n").unwrap();
    // A comment naming a module is no dependency.
    std::fs::write(src.join("b.rs"), "// crate::c::Other\npub struct Thing;\n").unwrap();
    std::fs::write(
        src.join("c.rs"),
        "pub fn f() -> crate::b::Thing { crate::b::Thing }\n",
    )
    .unwrap();
    let (ok, out) = file_cycles(&[src]);
    assert!(ok, "no cycle yet, but: {out}");
    std::fs::write(
        src.join("b.rs"),
        "pub struct Thing;\npub fn g() { crate::a::h() }\n",
    )
    .unwrap();
    let (ok, out) = file_cycles(&[src]);
    assert!(!ok, "a -> b -> a and a -> c -> b -> a make a cycle: {out}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.contains("cycle of 3 modules: a b c"), "{out}");
    assert!(out.contains("b -> a: h"), "{out}");
}

#[test]
fn no_function_over_120_lines() {
    let out = Command::new("python3")
        .arg(repo_root().join("scripts/longest-functions.py"))
        .arg("5")
        .current_dir(repo_root())
        .output()
        .expect("python3 runs scripts/longest-functions.py");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "a function is over 120 lines:\n{text}"
    );
    assert_eq!(text.lines().count(), 5, "{text}");
}
