//! The raw capture on disk: every event of a recording, in time order, in a
//! compact binary form compressed with zstd, so that converting it into a
//! workload takes two passes over a file instead of memory in proportion to
//! the recording. The file is unlinked as soon as it is opened (`O_TMPFILE`
//! where the filesystem has it): nothing is left behind, whatever ends the
//! recording.
//!
//! An event is a tag byte, `time`, `pid`, `tid`, then its kind's fields in
//! declaration order, little endian; strings are a u16 length and bytes.

use super::event::{Event, Kind};
use crate::error::{KernelError, Result};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

const LEVEL: i32 = 1;

/// Where the spool is being written.
pub struct Writer {
    z: zstd::stream::write::Encoder<'static, BufWriter<File>>,
    pub events: u64,
}

/// Opens an anonymous file in `dir` (unlinked at once).
fn anonymous_file(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmpfile = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    match tmpfile {
        Ok(f) => Ok(f),
        Err(_) => {
            let path = dir.join(format!("hugelab-record-{}.spool", std::process::id()));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(f)
        }
    }
}

fn spool_error(dir: &Path, e: io::Error) -> KernelError {
    KernelError::Refused(format!(
        "cannot write the recording's spool in {}: {e}",
        dir.display()
    ))
}

impl Writer {
    pub fn create(dir: &Path) -> Result<Writer> {
        let f = anonymous_file(dir).map_err(|e| spool_error(dir, e))?;
        let z = zstd::stream::write::Encoder::new(BufWriter::with_capacity(1 << 20, f), LEVEL)
            .map_err(|e| spool_error(dir, e))?;
        Ok(Writer { z, events: 0 })
    }

    pub fn push(&mut self, e: &Event) -> io::Result<()> {
        let mut b = Vec::with_capacity(64);
        encode(e, &mut b);
        self.events += 1;
        self.z.write_all(&b)
    }

    /// Ends the stream and hands the file back for reading.
    pub fn finish(self) -> io::Result<Spool> {
        let mut f = self.z.finish()?.into_inner().map_err(|e| e.into_error())?;
        f.flush()?;
        let bytes = f.seek(SeekFrom::End(0))?;
        Ok(Spool {
            file: f,
            events: self.events,
            bytes,
        })
    }
}

/// A finished spool, read as many times as needed.
pub struct Spool {
    file: File,
    pub events: u64,
    /// Its compressed size.
    pub bytes: u64,
}

impl Spool {
    /// Every event, from the start.
    pub fn events(&mut self) -> io::Result<Events<'_>> {
        self.file.seek(SeekFrom::Start(0))?;
        let z = zstd::stream::read::Decoder::new(&self.file)?;
        Ok(Events {
            r: BufReader::with_capacity(1 << 20, z),
        })
    }
}

pub struct Events<'a> {
    r: BufReader<zstd::stream::read::Decoder<'static, BufReader<&'a File>>>,
}

impl Iterator for Events<'_> {
    type Item = io::Result<Event>;
    fn next(&mut self) -> Option<io::Result<Event>> {
        let mut tag = [0u8];
        match self.r.read(&mut tag) {
            Ok(0) => None,
            Ok(_) => Some(decode(tag[0], &mut self.r)),
            Err(e) => Some(Err(e)),
        }
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    b.extend((s.len() as u16).to_le_bytes());
    b.extend(s);
}

fn encode(e: &Event, b: &mut Vec<u8>) {
    let tag = match e.kind {
        Kind::Fault { .. } => 0,
        Kind::SysEnter { .. } => 1,
        Kind::SysExit { .. } => 2,
        Kind::NewTask { .. } => 3,
        Kind::Exec { .. } => 4,
        Kind::Mmap2 { .. } => 5,
        Kind::Comm { .. } => 6,
        Kind::Fork { .. } => 7,
        Kind::Exit { .. } => 8,
        Kind::Lost { .. } => 9,
    };
    b.push(tag);
    b.extend(e.time.to_le_bytes());
    b.extend(e.pid.to_le_bytes());
    b.extend(e.tid.to_le_bytes());
    match &e.kind {
        Kind::Fault {
            addr,
            error_code,
            user,
        } => {
            b.extend(addr.to_le_bytes());
            b.extend(error_code.to_le_bytes());
            b.push(u8::from(*user));
        }
        Kind::SysEnter { nr, args } => {
            b.extend(nr.to_le_bytes());
            for a in args {
                b.extend(a.to_le_bytes());
            }
        }
        Kind::SysExit { nr, ret } => {
            b.extend(nr.to_le_bytes());
            b.extend(ret.to_le_bytes());
        }
        Kind::NewTask {
            child,
            comm,
            clone_flags,
        } => {
            b.extend(child.to_le_bytes());
            put_str(b, comm);
            b.extend(clone_flags.to_le_bytes());
        }
        Kind::Exec { filename, old_pid } => {
            put_str(b, filename);
            b.extend(old_pid.to_le_bytes());
        }
        Kind::Mmap2 {
            addr,
            len,
            pgoff,
            prot,
            flags,
            filename,
        } => {
            for v in [addr, len, pgoff] {
                b.extend(v.to_le_bytes());
            }
            b.extend(prot.to_le_bytes());
            b.extend(flags.to_le_bytes());
            put_str(b, filename);
        }
        Kind::Comm { comm, exec } => {
            put_str(b, comm);
            b.push(u8::from(*exec));
        }
        Kind::Fork { ppid, ptid } | Kind::Exit { ppid, ptid } => {
            b.extend(ppid.to_le_bytes());
            b.extend(ptid.to_le_bytes());
        }
        Kind::Lost { count } => b.extend(count.to_le_bytes()),
    }
}

fn u64_of(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn u32_of(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn u8_of(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

fn str_of(r: &mut impl Read) -> io::Result<String> {
    let mut n = [0u8; 2];
    r.read_exact(&mut n)?;
    let mut s = vec![0u8; u16::from_le_bytes(n) as usize];
    r.read_exact(&mut s)?;
    Ok(String::from_utf8_lossy(&s).into_owned())
}

fn decode(tag: u8, r: &mut impl Read) -> io::Result<Event> {
    let time = u64_of(r)?;
    let pid = u32_of(r)?;
    let tid = u32_of(r)?;
    let kind = match tag {
        0 => Kind::Fault {
            addr: u64_of(r)?,
            error_code: u64_of(r)?,
            user: u8_of(r)? != 0,
        },
        1 => {
            let nr = u64_of(r)? as i64;
            let mut args = [0u64; 6];
            for a in &mut args {
                *a = u64_of(r)?;
            }
            Kind::SysEnter { nr, args }
        }
        2 => Kind::SysExit {
            nr: u64_of(r)? as i64,
            ret: u64_of(r)? as i64,
        },
        3 => Kind::NewTask {
            child: u32_of(r)?,
            comm: str_of(r)?,
            clone_flags: u64_of(r)?,
        },
        4 => Kind::Exec {
            filename: str_of(r)?,
            old_pid: u32_of(r)?,
        },
        5 => Kind::Mmap2 {
            addr: u64_of(r)?,
            len: u64_of(r)?,
            pgoff: u64_of(r)?,
            prot: u32_of(r)?,
            flags: u32_of(r)?,
            filename: str_of(r)?,
        },
        6 => Kind::Comm {
            comm: str_of(r)?,
            exec: u8_of(r)? != 0,
        },
        7 | 8 => {
            let (ppid, ptid) = (u32_of(r)?, u32_of(r)?);
            if tag == 7 {
                Kind::Fork { ppid, ptid }
            } else {
                Kind::Exit { ppid, ptid }
            }
        }
        9 => Kind::Lost { count: u64_of(r)? },
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the recording's spool is corrupt (event tag {tag})"),
            ))
        }
    };
    Ok(Event {
        time,
        pid,
        tid,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(time: u64, kind: Kind) -> Event {
        Event {
            time,
            pid: 7,
            tid: 8,
            kind,
        }
    }

    #[test]
    fn every_kind_comes_back_as_it_went_in_twice() {
        let events = vec![
            ev(
                1,
                Kind::Fault {
                    addr: 0x7f00_0000_1000,
                    error_code: 6,
                    user: true,
                },
            ),
            ev(
                2,
                Kind::SysEnter {
                    nr: 9,
                    args: [1, 2, 3, 4, u64::MAX, 6],
                },
            ),
            ev(3, Kind::SysExit { nr: 9, ret: -12 }),
            ev(
                4,
                Kind::NewTask {
                    child: 9,
                    comm: "cc1".into(),
                    clone_flags: 0x4100,
                },
            ),
            ev(
                5,
                Kind::Exec {
                    filename: "/usr/bin/true".into(),
                    old_pid: 7,
                },
            ),
            ev(
                6,
                Kind::Mmap2 {
                    addr: 1,
                    len: 2,
                    pgoff: 3,
                    prot: 4,
                    flags: 5,
                    filename: "[heap]".into(),
                },
            ),
            ev(
                7,
                Kind::Comm {
                    comm: "true".into(),
                    exec: true,
                },
            ),
            ev(8, Kind::Fork { ppid: 1, ptid: 2 }),
            ev(9, Kind::Exit { ppid: 3, ptid: 4 }),
            ev(10, Kind::Lost { count: 11 }),
        ];
        let mut w = Writer::create(&std::env::temp_dir()).unwrap();
        for e in &events {
            w.push(e).unwrap();
        }
        let mut s = w.finish().unwrap();
        assert_eq!(s.events, 10);
        for _ in 0..2 {
            let back: Vec<Event> = s.events().unwrap().map(|e| e.unwrap()).collect();
            assert_eq!(back, events);
        }
    }
}
