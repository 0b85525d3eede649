//! The long fuzzing run (`bench/fuzz --inputs N [--seed S]`, or
//! `cargo bench -p hugelab-model --bench fuzz -- --inputs N`): generated
//! inputs through the parser, its checkers, the printer and the model (see
//! `tests/fuzzing/mod.rs`). Prints inputs per second, the total, the peak
//! resident set and every failure with its input; exits 1 on a failure.

#[path = "../tests/fuzzing/mod.rs"]
mod fuzzing;

use std::time::Instant;

/// The value after `--name`, or the default.
fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == name) else {
        return default;
    };
    let value = args.get(i + 1).map(|v| v.replace('_', ""));
    let parsed = value.as_deref().and_then(|v| match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    });
    parsed.unwrap_or_else(|| {
        eprintln!("fuzz: {name} needs a number");
        std::process::exit(2)
    })
}

fn main() {
    let inputs = arg("--inputs", 1_000_000);
    let seed = arg("--seed", 0x6675_7a7a);
    let dir = std::env::temp_dir().join(format!("hugelab-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let t = Instant::now();
    let tally = fuzzing::campaign(seed, inputs, 200, &dir);
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    for f in &tally.failures {
        println!("FAILURE: {f}");
    }
    println!(
        "fuzz: seed {seed:#x}: {} inputs in {secs:.1} s: {:.0} inputs/s; {} parsed, {} ran on the model, {} compressed; max RSS {} MB; {} failures",
        tally.inputs,
        tally.inputs as f64 / secs,
        tally.parsed,
        tally.ran,
        tally.compressed,
        fuzzing::max_rss_kb() / 1024,
        tally.failed
    );
    if !tally.failures.is_empty() {
        std::process::exit(1);
    }
}
