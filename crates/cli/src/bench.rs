//! `hugelab bench`: runs a real command under several huge-page settings and
//! compares them as the mTHP series did (seed 000: a kernel build per
//! setting, real/kern/user time and peak memory against a 4K baseline).
//!
//! Every tunable any setting names is journaled by the settings guard and
//! restored on success, error, Ctrl-C and SIGTERM (`hugelab settings
//! restore` after SIGKILL). A setting is applied before each of its runs:
//! its own values, and the machine's original value for the tunables only
//! other settings name. Runs are interleaved (A B C A B C …) so that drift —
//! above all these VMs returning freed memory to the host, which makes the
//! first touches after idle slow — hits every setting alike; warm-up runs
//! (`--warmup`) come first and are recorded but not tabulated. Each run is
//! one `hugelab_kernel::command::run_in_memcg`: a fresh memory cgroup,
//! created before the run and removed after it, limited by the setting's
//! `memory.max=` if it has one. A run whose command ended non-zero after an
//! OOM kill in its group is an outcome (counted, the bench goes on), not a
//! failure of the command.

use crate::bench_plot::write_plot;
use crate::bench_record::{BenchResult, RunRecord, SettingSpec};
use crate::bench_report;
use crate::compare::parse_settings;
use anyhow::{bail, Context, Result};
use clap::Args;
use hugelab_kernel::command::{run_in_memcg, CommandRun, ANON_SAMPLE_PERIOD};
use hugelab_kernel::guard::SettingsGuard;
use hugelab_kernel::run_as::RunAs;
use hugelab_kernel::{damon, memcg, sysfs};
use hugelab_workload::Tunable;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

#[derive(Args)]
pub struct BenchArgs {
    /// A setting: NAME:TUNABLE=VALUE,... (repeat; the first is the baseline).
    #[arg(
        long = "setting",
        value_name = "NAME:TUNABLE=VALUE,...",
        required_unless_present = "from"
    )]
    settings: Vec<String>,
    /// Run nothing: print the tables (and --plot) of a bench saved with --json.
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["settings", "command", "dry_run"])]
    from: Option<PathBuf>,
    /// Measured runs per setting.
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// Warm-up runs per setting, before the measured ones (not tabulated).
    #[arg(long, default_value_t = 1)]
    warmup: u32,
    /// Print every run's figures and the statistics as JSON.
    #[arg(long)]
    json: bool,
    /// Draw every run and each setting's mean and 95% interval into this SVG.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Print what would be changed and run, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Let the command's output through (default: discarded).
    #[arg(long)]
    show_output: bool,
    /// Go on when the command exits non-zero (default: stop the bench).
    #[arg(long)]
    ignore_failure: bool,
    /// Run the command as this user (default: the user who ran sudo, from
    /// SUDO_UID/SUDO_GID; root when hugelab was not started with sudo).
    #[arg(long, value_name = "NAME", conflicts_with = "as_root")]
    user: Option<String>,
    /// Run the command as root even under sudo (the table's header says so).
    #[arg(long)]
    as_root: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required_unless_present = "from", value_name = "CMD")]
    command: Vec<String>,
}

/// A setting as applied: name, (tunable, value) pairs and the memory
/// limit of each run's cgroup.
struct Applied {
    name: String,
    values: Vec<(Tunable, String)>,
    memory_max: Option<u64>,
}

impl Applied {
    /// What this setting writes to the tunable at `path`: its own value, or
    /// `original` (the machine's value before the bench) when only other
    /// settings name it.
    fn value<'a>(&'a self, path: &str, original: &'a str) -> &'a str {
        self.values
            .iter()
            .find(|(t, _)| t.path() == path)
            .map_or(original, |(_, v)| v.as_str())
    }
}

/// The union of the settings' tunables, by path: the tunable and the
/// machine's value of it before the bench.
type Originals = BTreeMap<String, (Tunable, String)>;

pub fn main(args: BenchArgs) -> Result<ExitCode> {
    if let Some(file) = &args.from {
        return from_saved(file, &args);
    }
    let Some(result) = measure(&args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    if let Some(path) = &args.plot {
        write_plot(&result, path)?;
    }
    print!("{}", report(&result, args.json)?);
    Ok(ExitCode::SUCCESS)
}

impl BenchArgs {
    /// A bench of `command` under `settings` (as `--setting` takes them),
    /// `runs` measured runs after `warmup` ones each, the command's output
    /// discarded: what `validate` measures.
    pub(crate) fn of(
        settings: Vec<String>,
        runs: u32,
        warmup: u32,
        dry_run: bool,
        json: bool,
        command: Vec<String>,
    ) -> BenchArgs {
        BenchArgs {
            settings,
            from: None,
            runs,
            warmup,
            json,
            plot: None,
            dry_run,
            show_output: false,
            ignore_failure: false,
            user: None,
            as_root: false,
            command,
        }
    }

    /// Who the command runs as: `--user NAME` and `--as-root`, as `bench`
    /// takes them (`validate`'s).
    pub(crate) fn run_as(mut self, user: Option<String>, as_root: bool) -> BenchArgs {
        self.user = user;
        self.as_root = as_root;
        self
    }
}

/// Checks the settings and the command, then runs the schedule under the
/// settings guard: every run's figures. With `--dry-run`, prints what would
/// change and run instead, and returns None.
pub(crate) fn measure(args: &BenchArgs) -> Result<Option<BenchResult>> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    // Everything is checked before anything changes.
    let settings = checked_settings(&args.settings)?;
    let program = resolve(&args.command[0])?;
    let mut argv = args.command.clone();
    argv[0] = program.display().to_string();
    let mut original = Originals::new();
    for s in &settings {
        for (t, _) in &s.values {
            let now = sysfs::read_tunable(t)?;
            original.entry(t.path()).or_insert((t.clone(), now));
        }
    }
    let schedule = schedule(settings.len(), args.warmup, args.runs);
    let run_as = run_as(args)?;
    let who = who(run_as.as_ref(), args.as_root);
    if args.dry_run {
        let plan = DryRun::new(&settings, &original, &schedule, &argv, &who);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&plan)?);
        } else {
            print!("{}", plan.render());
        }
        return Ok(None);
    }
    hugelab_kernel::guard::require_root(
        "hugelab bench needs root: it sets kernel tunables and creates memory cgroups",
    )?;
    if memcg::hierarchy().is_none() {
        bail!("this machine has no memory cgroup controller (neither v2 nor v1 is mounted)");
    }
    if let Some(user) = &run_as {
        let cwd = std::env::current_dir().context("cannot read the working directory")?;
        if let Some(why) = hugelab_kernel::command::check_access(user, &program, &cwd) {
            bail!(why);
        }
    }
    let run = Run {
        argv: &argv,
        run_as: run_as.as_ref(),
        who,
    };
    run_schedule(args, &settings, &original, &schedule, &run).map(Some)
}

/// The command and who it runs as.
struct Run<'a> {
    argv: &'a [String],
    run_as: Option<&'a RunAs>,
    /// [`who`].
    who: String,
}

/// Who the command runs as: `--as-root` root, `--user NAME` that user,
/// else the user who ran sudo (None: root, hugelab's own user).
fn run_as(args: &BenchArgs) -> Result<Option<RunAs>> {
    Ok(if args.as_root {
        None
    } else if let Some(name) = &args.user {
        Some(RunAs::user(name)?)
    } else {
        RunAs::sudo_invoker(|k| std::env::var(k).ok())?
    })
}

/// `user nobody (uid 65534, gid 65534)`, `root (--as-root)`, `root`.
fn who(run_as: Option<&RunAs>, as_root: bool) -> String {
    match run_as {
        Some(u) => format!("user {}", u.describe()),
        None if as_root => "root (--as-root)".to_string(),
        None => "root (hugelab was not started with sudo)".to_string(),
    }
}

/// `--from FILE.json`: the tables (and --plot) of a bench saved with --json.
fn from_saved(file: &Path, args: &BenchArgs) -> Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let result: BenchResult = serde_json::from_str(&text)
        .with_context(|| format!("{} is not the JSON of hugelab bench", file.display()))?;
    if let Some(path) = &args.plot {
        write_plot(&result, path)?;
    }
    print!("{}", report(&result, args.json)?);
    Ok(ExitCode::SUCCESS)
}

/// Every `--setting`, parsed, each tunable present on this kernel.
fn checked_settings(specs: &[String]) -> Result<Vec<Applied>> {
    let mut settings = Vec::new();
    for (spec, s) in specs.iter().zip(parse_settings(specs)?) {
        for (tunable, _) in &s.sets {
            let file = sysfs::tunable_file(tunable);
            if !file.exists() {
                bail!(
                    "--setting '{spec}': this kernel has no {} ({} does not exist)",
                    tunable.path(),
                    file.display()
                );
            }
        }
        settings.push(Applied {
            name: s.name,
            values: s
                .sets
                .iter()
                .map(|(t, v)| (t.clone(), v.to_string()))
                .collect(),
            memory_max: s.memory_max,
        });
    }
    Ok(settings)
}

/// Runs the schedule under the settings guard (the tunables restored on
/// every ending, Ctrl-C included): the runs, their figures.
fn run_schedule(
    args: &BenchArgs,
    settings: &[Applied],
    original: &Originals,
    schedule: &[Step],
    cmd: &Run,
) -> Result<BenchResult> {
    let argv = cmd.argv;
    let mut result = BenchResult {
        command: args.command.clone(),
        run_as: cmd.who.clone(),
        settings: settings
            .iter()
            .map(|s| SettingSpec {
                name: s.name.clone(),
                tunables: s
                    .values
                    .iter()
                    .map(|(t, v)| (t.path(), v.clone()))
                    .collect(),
                memory_max: s.memory_max,
            })
            .collect(),
        warmup: args.warmup,
        anon_sample_period_ms: ANON_SAMPLE_PERIOD.as_secs_f64() * 1e3,
        runs_per_setting: args.runs,
        runs: Vec::new(),
        interrupted: false,
    };
    let mut guard = SettingsGuard::acquire()?;
    *state() = Some(Interrupt {
        child_group: None,
        result: result.clone(),
        json: args.json,
    });
    hugelab_kernel::guard::set_cleanup_hook(on_interrupt);

    let bar = ProgressBar::new(schedule.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg} (ETA {eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let mut current: BTreeMap<String, String> = original
        .iter()
        .map(|(p, (_, v))| (p.clone(), v.clone()))
        .collect();
    for (n, step) in schedule.iter().enumerate() {
        let s = &settings[step.setting];
        let kind = if step.warmup { "warm-up" } else { "run" };
        bar.set_message(format!("{} {kind} {}", s.name, step.run + 1));
        // This setting's values; the original for what only others name.
        for (path, (t, orig)) in original {
            let want = s.value(path, orig);
            if current[path] != want {
                guard
                    .set(t, want)
                    .with_context(|| format!("applying setting {}", s.name))?;
                current.insert(path.clone(), want.to_string());
            }
        }
        let group = format!("bench{n}");
        let (limit, show) = (s.memory_max, args.show_output);
        // The state stays locked from before the group is made until it is
        // registered, so an interrupt either finds the group or comes
        // before it exists (and this thread then parks below).
        let mut slot = state();
        if slot.is_none() {
            drop(slot);
            until_the_signal_thread_exits();
        }
        let run = run_in_memcg(argv, &group, limit, cmd.run_as, show, move |_, dir| {
            if let Some(st) = slot.as_mut() {
                st.child_group = Some(dir.to_path_buf());
            }
        })?;
        match state().as_mut() {
            Some(st) => st.child_group = None,
            None => until_the_signal_thread_exits(),
        }
        let record = run_record(&s.name, step, run);
        // An OOM kill is the setting's outcome, not the command's failure.
        if record.exit_code != 0 && !record.oom_killed() && !args.ignore_failure {
            bar.finish_and_clear();
            guard.restore()?;
            bail!(
                "{} {kind} {}: `{}` exited with status {}; the bench stops (--ignore-failure goes on)",
                s.name,
                step.run + 1,
                args.command.join(" "),
                record.exit_code
            );
        }
        result.runs.push(record);
        if let Some(st) = state().as_mut() {
            st.result = result.clone();
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    guard.restore()?;
    *state() = None;
    Ok(result)
}

/// What a run of `setting` measured, as the bench keeps it.
fn run_record(setting: &str, step: &Step, run: CommandRun) -> RunRecord {
    RunRecord {
        setting: setting.to_string(),
        run: step.run,
        warmup: step.warmup,
        exit_code: run.exit_code,
        wall_s: run.wall_s,
        user_s: run.user_s,
        sys_s: run.sys_s,
        peak_kb: run.peak_kb,
        minflt: run.minflt,
        majflt: run.majflt,
        pre_exec_minflt: run.pre_exec_minflt,
        oom_kills: run.oom_kills,
        anon_peak_kb: run.anon.anon_kb,
        anon_thp_peak_kb: run.anon.anon_thp_kb,
        anon_samples: run.anon.samples,
        anon_sample_us: run.anon.sample_us,
        noisy: if run.noisy() {
            run.counters.keys().cloned().collect()
        } else {
            Vec::new()
        },
        counters: run.counters,
    }
}

/// The interrupt hook took the state (and killed the run in flight): the
/// signal thread restores the tunables and exits the process; wait for it.
fn until_the_signal_thread_exits() -> ! {
    loop {
        std::thread::park();
    }
}

/// One run of the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub setting: usize,
    pub run: u32,
    pub warmup: bool,
}

/// Warm-ups then measured runs, each round going through every setting.
pub fn schedule(settings: usize, warmup: u32, runs: u32) -> Vec<Step> {
    let round = |run, warmup| {
        (0..settings).map(move |setting| Step {
            setting,
            run,
            warmup,
        })
    };
    (0..warmup)
        .flat_map(|r| round(r, true))
        .chain((0..runs).flat_map(|r| round(r, false)))
        .collect()
}

/// The program to execute: a path as given, or found in PATH.
fn resolve(program: &str) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        if executable(&p) {
            return Ok(p);
        }
        bail!("the command {program} does not exist or is not executable");
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| executable(p))
        .with_context(|| format!("the command {program} is not found in PATH"))
}

/// `--dry-run`: what would be changed and run. `--json` prints it as it
/// is; [`DryRun::render`] is the text.
#[derive(Serialize)]
struct DryRun {
    dry_run: bool,
    command: Vec<String>,
    settings: Vec<PlannedSetting>,
    cgroup_root: Option<CgroupRoot>,
    /// The DAMON kdamonds the settings guard turns off for the bench.
    damon: Vec<damon::Planned>,
    /// Why they cannot be listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    damon_unreadable: Option<String>,
    /// Who the command runs as (`user nobody (uid 65534, gid 65534)`).
    run_as: String,
    runs: Vec<PlannedRun>,
}

#[derive(Serialize)]
struct PlannedSetting {
    name: String,
    baseline: bool,
    /// Every tunable any setting names: this setting's value of it, and the
    /// machine's now.
    tunables: Vec<PlannedValue>,
    /// The memory limit of each run's cgroup, bytes; null: none.
    memory_max: Option<u64>,
}

#[derive(Serialize)]
struct PlannedValue {
    tunable: String,
    value: String,
    now: String,
}

#[derive(Serialize)]
struct CgroupRoot {
    dir: PathBuf,
    version: String,
}

#[derive(Serialize)]
struct PlannedRun {
    setting: String,
    warmup: bool,
    /// From 1.
    run: u32,
}

impl DryRun {
    fn new(
        settings: &[Applied],
        original: &Originals,
        schedule: &[Step],
        argv: &[String],
        who: &str,
    ) -> Self {
        let damon = damon::planned();
        DryRun {
            run_as: who.to_string(),
            dry_run: true,
            command: argv.to_vec(),
            settings: settings
                .iter()
                .enumerate()
                .map(|(i, s)| PlannedSetting {
                    name: s.name.clone(),
                    baseline: i == 0,
                    tunables: original
                        .iter()
                        .map(|(path, (_, now))| PlannedValue {
                            tunable: path.clone(),
                            value: s.value(path, now).to_string(),
                            now: now.clone(),
                        })
                        .collect(),
                    memory_max: s.memory_max,
                })
                .collect(),
            cgroup_root: memcg::hierarchy().map(|(dir, v)| CgroupRoot {
                dir,
                version: format!("{v:?}"),
            }),
            damon_unreadable: damon.as_ref().err().map(|e| e.to_string()),
            damon: damon.unwrap_or_default(),
            runs: schedule
                .iter()
                .map(|st| PlannedRun {
                    setting: settings[st.setting].name.clone(),
                    warmup: st.warmup,
                    run: st.run + 1,
                })
                .collect(),
        }
    }

    fn render(&self) -> String {
        let mut out = String::from("dry run: nothing is changed\n\n");
        for s in &self.settings {
            let role = if s.baseline { " (baseline)" } else { "" };
            out.push_str(&format!("setting {}{role}:\n", s.name));
            for t in &s.tunables {
                let change = if t.value == t.now {
                    "(unchanged)".to_string()
                } else {
                    format!("(now {})", t.now)
                };
                out.push_str(&format!("  {} = {} {change}\n", t.tunable, t.value));
            }
            if let Some(max) = s.memory_max {
                let file = match self.cgroup_root.as_ref().map(|r| r.version.as_str()) {
                    Some("V1") => "memory.limit_in_bytes",
                    _ => "memory.max",
                };
                out.push_str(&format!(
                    "  memory.max = {} (each run's cgroup: {file} = {max})\n",
                    hugelab_workload::Size(max)
                ));
            }
        }
        out.push_str(&damon_lines(&self.damon, self.damon_unreadable.as_deref()));
        let root = self
            .cgroup_root
            .as_ref()
            .map_or("no memory cgroup controller".to_string(), |r| {
                format!("{} ({})", r.dir.display(), r.version)
            });
        out.push_str(&format!(
            "\n{} runs, each `{}` as {} in a fresh memory cgroup under {root}:\n",
            self.runs.len(),
            self.command.join(" "),
            self.run_as
        ));
        for r in &self.runs {
            let kind = if r.warmup { "warm-up" } else { "run" };
            out.push_str(&format!("  {} {kind} {}\n", r.setting, r.run));
        }
        out.push_str("then every tunable above is restored to its value now\n");
        out
    }
}

/// The dry run's DAMON lines: what the settings guard turns off for the
/// whole command (nothing when no kdamond runs).
pub(crate) fn damon_lines(planned: &[damon::Planned], unreadable: Option<&str>) -> String {
    let mut out = String::new();
    if let Some(e) = unreadable {
        out.push_str(&format!("\nDAMON: cannot tell which kdamonds run: {e}\n"));
    }
    if !planned.is_empty() {
        out.push_str("\nfor the whole command (DAMON's pageout and sampling move the counters):\n");
        for p in planned {
            out.push_str(&format!("  {}\n", p.line()));
        }
    }
    out
}

/// What the interrupt hook needs: the group of the run in flight and the
/// runs so far.
struct Interrupt {
    child_group: Option<PathBuf>,
    result: BenchResult,
    json: bool,
}

static STATE: Mutex<Option<Interrupt>> = Mutex::new(None);

fn state() -> std::sync::MutexGuard<'static, Option<Interrupt>> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ctrl-C / SIGTERM (on the guard's signal thread, before it restores the
/// tunables and exits): kill the run in flight, remove its group, print the
/// runs finished so far. Written with `write!`, errors ignored: a stdout
/// whose reader has gone (`hugelab bench … | head`) must not panic here,
/// where no unwinding reaches `closed_stdout::run` and the guard would call
/// it a failed hook.
fn on_interrupt() {
    use std::io::Write;
    let Some(mut st) = state().take() else {
        return;
    };
    if let Some(dir) = st.child_group.take() {
        memcg::kill_all(&dir);
        let _ = std::fs::remove_dir(&dir);
    }
    // Any other group of this process (none expected: see `run_schedule`).
    memcg::remove_own();
    st.result.interrupted = true;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "hugelab: bench interrupted after {}",
        crate::table::plural(st.result.runs.len() as u64, "run", "runs")
    );
    match report(&st.result, st.json) {
        Ok(text) => {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "{text}");
            let _ = out.flush();
        }
        Err(e) => {
            let _ = writeln!(err, "hugelab: {e:#}");
        }
    }
}

/// The tables (the seed-shaped summary first, as `compare` prints its
/// summary first, then the metrics), or the JSON.
fn report(result: &BenchResult, json: bool) -> Result<String> {
    if json {
        return Ok(serde_json::to_string_pretty(&bench_report::to_json(result))? + "\n");
    }
    let mut out = String::new();
    if result.interrupted {
        out.push_str("interrupted: the runs finished so far\n\n");
    }
    if !result.run_as.is_empty() {
        out.push_str(&format!(
            "`{}` ran as {}\n",
            result.command.join(" "),
            result.run_as
        ));
    }
    out.push_str(&bench_report::summary_table(result));
    out.push('\n');
    out.push_str(&bench_report::metric_tables(result));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_interleaves_settings_after_the_warmups() {
        let s = schedule(2, 1, 2);
        let short: Vec<(usize, u32, bool)> =
            s.iter().map(|x| (x.setting, x.run, x.warmup)).collect();
        assert_eq!(
            short,
            [
                (0, 0, true),
                (1, 0, true),
                (0, 0, false),
                (1, 0, false),
                (0, 1, false),
                (1, 1, false)
            ]
        );
    }
}
