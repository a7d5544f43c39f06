"""`kfast doctor`: one report on everything kfast depends on, for a bug report or a first look.

Each check records what it found; each problem carries its fix and a severity. An "error" means a
required piece is broken (the CLI then exits non-zero); a "warning" means something optional is missing.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

from kfast import nvml
from kfast._core.cpus import usable_cpus
from kfast.env.horovod_build import _dist_version
from kfast.env.horovod_build import horovod_build


# What kfast offers on every Keras backend; kfast.distributed needs TensorFlow's (Horovod's TensorFlow collectives)
# or JAX's (Keras's own distribution).
EVERY_BACKEND = ("FastLoader", "ArrayDataset", "diagnose", "tune", "AutoTune", "ThroughputMonitor", "GPUMonitor")
_FRAMEWORKS = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}
_GPU_BUILDS = {
    "tensorflow": "install the GPU build: pip install 'kfast[gpu]' (tensorflow[and-cuda]) and remove tensorflow-cpu",
    "jax": "install JAX's CUDA build for the driver: pip install 'jax[cuda13]' (or 'jax[cuda12]')",
    "torch": "install a CUDA build of PyTorch (PyPI's default Linux wheel is one)",
}


def _problem(report: dict[str, Any], severity: str, problem: str, fix: str) -> None:
    report["problems"].append({"severity": severity, "problem": problem, "fix": fix})


def _check_keras(report: dict[str, Any]) -> str | None:
    try:
        import keras
    except Exception as e:  # noqa: BLE001 - a broken install is what doctor reports
        report["keras"] = {"version": None, "backend": None, "error": f"{type(e).__name__}: {e}"}
        _problem(report, "error", f"keras cannot be imported ({e}).", "pip install 'keras>=3'")
        return None
    backend = keras.backend.backend()
    report["keras"] = {"version": keras.__version__, "backend": backend, "error": None}
    if not keras.__version__.startswith("3."):
        _problem(report, "error", f"keras {keras.__version__} is installed; kfast needs Keras 3.",
                 "pip install 'keras>=3,<4'")
    return backend


def _check_tensorflow(report: dict[str, Any], backend: str | None) -> str | None:
    try:
        import tensorflow as tf
    except Exception as e:  # noqa: BLE001
        report["tensorflow"] = {"version": None, "gpus": None, "error": f"{type(e).__name__}: {e}"}
        if backend == "tensorflow":  # elsewhere _check_backend says what TensorFlow would add
            _problem(report, "error", f"TensorFlow cannot be imported ({e}); Keras is set to use it.",
                     "pip install 'kfast[cpu]' on a CPU machine or 'kfast[gpu]' on a GPU machine")
        return None
    gpus = len(tf.config.list_physical_devices("GPU"))
    report["tensorflow"] = {"version": tf.__version__, "gpus": gpus, "error": None}
    return tf.__version__


def _backend_gpus(backend: str) -> int | None:
    """The number of GPUs JAX or PyTorch can use, or None when that cannot be told."""
    try:
        if backend == "jax":
            import jax

            return sum(device.platform == "gpu" for device in jax.devices())
        if backend == "torch":
            import torch

            return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - a framework that fails here is reported as "unknown"
        return None
    return None


def _check_backend(report: dict[str, Any], backend: str, tf_version: str | None) -> None:
    """Records what kfast can do on Keras's backend, and the GPUs a JAX or PyTorch backend sees."""
    distributed = backend == "tensorflow" and tf_version is not None or backend == "jax"
    report["keras"]["works"] = list(EVERY_BACKEND) + (["kfast.distributed"] if distributed else [])
    report["keras"]["gpus"] = None
    if backend in (None, "tensorflow"):
        return
    report["keras"]["gpus"] = _backend_gpus(backend)
    if backend == "jax":
        return  # kfast.distributed's JAX engine: Keras's own distribution (kfast/distributed/_jax.py)
    _problem(report, "warning",
             f"Keras runs on {_FRAMEWORKS.get(backend, backend)}: kfast's loaders, diagnose, tune and monitors work "
             "here, but kfast.distributed needs Keras's TensorFlow backend (Horovod) or its JAX backend"
             + ("" if tf_version else ", and keras.callbacks.TensorBoard needs TensorFlow installed") + ".",
             "to train on several processes, set KERAS_BACKEND=jax, or KERAS_BACKEND=tensorflow with kfast[cpu] or "
             "kfast[gpu] and Horovod (bash scripts/install_horovod.sh) installed")


def _check_tensorboard(report: dict[str, Any], tf_version: str | None, backend: str | None = "tensorflow") -> None:
    version = _dist_version("tensorboard")
    report["tensorboard"] = {"version": version}
    if tf_version is None and backend != "tensorflow":
        return  # without TensorFlow, TensorBoard alone does not help Keras (_check_backend says so)
    # TensorBoard releases follow TensorFlow's: 2.21.x goes with TensorFlow 2.21.
    want = ".".join(tf_version.split(".")[:2]) if tf_version else None
    pin = f"'tensorboard=={want}.*'" if want else "tensorboard"
    if version is None:
        _problem(report, "warning", "TensorBoard is not installed: keras.callbacks.TensorBoard fails and the recipes "
                 "write no TensorBoard logs.", f"pip install {pin}")
    elif want and not version.startswith(want + "."):
        _problem(report, "warning", f"TensorBoard {version} is installed for TensorFlow {tf_version}; they are "
                 "released together and should match.", f"pip install {pin}")


def _check_horovod(report: dict[str, Any], tf_version: str | None, backend: str | None = "tensorflow") -> None:
    info = horovod_build()
    info["tensorflow_matches"] = None
    if info["built_for_tensorflow"] and tf_version:
        info["tensorflow_matches"] = info["built_for_tensorflow"] == tf_version
    report["horovod"] = info
    if not info["installed"] and backend != "tensorflow":
        return  # kfast.distributed needs the TensorFlow backend first (_check_backend says so)
    if not info["installed"]:
        _problem(report, "warning", "Horovod is not installed: training runs on one process only.",
                 "bash scripts/install_horovod.sh (builds Horovod 0.28.1 for the installed TensorFlow)")
    elif info["tensorflow_matches"] is False:
        _problem(report, "error",
                 f"Horovod was built for TensorFlow {info['built_for_tensorflow']} but {tf_version} is "
                 "installed; its ops will not load.",
                 "rebuild it: bash scripts/install_horovod.sh")
    elif info["error"]:
        _problem(report, "error", f"Horovod is installed but its TensorFlow extension fails: {info['error']}",
                 "rebuild it: bash scripts/install_horovod.sh")
    elif not (info["gloo"] or info["mpi"]):
        _problem(report, "error", "Horovod was built without Gloo or MPI, so horovodrun cannot start jobs.",
                 "rebuild it: bash scripts/install_horovod.sh")


def _check_gpus(report: dict[str, Any]) -> None:
    report["nvidia_ml_py"] = {"version": _dist_version("nvidia-ml-py"), "driver": None}
    try:
        report["nvidia_ml_py"]["driver"] = nvml.driver_version()
        report["gpus"] = nvml.list_gpus()
        report["gpus_reason"] = None if report["gpus"] else "NVML found no GPU."
    except nvml.NvmlUnavailable as e:
        report["gpus"] = []
        report["gpus_reason"] = str(e)
    keras = report.get("keras") or {}
    backend = keras.get("backend")
    seen = (report.get("tensorflow") or {}).get("gpus") if backend == "tensorflow" else keras.get("gpus")
    if report["gpus"] and seen == 0 and backend in _GPU_BUILDS:
        _problem(report, "warning", f"NVML sees {len(report['gpus'])} GPU(s) but {_FRAMEWORKS[backend]} sees none, "
                 "so training runs on CPU.", _GPU_BUILDS[backend])


def _check_gpu_planning(report: dict[str, Any]) -> None:
    """Whether `kfast plan --device H100` can compile for a GPU here (a small compile in a JAX process)."""
    from kfast.planning import deviceless

    problem = deviceless.probe()
    report["plan_gpu"] = {"works": problem is None, "problem": problem}
    if problem is not None:
        _problem(report, "warning", f"kfast plan --device (memory compiled for a named GPU) does not work here: "
                 f"{problem}", f"{deviceless.INSTALL}; or plan with method='analytical'")


def _check_platform(report: dict[str, Any], system: str = sys.platform) -> None:
    if system != "linux":
        _problem(report, "error", f"kfast runs on Linux only (its worker processes start from a fork server, use "
                 f"/dev/shm and CPU affinity); this is {system}.", "run kfast on Linux, or in a Linux container")


def collect() -> dict[str, Any]:
    """Runs every check.

    Returns:
        A JSON-serialisable dict: `kfast`, `python`, `platform`, `keras` (with `backend`, the GPUs a JAX or
        PyTorch backend sees as `gpus`, and what kfast offers there as `works`), `tensorflow`, `tensorboard`,
        `horovod`, `nvidia_ml_py`, `cpus`, `gpus`, `gpus_reason`, `plan_gpu` (whether memory planning for a
        named GPU works here, with the problem when not) and `problems` (each with `severity`,
        `problem` and `fix`).

    Example:

    >>> import kfast.env.doctor
    >>> report = kfast.env.doctor.collect()
    >>> all({"severity", "problem", "fix"} <= set(p) for p in report["problems"])
    True
    """
    from kfast._version import __version__

    report: dict[str, Any] = {
        "kfast": __version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "cpus": {"total": os.cpu_count(),
                 "usable": usable_cpus()},
        "problems": [],
    }
    _check_platform(report)
    backend = _check_keras(report)
    tf_version = _check_tensorflow(report, backend)
    if backend is not None:
        _check_backend(report, backend, tf_version)
    _check_tensorboard(report, tf_version, backend)
    _check_horovod(report, tf_version, backend)
    _check_gpus(report)
    _check_gpu_planning(report)
    return report


def check_hosts(report: dict[str, Any], names: Sequence[str], engine: str = "horovod") -> None:
    """Adds to `report` the checks `kfast launch` runs on hosts `names` before starting a job of `engine`
    (`"horovod"` or `"jax"`).

    Stores `kfast.env.preflight.check`'s result under `hosts`; each problem it finds is an error.
    """
    from kfast.env import preflight

    result = preflight.check(names, engine=engine)
    report["hosts"] = result
    for p in result["problems"]:
        _problem(report, "error", f"{p['host']}: {p['problem']}.", p["fix"])


def has_errors(report: dict[str, Any]) -> bool:
    return any(p["severity"] == "error" for p in report["problems"])


def _or(value: object, missing: str = "not installed") -> object:
    return missing if value is None else value


def format_report(report: dict[str, Any]) -> str:
    """Returns the report as aligned text lines for a terminal."""
    tf = report["tensorflow"]
    keras = report["keras"]
    hvd = report["horovod"]
    nv = report["nvidia_ml_py"]
    lines = [f"kfast {report['kfast']} doctor", ""]
    rows = [("python", f"{report['python']['version']} ({report['python']['executable']})"),
            ("platform", report["platform"]),
            ("keras", f"{_or(keras['version'])}, backend {_or(keras['backend'], 'unknown')}"
                      + (f", which sees {keras['gpus']} GPU(s)" if keras.get("gpus") is not None else "")),
            ("tensorflow", f"{_or(tf['version'])}" + (f", sees {tf['gpus']} GPU(s)" if tf["version"] else "")),
            ("tensorboard", _or(report["tensorboard"]["version"]))]
    if keras.get("works"):
        rows.insert(3, ("works here", ", ".join(keras["works"]) + (
            "" if "kfast.distributed" in keras["works"] else "; not kfast.distributed (needs Keras on TensorFlow or JAX)")))
    if hvd["installed"]:
        built = [name for name in ("gloo", "mpi", "nccl", "cuda") if hvd[name]]
        match = {True: "matches", False: "MISMATCH", None: "unknown"}[hvd["tensorflow_matches"]]
        rows.append(("horovod", f"{_or(hvd['version'], 'broken')}, built with {', '.join(built) or 'nothing'}; "
                                f"built for TensorFlow {_or(hvd['built_for_tensorflow'], '?')} ({match})"))
    else:
        rows.append(("horovod", "not installed"))
    rows.append(("nvidia-ml-py", f"{_or(nv['version'])}, driver {_or(nv['driver'], 'unavailable')}"))
    rows.append(("cpus", f"{report['cpus']['usable']} usable of {report['cpus']['total']}"))
    if "plan_gpu" in report:
        rows.append(("plan --device", "works (compiles for a named GPU without one)" if report["plan_gpu"]["works"]
                     else "does not work here (see Problems)"))
    if report["gpus"]:
        for gpu in report["gpus"]:
            rows.append((f"gpu {gpu['index']}", f"{gpu['name']}, {gpu['memory_used_mib']}/"
                                                f"{gpu['memory_total_mib']} MiB used, {gpu['utilization_percent']}% busy"))
    else:
        rows.append(("gpus", f"none visible: {report['gpus_reason']}"))
    lines += [f"  {name:<13} {value}" for name, value in rows]
    lines.append("")
    if "hosts" in report:
        from kfast.env import preflight

        hosts = report["hosts"]
        lines.append(f"Hosts (checked from {hosts['this_host']} over ssh, working directory {hosts['directory']}):")
        lines += [f"  {line}" for line in preflight.host_lines(hosts) + hosts["notes"]]
        lines.append("")
    if report["problems"]:
        lines.append("Problems:")
        for p in report["problems"]:
            lines.append(f"  [{p['severity']}] {p['problem']}")
            lines.append(f"      fix: {p['fix']}")
    else:
        lines.append("No problems found.")
    return "\n".join(lines)
