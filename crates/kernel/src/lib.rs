//! The kernel backend: runs a workload on the real Linux kernel of this
//! machine and reads the kernel's own counters, so that every claim of the
//! model can be checked against the truth.
//!
//! - [`guard`]: the settings guard. Every tunable is journaled on disk before
//!   its first write and restored on success, error, panic and signal; it
//!   also turns DAMON's running kdamonds off for the run ([`damon`]).
//! - [`agent`]: the process agents. Each `spawn` is a real process executing
//!   the workload's statements on real memory; [`process`] is the runner's
//!   side, and [`protocol`] the requests and replies between them.
//! - readers: [`vmstat`] (/proc/vmstat, per-size stats, meminfo), [`smaps`],
//!   [`pagemap`] (folio shapes from pagemap + kpageflags).
//! - [`backend`]: the workload's statements, each handed to its handler in
//!   the module of its mechanism (`mmap`, `madvise`, `task`, ...), inside a
//!   measurement window (`measure`) over the workload's agents (`agents`).
//! - [`record`]: `hugelab record`'s capture of a real program (perf tracepoints).
//! - [`hugetlb`]: HugeTLB pools grown and shrunk with HVO off and on, timed,
//!   with the memmap and free-page counters around each write.
//!
//! Depends only on the workload crate, never on the model.

pub mod agent;
pub mod agent_task;
mod agents;
mod attribute;
pub mod backend;
mod call;
mod census;
pub mod command;
pub mod damon;
pub mod damon_view;
pub mod error;
mod filemap;
pub mod guard;
mod gup;
pub mod host_activity;
mod huge_memory;
pub mod hugetlb;
mod khugepaged;
pub mod machine;
mod madvise;
mod measure;
pub mod memcg;
pub mod meminit;
mod memory;
mod mmap;
mod modes;
mod mprotect;
mod mremap;
pub mod pagemap;
pub mod process;
pub mod procfile;
pub mod protocol;
pub mod record;
mod relocate;
pub mod run_as;
pub mod scan;
pub mod smaps;
mod spurious;
pub mod sysfs;
mod taints;
mod task;
mod tunable;
mod vmscan;
pub mod vmstat;

pub use backend::KernelBackend;
pub use error::{KernelError, Result};
