"""Checkpoint files: atomic writes, finding the latest, and resuming every rank from it."""

import json
import os
import re
import zipfile

from kfast import distributed

_EPOCH_FILE = re.compile(r"^epoch-(\d{4,})\.keras$")


def epoch_path(directory, epoch):
    """Path of the checkpoint written after `epoch` (counted from 1)."""
    return os.path.join(directory, f"epoch-{epoch:04d}.keras")


def save_atomic(model, path):
    """Saves `model` to `path` through a temporary file and a rename, so a crash never leaves half a file.

    A model compiled with `kfast.DistributedOptimizer` is saved with the wrapped optimizer in its place,
    so the file loads with plain `keras.saving.load_model` where kfast and Horovod are not installed.
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{name}")
    try:
        model.save(tmp)
        _unwrap_optimizer_config(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _unwrap_optimizer_config(archive):
    with zipfile.ZipFile(archive) as z:
        entries = {info.filename: z.read(info) for info in z.infolist()}
    config = json.loads(entries["config.json"])
    optimizer = (config.get("compile_config") or {}).get("optimizer")
    if not (isinstance(optimizer, dict) and optimizer.get("registered_name") == "kfast>DistributedOptimizer"):
        return
    config["compile_config"]["optimizer"] = optimizer["config"]["optimizer"]
    entries["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(archive, "w") as z:
        for filename, data in entries.items():
            z.writestr(filename, data)


def list_epochs(directory):
    """Returns the epochs (ascending) that have a checkpoint in `directory`."""
    if not os.path.isdir(directory):
        return []
    found = (_EPOCH_FILE.match(name) for name in os.listdir(directory))
    return sorted(int(m.group(1)) for m in found if m)


def restore(model, checkpoint_dir):
    """Loads the latest checkpoint on rank 0 and gives every rank the same state.

    Call it after `model.compile(...)` and before `fit`. Rank 0 reads the newest `epoch-NNNN.keras` in
    `checkpoint_dir` (weights and optimizer state); every rank then receives rank 0's state and the
    epoch to go on from.

    Args:
        model: the compiled model to restore into.
        checkpoint_dir: the directory `RankZeroCheckpoint` writes.

    Returns:
        The `initial_epoch` to pass to `fit`: 0 when there is no checkpoint.

    Example:

    >>> initial_epoch = kfast.distributed.restore(model, "ckpt")  # doctest: +SKIP
    >>> model.fit(loader, epochs=10, initial_epoch=initial_epoch)  # doctest: +SKIP
    """
    if model.optimizer is None:
        raise RuntimeError("restore() needs a compiled model: call model.compile(...) first.")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    epoch = 0
    if distributed.is_chief():
        epochs = list_epochs(checkpoint_dir)
        if epochs:
            epoch = epochs[-1]
            model.load_weights(epoch_path(checkpoint_dir, epoch))
    epoch = distributed.broadcast_object(epoch, root_rank=0)
    if epoch:
        distributed.broadcast_variables(list(model.variables) + list(model.optimizer.variables), root_rank=0)
    return epoch
