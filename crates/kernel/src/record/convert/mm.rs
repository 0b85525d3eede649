//! One recorded mm turned into statements: the mappings exec made, the mm
//! syscalls the program made (from their arguments and results), and its
//! first touches (from its page faults).

use super::around::{Around, PageCache};
use super::names::{ident, Files, Unique};
use super::out::{range, size, Out, PAGE};
use super::space::{allows, Extent, Piece, Prot, Space, What};
use super::Stats;
use hugelab_workload::stmt::{special_mapping, SPECIAL_MAPPINGS};
use std::io;
use std::rc::Rc;

// mmap flags (include/uapi/asm-generic/mman*.h, x86-64).
const MAP_SHARED: u64 = 0x01;
const MAP_FIXED: u64 = 0x10;
const MAP_ANONYMOUS: u64 = 0x20;
const MAP_GROWSDOWN: u64 = 0x100;
const MAP_POPULATE: u64 = 0x8000;
const MAP_STACK: u64 = 0x20000;
const MAP_HUGETLB: u64 = 0x40000;
/// setup_arg_pages grows the new stack by this much below the arguments.
const STACK_EXPAND: u64 = 128 << 10;

/// A mapping from a PERF_RECORD_MMAP2.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub addr: u64,
    pub len: u64,
    /// File offset in bytes.
    pub pgoff: u64,
    pub prot: u32,
    pub flags: u32,
    pub filename: String,
}

/// What the statements of one mm need from the rest of the conversion.
pub struct Ctx<'o, 'w> {
    pub out: &'o mut Out<'w>,
    pub files: &'o mut Files,
    pub cache: &'o mut PageCache,
    pub stats: &'o mut Stats,
}

#[derive(Default, Clone)]
pub struct Mm {
    pub space: Space,
    names: Unique,
    anon: u32,
    /// The break's start and where it is now.
    brk: Option<(u64, u64)>,
    /// Mappings exec made, written once the new image runs.
    exec_maps: Vec<Mapping>,
    /// The last fault if it was taken in kernel mode and nothing but faults
    /// came after it: its task, page and whether a write.
    last_kernel_fault: Option<(String, u64, bool)>,
    /// The files its regions map and the pages fault-around mapped.
    around: Around,
}

fn page_up(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

fn advice(n: u64) -> Option<&'static str> {
    Some(match n {
        4 => "DONTNEED",
        8 => "FREE",
        14 => "HUGEPAGE",
        15 => "NOHUGEPAGE",
        20 => "COLD",
        21 => "PAGEOUT",
        22 => "POPULATE_READ",
        23 => "POPULATE_WRITE",
        25 => "COLLAPSE",
        _ => return None,
    })
}

fn advice_skipped(n: u64) -> &'static str {
    match n {
        0 => "madvise NORMAL",
        1 => "madvise RANDOM",
        2 => "madvise SEQUENTIAL",
        3 => "madvise WILLNEED",
        9 => "madvise REMOVE",
        10 | 11 => "madvise DONTFORK/DOFORK",
        12 | 13 => "madvise MERGEABLE/UNMERGEABLE",
        16 | 17 => "madvise DONTDUMP/DODUMP",
        18 | 19 => "madvise WIPEONFORK/KEEPONFORK",
        102 | 103 => "madvise GUARD_INSTALL/REMOVE",
        _ => "madvise of other advice",
    }
}

impl Mm {
    /// A fork's child: see [`Around::forked`].
    pub fn forked(&mut self) {
        self.around.forked();
    }

    pub fn has_exec_maps(&self) -> bool {
        !self.exec_maps.is_empty()
    }

    /// Whether a mapping record made outside any syscall is the kernel
    /// growing a stack this mm already has (expand_downwards calls
    /// perf_event_mmap with the grown VMA): no new region, since the
    /// replay's growsdown region grows by the same faults.
    pub fn stack_grown(&self, addr: u64, len: u64) -> bool {
        let last = (addr + len).saturating_sub(1);
        matches!(self.space.find(last), Some((_, e)) if e.what == What::Stack)
    }

    /// A mapping exec made: kept until the image runs, a later one cutting
    /// an earlier one it overlaps (the ELF loader maps a whole image first
    /// and unmaps what its first segment does not use without a record).
    pub fn exec_mapping(&mut self, m: Mapping) {
        for prev in &mut self.exec_maps {
            if prev.addr < m.addr && m.addr < prev.addr + prev.len {
                prev.len = m.addr - prev.addr;
            }
        }
        self.exec_maps
            .retain(|p| !(m.addr <= p.addr && p.addr < m.addr + m.len));
        self.exec_maps.push(m);
    }

    fn region(&mut self, base: &str) -> Rc<str> {
        self.names.take(base).into()
    }

    fn skip(&mut self, start: u64, end: u64, why: &'static str) {
        let region = self.region("skipped");
        self.space.insert(
            start,
            Extent {
                end,
                region,
                base: start,
                what: What::Skip(why),
                prot: Prot::ReadWrite,
            },
        );
    }

    /// Writes the mappings exec made. `stack_low`: the lowest page the
    /// stack reached (from the first pass).
    pub fn write_exec_maps(
        &mut self,
        c: &mut Ctx,
        proc: &str,
        time: u64,
        stack_low: Option<u64>,
    ) -> io::Result<()> {
        for m in std::mem::take(&mut self.exec_maps) {
            let (start, end) = (m.addr, m.addr + page_up(m.len));
            match m.filename.as_str() {
                "[stack]" => self.stack(c, proc, time, start, end, stack_low)?,
                "[heap]" => {
                    self.brk = Some((start, end));
                    let heap = self.region("heap");
                    self.space
                        .insert(start, extent(end, heap, start, What::Heap, Prot::ReadWrite));
                    c.out.stmt(
                        time,
                        &format!("{proc} brk heap {} at={start:#x}", size(end - start)),
                    )?;
                }
                "//anon" | "" => {
                    let flags = u64::from(m.flags);
                    self.anon_mmap(c, proc, time, start, end, u64::from(m.prot), flags)?;
                }
                f if f.starts_with('[') => match SPECIAL_MAPPINGS.iter().find(|s| s.maps_name == f)
                {
                    Some(s) => self.space.insert(
                        start,
                        extent(end, s.name.into(), start, What::Special, Prot::Read),
                    ),
                    None => self.skip(start, end, "faults on other special mappings"),
                },
                path => {
                    let file = c.files.name(path);
                    self.file_mmap(
                        c,
                        proc,
                        time,
                        (start, end),
                        &file,
                        m.pgoff,
                        u64::from(m.prot),
                    )?;
                }
            }
        }
        Ok(())
    }

    fn stack(
        &mut self,
        c: &mut Ctx,
        proc: &str,
        time: u64,
        start: u64,
        end: u64,
        low: Option<u64>,
    ) -> io::Result<()> {
        let low = low.map_or(start, |l| l.min(start));
        let name = self.region("stack");
        self.space.insert(
            low,
            extent(end, name.clone(), low, What::Stack, Prot::ReadWrite),
        );
        c.out.stmt(
            time,
            &format!(
                "{proc} mmap {name} {} at={low:#x} growsdown initial={}",
                size(end - low),
                size(end - start)
            ),
        )?;
        // The pages exec wrote the arguments and environment into are
        // there without a fault event: the stack was grown by STACK_EXPAND
        // below them. exec faulted each in by GUP (get_arg_page), which
        // counts in the task's min_flt (mm_account_fault) but raises no
        // perf event; the replay's POPULATE_WRITE takes the same faults, so
        // the process's count includes them.
        let args = (end - start).saturating_sub(STACK_EXPAND).max(PAGE);
        *c.stats
            .faults_by_process
            .entry(proc.to_string())
            .or_default() += args / PAGE;
        c.out.stmt(
            time,
            &format!(
                "{proc} madvise {} POPULATE_WRITE",
                range(&name, low, end - args, end)
            ),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn anon_mmap(
        &mut self,
        c: &mut Ctx,
        proc: &str,
        time: u64,
        start: u64,
        end: u64,
        prot: u64,
        flags: u64,
    ) -> io::Result<()> {
        let prot = Prot::from_bits(prot);
        // The ELF loader's bss, or ld.so's, right after a file's data.
        let base = match self.space.find(start.wrapping_sub(1)) {
            Some((_, e)) if e.what == What::File && e.end == start && e.prot == Prot::ReadWrite => {
                match e.region.rsplit_once('-') {
                    Some((file, _)) => format!("{file}-bss"),
                    None => format!("{}-bss", e.region),
                }
            }
            _ => {
                self.anon += 1;
                format!("anon{}", self.anon)
            }
        };
        let shared = flags & MAP_SHARED != 0;
        let name = self.region(&base);
        let what = if shared { What::Shared } else { What::Anon };
        self.space
            .insert(start, extent(end, name.clone(), start, what, prot));
        let mut s = format!("{proc} mmap {name} {} at={start:#x}", size(end - start));
        if prot != Prot::ReadWrite {
            s += &format!(" prot={}", prot);
        }
        for (bit, word) in [
            (MAP_SHARED, " shared"),
            (MAP_STACK, " stack"),
            (MAP_POPULATE, " populate"),
        ] {
            if flags & bit != 0 {
                s += word;
            }
        }
        c.out.stmt(time, &s)
    }

    #[allow(clippy::too_many_arguments)]
    fn file_mmap(
        &mut self,
        c: &mut Ctx,
        proc: &str,
        time: u64,
        (start, end): (u64, u64),
        file: &str,
        offset: u64,
        prot_bits: u64,
    ) -> io::Result<()> {
        let prot = Prot::from_bits(prot_bits);
        let seg = match prot {
            _ if prot.write() => "data",
            _ if prot.exec() => "text",
            Prot::Read => "ro",
            _ => "none",
        };
        let name = self.region(&format!("{}-{seg}", ident(file)));
        self.around.file_region(name.clone(), file, offset);
        self.space
            .insert(start, extent(end, name.clone(), start, What::File, prot));
        let mut s = format!("{proc} mmap {name} {} file={file}", size(end - start));
        if offset != 0 {
            s += &format!(" offset={}", size(offset));
        }
        if prot != Prot::ReadWrite {
            s += &format!(" prot={}", prot);
        }
        s += &format!(" at={start:#x}");
        c.out.stmt(time, &s)
    }

    fn each_piece(
        &self,
        c: &mut Ctx,
        time: u64,
        pieces: &[Piece],
        stmt: impl Fn(&str) -> String,
    ) -> io::Result<()> {
        for p in pieces {
            if !matches!(p.extent.what, What::Skip(_) | What::Special) {
                let r = range(&p.extent.region, p.extent.base, p.start, p.end);
                c.out.stmt(time, &stmt(&r))?;
            }
        }
        Ok(())
    }

    fn munmap(
        &mut self,
        c: &mut Ctx,
        proc: &str,
        time: u64,
        start: u64,
        end: u64,
    ) -> io::Result<()> {
        self.around.forget(start, end);
        let gone = self.space.remove(start, end);
        self.each_piece(c, time, &gone, |r| format!("{proc} munmap {r}"))
    }

    /// A completed mm syscall: `nr` with `args` returned `ret`. `file`: the
    /// path the MMAP2 record of an fd-backed mmap named.
    #[allow(clippy::too_many_arguments)]
    pub fn syscall(
        &mut self,
        c: &mut Ctx,
        proc: &str,
        time: u64,
        nr: i64,
        a: [u64; 6],
        ret: i64,
        file: Option<String>,
    ) -> io::Result<()> {
        let failed = ret < 0 && ret > -4096;
        if failed && nr != 12 {
            c.stats.skip("failed mm syscalls");
            return Ok(());
        }
        match nr {
            9 => self.sys_mmap(c, proc, time, a, ret as u64, file),
            11 => self.munmap(c, proc, time, a[0], a[0] + page_up(a[1])),
            10 => {
                let prot = Prot::from_bits(a[2]);
                let changed = self.space.protect(a[0], a[0] + page_up(a[1]), prot);
                self.each_piece(c, time, &changed, |r| {
                    format!("{proc} mprotect {r} {}", prot)
                })
            }
            28 => match advice(a[2]) {
                Some(adv) => {
                    if matches!(adv, "DONTNEED" | "FREE") {
                        self.around.forget(a[0], a[0] + page_up(a[1]));
                    }
                    let pieces = self.space.pieces(a[0], a[0] + page_up(a[1]));
                    self.each_piece(c, time, &pieces, |r| format!("{proc} madvise {r} {adv}"))
                }
                None => {
                    c.stats.skip(advice_skipped(a[2]));
                    Ok(())
                }
            },
            12 => self.sys_brk(c, proc, time, ret as u64),
            25 => self.sys_mremap(c, proc, time, a, ret as u64),
            _ => Ok(()),
        }
    }

    fn sys_mmap(
        &mut self,
        c: &mut Ctx,
        proc: &str,
        time: u64,
        a: [u64; 6],
        addr: u64,
        file: Option<String>,
    ) -> io::Result<()> {
        let (prot, flags) = (a[2], a[3]);
        let end = addr + page_up(a[1]);
        if flags & MAP_FIXED != 0 {
            self.munmap(c, proc, time, addr, end)?;
        }
        if flags & MAP_HUGETLB != 0 {
            c.stats.skip("HugeTLB mappings at fixed addresses");
            self.skip(addr, end, "faults in HugeTLB mappings");
            return Ok(());
        }
        if flags & MAP_ANONYMOUS != 0 {
            if flags & MAP_GROWSDOWN != 0 {
                let name = self.region("stack");
                self.space.insert(
                    addr,
                    extent(end, name.clone(), addr, What::Stack, Prot::from_bits(prot)),
                );
                let size = size(end - addr);
                return c.out.stmt(
                    time,
                    &format!("{proc} mmap {name} {size} at={addr:#x} growsdown initial={size}"),
                );
            }
            return self.anon_mmap(c, proc, time, addr, end, prot, flags);
        }
        match file {
            Some(f) if f == "/dev/zero" => self.anon_mmap(c, proc, time, addr, end, prot, flags),
            Some(_) if flags & MAP_SHARED != 0 && prot & 2 != 0 => {
                c.stats.skip("shared writable file mappings");
                self.skip(addr, end, "faults in shared writable file mappings");
                Ok(())
            }
            Some(path) => {
                let file = c.files.name(&path);
                self.file_mmap(c, proc, time, (addr, end), &file, a[5], prot)
            }
            None => {
                c.stats.skip("file mappings without a name");
                self.skip(addr, end, "faults in file mappings without a name");
                Ok(())
            }
        }
    }

    fn sys_brk(&mut self, c: &mut Ctx, proc: &str, time: u64, ret: u64) -> io::Result<()> {
        let now = page_up(ret);
        let Some((start, end)) = self.brk else {
            // The first brk (brk(0)): where the break starts.
            self.brk = Some((now, now));
            return Ok(());
        };
        if now == end || now < start {
            return Ok(());
        }
        let first = !self.space.has_region("heap") && end == start;
        if now > end {
            let heap: Rc<str> = match self.space.find(start) {
                Some((_, e)) if e.what == What::Heap => e.region.clone(),
                _ if first => self.region("heap"),
                _ => "heap".into(),
            };
            self.space
                .insert(end, extent(now, heap, start, What::Heap, Prot::ReadWrite));
        } else {
            self.space.remove(now, end);
        }
        self.brk = Some((start, now));
        let at = if first {
            format!(" at={start:#x}")
        } else {
            String::new()
        };
        c.out
            .stmt(time, &format!("{proc} brk heap {}{at}", size(now - start)))
    }

    fn sys_mremap(
        &mut self,
        c: &mut Ctx,
        proc: &str,
        time: u64,
        a: [u64; 6],
        to: u64,
    ) -> io::Result<()> {
        let (from, old_len, new_len) = (a[0], page_up(a[1]), page_up(a[2]));
        let pieces = self.space.pieces(from, from + old_len);
        let [p] = pieces.as_slice() else {
            c.stats.skip("mremap of more or less than one mapping");
            return Ok(());
        };
        if old_len == 0 || p.start != from || p.end != from + old_len {
            c.stats.skip("mremap of more or less than one mapping");
            return Ok(());
        }
        let e = p.extent.clone();
        if e.base != from {
            // The language moves whole regions only.
            c.stats.skip("mremap of part of a region");
            return Ok(());
        }
        self.space.remove(from, from + old_len);
        self.around.forget(from, from + old_len);
        let base = to;
        self.space.insert(
            to,
            Extent {
                end: to + new_len,
                base,
                ..e.clone()
            },
        );
        if matches!(e.what, What::Skip(_) | What::Special) {
            return Ok(());
        }
        let mut s = format!(
            "{proc} mremap {} {}",
            range(&e.region, e.base, from, from + old_len),
            size(new_len)
        );
        if to != from {
            s += &format!(" at={to:#x}");
        }
        c.out.stmt(time, &s)
    }

    /// Something other than a fault happened in this mm (a syscall, a fork,
    /// an exit): a fault after it is not the retry of one before.
    pub fn not_a_fault(&mut self) {
        self.last_kernel_fault = None;
    }

    /// A page fault at `addr` with x86 `error_code`, by task `task`:
    /// whether it is replayed (as a first touch).
    ///
    /// A kernel access with page faults disabled (`faulthandler_disabled`:
    /// the XSAVE of a signal frame onto the stack, `copy_fpstate_to_sigframe`,
    /// a futex op) raises the fault event but is not handled, nor counted
    /// in min_flt (`do_user_addr_fault` gives up before
    /// `handle_mm_fault`); the kernel then faults the page in with faults
    /// enabled and retries. So a task's fault on the page its previous
    /// fault, a kernel one, was on, needing no more access, with nothing
    /// between them in the mm, is that retry: one fault, replayed once.
    pub fn fault(
        &mut self,
        c: &mut Ctx,
        task: &str,
        time: u64,
        addr: u64,
        error_code: u64,
    ) -> io::Result<Fault> {
        let write = error_code & 2 != 0;
        let present = error_code & 1 != 0;
        let page = addr & !(PAGE - 1);
        let retry = matches!(&self.last_kernel_fault,
            Some((t, p, w)) if t == task && *p == page && (*w || !write));
        self.last_kernel_fault =
            (error_code & 4 == 0 && !retry).then(|| (task.to_string(), page, write));
        if retry {
            c.stats
                .skip("kernel faults with page faults disabled (retried)");
            return Ok(Fault::Skipped);
        }
        let Some((vma_start, e)) = self.space.find(page) else {
            c.stats
                .skip("faults outside the mappings the recording knows");
            return Ok(Fault::Skipped);
        };
        if let What::Skip(why) = e.what {
            c.stats.skip(why);
            return Ok(Fault::Skipped);
        }
        if (present && !write) || !allows(e.prot, write) {
            c.stats
                .skip("faults the program took a signal on (protection)");
            return Ok(Fault::Skipped);
        }
        if e.what == What::File && !present && !write && self.around.mapped_around(page) {
            c.stats.skip(RACED);
            return Ok(Fault::Raced);
        }
        let (region, base) = (e.region.clone(), e.base);
        if e.what == What::Special {
            return special_fault(c, task, time, &region, page - base, write);
        }
        if e.what == What::File && !present {
            let vma = (vma_start, e.end);
            self.around
                .fault(c.cache, (time, task), &region, base, vma, page, write);
        }
        // A read fault's fault-around makes the order of file reads matter.
        let ordered = e.what == What::File && !write;
        c.out
            .touch(time, task, &region, base, page, write, ordered)?;
        Ok(Fault::Replayed)
    }
}

/// What became of a recorded page fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Written as a first touch.
    Replayed,
    /// Not replayed, with its reason in `Stats::skipped`.
    Skipped,
    /// A read fault a concurrent fault-around left to happen ([`RACED`]):
    /// the kernel counted it in the task's min_flt, and no replay has it.
    Raced,
}

/// Why a raced read fault is not replayed (see `around`).
pub const RACED: &str =
    "file faults fault-around had not mapped (a cached page another process was faulting at once)";

/// A fault on page `offset` of special mapping `name`: a `special` read of
/// it, unless the program could not have gone on from it (a write, or a
/// page whose fault is SIGBUS).
fn special_fault(
    c: &mut Ctx,
    task: &str,
    time: u64,
    name: &str,
    offset: u64,
    write: bool,
) -> io::Result<Fault> {
    let readable =
        special_mapping(name).is_some_and(|(_, m)| m.readable & (1 << (offset / PAGE)) != 0);
    if write || !readable {
        c.stats
            .skip("faults the program took a signal on (special mappings)");
        return Ok(Fault::Skipped);
    }
    let r = range(name, 0, offset, offset + PAGE);
    c.out.stmt(time, &format!("{task} special {r}"))?;
    Ok(Fault::Replayed)
}

fn extent(end: u64, region: Rc<str>, base: u64, what: What, prot: Prot) -> Extent {
    Extent {
        end,
        region,
        base,
        what,
        prot,
    }
}
