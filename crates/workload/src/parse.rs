//! The `.hlw` parser: text → typed AST, with `file:line:col` errors.
//!
//! A stream ([`Statements`]): one line at a time from a reader, each
//! statement checked semantically (see [`crate::check`]) against those before
//! it as soon as it is parsed, and handed out before the next line is read.
//! So the error reported is always the first one in file order, syntax or
//! semantics alike, and the stream ends there; a run that executes the
//! statements as they come (`crate::run_stream`) has executed every statement
//! before it, and none after. Memory does not grow with the file: the line
//! buffer and token list are reused, and only what the checker tracks (names
//! that exist, snapshot labels) is kept. [`parse`] and [`parse_file`] collect
//! the whole stream into a [`Workload`].
//!
//! Nothing here panics on any input: every conversion that could fail on user
//! text returns an error instead. Which tunables `set` accepts, and with which
//! values, is [`crate::tunables`]'s business.
//!
//! This module is the stream and two thin tables, from a line's first word to
//! its statement's `parse` (each statement's grammar is in its own file under
//! [`crate::stmt`]; see there how the tables are kept in step).

use crate::check;
use crate::checker::{Checker, Issue, Part};
use crate::line::{recycle, tokenize, Line, Tok};
pub use crate::source::{open, open_bytes, Bytes, Source};
use crate::stmt::{self, *};
pub use crate::text::ParseError;
use crate::text::{quote, valid_name};
pub use crate::units::SizeError;
use crate::Pos;
use std::io::{BufRead, Read as _};
use std::path::Path;

/// The top-level statement keywords, in the order error messages list them.
const KEYWORDS: &str =
    "set, machine, cgroup, spawn, split, khugepaged, reclaim, fragment, sleep, snapshot, expect";
/// The verbs of `<proc> <verb> ...` statements, in the order error messages list them.
const VERBS: &str =
    "mmap, munmap, mprotect, mremap, madvise, brk, read, write, special, pin, unpin, fork, thread, thp_disable, exit, exec";

/// The longest line the parser reads (a file without newlines, such as a
/// binary one, must not be read whole into memory).
pub const MAX_LINE: usize = 1 << 20;

/// A workload read as a stream: an iterator over its statements, each parsed
/// and checked against those before it when it is asked for, so that a run
/// can execute it before the next line is even read. Yields the first error
/// (syntax, semantics, invalid UTF-8, a read error) and then ends.
pub struct Statements<R> {
    file: String,
    reader: R,
    checker: Checker,
    /// The number of the last line read.
    line: u32,
    buf: Vec<u8>,
    /// The token list, reused from line to line (see [`recycle`]).
    toks: Vec<Tok<'static>>,
    parts: Vec<(Part, u32)>,
    done: bool,
}

impl<R: BufRead> Statements<R> {
    /// Statements of the text `reader` gives, named `file` in errors.
    pub fn new(file: impl Into<String>, reader: R) -> Statements<R> {
        Statements {
            file: file.into(),
            reader,
            checker: Checker::new(),
            line: 0,
            buf: Vec::with_capacity(256),
            toks: Vec::with_capacity(16),
            parts: Vec::with_capacity(8),
            done: false,
        }
    }

    /// The name errors give the workload.
    pub fn file(&self) -> &str {
        &self.file
    }

    fn err(&self, line: u32, col: u32, message: impl Into<String>) -> ParseError {
        ParseError {
            file: self.file.clone(),
            line,
            col,
            message: message.into(),
        }
    }

    /// Reads the next line into `buf`, without its `\n`: false at the end
    /// of the text. For lines not whole in the reader's buffer.
    fn read_line(&mut self) -> Result<bool, ParseError> {
        self.buf.clear();
        let limit = MAX_LINE as u64 + 1;
        let n = (&mut self.reader)
            .take(limit)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| read_error(&self.file, self.line, e))?;
        if n == 0 {
            return Ok(false);
        }
        self.line = self.line.saturating_add(1);
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        } else if self.buf.len() > MAX_LINE {
            return Err(self.err(
                self.line,
                1,
                format!("line longer than {} bytes; is this a workload?", MAX_LINE),
            ));
        }
        Ok(true)
    }

    fn next_stmt(&mut self) -> Result<Option<Stmt>, ParseError> {
        loop {
            // The common case: the whole line is in the reader's buffer, and
            // is parsed there.
            let avail = self
                .reader
                .fill_buf()
                .map_err(|e| read_error(&self.file, self.line, e))?;
            if let Some(nl) = avail.iter().position(|&b| b == b'\n') {
                self.line = self.line.saturating_add(1);
                let stmt = parse_bytes(
                    &self.file,
                    self.line,
                    &avail[..nl],
                    &mut self.checker,
                    &mut self.toks,
                    &mut self.parts,
                );
                self.reader.consume(nl + 1);
                match stmt? {
                    Some(stmt) => return Ok(Some(stmt)),
                    None => continue,
                }
            }
            // A line across the end of the buffer, or the last line without
            // a newline: copied out first.
            if !self.read_line()? {
                return Ok(None);
            }
            let stmt = parse_bytes(
                &self.file,
                self.line,
                &self.buf,
                &mut self.checker,
                &mut self.toks,
                &mut self.parts,
            )?;
            if stmt.is_some() {
                return Ok(stmt);
            }
        }
    }
}

/// A read error of the stream, after line `line`.
fn read_error(file: &str, line: u32, e: std::io::Error) -> ParseError {
    let at = match line {
        0 => String::new(),
        n => format!(" after line {n}"),
    };
    ParseError {
        file: file.to_string(),
        line: 0,
        col: 0,
        message: format!("cannot read{at}: {e}"),
    }
}

/// Line `line_no` of `file`, as bytes without its `\n`: its statement,
/// checked (`None` for a blank or comment line). `toks` and `parts` are
/// scratch space, reused from line to line.
fn parse_bytes(
    file: &str,
    line_no: u32,
    bytes: &[u8],
    checker: &mut Checker,
    toks: &mut Vec<Tok<'static>>,
    parts: &mut Vec<(Part, u32)>,
) -> Result<Option<Stmt>, ParseError> {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let raw = match std::str::from_utf8(bytes) {
        Ok(raw) => raw,
        Err(e) => {
            // What comes before the bad byte is valid UTF-8.
            let good = std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or("");
            let col = u32::try_from(good.chars().count()).unwrap_or(u32::MAX);
            return Err(ParseError {
                file: file.to_string(),
                line: line_no,
                col: col.saturating_add(1),
                message: "invalid UTF-8".to_string(),
            });
        }
    };
    let mut line_toks = recycle(std::mem::take(toks));
    tokenize(raw, &mut line_toks);
    parts.clear();
    let mut line = Line {
        file,
        line: line_no,
        toks: &line_toks,
        parts,
    };
    let stmt = parse_line(&mut line, checker);
    *toks = recycle(line_toks);
    stmt
}

impl<R: BufRead> Iterator for Statements<R> {
    type Item = Result<Stmt, ParseError>;

    fn next(&mut self) -> Option<Result<Stmt, ParseError>> {
        if self.done {
            return None;
        }
        let next = self.next_stmt().transpose();
        if !matches!(next, Some(Ok(_))) {
            self.done = true;
        }
        next
    }
}

impl<R: BufRead> std::iter::FusedIterator for Statements<R> {}

/// One line's statement (`None` for a blank or comment line), checked.
fn parse_line(line: &mut Line<'_>, checker: &mut Checker) -> Result<Option<Stmt>, ParseError> {
    let Some(first) = line.toks.first().copied() else {
        return Ok(None);
    };
    let kind = parse_stmt(line, checker)?;
    let stmt = Stmt {
        pos: Pos {
            line: line.line,
            col: first.col,
        },
        kind,
    };
    if let Err(Issue { part, message }) = check::stmt(checker, &stmt) {
        let col = part
            .and_then(|p| line.parts.iter().find(|(q, _)| *q == p).map(|(_, c)| *c))
            .unwrap_or(first.col);
        return Err(line.err(col, message));
    }
    Ok(Some(stmt))
}

/// Parses one whole workload. `file` is only used in error messages and kept
/// in [`Workload::file`].
pub fn parse(file: &str, text: &str) -> Result<Workload, ParseError> {
    let stmts = Statements::new(file, text.as_bytes()).collect::<Result<_, _>>()?;
    Ok(Workload {
        file: file.to_string(),
        stmts,
    })
}

/// A workload file's statements, streamed (see [`open`] and [`Statements`]).
pub fn stream_file(path: &Path) -> Result<Statements<Source>, ParseError> {
    Ok(Statements::new(path.display().to_string(), open(path)?))
}

/// The statements of a workload file's `bytes`, read elsewhere (see
/// [`open_bytes`]); `path` names it in errors and says how it is compressed.
pub fn stream_bytes(path: &Path, bytes: Bytes) -> Result<Statements<Source>, ParseError> {
    Ok(Statements::new(
        path.display().to_string(),
        open_bytes(path, bytes)?,
    ))
}

/// Reads and parses a whole workload file (plain, `.gz` or `.zst`). An
/// unreadable file is an error at line 0; bytes that are not UTF-8 are an
/// error at their line and column.
pub fn parse_file(path: &Path) -> Result<Workload, ParseError> {
    let stream = stream_file(path)?;
    let file = stream.file().to_string();
    let stmts = stream.collect::<Result<_, _>>()?;
    Ok(Workload { file, stmts })
}

fn parse_stmt(l: &mut Line<'_>, checker: &Checker) -> Result<StmtKind, ParseError> {
    let first = l.toks[0];
    // Most lines are `<proc> <verb>`: skip the keywords when the first
    // letter is none of theirs.
    if !matches!(
        first.text.as_bytes()[0],
        b's' | b'm' | b'c' | b'k' | b'r' | b'e' | b'f'
    ) {
        return parse_proc_stmt(l, checker);
    }
    Ok(match first.text {
        "set" => StmtKind::Set(Set::parse(l)?),
        "machine" => StmtKind::Machine(Machine::parse(l)?),
        "cgroup" => StmtKind::Cgroup(Cgroup::parse(l)?),
        "spawn" => StmtKind::Spawn(Spawn::parse(l)?),
        "split" => StmtKind::Split(Split::parse(l)?),
        "khugepaged" => {
            l.no_more(1, "khugepaged")?;
            StmtKind::Khugepaged
        }
        "reclaim" => {
            l.no_more(1, "reclaim")?;
            StmtKind::Reclaim
        }
        "fragment" => StmtKind::Fragment(Fragment::parse(l)?),
        "sleep" => StmtKind::Sleep(stmt::Sleep::parse(l)?),
        "snapshot" => StmtKind::Snapshot(Snapshot::parse(l)?),
        "expect" => stmt::parse_expect(l)?.into(),
        _ => return parse_proc_stmt(l, checker),
    })
}

/// `<proc> <verb> ...`. When the verb is unknown, the message is about the
/// verb if the first token names a process seen so far, else about the first
/// token (most likely a mistyped keyword).
fn parse_proc_stmt(l: &mut Line<'_>, checker: &Checker) -> Result<StmtKind, ParseError> {
    let first = l.toks[0];
    let unknown_stmt = |l: &Line<'_>| {
        l.err(
            first.col,
            format!(
                "unknown statement {}; expected one of {KEYWORDS}, or '<process> <verb>'",
                quote(first.text)
            ),
        )
    };
    if !valid_name(first.text) {
        return Err(unknown_stmt(l));
    }
    let Some(verb) = l.toks.get(1).copied() else {
        if checker.has_process(first.text) {
            return Err(l.err(
                l.end_col(),
                format!(
                    "missing statement for process {}; expected one of {VERBS}",
                    quote(first.text)
                ),
            ));
        }
        return Err(unknown_stmt(l));
    };
    let proc = first.text.to_string();
    l.mark(Part::Proc, first.col);
    Ok(match verb.text {
        "mmap" => StmtKind::Mmap(Mmap::parse(l, proc)?),
        "munmap" => StmtKind::Munmap(Munmap::parse(l, proc)?),
        "mprotect" => StmtKind::Mprotect(Mprotect::parse(l, proc)?),
        "mremap" => StmtKind::Mremap(stmt::Mremap::parse(l, proc)?),
        "madvise" => StmtKind::Madvise(Madvise::parse(l, proc)?),
        "brk" => StmtKind::Brk(stmt::Brk::parse(l, proc)?),
        "read" => StmtKind::Read(stmt::Read::parse(l, proc)?),
        "write" => StmtKind::Write(stmt::Write::parse(l, proc)?),
        "special" => StmtKind::Special(stmt::Special::parse(l, proc)?),
        "pin" => StmtKind::Pin(Pin::parse(l, proc)?),
        "unpin" => StmtKind::Unpin(Unpin::parse(l, proc)?),
        "fork" => StmtKind::Fork(Fork::parse(l, proc)?),
        "thp_disable" => StmtKind::ThpDisable(ThpDisable::parse(l, proc)?),
        "thread" => StmtKind::Thread(stmt::Thread::parse(l, proc)?),
        "exit" => StmtKind::Exit(Exit::parse(l, proc)?),
        "exec" => StmtKind::Exec(stmt::Exec::parse(l, proc)?),
        _ if !checker.has_process(first.text) => return Err(unknown_stmt(l)),
        _ => {
            return Err(l.err(
                verb.col,
                format!(
                    "unknown statement {} for process {}; expected one of {VERBS}",
                    quote(verb.text),
                    quote(first.text)
                ),
            ))
        }
    })
}
