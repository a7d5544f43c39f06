"""The diagnosis picture: where each measured training step's time went, and how busy the GPU was.

Drawn on a `matplotlib.figure.Figure` with its own Agg canvas, never through pyplot or `matplotlib.use`,
so a notebook's backend and open figures are left alone.
"""

from __future__ import annotations

import os
import textwrap
from typing import TYPE_CHECKING

import numpy as np

from kfast._core.step_shares import LABELS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from kfast.diagnosis.report import Diagnosis

# Input wait is the colour to notice; compute is the work the step exists for; other is neutral. The
# names are the ones the text prints (kfast._core.step_shares.LABELS).
_COLOURS = {"compute": "#4C72B0", "input_wait": "#E8743B", "other": "#A9A9A9"}
_VERDICT_COLOURS = {"input-bound": "#C44E1A", "compute-bound": "#2E6B30", "balanced": "#6A4C93",
                    "uncertain": "#555555"}
_PHASE_LABELS = {"input": "input alone", "compute": "compute alone", "end_to_end": "end to end"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def draw(diagnosis: Diagnosis, path: str | os.PathLike[str]) -> None:
    """Writes `diagnosis` as a PNG to `path` (see `Diagnosis.plot`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    d = diagnosis
    gpu = bool(d.gpu_timeline)
    first = d.recommendations[0] if d.recommendations else ""
    note = textwrap.fill(f"What to do: {first}", 160)
    if not gpu:
        note += f"\nGPU utilisation: not measured ({d.gpu_reason or 'no samples'})."
    height = (6.6 if gpu else 4.8) + 0.16 * note.count("\n")
    fig = Figure(figsize=(10, height), dpi=100)
    FigureCanvasAgg(fig)
    _header(fig, d)
    fig.text(0.012, 0.012, note, ha="left", va="bottom", fontsize=8.5, color="#333333")
    if gpu:
        ax, ax_gpu = fig.subplots(2, 1, gridspec_kw={"height_ratios": [2.4, 1], "hspace": 0.5})
    else:
        ax, ax_gpu = fig.subplots(1, 1), None
    # Inches, not fractions: the header and footer keep their size whatever the figure's height.
    fig.subplots_adjust(left=0.075, right=0.985, top=1 - 1.4 / height, bottom=(0.7 + 0.16 * note.count("\n")) / height)
    _draw_steps(ax, d)
    if gpu:
        _draw_gpu(ax_gpu, d)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)


def _header(fig: Figure, d: Diagnosis) -> None:
    # The typical step's shares, the very numbers the text prints (Diagnosis.shares).
    s, pct = d.shares, d.shares.percents()
    b = d.batch_size
    fig.text(0.012, 1 - 0.1 / fig.get_figheight(), f"{d.verdict.upper()}: {d.headline()}",
             ha="left", va="top", fontsize=15, fontweight="bold", color=_VERDICT_COLOURS.get(d.verdict, "black"))
    # Short names here, for the width; the legend below spells "other" out.
    parts = " + ".join(f"{_ms(getattr(s, part))} {LABELS[part].split(' (')[0]} ({pct[part]}%)" for part in _COLOURS)
    fig.text(0.012, 1 - 0.45 / fig.get_figheight(), f"typical step {_ms(s.step)} = {parts}   (batch of {b})\n"
             f"samples/s:  input alone {d.input_batches_per_s * b:,.0f}   |   compute alone "
             f"{d.compute_steps_per_s * b:,.0f}   |   end to end {d.end_to_end_steps_per_s * b:,.0f}",
             ha="left", va="top", fontsize=10.5, linespacing=1.5)


def _draw_steps(ax: Axes, d: Diagnosis) -> None:
    parts = d.step_breakdown()
    steps = np.arange(1, len(parts["compute"]) + 1)
    total = np.asarray(sum(parts.values())) * 1e3
    # A few slow steps (a new epoch's iterator, a pause) must not flatten the others: clip them and say so.
    cap = max(float(np.percentile(total, 90)) * 1.6, float(np.median(total)) * 2)
    top = cap if total.max() > cap * 1.15 else float(total.max())
    base = np.zeros(len(steps))
    pct = d.shares.percents()
    for key, colour in _COLOURS.items():
        height = np.minimum(base + parts[key] * 1e3, top) - np.minimum(base, top)
        ax.bar(steps, height, bottom=np.minimum(base, top), width=0.85, color=colour, linewidth=0,
               label=f"{LABELS[key]}: {pct[key]}%")
        base = base + parts[key] * 1e3
    clipped = total > top * 1.001
    for x, value in zip(steps[clipped], total[clipped]):
        ax.text(x, top, f"{value:.0f}", ha="center", va="bottom", fontsize=7.5, color="#444444")
    for i, start in enumerate(d.epoch_starts):
        ax.axvline(start + 0.5, color="#555555", linestyle=":", linewidth=1, label="new epoch" if i == 0 else None)
    ax.set_xlim(0.3, len(steps) + 0.7)
    ax.set_ylim(0, max(top, 1e-3) * 1.08)
    ax.set_xlabel("measured training step (end to end)" +
                  ("; steps taller than the frame are cut, their ms on top" if clipped.any() else ""))
    ax.set_ylabel("ms per step")
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.01), ncols=4, frameon=False, fontsize=9.5, borderaxespad=0,
              handlelength=1.4, columnspacing=1.6)
    ax.spines[["top", "right"]].set_visible(False)


def _draw_gpu(ax: Axes, d: Diagnosis) -> None:
    t0 = min([d.gpu_timeline[0][0]] + [start for start, _ in d.phases.values()])
    shades = {"input": "#FBE3D6", "compute": "#DCE4F2", "end_to_end": "#EDEDED"}
    for name, (start, end) in d.phases.items():
        ax.axvspan(start - t0, end - t0, color=shades.get(name, "#EDEDED"), zorder=0, linewidth=0)
        ax.text((start + end) / 2 - t0, 104, _PHASE_LABELS.get(name, name), ha="center", va="bottom", fontsize=9,
                color="#555555")
    ax.plot([t - t0 for t, *_ in d.gpu_timeline], [u for _, u, *_ in d.gpu_timeline], color="#2E6B30", linewidth=1.4)
    ax.set_ylim(0, 100)
    ax.set_xlim(0, max([d.gpu_timeline[-1][0]] + [end for _, end in d.phases.values()]) - t0)
    ax.set_xlabel("seconds since the diagnosis began")
    ax.set_ylabel("GPU busy %")
    ax.spines[["top", "right"]].set_visible(False)
