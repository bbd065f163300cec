"""Queueing formulas against textbook values."""

import math

import numpy as np
import pytest

from kvscale.perfmodel.queueing import erlang_c, mm1_wait_quantile_s, mmc_wait_quantile_s, normal_quantile


def test_erlang_c_textbook_values() -> None:
    values = erlang_c([1, 2, 10], [0.5, 1.0, 8.0])
    assert values == pytest.approx([0.5, 1 / 3, 0.40918], rel=1e-4)


def test_erlang_c_saturates_at_one() -> None:
    assert float(erlang_c(4, 4.0)) == 1.0
    assert float(erlang_c(4, 9.0)) == 1.0


def test_erlang_c_large_server_counts_are_finite() -> None:
    value = float(erlang_c(1024, 1000.0))
    assert 0.0 < value < 1.0


def test_mm1_quantile_closed_form() -> None:
    # P(W > t) = rho exp(-(1-rho) t / S): the 95th percentile at rho 0.8, S 1 s.
    expected = math.log(0.8 / 0.05) / 0.2
    assert float(mm1_wait_quantile_s(0.8, 1.0, 0.95)) == pytest.approx(expected)
    assert float(mm1_wait_quantile_s(0.01, 1.0, 0.95)) == 0.0
    assert np.isinf(mm1_wait_quantile_s(1.0, 1.0, 0.95))


def test_mmc_with_one_server_matches_mm1() -> None:
    # For c = 1 the M/M/c waiting-time tail is the M/M/1 one.
    assert float(mmc_wait_quantile_s(1, 0.8, 1.0, 0.95)) == pytest.approx(float(mm1_wait_quantile_s(0.8, 1.0, 0.95)))


def test_normal_quantile() -> None:
    assert normal_quantile(0.5) == pytest.approx(0.0, abs=1e-9)
    assert normal_quantile(0.95) == pytest.approx(1.644854, rel=1e-5)
    assert normal_quantile(0.01) == pytest.approx(-2.326348, rel=1e-5)
