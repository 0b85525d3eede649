"""hugelab.explain: why each fault got its folio size. Expected values
from arithmetic on the scenario (8 MiB written with only 64K enabled: 128
faults, each a 64K folio) and `hugelab explain --json`'s document."""

import json
import subprocess

import pytest

import hugelab


def test_one_statement(root):
    path = root / "scenarios" / "mthp-64k-only-8m.hlw"
    line = path.read_text().splitlines().index("a write buf") + 1
    e = hugelab.explain(path, line=line)
    assert list(e.statements["line"]) == [line]
    assert list(e.statements["faults"]) == [8 * 1024 // 64]
    assert e.outcomes.to_dict("records") == [{"line": line, "outcome": "got 64K", "faults": 128}]
    assert e.groups["faults"].sum() == 128
    assert e.groups["write"].all()
    assert all(chain[-1] == "mapped a 64K folio" for chain in e.groups["chain"])
    assert e.stopped is None


def test_the_same_document_as_the_cli(root, cli):
    path = root / "scenarios" / "mthp-64k-only-8m.hlw"
    out = subprocess.run(
        [cli, "explain", "--json", path], check=True, capture_output=True, text=True
    ).stdout
    assert hugelab.explain(path).json == json.loads(out)


def test_a_line_without_a_statement():
    with pytest.raises(hugelab.Error) as e:
        hugelab.explain("spawn a\n\na mmap buf 64K\na write buf\n", line=2)
    assert str(e.value) == "<string>:2: no statement starts on this line"


def test_a_run_that_stops_after_explaining():
    text = "spawn a\na mmap buf 64K\na write buf\na munmap nosuch\n"
    with pytest.raises(hugelab.WorkloadError) as e:
        hugelab.explain(text, line=4)
    assert e.value.line == 4
    e2 = hugelab.explain("spawn a\na mmap buf 64K\na write buf\nmachine memory=0\n")
    assert list(e2.statements["line"]) == [3]
    assert e2.stopped is not None and e2.stopped.startswith("<string>:4:")
