"""Pure builders of the serving Deployment and Service (plain dicts, no kube client)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvscale.api.spec import Engine, LLMDeploymentSpec, Precision, load_resource
from kvscale.catalog import GpuSpec, find_gpu
from kvscale.errors import InvalidSpecError
from kvscale.kube import (
    DEFAULT_IMAGES,
    SPEC_HASH_ANNOTATION,
    Owner,
    build_deployment,
    build_service,
    selector_string,
)
from kvscale.planner import Candidate, build_plan_inputs, plan_deployment

ROOT = Path(__file__).resolve().parents[2]
OWNER = Owner(name="llama-70b", namespace="serving", uid="0b5e1a4c-7c55-4c1e-9d0e-1f6f3c2a9b10")


@pytest.fixture(scope="module")
def spec() -> LLMDeploymentSpec:
    return load_resource(ROOT / "examples" / "llama-3.1-70b-h100.yaml").spec


@pytest.fixture(scope="module")
def chosen(spec: LLMDeploymentSpec) -> Candidate:
    plan = plan_deployment(build_plan_inputs(spec))
    assert plan.chosen is not None
    return plan.chosen


@pytest.fixture(scope="module")
def h100() -> GpuSpec:
    return find_gpu("H100-SXM")


def with_changes(spec: LLMDeploymentSpec, **sections: dict[str, Any]) -> LLMDeploymentSpec:
    """The spec with some sections' fields replaced (camelCase keys, as in a resource)."""
    document = spec.model_dump(by_alias=True, exclude_none=True)
    for section, fields in sections.items():
        document[section] = {**document.get(section, {}), **fields}
    return LLMDeploymentSpec.model_validate(document)


def deploy(spec: LLMDeploymentSpec, chosen: Candidate, gpu: GpuSpec, replicas: int = 2,
           native: Precision = Precision.BF16) -> dict[str, Any]:
    return build_deployment(OWNER, spec, chosen, replicas, gpu=gpu, native_precision=native)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    return only  # type: ignore[no-any-return]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def spec_hash(deployment: dict[str, Any]) -> str:
    return deployment["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION]  # type: ignore[no-any-return]


def test_vllm_flags_for_the_70b_plan(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    c = container(deploy(spec, chosen, h100))
    assert c["image"] == "vllm/vllm-openai:v0.11.0" == DEFAULT_IMAGES[Engine.VLLM]
    assert c["command"] == ["vllm", "serve"]
    args = c["args"]
    assert flag(args, "--model") == flag(args, "--served-model-name") == "meta-llama/Llama-3.1-70B-Instruct"
    assert flag(args, "--tensor-parallel-size") == str(chosen.tensor_parallel)
    assert flag(args, "--max-num-seqs") == str(chosen.max_num_seqs)
    assert flag(args, "--max-model-len") == str(chosen.max_model_len) == "16384"
    assert flag(args, "--gpu-memory-utilization") == "0.9"
    assert flag(args, "--port") == "8000"
    assert "--kv-cache-dtype" not in args and "--quantization" not in args and "--dtype" not in args
    assert args[-2:] == ["--port", "8000"]


def test_gpu_requests_equal_tensor_parallel(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    resources = container(deploy(spec, chosen, h100))["resources"]
    tp = str(chosen.tensor_parallel)
    assert resources == {"requests": {"nvidia.com/gpu": tp}, "limits": {"nvidia.com/gpu": tp}}


def test_node_selector_and_default_toleration(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    pod = deploy(spec, chosen, h100)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_amd_gpus_use_their_resource_and_label(spec: LLMDeploymentSpec, chosen: Candidate) -> None:
    mi300x = find_gpu("MI300X")
    pod = deploy(spec, replace(chosen, gpu_type=mi300x.name), mi300x)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"amd.com/gpu": str(chosen.tensor_parallel)}
    assert pod["nodeSelector"] == {"amd.com/gpu.product-name": mi300x.product_label}
    assert pod["tolerations"][-1]["key"] == "amd.com/gpu"


def test_owner_references_and_labels(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    deployment = deploy(spec, chosen, h100)
    service = build_service(OWNER, spec)
    expected_owner = {
        "apiVersion": "kvscale.dev/v1alpha1",
        "kind": "LLMDeployment",
        "name": "llama-70b",
        "uid": OWNER.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    labels = {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": "llama-70b",
        "app.kubernetes.io/managed-by": "kvscale",
        "kvscale.dev/llmdeployment": "llama-70b",
    }
    for obj in (deployment, service):
        assert obj["metadata"]["ownerReferences"] == [expected_owner]
        assert obj["metadata"]["labels"] == labels
        assert (obj["metadata"]["name"], obj["metadata"]["namespace"]) == ("llama-70b", "serving")
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"] == labels
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == service["spec"]["selector"] == {"kvscale.dev/llmdeployment": "llama-70b"}
    assert selector.items() <= template["metadata"]["labels"].items()
    assert selector_string(OWNER) == "kvscale.dev/llmdeployment=llama-70b"


def test_deployment_shape(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    deployment = deploy(spec, chosen, h100, replicas=3)
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert len(annotations[SPEC_HASH_ANNOTATION]) == 64


def test_shared_memory_volume(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    pod = deploy(spec, chosen, h100)["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]


def test_probes_allow_for_model_loading(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    c = container(deploy(spec, chosen, h100))
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60  # weights take minutes
    liveness = c["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    assert c["readinessProbe"]["failureThreshold"] <= liveness["failureThreshold"]


def test_service(spec: LLMDeploymentSpec) -> None:
    service = build_service(OWNER, spec)
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


def test_sglang_variant(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    sglang = with_changes(spec, serving={"engine": "sglang"}, model={"kvCacheDtype": "fp8"})
    deployment = deploy(sglang, chosen, h100)
    c = container(deployment)
    assert c["name"] == "sglang"
    assert c["image"] == "lmsysorg/sglang:v0.5.4"
    assert c["command"] == ["python3", "-m", "sglang.launch_server"]
    args = c["args"]
    assert flag(args, "--model-path") == "meta-llama/Llama-3.1-70B-Instruct"
    assert flag(args, "--tp-size") == str(chosen.tensor_parallel)
    assert flag(args, "--max-running-requests") == str(chosen.max_num_seqs)
    assert flag(args, "--context-length") == str(chosen.max_model_len)
    assert flag(args, "--mem-fraction-static") == "0.9"
    assert flag(args, "--kv-cache-dtype") == "fp8_e4m3"
    assert (flag(args, "--port"), flag(args, "--host")) == ("8000", "0.0.0.0")
    assert "--enable-metrics" in args  # SGLang's /metrics is off by default
    assert deployment["metadata"]["labels"]["app.kubernetes.io/name"] == "sglang"
    assert deployment["spec"]["selector"]["matchLabels"] == {"kvscale.dev/llmdeployment": "llama-70b"}


def test_fp8_kv_cache_and_on_load_quantization(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    fp8 = with_changes(spec, model={"precision": "fp8", "kvCacheDtype": "fp8"})
    args = container(deploy(fp8, chosen, h100, native=Precision.BF16))["args"]
    assert flag(args, "--kv-cache-dtype") == "fp8"
    assert flag(args, "--quantization") == "fp8"
    # An fp8 checkpoint is detected by the engine: no --quantization.
    native_fp8 = container(deploy(fp8, chosen, h100, native=Precision.FP8))["args"]
    assert "--quantization" not in native_fp8
    assert flag(native_fp8, "--kv-cache-dtype") == "fp8"


def test_precision_follows_the_checkpoint_when_unset(spec: LLMDeploymentSpec, chosen: Candidate,
                                                      h100: GpuSpec) -> None:
    unset = LLMDeploymentSpec.model_validate(
        {**spec.model_dump(by_alias=True, exclude_none=True),
         "model": {"name": spec.model.name}}
    )
    assert unset.model.precision is None
    args = container(deploy(unset, chosen, h100, native=Precision.FP8))["args"]
    assert "--quantization" not in args and "--dtype" not in args


def test_sixteen_bit_cast_and_impossible_precisions(spec: LLMDeploymentSpec, chosen: Candidate,
                                                    h100: GpuSpec) -> None:
    fp16 = with_changes(spec, model={"precision": "fp16"})
    assert flag(container(deploy(fp16, chosen, h100))["args"], "--dtype") == "float16"
    int4 = with_changes(spec, model={"precision": "int4"})
    with pytest.raises(InvalidSpecError, match="int4 needs a checkpoint already quantized"):
        deploy(int4, chosen, h100, native=Precision.BF16)


def test_extra_args_come_last(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    extra = ["--enable-prefix-caching", "--max-num-batched-tokens", "16384"]
    for engine in ("vllm", "sglang"):
        changed = with_changes(spec, serving={"engine": engine, "extraArgs": extra})
        assert container(deploy(changed, chosen, h100))["args"][-3:] == extra


def test_image_override(spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec) -> None:
    custom = with_changes(spec, serving={"image": "registry.local/vllm:patched"})
    assert container(deploy(custom, chosen, h100))["image"] == "registry.local/vllm:patched"


@pytest.mark.parametrize("image", [
    "vllm/vllm-openai:v0.17.0",
    "vllm/vllm-openai:0.17.1.post1",
    "vllm/vllm-openai:v0.20.0-cu129",  # a build variant of a release
    "vllm/vllm-openai-cpu:v0.32.0",
    "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0",
])
def test_vllm_releases_that_export_the_mfu_counters_get_the_flag(spec: LLMDeploymentSpec, chosen: Candidate,
                                                                   h100: GpuSpec, image: str) -> None:
    args = container(deploy(with_changes(spec, serving={"image": image}), chosen, h100))["args"]
    assert "--enable-mfu-metrics" in args
    assert args[-2:] == ["--port", "8000"]


@pytest.mark.parametrize("image", [
    "vllm/vllm-openai:v0.16.0",  # accepts the flag but only logs: the counters came in 0.17.0
    "vllm/vllm-openai:v0.11.0",
    "vllm/vllm-openai:latest",
    "vllm/vllm-openai:nightly",
    "vllm/vllm-openai:v0.17.0rc1",
    "vllm/vllm-openai",
    "vllm/vllm-openai@sha256:" + "0" * 64,
    "vllm/vllm-openai:v0.17.0@sha256:" + "0" * 64,
    "registry.local:5000/vllm",
    "registry.local/vllm:patched",
    "ghcr.io/llm-d/llm-d-inference-sim:v0.20.0",  # not vLLM: its own versions, and it rejects unknown flags
    "mycorp/llm-server:0.20.0",
])
def test_images_not_known_to_export_the_mfu_counters_do_not_get_the_flag(
        spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec, image: str) -> None:
    # vLLM rejects flags it does not know: the pod would crash-loop. extraArgs can add it.
    assert "--enable-mfu-metrics" not in container(deploy(with_changes(spec, serving={"image": image}), chosen,
                                                          h100))["args"]


def test_the_default_images_and_sglang_get_no_mfu_flag(spec: LLMDeploymentSpec, chosen: Candidate,
                                                       h100: GpuSpec) -> None:
    # The pinned default (vllm-openai v0.11.0) predates the counters: its pods, and their spec hash, are
    # as before.
    assert "--enable-mfu-metrics" not in container(deploy(spec, chosen, h100))["args"]
    sglang = with_changes(spec, serving={"engine": "sglang", "image": "vllm/vllm-openai:v0.20.0"})
    assert "--enable-mfu-metrics" not in container(deploy(sglang, chosen, h100))["args"]


def test_extra_args_can_turn_the_mfu_counters_off(spec: LLMDeploymentSpec, chosen: Candidate,
                                                  h100: GpuSpec) -> None:
    changed = with_changes(spec, serving={"image": "vllm/vllm-openai:v0.20.0",
                                          "extraArgs": ["--no-enable-mfu-metrics"]})
    args = container(deploy(changed, chosen, h100))["args"]
    assert args.index("--enable-mfu-metrics") < args.index("--no-enable-mfu-metrics") == len(args) - 1


def test_user_resources_node_selector_tolerations_and_env_are_merged(
    spec: LLMDeploymentSpec, chosen: Candidate, h100: GpuSpec
) -> None:
    changed = with_changes(
        spec,
        serving={
            "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
                          "limits": {"memory": "96Gi"}},
            "nodeSelector": {"pool": "inference", "nvidia.com/gpu.product": "NVIDIA-L4"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
        },
    )
    pod = deploy(changed, chosen, h100)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    tp = str(chosen.tensor_parallel)
    assert c["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": tp},  # the plan's GPU count wins
        "limits": {"memory": "96Gi", "nvidia.com/gpu": tp},
    }
    assert pod["nodeSelector"] == {"pool": "inference", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [  # the GPU toleration is not duplicated
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert c["env"] == [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
    assert "HF_HUB_OFFLINE" not in {e["name"] for e in c["env"]}


def test_spec_hash_changes_with_the_template_only(spec: LLMDeploymentSpec, chosen: Candidate,
                                                   h100: GpuSpec) -> None:
    base = spec_hash(deploy(spec, chosen, h100, replicas=2))
    assert spec_hash(deploy(spec, chosen, h100, replicas=2)) == base  # deterministic
    assert spec_hash(deploy(spec, chosen, h100, replicas=7)) == base  # scaling is not a change
    # Scaling fields and SLOs do not reach the pods.
    unrelated = with_changes(spec, scaling={"maxReplicas": 11}, slo={"ttftMs": 900})
    assert spec_hash(deploy(unrelated, chosen, h100)) == base
    changed = [
        deploy(spec, replace(chosen, max_num_seqs=chosen.max_num_seqs * 2), h100),
        deploy(spec, replace(chosen, tensor_parallel=4 if chosen.tensor_parallel == 8 else 8), h100),
        deploy(with_changes(spec, serving={"extraArgs": ["--enable-prefix-caching"]}), chosen, h100),
        deploy(with_changes(spec, serving={"env": [{"name": "A", "value": "1"}]}), chosen, h100),
        deploy(with_changes(spec, serving={"image": "vllm/vllm-openai:v0.11.1"}), chosen, h100),
        deploy(with_changes(spec, serving={"image": "vllm/vllm-openai:v0.17.0"}), chosen, h100),  # + the flag
        deploy(with_changes(spec, serving={"resources": {"limits": {"memory": "1Ti"}}}), chosen, h100),
    ]
    hashes = [spec_hash(d) for d in changed]
    assert base not in hashes and len(set(hashes)) == len(hashes)


def test_builders_do_not_import_the_kubernetes_client() -> None:
    import kvscale.kube.builders as builders
    import kvscale.kube.engines as engines

    for module in (builders, engines):
        source = Path(module.__file__ or "").read_text()
        assert "import kubernetes" not in source and "from kubernetes" not in source
