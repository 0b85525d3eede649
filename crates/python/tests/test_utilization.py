"""hugelab.utilization: how full the large folios are. Expected values from
arithmetic on the workload: 2M THPs written to known depths, each bucket's
folios and zero-filled subpages counted from the writes."""

import json
import subprocess

import pytest

import hugelab

# Four PMD THPs: two written whole, one 1M of its 2M, one a single page.
PARTLY_WRITTEN = """set transparent_hugepage/enabled always
spawn a
a mmap buf 8M align=2M
a write buf+0:4M
a write buf+4M:1M
a write buf+6M:4K
snapshot written
"""


def test_buckets_from_the_writes():
    u = hugelab.utilization(PARTLY_WRITTEN, snapshot="written", buckets=4)
    assert list(u.sizes["size_kb"]) == [2048]
    assert list(u.sizes["pmd_mapped"]) == [4]
    h = u.histogram
    # 512 subpages in 4 buckets of 128 (0-127, 128-255, 256-383, 384-512):
    # the single page, the half (256 used) and the two whole ones fall into
    # the first, third and fourth.
    assert list(zip(h["lo"], h["hi"])) == [(0, 127), (128, 255), (256, 383), (384, 512)]
    assert list(h["folios"]) == [1, 0, 1, 2]
    # Zero-filled subpages are those never written: 511 and 256.
    assert list(h["zero_pages"]) == [511, 0, 256, 0]
    assert list(u.processes) == ["a"]
    assert u.processes["a"].json == {k: v for k, v in u.json.items() if k != "processes"}


def test_the_same_document_as_the_cli(root, cli):
    path = root / "workloads" / "bimodal-utilization.hlw"
    args = ["utilization", "--json", "--snapshot", "before", str(path)]
    out = subprocess.run([cli, *args], check=True, capture_output=True, text=True).stdout
    assert hugelab.utilization(path, snapshot="before").json == json.loads(out)


def test_bad_input():
    with pytest.raises(hugelab.Error) as e:
        hugelab.utilization(PARTLY_WRITTEN, snapshot="peak")
    assert str(e.value) == (
        "<string> has no snapshot named 'peak': its snapshots are 'written' and 'end'"
    )
    with pytest.raises(hugelab.Error) as e:
        hugelab.utilization(PARTLY_WRITTEN, proc="x")
    assert "no process 'x'" in str(e.value)
    with pytest.raises(hugelab.Error) as e:
        hugelab.utilization(PARTLY_WRITTEN, buckets=0)
    assert str(e.value) == "buckets: 0 is not in 1..=512"
