//! Error numbers of failed system calls, by the names of
//! `include/uapi/asm-generic/errno-base.h` and `errno.h` (the numbers are
//! those of x86_64 and arm64, which share the generic table).
//!
//! A statement whose system call fails does not stop a workload: the backend
//! reports the errno, the run goes on, and `expect errno == EAGAIN` on the
//! next line checks it (`expect errno == 0`: the statement succeeded).

use serde::{Serialize, Serializer};
use std::fmt;

/// An errno, 0 meaning success.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Errno(pub i32);

/// Every errno hugelab knows by name.
const NAMES: NameTable = NameTable(&[
    ("EPERM", 1),
    ("ENOENT", 2),
    ("ESRCH", 3),
    ("EINTR", 4),
    ("EIO", 5),
    ("ENXIO", 6),
    ("E2BIG", 7),
    ("EBADF", 9),
    ("EAGAIN", 11),
    ("ENOMEM", 12),
    ("EACCES", 13),
    ("EFAULT", 14),
    ("EBUSY", 16),
    ("EEXIST", 17),
    ("ENODEV", 19),
    ("EINVAL", 22),
    ("ENOSPC", 28),
    ("EROFS", 30),
    ("ERANGE", 34),
    ("ENOSYS", 38),
    ("EOVERFLOW", 75),
    ("EOPNOTSUPP", 95),
    ("EHWPOISON", 133),
]);

impl Errno {
    pub const OK: Errno = Errno(0);
    pub const EPERM: Errno = Errno(1);
    pub const ENOENT: Errno = Errno(2);
    pub const ENXIO: Errno = Errno(6);
    pub const EAGAIN: Errno = Errno(11);
    pub const ENOMEM: Errno = Errno(12);
    pub const EFAULT: Errno = Errno(14);
    pub const EBUSY: Errno = Errno(16);
    pub const EEXIST: Errno = Errno(17);
    pub const EINVAL: Errno = Errno(22);

    /// `EAGAIN`, `0`, or the number of an errno without a name here.
    pub fn name(self) -> String {
        NAMES.name(self.0, "errno")
    }

    /// `EAGAIN` or `0`.
    pub fn from_name(s: &str) -> Option<Errno> {
        NAMES.number(s).map(Errno)
    }

    /// The names `from_name` accepts, for error messages.
    pub fn known_names() -> impl Iterator<Item = &'static str> {
        NAMES.names()
    }
}

/// The kernel's names for a kind of number (errnos, signals), 0 being
/// written `0` (no error, no signal).
pub(crate) struct NameTable(pub &'static [(&'static str, i32)]);

impl NameTable {
    /// The name of `n`, `0`, or `<kind> <n>` for a number without one.
    pub fn name(&self, n: i32, kind: &str) -> String {
        if n == 0 {
            return "0".into();
        }
        self.0
            .iter()
            .find(|(_, v)| *v == n)
            .map_or_else(|| format!("{kind} {n}"), |(name, _)| name.to_string())
    }

    /// The number named `s` (`0` included).
    pub fn number(&self, s: &str) -> Option<i32> {
        if s == "0" {
            return Some(0);
        }
        self.0.iter().find(|(name, _)| *name == s).map(|(_, n)| *n)
    }

    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.iter().map(|(name, _)| *name)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl Serialize for Errno {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in Errno::known_names().chain(["0"]) {
            assert_eq!(Errno::from_name(name).unwrap().name(), name);
        }
        assert_eq!(Errno::from_name("EWHAT"), None);
        assert_eq!(Errno(200).name(), "errno 200");
    }
}
