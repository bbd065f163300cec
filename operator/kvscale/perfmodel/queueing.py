"""Queueing formulas (pure numpy): Erlang C for waiting on a batch slot, normal quantiles."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]


def erlang_c(servers: ArrayLike, offered_load: ArrayLike) -> Array:
    """Probability that an arrival waits in an M/M/c queue (c = servers, a = λ/μ); 1 when a >= c.

    Erlang B is the truncated-Poisson ratio a^c/c! / Σ_{k<=c} a^k/k!, summed in log space along a
    trailing axis so that whole arrays of (c, a) are evaluated in one vectorised pass.
    """
    c = np.rint(np.asarray(servers, dtype=np.float64))
    a = np.asarray(offered_load, dtype=np.float64)
    c, a = np.broadcast_arrays(c, a)
    k = np.arange(int(np.max(c, initial=1)) + 1, dtype=np.float64)
    log_factorial = np.concatenate(([0.0], np.cumsum(np.log(k[1:]))))
    log_a = np.log(np.maximum(a, 1e-300))[..., None]
    terms = k * log_a - log_factorial
    terms = np.where(k <= c[..., None], terms, -np.inf)
    top = terms.max(axis=-1, keepdims=True)
    log_sum = (top + np.log(np.exp(terms - top).sum(axis=-1, keepdims=True)))[..., 0]
    log_last = c * log_a[..., 0] - log_factorial[c.astype(np.int64)]
    blocking = np.exp(log_last - log_sum)
    rho = a / np.maximum(c, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = blocking / (1.0 - rho * (1.0 - blocking))
    return np.where(rho >= 1.0, 1.0, np.clip(wait, 0.0, 1.0))


def mmc_wait_quantile_s(servers: ArrayLike, arrival_rate: ArrayLike, service_s: ArrayLike,
                        quantile: float) -> Array:
    """The `quantile` of waiting time in M/M/c: P(W > t) = C·exp(-(cμ-λ)t); inf when unstable."""
    c = np.asarray(servers, dtype=np.float64)
    lam = np.asarray(arrival_rate, dtype=np.float64)
    service = np.asarray(service_s, dtype=np.float64)
    mu = 1.0 / service
    prob_wait = erlang_c(c, lam / mu)
    drain = c * mu - lam
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = np.log(prob_wait / (1.0 - quantile)) / drain
    wait = np.where(prob_wait <= 1.0 - quantile, 0.0, wait)
    return np.where(drain <= 0, np.inf, np.maximum(wait, 0.0))


def mmc_wait_mean_s(servers: ArrayLike, arrival_rate: ArrayLike, service_s: ArrayLike) -> Array:
    """Mean waiting time in M/M/c: C(c, a) / (cμ - λ); inf when unstable."""
    c = np.asarray(servers, dtype=np.float64)
    lam = np.asarray(arrival_rate, dtype=np.float64)
    mu = 1.0 / np.asarray(service_s, dtype=np.float64)
    drain = c * mu - lam
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = erlang_c(c, lam / mu) / drain
    return np.where(drain <= 0, np.inf, wait)


def mm1_wait_quantile_s(utilisation: ArrayLike, service_s: ArrayLike, quantile: float) -> Array:
    """The `quantile` of waiting time in M/M/1: P(W > t) = ρ·exp(-(1-ρ)t/S); inf when ρ >= 1."""
    rho = np.asarray(utilisation, dtype=np.float64)
    service = np.asarray(service_s, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = service * np.log(rho / (1.0 - quantile)) / (1.0 - rho)
    wait = np.where(rho <= 1.0 - quantile, 0.0, wait)
    return np.where(rho >= 1.0, np.inf, np.maximum(wait, 0.0))


def normal_quantile(quantile: float) -> float:
    """z such that P(Z <= z) = quantile for a standard normal (Acklam's rational approximation)."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    low = 0.02425
    if quantile < low:
        q = np.sqrt(-2 * np.log(quantile))
        return float((((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5])
                     / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1))
    if quantile > 1 - low:
        return -normal_quantile(1 - quantile)
    q = quantile - 0.5
    r = q * q
    return float((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q
                 / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1))
