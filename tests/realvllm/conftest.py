"""`make test-vllm`: a real vLLM (PyPI's CPU build) serving one pod of an LLMDeployment on the test bed.

The bed fixtures come from tests/conftest.py; the pod machinery (podsim, e2ekit, loadgen) from
tests/e2e and the operator harness from tests/bed, put on the path here as tests/e2e/conftest.py does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "e2e", HERE.parent / "bed"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.bed)
