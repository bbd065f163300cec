"""SI units and the few conversions kvscale does at its edges (files, CLI, status).

Inside the core every quantity is SI (bytes, seconds, FLOP/s, bytes/s, USD/hour) and its name says so.
"""

from typing import Final

KIB: Final = 1024
MIB: Final = 1024**2
GIB: Final = 1024**3
GB: Final = 10**9
TB: Final = 10**12
TERA: Final = 1e12
MS_PER_S: Final = 1000.0
S_PER_HOUR: Final = 3600.0


def ms_to_s(value_ms: float) -> float:
    return value_ms / MS_PER_S


def s_to_ms(value_s: float) -> float:
    return value_s * MS_PER_S


def gib_to_bytes(value_gib: float) -> int:
    return round(value_gib * GIB)


def bytes_to_gib(value_bytes: float) -> float:
    return value_bytes / GIB


def tflops_to_flops_per_s(value_tflops: float) -> float:
    return value_tflops * TERA


def tb_per_s_to_bytes_per_s(value_tb_per_s: float) -> float:
    return value_tb_per_s * TB


def gb_per_s_to_bytes_per_s(value_gb_per_s: float) -> float:
    return value_gb_per_s * GB


def bytes_per_s_to_gb_per_s(value_bytes_per_s: float) -> float:
    return value_bytes_per_s / GB


def gbit_per_s_to_bytes_per_s(value_gbit_per_s: float) -> float:
    """Network links are sold in gigabits per second (400 Gb/s InfiniBand = 50 GB/s)."""
    return value_gbit_per_s * GB / 8.0


def bytes_per_s_to_gbit_per_s(value_bytes_per_s: float) -> float:
    return value_bytes_per_s * 8.0 / GB


def flops_per_s_to_tflops(value_flops_per_s: float) -> float:
    return value_flops_per_s / TERA
