//! `hugelab explain FILE.hlw[:LINE]`: why each fault of a statement got
//! the folio size it got. The workload runs on the model with its
//! tracepoints on (hugelab_model::trace); each statement's faults are
//! grouped by their chain of decisions, each decision named after the
//! kernel function that takes it, and printed as a table (or `--json`).

use anyhow::{bail, Context, Result};
use clap::Args;
use hugelab_model::trace::{group, FaultGroup, Step};
use hugelab_model::Model;
use hugelab_workload::gone::Gone;
use hugelab_workload::{run_file, Backend, BackendError, Lookahead, Reading, Stmt};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ExplainArgs {
    /// The workload, with the line of one statement (`FILE.hlw:12`) or
    /// without (every statement that faults).
    target: String,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// One statement's faults, grouped.
#[derive(Serialize)]
pub struct Explained {
    pub line: u32,
    pub statement: String,
    pub faults: u64,
    pub groups: Vec<Group>,
}

#[derive(Serialize)]
pub struct Group {
    pub faults: u64,
    pub write: bool,
    /// The first and last faulting address, as `region+offset`.
    pub first: String,
    pub last: String,
    pub steps: Vec<Step>,
    /// The steps in words.
    pub chain: Vec<String>,
}

/// The model, recording the faults of the statements asked for.
struct Explaining {
    model: Model,
    line: Option<u32>,
    out: Vec<Explained>,
}

impl Explaining {
    fn explain(
        &mut self,
        stmt: &Stmt,
        run: impl FnOnce(&mut Model) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let wanted = self.line.is_none_or(|l| l == stmt.pos.line);
        if !wanted {
            return run(&mut self.model);
        }
        // The statement's process and regions as they are before it runs
        // (it may exit, or be killed, during it).
        let regions = stmt
            .kind
            .process()
            .and_then(|p| self.model.regions(p))
            .unwrap_or_default();
        self.model.machine.start_trace();
        let result = run(&mut self.model);
        let trace = self.model.machine.take_trace().unwrap_or_default();
        let at = |addr: u64| {
            regions
                .iter()
                .find(|(_, start, len)| addr >= *start && addr < start + len)
                .map_or(format!("{addr:#x}"), |(name, start, _)| {
                    format!("{name}+{}", hugelab_workload::Size(addr - start))
                })
        };
        let groups: Vec<Group> = group(&trace.faults)
            .into_iter()
            .map(|g: FaultGroup| Group {
                faults: g.faults,
                write: g.write,
                first: at(g.first),
                last: at(g.last),
                chain: g.steps.iter().map(Step::describe).collect(),
                steps: g.steps,
            })
            .collect();
        if !groups.is_empty() || self.line.is_some() {
            self.out.push(Explained {
                line: stmt.pos.line,
                statement: stmt.to_string(),
                faults: trace.faults.len() as u64,
                groups,
            });
        }
        result
    }
}

impl Backend for Explaining {
    fn name(&self) -> &str {
        self.model.name()
    }
    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        self.explain(stmt, |m| m.execute(stmt))
    }
    fn execute_retiring(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        self.explain(stmt, |m| m.execute_retiring(stmt, gone))
    }
    fn read(&mut self) -> Result<Reading, BackendError> {
        self.model.read()
    }
    fn read_counter(&mut self, name: &str) -> Option<Result<Reading, BackendError>> {
        self.model.read_counter(name)
    }
    fn prepare(&mut self, ahead: &Lookahead) -> Result<(), BackendError> {
        self.model.prepare(ahead)
    }
    fn needs_lookahead(&self) -> bool {
        self.model.needs_lookahead()
    }
}

/// `FILE:LINE` split, when FILE exists and LINE is a number.
fn target(arg: &str) -> Result<(PathBuf, Option<u32>)> {
    if let Some((file, line)) = arg.rsplit_once(':') {
        if let Ok(line) = line.parse::<u32>() {
            if std::path::Path::new(file).exists() {
                return Ok((file.into(), Some(line)));
            }
        }
    }
    if !std::path::Path::new(arg).exists() {
        bail!("{arg}: no such workload file");
    }
    Ok((arg.into(), None))
}

/// Runs the workload on the model and explains the statement(s).
pub fn explain(file: &std::path::Path, line: Option<u32>) -> Result<Vec<Explained>> {
    let mut e = Explaining {
        model: Model::default(),
        line,
        out: Vec::new(),
    };
    let stopped = run_file(&mut e, file).err();
    if let Some(err) = stopped {
        if e.out.is_empty() {
            return Err(err).with_context(|| format!("cannot run {}", file.display()));
        }
        // What ran is explained; the reason the run stopped follows it.
        eprintln!("{}: the run stopped: {err}", file.display());
    }
    if let Some(l) = line {
        if e.out.is_empty() {
            bail!("{}:{l}: no statement starts on this line", file.display());
        }
    }
    Ok(e.out)
}

/// The table people read.
pub fn render(file: &str, explained: &[Explained]) -> String {
    let mut s = String::new();
    if explained.is_empty() {
        s.push_str(&format!("{file}: no statement faults\n"));
    }
    for e in explained {
        s.push_str(&format!("{file}:{}  {}\n", e.line, e.statement));
        if e.groups.is_empty() {
            s.push_str("  no faults: every access found its page mapped\n\n");
            continue;
        }
        s.push_str(&format!("  {:>7}  {:<24}  decisions\n", "faults", "at"));
        for g in &e.groups {
            let at = if g.first == g.last {
                g.first.clone()
            } else {
                format!("{} .. {}", g.first, g.last)
            };
            let kind = if g.write { "write" } else { "read" };
            for (i, step) in g.chain.iter().enumerate() {
                if i == 0 {
                    s.push_str(&format!("  {:>7}  {:<24}  {kind}: {step}\n", g.faults, at));
                } else {
                    s.push_str(&format!("  {:>7}  {:<24}  {step}\n", "", ""));
                }
            }
        }
        s.push('\n');
    }
    s
}

pub fn main(args: ExplainArgs) -> Result<ExitCode> {
    let (file, line) = target(&args.target)?;
    let explained = explain(&file, line)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&explained)?);
    } else {
        print!("{}", render(&file.display().to_string(), &explained));
    }
    Ok(ExitCode::SUCCESS)
}
