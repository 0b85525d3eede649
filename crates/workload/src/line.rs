//! The parser's view of one line: its tokens with their columns, and the
//! helpers every statement's `parse` uses to read its arguments (names,
//! sizes, ranges, options) with an error pointing at the right column.
//! Statements' own grammar is in [`crate::stmt`]; the stream of lines is
//! [`crate::parse`].

use crate::ast::*;
use crate::checker::Part;
use crate::text::{parse_decimal, quote, valid_name, ParseError, RESERVED};

/// An integer in decimal or `0x` hex, with an optional leading `-` (the
/// value of `expect`: a change since the start may be negative).
pub(crate) fn parse_int(s: &str) -> Result<i64, String> {
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

/// One option a statement accepts: `name=<value>` when `value` is set, else a flag.
pub(crate) struct OptSpec {
    name: &'static str,
    value: Option<&'static str>,
}

pub(crate) const fn opt(name: &'static str, value: &'static str) -> OptSpec {
    OptSpec {
        name,
        value: Some(value),
    }
}

pub(crate) const fn flag(name: &'static str) -> OptSpec {
    OptSpec { name, value: None }
}

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
pub(crate) struct Tok<'a> {
    pub(crate) text: &'a str,
    pub(crate) col: u32,
}

impl Tok<'_> {
    /// The column of the character at byte `byte` of this token (a char boundary).
    pub(crate) fn col_at(&self, byte: usize) -> u32 {
        let chars = match self.text.get(..byte) {
            Some(s) if s.is_ascii() => s.len(),
            Some(s) => s.chars().count(),
            None => 0,
        };
        self.col
            .saturating_add(u32::try_from(chars).unwrap_or(u32::MAX))
    }

    /// The column just past this token.
    pub(crate) fn end_col(&self) -> u32 {
        self.col_at(self.text.len())
    }
}

/// Splits a line into `toks` at spaces and tabs, dropping a `#` comment.
/// Works on bytes (spaces, tabs and `#` are ASCII, so never inside a
/// character); a token's column counts the characters before it.
pub(crate) fn tokenize<'a>(line: &'a str, toks: &mut Vec<Tok<'a>>) {
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
pub(crate) fn recycle<'b>(mut v: Vec<Tok<'_>>) -> Vec<Tok<'b>> {
    v.clear();
    v.into_iter()
        .map(|_| -> Tok<'b> { unreachable!() })
        .collect()
}

/// The statement being parsed: its tokens, plus the columns of the parts a
/// semantic error may point at (the AST itself keeps only statement positions).
pub(crate) struct Line<'a> {
    pub(crate) file: &'a str,
    pub(crate) line: u32,
    pub(crate) toks: &'a [Tok<'a>],
    pub(crate) parts: &'a mut Vec<(Part, u32)>,
}

impl<'a> Line<'a> {
    pub(crate) fn err(&self, col: u32, message: impl Into<String>) -> ParseError {
        ParseError {
            file: self.file.to_string(),
            line: self.line,
            col,
            message: message.into(),
        }
    }

    /// The column just past the last token: where a missing argument should be.
    pub(crate) fn end_col(&self) -> u32 {
        self.toks.last().map_or(1, |t| t.end_col())
    }

    /// Token `i`, or a "missing <what>" error pointing past the line's end.
    pub(crate) fn arg(&self, i: usize, what: &str, usage: &str) -> Result<Tok<'a>, ParseError> {
        self.toks
            .get(i)
            .copied()
            .ok_or_else(|| self.err(self.end_col(), format!("missing {what}; usage: {usage}")))
    }

    /// Errors if there are tokens from `i` on.
    pub(crate) fn no_more(&self, i: usize, usage: &str) -> Result<(), ParseError> {
        match self.toks.get(i) {
            Some(t) => Err(self.err(
                t.col,
                format!("unexpected argument {}; usage: {usage}", quote(t.text)),
            )),
            None => Ok(()),
        }
    }

    pub(crate) fn mark(&mut self, part: Part, col: u32) {
        self.parts.push((part, col));
    }

    pub(crate) fn name(&self, tok: Tok<'_>, what: &str) -> Result<Name, ParseError> {
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
    pub(crate) fn new_proc_name(&self, tok: Tok<'_>) -> Result<Name, ParseError> {
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
    pub(crate) fn size_in(&self, tok: Tok<'_>, from: usize, to: usize) -> Result<Size, ParseError> {
        tok.text[from..to]
            .parse::<Size>()
            .map_err(|e| self.err(tok.col_at(from), e.to_string()))
    }

    pub(crate) fn size_at(&self, text: &str, col: u32) -> Result<Size, ParseError> {
        text.parse::<Size>()
            .map_err(|e| self.err(col, e.to_string()))
    }

    /// `<region>[+<offset>][:<length>]`, each part's error at its own column.
    pub(crate) fn range(&self, tok: Tok<'_>) -> Result<Range, ParseError> {
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

    /// Token `i` as a range (`<region>[+<offset>][:<length>]`), marked as
    /// the statement's range.
    pub(crate) fn range_arg(&mut self, i: usize, usage: &str) -> Result<Range, ParseError> {
        let r = self.arg(i, "range", usage)?;
        let range = self.range(r)?;
        self.mark(Part::Range, r.col);
        Ok(range)
    }

    /// Parses the options from token `from` on, in any order, each at most once.
    /// Returns, per spec, the value token (the text after `=`, or the flag itself).
    pub(crate) fn options<const N: usize>(
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

pub(crate) fn parse_prot(l: &Line<'_>, t: Tok<'_>) -> Result<Prot, ParseError> {
    match Prot::ALL.into_iter().find(|p| p.name() == t.text) {
        Some(p) => Ok(p),
        None => Err(l.err(
            t.col,
            format!(
                "bad protection {}; expected one of rw, r, none, rx, rwx, x",
                quote(t.text)
            ),
        )),
    }
}

pub(crate) fn parse_step(l: &mut Line<'_>, v: Option<Tok<'_>>) -> Result<Option<Size>, ParseError> {
    let Some(v) = v else { return Ok(None) };
    l.mark(Part::Step, v.col);
    let s = l.size_at(v.text, v.col)?;
    if s.0 == 0 {
        return Err(l.err(v.col, "step must be nonzero"));
    }
    Ok(Some(s))
}
