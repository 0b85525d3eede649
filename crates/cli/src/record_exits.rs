//! The recorder's readings at each process's exit, named as the workload
//! names the processes, and the `expect` lines that check a replay
//! against them.

use crate::table;
use hugelab_kernel::record::MmStat;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::rc::Rc;

/// One process of the workload as the recorded run measured it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Measured {
    /// The workload's name for it.
    pub process: String,
    pub pid: u32,
    /// Its mms the recorder read (one per exec, plus the first).
    pub mms: usize,
    /// Minor faults over its mms that were read.
    pub minflt: u64,
    /// RssAnon and RssShmem of its last mm when it ended, kB.
    pub anon_kb: u64,
    pub shmem_kb: u64,
    /// Every mm of it, from the first, was read, the last at its exit: its
    /// figures are the whole process's.
    pub whole: bool,
}

/// The readings grouped per process, in the workload's order of processes
/// (`named`: pid and name, as the conversion gives them). Readings of a
/// process the workload has no name for are left out.
pub fn by_process(named: &[(u32, String)], exits: &[MmStat]) -> Vec<Measured> {
    let mut key = HashMap::new();
    let mut seen: HashMap<u32, u32> = HashMap::new();
    for (i, (pid, _)) in named.iter().enumerate() {
        let n = seen.entry(*pid).or_default();
        key.insert((*pid, *n), i);
        *n += 1;
    }
    let mut mms: Vec<Vec<&MmStat>> = vec![Vec::new(); named.len()];
    for s in exits {
        if let Some(&i) = key.get(&(s.pid, s.incarnation)) {
            mms[i].push(s);
        }
    }
    named
        .iter()
        .zip(mms)
        .filter(|(_, m)| !m.is_empty())
        .map(|((pid, name), mut m)| {
            m.sort_by_key(|s| s.generation);
            let last = m.last().expect("not empty");
            let whole = last.ended_by == "exit"
                && m.iter()
                    .enumerate()
                    .all(|(g, s)| s.generation as usize == g);
            Measured {
                process: name.clone(),
                pid: *pid,
                mms: m.len(),
                minflt: m.iter().map(|s| s.minflt).sum(),
                anon_kb: last.anon_kb,
                shmem_kb: last.shmem_kb,
                whole,
            }
        })
        .collect()
}

/// The `expect` line of a process at its exit snapshot: its anonymous
/// memory (smaps' `Anonymous`, the process's regions summed, is what
/// RssAnon counts: anonymous pages mapped, including the copies in private
/// file mappings). Only for a process measured at its exit. Not its minor
/// faults: the kernel's count holds faults no workload statement stands
/// for (those through get_user_pages at exec, on the vdso), so the
/// replayed faults are what `stat.<proc>.minflt` is checked against.
/// Not RssShmem: no counter of the model is a process's shmem alone.
pub fn expects(m: &Measured) -> String {
    if !m.whole {
        return String::new();
    }
    format!(
        "expect smaps.{p}.Anonymous == {a}   # kB, RssAnon at its exit\n",
        p = m.process,
        a = m.anon_kb,
    )
}

/// A writer that passes the workload through and, after each
/// `snapshot <proc>-exit` line, adds that process's [`expects`] (filled in
/// `figures` once the conversion has named the processes).
pub struct ExpectWriter<'w> {
    inner: &'w mut dyn Write,
    pub figures: Rc<RefCell<BTreeMap<String, Measured>>>,
    line: Vec<u8>,
}

impl<'w> ExpectWriter<'w> {
    pub fn new(inner: &'w mut dyn Write) -> ExpectWriter<'w> {
        ExpectWriter {
            inner,
            figures: Rc::default(),
            line: Vec::new(),
        }
    }

    fn line_done(&mut self) -> io::Result<()> {
        self.inner.write_all(&self.line)?;
        let text = std::str::from_utf8(&self.line).unwrap_or("");
        let after = text
            .trim_end()
            .strip_prefix("snapshot ")
            .and_then(|s| s.strip_suffix("-exit"))
            .and_then(|p| self.figures.borrow().get(p).map(expects));
        if let Some(lines) = after {
            self.inner.write_all(lines.as_bytes())?;
        }
        self.line.clear();
        Ok(())
    }
}

impl Write for ExpectWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for chunk in buf.split_inclusive(|&b| b == b'\n') {
            self.line.extend_from_slice(chunk);
            if chunk.ends_with(b"\n") {
                self.line_done()?;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.line.is_empty() {
            self.inner.write_all(&self.line)?;
            self.line.clear();
        }
        self.inner.flush()
    }
}

/// The table of the processes' figures (after the recording's lines).
pub fn table(
    measured: &[Measured],
    replayed: &BTreeMap<String, u64>,
    raced: &BTreeMap<String, u64>,
) -> String {
    let header: Vec<String> = [
        "process",
        "pid",
        "mms",
        "minflt measured",
        "faults replayed",
        "raced (not replayed)",
        "anon kB",
        "shmem kB",
    ]
    .map(String::from)
    .to_vec();
    let rows: Vec<Vec<String>> = measured
        .iter()
        .map(|m| {
            vec![
                m.process.clone(),
                m.pid.to_string(),
                format!("{}{}", m.mms, if m.whole { "" } else { " (part)" }),
                m.minflt.to_string(),
                replayed.get(&m.process).copied().unwrap_or(0).to_string(),
                raced.get(&m.process).copied().unwrap_or(0).to_string(),
                m.anon_kb.to_string(),
                m.shmem_kb.to_string(),
            ]
        })
        .collect();
    table::render_text(&header, &rows)
}

/// The table of the readings themselves, per mm (the summary's, which has
/// no workload names).
pub fn mm_table(exits: &[MmStat]) -> String {
    let header: Vec<String> = [
        "pid", "comm", "mm", "ended by", "minflt", "anon kB", "shmem kB",
    ]
    .map(String::from)
    .to_vec();
    let rows: Vec<Vec<String>> = exits
        .iter()
        .map(|s| {
            vec![
                s.pid.to_string(),
                s.comm.clone(),
                s.generation.to_string(),
                s.ended_by.to_string(),
                s.minflt.to_string(),
                s.anon_kb.to_string(),
                s.shmem_kb.to_string(),
            ]
        })
        .collect();
    table::render_text(&header, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mm(pid: u32, incarnation: u32, generation: u32, ended_by: &'static str) -> MmStat {
        MmStat {
            pid,
            incarnation,
            generation,
            ended_by,
            comm: "c".into(),
            minflt: 10 + u64::from(generation),
            anon_kb: 100 + u64::from(generation),
            shmem_kb: 0,
        }
    }

    #[test]
    fn readings_are_matched_by_pid_and_incarnation() {
        let named = vec![
            (10, "sh".to_string()),
            (11, "cc1".to_string()),
            (11, "cc1-2".to_string()),
        ];
        let exits = vec![
            mm(11, 0, 0, "exec"),
            mm(11, 0, 1, "exit"),
            mm(11, 1, 0, "exit"),
            mm(10, 0, 1, "exit"),
        ];
        let m = by_process(&named, &exits);
        assert_eq!(m.len(), 3);
        assert_eq!((m[0].process.as_str(), m[0].whole), ("sh", false));
        assert_eq!((m[1].minflt, m[1].anon_kb, m[1].mms), (21, 101, 2));
        assert!(m[1].whole);
        assert_eq!((m[2].process.as_str(), m[2].minflt), ("cc1-2", 10));
    }

    #[test]
    fn expects_follow_the_exit_snapshot() {
        let mut out = Vec::new();
        {
            let mut w = ExpectWriter::new(&mut out);
            w.figures.borrow_mut().insert(
                "a".into(),
                Measured {
                    process: "a".into(),
                    whole: true,
                    minflt: 7,
                    anon_kb: 24,
                    ..Measured::default()
                },
            );
            w.write_all(b"spawn a\na write r\nsnap").unwrap();
            w.write_all(b"shot a-exit\na exit\nsnapshot b-exit\n# end")
                .unwrap();
            w.flush().unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "spawn a\na write r\nsnapshot a-exit\nexpect smaps.a.Anonymous == 24   # kB, RssAnon at its exit\na exit\nsnapshot b-exit\n# end"
        );
    }
}
