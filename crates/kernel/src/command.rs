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
//! - A setting's memory limit is the group's (v2 memory.max, v1
//!   memory.limit_in_bytes); the OOM kills are the group's count after the
//!   run (v2 memory.events, v1 memory.oom_control: `oom_kill`).
//! - Peak anonymous memory of the tree: the kernel keeps a watermark of the
//!   group's whole charge only (v2 memory.peak, v1 max_usage_in_bytes, page
//!   cache included), none of its anon part, and a group's usage threshold
//!   event (v1 cgroup.event_control) fires on the whole charge too. So a
//!   thread samples the group's memory.stat (v2 `anon`, `anon_thp`; v1 `rss`,
//!   `rss_huge`) every [`ANON_SAMPLE_PERIOD`] and keeps the largest; a run
//!   reports its number of samples and what one cost. memory.stat's figures
//!   are the memcg's per-cpu statistics as last flushed: a read flushes them
//!   once more than MEMCG_CHARGE_BATCH (64) pages per CPU are pending, so a
//!   sample can be that much behind (512 KiB on 2 CPUs).

use crate::error::{KernelError, Result};
use crate::memcg::Memcg;
use crate::run_as::RunAs;
use crate::vmstat::SystemReader;
use hugelab_workload::Counters;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the group's anonymous memory is sampled during a run.
pub const ANON_SAMPLE_PERIOD: Duration = Duration::from_millis(1);

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
    /// Minor faults of the process tree, less those hugelab's child took
    /// between its fork and its exec of the command (`pre_exec_minflt`):
    /// the command's own, as a recording of it counts them.
    pub minflt: u64,
    pub majflt: u64,
    /// The minor faults of hugelab's child before the exec (copy-on-write
    /// of the pages it touched in hugelab's image), read by the child with
    /// getrusage just before it execs.
    pub pre_exec_minflt: u64,
    /// The group's peak, kB (0 where the kernel keeps no peak).
    pub peak_kb: u64,
    /// Deltas of the THP counters over the run.
    pub counters: Counters,
    /// Page faults of other processes during the run (system pgfault delta
    /// less the command's).
    pub foreign_faults: i64,
    /// OOM kills in the group during the run.
    pub oom_kills: u64,
    /// The sampled peaks of the group's anonymous memory.
    pub anon: AnonPeak,
}

/// The peaks of a group's anonymous memory over a run, sampled (see the
/// module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AnonPeak {
    /// Largest anon charge seen (THPs included), kB.
    pub anon_kb: u64,
    /// Largest anon charge in THPs seen, kB (not necessarily at the same
    /// sample).
    pub anon_thp_kb: u64,
    /// Samples taken.
    pub samples: u64,
    /// Mean cost of one sample (read and parse memory.stat), microseconds.
    pub sample_us: f64,
}

/// A thread sampling a group's memory.stat until stopped.
struct AnonSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<AnonPeak>,
}

impl AnonSampler {
    fn start(stat: std::path::PathBuf) -> AnonSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            use std::io::{Read, Seek};
            let mut peak = AnonPeak::default();
            let Ok(mut file) = std::fs::File::open(&stat) else {
                return peak;
            };
            let mut buf = String::with_capacity(4096);
            let mut spent = Duration::ZERO;
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                buf.clear();
                let read = file.rewind().and_then(|_| file.read_to_string(&mut buf));
                if let Some((anon, thp)) = read.ok().and_then(|_| crate::memcg::anon_of_stat(&buf))
                {
                    peak.anon_kb = peak.anon_kb.max(anon / 1024);
                    peak.anon_thp_kb = peak.anon_thp_kb.max(thp / 1024);
                    peak.samples += 1;
                }
                spent += t.elapsed();
                std::thread::sleep(ANON_SAMPLE_PERIOD);
            }
            if peak.samples > 0 {
                peak.sample_us = spent.as_secs_f64() * 1e6 / peak.samples as f64;
            }
            peak
        });
        AnonSampler { stop, thread }
    }

    fn finish(self) -> AnonPeak {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
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

/// Runs `argv` in a new group named `group`, limited to `limit` bytes if
/// given, as `run_as` if given (else as hugelab's own user, with its
/// environment); `started(pid, group dir)` is called once the command runs
/// (so an interrupt can kill it and remove the group). Output goes to
/// /dev/null unless `show_output`.
pub fn run_in_memcg(
    argv: &[String],
    group: &str,
    limit: Option<u64>,
    run_as: Option<&RunAs>,
    show_output: bool,
    started: impl FnOnce(i32, &std::path::Path),
) -> Result<CommandRun> {
    let cg = Memcg::create(group, limit)?;
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
    if let Some(user) = run_as {
        cmd.env_clear()
            .envs(user.environment(|k| std::env::var(k).ok()));
    }
    let user = run_as.cloned();
    let faults = PreExecFaults::new()?;
    let report = faults.write_end();
    // SAFETY: between fork and exec only async-signal-safe calls (open,
    // write, close, getrusage, setgroups, setgid, setuid) on memory
    // prepared before the fork. The group is joined as root, then the
    // command's user is taken.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            PreExecFaults::report(report);
            match &user {
                Some(u) => u.drop_privileges(),
                None => Ok(()),
            }
        });
    }
    let t = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| KernelError::Refused(format!("cannot run {}: {e}", argv[0])))?;
    let pid = child.id() as i32;
    let pre_exec_minflt = faults.read();
    let sampler = AnonSampler::start(cg.dir().join("memory.stat"));
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
    let anon = sampler.finish();
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
    let oom_kills = cg.oom_kills().unwrap_or(0);

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
    let minflt = minflt.saturating_sub(pre_exec_minflt);
    Ok(CommandRun {
        exit_code,
        wall_s,
        user_s: secs(ru.ru_utime),
        sys_s: secs(ru.ru_stime),
        minflt,
        majflt,
        pre_exec_minflt,
        peak_kb,
        counters,
        foreign_faults,
        oom_kills,
        anon,
    })
}

/// Whether `user` can run `program` from `dir` (enter and read the
/// directory, execute the program), checked by a shell that drops to the
/// user as the measured command will: None if so, else the sentence that
/// says what it cannot.
pub fn check_access(
    user: &RunAs,
    program: &std::path::Path,
    dir: &std::path::Path,
) -> Option<String> {
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", r#"cd "$1" && test -r . && test -x "$2""#, "sh"])
        .arg(dir)
        .arg(program)
        .env_clear()
        .envs(user.environment(|k| std::env::var(k).ok()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let u = user.clone();
    // SAFETY: setgroups, setgid, setuid only, on memory made before the fork.
    unsafe {
        cmd.pre_exec(move || u.drop_privileges());
    }
    match cmd.status() {
        Ok(s) if s.success() => None,
        Ok(_) => Some(format!(
            "the user {} cannot read the working directory {} or run {}; run the bench from a directory that user can read, or keep root with --as-root",
            user.describe(),
            dir.display(),
            program.display()
        )),
        Err(e) => Some(format!("cannot check what the user {} may run: {e}", user.describe())),
    }
}

/// A pipe over which hugelab's child reports its minor faults just before
/// it execs the command (they count in the task's min_flt, which the exec
/// keeps, but are not the command's).
struct PreExecFaults {
    read: std::fs::File,
    write: std::os::fd::OwnedFd,
}

impl PreExecFaults {
    fn new() -> Result<PreExecFaults> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two fds; both close on exec.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(KernelError::Refused(format!(
                "cannot make a pipe: {}",
                std::io::Error::last_os_error()
            )));
        }
        use std::os::fd::FromRawFd;
        // SAFETY: the fds were just made, each owned once.
        Ok(unsafe {
            PreExecFaults {
                read: std::fs::File::from_raw_fd(fds[0]),
                write: std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            }
        })
    }

    fn write_end(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.write.as_raw_fd()
    }

    /// In the child, between fork and exec: async-signal-safe calls only.
    fn report(fd: i32) {
        // SAFETY: getrusage fills a zeroed rusage; write of 8 bytes of a
        // local; an error loses only the correction.
        unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut ru);
            let n = (ru.ru_minflt as u64).to_ne_bytes();
            libc::write(fd, n.as_ptr().cast(), n.len());
        }
    }

    /// In hugelab, once the command runs: the child's count (0 if it
    /// reported none).
    fn read(self) -> u64 {
        use std::io::Read;
        drop(self.write);
        let mut read = self.read;
        let mut n = [0u8; 8];
        match read.read_exact(&mut n) {
            Ok(()) => u64::from_ne_bytes(n),
            Err(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sampler keeps the largest anon and THP figures a stat file
    /// showed while it ran (a file of ours standing in for memory.stat).
    #[test]
    fn the_sampler_keeps_the_peaks() {
        let stat = std::env::temp_dir().join(format!("hugelab-anon-{}.stat", std::process::id()));
        let show = |anon: u64, thp: u64| {
            // Rewritten in place: the sampler keeps its file open.
            std::fs::write(&stat, format!("cache 0\nrss {anon}\nrss_huge {thp}\n")).unwrap();
            std::thread::sleep(Duration::from_millis(30));
        };
        show(1 << 20, 0);
        let sampler = AnonSampler::start(stat.clone());
        show(8 << 20, 2 << 20);
        show(64 << 20, 4 << 20);
        show(4 << 20, 4 << 20);
        let peak = sampler.finish();
        std::fs::remove_file(&stat).unwrap();
        assert_eq!((peak.anon_kb, peak.anon_thp_kb), (64 << 10, 4 << 10));
        // 90 ms at one sample per ms (and what each took): tens of samples.
        assert!(peak.samples >= 20, "{peak:?}");
        assert!(peak.sample_us > 0.0, "{peak:?}");
    }

    #[test]
    fn no_stat_file_no_samples() {
        let peak = AnonSampler::start("/nonexistent/memory.stat".into()).finish();
        assert_eq!(peak, AnonPeak::default());
    }
}
