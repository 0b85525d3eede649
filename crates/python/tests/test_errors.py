"""Bad input: an exception of hugelab's with the one sentence the CLI
prints, and the place of a workload's error."""

import subprocess

import pytest

import hugelab

# The example of docs/language.md, "Errors": line 3, column 9.
OUT_OF_REGION = "spawn a\na mmap buf 2M\na write buf+1M:2M\n"


def test_a_missing_file(tmp_path):
    missing = tmp_path / "missing.hlw"
    with pytest.raises(hugelab.WorkloadError) as e:
        hugelab.run(missing)
    assert str(e.value) == f"{missing}: cannot read: No such file or directory (os error 2)"
    assert e.value.file == str(missing) and e.value.line is None
    with pytest.raises(hugelab.WorkloadError):
        hugelab.compare(str(missing), {"a": {}})


def test_a_malformed_workload_names_its_place():
    with pytest.raises(hugelab.WorkloadError) as e:
        hugelab.run(OUT_OF_REGION)
    assert (e.value.file, e.value.line, e.value.col) == ("<string>", 3, 9)
    assert str(e.value).startswith("<string>:3:9: range 'buf+1M:2M' is out of region 'buf'")
    assert "\n" not in str(e.value)


def test_the_message_is_the_clis(tmp_path, cli):
    path = tmp_path / "buf.hlw"
    path.write_text(OUT_OF_REGION)
    err = subprocess.run([cli, "run", path], capture_output=True, text=True).stderr
    with pytest.raises(hugelab.WorkloadError) as e:
        hugelab.run(path)
    assert err == f"hugelab: {e.value}\n"
    assert (e.value.line, e.value.col) == (3, 9)


def test_an_unknown_tunable():
    with pytest.raises(hugelab.SettingError) as e:
        hugelab.compare(OUT_OF_REGION, {"x": {"transparent_hugepage/enabledx": "always"}})
    assert str(e.value) == (
        "--setting x:1:5: unknown tunable 'transparent_hugepage/enabledx'; "
        "did you mean transparent_hugepage/enabled?"
    )
    with pytest.raises(hugelab.SettingError):
        hugelab.run(OUT_OF_REGION, settings={"transparent_hugepage/enabled": "sometimes"})


def test_a_bad_machine_shape():
    with pytest.raises(hugelab.MachineError) as e:
        hugelab.run("spawn a\n", machine={"memory": "0"})
    assert str(e.value) == "machine:1:16: machine memory must be nonzero"
    with pytest.raises(hugelab.MachineError):
        hugelab.run("spawn a\n", machine={"size": "4G"})


def test_a_missing_snapshot_and_a_memory_limit():
    with pytest.raises(hugelab.Error) as e:
        hugelab.compare("spawn a\n", {"a": {}}, snapshot="peak")
    assert str(e.value) == "<string> has no snapshot 'peak'; its snapshots are end"
    with pytest.raises(hugelab.SettingError):
        hugelab.compare("spawn a\n", {"a": {"memory.max": "20M"}})


def test_not_a_workload():
    with pytest.raises(TypeError):
        hugelab.run(42)  # type: ignore[arg-type]
