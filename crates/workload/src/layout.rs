//! Other address layouts of a recording: the same program as another run
//! of it would have placed it, under address-space layout randomisation.
//!
//! A recording carries the addresses of one run (`at=` of `mmap`, `brk`,
//! `mremap`). Linux 6.18 randomises them per exec (mm/util.c
//! `arch_mmap_rnd`, `arch_randomize_brk`, the stack and the PIE base: page
//! granular, 28 bits on x86_64), and where a VMA starts modulo the PMD size
//! decides how many of its aligned 2 MiB ranges a THP can fill: under THP
//! `always` the same program's faults differ by hundreds from run to run
//! (docs/predict.md, xz). [`Relayout`] rewrites the addresses as another
//! run's: every mm moves down by its own page-granular shift below the PMD
//! size, drawn from the layout number and the mm's order of creation, so a
//! layout is the same on every replay.
//!
//! Deliberate simplifications:
//! - One shift per mm for all of its mappings. The kernel draws the mmap
//!   base, the brk start, the stack and the executable apart; each VMA's
//!   alignment (what faults depend on) is equally random either way, and
//!   adjacent mappings stay adjacent, so VMA merging is as recorded.
//! - A private anonymous mapping whose size and recorded address are PMD
//!   multiples was THP-aligned by the kernel (`__get_unmapped_area` →
//!   `thp_get_unmapped_area_vmflags`), which pads the gap: it goes a whole
//!   PMD down instead, and so does every mapping of that mm the program makes
//!   after it below it (top-down placement continues under it, aligned as
//!   recorded); mappings above it keep the mm's shift.
//! - Layout 0 is the recording's own.

use crate::ast::Name;
use crate::units::{PAGE_SIZE, PMD_SIZE};
use crate::StmtKind;
use std::collections::HashMap;

/// The lowest address a shifted mapping may start at (vm.mmap_min_addr's
/// default): a shift that would go below keeps the recorded address.
const MMAP_MIN_ADDR: u64 = 0x10000;

/// How one mm's recorded addresses move.
#[derive(Clone, Copy, Debug)]
struct MmShift {
    /// Down by this much: a multiple of the base page below the PMD size.
    delta: u64,
    /// The top of the first THP-aligned anonymous mapping, once there is
    /// one: later mappings below it go a whole PMD down.
    aligned_top: Option<u64>,
}

impl MmShift {
    fn moved(&self, at: u64) -> u64 {
        let down = match self.aligned_top {
            Some(top) if at < top && self.delta != 0 => PMD_SIZE,
            _ => self.delta,
        };
        if at >= MMAP_MIN_ADDR + down {
            at - down
        } else {
            at
        }
    }
}

/// Rewrites a recording's statements, in order, as layout `layout` places
/// them.
#[derive(Debug)]
pub struct Relayout {
    layout: u64,
    /// mms made so far: the next one's number.
    mms: u64,
    /// Each live process's (and thread's) mm.
    mm_of: HashMap<Name, usize>,
    shifts: Vec<MmShift>,
}

impl Relayout {
    pub fn new(layout: u64) -> Relayout {
        Relayout {
            layout,
            mms: 0,
            mm_of: HashMap::new(),
            shifts: Vec::new(),
        }
    }

    /// A new mm (spawn, exec) for `proc`, with its own shift.
    fn new_mm(&mut self, proc: &str) {
        let delta = if self.layout == 0 {
            0
        } else {
            let draw = splitmix64(self.layout.wrapping_mul(0x9E37_79B9) ^ self.mms);
            draw % (PMD_SIZE / PAGE_SIZE) * PAGE_SIZE
        };
        self.mms += 1;
        self.shifts.push(MmShift {
            delta,
            aligned_top: None,
        });
        self.mm_of.insert(proc.to_string(), self.shifts.len() - 1);
    }

    /// The statement's addresses as this layout places them; processes
    /// and mms follow spawn, fork, thread and exec.
    pub fn apply(&mut self, kind: &mut StmtKind) {
        match kind {
            StmtKind::Spawn(s) => self.new_mm(&s.proc),
            StmtKind::Exec(e) => self.new_mm(&e.proc),
            StmtKind::Fork(f) => {
                // The child's mm is a copy: same addresses, same shift from
                // now on (a copy, so later alignments stay per mm).
                if let Some(&mm) = self.mm_of.get(&f.proc) {
                    self.shifts.push(self.shifts[mm]);
                    self.mm_of.insert(f.child.clone(), self.shifts.len() - 1);
                }
            }
            StmtKind::Thread(t) => {
                if let Some(&mm) = self.mm_of.get(&t.proc) {
                    self.mm_of.insert(t.thread.clone(), mm);
                }
            }
            StmtKind::Mmap(m) => {
                let thp_aligned = m.file.is_none()
                    && m.hugetlb.is_none()
                    && !m.shared
                    && m.size.0.is_multiple_of(PMD_SIZE);
                if let (Some(at), Some(shift)) = (m.at, self.shift_of(&m.proc)) {
                    if thp_aligned && at.is_multiple_of(PMD_SIZE) && shift.delta != 0 {
                        let top = at + m.size.0;
                        let first = *shift.aligned_top.get_or_insert(top);
                        shift.aligned_top = Some(first.max(top));
                    }
                    m.at = Some(shift.moved(at));
                }
            }
            StmtKind::Brk(b) => {
                if let (Some(at), Some(shift)) = (b.at, self.shift_of(&b.proc)) {
                    b.at = Some(shift.moved(at));
                }
            }
            StmtKind::Mremap(r) => {
                if let (Some(at), Some(shift)) = (r.at, self.shift_of(&r.proc)) {
                    r.at = Some(shift.moved(at));
                }
            }
            _ => {}
        }
    }

    fn shift_of(&mut self, proc: &str) -> Option<&mut MmShift> {
        let mm = *self.mm_of.get(proc)?;
        self.shifts.get_mut(mm)
    }
}

/// A 64-bit mix (Steele, Lea and Flood's SplitMix64 finaliser): the same
/// layout number gives the same shifts on every machine.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse;

    /// The `at=` of every statement that has one, after `layout`.
    fn addresses(text: &str, layout: u64) -> Vec<u64> {
        let w = parse("t.hlw", text).expect("parses");
        let mut r = Relayout::new(layout);
        w.stmts
            .into_iter()
            .filter_map(|mut s| {
                r.apply(&mut s.kind);
                match s.kind {
                    StmtKind::Mmap(m) => m.at,
                    StmtKind::Brk(b) => b.at,
                    StmtKind::Mremap(r) => r.at,
                    _ => None,
                }
            })
            .collect()
    }

    const TWO: &str = "spawn a\n\
        a mmap x 12K at=0x7f0000001000\n\
        a mmap y 8K at=0x7f0000004000\n\
        a brk heap 132K at=0x555500000000\n\
        spawn b\n\
        b mmap z 4K at=0x7f0000001000\n";

    #[test]
    fn layout_0_is_the_recording() {
        assert_eq!(
            addresses(TWO, 0),
            vec![
                0x7f0000001000,
                0x7f0000004000,
                0x555500000000,
                0x7f0000001000
            ]
        );
    }

    #[test]
    fn an_mm_moves_as_one_by_a_page_multiple_below_the_pmd_size() {
        let a = addresses(TWO, 1);
        let d = 0x7f0000001000 - a[0];
        assert!(d < PMD_SIZE && d.is_multiple_of(PAGE_SIZE));
        // Adjacent stays adjacent (x ends where y starts), the heap moves alike.
        assert_eq!(a[1], a[0] + 12 * 1024);
        assert_eq!(a[2], 0x555500000000 - d);
        // Layouts differ from each other and repeat exactly.
        let shifts: Vec<u64> = (1..9).map(|l| addresses(TWO, l)[0]).collect();
        assert!(
            shifts
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 4
        );
        assert_eq!(addresses(TWO, 3), addresses(TWO, 3));
    }

    #[test]
    fn a_fork_child_keeps_its_parents_shift_and_an_exec_draws_a_new_one() {
        let text = "spawn a\n\
            a mmap x 4K at=0x7f0000001000\n\
            a fork c\n\
            c mmap y 4K at=0x7f0000005000\n\
            c exec\n\
            c mmap z 4K at=0x7f0000005000\n";
        for layout in 1..20 {
            let a = addresses(text, layout);
            assert_eq!(0x7f0000001000 - a[0], 0x7f0000005000 - a[1]);
            if 0x7f0000005000 - a[2] != 0x7f0000001000 - a[0] {
                return;
            }
        }
        panic!("an exec never drew its own shift in 19 layouts");
    }

    #[test]
    fn a_thp_aligned_anonymous_mapping_goes_a_whole_pmd_down_and_so_does_what_comes_below() {
        let text = "spawn a\n\
            a mmap above 4K at=0x7f0000801000\n\
            a mmap big 4M at=0x7f0000400000\n\
            a mmap below 12K at=0x7f00003fd000\n\
            a mmap later-above 4K at=0x7f0000803000\n";
        let layout = (1..50)
            .find(|&l| addresses(text, l)[0] != 0x7f0000801000)
            .expect("some layout moves");
        let a = addresses(text, layout);
        let d = 0x7f0000801000 - a[0];
        assert_eq!(a[1], 0x7f0000400000 - PMD_SIZE);
        assert_eq!(a[2], 0x7f00003fd000 - PMD_SIZE);
        assert_eq!(a[3], 0x7f0000803000 - d);
    }
}
