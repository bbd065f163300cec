"""Bed tests: every test here runs against the real test bed (see tests/conftest.py for fixtures).

All tests in this folder are marked `bed`. When one fails, the tail of every bed log
(.testbed/logs/*.log: apiserver, controllers, scheduler, kwok, Prometheus, simulators) is
attached to the report, because the cause is often in a component, not in the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

LOGS_DIR = Path(__file__).resolve().parents[2] / ".testbed" / "logs"
TAIL_LINES = 30


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.bed)


@pytest.fixture
def operator_in_namespace(kube: Any, namespace: str) -> Iterator[Any]:
    """The operator in-process, watching only the test's namespace (its counters are the test's own),
    resyncing every 2 s."""
    from operator_harness import install_crd, running_operator

    install_crd(kube)
    with running_operator(kube, scan_interval_s=2.0, namespaces=(namespace,)) as running:
        yield running


@pytest.fixture
def make_namespace(kube: Any) -> Iterator[Callable[[str], str]]:
    """Factory for extra fresh namespaces (watched / workload / other), deleted afterwards."""
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"helm-{prefix}-{uuid.uuid4().hex[:6]}"
        kube.kubectl("create", "namespace", name, check=True)
        made.append(name)
        return name

    yield make
    for name in made:
        kube.kubectl("delete", "namespace", name, "--wait=false")


def _log_tails() -> str:
    parts = []
    for log in sorted(LOGS_DIR.glob("*.log")):
        lines = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if '"msg":"Syncing lease"' not in line  # kwok's heartbeat, every 10 s per node
        ][-TAIL_LINES:]
        parts.append(f"===== last {len(lines)} lines of {log} =====\n" + "\n".join(lines))
    return "\n".join(parts) or f"(no logs in {LOGS_DIR})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and item.get_closest_marker("bed") is not None:
        report.sections.append(("test bed logs", _log_tails()))
    return report
