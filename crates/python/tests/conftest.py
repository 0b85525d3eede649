"""Where the repository and the `hugelab` binary are, for the tests."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def cli() -> Path:
    """The `hugelab` binary cargo built (for the tests that hold the package
    to the CLI's output); skipped when it has not been built."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    binary = target / "debug" / "hugelab"
    if not binary.exists():
        pytest.skip(f"no hugelab binary at {binary}: cargo build first")
    return binary
