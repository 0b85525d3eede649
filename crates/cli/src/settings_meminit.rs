//! `hugelab settings init-memory`: make the kernel finish the memory it
//! initialises lazily, so /proc/kpageflags can tell the folios placed there
//! (`hugelab_kernel::meminit` says why and how).

use anyhow::Result;
use clap::Args;
use hugelab_kernel::meminit::{self, Uninitialised};
use std::process::ExitCode;

#[derive(Args)]
pub struct InitMemoryArgs {
    /// Leave at least this much MemAvailable, MiB
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    pub reserve: u64,
    /// Say what is uninitialised and what would be touched; touch nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Print it as JSON
    #[arg(long)]
    pub json: bool,
}

pub fn main(args: &InitMemoryArgs) -> Result<ExitCode> {
    hugelab_kernel::guard::require_root(
        "hugelab settings init-memory needs root: it reads /proc/kpageflags",
    )?;
    let reserve = args.reserve << 20;
    if args.dry_run {
        let u = meminit::uninitialised()?;
        let (available, _) = hugelab_kernel::hugetlb::mem_available()?;
        let at_most = available.saturating_sub(reserve);
        if args.json {
            let doc = serde_json::json!({
                "dry_run": true,
                "uninitialised": u,
                "mem_available_bytes": available,
                "reserve_bytes": reserve,
                "would_touch_at_most_bytes": if u.blocks.is_empty() { 0 } else { at_most },
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        } else {
            println!("{}", describe(&u));
            if !u.blocks.is_empty() {
                println!(
                    "would touch free memory, 128 MiB at a time, up to {} MiB (MemAvailable {} MiB less the reserve of {} MiB), stopping once no block is left uninitialised; nothing changed",
                    at_most >> 20,
                    available >> 20,
                    args.reserve
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let done = meminit::initialise(reserve)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&done)?);
    } else {
        println!("before: {}", describe(&done.before));
        if !done.before.blocks.is_empty() {
            println!(
                "touched {} MiB in {:.1} s, then freed it",
                done.touched_bytes >> 20,
                done.seconds
            );
            println!("after: {}", describe(&done.after));
        }
        if let Some(why) = &done.stopped {
            println!("stopped early: {why}");
        }
    }
    Ok(if done.after.blocks.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One sentence on the uninitialised blocks.
pub fn describe(u: &Uninitialised) -> String {
    if u.blocks.is_empty() {
        return "every online memory block is initialised (each has pages /proc/kpageflags reads flags for)".into();
    }
    format!(
        "{} MiB not yet initialised by the kernel, in {} memory blocks of {} MiB ({}): /proc/kpageflags reads 0 for their pages",
        u.bytes() >> 20,
        u.blocks.len(),
        u.block_bytes >> 20,
        ranges(&u.blocks)
    )
}

/// `memory150-199, memory203`.
fn ranges(blocks: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        let mut j = i;
        while j + 1 < blocks.len() && blocks[j + 1] == blocks[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            format!("memory{}", blocks[i])
        } else {
            format!("memory{}-{}", blocks[i], blocks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::ranges;

    #[test]
    fn runs_of_blocks_print_as_ranges() {
        assert_eq!(
            ranges(&[150, 151, 152, 160, 170, 171]),
            "memory150-152, memory160, memory170-171"
        );
        assert_eq!(ranges(&[]), "");
    }
}
