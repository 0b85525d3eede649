//! The counters another process's activity made unknown, and since when.
//!
//! A counter is unknown from the first window that may hold another's
//! event in it on (its reason is the first one found). Its change between
//! two snapshots is still the workload's when no window between them was
//! disturbed for it: each window hit since the latest [`Taints::mark`] is
//! kept apart, so that `diff` can take a counter's value at a snapshot from
//! one run and its change since from another (the workload is
//! deterministic).

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Default)]
pub(crate) struct Taints {
    /// Counter → the first reason it is unknown.
    first: BTreeMap<String, String>,
    /// Counters a window disturbed since the latest mark.
    since_mark: BTreeSet<String>,
}

impl Taints {
    /// A window disturbed `name`, for `why` (kept if it is the first).
    pub(crate) fn insert(&mut self, name: String, why: String) {
        self.insert_with(name, || why);
    }

    /// [`Taints::insert`], the reason made only if it is the first.
    pub(crate) fn insert_with(&mut self, name: String, why: impl FnOnce() -> String) {
        self.since_mark.insert(name.clone());
        self.first.entry(name).or_insert_with(why);
    }

    pub(crate) fn contains_key(&self, name: &str) -> bool {
        self.first.contains_key(name)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&String> {
        self.first.get(name)
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_empty()
    }

    /// `mirror` is unknown exactly when, and since, `item` is (a counter
    /// the kernel keeps in another unit).
    pub(crate) fn mirror(&mut self, item: &str, mirror: &str) {
        match self.first.get(item).cloned() {
            Some(why) => self.first.insert(mirror.to_string(), why),
            None => self.first.remove(mirror),
        };
        if self.since_mark.contains(item) {
            self.since_mark.insert(mirror.to_string());
        } else {
            self.since_mark.remove(mirror);
        }
    }

    /// A snapshot was taken: windows from now on are the next interval's.
    pub(crate) fn mark(&mut self) {
        self.since_mark.clear();
    }

    /// Whether no window since the latest mark disturbed `name`.
    pub(crate) fn clean_since_mark(&self, name: &str) -> bool {
        !self.since_mark.contains(name)
    }

    /// The counters, for tests.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> impl Iterator<Item = &String> {
        self.first.keys()
    }
}

impl std::ops::Index<&str> for Taints {
    type Output = String;

    fn index(&self, name: &str) -> &String {
        &self.first[name]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_stays_and_a_mark_starts_a_clean_interval() {
        let mut t = Taints::default();
        t.insert("vmstat.pgfault".into(), "first".into());
        t.insert("vmstat.pgfault".into(), "second".into());
        assert_eq!(t["vmstat.pgfault"], "first");
        assert!(!t.clean_since_mark("vmstat.pgfault"));
        t.mark();
        assert!(t.contains_key("vmstat.pgfault"), "unknown still");
        assert!(
            t.clean_since_mark("vmstat.pgfault"),
            "but its change since is known"
        );
        t.insert_with("vmstat.pgfault".into(), || unreachable!("not the first"));
        assert!(!t.clean_since_mark("vmstat.pgfault"));
        t.mirror("vmstat.pgfault", "meminfo.X");
        assert_eq!(t["meminfo.X"], "first");
        assert!(!t.clean_since_mark("meminfo.X"));
    }
}
