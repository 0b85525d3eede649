//! `mremap` on the kernel (the system call of mm/mremap.c): the region's
//! range resized in place, or moved to `at=` (MREMAP_MAYMOVE|MREMAP_FIXED),
//! or, with `maymove`, to where the placement rule puts a region of the new
//! size when it cannot grow in place (the model's choice, made with
//! MREMAP_FIXED after the call without flags failed with ENOMEM). The
//! region then names the new place and size.

use crate::agents::{Agents, Region};
use crate::measure::Measurement;
use crate::protocol::{RemapTo, Request};
use hugelab_workload::mapped::Mapped;
use hugelab_workload::stmt::Mremap;
use hugelab_workload::units::PAGE_SIZE;
use hugelab_workload::{placement, BackendError, Stmt};

/// `<proc> mremap <range> <new-size> [at=<addr>] [maymove]`
pub(crate) fn mremap(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Mremap,
) -> Result<(), BackendError> {
    let (addr, old_len) = agents.range(stmt, &s.proc, &s.range)?;
    let new_len = s.new_size.bytes().next_multiple_of(PAGE_SIZE);
    let p = agents.get_mut(stmt, &s.proc)?;
    let mut cursor = p.cursor;
    let to = match s.at {
        Some(at) => {
            let at = crate::relocate::fixed_address(stmt, &s.proc, p, at, new_len)?;
            placement::after_fixed_region(&mut cursor, at, new_len);
            RemapTo::Fixed(at)
        }
        None if s.maymove && new_len > old_len => {
            let align = placement::default_align(new_len);
            RemapTo::Fallback(placement::place_region(&mut cursor, new_len, align))
        }
        None => RemapTo::InPlace,
    };
    let req = Request::Mremap {
        addr,
        old_len,
        new_len,
        to,
    };
    let mut new_addr = 0;
    m.window(stmt, false, agents, |agents| {
        let (a, call) = agents.request(stmt, &s.proc, req)?;
        new_addr = a as u64;
        Ok(call)
    })?;
    let p = agents.get_mut(stmt, &s.proc)?;
    let moved = match to {
        RemapTo::InPlace => false,
        RemapTo::Fixed(_) => true,
        RemapTo::Fallback(a) => new_addr == a,
    };
    if moved {
        p.cursor = cursor;
    }
    // As the checker keeps it: a shrink, or a move of the same size, keeps
    // the holes of what stays.
    let old = p.regions.get(&s.range.region);
    let anon = old.is_some_and(|r| r.anon);
    let private_file = old.is_some_and(|r| r.private_file);
    let mapped = match p.regions.get(&s.range.region) {
        Some(r) if new_len <= old_len => {
            let mut m = r.mapped.clone();
            m.unmap(new_len, old_len);
            m
        }
        _ => Mapped::whole(new_len),
    };
    p.regions.insert(
        s.range.region.clone(),
        Region {
            start: new_addr,
            len: new_len,
            mapped,
            anon,
            private_file,
        },
    );
    Ok(())
}
