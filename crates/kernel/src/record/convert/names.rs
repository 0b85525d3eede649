//! Names the workload gives what it recorded: processes after their
//! programs (`make`, `cc1-3`), files after their basenames (`libc.so.6`),
//! regions after what they map (`libc_so_6-data`, `heap`, `stack`,
//! `anon3`), each made valid in the language and unique where it must be.

use std::collections::{HashMap, HashSet};

/// A name of the language (`[A-Za-z_][A-Za-z0-9_-]*`) close to `s`.
pub fn ident(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.insert(0, '_');
    }
    // A line starting with a top-level keyword is that statement.
    if hugelab_workload::text::RESERVED.contains(&out.as_str()) {
        out.push('_');
    }
    out
}

/// A file name of the language (`[A-Za-z0-9_][A-Za-z0-9_.+-]*`) for a path.
fn file_ident(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let base = base.strip_suffix(" (deleted)").unwrap_or(base);
    let mut out: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
        out.insert(0, '_');
    }
    out
}

/// Names handed out once each: `base`, then `base-2`, `base-3`...
#[derive(Default, Debug, Clone)]
pub struct Unique {
    taken: HashSet<String>,
}

impl Unique {
    pub fn take(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut n = 1;
        while !self.taken.insert(name.clone()) {
            n += 1;
            name = format!("{base}-{n}");
        }
        name
    }
}

/// The workload's files, one per path.
#[derive(Default)]
pub struct Files {
    by_path: HashMap<String, String>,
    names: Unique,
}

impl Files {
    pub fn name(&mut self, path: &str) -> String {
        if let Some(n) = self.by_path.get(path) {
            return n.clone();
        }
        let n = self.names.take(&file_ident(path));
        self.by_path.insert(path.to_string(), n.clone());
        n
    }

    pub fn count(&self) -> usize {
        self.by_path.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_and_unique() {
        assert_eq!(ident("cc1"), "cc1");
        assert_eq!(ident("1cc"), "_1cc");
        assert_eq!(ident("python3.12"), "python3_12");
        assert_eq!(ident("split"), "split_");
        let mut u = Unique::default();
        assert_eq!(u.take("cc1"), "cc1");
        assert_eq!(u.take("cc1"), "cc1-2");
        assert_eq!(u.take("cc1"), "cc1-3");
        let mut f = Files::default();
        assert_eq!(f.name("/usr/lib/x86_64-linux-gnu/libc.so.6"), "libc.so.6");
        assert_eq!(f.name("/usr/lib/x86_64-linux-gnu/libc.so.6"), "libc.so.6");
        assert_eq!(f.name("/opt/libc.so.6"), "libc.so.6-2");
        assert_eq!(f.name("/memfd:x (deleted)"), "memfd_x");
    }
}
