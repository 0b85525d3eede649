//! The kernel backend: runs a workload on the real Linux kernel of this
//! machine and reads the kernel's own counters, so that every claim of the
//! model can be checked against the truth.
//!
//! - [`guard`]: the settings guard. Every tunable is journaled on disk before
//!   its first write and restored on success, error, panic and signal.
//! - [`agent`]: the process agents. Each `spawn` is a real process executing
//!   the workload's statements on real memory; [`process`] is the runner's
//!   side, and [`protocol`] the requests and replies between them.
//! - readers: [`vmstat`] (/proc/vmstat, per-size stats, meminfo), [`smaps`],
//!   [`pagemap`] (folio shapes from pagemap + kpageflags).
//! - [`hugetlb`]: HugeTLB pools grown and shrunk with HVO off and on, timed,
//!   with the memmap and free-page counters around each write.
//!
//! Depends only on the workload crate, never on the model.

pub mod agent;
pub mod backend;
pub mod command;
pub mod error;
pub mod guard;
pub mod hugetlb;
mod khugepaged;
mod measure;
pub mod memcg;
pub mod pagemap;
pub mod process;
pub mod protocol;
pub mod scan;
pub mod smaps;
pub mod sysfs;
pub mod vmstat;

pub use backend::KernelBackend;
pub use error::{KernelError, Result};
