"""Measure a link's latency and bandwidth with real Horovod allreduces between two hosts (for `kfast plan`).

`measure(hosts)` starts `horovodrun -np 2 -H host1:1,host2:1 python -m kfast.planning.link_probe`: the two ranks
allreduce float32 buffers of growing size (4 B to 64 MiB, stopping before one would take over 2 s) and
rank 0 prints the median seconds per size as JSON. On 2 ranks a ring-allreduce of S bytes costs
2 x latency + S / bandwidth (see `kfast.planning.cost_model`), so latency comes from the smallest messages and
bandwidth from the slope over the large ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

_MARK = "kfast-link-probe: "
_SIZES = [4, 64, 1024, 16384, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26]  # 4 B ... 64 MiB
_NEXT_MAX_S = 2.0


def fit(seconds_by_size: dict[int, float]) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) from `{bytes: seconds}` of 2-rank allreduces.

    Example:

    >>> fit({4: 2e-4, 1 << 20: 2e-4 + (1 << 20) / 1e8, 1 << 22: 2e-4 + (1 << 22) / 1e8})
    (0.0001, 100000000.0)
    """
    sizes = sorted(seconds_by_size)
    latency = seconds_by_size[sizes[0]] / 2
    large = [s for s in sizes if s >= 1 << 20] or sizes[-2:]
    if len(large) < 2:
        raise ValueError(f"a link probe needs two message sizes of 1 MiB or more to measure bandwidth; got sizes {sizes}.")
    x = np.array(large, dtype=float)
    y = np.array([seconds_by_size[s] for s in large])
    slope = np.polyfit(x, y, 1)[0]
    if slope <= 0:
        raise ValueError(f"the link probe's timings do not grow with message size ({seconds_by_size}); run it again "
                         "on idle hosts, or pass --bandwidth and --latency.")
    return round(latency, 9), round(float(1 / slope), 3)


def _probe(repeats: int = 5) -> None:
    import kfast

    kfast.distributed.init()
    times: dict[int, float] = {}
    for size, following in zip(_SIZES, _SIZES[1:] + [0]):
        buf = np.ones(size // 4, dtype="float32")
        kfast.distributed.allreduce_average([buf])  # warm: the first of a size sets up the buffers
        samples: list[float] = []
        for _ in range(repeats):
            start = time.perf_counter()
            kfast.distributed.allreduce_average([buf])
            samples.append(time.perf_counter() - start)
        times[size] = float(np.median(samples))
        # Stop before the next size would take over _NEXT_MAX_S. Both ranks decide on the same averaged
        # time, or one would wait in a collective for ever.
        if following * kfast.distributed.allreduce_mean_values([times[size]])[0] / size > _NEXT_MAX_S:
            break
    if kfast.distributed.rank() == 0:
        print(_MARK + json.dumps(times), flush=True)


def measure(hosts: Sequence[str], *, timeout: float = 180,
            horovodrun: str | None = None) -> tuple[float, float, dict[int, float]]:
    """Runs the probe between the first two of `hosts` and returns `(latency_s, bandwidth_bytes_per_s, times)`.

    Raises:
        RuntimeError: when horovodrun fails or prints no result, with its output.
    """
    from kfast.distributed import horovodrun_path

    if len(hosts) < 2:
        raise ValueError(f"measuring a link needs two hosts; got {hosts}.")
    cmd = [horovodrun or horovodrun_path(), "-np", "2", "-H", f"{hosts[0]}:1,{hosts[1]}:1", "--gloo",
           sys.executable, "-m", "kfast.planning.link_probe"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"the link probe between {hosts[0]} and {hosts[1]} took over {timeout} s: "
                           f"{' '.join(cmd)}\n{e.stdout!r}\n{e.stderr!r}") from e
    for line in proc.stdout.splitlines():
        if _MARK in line:
            times = {int(k): v for k, v in json.loads(line.split(_MARK, 1)[1]).items()}
            latency, bandwidth = fit(times)
            return latency, bandwidth, times
    raise RuntimeError(f"the link probe between {hosts[0]} and {hosts[1]} failed (exit {proc.returncode}): "
                       f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


if __name__ == "__main__":
    _probe()
