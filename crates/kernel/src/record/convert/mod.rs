//! Converting a recording into a workload (`.hlw`): two passes over the
//! spooled events ([`super::spool`]). The first ([`census`]) names the
//! processes and finds how far each main stack grew; the second writes the
//! statements as it reads, holding only the live mms' address spaces:
//! - tasks ([`tasks`]): a process per mm (`spawn` at the command's exec
//!   and at a vfork child's, `fork`, `exec`, `thread`, `exit`);
//! - mappings ([`mm`]): those exec made (PERF_RECORD_MMAP2: ELF segments,
//!   bss, stack, heap) and those the program made (its mmap, munmap,
//!   mprotect, madvise, brk and mremap, from their arguments and results;
//!   an fd-backed mmap's file from its MMAP2 record);
//! - first touches: each page fault a `read` or `write` of its page,
//!   consecutive ones coalesced into ranges ([`out`]);
//! - time: a pause of 1 ms or more between statements is a `sleep`.
//!
//! What is not replayed is counted by reason and listed at the end of the
//! workload: faults on the vdso, mappings the language cannot express yet,
//! advice without effect on anonymous memory, failed syscalls.

mod around;
mod census;
mod mm;
mod names;
mod out;
mod space;
mod tasks;
#[cfg(test)]
mod tests;

use super::event::{Event, Kind};
use super::settings::{self, SettingRead};
use super::spool::Spool;
use mm::{Ctx, Mapping, Mm};
use names::Files;
use out::Out;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use tasks::{Change, ProcId, Task, Tracker};

/// What the header says about the recording.
pub struct Header {
    pub command: Vec<String>,
    /// When it was recorded, as people read it.
    pub date: String,
    /// `uname -r`.
    pub kernel: String,
    /// Stopped by a signal before the command ended.
    pub interrupted: bool,
    /// A `snapshot <proc>-exit` before each process's exit, to compare its
    /// memory at its largest (a recorded program's `end` is after every exit).
    pub snapshot_at_exit: bool,
    /// The tree's reads of the THP settings (named in the header).
    pub settings_read: Vec<SettingRead>,
}

/// What the conversion wrote and left out.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub statements: u64,
    pub processes: usize,
    pub threads: u64,
    pub faults: u64,
    pub files: usize,
    /// Events not replayed, by reason.
    pub skipped: BTreeMap<&'static str, u64>,
    /// Page faults replayed (as first touches, and the populate of the
    /// pages exec wrote the arguments into), by process (the workload's
    /// name): with THP off, the `stat.<proc>.minflt` the replay must give.
    pub faults_by_process: BTreeMap<String, u64>,
    /// Read faults a concurrent fault-around left to happen, by process:
    /// counted in the recorded run's min_flt, taken by no replay, so the
    /// measured count less these is what the replay gives.
    pub raced_by_process: BTreeMap<String, u64>,
    /// The THP settings each process read (process, path relative to
    /// /sys/kernel/mm/), in the order first read: the header's line.
    pub settings_read: Vec<(String, String)>,
}

impl Stats {
    pub fn skip(&mut self, why: &'static str) {
        *self.skipped.entry(why).or_default() += 1;
    }
}

/// A syscall between its entry and its exit.
struct Pending {
    nr: i64,
    args: [u64; 6],
    /// The file an fd-backed mmap maps (from its MMAP2 record).
    file: Option<String>,
}

const MMAP: i64 = 9;
const MM_SYSCALLS: [i64; 6] = [9, 10, 11, 12, 25, 28];
/// execve and execveat.
const EXECVE: [i64; 2] = [59, 322];

/// The second pass's state.
struct Convert<'c> {
    census: &'c census::Census,
    snapshot_at_exit: bool,
    names: Vec<String>,
    tracker: Tracker,
    mms: HashMap<ProcId, Mm>,
    pending: HashMap<u32, Pending>,
    files: Files,
    /// The file pages replayed faults touched.
    cache: around::PageCache,
    stats: Stats,
}

impl Convert<'_> {
    fn task_name(&self, t: Task) -> String {
        let proc = &self.names[t.mm];
        match (t.proc, t.thread) {
            (Some(_), Some(n)) => format!("{proc}-t{n}"),
            _ => proc.clone(),
        }
    }

    fn event(&mut self, out: &mut Out, e: &Event) -> io::Result<()> {
        let change = self.tracker.apply(e);
        self.change(out, e.time, change)?;
        let Some(task) = self.tracker.task(e.tid) else {
            return Ok(());
        };
        let proc = self.names[task.mm].clone();
        let task_name = self.task_name(task);
        let execs = self.tracker.procs[task.mm].execs;
        let Convert {
            census,
            mms,
            files,
            cache,
            stats,
            pending,
            ..
        } = self;
        let mm = mms.entry(task.mm).or_default();
        let mut c = Ctx {
            out,
            files,
            cache,
            stats,
        };
        if mm.has_exec_maps() && !matches!(e.kind, Kind::Mmap2 { .. } | Kind::Comm { .. }) {
            mm.write_exec_maps(&mut c, &proc, e.time, census.stack_low(task.mm, execs))?;
        }
        if !matches!(e.kind, Kind::Fault { .. }) {
            mm.not_a_fault();
        }
        match &e.kind {
            // An execve's mapping records before its point of no return
            // are the new mm's, still being built: get_arg_page growing
            // the temporary stack it copies the arguments into.
            Kind::SysEnter { nr, args } if MM_SYSCALLS.contains(nr) || EXECVE.contains(nr) => {
                pending.insert(
                    e.tid,
                    Pending {
                        nr: *nr,
                        args: *args,
                        file: None,
                    },
                );
            }
            Kind::SysExit { nr, ret } => {
                if let Some(p) = pending.remove(&e.tid).filter(|p| p.nr == *nr) {
                    if !EXECVE.contains(&p.nr) {
                        mm.syscall(&mut c, &proc, e.time, p.nr, p.args, *ret, p.file)?;
                    }
                }
            }
            // The new image: its mappings from here on are exec's.
            Kind::Comm { exec: true, .. } => {
                pending.remove(&e.tid);
            }
            Kind::Mmap2 {
                addr,
                len,
                pgoff,
                prot,
                flags,
                filename,
            } => match pending.get_mut(&e.tid) {
                Some(p) if p.nr == MMAP => p.file = Some(filename.clone()),
                Some(_) => {}
                None if mm.stack_grown(*addr, *len) => {}
                None => mm.exec_mapping(Mapping {
                    addr: *addr,
                    len: *len,
                    pgoff: *pgoff,
                    prot: *prot,
                    flags: *flags,
                    filename: filename.clone(),
                }),
            },
            Kind::Fault {
                addr, error_code, ..
            } => {
                c.stats.faults += 1;
                let by_process = match mm.fault(&mut c, &task_name, e.time, *addr, *error_code)? {
                    mm::Fault::Replayed => &mut c.stats.faults_by_process,
                    mm::Fault::Raced => &mut c.stats.raced_by_process,
                    mm::Fault::Skipped => return Ok(()),
                };
                *by_process.entry(proc.clone()).or_default() += 1;
            }
            _ => {}
        }
        Ok(())
    }

    fn change(&mut self, out: &mut Out, time: u64, change: Change) -> io::Result<()> {
        let name = |p: ProcId| &self.names[p];
        let text = match change {
            Change::None => return Ok(()),
            Change::Spawn(p) => {
                self.mms.insert(p, Mm::default());
                format!("spawn {}", name(p))
            }
            Change::Fork { parent, child } => {
                let mut mm = self.mms.get(&parent).cloned().unwrap_or_default();
                mm.forked();
                self.mms.insert(child, mm);
                format!("{} fork {}", name(parent), name(child))
            }
            Change::Thread { proc, n } => {
                self.stats.threads += 1;
                format!("{} thread {}-t{n}", name(proc), name(proc))
            }
            Change::Exec(p) => {
                self.mms.insert(p, Mm::default());
                format!("{} exec", name(p))
            }
            Change::ThreadExit { proc, n } => format!("{}-t{n} exit", name(proc)),
            Change::Exit(p) => {
                self.mms.remove(&p);
                if self.snapshot_at_exit {
                    out.stmt(time, &format!("snapshot {}-exit", name(p)))?;
                }
                format!("{} exit", name(p))
            }
        };
        out.stmt(time, &text)
    }
}

fn header(h: &Header, census: &census::Census, settings_read: &[(String, String)]) -> String {
    let seconds = census.first.map_or(0.0, |f| (census.last - f) as f64 / 1e9);
    let mut s = format!(
        "A program recorded by `hugelab record` on {}, Linux {}, with THP off for its whole tree:\n  {}\n",
        h.date,
        h.kernel,
        h.command.join(" ")
    );
    s += &format!(
        "{} events in {:.3} s: {} page faults, {} processes, {} threads, {} execs.\n",
        census.events,
        seconds,
        census.faults,
        census.processes(),
        census.threads,
        census.execs
    );
    if let Some(line) = settings::header_line(settings_read) {
        s += &line;
        s.push('\n');
    }
    if h.interrupted {
        s += "INTERRUPTED: the recording was stopped before the command ended; this is the part before.\n";
    }
    s += "Replay it with `hugelab run` (the model) or `hugelab diff` (model and kernel); what was not\nreplayed is counted at the end.";
    s
}

/// A debugging aid: with `HUGELAB_RECORD_EVENTS=FILE` in the environment,
/// the conversion also writes every recorded event to FILE, a JSON line each.
fn dump_file() -> io::Result<Option<io::BufWriter<std::fs::File>>> {
    match std::env::var_os("HUGELAB_RECORD_EVENTS") {
        Some(path) => Ok(Some(io::BufWriter::new(std::fs::File::create(path)?))),
        None => Ok(None),
    }
}

/// Writes the workload of the events in `spool` to `w`.
pub fn convert(spool: &mut Spool, h: &Header, w: &mut dyn Write) -> io::Result<Stats> {
    convert_named(spool, h, w, |_| {})
}

/// [`convert`], telling `names` each process's pid and name (in order of
/// creation) before anything is written.
pub fn convert_named(
    spool: &mut Spool,
    h: &Header,
    w: &mut dyn Write,
    names: impl FnOnce(&[(u32, String)]),
) -> io::Result<Stats> {
    let mut census = census::Census::default();
    let mut dump = dump_file()?;
    for e in spool.events()? {
        let e = e?;
        if let Some(d) = &mut dump {
            serde_json::to_writer(&mut *d, &e)?;
            writeln!(d)?;
        }
        census.add(&e);
    }
    if let Some(d) = &mut dump {
        d.flush()?;
    }
    let named: Vec<(u32, String)> = census.pids().iter().copied().zip(census.names()).collect();
    names(&named);
    let settings_read = settings::by_process(&named, &h.settings_read);
    let mut out = Out::new(w);
    out.comment(&header(h, &census, &settings_read))?;
    let mut conv = Convert {
        snapshot_at_exit: h.snapshot_at_exit,
        names: census.names(),
        census: &census,
        tracker: Tracker::default(),
        mms: HashMap::new(),
        pending: HashMap::new(),
        files: Files::default(),
        cache: around::PageCache::default(),
        stats: Stats::default(),
    };
    let mut last = 0;
    for e in spool.events()? {
        let e = e?;
        last = e.time;
        conv.event(&mut out, &e)?;
    }
    // Processes still there when the recording stopped end with it.
    let live: Vec<ProcId> = conv.tracker.live().collect();
    for p in live {
        if conv.mms.contains_key(&p) {
            out.stmt(last, &format!("{} exit", conv.names[p]))?;
        }
    }
    out.flush()?;
    let mut stats = conv.stats;
    stats.settings_read = settings_read;
    stats.statements = out.statements;
    stats.processes = census.processes();
    stats.files = conv.files.count();
    let mut tail = format!(
        "{} statements, {} processes, {} threads, {} files, {} faults.",
        stats.statements, stats.processes, stats.threads, stats.files, stats.faults
    );
    if stats.skipped.is_empty() {
        tail += "\nEverything recorded was replayed.";
    } else {
        tail += "\nNot replayed:";
        for (why, n) in &stats.skipped {
            tail += &format!("\n  {n} {why}");
        }
    }
    out.comment(&tail)?;
    Ok(stats)
}
