//! `hugelab`: model, measure and tune Linux huge pages.
//!
//! The CLI is the only crate that knows the backends; it parses arguments,
//! runs workloads through `hugelab_workload::run` and prints what comes back.

mod compare;
mod run;
mod table;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "hugelab",
    version,
    about = "Model, measure and tune Linux huge pages"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run workloads and print their counters at each snapshot; checks `expect` lines.
    Run(run::RunArgs),
    /// Run one workload under several settings and compare the counters.
    Compare(compare::CompareArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::main(args),
        Command::Compare(args) => compare::main(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("hugelab: {err:#}");
            ExitCode::from(2)
        }
    }
}
