"""Where RankZeroCheckpoint writes: the directory argument, and file names made from a template.

A template is a file name with Keras's `ModelCheckpoint` placeholders: `{epoch}` (from 1), `{batch}` (from
1, within the epoch; only when saving every N batches) and any key of the logs, with Python's format
specs, e.g. `"{epoch:02d}-{val_loss:.2f}.keras"`. Everything is checked when the callback is built, so
that a bad name fails before training rather than after the first epoch.
"""

from __future__ import annotations

import os
import string
from typing import Any

MODEL_SUFFIX = ".keras"
WEIGHTS_SUFFIX = ".weights.h5"


def checked_directory(owner: str, name: str, value: Any, example: str) -> str:
    """Returns `value` as a path string, or raises `ValueError` saying what a directory argument must be."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        path = os.fspath(value)
        if isinstance(path, str) and path:
            return path
    raise ValueError(f"{owner} got {name}={value!r}; it must be the path (a str or os.PathLike) of a "
                     f"directory, e.g. {example}.")


def suffix(weights_only: bool) -> str:
    """How the files end: Keras 3 saves weights to `.weights.h5` and whole models to `.keras`."""
    return WEIGHTS_SUFFIX if weights_only else MODEL_SUFFIX


class _Probe(dict[str, Any]):
    """Log values as they reach callbacks (Python floats), for trying a template before training."""

    def __missing__(self, key: str) -> float:
        return 0.0


class FileNames:
    """The names of one RankZeroCheckpoint's files: checked once, then formatted at each save."""

    def __init__(self, template: Any, weights_only: bool, per_batch: bool) -> None:
        ends = suffix(weights_only)
        if template is None:
            template = "epoch-{epoch:04d}" + ("-batch-{batch:04d}" if per_batch else "") + ends
        if not isinstance(template, str) or not template:
            raise ValueError(f"RankZeroCheckpoint got filename={template!r}; it must be a file name (a str), "
                             f"such as 'epoch-{{epoch:04d}}{ends}'.")
        if os.sep in template or "/" in template or template.startswith("."):
            raise ValueError(f"RankZeroCheckpoint got filename={template!r}; it must be a plain name inside "
                             "directory= (no folders, not starting with '.'): put the folders in directory=.")
        if not template.endswith(ends):
            other = "save_weights_only=False and end it in '.keras'" if weights_only else \
                "save_weights_only=True and end it in '.weights.h5'"
            raise ValueError(
                f"RankZeroCheckpoint got filename={template!r} with save_weights_only={weights_only}; Keras 3 "
                f"saves {'weights' if weights_only else 'whole models'} to '{ends}' files, so the name must end "
                f"in '{ends}' (or pass {other}).")
        try:
            fields = {field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(template)
                      if field is not None}
            if "" in fields or any(field.isdigit() for field in fields):
                raise ValueError(f"RankZeroCheckpoint got filename={template!r}, which has a positional "
                                 "placeholder; name each one: {epoch}, {batch} or a key of the logs.")
            template.format_map(_Probe(epoch=1, batch=1))
        except (ValueError, IndexError, KeyError, AttributeError, TypeError) as e:
            if str(e).startswith("RankZeroCheckpoint"):
                raise
            raise ValueError(f"RankZeroCheckpoint cannot use filename={template!r} ({type(e).__name__}: {e}); "
                             "name placeholders as Keras does: {epoch}, {batch} or a key of the logs, with a "
                             "format spec if you like ('{epoch:04d}', '{val_loss:.2f}').") from e
        if "batch" in fields and not per_batch:
            raise ValueError(f"RankZeroCheckpoint got filename={template!r} with save_freq='epoch'; {{batch}} "
                             "only has a value when saving every N batches (save_freq=N).")
        self.template, self.best = template, "best" + ends
        if template == self.best:
            raise ValueError(f"RankZeroCheckpoint got filename={template!r}, the name of its best model; pick "
                             "another (the default is 'epoch-{epoch:04d}" + ends + "').")

    def format(self, epoch: int, batch: int | None, logs: dict[str, Any]) -> str:
        """The file name for a save in `epoch` (from 0), after `batch` (from 0; None at the epoch's end)."""
        values = {**logs, "epoch": epoch + 1}
        if batch is not None:
            values["batch"] = batch + 1
        try:
            name = self.template.format_map(values)
        except KeyError as e:
            raise ValueError(
                f"RankZeroCheckpoint cannot name the checkpoint of epoch {epoch + 1} from "
                f"filename={self.template!r}: the logs have no {e.args[0]!r} (they hold {sorted(logs)}). Name "
                "only {epoch}, {batch} and keys that are in the logs (validation ones need validation data).") from e
        if name == self.best or os.sep in name or "/" in name:
            raise ValueError(f"RankZeroCheckpoint's filename={self.template!r} gave the name {name!r} for epoch "
                             f"{epoch + 1}, which it cannot write (a folder, or the best model's name); change "
                             "the template.")
        return name
