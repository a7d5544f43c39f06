"""TfDataSettings: what `kfast.tune` may change on a `tf.data` pipeline, as one value that applies itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    import tensorflow as tf

# tf.data.AUTOTUNE, named here so that reading or printing settings needs no TensorFlow.
AUTOTUNE = -1
_FIELDS = ("cache", "prefetch", "deterministic", "map_parallelization", "private_threadpool_size",
           "max_intra_op_parallelism")


@dataclasses.dataclass(frozen=True)
class TfDataSettings:
    """The settings `kfast.tune` chooses for an already-built `tf.data` pipeline (`TfDataTuneResult.settings`).

    Each field left at its default leaves that part of the pipeline as it was given, so `TfDataSettings()`
    is the pipeline untouched. `apply(dataset)` appends `cache()` and then `prefetch(...)` to the end of
    the pipeline and sets the `tf.data.Options`, which act on the whole pipeline wherever they are set.
    Public attributes of the dataset (`class_names` and `file_paths` of
    `keras.utils.image_dataset_from_directory`) carry over to the returned one.

    Args:
        cache: append `cache()`, in memory: the first epoch fills it, later epochs read it. Defaults to
            `False`.
        prefetch: append `prefetch(prefetch)`; `-1` is `tf.data.AUTOTUNE`. Defaults to `None`: nothing.
        deterministic: `tf.data.Options().deterministic`; `False` lets parallel maps and interleaves hand
            out elements in the order they finish, which changes the order of batches. Defaults to
            `None`: as given.
        map_parallelization: `tf.data.Options().experimental_optimization.map_parallelization`: run the
            pipeline's sequential maps in parallel where their function allows it (TensorFlow's own
            default is `True`). Defaults to `None`: as given.
        private_threadpool_size: `tf.data.Options().threading.private_threadpool_size`: a thread pool of
            this size for the pipeline alone, apart from the one training uses. Defaults to `None`: as
            given.
        max_intra_op_parallelism: `tf.data.Options().threading.max_intra_op_parallelism`: the threads one
            op of the pipeline may use. Defaults to `None`: as given.

    Example:

    >>> import tensorflow as tf
    >>> settings = TfDataSettings(prefetch=-1, deterministic=False)
    >>> print(settings)
    prefetch(AUTOTUNE), deterministic=False
    >>> ds = settings.apply(tf.data.Dataset.range(4).batch(2))
    >>> ds.options().deterministic, [b.numpy().tolist() for b in ds]
    (False, [[0, 1], [2, 3]])
    >>> print(TfDataSettings())
    as given
    """

    cache: bool = False
    prefetch: int | None = None
    deterministic: bool | None = None
    map_parallelization: bool | None = None
    private_threadpool_size: int | None = None
    max_intra_op_parallelism: int | None = None

    @property
    def untouched(self) -> bool:
        """True when these settings leave the pipeline as it was given."""
        return self == TfDataSettings()

    def replace(self, **changes: Any) -> TfDataSettings:
        """Returns a copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Returns the settings as a plain dict (JSON-serialisable)."""
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TfDataSettings:
        """Builds settings from a mapping holding (at least) the six keys."""
        return cls(**{name: values[name] for name in _FIELDS})

    def options(self) -> tf.data.Options:
        """The `tf.data.Options` these settings set (only the fields that are not `None`)."""
        import tensorflow as tf

        options = tf.data.Options()
        if self.deterministic is not None:
            options.deterministic = self.deterministic
        if self.map_parallelization is not None:
            options.experimental_optimization.map_parallelization = self.map_parallelization
        if self.private_threadpool_size is not None:
            options.threading.private_threadpool_size = self.private_threadpool_size
        if self.max_intra_op_parallelism is not None:
            options.threading.max_intra_op_parallelism = self.max_intra_op_parallelism
        return options

    def apply(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Returns `dataset` with these settings: `cache()`, then `prefetch(...)` appended, then the options."""
        out = dataset.cache() if self.cache else dataset
        if self.prefetch is not None:
            out = out.prefetch(self.prefetch)
        if any(getattr(self, name) is not None for name in _FIELDS[2:]):
            out = out.with_options(self.options())
        if out is not dataset:
            for name, value in vars(dataset).items():
                if not name.startswith("_") and not hasattr(out, name):
                    setattr(out, name, value)
        return out

    def __str__(self) -> str:
        parts = ["cache"] if self.cache else []
        if self.prefetch is not None:
            parts.append(f"prefetch({'AUTOTUNE' if self.prefetch == AUTOTUNE else self.prefetch})")
        parts += [f"{name}={getattr(self, name)}" for name in _FIELDS[2:] if getattr(self, name) is not None]
        return ", ".join(parts) or "as given"
