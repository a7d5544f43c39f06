"""The JAX engine: Keras 3's own `keras.distribution` across JAX processes, behind kfast's lines.

It speaks only JAX: the router, `kfast.distributed.collectives`, calls `init()` here when Keras runs on JAX
(`kfast.distributed.init()`), and uses its collectives once the job has several processes. `init()` joins the
job's processes (`jax.distributed.initialize`, through `keras.distribution.initialize`, which also gives every
process one random seed), sets a `keras.distribution.DataParallel` over every process's devices, and makes this
engine's topology the current one. It imports only `kfast._core.topology` of kfast, and under Slurm the reader
of Slurm's count lists (`kfast.cluster.nodelist`).

NOTE [ One step for the whole job ]
Under Horovod each rank runs its own step on its own batch, and kfast averages the gradients and sums the
metric states across ranks. Here one compiled step runs over the whole job's batch: each process hands Keras
its part of every global batch (its FastLoader shard, `auto_shard_dataset=False`), Keras makes one global
array of the parts, and XLA averages the gradients over the global batch inside the step. So the gradients
and the metric states are the whole job's already; `DistributedOptimizer` exchanges nothing and
`MetricAverage` sums nothing (the topology says `one_step_for_all`). The host-side collectives below
(objects, values, a broadcast of variables) carry the rest: checkpoints, the preemption vote, resume.

Where the job comes from: `kfast launch` sets Keras's `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator),
`KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`, and `KFAST_LOCAL_RANK` /
`KFAST_LOCAL_SIZE`; under Slurm's `srun` JAX reads Slurm's own variables.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from kfast._core import topology

# Keras's variables (keras.distribution.initialize reads them) and kfast launch's own.
ADDRESS_VAR = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
COUNT_VAR = "KERAS_DISTRIBUTION_NUM_PROCESSES"
ID_VAR = "KERAS_DISTRIBUTION_PROCESS_ID"
LOCAL_RANK_VAR = "KFAST_LOCAL_RANK"
LOCAL_SIZE_VAR = "KFAST_LOCAL_SIZE"

_started = False


def launched() -> bool:
    """Whether this process is one of several JAX processes: started by `kfast launch` (Keras's variables) or
    as a task of a Slurm step of several tasks (`srun`)."""
    if int(os.environ.get(COUNT_VAR, "1") or 1) > 1:
        return True
    return "SLURM_STEP_ID" in os.environ and int(os.environ.get("SLURM_STEP_NUM_TASKS", "1") or 1) > 1


def _env_int(names: Sequence[str], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


class JaxTopology:
    """The JAX processes' rank and size (a `kfast._core.topology.Topology`); see NOTE [ One step for the whole
    job ] for `one_step_for_all`."""

    one_step_for_all = True

    def rank(self) -> int:
        import jax

        return int(jax.process_index())

    def size(self) -> int:
        import jax

        return int(jax.process_count())

    def local_rank(self) -> int:
        return _env_int((LOCAL_RANK_VAR, "SLURM_LOCALID"), 0)

    def local_size(self) -> int:
        if LOCAL_SIZE_VAR in os.environ:
            return _env_int((LOCAL_SIZE_VAR,), 1)
        # Under srun: the step's tasks on each node ("2(x3),1"), this node's by its index in the step.
        tasks = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
        if not tasks:
            return 1
        from kfast.cluster.nodelist import expand_counts  # Slurm's count lists, read where kfast reads them all

        return expand_counts(tasks)[_env_int(("SLURM_NODEID",), 0)]


def init() -> None:
    """Joins the JAX processes (when several were launched) and sets data parallelism over every device.

    One process with several devices trains data-parallel over them too (a batch split over the devices).
    Calling it again is harmless.

    Raises:
        RuntimeError: when the processes cannot join (the coordinator's address, count and id are named).
    """
    global _started
    if _started:
        return
    import jax
    import keras

    if launched():
        # Gloo carries the collectives of CPU devices between processes (the default has none); GPUs use NCCL.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        local = _env_int((LOCAL_RANK_VAR,), -1)
        if local >= 0 and _env_int((LOCAL_SIZE_VAR,), 1) > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
            jax.config.update("jax_cuda_visible_devices", str(local))  # one GPU per local rank
        try:
            keras.distribution.initialize()
        except Exception as e:  # noqa: BLE001 - JAX's errors here are RuntimeError, ValueError or XlaRuntimeError
            where = ", ".join(f"{k}={os.environ.get(k)!r}" for k in (ADDRESS_VAR, COUNT_VAR, ID_VAR))
            raise RuntimeError(f"kfast.distributed.init() could not join the JAX processes ({where}): {e}. Start "
                               "the script with `kfast launch -np N script.py`, or as the tasks of one srun.") from e
    if jax.device_count() > 1:
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False))
    several = jax.process_count() > 1 or jax.device_count() > 1
    topology.set_current(JaxTopology() if several else topology.SINGLE_PROCESS)
    _started = True


@contextlib.contextmanager
def saving_alone() -> Iterator[None]:
    """Lets one process save the model while the others go on: Keras's saving makes throw-away variables (an
    optimizer and metrics to compare attributes with), and under a distribution over several processes each new
    variable is placed by a collective that the other processes never join. Inside this, new variables are
    this process's own; the model's own are read, not moved."""
    import keras

    if not (_started and topology.size() > 1):
        yield
        return
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


def started() -> bool:
    """Whether `init()` ran in this process."""
    return _started


# NOTE [ Objects as bytes ]
# JAX's host collectives move arrays. An object travels pickled, as uint8. A broadcast sends two arrays from the
# root (`broadcast_one_to_all`, the root chosen by its flag): the length, as 8 bytes, then the bytes, which the
# others receive into zeros of that length; so each process receives one copy. An all-gather gathers the lengths
# first; each process pads its bytes to the longest, and each reads the others' up to their lengths. Floats travel
# as their bytes too, so float64 stays float64 (JAX's arrays are float32 unless x64 is on), in one all-gather of
# a known length.

# A test seam: when set, called with (the collective's name, the array handed to it, the array it returned) for
# every host collective of this module, e.g. to count the bytes a broadcast moves
# (tests/distributed/jax_collectives.py).
_observer: Callable[[str, Any, Any], None] | None = None


def _host_allgather(array: Any) -> Any:
    """Every process's `array` (the same shape on each), stacked along a new first axis in process order."""
    import numpy as np
    from jax.experimental import multihost_utils

    out = np.asarray(multihost_utils.process_allgather(array))
    if _observer is not None:
        _observer("process_allgather", array, out)
    return out


def _host_broadcast(array: Any, source: bool) -> Any:
    """The `array` of the process whose `source` is True, on every process (each hands one of that shape)."""
    import numpy as np
    from jax.experimental import multihost_utils

    out = np.asarray(multihost_utils.broadcast_one_to_all(array, is_source=source))
    if _observer is not None:
        _observer("broadcast_one_to_all", array, out)
    return out


def _broadcast_bytes(payload: bytes, source: bool) -> bytes:
    import numpy as np

    length = _host_broadcast(np.frombuffer(len(payload).to_bytes(8, "little"), np.uint8), source)
    size = int.from_bytes(length.tobytes(), "little")
    buffer = np.frombuffer(payload, np.uint8) if source else np.zeros(size, np.uint8)
    return bytes(_host_broadcast(buffer, source).tobytes())


def _gather_bytes(payload: bytes) -> list[bytes]:
    import numpy as np

    lengths = _host_allgather(np.array([len(payload)], dtype=np.int32)).reshape(-1)
    buffer = np.zeros(int(lengths.max()), np.uint8)
    buffer[:len(payload)] = np.frombuffer(payload, np.uint8)
    rows = _host_allgather(buffer).reshape(len(lengths), -1)
    return [rows[i, :n].tobytes() for i, n in enumerate(lengths)]


class JaxCollectives:
    """The host-side collectives between JAX processes (a `kfast.distributed.collectives.Collectives`; see
    NOTE [ Objects as bytes ])."""

    def allgather_object(self, obj: Any) -> list[Any]:
        return [pickle.loads(b) for b in _gather_bytes(pickle.dumps(obj))]

    def broadcast_object(self, obj: Any, root_rank: int) -> Any:
        import jax

        source = jax.process_index() == root_rank
        return pickle.loads(_broadcast_bytes(pickle.dumps(obj) if source else b"", source))

    def allreduce_sum_values(self, values: Sequence[float]) -> list[float]:
        import numpy as np

        mine = np.asarray(values, np.float64)
        if not mine.size:
            return []  # every process gives as many values, so every process skips the collective
        rows = _host_allgather(mine.view(np.uint8)).reshape(-1, mine.nbytes).view(np.float64)
        return [float(v) for v in np.sum(rows, axis=0)]

    def allreduce_mean_values(self, values: Sequence[float]) -> list[float]:
        import jax

        return [s / jax.process_count() for s in self.allreduce_sum_values(values)]

    def allreduce_max_ints(self, values: Sequence[int]) -> list[int]:
        import numpy as np

        mine = np.asarray(values, np.int32)
        if not mine.size:
            return []
        return [int(v) for v in _host_allgather(mine).reshape(-1, mine.size).max(axis=0)]

    def allreduce_average(self, tensors: Sequence[Any], name: str | None) -> list[Any]:
        # Outside a step (kfast.plan's link probe, a user's own call); inside one, XLA averages.
        import jax
        import numpy as np

        out = list(tensors)
        for i, t in enumerate(tensors):
            if t is not None:
                gathered = _host_allgather(np.asarray(t))
                out[i] = gathered.reshape(jax.process_count(), *np.shape(t)).mean(axis=0).astype(np.asarray(t).dtype)
        return out

    def broadcast_variables(self, variables: Iterable[Any], root_rank: int) -> None:
        # Nothing to send: a variable is one global array, and JAX places every value given to it (a
        # variable's creation, an assignment, a loaded checkpoint) only after checking that each process gave
        # the same; the steps that change it run the same program on every process.
        return None


def collectives() -> JaxCollectives:
    """The JAX processes' collectives, for the router (`kfast.distributed.collectives`) once `init()` ran."""
    return JaxCollectives()


def load_on_every_process(model: Any, path: str) -> None:
    """Loads rank 0's checkpoint `path` into `model` on every process (a weight's assignment is a collective
    here, so rank 0 cannot load alone): from the same file where a process sees rank 0's, else from a copy of
    rank 0's bytes (hosts without shared storage: only rank 0's disk has the checkpoints, or another disk has
    other files at that path)."""
    import hashlib
    import tempfile

    import jax

    def digest() -> str | None:
        if not os.path.isfile(path):
            return None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    collectives = JaxCollectives()
    mine = digest()
    digests = collectives.allgather_object(mine)
    if all(d == digests[0] for d in digests):
        model.load_weights(path)
        return
    payload = None
    if jax.process_index() == 0:
        with open(path, "rb") as source:
            payload = source.read()
    payload = collectives.broadcast_object(payload, root_rank=0)
    if mine == digests[0]:
        model.load_weights(path)
        return
    with tempfile.TemporaryDirectory(prefix="kfast-restore-") as copy_dir:
        copy = os.path.join(copy_dir, os.path.basename(path))  # the name's suffix tells Keras the format
        with open(copy, "wb") as target:
            target.write(payload)
        model.load_weights(copy)
