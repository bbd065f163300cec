"""The bed's simulator reports TTFT as vLLM v1 does: from the request's arrival, queue wait included.

llm-d-inference-sim v0.10.2 reported only its simulated prefill delay, so on the bed a request that
waited for a max-num-seqs slot looked fast in Prometheus while its client waited seconds (quirk 10 in
docs/testing.md), and kvscale's TTFT breach correction never saw queueing. tests/testbed/build.sh
patches it (llm-d-inference-sim-ttft-from-arrival.patch); this test fails on an unpatched build.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from bedkit import SimFactory, wait_until
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.bed

PREFILL_MS = 400
REQUESTS = 3


def _histogram_sum_count(text: str, name: str) -> tuple[float, float]:
    total, count = 0.0, 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    return total, count


def test_ttft_counts_the_wait_for_a_slot(inference_sim: SimFactory) -> None:
    # One slot, three requests at once: they are served one after another, so their TTFTs from arrival
    # are about 1, 2 and 3 prefill delays (sum ~6 delays), where the delays alone sum to 3.
    sim = inference_sim(model="kvscale/ttft-test", max_num_seqs=1, ttft_ms=PREFILL_MS, itl_ms=1)
    with ThreadPoolExecutor(REQUESTS) as pool:
        for response in pool.map(lambda i: sim.completion(prompt=f"queued {i}", max_tokens=2), range(REQUESTS)):
            assert response["choices"], response

    def reported() -> tuple[float, float] | None:
        ttft = _histogram_sum_count(sim.metrics_text(), "vllm:time_to_first_token_seconds")
        return ttft if ttft[1] >= REQUESTS else None

    ttft_sum_s, ttft_count = wait_until(reported, timeout=15, what="three TTFT observations")
    queue_sum_s, _ = _histogram_sum_count(sim.metrics_text(), "vllm:request_queue_time_seconds")
    delays_s = REQUESTS * PREFILL_MS / 1000
    assert ttft_count == REQUESTS
    assert queue_sum_s > 0.5 * delays_s, f"the requests did not queue: queue time {queue_sum_s:.2f} s"
    # From arrival: the delays plus the queue wait (~6 delays in all); the delays alone would be 3.
    assert ttft_sum_s >= delays_s + 0.8 * queue_sum_s, (
        f"TTFT sum {ttft_sum_s:.2f} s is the prefill delays ({delays_s:.2f} s) without the queue wait "
        f"({queue_sum_s:.2f} s): the simulator is not built with the TTFT-from-arrival patch")
