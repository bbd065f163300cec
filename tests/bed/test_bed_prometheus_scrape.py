"""Issue 3 proof (3): Prometheus scrapes a real llm-d-inference-sim process (vLLM-named metrics)
through file-based service discovery, and PromQL sees the requests we sent."""

from __future__ import annotations

import uuid

import pytest
from bedkit import InferenceSim, Prometheus, SimFactory

pytestmark = pytest.mark.bed

MODEL = "kvscale/scrape-test"
REQUESTS = 3


def test_prometheus_scrapes_inference_sim(prometheus: Prometheus, inference_sim: SimFactory) -> None:
    sim: InferenceSim = inference_sim(model=MODEL, max_num_seqs=4, ttft_ms=5, itl_ms=1)
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    labels = {"kvscale_pool": pool, "kvscale_accelerator": "NVIDIA-H100-80GB-HBM3"}

    for i in range(REQUESTS):
        response = sim.completion(prompt=f"request {i} from the kvscale test bed", max_tokens=6)
        assert response["model"] == MODEL
        assert response["choices"], response
    assert "vllm:request_success_total" in sim.metrics_text()

    prometheus.add_target(f"sim-{pool}", sim.host_port, labels)
    try:
        target = prometheus.wait_for_target_up(sim.host_port, timeout=30)
        assert target["labels"]["kvscale_pool"] == pool
        assert target["scrapeUrl"] == f"{sim.url}/metrics"

        selector = f'{{kvscale_pool="{pool}"}}'
        success = prometheus.wait_for_query(
            f"sum by (model_name, kvscale_pool, kvscale_accelerator, instance) (vllm:request_success_total{selector})",
            lambda r: bool(r) and float(r[0]["value"][1]) >= REQUESTS,
            timeout=30,
        )
        (series,) = success
        assert series["metric"] == {
            "model_name": MODEL,
            "kvscale_pool": pool,
            "kvscale_accelerator": "NVIDIA-H100-80GB-HBM3",
            "instance": sim.host_port,
        }
        assert float(series["value"][1]) == REQUESTS

        tokens = prometheus.wait_for_query(f"vllm:generation_tokens_total{selector}", timeout=30)
        (gen,) = tokens
        assert gen["metric"]["model_name"] == MODEL
        assert gen["metric"]["job"] == "testbed"
        assert float(gen["value"][1]) > 0
    finally:
        prometheus.remove_target(f"sim-{pool}")
        sim.stop()
