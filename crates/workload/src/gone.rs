//! What regions and processes leave behind when they go (a `munmap` after
//! which nothing of a region is mapped, an `exit`): their counters as of the
//! statement that ended them, which later readings and snapshots no longer
//! have but `expect` lines may still ask for (docs/language.md, "Names that
//! come back").
//!
//! A workload recorded from a real program can map and unmap hundreds of
//! thousands of regions, so what they left is kept compactly: per region (or
//! per process, for its own counters), the list of fields it reported,
//! shared between all those that reported the same ones, and only the values
//! that were not 0. A name used again replaces what its last owner left.

use crate::counters;
use crate::observation::Reading;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// The fields one owner (a region, or a process's own counters) reported,
/// by their names without the owner's parts (`smaps.Rss`,
/// `folios.64kB.pte`, `stat.minflt`), sorted.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Shape(Box<[Box<str>]>);

impl Shape {
    /// The shape of the counters of region `region` of `proc` in `reading`
    /// (`None` if it has none): for [`Gone::add_zeroed_region`].
    pub fn of_region(reading: &Reading, proc: &str, region: &str) -> Option<Arc<Shape>> {
        let mut fields: Vec<Box<str>> = reading
            .counters
            .keys()
            .chain(reading.unknown.keys())
            .filter_map(|name| {
                let (owner, field) = split(name)?;
                (owner.proc == proc && owner.region == Some(region)).then(|| field.into())
            })
            .collect();
        fields.sort_unstable();
        fields.dedup();
        (!fields.is_empty()).then(|| Arc::new(Shape(fields.into())))
    }

    fn index(&self, field: &str) -> Option<usize> {
        self.0.binary_search_by(|f| (**f).cmp(field)).ok()
    }

    /// The field names, for tests and messages.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|f| &**f)
    }
}

/// Whose counter a name is: a process, and a region of it or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct OwnerRef<'a> {
    proc: &'a str,
    region: Option<&'a str>,
}

impl OwnerRef<'_> {
    /// The map key: `proc` or `proc/region` (`/` is in no name).
    fn key(&self) -> String {
        match self.region {
            Some(r) => format!("{}/{r}", self.proc),
            None => self.proc.to_string(),
        }
    }
}

/// The owner of a per-process or per-region counter and its field name
/// without the owner's parts; `None` for any other counter.
fn split(name: &str) -> Option<(OwnerRef<'_>, String)> {
    let c = counters::lookup(name)?;
    let proc = c.proc?;
    let last = c.region.unwrap_or(proc);
    // `proc` and `region` are slices of `name`, where the owner's parts end.
    let end = (last.as_ptr() as usize) - (name.as_ptr() as usize) + last.len();
    let family = name.split('.').next()?;
    let rest = name.get(end + 1..)?;
    Some((
        OwnerRef {
            proc,
            region: c.region,
        },
        format!("{family}.{rest}"),
    ))
}

/// What one owner left: its fields, the values that were not 0, and the
/// fields the backend could not read then, with why.
#[derive(Debug)]
struct Left {
    shape: Arc<Shape>,
    values: Box<[(u32, i64)]>,
    unknown: Box<[(u32, Box<str>)]>,
}

/// A counter's last value, as [`Gone::get`] finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Last<'a> {
    Value(i64),
    /// The backend could not read it reliably when it went: why.
    Unknown(&'a str),
}

/// Everything gone regions and processes left, by owner.
#[derive(Debug, Default)]
pub struct Gone {
    left: HashMap<Box<str>, Left>,
    /// Every shape in use once, so that owners with the same fields share it.
    shapes: HashSet<Arc<Shape>>,
}

impl Gone {
    /// Keeps the per-process and per-region counters of `reading` (a
    /// backend's reading of what just went) as their owners' last values;
    /// other counters in it are ignored. An owner in it replaces what an
    /// earlier owner of the same name left.
    pub fn add(&mut self, reading: Reading) {
        type Fields = Vec<(String, Result<i64, String>)>;
        let mut owners: BTreeMap<String, Fields> = BTreeMap::new();
        let known = reading.counters.into_iter().map(|(n, v)| (n, Ok(v)));
        let unknown = reading.unknown.into_iter().map(|(n, why)| (n, Err(why)));
        for (name, value) in known.chain(unknown) {
            if let Some((owner, field)) = split(&name) {
                owners.entry(owner.key()).or_default().push((field, value));
            }
        }
        for (key, mut fields) in owners {
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            fields.dedup_by(|a, b| a.0 == b.0);
            let names: Box<[Box<str>]> = fields.iter().map(|(f, _)| f.as_str().into()).collect();
            let shape = self.intern(Shape(names));
            let mut values = Vec::new();
            let mut unknown = Vec::new();
            for (i, (_, value)) in fields.into_iter().enumerate() {
                let i = u32::try_from(i).unwrap_or(u32::MAX);
                match value {
                    Ok(0) => {}
                    Ok(v) => values.push((i, v)),
                    Err(why) => unknown.push((i, why.into())),
                }
            }
            let left = Left {
                shape,
                values: values.into(),
                unknown: unknown.into(),
            };
            self.left.insert(key.into(), left);
        }
    }

    /// Region `region` of `proc` went leaving every counter of `shape` at 0
    /// (what a region with nothing mapped reads): kept without building a
    /// name per counter.
    pub fn add_zeroed_region(&mut self, proc: &str, region: &str, shape: &Arc<Shape>) {
        let key = OwnerRef {
            proc,
            region: Some(region),
        }
        .key();
        let left = Left {
            shape: Arc::clone(shape),
            values: Box::new([]),
            unknown: Box::new([]),
        };
        self.left.insert(key.into(), left);
    }

    fn intern(&mut self, shape: Shape) -> Arc<Shape> {
        if let Some(s) = self.shapes.get(&shape) {
            return Arc::clone(s);
        }
        let s = Arc::new(shape);
        self.shapes.insert(Arc::clone(&s));
        s
    }

    /// The last value of `counter`, if a region or process that went left it.
    pub fn get(&self, counter: &str) -> Option<Last<'_>> {
        let (owner, field) = split(counter)?;
        let left = self.left.get(owner.key().as_str())?;
        let i = u32::try_from(left.shape.index(&field)?).ok()?;
        if let Some((_, why)) = left.unknown.iter().find(|(j, _)| *j == i) {
            return Some(Last::Unknown(why));
        }
        let v = left
            .values
            .iter()
            .find(|(j, _)| *j == i)
            .map_or(0, |(_, v)| *v);
        Some(Last::Value(v))
    }

    /// How many regions and processes left something (for tests).
    pub fn owners(&self) -> usize {
        self.left.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(known: &[(&str, i64)], unknown: &[(&str, &str)]) -> Reading {
        Reading {
            counters: known.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            unknown: unknown
                .iter()
                .map(|(n, w)| (n.to_string(), w.to_string()))
                .collect(),
            changes: Default::default(),
        }
    }

    #[test]
    fn keeps_last_values_by_owner_and_shares_shapes() {
        let mut g = Gone::default();
        g.add(reading(
            &[
                ("smaps.a.r.Rss", 0),
                ("folios.a.r.64kB", 3),
                ("stat.a.minflt", 7),
                ("smaps.a.Rss", 0),
                ("vmstat.pgfault", 9),
            ],
            &[("folios.a.r.4kB", "kpageflags read 0")],
        ));
        assert_eq!(g.get("smaps.a.r.Rss"), Some(Last::Value(0)));
        assert_eq!(g.get("folios.a.r.64kB"), Some(Last::Value(3)));
        assert_eq!(
            g.get("folios.a.r.4kB"),
            Some(Last::Unknown("kpageflags read 0"))
        );
        assert_eq!(g.get("stat.a.minflt"), Some(Last::Value(7)));
        assert_eq!(g.get("smaps.a.Rss"), Some(Last::Value(0)));
        // Not a field it reported, not an owner that went, not per-owner.
        assert_eq!(g.get("smaps.a.r.Pss"), None);
        assert_eq!(g.get("smaps.a.q.Rss"), None);
        assert_eq!(g.get("vmstat.pgfault"), None);
        assert_eq!(g.owners(), 2);

        let shape = Shape::of_region(
            &reading(&[("smaps.b.q.Rss", 5), ("folios.b.q.64kB", 1)], &[]),
            "b",
            "q",
        )
        .unwrap();
        assert_eq!(
            shape.fields().collect::<Vec<_>>(),
            ["folios.64kB", "smaps.Rss"]
        );
        g.add_zeroed_region("b", "q", &shape);
        g.add_zeroed_region("a", "r", &shape); // replaces what r left
        assert_eq!(g.get("smaps.b.q.Rss"), Some(Last::Value(0)));
        assert_eq!(g.get("folios.a.r.64kB"), Some(Last::Value(0)));
        assert_eq!(g.get("folios.a.r.4kB"), None);
        assert_eq!(g.owners(), 3);
    }
}
