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

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_shape_is_a_machine_then_a_fragment_statement() {
        let stmts = machine_statements(&shape(&[("fragment", "10%"), ("memory", "64M")])).unwrap();
        let text: Vec<String> = stmts.iter().map(|s| s.to_string()).collect();
        // The printer writes the default pattern out.
        assert_eq!(
            text,
            [
                "machine memory=64M",
                "fragment unmovable=10% pattern=spread"
            ]
        );
        assert!(machine_statements(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_bad_shape_is_refused_at_its_place() {
        let err = machine_statements(&shape(&[("memory", "0")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "machine:1:16: machine memory must be nonzero"
        );
        let twice = shape(&[("fragment", "1%"), ("fragment", "2%")]);
        let err = machine_statements(&twice).unwrap_err();
        assert_eq!(
            err.to_string(),
            "machine shape: gives fragment twice; give it one value"
        );
    }
}
