"""A deployment's replica start-up time, measured: the horizon its scale-ups must look ahead.

A new replica serves only once its pod is scheduled, its image pulled, its weights loaded and its
engine warmed up: minutes for vLLM, and different per model, image and node. The operator records
each pod's time from creation to its first Ready (status.startup) and the policy forecasts one
such start-up ahead, at a high percentile: a forecast that is Ready too late for a ramp is the
failure this exists to avoid.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

STARTUP_PERCENTILE = 90.0
STARTUP_SAMPLES_KEPT = 20  # the most recent start-ups: an image or model change moves the figure soon


def startup_percentile_s(durations_s: Sequence[float], default_s: float) -> float:
    """The STARTUP_PERCENTILE of the most recent start-ups, or `default_s` before any was measured."""
    recent = [d for d in durations_s[-STARTUP_SAMPLES_KEPT:] if d >= 0]
    if not recent:
        return default_s
    return float(np.percentile(np.asarray(recent, dtype=np.float64), STARTUP_PERCENTILE))


__all__ = ["STARTUP_PERCENTILE", "STARTUP_SAMPLES_KEPT", "startup_percentile_s"]
