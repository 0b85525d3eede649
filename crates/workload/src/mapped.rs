//! Which parts of a region are still mapped, so that the checker and the
//! kernel backend know when a region is gone: once `munmap`s (one or several)
//! have covered all of it, its name is free again (docs/language.md, "Names").
//!
//! The model asks its own VMAs instead; the rule is the same ("no VMA is left
//! in the region").

/// The mapped parts of a region, as sorted, disjoint `[start, end)` byte
/// offsets into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    parts: Vec<(u64, u64)>,
}

impl Mapped {
    /// A region of `len` bytes, all of it mapped.
    pub fn whole(len: u64) -> Mapped {
        Mapped {
            parts: if len == 0 { Vec::new() } else { vec![(0, len)] },
        }
    }

    /// `munmap` of `[start, end)` (offsets into the region): unmapping a
    /// part that is already unmapped is no error, as for the system call.
    pub fn unmap(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // The common case: the whole rest of the region goes.
        if let [(s, e)] = self.parts[..] {
            if start <= s && e <= end {
                self.parts.clear();
                return;
            }
        }
        let mut out = Vec::with_capacity(self.parts.len() + 1);
        for &(s, e) in &self.parts {
            if e <= start || s >= end {
                out.push((s, e));
                continue;
            }
            if s < start {
                out.push((s, start));
            }
            if e > end {
                out.push((end, e));
            }
        }
        self.parts = out;
    }

    /// Nothing of the region is mapped any more.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The mapped parts, in order.
    pub fn parts(&self) -> &[(u64, u64)] {
        &self.parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_munmaps_cover_a_region() {
        let mut m = Mapped::whole(16);
        m.unmap(4, 8);
        assert_eq!(m.parts(), &[(0, 4), (8, 16)]);
        m.unmap(4, 8); // again: nothing changes
        assert_eq!(m.parts(), &[(0, 4), (8, 16)]);
        m.unmap(0, 6);
        assert_eq!(m.parts(), &[(8, 16)]);
        m.unmap(12, 16);
        assert!(!m.is_empty());
        m.unmap(8, 12);
        assert!(m.is_empty());
    }

    #[test]
    fn one_munmap_of_everything() {
        let mut m = Mapped::whole(16);
        m.unmap(0, 16);
        assert!(m.is_empty());
        let mut m = Mapped::whole(16);
        m.unmap(2, 4);
        m.unmap(0, 16);
        assert!(m.is_empty());
    }
}
