//! Writing statements: first touches coalesced into ranges, and the time
//! between statements kept as `sleep`.

use std::io::{self, Write};

/// A gap between two statements shorter than this is not written.
const SLEEP_MIN_NS: u64 = 1_000_000;
/// A run of touches is cut where the program paused this long.
const RUN_GAP_NS: u64 = 1_000_000;
pub const PAGE: u64 = 4096;

/// Consecutive first touches of one task, in one region, of one kind, on
/// adjacent pages: up, or down where the order of the touches does not
/// matter. A range is replayed upward, so touches down are written as one
/// only when replaying them upward faults the same pages: not for reads of
/// a file mapping, where a read fault maps the cached pages of its 64 KiB
/// window (do_fault_around), so which page of two neighbours in different
/// windows faults first decides whether the other faults at all.
struct Run {
    task: String,
    region: String,
    base: u64,
    write: bool,
    start: u64,
    end: u64,
    last: u64,
}

pub struct Out<'a> {
    w: &'a mut dyn Write,
    run: Option<Run>,
    /// The time of the last statement written.
    time: Option<u64>,
    pub statements: u64,
    pub sleeps: u64,
}

/// A size as the language writes it: the largest binary suffix that divides it.
pub fn size(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (u, s) in UNITS {
        if n >= u && n.is_multiple_of(u) {
            return format!("{}{s}", n / u);
        }
    }
    n.to_string()
}

/// `region`, `region+off`, `region:len` or `region+off:len`.
pub fn range(region: &str, base: u64, start: u64, end: u64) -> String {
    let off = start - base;
    if off == 0 {
        format!("{region}:{}", size(end - start))
    } else {
        format!("{region}+{}:{}", size(off), size(end - start))
    }
}

impl<'a> Out<'a> {
    pub fn new(w: &'a mut dyn Write) -> Out<'a> {
        Out {
            w,
            run: None,
            time: None,
            statements: 0,
            sleeps: 0,
        }
    }

    pub fn comment(&mut self, text: &str) -> io::Result<()> {
        self.flush()?;
        for line in text.lines() {
            writeln!(self.w, "# {line}")?;
        }
        Ok(())
    }

    fn pause(&mut self, time: u64) -> io::Result<()> {
        if let Some(t) = self.time {
            let gap = time.saturating_sub(t);
            if gap >= SLEEP_MIN_NS {
                writeln!(self.w, "sleep {}us", gap / 1000)?;
                self.sleeps += 1;
            }
        }
        self.time = Some(time.max(self.time.unwrap_or(0)));
        Ok(())
    }

    /// Writes one statement that happened at `time`.
    pub fn stmt(&mut self, time: u64, text: &str) -> io::Result<()> {
        self.flush()?;
        self.pause(time)?;
        self.statements += 1;
        writeln!(self.w, "{text}")
    }

    /// A first touch of the page at `page` (page-aligned) of `region`;
    /// `ordered`: the order of the touches matters (see [`Run`]): this
    /// touch does not extend a run down.
    #[allow(clippy::too_many_arguments)]
    pub fn touch(
        &mut self,
        time: u64,
        task: &str,
        region: &str,
        base: u64,
        page: u64,
        write: bool,
        ordered: bool,
    ) -> io::Result<()> {
        if let Some(r) = &mut self.run {
            let same = r.task == task && r.region == region && r.base == base && r.write == write;
            if same && time.saturating_sub(r.last) < RUN_GAP_NS {
                if page == r.end {
                    r.end += PAGE;
                    r.last = time;
                    return Ok(());
                }
                if page + PAGE == r.start && !ordered {
                    r.start = page;
                    r.last = time;
                    return Ok(());
                }
            }
        }
        self.flush()?;
        self.pause(time)?;
        self.run = Some(Run {
            task: task.to_string(),
            region: region.to_string(),
            base,
            write,
            start: page,
            end: page + PAGE,
            last: time,
        });
        Ok(())
    }

    /// Writes the pending run of touches, if any.
    pub fn flush(&mut self) -> io::Result<()> {
        if let Some(r) = self.run.take() {
            let verb = if r.write { "write" } else { "read" };
            writeln!(
                self.w,
                "{} {verb} {}",
                r.task,
                range(&r.region, r.base, r.start, r.end)
            )?;
            self.statements += 1;
            self.time = Some(r.last.max(self.time.unwrap_or(0)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touches_coalesce_up_and_down_and_break_on_a_pause() {
        let mut buf = Vec::new();
        let mut o = Out::new(&mut buf);
        let base = 0x10000;
        for (t, p) in [(0, 2), (10, 3), (20, 1), (30, 0)] {
            o.touch(t, "a", "buf", base, base + p * PAGE, true, false)
                .unwrap();
        }
        o.touch(40, "a", "buf", base, base + 9 * PAGE, false, false)
            .unwrap();
        o.touch(3_000_040, "a", "buf", base, base + 10 * PAGE, false, false)
            .unwrap();
        o.stmt(3_000_050, "a munmap buf").unwrap();
        o.flush().unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert_eq!(
            text,
            "a write buf:16K\na read buf+36K:4K\nsleep 3000us\na read buf+40K:4K\na munmap buf\n"
        );
    }

    #[test]
    fn sizes_take_the_largest_suffix() {
        assert_eq!(size(4096), "4K");
        assert_eq!(size(2 << 20), "2M");
        assert_eq!(size(3 << 30), "3G");
        assert_eq!(size(1536 << 10), "1536K");
        assert_eq!(size(100), "100");
    }
}
