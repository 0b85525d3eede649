//! `sleep <duration>`: time passes between two statements, as it did
//! between two events of a recorded program.
//!
//! Time passes only here, and khugepaged makes the passes its tunables
//! (`scan_sleep_millisecs`, `pages_to_scan`, `alloc_sleep_millisecs`) set
//! for it, on both backends (docs/language.md says how).

use crate::line::Line;
use crate::text::{quote, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sleep {
    /// Nanoseconds.
    pub ns: u64,
}

const USAGE: &str = "sleep <duration> (a number with ns, us, ms or s: 1500us, 1.5ms, 2s)";

const UNITS: [(&str, u64); 4] = [
    ("ns", 1),
    ("us", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
];

/// `1.5ms` in nanoseconds; None for anything else (no sign, no exponent,
/// no fraction finer than a nanosecond).
pub fn parse_duration(text: &str) -> Option<u64> {
    let (num, scale) = UNITS
        .iter()
        .filter_map(|&(u, scale)| Some((text.strip_suffix(u)?, scale)))
        .find(|(n, _)| !n.ends_with(['n', 'u', 'm']))?;
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty()
        || !(int.bytes().all(|b| b.is_ascii_digit()) && frac.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let mut ns = int.parse::<u64>().ok()?.checked_mul(scale)?;
    let mut unit = scale;
    for d in frac.bytes() {
        unit /= 10;
        if unit == 0 {
            return None;
        }
        ns = ns.checked_add(u64::from(d - b'0') * unit)?;
    }
    Some(ns)
}

impl Sleep {
    pub(crate) fn parse(l: &mut Line<'_>) -> Result<Sleep, ParseError> {
        let t = l.arg(1, "duration", USAGE)?;
        let ns = parse_duration(t.text).ok_or_else(|| {
            l.err(
                t.col,
                format!(
                    "bad duration {}; expected a number with ns, us, ms or s (1500us, 1.5ms, 2s)",
                    quote(t.text)
                ),
            )
        })?;
        l.no_more(2, USAGE)?;
        Ok(Sleep { ns })
    }
}

impl fmt::Display for Sleep {
    /// In the largest unit that divides it exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (unit, scale) = UNITS
            .iter()
            .rev()
            .find(|&&(_, s)| self.ns.is_multiple_of(s))
            .copied()
            .unwrap_or(("ns", 1));
        write!(f, "sleep {}{unit}", self.ns / scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_and_print_back() {
        assert_eq!(parse_duration("1500us"), Some(1_500_000));
        assert_eq!(parse_duration("1.5ms"), Some(1_500_000));
        assert_eq!(parse_duration("2s"), Some(2_000_000_000));
        assert_eq!(parse_duration("0.000000001s"), Some(1));
        assert_eq!(parse_duration("7ns"), Some(7));
        for bad in [
            "", "1", "ms", "-1ms", "1.ms5", "1e3us", "0.5ns", "1.2.3s", "1 ms", "1m",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(Sleep { ns: 1_500_000 }.to_string(), "sleep 1500us");
        assert_eq!(Sleep { ns: 2_000_000_000 }.to_string(), "sleep 2s");
        assert_eq!(Sleep { ns: 0 }.to_string(), "sleep 0s");
    }
}
