"""Accelerator specifications. The data file uses datasheet units; this module converts to SI once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvscale import units


class GpuEntry(BaseModel):
    """One GPU as written in data/gpus.yaml (datasheet units, dense tensor throughput)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    aliases: list[str] = Field(default_factory=list)
    vendor: Literal["nvidia", "amd"]
    memory_gib: Annotated[float, Field(gt=0)]
    hbm_bandwidth_tb_per_s: Annotated[float, Field(gt=0)]
    bf16_dense_tflops: Annotated[float, Field(gt=0)]
    fp8_dense_tflops: Annotated[float | None, Field(gt=0)] = None
    int8_dense_tops: Annotated[float | None, Field(gt=0)] = None
    fp4_dense_tflops: Annotated[float | None, Field(gt=0)] = None
    interconnect: Literal["nvlink", "xgmi", "pcie"]
    interconnect_gb_per_s: Annotated[float, Field(gt=0, description="Per GPU, one direction.")]
    inter_node_gbit_per_s: Annotated[
        float, Field(gt=0, description="Network between nodes per GPU, one direction, gigabits/s.")]
    inter_node_source: str = ""
    product_label: Annotated[str, Field(description="Value of the node label nvidia.com/gpu.product (or AMD's).")]
    resource_name: str = "nvidia.com/gpu"
    max_gpus_per_node: Annotated[int, Field(ge=1)] = 8
    weight_streaming_scale: Annotated[float, Field(gt=0, le=1.5)] = 1.0
    usd_per_hour: Annotated[float, Field(gt=0)]
    source: str
    price_source: str = ""


@dataclass(frozen=True)
class GpuSpec:
    """A GPU in SI units, as the performance model uses it."""

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    fp8_flops_per_s: float | None
    int8_ops_per_s: float | None
    fp4_flops_per_s: float | None
    interconnect: str
    interconnect_bytes_per_s: float
    product_label: str
    resource_name: str
    max_gpus_per_node: int
    usd_per_hour: float
    inter_node_bytes_per_s: float = 0.0  # per GPU, one direction: what a pipeline stage boundary crosses
    # Achieved weight-streaming share of decode GEMMs relative to Hopper's (the fitted factor's reference).
    weight_streaming_scale: float = 1.0

    @property
    def inter_node_gbit_per_s(self) -> float:
        return units.bytes_per_s_to_gbit_per_s(self.inter_node_bytes_per_s)

    @classmethod
    def from_entry(cls, entry: GpuEntry) -> GpuSpec:
        def tera(value: float | None) -> float | None:
            return None if value is None else units.tflops_to_flops_per_s(value)

        return cls(
            name=entry.name,
            memory_bytes=units.gib_to_bytes(entry.memory_gib),
            hbm_bandwidth_bytes_per_s=units.tb_per_s_to_bytes_per_s(entry.hbm_bandwidth_tb_per_s),
            bf16_flops_per_s=units.tflops_to_flops_per_s(entry.bf16_dense_tflops),
            fp8_flops_per_s=tera(entry.fp8_dense_tflops),
            int8_ops_per_s=tera(entry.int8_dense_tops),
            fp4_flops_per_s=tera(entry.fp4_dense_tflops),
            interconnect=entry.interconnect,
            interconnect_bytes_per_s=units.gb_per_s_to_bytes_per_s(entry.interconnect_gb_per_s),
            product_label=entry.product_label,
            resource_name=entry.resource_name,
            max_gpus_per_node=entry.max_gpus_per_node,
            usd_per_hour=entry.usd_per_hour,
            inter_node_bytes_per_s=units.gbit_per_s_to_bytes_per_s(entry.inter_node_gbit_per_s),
            weight_streaming_scale=entry.weight_streaming_scale,
        )
