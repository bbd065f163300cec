"""Plan values: what the planner decided, what it rejected and why. Frozen, JSON-ready."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvscale.api.conditions import ServingConfiguration


@dataclass(frozen=True)
class Predicted:
    """Predicted behaviour at the planned load; latencies at the SLO percentile."""

    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float  # the whole fleet at the workload's rate
    output_tokens_per_s_per_gpu: float
    requests_per_second_per_replica: float
    decode_step_ms: float
    running_seqs_per_replica: float


def replica_layout(gpu_type: str, gpus_per_node: int, nodes: int) -> str:
    """One replica's GPUs: '8 x H100-SXM', or '2 nodes x 8 H100-SXM' when it spans nodes."""
    if nodes <= 1:
        return f"{gpus_per_node} x {gpu_type}"
    return f"{nodes} nodes x {gpus_per_node} {gpu_type}"


def serving_flags(config: ServingConfiguration) -> tuple[str, int, int, int, int, int]:
    """What a move between configurations changes: GPU type, TP, PP, DP, max-num-seqs, max-model-len."""
    return (config.gpu_type, config.tensor_parallel, config.pipeline_parallel, config.data_parallel,
            config.max_num_seqs, config.max_model_len)


@dataclass(frozen=True)
class Candidate:
    """One evaluated configuration (a GPU type, TP, PP and DP degrees and max-num-seqs).

    `max_num_seqs` is the engine flag: with data-parallel engines each has its own (the replica runs
    `ServingSetup.replica_max_num_seqs` of it); `kv_cache_tokens` is what the whole replica caches."""

    gpu_type: str
    tensor_parallel: int
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_tokens: int
    weights_bytes_per_gpu: float
    usd_per_gpu_hour: float
    goodput_requests_per_s: float  # per replica, both SLOs held
    goodput_output_tokens_per_s: float  # per replica
    binding: str  # what stops more load per replica: tpot, ttft, memory or throughput
    replicas: int
    gpus: int
    cost_per_hour: float
    tokens_per_dollar: float  # SLO-compliant output tokens per dollar at goodput
    predicted: Predicted | None
    rejection: str = ""  # why this candidate cannot serve; empty when it can
    pipeline_parallel: int = 1  # stages, one node each: a replica spans this many nodes
    inter_node_gbit_per_s: float = 0.0  # the network between a replica's nodes, per GPU (more than one node)
    # Data-parallel engines (MoE: attention data-parallel, experts parallel over all the replica's GPUs),
    # and the nodes they fill (1: all within one node).
    data_parallel: int = 1
    data_parallel_nodes: int = 1

    @property
    def feasible(self) -> bool:
        return not self.rejection

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    @property
    def nodes_per_replica(self) -> int:
        return self.pipeline_parallel * self.data_parallel_nodes

    @property
    def gpus_per_pod(self) -> int:
        """GPUs of one pod: one per node of the replica."""
        return self.gpus_per_replica // self.nodes_per_replica

    @property
    def multi_node(self) -> bool:
        return self.nodes_per_replica > 1

    @property
    def parallelism(self) -> str:
        """TP8, TP8 PP2 for a replica over two nodes, or TP1 DP16 EP16 with data-parallel engines."""
        pp = f" PP{self.pipeline_parallel}" if self.pipeline_parallel > 1 else ""
        dp = f" DP{self.data_parallel} EP{self.tensor_parallel * self.data_parallel}" if self.data_parallel > 1 else ""
        return f"TP{self.tensor_parallel}{pp}{dp}"

    @property
    def layout(self) -> str:
        """One replica's GPUs: '8 x H100-SXM', or '2 nodes x 8 H100-SXM' when it spans nodes."""
        return replica_layout(self.gpu_type, self.gpus_per_pod, self.nodes_per_replica)

    @property
    def label(self) -> str:
        return f"{self.gpu_type} {self.parallelism} max-num-seqs {self.max_num_seqs}"


@dataclass(frozen=True)
class CandidateCurve:
    """Throughput vs TPOT of one GPU type and TP (and PP) degree as concurrency grows (the goodput chart)."""

    gpu_type: str
    tensor_parallel: int
    concurrency: tuple[int, ...]
    tpot_ms: tuple[float, ...]
    output_tokens_per_s_per_gpu: tuple[float, ...]
    pipeline_parallel: int = 1
    data_parallel: int = 1


@dataclass(frozen=True)
class Plan:
    """The planner's answer. `chosen` is None when nothing meets the SLOs; `explanation` says why."""

    feasible: bool
    chosen: Candidate | None
    binding_constraint: str
    explanation: str
    model: str
    workload_requests_per_second: float
    ttft_slo_ms: float
    tpot_slo_ms: float
    percentile: float
    alternatives: tuple[Candidate, ...] = ()  # best feasible candidate of each GPU type, TP and PP, cheapest first
    rejected: tuple[Candidate, ...] = ()  # one per GPU type, TP and PP that cannot serve, with the reason
    curves: tuple[CandidateCurve, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON shape of `kvscale plan -o json` and of the resource's status.plan."""
        chosen = self.chosen
        body: dict[str, Any] = {
            "feasible": self.feasible,
            "model": self.model,
            "gpu_type": chosen.gpu_type if chosen else None,
            "tensor_parallel": chosen.tensor_parallel if chosen else None,
            "pipeline_parallel": chosen.pipeline_parallel if chosen else None,
            "data_parallel": chosen.data_parallel if chosen else None,
            "nodes_per_replica": chosen.nodes_per_replica if chosen else None,
            "max_num_seqs": chosen.max_num_seqs if chosen else None,
            "max_model_len": chosen.max_model_len if chosen else None,
            "gpu_memory_utilization": chosen.gpu_memory_utilization if chosen else None,
            "replicas": chosen.replicas if chosen else 0,
            "gpus": chosen.gpus if chosen else 0,
            "cost_per_hour": round(chosen.cost_per_hour, 4) if chosen else None,
            "tokens_per_dollar": round(chosen.tokens_per_dollar, 1) if chosen else None,
            "goodput_requests_per_s_per_replica": round(chosen.goodput_requests_per_s, 4) if chosen else None,
            "kv_cache_tokens": chosen.kv_cache_tokens if chosen else None,
            "binding_constraint": self.binding_constraint,
            "explanation": self.explanation,
            "predicted": _predicted_dict(chosen.predicted) if chosen and chosen.predicted else None,
            "alternatives": [_candidate_summary(c) for c in self.alternatives],
            "rejected": [{"gpu_type": c.gpu_type, "tensor_parallel": c.tensor_parallel,
                          "pipeline_parallel": c.pipeline_parallel, "data_parallel": c.data_parallel,
                          "reason": c.rejection}
                         for c in self.rejected],
        }
        return body


def _predicted_dict(predicted: Predicted) -> dict[str, float]:
    return {
        "ttft_ms": round(predicted.ttft_ms, 2),
        "tpot_ms": round(predicted.tpot_ms, 3),
        "output_tokens_per_s": round(predicted.output_tokens_per_s, 1),
        "output_tokens_per_s_per_gpu": round(predicted.output_tokens_per_s_per_gpu, 1),
        "requests_per_second_per_replica": round(predicted.requests_per_second_per_replica, 4),
        "decode_step_ms": round(predicted.decode_step_ms, 3),
        "running_seqs_per_replica": round(predicted.running_seqs_per_replica, 2),
    }


def _candidate_summary(candidate: Candidate) -> dict[str, Any]:
    return {
        "gpu_type": candidate.gpu_type,
        "tensor_parallel": candidate.tensor_parallel,
        "pipeline_parallel": candidate.pipeline_parallel,
        "data_parallel": candidate.data_parallel,
        "max_num_seqs": candidate.max_num_seqs,
        "replicas": candidate.replicas,
        "gpus": candidate.gpus,
        "cost_per_hour": round(candidate.cost_per_hour, 4),
        "tokens_per_dollar": round(candidate.tokens_per_dollar, 1),
        "binding": candidate.binding,
    }
