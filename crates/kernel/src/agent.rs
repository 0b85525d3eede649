//! The process agent: the program behind every `spawn`. It executes the
//! statements the runner sends it on real memory, so that the kernel does the
//! faulting, and reports the faults its own accesses took.
//!
//! The agent must not disturb the counters it is measured by, so:
//! - it starts with PR_SET_THP_DISABLE (set by the runner before exec, and
//!   inherited), marks every private writable mapping it owns MADV_NOHUGEPAGE,
//!   and only then clears PR_SET_THP_DISABLE: its own memory never becomes a
//!   THP, while the workload's regions follow the workload's settings;
//! - after start-up it never allocates: requests and replies are fixed-size
//!   messages on a SOCK_SEQPACKET socket, read into buffers on a stack that was
//!   touched in advance (also again right after `fork`, whose COW faults on
//!   the agent's own stack then belong to the fork, not to a later access);
//! - faults are counted with getrusage around the access loop only
//!   (`loop_faults`), and around the whole request (`all_faults`), which the
//!   runner compares with the system-wide pgfault to detect other processes.

use std::hint::black_box;
use std::os::fd::RawFd;

/// Request opcodes. A request is `[op, a0..a6]` as u64s.
pub mod op {
    pub const MMAP: u64 = 1;
    pub const MUNMAP: u64 = 2;
    pub const MPROTECT: u64 = 3;
    pub const MADVISE: u64 = 4;
    pub const TOUCH: u64 = 5;
    /// Forks; the new process's channel arrives with the request (SCM_RIGHTS).
    pub const FORK: u64 = 6;
    pub const THP_DISABLE: u64 = 7;
    pub const EXIT: u64 = 8;
    /// Long-term pin of a range: an io_uring fixed buffer.
    pub const PIN: u64 = 9;
    pub const UNPIN: u64 = 10;
}

/// mmap flags carried in a request (a3 of MMAP).
pub mod map {
    pub const SHARED: u64 = 1;
    pub const HUGETLB_2M: u64 = 2;
    pub const HUGETLB_1G: u64 = 4;
}

/// TOUCH flags (a3).
pub mod touch {
    pub const WRITE: u64 = 1;
    pub const ZERO: u64 = 2;
}

pub const REQUEST_WORDS: usize = 8;
pub type Request = [u64; REQUEST_WORDS];

/// `[errno (0 = ok), value, loop_faults, all_faults]`. The first message a
/// new process sends (after spawn or fork) is `[0, pid, 0, faults so far]`.
pub type Reply = [i64; 4];

const STACK_PRETOUCH: usize = 256 << 10;

/// Entry point of `hugelab __agent <fd> <runner pid>`: never returns.
pub fn agent_main(fd: RawFd, runner: libc::pid_t) -> ! {
    // SAFETY: plain syscalls on our own process.
    unsafe {
        // Die with the runner, whatever kills it (SIGKILL included).
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != runner {
            libc::_exit(1);
        }
        // Start again with THP disabled, so that nothing the start-up
        // allocates is ever a THP (the flag survives exec). The runner spawns
        // us without fork (posix_spawn), so that it never write-protects its
        // own memory, which would make it fault inside measurements.
        if libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) == 0 {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
            reexec();
        }
        // Children forked for `fork` are reaped by the kernel: the runner
        // watches them by pid.
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
    }
    tame_own_mappings();
    populate_own_mappings();
    pretouch_stack();
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0) };
    let mut fd = fd;
    send(fd, &[0, i64::from(std::process::id() as i32), 0, minflt()]);
    loop {
        let mut req: Request = [0; REQUEST_WORDS];
        let mut passed_fd: RawFd = -1;
        if !recv(fd, &mut req, &mut passed_fd) {
            // The runner is gone or closed our channel.
            unsafe { libc::_exit(0) };
        }
        let before = minflt();
        let (errno, value, loop_faults) = match req[0] {
            op::FORK => match do_fork(fd, passed_fd) {
                Forked::Parent(pid) => (0, i64::from(pid), 0),
                Forked::Failed(e) => (e, 0, 0),
                Forked::Child(child_fd) => {
                    // The runner talks to the child on the new channel.
                    fd = child_fd;
                    continue;
                }
            },
            op::EXIT => unsafe { libc::_exit(0) },
            _ => execute(&req),
        };
        send(fd, &[errno, value, loop_faults, minflt() - before]);
    }
}

/// execv of this same program with the same arguments.
fn reexec() -> ! {
    let args: Vec<std::ffi::CString> = std::env::args()
        .filter_map(|a| std::ffi::CString::new(a).ok())
        .collect();
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of C strings that outlive the call.
    unsafe {
        libc::execv(c"/proc/self/exe".as_ptr(), argv.as_ptr());
        libc::_exit(127)
    }
}

/// Runs one request other than FORK/EXIT: (errno, value, faults of the access loop).
fn execute(req: &Request) -> (i64, i64, i64) {
    let [op, a0, a1, a2, a3, ..] = *req;
    let ok = |rc: libc::c_int| if rc == 0 { (0, 0, 0) } else { (errno(), 0, 0) };
    // SAFETY: the runner only sends ranges of regions it mapped in this
    // process; a bad range fails with an errno or kills this agent, never the runner.
    unsafe {
        match op {
            op::MMAP => match map_region(a0, a1, a2, a3) {
                Ok(addr) => (0, addr as i64, 0),
                Err(e) => (e, 0, 0),
            },
            op::MUNMAP => ok(libc::munmap(a0 as *mut _, a1 as usize)),
            op::MPROTECT => ok(libc::mprotect(a0 as *mut _, a1 as usize, a2 as i32)),
            op::MADVISE => ok(libc::madvise(a0 as *mut _, a1 as usize, a2 as i32)),
            op::TOUCH => {
                let before = minflt();
                touch_range(a0, a1, a2, a3);
                (0, 0, minflt() - before)
            }
            op::THP_DISABLE => ok(libc::prctl(libc::PR_SET_THP_DISABLE, a0, 0, 0, 0)),
            op::PIN => {
                let before = minflt();
                let errno = pin(a0, a1);
                (errno, 0, minflt() - before)
            }
            op::UNPIN => (unpin(a0, a1), 0, 0),
            _ => (libc::ENOSYS as i64, 0, 0),
        }
    }
}

/// Maps a region at the address the runner chose by the placement rule both
/// backends share (`hugelab_workload::placement`); never over a mapping.
unsafe fn map_region(addr: u64, len: u64, prot: u64, flags: u64) -> Result<u64, i64> {
    let mut mflags = libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    mflags |= if flags & map::SHARED != 0 {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    if flags & map::HUGETLB_2M != 0 {
        mflags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
    }
    if flags & map::HUGETLB_1G != 0 {
        mflags |= libc::MAP_HUGETLB | libc::MAP_HUGE_1GB;
    }
    let got = libc::mmap(addr as *mut _, len as usize, prot as i32, mflags, -1, 0);
    if got == libc::MAP_FAILED {
        return Err(errno());
    }
    Ok(got as u64)
}

/// The ranges pinned so far, each by an io_uring of its own: (start, len, ring fd).
static mut PINS: [(u64, u64, i32); 64] = [(0, 0, -1); 64];

/// Pins `[start, start+len)` the way io_uring fixed buffers do
/// (IORING_REGISTER_BUFFERS: pin_user_pages with FOLL_LONGTERM | FOLL_WRITE),
/// faulting in what is not mapped yet. Returns 0 or an errno.
unsafe fn pin(start: u64, len: u64) -> i64 {
    const IORING_REGISTER_BUFFERS: libc::c_long = 0;
    let Some(slot) = (*std::ptr::addr_of_mut!(PINS)).iter_mut().find(|p| p.2 < 0) else {
        return i64::from(libc::ENOSPC);
    };
    let mut params = [0u8; 120]; // struct io_uring_params
    let fd = libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) as i32;
    if fd < 0 {
        return errno();
    }
    let iov = libc::iovec {
        iov_base: start as *mut _,
        iov_len: len as usize,
    };
    let rc = libc::syscall(
        libc::SYS_io_uring_register,
        fd,
        IORING_REGISTER_BUFFERS,
        &iov as *const libc::iovec,
        1,
    );
    if rc < 0 {
        let e = errno();
        libc::close(fd);
        return e;
    }
    *slot = (start, len, fd);
    0
}

/// Unpins a range pinned by [`pin`] (the same start and length): the buffers
/// are unregistered first, which unpins at once, then the ring is closed.
unsafe fn unpin(start: u64, len: u64) -> i64 {
    const IORING_UNREGISTER_BUFFERS: libc::c_long = 1;
    let pins = &mut *std::ptr::addr_of_mut!(PINS);
    let Some(slot) = pins
        .iter_mut()
        .find(|p| p.2 >= 0 && p.0 == start && p.1 == len)
    else {
        return i64::from(libc::ENOENT);
    };
    let rc = libc::syscall(
        libc::SYS_io_uring_register,
        slot.2,
        IORING_UNREGISTER_BUFFERS,
        std::ptr::null::<u8>(),
        0,
    );
    let e = if rc < 0 { errno() } else { 0 };
    libc::close(slot.2);
    *slot = (0, 0, -1);
    e
}

/// One byte every `step` bytes: a load, or a store of a non-zero (or zero) byte.
unsafe fn touch_range(start: u64, len: u64, step: u64, flags: u64) {
    let step = step.max(1);
    let mut off = 0;
    if flags & touch::WRITE != 0 {
        let byte = if flags & touch::ZERO != 0 { 0 } else { 1 };
        while off < len {
            std::ptr::write_volatile((start + off) as *mut u8, byte);
            off += step;
        }
    } else {
        while off < len {
            black_box(std::ptr::read_volatile((start + off) as *const u8));
            off += step;
        }
    }
}

enum Forked {
    Parent(libc::pid_t),
    Child(RawFd),
    Failed(i64),
}

/// Forks. The child switches to the channel passed with the request and says
/// hello on it; the parent closes that channel.
fn do_fork(old_fd: RawFd, child_fd: RawFd) -> Forked {
    if child_fd < 0 {
        return Forked::Failed(i64::from(libc::EBADF));
    }
    // SAFETY: fork in a single-threaded process; the child continues the same loop.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        unsafe { libc::close(child_fd) };
        return Forked::Failed(errno());
    }
    if pid == 0 {
        unsafe { libc::close(old_fd) };
        // fork copies no PTEs of file mappings: map the agent's code again
        // now, or its first request would fault on it.
        populate_own_mappings();
        unshare_own_writable();
        pretouch_stack();
        send(
            child_fd,
            &[0, i64::from(std::process::id() as i32), 0, minflt()],
        );
        return Forked::Child(child_fd);
    }
    unshare_own_writable();
    pretouch_stack();
    unsafe { libc::close(child_fd) };
    Forked::Parent(pid)
}

/// Touches the stack the agent will ever use, so that no later request faults
/// on it (and, after fork, so that the COW copies happen inside the fork).
#[inline(never)]
fn pretouch_stack() {
    let mut buf = [0u8; STACK_PRETOUCH];
    let mut i = 0;
    while i < STACK_PRETOUCH {
        buf[i] = 1;
        i += 4096;
    }
    black_box(&mut buf);
}

/// The agent's own private writable mappings (heap, data, stack), recorded
/// at start-up before any region exists.
static mut OWN_WRITABLE: [(u64, u64); 64] = [(0, 0); 64];

/// The agent's own read-only mappings (its code and constants), recorded at
/// start-up before any region exists.
static mut OWN_READONLY: [(u64, u64); 64] = [(0, 0); 64];

/// A mapping of this process, from /proc/self/maps.
struct OwnMapping {
    start: u64,
    end: u64,
    /// `r-` (code, constants): populated so that first use does not fault.
    read_only: bool,
    /// `rw.p` (heap, stack, data, anonymous): kept out of THP.
    private_writable: bool,
}

/// The process's own mappings (allocates: only before the request loop).
fn own_mappings() -> Vec<OwnMapping> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(|line| {
            let mut it = line.split_whitespace();
            let (range, perms) = (it.next()?, it.next()?.as_bytes());
            let (a, b) = range.split_once('-')?;
            Some(OwnMapping {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                read_only: perms.starts_with(b"r-"),
                private_writable: perms.starts_with(b"rw") && perms.get(3) == Some(&b'p'),
            })
        })
        .collect()
}

/// MADV_NOHUGEPAGE on every private writable mapping of the agent itself
/// (heap, stack, anonymous and data), and a note of its read-only ones: runs
/// once, before the loop, while allocating is still harmless
/// (PR_SET_THP_DISABLE is in force).
fn tame_own_mappings() {
    for m in own_mappings() {
        if m.read_only {
            // SAFETY: written only here, before the loop, single-threaded.
            unsafe {
                let own = &mut *std::ptr::addr_of_mut!(OWN_READONLY);
                if let Some(slot) = own.iter_mut().find(|s| s.1 == 0) {
                    *slot = (m.start, m.end);
                }
            }
        }
        if m.private_writable {
            // SAFETY: written only here, before the loop, single-threaded.
            unsafe {
                let own = &mut *std::ptr::addr_of_mut!(OWN_WRITABLE);
                if let Some(slot) = own.iter_mut().find(|s| s.1 == 0) {
                    *slot = (m.start, m.end);
                }
            }
            // SAFETY: advice on our own mapping.
            unsafe {
                libc::madvise(
                    m.start as *mut _,
                    (m.end - m.start) as usize,
                    libc::MADV_NOHUGEPAGE,
                )
            };
        }
    }
}

/// Maps every page of the agent's code and constants (MADV_POPULATE_READ), so
/// that executing a request for the first time takes no fault that would be
/// counted as the workload's.
fn populate_own_mappings() {
    // SAFETY: read-only use of the table filled at start-up; advice on our
    // own mappings.
    unsafe {
        for &(a, b) in (*std::ptr::addr_of!(OWN_READONLY)).iter() {
            if b > a {
                libc::madvise(a as *mut _, (b - a) as usize, libc::MADV_POPULATE_READ);
            }
        }
    }
}

/// Breaks copy-on-write on all of the agent's own writable memory at once
/// (MADV_POPULATE_WRITE), right after fork: otherwise parent and child
/// would each take COW faults on their heap and data later, inside some
/// request, and those would be counted as the workload's.
fn unshare_own_writable() {
    // SAFETY: read-only use of the table filled at start-up; advice on our
    // own mappings.
    unsafe {
        for &(a, b) in (*std::ptr::addr_of!(OWN_WRITABLE)).iter() {
            if b > a {
                libc::madvise(a as *mut _, (b - a) as usize, libc::MADV_POPULATE_WRITE);
            }
        }
    }
}

/// For the runner: maps its own code and constants and touches its stack, so
/// that executing a statement's code for the first time does not fault inside
/// the measured interval (those faults would look like another process's).
pub fn prefault_runner() {
    for m in own_mappings().iter().filter(|m| m.read_only) {
        // SAFETY: advice on our own mapping.
        unsafe {
            libc::madvise(
                m.start as *mut _,
                (m.end - m.start) as usize,
                libc::MADV_POPULATE_READ,
            )
        };
    }
    pretouch_stack();
}

/// For the runner: from now on its heap never goes back to the kernel (no
/// mmap'd malloc chunks, no trimming). A buffer freed between two windows
/// (the pagemap batch of a large region, read for a snapshot) would
/// otherwise free one of the runner's page tables, and that page leaves
/// NR_PAGETABLE in an RCU callback that lands in a later window, counted as
/// the workload's; its allocation, outside any window, never was.
pub fn hold_runner_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes glibc's allocation thresholds.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
    }
}

/// The minor faults this process has taken so far (all its threads).
pub fn own_minflt() -> i64 {
    minflt()
}

fn minflt() -> i64 {
    // SAFETY: getrusage writes into a struct we own.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru.ru_minflt
    }
}

fn errno() -> i64 {
    i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

fn send(fd: RawFd, reply: &Reply) {
    // SAFETY: sends our own buffer.
    unsafe {
        libc::send(
            fd,
            reply.as_ptr().cast(),
            std::mem::size_of::<Reply>(),
            libc::MSG_NOSIGNAL,
        )
    };
}

/// Receives one request and, with a FORK, the file descriptor passed with it.
fn recv(fd: RawFd, req: &mut Request, passed: &mut RawFd) -> bool {
    // SAFETY: recvmsg into buffers we own; the control buffer is sized for one fd.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: req.as_mut_ptr().cast(),
            iov_len: std::mem::size_of::<Request>(),
        };
        let mut cbuf = [0u64; 8];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        loop {
            let n = libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if n != std::mem::size_of::<Request>() as isize {
                return false;
            }
            break;
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if !cmsg.is_null()
            && (*cmsg).cmsg_level == libc::SOL_SOCKET
            && (*cmsg).cmsg_type == libc::SCM_RIGHTS
        {
            *passed = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
        }
        true
    }
}
