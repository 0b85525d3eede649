//! The words of the workload language below any statement: the error type
//! every stage reports ([`ParseError`]), how a user's token is quoted in a
//! message, decimal numbers, and what a name and a counter name may be.
//! Everything else in the crate builds on this module; it uses none of it.

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

/// The top-level keywords: a line starting with one is that statement, so
/// none of them can name a process.
pub const RESERVED: [&str; 11] = [
    "set",
    "machine",
    "cgroup",
    "spawn",
    "split",
    "khugepaged",
    "reclaim",
    "fragment",
    "sleep",
    "snapshot",
    "expect",
];

/// `[A-Za-z_][A-Za-z0-9_-]*`
pub(crate) fn valid_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A file name of the workload (`file=` of mmap): `[A-Za-z0-9_][A-Za-z0-9_.+-]*`,
/// so that `libc.so.6` and `ld-linux-x86-64.so.2` are names; never a path.
pub(crate) fn valid_file_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphanumeric() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'+' | b'-'))
}

/// A dotted counter name of `[A-Za-z0-9_.-]`, with no empty dotted part.
pub(crate) fn valid_counter(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && s.split('.').all(|part| !part.is_empty())
}
