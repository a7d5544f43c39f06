"""Checkpoints: the training state saved with the weights, and resuming every rank from a directory.

Each checkpoint (`epoch-NNNN.keras`, or any name `RankZeroCheckpoint` is given) is a normal Keras file
with kfast's state inside it (the layout: `NOTE [ Where a checkpoint's state lives ]` in
`_checkpoint_files`): where training was (epoch and batch), the best value so far of the callback that
wrote it, and what the callbacks need to carry on exactly after a restart (the single-rank base learning
rate, ...). It travels inside the same file as the weights it belongs to, so the two can never disagree,
and falling back to an older checkpoint falls back to its state too.

The best value belongs to a directory, not to the model: `restore()` hands it to the `RankZeroCheckpoint`
of the directory it restored from (through `restore_point`), and a callback writing anywhere else starts
from its own `initial_value_threshold`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
import weakref
from typing import TYPE_CHECKING
from typing import Any

from kfast._core import fit_timing
from kfast.data import position as data_position
from kfast.data.position import EpochOrder
from kfast.distributed import _checkpoint_files as files
from kfast._core import topology
from kfast.distributed import collectives
from kfast.distributed._checkpoint_files import STATE_VERSION  # noqa: F401 - part of this module's API
from kfast.distributed._checkpoint_files import NewerCheckpointError
from kfast.distributed._checkpoint_files import Position
from kfast.distributed._checkpoint_files import epoch_path  # noqa: F401
from kfast.distributed._checkpoint_files import list_epochs  # noqa: F401
from kfast.distributed._checkpoint_files import read_archive  # noqa: F401
from kfast.distributed._checkpoint_files import remove_partial  # noqa: F401
from kfast.distributed._checkpoint_paths import checked_directory

if TYPE_CHECKING:
    import keras

# Per-model training state, filled by the callbacks and by restore(); keyed weakly, so it dies with the model.
_STATES: weakref.WeakKeyDictionary[keras.Model, dict[str, Any]] = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class RestorePoint:
    """What `restore()` last loaded into a model.

    Attributes:
        directory: the checkpoint directory, as `os.path.realpath` gives it.
        path: the file loaded.
        epoch: epochs finished when it was saved (what `restore()` returned).
        batch: batches of the next epoch trained as well; 0 for a save at an epoch's end.
        best: the directory's best so far, `{"monitor", "mode", "value"}`, or None.
        metrics: this rank's metric state inside the epoch (values of `model.metrics_variables`), when the
            checkpoint has it for this number of ranks; else None.
        loader: a weak reference to the FastLoader `restore(loader=...)` handed the data position to, or None.
        metrics_restored: whether a fit gave the epoch its metric state back already (once per restore).
    """

    directory: str
    path: str
    epoch: int
    batch: int
    best: dict[str, Any] | None
    metrics: list[Any] | None = None
    loader: weakref.ReferenceType[Any] | None = dataclasses.field(default=None, repr=False)
    metrics_restored: bool = False


_RESTORED: weakref.WeakKeyDictionary[keras.Model, RestorePoint] = weakref.WeakKeyDictionary()


def training_state(model: keras.Model) -> dict[str, Any]:
    """The dict of values that `RankZeroCheckpoint` saves with `model` and `restore()` loads back.

    Callbacks keep what must survive a restart here (under their own keys) rather than in attributes.
    """
    return _STATES.setdefault(model, {})


def restore_point(model: keras.Model) -> RestorePoint | None:
    """Where the last `restore()` took `model` from; None when it found no checkpoint or never ran.

    Example:

    >>> import os, keras, kfast
    >>> from kfast.distributed import checkpoint
    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> os.makedirs("ckpt")
    >>> checkpoint.save_atomic(model, "ckpt/epoch-0002.keras", position=checkpoint.Position(2))
    >>> kfast.distributed.restore(model, "ckpt")
    2
    >>> point = checkpoint.restore_point(model)
    >>> point.epoch, point.batch, os.path.basename(point.path)
    (2, 0, 'epoch-0002.keras')
    """
    return _RESTORED.get(model)


def save_atomic(model: keras.Model, path: str | os.PathLike[str], *, position: Position | None = None,
                best: dict[str, Any] | None = None, data: dict[str, Any] | None = None) -> None:
    """Saves `model` to `path` through a temporary file and a rename, so a crash never leaves half a file.

    A `.weights.h5` path gets the weights (with the optimizer's state), any other the whole model. The
    model's `training_state` goes in too, with `position` (how far training had gone) and `best` (the
    writing callback's best so far) and `data` (where the data stood) when given. A model compiled with `kfast.DistributedOptimizer` is saved
    with the wrapped optimizer in its place, so the file loads with plain `keras.saving.load_model` where
    kfast and Horovod are not installed.
    """
    state = {k: v for k, v in training_state(model).items() if k not in files.RESERVED}
    if position is not None:
        state["position"] = {"epoch": position.epoch, "batch": position.batch}
    if best is not None:
        state["best"] = best
    if data is not None:
        state["data"] = data
    files.write(model, path, state)


# What rank 0 read: (position, build_config, training state, best, path, data).
_Found = tuple[Position, dict[str, Any] | None, dict[str, Any], dict[str, Any] | None, str, dict[str, Any] | None]


def _load_latest(model: keras.Model, checkpoint_dir: str, load: bool = True) -> _Found | None:
    """On rank 0: loads the newest readable checkpoint. Returns (position, build_config, training state,
    best, path, data), or None when there is none. With `load=False` it only picks the file."""
    found, errors = files.find(checkpoint_dir)
    for e in errors:
        warnings.warn(f"kfast skipped {e}; its place among the checkpoints is unknown.", stacklevel=3)
    for _, name in found:
        path = os.path.join(checkpoint_dir, name)
        try:
            build_config, state = files.read_archive(path)
        except NewerCheckpointError:
            raise  # not broken: skipping it would resume from an older epoch without saying why
        except ValueError as e:
            warnings.warn(f"kfast skipped {e}; resuming from the checkpoint before it instead.", stacklevel=3)
            continue
        position, best, training = files.split_state(state, name)
        if load:
            _build(model, build_config, path)
            model.load_weights(path)
        # The best file describes the best model itself: after a fallback it may be newer than `path`.
        data = state.get("data") if isinstance(state.get("data"), dict) else None
        return position or Position(0), build_config, training, files.best_record(checkpoint_dir) or best, path, data
    if found:
        raise ValueError(
            f"No checkpoint in {checkpoint_dir} can be read (tried epochs {sorted(p.epoch for p, _ in found)}, in "
            f"{', '.join(sorted(n for _, n in found))}); delete the broken files to start from scratch, or restore "
            "them from a backup.")
    return None


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


def restore(model: keras.Model, checkpoint_dir: str | os.PathLike[str], *, loader: Any = None) -> int:
    """Loads the latest checkpoint on rank 0 and gives every rank the same state.

    Call it after `model.compile(...)` and before `fit`. Rank 0 reads the newest readable checkpoint in
    `checkpoint_dir`, whatever names `RankZeroCheckpoint` gave its files (`.keras`: weights, optimizer
    state and kfast's training state, such as the base learning rate; `.weights.h5`: the same but the
    model's configuration); an unreadable file is skipped with a warning in favour of the one before it.
    Every rank then receives rank 0's state and the epoch to go on from, and the directory's best value
    so far goes to the `RankZeroCheckpoint` writing that same directory (none other). A model without an
    `Input` layer is built from the shapes the checkpoint records.

    Where the data stood goes on too, when training read a `kfast.data.FastLoader` that the checkpoints
    recorded (`RankZeroCheckpoint(loader=...)`) and that is handed back here (`loader=`): its
    `load_state_dict` takes the recorded position, so the next `fit` (with `initial_epoch` set to what this
    returns) continues the epoch in progress with only its remaining batches, in the order the
    uninterrupted run would have used, on the same number of ranks or another (the rest of the epoch is
    dealt over the new ranks), then goes on with the next epochs in their recorded order; the learning-rate
    warm-up, the epoch's logs and `best.keras` go on as if training had not stopped. Without `loader=`, or
    with other data (arrays, `tf.data`, a plain `PyDataset`), a checkpoint saved inside an epoch makes
    `fit` run that epoch again from its first batch, with a warning. The epoch and batch are in
    `kfast.distributed.checkpoint.restore_point(model)`; see the "Preemption and resume" guide.

    Args:
        model: the compiled model to restore into.
        checkpoint_dir: the directory `RankZeroCheckpoint` writes.
        loader: the `kfast.data.FastLoader` to train on, which goes on where the checkpoint's data stood.
            Defaults to `None`.

    Returns:
        The `initial_epoch` to pass to `fit`: 0 when there is no checkpoint.

    Raises:
        RuntimeError: when the model is not compiled.
        ValueError: for a `checkpoint_dir` that is not a directory path, or a `model` that is not a Keras
            model; when checkpoints exist but none can be read, or they do not fit the model.

    Example:

    >>> import keras, kfast
    >>> model = keras.Sequential([keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> kfast.distributed.restore(model, "no-checkpoints-here")
    0
    """
    import keras

    if not isinstance(model, keras.Model):
        raise ValueError(f"restore() got model={model!r} ({type(model).__name__}); it must be the compiled "
                         "keras.Model to load into, as in restore(model, 'checkpoints').")
    directory = checked_directory("restore()", "checkpoint_dir", checkpoint_dir, "restore(model, 'checkpoints')")
    if os.path.isfile(directory):
        raise ValueError(f"restore() got checkpoint_dir={directory!r}, which is a file; pass the directory that "
                         "holds the checkpoints (restore() picks the newest in it).")
    if model.optimizer is None:
        raise RuntimeError("restore() needs a compiled model: call model.compile(...) first.")
    if loader is not None and not callable(getattr(loader, "load_state_dict", None)):
        raise ValueError(f"restore() got loader={type(loader).__name__}; pass the kfast.data.FastLoader that fit "
                         "will train on (the one RankZeroCheckpoint(loader=...) recorded), or leave loader out.")
    from kfast.distributed.optimizer import unwrap_for_saving

    unwrap_for_saving(model)  # the user's own model.save then writes a file plain Keras opens, as checkpoints are
    if model.built and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    found: _Found | None = None
    error: Exception | None = None
    # NOTE [ Every JAX process loads the file ]: on the JAX engine a weight's assignment is a collective of
    # every process (JAX checks that they all give the same value), so rank 0 cannot load alone; it picks
    # the file, and each process loads it (`collectives.load_on_every_process`: from its own disk, or rank 0's
    # bytes).
    together = topology.one_step_for_all() and collectives.size() > 1
    if collectives.is_chief():
        try:
            found = _load_latest(model, directory, load=not together)
        except Exception as e:  # noqa: BLE001 - re-raised on every rank below, so no rank waits forever
            error = e
    # Every rank learns of rank 0's failure, so none is left waiting in a collective.
    found, message = collectives.broadcast_object((found, None if error is None else str(error)), root_rank=0)
    if error is not None:
        raise error
    if message is not None:
        raise ValueError(f"Rank 0 could not restore from {directory}: {message}")
    training_state(model).clear()
    _RESTORED.pop(model, None)
    if found is None:
        return 0
    position, build_config, state, best, path, data = found
    _build(model, build_config, directory)
    if together:
        collectives.load_on_every_process(model, path)
    else:
        collectives.broadcast_variables(list(model.variables) + list(model.optimizer.variables), root_rank=0)
    training_state(model).update(state)
    position, metrics, order = _data_position(position, data)
    taken = None
    if order is not None and loader is not None:
        loader.load_state_dict(data_position.state_of(order, 0))
        taken = weakref.ref(loader)
        if position.batch:
            # The resumed epoch's metric state needs the compiled metrics built, which Keras does at the first
            # step (or, on JAX, from a first look at the data that would take the resumed epoch's first batch).
            fit_timing.build_from_batch(model, loader[0], "kfast.distributed.restore", metrics=True)
    elif position.batch and collectives.is_chief():
        warnings.warn(
            f"kfast restored {path}, saved {position.batch} batch(es) into epoch {position.epoch + 1}, but "
            + ("no loader= was given to go on where its data stood" if order is not None else
               "it records no data position (its RankZeroCheckpoint had no loader=)")
            + f": epoch {position.epoch + 1} runs again from its first batch. Pass the kfast.data.FastLoader to both, "
            "RankZeroCheckpoint(..., loader=loader) and restore(model, directory, loader=loader), to resume inside "
            "the epoch.", stacklevel=2)
    _RESTORED[model] = RestorePoint(os.path.realpath(directory), path, position.epoch, position.batch, best, metrics,
                                    taken)
    return position.epoch


def load_model(filepath: str | os.PathLike[str], *, compression: str | None = None, backward_passes_per_step: int = 1,
               custom_objects: dict[str, Any] | None = None) -> keras.Model:
    """Opens a saved model with its optimizer wrapped in `kfast.DistributedOptimizer`, its state kept.

    Horovod's `hvd.load_model`, for Keras 3: for a model trained in one process with plain Keras (or with
    kfast; the files are the same) that goes on training on many ranks. The file loads with
    `keras.saving.load_model`; its optimizer (say `Adam`, with its moments and `iterations`) becomes the
    wrapped optimizer, and the model is compiled again with the file's loss, metrics and other compile
    settings. Add `kfast.callbacks.BroadcastState` (or `default_callbacks`) to `fit` so every rank starts from
    the same state. To resume from a checkpoint directory, with kfast's training state (epoch, best value,
    data position), compile the model yourself and call `restore()` instead; it reads plain Keras files too
    (named `epoch-NNNN.keras`, as `keras.callbacks.ModelCheckpoint("dir/epoch-{epoch:04d}.keras")` writes them).

    Args:
        filepath: a `.keras` file.
        compression: passed to `DistributedOptimizer`. Defaults to `None`.
        backward_passes_per_step: passed to `DistributedOptimizer`. Defaults to `1`.
        custom_objects: passed to `keras.saving.load_model`. Defaults to `None`.

    Returns:
        The model, compiled with `DistributedOptimizer(<the file's optimizer>)`.

    Raises:
        ValueError: for a file saved without an optimizer (an uncompiled model, or `include_optimizer`
            left out).

    Example:

    >>> import keras, numpy as np
    >>> from kfast.distributed import checkpoint
    >>> plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> plain.compile(keras.optimizers.Adam(0.01), "mse")
    >>> _ = plain.fit(np.ones((8, 2)), np.ones(8), batch_size=4, verbose=0)
    >>> plain.save("plain.keras")
    >>> model = checkpoint.load_model("plain.keras")
    >>> type(model.optimizer).__name__, type(model.optimizer.inner_optimizer).__name__
    ('DistributedOptimizer', 'Adam')
    >>> int(model.optimizer.iterations)  # Adam's state goes on
    2
    """
    import keras

    from kfast.distributed.optimizer import DistributedOptimizer
    from kfast.distributed.optimizer import unwrap_for_saving

    model = keras.saving.load_model(filepath, custom_objects=custom_objects)
    settings = model.get_compile_config() if getattr(model, "optimizer", None) is not None else {}
    if not settings.get("optimizer"):
        raise ValueError(f"load_model() got {os.fspath(filepath)!r}, which holds no optimizer (it was saved before "
                         "model.compile); load it with keras.saving.load_model and compile it with "
                         "kfast.DistributedOptimizer(...).")
    optimizer = model.optimizer
    while isinstance(optimizer, (DistributedOptimizer, keras.optimizers.LossScaleOptimizer)):
        # A file saved before kfast wrote plain optimizers names the wrapper; mixed precision adds Keras's
        # loss scaling, which compile() adds again.
        optimizer = optimizer.inner_optimizer
    settings.pop("optimizer")
    with keras.saving.custom_object_scope(custom_objects or {}):
        settings = keras.saving.deserialize_keras_object(settings)
    model.compile(optimizer=DistributedOptimizer(optimizer, compression=compression,
                                                 backward_passes_per_step=backward_passes_per_step), **settings)
    unwrap_for_saving(model)
    return model


def epoch_offset(model: keras.Model) -> int:
    """Batches of the epoch `model` is training that were trained before `restore()` (inside a resumed epoch,
    read from the loader `restore(loader=...)` handed the position to); else 0."""
    point = _RESTORED.get(model)
    loader = point.loader() if point is not None and point.loader is not None else None
    return loader.epoch_offset if loader is not None else 0


def _data_position(position: Position, data: dict[str, Any] | None
                   ) -> tuple[Position, list[Any] | None, EpochOrder | None]:
    """The position to resume at, this rank's metric state (None when there is none for this number of ranks)
    and the recorded data order (None when the checkpoint has none): the loader's `state_dict()` form under
    "loader", or, in checkpoints written before it, an `EpochOrder` under "order"."""
    recorded = (data or {}).get("loader")
    if recorded is not None:
        order: EpochOrder | None = data_position.order_of(recorded, 0, int(recorded.get("size", 1)),
                                                          owner="kfast.distributed.restore")
    else:
        order = EpochOrder.from_dict((data or {}).get("order"))
    if order is None:
        return position, None, None
    if position.batch and not order.remaining(0, collectives.size()):
        # Fewer batches left than ranks now: the epoch is over for them, and the next begins.
        order, position = dataclasses.replace(order, epoch=order.epoch + 1, done=0), Position(position.epoch + 1)
    metrics = (data or {}).get("metrics")
    mine = metrics[collectives.rank()] if (position.batch and isinstance(metrics, list)
                                           and len(metrics) == collectives.size()) else None
    return position, mine, order
