//! `hugelab predict --why`: for each setting against the first, the regions
//! whose faults changed most and the kernel decisions behind them. Each
//! setting's run is traced as `explain` traces it (explain::Explaining);
//! its statements' fault groups are folded as they come into a count per
//! program and region and, per region, per chain of decisions, so memory
//! stays bounded however long the recording. Under each setting a region
//! shows the chain that gained most faults against the other setting: the
//! decisions taken there and not on the other side.

use crate::explain::Explained;
use std::collections::BTreeMap;

/// Regions shown per setting.
const TOP: usize = 3;

/// A program's region: (program, region). The program is the process name
/// without the `-N` the recorder adds to the second and later processes of
/// a name, so that every `cc1` of a build counts together.
type Key = (String, String);

/// The faults of a region.
#[derive(Default)]
pub struct RegionFaults {
    pub faults: u64,
    /// Faults per chain of decisions (explain's words).
    pub chains: BTreeMap<Vec<String>, u64>,
}

/// One setting's faults by region and chain.
#[derive(Default)]
pub struct WhyFold {
    pub regions: BTreeMap<Key, RegionFaults>,
}

/// `cc1-14` → `cc1`; `sh` stays.
fn program(proc: &str) -> &str {
    match proc.rsplit_once('-') {
        Some((name, n)) if !name.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => proc,
    }
}

impl WhyFold {
    /// Folds one statement's explanation in.
    pub fn add(&mut self, e: &Explained) {
        let proc = e.statement.split_whitespace().next().unwrap_or("");
        for g in &e.groups {
            let region = match g.first.split_once('+') {
                Some((region, _)) => region,
                None if g.first.starts_with("0x") => "(no region)",
                None => g.first.as_str(),
            };
            let key = (program(proc).to_string(), region.to_string());
            let r = self.regions.entry(key).or_default();
            r.faults += g.faults;
            *r.chains.entry(g.chain.clone()).or_default() += g.faults;
        }
    }

    fn faults(&self, key: &Key) -> u64 {
        self.regions.get(key).map_or(0, |r| r.faults)
    }

    /// The chain of the region that gained most faults against `other`
    /// (the decisions this side took where the other took others), and
    /// how many faults took it here; the most frequent chain when none
    /// gained.
    fn main_chain(&self, other: &WhyFold, key: &Key) -> Option<(&Vec<String>, u64)> {
        let r = self.regions.get(key)?;
        let theirs = |c: &Vec<String>| {
            other
                .regions
                .get(key)
                .and_then(|o| o.chains.get(c))
                .copied()
                .unwrap_or(0)
        };
        let gain = |c: &Vec<String>, n: u64| n.saturating_sub(theirs(c));
        let (chain, n) = r
            .chains
            .iter()
            .max_by_key(|(c, n)| (gain(c, **n), **n, std::cmp::Reverse(*c)))?;
        Some((chain, *n))
    }
}

/// The regions of `p` whose faults differ most from `base`'s, most first.
fn largest_differences<'a>(base: &'a WhyFold, p: &'a WhyFold) -> Vec<(&'a Key, i64)> {
    let mut keys: Vec<&Key> = base.regions.keys().chain(p.regions.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut diffs: Vec<(&Key, i64)> = keys
        .into_iter()
        .map(|k| (k, p.faults(k) as i64 - base.faults(k) as i64))
        .filter(|(_, d)| *d != 0)
        .collect();
    diffs.sort_by_key(|(k, d)| (std::cmp::Reverse(d.unsigned_abs()), *k));
    diffs.truncate(TOP);
    diffs
}

/// The decisions of one side, indented under the region's line.
fn chain_lines(out: &mut String, setting: &str, fold: &WhyFold, other: &WhyFold, key: &Key) {
    match fold.main_chain(other, key) {
        Some((chain, n)) => {
            out.push_str(&format!("    under {setting}, {n} of its faults:\n"));
            for step in chain {
                out.push_str(&format!("      {step}\n"));
            }
        }
        None => out.push_str(&format!("    under {setting}: no fault\n")),
    }
}

/// Per setting after the first, its largest differences in faults by
/// region, each with the decisions that differ most on either side: `folds` is each setting's name and fold, the baseline first.
pub fn render(folds: &[(&str, &WhyFold)]) -> String {
    let Some(&(base, base_fold)) = folds.first() else {
        return String::new();
    };
    let mut out = String::new();
    for &(setting, fold) in &folds[1..] {
        let diffs = largest_differences(base_fold, fold);
        out.push_str(&format!("\nWhy {setting} differs from {base}:"));
        if diffs.is_empty() {
            out.push_str(" every region takes the same faults\n");
            continue;
        }
        out.push('\n');
        for (key, d) in diffs {
            let (b, v) = (base_fold.faults(key), fold.faults(key));
            out.push_str(&format!(
                "  {} {}: {b} faults under {base}, {v} under {setting} ({d:+})\n",
                key.0, key.1
            ));
            chain_lines(&mut out, base, base_fold, fold, key);
            chain_lines(&mut out, setting, fold, base_fold, key);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_count_together() {
        assert_eq!(program("cc1-14"), "cc1");
        assert_eq!(program("cc1"), "cc1");
        assert_eq!(program("ld-linux"), "ld-linux");
        assert_eq!(program("-3"), "-3");
    }

    #[test]
    fn the_largest_differences_come_first() {
        let fold = |v: &[(&str, u64)]| WhyFold {
            regions: v
                .iter()
                .map(|(r, n)| {
                    let chains = BTreeMap::from([(vec![format!("c{n}")], *n)]);
                    let faults = RegionFaults { faults: *n, chains };
                    (("a".to_string(), r.to_string()), faults)
                })
                .collect(),
        };
        let base = fold(&[("buf", 1024), ("heap", 10), ("stack", 3)]);
        let p = fold(&[("buf", 2), ("heap", 12), ("new", 100)]);
        let d = largest_differences(&base, &p);
        let names: Vec<(&str, i64)> = d.iter().map(|(k, d)| (k.1.as_str(), *d)).collect();
        assert_eq!(names, vec![("buf", -1022), ("new", 100), ("stack", -3)]);
    }
}
