//! Where a streamed workload's text comes from: a file, plain or compressed
//! (gzip `.gz`, zstd `.zst`), decompressed as it is read, so that a recorded
//! workload of millions of statements never has to be unpacked on disk or
//! held in memory.

use crate::text::ParseError;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

/// The read buffer of a workload file (and of its decompressed text).
const BUF: usize = 256 << 10;

/// The text of a workload file, read as a stream (see [`open`]).
pub struct Source(Inner);

enum Inner {
    Plain(BufReader<File>),
    Gzip(BufReader<flate2::bufread::MultiGzDecoder<BufReader<File>>>),
    Zstd(BufReader<zstd::stream::read::Decoder<'static, BufReader<File>>>),
}

/// How a workload file is compressed, by its name: `.gz` is gzip, `.zst`
/// zstd, anything else plain text.
fn compression(path: &Path) -> Option<&'static str> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("gz") => Some("gzip"),
        Some("zst") => Some("zstd"),
        _ => None,
    }
}

/// Opens a workload file to be read as a stream: plain text, or gzip (`.gz`)
/// or zstd (`.zst`) compressed text, decompressed as it is read. A file that
/// cannot be opened is an error at line 0 (`file: cannot read: ...`); one
/// whose compressed data is bad fails when that part is read, as an error of
/// the stream (`file: cannot read after line 12: ...`).
pub fn open(path: &Path) -> Result<Source, ParseError> {
    let cannot = |e: io::Error| ParseError {
        file: path.display().to_string(),
        line: 0,
        col: 0,
        message: format!("cannot read: {e}"),
    };
    let file = File::open(path).map_err(cannot)?;
    if file.metadata().map_err(cannot)?.is_dir() {
        return Err(cannot(io::Error::new(
            io::ErrorKind::IsADirectory,
            "it is a directory",
        )));
    }
    let raw = BufReader::with_capacity(BUF, file);
    Ok(Source(match compression(path) {
        Some("gzip") => Inner::Gzip(BufReader::with_capacity(
            BUF,
            flate2::bufread::MultiGzDecoder::new(raw),
        )),
        Some(_) => {
            let z = zstd::stream::read::Decoder::with_buffer(raw).map_err(cannot)?;
            Inner::Zstd(BufReader::with_capacity(BUF, z))
        }
        None => Inner::Plain(raw),
    }))
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.0 {
            Inner::Plain(r) => r.read(buf),
            Inner::Gzip(r) => r.read(buf),
            Inner::Zstd(r) => r.read(buf),
        }
    }
}

impl BufRead for Source {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        match &mut self.0 {
            Inner::Plain(r) => r.fill_buf(),
            Inner::Gzip(r) => r.fill_buf(),
            Inner::Zstd(r) => r.fill_buf(),
        }
    }

    fn consume(&mut self, n: usize) {
        match &mut self.0 {
            Inner::Plain(r) => r.consume(n),
            Inner::Gzip(r) => r.consume(n),
            Inner::Zstd(r) => r.consume(n),
        }
    }
}
