"""The cost model behind `kfast.plan`: how long gradient exchange takes on N ranks, and what it does to a step.

Synchronous data-parallel training with a fixed per-rank batch (weak scaling): each step every rank
computes on its own batch, then the ranks average `S` bytes of gradients.

- Ring-allreduce (what Horovod and kfast run): a reduce-scatter and an allgather, 2(N-1) rounds of one
  message of S/N bytes each way around the ring, so a rank's link carries 2(N-1)/N x S bytes per step
  whatever N is: T = 2(N-1) x latency + 2(N-1)/N x S / bandwidth.
- Parameter server with k shards on their own links: each worker pushes S and pulls S back; each server
  link carries N x S / k in each direction, so it is the bottleneck once N > k:
  T = 2 x latency + 2 x max(S, N x S / k) / bandwidth.

A step takes compute + exchange when the exchange starts after the backward pass (kfast's
DistributedOptimizer sends one grouped allreduce after it); frameworks that overlap the exchange with
the backward pass can hide up to the backward share of compute (about 2/3: backward costs about twice
the forward). The two are the ends of the predicted range.
"""

from __future__ import annotations

import math
import re

# Backward is about two thirds of a training step (two matrix products per layer against one forward).
BACKWARD_SHARE = 2 / 3

_RATE_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
               "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
_TIME_DIVISORS = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}  # dividing keeps 20us exactly 2e-05


def parse_bandwidth(text: str | float) -> float:
    """Bytes per second from `"10Gbit"`, `"25 Gbit/s"`, `"10Gbps"`, `"100Mbit"`, `"1.25GB/s"` (B/s is bytes).

    Example:

    >>> parse_bandwidth("10Gbit"), parse_bandwidth("100 MB/s")
    (1250000000.0, 100000000.0)
    """
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9+-]+)?)\s*([kmgt]?(?:bit|b))(/s|ps)?\s*", str(text), re.IGNORECASE)
    # "bit" and "bps" mean bits (the network habit: 10Gbps); a bare "B" means bytes, whatever the case.
    key = match.group(2).lower() if match else None
    if match and key and match.group(3) and match.group(3).lower() == "ps" and not key.endswith("bit"):
        key = key[:-1] + "bit"
    if match is None or key not in _RATE_UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"bandwidth {text!r} is not a rate; expected a number and a unit such as 10Gbit, "
                         "25Gbit/s, 100Mbit or 1.25GB/s.")
    return float(match.group(1)) * _RATE_UNITS[key]


def parse_latency(text: str | float) -> float:
    """Seconds from `"20us"`, `"1.5ms"`, `"0.002s"`.

    Example:

    >>> parse_latency("20us"), parse_latency("1.5ms")
    (2e-05, 0.0015)
    """
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9+-]+)?)\s*(s|ms|us|µs|ns)\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"latency {text!r} is not a time; expected a number and a unit such as 20us, 1.5ms "
                         "or 0.002s.")
    return float(match.group(1)) / _TIME_DIVISORS[match.group(2).lower()]


def ring_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float, messages: int = 1) -> float:
    """Seconds of one ring-allreduce of `nbytes` over `ranks`, sent as `messages` fused buffers.

    Example:

    >>> round(ring_seconds(1e8, 4, 1.25e9, 0.0), 4)  # 100 MB on 4 ranks over 10 Gbit/s
    0.12
    """
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * latency * messages + 2 * (ranks - 1) / ranks * nbytes / bandwidth


def server_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float, servers: int = 1,
                   messages: int = 1) -> float:
    """Seconds of one push-and-pull of `nbytes` per worker through `servers` parameter-server shards."""
    if ranks <= 1:
        return 0.0
    return 2 * latency * messages + 2 * max(nbytes, ranks * nbytes / servers) / bandwidth


def step_range(compute: float, exchange: float) -> tuple[float, float]:
    """(fastest, slowest) step seconds: the exchange hidden behind the backward pass as far as it can be,
    and not hidden at all (kfast's case)."""
    hidden = min(exchange, BACKWARD_SHARE * compute)
    return compute + exchange - hidden, compute + exchange


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def human_rate(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    for unit, size in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= size:
            return f"{bits / size:.3g} {unit}"
    return f"{bits:.3g} bit/s"


def human_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def needed_compute(exchange: float, target: float) -> float:
    """Compute seconds per step at which an un-overlapped exchange of `exchange` seconds leaves efficiency
    `target`: compute / (compute + exchange) = target."""
    return math.inf if target >= 1 else exchange * target / (1 - target)
