"""hugelab.compare: one workload under several settings, the figures of
`hugelab compare`. Expected values come from arithmetic on the workload:
8 MiB written page by page is 2048 base pages, 512 16K folios, 128 64K
folios or 4 PMD THPs, each taken by one fault."""

import json
import math
import subprocess
import sys

import hugelab

EIGHT_MIB = "spawn a\na mmap buf 8M align=2M\na write buf\nsnapshot written\n"
SETTINGS = {
    "4K": {"transparent_hugepage/enabled": "never"},
    "64K": {
        "transparent_hugepage/enabled": "never",
        "transparent_hugepage/hugepages-64kB/enabled": "always",
    },
    "PMD": {"transparent_hugepage/enabled": "always"},
}


def test_summary_in_the_series_terms():
    c = hugelab.compare(EIGHT_MIB, SETTINGS)
    assert c.snapshot == "written" and c.snapshots == ["written", "end"]
    assert c.baseline == "4K"
    s = c.summary
    assert list(s.index) == ["4K", "64K", "PMD"]
    assert list(s["page_faults"]) == [2048, 128, 4]
    assert s.loc["64K", "page_faults_change"] == (128 - 2048) * 100 / 2048
    assert list(s["anon_kb"]) == [8192] * 3
    assert list(s["large_folio_pct"]) == [0.0, 100.0, 100.0]
    assert s.loc["64K", "in_64K_pct"] == 100.0
    assert s.loc["PMD", "in_2M_pct"] == 100.0
    assert s.loc["4K", "in_2M_pct"] == 0.0
    assert list(s["fallbacks"]) == [0, 0, 0]
    assert list(s["large_folio_kb"]) == [0, 8192, 8192]


def test_table_has_a_column_per_setting_and_the_changes():
    c = hugelab.compare(EIGHT_MIB, SETTINGS)
    t = c.table
    assert list(t.columns) == ["4K", "64K", "PMD", "64K vs 4K", "PMD vs 4K"]
    assert t.loc["mthp.64kB.anon_fault_alloc", "64K"] == 128
    assert t.loc["vmstat.thp_fault_alloc", "PMD"] == 4
    assert t.loc["vmstat.pgfault", "PMD vs 4K"] == (4 - 2048) * 100 / 2048
    # 0 in the baseline and not 0: no percentage (the CLI's n/a).
    assert math.isnan(t.loc["vmstat.thp_fault_alloc", "PMD vs 4K"])
    assert t.loc["meminfo.AnonPages", "PMD vs 4K"] == 0.0


def test_columns_keep_the_settings_order():
    order = {"PMD": SETTINGS["PMD"], "4K": SETTINGS["4K"]}
    c = hugelab.compare(EIGHT_MIB, order)
    assert list(c.summary.index) == ["PMD", "4K"]
    assert list(c.table.columns) == ["PMD", "4K", "4K vs PMD"]
    assert c.table.loc["vmstat.pgfault", "4K vs PMD"] == (2048 - 4) * 100 / 4


def test_default_settings_are_the_series(root):
    c = hugelab.compare(root / "scenarios" / "thp-pmd-always.hlw")
    assert list(c.summary.index) == list(hugelab.SERIES_SETTINGS)
    # The scenario sets every size but 2M to never in its prelude, and the
    # series' settings write over those lines.
    assert c.settings[1]["overrides"]


def test_identical_columns_get_a_note():
    same = {"a": SETTINGS["4K"], "b": SETTINGS["4K"]}
    c = hugelab.compare(EIGHT_MIB, same)
    assert c.notes == ["setting b sets exactly what setting a sets: the same column twice"]


def test_the_same_document_as_the_cli(root, cli):
    path = root / "scenarios" / "mthp-64k-only-8m.hlw"
    args = [cli, "compare", "--json", "--snapshot", "end"]
    for name, sets in SETTINGS.items():
        args += ["--setting", name + ":" + ",".join(f"{t}={v}" for t, v in sets.items())]
    out = subprocess.run(
        args + [str(path)], check=True, capture_output=True, text=True
    ).stdout
    assert hugelab.compare(str(path), SETTINGS, snapshot="end").json == json.loads(out)


def test_python_c_prints_the_summary(root):
    code = (
        "import hugelab; print(hugelab.compare('scenarios/mthp-64k-only-8m.hlw', "
        "{'4K': {'transparent_hugepage/hugepages-64kB/enabled': 'never'}, "
        "'64K': {'transparent_hugepage/hugepages-64kB/enabled': 'always'}}).summary)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    lines = out.splitlines()
    assert lines[0].split()[0] == "page_faults"
    assert lines[1].split()[0] == "setting"
    assert lines[2].split()[0] == "4K" and lines[3].split()[0] == "64K"
