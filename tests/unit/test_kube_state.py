"""Pure reading of live objects: drift, ownership, GPU capacity; and the replica decision."""

import copy
from pathlib import Path
from typing import Any

from kvscale.api.spec import ScalingMode, load_resource
from kvscale.api.status import LLMDeploymentStatus
from kvscale.catalog import find_gpu
from kvscale.controllers.desire import decide_replicas
from kvscale.kube.builders import Owner, build_deployment
from kvscale.kube.state import count_gpu_capacity, is_owned_by, is_subset, replica_counts, template_drifted
from kvscale.planner import build_plan_inputs, plan_deployment

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-3.1-70b-h100.yaml"
OWNER = Owner(name="llama-70b", namespace="team", uid="uid-1")


def _desired() -> dict[str, Any]:
    spec = load_resource(EXAMPLE).spec
    inputs = build_plan_inputs(spec)
    plan = plan_deployment(inputs)
    assert plan.chosen is not None
    return build_deployment(OWNER, spec, plan.chosen, 2, gpu=inputs.gpus[0],
                            native_precision=inputs.arch.native_precision)


def _as_served(desired: dict[str, Any]) -> dict[str, Any]:
    """What the apiserver returns: our fields plus defaults it fills in."""
    live = copy.deepcopy(desired)
    pod = live["spec"]["template"]["spec"]
    pod.update({"dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "default-scheduler"})
    container = pod["containers"][0]
    container.update({"imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"})
    limits = container["resources"]["limits"]
    container["resources"]["limits"] = {k: ("16000m" if v == "16" else v) for k, v in limits.items()}
    live["status"] = {"replicas": 2, "readyReplicas": 1}
    return live


def test_server_defaults_are_not_drift() -> None:
    desired = _desired()
    assert not template_drifted(desired, _as_served(desired))


def test_edited_flags_are_drift() -> None:
    desired = _desired()
    live = _as_served(desired)
    live["spec"]["template"]["spec"]["containers"][0]["args"][-1] = "edited"
    assert template_drifted(desired, live)


def test_quantities_compare_by_value() -> None:
    assert is_subset({"resources": {"cpu": "1"}}, {"resources": {"cpu": "1000m"}})
    assert not is_subset({"resources": {"cpu": "2"}}, {"resources": {"cpu": "1000m"}})
    assert not is_subset({"args": ["a", "b"]}, {"args": ["a"]})


def test_ownership_needs_the_controller_reference() -> None:
    desired = _desired()
    assert is_owned_by(desired, "uid-1")
    assert not is_owned_by(desired, "uid-2")
    assert not is_owned_by({"metadata": {}}, "uid-1")


def _node(name: str, label: str, gpus: str, ready: bool = True, unschedulable: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": label}},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": {"nvidia.com/gpu": gpus},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_gpu_capacity_counts_ready_schedulable_nodes_of_the_product() -> None:
    nodes = [
        _node("a", "NVIDIA-H100-80GB-HBM3", "8"),
        _node("b", "NVIDIA-H100-80GB-HBM3", "6"),
        _node("c", "NVIDIA-H100-80GB-HBM3", "8", ready=False),
        _node("d", "NVIDIA-H100-80GB-HBM3", "8", unschedulable=True),
        _node("e", "NVIDIA-L4", "8"),
    ]
    capacity = count_gpu_capacity(nodes, find_gpu("H100-SXM"), tensor_parallel=4)
    assert (capacity.nodes, capacity.gpus, capacity.replica_slots) == (2, 14, 3)  # 8//4 + 6//4


def test_replica_counts() -> None:
    assert replica_counts(None) == (0, 0)
    assert replica_counts({"status": {"replicas": 3, "readyReplicas": 2}}) == (3, 2)


def test_replicas_follow_the_plan_on_new_specs_and_the_scaler_in_between() -> None:
    spec = load_resource(EXAMPLE).spec
    plan = plan_deployment(build_plan_inputs(spec))
    assert plan.chosen is not None
    live = {"spec": {"replicas": 5}}
    assert decide_replicas(spec, plan.chosen, None, None, 1) == plan.chosen.replicas
    settled = LLMDeploymentStatus(observed_generation=1, desired_replicas=5)
    assert decide_replicas(spec, plan.chosen, live, settled, 1) == 5  # the scaling loop's count stays
    assert decide_replicas(spec, plan.chosen, live, settled, 2) == plan.chosen.replicas  # new spec: re-plan
    manual_scaling = spec.scaling.model_copy(update={"mode": ScalingMode.OFF})
    manual = spec.model_copy(update={"replicas": 7, "scaling": manual_scaling})
    assert decide_replicas(manual, plan.chosen, live, settled, 1) == 7
