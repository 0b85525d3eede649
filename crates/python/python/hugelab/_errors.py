"""The exceptions of hugelab: each carries the one-sentence message the
``hugelab`` command prints, and for an error in a workload its place."""

from typing import Optional


class Error(Exception):
    """Any error hugelab reports.

    ``message`` is the sentence ``hugelab`` prints (``file:line:col: ...`` for
    an error at a place); ``file``, ``line`` and ``col`` say where, when the
    error has a place (``line`` and ``col`` are None for a whole-file error
    such as a file that cannot be read).
    """

    def __init__(
        self,
        message: str,
        file: Optional[str] = None,
        line: Optional[int] = None,
        col: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.col = col


class WorkloadError(Error):
    """The workload cannot be read, does not parse, does not make sense, or
    stops the model at a statement (``file:line:col: ...``)."""


class SettingError(Error):
    """A setting is refused: an unknown tunable, a bad value, a name used
    twice, a tunable the workload sets again after it started."""


class MachineError(Error):
    """A machine shape is refused: an unknown key or a bad value."""


class SweepError(Error):
    """Cells of a sweep failed (the workload stopped the model, or the
    worker process running the cell died); the others were kept.

    ``failed`` lists each failed cell (``workload``, ``setting``,
    ``machine``, ``error``); ``rows`` is the DataFrame of the cells that
    finished, as :func:`hugelab.sweep` would have returned it. The output,
    when given, holds those cells: a re-run runs the failed ones again.
    """

    def __init__(self, message: str, failed: list, rows: object) -> None:
        super().__init__(message)
        self.failed = failed
        self.rows = rows


class EngineError(Error):
    """A sweep's engine cannot run it: Ray is not installed (``pip install
    'hugelab[ray]'``), the cluster cannot be reached, or cells got no
    outcome from it. Nothing is written to the output; the cells finished
    before are in its journal, and a re-run resumes from them."""
