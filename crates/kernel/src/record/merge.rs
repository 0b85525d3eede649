//! Merging the per-CPU streams by timestamp. Each CPU's ring is in time
//! order but the rings are not with each other; an event stamped before
//! the start of the previous drain round was in its ring by the end of that
//! round, so everything older than that start is final and goes out sorted.

use super::event::Event;

#[derive(Default)]
pub struct Merger {
    pending: Vec<Event>,
}

impl Merger {
    pub fn push(&mut self, e: Event) {
        self.pending.push(e);
    }

    /// Hands out, in time order, every pending event older than `before`.
    pub fn release(&mut self, before: u64, mut each: impl FnMut(Event)) {
        // Stable: events of one CPU with equal times keep their order.
        self.pending.sort_by_key(|e| e.time);
        let n = self.pending.partition_point(|e| e.time < before);
        for e in self.pending.drain(..n) {
            each(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::event::Kind;

    fn ev(time: u64, tid: u32) -> Event {
        Event {
            time,
            pid: 1,
            tid,
            kind: Kind::Lost { count: 0 },
        }
    }

    #[test]
    fn two_cpus_interleave_by_time_and_late_events_wait() {
        let mut m = Merger::default();
        for e in [ev(10, 0), ev(30, 0), ev(50, 0), ev(20, 1), ev(40, 1)] {
            m.push(e);
        }
        let mut out = Vec::new();
        m.release(45, |e| out.push(e.time));
        assert_eq!(out, vec![10, 20, 30, 40]);
        m.push(ev(46, 1));
        m.release(u64::MAX, |e| out.push(e.time));
        assert_eq!(out, vec![10, 20, 30, 40, 46, 50]);
    }
}
