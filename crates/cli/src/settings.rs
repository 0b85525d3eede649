//! `hugelab settings show|restore|init-memory`: the tunables hugelab knows and what else
//! on the machine acts on huge pages (DAMON, khugepaged, limited memory
//! cgroups: [`crate::settings_activity`]), and the replay of a restore
//! journal left by a run that was killed (SIGKILL, power).

use anyhow::Result;
use clap::{Args, Subcommand};
use hugelab_kernel::{guard, host_activity, sysfs};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum SettingsCommand {
    /// Print the current value of every tunable the model knows (sysfs
    /// names), then what else on the machine acts on huge pages: DAMON's
    /// kdamonds and schemes, DAMON_RECLAIM/DAMON_LRU_SORT, khugepaged since
    /// boot, memory cgroups with a limit, memory the kernel has not yet
    /// initialised.
    Show(ShowArgs),
    /// Put back the tunables a killed kernel-backend run left changed (and
    /// remove the memory cgroups it left).
    Restore,
    /// Make the kernel finish initialising the memory it initialises lazily
    /// (deferred struct-page init; /proc/kpageflags reads 0 for its pages
    /// until then): touch free memory until no memory block is left
    /// uninitialised or MemAvailable reaches the reserve, then free it.
    /// Evicts clean page cache on the way; cannot be (and needs no) undoing.
    InitMemory(crate::settings_meminit::InitMemoryArgs),
}

#[derive(Args)]
pub struct ShowArgs {
    /// Print it as JSON: {tunables: [{tunable, file, value}], activity}.
    #[arg(long)]
    json: bool,
}

pub fn main(cmd: SettingsCommand) -> Result<ExitCode> {
    match cmd {
        SettingsCommand::Show(args) if args.json => {
            let list: Vec<serde_json::Value> = guard::show()?
                .into_iter()
                .map(|(tunable, value)| {
                    serde_json::json!({
                        "tunable": tunable.path(),
                        "file": sysfs::tunable_file(&tunable),
                        "value": value,
                    })
                })
                .collect();
            let all = serde_json::json!({
                "tunables": list,
                "activity": host_activity::read(),
            });
            println!("{}", serde_json::to_string_pretty(&all)?);
        }
        SettingsCommand::Show(_) => {
            for (tunable, value) in guard::show()? {
                println!("{tunable} {value}");
            }
            print!(
                "{}",
                crate::settings_activity::render(&host_activity::read())
            );
        }
        SettingsCommand::InitMemory(args) => return crate::settings_meminit::main(&args),
        SettingsCommand::Restore => {
            let restored = guard::restore_journal()?;
            if restored.is_empty() {
                println!(
                    "nothing to restore: no journal in {}",
                    guard::state_dir().display()
                );
            }
            for r in &restored {
                println!("{r}");
            }
            for dir in hugelab_kernel::memcg::remove_stale() {
                println!(
                    "removed the memory cgroup {} a killed run left",
                    dir.display()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
