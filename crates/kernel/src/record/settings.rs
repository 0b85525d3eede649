//! The recorded tree's reads of the THP settings: which of its processes
//! read which file under /sys/kernel/mm/transparent_hugepage/ (`enabled`,
//! `defrag`, `hpage_pmd_size`, `hugepages-<size>kB/enabled`,
//! `khugepaged/*`). A program that adapts to the setting it sees (an
//! allocator or a runtime choosing its heap's alignment or its
//! MADV_HUGEPAGE calls) does in a replay what it did under the recording's
//! setting; the workload's header says which settings it read.
//!
//! The mechanism (Linux 6.18, fs/notify/fanotify): one fanotify group
//! (FAN_CLASS_NOTIF, an event with an open descriptor of the file), with a
//! mark on each directory of the tree asking for FAN_ACCESS of its children
//! (FAN_EVENT_ON_CHILD). `vfs_read` reports an access when a read returned
//! data (`fsnotify_access`), on sysfs as anywhere: the cost falls on reads
//! of these files only, and every other file is untouched (the marks are
//! on these inodes, not on the mount or the filesystem). An event carries
//! the reader's thread group id (in our pid namespace); the file is named
//! by its descriptor's link in /proc/self/fd. A file added to a watched
//! directory later is covered (the mark is the directory's); a directory
//! added later is not (the tree is made once, at boot, by `hugepage_init`).
//! Reads of the directories themselves (listing the mTHP sizes) are not
//! noted, only reads of the files.
//!
//! The group is closed when the [`Watch`] is dropped, and with it every
//! mark: nothing on the machine changes, and the process's exit closes it
//! on any path.

use crate::error::{KernelError, Result};
use serde::Serialize;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The tree the recorder watches.
pub const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

/// The start of the workload's header line naming the settings read
/// (followed by `<proc> <path>` pairs, comma separated, the path relative
/// to /sys/kernel/mm/).
pub const HEADER_PREFIX: &str = "THP settings read by the program: ";

/// A read of a THP setting by a process of the recorded tree.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct SettingRead {
    pub pid: u32,
    /// Which of the workload's processes with this pid (as
    /// [`super::MmStat::incarnation`]).
    pub incarnation: u32,
    /// Relative to /sys/kernel/mm/ (`transparent_hugepage/enabled`).
    pub path: String,
}

/// A fanotify group watching the reads of every file of a tree.
pub struct Watch {
    fd: OwnedFd,
    /// What paths are made relative to (the tree's parent).
    base: PathBuf,
    /// The kernel's queue overflowed: some reads were not reported.
    pub overflowed: bool,
}

impl Watch {
    /// Watches reads of the files of `root` and of its subdirectories.
    /// Needs CAP_SYS_ADMIN.
    pub fn open(root: &Path) -> Result<Watch> {
        let flags = libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK;
        let event_flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_LARGEFILE) as libc::c_uint;
        // SAFETY: plain syscall; the descriptor is owned below.
        let fd = unsafe { libc::fanotify_init(flags, event_flags) };
        if fd < 0 {
            return Err(os_error("fanotify_init"));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            mark(&fd, &dir)?;
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| KernelError::Refused(format!("cannot list {}: {e}", dir.display())))?;
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(entry.path());
                }
            }
        }
        Ok(Watch {
            fd,
            base: root.parent().unwrap_or(root).to_path_buf(),
            overflowed: false,
        })
    }

    /// Hands every read reported so far to `f` (the reader's pid, the
    /// file relative to the tree's parent), without blocking.
    pub fn drain(&mut self, mut f: impl FnMut(u32, String)) {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into a local buffer from our non-blocking group.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return;
            }
            let mut at = 0;
            let size = std::mem::size_of::<libc::fanotify_event_metadata>();
            while at + size <= n as usize {
                // SAFETY: the kernel wrote a whole metadata block here;
                // read_unaligned copes with the byte buffer's alignment.
                let m: libc::fanotify_event_metadata =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                if m.event_len < size as u32 {
                    return;
                }
                at += m.event_len as usize;
                if m.mask & libc::FAN_Q_OVERFLOW != 0 {
                    self.overflowed = true;
                }
                if m.fd < 0 {
                    continue;
                }
                // SAFETY: the event's descriptor is ours to close.
                let file = unsafe { OwnedFd::from_raw_fd(m.fd) };
                let link = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()));
                if let Ok(path) = link {
                    if let Ok(rel) = path.strip_prefix(&self.base) {
                        f(m.pid as u32, rel.to_string_lossy().into_owned());
                    }
                }
            }
        }
    }
}

fn mark(group: &OwnedFd, dir: &Path) -> Result<()> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| KernelError::Refused(format!("{} has a NUL byte", dir.display())))?;
    // SAFETY: a valid group, a NUL-terminated path.
    let r = unsafe {
        libc::fanotify_mark(
            group.as_raw_fd(),
            libc::FAN_MARK_ADD | libc::FAN_MARK_ONLYDIR,
            libc::FAN_ACCESS | libc::FAN_EVENT_ON_CHILD,
            libc::AT_FDCWD,
            path.as_ptr(),
        )
    };
    if r != 0 {
        return Err(os_error(&format!("fanotify_mark of {}", dir.display())));
    }
    Ok(())
}

fn os_error(what: &str) -> KernelError {
    KernelError::Refused(format!("{what} failed: {}", io::Error::last_os_error()))
}

/// The reads named as the workload names its processes: `named` is each
/// process's pid and name in order of creation (a pid the kernel reused
/// names another process, the next with that pid). Each (process, path)
/// once, in the order first read; reads by no process of the workload (the
/// command before its exec) are left out.
pub fn by_process(named: &[(u32, String)], reads: &[SettingRead]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for r in reads {
        let name = named
            .iter()
            .filter(|(pid, _)| *pid == r.pid)
            .nth(r.incarnation as usize)
            .map(|(_, n)| n);
        if let Some(name) = name {
            let pair = (name.clone(), r.path.clone());
            if !out.contains(&pair) {
                out.push(pair);
            }
        }
    }
    out
}

/// The header line naming them (without the comment's `# `), or None when
/// the program read none.
pub fn header_line(reads: &[(String, String)]) -> Option<String> {
    if reads.is_empty() {
        return None;
    }
    let pairs: Vec<String> = reads.iter().map(|(p, f)| format!("{p} {f}")).collect();
    Some(format!("{HEADER_PREFIX}{}", pairs.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pid: u32, incarnation: u32, path: &str) -> SettingRead {
        SettingRead {
            pid,
            incarnation,
            path: path.into(),
        }
    }

    #[test]
    fn reads_are_named_by_process_once_each_in_order() {
        let named = [
            (10, "sh".to_string()),
            (11, "java".to_string()),
            (12, "cat".to_string()),
            // pid 11 reused by a later process.
            (11, "cat-2".to_string()),
        ];
        let reads = [
            read(11, 0, "transparent_hugepage/enabled"),
            read(10, 0, "transparent_hugepage/hpage_pmd_size"),
            read(11, 0, "transparent_hugepage/enabled"),
            read(11, 1, "transparent_hugepage/enabled"),
            // Not a process of the workload.
            read(99, 0, "transparent_hugepage/defrag"),
            read(12, 1, "transparent_hugepage/defrag"),
        ];
        let named_reads = by_process(&named, &reads);
        let pair = |p: &str, f: &str| (p.to_string(), f.to_string());
        assert_eq!(
            named_reads,
            [
                pair("java", "transparent_hugepage/enabled"),
                pair("sh", "transparent_hugepage/hpage_pmd_size"),
                pair("cat-2", "transparent_hugepage/enabled"),
            ]
        );
        assert_eq!(
            header_line(&named_reads).unwrap(),
            "THP settings read by the program: java transparent_hugepage/enabled, \
             sh transparent_hugepage/hpage_pmd_size, cat-2 transparent_hugepage/enabled"
        );
    }

    #[test]
    fn no_reads_no_line() {
        assert_eq!(header_line(&[]), None);
        assert!(by_process(&[(1, "a".into())], &[]).is_empty());
    }

    #[test]
    fn one_read_is_one_pair() {
        let reads = [(
            "python3_11".to_string(),
            "transparent_hugepage/enabled".to_string(),
        )];
        assert_eq!(
            header_line(&reads).unwrap(),
            "THP settings read by the program: python3_11 transparent_hugepage/enabled"
        );
    }

    /// The watch on a made-up tree (fanotify needs root; skipped otherwise):
    /// a child's reads are reported with its pid and the file's path, a file
    /// added later to a watched directory too, an open without a read and
    /// a read of a file outside the tree are not; no descriptor is left.
    #[test]
    fn a_childs_reads_of_the_tree_are_reported_with_its_pid() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: fanotify needs root");
            return;
        }
        let top = std::env::temp_dir().join(format!("hugelab-settings-{}", std::process::id()));
        let root = top.join("transparent_hugepage");
        std::fs::create_dir_all(root.join("hugepages-64kB")).unwrap();
        std::fs::write(root.join("enabled"), "always [madvise] never\n").unwrap();
        std::fs::write(root.join("hugepages-64kB/enabled"), "never\n").unwrap();
        std::fs::write(top.join("other"), "x\n").unwrap();
        // Other tests' threads open files meanwhile: the group is looked
        // for by what it is, and the events' descriptors by what they name.
        let open = |what: &str| {
            std::fs::read_dir("/proc/self/fd").unwrap().any(|e| {
                std::fs::read_link(e.unwrap().path())
                    .is_ok_and(|l| l.to_string_lossy().contains(what))
            })
        };
        let mut w = Watch::open(&root).unwrap();
        std::fs::write(root.join("defrag"), "madvise\n").unwrap();
        let sh = |script: &str| {
            let child = std::process::Command::new("sh")
                .args(["-c", script])
                .current_dir(&top)
                .spawn()
                .unwrap();
            let pid = child.id();
            assert!(child.wait_with_output().unwrap().status.success());
            pid
        };
        let reader = sh(
            "read a < transparent_hugepage/enabled; read b < transparent_hugepage/hugepages-64kB/enabled; \
             read c < transparent_hugepage/defrag; read d < other",
        );
        let opener = sh(": < transparent_hugepage/enabled");
        let mut got = Vec::new();
        w.drain(|pid, path| got.push((pid, path)));
        assert!(open("anon_inode:[fanotify]"), "the group while watching");
        drop(w);
        let _ = std::fs::remove_dir_all(&top);
        assert!(!got.iter().any(|(pid, _)| *pid == opener), "{got:?}");
        got.dedup();
        let read = |p: &str| (reader, p.to_string());
        assert_eq!(
            got,
            [
                read("transparent_hugepage/enabled"),
                read("transparent_hugepage/hugepages-64kB/enabled"),
                read("transparent_hugepage/defrag"),
            ]
        );
        assert!(!open("anon_inode:[fanotify]"), "the group is closed");
        assert!(
            !open("hugelab-settings-"),
            "the events' descriptors are closed"
        );
    }
}
