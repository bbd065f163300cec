"""kube.cluster's discovery of the LeaderWorkerSet API: asked once per minute at most where it is absent."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from kvscale.kube import cluster as cluster_module
from kvscale.kube.cluster import API_ABSENT_RECHECK_S, Cluster


class _Resources:
    def __init__(self, served: bool) -> None:
        self.served, self.lookups, self.invalidations = served, 0, 0

    def get(self, **_: Any) -> object:
        self.lookups += 1
        if not self.served:
            raise ResourceNotFoundError("no leaderworkersets")
        return "lws-resource"

    def invalidate_cache(self) -> None:
        self.invalidations += 1


class _Dynamic:
    def __init__(self, resources: _Resources) -> None:
        self.resources = resources


def _cluster(resources: _Resources) -> Cluster:
    cluster = Cluster.__new__(Cluster)  # no API server: only the discovery path is exercised
    cluster._dynamic = _Dynamic(resources)  # type: ignore[assignment]
    cluster._leader_worker_sets = None
    cluster._leader_worker_sets_missing_at = None
    return cluster


def test_an_absent_api_is_looked_up_again_only_after_the_recheck_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(f"{cluster_module.__name__}.time.monotonic", lambda: clock[0])
    resources = _Resources(served=False)
    cluster = _cluster(resources)
    for _ in range(50):  # fifty reconcile passes within the minute: one discovery
        assert cluster.leader_worker_sets() is None
    assert (resources.lookups, resources.invalidations) == (1, 1)
    clock[0] += API_ABSENT_RECHECK_S + 1
    resources.served = True  # LWS installed meanwhile
    assert cluster.leader_worker_sets() == "lws-resource"
    assert cluster.leader_worker_sets() == "lws-resource" and resources.lookups == 2  # found: kept
