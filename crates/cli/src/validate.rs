//! `hugelab validate FILE --setting ... -- CMD ARGS`: `predict` of a
//! recording and `bench` of the program it recorded, under the same
//! settings, printed side by side with the error per figure
//! (validate_rows.rs), and how much faster the prediction was than the
//! measurement.
//!
//! Predict runs first: a setting the model does not know, a recording of
//! another kernel or a broken file stops before anything on the machine
//! changes. Then bench runs under its settings guard (every tunable
//! journaled and restored, a cgroup per run), as `hugelab bench` does.

use crate::bench::{self, BenchArgs};
use crate::bench_record::BenchResult;
use crate::predict::{self, Predicted};
use crate::predict_report;
use crate::validate_rows::{self, Row};
use anyhow::Result;
use clap::Args;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args)]
pub struct ValidateArgs {
    /// A setting: NAME:TUNABLE=VALUE,... and `memory.max=SIZE`, as
    /// `predict` and `bench` take it (repeat; the first is the baseline).
    /// Default: the multi-size THP series' configurations.
    #[arg(long = "setting", value_name = "NAME:TUNABLE=VALUE,...")]
    settings: Vec<String>,
    /// Measured runs of the command per setting.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Warm-up runs per setting, before the measured ones (not compared).
    #[arg(long, default_value_t = 1)]
    warmup: u32,
    /// How many settings predict runs at once. Default: the number of CPUs.
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// Predict in N address layouts (as `predict --layouts`): the predicted
    /// figure is then their mean, with their range beside it.
    #[arg(long, value_name = "N", default_value_t = 1)]
    layouts: usize,
    /// Print JSON: every row, the timings, the predictions and every run.
    #[arg(long)]
    json: bool,
    /// Predict, and print what the bench would change and run; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Run the command as this user (default: the user who ran sudo; root
    /// when hugelab was not started with sudo), as `bench` does.
    #[arg(long, value_name = "NAME", conflicts_with = "as_root")]
    user: Option<String>,
    /// Run the command as root even under sudo.
    #[arg(long)]
    as_root: bool,
    /// The recording of the command (`hugelab record`).
    file: PathBuf,
    /// The command the recording is of, and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// How long each side took.
struct Timings {
    predict_s: f64,
    bench_s: f64,
    /// One measured run of each setting: the means of the runs' wall times
    /// added up, what a bench of the settings once each costs.
    once_each_s: f64,
}

pub fn main(args: ValidateArgs) -> Result<ExitCode> {
    let specs = predict::settings_or_series(&args.settings);
    let start = Instant::now();
    let predicted = predict::predict(&args.file, &specs, args.jobs, false, args.layouts)?;
    let predict_s = start.elapsed().as_secs_f64();
    let bench_args = BenchArgs::of(
        specs,
        args.runs,
        args.warmup,
        args.dry_run,
        args.json,
        args.command.clone(),
    )
    .run_as(args.user.clone(), args.as_root);
    let start = Instant::now();
    let Some(measured) = bench::measure(&bench_args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let timings = Timings {
        predict_s,
        bench_s: start.elapsed().as_secs_f64(),
        once_each_s: once_each(&measured),
    };
    let rows = validate_rows::rows(&predicted.predictions, &measured);
    if args.json {
        let doc = to_json(&args, &predicted, &measured, &rows, &timings);
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", render(&args, &predicted, &measured, &rows, &timings));
    }
    Ok(ExitCode::SUCCESS)
}

/// The mean wall time of each setting's measured runs, added up.
fn once_each(bench: &BenchResult) -> f64 {
    bench
        .samples("real-time")
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(_, v)| v.iter().sum::<f64>() / v.len() as f64)
        .sum()
}

fn render(
    args: &ValidateArgs,
    p: &Predicted,
    measured: &BenchResult,
    rows: &[Row],
    t: &Timings,
) -> String {
    let met = rows.iter().filter(|r| r.within_goal == Some(true)).count();
    let compared = rows.iter().filter(|r| r.within_goal.is_some()).count();
    let mut out = format!(
        "{} predicted against `{}` measured as {} ({} runs per setting after {} warm-up): \
         {met} of {compared} figures within the goal (±{:.0} % of the mean, or inside min-max)\n\n",
        args.file.display(),
        args.command.join(" "),
        measured.run_as,
        args.runs,
        args.warmup,
        validate_rows::GOAL_FRACTION * 100.0
    );
    out.push_str(&validate_rows::render(rows));
    out.push_str(&format!(
        "\npredict: {:.2} s for {} settings ({} at once); bench: {:.1} s, of which one run of each \
         setting {:.1} s: predict {:.0}x faster than that\n",
        t.predict_s,
        p.predictions.len(),
        p.jobs,
        t.bench_s,
        t.once_each_s,
        t.once_each_s / t.predict_s.max(1e-9)
    ));
    for note in &p.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

fn to_json(
    args: &ValidateArgs,
    p: &Predicted,
    bench: &BenchResult,
    rows: &[Row],
    t: &Timings,
) -> serde_json::Value {
    let file = args.file.display().to_string();
    json!({
        "file": file,
        "command": args.command,
        "runs": args.runs,
        "warmup": args.warmup,
        "goal_fraction": validate_rows::GOAL_FRACTION,
        "rows": rows,
        "predict_s": t.predict_s,
        "predict_jobs": p.jobs,
        "bench_s": t.bench_s,
        "bench_once_each_s": t.once_each_s,
        "speedup_once_each": t.once_each_s / t.predict_s.max(1e-9),
        "predict": predict_report::to_json(&file, p.header.as_ref(), &p.predictions, &p.notes),
        "bench": bench,
    })
}
