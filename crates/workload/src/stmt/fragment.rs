//! `fragment unmovable=<percent>% [pattern=spread|clustered] [seed=<n>]`:
//! unmovable kernel pages through physical memory (model only; see the
//! model's `fragment`).

use crate::ast::FragmentPattern;
use crate::checker::{Checker, Issue};
use crate::line::{opt, Line, OptSpec};
use crate::text::{quote, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// The share of the machine's frames, in tenths of a percent.
    pub permille: u32,
    pub pattern: FragmentPattern,
    pub seed: u64,
}

const USAGE: &str = "fragment unmovable=<percent>% [pattern=spread|clustered] [seed=<n>]";
const OPTS: &[OptSpec; 3] = &[
    opt("unmovable", "<percent>%"),
    opt("pattern", "spread|clustered"),
    opt("seed", "<n>"),
];

/// `fragment unmovable=<percent>% [pattern=spread|clustered] [seed=<n>]`.
impl Fragment {
    pub(crate) fn parse(l: &mut Line<'_>) -> Result<Fragment, ParseError> {
        let opts = l.options(1, "fragment", OPTS)?;
        let Some(share) = opts[0] else {
            return Err(l.err(
                l.end_col(),
                format!("fragment needs unmovable=<percent>%; usage: {USAGE}"),
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
        Ok(Fragment {
            permille,
            pattern,
            seed,
        })
    }
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

impl Fragment {
    pub(crate) fn check(&self, _: &mut Checker, _: u32) -> Result<(), Issue> {
        Ok(())
    }
}

impl fmt::Display for Fragment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let permille = self.permille;
        write!(f, "fragment unmovable={}", permille / 10)?;
        if !permille.is_multiple_of(10) {
            write!(f, ".{}", permille % 10)?;
        }
        write!(f, "% pattern={}", self.pattern.name())?;
        if self.seed != 0 {
            write!(f, " seed={}", self.seed)?;
        }
        Ok(())
    }
}
