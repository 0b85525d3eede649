//! The page sizes hugelab works with, defined once for every crate: x86_64
//! with 4 KiB base pages, where a PMD maps 2 MiB. The model runs only this
//! shape (it refuses another `machine arch=` or `base_page=`), the kernel
//! backend's page walks and region placement (`placement`) assume it, and
//! the checker takes it as the base page until `machine base_page=` says
//! otherwise.

/// log2 of the base page size (x86_64 PAGE_SHIFT).
pub const PAGE_SHIFT: u32 = 12;
/// The base page size in bytes (4 KiB).
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// log2 of the range one PMD entry maps (x86_64 PMD_SHIFT).
pub const PMD_SHIFT: u32 = 21;
/// The range one PMD entry maps, in bytes (2 MiB): the PMD THP size.
pub const PMD_SIZE: u64 = 1 << PMD_SHIFT;
