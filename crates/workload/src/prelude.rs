//! A workload under a setting (`hugelab compare --setting NAME:TUNABLE=VALUE`):
//! which of the workload's own `set` lines a setting overrides, and which it
//! refuses.
//!
//! The rule. A workload's **prelude** is its leading `set`, `machine` and
//! `cgroup` statements (comments and blank lines are no statements): they
//! configure the machine and run nothing. It ends at the first other
//! statement, or right after the first `set` of a HugeTLB pool size
//! (`vm.nr_hugepages`, `hugepages/hugepages-<N>kB/nr_hugepages`), which
//! allocates pages: `vm.hugetlb_optimize_vmemmap` applies to the pages
//! allocated while it holds (mm/hugetlb_vmemmap.c), so a change of it after a
//! pool has grown is part of the experiment, not configuration.
//!
//! A setting's `set` statements run before the workload. A `set` of the same
//! tunable in the prelude is dropped (the setting wins) and reported; a `set`
//! of it after the prelude is a mid-run change the setting cannot hold, and
//! is refused as an error at its line, before it runs.
//!
//! The same tunable means the same kernel variable: the same file, and
//! `vm.nr_hugepages` / `vm.nr_overcommit_hugepages`, which are the default
//! HugeTLB size's (2048kB on x86-64, the model's machine)
//! `hugepages/hugepages-2048kB/...` files under another name. A per-size
//! `hugepages-<N>kB/enabled` is not the same tunable as
//! `transparent_hugepage/enabled`, even though its `inherit` reads it: the
//! per-size file keeps its own value. A setting of `transparent_hugepage/enabled`
//! therefore does not reach a size the prelude sets to anything but `inherit`;
//! [`UnderSetting`] reports those lines whose value differs from the
//! setting's as [`SettingEffect::unreached`].
//!
//! The workload is read as a stream: the prelude needs no lookahead, since
//! each statement is judged when it comes.

use crate::ast::{SetValue, ThpEnabled, ThpSizeEnabled, Tunable, VmSysctl};
use crate::parse::ParseError;
use crate::stmt::{self, Stmt, StmtKind};
use serde::Serialize;
use std::borrow::Borrow;

/// The HugeTLB size `vm.nr_hugepages` sizes (default_hstate on x86-64).
const DEFAULT_HSTATE_KB: u64 = 2048;

/// The kernel variable a `set` of `t` writes, aliases merged: two tunables
/// are the same when this gives the same value.
pub fn same_variable(t: &Tunable) -> Tunable {
    match t {
        Tunable::Sysctl(VmSysctl::NrHugepages) => Tunable::HugetlbNrHugepages {
            size_kb: DEFAULT_HSTATE_KB,
        },
        Tunable::Sysctl(VmSysctl::NrOvercommitHugepages) => Tunable::HugetlbNrOvercommit {
            size_kb: DEFAULT_HSTATE_KB,
        },
        t => t.clone(),
    }
}

/// Whether a `set` of `t` allocates or frees memory (a HugeTLB pool size):
/// the prelude ends after it.
fn sizes_a_pool(t: &Tunable) -> bool {
    matches!(
        t,
        Tunable::HugetlbNrHugepages { .. } | Tunable::Sysctl(VmSysctl::NrHugepages)
    )
}

/// A `set` line of the workload's prelude.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PreludeLine {
    pub line: u32,
    /// The statement as written (canonical text: `set <tunable> <value>`).
    pub statement: String,
}

/// What running a workload under a setting changed of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettingEffect {
    /// The prelude's `set` lines of the setting's tunables: dropped.
    pub overridden: Vec<PreludeLine>,
    /// Prelude lines setting a THP size to something other than `inherit`
    /// and other than the value the setting gives
    /// `transparent_hugepage/enabled`: that size does not follow the setting.
    pub unreached: Vec<PreludeLine>,
}

/// The statements of a workload under a setting that sets `tunables`: its
/// prelude's `set` lines of those tunables dropped (and recorded in
/// `effect`), a later `set` of one of them an error. Wraps the workload's
/// statement stream; the setting's own statements go before it.
pub struct UnderSetting<'a, I> {
    stmts: I,
    file: String,
    setting: String,
    tunables: Vec<Tunable>,
    /// The setting's `transparent_hugepage/enabled`, if it sets it.
    thp_enabled: Option<ThpEnabled>,
    /// The line of the statement that ended the prelude, once it has.
    started: Option<u32>,
    effect: &'a mut SettingEffect,
    done: bool,
}

impl<'a, I> UnderSetting<'a, I> {
    /// `file` names the workload in errors, `setting` the setting, `sets`
    /// what it writes.
    pub fn new<'t>(
        stmts: I,
        file: &str,
        setting: &str,
        sets: impl IntoIterator<Item = (&'t Tunable, &'t SetValue)>,
        effect: &'a mut SettingEffect,
    ) -> UnderSetting<'a, I> {
        let mut tunables = Vec::new();
        let mut thp_enabled = None;
        for (tunable, value) in sets {
            tunables.push(same_variable(tunable));
            if let SetValue::Enabled(v) = value {
                thp_enabled = Some(*v);
            }
        }
        UnderSetting {
            stmts,
            file: file.to_string(),
            setting: setting.to_string(),
            thp_enabled,
            tunables,
            started: None,
            effect,
            done: false,
        }
    }
}

impl<I, S> Iterator for UnderSetting<'_, I>
where
    I: Iterator<Item = Result<S, ParseError>>,
    S: Borrow<Stmt>,
{
    type Item = Result<S, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            let stmt = match self.stmts.next()? {
                Ok(s) => s,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            let s: &Stmt = stmt.borrow();
            let line = s.pos.line;
            let in_prelude = self.started.is_none();
            let StmtKind::Set(stmt::Set { tunable, value }) = &s.kind else {
                if in_prelude
                    && !matches!(s.kind, StmtKind::Machine { .. } | StmtKind::Cgroup { .. })
                {
                    self.started = Some(line);
                }
                return Some(Ok(stmt));
            };
            let ends_prelude = sizes_a_pool(tunable);
            if self.tunables.contains(&same_variable(tunable)) {
                if let Some(started) = self.started {
                    self.done = true;
                    return Some(Err(ParseError {
                        file: self.file.clone(),
                        line,
                        col: s.pos.col,
                        message: format!(
                            "setting {} sets {}, which this line sets again after the \
                             workload started (line {started}); a setting overrides only the \
                             `set` lines before the first statement that runs, so remove this \
                             line or that tunable from the setting",
                            self.setting,
                            tunable.path()
                        ),
                    }));
                }
                self.effect.overridden.push(PreludeLine {
                    line,
                    statement: s.to_string(),
                });
                if ends_prelude {
                    self.started = Some(line);
                }
                continue;
            }
            let unreached = match (self.thp_enabled, value) {
                (Some(top), SetValue::SizeEnabled(size)) => {
                    *size != ThpSizeEnabled::Inherit && size.name() != top.name()
                }
                _ => false,
            };
            if in_prelude && unreached {
                self.effect.unreached.push(PreludeLine {
                    line,
                    statement: s.to_string(),
                });
            }
            if in_prelude && ends_prelude {
                self.started = Some(line);
            }
            return Some(Ok(stmt));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Statements;

    /// Runs `text` under a setting of `sets` (`TUNABLE=VALUE`): the lines
    /// that pass, and the effect.
    fn under(text: &str, sets: &[&str]) -> (Vec<u32>, SettingEffect, Option<ParseError>) {
        let sets: Vec<(Tunable, SetValue)> = sets
            .iter()
            .map(|s| {
                let (t, v) = s.split_once('=').unwrap();
                let t: Tunable = t.parse().unwrap();
                let v = t.parse_value(v).unwrap();
                (t, v)
            })
            .collect();
        let tunables = sets.iter().map(|(t, v)| (t, v));
        let mut effect = SettingEffect::default();
        let mut lines = Vec::new();
        let mut error = None;
        let stmts = Statements::new("w.hlw", text.as_bytes());
        for item in UnderSetting::new(stmts, "w.hlw", "S", tunables, &mut effect) {
            match item {
                Ok(s) => lines.push(s.pos.line),
                Err(e) => error = Some(e),
            }
        }
        (lines, effect, error)
    }

    #[test]
    fn a_setting_drops_the_preludes_set_of_its_tunable_and_says_which() {
        let text = "# c\nset transparent_hugepage/enabled never\n\
                    set transparent_hugepage/hugepages-64kB/enabled always\n\
                    spawn a\na mmap r 1M\n";
        let (lines, effect, error) =
            under(text, &["transparent_hugepage/hugepages-64kB/enabled=never"]);
        assert_eq!(lines, [2, 4, 5]);
        assert_eq!(error, None);
        assert_eq!(
            effect.overridden,
            [PreludeLine {
                line: 3,
                statement: "set transparent_hugepage/hugepages-64kB/enabled always".into()
            }]
        );
        assert!(effect.unreached.is_empty());
    }

    #[test]
    fn a_set_of_the_settings_tunable_after_the_prelude_is_refused() {
        let text = "set transparent_hugepage/enabled never\nspawn a\n\
                    set transparent_hugepage/enabled always\nexit a\n";
        let (lines, effect, error) = under(text, &["transparent_hugepage/enabled=never"]);
        assert_eq!(lines, [2]);
        assert_eq!(effect.overridden.len(), 1);
        let e = error.expect("refused");
        assert_eq!((e.line, e.col), (3, 1));
        assert!(e
            .message
            .starts_with("setting S sets transparent_hugepage/enabled"));
        assert!(e.message.contains("(line 2)"), "{}", e.message);
    }

    #[test]
    fn machine_and_cgroup_belong_to_the_prelude() {
        let text = "machine memory=1G\ncgroup g\nset transparent_hugepage/enabled never\nspawn a\n";
        let (lines, effect, error) = under(text, &["transparent_hugepage/enabled=never"]);
        assert_eq!((lines, error), (vec![1, 2, 4], None));
        assert_eq!(effect.overridden[0].line, 3);
    }

    /// vm.nr_hugepages is the default (2 MiB) pool's nr_hugepages; its
    /// per-size enabled and the top-level enabled are different files.
    #[test]
    fn aliases_are_the_same_tunable_and_inherit_is_not() {
        let text = "set vm.nr_overcommit_hugepages 3\n\
                    set transparent_hugepage/hugepages-2048kB/enabled always\n\
                    set transparent_hugepage/hugepages-64kB/enabled inherit\n\
                    set transparent_hugepage/hugepages-32kB/enabled never\nspawn a\n";
        let (lines, effect, _) = under(
            text,
            &[
                "hugepages/hugepages-2048kB/nr_overcommit_hugepages=2",
                "transparent_hugepage/enabled=never",
            ],
        );
        assert_eq!(lines, [2, 3, 4, 5]);
        assert_eq!(effect.overridden[0].line, 1);
        // The 2048kB size set to always does not follow the setting's enabled
        // never; the 64kB one, set to inherit, does; the 32kB one, never,
        // agrees with it.
        assert_eq!(
            effect.unreached,
            [PreludeLine {
                line: 2,
                statement: "set transparent_hugepage/hugepages-2048kB/enabled always".into()
            }]
        );
    }

    /// HVO applies to the pages allocated while it is on: a change of it
    /// after the first pool size is part of the experiment.
    #[test]
    fn a_pool_size_ends_the_prelude() {
        let text = "set vm.hugetlb_optimize_vmemmap 0\n\
                    set hugepages/hugepages-2048kB/nr_hugepages 4\n\
                    set vm.hugetlb_optimize_vmemmap 1\n";
        let (lines, effect, error) = under(text, &["vm.hugetlb_optimize_vmemmap=1"]);
        assert_eq!(lines, [2]);
        assert_eq!(effect.overridden[0].line, 1);
        assert_eq!(error.expect("refused").line, 3);
        // The pool size itself, overridden, ends the prelude too.
        let (lines, _, error) = under(text, &["vm.nr_hugepages=2"]);
        assert_eq!(lines, [1, 3]);
        assert_eq!(error, None);
        let text = "set vm.nr_hugepages 4\nset vm.nr_hugepages 8\n";
        let (_, _, error) = under(text, &["hugepages/hugepages-2048kB/nr_hugepages=2"]);
        assert_eq!(error.expect("refused").line, 2);
    }

    #[test]
    fn parse_errors_pass_through_and_end_the_stream() {
        let (lines, _, error) = under("spawn a\nbogus\nspawn b\n", &[]);
        assert_eq!(lines, [1]);
        assert_eq!(error.expect("a parse error").line, 2);
    }
}
