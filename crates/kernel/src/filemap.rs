//! The workload's files on the kernel (`mmap ... file=<name>`): each name is
//! one memfd (shmem, `memfd_create(name)`), created by the runner at the
//! first mapping that names it and shared by every agent that maps it (the
//! runner passes the descriptor with the request, SCM_RIGHTS), so that every
//! process mapping `libc.so.6` maps the same page cache, as on the machine the
//! program was recorded on. A file is as long as the largest offset + size
//! any mapping of it used so far (`ftruncate` before the mapping that first
//! needs it), and nothing is written to it: its page cache starts empty and
//! a page comes in, zero-filled, at the first fault on it from any process
//! (shmem_fault allocates in a hole, for a read fault and for the source
//! page of a write's do_cow_fault), so fault-around (filemap_map_pages maps
//! only pages already in the page cache) maps only pages some earlier fault
//! brought in, and a recorded program's replayed reads fault where it did.
//! The recorded program's contents are not needed: the counters do not look
//! at them. Each page is charged to the memory cgroup of the process whose
//! fault brought it in (shmem_alloc_and_add_folio), not to the runner's.
//! Its pages are order 0 because shmem_enabled is `never` (and
//! every `hugepages-<N>kB/shmem_enabled` `never`, or `inherit` of it): the
//! backend checks that before it creates a file and refuses otherwise.
//!
//! Nothing remains after a run: a memfd is freed when its last descriptor
//! and mapping go, and the runner's descriptors close with the runner, on
//! every exit path (SIGKILL too), the agents' mappings with the agents.

use crate::call::failed;
use hugelab_workload::{BackendError, Stmt};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The workload's files by name: a memfd each, and its length so far.
#[derive(Default)]
pub(crate) struct Files {
    files: BTreeMap<String, (OwnedFd, u64)>,
}

impl Files {
    /// The descriptor of `name`, created (or grown: `ftruncate`, no page
    /// written) so that it is at least `end` bytes long.
    pub(crate) fn at_least(
        &mut self,
        stmt: &Stmt,
        name: &str,
        end: u64,
    ) -> Result<RawFd, BackendError> {
        if !self.files.contains_key(name) {
            refuse_large_shmem_folios(stmt)?;
            let fd = memfd(name).map_err(|e| failed(stmt, format!("memfd_create({name}): {e}")))?;
            self.files.insert(name.to_string(), (fd, 0));
        }
        let (fd, len) = self.files.get_mut(name).expect("just inserted");
        if *len < end {
            truncate(fd.as_raw_fd(), end).map_err(|e| {
                failed(
                    stmt,
                    format!("growing file '{name}' (a memfd) to {end} bytes: {e}"),
                )
            })?;
            *len = end;
        }
        Ok(fd.as_raw_fd())
    }
}

/// memfd_create(name, MFD_CLOEXEC).
fn memfd(name: &str) -> std::io::Result<OwnedFd> {
    let cname = CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated name; the new fd is ours.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is fresh.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// ftruncate(fd, len): the file grows by holes, no page of it comes in.
fn truncate(fd: RawFd, len: u64) -> std::io::Result<()> {
    let len = i64::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: a plain syscall on our descriptor.
    if unsafe { libc::ftruncate(fd, len) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A memfd's page cache holds large folios unless shmem_enabled is `never`
/// (or `deny`) and no size's own `shmem_enabled` says otherwise; the model
/// has order-0 page cache only, so anything else is refused (for a shared
/// anonymous mapping too: its shmem object follows the same settings).
pub(crate) fn refuse_large_shmem_folios(stmt: &Stmt) -> Result<(), BackendError> {
    let dir = "/sys/kernel/mm/transparent_hugepage";
    let chosen = |path: &str| -> Option<String> {
        let text = std::fs::read_to_string(path).ok()?;
        let word = text.split_whitespace().find(|w| w.starts_with('['))?;
        Some(word.trim_matches(['[', ']']).to_string())
    };
    let top = chosen(&format!("{dir}/shmem_enabled"));
    if let Some(top) = &top {
        if top != "never" && top != "deny" {
            return Err(refusal(stmt, "shmem_enabled", top));
        }
    }
    let sizes = std::fs::read_dir(dir).into_iter().flatten().flatten();
    for entry in sizes {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("hugepages-") {
            continue;
        }
        let path = format!("{dir}/{name}/shmem_enabled");
        if let Some(v) = chosen(&path) {
            if v != "never" && v != "inherit" {
                return Err(refusal(stmt, &format!("{name}/shmem_enabled"), &v));
            }
        }
    }
    Ok(())
}

fn refusal(stmt: &Stmt, file: &str, value: &str) -> BackendError {
    failed(
        stmt,
        format!(
            "file= and shared anonymous mappings need order-0 shmem page cache, but transparent_hugepage/{file} is \
             {value} here; set it to never to run this workload"
        ),
    )
}
