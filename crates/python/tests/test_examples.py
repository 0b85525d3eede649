"""examples/: each script runs on a small input and makes what it says."""

import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="the examples draw with matplotlib (scripts/python-env installs it)")


def test_sweep_seed000_prints_the_table_and_draws_the_figure(root, tmp_path):
    figure, rows = tmp_path / "faults.svg", tmp_path / "rows.csv"
    workloads = ["workloads/underused-queued-then-shrinker-off.hlw",
                 "workloads/bimodal-utilization.hlw"]
    r = subprocess.run([sys.executable, root / "examples" / "sweep_seed000.py", figure,
                        "--rows", rows, *workloads], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith("10 cells: 2 workloads × 5 settings, ")
    # A row per workload and setting; under 64K+32K+16K the under-used
    # workload's 2 MiB fault in 64 KiB folios: 512 faults become 33 (-93.6 %).
    line = next(x for x in out if x.split()[:1] == ["64K+32K+16K"] and "-93.6" in x)
    assert line.split()[1] == "33", line
    assert sum(1 for x in out if x.split()[:1] == ["PMD"] or " PMD " in x) == 2
    svg = figure.read_text()
    assert svg.startswith("<?xml") and "<svg" in svg and "64K+32K+16K" in svg
    assert rows.read_text().startswith("workload,setting,machine,snapshot,line,counter,value\n")
