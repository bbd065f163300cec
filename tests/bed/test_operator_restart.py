"""Restarting the operator writes nothing for unchanged resources (issue 4).

Its own module: the other operator tests share a cluster-wide operator for their whole module, and
a second operator reconciling the same objects would race this test's writes count.
"""

from __future__ import annotations

from functools import partial

import yaml
from bedkit import Kube, wait_until
from operator_harness import EXAMPLES, RunningOperator, apply, get, install_crd, running_operator, wait_condition


def test_restarting_the_operator_writes_nothing_for_unchanged_resources(kube: Kube, namespace: str) -> None:
    install_crd(kube)
    names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in EXAMPLES[:3]]

    def versions() -> dict[str, str]:
        found = {}
        for name in names:
            for kind in ("llmd", "deployment", "service"):
                obj = get(kube, kind, namespace, name)
                assert obj is not None
                found[f"{kind}/{name}"] = obj["metadata"]["resourceVersion"]
        return found

    with running_operator(kube, namespaces=(namespace,)) as first:
        for path in EXAMPLES[:3]:
            apply(kube, namespace, path.read_text())
        for name in names:
            wait_condition(kube, namespace, name, "Planned", "True")
            wait_until(partial(get, kube, "deployment", namespace, name), 60, "the Deployment")
        # Settled: pods scheduled and Ready, controllers idle (nothing changes between two polls)
        # and a full resync that writes nothing.
        seen: list[dict[str, str]] = []

        def settled() -> bool:
            seen.append(versions())
            return len(seen) >= 2 and seen[-1] == seen[-2] and _quiet_pass(first)

        wait_until(settled, 120, "the resources to settle", interval=3.0)

    before = versions()
    with running_operator(kube, namespaces=(namespace,)) as second:
        wait_until(lambda: second.state.reconciles >= 2 * len(names), 60, "two reconciles per resource")
        assert second.state.writes == 0
        assert second.state.failures == 0
    assert versions() == before


def _quiet_pass(operator: RunningOperator) -> bool:
    writes = operator.state.writes
    reconciles = operator.state.reconciles
    operator.state.resync()
    return operator.state.writes == writes and operator.state.reconciles > reconciles
