"""``hugelab.sweep``'s Ray engine, and ``hugelab sweep --ray``'s.

The plan, the resume state and the writer stay where the sweep was started
(the native ``SweepRun`` in Python, the CLI's own in ``hugelab sweep``);
this module only runs the cells left on a Ray cluster:

- each workload file is read here once and put in the cluster's object
  store (``ray.put``), so the workers need no shared path; a worker runs a
  batch of cells on those bytes (``_native.run_cells_lines(cells,
  workloads)``: each outcome's JSON line, passed on as it is),
  which must be the bytes the plan hashed;
- a batch is as many cells as run in about :data:`TASK_SECONDS` at the mean
  time per cell the tasks measured so far (one cell per task at first, to
  measure), and no more than an even share of what is left among the
  tasks that can be in flight (:data:`IN_FLIGHT` per worker);
- a task whose worker process or node dies is run again by Ray
  (``max_retries``); a batch that still fails is split, each cell run
  alone, and a cell that fails alone is a failed cell (a re-run runs it
  again);
- each outcome is passed on once: the driver keeps the set of cells done,
  drops a second outcome of a cell (a task that ran twice), and checks at
  the end that every cell of the plan has exactly one.

``python -m hugelab._ray_sweep --address ADDRESS`` is the engine process
``hugelab sweep --ray`` starts: it connects, says so on stdout
(``{"ready": {...}}``), reads the cells left (a JSON array, one line) on
stdin and answers each cell's outcome, a JSON line each, as the CLI's
local workers do, then ``{"done": {...}}``; or ``{"error": SENTENCE}``.
"""

import argparse
import contextlib
import ctypes
import json
import logging
import math
import os
import socket
import sys
import time
from collections import deque
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import _native
from ._errors import EngineError, Error

#: How long a task should run: long enough that the cluster's cost per task
#: (scheduling, moving arguments and results) is small beside it.
TASK_SECONDS = 1.5
#: Times Ray runs a task again after its worker process or node died.
RETRIES = 3
#: Tasks in flight per worker: the next is queued when one finishes.
IN_FLIGHT = 2
#: Seconds the cluster may have no CPU at all (every node that could run a
#: cell gone) before the sweep gives up on the cells still waiting.
NO_CPU_SECONDS = 60.0
#: Seconds to wait for the cluster's address to answer before saying it
#: cannot be reached.
CONNECT_SECONDS = 5.0

#: What the last sweep on Ray did (for its tests): tasks, tasks that failed
#: even after Ray's retries, outcomes dropped as a second one of a cell, and
#: the CPU seconds the workers spent running cells.
last_stats: Dict[str, Any] = {}


def _import_ray() -> Any:
    try:
        import ray  # noqa: F401
    except ImportError as e:
        raise EngineError(
            f"the Ray engine needs Ray, which this Python ({sys.executable}) cannot import "
            f"({e}): pip install 'hugelab[ray]'"
        ) from None
    return ray


def _check_reachable(address: str) -> None:
    """A HOST:PORT address that answers no TCP connection is an error now,
    not after Ray's own minute of retries."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise EngineError(f"the Ray address {address!r} is not HOST:PORT (or 'auto')")
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_SECONDS).close()
    except OSError as e:
        raise EngineError(
            f"cannot reach the Ray cluster at {address}: {e.strerror or e}"
        ) from None


@contextlib.contextmanager
def connect(address: Optional[str]) -> Iterator[int]:
    """Connects to the cluster at ``address`` (``HOST:PORT`` of its head,
    or ``auto``: ``RAY_ADDRESS`` or the cluster started on this machine;
    None is ``auto``), unless this process already is; yields its number of
    CPUs (the workers), and disconnects at the end if it connected."""
    ray = _import_ray()
    ours = not ray.is_initialized()
    if ours:
        address = address or "auto"
        if address != "auto":
            _check_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        except Exception as e:  # ray raises ConnectionError, RuntimeError, ValueError
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise EngineError(f"cannot connect to the Ray cluster at {address}: {why}") from None
    try:
        workers = int(ray.cluster_resources().get("CPU", 0))
        if workers < 1:
            raise EngineError(f"the Ray cluster at {address} has no CPU to run cells on")
        yield workers
    finally:
        if ours:
            ray.shutdown()


def _run_batch(
    cells: str, paths: List[str], *texts: bytes
) -> Tuple[List[Tuple[str, str]], float, float]:
    """A Ray task: the batch's outcomes (each cell's key and JSON line), the
    seconds they took and the CPU seconds of running them (this thread's:
    what the same cells cost in-process, without what Ray costs)."""
    start, cpu = time.perf_counter(), time.thread_time()
    outcomes = _native.run_cells_lines(cells, dict(zip(paths, texts)))
    return outcomes, time.perf_counter() - start, time.thread_time() - cpu


def _failed(key: str, error: str) -> Tuple[str, str]:
    return key, json.dumps({"failed": {"key": key, "error": error}})


class _Driver:
    """One sweep's cells on the cluster: batches, retries, each outcome once."""

    def __init__(self, ray: Any, cells: List[Dict[str, Any]], keys: List[str],
                 workers: int, emit: Callable[[List[str]], None]) -> None:
        self.ray, self.workers, self.emit = ray, workers, emit
        self.key = {id(c): k for c, k in zip(cells, keys)}
        self.planned = set(keys)
        if len(self.planned) != len(keys):
            raise EngineError("the cells to run name a cell twice")
        self.pending = deque(cells)
        self.alone: deque = deque()  # cells of a batch that failed: each alone
        self.done: set = set()
        self.per_cell: Optional[float] = None
        self.stats: Dict[str, Any] = {"tasks": 0, "failed_tasks": 0, "duplicates": 0,
                                      "cells": len(keys), "cells_cpu_seconds": 0.0}
        self.task = ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=False)(
            _run_batch
        )
        self.shipped: Dict[str, Any] = {}

    def ship(self) -> None:
        """Puts each workload's bytes in the object store, once; a workload
        that cannot be read costs its cells."""
        unreadable = {}
        for cell in self.pending:
            path = cell["workload"]
            if path in self.shipped or path in unreadable:
                continue
            try:
                with open(path, "rb") as f:
                    self.shipped[path] = self.ray.put(f.read())
            except OSError as e:
                unreadable[path] = f"{path}: cannot read the workload: {e.strerror or e}"
        if unreadable:
            lost = [c for c in self.pending if c["workload"] in unreadable]
            self.pending = deque(c for c in self.pending if c["workload"] not in unreadable)
            self.take([_failed(self.key[id(c)], unreadable[c["workload"]]) for c in lost])

    def batch(self) -> List[Dict[str, Any]]:
        if self.alone:
            return [self.alone.popleft()]
        # An even share of what is left among the tasks that can be in
        # flight: the probes may have been the cheapest cells, and a batch
        # sized by them alone took half of a sweep.
        share = max(1, math.ceil(len(self.pending) / (self.workers * IN_FLIGHT)))
        want = 1 if self.per_cell is None else math.ceil(TASK_SECONDS / max(self.per_cell, 1e-6))
        return [self.pending.popleft() for _ in range(min(max(want, 1), share))]

    def submit(self, inflight: Dict[Any, List[Dict[str, Any]]]) -> None:
        # Until a task has been timed, one probe per worker.
        limit = self.workers * (IN_FLIGHT if self.per_cell is not None else 1)
        while (self.pending or self.alone) and len(inflight) < limit:
            batch = self.batch()
            paths = sorted({c["workload"] for c in batch})
            ref = self.task.remote(json.dumps(batch), paths, *[self.shipped[p] for p in paths])
            inflight[ref] = batch
            self.stats["tasks"] += 1

    def take(self, outcomes: List[Tuple[str, str]]) -> None:
        """Passes on the outcomes of cells not done yet; drops the others."""
        new = []
        for key, line in outcomes:
            if key not in self.planned:
                raise EngineError(f"a task answered for a cell not in this sweep: {key}")
            if key in self.done:
                self.stats["duplicates"] += 1
                continue
            self.done.add(key)
            new.append(line)
        if new:
            self.emit(new)

    def answered(self, ref: Any, batch: List[Dict[str, Any]]) -> None:
        ray = self.ray
        try:
            outcomes, seconds, cpu = ray.get(ref)
        except ray.exceptions.RayError as e:
            self.stats["failed_tasks"] += 1
            if len(batch) > 1:
                self.alone.extend(batch)
                return
            if isinstance(e, ray.exceptions.RayTaskError):
                lines = str(e).strip().splitlines()
                why = f"the Ray task running it raised: {lines[-1] if lines else type(e).__name__}"
            else:
                why = (f"the Ray worker running it died {RETRIES + 1} times "
                       f"({type(e).__name__}): out of memory, a crash or a lost node")
            self.take([_failed(self.key[id(batch[0])], why)])
            return
        self.stats["cells_cpu_seconds"] += cpu
        t = seconds / len(batch)
        self.per_cell = t if self.per_cell is None else 0.7 * self.per_cell + 0.3 * t
        self.take(outcomes)

    def run(self) -> None:
        self.ship()
        inflight: Dict[Any, List[Dict[str, Any]]] = {}
        self.submit(inflight)
        no_cpu_since: Optional[float] = None
        while inflight:
            ready, _ = self.ray.wait(list(inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                self.answered(ref, inflight.pop(ref))
            self.submit(inflight)
            if ready:
                no_cpu_since = None
            elif self.ray.cluster_resources().get("CPU", 0) > 0:
                no_cpu_since = None
            else:
                now = time.monotonic()
                no_cpu_since = no_cpu_since if no_cpu_since is not None else now
                if now - no_cpu_since >= NO_CPU_SECONDS:
                    waiting = sum(len(b) for b in inflight.values()) + len(self.pending)
                    raise EngineError(
                        f"the cluster has had no CPU for {NO_CPU_SECONDS:.0f} s (every node "
                        f"that could run a cell is gone): {waiting + len(self.alone)} of "
                        f"{len(self.planned)} cells got no outcome; the others are in the "
                        "journal, and a re-run resumes from it"
                    )
        missing = self.planned - self.done
        if missing:
            raise EngineError(
                f"{len(missing)} of {len(self.planned)} cells got no outcome from the "
                f"cluster (the first: {sorted(missing)[0]})"
            )


def run_cells_on_ray(todo: str, workers: int, emit: Callable[[List[str]], None]) -> Dict[str, Any]:
    """Runs the cells (JSON, as ``SweepRun.todo`` gives them) on the
    connected cluster's ``workers`` CPUs; ``emit`` takes each batch of
    outcome lines (JSON, one per cell) as it comes, every cell's exactly
    once. Returns what it did (tasks, failed tasks, dropped duplicates, the
    cells' CPU seconds in the workers)."""
    ray = _import_ray()
    cells = json.loads(todo)
    driver = _Driver(ray, cells, _native.cell_keys(todo), workers, emit)
    driver.run()
    last_stats.clear()
    last_stats.update(driver.stats)
    return driver.stats


def run_ray(state: "_native.SweepRun", workers: int) -> None:
    """``hugelab.sweep(engine='ray')``: the cells ``state`` has left, run on
    the connected cluster, each outcome recorded (and journaled) as it
    comes."""

    def record(lines: List[str]) -> None:
        taken = state.record("[" + ",".join(lines) + "]")
        if taken != len(lines):
            raise EngineError(f"the sweep took {taken} of {len(lines)} new outcomes")

    run_cells_on_ray(state.todo(), workers, record)


def _die_with_parent() -> None:
    """The engine process ends with the ``hugelab sweep`` that started it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hugelab._ray_sweep",
        description="hugelab sweep --ray's engine: runs the cells read on stdin on a Ray "
        "cluster, answering each cell's outcome as a JSON line",
    )
    ap.add_argument("--address", default="auto", help="the cluster's HOST:PORT, or auto")
    args = ap.parse_args(argv)
    _die_with_parent()
    # The protocol has stdout to itself: anything else printed goes to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def say(doc: Dict[str, Any]) -> None:
        out.write(json.dumps(doc) + "\n")
        out.flush()

    def emit(lines: List[str]) -> None:
        out.write("".join(line + "\n" for line in lines))
        out.flush()

    try:
        with connect(args.address) as workers:
            say({"ready": {"workers": workers}})
            todo = sys.stdin.readline()
            if not todo.strip():
                return 1  # the CLI stopped before sending the cells
            stats = run_cells_on_ray(todo, workers, emit)
            say({"done": stats})
    except Error as e:
        say({"error": e.message})
        return 2
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    from hugelab._ray_sweep import main as _main  # the functions Ray ships by reference

    sys.exit(_main())
