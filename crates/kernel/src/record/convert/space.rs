//! One mm's address space as the workload names it: which region (and
//! where that region starts) each mapped address belongs to, its kind and
//! protection. A region keeps its name when parts of it are unmapped,
//! mprotected or moved, as the language's regions do.

use std::collections::BTreeMap;
use std::rc::Rc;

pub use hugelab_workload::Prot;

/// Whether a user access with protection `prot` faults in a page
/// (x86's `access_error`: a write needs PROT_WRITE, a read any access).
pub fn allows(prot: Prot, write: bool) -> bool {
    if write {
        prot.write()
    } else {
        prot != Prot::None
    }
}

/// What a region maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    Anon,
    /// MAP_SHARED|MAP_ANONYMOUS (shmem).
    Shared,
    /// A private file mapping.
    File,
    Heap,
    Stack,
    /// A special mapping exec made (`vdso`, `vvar`, `vvar_vclock`): its
    /// faults are `special` statements; no statement maps or unmaps it.
    Special,
    /// Not replayed (a shared writable file...): why.
    Skip(&'static str),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub end: u64,
    pub region: Rc<str>,
    /// Where the region's offset 0 is.
    pub base: u64,
    pub what: What,
    pub prot: Prot,
}

/// A piece of an extent inside a range: `[start, end)` of `extent`.
#[derive(Clone, Debug)]
pub struct Piece {
    pub start: u64,
    pub end: u64,
    pub extent: Extent,
}

#[derive(Default, Debug, Clone)]
pub struct Space {
    map: BTreeMap<u64, Extent>,
}

impl Space {
    pub fn find(&self, addr: u64) -> Option<(u64, &Extent)> {
        let (&start, e) = self.map.range(..=addr).next_back()?;
        (addr < e.end).then_some((start, e))
    }

    /// The pieces of extents overlapping `[start, end)`, clipped to it.
    pub fn pieces(&self, start: u64, end: u64) -> Vec<Piece> {
        let first = self.find(start).map_or(start, |(s, _)| s);
        self.map
            .range(first..end)
            .filter(|(_, e)| e.end > start)
            .map(|(&s, e)| Piece {
                start: s.max(start),
                end: e.end.min(end),
                extent: e.clone(),
            })
            .collect()
    }

    /// Removes `[start, end)`, splitting extents that straddle its edges.
    pub fn remove(&mut self, start: u64, end: u64) -> Vec<Piece> {
        let pieces = self.pieces(start, end);
        for p in &pieces {
            let (s, e) = self
                .find(p.start)
                .map(|(s, e)| (s, e.clone()))
                .expect("a piece's extent");
            self.map.remove(&s);
            if s < p.start {
                self.map.insert(
                    s,
                    Extent {
                        end: p.start,
                        ..e.clone()
                    },
                );
            }
            if p.end < e.end {
                self.map.insert(p.end, e);
            }
        }
        pieces
    }

    pub fn insert(&mut self, start: u64, extent: Extent) {
        self.remove(start, extent.end);
        self.map.insert(start, extent);
    }

    /// Sets the protection of `[start, end)`, returning the pieces whose
    /// protection changed (as they were).
    pub fn protect(&mut self, start: u64, end: u64, prot: Prot) -> Vec<Piece> {
        let changed: Vec<Piece> = self
            .pieces(start, end)
            .into_iter()
            .filter(|p| p.extent.prot != prot)
            .collect();
        for p in &changed {
            self.insert(
                p.start,
                Extent {
                    end: p.end,
                    prot,
                    ..p.extent.clone()
                },
            );
        }
        changed
    }

    /// Whether a region named `name` still has any extent.
    pub fn has_region(&self, name: &str) -> bool {
        self.map.values().any(|e| &*e.region == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(end: u64, name: &str, base: u64) -> Extent {
        Extent {
            end,
            region: name.into(),
            base,
            what: What::Anon,
            prot: Prot::ReadWrite,
        }
    }

    #[test]
    fn a_hole_punched_in_a_region_keeps_both_sides_named() {
        let mut s = Space::default();
        s.insert(0x1000, ext(0x9000, "a", 0x1000));
        s.insert(0x9000, ext(0xa000, "b", 0x9000));
        let gone = s.remove(0x3000, 0x5000);
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].start, gone[0].end), (0x3000, 0x5000));
        assert_eq!(s.find(0x2fff).unwrap().0, 0x1000);
        assert!(s.find(0x3000).is_none());
        let (start, e) = s.find(0x5000).unwrap();
        assert_eq!(
            (start, e.end, e.base, &*e.region),
            (0x5000, 0x9000, 0x1000, "a")
        );
        let changed = s.protect(0x8000, 0xa000, Prot::Read);
        assert_eq!(changed.len(), 2);
        assert_eq!(s.find(0x7fff).unwrap().1.prot, Prot::ReadWrite);
        assert_eq!(s.find(0x8000).unwrap().1.prot, Prot::Read);
        assert_eq!(s.pieces(0, u64::MAX).len(), 4);
        assert!(s.has_region("b"));
        s.remove(0x9000, 0xa000);
        assert!(!s.has_region("b"));
    }
}
