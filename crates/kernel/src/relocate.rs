//! Fixed addresses (`at=`) on the kernel, where the agent's own mappings
//! live too. A recorded program's addresses are the kernel's random
//! choices of its run; the agent's own binary, libraries, heap and stack
//! sit at the kernel's fixed, non-random addresses (agents start with
//! ADDR_NO_RANDOMIZE), so the two rarely meet. When a process's first fixed
//! address does overlap or touch one of the agent's own mappings (touching
//! could merge with it), all of that process's fixed addresses are
//! relocated as a block by a multiple of 1 GiB: every address keeps its
//! offset within 2 MiB and 1 GiB, and regions keep their adjacency, which
//! is what decides THP eligibility, HugeTLB alignment and VMA merging. A
//! forked process inherits its parent's relocation. A later fixed address
//! that still meets an own mapping is refused with one sentence.
//!
//! Apart from its mappings, an address can share page-table pages with the
//! agent's own: a PUD table covers 512 GiB, and every recorded stack sits in
//! the top 512 GiB, where the agent's stack and libraries are too. The
//! kernel then allocates fewer page tables than the program did alone; the
//! page-table counters of such a process are unknown from then on, said
//! with the reason (moving every address out of those spans would need one
//! shift for all of a process's addresses, known only at its first).

use crate::agents::Proc;
use crate::call::failed;
use hugelab_workload::{BackendError, Stmt};

const GIB: u64 = 1 << 30;
/// What one PUD table maps (x86-64, 4-level page tables): addresses in the
/// same span share its page, and the PMD and PTE tables of smaller spans.
const PUD_TABLE_SPAN: u64 = 512 * GIB;
/// vm.mmap_min_addr's default.
const LOWEST: u64 = 0x1_0000;
/// The end of the user address space (x86-64, 4-level page tables).
const HIGHEST: u64 = 0x7fff_ffff_f000;
/// How many GiB a block may move.
const MAX_STEPS: i64 = 64;

/// The mappings of a /proc/PID/maps text that are none of the workload's
/// `regions` (start, len): the agent's own.
pub(crate) fn own_mappings(maps: &str, regions: &[(u64, u64)]) -> Vec<(u64, u64, String)> {
    let ours = |lo: u64, hi: u64| regions.iter().any(|&(s, l)| lo < s + l && hi > s);
    maps.lines()
        .filter_map(|line| {
            let (lo, hi) = crate::smaps::vma_header(line)?;
            let what = line
                .split_ascii_whitespace()
                .nth(5)
                .unwrap_or("anonymous memory");
            (!ours(lo, hi)).then(|| (lo, hi, what.to_string()))
        })
        .collect()
}

/// The first own mapping `[at, at + len)` overlaps or touches.
fn collision(own: &[(u64, u64, String)], at: u64, len: u64) -> Option<&(u64, u64, String)> {
    own.iter().find(|(lo, hi, _)| *lo <= at + len && *hi >= at)
}

/// The first own mapping in a PUD table span `[at, at + len)` is in too.
fn table_neighbour(own: &[(u64, u64, String)], at: u64, len: u64) -> Option<&(u64, u64, String)> {
    let span = |a: u64| a / PUD_TABLE_SPAN;
    let (first, last) = (span(at), span(at + len - 1));
    own.iter()
        .find(|(lo, hi, _)| span(*lo) <= last && span(hi - 1) >= first)
}

/// The shift in bytes (0, then -1 GiB, +1 GiB, -2 GiB...) that takes
/// `[at, at + len)` clear of `own` and keeps it in the user address space.
fn choose_shift(own: &[(u64, u64, String)], at: u64, len: u64) -> Option<i64> {
    let steps = (0..=MAX_STEPS).flat_map(|k| [-k, k]).skip(1);
    steps.map(|k| k * GIB as i64).find(|&d| {
        let lo = at as i64 + d;
        lo >= LOWEST as i64
            && lo + len as i64 <= HIGHEST as i64
            && collision(own, lo as u64, len).is_none()
    })
}

/// Where `[at, at + len)` of `proc` goes on the kernel: the address
/// relocated by the process's shift, decided at its first fixed address.
pub(crate) fn fixed_address(
    stmt: &Stmt,
    proc: &str,
    p: &mut Proc,
    at: u64,
    len: u64,
) -> Result<u64, BackendError> {
    let path = format!("/proc/{}/maps", p.agent.pid);
    let maps = std::fs::read_to_string(&path).map_err(|e| failed(stmt, format!("{path}: {e}")))?;
    let regions: Vec<(u64, u64)> = p.regions.values().map(|r| (r.start, r.len)).collect();
    let own = own_mappings(&maps, &regions);
    let shift = match p.shift {
        Some(s) => s,
        None => {
            let s = choose_shift(&own, at, len).ok_or_else(|| {
                failed(stmt, format!("no place within {MAX_STEPS} GiB of {at:#x} is clear of the agent's own mappings"))
            })?;
            if s != 0 {
                let (lo, hi, what) = collision(&own, at, len).expect("a collision moved it");
                eprintln!(
                    "hugelab: note: {proc}'s fixed addresses meet the agent's own mapping {lo:#x}-{hi:#x} ({what}) at line {}; relocated on the kernel by {:+} GiB (offsets within 1 GiB and adjacency kept)",
                    stmt.pos.line,
                    s / GIB as i64
                );
            }
            p.shift = Some(s);
            s
        }
    };
    let addr = (at as i64 + shift) as u64;
    if p.shared_tables.is_none() {
        if let Some((lo, hi, what)) = table_neighbour(&own, addr, len) {
            p.shared_tables = Some(format!(
                "{proc}'s fixed address {addr:#x} (line {}) is in the same 512 GiB as the agent's own mapping {lo:#x}-{hi:#x} ({what}): they share page-table pages the program alone would have allocated",
                stmt.pos.line
            ));
        }
    }
    match collision(&own, addr, len) {
        None => Ok(addr),
        Some((lo, hi, what)) => Err(failed(
            stmt,
            format!(
                "at={at:#x} ({len:#x} bytes{}) meets the agent's own mapping {lo:#x}-{hi:#x} ({what}), and this process's fixed addresses were placed already",
                if shift == 0 { String::new() } else { format!(", relocated to {addr:#x}") }
            ),
        )),
    }
}

/// Refuses `[addr, addr + len)`, an address on the kernel already
/// (relocated), when it meets an own mapping of the agent of `p`.
pub(crate) fn refuse_own_collision(
    stmt: &Stmt,
    p: &Proc,
    addr: u64,
    len: u64,
) -> Result<(), BackendError> {
    let path = format!("/proc/{}/maps", p.agent.pid);
    let maps = std::fs::read_to_string(&path).map_err(|e| failed(stmt, format!("{path}: {e}")))?;
    let regions: Vec<(u64, u64)> = p.regions.values().map(|r| (r.start, r.len)).collect();
    let own = own_mappings(&maps, &regions);
    match collision(&own, addr, len) {
        None => Ok(()),
        Some((lo, hi, what)) => Err(failed(
            stmt,
            format!(
                "{addr:#x} ({len:#x} bytes) meets the agent's own mapping {lo:#x}-{hi:#x} ({what})"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
555555554000-555555556000 r--p 00000000 fd:00 1 /usr/bin/hugelab
7ffff7fc0000-7ffff7fc2000 r-xp 00000000 00:00 0 [vdso]
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]
7e0000200000-7e0000400000 rw-p 00000000 00:00 0
";

    #[test]
    fn the_workloads_own_regions_are_not_the_agents() {
        let own = own_mappings(MAPS, &[(0x7e00_0020_0000, 0x20_0000)]);
        assert_eq!(own.len(), 3);
        assert_eq!(own[2].2, "[stack]");
    }

    #[test]
    fn touching_an_own_mapping_counts_and_a_workload_region_does_not() {
        let own = own_mappings(MAPS, &[(0x7e00_0020_0000, 0x20_0000)]);
        // Right below the stack: it could merge with it.
        assert!(collision(&own, 0x7fff_fffd_d000, 0x1000).is_some());
        assert!(collision(&own, 0x5555_5555_6000, 0x1000).is_some());
        // Over or next to a region of the workload: the kernel's EEXIST, or a merge the workload asked for.
        assert!(collision(&own, 0x7e00_0020_0000, 0x1000).is_none());
        assert!(collision(&own, 0x7e00_0040_0000, 0x1000).is_none());
    }

    #[test]
    fn a_clear_block_stays_and_a_colliding_one_moves_by_whole_gib() {
        let own = own_mappings(MAPS, &[]);
        assert_eq!(choose_shift(&own, 0x7f00_0000_0000, 0x1000), Some(0));
        // Touching the stack's bottom could merge with it: moved down 1 GiB.
        let at = 0x7fff_fffd_d000;
        assert_eq!(choose_shift(&own, at, 0x1000), Some(-(GIB as i64)));
        // Near the top a block cannot go up.
        assert_eq!(
            choose_shift(&own, 0x7fff_ffff_0000, 0xf000),
            Some(-(GIB as i64))
        );
        // At the bottom it cannot go down.
        let own = vec![(0x1_0000, 0x2_0000, "x".to_string())];
        assert_eq!(choose_shift(&own, 0x1_0000, 0x1000), Some(GIB as i64));
    }

    #[test]
    fn an_address_in_the_agents_512_gib_shares_its_page_tables() {
        let own = own_mappings(MAPS, &[]);
        // A recorded stack: the top 512 GiB, the agent's stack's.
        let near = table_neighbour(&own, 0x7ffd_8164_4000, 0x21000);
        assert_eq!(near.map(|m| m.2.as_str()), Some("[vdso]"));
        // A recorded library below 0x7f8000000000: a PUD table of its own.
        assert!(table_neighbour(&own, 0x7f5e_9941_c000, 0x2000).is_none());
        // A recorded PIE binary in the agent binary's 512 GiB.
        assert!(table_neighbour(&own, 0x5570_0000_0000, 0x1000).is_some());
        assert!(table_neighbour(&own, 0x5600_0000_0000, 0x1000).is_none());
    }
}
