//! Writing a recorded workload to its file: compressed by the file's name
//! (`.zst` zstd, `.gz` gzip, else plain text), into a temporary file beside
//! it that is renamed over it only when whole, and given to the user who
//! ran `sudo`.

use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The workload file being written.
pub struct Output {
    path: PathBuf,
    tmp: PathBuf,
    w: Box<dyn Finish>,
}

/// A writer that must be finished to be whole (a compressor's last frame).
pub trait Finish: Write {
    fn finish(self: Box<Self>) -> std::io::Result<()>;
}

impl Finish for zstd::stream::write::Encoder<'static, BufWriter<File>> {
    fn finish(self: Box<Self>) -> std::io::Result<()> {
        (*self).finish()?.flush()
    }
}

impl Finish for flate2::write::GzEncoder<BufWriter<File>> {
    fn finish(self: Box<Self>) -> std::io::Result<()> {
        (*self).finish()?.flush()
    }
}

impl Finish for BufWriter<File> {
    fn finish(mut self: Box<Self>) -> std::io::Result<()> {
        self.flush()
    }
}

impl Output {
    pub fn create(path: &Path) -> Result<Output> {
        let name = path
            .file_name()
            .with_context(|| format!("{} is not a file name", path.display()))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let f = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let buf = BufWriter::with_capacity(1 << 20, f);
        let w: Box<dyn Finish> = match path.extension().and_then(|e| e.to_str()) {
            Some("zst") => Box::new(zstd::stream::write::Encoder::new(buf, 9)?),
            Some("gz") => Box::new(flate2::write::GzEncoder::new(
                buf,
                flate2::Compression::default(),
            )),
            _ => Box::new(buf),
        };
        Ok(Output {
            path: path.to_path_buf(),
            tmp,
            w,
        })
    }

    pub fn writer(&mut self) -> &mut dyn Write {
        &mut self.w
    }

    /// Finishes the stream, renames it into place and gives it to the sudo
    /// user. Returns the file's size.
    pub fn commit(self) -> Result<u64> {
        let Output { path, tmp, w } = self;
        w.finish()
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        give_to_sudo_user(&tmp);
        std::fs::rename(&tmp, &path)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
        Ok(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0))
    }

    /// Removes the partial file (on an error).
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

fn give_to_sudo_user(path: &Path) {
    let id = |var| std::env::var(var).ok()?.parse::<u32>().ok();
    if let (Some(uid), Some(gid)) = (id("SUDO_UID"), id("SUDO_GID")) {
        let _ = std::os::unix::fs::chown(path, Some(uid), Some(gid));
    }
}
