//! The shape of a process's THPs with the meaning `tools/mm/thpmaps` (Linux
//! 6.18 tree) gives it, so a thpmaps user recognises every figure:
//!
//! - `anon-thp-pmd-aligned-2048kB`: PMD-mapped, from smaps `AnonHugePages`
//!   (file: `ShmemPmdMapped + FilePmdMapped`);
//! - `anon-thp-pte-{aligned,unaligned}-<size>kB`: folios of that size whose
//!   pages are all mapped by PTEs, contiguously in both virtual and physical
//!   address, split by whether the virtual address is aligned to the size;
//! - `anon-thp-pte-partial`: pages of large folios that are mapped but not
//!   as a whole, contiguous folio;
//! - `anon-cont-pte-aligned-<S>kB` (`--cont S`): naturally aligned blocks of
//!   S that are virtually and physically contiguous inside one folio
//!   (contpte / "hpa" coalescing eligibility), and `anon-cont-pmd-aligned-<S>kB`
//!   the PMD-mapped memory.
//!
//! A page is a THP page when kpageflags has `KPF_THP`; runs are maximal
//! ranges contiguous in both virtual and physical frame number, cut into
//! folios at `KPF_COMPOUND_HEAD`; a run that starts on a tail, or ends where
//! the next physical page is a tail, is partial there. Where this differs
//! from thpmaps, on purpose:
//!
//! - PMD-mapped ranges (found with PAGEMAP_SCAN) are not walked: thpmaps walks
//!   them and subtracts `AnonHugePages` from the 2 MiB PTE figure, which is
//!   wrong when some PMD-mapped THP reads 0 in kpageflags (these VMs);
//! - the huge zero PMD is left out: thpmaps counts it as a PTE-mapped file THP;
//! - a partial folio at the end of a run is attributed to anon or file by its
//!   head page, where thpmaps looks at the page before it (the previous run's
//!   last page, or the VMA's last page when the run holds one folio).
//!
//! Pages whose kpageflags read 0 are not THP pages for thpmaps either; the
//! scan counts them separately as unclassified instead of staying silent.

use hugelab_workload::units::{HPAGE_PMD_ORDER, PAGE_KB};
use serde::Serialize;

use crate::pagemap::{KPF_ANON, KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL, KPF_THP};

const ORDERS: usize = HPAGE_PMD_ORDER as usize + 1;
/// The smallest order thpmaps reports (`stats[2:]`): its figures leave out
/// whole folios of orders 0 and 1 (an order-1 file folio reads KPF_THP).
const FIRST_ORDER: usize = 2;

/// One of thpmaps's two memory types.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TypeShape {
    /// kB mapped by PMDs.
    pub pmd_kb: u64,
    /// Pages of whole, contiguous PTE-mapped folios by order, aligned or not.
    pub aligned: [u64; ORDERS],
    pub unaligned: [u64; ORDERS],
    /// Pages of folios mapped partially or not contiguously.
    pub partial: u64,
    /// Pages in aligned contiguous blocks, per `--cont` order (same order as
    /// `Shape::cont_orders`).
    pub cont: Vec<u64>,
}

/// The thpmaps figures of a VMA, a process or a rollup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Shape {
    pub anon: TypeShape,
    pub file: TypeShape,
    pub cont_orders: Vec<u32>,
    /// smaps `Anonymous` and `Rss - Anonymous`: thpmaps's percentages are of these.
    pub anon_total_kb: u64,
    pub file_total_kb: u64,
}

impl Shape {
    pub fn new(cont_orders: &[u32]) -> Shape {
        let ts = || TypeShape {
            cont: vec![0; cont_orders.len()],
            ..TypeShape::default()
        };
        Shape {
            anon: ts(),
            file: ts(),
            cont_orders: cont_orders.to_vec(),
            ..Shape::default()
        }
    }

    fn of(&mut self, anon: bool) -> &mut TypeShape {
        if anon {
            &mut self.anon
        } else {
            &mut self.file
        }
    }

    /// Adds another VMA's or process's figures (same `--cont` orders).
    pub fn add(&mut self, o: &Shape) {
        for (a, b) in [(&mut self.anon, &o.anon), (&mut self.file, &o.file)] {
            a.pmd_kb += b.pmd_kb;
            a.partial += b.partial;
            for k in 0..ORDERS {
                a.aligned[k] += b.aligned[k];
                a.unaligned[k] += b.unaligned[k];
            }
            for (x, y) in a.cont.iter_mut().zip(&b.cont) {
                *x += y;
            }
        }
        self.anon_total_kb += o.anon_total_kb;
        self.file_total_kb += o.file_total_kb;
    }

    /// Memory in large folios, anon and file, kB: thpmaps's thp figures
    /// (PMD-mapped, whole PTE-mapped folios of the orders it reports,
    /// partial), without the `--cont` ones, which count the same memory
    /// again.
    pub fn thp_kb(&self) -> u64 {
        [&self.anon, &self.file]
            .iter()
            .map(|t| {
                let whole: u64 = t.aligned[FIRST_ORDER..]
                    .iter()
                    .chain(&t.unaligned[FIRST_ORDER..])
                    .sum();
                t.pmd_kb + (whole + t.partial) * PAGE_KB
            })
            .sum()
    }

    /// `(thpmaps label, kB, is anon)` in thpmaps's order.
    pub fn labels(&self) -> Vec<(String, u64, bool)> {
        let pmd_kb = PAGE_KB << (ORDERS - 1);
        let mut out = vec![
            (
                format!("anon-thp-pmd-aligned-{pmd_kb}kB"),
                self.anon.pmd_kb,
                true,
            ),
            (
                format!("file-thp-pmd-aligned-{pmd_kb}kB"),
                self.file.pmd_kb,
                false,
            ),
        ];
        for (ty, t, anon) in [("anon", &self.anon, true), ("file", &self.file, false)] {
            for (sub, v) in [("aligned", &t.aligned), ("unaligned", &t.unaligned)] {
                for (order, pages) in v.iter().enumerate().skip(FIRST_ORDER) {
                    let kb = PAGE_KB << order;
                    out.push((format!("{ty}-thp-pte-{sub}-{kb}kB"), pages * PAGE_KB, anon));
                }
            }
            out.push((format!("{ty}-thp-pte-partial"), t.partial * PAGE_KB, anon));
        }
        for (i, order) in self.cont_orders.iter().enumerate() {
            let kb = PAGE_KB << order;
            out.push((
                format!("anon-cont-pmd-aligned-{kb}kB"),
                self.anon.pmd_kb,
                true,
            ));
            out.push((
                format!("file-cont-pmd-aligned-{kb}kB"),
                self.file.pmd_kb,
                false,
            ));
            out.push((
                format!("anon-cont-pte-aligned-{kb}kB"),
                self.anon.cont[i] * PAGE_KB,
                true,
            ));
            out.push((
                format!("file-cont-pte-aligned-{kb}kB"),
                self.file.cont[i] * PAGE_KB,
                false,
            ));
        }
        out
    }
}

/// A `--cont` block being walked.
#[derive(Clone, Copy, Default)]
struct Block {
    active: bool,
    pos: u64,
    boundary: bool,
    anon: bool,
}

/// The folio being walked inside a run.
#[derive(Clone, Copy)]
struct Folio {
    vfn: u64,
    nr: u64,
    anon: bool,
}

/// Feeds PTE-mapped present pages in virtual order, one VMA at a time.
pub struct ShapeWalker<'a> {
    shape: &'a mut Shape,
    open: bool,
    last_vfn: u64,
    last_pfn: u64,
    /// kpageflags of the physical page after the last one.
    last_after: u64,
    first_anon: bool,
    folio: Option<Folio>,
    /// Per `--cont` order: does the run's alignment allow blocks, and the block.
    cont_ok: Vec<bool>,
    blocks: Vec<Block>,
}

impl<'a> ShapeWalker<'a> {
    pub fn new(shape: &'a mut Shape) -> ShapeWalker<'a> {
        let n = shape.cont_orders.len();
        ShapeWalker {
            shape,
            open: false,
            last_vfn: 0,
            last_pfn: 0,
            last_after: 0,
            first_anon: false,
            folio: None,
            cont_ok: vec![false; n],
            blocks: vec![Block::default(); n],
        }
    }

    /// A present page mapped by a PTE: its frame numbers, its kpageflags and
    /// those of the physical page after it.
    pub fn page(&mut self, vfn: u64, pfn: u64, flags: u64, after: u64) {
        if flags & (1 << KPF_THP) == 0 {
            self.close();
            return;
        }
        let anon = flags & (1 << KPF_ANON) != 0;
        let head = flags & (1 << KPF_COMPOUND_HEAD) != 0;
        if !(self.open && vfn == self.last_vfn + 1 && pfn == self.last_pfn + 1) {
            self.close();
            self.open = true;
            self.first_anon = anon;
            for (k, &order) in self.shape.cont_orders.iter().enumerate() {
                let mask = (1u64 << order) - 1;
                self.cont_ok[k] = (pfn ^ vfn) & mask == 0;
            }
        }
        if head {
            if let Some(f) = self.folio.take() {
                self.whole(f);
            }
            self.folio = Some(Folio { vfn, nr: 1, anon });
        } else if let Some(f) = &mut self.folio {
            f.nr += 1;
        } else {
            let first = self.first_anon;
            self.shape.of(first).partial += 1;
        }
        for k in 0..self.blocks.len() {
            if !self.cont_ok[k] {
                continue;
            }
            let nr = 1u64 << self.shape.cont_orders[k];
            let b = &mut self.blocks[k];
            if vfn.is_multiple_of(nr) {
                *b = Block {
                    active: true,
                    pos: 0,
                    boundary: false,
                    anon,
                };
            } else if b.active {
                b.pos += 1;
                b.boundary |= head;
            }
            if b.active && b.pos == nr - 1 {
                b.active = false;
                if !b.boundary {
                    let anon = b.anon;
                    self.shape.of(anon).cont[k] += nr;
                }
            }
        }
        self.last_vfn = vfn;
        self.last_pfn = pfn;
        self.last_after = after;
    }

    /// Anything that is not a PTE-mapped present page ends the run.
    pub fn close(&mut self) {
        if let Some(f) = self.folio.take() {
            if self.last_after & (1 << KPF_COMPOUND_TAIL) != 0 {
                self.shape.of(f.anon).partial += f.nr;
            } else {
                self.whole(f);
            }
        }
        self.open = false;
        for b in &mut self.blocks {
            b.active = false;
        }
    }

    /// A folio mapped whole: thpmaps takes its order as log2 of its length.
    fn whole(&mut self, f: Folio) {
        let order = (63 - f.nr.leading_zeros()) as usize;
        let nr = 1u64 << order;
        let t = self.shape.of(f.anon);
        if order >= ORDERS {
            t.partial += f.nr;
        } else if f.vfn.is_multiple_of(nr) {
            t.aligned[order] += nr;
        } else {
            t.unaligned[order] += nr;
        }
    }
}

impl Drop for ShapeWalker<'_> {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THP: u64 = 1 << KPF_THP;
    const ANON: u64 = 1 << KPF_ANON;
    const H: u64 = THP | ANON | (1 << KPF_COMPOUND_HEAD);
    const T: u64 = THP | ANON | (1 << KPF_COMPOUND_TAIL);

    /// Feeds `(vfn, pfn, flags)` pages; `after` is looked up in the list
    /// itself (the next physical page's flags), else 0.
    fn walk(pages: &[(u64, u64, u64)], cont: &[u32]) -> Shape {
        let mut s = Shape::new(cont);
        {
            let mut w = ShapeWalker::new(&mut s);
            for &(v, p, f) in pages {
                let after = pages.iter().find(|x| x.1 == p + 1).map_or(0, |x| x.2);
                w.page(v, p, f, after);
            }
        }
        s
    }

    fn folio(vfn: u64, pfn: u64, nr: u64) -> Vec<(u64, u64, u64)> {
        (0..nr)
            .map(|i| (vfn + i, pfn + i, if i == 0 { H } else { T }))
            .collect()
    }

    #[test]
    fn whole_folios_aligned_and_unaligned() {
        let mut pages = folio(0x1000, 0x5000, 16);
        pages.extend(folio(0x2008, 0x6000, 16));
        let s = walk(&pages, &[]);
        assert_eq!(s.anon.aligned[4], 16);
        assert_eq!(s.anon.unaligned[4], 16);
        assert_eq!(s.anon.partial, 0);
    }

    #[test]
    fn a_folio_missing_its_last_page_is_partial() {
        let mut pages = folio(0x1000, 0x5000, 16);
        // The 16th page is unmapped, but its flags are known to the walk as
        // the physical page after the 15th: a tail.
        let last = pages.pop().unwrap();
        let mut s = Shape::new(&[]);
        {
            let mut w = ShapeWalker::new(&mut s);
            for &(v, p, f) in &pages {
                let after = if p + 1 == last.1 { last.2 } else { T };
                w.page(v, p, f, after);
            }
        }
        assert_eq!(s.anon.partial, 15);
        assert_eq!(s.anon.aligned[4], 0);
    }

    #[test]
    fn a_run_starting_on_a_tail_is_partial_up_to_the_next_head() {
        let mut pages: Vec<_> = folio(0x1000, 0x5000, 16).into_iter().skip(4).collect();
        pages.extend(
            folio(0x100c, 0x500c + 4, 16)
                .into_iter()
                .map(|(v, p, f)| (v + 4, p, f)),
        );
        let s = walk(&pages, &[]);
        assert_eq!(s.anon.partial, 12);
        assert_eq!(s.anon.aligned[4], 16);
    }

    #[test]
    fn cont_blocks_need_matching_alignment_and_no_head_inside() {
        // Two 32K folios back to back, physically contiguous: 64K blocks
        // would straddle a head; 32K blocks are fine.
        let mut pages = folio(0x1000, 0x5000, 8);
        pages.extend(folio(0x1008, 0x5008, 8));
        let s = walk(&pages, &[3, 4]);
        assert_eq!(s.anon.cont, vec![16, 0]);
        // Virtual and physical offsets differing modulo the block: none.
        let s = walk(&folio(0x1001, 0x5000, 16), &[2]);
        assert_eq!(s.anon.cont, vec![0]);
    }

    #[test]
    fn base_pages_are_not_thp() {
        let s = walk(&[(0x1000, 0x5000, ANON), (0x1001, 0x5001, ANON)], &[]);
        assert_eq!(s, Shape::new(&[]));
    }

    #[test]
    fn labels_are_thpmaps_labels() {
        let s = Shape::new(&[4]);
        let l: Vec<String> = s.labels().into_iter().map(|x| x.0).collect();
        assert_eq!(l[0], "anon-thp-pmd-aligned-2048kB");
        assert!(l.contains(&"anon-thp-pte-aligned-16kB".to_string()));
        assert!(l.contains(&"file-thp-pte-unaligned-2048kB".to_string()));
        assert!(l.contains(&"anon-thp-pte-partial".to_string()));
        assert!(l.contains(&"anon-cont-pte-aligned-64kB".to_string()));
        assert!(!l.iter().any(|x| x.contains("-8kB")));
    }

    /// thp_kb is the sum of the thp labels: an order-1 folio is in neither.
    #[test]
    fn thp_kb_is_what_the_thp_labels_show() {
        let mut pages = folio(0x1000, 0x5000, 2);
        pages.extend(folio(0x2000, 0x6000, 16));
        pages.extend(folio(0x3008, 0x7000, 4));
        let mut s = walk(&pages, &[4]);
        s.anon.pmd_kb = 2048;
        s.anon.partial = 3;
        assert_eq!(s.anon.aligned[1], 2);
        let labels: u64 = s
            .labels()
            .iter()
            .filter(|l| l.0.contains("-thp-"))
            .map(|l| l.1)
            .sum();
        assert_eq!(s.thp_kb(), labels);
        assert_eq!(s.thp_kb(), 2048 + (16 + 4 + 3) * PAGE_KB);
    }
}
