//! Streamed workloads: statements run as they are read, and an error stops
//! the run where it is (after the statements before it ran, before its own).
//! Memory: stream_memory.rs.

mod common;

use common::Recorder;
use hugelab_workload::*;
use std::io::{self, BufRead, Read};

/// Text handed out one line per read, that fails the test if a line past
/// `last` is ever read: what a run has not reached, it has not read.
struct Lines {
    lines: Vec<String>,
    next: usize,
    pos: usize,
    last: usize,
}

impl Read for Lines {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        common::read_from_buf(self, buf)
    }
}

impl BufRead for Lines {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.next >= self.lines.len() {
            return Ok(&[]);
        }
        assert!(
            self.next < self.last,
            "line {} was read before the run reached it",
            self.next + 1
        );
        Ok(&self.lines[self.next].as_bytes()[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
        if self.next < self.lines.len() && self.pos >= self.lines[self.next].len() {
            self.next += 1;
            self.pos = 0;
        }
    }
}

#[test]
fn a_bad_statement_stops_the_run_after_those_before_it_ran() {
    // Line 6 writes a region that line 5 unmapped: a checker error.
    let text =
        "spawn a\na mmap r 64K\na write r\n# a comment\na munmap r\na write r\nspawn b\nspawn c\n";
    let lines: Vec<String> = text.lines().map(|l| format!("{l}\n")).collect();
    let reader = Lines {
        lines,
        next: 0,
        pos: 0,
        last: 6, // lines 7 and 8 must never be read
    };
    let mut backend = Recorder {
        keep: true,
        ..Recorder::default()
    };
    let stmts = Statements::new("w.hlw", reader);
    let err = run_stream(&mut backend, "w.hlw", &Lookahead::default(), stmts).unwrap_err();
    assert_eq!(
        backend.executed,
        [1, 2, 3, 5],
        "lines 1 to 5 ran, and no other"
    );
    assert_eq!(
        err.to_string(),
        "w.hlw:6:9: unknown region 'r' of process 'a' (it was fully unmapped at line 5); it has no regions"
    );
    assert!(matches!(err, RunError::Parse(_)));
}

#[test]
fn a_stream_ends_at_its_first_error() {
    let mut s = Statements::new("w.hlw", "spawn a\nspawn a\nspawn b\n".as_bytes());
    assert!(s.next().unwrap().is_ok());
    let e = s.next().unwrap().unwrap_err();
    assert_eq!((e.line, e.col), (2, 7));
    assert!(s.next().is_none(), "nothing after the error");
}

#[test]
fn long_lines_and_bad_bytes_are_errors_at_their_line() {
    let long = format!("spawn a\n{}\n", "x".repeat(2 << 20));
    // Through a small buffer, as from a file: the line is not read whole.
    let reader = io::BufReader::with_capacity(4096, long.as_bytes());
    let e = Statements::new("w.hlw", reader)
        .find_map(Result::err)
        .unwrap();
    assert_eq!((e.line, e.col), (2, 1));
    assert!(e.message.contains("line longer than"), "{e}");
    // Bytes that are not UTF-8, split across reads.
    let bad = b"spawn a\nspawn \xc3b\xff\n";
    let reader = io::BufReader::with_capacity(9, &bad[..]);
    let e = Statements::new("w.hlw", reader)
        .find_map(Result::err)
        .unwrap();
    assert_eq!((e.line, e.col, e.message.as_str()), (2, 7, "invalid UTF-8"));
    // A last line without a newline, with \r\n before it.
    let reader = io::BufReader::with_capacity(5, &b"spawn a\r\na exit"[..]);
    let stmts: Vec<Stmt> = Statements::new("w.hlw", reader)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(stmts.len(), 2);
    assert_eq!(stmts[1].pos, Pos { line: 2, col: 1 });
}

#[test]
fn lookahead_finds_reclaim_without_parsing() {
    let ahead = |t: &str| Lookahead::scan("w.hlw", t.as_bytes()).unwrap();
    assert!(!ahead("spawn a\n# reclaim\na write r # reclaim\n").reclaims);
    assert!(ahead("spawn a\n  reclaim   # now\n").reclaims);
    assert!(ahead("\treclaim").reclaims);
    assert!(!ahead("reclaimer exit\n").reclaims);
}
