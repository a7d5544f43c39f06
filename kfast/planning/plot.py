"""The plan picture: scaling efficiency and throughput against ranks, ring-allreduce beside a parameter server,
and one device's memory beside them: the predicted breakdown as stacked bars (as it is, and with the change
that makes it fit), against the device's memory.

Drawn on a `matplotlib.figure.Figure` with its own Agg canvas (no pyplot), so a notebook's backend is
left alone.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from kfast.planning.memory import MemoryReport
    from kfast.planning.planner import Plan

_RING, _OVERLAP, _SERVER, _MEASURED = "#4C72B0", "#8FAADC", "#C44E1A", "#2E6B30"
_PARTS = (("parameters", "#4C72B0"), ("gradients", "#8FAADC"), ("optimizer", "#C44E1A"),
          ("activations", "#2E6B30"), ("batch", "#B8A03A"))


def draw(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Writes `plan` as a PNG to `path` (see `Plan.plot`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = plan.rows
    n = [r["ranks"] for r in rows]
    fig = Figure(figsize=(11, 4.6), dpi=100)
    FigureCanvasAgg(fig)
    if plan.memory is not None:
        eff, thr, mem = fig.subplots(1, 3, gridspec_kw={"width_ratios": (1, 1, 0.6)})
        _memory(mem, plan.memory)
    else:
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


def _memory(ax: Any, memory: MemoryReport) -> None:
    """Stacked bars of one device's memory in GB, as it is and with the change, and the device's memory."""
    fit = memory.fit
    bars = [("as it is", memory.breakdown)]
    if fit is not None and fit.change is not None:
        bars.append(("with the change", fit.change.breakdown))
    top = max([b.peak for _, b in bars] + ([fit.device_memory] if fit is not None else [])) / 1e9
    for x, (_, breakdown) in enumerate(bars):
        bottom = 0.0
        for part, color in _PARTS:
            height = getattr(breakdown, part) / 1e9
            ax.bar(x, height, bottom=bottom, color=color, width=0.6, label=part if x == 0 else None)
            bottom += height
    if memory.compiled is not None:
        ax.plot([0], [memory.compiled.total / 1e9], "D", color="#222222", label="XLA's compiled step")
    if fit is not None:
        ax.axhline(fit.device_memory / 1e9, color="#999999", ls="--", lw=1, label="device memory")
        ax.axhline(fit.usable / 1e9, color="#999999", ls=":", lw=0.8, label="usable")
    ax.set_xticks(range(len(bars)), [name for name, _ in bars])
    ax.set_xlim(-0.6, len(bars) - 0.4)
    ax.set_ylim(0, top * 1.6)  # room above the bars for the legend
    ax.set_ylabel("GB per device")
    ax.set_title(f"memory at batch {memory.breakdown.batch_size}", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
