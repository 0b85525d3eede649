//! What `hugelab utilization` computes on the model, shared with the Python
//! package: the workload run as a stream up to a snapshot, the large folios
//! of its processes listed, and the report of
//! `hugelab_workload::utilization` over them (how full each folio is, why it
//! exists, what the deferred split shrinker would give back), per process
//! and in total. The CLI adds the kernel's live scan and prints.

use anyhow::{bail, Context, Result};
use hugelab_model::thp_utilization::Scope;
use hugelab_model::Model;
use hugelab_workload::utilization::{
    utilization_report, FolioUse, ShrinkerSettings, UtilizationReport,
};
use hugelab_workload::{
    run_stream, stmt, Backend, Lookahead, Observation, ParseError, Stmt, StmtKind,
};

/// What a backend's scan at the snapshot found.
pub struct Scan {
    /// The large folios of each process scanned, by workload name, in
    /// name order.
    pub processes: Vec<(String, Vec<FolioUse>)>,
    /// The shrinker settings in force at the snapshot.
    pub settings: ShrinkerSettings,
}

/// Runs the workload (`stmts`, called `file`) on `backend` as a stream,
/// up to its `snapshot` statement labelled `snapshot` (`None` or `end`: to
/// its end); what comes after that statement is not read. A label the
/// workload does not have is an error once the whole workload has run.
pub fn run_until(
    backend: &mut dyn Backend,
    file: &str,
    stmts: impl Iterator<Item = Result<Stmt, ParseError>>,
    ahead: &Lookahead,
    snapshot: Option<&str>,
) -> Result<Observation> {
    let want = snapshot.filter(|l| *l != "end");
    let (mut found, mut labels) = (false, Vec::new());
    let until = stmts.take_while(|s| {
        if let Ok(Stmt {
            kind: StmtKind::Snapshot(stmt::Snapshot { label }),
            ..
        }) = s
        {
            if Some(label.as_str()) == want {
                found = true;
                return false;
            }
            labels.push(format!("'{label}'"));
        }
        true
    });
    let obs = run_stream(backend, file, ahead, until)?;
    if let (Some(label), false) = (want, found) {
        let known = if labels.is_empty() {
            "it has none but the implicit 'end'".to_string()
        } else {
            format!("its snapshots are {} and 'end'", labels.join(", "))
        };
        bail!("{file} has no snapshot named '{label}': {known}");
    }
    Ok(obs)
}

/// The report over everything scanned, and, when the scope is every
/// process, one per process (name, report) even if there is only one.
pub struct Reports {
    pub total: UtilizationReport,
    pub processes: Vec<(String, UtilizationReport)>,
}

/// Builds the reports from what `scan` found (it runs the workload up to the
/// snapshot on its backend and scans the backend then), at the scanned
/// settings unless `max_ptes_none` overrides them; the per-process ones
/// when `each` (the scope is every process).
pub fn report(
    max_ptes_none: Option<u32>,
    buckets: usize,
    each: bool,
    scan: impl FnOnce() -> Result<Scan>,
) -> Result<Reports> {
    let Scan {
        processes,
        mut settings,
    } = scan()?;
    if let Some(n) = max_ptes_none {
        settings.max_ptes_none = n;
    }
    let total = utilization_report(
        processes.iter().flat_map(|(_, f)| f.iter()),
        settings,
        buckets,
    );
    let processes = if each {
        processes
            .iter()
            .map(|(name, f)| (name.clone(), utilization_report(f, settings, buckets)))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Reports { total, processes })
}

/// "snapshot 'NAME'" or "the end", for messages.
pub fn describe_snapshot(snapshot: Option<&str>) -> String {
    snapshot.map_or("the end".to_string(), |s| format!("snapshot '{s}'"))
}

/// The model's scan: runs the workload (`stmts`, called `file`) up to
/// `snapshot` on a fresh model, then lists the folios of `scope`; with what
/// the run observed up to there (its failed `expect` lines are the
/// caller's to say).
pub fn scan_model(
    file: &str,
    stmts: impl Iterator<Item = Result<Stmt, ParseError>>,
    snapshot: Option<&str>,
    scope: Scope<'_>,
) -> Result<(Scan, Observation)> {
    let mut model = Model::default();
    let obs = run_until(&mut model, file, stmts, &Lookahead::default(), snapshot)?;
    let at = || format!("{} at {}", obs.workload, describe_snapshot(snapshot));
    let processes = match scope {
        Scope::All => model
            .machine
            .tasks
            .keys()
            .map(|name| {
                let folios = model.folio_uses(Scope::Process(name)).with_context(at)?;
                Ok((name.clone(), folios))
            })
            .collect::<Result<Vec<_>>>()?,
        Scope::Process(name) | Scope::Region { proc: name, .. } => {
            vec![(name.to_string(), model.folio_uses(scope).with_context(at)?)]
        }
    };
    let scan = Scan {
        processes,
        settings: model.shrinker_settings(),
    };
    Ok((scan, obs))
}

/// The reports as `hugelab utilization --json` prints one backend's: the
/// total report itself, with `processes` (name to report) when `each` (the
/// scope is every process), also for one process.
pub fn reports_json(r: &Reports, each: bool) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(&r.total)?;
    if each {
        let per: serde_json::Map<String, serde_json::Value> = r
            .processes
            .iter()
            .map(|(n, p)| Ok((n.clone(), serde_json::to_value(p)?)))
            .collect::<Result<_>>()?;
        v["processes"] = per.into();
    }
    Ok(v)
}
