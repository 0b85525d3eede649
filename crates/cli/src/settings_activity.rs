//! The second part of `hugelab settings show`: what else on this machine
//! acts on huge pages (`hugelab_kernel::host_activity`), as tables: DAMON's
//! kdamonds and their schemes, the DAMON modules, khugepaged since boot,
//! the memory cgroups with a limit, and memory the kernel has not yet
//! initialised (whose folios kpageflags cannot tell). A part the machine does not have is one
//! line saying so.

use crate::table::{human, render_text};
use hugelab_kernel::damon_view::{self, Kdamond};
use hugelab_kernel::host_activity::{Activity, Cgroups, Khugepaged};

/// The text after the tunables (it starts with a blank line).
pub fn render(a: &Activity) -> String {
    let mut out = String::from("\nwhat else on this machine acts on huge pages:\n");
    out.push_str(&damon(a.damon.as_deref(), &a.damon_paused_by_run));
    out.push_str(&modules(a));
    out.push_str(&khugepaged(a.khugepaged.as_ref()));
    out.push_str(&cgroups(a.cgroups.as_ref()));
    out.push_str(&match &a.uninitialised {
        Some(u) if !u.blocks.is_empty() => format!(
            "\nmemory: {}; folios placed there are unknown to the kernel backend until `hugelab settings init-memory`\n",
            crate::settings_meminit::describe(u)
        ),
        Some(u) => format!("\nmemory: {}\n", crate::settings_meminit::describe(u)),
        None => "\nmemory: not known whether the kernel has initialised all of it (/proc/kpageflags needs root)\n".into(),
    });
    out
}

fn strings(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

fn damon(kdamonds: Option<&[Kdamond]>, paused: &[(u32, i64)]) -> String {
    let Some(kdamonds) = kdamonds else {
        return format!(
            "\nDAMON: this kernel has no DAMON sysfs interface ({} is missing)\n",
            hugelab_kernel::damon::ADMIN
        );
    };
    if kdamonds.is_empty() {
        return "\nDAMON: no kdamond\n".to_string();
    }
    let header = strings(&[
        "kdamond",
        "state",
        "operations",
        "scheme",
        "action",
        "acts on huge pages",
        "access pattern",
        "quota",
        "watermarks",
        "tried",
        "applied",
    ]);
    let mut rows = Vec::new();
    for k in kdamonds {
        let by_run = paused.iter().find(|(i, _)| *i == k.index);
        let state = match (k.pid, by_run) {
            (Some(pid), _) => format!("{} (pid {pid})", k.state),
            (None, Some((_, run))) if k.state == "off" => {
                format!("off (paused by hugelab run {run}, on again after it)")
            }
            (None, _) => k.state.clone(),
        };
        for c in &k.contexts {
            let ops = if c.target_pids.is_empty() {
                c.operations.clone()
            } else {
                let pids: Vec<String> = c.target_pids.iter().map(|p| p.to_string()).collect();
                format!("{} (pids {})", c.operations, pids.join(", "))
            };
            let base = vec![k.index.to_string(), state.clone(), ops];
            if c.schemes.is_empty() {
                let mut row = base.clone();
                row.push("none".into());
                rows.push(row);
            }
            for s in &c.schemes {
                let mut row = base.clone();
                row.extend([
                    s.index.to_string(),
                    s.action.clone(),
                    if s.acts_on_huge_pages { "yes" } else { "no" }.to_string(),
                    s.pattern(c),
                    s.quota(),
                    s.watermarks(),
                    format!("{} regions, {}", s.nr_tried, human(s.sz_tried)),
                    human(s.sz_applied),
                ]);
                rows.push(row);
            }
        }
    }
    format!(
        "\nDAMON kdamonds (stats as the kdamond last updated them):\n{}",
        render_text(&header, &rows)
    )
}

fn modules(a: &Activity) -> String {
    if a.damon_modules.is_empty() {
        return format!(
            "\nDAMON modules: neither damon_reclaim nor damon_lru_sort is in {}\n",
            damon_view::MODULES
        );
    }
    let rows: Vec<Vec<String>> = a
        .damon_modules
        .iter()
        .map(|m| {
            let params: Vec<String> = m
                .parameters
                .iter()
                .filter(|(n, _)| n != "enabled")
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            vec![
                m.name.to_uppercase(),
                if m.enabled { "yes" } else { "no" }.to_string(),
                params.join(" "),
            ]
        })
        .collect();
    format!(
        "\nDAMON modules:\n{}",
        render_text(&strings(&["module", "enabled", "parameters"]), &rows)
    )
}

fn khugepaged(k: Option<&Khugepaged>) -> String {
    let Some(k) = k else {
        return format!(
            "\nkhugepaged: this kernel has no {}\n",
            hugelab_kernel::host_activity::KHUGEPAGED
        );
    };
    let count = |n: u64| format!("{n} ({:.1}/h)", k.per_hour(n));
    let header = strings(&[
        "full_scans",
        "pages_collapsed",
        "thp_collapse_alloc",
        "pages_to_scan",
        "scan_sleep_millisecs",
    ]);
    let rows = vec![vec![
        count(k.full_scans),
        count(k.pages_collapsed),
        count(k.thp_collapse_alloc),
        k.pages_to_scan.to_string(),
        k.scan_sleep_millisecs.to_string(),
    ]];
    format!(
        "\nkhugepaged since boot ({:.1} h ago; per hour of uptime in brackets):\n{}",
        k.uptime_s / 3600.0,
        render_text(&header, &rows)
    )
}

fn cgroups(c: Option<&Cgroups>) -> String {
    let Some(c) = c else {
        return "\nmemory cgroups: no memory cgroup hierarchy is mounted (neither v2 nor v1)\n"
            .to_string();
    };
    let place = format!("{}, {}", c.version, c.root.display());
    if c.limited.is_empty() {
        return format!("\nmemory cgroups ({place}): none has a limit\n");
    }
    let mut header = strings(&["cgroup", "limit", "usage"]);
    header.extend(c.limited[0].settings.iter().map(|(n, _)| n.clone()));
    let rows: Vec<Vec<String>> = c
        .limited
        .iter()
        .map(|g| {
            let mut row = vec![g.path.clone(), human(g.limit_bytes), human(g.usage_bytes)];
            row.extend(g.settings.iter().map(|(_, v)| v.clone()));
            row
        })
        .collect();
    format!(
        "\nmemory cgroups with a limit ({place}):\n{}",
        render_text(&header, &rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use hugelab_kernel::host_activity::Limited;

    /// A machine without DAMON, THP or memory cgroups: one line each.
    #[test]
    fn what_the_machine_lacks_is_one_line_each() {
        let a = Activity {
            damon: None,
            damon_paused_by_run: vec![],
            damon_modules: vec![],
            khugepaged: None,
            cgroups: None,
            uninitialised: None,
        };
        let text = render(&a);
        for said in [
            "DAMON: this kernel has no DAMON sysfs interface (/sys/kernel/mm/damon/admin is missing)",
            "DAMON modules: neither damon_reclaim nor damon_lru_sort is in /sys/module",
            "khugepaged: this kernel has no /sys/kernel/mm/transparent_hugepage/khugepaged",
            "memory cgroups: no memory cgroup hierarchy is mounted (neither v2 nor v1)",
            "memory: not known whether the kernel has initialised all of it (/proc/kpageflags needs root)",
        ] {
            assert_eq!(
                text.lines().filter(|l| *l == said).count(),
                1,
                "{said}:\n{text}"
            );
        }
        assert!(!text.contains('|'), "no table: {text}");
    }

    /// A limited group: its limit and usage, and its settings as columns.
    #[test]
    fn a_limited_group_is_a_row() {
        let a = Activity {
            damon: Some(vec![]),
            damon_paused_by_run: vec![],
            damon_modules: vec![],
            khugepaged: Some(Khugepaged {
                pages_to_scan: 4096,
                scan_sleep_millisecs: 10000,
                full_scans: 2,
                pages_collapsed: 7,
                thp_collapse_alloc: 7,
                uptime_s: 3600.0,
            }),
            cgroups: Some(Cgroups {
                root: "/sys/fs/cgroup/memory".into(),
                version: "v1".into(),
                limited: vec![Limited {
                    path: "/db".into(),
                    limit_bytes: 1 << 30,
                    usage_bytes: 512 << 20,
                    settings: vec![("memory.swappiness".into(), "10".into())],
                }],
            }),
            uninitialised: Some(Default::default()),
        };
        let text = render(&a);
        assert!(text.contains("\nDAMON: no kdamond\n"), "{text}");
        assert!(text.contains("| 7 (7.0/h) "), "{text}");
        assert!(
            text.contains("memory cgroups with a limit (v1, /sys/fs/cgroup/memory):"),
            "{text}"
        );
        let row = text.lines().find(|l| l.starts_with("| /db ")).unwrap();
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells, ["/db", "1.00 GiB", "512.00 MiB", "10"]);
    }
}
