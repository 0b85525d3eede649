//! The workload's files on the kernel (`mmap ... file=<name>`): each name is
//! one memfd (shmem, `memfd_create(name)`), created by the runner at the
//! first mapping that names it and shared by every agent that maps it (the
//! runner passes the descriptor with the request, SCM_RIGHTS), so that every
//! process mapping `libc.so.6` maps the same page cache, as on the machine the
//! program was recorded on. A file is as long as the largest offset + size
//! any mapping of it used so far, and fully written: every page of it is in
//! the page cache before the mapping that first covers it is made (the
//! recorded program's libraries were cached; a memfd's pages exist once
//! written). Its pages are order 0 because shmem_enabled is `never` (and
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

/// What a new file's pages are written with (anything: the counters do not
/// look at contents; not zero, as a program's text is not).
static FILL: [u8; 1 << 16] = [0x5a; 1 << 16];

impl Files {
    /// The descriptor of `name`, created (or grown) so that it is at least
    /// `end` bytes long and every page of it is in the page cache.
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
            fill(fd.as_raw_fd(), *len, end).map_err(|e| {
                failed(
                    stmt,
                    format!("writing file '{name}' (a memfd) to {end} bytes: {e}"),
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

/// Writes `[from, to)` of the file, which then holds every page of it.
fn fill(fd: RawFd, from: u64, to: u64) -> std::io::Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(FILL.len() as u64) as usize;
        // SAFETY: pwrite from a static buffer.
        let w = unsafe { libc::pwrite(fd, FILL.as_ptr().cast(), n, at as i64) };
        if w < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        at += w as u64;
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
