"""Checkpoint files: atomic writes, training state beside the weights, and resuming every rank from them.

Each `epoch-NNNN.keras` is a normal Keras archive with one extra member, `kfast-state.json`: what the
callbacks need to carry on exactly after a restart (the single-rank base learning rate, the best value
seen so far, ...). It travels inside the same file as the weights it belongs to, so the two can never
disagree, and falling back to an older checkpoint falls back to its state too. The state carries a
format version (`"version"`): a checkpoint without one was written by an earlier kfast in the same
layout and is read as it is; one of a newer version is refused, naming the file, rather than read wrong.
"""

from __future__ import annotations

import json
import os
import re
import warnings
import weakref
import zipfile
from typing import TYPE_CHECKING
from typing import Any

from kfast.distributed import _horovod as distributed

if TYPE_CHECKING:
    import keras

_EPOCH_FILE = re.compile(r"^epoch-(\d{4,})\.keras$")
_STATE_MEMBER = "kfast-state.json"
# The layout of kfast-state.json this kfast writes; bump it when a key changes meaning.
STATE_VERSION = 1
# Per-model training state, filled by the callbacks and by restore(); keyed weakly, so it dies with the model.
_STATES: weakref.WeakKeyDictionary[keras.Model, dict[str, Any]] = weakref.WeakKeyDictionary()


class NewerCheckpointError(ValueError):
    """A checkpoint whose training state a newer kfast wrote, in a layout this one cannot read."""


def training_state(model: keras.Model) -> dict[str, Any]:
    """The dict of values that `RankZeroCheckpoint` saves with `model` and `restore()` loads back.

    Callbacks keep what must survive a restart here (under their own keys) rather than in attributes.
    """
    return _STATES.setdefault(model, {})


def epoch_path(directory: str | os.PathLike[str], epoch: int) -> str:
    """Path of the checkpoint written after `epoch` (counted from 1)."""
    return os.path.join(directory, f"epoch-{epoch:04d}.keras")


# Prefix of a checkpoint being written; a file with it is left only by a process killed mid-save.
_PARTIAL = ".tmp-"


def remove_partial(directory: str | os.PathLike[str]) -> list[str]:
    """Deletes what saves killed halfway left in `directory` (one job writes a checkpoint directory at a
    time, so no live save owns such a file when training begins). Returns the names removed."""
    removed: list[str] = []
    for name in sorted(os.listdir(directory)):
        if name.startswith(_PARTIAL):
            try:
                os.remove(os.path.join(directory, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


def save_atomic(model: keras.Model, path: str | os.PathLike[str]) -> None:
    """Saves `model` to `path` through a temporary file and a rename, so a crash never leaves half a file.

    The model's `training_state` goes into the archive too. A model compiled with
    `kfast.DistributedOptimizer` is saved with the wrapped optimizer in its place, so the file loads
    with plain `keras.saving.load_model` where kfast and Horovod are not installed.
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f"{_PARTIAL}{os.getpid()}-{name}")
    try:
        model.save(tmp)
        _finish_archive(tmp, training_state(model))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _finish_archive(archive: str, state: dict[str, Any]) -> None:
    with zipfile.ZipFile(archive) as z:
        entries = {info.filename: z.read(info) for info in z.infolist()}
    config = json.loads(entries["config.json"])
    optimizer = (config.get("compile_config") or {}).get("optimizer")
    if isinstance(optimizer, dict) and optimizer.get("registered_name") == "kfast>DistributedOptimizer":
        config["compile_config"]["optimizer"] = optimizer["config"]["optimizer"]
        entries["config.json"] = json.dumps(config).encode()
    entries[_STATE_MEMBER] = json.dumps({"version": STATE_VERSION, **state}).encode()
    with zipfile.ZipFile(archive, "w") as z:
        for filename, data in entries.items():
            z.writestr(filename, data)


def read_archive(path: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Checks that the checkpoint at `path` is whole and returns `(build_config, state)` from it.

    Raises:
        ValueError: naming the file, when it is truncated, corrupt or not a Keras archive.
    """
    try:
        with zipfile.ZipFile(path) as z:
            broken = z.testzip()  # reads every member: a truncated or corrupt file fails here, not mid-load
            if broken is not None:
                raise ValueError(f"member {broken} fails its checksum")
            config = json.loads(z.read("config.json"))
            names = set(z.namelist())
            state = json.loads(z.read(_STATE_MEMBER)) if _STATE_MEMBER in names else {}
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, EOFError) as e:
        raise ValueError(f"checkpoint {path} cannot be read ({type(e).__name__}: {e})") from e
    version = state.pop("version", 0)  # 0: written before states had a version, in the same layout
    if not isinstance(version, int) or version > STATE_VERSION:
        raise NewerCheckpointError(
            f"checkpoint {path} holds kfast training state of format version {version!r}, and this kfast reads "
            f"versions up to {STATE_VERSION}; resume it with the kfast that wrote it (or a newer one).")
    return config.get("build_config"), state


def list_epochs(directory: str | os.PathLike[str]) -> list[int]:
    """Returns the epochs (ascending) that have a checkpoint in `directory`."""
    if not os.path.isdir(directory):
        return []
    found = (_EPOCH_FILE.match(name) for name in os.listdir(directory))
    return sorted(int(m.group(1)) for m in found if m)


def _load_latest(model: keras.Model,
                 checkpoint_dir: str | os.PathLike[str]) -> tuple[int, dict[str, Any] | None, dict[str, Any]]:
    """On rank 0: loads the newest readable checkpoint. Returns (epoch, build_config, state)."""
    epochs = list_epochs(checkpoint_dir)
    for epoch in reversed(epochs):
        path = epoch_path(checkpoint_dir, epoch)
        try:
            build_config, state = read_archive(path)
        except NewerCheckpointError:
            raise  # not broken: skipping it would resume from an older epoch without saying why
        except ValueError as e:
            warnings.warn(f"kfast skipped {e}; resuming from the checkpoint before it instead.", stacklevel=3)
            continue
        _build(model, build_config, path)
        model.load_weights(path)
        return epoch, build_config, state
    if epochs:
        raise ValueError(f"No checkpoint in {checkpoint_dir} can be read (tried epochs {epochs}); delete the "
                         "broken files to start from scratch, or restore them from a backup.")
    return 0, None, {}


def _build(model: keras.Model, build_config: dict[str, Any] | None, path: str | os.PathLike[str]) -> None:
    # A model without an Input layer is built by its first batch; a checkpoint records the shapes it was
    # built with, so restore() can build it now and load the weights before fit() starts.
    if not model.built:
        if not build_config:
            raise ValueError(f"The model is not built and {path} records no input shape; call "
                             "model.build(input_shape) or start it with keras.Input before restore().")
        model.build_from_config(build_config)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def restore(model: keras.Model, checkpoint_dir: str | os.PathLike[str]) -> int:
    """Loads the latest checkpoint on rank 0 and gives every rank the same state.

    Call it after `model.compile(...)` and before `fit`. Rank 0 reads the newest readable
    `epoch-NNNN.keras` in `checkpoint_dir` (weights, optimizer state and kfast's training state, such as
    the base learning rate and the best value so far); an unreadable file is skipped with a warning in
    favour of the one before it. Every rank then receives rank 0's state and the epoch to go on from.
    A model without an `Input` layer is built from the shapes the checkpoint records.

    Args:
        model: the compiled model to restore into.
        checkpoint_dir: the directory `RankZeroCheckpoint` writes.

    Returns:
        The `initial_epoch` to pass to `fit`: 0 when there is no checkpoint.

    Raises:
        RuntimeError: when the model is not compiled.
        ValueError: when checkpoints exist but none can be read, or they do not fit the model.

    Example:

    >>> import keras, kfast
    >>> model = keras.Sequential([keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> kfast.distributed.restore(model, "no-checkpoints-here")
    0
    """
    if model.optimizer is None:
        raise RuntimeError("restore() needs a compiled model: call model.compile(...) first.")
    if model.built and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    found: tuple[int, dict[str, Any] | None, dict[str, Any]] = (0, None, {})
    error: Exception | None = None
    if distributed.is_chief():
        try:
            found = _load_latest(model, checkpoint_dir)
        except Exception as e:  # noqa: BLE001 - re-raised on every rank below, so no rank waits forever
            error = e
    # Every rank learns of rank 0's failure, so none is left waiting in a collective.
    found, message = distributed.broadcast_object((found, None if error is None else str(error)), root_rank=0)
    if error is not None:
        raise error
    if message is not None:
        raise ValueError(f"Rank 0 could not restore from {checkpoint_dir}: {message}")
    epoch, build_config, state = found
    if epoch:
        _build(model, build_config, checkpoint_dir)
        distributed.broadcast_variables(list(model.variables) + list(model.optimizer.variables), root_rank=0)
    training_state(model).clear()
    training_state(model).update(state)
    return epoch
