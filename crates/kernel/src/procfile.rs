//! A /proc or sysfs file kept open and read again from its start: each read
//! at offset 0 makes the kernel show the file afresh (`seq_read_iter` sees a
//! position other than where the last read stopped and restarts: `traverse`
//! to 0), so a reading costs one or a few `pread`s instead of an open, a
//! stat, reads and a close — the path walk of a sysfs open was a quarter of
//! a measurement window's time.
//!
//! Opened at the first read, so that a reader can be built where the file
//! cannot be opened (not root) and fail only when it is used.

use crate::error::{KernelError, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub struct ProcFile {
    path: PathBuf,
    file: Option<File>,
    write: bool,
    /// Shown as one record (see [`ProcFile::single`]).
    single: bool,
}

impl ProcFile {
    /// A file to read, to its end.
    pub fn new(path: impl Into<PathBuf>) -> ProcFile {
        ProcFile {
            path: path.into(),
            file: None,
            write: false,
            single: false,
        }
    }

    /// A file the kernel shows whole at each read from 0: a sysfs
    /// attribute, a sysctl, or a /proc file of `single_open` (/proc/meminfo,
    /// whose one record `seq_read_iter` grows its buffer to fit). A read
    /// that comes back short has all of it, so the read that would return
    /// 0 is saved. (A seq_file of many records, /proc/vmstat, comes back a
    /// page at a time.)
    pub fn single(path: impl Into<PathBuf>) -> ProcFile {
        ProcFile {
            single: true,
            ..ProcFile::new(path)
        }
    }

    /// A file to write (a sysctl that acts when written).
    pub fn writable(path: impl Into<PathBuf>) -> ProcFile {
        ProcFile {
            write: true,
            ..ProcFile::new(path)
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file, and the path for errors.
    fn open(&mut self) -> Result<(&File, &Path)> {
        if self.file.is_none() {
            let f = OpenOptions::new()
                .read(!self.write)
                .write(self.write)
                .open(&self.path)
                .map_err(|e| KernelError::io(&self.path, e))?;
            self.file = Some(f);
        }
        Ok((self.file.as_ref().expect("opened above"), &self.path))
    }

    /// The whole file, afresh, into `buf` (cleared first). It allocates only
    /// when the file outgrows `buf`'s capacity, so that a buffer written
    /// once (see `vmstat::touched`) takes no fault here.
    pub fn read_into(&mut self, buf: &mut Vec<u8>) -> Result<()> {
        buf.clear();
        let single = self.single;
        let (file, path) = self.open()?;
        loop {
            if buf.len() == buf.capacity() {
                buf.reserve(4096);
            }
            let len = buf.len();
            buf.resize(buf.capacity(), 0);
            let asked = buf.len() - len;
            let read = file.read_at(&mut buf[len..], len as u64);
            buf.truncate(len + *read.as_ref().unwrap_or(&0));
            match read {
                Ok(0) => return Ok(()),
                Ok(n) if single && n < asked => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(KernelError::io(path, e)),
            }
        }
    }

    /// Writes `data` at offset 0, as `echo data > file` does.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        let (file, path) = self.open()?;
        file.write_at(data, 0)
            .map(|_| ())
            .map_err(|e| KernelError::io(path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_afresh_from_the_start() {
        let dir = std::env::temp_dir().join(format!("hugelab-procfile-{}", std::process::id()));
        std::fs::write(&dir, "one\n").unwrap();
        let mut f = ProcFile::new(&dir);
        let mut buf = Vec::with_capacity(2);
        f.read_into(&mut buf).unwrap();
        assert_eq!(buf, b"one\n");
        std::fs::write(&dir, "two, longer\n").unwrap();
        f.read_into(&mut buf).unwrap();
        assert_eq!(buf, b"two, longer\n");
        let mut one = ProcFile::single(&dir);
        one.read_into(&mut buf).unwrap();
        assert_eq!(buf, b"two, longer\n");
        std::fs::remove_file(&dir).unwrap();
        assert!(ProcFile::new(&dir).read_into(&mut buf).is_err());
    }

    #[test]
    fn a_file_of_many_records_is_read_to_its_end() {
        // /proc/zoneinfo is a seq_file of one record per zone, longer than
        // the page a read of it returns (/proc/vmstat is less than a page
        // on some builds: 4036 bytes seen). Its figures move; its words
        // before the figures do not.
        let mut f = ProcFile::new("/proc/zoneinfo");
        let mut buf = Vec::with_capacity(1 << 10);
        f.read_into(&mut buf).unwrap();
        let whole = std::fs::read("/proc/zoneinfo").unwrap();
        let names = |b: &[u8]| -> Vec<Vec<u8>> {
            b.split(|c| *c == b'\n')
                .map(|l| {
                    l.split(|c| c.is_ascii_digit())
                        .next()
                        .unwrap_or_default()
                        .to_vec()
                })
                .collect()
        };
        assert!(buf.len() > 4096, "{} bytes", buf.len());
        assert_eq!(names(&buf), names(&whole));
    }

    #[test]
    fn a_proc_file_changes_between_reads() {
        let mut f = ProcFile::new("/proc/self/stat");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        f.read_into(&mut a).unwrap();
        f.read_into(&mut b).unwrap();
        assert!(a.starts_with(std::process::id().to_string().as_bytes()));
        assert!(b.starts_with(std::process::id().to_string().as_bytes()));
    }
}
