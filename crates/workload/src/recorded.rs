//! The header `hugelab record` writes at the top of a recording, read back:
//! when and on which kernel the program was recorded, its command, and the
//! THP settings files it read while recorded. Every tool that needs to know
//! where a workload came from reads it here.
//!
//! The header is comment lines before the first statement:
//!
//! ```text
//! # A program recorded by `hugelab record` on 2026-11-27T17:38:59Z, Linux 6.18.44-fc-v657, with THP off for its whole tree:
//! #   /usr/bin/python3.11 stdlib.py
//! # 97658 events in 3.198 s: 95527 page faults, 1 processes, 0 threads, 0 execs.
//! # THP settings read by the program: python3_11 transparent_hugepage/enabled
//! ```
//!
//! A workload without the first line is not a recording (a hand-written
//! workload): [`parse_header`] gives `None`.

use crate::parse::ParseError;
use std::io::BufRead;
use std::path::Path;

/// What the first line of a recording starts with.
const FIRST: &str = "A program recorded by `hugelab record` on ";
/// The line naming the THP settings files the program read.
const THP_READS: &str = "THP settings read by the program: ";
/// How many leading comment lines are looked at.
const MAX_LINES: usize = 64;

/// A recording's header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordingHeader {
    /// When the recording was made, as written (RFC 3339).
    pub date: String,
    /// The kernel release the program ran on (`uname -r`).
    pub kernel: String,
    /// The recorded command line, as written.
    pub command: String,
    /// Whether the program ran with THP off (the recorder's way: then what
    /// it read of the THP settings said "never").
    pub thp_off: bool,
    /// The THP sysfs files a process read while recorded: (process, path
    /// relative to /sys/kernel/mm/), in the order written.
    pub thp_reads: Vec<(String, String)>,
}

impl RecordingHeader {
    /// Whether the recording was made on `release` (`6.18`): the same
    /// version, whatever the stable release and local suffix after it.
    pub fn kernel_is(&self, release: &str) -> bool {
        match self.kernel.strip_prefix(release) {
            Some(rest) => rest.is_empty() || rest.starts_with(['.', '-', '+']),
            None => false,
        }
    }
}

/// The header in the leading comment lines of a workload's text (each
/// without its `# `), or `None` when the text is not a recording.
pub fn parse_header<'a>(comments: impl IntoIterator<Item = &'a str>) -> Option<RecordingHeader> {
    let mut lines = comments.into_iter().map(str::trim_end);
    let first = lines.next()?.strip_prefix(FIRST)?;
    let (date, rest) = first.split_once(", Linux ")?;
    let kernel = rest.split([',', ' ']).next()?;
    let mut h = RecordingHeader {
        date: date.to_string(),
        kernel: kernel.to_string(),
        thp_off: rest.contains("with THP off"),
        ..RecordingHeader::default()
    };
    h.command = lines.next().unwrap_or("").trim().to_string();
    for line in lines {
        if let Some(reads) = line.strip_prefix(THP_READS) {
            for read in reads.split(',').map(str::trim).filter(|r| !r.is_empty()) {
                if let Some((proc, path)) = read.split_once(' ') {
                    h.thp_reads
                        .push((proc.to_string(), path.trim().to_string()));
                }
            }
        }
    }
    Some(h)
}

/// The header of the workload file at `path` (plain or compressed), read
/// from its leading comment lines; `None` for a file that is not a
/// recording.
pub fn read_header(path: &Path) -> Result<Option<RecordingHeader>, ParseError> {
    let mut source = crate::source::open(path)?;
    let mut comments = Vec::new();
    let mut line = String::new();
    while comments.len() < MAX_LINES {
        line.clear();
        let read = source.read_line(&mut line).map_err(|e| ParseError {
            file: path.display().to_string(),
            line: comments.len() as u32 + 1,
            col: 0,
            message: format!("cannot read: {e}"),
        })?;
        match line.strip_prefix('#') {
            Some(text) if read > 0 => {
                comments.push(text.strip_prefix(' ').unwrap_or(text).to_string())
            }
            _ => break,
        }
    }
    Ok(parse_header(comments.iter().map(String::as_str)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECORDED: &str = "\
A program recorded by `hugelab record` on 2026-11-27T17:38:59Z, Linux 6.18.44-fc-v657, with THP off for its whole tree:
  /root/.pyenv/versions/3.11.7/bin/python3.11 stdlib.py
97658 events in 3.198 s: 95527 page faults, 1 processes, 0 threads, 0 execs.
THP settings read by the program: python3_11 transparent_hugepage/enabled, java transparent_hugepage/hugepages-2048kB/enabled
Replay it with `hugelab run` (the model) or `hugelab diff` (model and kernel); what was not
replayed is counted at the end.";

    #[test]
    fn a_recording_header_gives_date_kernel_command_and_thp_reads() {
        let h = parse_header(RECORDED.lines()).unwrap();
        assert_eq!(h.date, "2026-11-27T17:38:59Z");
        assert_eq!(h.kernel, "6.18.44-fc-v657");
        assert!(h.thp_off);
        assert_eq!(
            h.command,
            "/root/.pyenv/versions/3.11.7/bin/python3.11 stdlib.py"
        );
        assert_eq!(
            h.thp_reads,
            vec![
                ("python3_11".into(), "transparent_hugepage/enabled".into()),
                (
                    "java".into(),
                    "transparent_hugepage/hugepages-2048kB/enabled".into()
                ),
            ]
        );
        assert!(h.kernel_is("6.18"));
        assert!(!h.kernel_is("6.1"));
        assert!(!h.kernel_is("6.12"));
    }

    #[test]
    fn a_header_without_thp_reads_has_none() {
        let text = RECORDED.replace(
            "THP settings read by the program: python3_11 transparent_hugepage/enabled, java transparent_hugepage/hugepages-2048kB/enabled\n",
            "",
        );
        let h = parse_header(text.lines()).unwrap();
        assert!(h.thp_reads.is_empty());
        assert!(h.kernel_is("6.18"));
    }

    #[test]
    fn a_hand_written_workload_has_no_header() {
        assert_eq!(parse_header(["a workload by hand", "more"]), None);
        assert_eq!(parse_header([]), None);
    }

    #[test]
    fn another_kernel_is_told_apart() {
        let text = RECORDED.replace("Linux 6.18.44-fc-v657", "Linux 6.12.9");
        let h = parse_header(text.lines()).unwrap();
        assert_eq!(h.kernel, "6.12.9");
        assert!(!h.kernel_is("6.18"));
        let exact = RECORDED.replace("Linux 6.18.44-fc-v657", "Linux 6.18");
        assert!(parse_header(exact.lines()).unwrap().kernel_is("6.18"));
    }

    #[test]
    fn read_header_reads_a_file_and_stops_at_the_first_statement() {
        let dir = std::env::temp_dir().join(format!("hugelab-recorded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.hlw");
        let text: String = RECORDED.lines().map(|l| format!("# {l}\n")).collect();
        std::fs::write(
            &path,
            format!("{text}spawn a\n# THP settings read by the program: a x\n"),
        )
        .unwrap();
        let h = read_header(&path).unwrap().unwrap();
        assert_eq!(h.thp_reads.len(), 2);
        std::fs::write(&path, "spawn a\n").unwrap();
        assert_eq!(read_header(&path).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
