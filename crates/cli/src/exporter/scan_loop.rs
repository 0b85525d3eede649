//! The scanner thread: one pass over every process per interval, each
//! process scanned on one thread by the kernel crate's scan and added to its
//! memory cgroup's sums ([`CgroupFigures`]), then published whole; the
//! endpoint serves the last complete pass meanwhile (an `Arc` swapped under
//! a lock held only to swap or clone it, so a scrape never waits for a
//! scan).
//!
//! **The CPU budget**: after each process the thread compares the
//! exporter's CPU time since the pass began (every thread's,
//! `CLOCK_PROCESS_CPUTIME_ID`, scrapes included), plus as much again as
//! that process took (paid ahead for the next, so that the budget holds
//! in the middle of a step too, as long as it costs no more than the last),
//! with the budget times the
//! time since then, and sleeps until they meet. The budget so holds over
//! each pass whatever the machine holds; a pass that needs more than the
//! interval at the budget takes longer (its figures are served with their
//! age), and the next starts at once. The scan also waits between the
//! chunks of a process (256 MiB of present memory each, `ScanOptions::pace`),
//! so a large process is no burst longer than one chunk's reading.

use super::figures::{at_depth, CgroupFigures, Cost, Pass, Predictions, Skip};
use super::Config;
use anyhow::Result;
use hugelab_kernel::memcg;
use hugelab_kernel::scan::{self, ScanOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// What the scanner thread shares with the endpoint.
#[derive(Default)]
pub struct Shared {
    latest: Mutex<Option<Arc<Pass>>>,
    /// Notified at each published pass.
    published: Condvar,
    /// Complete passes so far.
    passes: Mutex<u64>,
    /// A pass is running (not waiting for the next interval).
    running: AtomicBool,
}

impl Shared {
    /// The last complete pass, if any.
    pub fn latest(&self) -> Option<Arc<Pass>> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    pub fn passes(&self) -> u64 {
        *self.passes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `timeout` for a pass after the `seen`th; the passes now.
    pub fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        let passes = self.passes.lock().unwrap_or_else(|e| e.into_inner());
        let (passes, _) = self
            .published
            .wait_timeout_while(passes, timeout, |n| *n <= seen)
            .unwrap_or_else(|e| e.into_inner());
        *passes
    }

    fn publish(&self, pass: Pass) {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(pass));
        *self.passes.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.published.notify_all();
    }
}

/// Starts the scanner thread; it runs until the process ends.
pub fn start(config: &Config) -> Result<Arc<Shared>> {
    let shared = Arc::new(Shared::default());
    let (interval, depth, budget) = (config.interval, config.depth, config.budget);
    let theirs = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("hugelab-scan".into())
        .spawn(move || loop {
            let start = Instant::now();
            theirs.running.store(true, Ordering::Relaxed);
            let pass = one_pass(depth, budget);
            theirs.running.store(false, Ordering::Relaxed);
            match pass {
                Ok(pass) => theirs.publish(pass),
                Err(e) => eprintln!("hugelab: exporter: the scan failed: {e:#}"),
            }
            std::thread::sleep((start + interval).saturating_duration_since(Instant::now()));
        })?;
    Ok(shared)
}

/// The exporter's CPU time so far, every thread.
pub fn cpu_time() -> Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(id, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Keeps the CPU time since `start` within `rate` of the wall time, in the
/// middle of a step too: each pace pays ahead for the next step (a process,
/// or a chunk of one) at the cost of the step just done, so that a step in
/// progress that costs no more than the last is already paid for.
struct Budget {
    /// The CPU time counted ([`cpu_time`]).
    clock: fn() -> Duration,
    rate: f64,
    wall: Instant,
    cpu: Duration,
    waited: Duration,
    /// The CPU time used at the last pace.
    paced: Duration,
}

impl Budget {
    fn new(rate: f64) -> Budget {
        Budget::counting(cpu_time, rate)
    }

    fn counting(clock: fn() -> Duration, rate: f64) -> Budget {
        Budget {
            clock,
            rate,
            wall: Instant::now(),
            cpu: clock(),
            waited: Duration::ZERO,
            paced: Duration::ZERO,
        }
    }

    fn used(&self) -> Duration {
        (self.clock)().saturating_sub(self.cpu)
    }

    /// Sleeps until the CPU time used, and as much again as the step since
    /// the last pace took, is within the budget.
    fn pace(&mut self) {
        let used = self.used();
        let ahead = used.saturating_sub(self.paced);
        let due = Duration::from_secs_f64((used + ahead).as_secs_f64() / self.rate);
        let wait = due.saturating_sub(self.wall.elapsed());
        if !wait.is_zero() {
            std::thread::sleep(wait);
            self.waited += wait;
        }
        self.paced = self.used();
    }
}

thread_local! {
    /// The budget of the pass this thread runs, for [`pace_pass`].
    static PASS: std::cell::RefCell<Option<Budget>> = const { std::cell::RefCell::new(None) };
}

/// Paces the pass this thread runs: the scan calls it between chunks of a
/// process.
fn pace_pass() {
    PASS.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            b.pace();
        }
    });
}

/// Scans every process once, pacing itself to the budget.
fn one_pass(depth: usize, rate: f64) -> Result<Pass> {
    PASS.with(|b| *b.borrow_mut() = Some(Budget::new(rate)));
    let pass = walk_processes(depth);
    let budget = PASS
        .with(|b| b.borrow_mut().take())
        .expect("the pass's budget");
    let (cgroups, mut cost, predictions) = pass?;
    cost.wall = budget.wall.elapsed();
    cost.cpu = budget.used();
    cost.waited = budget.waited;
    Ok(Pass {
        finished: SystemTime::now(),
        finished_at: Instant::now(),
        predictions,
        cgroups,
        cost,
    })
}

/// Every process scanned and added to its cgroup, paced after each.
fn walk_processes(depth: usize) -> Result<(BTreeMap<String, CgroupFigures>, Cost, Predictions)> {
    let predictions = Predictions::new(scan::shrinker_settings()?);
    let hierarchy = memcg::hierarchy();
    let me = std::process::id() as i32;
    let opts = ScanOptions {
        content: true,
        threads: 1,
        pace: Some(pace_pass),
        ..ScanOptions::default()
    };
    let mut cgroups: BTreeMap<String, CgroupFigures> = BTreeMap::new();
    let mut cost = Cost::default();
    let mut first_error = None;
    for pid in scan::all_pids()?.into_iter().filter(|&p| p != me) {
        let cgroup = match &hierarchy {
            Some((_, version)) => memcg::memcg_of(pid, *version).map(|p| at_depth(&p, depth)),
            None => Some("/".to_string()),
        };
        let outcome = match cgroup {
            None => Err(Skip::Exited),
            Some(cg) => match scan::scan_process(pid, &opts) {
                // No memory: a kernel thread (no skip), or a zombie now.
                Ok(s) if s.vmas.is_empty() && scan::has_exited(pid) => Err(Skip::Exited),
                Ok(s) if s.vmas.is_empty() => Ok(false),
                Ok(s) => {
                    cost.pages_read += s.folio_pages;
                    cgroups.entry(cg).or_default().add(&s, &predictions);
                    Ok(true)
                }
                Err(e) if scan::is_gone(&e) => Err(Skip::Exited),
                Err(e) if scan::is_denied(&e) => Err(Skip::Denied),
                Err(e) => {
                    first_error.get_or_insert_with(|| format!("process {pid}: {e}"));
                    Err(Skip::Error)
                }
            },
        };
        match outcome {
            Ok(true) => cost.scanned += 1,
            Ok(false) => {}
            Err(skip) => *cost.skipped.entry(skip).or_default() += 1,
        }
        pace_pass();
    }
    if let Some(e) = first_error {
        eprintln!("hugelab: exporter: not scanned ({e}; counted as skipped, reason error)");
    }
    Ok((cgroups, cost, predictions))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's CPU time: the other tests' threads run meanwhile.
    fn thread_cpu_time() -> Duration {
        clock(libc::CLOCK_THREAD_CPUTIME_ID)
    }

    /// CPU spent faster than the budget allows is paid back by a wait:
    /// afterwards the CPU time is within the budget of the wall time.
    #[test]
    fn pacing_keeps_the_cpu_time_within_the_budget() {
        let mut b = Budget::counting(thread_cpu_time, 0.05);
        let spin = thread_cpu_time() + Duration::from_millis(20);
        let mut x = 0u64;
        while thread_cpu_time() < spin {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        b.pace();
        let (used, wall) = (b.used(), b.wall.elapsed());
        // 20 ms of CPU at 5 % is 400 ms: spinning took less (it is all CPU).
        assert!(
            b.waited > Duration::ZERO,
            "no wait after {used:?} of CPU in {wall:?}"
        );
        assert!(
            used.as_secs_f64() <= 0.05 * wall.as_secs_f64() * 1.01,
            "{used:?} of CPU in {wall:?}"
        );
        // Paid ahead: another step like this one is within the budget too.
        assert!(
            2.0 * used.as_secs_f64() <= 0.05 * wall.as_secs_f64() * 1.01,
            "{used:?} of CPU in {wall:?}: the next step is not paid for"
        );
    }
}
