//! The recorded command: found on PATH, forked with THP disabled for its
//! whole tree (PR_SET_THP_DISABLE is inherited by fork and kept across
//! exec) and under the seccomp filter that stops each exec at its entry
//! for the tracer ([`super::exits`]), as the invoking user under sudo, held
//! before exec until the recorder's events are open and it is traced, and
//! waited for with every descendant (hugelab is the tree's child subreaper
//! and its tracer).

use super::exits::{self, Tracer};
use crate::error::{KernelError, Result};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A forked child waiting to exec.
pub struct Child {
    pub pid: libc::pid_t,
    /// Written once to let the child exec.
    go: libc::c_int,
    /// Carries the child's errno if exec fails; EOF once exec succeeded.
    failed: libc::c_int,
    program: String,
}

/// The user the command runs as: SUDO_UID/SUDO_GID with the user's groups,
/// or None to stay root.
struct User {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

/// Finds `program` as execvp would: a path if it holds a slash, else on PATH.
pub fn resolve(program: &str) -> Result<PathBuf> {
    let runnable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return if runnable(&p) {
            Ok(p)
        } else {
            Err(KernelError::Refused(format!(
                "cannot run {program}: no such executable file"
            )))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| runnable(p))
        .ok_or_else(|| KernelError::Refused(format!("no command {program} found on PATH")))
}

fn cstring(s: &OsStr) -> Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| KernelError::Refused(format!("{s:?} holds a NUL byte")))
}

/// Forks the child: THP disabled, the invoking user's ids, then it waits
/// for [`Child::start`].
pub fn spawn(argv: &[String]) -> Result<Child> {
    let path = resolve(&argv[0])?;
    let path_c = cstring(path.as_os_str())?;
    let args: Vec<CString> = argv
        .iter()
        .map(|a| cstring(OsStr::new(a)))
        .collect::<Result<_>>()?;
    let mut arg_ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    arg_ptrs.push(std::ptr::null());
    let user = sudo_user()?;
    let go = pipe()?;
    let failed = pipe().inspect_err(|_| close_pair(go))?;
    // SAFETY: the child only makes async-signal-safe calls before exec.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        close_pair(go);
        close_pair(failed);
        return Err(os_error("fork"));
    }
    if pid == 0 {
        // SAFETY: in the child: raw syscalls on memory prepared before fork.
        unsafe { child(go[0], failed[1], &path_c, &arg_ptrs, user.as_ref()) };
    }
    // SAFETY: closing the child's ends in the parent.
    unsafe {
        libc::close(go[0]);
        libc::close(failed[1]);
    }
    Ok(Child {
        pid,
        go: go[1],
        failed: failed[0],
        program: argv[0].clone(),
    })
}

/// The child's side; never returns.
unsafe fn child(
    go: libc::c_int,
    failed: libc::c_int,
    path: &CString,
    argv: &[*const libc::c_char],
    user: Option<&User>,
) -> ! {
    let fail = |errno: i32| -> ! {
        libc::write(failed, (&errno as *const i32).cast(), 4);
        libc::_exit(127)
    };
    // Rust ignores SIGPIPE and an ignored signal survives exec: the command
    // gets the default back, as std::process::Command gives it.
    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    if libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0 {
        fail(*libc::__errno_location());
    }
    // While still root (CAP_SYS_ADMIN: no need for no_new_privs, so setuid
    // programs keep working in the tree).
    let prog = libc::sock_fprog {
        len: exits::EXEC_FILTER.len() as libc::c_ushort,
        filter: exits::EXEC_FILTER.as_ptr().cast_mut(),
    };
    if libc::prctl(
        libc::PR_SET_SECCOMP,
        libc::SECCOMP_MODE_FILTER as libc::c_ulong,
        &prog as *const libc::sock_fprog,
    ) != 0
    {
        fail(*libc::__errno_location());
    }
    if let Some(u) = user {
        if libc::setgroups(u.groups.len(), u.groups.as_ptr()) != 0
            || libc::setgid(u.gid) != 0
            || libc::setuid(u.uid) != 0
        {
            fail(*libc::__errno_location());
        }
    }
    let mut byte = 0u8;
    if libc::read(go, (&mut byte as *mut u8).cast(), 1) != 1 {
        // The recorder gave up before starting us.
        libc::_exit(127);
    }
    libc::execv(path.as_ptr(), argv.as_ptr());
    fail(*libc::__errno_location())
}

impl Child {
    /// Seizes the child with `tracer` and lets it exec, following it until
    /// its exec is reported; an exec that fails is an error (the child has
    /// then exited and been reaped).
    pub fn start(mut self, tracer: &mut Tracer) -> Result<libc::pid_t> {
        tracer.seize(self.pid)?;
        let byte = 1u8;
        // SAFETY: writes one byte to our pipe, then closes it.
        unsafe {
            libc::write(self.go, (&byte as *const u8).cast(), 1);
            libc::close(self.go);
        }
        self.go = -1;
        while !tracer.root_execed && tracer.wait_root() {}
        let mut errno = 0i32;
        // SAFETY: reads at most 4 bytes into errno.
        let n = unsafe { libc::read(self.failed, (&mut errno as *mut i32).cast(), 4) };
        if n == 4 {
            // Its exit is reaped by now (or it is killed and reaped here).
            while tracer.wait_root() {}
            return Err(KernelError::Refused(format!(
                "cannot run {}: {}",
                self.program,
                io::Error::from_raw_os_error(errno)
            )));
        }
        Ok(self.pid)
    }
}

impl Drop for Child {
    /// A child never started: closing `go` makes it exit; reap it.
    fn drop(&mut self) {
        // SAFETY: closes our pipe ends.
        unsafe {
            if self.go >= 0 {
                libc::close(self.go);
                reap(self.pid);
            }
            libc::close(self.failed);
        }
    }
}

fn reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

fn pipe() -> Result<[libc::c_int; 2]> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os_error("pipe2"));
    }
    Ok(fds)
}

fn close_pair(fds: [libc::c_int; 2]) {
    // SAFETY: closes descriptors we created.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

fn os_error(what: &str) -> KernelError {
    KernelError::Refused(format!("{what} failed: {}", io::Error::last_os_error()))
}

/// SUDO_UID and SUDO_GID with that user's supplementary groups, when
/// hugelab runs as root under sudo for a user other than root.
fn sudo_user() -> Result<Option<User>> {
    let id = |name| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let (Some(uid), Some(gid)) = (id("SUDO_UID"), id("SUDO_GID")) else {
        return Ok(None);
    };
    if uid == 0 {
        return Ok(None);
    }
    let mut groups = vec![gid];
    if let Some(name) = std::env::var_os("SUDO_USER").and_then(|n| CString::new(n.as_bytes()).ok())
    {
        let mut n: libc::c_int = 64;
        // A user in more groups than there is room for: -1 and n says how many.
        for _ in 0..2 {
            let mut list = vec![0 as libc::gid_t; n.max(1) as usize];
            // SAFETY: list has room for n groups; n is updated to the count.
            let r = unsafe { libc::getgrouplist(name.as_ptr(), gid, list.as_mut_ptr(), &mut n) };
            if r >= 0 {
                list.truncate(n as usize);
                groups = list;
                break;
            }
        }
    }
    Ok(Some(User { uid, gid, groups }))
}

/// Makes this process the child subreaper of what it starts (orphans of the
/// recorded tree become our children, so every descendant is waited for),
/// or stops it.
pub fn set_subreaper(on: bool) {
    // SAFETY: plain prctl.
    unsafe {
        libc::prctl(
            libc::PR_SET_CHILD_SUBREAPER,
            libc::c_ulong::from(on),
            0,
            0,
            0,
        )
    };
}

/// Sends SIGKILL to every child of this process, without waiting: an
/// interrupted recording's round, repeated until the tree is gone (orphans
/// come to us, the subreaper, and are killed at the next round).
pub fn kill_children() {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    for pid in children_of(me) {
        // SAFETY: signals our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    exits::kill_traced();
}

/// Kills and reaps every child and tracee of this process, and the orphans
/// that then become its children, until none is left (the signal path's
/// cleanup, on another thread than the tracer's: it may reap but not
/// resume; a killed tracee needs no resuming). Gives up after about two
/// seconds: the tracees left die with hugelab (PTRACE_O_EXITKILL).
pub fn kill_all_children() {
    for _ in 0..400 {
        kill_children();
        loop {
            // SAFETY: reaps any child or tracee that is gone, without blocking.
            let r =
                unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG | libc::__WALL) };
            if r < 0 {
                return;
            }
            if r == 0 {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The processes whose parent is `parent` (/proc/PID/stat's 4th field).
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                // After the comm's closing parenthesis: state, ppid.
                s.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
                    == Some(parent)
            })
        })
        .collect()
}
