"""SLO-driven scaling: observations, calibration and the scaling policy. Pure: time is passed in."""

from kvscale.autoscaler.calibration import Calibration, CalibrationSample, calibrate
from kvscale.autoscaler.policy import (
    ReplicaContext,
    ScaleDecision,
    ScalingHistory,
    decide,
)
from kvscale.autoscaler.signals import Observation, ObservationProblem, check_observation

__all__ = [
    "Calibration",
    "CalibrationSample",
    "Observation",
    "ObservationProblem",
    "ReplicaContext",
    "ScaleDecision",
    "ScalingHistory",
    "calibrate",
    "check_observation",
    "decide",
]
