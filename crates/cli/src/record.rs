//! `hugelab record`: runs a command under the kernel crate's recorder.
//! So far it prints a summary of what was captured (`--summary`); the
//! workload output is not built yet.

use crate::table;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_kernel::guard::{self, SettingsGuard};
use hugelab_kernel::record::{self, Summary};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::IsTerminal;
use std::process::ExitCode;

#[derive(Args)]
pub struct RecordArgs {
    /// Print what was captured, per task (the workload output is not built yet).
    #[arg(long)]
    summary: bool,
    /// The summary as JSON.
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

pub fn main(args: RecordArgs) -> Result<ExitCode> {
    if !args.summary {
        bail!("hugelab record only prints a --summary of the capture so far; the workload output is not built yet");
    }
    guard::require_root(
        "hugelab record traces the command with perf tracepoints and needs root; run it as root",
    )?;
    // Holds the machine lock and installs the signal path, which kills the
    // recorded tree and unmounts the tracefs we mounted.
    let mut settings = SettingsGuard::acquire()?;
    guard::set_cleanup_hook(record::interrupt_cleanup);
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("a valid template"));
        bar
    });
    let mut summary = Summary::default();
    let opts = record::Options {
        command: args.command.clone(),
        buffer: args.buffer,
    };
    let outcome = record::record(
        &opts,
        |e| summary.add(e),
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
    if outcome.lost > 0 {
        bail!(
            "the kernel lost {} events because a {} per-CPU buffer filled up; record again with a larger --buffer (e.g. --buffer {}M)",
            outcome.lost,
            table::human(outcome.buffer),
            (outcome.buffer >> 20).max(1) * 4
        );
    }
    if args.json {
        println!("{}", to_json(&summary, &outcome));
    } else {
        print!("{}", to_text(&summary, &outcome));
    }
    Ok(ExitCode::SUCCESS)
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
    })
}

fn to_json(s: &Summary, o: &record::Outcome) -> String {
    json!({ "tasks": s.tasks, "totals": totals(o) }).to_string()
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
    out
}
