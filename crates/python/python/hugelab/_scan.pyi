"""Type hints of hugelab.scan: see the module's docstrings."""

import os
from typing import Any, Dict, Iterable, Optional, Union

import pandas as pd

from . import UtilizationReport

class ScanResult:
    json: Dict[str, Any]
    processes: pd.DataFrame
    sizes: pd.DataFrame
    histogram: pd.DataFrame
    give_back: pd.DataFrame
    shape: pd.DataFrame
    reports: Dict[int, UtilizationReport]
    exited_during_scan: int
    not_readable: int

def scan(
    pid: Union[int, Iterable[int], None] = None,
    cgroup: Union[str, os.PathLike[str], None] = None,
    all: bool = False,
    buckets: int = 10,
    max_ptes_none: Optional[int] = None,
) -> ScanResult: ...
