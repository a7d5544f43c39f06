"""Checkpoint files: kfast's state inside `.keras` and `.weights.h5` files, atomic writes, and finding a
directory's checkpoints, newest first.

NOTE [ Where a checkpoint's state lives ]
A `.keras` file is a zip archive: kfast adds the member `kfast-state.json`. A `.weights.h5` file is HDF5:
kfast adds two attributes to its root group, `kfast-state` (the same JSON) and `kfast-build-config` (the
input shapes, which a `.keras` archive keeps in its config.json); HDF5 keeps attributes up to 64 KiB,
and the state is a few hundred bytes. Keras reads neither addition, so both files load with plain Keras.
The state is one JSON object:

    {"version": 2, "position": {"epoch": 3, "batch": 0},
     "best": {"monitor": "val_loss", "mode": "min", "value": 0.31},
     "data": {"loader": {...}, "metrics": [[...], ...]}, ...the model's training state...}

`position` is how far training had gone when the file was written: epochs finished, and batches of the
next epoch trained (0 at an epoch's end). `best` is the best value so far of the RankZeroCheckpoint that
wrote the file, for that file's directory. `data` (when training read a FastLoader) is where the data
stood, in `FastLoader.state_dict()`'s versioned form with every rank's seed (what `restore` hands to
`load_state_dict`; files written before it hold `"order"`, a `kfast.data.position.EpochOrder`, still read), and
inside an epoch each rank's metric state (the values of `model.metrics_variables`), so that the epoch's
logs come out as if it had not stopped. Every other key is `checkpoint.training_state(model)`.
Version 1 had no `position` (it comes from the `epoch-NNNN.keras` name) and kept `best` in the model's
training state; version 0 is version 1 without the `version` key. Both are still read. A newer version
is refused, naming the file, rather than read wrong.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import zipfile
from typing import TYPE_CHECKING
from typing import Any

from kfast.distributed import collectives
from kfast.distributed._checkpoint_paths import MODEL_SUFFIX
from kfast.distributed._checkpoint_paths import WEIGHTS_SUFFIX

if TYPE_CHECKING:
    import keras

_EPOCH_FILE = re.compile(r"^epoch-(\d{4,})\.keras$")
_STATE_MEMBER = "kfast-state.json"
_STATE_ATTR = "kfast-state"
_BUILD_ATTR = "kfast-build-config"
# The layout of a checkpoint's kfast state that this kfast writes; bump it when a key changes meaning.
STATE_VERSION = 2
# Keys of the state that belong to the file, not to the model's training state.
RESERVED = ("version", "position", "best", "data")
BEST_NAMES = ("best" + MODEL_SUFFIX, "best" + WEIGHTS_SUFFIX)
# Prefix of a checkpoint being written; a file with it is left only by a process killed mid-save.
_PARTIAL = ".tmp-"
_READ_ERRORS = (OSError, zipfile.BadZipFile, KeyError, ValueError, EOFError)


class NewerCheckpointError(ValueError):
    """A checkpoint whose training state a newer kfast wrote, in a layout this one cannot read."""


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    """How far training had gone at a save: `epoch` epochs finished, then `batch` batches of the next."""

    epoch: int
    batch: int = 0


def epoch_path(directory: str | os.PathLike[str], epoch: int) -> str:
    """Path of the checkpoint written after `epoch` (counted from 1) under the default names."""
    return os.path.join(directory, f"epoch-{epoch:04d}.keras")


def list_epochs(directory: str | os.PathLike[str]) -> list[int]:
    """Returns the epochs (ascending) that have a checkpoint under the default names in `directory`."""
    if not os.path.isdir(directory):
        return []
    found = (_EPOCH_FILE.match(name) for name in os.listdir(directory))
    return sorted(int(m.group(1)) for m in found if m)


def remove_partial(directory: str | os.PathLike[str], pid: int | None = None) -> list[str]:
    """Deletes what saves killed halfway left in `directory` (one job writes a checkpoint directory at a
    time, so no live save owns such a file when training begins), or only process `pid`'s. Returns the
    names removed."""
    removed: list[str] = []
    prefix = _PARTIAL if pid is None else f"{_PARTIAL}{pid}-"
    if not os.path.isdir(directory):
        return removed
    for name in sorted(os.listdir(directory)):
        if name.startswith(prefix):
            try:
                os.remove(os.path.join(directory, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


def _h5py() -> Any:
    import h5py  # type: ignore[import-untyped]  # Keras's own dependency, used for its .weights.h5 files

    return h5py


def write(model: keras.Model, path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Saves `model` to `path` (weights only for a `.weights.h5` name) with `state`, through a temporary
    file and a rename, so a crash never leaves half a file under the final name."""
    # Loads keras with it, which reading a checkpoint's state does not need (no cycle: it imports nothing here).
    from kfast.distributed.optimizer import unwrap_for_saving

    directory, name = os.path.split(os.fspath(path))
    tmp = os.path.join(directory, f"{_PARTIAL}{os.getpid()}-{name}")
    text = json.dumps({"version": STATE_VERSION, **state})
    unwrap_for_saving(model)  # the file names the wrapped optimizer: NOTE [ Files plain Keras opens ]
    try:
        with collectives.saving_alone():  # rank 0 saves alone, the other processes do not join a collective
            if name.endswith(WEIGHTS_SUFFIX):
                model.save_weights(tmp)
                with _h5py().File(tmp, "a") as f:
                    f.attrs[_STATE_ATTR] = text
                    if model.built:
                        f.attrs[_BUILD_ATTR] = json.dumps(model.get_build_config())
            else:
                model.save(tmp)
                _finish_archive(tmp, text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _finish_archive(archive: str, state: str) -> None:
    with zipfile.ZipFile(archive, "a") as z:
        z.writestr(_STATE_MEMBER, state)


def _unreadable(path: str | os.PathLike[str], e: Exception) -> ValueError:
    return ValueError(f"checkpoint {path} cannot be read ({type(e).__name__}: {e})")


def peek(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The kfast state of the checkpoint at `path` as stored (`{}` if it has none), without its weights.

    Raises:
        ValueError: naming the file, when it cannot be read.
    """
    try:
        if os.fspath(path).endswith(WEIGHTS_SUFFIX):
            with _h5py().File(path, "r") as f:
                raw = f.attrs.get(_STATE_ATTR)
        else:
            with zipfile.ZipFile(path) as z:
                raw = z.read(_STATE_MEMBER) if _STATE_MEMBER in z.namelist() else None
        state = json.loads(raw) if raw is not None else {}
    except _READ_ERRORS as e:
        raise _unreadable(path, e) from e
    return state if isinstance(state, dict) else {}


def _position(state: dict[str, Any], name: str) -> Position | None:
    saved = state.get("position")
    if isinstance(saved, dict) and all(isinstance(saved.get(k), int) and saved[k] >= 0 for k in ("epoch", "batch")):
        return Position(saved["epoch"], saved["batch"])
    legacy = _EPOCH_FILE.match(name)
    return Position(int(legacy.group(1))) if legacy else None


def read_archive(path: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Checks that the checkpoint at `path` (`.keras` or `.weights.h5`) is whole and returns
    `(build_config, state)` from it; `state` keeps every key but `version`.

    Raises:
        NewerCheckpointError: when a newer kfast wrote its state.
        ValueError: naming the file, when it is truncated, corrupt or not a checkpoint.
    """
    try:
        if os.fspath(path).endswith(WEIGHTS_SUFFIX):
            h5py = _h5py()

            def read_all(_: str, item: Any) -> None:
                if isinstance(item, h5py.Dataset):
                    item[()]

            with h5py.File(path, "r") as f:
                # Reads every array: a truncated or corrupt file fails here, not halfway through loading.
                f.visititems(read_all)
                build = f.attrs.get(_BUILD_ATTR)
                config = {"build_config": json.loads(build) if build is not None else None}
                raw = f.attrs.get(_STATE_ATTR)
        else:
            with zipfile.ZipFile(path) as z:
                broken = z.testzip()  # reads every member, for the same reason
                if broken is not None:
                    raise ValueError(f"member {broken} fails its checksum")
                config = json.loads(z.read("config.json"))
                raw = z.read(_STATE_MEMBER) if _STATE_MEMBER in z.namelist() else None
        state = json.loads(raw) if raw is not None else {}
    except _READ_ERRORS as e:
        raise _unreadable(path, e) from e
    version = state.pop("version", 0)  # 0: written before states had a version, in version 1's layout
    if not isinstance(version, int) or version > STATE_VERSION:
        raise NewerCheckpointError(
            f"checkpoint {path} holds kfast training state of format version {version!r}, and this kfast reads "
            f"versions up to {STATE_VERSION}; resume it with the kfast that wrote it (or a newer one).")
    return config.get("build_config"), state


def split_state(state: dict[str, Any], name: str) -> tuple[Position | None, dict[str, Any] | None, dict[str, Any]]:
    """`(position, best, training state)` from a state `read_archive` returned for the file `name`."""
    best = state.get("best")
    training = {k: v for k, v in state.items() if k not in RESERVED}
    return _position(state, name), best if isinstance(best, dict) else None, training


def find(directory: str | os.PathLike[str]) -> tuple[list[tuple[Position, str]], list[ValueError]]:
    """The checkpoints kfast wrote in `directory` (best files left out), newest first by position, then by
    name; and the errors of the files whose place among them cannot be read."""
    found, errors = [], []
    if not os.path.isdir(directory):
        return [], []
    for name in sorted(os.listdir(directory)):
        if name.startswith(".") or name in BEST_NAMES or not name.endswith((MODEL_SUFFIX, WEIGHTS_SUFFIX)):
            continue
        try:
            position = _position(peek(os.path.join(directory, name)), name)
        except ValueError as e:
            position = _position({}, name)  # a broken epoch-NNNN.keras still has its place
            if position is None:
                errors.append(e)
        if position is not None:
            found.append((position, name))
    return sorted(found, reverse=True), errors


def prune(directory: str | os.PathLike[str], keep: int, written: str) -> None:
    """Deletes the oldest checkpoints in `directory` beyond the newest `keep`, never the file `written`."""
    others = [name for _, name in find(directory)[0] if name != written]
    for name in others[keep - 1:]:
        try:
            os.remove(os.path.join(directory, name))
        except FileNotFoundError:
            pass


def best_record(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The `best` that the newest readable best file of `directory` records: it describes that very model."""
    records = []
    for name in BEST_NAMES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            try:
                state = peek(path)
            except ValueError:
                continue  # the epoch checkpoint's own record stands in for it
            if isinstance(state.get("best"), dict):
                records.append((_position(state, name) or Position(-1), os.path.getmtime(path), state["best"]))
    return max(records, key=lambda r: r[:2])[2] if records else None
