//! The process agent: the program behind every `spawn`. It executes the
//! statements the runner sends it on real memory, so that the kernel does the
//! faulting, and reports the faults its own accesses took.
//!
//! The agent must not disturb the counters it is measured by, so:
//! - it starts with PR_SET_THP_DISABLE (set by the runner before exec, and
//!   inherited), marks every private writable mapping it owns MADV_NOHUGEPAGE,
//!   and only then clears PR_SET_THP_DISABLE: its own memory never becomes a
//!   THP, while the workload's regions follow the workload's settings;
//! - after start-up it never allocates: requests and replies
//!   ([`crate::protocol`]) are fixed-size messages on a SOCK_SEQPACKET
//!   socket, read and decoded into buffers on a stack that was
//!   touched in advance (also again right after `fork`, whose COW faults on
//!   the agent's own stack then belong to the fork, not to a later access);
//! - it runs on one CPU only (`pin_to_one_cpu`, inherited by `fork`), and
//!   after a MADV_FREE or MADV_COLD it drains that CPU's LRU batches
//!   (`drain_lru_batches`): the kernel keeps order-0 folios in per-cpu
//!   batches (`lru_add` at fault, `lru_lazyfree`, `lru_deactivate`) and
//!   counts pglazyfree / pgdeactivate only when a batch is moved, so without
//!   this a statement's counts would depend on which CPU faulted and which
//!   advised, and would come in some later statement's window;
//! - its own vDSO and vvar are a fresh program's for the workload's
//!   `special` reads: its dynamic loader read the vDSO's text at start, so
//!   it zaps those PTEs (MADV_DONTNEED, [`zap_own_vdso`]) once set up, and
//!   again after exec; it never runs vDSO code after that and never reads
//!   `[vvar]`/`[vvar_vclock]` (no clock_gettime, no Instant::now, no
//!   vDSO getrandom: glibc 2.36 has none), which could not be zapped
//!   (VM_PFNMAP): a vvar page it touched would take no fault when the
//!   workload reads it (the runner checks the agent's PTEs of the mapping
//!   in /proc/PID/pagemap before each `special` read, and a difference
//!   makes the process's minflt unknown with the reason). Its start-up's
//!   MADV_POPULATE_READ of its read-only mappings leaves these three alone;
//! - faults are counted with getrusage around the access loop only
//!   (`loop_faults`), and around the whole request (`all_faults`), which the
//!   runner compares with the system-wide pgfault to detect other processes.
//!   Both are the faults of the task that runs the request (RUSAGE_THREAD):
//!   a `thread` statement's requests run on that thread
//!   ([`crate::agent_task`]), each thread with a channel of its own.

use crate::agent_task;
use crate::protocol::{Access, RemapTo, Reply, ReplyWire, Request, RequestWire};
use hugelab_workload::stmt::SPECIAL_MAPPINGS;
use hugelab_workload::units::PAGE_SIZE;
use hugelab_workload::{Errno, HugetlbSize};
use std::cell::Cell;
use std::hint::black_box;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering::Relaxed};

/// An empty page of the agent's own for `drain_lru_batches`, mapped
/// PROT_NONE so that nothing ever populates it: not the agent (a touch would
/// be a SIGSEGV), and not the MADV_POPULATE_WRITE after `fork`
/// (`unshare_own_writable` takes only `rw-p` mappings). A populated drain
/// page would be a folio of the agent's own that MADV_COLD deactivates,
/// counted in pgdeactivate as the workload's.
static DRAIN_PAGE: AtomicI64 = AtomicI64::new(0);

/// The runner's pid, passed on at exec.
static RUNNER: AtomicI32 = AtomicI32::new(0);

// Per task (the agent's first task, or one of its threads): constant
// initialisers and no destructors, so the signal handler may read them.
thread_local! {
    /// The task's channel to the runner, for the signal handler's last word.
    static CHANNEL: Cell<RawFd> = const { Cell::new(-1) };
    /// The task's faults when the request being executed started.
    static REQUEST_FAULTS: Cell<i64> = const { Cell::new(0) };
    /// Its faults when the access loop being executed started; -1 outside one.
    static LOOP_FAULTS: Cell<i64> = const { Cell::new(-1) };
    /// The stack slot of a thread ([`agent_task`]); None for the first task.
    static SLOT: Cell<Option<usize>> = const { Cell::new(None) };
}

const STACK_PRETOUCH: usize = 256 << 10;

/// Entry point of `hugelab __agent <fd> <runner pid> [exec <0|1>]`: never
/// returns. After `exec` (the workload's), `thp_after_exec` is the
/// PR_SET_THP_DISABLE the old image had, restored once set up.
pub fn agent_main(fd: RawFd, runner: libc::pid_t, thp_after_exec: Option<bool>) -> ! {
    RUNNER.store(runner, Relaxed);
    // SAFETY: plain syscalls on our own process.
    unsafe {
        // Die with the runner, whatever kills it (SIGKILL included). An
        // agent re-executed by `exec` keeps what it had: a spawned one the
        // flag (execve keeps it), a forked one none (fork cleared it; it
        // ends when its channel closes), and its parent is not the runner.
        if thp_after_exec.is_none() {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != runner {
                libc::_exit(1);
            }
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
    pin_to_one_cpu();
    // SAFETY: a new anonymous mapping of our own.
    let drain = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE_SIZE as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if drain != libc::MAP_FAILED {
        DRAIN_PAGE.store(drain as i64, Relaxed);
    }
    agent_task::map_stacks();
    tame_own_mappings();
    report_fatal_signals();
    populate_own_mappings();
    pretouch_stack();
    zap_own_vdso();
    let thp = libc::c_ulong::from(thp_after_exec.unwrap_or(false));
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, thp, 0, 0, 0) };
    CHANNEL.set(fd);
    send(fd, &hello());
    serve(fd, true);
    // SAFETY: ends the process (serve returns only for a thread).
    unsafe { libc::_exit(0) }
}

/// The request loop of a task on channel `fd`: the process's first task
/// (`first`), or a thread, which returns when told to exit or when its
/// channel closes. A fork's child goes on in the loop as its process's
/// first task, on the new channel.
fn serve(fd: RawFd, first: bool) {
    let (mut fd, mut first) = (fd, first);
    loop {
        let mut wire = RequestWire::default();
        let mut passed_fd: RawFd = -1;
        if !recv(fd, &mut wire, &mut passed_fd) {
            // The runner is gone or closed our channel.
            if first {
                unsafe { libc::_exit(0) };
            }
            return;
        }
        let before = minflt();
        REQUEST_FAULTS.set(before);
        let reply = match Request::decode(&wire) {
            Some(Request::Fork) => match do_fork(fd, passed_fd) {
                Forked::Parent(pid) => done(Errno::OK, i64::from(pid), 0),
                Forked::Failed(e) => done(e, 0, 0),
                Forked::Child(child_fd) => {
                    // The runner talks to the child on the new channel.
                    fd = child_fd;
                    first = true;
                    CHANNEL.set(fd);
                    continue;
                }
            },
            Some(Request::Exit) if first => unsafe { libc::_exit(0) },
            Some(Request::Exit) => return,
            Some(Request::Thread) => match start_thread(passed_fd) {
                Ok(()) => done(Errno::OK, 0, 0),
                Err(e) => done(e, 0, 0),
            },
            Some(Request::Exec) => {
                let e = agent_task::exec_self(fd, RUNNER.load(Relaxed));
                done(e, 0, 0)
            }
            Some(Request::MmapFile {
                addr,
                len,
                prot,
                offset,
            }) => map_file(addr, len, prot, offset, passed_fd),
            Some(req) => execute(req),
            None => done(Errno(libc::ENOSYS), 0, 0),
        };
        send(
            fd,
            &Reply {
                all_faults: minflt() - before,
                ..reply
            },
        );
    }
}

/// Starts a thread serving channel `fd` (see [`agent_task`]).
fn start_thread(fd: RawFd) -> Result<(), Errno> {
    if fd < 0 {
        return Err(Errno(libc::EBADF));
    }
    agent_task::start_thread(fd, thread_main).inspect_err(|_| {
        // SAFETY: closes the channel passed to us, which no thread got.
        unsafe { libc::close(fd) };
    })
}

/// A thread's start: hello with its tid on its channel, then the loop;
/// when the loop returns, the thread ends (its slot is joined when used
/// again).
extern "C" fn thread_main(arg: *mut libc::c_void) -> *mut libc::c_void {
    let (fd, slot) = agent_task::thread_arg(arg);
    SLOT.set(Some(slot));
    CHANNEL.set(fd);
    // SAFETY: gettid takes no arguments.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    send(fd, &Reply::hello(tid, minflt()));
    serve(fd, false);
    // SAFETY: closes this thread's own channel.
    unsafe { libc::close(fd) };
    agent_task::thread_exited(slot);
    std::ptr::null_mut()
}

/// A reply before its `all_faults` are known.
fn done(errno: Errno, value: i64, loop_faults: i64) -> Reply {
    Reply {
        errno,
        value,
        loop_faults,
        all_faults: 0,
        signal: 0,
    }
}

/// The hello of this process: its pid and the faults it took so far.
fn hello() -> Reply {
    Reply::hello(i64::from(std::process::id() as i32), minflt())
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

/// Runs one request other than Fork/Exit: its reply but for `all_faults`.
fn execute(req: Request) -> Reply {
    let ok = |rc: libc::c_int| {
        let e = if rc == 0 { Errno::OK } else { errno() };
        done(e, 0, 0)
    };
    // SAFETY: the runner only sends ranges of regions it mapped in this
    // process; a bad range fails with an errno or kills this agent, never the runner.
    unsafe {
        match req {
            Request::Mmap {
                addr,
                len,
                prot,
                shared,
                hugetlb,
                populate,
                stack,
                growsdown,
            } => {
                let mut extra = 0;
                for (on, flag) in [
                    (populate, libc::MAP_POPULATE),
                    (stack, libc::MAP_STACK),
                    (growsdown, libc::MAP_GROWSDOWN),
                ] {
                    if on {
                        extra |= flag;
                    }
                }
                // MAP_POPULATE faults in the call itself: counted as the
                // process's own (GUP faults count in its min_flt).
                let before = minflt();
                let mapped = map_region(addr, len, prot, shared, hugetlb, extra);
                let faults = minflt() - before;
                match mapped {
                    Ok(addr) => done(Errno::OK, addr as i64, faults),
                    Err(e) => done(e, 0, faults),
                }
            }
            Request::Munmap { addr, len } => ok(libc::munmap(addr as *mut _, len as usize)),
            Request::Mprotect { addr, len, prot } => {
                ok(libc::mprotect(addr as *mut _, len as usize, prot))
            }
            Request::Madvise { addr, len, advice } => {
                // MADV_POPULATE_* fault in the call: the process's own faults.
                let before = minflt();
                let r = libc::madvise(addr as *mut _, len as usize, advice);
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                let faults = minflt() - before;
                if advice == libc::MADV_FREE || advice == libc::MADV_COLD {
                    drain_lru_batches();
                }
                *libc::__errno_location() = errno;
                Reply {
                    loop_faults: faults,
                    ..ok(r)
                }
            }
            Request::Touch {
                addr,
                len,
                step,
                access,
            } => {
                let before = minflt();
                LOOP_FAULTS.set(before);
                touch_range(addr, len, step, access);
                LOOP_FAULTS.set(-1);
                done(Errno::OK, 0, minflt() - before)
            }
            Request::ThpDisable { on } => ok(libc::prctl(
                libc::PR_SET_THP_DISABLE,
                libc::c_ulong::from(on),
                0,
                0,
                0,
            )),
            Request::Pin { addr, len } => {
                let before = minflt();
                let errno = pin(addr, len);
                done(errno, 0, minflt() - before)
            }
            Request::Unpin { addr, len } => done(unpin(addr, len), 0, 0),
            Request::Mremap {
                addr,
                old_len,
                new_len,
                to,
            } => match remap(addr, old_len, new_len, to) {
                Ok(addr) => done(Errno::OK, addr as i64, 0),
                Err(e) => done(e, 0, 0),
            },
            Request::Fork
            | Request::Exit
            | Request::Thread
            | Request::Exec
            | Request::MmapFile { .. } => done(Errno(libc::ENOSYS), 0, 0),
        }
    }
}

/// mremap(2) as `to` says (see [`RemapTo`]): the address the range ends at.
fn remap(addr: u64, old_len: u64, new_len: u64, to: RemapTo) -> Result<u64, Errno> {
    let call = |flags: libc::c_int, new_addr: u64| {
        // SAFETY: mremap of a range of this agent's regions (see execute);
        // a bad one fails with an errno.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mremap,
                addr,
                old_len,
                new_len,
                libc::c_long::from(flags),
                new_addr,
            )
        };
        if r == -1 {
            Err(errno())
        } else {
            Ok(r as u64)
        }
    };
    let fixed = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
    match to {
        RemapTo::InPlace => call(0, 0),
        RemapTo::Fixed(at) => call(fixed, at),
        RemapTo::Fallback(at) => match call(0, 0) {
            Err(Errno::ENOMEM) => call(fixed, at),
            r => r,
        },
    }
}

/// Makes a SIGBUS or SIGSEGV (the kernel's answer to a fault it cannot
/// serve: a HugeTLB fault with an empty pool, an access the protection
/// forbids) end the agent with a last reply that says so, and no core
/// dump of the workload's memory: see [`on_fatal_signal`].
fn report_fatal_signals() {
    // SAFETY: setrlimit and sigaction with structures we own; the handler
    // is async-signal-safe (see it).
    unsafe {
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        for sig in [libc::SIGBUS, libc::SIGSEGV] {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_fatal_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The agent's last word: a reply carrying the signal, the faulting address
/// and the faults counted so far; then the same signal again with its
/// default action, which kills the agent by it as soon as this handler
/// returns (whatever the access would do when tried again). Uses only
/// system calls (getrusage, send, sigaction, kill): async-signal-safe.
extern "C" fn on_fatal_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let now = minflt();
    let in_loop = LOOP_FAULTS.get();
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers;
    // si_addr is set for SIGBUS and SIGSEGV.
    let addr = unsafe { (*info).si_addr() } as i64;
    let reply = Reply {
        errno: Errno::OK,
        value: addr,
        loop_faults: if in_loop >= 0 { now - in_loop } else { 0 },
        all_faults: now - REQUEST_FAULTS.get(),
        signal: sig,
    };
    send(CHANNEL.get(), &reply);
    // SAFETY: plain system calls on this process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::kill(libc::getpid(), sig);
    }
}

/// Maps a region at the address the runner chose by the placement rule both
/// backends share (`hugelab_workload::placement`); never over a mapping.
/// `extra` are further MAP_ flags (MAP_POPULATE, MAP_STACK, MAP_GROWSDOWN).
unsafe fn map_region(
    addr: u64,
    len: u64,
    prot: i32,
    shared: bool,
    hugetlb: Option<HugetlbSize>,
    extra: i32,
) -> Result<u64, Errno> {
    let mut mflags = libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE | extra;
    mflags |= if shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    mflags |= match hugetlb {
        Some(HugetlbSize::Size2M) => libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
        Some(HugetlbSize::Size1G) => libc::MAP_HUGETLB | libc::MAP_HUGE_1GB,
        None => 0,
    };
    let got = libc::mmap(addr as *mut _, len as usize, prot, mflags, -1, 0);
    if got == libc::MAP_FAILED {
        return Err(errno());
    }
    Ok(got as u64)
}

/// MAP_PRIVATE of the file `fd` (passed with the request, closed here once
/// mapped: the mapping holds the file) at exactly `addr`, from `offset`.
fn map_file(addr: u64, len: u64, prot: i32, offset: u64, fd: RawFd) -> Reply {
    if fd < 0 {
        return done(Errno(libc::EBADF), 0, 0);
    }
    let flags = libc::MAP_PRIVATE | libc::MAP_FIXED_NOREPLACE;
    // SAFETY: a new mapping at an address the runner chose clear of this
    // agent's own mappings; the fd is ours to close.
    unsafe {
        let got = libc::mmap(addr as *mut _, len as usize, prot, flags, fd, offset as i64);
        let e = errno();
        libc::close(fd);
        if got == libc::MAP_FAILED {
            return done(e, 0, 0);
        }
        done(Errno::OK, got as i64, 0)
    }
}

/// The ranges pinned so far, each by an io_uring of its own: (start, len, ring fd).
static mut PINS: [(u64, u64, i32); 64] = [(0, 0, -1); 64];

/// Pins `[start, start+len)` the way io_uring fixed buffers do
/// (IORING_REGISTER_BUFFERS: pin_user_pages with FOLL_LONGTERM | FOLL_WRITE),
/// faulting in what is not mapped yet. Returns [`Errno::OK`] or an errno.
unsafe fn pin(start: u64, len: u64) -> Errno {
    const IORING_REGISTER_BUFFERS: libc::c_long = 0;
    let Some(slot) = (*std::ptr::addr_of_mut!(PINS)).iter_mut().find(|p| p.2 < 0) else {
        return Errno(libc::ENOSPC);
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
    Errno::OK
}

/// Unpins a range pinned by [`pin`] (the same start and length): the buffers
/// are unregistered first, which unpins at once, then the ring is closed.
unsafe fn unpin(start: u64, len: u64) -> Errno {
    const IORING_UNREGISTER_BUFFERS: libc::c_long = 1;
    let pins = &mut *std::ptr::addr_of_mut!(PINS);
    let Some(slot) = pins
        .iter_mut()
        .find(|p| p.2 >= 0 && p.0 == start && p.1 == len)
    else {
        return Errno(libc::ENOENT);
    };
    let rc = libc::syscall(
        libc::SYS_io_uring_register,
        slot.2,
        IORING_UNREGISTER_BUFFERS,
        std::ptr::null::<u8>(),
        0,
    );
    let e = if rc < 0 { errno() } else { Errno::OK };
    libc::close(slot.2);
    *slot = (0, 0, -1);
    e
}

/// One byte every `step` bytes: a load, or a store of a non-zero (or zero) byte.
unsafe fn touch_range(start: u64, len: u64, step: u64, access: Access) {
    let step = step.max(1);
    let mut off = 0;
    if access == Access::Read {
        while off < len {
            black_box(std::ptr::read_volatile((start + off) as *const u8));
            off += step;
        }
    } else {
        let byte = if access == Access::WriteZero { 0 } else { 1 };
        while off < len {
            std::ptr::write_volatile((start + off) as *mut u8, byte);
            off += step;
        }
    }
}

enum Forked {
    Parent(libc::pid_t),
    Child(RawFd),
    Failed(Errno),
}

/// Forks. The child switches to the channel passed with the request and says
/// hello on it; the parent closes that channel.
fn do_fork(old_fd: RawFd, child_fd: RawFd) -> Forked {
    if child_fd < 0 {
        return Forked::Failed(Errno(libc::EBADF));
    }
    // SAFETY: fork in a single-threaded process; the child continues the same loop.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        unsafe { libc::close(child_fd) };
        return Forked::Failed(errno());
    }
    if pid == 0 {
        unsafe { libc::close(old_fd) };
        // Only the forking task is in the child.
        agent_task::after_fork(SLOT.get());
        // fork copies no PTEs of file mappings: map the agent's code again
        // now, or its first request would fault on it.
        populate_own_mappings();
        unshare_own_writable();
        agent_task::unshare_running_slots();
        pretouch_stack();
        send(child_fd, &hello());
        return Forked::Child(child_fd);
    }
    unshare_own_writable();
    agent_task::unshare_running_slots();
    pretouch_stack();
    unsafe { libc::close(child_fd) };
    Forked::Parent(pid)
}

/// Touches the stack the agent will ever use, so that no later request faults
/// on it (and, after fork, so that the COW copies happen inside the fork).
/// A thread's stack is smaller, populated at start-up, and unshared after a
/// fork when a thread runs on it (`agent_task::unshare_running_slots`).
fn pretouch_stack() {
    // The check is outside the function with the buffer, whose frame is
    // probed page by page on entry.
    if SLOT.get().is_none() {
        touch_stack_frame();
    }
}

#[inline(never)]
fn touch_stack_frame() {
    let mut buf = [0u8; STACK_PRETOUCH];
    let mut i = 0;
    while i < STACK_PRETOUCH {
        buf[i] = 1;
        i += PAGE_SIZE as usize;
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
    /// `[vdso]`, `[vvar]` or `[vvar_vclock]`: left alone, but for the
    /// vDSO's zap (see [`zap_own_vdso`]).
    special: Option<String>,
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
            let name = it.nth(3).unwrap_or("");
            let special = SPECIAL_MAPPINGS
                .iter()
                .any(|m| m.maps_name == name)
                .then(|| name.to_string());
            Some(OwnMapping {
                special,
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
        if let Some(name) = &m.special {
            if name == "[vdso]" {
                OWN_VDSO.store(m.start, Relaxed);
                OWN_VDSO_LEN.store(m.end - m.start, Relaxed);
            }
            continue;
        }
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

/// The agent's own vDSO text (`[vdso]`), start and length, from start-up.
static OWN_VDSO: AtomicU64 = AtomicU64::new(0);
static OWN_VDSO_LEN: AtomicU64 = AtomicU64::new(0);

/// Unmaps the PTEs of the agent's own vDSO text (MADV_DONTNEED: allowed on
/// a special mapping that is not VM_PFNMAP), which its dynamic loader read
/// at start (the ELF header, the symbol table): the workload's `special`
/// reads then fault as a fresh program's do. Once at start and so again
/// after exec; a fork's child has none (fork copies no vDSO PTE).
fn zap_own_vdso() {
    let (start, len) = (OWN_VDSO.load(Relaxed), OWN_VDSO_LEN.load(Relaxed));
    if len > 0 {
        // SAFETY: advice on our own vDSO, whose text we do not run.
        unsafe { libc::madvise(start as *mut _, len as usize, libc::MADV_DONTNEED) };
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
    // The threads' stacks are unshared by their own rule (agent_task).
    let (s0, s1) = agent_task::stacks_range();
    unsafe {
        for &(a, b) in (*std::ptr::addr_of!(OWN_WRITABLE)).iter() {
            for (lo, hi) in [(a, b.min(s0.max(a))), (a.max(s1), b)] {
                if hi > lo && !(s0 < s1 && lo >= s0 && hi <= s1) {
                    libc::madvise(lo as *mut _, (hi - lo) as usize, libc::MADV_POPULATE_WRITE);
                }
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

/// For the runner: keeps its own memory out of what windows measure.
/// - Its heap never goes back to the kernel (no mmap'd malloc chunks, no
///   trimming). A buffer freed between two windows (the pagemap batch of a
///   large region, read for a snapshot) would otherwise free one of the
///   runner's page tables, and that page leaves NR_PAGETABLE in an RCU
///   callback that lands in a later window, counted as the workload's; its
///   allocation, outside any window, never was.
/// - It never gets a THP or mTHP (PR_SET_THP_DISABLE): its own faults inside
///   a window are excused as not another process's, so they must not
///   allocate a large folio the per-size counters would count as the
///   workload's. Agents inherit the flag and clear it once their own memory
///   is marked (see the module doc).
pub fn hold_runner_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes glibc's allocation thresholds.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
    }
    // SAFETY: prctl with integer arguments, on this process.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// The minor faults this process has taken so far (all its threads).
pub fn own_minflt() -> i64 {
    rusage_minflt(libc::RUSAGE_SELF)
}

/// The minor faults of the calling task (an agent's first task or one of
/// its threads): a thread's own, as the kernel counts them per task.
fn minflt() -> i64 {
    rusage_minflt(libc::RUSAGE_THREAD)
}

fn rusage_minflt(who: libc::c_int) -> i64 {
    // SAFETY: getrusage writes into a struct we own.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut ru);
        ru.ru_minflt
    }
}

fn errno() -> Errno {
    Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

fn send(fd: RawFd, reply: &Reply) {
    let wire: ReplyWire = reply.encode();
    // SAFETY: sends our own buffer.
    unsafe {
        libc::send(
            fd,
            wire.as_ptr().cast(),
            std::mem::size_of::<ReplyWire>(),
            libc::MSG_NOSIGNAL,
        )
    };
}

/// Receives one request and, with a Fork, the file descriptor passed with it.
fn recv(fd: RawFd, wire: &mut RequestWire, passed: &mut RawFd) -> bool {
    // SAFETY: recvmsg into buffers we own; the control buffer is sized for one fd.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: wire.as_mut_ptr().cast(),
            iov_len: std::mem::size_of::<RequestWire>(),
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
            if n != std::mem::size_of::<RequestWire>() as isize {
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

/// Binds the agent to the CPU it runs on now, so that its faults and its
/// madvise calls use the same CPU's LRU batches (see the module doc).
fn pin_to_one_cpu() {
    // SAFETY: plain syscalls on our own process with a set on our stack.
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// lru_add_drain on the agent's CPU: MADV_COLD of an empty page of its own
/// starts with it (mm/madvise.c `madvise_cold`; `can_madv_lru_vma` does not
/// look at the protection) and finds nothing to do besides, so nothing else
/// is counted: the page is PROT_NONE and never populated, in every
/// generation of agents (see [`DRAIN_PAGE`]).
fn drain_lru_batches() {
    let page = DRAIN_PAGE.load(Relaxed);
    if page != 0 {
        // SAFETY: our own PROT_NONE mapping, never touched.
        unsafe { libc::madvise(page as *mut _, PAGE_SIZE as usize, libc::MADV_COLD) };
    }
}
