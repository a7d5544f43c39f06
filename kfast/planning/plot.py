"""The plan picture: scaling efficiency and throughput against ranks, ring-allreduce beside a parameter server.

Drawn on a `matplotlib.figure.Figure` with its own Agg canvas (no pyplot), so a notebook's backend is
left alone.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kfast.planning.planner import Plan

_RING, _OVERLAP, _SERVER, _MEASURED = "#4C72B0", "#8FAADC", "#C44E1A", "#2E6B30"


def draw(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Writes `plan` as a PNG to `path` (see `Plan.plot`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = plan.rows
    n = [r["ranks"] for r in rows]
    fig = Figure(figsize=(11, 4.6), dpi=100)
    FigureCanvasAgg(fig)
    eff, thr = fig.subplots(1, 2)
    eff.plot(n, [r["efficiency"] for r in rows], "o-", color=_RING, label="ring-allreduce (kfast)")
    eff.plot(n, [r["efficiency_overlap"] for r in rows], "--", color=_OVERLAP,
             label="ring, exchange overlapped with backward")
    eff.plot(n, [r["server_efficiency"] for r in rows], "s-", color=_SERVER,
             label=f"parameter server ({plan.servers} shard{'s' if plan.servers > 1 else ''})")
    eff.axhline(plan.threshold, color="#999999", lw=0.8, ls=":")
    eff.set_ylim(0, 1.05)
    eff.set_ylabel("scaling efficiency  (throughput / (N x one rank))")
    single = plan.batch_size / plan.compute_s
    thr.plot(n, [k * single for k in n], ":", color="#999999", label="perfect scaling")
    thr.plot(n, [r["samples_per_s"] for r in rows], "o-", color=_RING, label="ring-allreduce (kfast)")
    thr.plot(n, [k * plan.batch_size / r["server_step_s"] for k, r in zip(n, rows)], "s-", color=_SERVER,
             label="parameter server")
    thr.set_yscale("log")
    thr.set_ylabel("samples / s (all ranks)")
    if plan.measured:
        m = sorted(plan.measured.items())
        eff.plot([k for k, _ in m], [plan.compute_s / s for _, s in m], "D", color=_MEASURED, ms=8, label="measured")
        thr.plot([k for k, _ in m], [k * plan.batch_size / s for k, s in m], "D", color=_MEASURED, ms=8,
                 label="measured")
    for ax in (eff, thr):
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(k) for k in n])
        ax.set_xlabel("ranks (GPUs)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right" if ax is eff else "upper left")
    from kfast.planning import cost_model

    fig.suptitle(f"kfast plan: {plan.name}, {cost_model.human_bytes(plan.gradient_bytes)} of gradients per step, "
                 f"compute {cost_model.human_seconds(plan.compute_s)} at batch {plan.batch_size}, link "
                 f"{cost_model.human_rate(plan.bandwidth)} / {cost_model.human_seconds(plan.latency)}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
