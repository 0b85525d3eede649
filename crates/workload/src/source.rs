//! Where a streamed workload's text comes from: a file, plain or compressed
//! (gzip `.gz`, zstd `.zst`), decompressed as it is read, so that a recorded
//! workload of millions of statements never has to be unpacked on disk or
//! held in memory; or a workload file's bytes already in memory (shipped to
//! another machine), decompressed the same way.

use crate::text::ParseError;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Cursor, Read};
use std::path::Path;
use std::sync::Arc;

/// The read buffer of a workload file (and of its decompressed text).
const BUF: usize = 256 << 10;

/// The text of a workload file, read as a stream (see [`open`]).
pub struct Source(Inner);

enum Inner {
    Plain(BufReader<File>),
    Gzip(BufReader<flate2::bufread::MultiGzDecoder<BufReader<File>>>),
    Zstd(BufReader<zstd::stream::read::Decoder<'static, BufReader<File>>>),
    Bytes(Cursor<Bytes>),
    GzipBytes(BufReader<flate2::bufread::MultiGzDecoder<Cursor<Bytes>>>),
    ZstdBytes(BufReader<zstd::stream::read::Decoder<'static, Cursor<Bytes>>>),
}

/// A workload file's bytes, shared (one copy for every run of it).
#[derive(Clone)]
pub struct Bytes(pub Arc<[u8]>);

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
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

/// The text of a workload file whose bytes are `bytes` (read elsewhere, or
/// shipped from the machine that read it), compressed as `path`'s name
/// says, as [`open`] reads the file itself.
pub fn open_bytes(path: &Path, bytes: Bytes) -> Result<Source, ParseError> {
    let raw = Cursor::new(bytes);
    Ok(Source(match compression(path) {
        Some("gzip") => Inner::GzipBytes(BufReader::with_capacity(
            BUF,
            flate2::bufread::MultiGzDecoder::new(raw),
        )),
        Some(_) => {
            let z = zstd::stream::read::Decoder::with_buffer(raw).map_err(|e| ParseError {
                file: path.display().to_string(),
                line: 0,
                col: 0,
                message: format!("cannot read: {e}"),
            })?;
            Inner::ZstdBytes(BufReader::with_capacity(BUF, z))
        }
        None => Inner::Bytes(raw),
    }))
}

/// Each arm of [`Inner`], the same call.
macro_rules! each {
    ($inner:expr, $r:ident => $call:expr) => {
        match $inner {
            Inner::Plain($r) => $call,
            Inner::Gzip($r) => $call,
            Inner::Zstd($r) => $call,
            Inner::Bytes($r) => $call,
            Inner::GzipBytes($r) => $call,
            Inner::ZstdBytes($r) => $call,
        }
    };
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        each!(&mut self.0, r => r.read(buf))
    }
}

impl BufRead for Source {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        each!(&mut self.0, r => r.fill_buf())
    }

    fn consume(&mut self, n: usize) {
        each!(&mut self.0, r => r.consume(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn text(mut s: Source) -> String {
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn bytes_read_as_the_file_they_came_from() {
        let plain = "spawn a\na mmap buf 8M\na write buf\n";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(plain.as_bytes()).unwrap();
        let gz = gz.finish().unwrap();
        let zst = zstd::encode_all(plain.as_bytes(), 1).unwrap();
        for (name, bytes) in [
            ("w.hlw", plain.as_bytes().to_vec()),
            ("w.hlw.gz", gz),
            ("w.hlw.zst", zst),
        ] {
            let source = open_bytes(Path::new(name), Bytes(bytes.into())).unwrap();
            assert_eq!(text(source), plain, "{name}");
        }
    }
}
