//! `hugelab settings init-memory` on this machine: the dry run changes
//! nothing and names the blocks it would initialise; a run bounded by its
//! reserve to a few hundred MiB touches no more than that, never makes a
//! block uninitialised again, and exits 0 exactly when none is left.

mod common;

use common::{assert_refused_as_nobody, run};
use serde_json::Value;

fn json(args: &[&str]) -> (i32, Value) {
    let out = run(args);
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), doc)
}

fn blocks(v: &Value) -> Vec<u64> {
    v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect()
}

#[test]
fn a_bounded_run_touches_at_most_what_the_reserve_leaves() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root");
        return;
    }
    assert_refused_as_nobody(&["settings", "init-memory", "--dry-run"]);
    let (code, plan) = json(&["settings", "init-memory", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{plan:#}");
    let before = blocks(&plan["uninitialised"]);
    let available = plan["mem_available_bytes"].as_u64().unwrap();
    let would = plan["would_touch_at_most_bytes"].as_u64().unwrap();
    assert_eq!(before.is_empty(), would == 0, "{plan:#}");

    // A reserve that leaves 384 MiB to touch.
    let reserve_mib = (available >> 20).saturating_sub(384);
    let reserve = reserve_mib.to_string();
    let (code, done) = json(&["settings", "init-memory", "--reserve", &reserve, "--json"]);
    let (first, after) = (blocks(&done["before"]), blocks(&done["after"]));
    assert!(
        after.iter().all(|b| first.contains(b)),
        "a block became uninitialised: {done:#}"
    );
    assert_eq!(code == 0, after.is_empty(), "{done:#}");
    let touched = done["touched_bytes"].as_u64().unwrap();
    // Each step checks MemAvailable first; what others free meanwhile
    // can allow a step or two more.
    assert!(touched <= 640 << 20, "{done:#}");
    if first.is_empty() {
        assert_eq!(touched, 0, "{done:#}");
    }
    if !after.is_empty() {
        let why = done["stopped"].as_str().unwrap_or_default();
        assert!(why.contains("reserve"), "{done:#}");
    }
}
