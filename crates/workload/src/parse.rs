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

use crate::ast::*;
use crate::check::{valid_name, Checker, Issue, Part, RESERVED};
use crate::observation::{ERRNO, SIGNAL};
pub use crate::source::{open, Source};
use std::io::{BufRead, Read};
use std::path::Path;
use std::str::FromStr;

/// A syntax or semantic error at a place in a workload file.
///
/// Displays as `file:line:col: message`; `line` 0 means the file could not be
/// read at all, and then it displays as `file: message`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{} {message}", location(.line, .col))]
pub struct ParseError {
    pub file: String,
    pub line: u32,
    pub col: u32,
    pub message: String,
}

/// `line:col:` or nothing for a file-level error (line 0).
fn location(line: &u32, col: &u32) -> String {
    if *line == 0 {
        String::new()
    } else {
        format!("{line}:{col}:")
    }
}

pub use crate::units::SizeError;

impl FromStr for Size {
    type Err = SizeError;

    /// See [`crate::units::parse_size`].
    fn from_str(s: &str) -> Result<Size, SizeError> {
        crate::units::parse_size(s).map(Size)
    }
}

/// `None` if `s` is not all ASCII digits (or is empty); `Some(None)` on overflow.
/// (`u64::from_str` alone would accept a leading `+`.)
pub(crate) fn parse_decimal(s: &str) -> Option<Option<u64>> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if s.len() <= 19 {
        // Fits: 19 digits are below 2^64.
        return Some(Some(
            s.bytes().fold(0u64, |n, b| n * 10 + u64::from(b - b'0')),
        ));
    }
    let mut n: Option<u64> = Some(0);
    for b in s.bytes() {
        n = n.and_then(|n| n.checked_mul(10)?.checked_add(u64::from(b - b'0')));
    }
    Some(n)
}

/// An integer in decimal or `0x` hex, with an optional leading `-` (the
/// value of `expect`: a change since the start may be negative).
fn parse_int(s: &str) -> Result<i64, String> {
    let bad = || {
        format!(
            "bad value {}; expected an integer like 42, -7 or 0x2a",
            quote(s)
        )
    };
    let large = || format!("value too large: {}", quote(s));
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let magnitude: u64 = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        u64::from_str_radix(hex, 16).map_err(|_| large())?
    } else {
        parse_decimal(digits).ok_or_else(bad)?.ok_or_else(large)?
    };
    if neg {
        0i64.checked_sub_unsigned(magnitude).ok_or_else(large)
    } else {
        i64::try_from(magnitude).map_err(|_| large())
    }
}

/// A user token inside an error message: quoted, control characters escaped
/// (so the message stays on one line) and cut when very long.
pub(crate) fn quote(s: &str) -> String {
    const MAX: usize = 60;
    let mut out = String::from("'");
    for (i, c) in s.chars().enumerate() {
        if i == MAX {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// The top-level statement keywords, in the order error messages list them.
const KEYWORDS: &str = "set, machine, cgroup, spawn, split, khugepaged, reclaim, snapshot, expect";
/// The verbs of `<proc> <verb> ...` statements, in the order error messages list them.
const VERBS: &str =
    "mmap, munmap, mprotect, madvise, read, write, pin, unpin, fork, thp_disable, exit";

const USAGE_SET: &str = "set <tunable> <value>";
const USAGE_MACHINE: &str =
    "machine <key>=<value>... with keys arch=x86_64|arm64, base_page=4K|16K|64K, memory=<size>, hvo=6.18|2021, struct_page=<bytes>";
const USAGE_CGROUP: &str = "cgroup <cg> [memory.max=<size>]";
const USAGE_SPAWN: &str = "spawn <proc> [cgroup=<cg>]";
const USAGE_SPLIT: &str = "split <proc> <range>";
const USAGE_FRAGMENT: &str = "fragment unmovable=<percent>% [pattern=spread|clustered] [seed=<n>]";
const USAGE_SNAPSHOT: &str = "snapshot <label>";
const USAGE_EXPECT: &str =
    "expect <counter> [+ <counter>]... ==|<=|>= <value>, or expect errno == <ERRNO>|0, or expect signal == <SIGNAL>|0";
const USAGE_MMAP: &str =
    "<proc> mmap <region> <size> [align=<size>] [hugetlb=2M|1G] [shared] [prot=rw|r|none]";
const USAGE_MUNMAP: &str = "<proc> munmap <range>";
const USAGE_MPROTECT: &str = "<proc> mprotect <range> rw|r|none";
const USAGE_MADVISE: &str =
    "<proc> madvise <range> HUGEPAGE|NOHUGEPAGE|DONTNEED|FREE|COLLAPSE|PAGEOUT|COLD";
const USAGE_READ: &str = "<proc> read <range> [step=<size>]";
const USAGE_WRITE: &str = "<proc> write <range> [step=<size>] [zero]";
const USAGE_PIN: &str = "<proc> pin <range>";
const USAGE_UNPIN: &str = "<proc> unpin <range>";
const USAGE_FORK: &str = "<proc> fork <child>";
const USAGE_THP_DISABLE: &str = "<proc> thp_disable on|off";
const USAGE_EXIT: &str = "<proc> exit";

/// One option a statement accepts: `name=<value>` when `value` is set, else a flag.
struct OptSpec {
    name: &'static str,
    value: Option<&'static str>,
}

const fn opt(name: &'static str, value: &'static str) -> OptSpec {
    OptSpec {
        name,
        value: Some(value),
    }
}

const fn flag(name: &'static str) -> OptSpec {
    OptSpec { name, value: None }
}

const MMAP_OPTS: &[OptSpec; 4] = &[
    opt("align", "<size>"),
    opt("hugetlb", "2M|1G"),
    flag("shared"),
    opt("prot", "rw|r|none"),
];
const READ_OPTS: &[OptSpec; 1] = &[opt("step", "<size>")];
const WRITE_OPTS: &[OptSpec; 2] = &[opt("step", "<size>"), flag("zero")];
const SPAWN_OPTS: &[OptSpec; 1] = &[opt("cgroup", "<cg>")];
const CGROUP_OPTS: &[OptSpec; 1] = &[opt("memory.max", "<size>")];
const FRAGMENT_OPTS: &[OptSpec; 3] = &[
    opt("unmovable", "<percent>%"),
    opt("pattern", "spread|clustered"),
    opt("seed", "<n>"),
];

fn describe_opts(specs: &[OptSpec]) -> String {
    let v: Vec<String> = specs
        .iter()
        .map(|s| match s.value {
            Some(v) => format!("{}={}", s.name, v),
            None => s.name.to_string(),
        })
        .collect();
    v.join(", ")
}

/// A token of a line: its text and the 1-based column (in characters) where it starts.
#[derive(Clone, Copy, Debug)]
struct Tok<'a> {
    text: &'a str,
    col: u32,
}

impl Tok<'_> {
    /// The column of the character at byte `byte` of this token (a char boundary).
    fn col_at(&self, byte: usize) -> u32 {
        let chars = match self.text.get(..byte) {
            Some(s) if s.is_ascii() => s.len(),
            Some(s) => s.chars().count(),
            None => 0,
        };
        self.col
            .saturating_add(u32::try_from(chars).unwrap_or(u32::MAX))
    }

    /// The column just past this token.
    fn end_col(&self) -> u32 {
        self.col_at(self.text.len())
    }
}

/// Splits a line into `toks` at spaces and tabs, dropping a `#` comment.
/// Works on bytes (spaces, tabs and `#` are ASCII, so never inside a
/// character); a token's column counts the characters before it.
fn tokenize<'a>(line: &'a str, toks: &mut Vec<Tok<'a>>) {
    let bytes = line.as_bytes();
    let first = toks.len();
    let col = |at: usize| u32::try_from(at + 1).unwrap_or(u32::MAX);
    let mut start = usize::MAX;
    let mut end = bytes.len();
    let mut high = 0u8;
    for (i, &b) in bytes.iter().enumerate() {
        high |= b;
        match b {
            b' ' | b'\t' if start != usize::MAX => {
                toks.push(Tok {
                    text: &line[start..i],
                    col: col(start),
                });
                start = usize::MAX;
            }
            b' ' | b'\t' => {}
            b'#' => {
                end = i;
                break;
            }
            _ if start == usize::MAX => start = i,
            _ => {}
        }
    }
    if start != usize::MAX {
        toks.push(Tok {
            text: &line[start..end],
            col: col(start),
        });
    }
    if high & 0x80 != 0 {
        // Not all ASCII: a column counts characters, not bytes.
        for t in &mut toks[first..] {
            let at = t.text.as_ptr() as usize - line.as_ptr() as usize;
            let chars = line[..at].chars().count();
            t.col = u32::try_from(chars).map_or(u32::MAX, |c| c.saturating_add(1));
        }
    }
}

/// An empty token list with the allocation of `v`, for the next line (whose
/// tokens borrow another buffer). The map never runs: `v` is empty by then,
/// and the standard library collects it in place.
fn recycle<'b>(mut v: Vec<Tok<'_>>) -> Vec<Tok<'b>> {
    v.clear();
    v.into_iter()
        .map(|_| -> Tok<'b> { unreachable!() })
        .collect()
}

/// The statement being parsed: its tokens, plus the columns of the parts a
/// semantic error may point at (the AST itself keeps only statement positions).
struct Line<'a> {
    file: &'a str,
    line: u32,
    toks: &'a [Tok<'a>],
    parts: &'a mut Vec<(Part, u32)>,
}

impl<'a> Line<'a> {
    fn err(&self, col: u32, message: impl Into<String>) -> ParseError {
        ParseError {
            file: self.file.to_string(),
            line: self.line,
            col,
            message: message.into(),
        }
    }

    /// The column just past the last token: where a missing argument should be.
    fn end_col(&self) -> u32 {
        self.toks.last().map_or(1, |t| t.end_col())
    }

    /// Token `i`, or a "missing <what>" error pointing past the line's end.
    fn arg(&self, i: usize, what: &str, usage: &str) -> Result<Tok<'a>, ParseError> {
        self.toks
            .get(i)
            .copied()
            .ok_or_else(|| self.err(self.end_col(), format!("missing {what}; usage: {usage}")))
    }

    /// Errors if there are tokens from `i` on.
    fn no_more(&self, i: usize, usage: &str) -> Result<(), ParseError> {
        match self.toks.get(i) {
            Some(t) => Err(self.err(
                t.col,
                format!("unexpected argument {}; usage: {usage}", quote(t.text)),
            )),
            None => Ok(()),
        }
    }

    fn mark(&mut self, part: Part, col: u32) {
        self.parts.push((part, col));
    }

    fn name(&self, tok: Tok<'_>, what: &str) -> Result<Name, ParseError> {
        if valid_name(tok.text) {
            Ok(tok.text.to_string())
        } else {
            Err(self.err(
                tok.col,
                format!(
                    "bad {what} name {}; names are [A-Za-z_][A-Za-z0-9_-]*",
                    quote(tok.text)
                ),
            ))
        }
    }

    /// A process name that a statement creates: also not a reserved keyword,
    /// since a line starting with a keyword is always that statement.
    fn new_proc_name(&self, tok: Tok<'_>) -> Result<Name, ParseError> {
        let name = self.name(tok, "process")?;
        if RESERVED.contains(&name.as_str()) {
            return Err(self.err(
                tok.col,
                format!(
                    "{} is a statement keyword and cannot name a process",
                    quote(&name)
                ),
            ));
        }
        Ok(name)
    }

    /// The size in bytes `from..to` of `tok`, an error pointing there.
    fn size_in(&self, tok: Tok<'_>, from: usize, to: usize) -> Result<Size, ParseError> {
        tok.text[from..to]
            .parse::<Size>()
            .map_err(|e| self.err(tok.col_at(from), e.to_string()))
    }

    fn size_at(&self, text: &str, col: u32) -> Result<Size, ParseError> {
        text.parse::<Size>()
            .map_err(|e| self.err(col, e.to_string()))
    }

    /// `<region>[+<offset>][:<length>]`, each part's error at its own column.
    fn range(&self, tok: Tok<'_>) -> Result<Range, ParseError> {
        let s = tok.text;
        let name_end = s
            .bytes()
            .position(|b| b == b'+' || b == b':')
            .unwrap_or(s.len());
        let region = &s[..name_end];
        if region.is_empty() {
            return Err(self.err(
                tok.col,
                format!(
                    "missing region name in range {}; ranges are <region>[+<offset>][:<length>]",
                    quote(s)
                ),
            ));
        }
        let region = self.name(
            Tok {
                text: region,
                col: tok.col,
            },
            "region",
        )?;
        let mut rest_at = name_end;
        let mut offset = None;
        if s[rest_at..].starts_with('+') {
            let body_at = rest_at + 1;
            let body_end = s.as_bytes()[body_at..]
                .iter()
                .position(|&b| b == b':')
                .map_or(s.len(), |i| body_at + i);
            offset = Some(self.size_in(tok, body_at, body_end)?);
            rest_at = body_end;
        }
        let mut len = None;
        if s[rest_at..].starts_with(':') {
            let body_at = rest_at + 1;
            let l = self.size_in(tok, body_at, s.len())?;
            if l.0 == 0 {
                return Err(self.err(
                    tok.col_at(body_at),
                    format!("zero-length range {}", quote(s)),
                ));
            }
            len = Some(l);
        }
        Ok(Range {
            region,
            offset,
            len,
        })
    }

    /// Parses the options from token `from` on, in any order, each at most once.
    /// Returns, per spec, the value token (the text after `=`, or the flag itself).
    fn options<const N: usize>(
        &self,
        from: usize,
        stmt: &str,
        specs: &[OptSpec; N],
    ) -> Result<[Option<Tok<'a>>; N], ParseError> {
        let mut found: [Option<Tok<'a>>; N] = [None; N];
        if from >= self.toks.len() {
            return Ok(found);
        }
        for tok in self.toks.iter().skip(from) {
            let (key, value) = match tok.text.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (tok.text, None),
            };
            let Some(idx) = specs.iter().position(|s| s.name == key) else {
                return Err(self.err(
                    tok.col,
                    format!(
                        "unknown option {} for {stmt}; expected one of {}",
                        quote(key),
                        describe_opts(specs)
                    ),
                ));
            };
            let spec = &specs[idx];
            if found[idx].is_some() {
                return Err(self.err(
                    tok.col,
                    format!(
                        "duplicate option {}; {stmt} accepts {}",
                        quote(key),
                        describe_opts(specs)
                    ),
                ));
            }
            let value_tok = match (spec.value, value) {
                (Some(_), Some(v)) => Tok {
                    text: v,
                    col: tok.col_at(key.len() + 1),
                },
                (Some(what), None) => {
                    return Err(self.err(
                        tok.col,
                        format!("option '{key}' needs a value: {key}={what}"),
                    ));
                }
                (None, Some(_)) => {
                    return Err(self.err(tok.col, format!("option '{key}' takes no value")))
                }
                (None, None) => *tok,
            };
            found[idx] = Some(value_tok);
        }
        Ok(found)
    }
}

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
    if let Err(Issue { part, message }) = checker.stmt(&stmt) {
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

/// Reads and parses a whole workload file (plain, `.gz` or `.zst`). An
/// unreadable file is an error at line 0; bytes that are not UTF-8 are an
/// error at their line and column.
pub fn parse_file(path: &Path) -> Result<Workload, ParseError> {
    let stream = stream_file(path)?;
    let file = stream.file().to_string();
    let stmts = stream.collect::<Result<_, _>>()?;
    Ok(Workload { file, stmts })
}

/// `fragment unmovable=<percent>% [pattern=spread|clustered] [seed=<n>]`.
fn parse_fragment(l: &mut Line<'_>) -> Result<StmtKind, ParseError> {
    let opts = l.options(1, "fragment", FRAGMENT_OPTS)?;
    let Some(share) = opts[0] else {
        return Err(l.err(
            l.end_col(),
            format!("fragment needs unmovable=<percent>%; usage: {USAGE_FRAGMENT}"),
        ));
    };
    let permille = parse_percent(share.text).ok_or_else(|| {
        l.err(
            share.col,
            format!(
                "bad share {}; expected a percentage from 0% to 100% with at most one decimal, such as 10% or 2.5%",
                quote(share.text)
            ),
        )
    })?;
    let pattern = match opts[1] {
        None => FragmentPattern::Spread,
        Some(t) => match t.text {
            "spread" => FragmentPattern::Spread,
            "clustered" => FragmentPattern::Clustered,
            other => {
                return Err(l.err(
                    t.col,
                    format!(
                        "bad pattern {}; expected one of spread, clustered",
                        quote(other)
                    ),
                ))
            }
        },
    };
    let seed = match opts[2] {
        None => 0,
        Some(t) => t.text.parse::<u64>().map_err(|_| {
            l.err(
                t.col,
                format!("bad seed {}; expected a decimal integer", quote(t.text)),
            )
        })?,
    };
    Ok(StmtKind::Fragment {
        permille,
        pattern,
        seed,
    })
}

/// `10%` or `2.5%` in tenths of a percent, at most 100%.
fn parse_percent(text: &str) -> Option<u32> {
    let number = text.strip_suffix('%')?;
    let (whole, tenth) = match number.split_once('.') {
        Some((w, t)) if t.len() == 1 => (w, t),
        Some(_) => return None,
        None => (number, "0"),
    };
    if whole.is_empty()
        || !whole
            .bytes()
            .chain(tenth.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let permille = whole.parse::<u32>().ok()?.checked_mul(10)? + tenth.parse::<u32>().ok()?;
    (permille <= 1000).then_some(permille)
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
    match first.text {
        "set" => parse_set(l),
        "machine" => parse_machine(l),
        "cgroup" => {
            let t = l.arg(1, "cgroup name", USAGE_CGROUP)?;
            let cgroup = l.name(t, "cgroup")?;
            l.mark(Part::Cgroup, t.col);
            let opts = l.options(2, "cgroup", CGROUP_OPTS)?;
            let memory_max = match opts[0] {
                Some(v) if v.text == "max" => None,
                Some(v) => Some(l.size_at(v.text, v.col)?),
                None => None,
            };
            Ok(StmtKind::Cgroup { cgroup, memory_max })
        }
        "spawn" => {
            let t = l.arg(1, "process name", USAGE_SPAWN)?;
            let proc = l.new_proc_name(t)?;
            l.mark(Part::Proc, t.col);
            let opts = l.options(2, "spawn", SPAWN_OPTS)?;
            let cgroup = match opts[0] {
                Some(v) => {
                    l.mark(Part::Cgroup, v.col);
                    Some(l.name(v, "cgroup")?)
                }
                None => None,
            };
            Ok(StmtKind::Spawn { proc, cgroup })
        }
        "split" => {
            let t = l.arg(1, "process name", USAGE_SPLIT)?;
            let proc = l.name(t, "process")?;
            l.mark(Part::Proc, t.col);
            let r = l.arg(2, "range", USAGE_SPLIT)?;
            let range = l.range(r)?;
            l.mark(Part::Range, r.col);
            l.no_more(3, USAGE_SPLIT)?;
            Ok(StmtKind::Split { proc, range })
        }
        "khugepaged" => {
            l.no_more(1, "khugepaged")?;
            Ok(StmtKind::Khugepaged)
        }
        "reclaim" => {
            l.no_more(1, "reclaim")?;
            Ok(StmtKind::Reclaim)
        }
        "fragment" => parse_fragment(l),
        "snapshot" => {
            let t = l.arg(1, "label", USAGE_SNAPSHOT)?;
            let label = l.name(t, "snapshot")?;
            l.mark(Part::Label, t.col);
            l.no_more(2, USAGE_SNAPSHOT)?;
            Ok(StmtKind::Snapshot { label })
        }
        "expect" => parse_expect(l),
        _ => parse_proc_stmt(l, checker),
    }
}

fn parse_set(l: &mut Line<'_>) -> Result<StmtKind, ParseError> {
    let t = l.arg(1, "tunable", USAGE_SET)?;
    let tunable = t.text.parse::<Tunable>().map_err(|m| l.err(t.col, m))?;
    let v = l.arg(2, "value", USAGE_SET)?;
    let value = tunable.parse_value(v.text).map_err(|m| l.err(v.col, m))?;
    l.no_more(3, USAGE_SET)?;
    Ok(StmtKind::Set { tunable, value })
}

fn parse_machine(l: &mut Line<'_>) -> Result<StmtKind, ParseError> {
    l.arg(1, "machine key", USAGE_MACHINE)?;
    let keys = "expected arch=x86_64|arm64, base_page=4K|16K|64K, memory=<size>, hvo=6.18|2021, struct_page=<bytes>";
    let mut params = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for i in 1..l.toks.len() {
        let t = l.toks[i];
        let Some((key, value)) = t.text.split_once('=') else {
            return Err(l.err(
                t.col,
                format!("bad machine setting {}; {keys}", quote(t.text)),
            ));
        };
        let vcol = t.col_at(key.len() + 1);
        let (key, param) = match key {
            "arch" => (
                "arch",
                MachineParam::Arch(match value {
                    "x86_64" => Arch::X86_64,
                    "arm64" => Arch::Arm64,
                    _ => {
                        return Err(l.err(
                            vcol,
                            format!(
                                "unknown arch {}; expected one of x86_64, arm64",
                                quote(value)
                            ),
                        ))
                    }
                }),
            ),
            "base_page" => {
                let s = l.size_at(value, vcol)?;
                if !matches!(s.0, 0x1000 | 0x4000 | 0x10000) {
                    return Err(l.err(
                        vcol,
                        format!(
                            "bad base_page {}; expected one of 4K, 16K, 64K",
                            quote(value)
                        ),
                    ));
                }
                ("base_page", MachineParam::BasePage(s))
            }
            "memory" => {
                let s = l.size_at(value, vcol)?;
                if s.0 == 0 {
                    return Err(l.err(vcol, "machine memory must be nonzero"));
                }
                ("memory", MachineParam::Memory(s))
            }
            "hvo" => (
                "hvo",
                MachineParam::Hvo(match value {
                    "6.18" => HvoRuleName::Linux618,
                    "2021" => HvoRuleName::Series2021,
                    _ => {
                        return Err(l.err(
                            vcol,
                            format!("unknown hvo rule {}; expected 6.18 or 2021", quote(value)),
                        ))
                    }
                }),
            ),
            "struct_page" => {
                let n = parse_int(value).map_err(|m| l.err(vcol, m))?;
                if !(1..=4096).contains(&n) {
                    return Err(l.err(vcol, "struct_page is 1 to 4096 bytes"));
                }
                ("struct_page", MachineParam::StructPage(n as u64))
            }
            _ => return Err(l.err(t.col, format!("unknown machine key {}; {keys}", quote(key)))),
        };
        if seen.contains(&key) {
            return Err(l.err(t.col, format!("duplicate machine key '{key}'; {keys}")));
        }
        seen.push(key);
        l.mark(Part::MachineKey(key), t.col);
        params.push(param);
    }
    Ok(StmtKind::Machine { params })
}

fn parse_expect(l: &mut Line<'_>) -> Result<StmtKind, ParseError> {
    // `expect C [+ C]... OP V`: counters joined by `+` tokens.
    let mut counters = Vec::new();
    let mut i = 1;
    let o = loop {
        let c = l.arg(i, "counter", USAGE_EXPECT)?;
        if !crate::check::valid_counter(c.text) {
            let hint = if c.text.contains('+') {
                "; a sum is written with spaces around each +, like vmstat.a + vmstat.b"
            } else {
                ""
            };
            return Err(l.err(
                c.col,
                format!(
                    "bad counter name {}; expected a dotted name of [A-Za-z0-9_.-] like vmstat.thp_fault_alloc{hint}",
                    quote(c.text)
                ),
            ));
        }
        l.mark(Part::Counter(counters.len()), c.col);
        counters.push(c.text.to_string());
        let o = l.arg(i + 1, "comparison", USAGE_EXPECT)?;
        if o.text != "+" {
            break o;
        }
        i += 2;
    };
    let op = match o.text {
        "==" => CmpOp::Eq,
        "<=" => CmpOp::Le,
        ">=" => CmpOp::Ge,
        _ => {
            return Err(l.err(
                o.col,
                format!(
                    "unknown comparison {}; expected one of ==, <=, >= (or + between counters)",
                    quote(o.text)
                ),
            ))
        }
    };
    let v = l.arg(i + 2, "value", USAGE_EXPECT)?;
    let outcome = match counters.as_slice() {
        [one] if one == ERRNO || one == SIGNAL => Some(one.as_str()),
        _ => None,
    };
    if let Some(what) = outcome {
        if op != CmpOp::Eq {
            let what = if what == ERRNO {
                "an errno"
            } else {
                "a signal"
            };
            return Err(l.err(o.col, format!("{what} is compared with == only")));
        }
        l.no_more(i + 3, USAGE_EXPECT)?;
        return if what == ERRNO {
            let errno = Errno::from_name(v.text).ok_or_else(|| {
                let names: Vec<&str> = Errno::known_names().collect();
                l.err(
                    v.col,
                    format!(
                        "unknown errno {}; expected 0 (success) or one of {}",
                        quote(v.text),
                        names.join(", ")
                    ),
                )
            })?;
            Ok(StmtKind::ExpectErrno { errno })
        } else {
            let signal = Signal::from_name(v.text).ok_or_else(|| {
                let names: Vec<&str> = Signal::known_names().collect();
                l.err(
                    v.col,
                    format!(
                        "unknown signal {}; expected 0 (not killed) or one of {}",
                        quote(v.text),
                        names.join(", ")
                    ),
                )
            })?;
            Ok(StmtKind::ExpectSignal { signal })
        };
    }
    if let Some(pos) = counters.iter().position(|c| c == ERRNO || c == SIGNAL) {
        return Err(l.err(
            l.toks[1 + 2 * pos].col,
            format!(
                "{} is an outcome, not a counter: it cannot be summed",
                counters[pos]
            ),
        ));
    }
    let value = parse_int(v.text).map_err(|m| l.err(v.col, m))?;
    l.no_more(i + 3, USAGE_EXPECT)?;
    Ok(StmtKind::Expect {
        counters,
        op,
        value,
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
    let range_at = |l: &mut Line<'_>, usage: &str| -> Result<Range, ParseError> {
        let r = l.arg(2, "range", usage)?;
        let range = l.range(r)?;
        l.mark(Part::Range, r.col);
        Ok(range)
    };
    let kind = match verb.text {
        "mmap" => {
            let r = l.arg(2, "region name", USAGE_MMAP)?;
            let region = l.name(r, "region")?;
            l.mark(Part::Region, r.col);
            let s = l.arg(3, "size", USAGE_MMAP)?;
            let size = l.size_at(s.text, s.col)?;
            l.mark(Part::Size, s.col);
            let opts = l.options(4, "mmap", MMAP_OPTS)?;
            let align = match opts[0] {
                Some(v) => {
                    l.mark(Part::Align, v.col);
                    Some(l.size_at(v.text, v.col)?)
                }
                None => None,
            };
            let hugetlb = match opts[1] {
                Some(v) => {
                    let s = l.size_at(v.text, v.col)?;
                    Some(match s.0 {
                        0x20_0000 => HugetlbSize::Size2M,
                        0x4000_0000 => HugetlbSize::Size1G,
                        _ => {
                            return Err(l.err(
                                v.col,
                                format!("bad hugetlb size {}; expected 2M or 1G", quote(v.text)),
                            ));
                        }
                    })
                }
                None => None,
            };
            let prot = match opts[3] {
                Some(v) => Some(parse_prot(l, v)?),
                None => None,
            };
            StmtKind::Mmap {
                proc,
                region,
                size,
                align,
                hugetlb,
                shared: opts[2].is_some(),
                prot,
            }
        }
        "munmap" => {
            let range = range_at(l, USAGE_MUNMAP)?;
            l.no_more(3, USAGE_MUNMAP)?;
            StmtKind::Munmap { proc, range }
        }
        "mprotect" => {
            let range = range_at(l, USAGE_MPROTECT)?;
            let p = l.arg(3, "protection", USAGE_MPROTECT)?;
            let prot = parse_prot(l, p)?;
            l.no_more(4, USAGE_MPROTECT)?;
            StmtKind::Mprotect { proc, range, prot }
        }
        "madvise" => {
            let range = range_at(l, USAGE_MADVISE)?;
            let a = l.arg(3, "advice", USAGE_MADVISE)?;
            let advice = Advice::ALL
                .iter()
                .copied()
                .find(|adv| adv.name().eq_ignore_ascii_case(a.text))
                .ok_or_else(|| {
                    l.err(
                        a.col,
                        format!(
                            "unknown advice {}; expected one of HUGEPAGE, NOHUGEPAGE, DONTNEED, FREE, COLLAPSE, PAGEOUT, COLD",
                            quote(a.text)
                        ),
                    )
                })?;
            l.no_more(4, USAGE_MADVISE)?;
            StmtKind::Madvise {
                proc,
                range,
                advice,
            }
        }
        "read" => {
            let range = range_at(l, USAGE_READ)?;
            let opts = l.options(3, "read", READ_OPTS)?;
            let step = parse_step(l, opts[0])?;
            StmtKind::Read { proc, range, step }
        }
        "write" => {
            let range = range_at(l, USAGE_WRITE)?;
            let opts = l.options(3, "write", WRITE_OPTS)?;
            let step = parse_step(l, opts[0])?;
            StmtKind::Write {
                proc,
                range,
                step,
                zero: opts[1].is_some(),
            }
        }
        "pin" => {
            let range = range_at(l, USAGE_PIN)?;
            l.no_more(3, USAGE_PIN)?;
            StmtKind::Pin { proc, range }
        }
        "unpin" => {
            let range = range_at(l, USAGE_UNPIN)?;
            l.no_more(3, USAGE_UNPIN)?;
            StmtKind::Unpin { proc, range }
        }
        "fork" => {
            let c = l.arg(2, "child process name", USAGE_FORK)?;
            let child = l.new_proc_name(c)?;
            l.mark(Part::Child, c.col);
            l.no_more(3, USAGE_FORK)?;
            StmtKind::Fork { proc, child }
        }
        "thp_disable" => {
            let v = l.arg(2, "on or off", USAGE_THP_DISABLE)?;
            let on = match v.text {
                "on" => true,
                "off" => false,
                _ => {
                    return Err(l.err(
                        v.col,
                        format!(
                            "bad thp_disable value {}; expected on or off",
                            quote(v.text)
                        ),
                    ))
                }
            };
            l.no_more(3, USAGE_THP_DISABLE)?;
            StmtKind::ThpDisable { proc, on }
        }
        "exit" => {
            l.no_more(2, USAGE_EXIT)?;
            StmtKind::Exit { proc }
        }
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
    };
    Ok(kind)
}

fn parse_prot(l: &Line<'_>, t: Tok<'_>) -> Result<Prot, ParseError> {
    match t.text {
        "rw" => Ok(Prot::ReadWrite),
        "r" => Ok(Prot::Read),
        "none" => Ok(Prot::None),
        _ => Err(l.err(
            t.col,
            format!(
                "bad protection {}; expected one of rw, r, none",
                quote(t.text)
            ),
        )),
    }
}

fn parse_step(l: &mut Line<'_>, v: Option<Tok<'_>>) -> Result<Option<Size>, ParseError> {
    let Some(v) = v else { return Ok(None) };
    l.mark(Part::Step, v.col);
    let s = l.size_at(v.text, v.col)?;
    if s.0 == 0 {
        return Err(l.err(v.col, "step must be nonzero"));
    }
    Ok(Some(s))
}

impl Advice {
    /// Every advice, in the order error messages list them.
    pub const ALL: [Advice; 7] = [
        Advice::Hugepage,
        Advice::NoHugepage,
        Advice::DontNeed,
        Advice::Free,
        Advice::Collapse,
        Advice::Pageout,
        Advice::Cold,
    ];

    /// The kernel's MADV_ name without the prefix, as written in a workload.
    pub fn name(self) -> &'static str {
        match self {
            Advice::Hugepage => "HUGEPAGE",
            Advice::NoHugepage => "NOHUGEPAGE",
            Advice::DontNeed => "DONTNEED",
            Advice::Free => "FREE",
            Advice::Collapse => "COLLAPSE",
            Advice::Pageout => "PAGEOUT",
            Advice::Cold => "COLD",
        }
    }
}
