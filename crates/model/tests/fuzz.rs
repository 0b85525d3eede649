//! The parser, its checkers, the printer and the model take generated input
//! without a panic (see `fuzzing/mod.rs`): a short run here, a long one in
//! `bench/fuzz`. `HUGELAB_FUZZ_INPUTS` and `HUGELAB_FUZZ_SEED` change the
//! run (default 5,000 inputs from a fixed seed, so CI is deterministic).

mod fuzzing;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn generated_inputs_never_panic() {
    let inputs = env_u64("HUGELAB_FUZZ_INPUTS", 5_000);
    let seed = env_u64("HUGELAB_FUZZ_SEED", 0x6675_7a7a);
    let dir = std::env::temp_dir().join(format!("hugelab-fuzz-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tally = fuzzing::campaign(seed, inputs, 50, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
    println!(
        "seed {seed:#x}: {} inputs, {} parsed, {} ran on the model, {} compressed; max RSS {} MB",
        tally.inputs,
        tally.parsed,
        tally.ran,
        tally.compressed,
        fuzzing::max_rss_kb() / 1024
    );
    assert!(
        tally.failures.is_empty(),
        "{} failures (seed {seed:#x}); the first:\n{}",
        tally.failed,
        tally.failures[0]
    );
    // The generators reach past the parser: a run that parses nothing tests
    // only its first token.
    assert!(
        tally.parsed * 20 > tally.inputs,
        "only {} of {} inputs parsed",
        tally.parsed,
        tally.inputs
    );
    assert!(tally.ran > 0);
}
