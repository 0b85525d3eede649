//! The plan: every workload × machine shape × setting, in that order of
//! nesting (the workloads as given, each on each shape as given, under each
//! setting as given), each cell with a key that names it whatever the
//! engine: the workload's path and a hash of its bytes, the setting's name
//! and what it sets, the shape.

use anyhow::{bail, Context, Result};
use hugelab_compare::machine::machine_statements;
use hugelab_compare::parse_settings;
use hugelab_compare::setting::MEMORY_MAX;
use serde::{Deserialize, Serialize};

/// The machine label of a cell run on the workload's own machine (no shape).
pub const OWN_MACHINE: &str = "own";

/// One run: a workload under a setting on a machine shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    /// The workload's path, as given.
    pub workload: String,
    /// FNV-1a 64 of the workload file's bytes, 16 hex digits.
    pub hash: String,
    /// The setting's name (the `setting` column).
    pub setting: String,
    /// The whole setting, `NAME:TUNABLE=VALUE,...`.
    pub spec: String,
    /// The shape as given, `memory=4G,fragment=10%`, or [`OWN_MACHINE`]
    /// (the `machine` column).
    pub machine: String,
    /// The shape's `KEY=VALUE` pairs, in order (none for [`OWN_MACHINE`]).
    pub shape: Vec<(String, String)>,
}

impl Cell {
    /// The cell's stable key: `workload#hash|spec|machine`.
    pub fn key(&self) -> String {
        format!(
            "{}#{}|{}|{}",
            self.workload, self.hash, self.spec, self.machine
        )
    }

    /// What the output's rows call it: (workload, setting, machine).
    pub fn names(&self) -> (&str, &str, &str) {
        (&self.workload, &self.setting, &self.machine)
    }
}

/// A machine shape as the CLI takes it, `KEY=VALUE,KEY=VALUE` (the keys of
/// the `machine` statement and `fragment`), checked by the workload parser.
pub fn parse_shape(text: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for part in text.split(',') {
        let Some((key, value)) = part
            .split_once('=')
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        else {
            bail!("--machine '{text}': '{part}' is not KEY=VALUE (e.g. memory=4G,fragment=10%)");
        };
        pairs.push((key.trim().to_string(), value.trim().to_string()));
    }
    machine_statements(&pairs).with_context(|| format!("--machine '{text}'"))?;
    Ok(pairs)
}

/// FNV-1a 64 of `bytes`: the same on every machine and build.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The cells of `workloads` × `machines` (shape text and its pairs; none:
/// the workload's own machine) × `settings` (`NAME:TUNABLE=VALUE,...`),
/// after checking every input: each workload is read (and hashed), each
/// setting parsed (a model run has no memory cgroup: `memory.max` is
/// refused), each shape's label used once.
pub fn plan(
    workloads: &[String],
    settings: &[String],
    machines: &[(String, Vec<(String, String)>)],
) -> Result<Vec<Cell>> {
    if workloads.is_empty() {
        bail!("sweep needs at least one workload");
    }
    let parsed = parse_settings(settings)?;
    if parsed.is_empty() {
        bail!("sweep needs at least one setting");
    }
    if let Some(s) = parsed.iter().find(|s| s.memory_max.is_some()) {
        bail!(
            "--setting {}: a sweep runs the model without a memory cgroup, so it cannot take \
             {MEMORY_MAX} (hugelab bench can)",
            s.name
        );
    }
    for (i, (label, shape)) in machines.iter().enumerate() {
        machine_statements(shape).with_context(|| format!("--machine '{label}'"))?;
        if machines[..i].iter().any(|(l, _)| l == label) {
            bail!("--machine '{label}' is given twice; give each shape once");
        }
    }
    let own = [(OWN_MACHINE.to_string(), Vec::new())];
    let machines = if machines.is_empty() {
        &own[..]
    } else {
        machines
    };
    let mut cells = Vec::new();
    for (i, workload) in workloads.iter().enumerate() {
        if workloads[..i].contains(workload) {
            bail!("workload {workload} is given twice; give each workload once");
        }
        let bytes = std::fs::read(workload)
            .with_context(|| format!("{workload}: cannot read the workload"))?;
        let hash = format!("{:016x}", fnv1a(&bytes));
        for (label, shape) in machines {
            for (setting, spec) in parsed.iter().zip(settings) {
                cells.push(Cell {
                    workload: workload.clone(),
                    hash: hash.clone(),
                    setting: setting.name.clone(),
                    spec: spec.clone(),
                    machine: label.clone(),
                    shape: shape.clone(),
                });
            }
        }
    }
    Ok(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_is_the_published_function() {
        // The FNV-1a 64 test vectors: "" and "a".
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn a_shape_is_pairs_checked_by_the_parser() {
        let pairs = parse_shape("memory=64M,fragment=10% pattern=clustered").unwrap();
        assert_eq!(
            pairs,
            [
                ("memory".to_string(), "64M".to_string()),
                ("fragment".to_string(), "10% pattern=clustered".to_string())
            ]
        );
        let err = parse_shape("memory").unwrap_err().to_string();
        assert!(
            err.starts_with("--machine 'memory': 'memory' is not KEY=VALUE"),
            "{err}"
        );
        let err = format!("{:#}", parse_shape("memory=0").unwrap_err());
        assert!(err.contains("machine memory must be nonzero"), "{err}");
    }
}
