"""Pure helpers for status conditions, and the mapping from a plan to the resource's status.

The clock is passed in (`now`), never read here. The planner's `Plan` is accepted by shape
(`PlanView`): `api` sits below `planner` in the layering and may not import it. The status of a
whole reconcile pass is built in `kvscale.controllers.desire`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol

from kvscale.api.status import (
    CONDITION_MESSAGE_MAX_CHARS,
    Condition,
    ConditionStatus,
    PlanStatus,
    PredictedStatus,
)


class ConditionType(StrEnum):
    """The condition types an LLMDeployment reports."""

    PLANNED = "Planned"
    READY = "Ready"
    INFEASIBLE = "Infeasible"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    INVALID_SPEC = "InvalidSpec"
    WRITE_FAILED = "WriteFailed"


class Reason(StrEnum):
    """Catalogue of condition reasons (CamelCase, as the API conventions ask)."""

    PLAN_FOUND = "PlanFound"
    NO_FEASIBLE_PLAN = "NoFeasiblePlan"
    TPOT_UNREACHABLE = "TpotUnreachable"
    TTFT_UNREACHABLE = "TtftUnreachable"
    INSUFFICIENT_MEMORY = "InsufficientMemory"
    MAX_REPLICAS_TOO_LOW = "MaxReplicasTooLow"
    LEADER_WORKER_SET_NOT_INSTALLED = "LeaderWorkerSetNotInstalled"
    MULTI_NODE_NOT_RUNNABLE = "MultiNodeNotRunnable"


# Plan.binding_constraint of an infeasible plan -> the Infeasible condition's reason.
_INFEASIBLE_REASONS = {
    "tpot": Reason.TPOT_UNREACHABLE,
    "ttft": Reason.TTFT_UNREACHABLE,
    "memory": Reason.INSUFFICIENT_MEMORY,
    "replicas": Reason.MAX_REPLICAS_TOO_LOW,
}


def format_time(now: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes metav1.Time."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def is_condition_true(conditions: Sequence[Condition], type_: str) -> bool:
    found = find_condition(conditions, type_)
    return found is not None and found.status == ConditionStatus.TRUE


def _clip(message: str) -> str:
    if len(message) <= CONDITION_MESSAGE_MAX_CHARS:
        return message
    return message[: CONDITION_MESSAGE_MAX_CHARS - 3] + "..."


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """A new list with `type_` set (appended when absent, replaced in place otherwise).

    lastTransitionTime moves to `now` only when the status flips; a new reason, message or
    generation alone keeps the time of the last transition.
    """
    previous = find_condition(conditions, type_)
    changed = previous is None or previous.status != status
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=_clip(message),
        last_transition_time=format_time(now) if changed or previous is None else previous.last_transition_time,
        observed_generation=generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type_ else c for c in conditions]


class PredictedView(Protocol):
    """The fields of `kvscale.planner.Predicted` the status uses."""

    @property
    def ttft_ms(self) -> float: ...
    @property
    def tpot_ms(self) -> float: ...
    @property
    def output_tokens_per_s(self) -> float: ...
    @property
    def output_tokens_per_s_per_gpu(self) -> float: ...


class ServingConfiguration(Protocol):
    """What the vLLM launch arguments of a configuration fix (a Candidate, or its copy in status)."""

    @property
    def gpu_type(self) -> str: ...
    @property
    def tensor_parallel(self) -> int: ...
    @property
    def pipeline_parallel(self) -> int: ...
    @property
    def data_parallel(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...


class CandidateView(ServingConfiguration, Protocol):
    """The fields of `kvscale.planner.Candidate` the status uses."""

    @property
    def gpu_memory_utilization(self) -> float: ...
    @property
    def replicas(self) -> int: ...
    @property
    def gpus(self) -> int: ...
    @property
    def cost_per_hour(self) -> float: ...
    @property
    def tokens_per_dollar(self) -> float: ...
    @property
    def predicted(self) -> PredictedView | None: ...


class PlanView(Protocol):
    """The fields of `kvscale.planner.Plan` the status uses."""

    @property
    def feasible(self) -> bool: ...
    @property
    def chosen(self) -> CandidateView | None: ...
    @property
    def binding_constraint(self) -> str: ...
    @property
    def explanation(self) -> str: ...


def build_plan_status(plan: PlanView) -> PlanStatus:
    chosen = plan.chosen
    if chosen is None:
        return PlanStatus(
            feasible=plan.feasible, binding_constraint=plan.binding_constraint, explanation=plan.explanation
        )
    return PlanStatus(
        feasible=plan.feasible,
        gpu_type=chosen.gpu_type,
        tensor_parallel=chosen.tensor_parallel,
        pipeline_parallel=chosen.pipeline_parallel,
        data_parallel=chosen.data_parallel,
        max_num_seqs=chosen.max_num_seqs,
        max_model_len=chosen.max_model_len,
        gpu_memory_utilization=chosen.gpu_memory_utilization,
        replicas=chosen.replicas,
        gpus=chosen.gpus,
        cost_per_hour=round(chosen.cost_per_hour, 4),
        tokens_per_dollar=round(chosen.tokens_per_dollar, 1),
        binding_constraint=plan.binding_constraint,
        explanation=plan.explanation,
    )


def build_predicted_status(plan: PlanView) -> PredictedStatus | None:
    predicted = plan.chosen.predicted if plan.chosen is not None else None
    if predicted is None:
        return None
    return PredictedStatus(
        ttft_ms=round(predicted.ttft_ms, 2),
        tpot_ms=round(predicted.tpot_ms, 3),
        output_tokens_per_s=round(predicted.output_tokens_per_s, 1),
        output_tokens_per_s_per_gpu=round(predicted.output_tokens_per_s_per_gpu, 1),
    )


def plan_conditions(
    plan: PlanView, conditions: Sequence[Condition], now: datetime, generation: int
) -> list[Condition]:
    """Planned and Infeasible for `plan` (its explanation is their message), set on `conditions`."""
    if plan.feasible and plan.chosen is not None:
        planned = set_condition(conditions, ConditionType.PLANNED, ConditionStatus.TRUE, Reason.PLAN_FOUND,
                                plan.explanation, now, generation)
        return set_condition(planned, ConditionType.INFEASIBLE, ConditionStatus.FALSE, Reason.PLAN_FOUND,
                             "A configuration meets both SLOs within maxReplicas.", now, generation)
    reason = _INFEASIBLE_REASONS.get(plan.binding_constraint, Reason.NO_FEASIBLE_PLAN)
    planned = set_condition(conditions, ConditionType.PLANNED, ConditionStatus.FALSE, Reason.NO_FEASIBLE_PLAN,
                            plan.explanation, now, generation)
    return set_condition(planned, ConditionType.INFEASIBLE, ConditionStatus.TRUE, reason,
                         plan.explanation, now, generation)
