"""The Ray engine on a real local cluster: a head and a second node started
with `ray start` (one CPU each), a sweep of 255 cells through
``hugelab.sweep(engine="ray")`` and through ``hugelab sweep --ray``,
every cell's rows compared with the local engine's (the same output
bytes), a Ray worker process killed with SIGKILL while it runs a task, a
re-run resuming from the output, the second node lost mid-sweep (its
raylet and workers killed), and the cluster stopped on every exit path,
checked in the process list.

The cluster runs in network, PID and mount namespaces of its own
(ray_cluster.py): Ray there binds and talks on 127.0.0.1 only, `ray stop
--force` run in them sees and stops this test's Ray processes only, and
whatever happens to the test they end within ray_cluster.LIFETIME seconds.
Skipped, saying why, where namespaces cannot be made.

Bad input needs no cluster: an unreachable address, and Ray not
installed, are one sentence, with nothing written."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from ray_cluster import ADDRESS, ROOT, Cluster, cmdline, ns_of, pids

import hugelab
#: The sweep: a recording of part of a kernel build (about half a second a
#: cell, so that tasks run long enough to be killed mid-task), the
#: copy-on-write and HugeTLB scenarios, and one scenario that fails under
#: some of the settings (its failures compared too), under compare's five
#: settings.
WORKLOADS = (
    ["crates/cli/workloads/kbuild-mm.hlw.zst"]
    + sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("scenarios/cow-*.hlw"))
    + sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("scenarios/hugetlb-*.hlw"))
    + ["scenarios/mthp-inherit-follows-enabled.hlw"]
)
#: hugelab.sweep(engine="ray") in the cluster's namespaces: prints what the
#: engine did and the failed cells, as JSON.
DRIVER = """
import json, sys
import hugelab
from hugelab import _ray_sweep
args = json.loads(sys.argv[1])
try:
    hugelab.sweep(args["workloads"], engine="ray", address=args["address"],
                  output=args["output"])
    failed = []
except hugelab.SweepError as e:
    failed = e.failed
print(json.dumps({"stats": _ray_sweep.last_stats, "failed": failed}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("no unshare/nsenter (util-linux) to give the test cluster its own namespaces")
    if not (Path(sys.executable).parent / "ray").exists():
        pytest.skip(f"no ray beside {sys.executable}: scripts/python-env installs it")
    tmp = tmp_path_factory.mktemp("ray")
    try:
        c = Cluster(tmp)
    except (RuntimeError, OSError) as e:
        pytest.skip(str(e))
    try:
        c.start()
        yield c
    finally:
        c.stop()
        # Nothing of the cluster is left: no process in its namespaces, and
        # no raylet, gcs_server or ray:: worker whose command names its
        # temporary directory.
        end = time.time() + 30
        while time.time() < end and (c.processes() or ns_of(c.init) is not None):
            time.sleep(0.2)
        left = [(p, cmdline(p)) for p in c.processes()]
        left += [(p, cmd) for p in pids() for cmd in [cmdline(p)]
                 if str(tmp) in cmd and ("raylet" in cmd or "gcs_server" in cmd or "ray::" in cmd)]
        assert not left, f"the test cluster left processes running: {left}"


def _local(tmp_path, name):
    """The local engine's output of the same sweep, and its failed cells."""
    out = tmp_path / name
    try:
        hugelab.sweep(WORKLOADS, output=out, jobs=2)
        failed = []
    except hugelab.SweepError as e:
        failed = e.failed
    return out, failed


def test_a_sweep_on_ray_survives_a_killed_worker_and_equals_the_local_engines(
        cluster, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "ray.csv"
    args = json.dumps({"workloads": WORKLOADS, "address": ADDRESS, "output": str(out)})
    driver = cluster.popen([sys.executable, "-c", DRIVER, args])
    # SIGKILL the first Ray worker process seen running a task of the sweep.
    killed = None
    end = time.time() + 120
    while driver.poll() is None and killed is None and time.time() < end:
        for pid in cluster.processes():
            if cmdline(pid).startswith("ray::_run_batch"):
                os.kill(pid, signal.SIGKILL)
                killed = pid
                break
        time.sleep(0.01)
    stdout, stderr = driver.communicate(timeout=180)
    assert driver.returncode == 0, stderr
    assert killed is not None, "the sweep ended before a task was seen running"
    assert killed not in pids() or not cmdline(killed).startswith("ray::_run_batch")
    done = json.loads(stdout.strip().splitlines()[-1])
    cells = len(WORKLOADS) * len(hugelab.SERIES_SETTINGS)
    assert cells >= 200
    assert done["stats"]["cells"] == cells
    assert done["stats"]["failed_tasks"] == 0, done
    # Every cell's rows are the local engine's: the same bytes, and per cell.
    local, local_failed = _local(tmp_path, "local.csv")
    assert out.read_bytes() == local.read_bytes()
    assert done["failed"] == local_failed and local_failed, "mthp-inherit fails somewhere"
    rows = pd.read_csv(out, keep_default_na=False)
    mine = rows.groupby(["workload", "setting", "machine"], sort=False).size()
    # Each finished cell once, as one run of rows: cells × 1 group each.
    runs = (rows[["workload", "setting", "machine"]]
            != rows[["workload", "setting", "machine"]].shift()).any(axis=1).sum()
    assert runs == len(mine) == cells - len(done["failed"])
    assert not (tmp_path / "ray.csv.partial").exists()
    # A re-run resumes from the output: only the failed cells run again.
    again = cluster.run([sys.executable, "-c", DRIVER, args], timeout=120)
    assert again.returncode == 0, again.stderr
    redone = json.loads(again.stdout.strip().splitlines()[-1])
    assert redone["stats"]["cells"] == len(done["failed"])
    assert redone["failed"] == done["failed"]
    assert out.read_bytes() == local.read_bytes()


def test_the_cli_sweeps_on_ray_to_the_local_engines_bytes(cluster, cli, tmp_path):
    out = tmp_path / "ray.parquet"
    r = cluster.run([str(cli), "sweep", "--json", "--ray", ADDRESS, "--python", sys.executable,
                     "-o", str(out), *WORKLOADS], timeout=180)
    local = tmp_path / "local.parquet"
    lr = subprocess.run([cli, "sweep", "--json", "--jobs", "2", "-o", local, *WORKLOADS],
                        cwd=ROOT, capture_output=True, text=True)
    # Both report the failed cells, exit 1, and print the same summaries.
    assert (r.returncode, lr.returncode) == (1, 1), r.stderr
    doc, local_doc = json.loads(r.stdout), json.loads(lr.stdout)
    # Ray's account: every cell in some task, the cells' CPU time counted.
    engine = doc.pop("engine")
    assert "engine" not in local_doc
    assert engine["cells"] == doc["cells"] and 1 <= engine["tasks"] <= doc["cells"] * 2
    assert engine["cells_cpu_seconds"] > 0
    doc.pop("output"), local_doc.pop("output")
    assert doc == local_doc
    assert out.read_bytes() == local.read_bytes()
    assert out.read_bytes()[:4] == b"PAR1"
    failed = [line for line in r.stderr.splitlines() if line.startswith("cell ")]
    assert failed == [line for line in lr.stderr.splitlines() if line.startswith("cell ")]


def test_a_sweep_on_ray_survives_losing_a_node(cluster, tmp_path, monkeypatch):
    # Last of the cluster's tests: the second node is gone after it.
    monkeypatch.chdir(ROOT)
    out = tmp_path / "ray.csv"
    args = json.dumps({"workloads": WORKLOADS, "address": ADDRESS, "output": str(out)})
    driver = cluster.popen([sys.executable, "-c", DRIVER, args])
    # Once the second node runs a task, SIGKILL its raylet, then its
    # workers: the node is lost, with the task it was running.
    node = str(cluster.tmp / "node")
    procs = [(p, cmdline(p)) for p in cluster.processes()]
    raylet = [p for p, cmd in procs if "raylet" in cmd.split(" ")[0] and node in cmd]
    assert len(raylet) == 1, procs
    lost = []
    end = time.time() + 120
    while driver.poll() is None and not lost and time.time() < end:
        workers = [p for p in cluster.processes() if _ppid(p) == raylet[0]]
        if any(cmdline(p).startswith("ray::_run_batch") for p in workers):
            for pid in raylet + workers:
                os.kill(pid, signal.SIGKILL)
            lost = raylet + workers
        time.sleep(0.01)
    stdout, stderr = driver.communicate(timeout=180)
    assert driver.returncode == 0, stderr
    assert lost, "the sweep ended before a task was seen running"
    done = json.loads(stdout.strip().splitlines()[-1])
    local, local_failed = _local(tmp_path, "local.csv")
    assert out.read_bytes() == local.read_bytes()
    assert done["failed"] == local_failed


def _ppid(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_cluster_is_one_sentence_and_writes_nothing(root, tmp_path, cli):
    address = f"127.0.0.1:{_closed_port()}"
    scenario = str(root / WORKLOADS[1])
    out = tmp_path / "rows.parquet"
    with pytest.raises(hugelab.EngineError, match=f"cannot reach the Ray cluster at {address}"):
        hugelab.sweep([scenario], engine="ray", address=address, output=out)
    assert list(tmp_path.iterdir()) == []
    r = subprocess.run([cli, "sweep", "--ray", address, "--python", sys.executable, "-o", out,
                        scenario], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert f"cannot reach the Ray cluster at {address}" in r.stderr
    assert list(tmp_path.iterdir()) == []
    # Bad input wins over the address, and writes nothing either.
    with pytest.raises(hugelab.WorkloadError, match="cannot read the workload"):
        hugelab.sweep([str(tmp_path / "missing.hlw")], engine="ray", address=address, output=out)
    assert list(tmp_path.iterdir()) == []


def test_ray_not_installed_says_how_to_install_it(root, tmp_path, monkeypatch, cli):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(hugelab.EngineError, match=r"pip install 'hugelab\[ray\]'"):
        hugelab.sweep([str(root / WORKLOADS[1])], engine="ray", output=tmp_path / "o.csv")
    assert list(tmp_path.iterdir()) == []
    # The CLI's engine process, in a Python where `import ray` fails.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "ray.py").write_text("raise ImportError('no Ray here')\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={shadow} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    out = tmp_path / "out" / "o.csv"
    out.parent.mkdir()
    r = subprocess.run([cli, "sweep", "--ray", "auto", "--python", python, "-o", out,
                        root / WORKLOADS[1]], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "the Ray engine needs Ray" in r.stderr and "pip install 'hugelab[ray]'" in r.stderr
    assert list(out.parent.iterdir()) == []
    with pytest.raises(ValueError, match="jobs counts the local engine"):
        hugelab.sweep([str(root / WORKLOADS[1])], engine="ray", jobs=2)


class FakeRef:
    """An object reference: each one distinct, as Ray's are."""

    def __init__(self, kind, value):
        self.kind, self.value = kind, value


class FakeRay:
    """Just enough of Ray for the engine's driver, in this process: each
    task runs when it is submitted; a batch holding a cell of the setting
    ``dies_on`` fails as a task whose worker died at each of Ray's tries;
    the first batch answered also answers ``extra`` outcomes again, as a
    task run twice would."""

    class exceptions:
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            pass

        class WorkerCrashedError(RayError):
            pass

    def __init__(self, dies_on, extra):
        self.dies_on, self.extra, self.batches = dies_on, extra, []

    def put(self, value):
        return FakeRef("put", value)

    def remote(self, **options):
        assert options["max_retries"] >= 1
        fake = self

        class Task:
            def __init__(self, f):
                self.f = f

            def remote(self, cells, paths, *refs):
                batch = json.loads(cells)
                fake.batches.append(len(batch))
                if any(c["setting"] == fake.dies_on for c in batch):
                    return FakeRef("crash", None)
                outcomes, seconds, cpu = self.f(cells, paths, *[r.value for r in refs])
                if fake.extra is not None:
                    extra = json.loads(fake.extra)
                    outcomes = outcomes + [(o["rows"]["key"], json.dumps(o)) for o in extra]
                    fake.extra = None
                return FakeRef("done", (outcomes, seconds, cpu))

        return Task

    def wait(self, refs, num_returns, timeout):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if ref.kind == "crash":
            raise self.exceptions.WorkerCrashedError("the worker died")
        return ref.value


def test_the_driver_splits_a_failed_batch_and_passes_each_outcome_once(root, monkeypatch):
    from hugelab import _native, _ray_sweep

    workloads = [str(root / w) for w in WORKLOADS[1:13]]
    settings = [("PMD", [("transparent_hugepage/enabled", "always")]),
                ("4K", [("transparent_hugepage/enabled", "never")])]
    pmd_only = _native.SweepRun(workloads, settings[:1], [], None, None)
    local = json.loads(_native.run_cells(pmd_only.todo()))
    # The first PMD cell's outcome comes a second time with the first batch.
    fake = FakeRay("4K", json.dumps(local[:1]))
    monkeypatch.setattr(_ray_sweep, "_import_ray", lambda: fake)
    state = _native.SweepRun(workloads, settings, [], None, None)
    _ray_sweep.run_ray(state, 2)
    stats = _ray_sweep.last_stats
    assert stats["duplicates"] == 1
    doc = json.loads(state.finish())
    # Every 4K cell failed alone, after its batch failed; the PMD cells ran.
    assert [(f["workload"], f["setting"]) for f in doc["failed"]] == [
        (w, "4K") for w in workloads]
    assert all("the Ray worker running it died" in f["error"] for f in doc["failed"])
    pmd_only.record(json.dumps(local))
    assert doc["columns"] == json.loads(pmd_only.finish())["columns"]
    # Probes of one cell, then batches of more (the cells are fast), then
    # the 4K cells one at a time.
    assert fake.batches[:2] == [1, 1] and max(fake.batches) > 1
    assert fake.batches.count(1) >= len(workloads)
    assert stats["tasks"] == len(fake.batches)
    # The cells ran here: their CPU time is this process's, and some.
    assert 0 < stats["cells_cpu_seconds"] <= time.process_time()
