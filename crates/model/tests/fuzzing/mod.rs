//! The fuzzing harness shared by `tests/fuzz.rs` (a short run in the suite)
//! and `benches/fuzz.rs` (the long run, `bench/fuzz --inputs N`).
//!
//! Inputs come from two generators: arbitrary bytes (biased towards the
//! language's own words, so that some get past the first token), and
//! mutations of the hand-written corpus (`scenarios/*.hlw`,
//! `workloads/*.hlw`): lines deleted, duplicated, swapped, tokens flipped,
//! numbers changed to 0, huge or negative values, text truncated. A few
//! inputs are compressed (`.zst`, `.gz`) and truncated, and read from a file
//! as `hugelab run` reads one.
//!
//! Each input goes through the streaming parser and its checker, the
//! whole-workload checker ([`check`]), the printer (what parses prints to
//! text that parses back to the same statements), the lookahead scan, and,
//! when it parses, a run on a small model machine: bounded to [`MAX_STMTS`]
//! statements, [`MAX_SLEEP`] of simulated time, mappings of [`MAX_REGION`]
//! and [`MODEL_MEMORY`] of simulated memory. Every failure must be
//! an error naming the file, and a line and column when it is about a line;
//! a panic anywhere is a failure of the harness, with the input that caused
//! it.

use hugelab_model::Model;
use hugelab_workload::check::check;
use hugelab_workload::{parse, run, stmt, Lookahead, ParseError, Statements, StmtKind, Workload};
use std::io::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Statements of a parsed input the model runs at most (the rest are dropped).
pub const MAX_STMTS: usize = 64;
/// The simulated memory of the model machine an input runs on.
pub const MODEL_MEMORY: u64 = 64 << 20;
/// Time the model's run of an input may sleep in all (see [`exercise`]).
pub const MAX_SLEEP: Duration = Duration::from_secs(60);
/// The largest mapping the model's run of an input makes (see [`exercise`]).
pub const MAX_REGION: u64 = 1 << 30;
/// An input slower than this is reported (a loop that does not end is a bug
/// as much as a panic).
pub const SLOW: Duration = Duration::from_secs(2);
/// An input still running after this is a hang: the watchdog prints it and
/// ends the process (a loop that does not end cannot be caught otherwise).
pub const HANG: Duration = Duration::from_secs(30);
/// The name every input is parsed as; every error must start with it.
const FILE: &str = "fuzz.hlw";

/// A small, fast, seeded generator (SplitMix64): the same seed, the same inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The corpus: every `.hlw` of `scenarios/` and `workloads/`, as text.
pub struct Corpus {
    pub files: Vec<String>,
    /// Every whitespace-separated word of the corpus, for token flips and
    /// for biased bytes.
    words: Vec<String>,
}

/// The repository's root, from this crate's manifest directory.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Corpus {
    pub fn load() -> Corpus {
        let mut files = Vec::new();
        for dir in ["scenarios", "workloads"] {
            let mut paths: Vec<_> = std::fs::read_dir(root().join(dir))
                .unwrap_or_else(|e| panic!("{dir}: {e}"))
                .map(|e| e.expect("a directory entry").path())
                .filter(|p| p.extension().is_some_and(|x| x == "hlw"))
                .collect();
            paths.sort();
            for p in paths {
                files.push(std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p:?}: {e}")));
            }
        }
        let mut words: Vec<String> = files
            .iter()
            .flat_map(|f| f.split_whitespace().map(str::to_string))
            .collect();
        words.sort();
        words.dedup();
        assert!(files.len() > 100, "the corpus is {} files", files.len());
        Corpus { files, words }
    }
}

/// Numbers a mutation puts in place of one: zero, the edges of the integer
/// types, beyond them, negative.
const NUMBERS: [&str; 12] = [
    "0",
    "-1",
    "1",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999",
    "-9223372036854775808",
    "1e9",
];
/// Suffixes a mutated number may take.
const SUFFIXES: [&str; 8] = ["", "K", "M", "G", "T", "P", "E", "kB"];
/// Bytes arbitrary inputs are made of, beyond the corpus's words.
const SPECIAL: [&str; 12] = [
    " ", "\n", "\t", "\r", "#", "+", ":", "=", "\"", "\0", "\u{feff}", "é",
];

/// Arbitrary bytes: uniform ones, or a random string of corpus words,
/// special characters and numbers.
pub fn arbitrary(rng: &mut Rng, corpus: &Corpus) -> Vec<u8> {
    let len = rng.below(256);
    if rng.below(4) == 0 {
        return (0..len).map(|_| rng.next() as u8).collect();
    }
    let mut out = Vec::new();
    for _ in 0..len / 4 {
        match rng.below(8) {
            0..=3 => out.extend_from_slice(rng.pick(&corpus.words).as_bytes()),
            4 => out.extend_from_slice(rng.pick(&NUMBERS).as_bytes()),
            5 => out.push(rng.next() as u8),
            _ => out.extend_from_slice(rng.pick(&SPECIAL).as_bytes()),
        }
        out.push(if rng.below(5) == 0 { b'\n' } else { b' ' });
    }
    out
}

/// A corpus file with one to four mutations.
pub fn mutated(rng: &mut Rng, corpus: &Corpus) -> Vec<u8> {
    let text = rng.pick(&corpus.files);
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for _ in 0..1 + rng.below(4) {
        mutate(rng, corpus, &mut lines);
    }
    let mut out = lines.join("\n").into_bytes();
    if rng.below(2) == 0 {
        out.push(b'\n');
    }
    if rng.below(8) == 0 && !out.is_empty() {
        let at = rng.below(out.len());
        out.truncate(at);
    }
    out
}

fn mutate(rng: &mut Rng, corpus: &Corpus, lines: &mut Vec<String>) {
    if lines.is_empty() {
        lines.push(rng.pick(&corpus.words).clone());
        return;
    }
    let i = rng.below(lines.len());
    match rng.below(8) {
        0 => {
            lines.remove(i);
        }
        1 => {
            let l = lines[i].clone();
            lines.insert(rng.below(lines.len() + 1), l);
        }
        2 => {
            let j = rng.below(lines.len());
            lines.swap(i, j);
        }
        3 => {
            // A line of another file.
            let other = rng.pick(&corpus.files);
            let others: Vec<&str> = other.lines().collect();
            if !others.is_empty() {
                lines.insert(i, rng.pick(&others).to_string());
            }
        }
        4 | 5 => lines[i] = with_number(rng, &lines[i]),
        6 => lines[i] = with_word(rng, corpus, &lines[i]),
        _ => {
            // A byte changed, inserted or removed.
            let mut b = std::mem::take(&mut lines[i]).into_bytes();
            let at = rng.below(b.len() + 1);
            match rng.below(3) {
                0 if at < b.len() => b[at] = rng.next() as u8,
                1 if at < b.len() => {
                    b.remove(at);
                }
                _ => b.insert(at, rng.next() as u8),
            }
            lines[i] = String::from_utf8_lossy(&b).into_owned();
        }
    }
}

/// The line with one of its numbers (a run of digits) replaced.
fn with_number(rng: &mut Rng, line: &str) -> String {
    let b = line.as_bytes();
    let starts: Vec<usize> = (0..b.len())
        .filter(|&i| b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_digit()))
        .collect();
    if starts.is_empty() {
        return line.to_string();
    }
    let s = *rng.pick(&starts);
    let mut e = s;
    while e < b.len() && b[e].is_ascii_digit() {
        e += 1;
    }
    // Keep the unit that follows, or put another.
    let unit = if rng.below(2) == 0 {
        ""
    } else {
        while e < b.len() && b[e].is_ascii_alphabetic() {
            e += 1;
        }
        rng.pick(&SUFFIXES)
    };
    format!("{}{}{unit}{}", &line[..s], rng.pick(&NUMBERS), &line[e..])
}

/// The line with one of its words replaced by a corpus word, or removed.
fn with_word(rng: &mut Rng, corpus: &Corpus, line: &str) -> String {
    let mut words: Vec<&str> = line.split(' ').collect();
    let i = rng.below(words.len());
    if rng.below(4) == 0 {
        words.remove(i);
    } else {
        words[i] = rng.pick(&corpus.words).as_str();
    }
    words.join(" ")
}

/// What a run of the harness saw.
#[derive(Default, Debug)]
pub struct Tally {
    pub inputs: u64,
    /// Inputs that parsed and checked.
    pub parsed: u64,
    /// Inputs the model ran to their end (or to `MAX_STMTS`) without an error.
    pub ran: u64,
    /// Inputs that are a compressed file, possibly truncated.
    pub compressed: u64,
    /// Panics, malformed errors, slow inputs: the first [`KEEP`] with their input.
    pub failures: Vec<String>,
    /// How many failures there were in all.
    pub failed: u64,
}

/// Failures kept with their input (the rest are counted).
const KEEP: usize = 20;

impl Tally {
    fn fail(&mut self, what: String) {
        self.failed += 1;
        if self.failures.len() < KEEP {
            self.failures.push(what);
        }
    }
}

/// Captures panic messages instead of printing them, so a failure is reported
/// once, with its input.
pub fn quiet_panics() -> Arc<Mutex<String>> {
    let last = Arc::new(Mutex::new(String::new()));
    let keep = last.clone();
    panic::set_hook(Box::new(move |info| {
        *keep.lock().unwrap() = info.to_string();
    }));
    last
}

/// Runs one input through everything; a failure (a panic, an error without
/// its place, a slow input) is added to the tally with the input.
pub fn one(input: &[u8], tally: &mut Tally, last_panic: &Mutex<String>, watch: &Watch) {
    tally.inputs += 1;
    let t = Instant::now();
    watch.start(input, t);
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| exercise(input, tally)));
    let problem = match outcome {
        Ok(Ok(())) if t.elapsed() > SLOW => Some(format!("took {:?}", t.elapsed())),
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(format!("panic: {}", last_panic.lock().unwrap())),
    };
    if let Some(p) = problem {
        tally.fail(format!(
            "{p}\n--- input ({} bytes) ---\n{}\n---",
            input.len(),
            String::from_utf8_lossy(input)
        ));
    }
}

/// An error must name the file, and a line and column when it has a line.
fn well_formed(e: &ParseError) -> Result<(), String> {
    let text = e.to_string();
    let place = format!("{FILE}:{}:{}:", e.line, e.col);
    if e.file != FILE || (e.line > 0 && (e.col == 0 || !text.starts_with(&place))) {
        return Err(format!("error without its place: {text:?}"));
    }
    if e.message.trim().is_empty() {
        return Err(format!("error without a message: {text:?}"));
    }
    Ok(())
}

fn exercise(input: &[u8], tally: &mut Tally) -> Result<(), String> {
    Lookahead::scan(FILE, input).map_err(|e| format!("lookahead failed on bytes: {e}"))?;
    let streamed: Result<Vec<_>, _> = Statements::new(FILE, input).collect();
    let stmts = match streamed {
        Ok(s) => s,
        Err(e) => return well_formed(&e),
    };
    let w = Workload {
        file: FILE.to_string(),
        stmts,
    };
    check(&w).map_err(|e| format!("parsed but the checker refuses it: {e}"))?;
    let printed = w.to_string();
    match parse(FILE, &printed) {
        Ok(back)
            if back
                .stmts
                .iter()
                .map(|s| &s.kind)
                .eq(w.stmts.iter().map(|s| &s.kind)) => {}
        Ok(_) => return Err(format!("prints to other statements:\n{printed}")),
        Err(e) => {
            return Err(format!(
                "prints to text that does not parse ({e}):\n{printed}"
            ))
        }
    }
    tally.parsed += 1;
    // The model's `sleep` makes every khugepaged pass due in it, and its
    // `khugepaged` walks every PMD slot of every VMA, so their cost grows
    // with the time slept and the size mapped: the run stops before the
    // sleep that would take it past MAX_SLEEP and the mapping larger than
    // MAX_REGION.
    let mut slept = 0u64;
    let bounded = Workload {
        file: w.file,
        stmts: (w.stmts.into_iter().take(MAX_STMTS))
            .take_while(|s| match &s.kind {
                StmtKind::Sleep(stmt::Sleep { ns }) => {
                    slept = slept.saturating_add(*ns);
                    slept <= MAX_SLEEP.as_nanos() as u64
                }
                StmtKind::Mmap(stmt::Mmap { size, .. }) => size.bytes() <= MAX_REGION,
                StmtKind::Mremap(stmt::Mremap { new_size, .. }) => new_size.bytes() <= MAX_REGION,
                _ => true,
            })
            .collect(),
    };
    if run(&mut Model::new(MODEL_MEMORY), &bounded).is_ok() {
        tally.ran += 1;
    }
    Ok(())
}

/// A corpus file compressed (zstd or gzip) and maybe truncated or with a
/// byte flipped, read from a file the way `hugelab run` reads one: an error
/// must name the file.
pub fn compressed(
    rng: &mut Rng,
    corpus: &Corpus,
    dir: &Path,
    tally: &mut Tally,
    (last, watch): (&Mutex<String>, &Watch),
) {
    let text = rng.pick(&corpus.files);
    let (ext, mut bytes) = if rng.below(2) == 0 {
        (
            "zst",
            zstd::encode_all(text.as_bytes(), 3).expect("zstd compresses"),
        )
    } else {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(text.as_bytes()).expect("gzip compresses");
        ("gz", gz.finish().expect("gzip compresses"))
    };
    match rng.below(3) {
        0 => bytes.truncate(rng.below(bytes.len() + 1)),
        1 => {
            let at = rng.below(bytes.len());
            bytes[at] ^= 1 << rng.below(8);
        }
        _ => {}
    }
    let path = dir.join(format!("fuzz.hlw.{ext}"));
    std::fs::write(&path, &bytes).expect("the fuzz directory is writable");
    tally.inputs += 1;
    tally.compressed += 1;
    watch.start(&bytes, Instant::now());
    let name = path.display().to_string();
    let outcome = panic::catch_unwind(|| hugelab_workload::parse_file(&path));
    let problem = match outcome {
        Ok(Ok(_)) => None,
        Ok(Err(e)) if e.file == name && !e.message.trim().is_empty() => None,
        Ok(Err(e)) => Some(format!("error without its file: {e}")),
        Err(_) => Some(format!("panic: {}", last.lock().unwrap())),
    };
    if let Some(p) = problem {
        tally.fail(format!("{p}\n--- a .{ext} of {} bytes ---", bytes.len()));
    }
}

/// The input running now and since when, for the watchdog.
#[derive(Clone)]
pub struct Watch(Arc<Mutex<(Instant, Vec<u8>)>>);

impl Watch {
    /// A watchdog thread that ends the process when one input runs past [`HANG`].
    fn new() -> Watch {
        let watch = Watch(Arc::new(Mutex::new((Instant::now(), Vec::new()))));
        let seen = watch.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            let now = seen.0.lock().unwrap();
            if now.0.elapsed() > HANG {
                eprintln!(
                    "FAILURE: an input ran for more than {HANG:?}:\n--- input ---\n{}\n---",
                    String::from_utf8_lossy(&now.1)
                );
                std::process::exit(1);
            }
        });
        watch
    }

    fn start(&self, input: &[u8], t: Instant) {
        let mut now = self.0.lock().unwrap();
        now.0 = t;
        now.1.clear();
        now.1.extend_from_slice(input);
    }
}

/// Peak resident set of this process (VmHWM), in kB.
pub fn max_rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmHWM:"));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Runs `inputs` inputs from `seed`: a third arbitrary bytes, the rest
/// mutations, and one in `compressed_every` a compressed file in `dir`.
pub fn campaign(seed: u64, inputs: u64, compressed_every: u64, dir: &Path) -> Tally {
    let corpus = Corpus::load();
    let last = quiet_panics();
    let watch = Watch::new();
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    while tally.inputs < inputs {
        if tally.inputs % compressed_every == compressed_every - 1 {
            compressed(&mut rng, &corpus, dir, &mut tally, (&last, &watch));
            continue;
        }
        let input = if rng.below(3) == 0 {
            arbitrary(&mut rng, &corpus)
        } else {
            mutated(&mut rng, &corpus)
        };
        one(&input, &mut tally, &last, &watch);
    }
    let _ = panic::take_hook();
    tally
}
