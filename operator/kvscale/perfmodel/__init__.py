"""The performance model: memory, roofline step times, communication, batching and queueing. Pure numpy."""

from kvscale.perfmodel.efficiency import DEFAULT_EFFICIENCY, EfficiencyFactors
from kvscale.perfmodel.memory import (
    compute_kv_capacity,
    compute_parameter_counts,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    weights_bytes_per_gpu,
)
from kvscale.perfmodel.prediction import Load, LoadKind, PointPrediction, fixed_batch_latency_s, predict_point
from kvscale.perfmodel.replica import PassTerms, ReplicaModel, ServingSetup, build_replica_model
from kvscale.perfmodel.serving import (
    Goodput,
    LoadEstimate,
    ObservedLoadEstimate,
    RequestShape,
    estimate_at_concurrency,
    estimate_at_observed_load,
    estimate_at_rate,
    estimate_goodput,
)

__all__ = [
    "DEFAULT_EFFICIENCY",
    "EfficiencyFactors",
    "Goodput",
    "Load",
    "LoadEstimate",
    "LoadKind",
    "ObservedLoadEstimate",
    "PassTerms",
    "PointPrediction",
    "ReplicaModel",
    "RequestShape",
    "ServingSetup",
    "build_replica_model",
    "compute_kv_capacity",
    "compute_parameter_counts",
    "estimate_at_concurrency",
    "estimate_at_observed_load",
    "estimate_at_rate",
    "estimate_goodput",
    "fixed_batch_latency_s",
    "kv_bytes_per_sequence",
    "kv_bytes_per_token",
    "predict_point",
    "weights_bytes_per_gpu",
]
