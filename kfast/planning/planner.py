"""`kfast.plan` (defined here): predict how a model scales over N ranks before renting them.

It measures the two numbers of the model that decide scaling, on this machine, in seconds: compute time
per training step and gradient bytes per step; takes the links' bandwidth and latency (given, or
measured between hosts by `kfast.planning.link_probe`); and applies the cost model in `kfast.planning.cost_model`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from typing import Any
from typing import TypedDict

import keras
import numpy as np

from kfast.planning import cost_model
from kfast.planning import gpus
from kfast.planning import memory_fit
from kfast.planning.memory import MemoryReport
from kfast.planning.memory import plan_memory
from kfast.planning.memory_model import check_precision
from kfast._core import fit_timing
from kfast._core.checks import check_int
from kfast._core.cpus import doublings
from kfast.data import structure
from kfast.distributed.optimizer import COMPRESSIONS
from kfast._core.checks import check_number

# Horovod fuses tensors into buffers of this size (HOROVOD_FUSION_THRESHOLD, bytes) before sending.
_FUSION_DEFAULT = 128 * 1024 * 1024
# Past this, "use a larger batch" stops being advice: memory and convergence rule it out.
_MOST_BATCH_FACTOR = 32


class PlanRow(TypedDict):
    """One row of `Plan.rows`: the prediction for one number of ranks (a plain dict at run time)."""

    ranks: int
    exchange_s: float
    step_s: float
    step_overlap_s: float
    samples_per_s: float
    efficiency: float
    efficiency_overlap: float
    server_step_s: float
    server_efficiency: float
    link_bytes: float


class Plan:
    """What `kfast.plan` predicts for each number of ranks, with what to change.

    Attributes:
        rows: one dict per rank count: `ranks`, `exchange_s`, `step_s` (kfast: exchange after backward),
            `step_overlap_s` (exchange hidden behind backward), `samples_per_s`, `efficiency`,
            `efficiency_overlap`, `server_step_s`, `server_efficiency`, `link_bytes` (per rank per step).
        compute_s: measured compute seconds per step on one rank; `batch_size` its per-rank batch.
        gradient_bytes: bytes exchanged per step (after compression); `parameters` trainable values.
        bandwidth, latency: link bytes/s and seconds; `link_source` says where they came from.
        advice: what to change, most useful first.
        measured: `{ranks: seconds per step}` from real runs, drawn beside the prediction (optional).
        memory: what one device holds (a `kfast.planning.MemoryReport`: the breakdown, whether it fits and
            the cheapest change that does, XLA's own analysis on JAX), or `None`.
    """

    def __init__(self, *, name: str, parameters: int, gradient_bytes: int, dtype: str, messages: int,
                 compute_s: float, batch_size: int, bandwidth: float, latency: float, link_source: str,
                 ranks: Iterable[int], compression: str | None, servers: int, threshold: float,
                 accumulation: int = 1, memory: MemoryReport | None = None) -> None:
        self.name, self.parameters, self.gradient_bytes, self.dtype = name, parameters, gradient_bytes, dtype
        self.messages, self.compute_s, self.batch_size = messages, compute_s, batch_size
        self.bandwidth, self.latency, self.link_source = bandwidth, latency, link_source
        self.compression, self.servers, self.threshold, self.accumulation = compression, servers, threshold, accumulation
        self.measured: dict[int, float] = {}
        self.memory = memory
        self.rows = [self._row(n) for n in ranks]
        self.advice = self._advise()

    def _exchange(self, n: int, nbytes: float | None = None, accumulation: int | None = None) -> float:
        nbytes = self.gradient_bytes if nbytes is None else nbytes
        # With gradient accumulation the exchange happens once every `accumulation` steps.
        return cost_model.ring_seconds(nbytes, n, self.bandwidth, self.latency, self.messages) / (
            accumulation or self.accumulation)

    def _row(self, n: int) -> PlanRow:
        exchange = self._exchange(n)
        fast, slow = cost_model.step_range(self.compute_s, exchange)
        server = self.compute_s + cost_model.server_seconds(self.gradient_bytes, n, self.bandwidth, self.latency,
                                                         self.servers, self.messages) / self.accumulation
        return {"ranks": n, "exchange_s": exchange, "step_s": slow, "step_overlap_s": fast,
                "samples_per_s": n * self.batch_size / slow, "efficiency": self.compute_s / slow,
                "efficiency_overlap": self.compute_s / fast, "server_step_s": server,
                "server_efficiency": self.compute_s / server,
                "link_bytes": 2 * (n - 1) / n * self.gradient_bytes if n > 1 else 0.0}

    def row(self, ranks: int) -> PlanRow:
        """The prediction for `ranks` (computed for any number, not only the table's)."""
        return self._row(ranks)

    def _advise(self) -> list[str]:
        largest = self.rows[-1]
        if largest["efficiency"] >= self.threshold:
            return [f"scales well: {largest['efficiency']:.0%} efficiency at {largest['ranks']} ranks "
                    f"(threshold {self.threshold:.0%}); nothing to change."]
        n, target = largest["ranks"], max(self.threshold, 0.9)
        out = []
        need = cost_model.needed_compute(largest["exchange_s"], target)
        factor = math.ceil(need / self.compute_s)
        ratio = (f"at {n} ranks the gradient exchange ({cost_model.human_seconds(largest['exchange_s'])}) is "
                 f"{largest['exchange_s'] / self.compute_s:.2g}x the compute ({cost_model.human_seconds(self.compute_s)})")
        if factor <= _MOST_BATCH_FACTOR:
            out.append(f"{ratio}: a per-rank batch {factor}x larger ({factor * self.batch_size}) reaches about "
                       f"{target:.0%} (compute grows with the batch, the exchange does not).")
        else:
            out.append(f"{ratio}: reaching {target:.0%} would take a per-rank batch {factor}x larger, so the link is "
                       "the limit here: a faster link, or fewer bytes per step (below), helps more.")
        if self.compression is None and self.dtype == "float32":
            half = self.compute_s / (self.compute_s + self._exchange(n, self.gradient_bytes / 2))
            out.append(f"fp16 compression (DistributedOptimizer(..., compression='fp16')) halves the bytes: "
                       f"{half:.0%} at {n} ranks.")
        for k in (2, 4, 8):
            with_k = self.compute_s / (self.compute_s + self._exchange(n, accumulation=self.accumulation * k))
            if with_k >= target or k == 8:
                out.append(f"gradient accumulation (backward_passes_per_step={self.accumulation * k}) exchanges once "
                           f"every {self.accumulation * k} batches: {with_k:.0%} at {n} ranks (the effective batch "
                           f"grows {k}x too).")
                break
        good = [r["ranks"] for r in self.rows if r["efficiency"] >= self.threshold and r["ranks"] > 1]
        if good:
            out.append(f"or run on {max(good)} ranks, the most that stay above {self.threshold:.0%} efficiency as it is.")
        else:
            out.append(f"as it is, no rank count above 1 reaches {self.threshold:.0%} efficiency on this link.")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.name, "parameters": self.parameters, "gradient_bytes": self.gradient_bytes,
                "dtype": self.dtype, "messages": self.messages, "compute_s": self.compute_s,
                "batch_size": self.batch_size, "bandwidth_bytes_per_s": self.bandwidth, "latency_s": self.latency,
                "link_source": self.link_source, "compression": self.compression, "servers": self.servers,
                "backward_passes_per_step": self.accumulation, "rows": self.rows, "advice": self.advice,
                "measured": {str(k): v for k, v in self.measured.items()},
                "memory": self.memory.to_dict() if self.memory else None}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        h = cost_model.human_seconds
        compressed = " (fp16 compression)" if self.compression else ""
        lines = [
            f"kfast plan: {self.name}, {self.parameters:,} trainable values, {cost_model.human_bytes(self.gradient_bytes)} "
            f"of {self.dtype} gradients per step{compressed}, in {self.messages} fused allreduce(s)",
            f"compute {h(self.compute_s)} per step at batch {self.batch_size} per rank "
            f"({self.batch_size / self.compute_s:,.0f} samples/s on one rank)",
            f"link {cost_model.human_rate(self.bandwidth)}, latency {h(self.latency)} ({self.link_source})",
            "",
            f"{'ranks':>5}  {'step (kfast)':>12}  {'samples/s':>10}  {'efficiency':>10}  {'with overlap':>12}  "
            f"{'param server x' + str(self.servers):>16}",
        ]
        for r in self.rows:
            lines.append(f"{r['ranks']:>5}  {h(r['step_s']):>12}  {r['samples_per_s']:>10,.0f}  {r['efficiency']:>10.0%}  "
                         f"{r['efficiency_overlap']:>12.0%}  {r['server_efficiency']:>16.0%}")
        if self.measured:
            lines.append("")
            lines.append("measured: " + ", ".join(f"{n} rank(s) {h(s)} per step (predicted {h(self.row(n)['step_s'])})"
                                                  for n, s in sorted(self.measured.items())))
        lines += ["", "What to change:"] + [f"  - {a}" for a in self.advice]
        if self.memory:
            lines += ["", str(self.memory)]
            change = self.memory.fit.change if self.memory.fit else None
            if change and change.mesh[1] > 1:
                lines.append(f"  scaling with it: N replicas take N x {change.mesh[1]} devices; the table above counts "
                             "replicas, and the exchanges inside a replica are not in it.")
            elif change:
                lines.append("  scaling with it: as in the table above (the same compute and gradient bytes per "
                             "optimizer step).")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str]) -> str | os.PathLike[str]:
        """Writes efficiency and throughput against ranks (log axes) for both strategies as a PNG, and the
        memory of one device beside them (stacked bars of the breakdown against the device's memory)."""
        from kfast.planning import plot

        plot.draw(self, path)
        return path


def gradient_size(model: keras.Model, compression: str | None = None) -> tuple[int, int, str]:
    """(trainable values, bytes exchanged per step, dtype name) for `model`'s trainable variables."""
    values, nbytes = 0, 0
    dtypes: set[str] = set()
    for v in model.trainable_variables:
        n = int(np.prod(v.shape))
        dtype = np.dtype(keras.backend.standardize_dtype(v.dtype))
        size = 2 if compression == "fp16" and dtype == np.float32 else dtype.itemsize
        values, nbytes = values + n, nbytes + n * size
        dtypes.add(dtype.name)
    return values, nbytes, "/".join(sorted(dtypes)) or "none"


def _synthetic_batch(model: keras.Model, batch_size: int, seed: int = 0) -> tuple[Any, np.ndarray]:
    """A batch of random inputs (and integer labels of the output's width) for a model with an Input."""
    if not getattr(model, "inputs", None):
        raise ValueError("kfast.plan got a model without inputs it can read (no keras.Input) and no dataset; "
                         "pass dataset= (a batch source), or build the model with keras.Input.")
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((batch_size,) + tuple(d or 1 for d in t.shape[1:])).astype(
        keras.backend.standardize_dtype(t.dtype)) for t in model.inputs]
    out = model.outputs[0].shape
    y = rng.standard_normal((batch_size,) + tuple(d or 1 for d in out[1:])).astype("float32")
    return (xs[0] if len(xs) == 1 else xs), y


def plan(model: keras.Model, dataset: Any = None, *, ranks: Iterable[int] | None = None,
         bandwidth: float | str | None = None, latency: float | str | None = None, compression: str | None = None,
         servers: int = 1, batch_size: int = 32, threshold: float = 0.8, steps: int = 10,
         link_source: str | None = None, device_memory: str | float | None = None, device: str | None = None,
         precision: str | None = None) -> Plan:
    """Predicts step time, throughput and scaling efficiency of `model` on 1..N ranks.

    Measures compute seconds per step on this machine (fit's own train step on one cached batch; the
    weights and optimizer state are put back) and the gradient bytes, then applies the ring-allreduce and
    parameter-server models of `kfast.planning.cost_model` for the given link. Predicts one device's
    memory too (`Plan.memory`, see `kfast.planning.plan_memory`): whether the step fits and the cheapest
    change that makes it fit.

    Args:
        model: a compiled Keras model (its loss decides the backward pass).
        dataset: where to take one batch from (a PyDataset, FastLoader, or anything indexable/iterable).
            Defaults to `None`: random inputs of `batch_size` built from the model's `keras.Input`s, with
            targets shaped like its output (for a loss that wants integer labels, pass a dataset).
        ranks: the rank counts to predict. Defaults to `None`: 1, 2, 4, ... 1024.
        bandwidth: link bytes per second, or a string such as `"10Gbit"`. Defaults to `None`: 10 Gbit/s.
        latency: seconds per message, or a string such as `"20us"`. Defaults to `None`: 20 us.
        compression: `None` or `"fp16"` (as `DistributedOptimizer`). Defaults to `None`; a model
            compiled with a `DistributedOptimizer` uses its setting.
        servers: parameter-server shards, for the comparison. Defaults to `1`.
        batch_size: per-rank batch of the synthetic inputs. Defaults to `32`.
        threshold: the efficiency under which the plan says what to change. Defaults to `0.8`.
        steps: timed steps. Defaults to `10`.
        link_source: a note on where the link numbers came from. Defaults to `None`.
        device_memory: one device's memory, in bytes or a string such as `"80GB"` or `"16GiB"`, for the
            memory verdict. Defaults to `None`: the first GPU's, through NVML; without one, no verdict.
        device: a GPU by name (`"H100"`, `kfast.planning.known_gpus()`): also compile the step for it without
            one here, for XLA's memory numbers, the runtime's margin and, when it does not fit, the changes
            compiled (`Plan.memory.gpu`). Defaults to `None`.
        precision: the dtype policy to predict memory for: `"float32"`, `"mixed_float16"` or
            `"mixed_bfloat16"`. Defaults to `None`: the model's own.

    Returns:
        A `Plan`: print it, `to_dict()` it, or `plot("plan.png")` it.

    Example:

    >>> import keras, kfast
    >>> model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024), keras.layers.Dense(10)])
    >>> model.compile("sgd", "mse")
    >>> p = kfast.plan(model, ranks=[1, 8], bandwidth="1Gbit", latency="50us", steps=3)
    >>> p.parameters, p.gradient_bytes, [r["ranks"] for r in p.rows]
    (273418, 1093672, [1, 8])
    """
    from kfast.diagnosis import measure

    fit_timing.check_model("kfast.plan", model, built=False)  # without a dataset: needs a keras.Input, below
    if compression not in COMPRESSIONS:
        raise ValueError(f"kfast.plan got compression={compression!r}; use None or 'fp16'.")
    check_int("kfast.plan", "servers", servers)
    check_int("kfast.plan", "batch_size", batch_size)
    check_int("kfast.plan", "steps", steps)
    check_number("kfast.plan", "threshold", threshold, above=0, below=1)
    if device_memory is not None:  # bad settings fail before anything is measured
        memory_fit.parse_memory(device_memory)
    if precision is not None:
        check_precision(precision)
    if device is not None:
        gpus.gpu_spec(device)
    ranks = sorted(set(ranks or doublings(1024)))
    for n in ranks:
        check_int("kfast.plan", "ranks", n, hint="each a number of ranks >= 1")
    given = bandwidth is not None or latency is not None
    bandwidth = cost_model.parse_bandwidth(bandwidth) if isinstance(bandwidth, str) else (bandwidth or 1.25e9)
    latency = cost_model.parse_latency(latency) if isinstance(latency, str) else (20e-6 if latency is None else latency)
    check_number("kfast.plan", "bandwidth", bandwidth, above=0, unit="bytes per second")
    check_number("kfast.plan", "latency", latency, least=0, unit="seconds")
    optimizer = model.optimizer
    accumulation = getattr(optimizer, "backward_passes_per_step", 1)
    compression = compression or getattr(optimizer, "compression", None)
    batch = fit_timing.first_batch(dataset) if dataset is not None else _synthetic_batch(model, batch_size)
    batch_size = structure.batch_size(batch)
    compute_s = float(np.median(measure.compute_seconds(model, batch, steps=steps)))
    memory = plan_memory(model, batch, batch_size=batch_size * accumulation, precision=precision,
                         accumulation=accumulation, device_memory=device_memory, device=device)
    parameters, nbytes, dtype = gradient_size(model, compression)
    fusion = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", _FUSION_DEFAULT)) or nbytes or 1
    return Plan(name=model.name, parameters=parameters, gradient_bytes=nbytes, dtype=dtype,
                messages=max(1, math.ceil(nbytes / fusion)), compute_s=compute_s, batch_size=batch_size,
                bandwidth=bandwidth, latency=latency,
                link_source=link_source or ("given" if given else "assumed: 10 Gbit/s, 20 us; pass bandwidth="),
                ranks=ranks, compression=compression, servers=servers, threshold=threshold,
                accumulation=accumulation, memory=memory)
