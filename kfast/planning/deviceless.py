"""Compiling for a GPU this machine does not have: XLA's device-less compile through JAX's CUDA plugin.

JAX's CUDA plugin (`jax-cuda12-plugin`, `jax-cuda12-pjrt`) and NVIDIA's `ptxas`/`libdevice`
(`nvidia-cuda-nvcc-cu12`) compile for a described GPU with no GPU and no driver:
`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=..., topology="1x1xN")` gives N
devices of that GPU to lay arguments on, and `memory_analysis()` of the compiled program is XLA's buffer
assignment for it (checked with jax 0.10.2; ../shared/notes/gpu-compile-facts.md). The plugin must be imported
with its CUDA version check off (`JAX_PLATFORMS=cpu` does that), so a process that has started JAX on a GPU
compiles for it directly instead.

Two traps this module steers around: `lower(lowering_platforms=("cuda",))` with ordinary arguments "succeeds" and
compiles for the CPU; and without `target_config` the topology asks for a visible GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from kfast.planning.gpus import GpuSpec
from kfast.planning.gpus import gpu_spec

INSTALL = "pip install 'kfast[plan-gpu]'"
# A product of two small matrices compiled for an H100 in a fresh JAX process: what `probe` runs.
_PROBE = """
import jax, jax.numpy as jnp
from kfast.planning import deviceless, gpus
mesh, replicated = deviceless.shardings(gpus.gpu_spec("H100"), deviceless.Placement())
x = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=replicated)
jax.jit(lambda a: a @ a).lower(x).compile().memory_analysis()
"""


class GpuCompileUnavailable(RuntimeError):
    """This Python cannot compile for a GPU without one: what is missing and the fix."""


@dataclass(frozen=True)
class Placement:
    """Where a compile's arguments live: `mesh` over N devices of one GPU kind, with axes `("data", "model")`.

    Example:

    >>> Placement(data=2, model=1).devices
    2
    """

    data: int = 1
    model: int = 1

    @property
    def devices(self) -> int:
        return self.data * self.model


def check_available() -> None:
    """Raises `GpuCompileUnavailable` naming the missing package and the fix, or returns when GPU compiles work.

    Example:

    >>> try:
    ...     check_available()
    ... except GpuCompileUnavailable as e:
    ...     print("plan-gpu" in str(e))
    ... else:
    ...     print(True)
    True
    """
    missing = [name for name, module in (("jax", "jax"), ("jax-cuda12-plugin", "jax_cuda12_plugin"),
                                         ("jax-cuda12-pjrt", "jax_plugins.xla_cuda12"),
                                         ("nvidia-cuda-nvcc-cu12", "nvidia.cuda_nvcc"))
               if _find(module) is None]
    if missing:
        raise GpuCompileUnavailable(f"compiling for a GPU without one needs {', '.join(missing)} in this Python; "
                                    f"install them with {INSTALL} (pinned to the jax kfast is tested with).")


def available() -> bool:
    """Whether the packages of a GPU compile are installed here (`check_available` says what is missing).

    Example:

    >>> isinstance(available(), bool)
    True
    """
    try:
        check_available()
    except GpuCompileUnavailable:
        return False
    return True


def probe(timeout: float = 180.0) -> str | None:
    """Compiles a small program for an H100 in a fresh JAX process: `None` when GPU planning works here, else what
    failed and the fix (what `kfast doctor` reports).

    Example:

    >>> result = probe()
    >>> result is None or "plan-gpu" in result or "XLA" in result
    True
    """
    try:
        check_available()
    except GpuCompileUnavailable as e:
        return str(e)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"a small compile for an H100 ran past {timeout:.0f} s; check the machine's load and retry."
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return str(compile_error(gpu_spec("H100"), RuntimeError(last)))


def _find(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def topology(spec: GpuSpec, devices: int) -> Any:
    """JAX's description of `devices` GPUs of kind `spec`, for lowering onto (nothing is allocated).

    Raises:
        GpuCompileUnavailable: when the plugin is missing or was not registered.
    """
    check_available()
    from jax.experimental import topologies

    try:
        return topologies.get_topology_desc(platform="cuda", target_config=spec.target_config(),
                                            topology=f"1x1x{devices}")
    except Exception as e:  # the plugin not registered: its CUDA version check ran and failed
        raise GpuCompileUnavailable(
            f"JAX could not describe {devices} x {spec.name} ({type(e).__name__}: {e}). The CUDA plugin registers "
            "without a GPU only when its CUDA check is off: set JAX_PLATFORMS=cpu (or "
            "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1) before JAX is imported; kfast plan does that for its own "
            "compile process.") from e


def shardings(spec: GpuSpec, placement: Placement) -> tuple[Any, Any]:
    """The mesh of `placement`'s devices of `spec` with axes ("data", "model"), and a replicated `NamedSharding`
    on it."""
    import jax
    from jax.experimental import topologies

    topo = topology(spec, placement.devices)
    mesh = topologies.make_mesh(topo, (placement.data, placement.model), ("data", "model"))
    return mesh, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def compile_error(spec: GpuSpec, error: Exception) -> GpuCompileUnavailable:
    """The error to raise when XLA fails to compile for `spec`: ptxas or libdevice missing, named with the fix."""
    text = str(error)
    if "libdevice" in text or "ptxas" in text:
        return GpuCompileUnavailable(f"XLA could not compile for {spec.name}: {text.splitlines()[0]} NVIDIA's "
                                     f"compiler tools come with nvidia-cuda-nvcc-cu12: {INSTALL}.")
    return GpuCompileUnavailable(f"XLA could not compile the step for {spec.name}: {type(error).__name__}: "
                                 f"{text.splitlines()[0] if text else ''}")
