"""hugelab.counters: the registry `hugelab counters --json` prints, a row
per field of each family."""

import json
import subprocess

import hugelab


def test_a_row_per_field(cli):
    doc = json.loads(
        subprocess.run([cli, "counters", "--json"], check=True, capture_output=True).stdout
    )
    frame = hugelab.counters()
    assert len(frame) == sum(len(f["fields"]) for f in doc)
    mthp = frame[(frame["family"] == "mthp") & (frame["field"] == "anon_fault_alloc")]
    assert list(mthp["kind"]) == ["event"]
    assert set(frame["scope"]) <= {"system", "process", "cgroup"}
