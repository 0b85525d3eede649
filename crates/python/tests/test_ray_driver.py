"""The Ray engine's driver against a cluster that has lost every CPU: it
ends the sweep with one sentence after ``NO_CPU_SECONDS`` instead of waiting
forever (a stand-in for the cluster, since a real one whose every node is
gone is also gone for its driver; test_ray.py runs the real cluster)."""

import time

import pytest

import hugelab
from hugelab import _ray_sweep


class _NoCpuCluster:
    """A connected cluster whose tasks never answer and whose nodes with CPUs
    are all gone: ``cluster_resources`` has no ``CPU``."""

    def __init__(self):
        self.submitted = 0

    def remote(self, **_options):
        cluster = self

        class Task:
            def remote(self, *_args):
                cluster.submitted += 1
                return object()

        return lambda _f: Task()

    def put(self, data):
        return data

    def wait(self, refs, num_returns, timeout):
        return [], refs

    def cluster_resources(self):
        return {"memory": 1 << 30}


def test_a_cluster_with_no_cpu_left_ends_the_sweep_in_one_sentence(root, monkeypatch):
    monkeypatch.setattr(_ray_sweep, "NO_CPU_SECONDS", 0.3)
    workload = str(root / "scenarios/mthp-inherit-follows-enabled.hlw")
    cells = [{"workload": workload, "n": i} for i in range(3)]
    emitted = []
    cluster = _NoCpuCluster()
    driver = _ray_sweep._Driver(cluster, cells, [f"cell{i}" for i in range(3)], 2,
                                emitted.extend)
    start = time.monotonic()
    with pytest.raises(hugelab.EngineError, match=r"no CPU for 0 s .* 3 of 3 cells got no outcome"):
        driver.run()
    assert 0.3 <= time.monotonic() - start < 10
    assert cluster.submitted == 2 and emitted == []
