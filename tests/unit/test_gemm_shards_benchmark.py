"""The model's linear-layer term against GEMMs measured alone at the shapes of tensor-parallel shards
(benchmarks/gemm_shards.py, NVIDIA AIConfigurator's tables): the shard shapes, the grid reading, and a band
on model / measured that any change to the streaming term must stay within or revisit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from benchmarks_loader import load_benchmark

from kvscale.perfmodel import DEFAULT_EFFICIENCY

# Measured 2026-11-28: 0.95 to 1.15 (every shard of both GPUs); 0.58-1.16 before the
# fixed cost per GEMM and the A100's streaming scale. A term outside this band has left the measured GEMMs behind.
LOWEST_RATIO = 0.85
HIGHEST_RATIO = 1.25


def test_the_data_covers_two_gpus_the_decode_batches_and_the_shard_sizes() -> None:
    gemm = load_benchmark("gemm_shards")
    tables = gemm.load_tables()["tables"]
    assert {t["gpu"] for t in tables} == {"A100-SXM-80GB", "H100-SXM"}
    for table in tables:
        assert set(gemm.DECODE_SEQS) <= set(table["m"])
        assert table["n"][0] <= 512 and table["n"][-1] >= 65536 and table["k"] == table["n"]
        values = [v for plane in table["latency_us"] for row in plane for v in row if v is not None]
        assert len(values) >= len(table["m"]) * (len(table["n"]) ** 2 - 1) and min(values) > 0


def test_shards_split_columns_and_rows_by_the_tensor_parallel_degree() -> None:
    gemm = load_benchmark("gemm_shards")
    from kvscale.catalog import resolve_architecture

    arch = resolve_architecture("meta-llama/Llama-3.3-70B-Instruct")
    assert gemm.layer_gemms(arch, 1) == [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
    assert gemm.layer_gemms(arch, 8) == [(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584)]


def test_grid_reading_is_exact_on_the_grid_and_between_its_neighbours_off_it() -> None:
    gemm = load_benchmark("gemm_shards")
    table = gemm.load_tables()["tables"][0]
    mi, ni, ki = table["m"].index(32), table["n"].index(8192), table["k"].index(1024)
    on_grid = table["latency_us"][mi][ni][ki]
    assert gemm.measured_gemm_us(table, 32, 8192, 1024) == pytest.approx(on_grid)
    low, high = table["latency_us"][mi][ni][ki], table["latency_us"][mi][ni][ki + 1]  # k 1024 and 1536
    assert min(low, high) <= gemm.measured_gemm_us(table, 32, 8192, 1280) <= max(low, high)


def test_model_over_measured_stays_in_a_band_and_small_shards_stream_slower() -> None:
    gemm = load_benchmark("gemm_shards")
    medians = gemm.median_by_shard(gemm.compare(gemm.load_tables()))
    outside = {key: round(ratio, 2) for key, (_, ratio, _) in medians.items()
               if not LOWEST_RATIO <= ratio <= HIGHEST_RATIO}
    assert not outside, f"model / measured linear time outside [{LOWEST_RATIO}, {HIGHEST_RATIO}]: {outside}"
    for gpu, model in {(g, m) for g, m, _ in medians}:
        shares = [medians[(gpu, model, tp)][0] for tp in gemm.TENSOR_PARALLEL]
        assert shares == sorted(shares, reverse=True), (gpu, model, shares)


def test_a_fixed_cost_per_gemm_fits_the_grid_better_than_streaming_alone_and_the_model_carries_it() -> None:
    gemm = load_benchmark("gemm_shards")
    for table in gemm.load_tables()["tables"]:
        fitted = gemm.fit_streaming_form(table)
        assert 0.5 < fitted.hbm_share < 1.0 and 1.0 < fitted.fixed_us < 15.0, fitted
        share = gemm.model_streaming_share(table["gpu"])
        assert fitted.median_error < 0.5 * gemm.form_error(table, share, 0.0)
        # The model's own form (its share on this GPU, fitted end to end, and its fixed cost) is near the grid's
        # best and well ahead of streaming alone: 8.8% and 11.9% against 6.8% and 6.6% (2026-11-28).
        model_error = gemm.form_error(table, share, DEFAULT_EFFICIENCY.gemm_fixed_s * 1e6)
        assert model_error < fitted.median_error + 0.06, (table["gpu"], model_error, fitted)
        assert model_error < 0.7 * gemm.form_error(table, share, 0.0), (table["gpu"], model_error)
