"""hugelab: model, measure and tune Linux huge pages, from Python.

The executable model of Linux 6.18's mm/ runs in this process (no
subprocess): :func:`run` runs a workload and returns its counters at each
snapshot, :func:`compare` runs one under several settings and returns the
figures ``hugelab compare`` prints as pandas DataFrames, :func:`explain` says why
each fault got the folio size it got, :func:`utilization` how full the large
folios are and what the deferred split shrinker would give back, :func:`counters` is the counter
registry, :func:`scan` (root) how full the huge pages of running
processes are, and :func:`sweep` runs every workload × machine shape ×
setting in worker processes or on a Ray cluster, as ``hugelab sweep`` does,
and returns the rows.

A workload is a path to a ``.hlw``, ``.hlw.gz`` or ``.hlw.zst`` file (a
``str`` ending so, or any ``os.PathLike``) or a ``str`` of .hlw text. A
setting is a mapping of tunable to value (``{"transparent_hugepage/enabled":
"always"}``). A machine shape is a mapping of the ``machine`` statement's
keys (``memory``, ...) plus ``fragment`` (the ``fragment`` statement's
``unmovable=`` percentage, optionally followed by its other keys), run
before the workload.

Errors are :class:`Error` subclasses carrying the sentence ``hugelab``
prints: :class:`WorkloadError` (with ``file``, ``line``, ``col``),
:class:`SettingError`, :class:`MachineError`; a sweep's :class:`SweepError`
(cells failed) and :class:`EngineError` (its engine cannot run: Ray missing
or unreachable).
"""

import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import pandas as pd

from . import _native
from ._errors import EngineError, Error, MachineError, SettingError, SweepError, WorkloadError
from ._scan import ScanResult, scan

__all__ = [
    "run",
    "compare",
    "explain",
    "utilization",
    "counters",
    "scan",
    "ScanResult",
    "sweep",
    "RunResult",
    "Comparison",
    "Explanation",
    "UtilizationReport",
    "Error",
    "WorkloadError",
    "SettingError",
    "MachineError",
    "SweepError",
    "EngineError",
    "SERIES_SETTINGS",
]

__version__: str = _native.VERSION

Workload = Union[str, "os.PathLike[str]"]
Setting = Mapping[str, Union[str, int]]
Machine = Mapping[str, Union[str, int]]

#: The multi-size THP series' configurations, ``hugelab compare``'s default:
#: 4K pages only, then 16K, 32K+16K, 64K+32K+16K small-order THP, then PMD THP.
SERIES_SETTINGS: Dict[str, Dict[str, str]] = {
    "4K": {"transparent_hugepage/enabled": "never"},
    "16K": {
        "transparent_hugepage/enabled": "never",
        "transparent_hugepage/hugepages-16kB/enabled": "always",
    },
    "32K+16K": {
        "transparent_hugepage/enabled": "never",
        "transparent_hugepage/hugepages-16kB/enabled": "always",
        "transparent_hugepage/hugepages-32kB/enabled": "always",
    },
    "64K+32K+16K": {
        "transparent_hugepage/enabled": "never",
        "transparent_hugepage/hugepages-16kB/enabled": "always",
        "transparent_hugepage/hugepages-32kB/enabled": "always",
        "transparent_hugepage/hugepages-64kB/enabled": "always",
    },
    "PMD": {"transparent_hugepage/enabled": "always"},
}

_SUFFIXES = (".hlw", ".hlw.gz", ".hlw.zst")


def _source(workload: Workload) -> Tuple[str, bool]:
    """The workload as (text or path, whether it is a path)."""
    if isinstance(workload, os.PathLike):
        return os.fspath(workload), True
    if not isinstance(workload, str):
        raise TypeError(
            f"a workload is a path or a str of .hlw text, not {type(workload).__name__}"
        )
    one_line = "\n" not in workload
    if one_line and workload.strip().endswith(_SUFFIXES):
        return workload, True
    return workload, False


def _pairs(what: str, mapping: Optional[Mapping[str, Any]]) -> List[Tuple[str, str]]:
    if mapping is None:
        return []
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{what} is a mapping of name to value, not {type(mapping).__name__}")
    return [(str(k), str(v)) for k, v in mapping.items()]


class RunResult:
    """What a workload did on the model: its counters at each snapshot,
    the ``expect`` lines' outcomes, the system calls that failed and the
    processes the kernel killed (the workload goes on after both).

    Attributes:
        workload: the workload's name (its path, or ``<string>``).
        backend: ``model``.
        snapshots: per snapshot in order (``end`` last): ``label``,
            ``line`` (None for ``end``) and ``counters`` (name to value).
        expectations: per ``expect`` line: ``line``, ``col``, ``counter``,
            ``op``, ``expected``, ``actual``, ``passed``.
        failed_calls: per failed call: ``line``, ``col``, ``statement``,
            ``errno``, ``message``.
        kills: per killed process: ``line``, ``col``, ``statement``,
            ``process``, ``signal``, ``message``.
        overrides: the workload's prelude ``set`` lines the settings dropped.
        json: the whole document, as ``hugelab run --json`` prints it.
    """

    def __init__(self, doc: Dict[str, Any]) -> None:
        obs = doc["observation"]
        self.json: Dict[str, Any] = obs
        self.workload: str = obs["workload"]
        self.backend: str = obs["backend"]
        self.snapshots: List[Dict[str, Any]] = obs["snapshots"]
        self.expectations: List[Dict[str, Any]] = obs["expects"]
        self.failed_calls: List[Dict[str, Any]] = obs.get("failed_calls", [])
        self.kills: List[Dict[str, Any]] = obs.get("kills", [])
        self.overrides: List[Dict[str, Any]] = doc["overrides"]
        self.not_inheriting: List[Dict[str, Any]] = doc["not_inheriting"]

    @property
    def passed(self) -> bool:
        """Whether every ``expect`` line held (those not checked aside)."""
        return all(e["passed"] or e.get("unknown") for e in self.expectations)

    def counters(self, snapshot: str = "end") -> Dict[str, int]:
        """The counters at a snapshot (by its label), name to value."""
        for s in self.snapshots:
            if s["label"] == snapshot:
                return dict(s["counters"])
        labels = ", ".join(s["label"] for s in self.snapshots)
        raise Error(f"{self.workload} has no snapshot '{snapshot}'; its snapshots are {labels}")

    def to_pandas(self) -> pd.DataFrame:
        """One row per (snapshot, counter): columns ``snapshot``, ``line``
        (the snapshot's line; None at ``end``), ``counter``, ``value``."""
        rows = [
            (s["label"], s["line"], name, value)
            for s in self.snapshots
            for name, value in s["counters"].items()
        ]
        frame = pd.DataFrame(rows, columns=["snapshot", "line", "counter", "value"])
        frame["line"] = frame["line"].astype("Int64")
        return frame

    def __repr__(self) -> str:
        labels = ", ".join(s["label"] for s in self.snapshots)
        passed = sum(1 for e in self.expectations if e["passed"])
        return (
            f"<hugelab.RunResult {self.workload}: snapshots {labels}; "
            f"expectations {passed}/{len(self.expectations)} passed; "
            f"{len(self.failed_calls)} failed calls, {len(self.kills)} kills>"
        )


class Comparison:
    """One workload under several settings, as ``hugelab compare`` prints it.

    Attributes:
        summary: a row per setting (the index), the first the baseline:
            ``page_faults`` (vmstat.pgfault), ``anon_kb`` (meminfo.AnonPages),
            ``large_folio_pct`` (the share of anon_kb in folios larger than
            a base page), ``in_<size>_pct`` per folio size (``in_64K_pct``,
            ``in_2M_pct``), ``fallbacks`` (the mthp ``anon_fault_fallback``
            counters summed), the ``..._change`` of each count against the
            baseline in percent (NaN where the baseline is 0 and the
            setting's is not), and ``large_folio_kb``.
        table: a row per counter (the index), a column per setting with the
            counter's value at the snapshot, then ``<setting> vs <baseline>``
            columns: the change in percent.
        snapshot: the snapshot compared; snapshots: all the workload took.
        notes: a sentence per setting whose column equals an earlier one's.
        settings: per setting: ``name``, ``sets``, ``overrides``,
            ``not_inheriting``.
        json: the whole document, as ``hugelab compare --json`` prints it.
    """

    def __init__(self, doc: Dict[str, Any]) -> None:
        self.json: Dict[str, Any] = doc
        self.workload: str = doc["workload"]
        self.snapshot: str = doc["snapshot"]
        self.snapshots: List[str] = doc["snapshots"]
        self.baseline: str = doc["baseline"]
        self.notes: List[str] = doc["notes"]
        self.settings: List[Dict[str, Any]] = doc["settings"]
        self.summary: pd.DataFrame = _summary_frame(doc["summary"])
        order = [s["name"] for s in self.settings]
        self.table: pd.DataFrame = _table_frame(doc["counters"], order)

    def __repr__(self) -> str:
        return (
            f"# {self.workload} at snapshot '{self.snapshot}', model backend\n"
            + "".join(f"note: {n}\n" for n in self.notes)
            + self.summary.to_string()
        )


def _size_kb(size: str) -> int:
    return int(size[: -len("kB")])


def _short_size(size: str) -> str:
    """``64K``, ``2M``: a sysfs size name (``2048kB``) as the CLI's tables
    write it."""
    kb = _size_kb(size)
    return f"{kb // 1024}M" if kb >= 1024 and kb % 1024 == 0 else f"{kb}K"


def _summary_frame(summary: List[Dict[str, Any]]) -> pd.DataFrame:
    """The CLI's summary table in numbers: its columns in its order, each
    change as a ``..._change`` column in percent, then ``large_folio_kb``."""
    sizes = sorted({b["size"] for s in summary for b in s["by_size"]}, key=_size_kb)
    rows = []
    for s in summary:
        shares = {b["size"]: b["share_pct"] for b in s["by_size"]}
        row = {
            "setting": s["setting"],
            "page_faults": s["page_faults"],
            "page_faults_change": s["page_faults_change_pct"],
            "anon_kb": s["anon_kb"],
            "anon_kb_change": s["anon_change_pct"],
            "large_folio_pct": s["large_folio_share_pct"],
        }
        for size in sizes:
            row[f"in_{_short_size(size)}_pct"] = shares.get(size, 0.0)
        row["fallbacks"] = s["fallbacks"]
        row["fallbacks_change"] = s["fallbacks_change_pct"]
        row["large_folio_kb"] = s["large_folio_kb"]
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("setting")
    floats = [c for c in frame.columns if c.endswith(("_pct", "_change"))]
    frame[floats] = frame[floats].astype(float)
    return frame


def _change_pct(base: int, value: int) -> float:
    if base == 0:
        return 0.0 if value == 0 else float("nan")
    return (value - base) * 100.0 / base


def _table_frame(columns: Dict[str, Dict[str, int]], order: List[str]) -> pd.DataFrame:
    """A row per counter, a column per setting in ``order`` (the first the
    baseline), then each later one's change against the baseline."""
    names = sorted({n for c in columns.values() for n in c})
    frame = pd.DataFrame(
        {setting: [columns[setting].get(n, 0) for n in names] for setting in order},
        index=pd.Index(names, name="counter"),
        dtype="int64",
    )
    baseline = order[0]
    for setting in order[1:]:
        frame[f"{setting} vs {baseline}"] = [
            _change_pct(b, v) for b, v in zip(frame[baseline], frame[setting])
        ]
    return frame


def run(
    workload: Workload,
    settings: Optional[Setting] = None,
    machine: Optional[Machine] = None,
) -> RunResult:
    """Runs a workload on the model, in this process.

    Args:
        workload: a path (``.hlw``, ``.hlw.gz``, ``.hlw.zst``) or .hlw text.
        settings: tunable to value, set before the workload; a ``set`` of
            the same tunable in the workload's prelude is dropped (said in
            ``overrides``), one after it started is a :class:`SettingError`.
        machine: a machine shape: ``machine`` statement keys (``memory``:
            ``"4G"``) and ``fragment`` (``"10%"``, ``"10% pattern=clustered"``).

    Returns:
        a :class:`RunResult`; ``.to_pandas()`` gives one row per
        (snapshot, counter).

    Raises:
        WorkloadError, SettingError, MachineError: with ``hugelab``'s sentence.
    """
    text, is_path = _source(workload)
    doc = _native.run(text, is_path, _pairs("settings", settings), _pairs("machine", machine))
    return RunResult(json.loads(doc))


def compare(
    workload: Workload,
    settings: Optional[Mapping[str, Setting]] = None,
    snapshot: Optional[str] = None,
    machine: Optional[Machine] = None,
) -> Comparison:
    """Runs a workload under each setting on a fresh model and compares the
    counters at one snapshot, as ``hugelab compare`` does.

    Args:
        workload: a path (``.hlw``, ``.hlw.gz``, ``.hlw.zst``) or .hlw text.
        settings: setting name to (tunable to value), in order; the first is
            the baseline. Default: :data:`SERIES_SETTINGS`.
        snapshot: the snapshot to compare; default the workload's first,
            else ``end``.
        machine: a machine shape, as :func:`run` takes it.

    Returns:
        a :class:`Comparison`: ``.summary`` and ``.table`` are DataFrames.

    Raises:
        WorkloadError, SettingError, MachineError, Error: with ``hugelab``'s
        sentence.
    """
    text, is_path = _source(workload)
    if settings is None:
        settings = SERIES_SETTINGS
    if not isinstance(settings, Mapping):
        raise TypeError("settings is a mapping of setting name to {tunable: value}")
    given = [(str(name), _pairs(f"setting {name}", sets)) for name, sets in settings.items()]
    doc = _native.compare_settings(text, is_path, given, snapshot, _pairs("machine", machine))
    return Comparison(json.loads(doc))


class Explanation:
    """Why each fault of a statement got the folio size it got, and what
    each collapse did, as ``hugelab explain`` prints it.

    Attributes:
        statements: a row per statement explained: ``line``, ``statement``,
            ``faults``, ``fell_back`` (faults that tried a larger size and
            fell back), ``ranges`` (PMD ranges a collapse scanned),
            ``collapsed``.
        outcomes: a row per statement and outcome (``got 64K``, ``got the
            zero page``, ...), the largest folio first: ``line``,
            ``outcome``, ``faults``.
        groups: a row per group of faults that took the same decisions:
            ``line``, ``faults``, ``write``, ``first`` and ``last`` (the
            first and last faulting address, ``region+offset``) and
            ``chain`` (the decisions, in words, as a list).
        collapses: a row per group of collapse steps with equal outcomes:
            ``line``, ``ranges``, ``first``, ``last``, ``chain``.
        stopped: why the run stopped after explaining what ran, or None.
        json: the statements as ``hugelab explain --json`` prints them.
    """

    def __init__(self, doc: Dict[str, Any]) -> None:
        explained = doc["explained"]
        self.json: List[Dict[str, Any]] = explained
        self.stopped: Optional[str] = doc["stopped"]
        self.statements = pd.DataFrame(
            [
                {
                    "line": e["line"],
                    "statement": e["statement"],
                    "faults": e["faults"],
                    "fell_back": e["totals"]["fell_back"],
                    "ranges": e["totals"]["ranges"],
                    "collapsed": e["totals"]["collapsed"],
                }
                for e in explained
            ],
            columns=["line", "statement", "faults", "fell_back", "ranges", "collapsed"],
        )
        self.outcomes = pd.DataFrame(
            [
                {"line": e["line"], "outcome": outcome, "faults": n}
                for e in explained
                for outcome, n in e["totals"]["got"]
            ],
            columns=["line", "outcome", "faults"],
        )
        group_columns = ["line", "faults", "write", "first", "last", "chain"]
        self.groups = pd.DataFrame(
            [
                {"line": e["line"], **{k: g[k] for k in group_columns[1:]}}
                for e in explained
                for g in e["groups"]
            ],
            columns=group_columns,
        )
        collapse_columns = ["line", "ranges", "first", "last", "chain"]
        self.collapses = pd.DataFrame(
            [
                {"line": e["line"], **{k: c[k] for k in collapse_columns[1:]}}
                for e in explained
                for c in e["collapses"]
            ],
            columns=collapse_columns,
        )

    def __repr__(self) -> str:
        return f"<hugelab.Explanation of {len(self.json)} statements>\n" + self.statements.to_string()


def explain(workload: Workload, line: Optional[int] = None) -> Explanation:
    """Runs a workload on the model with its tracepoints on and says why
    each fault of the statement starting on ``line`` (every statement that
    faults or collapses, without one) got the folio size it got, each
    decision named after the kernel function that takes it, as
    ``hugelab explain FILE[:LINE]`` does.

    Raises:
        WorkloadError: the workload is wrong, or stopped before any
            statement was explained; Error: no statement starts on ``line``.
    """
    text, is_path = _source(workload)
    if line is not None and (not isinstance(line, int) or line < 1):
        raise TypeError("line is a line number: an int from 1")
    return Explanation(json.loads(_native.explain_faults(text, is_path, line)))


class UtilizationReport:
    """How full the large folios are, why they exist and what the deferred
    split shrinker would give back, as ``hugelab utilization`` reports it.

    Attributes:
        histogram: a row per folio size and bucket of used subpages:
            ``size_kb``, ``lo``, ``hi`` (the bucket's used subpages, both
            ends in), ``folios``, ``zero_pages`` (zero-filled subpages).
        sizes: a row per folio size: ``size_kb``, ``order``,
            ``pmd_mapped``, ``partial_folios``, ``partial_mapped_pages``,
            ``partial_zero_pages``.
        bloat: never-written memory by cause and folio size: ``cause``,
            ``size_kb``, ``folios``, ``never_written_kb``.
        give_back: what the shrinker would give back (``freed_kb``,
            ``rss_kb``, ``underused_folios``, ...), a dict.
        settings: the shrinker settings the report is at, a dict.
        processes: each process's own report by name (every process's
            scope only; otherwise empty).
        json: the document, as ``hugelab utilization --json`` prints it.
    """

    def __init__(self, doc: Dict[str, Any]) -> None:
        self.json: Dict[str, Any] = doc
        self.give_back: Dict[str, Any] = doc["give_back"]
        self.settings: Dict[str, Any] = doc["settings"]
        self.histogram = pd.DataFrame(
            [{"size_kb": s["size_kb"], **b} for s in doc["sizes"] for b in s["buckets"]],
            columns=["size_kb", "lo", "hi", "folios", "zero_pages"],
        )
        size_columns = ["size_kb", "order", "pmd_mapped", "partial_folios",
                        "partial_mapped_pages", "partial_zero_pages"]
        self.sizes = pd.DataFrame(
            [{k: s[k] for k in size_columns} for s in doc["sizes"]], columns=size_columns
        )
        self.bloat = pd.DataFrame(
            doc["bloat"], columns=["cause", "size_kb", "folios", "never_written_kb"]
        )
        self.processes: Dict[str, "UtilizationReport"] = {
            name: UtilizationReport(p) for name, p in doc.get("processes", {}).items()
        }

    def __repr__(self) -> str:
        return (
            f"<hugelab.UtilizationReport: {self.sizes['size_kb'].tolist()} kB folios; "
            f"the shrinker would give back {self.give_back['freed_kb']} kB>"
        )


def utilization(
    workload: Workload,
    snapshot: Optional[str] = None,
    proc: Optional[str] = None,
    region: Optional[str] = None,
    buckets: int = 10,
    max_ptes_none: Optional[int] = None,
) -> UtilizationReport:
    """Runs a workload on the model up to its ``snapshot`` statement (default:
    its end) and reports on the large folios of every process (or of
    ``proc``, or of ``region`` of it), as ``hugelab utilization`` does.

    Args:
        buckets: buckets per folio size (1 to 512).
        max_ptes_none: predict the shrinker at this
            ``khugepaged/max_ptes_none`` instead of the workload's.

    Raises:
        WorkloadError: the workload is wrong; Error: no such snapshot,
            process or region, or a bucket count out of range.
    """
    text, is_path = _source(workload)
    doc = _native.utilization(text, is_path, snapshot, proc, region, buckets, max_ptes_none)
    return UtilizationReport(json.loads(doc))


def counters() -> pd.DataFrame:
    """The counter registry (``hugelab counters``): a row per field of each
    family, with columns ``family``, ``pattern``, ``scope``, ``source``,
    ``field``, ``kind``, ``unit``, ``reported``, ``what``."""
    rows = []
    for family in json.loads(_native.counters()):
        for field in family["fields"]:
            rows.append(
                {
                    "family": family["name"],
                    "pattern": family["pattern"],
                    "scope": family["scope"],
                    "source": family["source"],
                    "field": field["name"],
                    "kind": field["kind"],
                    "unit": field["unit"],
                    "reported": field["reported"],
                    "what": field["what"],
                }
            )
    return pd.DataFrame(rows)


def _sweep_on_ray(paths, given, shapes, out, format, address, progress) -> Dict[str, Any]:
    """The Ray engine's sweep: the input checked before connecting (bad
    input wins over an unreachable cluster, and neither writes anything),
    then the state and its journal, the cells on the cluster, the output."""
    from . import _ray_sweep, _sweep

    _native.SweepRun(paths, given, shapes, None, None)
    with _ray_sweep.connect(address) as workers:
        state = _sweep.Progress(_native.SweepRun(paths, given, shapes, out, format), progress)
        try:
            _ray_sweep.run_ray(state, workers)
        finally:
            state.close()
        return json.loads(state.finish())


def sweep(
    workloads: Sequence[Union[str, "os.PathLike[str]"]],
    settings: Optional[Mapping[str, Setting]] = None,
    machines: Optional[Sequence[Machine]] = None,
    output: Optional[Union[str, "os.PathLike[str]"]] = None,
    jobs: Optional[int] = None,
    engine: str = "local",
    format: Optional[str] = None,
    address: Optional[str] = None,
    progress: Optional[bool] = None,
) -> pd.DataFrame:
    """Runs every workload on every machine shape under every setting on the
    model, in worker processes or on a Ray cluster, as ``hugelab sweep``
    does (the same plan, rows and output bytes; docs/sweep.md).

    Args:
        workloads: workload files (``.hlw``, ``.hlw.gz``, ``.hlw.zst``);
            the ``workload`` column holds each path as given.
        settings: setting name to (tunable to value), in order; the first is
            each summary's baseline. Default: :data:`SERIES_SETTINGS`.
        machines: machine shapes, each as :func:`run` takes one; the
            ``machine`` column holds it as ``--machine`` writes it
            (``memory=4G,fragment=10%``). Default: each workload's own
            machine (``own``).
        output: a ``.parquet``, ``.csv`` or ``.json`` file to write the rows
            to (``format`` for another extension). A re-run over it skips
            the cells already in it; a sweep cut short resumes from its
            journal, ``OUTPUT.partial``.
        jobs: the local engine's worker processes; default one per core.
        engine: ``"local"`` (worker processes on this machine) or ``"ray"``
            (tasks on the Ray cluster at ``address``, each CPU of it a
            worker; the workloads are shipped to it, so its machines need
            ``hugelab`` installed but not the files; ``pip install
            'hugelab[ray]'``).
        format: the output's format when its extension does not say:
            ``"parquet"``, ``"csv"`` or ``"json"``.
        address: with ``engine="ray"``: the cluster's head, ``"HOST:PORT"``,
            or ``"auto"`` (the default: ``RAY_ADDRESS``, else the cluster
            started on this machine). When this process is connected to
            Ray already, that cluster.
        progress: a progress bar with the cells done and the ETA on stderr
            (tqdm); default: when stderr is a terminal.

    Returns:
        a DataFrame with a row per cell, snapshot and counter: ``workload``,
        ``setting``, ``machine``, ``snapshot``, ``line`` (NA at ``end``),
        ``counter``, ``value``, in the plan's order.

    Raises:
        WorkloadError, SettingError, MachineError, Error: bad input, with
        ``hugelab``'s sentence; nothing is written. SweepError: cells
        failed; the others are written and in its ``rows``. EngineError:
        Ray is not installed or the cluster cannot be reached (nothing is
        written), or it lost cells (the others are in the journal).
    """
    from . import _sweep

    if engine not in ("local", "ray"):
        raise ValueError(f"engine is 'local' or 'ray', not {engine!r}")
    if engine == "ray" and jobs is not None:
        raise ValueError("jobs counts the local engine's processes; on Ray each CPU is a worker")
    if engine == "local" and address is not None:
        raise ValueError("address is a Ray cluster's: give engine='ray' with it")
    if engine == "local":
        jobs = _sweep.default_jobs(jobs)
    if isinstance(workloads, (str, os.PathLike)):
        workloads = [workloads]
    paths = []
    for w in workloads:
        if not isinstance(w, (str, os.PathLike)) or (isinstance(w, str) and "\n" in w):
            raise TypeError("a sweep's workloads are paths to workload files")
        paths.append(os.fspath(w))
    if settings is None:
        settings = SERIES_SETTINGS
    if not isinstance(settings, Mapping):
        raise TypeError("settings is a mapping of setting name to {tunable: value}")
    given = [(str(name), _pairs(f"setting {name}", sets)) for name, sets in settings.items()]
    shapes = [_pairs("machine", m) for m in (machines or [])]
    out = None if output is None else os.fspath(output)
    if progress is None:
        progress = sys.stderr.isatty()
    if engine == "ray":
        doc = _sweep_on_ray(paths, given, shapes, out, format, address, progress)
    else:
        state = _sweep.Progress(_native.SweepRun(paths, given, shapes, out, format), progress)
        try:
            _sweep.run_local(state, jobs)
        finally:
            state.close()
        doc = json.loads(state.finish())
    rows = _sweep.frame(doc["columns"])
    if doc["failed"]:
        raise _sweep.failure(doc, rows)
    return rows
