"""End-to-end tests: the operator, serving pods simulated by llm-d-inference-sim (podsim.py), Prometheus
and trace-replayed load (loadgen.py), all on the real test bed (see tests/conftest.py for the fixtures).

Every test here is marked `bed`. When one fails, the tail of every bed log (apiserver, controllers,
scheduler, kwok, Prometheus and each simulator) is attached, by the same hook as tests/bed/conftest.py.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "bed"):  # podsim / loadgen / e2ekit, and tests/bed/operator_harness.py
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def _bed_log_tails() -> Callable[[], str]:
    """tests/bed/conftest.py's `_log_tails` (loaded under another name: every conftest is `conftest`)."""
    spec = importlib.util.spec_from_file_location("kvscale_bed_conftest", HERE.parent / "bed" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tails: Callable[[], str] = module._log_tails
    return tails


_log_tails = _bed_log_tails()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.bed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and HERE in Path(str(item.path)).resolve().parents:
        report.sections.append(("test bed logs", _log_tails()))
    return report


@pytest.fixture
def stack(kube: Any, prometheus: Any, namespace: str) -> Iterator[Any]:
    """The operator with live metrics, simulated serving pods and the conversation trace (e2ekit.Stack), in
    the test's namespace; a test module may define its own (another Prometheus URL, say)."""
    from e2ekit import serving_stack

    with serving_stack(kube, prometheus, namespace) as opened:
        yield opened
