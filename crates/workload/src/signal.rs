//! Signals that kill a process, by the names of `include/uapi/asm-generic/signal.h`
//! (x86_64 and arm64 share them).
//!
//! A process the kernel kills while it runs a statement (SIGBUS: a HugeTLB
//! fault with no page in the pool; SIGKILL: the OOM killer) is an outcome
//! of the workload, not an error: the backend retires the process as `exit`
//! would, the run goes on, and `expect signal == SIGBUS` on the next line
//! checks it (`expect signal == 0`: the process was not killed).

use crate::errno::NameTable;
use serde::{Serialize, Serializer};
use std::fmt;

/// A signal number, 0 meaning none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signal(pub i32);

/// Every signal hugelab knows by name.
const NAMES: NameTable = NameTable(&[
    ("SIGHUP", 1),
    ("SIGINT", 2),
    ("SIGQUIT", 3),
    ("SIGILL", 4),
    ("SIGTRAP", 5),
    ("SIGABRT", 6),
    ("SIGBUS", 7),
    ("SIGFPE", 8),
    ("SIGKILL", 9),
    ("SIGUSR1", 10),
    ("SIGSEGV", 11),
    ("SIGUSR2", 12),
    ("SIGPIPE", 13),
    ("SIGALRM", 14),
    ("SIGTERM", 15),
]);

impl Signal {
    pub const NONE: Signal = Signal(0);
    pub const SIGBUS: Signal = Signal(7);
    pub const SIGKILL: Signal = Signal(9);
    pub const SIGSEGV: Signal = Signal(11);

    /// `SIGBUS`, `0`, or `signal N` for one without a name here.
    pub fn name(self) -> String {
        NAMES.name(self.0, "signal")
    }

    /// `SIGBUS` or `0`.
    pub fn from_name(s: &str) -> Option<Signal> {
        NAMES.number(s).map(Signal)
    }

    /// The names `from_name` accepts, for error messages.
    pub fn known_names() -> impl Iterator<Item = &'static str> {
        NAMES.names()
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl Serialize for Signal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in Signal::known_names().chain(["0"]) {
            assert_eq!(Signal::from_name(name).unwrap().name(), name);
        }
        assert_eq!(Signal::from_name("SIGWHAT"), None);
        assert_eq!(Signal::from_name("7"), None);
        assert_eq!(Signal(40).name(), "signal 40");
        assert_eq!(Signal::SIGBUS.to_string(), "SIGBUS");
    }
}
