"""Efficiency factors: how far real kernels fall short of datasheet peaks. Calibration fits these."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EfficiencyFactors:
    """Multipliers on datasheet peaks plus fixed costs. The defaults are fitted to published
    measurements of NVIDIA GPUs with vLLM, TensorRT-LLM or NIM (benchmarks/fit_efficiency.py; what is
    fitted on what, and the cross-validated error, in docs/accuracy.md); the operator refits the speeds
    per deployment from live metrics."""

    hbm_bandwidth: float = 0.80  # achieved / peak HBM bandwidth for weight streaming, Hopper (fitted)
    compute: float = 0.60  # achieved / peak dense tensor throughput (prefill, large-batch decode) (fitted)
    interconnect: float = 0.70  # achieved / peak link bandwidth in all-reduce
    allreduce_latency_s: float = 12e-6  # fixed cost of one all-reduce call over NVLink/xGMI
    pcie_allreduce_latency_s: float = 30e-6  # the same over PCIe
    # Pipeline-parallel stage boundaries (not fitted: no published multi-node measurements are in the
    # accuracy set): the achieved share of the NIC's rate for one send/recv of hidden states, and the
    # fixed cost of a boundary (NCCL send/recv over InfiniBand or RoCE is about 10-30 us; vLLM adds the
    # tensor metadata it passes alongside), taken as 100 us.
    inter_node: float = 0.80  # (assumed)
    stage_transfer_latency_s: float = 100e-6  # (assumed)
    step_overhead_s: float = 1.5e-3  # scheduler, sampling, launch per engine step (fitted)
    # A GEMM's fixed cost beside streaming its weights (a kernel's ramp and tail, what makes a TP8 shard's
    # small matrices slower per byte): 5.6 us on an A100, 3.5 us on an H100 in AIConfigurator's vLLM bf16
    # GEMM tables (benchmarks/gemm_shards.py); their mean, not fitted to end-to-end figures.
    gemm_fixed_s: float = 4.5e-6
    # A fused MoE layer's fixed cost (aligning tokens to experts, the kernel's launch, ramp and tail, the
    # weighted sum), beside streaming the touched experts: 42 us fitted on vLLM 0.24's bf16 fused-MoE
    # tables for H100 and H200 in AIConfigurator, on shapes outside the catalog, streaming at the GEMM
    # tables' Hopper share (benchmarks/moe_kernels.py); not fitted end to end.
    moe_call_fixed_s: float = 42e-6
    # Expert GEMMs slice each expert's FFN width by TP; narrow slices fill the tensor cores' tiles poorly.
    # Their compute rate is the dense one times 1 / (1 + (half / columns) ** exponent), columns = the
    # expert's FFN width per GPU: half the dense rate at 308 columns (the same tables and fit).
    expert_width_half_columns: float = 308.0
    expert_width_exponent: float = 1.14
    attention_bandwidth: float = 0.90  # achieved / peak HBM bandwidth when reading the KV cache (fitted)
    # Per request, outside the engine's steps: HTTP, tokenization, the hand-off to the engine core
    # and the first token's way back; it adds to every TTFT (a share per model layer for the
    # prefill's CPU-side dispatch, as in measured-kernel planners).
    request_overhead_s: float = 20e-3  # (fitted)
    prefill_overhead_s_per_layer: float = 0.0  # (fitted: 0 on the published data)

    def expert_compute_share(self, columns_per_gpu: float) -> float:
        """The share of the dense compute rate that routed-expert GEMMs of this width per GPU reach."""
        if columns_per_gpu <= 0:
            return 1.0
        return float(1.0 / (1.0 + (self.expert_width_half_columns / columns_per_gpu) ** self.expert_width_exponent))

    def ttft_overhead_s(self, num_layers: int) -> float:
        return self.request_overhead_s + self.prefill_overhead_s_per_layer * num_layers

    def scaled(self, *, decode: float = 1.0, prefill: float = 1.0) -> EfficiencyFactors:
        """Factors with memory-bound work `decode` times faster and compute-bound work `prefill` times faster."""
        return replace(
            self,
            hbm_bandwidth=self.hbm_bandwidth * decode,
            attention_bandwidth=self.attention_bandwidth * decode,
            compute=self.compute * prefill,
        )


DEFAULT_EFFICIENCY = EfficiencyFactors()
