"""Type hints of hugelab: see the module's docstrings."""

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import pandas as pd

from ._errors import EngineError as EngineError
from ._errors import Error as Error
from ._errors import MachineError as MachineError
from ._errors import SettingError as SettingError
from ._errors import SweepError as SweepError
from ._errors import WorkloadError as WorkloadError
from ._scan import ScanResult as ScanResult
from ._scan import scan as scan

__version__: str

Workload = Union[str, os.PathLike[str]]
Setting = Mapping[str, Union[str, int]]
Machine = Mapping[str, Union[str, int]]

SERIES_SETTINGS: Dict[str, Dict[str, str]]

class RunResult:
    json: Dict[str, Any]
    workload: str
    backend: str
    snapshots: List[Dict[str, Any]]
    expectations: List[Dict[str, Any]]
    failed_calls: List[Dict[str, Any]]
    kills: List[Dict[str, Any]]
    overrides: List[Dict[str, Any]]
    not_inheriting: List[Dict[str, Any]]
    @property
    def passed(self) -> bool: ...
    def counters(self, snapshot: str = "end") -> Dict[str, int]: ...
    def to_pandas(self) -> pd.DataFrame: ...

class Comparison:
    json: Dict[str, Any]
    workload: str
    snapshot: str
    snapshots: List[str]
    baseline: str
    notes: List[str]
    settings: List[Dict[str, Any]]
    summary: pd.DataFrame
    table: pd.DataFrame

class Explanation:
    json: List[Dict[str, Any]]
    stopped: Optional[str]
    statements: pd.DataFrame
    outcomes: pd.DataFrame
    groups: pd.DataFrame
    collapses: pd.DataFrame

class UtilizationReport:
    json: Dict[str, Any]
    give_back: Dict[str, Any]
    settings: Dict[str, Any]
    histogram: pd.DataFrame
    sizes: pd.DataFrame
    bloat: pd.DataFrame
    processes: Dict[str, UtilizationReport]

def run(
    workload: Workload,
    settings: Optional[Setting] = None,
    machine: Optional[Machine] = None,
) -> RunResult: ...
def compare(
    workload: Workload,
    settings: Optional[Mapping[str, Setting]] = None,
    snapshot: Optional[str] = None,
    machine: Optional[Machine] = None,
) -> Comparison: ...
def explain(workload: Workload, line: Optional[int] = None) -> Explanation: ...
def utilization(
    workload: Workload,
    snapshot: Optional[str] = None,
    proc: Optional[str] = None,
    region: Optional[str] = None,
    buckets: int = 10,
    max_ptes_none: Optional[int] = None,
) -> UtilizationReport: ...
def counters() -> pd.DataFrame: ...
def sweep(
    workloads: Union[Workload, Sequence[Workload]],
    settings: Optional[Mapping[str, Setting]] = None,
    machines: Optional[Sequence[Machine]] = None,
    output: Optional[Union[str, os.PathLike[str]]] = None,
    jobs: Optional[int] = None,
    engine: str = "local",
    format: Optional[str] = None,
    address: Optional[str] = None,
    progress: Optional[bool] = None,
) -> pd.DataFrame: ...
