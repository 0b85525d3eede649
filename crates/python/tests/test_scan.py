"""hugelab.scan: a child process with four THPs written to known depths,
scanned live. Expected values from arithmetic on the writes: each THP's
subpages in use are the pages the child wrote, the rest are zero-filled
(Linux 6.18's `thp_underused` counts zero-filled subpages the same way).
Root only, as `hugelab scan`: skipped with the reason otherwise."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hugelab

MIB2 = 2 << 20
#: Pages written (0x5a at each page's first byte) in each of the four THPs.
USED = [512, 256, 103, 4]
ZERO = [512 - u for u in USED]

# The child: 8 MiB at a 2 MiB boundary, MADV_HUGEPAGE, written as USED says,
# then MADV_COLLAPSE (25), so the four ranges are PMD THPs whatever the
# machine's `enabled` is; prints the address and waits for stdin to close.
CHILD = f"""
import ctypes, mmap, sys
M = {MIB2}
m = mmap.mmap(-1, 5 * M, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
off = -base % M
m.madvise(mmap.MADV_HUGEPAGE, off, 4 * M)
for i, used in enumerate({USED}):
    for page in range(used):
        m[off + i * M + page * 4096] = 0x5A
m.madvise(25, off, 4 * M)
print(base + off, flush=True)
sys.stdin.read()
"""


def needs_root():
    if os.geteuid() != 0:
        reason = "not root: hugelab.scan reads page frame numbers and other processes' memory"
        print(f"skipped: {reason}")
        pytest.skip(reason)


@pytest.fixture
def child():
    """The child process, its pid and the address of its 8 MiB; ended (stdin
    closed, then killed if need be, and reaped) on every exit path."""
    needs_root()
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        addr = int(p.stdout.readline())
        yield p.pid, addr
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def region_thp_kb(pid: int, addr: int) -> int:
    """AnonHugePages of the child's VMA that holds `addr`, by its smaps."""
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= addr < end
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    raise AssertionError(f"no VMA at {addr:#x}")


def test_a_childs_thps_by_the_depths_written(child):
    pid, addr = child
    got = region_thp_kb(pid, addr)
    assert got == 8192, f"the kernel gave {got} kB of THPs for the child's 8 MiB, not 8192"
    r = hugelab.scan(pid=[pid, pid], max_ptes_none=409)
    assert list(r.processes["pid"]) == [pid], "a pid given twice is scanned once"
    assert r.processes["folio_pages"][0] >= 4 * 512
    pmd = r.sizes[r.sizes["size_kb"] == 2048].iloc[0]
    assert (pmd["folios"], pmd["bytes"], pmd["pmd_mapped"]) == (4, 8 << 20, 4)
    assert pmd["zero_pages"] == sum(ZERO)
    assert pmd["used_pct"] == pytest.approx(100.0 * sum(USED) / (4 * 512))
    h = r.histogram[(r.histogram["size_kb"] == 2048) & (r.histogram["folios"] > 0)]
    # 10 buckets of 512 subpages: 0-50, 51-101, 102-152, ..., 460-512.
    assert list(zip(h["lo"], h["hi"], h["folios"], h["zero_pages"])) == [
        (0, 50, 1, ZERO[3]),
        (102, 152, 1, ZERO[2]),
        (256, 306, 1, ZERO[1]),
        (460, 512, 1, ZERO[0]),
    ]
    # At max_ptes_none 409 only the THP with 508 zero-filled subpages is
    # under-used (more than 409): split, its zero-filled subpages freed.
    underused = Path("/sys/kernel/mm/transparent_hugepage/shrink_underused").read_text()
    g = r.give_back.iloc[0]
    if underused.strip() == "1":
        assert (g["underused_folios"], g["underused_kb"]) == (1, ZERO[3] * 4)
    else:
        assert g["underused_folios"] == 0
    assert r.reports[pid].settings["max_ptes_none"] == 409
    assert (r.exited_during_scan, r.not_readable) == (0, 0)


def test_the_same_document_as_the_cli(child, cli):
    pid, _ = child
    out = subprocess.run([cli, "scan", "--json", "--pid", str(pid)], check=True,
                         capture_output=True, text=True).stdout
    assert hugelab.scan(pid=pid).json == json.loads(out)


def test_refusals_carry_the_clis_sentence(cli):
    needs_root()
    gone = 2**22 + 1  # above pid_max's default: no such process
    cli_err = subprocess.run([cli, "scan", "--pid", str(gone)], capture_output=True,
                             text=True).stderr.strip()
    with pytest.raises(hugelab.Error) as e:
        hugelab.scan(pid=gone)
    assert cli_err == f"hugelab: {e.value}"
    assert str(e.value).startswith(f"process {gone} does not exist")
    for bad in [{}, {"pid": 1, "all": True}]:
        with pytest.raises(hugelab.Error, match="say what to scan"):
            hugelab.scan(**bad)
    with pytest.raises(TypeError):
        hugelab.scan(pid="1")


def test_not_root_is_refused_in_the_clis_words(cli):
    needs_root()
    if not Path("/usr/bin/setpriv").exists():
        pytest.skip("no setpriv to run as nobody")
    as_nobody = ["/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    code = "import hugelab\ntry:\n    hugelab.scan(all=True)\nexcept hugelab.Error as e:\n    print(e)\n"
    py = subprocess.run([*as_nobody, sys.executable, "-c", code], capture_output=True,
                        text=True, cwd="/")
    assert py.returncode == 0, py.stderr
    cli_err = subprocess.run([*as_nobody, cli, "scan", "--all"], capture_output=True,
                             text=True).stderr.strip()
    assert cli_err == f"hugelab: {py.stdout.strip()}"
    assert "needs root" in py.stdout and "uid 65534" in py.stdout
