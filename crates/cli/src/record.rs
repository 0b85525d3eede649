//! `hugelab record`: runs a command under the kernel crate's recorder and
//! writes what it did to anonymous memory as a workload (`-o FILE.hlw.zst`),
//! or prints a summary of the capture (`--summary`).

use crate::record_exits as exits;
use crate::record_write::Output;
use crate::table;
use anyhow::{bail, Context, Result};
use clap::Args;
use hugelab_kernel::guard::{self, SettingsGuard};
use hugelab_kernel::record::{self, convert, spool, Summary};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct RecordArgs {
    /// The workload to write (`.hlw.zst` zstd, `.hlw.gz` gzip, else plain);
    /// default: the program's name with `.hlw.zst`.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// A `snapshot <proc>-exit` before each process's exit in the workload
    /// (its memory at the end of its life; `end` comes after every exit),
    /// with `expect` lines of the anonymous memory and minor faults the
    /// recorded run had then.
    #[arg(long)]
    snapshot_at_exit: bool,
    /// Print what was captured, per task, instead of writing a workload.
    #[arg(long)]
    summary: bool,
    /// The summary, or the recording's figures, as JSON.
    #[arg(long)]
    json: bool,
    /// Ring buffer per CPU (4M, 16M, ...); a recording that loses any event is refused.
    #[arg(long, default_value = "4M", value_parser = parse_buffer)]
    buffer: u64,
    /// The command to record and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The largest ring per CPU `--buffer` accepts: more is a typo, not a need
/// (4M lost nothing at 0.4 M faults/s here).
const MAX_BUFFER: u64 = 1 << 30;

fn parse_buffer(s: &str) -> Result<u64, String> {
    let n = hugelab_workload::units::parse_size(s).map_err(|e| e.to_string())?;
    if n < 4096 {
        return Err(format!("{s} is less than a page"));
    }
    if n > MAX_BUFFER {
        return Err(format!(
            "{s} is more than the 1G per CPU a ring may take here"
        ));
    }
    Ok(n)
}

fn progress_bar() -> Option<ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("a valid template"));
        bar
    })
}

/// What a recording gave: its outcome, its summary, and its spooled events.
struct Recorded {
    outcome: record::Outcome,
    summary: Summary,
    spool: Option<spool::Spool>,
}

/// Records the command; the machine is as it was when this returns.
fn run_recording(args: &RecordArgs) -> Result<Recorded> {
    guard::require_root(
        "hugelab record traces the command with perf tracepoints and needs root; run it as root",
    )?;
    // Holds the machine lock and installs the signal path, which kills the
    // recorded tree and unmounts the tracefs we mounted. A first Ctrl-C
    // only ends the recording early: what was captured is still written.
    let mut settings = SettingsGuard::acquire()?;
    guard::set_cleanup_hook(record::interrupt_cleanup);
    guard::set_soft_interrupt_hook(record::soft_interrupt);
    let mut writer = if args.summary {
        None
    } else {
        Some(spool::Writer::create(&std::env::temp_dir())?)
    };
    let mut spool_error = None;
    let bar = progress_bar();
    let mut summary = Summary::default();
    let opts = record::Options {
        command: args.command.clone(),
        buffer: args.buffer,
        watch_settings: Some(std::path::PathBuf::from(record::settings::THP_DIR))
            .filter(|d| d.is_dir()),
    };
    let outcome = record::record(
        &opts,
        |e| {
            summary.add(e);
            if let Some(w) = &mut writer {
                if let Err(err) = w.push(e) {
                    spool_error.get_or_insert(err);
                }
            }
        },
        |p| {
            if let Some(bar) = &bar {
                bar.set_message(format!(
                    "{} events, {:.0}/s, {}",
                    p.events,
                    p.events as f64 / p.seconds.max(1e-9),
                    table::human(p.bytes)
                ));
                bar.tick();
            }
        },
    );
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    settings.restore()?;
    let outcome = outcome?;
    if let Some(e) = spool_error {
        bail!(
            "cannot keep the recording in {}: {e}",
            std::env::temp_dir().display()
        );
    }
    if outcome.lost > 0 {
        bail!(
            "the kernel lost {} events because a {} per-CPU buffer filled up; record again with a larger --buffer (e.g. --buffer {}M)",
            outcome.lost,
            table::human(outcome.buffer),
            (outcome.buffer >> 20).max(1) * 4
        );
    }
    let spool = writer.map(|w| w.finish()).transpose()?;
    Ok(Recorded {
        outcome,
        summary,
        spool,
    })
}

pub fn main(args: RecordArgs) -> Result<ExitCode> {
    if args.summary && args.output.is_some() {
        bail!("--summary prints what was captured and writes no workload; drop one of --summary and -o");
    }
    let output = args.output.clone().unwrap_or_else(|| {
        let program = args.command[0].rsplit('/').next().unwrap_or("recording");
        PathBuf::from(format!("{program}.hlw.zst"))
    });
    let Recorded {
        outcome,
        summary,
        spool,
    } = run_recording(&args)?;
    if outcome.interrupted {
        eprintln!("hugelab: interrupted: the command's tree was stopped; keeping what was recorded before");
    }
    let Some(mut spool) = spool else {
        if args.json {
            println!("{}", to_json(&summary, &outcome));
        } else {
            print!("{}", to_text(&summary, &outcome));
        }
        return Ok(ExitCode::SUCCESS);
    };
    if summary.tasks.is_empty() {
        bail!(
            "{} ended before it ran anything: nothing was recorded",
            args.command[0]
        );
    }
    let header = convert::Header {
        command: args.command.clone(),
        date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "(unknown)".into()),
        interrupted: outcome.interrupted,
        snapshot_at_exit: args.snapshot_at_exit,
        settings_read: outcome.settings_read.clone(),
    };
    let mut out = Output::create(&output)?;
    let mut named = Vec::new();
    let converted = {
        let mut w = exits::ExpectWriter::new(out.writer());
        let figures = w.figures.clone();
        let snapshot_at_exit = args.snapshot_at_exit;
        let r = convert::convert_named(&mut spool, &header, &mut w, |n| {
            named = n.to_vec();
            if snapshot_at_exit {
                *figures.borrow_mut() = exits::by_process(n, &outcome.exits)
                    .into_iter()
                    .map(|m| (m.process.clone(), m))
                    .collect();
            }
        });
        r.and_then(|s| std::io::Write::flush(&mut w).map(|()| s))
    };
    let stats = match converted {
        Ok(s) => s,
        Err(e) => {
            out.discard();
            return Err(e).with_context(|| format!("cannot write {}", output.display()));
        }
    };
    let bytes = out.commit()?;
    let measured = exits::by_process(&named, &outcome.exits);
    report(
        &args,
        &output,
        &outcome,
        &stats,
        &measured,
        (bytes, spool.bytes),
    );
    Ok(ExitCode::SUCCESS)
}

fn report(
    args: &RecordArgs,
    output: &std::path::Path,
    o: &record::Outcome,
    s: &convert::Stats,
    measured: &[exits::Measured],
    (bytes, spool_bytes): (u64, u64),
) {
    let skipped: u64 = s.skipped.values().sum();
    if args.json {
        let doc = json!({
            "workload": output,
            "bytes": bytes,
            "statements": s.statements,
            "processes": s.processes,
            "threads": s.threads,
            "files": s.files,
            "faults": s.faults,
            "faults_by_process": s.faults_by_process,
            "raced_by_process": s.raced_by_process,
            "measured_by_process": measured,
            "not_replayed": s.skipped,
            "thp_settings_read": settings_json(&s.settings_read),
            "interrupted": o.interrupted,
            "spool_bytes": spool_bytes,
            "totals": totals(o),
        });
        println!("{doc}");
        return;
    }
    println!(
        "wrote {} ({}): {} statements, {} processes, {} threads, {} files, {} faults{}",
        output.display(),
        table::human(bytes),
        s.statements,
        s.processes,
        s.threads,
        s.files,
        s.faults,
        if o.interrupted {
            "; INTERRUPTED: the part before the signal"
        } else {
            ""
        }
    );
    println!(
        "{} events in {:.2} s ({:.0}/s), {:.1} bytes per event compressed; {} events not replayed (listed at the end of the workload); the command exited with {}",
        o.events,
        o.seconds,
        o.events as f64 / o.seconds.max(1e-9),
        spool_bytes as f64 / o.events.max(1) as f64,
        skipped,
        o.status.map_or("no status".into(), |s| s.to_string()),
    );
    if o.settings_overflowed {
        println!(
            "some reads of the THP settings were not reported (the kernel's queue overflowed)"
        );
    }
    if let Some(line) = record::settings::header_line(&s.settings_read) {
        println!("{line}: a replay does what it did under this recording's settings");
    }
    if !measured.is_empty() {
        println!(
            "\nWhat each process measured at its exit (minflt over its mms; RssAnon and RssShmem of its last):"
        );
        print!(
            "{}",
            exits::table(measured, &s.faults_by_process, &s.raced_by_process)
        );
    }
}

/// `thp_settings_read` of `--json`: each process and the setting it read.
fn settings_json(reads: &[(String, String)]) -> serde_json::Value {
    reads
        .iter()
        .map(|(process, path)| json!({ "process": process, "path": path }))
        .collect()
}

fn totals(o: &record::Outcome) -> serde_json::Value {
    json!({
        "events": o.events,
        "lost": o.lost,
        "seconds": o.seconds,
        "events_per_second": o.events as f64 / o.seconds.max(1e-9),
        "bytes": o.bytes,
        "buffer_per_cpu": o.buffer,
        "exit_status": o.status,
        "minflt": o.minflt,
    })
}

fn to_json(s: &Summary, o: &record::Outcome) -> String {
    json!({
        "tasks": s.tasks,
        "mms": o.exits,
        "thp_settings_read": o.settings_read,
        "totals": totals(o),
    })
    .to_string()
}

fn to_text(s: &Summary, o: &record::Outcome) -> String {
    let header: Vec<String> = [
        "pid/tid",
        "comm",
        "parent",
        "kind",
        "clone flags",
        "read 0x4",
        "write 0x6",
        "wp 0x7",
        "other",
        "kernel",
        "mm syscalls",
        "exec'd",
    ]
    .map(String::from)
    .to_vec();
    let rows: Vec<Vec<String>> = s
        .tasks
        .iter()
        .map(|t| {
            let syscalls: Vec<String> =
                t.syscalls.iter().map(|(k, n)| format!("{k} {n}")).collect();
            vec![
                format!("{}/{}", t.pid, t.tid),
                t.comm.clone(),
                t.parent.map_or("-".into(), |p| p.to_string()),
                t.kind.to_string(),
                t.clone_flags.map_or("-".into(), |f| format!("{f:#x}")),
                t.faults.read.to_string(),
                t.faults.write.to_string(),
                t.faults.write_protect.to_string(),
                t.faults.other.to_string(),
                t.faults.kernel.to_string(),
                syscalls.join(", "),
                t.execs.join(" "),
            ]
        })
        .collect();
    let mut out = table::render_text(&header, &rows);
    out.push_str(&format!(
        "\n{} events, {} lost, {:.2} s, {:.0} events/s, {} read ({} buffer per CPU); the command exited with {}\n",
        o.events,
        o.lost,
        o.seconds,
        o.events as f64 / o.seconds.max(1e-9),
        table::human(o.bytes),
        table::human(o.buffer),
        o.status.map_or("no status".into(), |s| s.to_string()),
    ));
    if !o.settings_read.is_empty() {
        let reads: Vec<String> = o
            .settings_read
            .iter()
            .map(|r| format!("{} {}", r.pid, r.path))
            .collect();
        out.push_str(&format!(
            "THP settings read, by pid: {}\n",
            reads.join(", ")
        ));
    }
    if !o.exits.is_empty() {
        out.push_str("\nEach mm as it ended (exit or exec), read by the recorder:\n");
        out.push_str(&exits::mm_table(&o.exits));
    }
    out
}
