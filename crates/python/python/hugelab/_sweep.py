"""``hugelab.sweep``'s local engine: the plan, the resume state and the
writer are the native module's (the same as ``hugelab sweep``'s, so the
same inputs write the same bytes); the cells run in worker processes
(:class:`concurrent.futures.ProcessPoolExecutor`), batches of cells per
task. A panic of the model costs its cell (the native ``run_cells``); a
cell that kills its process (out of memory) costs that cell, not the
sweep."""

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Dict, List, Optional

import pandas as pd

from . import _native
from ._errors import SweepError

#: Tasks per worker the cells are cut into: enough that workers finishing
#: early find more, few enough that each task outweighs its cost.
_TASKS_PER_WORKER = 4


def _run_batch(cells: str) -> str:
    """A worker process's task: the batch's outcomes, as JSON."""
    return _native.run_cells(cells)


def _batches(cells: List[Any], jobs: int) -> List[List[Any]]:
    size = max(1, -(-len(cells) // (jobs * _TASKS_PER_WORKER)))
    return [cells[i : i + size] for i in range(0, len(cells), size)]


def run_local(state: "_native.SweepRun", jobs: int) -> None:
    """Runs the cells ``state`` has left on ``jobs`` worker processes,
    recording each batch's outcomes as it finishes. A worker that dies
    breaks the pool: the cells not finished then run again one at a time,
    each in a fresh process if need be, so that the death costs its own
    cell only."""
    todo = json.loads(state.todo())
    if not todo:
        return
    unfinished = _run_pool(state, _batches(todo, jobs), jobs)
    _run_one_by_one(state, sorted(unfinished, key=todo.index))


def _run_pool(state: "_native.SweepRun", batches: List[List[Any]], jobs: int) -> List[Any]:
    """Runs the batches; the cells of those a broken pool left unfinished."""
    unfinished: List[Any] = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_run_batch, json.dumps(b)): b for b in batches}
        for future in as_completed(futures):
            try:
                outcomes = future.result()
            except BrokenProcessPool:
                unfinished.extend(futures[future])
                continue
            state.record(outcomes)
    return unfinished


def _run_one_by_one(state: "_native.SweepRun", cells: List[Any]) -> None:
    """Each cell alone on one worker process (a fresh one after a death),
    so that a death costs the cell that caused it only."""
    pool = None
    try:
        for cell in cells:
            pool = pool or ProcessPoolExecutor(max_workers=1)
            batch = json.dumps([cell])
            try:
                outcomes = pool.submit(_run_batch, batch).result()
            except BrokenProcessPool as e:
                state.record_failed(batch, f"the worker process running it died: {e}")
                pool.shutdown()
                pool = None
                continue
            state.record(outcomes)
    finally:
        if pool is not None:
            pool.shutdown()


class Progress:
    """A sweep's state whose recorded cells move a progress bar with ETA
    (tqdm, on stderr), as ``hugelab sweep``'s does; the engines see the
    state's own methods. ``close`` ends the bar (``finish`` does too)."""

    def __init__(self, state: "_native.SweepRun", enabled: bool) -> None:
        self._state = state
        self._enabled = enabled
        self._bar: Any = None

    def todo(self) -> str:
        todo = self._state.todo()
        if self._enabled and self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=len(json.loads(todo)), unit="cell", desc="sweep",
                             file=sys.stderr, dynamic_ncols=True)
        return todo

    def record(self, outcomes: str) -> int:
        taken = self._state.record(outcomes)
        if self._bar is not None:
            self._bar.update(taken)
        return taken

    def record_failed(self, cells: str, error: str) -> None:
        self._state.record_failed(cells, error)
        if self._bar is not None:
            self._bar.update(len(json.loads(cells)))

    def finish(self) -> str:
        self.close()
        return self._state.finish()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def frame(columns: Dict[str, list]) -> pd.DataFrame:
    """The rows as a DataFrame: ``line`` an integer column with NA at ``end``."""
    rows = pd.DataFrame(columns, columns=["workload", "setting", "machine", "snapshot",
                                          "line", "counter", "value"])
    rows["line"] = rows["line"].astype("Int64")
    rows["value"] = rows["value"].astype("int64")
    return rows


def failure(doc: Dict[str, Any], rows: pd.DataFrame) -> SweepError:
    failed = doc["failed"]
    first = failed[0]
    message = (
        f"{len(failed)} of {doc['cells']} cells failed (the first: {first['workload']} under "
        f"{first['setting']} on machine {first['machine']}: {first['error']}); the output "
        "holds the others, and a re-run runs the failed ones again"
    )
    return SweepError(message, failed, rows)


def default_jobs(jobs: Optional[int]) -> int:
    if jobs is None:
        return os.cpu_count() or 1
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError("jobs is the number of worker processes: an int from 1")
    return jobs
