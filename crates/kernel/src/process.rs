//! The runner's side of a process agent: starting it, sending it requests,
//! forking it and seeing it gone. See [`crate::agent`] for the other side.
//!
//! Every live agent's pid is kept in a registry, so that the settings guard's
//! signal path can kill them before it restores hugetlb pools (pages still
//! mapped by an agent would keep a pool from shrinking).

use crate::error::{KernelError, Result};
use crate::procfile::ProcFile;
use crate::protocol::{Reply, ReplyWire, Request, RequestWire};
use hugelab_workload::Errno;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static LIVE: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Kills every live agent and waits (up to 10 s) until they are gone: the
/// guard's cleanup hook on SIGINT/SIGTERM, run before hugetlb pools shrink.
pub fn kill_all() {
    let pids = LIVE.lock().map(|v| v.clone()).unwrap_or_default();
    for &pid in &pids {
        // SAFETY: signals a process we started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in pids {
        // SAFETY: reaps our own child if it is one; kill(pid, 0) only checks.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn register(pid: i32) {
    if let Ok(mut v) = LIVE.lock() {
        v.push(pid);
    }
}

fn unregister(pid: i32) {
    if let Ok(mut v) = LIVE.lock() {
        v.retain(|p| *p != pid);
    }
}

/// One agent process and the runner's end of its channel, or (`tid` not
/// 0) one of its threads and the runner's end of that thread's channel.
pub struct AgentProc {
    pub pid: i32,
    /// The thread's id, 0 for the process's first task.
    pub tid: i32,
    chan: OwnedFd,
    /// The runner's child (spawned), as opposed to a forked grandchild that
    /// its parent agent reaps.
    child: Option<Child>,
    /// Faults the agent reported in its hello (start-up or the fork).
    pub hello_faults: i64,
    /// The agent's minor faults (/proc/PID/stat) when its current request
    /// was sent, for a spawned agent killed without a last word.
    minflt_at_request: Option<i64>,
    /// Its /proc/PID/stat, kept open (read at each request of a spawned
    /// agent), and a buffer for it.
    stat: Option<(ProcFile, Vec<u8>)>,
}

fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two fds we then own.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(KernelError::Agent(format!(
            "cannot create an agent channel: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: both fds are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Runs `f` (a spawn) with ADDR_NO_RANDOMIZE set on this thread, so that
/// the agent it starts is laid out at the kernel's fixed, non-random
/// addresses (its binary at 0x555555554000, its libraries and stack at the
/// very top of the address space), where a recorded program's mappings,
/// placed at random over about a terabyte, almost never are. The
/// persona is inherited through posix_spawn's vfork and kept across exec.
fn without_aslr<T>(f: impl FnOnce() -> T) -> T {
    const QUERY: libc::c_ulong = 0xffff_ffff;
    // SAFETY: personality only reads or sets this thread's persona.
    let old = unsafe { libc::personality(QUERY) };
    if old >= 0 {
        // SAFETY: as above.
        unsafe {
            libc::personality(old as libc::c_ulong | libc::ADDR_NO_RANDOMIZE as libc::c_ulong)
        };
    }
    let r = f();
    if old >= 0 {
        // SAFETY: as above.
        unsafe { libc::personality(old as libc::c_ulong) };
    }
    r
}

impl AgentProc {
    /// Starts `exe __agent <fd> <pid>`; the agent disables THP for its own
    /// start-up and dies with the runner (see [`crate::agent::agent_main`]).
    pub fn spawn(exe: &Path) -> Result<AgentProc> {
        let (ours, theirs) = seqpacket_pair()?;
        let fd = theirs.as_raw_fd();
        // The agent's end must survive exec; no pre_exec hook (that would
        // make std fork instead of posix_spawn, write-protecting the runner's
        // memory), so clear FD_CLOEXEC here. The CLI runs one thread, so no
        // other spawn can inherit it meanwhile.
        // SAFETY: fcntl on an fd we own.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
            return Err(KernelError::Agent(format!(
                "cannot pass the agent channel: {}",
                std::io::Error::last_os_error()
            )));
        }
        let mut cmd = Command::new(exe);
        cmd.arg("__agent")
            .arg(fd.to_string())
            .arg(std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let child = without_aslr(|| cmd.spawn()).map_err(|e| {
            KernelError::Agent(format!("cannot start the agent {}: {e}", exe.display()))
        })?;
        drop(theirs);
        let pid = child.id() as i32;
        register(pid);
        let mut agent = AgentProc {
            pid,
            tid: 0,
            chan: ours,
            child: Some(child),
            hello_faults: 0,
            minflt_at_request: None,
            stat: None,
        };
        let hello = agent.recv()?;
        agent.hello_faults = hello.all_faults;
        Ok(agent)
    }

    /// Sends one request and waits for its reply. A reply with a signal is
    /// the agent's last word (it is dying of the signal): it is returned
    /// once the agent is gone, its memory freed.
    pub fn request(&mut self, req: Request) -> Result<Reply> {
        self.request_passing(req, None)
    }

    /// [`AgentProc::request`], passing the descriptor `pass` with it
    /// (SCM_RIGHTS): the file a [`Request::MmapFile`] maps.
    pub fn request_passing(&mut self, req: Request, pass: Option<RawFd>) -> Result<Reply> {
        if self.child.is_some() {
            let pid = self.pid;
            let (file, buf) = self.stat.get_or_insert_with(|| {
                (
                    ProcFile::single(format!("/proc/{pid}/stat")),
                    Vec::with_capacity(1024),
                )
            });
            self.minflt_at_request = file
                .read_into(buf)
                .ok()
                .and_then(|()| stat_minflt(&String::from_utf8_lossy(buf)));
        }
        self.send(&req, pass)?;
        let reply = self.recv()?;
        if reply.signal != 0 {
            self.wait_gone(Duration::from_secs(30))?;
        }
        Ok(reply)
    }

    /// Forks the agent: returns the new agent and the parent's reply.
    pub fn fork(&mut self) -> Result<(AgentProc, Reply)> {
        let (ours, theirs) = seqpacket_pair()?;
        self.send(&Request::Fork, Some(theirs.as_raw_fd()))?;
        let reply = self.recv()?;
        drop(theirs);
        if reply.errno != Errno::OK {
            return Err(KernelError::Agent(format!("fork failed: {}", reply.errno)));
        }
        let pid = reply.value as i32;
        register(pid);
        let mut child = AgentProc {
            pid,
            tid: 0,
            chan: ours,
            child: None,
            hello_faults: 0,
            minflt_at_request: None,
            stat: None,
        };
        let hello = child.recv()?;
        child.hello_faults = hello.all_faults;
        Ok((child, reply))
    }

    /// Starts a thread in the agent: the thread's own channel.
    pub fn thread(&mut self) -> Result<AgentProc> {
        let (ours, theirs) = seqpacket_pair()?;
        self.send(&Request::Thread, Some(theirs.as_raw_fd()))?;
        let reply = self.recv()?;
        drop(theirs);
        if reply.errno == Errno::EAGAIN {
            return Err(KernelError::Agent(format!(
                "cannot start a thread: the kernel backend's agent runs at most {} threads of a process at once",
                crate::agent_task::SLOTS
            )));
        }
        if reply.errno != Errno::OK {
            return Err(KernelError::Agent(format!(
                "cannot start a thread: {}",
                reply.errno
            )));
        }
        let mut thread = AgentProc {
            pid: self.pid,
            tid: 0,
            chan: ours,
            child: None,
            hello_faults: 0,
            minflt_at_request: None,
            stat: None,
        };
        let hello = thread.recv()?;
        thread.tid = hello.value as i32;
        Ok(thread)
    }

    /// The agent executes itself again (execve), keeping its channel: back
    /// when the new image has set itself up and said hello.
    pub fn exec(&mut self) -> Result<()> {
        self.send(&Request::Exec, None)?;
        let hello = self.recv()?;
        if hello.errno != Errno::OK {
            return Err(KernelError::Agent(format!(
                "execve failed: {}",
                hello.errno
            )));
        }
        self.hello_faults = hello.all_faults;
        Ok(())
    }

    /// Tells the agent to exit and waits until the process is gone, so that
    /// the teardown of its own memory is over before the next measurement;
    /// a thread's channel: until that thread is gone.
    pub fn exit(mut self) -> Result<()> {
        let _ = self.send(&Request::Exit, None);
        self.wait_gone(Duration::from_secs(30))
    }

    fn wait_gone(&mut self, timeout: Duration) -> Result<()> {
        let pid = self.pid;
        if self.tid != 0 {
            // A thread: gone when its task is, or when its process died
            // (a zombie its parent reaps).
            let deadline = Instant::now() + timeout;
            let task = format!("/proc/{pid}/task/{}", self.tid);
            while Path::new(&task).exists() && !exited(pid) {
                if Instant::now() > deadline {
                    return Err(KernelError::Agent(format!(
                        "thread {} of agent pid {pid} did not exit within {timeout:?}",
                        self.tid
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            self.pid = -1;
            return Ok(());
        }
        if let Some(child) = self.child.as_mut() {
            let _ = child.wait();
        } else {
            let deadline = Instant::now() + timeout;
            // A forked agent is its parent agent's child, reaped by the kernel
            // (SIGCHLD ignored there): gone once kill(pid, 0) says ESRCH.
            // SAFETY: signal 0 only checks existence.
            while unsafe { libc::kill(pid, 0) } == 0 {
                if Instant::now() > deadline {
                    return Err(KernelError::Agent(format!(
                        "agent pid {pid} did not exit within {timeout:?}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        unregister(pid);
        self.pid = -1;
        Ok(())
    }

    fn send(&mut self, req: &Request, pass: Option<RawFd>) -> Result<()> {
        let wire: RequestWire = req.encode();
        let mut iov = libc::iovec {
            iov_base: wire.as_ptr() as *mut _,
            iov_len: std::mem::size_of::<RequestWire>(),
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: sendmsg from buffers we own; the control message carries one fd.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            if let Some(fd) = pass {
                msg.msg_control = cbuf.as_mut_ptr().cast();
                msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
            }
            libc::sendmsg(self.chan.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
        };
        if n < 0 {
            return Err(self.died(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<Reply> {
        let mut wire = ReplyWire::default();
        loop {
            // SAFETY: recv into a buffer we own.
            let n = unsafe {
                libc::recv(
                    self.chan.as_raw_fd(),
                    wire.as_mut_ptr().cast(),
                    std::mem::size_of::<ReplyWire>(),
                    0,
                )
            };
            if n == std::mem::size_of::<ReplyWire>() as isize {
                return Ok(Reply::decode(&wire));
            }
            let err = std::io::Error::last_os_error();
            if n < 0 && err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(self.died(err));
        }
    }

    /// The agent closed its channel: say how it died. A spawned agent's
    /// exit status is known: killed by a signal, it is
    /// [`KernelError::Killed`] (and gone).
    fn died(&mut self, err: std::io::Error) -> KernelError {
        let pid = self.pid;
        let mut faults = None;
        let (how, signal) = match self.child.as_mut().map(|_| wait4(pid)) {
            Some(Ok((status, minflt))) => {
                use std::os::unix::process::ExitStatusExt;
                faults = self.minflt_at_request.map(|at| minflt - at);
                let status = std::process::ExitStatus::from_raw(status);
                let sig = status.signal();
                let how = match sig {
                    Some(libc::SIGSEGV) => {
                        "was killed by SIGSEGV (an access the protection forbids)".to_string()
                    }
                    Some(libc::SIGBUS) => {
                        "was killed by SIGBUS (no memory to back the access)".to_string()
                    }
                    Some(libc::SIGKILL) => "was killed by SIGKILL (out of memory?)".to_string(),
                    Some(sig) => format!("was killed by signal {sig}"),
                    None => format!("exited with {status}"),
                };
                self.pid = -1; // reaped: nothing to kill or wait for any more
                (how, sig)
            }
            _ => (
                format!(
                    "stopped answering ({})",
                    err.raw_os_error()
                        .map_or(err.to_string(), |n| Errno(n).to_string())
                ),
                None,
            ),
        };
        unregister(pid);
        let message = format!("agent pid {pid} {how}");
        match signal {
            Some(signal) => KernelError::Killed {
                signal,
                message,
                faults,
            },
            None => KernelError::Agent(message),
        }
    }
}

/// waitpid with the child's resource usage: (wait status, minor faults).
fn wait4(pid: i32) -> std::io::Result<(i32, i64)> {
    let mut status = 0;
    // SAFETY: wait4 writes into the two locals; pid is our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: see above.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            return Ok((status, usage.ru_minflt));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Whether process `pid` has exited (gone, or a zombie: /proc/PID/stat
/// state Z or X).
pub fn exited(pid: i32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = text
        .rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().next());
    matches!(state, Some("Z" | "X") | None)
}

/// Field 10 (minflt) of a /proc/PID/stat line.
pub(crate) fn stat_minflt<T: std::str::FromStr>(text: &str) -> Option<T> {
    // The command name may hold spaces: count fields after its ')'.
    text.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(7)?
        .parse()
        .ok()
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        // A thread's channel closes: the thread ends, the process goes on.
        if self.pid > 0 && self.tid == 0 {
            // SAFETY: kills a process we started.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = self.wait_gone(Duration::from_secs(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minflt_is_the_tenth_field_whatever_the_command_name() {
        let line = "4242 (a) b) S 1 4242 4242 0 -1 4194560 1234 0 0 0 5 3 0 0 20 0";
        assert_eq!(stat_minflt::<i64>(line), Some(1234));
        assert_eq!(stat_minflt::<i64>("4242 (x) S 1"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(stat_minflt::<i64>(&own).is_some_and(|n| n > 0));
        let nested = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 1234 0 5 0 1 2";
        assert_eq!(stat_minflt::<u64>(nested), Some(1234));
    }
}
