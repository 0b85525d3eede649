//! Streamed workloads: memory does not grow with the number of statements.
//! Its own test binary, with one test: it counts every allocation.

mod common;

use common::Recorder;
use hugelab_workload::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{self, BufRead, Read};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes this test binary has allocated and not freed, and the
/// most it ever had.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `n` statements of a recorded program's kind, made as they are read: the
/// text never exists in memory as a whole.
struct Generated {
    n: u64,
    i: u64,
    line: Vec<u8>,
    pos: usize,
}

impl Generated {
    fn new(n: u64) -> Generated {
        Generated {
            n,
            i: 0,
            line: b"spawn a\na mmap r 1G\n".to_vec(),
            pos: 0,
        }
    }
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        common::read_from_buf(self, buf)
    }
}

impl BufRead for Generated {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos == self.line.len() && self.i < self.n {
            self.line.clear();
            let off = self.i * 7919 % 262_143;
            self.line.extend_from_slice(
                match self.i % 100 {
                    0 => b"expect vmstat.pgfault >= 0\n".to_vec(),
                    1 => format!("a madvise r+{}K:64K HUGEPAGE\n", off / 16 * 64).into_bytes(),
                    _ => format!("a write r+{}K:4K\n", off * 4).into_bytes(),
                }
                .as_slice(),
            );
            self.pos = 0;
            self.i += 1;
        }
        Ok(&self.line[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
    }
}

/// The most memory a streamed run of `n` generated statements held.
fn peak_of_run(n: u64) -> usize {
    let mut backend = Recorder::default();
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let stmts = Statements::new("gen.hlw", Generated::new(n));
    let obs = run_stream(&mut backend, "gen.hlw", &Lookahead::default(), stmts).unwrap();
    assert_eq!(backend.count, n - n.div_ceil(100) + 2);
    let peak = PEAK.load(Ordering::Relaxed) - before;
    drop(obs);
    peak
}

#[test]
fn memory_does_not_grow_with_the_statements_of_a_stream() {
    // Expectation outcomes are output, kept like snapshots: 1 in 100 here.
    let small = peak_of_run(2_000);
    let large = peak_of_run(200_000);
    let outcomes = (200_000 - 2_000) / 100 * std::mem::size_of::<ExpectOutcome>() * 2;
    assert!(
        large < small + outcomes + (64 << 10),
        "200,000 statements took {large} bytes at most, 2,000 took {small}"
    );
}
