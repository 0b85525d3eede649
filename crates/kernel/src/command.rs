//! Runs a command once in a fresh memory cgroup and measures it: what
//! `hugelab bench` repeats under each setting.
//!
//! - The child joins the group before it executes the command (it writes 0,
//!   "myself", to `cgroup.procs` between fork and exec), so every page the
//!   command and its descendants fault is charged there from the start and
//!   the group's peak is the run's.
//! - CPU time and faults are `wait4`'s rusage of the command: its own plus
//!   every descendant it waited for (a build's compilers).
//! - The system-wide THP counters (`vmstat.thp_*`, `mthp.<size>.<stat>`) are
//!   read right before and after; other processes move them too, so the
//!   system's page faults are compared with the command's: when others
//!   faulted more than a little ([`NOISE_FAULTS`], 1 % of the command's), the
//!   deltas are flagged noisy, as the kernel backend does for its windows.

use crate::error::{KernelError, Result};
use crate::memcg::Memcg;
use crate::vmstat::SystemReader;
use hugelab_workload::Counters;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Faults by other processes tolerated during a run before its system-wide
/// counters are called noisy (this VM's idle background: ~100 per second).
pub const NOISE_FAULTS: i64 = 1000;

/// One run's measurements.
#[derive(Clone, Debug, Default)]
pub struct CommandRun {
    /// Exit status, or 128 + the signal that killed it.
    pub exit_code: i32,
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    pub minflt: u64,
    pub majflt: u64,
    /// The group's peak, kB (0 where the kernel keeps no peak).
    pub peak_kb: u64,
    /// Deltas of the THP counters over the run.
    pub counters: Counters,
    /// Page faults of other processes during the run (system pgfault delta
    /// less the command's).
    pub foreign_faults: i64,
}

impl CommandRun {
    pub fn noisy(&self) -> bool {
        self.foreign_faults > NOISE_FAULTS.max((self.minflt + self.majflt) as i64 / 100)
    }
}

/// Is `name` one of the THP counters a run reports?
fn thp_counter(name: &str) -> bool {
    name.starts_with("vmstat.thp_") || name.starts_with("mthp.")
}

/// Runs `argv` in a new group named `group`; `started(pid, group dir)` is
/// called once the command runs (so an interrupt can kill it and remove the
/// group). Output goes to /dev/null unless `show_output`.
pub fn run_in_memcg(
    argv: &[String],
    group: &str,
    show_output: bool,
    started: impl FnOnce(i32, &std::path::Path),
) -> Result<CommandRun> {
    let cg = Memcg::create(group, None)?;
    let procs = CString::new(cg.dir().join("cgroup.procs").as_os_str().as_bytes())
        .map_err(|_| KernelError::Refused("a cgroup path with a NUL byte".into()))?;
    let mut reader = SystemReader::new();
    reader.capture(false)?;
    let before = reader.parse()?;

    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null());
    if !show_output {
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
    }
    // SAFETY: between fork and exec only async-signal-safe calls (open,
    // write, close) on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            Ok(())
        });
    }
    let t = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| KernelError::Refused(format!("cannot run {}: {e}", argv[0])))?;
    let pid = child.id() as i32;
    started(pid, cg.dir());
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = loop {
        // SAFETY: waits for our own child, writing into the two locals.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if rc >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break rc;
        }
    };
    let wall_s = t.elapsed().as_secs_f64();
    if rc < 0 {
        return Err(KernelError::Refused(format!(
            "waiting for {}: {}",
            argv[0],
            std::io::Error::last_os_error()
        )));
    }
    // The std handle must not reap it again (it has been).
    std::mem::forget(child);
    reader.capture(true)?;
    let after = reader.parse()?;
    // Daemons the command left behind would keep the group alive.
    crate::memcg::kill_all(cg.dir());
    let peak_kb = cg.peak_kb()?.unwrap_or(0);

    let exit_code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    let delta = |n: &str| after.get(n).copied().unwrap_or(0) - before.get(n).copied().unwrap_or(0);
    let counters: Counters = after
        .keys()
        .filter(|n| thp_counter(n))
        .map(|n| (n.clone(), delta(n)))
        .collect();
    let (minflt, majflt) = (ru.ru_minflt as u64, ru.ru_majflt as u64);
    let foreign_faults = delta("vmstat.pgfault") - (minflt + majflt) as i64;
    Ok(CommandRun {
        exit_code,
        wall_s,
        user_s: secs(ru.ru_utime),
        sys_s: secs(ru.ru_stime),
        minflt,
        majflt,
        peak_kb,
        counters,
        foreign_faults,
    })
}
