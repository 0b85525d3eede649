"""hugelab.sweep: the rows equal hugelab.run of each cell, the output file
is byte for byte the CLI's, and bad input raises with the CLI's sentence
and writes nothing."""

import subprocess

import pandas as pd
import pytest

import hugelab

PMD = {"transparent_hugepage/enabled": "always"}
M64K = {
    "transparent_hugepage/enabled": "never",
    "transparent_hugepage/hugepages-64kB/enabled": "always",
}
# Scenarios that set no tunable and no machine of their own.
SCENARIOS = [
    "scenarios/file-private-fork-child-writes.hlw",
    "scenarios/mmap-fills-a-hole-and-merges-both-sides.hlw",
]
SHAPES = [{"memory": "256M"}, {"memory": "256M", "fragment": "10%"}]


def test_rows_are_each_cells_run(root):
    workloads = [str(root / s) for s in SCENARIOS]
    rows = hugelab.sweep(workloads, {"PMD": PMD, "64K": M64K}, SHAPES, jobs=2)
    assert list(rows.columns) == [
        "workload", "setting", "machine", "snapshot", "line", "counter", "value",
    ]
    expected = 0
    for workload in workloads:
        for shape, label in zip(SHAPES, ["memory=256M", "memory=256M,fragment=10%"]):
            for name, setting in [("PMD", PMD), ("64K", M64K)]:
                run = hugelab.run(workload, settings=setting, machine=shape).to_pandas()
                cell = rows[
                    (rows["workload"] == workload)
                    & (rows["setting"] == name)
                    & (rows["machine"] == label)
                ]
                got = cell[["snapshot", "line", "counter", "value"]].reset_index(drop=True)
                pd.testing.assert_frame_equal(got, run)
                expected += len(run)
    # 2 workloads × 2 shapes × 2 settings, each its snapshots' counters.
    assert len(rows) == expected


@pytest.mark.parametrize("ext", ["parquet", "csv", "json"])
def test_the_output_is_the_clis_byte_for_byte(root, tmp_path, cli, ext):
    workloads = [str(root / s) for s in SCENARIOS]
    mine = tmp_path / f"python.{ext}"
    rows = hugelab.sweep(workloads, output=mine, jobs=2)
    theirs = tmp_path / f"cli.{ext}"
    subprocess.run([cli, "sweep", "--jobs", "1", "-o", theirs, *workloads], check=True,
                   capture_output=True)
    assert mine.read_bytes() == theirs.read_bytes()
    # Default settings: compare's five.
    assert list(dict.fromkeys(rows["setting"])) == list(hugelab.SERIES_SETTINGS)
    if ext == "parquet":
        assert mine.read_bytes()[:4] == b"PAR1"


def test_a_rerun_skips_the_cells_in_the_output(root, tmp_path):
    workload = str(root / SCENARIOS[0])
    out = tmp_path / "rows.csv"
    first = hugelab.sweep([workload], {"PMD": PMD}, output=out, jobs=1)
    before = out.read_bytes()
    # One more setting: the PMD cell is read back, the 64K one run.
    both = hugelab.sweep([workload], {"PMD": PMD, "64K": M64K}, output=out, jobs=1)
    assert out.read_bytes().startswith(before)
    pd.testing.assert_frame_equal(both[both["setting"] == "PMD"].reset_index(drop=True), first)
    assert not (tmp_path / "rows.csv.partial").exists()


def test_bad_input_raises_the_sentence_and_writes_nothing(root, tmp_path):
    out = tmp_path / "rows.parquet"
    scenario = str(root / SCENARIOS[0])
    with pytest.raises(hugelab.WorkloadError, match="cannot read the workload"):
        hugelab.sweep([str(tmp_path / "missing.hlw")], output=out)
    with pytest.raises(hugelab.SettingError, match="unknown tunable"):
        hugelab.sweep([scenario], {"x": {"transparent_hugepage/nope": "1"}}, output=out)
    with pytest.raises(hugelab.MachineError, match="machine memory must be nonzero"):
        hugelab.sweep([scenario], machines=[{"memory": "0"}], output=out)
    with pytest.raises(hugelab.Error, match="cannot write the output there"):
        hugelab.sweep([scenario], output=tmp_path / "no" / "rows.parquet")
    with pytest.raises(ValueError, match="engine is 'local' or 'ray'"):
        hugelab.sweep([scenario], engine="dask", output=out)
    with pytest.raises(ValueError, match="address is a Ray cluster's"):
        hugelab.sweep([scenario], address="127.0.0.1:6379", output=out)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_cell_costs_its_cell(tmp_path):
    # A workload that names a process it never started stops at that
    # line; the other runs.
    bad = tmp_path / "bad.hlw"
    bad.write_text("spawn a\na mmap buf 8M\nb write buf\n")
    good = tmp_path / "good.hlw"
    good.write_text("spawn a\na mmap buf 8M\na write buf\n")
    with pytest.raises(hugelab.SweepError) as e:
        hugelab.sweep([bad, good], {"PMD": PMD}, jobs=1)
    assert [f["workload"] for f in e.value.failed] == [str(bad)]
    assert "bad.hlw:3:1: unknown process 'b'" in e.value.failed[0]["error"]
    assert "1 of 2 cells failed" in e.value.message
    assert set(e.value.rows["workload"]) == {str(good)}


def test_a_worker_that_dies_costs_its_cell_only(root, monkeypatch):
    workloads = [str(root / s) for s in SCENARIOS]
    whole = hugelab.sweep(workloads, {"PMD": PMD, "64K": M64K}, jobs=2)
    # The worker processes abort on a 64K cell, as the OOM killer would end them.
    monkeypatch.setenv("HUGELAB_SWEEP_TEST_ABORT_ON", "64K")
    with pytest.raises(hugelab.SweepError) as e:
        hugelab.sweep(workloads, {"PMD": PMD, "64K": M64K}, jobs=2)
    failed = e.value.failed
    assert [(f["workload"], f["setting"]) for f in failed] == [(w, "64K") for w in workloads]
    assert all("the worker process running it died" in f["error"] for f in failed)
    pmd = whole[whole["setting"] == "PMD"].reset_index(drop=True)
    pd.testing.assert_frame_equal(e.value.rows, pmd)


def test_a_progress_bar_counts_the_cells_on_stderr(root, capfd):
    workloads = [str(root / s) for s in SCENARIOS]
    hugelab.sweep(workloads, {"PMD": PMD, "64K": M64K}, jobs=1, progress=True)
    err = capfd.readouterr().err
    # 2 workloads × 2 settings, each on its own machine: 4 cells, all done.
    assert "4/4" in err and "cell" in err, err
    hugelab.sweep(workloads, {"PMD": PMD}, jobs=1, progress=False)
    assert "cell" not in capfd.readouterr().err
