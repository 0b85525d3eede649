"""hugelab.run: a workload on the model, in-process. Expected values come
from arithmetic on the workload (its region sizes over the folio sizes) and
from the scenarios' own `expect` lines, which the kernel held."""

import subprocess

import pandas as pd

import hugelab

# 8 MiB, 2 MiB-aligned, written page by page, then a snapshot.
EIGHT_MIB = "spawn a\na mmap buf 8M align=2M\na write buf\nsnapshot written\n"
MTHP_64K_ONLY = {
    "transparent_hugepage/enabled": "never",
    "transparent_hugepage/hugepages-64kB/enabled": "always",
}


def test_scenario_runs_and_its_expectations_hold(root):
    path = root / "scenarios" / "thp-pmd-always.hlw"
    result = hugelab.run(path)
    text = path.read_text()
    expects = [line for line in text.splitlines() if line.startswith("expect ")]
    assert len(result.expectations) == len(expects)
    assert result.passed
    assert [s["label"] for s in result.snapshots] == ["end"]
    end = result.counters("end")
    # 8M / 2M = 4 PMD THPs, 8192 kB of them.
    assert end["vmstat.thp_fault_alloc"] == 8 * 1024 // 2048
    assert end["meminfo.AnonHugePages"] == 8 * 1024
    assert result.failed_calls == [] and result.kills == []


def test_to_pandas_is_one_row_per_snapshot_and_counter():
    result = hugelab.run(EIGHT_MIB, settings=MTHP_64K_ONLY)
    frame = result.to_pandas()
    assert list(frame.columns) == ["snapshot", "line", "counter", "value"]
    assert len(frame) == sum(len(s["counters"]) for s in result.snapshots)
    assert not frame.duplicated(["snapshot", "counter"]).any()
    assert set(frame["snapshot"]) == {"written", "end"}
    written = frame[frame["snapshot"] == "written"]
    assert set(written["line"]) == {4}
    assert pd.isna(frame[frame["snapshot"] == "end"]["line"]).all()
    value = written.set_index("counter")["value"]
    # 8M / 64K = 128 folios of 16 pages: 128 faults, 2048 pages.
    assert value["mthp.64kB.anon_fault_alloc"] == 128
    assert value["mthp.64kB.nr_anon"] == 128
    assert value["meminfo.AnonPages"] == 8 * 1024


def test_settings_override_the_workloads_prelude(root):
    path = root / "scenarios" / "thp-pmd-always.hlw"
    lines = path.read_text().splitlines()
    line = lines.index("set transparent_hugepage/enabled always") + 1
    result = hugelab.run(str(path), settings={"transparent_hugepage/enabled": "never"})
    assert [o["line"] for o in result.overrides] == [line]
    # No size is enabled: 2048 base pages, no THP, so the file's expects fail.
    end = result.counters()
    assert end["vmstat.thp_fault_alloc"] == 0
    assert end["vmstat.pgfault"] == 8 * 1024 // 4
    assert not result.passed


def test_failed_calls_are_reported_and_the_workload_goes_on(root):
    path = root / "scenarios" / "errno-refused-calls-do-not-stop-the-workload.hlw"
    text = path.read_text()
    # `expect errno == E` after each call; `== 0` after one that succeeded.
    errnos = [
        line.split()[3]
        for line in text.splitlines()
        if line.startswith("expect errno") and line.split()[3] != "0"
    ]
    result = hugelab.run(path)
    assert result.passed
    assert [c["errno"] for c in result.failed_calls] == errnos


def test_machine_shape_sizes_the_model():
    shape = {"memory": "64M"}
    result = hugelab.run("spawn a\na mmap buf 8M\na write buf\n", machine=shape)
    assert result.counters()["meminfo.AnonPages"] == 8 * 1024
    fragmented = hugelab.run(
        EIGHT_MIB,
        settings={"transparent_hugepage/enabled": "always"},
        machine={"memory": "64M", "fragment": "10%"},
    )
    # Unmovable pages spread into every pageblock (docs/language.md,
    # `fragment`): no 2M block is free, so each 2M range's first fault
    # falls back.
    end = fragmented.counters("written")
    assert end["vmstat.thp_fault_alloc"] == 0
    assert end["vmstat.thp_fault_fallback"] == 4


def test_the_run_matches_the_cli(tmp_path, cli):
    import json

    path = tmp_path / "eight.hlw"
    path.write_text(EIGHT_MIB)
    out = subprocess.run(
        [cli, "run", "--json", path], check=True, capture_output=True, text=True
    ).stdout
    assert hugelab.run(path).json == json.loads(out)
