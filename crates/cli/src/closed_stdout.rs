//! Output into a pipe whose reader has gone (`hugelab compare | head -1`):
//! a quiet end, as Unix tools have, for every command.
//!
//! Rust ignores SIGPIPE, so a write to such a pipe fails with EPIPE, and
//! `println!` turns that failure into a panic ("failed printing to stdout:
//! Broken pipe"). Every command prints with `print!`/`println!`, so that
//! panic is the one place all of them meet. Setting SIGPIPE back to its
//! default disposition at start would be simpler, but it would let the
//! kernel kill the process at the first such write wherever it happens,
//! including while a [`SettingsGuard`](hugelab_kernel::guard) holds changed
//! tunables (the guard's signal thread prints bench's partial report before
//! restoring), with the machine left changed and agents left running.
//!
//! Instead: the panic hook stays silent for exactly that panic; the panic
//! unwinds like any other, so every guard restores the machine and every
//! kernel backend reaps its agents on the way (their `Drop`); [`run`]
//! catches it at the top and, when the payload it caught is that panic's,
//! only then ends the process the way a Unix filter ends when its reader
//! leaves: killed by SIGPIPE (see [`exit`]). The decision is the caught
//! payload's, not a flag's: an EPIPE panic on some other thread earlier does
//! not turn a later, unrelated panic of the command into a quiet end.
//!
//! Code that prints on the guard's signal thread (bench's interrupt hook)
//! writes with `write!` and ignores the error instead: a panic there is not
//! unwound through `run`, and the guard would report it as a failed hook.

use std::any::Any;
use std::io;
use std::panic::{self, AssertUnwindSafe};

/// The message `print!` panics with when stdout's reader is gone
/// (std's `print_to`: "failed printing to stdout: {io error}").
fn is_closed_stdout(payload: &(dyn Any + Send)) -> bool {
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied());
    let epipe = io::Error::from_raw_os_error(libc::EPIPE);
    text == Some(format!("failed printing to stdout: {epipe}").as_str())
}

/// Runs `main` (the command), ending the process quietly, after unwinding,
/// if it printed into a closed pipe. Any other panic is reported as before.
pub fn run<T>(main: impl FnOnce() -> T) -> T {
    let default_hook = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if !is_closed_stdout(info.payload()) {
            default_hook(info);
        }
    }));
    match panic::catch_unwind(AssertUnwindSafe(main)) {
        Ok(value) => value,
        // Unwound: every guard has restored the machine by now.
        Err(payload) if is_closed_stdout(&*payload) => exit(),
        Err(payload) => panic::resume_unwind(payload),
    }
}

/// Ends the process killed by SIGPIPE, as `yes | head -1` ends `yes`: the
/// shell prints nothing for it, and its exit status is 128+13 = 141, the one
/// `set -o pipefail` scripts already expect from any producer whose reader
/// stopped early. Exit 0 would claim that everything was printed; exit 2 is
/// our "bad input" and would be wrong too.
fn exit() -> ! {
    // SAFETY: plain signal-disposition and mask calls on this process; no
    // guard is live any more (the unwinding dropped them).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(libc::SIGPIPE);
    }
    // Not reached: SIGPIPE's default action ends the process.
    std::process::exit(128 + libc::SIGPIPE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epipe_panic() {
        let epipe = io::Error::from_raw_os_error(libc::EPIPE);
        panic!("failed printing to stdout: {epipe}");
    }

    #[test]
    fn the_closed_stdout_panic_is_recognized_by_its_payload() {
        let payload = panic::catch_unwind(epipe_panic).unwrap_err();
        assert!(is_closed_stdout(&*payload));
        let other = panic::catch_unwind(|| panic!("failed printing to stdout: other")).unwrap_err();
        assert!(!is_closed_stdout(&*other));
    }

    /// A print into a closed pipe on another thread (it is silenced, and
    /// its thread ends) does not make a later, unrelated panic of the
    /// command a quiet end: that panic goes on unwinding, reported. (Had
    /// `run` ended the process instead, this test binary would have died
    /// of SIGPIPE.)
    #[test]
    fn an_unrelated_panic_after_an_epipe_on_another_thread_is_still_a_panic() {
        let caught = panic::catch_unwind(|| {
            run(|| {
                assert!(std::thread::spawn(epipe_panic).join().is_err());
                panic!("a bug in the command");
            })
        })
        .unwrap_err();
        assert_eq!(caught.downcast_ref::<&str>(), Some(&"a bug in the command"));
    }
}
