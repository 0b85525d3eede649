//! Helpers the workload crate's integration tests share.
#![allow(dead_code)] // each test binary uses its own subset

use hugelab_workload::{Backend, BackendError, Reading, Stmt};
use std::io::{self, BufRead};

/// `Read::read` for a reader that makes its text in `fill_buf`: copies
/// what `fill_buf` has into `buf`.
pub fn read_from_buf(r: &mut impl BufRead, buf: &mut [u8]) -> io::Result<usize> {
    let avail = r.fill_buf()?;
    let n = avail.len().min(buf.len());
    buf[..n].copy_from_slice(&avail[..n]);
    r.consume(n);
    Ok(n)
}

/// A backend that remembers the lines of the statements it executed.
#[derive(Default)]
pub struct Recorder {
    pub executed: Vec<u32>,
    pub count: u64,
    pub keep: bool,
}

impl Backend for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        self.count += 1;
        if self.keep {
            self.executed.push(stmt.pos.line);
        }
        Ok(())
    }

    fn read(&mut self) -> Result<Reading, BackendError> {
        Ok(Reading::default())
    }
}
