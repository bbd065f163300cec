"""The goodput chart: output tokens/s per GPU against TPOT for each candidate TP, with the SLO line."""

from __future__ import annotations

from pathlib import Path

from kvscale.errors import KvscaleError
from kvscale.planner import Plan


def draw_goodput_chart(plan: Plan, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpu_type = plan.chosen.gpu_type if plan.chosen else (plan.curves[0].gpu_type if plan.curves else None)
    curves = [c for c in plan.curves if c.gpu_type == gpu_type]
    fig, ax = plt.subplots(figsize=(8, 5))
    for curve in curves:
        ax.plot(curve.tpot_ms, curve.output_tokens_per_s_per_gpu, marker="o", markersize=3,
                label=f"TP{curve.tensor_parallel}")
        for x, y, c in zip(curve.tpot_ms, curve.output_tokens_per_s_per_gpu, curve.concurrency, strict=True):
            if c in (1, 16, 128, 512):
                ax.annotate(str(c), (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.axvline(plan.tpot_slo_ms, color="red", linestyle="--", label=f"TPOT SLO {plan.tpot_slo_ms:g} ms")
    if plan.chosen and plan.chosen.predicted:
        chosen = plan.chosen
        per_gpu = chosen.goodput_output_tokens_per_s / chosen.tensor_parallel
        ax.scatter([plan.chosen.predicted.tpot_ms], [per_gpu], s=120, facecolors="none", edgecolors="black",
                   zorder=5, label=f"chosen: TP{chosen.tensor_parallel}, max-num-seqs {chosen.max_num_seqs}")
    ax.set_xlabel("TPOT (ms, mean at concurrency; labels: concurrent requests)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(f"{plan.model} on {gpu_type}: goodput vs TPOT")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise KvscaleError(f"cannot write {path}: {exc}") from exc
    finally:
        plt.close(fig)
