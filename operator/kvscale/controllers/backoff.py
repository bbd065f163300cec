"""Back-off for refused writes (pure): the same write is not retried before its delay is out.

A write the API server refused is held for `BACKOFF_BASE_S`, doubling with every further refusal up
to `BACKOFF_MAX_S`. A *different* write of the same object (a new plan, a new replica count) is tried
at once: it may well succeed, and it is what the resource now wants. The delays suit an operator
whose level-triggered resync (default every 30 s) and watch events are what retry: back-off only
keeps those triggers from repeating a refused write on every one of them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvscale.controllers.world import WriteFailure, WriteKind

BACKOFF_BASE_S = 5.0
BACKOFF_MAX_S = 300.0


def fingerprint(body: Mapping[str, Any]) -> str:
    """Identifies a write by its content."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Refusal:
    failure: WriteFailure
    fingerprint: str
    attempts: int  # consecutive refusals of writes of this kind
    retry_at_s: float


@dataclass(frozen=True)
class Backoff:
    """The refused writes of one resource, by kind."""

    refusals: Mapping[WriteKind, Refusal] = field(default_factory=dict)

    def waiting(self, kind: WriteKind, body_fingerprint: str, now_s: float) -> WriteFailure | None:
        """The refusal this write still waits out, or None when it may be tried now."""
        refusal = self.refusals.get(kind)
        if refusal is None or refusal.fingerprint != body_fingerprint or now_s >= refusal.retry_at_s:
            return None
        return refusal.failure

    def record(self, kind: WriteKind, body_fingerprint: str, failure: WriteFailure | None, now_s: float) -> Backoff:
        """After a write was tried: a success clears its kind, a refusal doubles the delay."""
        refusals = dict(self.refusals)
        if failure is None:
            refusals.pop(kind, None)
            return Backoff(refusals)
        before = refusals.get(kind)
        attempts = before.attempts + 1 if before is not None else 1
        delay_s = min(BACKOFF_BASE_S * 2.0 ** (attempts - 1), BACKOFF_MAX_S)
        refusals[kind] = Refusal(failure, body_fingerprint, attempts, now_s + delay_s)
        return Backoff(refusals)

    def clear(self, kind: WriteKind) -> Backoff:
        return Backoff({k: v for k, v in self.refusals.items() if k != kind})

    def is_new(self, kind: WriteKind, failure: WriteFailure) -> bool:
        """Whether `failure` differs from the refusal already on record (what is logged and told once)."""
        before = self.refusals.get(kind)
        return before is None or before.failure.message != failure.message
