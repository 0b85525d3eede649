//! The agent's threads and its exec: what `<proc> thread <name>` and
//! `<proc> exec` do in the process agent ([`crate::agent`]).
//!
//! A thread is a real one (pthread_create: clone with CLONE_VM |
//! CLONE_THREAD ...), run on a stack the agent mapped, marked
//! MADV_NOHUGEPAGE and populated at start-up, before THP was allowed:
//! a stack glibc would map for it later would be a new anonymous VMA that
//! could get a THP on its first touch inside some statement's window. There
//! are [`SLOTS`] stacks; the slot of a thread that exited is joined
//! (pthread_join) and used again by the next thread.
//!
//! Exec re-executes the agent (`/proc/self/exe`), keeping its channel to the
//! runner open across it, with the workload's PR_SET_THP_DISABLE passed on
//! the command line, so that the new image sets itself up as at start and
//! then restores it (the kernel keeps the flag across exec, MMF_INIT_MASK).

use hugelab_workload::Errno;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::SeqCst};

/// How many threads a process can have at once (besides its first task).
pub const SLOTS: usize = 16;
/// Each thread's stack, its TLS and glibc's thread descriptor included.
const STACK: usize = 128 << 10;

const FREE: u8 = 0;
const RUNNING: u8 = 1;
/// Returned from its start function: to be joined before the slot is used.
const EXITED: u8 = 2;

/// The base of the stacks' mapping (0: none).
static STACKS: AtomicU64 = AtomicU64::new(0);
static STATE: [AtomicU8; SLOTS] = [const { AtomicU8::new(FREE) }; SLOTS];
static HANDLE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// Maps and populates the threads' stacks: at start-up, while the agent
/// may still allocate and THP is disabled for it.
pub fn map_stacks() {
    let len = SLOTS * STACK;
    // SAFETY: a new anonymous mapping of our own, advised and populated.
    unsafe {
        let at = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if at == libc::MAP_FAILED {
            return;
        }
        libc::madvise(at, len, libc::MADV_NOHUGEPAGE);
        libc::madvise(at, len, libc::MADV_POPULATE_WRITE);
        STACKS.store(at as u64, SeqCst);
    }
}

/// The threads' stacks, `[start, end)` (empty when not mapped): the agent's
/// own writable memory that a fork does not unshare whole.
pub fn stacks_range() -> (u64, u64) {
    let base = STACKS.load(SeqCst);
    if base == 0 {
        (0, 0)
    } else {
        (base, base + (SLOTS * STACK) as u64)
    }
}

/// Breaks copy-on-write on the stack of `slot` (a fork write-protected it):
/// outside any statement's window, so that the thread running on it takes
/// no fault of its own inside one. Only the stacks in use are unshared at a
/// fork, and a free one when a thread starts on it: unsharing all of them
/// would copy 2 MiB at every fork, charged to the workload's memory cgroup.
fn unshare_slot(slot: usize) {
    let base = STACKS.load(SeqCst);
    if base != 0 {
        // SAFETY: advice on our own mapping.
        unsafe {
            libc::madvise(
                (base + (slot * STACK) as u64) as *mut libc::c_void,
                STACK,
                libc::MADV_POPULATE_WRITE,
            )
        };
    }
}

/// After a fork, in the parent and in the child: unshares the stacks of the
/// threads that run (in the child, only the forking thread's, if a thread forked).
pub fn unshare_running_slots() {
    for (slot, state) in STATE.iter().enumerate() {
        if state.load(SeqCst) == RUNNING {
            unshare_slot(slot);
        }
    }
}

/// Starts a thread running `entry` with argument `fd | slot << 32` on a free
/// slot's stack. Errors: EAGAIN when every slot is taken (or no stacks).
pub fn start_thread(
    fd: RawFd,
    entry: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void,
) -> Result<(), Errno> {
    let base = STACKS.load(SeqCst);
    let slot = (0..SLOTS)
        .find(|&i| STATE[i].load(SeqCst) == FREE)
        .or_else(|| (0..SLOTS).find(|&i| STATE[i].load(SeqCst) == EXITED));
    let (Some(slot), true) = (slot, base != 0) else {
        return Err(Errno(libc::EAGAIN));
    };
    // SAFETY: pthread calls with our own attr and handle; the stack is our
    // mapping, unused (free, or its thread joined here).
    unsafe {
        if STATE[slot].load(SeqCst) == EXITED {
            libc::pthread_join(
                HANDLE[slot].load(SeqCst) as libc::pthread_t,
                std::ptr::null_mut(),
            );
        }
        unshare_slot(slot);
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        let stack = (base + (slot * STACK) as u64) as *mut libc::c_void;
        libc::pthread_attr_setstack(&mut attr, stack, STACK);
        let mut handle: libc::pthread_t = 0;
        let arg = thread_word(fd, slot) as *mut libc::c_void;
        STATE[slot].store(RUNNING, SeqCst);
        let rc = libc::pthread_create(&mut handle, &attr, entry, arg);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 {
            STATE[slot].store(FREE, SeqCst);
            return Err(Errno(rc));
        }
        HANDLE[slot].store(handle as u64, SeqCst);
    }
    Ok(())
}

/// The start argument of a thread serving channel `fd` on stack `slot`.
fn thread_word(fd: RawFd, slot: usize) -> u64 {
    fd as u32 as u64 | (slot as u64) << 32
}

/// The channel and slot a thread was started with.
pub fn thread_arg(arg: *mut libc::c_void) -> (RawFd, usize) {
    let word = arg as u64;
    (word as u32 as RawFd, (word >> 32) as usize)
}

/// The thread of `slot` is returning from its start function.
pub fn thread_exited(slot: usize) {
    STATE[slot].store(EXITED, SeqCst);
}

/// In a child of fork: only the forking task exists, on `own_slot`'s stack
/// if it was a thread (which stays taken); every other slot is free.
pub fn after_fork(own_slot: Option<usize>) {
    for (i, state) in STATE.iter().enumerate() {
        let own = own_slot == Some(i);
        state.store(if own { RUNNING } else { FREE }, SeqCst);
    }
}

/// The argument that tells a re-executed agent it came from `exec` and
/// which PR_SET_THP_DISABLE to restore (`__agent <fd> <runner> exec <0|1>`).
pub const EXEC_ARG: &str = "exec";

/// execve of this same program as an agent that keeps channel `fd`; returns
/// only if it fails, with the errno. Allocates (the image is replaced).
pub fn exec_self(fd: RawFd, runner: libc::pid_t) -> Errno {
    // SAFETY: fcntl and prctl on our own process.
    let thp_disabled = unsafe {
        libc::fcntl(fd, libc::F_SETFD, 0);
        libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0)
    };
    let arg0 = std::env::args().next().unwrap_or_else(|| "hugelab".into());
    let args = [
        arg0,
        "__agent".into(),
        fd.to_string(),
        runner.to_string(),
        EXEC_ARG.into(),
        if thp_disabled == 1 { "1" } else { "0" }.into(),
    ];
    let args: Vec<std::ffi::CString> = args
        .into_iter()
        .filter_map(|a| std::ffi::CString::new(a).ok())
        .collect();
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of C strings that outlive the call.
    unsafe { libc::execv(c"/proc/self/exe".as_ptr(), argv.as_ptr()) };
    Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_channel_and_slot_pass_through_its_start_argument() {
        for (fd, slot) in [(0, 0), (3, 1), (1023, SLOTS - 1), (i32::MAX, 7)] {
            let arg = thread_word(fd, slot) as *mut libc::c_void;
            assert_eq!(thread_arg(arg), (fd, slot));
        }
    }
}
