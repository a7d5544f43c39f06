"""Horovod for kfast: process topology and collectives. It imports nothing else of kfast.

This is the only kfast module that imports Horovod. Everything else asks it for `rank()`, `size()`,
`is_chief()` and calls its collectives, so the rest of kfast runs unchanged as a single process when
Horovod is absent or the script was not started by `horovodrun`.

kfast uses the collectives of `horovod.tensorflow` (allreduce, broadcast) directly: Horovod's own Keras
layer (`horovod.tensorflow.keras`) does not work with Keras 3.
"""

import os
import shutil
import sys
import warnings

_INSTALL_HINT = (
    "install Horovod built for your TensorFlow with `bash scripts/install_horovod.sh` "
    "(or `make test`, which runs it), see README"
)
_hvd = None  # horovod.tensorflow, once init() ran with Horovod present
_initialised = False


def _launched_by_horovodrun():
    return "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def horovodrun_path():
    """The `horovodrun` on PATH, else the one beside this Python (a virtualenv's bin/ that is not on PATH)."""
    return shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")


def import_horovod():
    """Returns `horovod.tensorflow`.

    Raises:
        ImportError: naming the install command, when Horovod (or its TensorFlow extension) cannot load.
    """
    return _import_horovod()


def _import_horovod():
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise ImportError(f"kfast.distributed needs Horovod with TensorFlow support ({e}); {_INSTALL_HINT}.") from e
    return hvd


def _keras_backend():
    import keras

    return keras.backend.backend()


def _backend_problem(backend):
    return (f"kfast.distributed trains data-parallel with Horovod's TensorFlow collectives, so it needs Keras's "
            f"TensorFlow backend, but this process runs Keras on {backend}. Set KERAS_BACKEND=tensorflow to scale "
            "out (with kfast[cpu] or kfast[gpu] and Horovod installed, see README)")


def init():
    """Starts Horovod and pins this process to the GPU of its local rank.

    Call it at the top of the training script, before building the model: pinning only works before
    TensorFlow touches the GPUs. Calling it again is harmless. Without `horovodrun` (or without Horovod
    installed, or with Keras on JAX or PyTorch, outside `horovodrun`) the process runs as rank 0 of 1,
    with a warning that says why.

    Raises:
        ImportError: when launched by `horovodrun` but Horovod cannot be imported.
        RuntimeError: when launched by `horovodrun` with Keras on a backend other than TensorFlow, when
            TensorFlow already initialised the GPUs, or when this host runs more processes than it has GPUs.

    Example:

    It sets up Horovod for the rest of the process, so the doctests do not run this line:

    >>> import kfast
    >>> kfast.distributed.init()  # doctest: +SKIP
    >>> kfast.distributed.rank(), kfast.distributed.size()
    (0, 1)
    """
    global _hvd, _initialised
    if _initialised:
        return
    backend = _keras_backend()
    if backend != "tensorflow":
        if _launched_by_horovodrun():
            raise RuntimeError(_backend_problem(backend) + ".")
        warnings.warn(_backend_problem(backend) + "; running as a single process.", stacklevel=2)
        _initialised = True
        return
    try:
        hvd = _import_horovod()
    except ImportError:
        if _launched_by_horovodrun():
            raise
        warnings.warn(f"Horovod is not installed; running as a single process. To scale out, {_INSTALL_HINT}.")
        _initialised = True
        return
    hvd.init()
    _pin_gpu(hvd.local_rank(), hvd.local_size())
    _hvd = hvd
    _initialised = True


def restart():
    """Shuts Horovod down and starts it again: how an elastic job re-forms its ring after ranks left or
    joined (rank and size may change). GPU pinning stays as `init()` left it."""
    if _hvd is not None:
        _hvd.shutdown()
        _hvd.init()


def elastic_api():
    """Horovod's elastic-training pieces, for `kfast.distributed.elastic`.

    Returns:
        `(notification_manager, HorovodInternalError, HostsUpdatedInterrupt, HostUpdateResult)`.
    """
    from horovod.common.elastic import notification_manager
    from horovod.common.exceptions import HorovodInternalError
    from horovod.common.exceptions import HostsUpdatedInterrupt
    from horovod.runner.elastic.worker import HostUpdateResult

    return notification_manager, HorovodInternalError, HostsUpdatedInterrupt, HostUpdateResult


def _pin_gpu(local_rank, local_size):
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    if local_size > len(gpus):
        raise RuntimeError(
            f"This host runs {local_size} kfast processes but has {len(gpus)} GPU(s); launch at most "
            f"{len(gpus)} per host (e.g. horovodrun -H host:{len(gpus)})."
        )
    gpu = gpus[local_rank]
    try:
        tf.config.set_visible_devices(gpu, "GPU")
        # Memory growth lets a second framework (or NVML tooling) share the card with this rank.
        tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as e:
        raise RuntimeError(
            "TensorFlow already initialised the GPUs, so this rank cannot be pinned to one; call "
            "kfast.distributed.init() at the top of the script, before building models or tensors."
        ) from e


def _require_init():
    if not _initialised and _launched_by_horovodrun():
        raise RuntimeError(
            "This process was started by horovodrun but kfast.distributed.init() was not called; call it "
            "at the top of the training script."
        )


def rank():
    """Returns this process's global rank (0 when not distributed)."""
    _require_init()
    return _hvd.rank() if _hvd else 0


def size():
    """Returns the number of processes in the job (1 when not distributed)."""
    _require_init()
    return _hvd.size() if _hvd else 1


def local_rank():
    """Returns this process's rank on its host (0 when not distributed)."""
    _require_init()
    return _hvd.local_rank() if _hvd else 0


def local_size():
    """Returns the number of processes on this host (1 when not distributed)."""
    _require_init()
    return _hvd.local_size() if _hvd else 1


def is_chief():
    """Returns True on rank 0, the process that prints, logs and writes checkpoints."""
    return rank() == 0


def allreduce_average(tensors, name=None):
    """Averages a list of tensors across ranks in one fused collective.

    Every rank must call it with tensors of the same shapes, in the same order. Without Horovod it
    returns the tensors unchanged.

    Args:
        tensors: list of tensors (or `None` entries, passed through).
        name: optional name prefix that identifies this collective across ranks.

    Returns:
        A list of averaged tensors, in the input's order.
    """
    if _hvd is None or _hvd.size() == 1:
        return list(tensors)
    present = [i for i, t in enumerate(tensors) if t is not None]
    reduced = _hvd.grouped_allreduce([tensors[i] for i in present], op=_hvd.Average, name=name)
    out = list(tensors)
    for i, t in zip(present, reduced):
        out[i] = t
    return out


def broadcast_variables(variables, root_rank=0):
    """Overwrites `variables` on every rank with root_rank's values.

    Works on Keras 3 variables (Horovod's own helper needs raw `tf.Variable`s and fails on them).

    Args:
        variables: iterable of Keras or TensorFlow variables, the same list on every rank.
        root_rank: the rank whose values win. Defaults to `0`.
    """
    if _hvd is None or _hvd.size() == 1:
        return
    for i, v in enumerate(variables):
        v.assign(_hvd.broadcast(v.value, root_rank, name=f"kfast.bcast.{i}"))


def broadcast_object(obj, root_rank=0):
    """Returns root_rank's `obj` on every rank (any picklable object)."""
    if _hvd is None or _hvd.size() == 1:
        return obj
    return _hvd.broadcast_object(obj, root_rank)


def allgather_object(obj):
    """Returns the list of every rank's `obj`, indexed by rank (any picklable object)."""
    if _hvd is None or _hvd.size() == 1:
        return [obj]
    return _hvd.allgather_object(obj)


def is_initialized():
    """Returns True once `init()` ran in this process."""
    return _initialised


def allreduce_mean_values(values):
    """Returns the element-wise mean over ranks of a list of Python floats (float64, exact order)."""
    if _hvd is None or _hvd.size() == 1:
        return [float(v) for v in values]
    import tensorflow as tf

    mean = _hvd.allreduce(tf.constant(values, dtype=tf.float64), op=_hvd.Average, name="kfast.values")
    return [float(v) for v in mean.numpy()]


def verbose(level="auto"):
    """Returns `level` on rank 0 and 0 elsewhere: `model.fit(..., verbose=kfast.distributed.verbose())`."""
    return level if is_chief() else 0
