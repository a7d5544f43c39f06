"""What the installed Horovod was built with, read without starting it (for `kfast doctor` and the
launch preflight)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from typing import Any

from kfast.distributed import _horovod


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def horovod_build() -> dict[str, Any]:
    """Describes the installed Horovod without starting it.

    Returns:
        A dict with `installed` (bool), `version`, `built_for_tensorflow` (the TensorFlow version the
        binary was compiled against), `gloo`, `mpi`, `nccl`, `cuda` (bools) and `error` (why the
        TensorFlow extension cannot load, or None).
    """
    info: dict[str, Any] = {"installed": False, "version": None, "built_for_tensorflow": None, "gloo": None,
            "mpi": None, "nccl": None, "cuda": None, "error": None}
    spec = importlib.util.find_spec("horovod")
    if spec is None:
        info["error"] = "Horovod is not installed; install it with `bash scripts/install_horovod.sh` (see README)."
        return info
    info["installed"] = True
    try:
        info["version"] = importlib.metadata.version("horovod")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        with open(os.path.join(list(spec.submodule_search_locations or ())[0], "metadata.json")) as f:
            info["built_for_tensorflow"] = json.load(f).get("tensorflow")
    except (OSError, ValueError):
        pass
    try:
        hvd = _horovod.import_horovod()
        info.update(gloo=hvd.gloo_built(), mpi=hvd.mpi_built(), nccl=hvd.nccl_built(), cuda=hvd.cuda_built())
    except Exception as e:  # noqa: BLE001 - any failure to load the extension is reported, not raised
        info["error"] = f"{type(e).__name__}: {e}"
    return info
