//! The page sizes hugelab works with, defined once for every crate: x86_64
//! with 4 KiB base pages, where a PMD maps 2 MiB. The model runs only this
//! shape (it refuses another `machine arch=` or `base_page=`), the kernel
//! backend's page walks and region placement (`placement`) assume it, and
//! the checker takes it as the base page until `machine base_page=` says
//! otherwise.
//!
//! Also the one parser of sizes ([`parse_size`]), for workload files and the
//! command line alike.

use crate::ast::Size;
use crate::text::{parse_decimal, quote};
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// log2 of the base page size (x86_64 PAGE_SHIFT).
pub const PAGE_SHIFT: u32 = 12;
/// The base page size in bytes (4 KiB).
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// The base page size in kB: what a page count is multiplied by for a kB figure.
pub const PAGE_KB: u64 = PAGE_SIZE / 1024;
/// log2 of the range one PMD entry maps (x86_64 PMD_SHIFT).
pub const PMD_SHIFT: u32 = 21;
/// The range one PMD entry maps, in bytes (2 MiB): the PMD THP size.
pub const PMD_SIZE: u64 = 1 << PMD_SHIFT;
/// The order of a PMD-sized folio (HPAGE_PMD_ORDER): 9.
pub const HPAGE_PMD_ORDER: u32 = PMD_SHIFT - PAGE_SHIFT;
/// The base pages one PMD maps (HPAGE_PMD_NR): 512.
pub const HPAGE_PMD_NR: u64 = 1 << HPAGE_PMD_ORDER;

/// A page frame number: a physical address >> PAGE_SHIFT. The model's
/// frames and the ones /proc/PID/pagemap shows alike; serialized as the
/// number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Pfn(pub u64);

impl std::fmt::Display for Pfn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pfn {:#x}", self.0)
    }
}

/// Why a size did not parse. Shared by the parser and by `Size::from_str`
/// so that command-line sizes get the same words as workload sizes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("bad size {}; expected bytes like 4096, 64K, 2M, 2MB, 1GiB or 0x1000", quote(.0))]
    Bad(String),
    #[error("size too large: {}", quote(.0))]
    TooLarge(String),
}

/// A size in bytes: decimal digits with an optional binary unit, or hex
/// `0x…`. The unit is `K`, `M`, `G` or `T` in either case, optionally
/// followed by `i` and/or `B` in either case (`2M` = `2m` = `2MB` = `2MiB`
/// = `2mb`), or a lone `B`; every spelling is binary (`1GB` is 2^30 bytes),
/// as the kernel's own `hugepages-2048kB` and `MemTotal: … kB` are.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let bad = || SizeError::Bad(s.to_string());
    let large = || SizeError::TooLarge(s.to_string());
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        return u64::from_str_radix(hex, 16).map_err(|_| large());
    }
    // The unit is the trailing non-digits, read from the end and as bytes
    // (no lowercased copy): every statement's addresses come here, and the
    // digits are checked once, by parse_decimal.
    let unit_len = s.bytes().rev().take_while(|b| !b.is_ascii_digit()).count();
    let (digits, unit) = s.split_at(s.len() - unit_len);
    let unit = unit.as_bytes();
    let unit = match unit {
        [rest @ .., b'b' | b'B'] => rest,
        u => u,
    };
    let shift = match unit {
        [] => 0,
        [k] | [k, b'i' | b'I'] => match k.to_ascii_lowercase() {
            b'k' => 10,
            b'm' => 20,
            b'g' => 30,
            b't' => 40,
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    let n = parse_decimal(digits).ok_or_else(bad)?.ok_or_else(large)?;
    n.checked_mul(1u64 << shift).ok_or_else(large)
}

impl FromStr for Size {
    type Err = SizeError;

    /// See [`parse_size`].
    fn from_str(s: &str) -> Result<Size, SizeError> {
        parse_size(s).map(Size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_common_spelling_is_binary() {
        for (text, bytes) in [
            ("4096", 4096),
            ("4096B", 4096),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("64kB", 64 << 10),
            ("64KiB", 64 << 10),
            ("2M", 2 << 20),
            ("2m", 2 << 20),
            ("2MB", 2 << 20),
            ("2mb", 2 << 20),
            ("2MiB", 2 << 20),
            ("2Mi", 2 << 20),
            ("2MIB", 2 << 20),
            ("1GiB", 1 << 30),
            ("512GB", 512 << 30),
            ("1T", 1 << 40),
            ("1TB", 1 << 40),
            ("0x1000", 4096),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn other_words_are_refused() {
        for text in [
            "", "M", "MB", "2Q", "2 MB", "2MBB", "2iB", "2Bi", "2ib", "+2M", "-2M", "1.5G", "0x",
            "0x1K", "2K2",
        ] {
            assert_eq!(
                parse_size(text),
                Err(SizeError::Bad(text.to_string())),
                "{text}"
            );
        }
        assert!(matches!(
            parse_size("16777216T"),
            Err(SizeError::TooLarge(_))
        ));
    }
}
