//! `hugelab record`'s capture: runs a command and records, in time order,
//! every page fault of its process tree with its address and error code,
//! its mm syscalls with their arguments and results, and its tasks' lives
//! (fork/clone with flags, exec, the mappings exec creates, exit).
//!
//! The mechanism (measured on Linux 6.18): perf_event_open on the
//! `exceptions:page_fault_user`/`page_fault_kernel`, `raw_syscalls:sys_enter`
//! /`sys_exit`, `task:task_newtask` and `sched:sched_process_exec`
//! tracepoints, one event per CPU and tracepoint, inherited by every task
//! the command creates, enabled at its exec (so hugelab's own fork and
//! setup are not recorded), filtered in the kernel (the syscalls of
//! [`event::SYSCALLS`]; kernel faults on user addresses only). Each CPU's
//! page-fault event is its leader: it owns the CPU's ring buffer, the
//! others write into it (PERF_EVENT_IOC_SET_OUTPUT), and it alone asks for
//! the side-band MMAP2, COMM, FORK and EXIT records. The rings are merged
//! by timestamp ([`merge`]).
//!
//! - [`perf`]: the attribute block and the calls; [`ring`]: reading a ring;
//! - [`tracefs`]: mounted if it is not, unmounted after;
//! - [`event`]: records parsed into typed [`Event`]s;
//! - [`child`]: the command, with THP disabled, as the sudo user, waited
//!   for with every descendant;
//! - [`exits`]: every process traced (ptrace) to read its minor faults and
//!   anonymous and shmem memory as each of its mms ends (exit or exec);
//! - [`settings`]: which processes read which THP setting (fanotify on
//!   /sys/kernel/mm/transparent_hugepage/);
//! - [`summary`]: per task counts of faults by error code and mm syscalls;
//! - [`spool`]: the events on disk, compressed; [`convert`]: the spooled
//!   events written as a workload.
//!
//! A first SIGINT/SIGTERM/SIGHUP ends the recording early ([`soft_interrupt`]):
//! the tree is killed, what was captured is kept and `Outcome::interrupted`
//! says so; a second one takes the usual signal path.

mod child;
pub mod convert;
pub mod event;
pub mod exits;
mod merge;
mod perf;
mod ring;
pub mod settings;
pub mod spool;
pub mod summary;
pub mod tracefs;

pub use event::{Event, Kind};
pub use exits::MmStat;
pub use settings::SettingRead;
pub use summary::Summary;

use crate::error::{KernelError, Result};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Kernel-mode faults on kernel addresses are not the program's memory.
const USER_ADDRESS_FILTER: &str = "address < 140737488355328"; // 0x800000000000
/// Events per CPU besides the leader.
const FOLLOWERS: usize = 5;
/// Poll timeout: the progress line's and the child reaping's pace.
const POLL_MS: i32 = 100;

pub struct Options {
    /// The command and its arguments.
    pub command: Vec<String>,
    /// Ring buffer bytes per CPU.
    pub buffer: u64,
    /// Note the tree's reads of the files of this tree
    /// ([`settings::THP_DIR`]); None: not watched.
    pub watch_settings: Option<std::path::PathBuf>,
}

/// Where a recording stands, for a progress line.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    pub events: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// How a recording ended.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub events: u64,
    /// Bytes of records read from the rings.
    pub bytes: u64,
    /// Events the kernel could not write (a recording with any is unusable).
    pub lost: u64,
    pub seconds: f64,
    /// The command's exit status (128 + signal if killed).
    pub status: Option<i32>,
    /// Bytes of ring buffer per CPU, as mapped (rounded up).
    pub buffer: u64,
    /// A signal stopped it before the command ended.
    pub interrupted: bool,
    /// The minor faults of the whole tree as the kernel counted them
    /// (getrusage(RUSAGE_CHILDREN) over the recording: every process of
    /// the tree reaped by its parent or by us, its subreaper).
    pub minflt: u64,
    /// Each process's figures at the end of each of its mms.
    pub exits: Vec<MmStat>,
    /// The tree's reads of the THP settings, in the order first seen.
    pub settings_read: Vec<SettingRead>,
    /// Some reads of the settings were lost (the kernel's queue overflowed).
    pub settings_overflowed: bool,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The soft interrupt for `guard::set_soft_interrupt_hook`: the first
/// signal asks the recording to stop (true); a second is not taken (false).
pub fn soft_interrupt() -> bool {
    !INTERRUPTED.swap(true, Ordering::SeqCst)
}

/// The signal path's cleanup: kills the recorded tree and unmounts the
/// tracefs the recording mounted. For `guard::set_cleanup_hook`.
pub fn interrupt_cleanup() {
    child::kill_all_children();
    if let Err(e) = tracefs::undo() {
        eprintln!("hugelab: {e}");
    }
}

/// The CPU rings and the events writing into them.
struct Capture {
    rings: Vec<ring::Ring>,
    /// Leaders first in each CPU's group; kept open while recording.
    fds: Vec<OwnedFd>,
    ids: event::Ids,
}

fn ids(t: &tracefs::Tracefs) -> Result<event::Ids> {
    Ok(event::Ids {
        fault_user: t.id("exceptions", "page_fault_user")?,
        fault_kernel: t.id("exceptions", "page_fault_kernel")?,
        sys_enter: t.id("raw_syscalls", "sys_enter")?,
        sys_exit: t.id("raw_syscalls", "sys_exit")?,
        newtask: t.id("task", "task_newtask")?,
        exec: t.id("sched", "sched_process_exec")?,
    })
}

/// Opens every event on `pid` for each online CPU.
fn open_capture(t: &tracefs::Tracefs, pid: libc::pid_t, buffer: u64) -> Result<Capture> {
    let ids = ids(t)?;
    let syscalls = event::syscall_filter();
    let followers: [_; FOLLOWERS] = [
        (ids.fault_kernel, Some(USER_ADDRESS_FILTER)),
        (ids.sys_enter, Some(syscalls.as_str())),
        (ids.sys_exit, Some(syscalls.as_str())),
        (ids.newtask, None),
        (ids.exec, None),
    ];
    let mut cap = Capture {
        rings: Vec::new(),
        fds: Vec::new(),
        ids,
    };
    for cpu in perf::online_cpus()? {
        let open = |tracepoint, leader| {
            perf::open(&perf::Open {
                tracepoint,
                pid,
                cpu,
                leader,
                wakeup: (buffer / 4).clamp(1, u64::from(u32::MAX)) as u32,
            })
        };
        let leader = open(ids.fault_user, true)?;
        cap.rings.push(ring::Ring::map(&leader, buffer)?);
        for (tracepoint, filter) in followers {
            let fd = open(tracepoint, false)?;
            if let Some(f) = filter {
                perf::set_filter(&fd, f)?;
            }
            perf::set_output(&fd, &leader)?;
            cap.fds.push(fd);
        }
        cap.fds.push(leader);
    }
    Ok(cap)
}

/// Resets PR_SET_CHILD_SUBREAPER however the recording ends.
struct Subreaper;

impl Subreaper {
    fn set() -> Subreaper {
        child::set_subreaper(true);
        Subreaper
    }
}

impl Drop for Subreaper {
    fn drop(&mut self) {
        child::set_subreaper(false);
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Records `opts.command` until it and every descendant have exited,
/// handing each event to `on_event` in time order and calling `progress`
/// about ten times a second. Needs root. The tracefs mount it may make is
/// undone before returning; the caller refuses a recording with `lost` > 0.
pub fn record(
    opts: &Options,
    mut on_event: impl FnMut(&Event),
    mut progress: impl FnMut(&Progress),
) -> Result<Outcome> {
    if opts.command.is_empty() {
        return Err(KernelError::Refused("no command to record".into()));
    }
    INTERRUPTED.store(false, Ordering::SeqCst);
    child::resolve(&opts.command[0])?;
    let _subreaper = Subreaper::set();
    let children_minflt = children_minflt();
    let mut tracer = exits::Tracer::new()?;
    if let Some(dir) = &opts.watch_settings {
        // Without it the recording is still whole: said, not made a failure.
        match settings::Watch::open(dir) {
            Ok(w) => tracer.watch_settings(w),
            Err(e) => eprintln!("hugelab: warning: reads of the THP settings are not noted: {e}"),
        }
    }
    let pending = child::spawn(&opts.command)?;
    let tracefs = tracefs::Tracefs::open()?;
    let mut cap = open_capture(&tracefs, pending.pid, opts.buffer)?;
    let start = Instant::now();
    pending.start(&mut tracer)?;
    let mut out = Outcome {
        buffer: cap.rings.first().map_or(0, |r| r.capacity()),
        ..Outcome::default()
    };
    let mut merger = merge::Merger::default();
    let mut watermark = 0;
    loop {
        let round = monotonic_ns();
        if INTERRUPTED.load(Ordering::SeqCst) {
            out.interrupted = true;
            child::kill_children();
        }
        tracer.drain_wake();
        tracer.note_reads();
        let running = tracer.reap();
        for ring in &mut cap.rings {
            let ids = cap.ids;
            out.bytes += ring.drain(|r| {
                if let Some(e) = event::parse(r, &ids) {
                    merger.push(e);
                }
            });
        }
        let before = if running { watermark } else { u64::MAX };
        merger.release(before, |e| {
            out.events += 1;
            if let Kind::Lost { count } = e.kind {
                out.lost += count;
            }
            on_event(&e);
        });
        watermark = round;
        out.seconds = start.elapsed().as_secs_f64();
        progress(&Progress {
            events: out.events,
            bytes: out.bytes,
            seconds: out.seconds,
        });
        if !running {
            break;
        }
        wait_for_data(&cap, tracer.wake_fd());
    }
    out.status = tracer.root_status;
    out.minflt = children_minflt_since(children_minflt);
    tracer.note_reads();
    out.settings_read = std::mem::take(&mut tracer.reads);
    out.settings_overflowed = tracer.reads_overflowed();
    out.exits = tracer.finish();
    // The losses no LOST record reported (a ring full at the end of the
    // run): the events' own counts, which include the records' too.
    let mut counted = 0;
    for fd in &cap.fds {
        counted += perf::lost(fd)?;
    }
    out.lost = out.lost.max(counted);
    drop(cap);
    // The recording is whole: a failed unmount is said, not made its failure.
    if let Err(e) = tracefs::undo() {
        eprintln!("hugelab: warning: {e}");
    }
    Ok(out)
}

/// The minor faults of this process's reaped children so far.
fn children_minflt() -> u64 {
    // SAFETY: a zeroed rusage is a valid one to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: fills usage.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_minflt as u64
}

fn children_minflt_since(before: u64) -> u64 {
    children_minflt().saturating_sub(before)
}

/// Sleeps until a ring passes its watermark, a tracee stops or exits
/// (`wake`, written by SIGCHLD), or the poll timeout. A leader whose task
/// has exited polls as hung up at once: then only `wake` is waited on, a
/// short while.
fn wait_for_data(cap: &Capture, wake: libc::c_int) {
    let wake = libc::pollfd {
        fd: wake,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds: Vec<libc::pollfd> = cap
        .fds
        .iter()
        .skip(FOLLOWERS)
        .step_by(FOLLOWERS + 1)
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .chain([wake])
        .collect();
    // SAFETY: fds is a valid array of pollfd.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_MS) };
    let woken = fds.last().is_some_and(|p| p.revents != 0);
    if !woken
        && fds
            .iter()
            .any(|p| p.revents & (libc::POLLHUP | libc::POLLERR) != 0)
    {
        let mut only = [wake];
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(only.as_mut_ptr(), 1, 20) };
    }
}
