//! Every scenario shipped in the repository's `scenarios/` parses, prints
//! canonically and reparses to the same statements.

use hugelab_workload::{parse, parse_file, StmtKind};
use std::path::Path;

#[test]
fn every_scenario_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipped: no scenarios directory at {}", dir.display());
        return;
    };
    let model_only = std::fs::read_dir(dir.join("model-only"))
        .into_iter()
        .flatten();
    let mut files: Vec<_> = entries
        .chain(model_only)
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "hlw"))
        .collect();
    files.sort();
    if files.is_empty() {
        eprintln!("skipped: no scenarios/*.hlw yet");
        return;
    }
    for path in &files {
        let w = parse_file(path).unwrap_or_else(|e| panic!("{e}"));
        let printed = w.to_string();
        let back = parse(&w.file, &printed)
            .unwrap_or_else(|e| panic!("reparse of printed {}: {e}", path.display()));
        let kinds = |w: &hugelab_workload::Workload| {
            w.stmts
                .iter()
                .map(|s| s.kind.clone())
                .collect::<Vec<StmtKind>>()
        };
        assert_eq!(kinds(&w), kinds(&back), "{}", path.display());
    }
}
