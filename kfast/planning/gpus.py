"""The GPUs kfast plans for without one: each by name, with the device description XLA compiles for.

XLA keeps a description of each GPU it can compile for without the device (a `GpuTargetConfigProto`: cores,
shared memory, caches, memory size, compute capability, cuDNN version) in its spec files,
`xla/backends/gpu/target_config/specs/*.txtpb` in openxla/xla (read at commit 4336d12e, 2026). `GpuSpec`
holds the values of those files that change the compiled program, each row citing its file; `target_config`
writes them back as the text proto that `jax.experimental.topologies.get_topology_desc` takes. The values
common to every NVIDIA GPU since Pascal (1024 threads a block, warps of 32, 48 KiB of static shared memory a
block, grid limits, 64 Ki registers) are the same in every file and written once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as XLA describes it to its compiler.

    Attributes:
        name: kfast's name for it (`"H100"`), what `device=` takes.
        description: XLA's `device_description_str`.
        memory: `device_memory_size`, bytes.
        compute_capability: (major, minor).
        cores: streaming multiprocessors (`core_count`).
        fpus_per_core: `fpus_per_core`.
        threads_per_core: `threads_per_core_limit`.
        shared_memory_per_core: bytes (`shared_memory_per_core`).
        shared_memory_per_block_optin: bytes (`shared_memory_per_block_optin`).
        l2_cache: bytes (`l2_cache_size`).
        bandwidth: memory bandwidth, bytes/s (`memory_bandwidth`).
        clock_ghz: `clock_rate_ghz`.
        dnn_version: the cuDNN version the spec names, (major, minor, patch).
        source: the XLA spec file the values come from.

    Example:

    >>> spec = gpu_spec("h100")
    >>> spec.name, spec.memory // 2**30, spec.compute_capability
    ('H100', 79, (9, 0))
    >>> "core_count: 132" in spec.target_config()
    True
    """

    name: str
    description: str
    memory: int
    compute_capability: tuple[int, int]
    cores: int
    fpus_per_core: int
    threads_per_core: int
    shared_memory_per_core: int
    shared_memory_per_block_optin: int
    l2_cache: int
    bandwidth: int
    clock_ghz: float
    dnn_version: tuple[int, int, int]
    source: str

    def target_config(self) -> str:
        """The `GpuTargetConfigProto` text XLA compiles for."""
        major, minor = self.compute_capability
        dnn = self.dnn_version
        return "\n".join([
            "gpu_device_info {",
            "  threads_per_block_limit: 1024", "  threads_per_warp: 32", "  shared_memory_per_block: 49152",
            f"  shared_memory_per_core: {self.shared_memory_per_core}",
            f"  threads_per_core_limit: {self.threads_per_core}", f"  core_count: {self.cores}",
            f"  fpus_per_core: {self.fpus_per_core}", "  block_dim_limit_x: 2147483647",
            "  block_dim_limit_y: 65535", "  block_dim_limit_z: 65535",
            f"  memory_bandwidth: {self.bandwidth}", f"  l2_cache_size: {self.l2_cache}",
            f"  clock_rate_ghz: {self.clock_ghz}", f"  device_memory_size: {self.memory}",
            f"  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}",
            f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
            "  registers_per_core_limit: 65536", "  registers_per_block_limit: 65536",
            "}", 'platform_name: "CUDA"',
            f"dnn_version_info {{ major: {dnn[0]} minor: {dnn[1]} patch: {dnn[2]} }}",
            f'device_description_str: "{self.description}"', ""])


_SPECS = "xla/backends/gpu/target_config/specs/"


def _spec(name: str, file: str, description: str, memory: int, cc: tuple[int, int], cores: int, fpus: int,
          threads: int, smem_core: int, smem_optin: int, l2: int, bandwidth: int, clock: float,
          dnn: tuple[int, int, int]) -> GpuSpec:
    return GpuSpec(name, description, memory, cc, cores, fpus, threads, smem_core, smem_optin, l2, bandwidth, clock,
                   dnn, _SPECS + file)


# One row per spec file of XLA's for an NVIDIA GPU (MIG slices left out: a slice's memory is the user's setting).
GPUS: dict[str, GpuSpec] = {s.name: s for s in [
    _spec("H100", "h100_sxm.txtpb", "NVIDIA H100 80GB HBM3", 84942979072, (9, 0), 132, 128, 2048, 233472, 232448,
          52428800, 3352320000000, 1.98, (8, 9, 4)),
    _spec("H100-PCIe", "h100_pcie.txtpb", "NVIDIA H100 PCIe", 84942979072, (9, 0), 114, 128, 2048, 233472, 232448,
          52428800, 2039040000000, 1.755, (8, 9, 2)),
    _spec("H200", "h200.txtpb", "NVIDIA H200 141GB HBM3e", 151397597184, (9, 0), 132, 128, 2048, 233472, 232448,
          52428800, 4800000000000, 1.98, (9, 10, 0)),
    _spec("A100-40GB", "a100_sxm_40.txtpb", "NVIDIA A100-SXM4-40GB", 42331013120, (8, 0), 108, 64, 2048, 167936,
          166912, 41943040, 1555200000000, 1.41, (9, 10, 0)),
    _spec("A100-80GB", "a100_sxm_80.txtpb", "NVIDIA A100-SXM4-80GB", 85100068864, (8, 0), 108, 64, 2048, 167936,
          166912, 41943040, 2039040000000, 1.41, (8, 9, 4)),
    _spec("A100-80GB-PCIe", "a100_pcie_80.txtpb", "A100 80GB", 79050250240, (8, 0), 108, 64, 2048, 167936, 166912,
          41943040, 2039000000000, 1.1105, (8, 9, 4)),
    _spec("A6000", "a6000.txtpb", "NVIDIA RTX A6000", 51041271808, (8, 6), 84, 128, 1536, 102400, 101376, 6291456,
          768096000000, 1.8, (8, 9, 4)),
    _spec("V100", "v100.txtpb", "Tesla V100-SXM2-16GB", 16935682048, (7, 0), 80, 64, 2048, 98304, 98304, 6291456,
          898048000000, 1.53, (9, 10, 0)),
    _spec("P100", "p100.txtpb", "Tesla P100-SXM2-16GB", 17066885120, (6, 0), 56, 64, 2048, 65536, 49152, 4194304,
          732160000000, 1.4805, (9, 10, 0)),
    _spec("B200", "b200.txtpb", "NVIDIA B200", 191514411008, (10, 0), 148, 128, 2048, 233472, 232448, 132644864,
          7672320000000, 1.965, (9, 7, 0)),
    _spec("RTX-PRO-6000", "rtx6000pro.txtpb", "NVIDIA RTX PRO 6000 Blackwell", 103079215104, (12, 0), 188, 128,
          1536, 131072, 101376, 134217728, 1792000000000, 2.6, (9, 1, 0)),
]}
# Names that mean two GPUs: the user picks.
_AMBIGUOUS = {"A100": ("A100-40GB", "A100-80GB", "A100-80GB-PCIe")}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def known_gpus() -> list[str]:
    """kfast's names of the GPUs it can plan for.

    Example:

    >>> "H100" in known_gpus() and "A100-40GB" in known_gpus()
    True
    """
    return list(GPUS)


def gpu_spec(name: str) -> GpuSpec:
    """The `GpuSpec` named `name`, matched without case, spaces, dashes or underscores (`"h100"`, `"A100 40GB"`).

    Raises:
        ValueError: for a name that is no known GPU, or one that means several (`"A100"`), listing the known ones.

    Example:

    >>> gpu_spec("a100_40gb").description
    'NVIDIA A100-SXM4-40GB'
    """
    by_key = {_key(n): spec for n, spec in GPUS.items()}
    spec = by_key.get(_key(str(name)))
    if spec is not None:
        return spec
    for short, names in _AMBIGUOUS.items():
        if _key(str(name)) == _key(short):
            raise ValueError(f"device={name!r} names several GPUs ({', '.join(names)}); pick one, e.g. "
                             f"device={names[0]!r}.")
    raise ValueError(f"device={name!r} is not a GPU kfast knows; known: {', '.join(GPUS)} (the GPUs XLA ships a "
                     "compile target for).")
