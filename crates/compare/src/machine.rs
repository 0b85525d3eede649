//! A machine shape as statements: `memory=4G` (and the `machine` statement's
//! other keys) and `fragment=10%` (the `fragment` statement's `unmovable=`,
//! optionally followed by its other keys: `fragment=10% pattern=clustered`).
//! They run after a setting's `set`s and before the workload, so a workload
//! that writes its own `machine` statement cannot take a shape (the
//! `machine` statement must come first; the parser says so at its line).

use anyhow::{bail, Result};
use hugelab_workload::{parse, Stmt};

/// The name a shape's statements are parsed under: a bad shape is reported
/// as `machine:1:COL: ...`.
pub const MACHINE_FILE: &str = "machine";

/// The statements of a shape given as `(KEY, VALUE)` pairs, in order:
/// one `machine` statement for every key but `fragment`, then the
/// `fragment` statement. Checked by the workload parser like any other.
pub fn machine_statements(shape: &[(String, String)]) -> Result<Vec<Stmt>> {
    let mut keys = Vec::new();
    let mut fragment = None;
    for (key, value) in shape {
        if key == "fragment" {
            if fragment.replace(value).is_some() {
                bail!("machine shape: gives fragment twice; give it one value");
            }
        } else {
            keys.push(format!("{key}={value}"));
        }
    }
    let mut text = String::new();
    if !keys.is_empty() {
        text.push_str(&format!("machine {}\n", keys.join(" ")));
    }
    if let Some(value) = fragment {
        text.push_str(&format!("fragment unmovable={value}\n"));
    }
    Ok(parse(MACHINE_FILE, &text)?.stmts)
}
