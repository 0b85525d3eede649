"""hugelab.scan: the huge pages of running processes on this machine, as
``hugelab scan --json`` reports them (the same code makes the document)."""

import builtins
import json
import os
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Union

import pandas as pd

from . import _native

if TYPE_CHECKING:
    from . import UtilizationReport

PAGE_KB = 4

_PROCESS_COLUMNS = ["pid", "comm", "thp_kb", "zero_filled_kb", "freed_kb",
                    "unclassified_kb", "zero_page_kb", "folio_pages"]
_SIZE_COLUMNS = ["pid", "size_kb", "order", "folios", "bytes", "pmd_mapped",
                 "partial_folios", "zero_pages", "used_pct"]
_GIVE_BACK_COLUMNS = ["pid", "underused_folios", "underused_kb", "partial_folios",
                      "partial_kb", "partial_unmapped_kb", "freed_kb", "rss_kb"]


def _size_row(pid: int, s: Dict[str, Any]) -> Dict[str, Any]:
    """One folio size of one process: its folios (fully and partly mapped),
    their bytes, and the share of their mapped subpages in use (not
    zero-filled)."""
    nr = s["size_kb"] // PAGE_KB
    full = sum(b["folios"] for b in s["buckets"])
    zero = sum(b["zero_pages"] for b in s["buckets"]) + s["partial_zero_pages"]
    mapped = full * nr + s["partial_mapped_pages"]
    folios = full + s["partial_folios"]
    return {
        "pid": pid,
        "size_kb": s["size_kb"],
        "order": s["order"],
        "folios": folios,
        "bytes": folios * s["size_kb"] * 1024,
        "pmd_mapped": s["pmd_mapped"],
        "partial_folios": s["partial_folios"],
        "zero_pages": zero,
        "used_pct": 100.0 * (mapped - zero) / mapped if mapped else float("nan"),
    }


class ScanResult:
    """What ``hugelab scan`` saw of the processes scanned, ranked as it ranks
    them (the most the deferred split shrinker would give back first).

    Attributes:
        processes: a row per process: ``pid``, ``comm``, ``thp_kb`` (its
            memory in large folios), ``zero_filled_kb`` (zero-filled
            subpages in them), ``freed_kb`` (what the shrinker would give
            back), ``unclassified_kb`` (kpageflags read 0), ``zero_page_kb``,
            ``folio_pages`` (mapped pages of anon large folios, all read).
        sizes: a row per process and anon large folio size: ``pid``,
            ``size_kb``, ``order``, ``folios`` (fully or partly mapped),
            ``bytes`` (their size), ``pmd_mapped``, ``partial_folios``,
            ``zero_pages`` (zero-filled mapped subpages), ``used_pct`` (the
            share of their mapped subpages in use).
        histogram: a row per process, folio size and bucket of subpages in
            use: ``pid``, ``size_kb``, ``lo``, ``hi``, ``folios``,
            ``zero_pages`` (fully mapped folios only).
        give_back: a row per process: what the shrinker would split and
            free (``hugelab scan``'s ``give_back`` fields).
        shape: a row per process and thpmaps figure: ``pid``, ``figure``
            (``anon-thp-pmd-aligned-2048kB``, ...), ``kb``.
        reports: each process's :class:`UtilizationReport`, by pid.
        exited_during_scan, not_readable: processes ``all`` or ``cgroup``
            skipped.
        json: the document, as ``hugelab scan --json`` prints it.
    """

    def __init__(self, doc: Dict[str, Any]) -> None:
        from . import UtilizationReport

        self.json: Dict[str, Any] = doc
        procs = doc["processes"]
        self.exited_during_scan: int = doc["exited_during_scan"]
        self.not_readable: int = doc["not_readable"]
        self.processes = pd.DataFrame(
            [{k: p[k] for k in _PROCESS_COLUMNS} for p in procs], columns=_PROCESS_COLUMNS
        )
        self.reports: Dict[int, "UtilizationReport"] = {
            p["pid"]: UtilizationReport(p["utilization"]) for p in procs
        }
        self.sizes = pd.DataFrame(
            [_size_row(p["pid"], s) for p in procs for s in p["utilization"]["sizes"]],
            columns=_SIZE_COLUMNS,
        )
        self.histogram = pd.DataFrame(
            [
                {"pid": p["pid"], "size_kb": s["size_kb"], **b}
                for p in procs
                for s in p["utilization"]["sizes"]
                for b in s["buckets"]
            ],
            columns=["pid", "size_kb", "lo", "hi", "folios", "zero_pages"],
        )
        self.give_back = pd.DataFrame(
            [{"pid": p["pid"], **p["utilization"]["give_back"]} for p in procs],
            columns=_GIVE_BACK_COLUMNS,
        )
        self.shape = pd.DataFrame(
            [
                {"pid": p["pid"], "figure": figure, "kb": kb}
                for p in procs
                for figure, kb in p["shape"].items()
            ],
            columns=["pid", "figure", "kb"],
        )

    def __repr__(self) -> str:
        return f"<hugelab.ScanResult of {len(self.processes)} processes>\n" + (
            self.processes.to_string(index=False)
        )


def scan(
    pid: Union[int, Iterable[int], None] = None,
    cgroup: Union[str, "os.PathLike[str]", None] = None,
    all: bool = False,
    buckets: int = 10,
    max_ptes_none: Optional[int] = None,
) -> ScanResult:
    """Scans running processes as ``hugelab scan`` does: the shape of their
    huge pages (thpmaps's figures), how full every anon large folio is (its
    zero-filled subpages, read through ``/proc/PID/mem``: nothing is
    changed) and what the deferred split shrinker would give back. Needs
    root, as the command does.

    Args:
        pid: a process, or several (exactly one of ``pid``, ``cgroup`` and
            ``all`` is given).
        cgroup: every process of this cgroup directory
            (``/sys/fs/cgroup/...``) and its descendants.
        all: every process of the machine but this one.
        buckets: buckets of each folio size's histogram.
        max_ptes_none: predict the shrinker at this
            ``khugepaged/max_ptes_none`` instead of the machine's.

    Returns:
        a :class:`ScanResult` of DataFrames.

    Raises:
        Error: with ``hugelab scan``'s sentence: not root, no such process
            (with ``pid``), not a cgroup, nothing or more than one thing to
            scan, a bucket count or ``max_ptes_none`` out of range.
    """
    if pid is None:
        pids: List[int] = []
    elif isinstance(pid, int) and not isinstance(pid, bool):
        pids = [pid]
    else:
        pids = list(pid)
    # `all` is the argument here.
    if not builtins.all(isinstance(p, int) and not isinstance(p, bool) for p in pids):
        raise TypeError("pid is a process id (an int) or a list of them")
    path = None if cgroup is None else os.fspath(cgroup)
    doc = _native.scan(pids, path, bool(all), buckets, max_ptes_none)
    return ScanResult(json.loads(doc))
