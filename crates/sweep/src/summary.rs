//! A sweep's summary per workload and machine shape: `hugelab compare`'s
//! (`hugelab_compare::compare::summarize`), a row per setting against the
//! first, at the snapshot compare would take (the workload's first, else
//! `end`).

use crate::resume::Finished;
use hugelab_compare::compare::summarize;
use hugelab_compare::Summary;
use serde::Serialize;

#[derive(Serialize)]
pub struct WorkloadSummary {
    pub workload: String,
    pub machine: String,
    pub snapshot: String,
    /// A row per finished setting, in the plan's order.
    pub summary: Vec<Summary>,
}

/// One summary per (workload, machine) with a finished cell, in the plan's order.
pub fn summaries(finished: &Finished) -> Vec<WorkloadSummary> {
    let mut out: Vec<WorkloadSummary> = Vec::new();
    let mut columns = Vec::new();
    let each = finished.cells.iter().zip(&finished.done);
    for (i, (cell, done)) in each.enumerate() {
        let first = i == 0
            || finished.cells[i - 1].workload != cell.workload
            || finished.cells[i - 1].machine != cell.machine;
        if first {
            flush(&mut out, &mut columns);
        }
        let Some(rows) = done else { continue };
        if out
            .last()
            .is_none_or(|s| s.workload != cell.workload || s.machine != cell.machine)
        {
            let snapshot = rows.snapshots.iter().find(|s| s.line.is_some());
            out.push(WorkloadSummary {
                workload: cell.workload.clone(),
                machine: cell.machine.clone(),
                snapshot: snapshot.map_or("end".to_string(), |s| s.label.clone()),
                summary: Vec::new(),
            });
        }
        let label = &out.last().expect("pushed above").snapshot;
        let at = rows.snapshots.iter().find(|s| &s.label == label);
        columns.push((
            cell.setting.clone(),
            at.map(|s| rows.counters(s)).unwrap_or_default(),
        ));
    }
    flush(&mut out, &mut columns);
    out
}

fn flush(out: &mut [WorkloadSummary], columns: &mut Vec<(String, hugelab_workload::Counters)>) {
    if let Some(last) = out.last_mut().filter(|_| !columns.is_empty()) {
        last.summary = summarize(columns);
    }
    columns.clear();
}
