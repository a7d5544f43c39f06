"""How Keras's `fit`, `evaluate` and `predict` read a FastLoader: the loader is its own Keras data adapter.

NOTE [ The loader is Keras's data adapter ]
Keras turns whatever `fit`, `evaluate` and `predict` get into a `DataAdapter`, and passes an adapter through
as is (`keras.src.trainers.data_adapters.get_data_adapter`: "Allow passing a custom data adapter"), as its
own adapters bring Grain and PyTorch loaders in. A FastLoader is one, so Keras asks it, not a wrapper of its
own, for each epoch's batches: `get_numpy_iterator()` (JAX: `get_jax_iterator()`, PyTorch:
`get_torch_dataloader()`) once per epoch, or on TensorFlow one `tf.data` pipeline (`get_tf_dataset()`) whose
generator runs once per epoch. Each of those is one iteration of the loader: its order is known before the
first batch, so the workers load ahead. Nothing of Keras is replaced.

What Keras keeps from an adapter, and kfast therefore takes as the loader's own settings (as Keras says of a
`tf.data` pipeline): `fit(shuffle=...)` and `fit(class_weight=...)` never reach it. The loader's `shuffle`
(by default: training data is shuffled, anything else read in index order) and `class_weight` govern.

Keras calls the adapter's `on_epoch_begin()` inside the loop it runs, before the epoch's first batch, and
`on_epoch_end()` after its last (and when it resets). Between the two the loader counts as read by Keras: a
Ctrl-C in a script then has a bound (`kfast.data._workers.interrupt`), and a whole-set read under Horovod is
counted for the callbacks (`kfast._core.keras_reads`).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from typing import Any
from typing import cast

from kfast._core import keras_private
from kfast._core import keras_reads
from kfast._core import topology
from kfast.data._loader_args import RAN_OUT
from kfast.data._workers import interrupt


class KerasEpochs(keras_private.DataAdapter):
    """FastLoader's Keras-facing methods (a Keras `DataAdapter`); the loader owns every attribute they use."""

    _order: Any
    _lock: Any
    _cursor: Any
    _stream: Any
    _quiet: Any
    _signature: Any
    _read_token: Any
    _warned_shard: bool
    shuffle: bool | None
    training: bool
    class_weight: dict[int, float] | None
    dataset: Any

    def _iterate(self, shuffled: bool) -> Any:
        raise NotImplementedError

    def _shuffled(self) -> bool:
        return self.training if self.shuffle is None else bool(self.shuffle)

    def _standardize(self, batch: Any) -> Any:
        """A batch as Keras's loops take it: a dict, or a tuple `(x,)`, `(x, y)` or `(x, y, sample_weight)`."""
        if isinstance(batch, dict):
            return batch
        if isinstance(batch, list):
            batch = tuple(batch)
        if not isinstance(batch, tuple):
            batch = (batch,)
        if not 1 <= len(batch) <= 3:
            raise ValueError(f"{type(self.dataset).__name__}.__getitem__ returned a tuple of {len(batch)} items; Keras "
                             "takes (x,), (x, y) or (x, y, sample_weight), or a dict.")
        if self.class_weight is not None and len(batch) >= 2:
            if len(batch) == 3:
                raise ValueError("FastLoader got class_weight, and the dataset's batches carry sample weights too; "
                                 "pass one of them (fold the class weights into the sample weights).")
            batch = (*batch, keras_private.class_weight_to_sample_weights(batch[1], self.class_weight))
        return batch

    def _keras_epoch(self) -> Iterator[Any]:
        """One epoch, read by a Keras loop."""
        it = self._iterate(self._shuffled())
        with self._lock:
            self._cursor.keras.append(it)
            if it.plan.start and self._quiet is None:
                # A resumed epoch has fewer batches than len() says, by design: only that one message, and only
                # until this epoch ends (on_epoch_end).
                warnings.filterwarnings("ignore", message=RAN_OUT)
                self._quiet = warnings.filters[0]
        token = self._read_token  # the Keras epoch reading it (its on_epoch_begin came first)
        try:
            for batch in it:
                yield self._standardize(batch)
        except BaseException:  # Keras dropped it (a first look at one batch, a call that raised), or it failed
            # No lock: a dropped generator is closed by the garbage collector in whatever thread it runs, maybe
            # a worker thread while the reader holds the loader's lock waiting for that worker's batch.
            if token is not None and self._read_token == token:
                self._read_token = None
                interrupt.keras_read_ends(token)
            raise

    # -- Keras's DataAdapter ---------------------------------------------------------------------------

    def get_numpy_iterator(self) -> Iterator[Any]:
        return cast(Iterator[Any], keras_private.numpy_iterator(self._keras_epoch()))

    def get_jax_iterator(self, super_batch: int | None = None) -> Iterator[Any]:
        iterator = keras_private.jax_iterator(self._keras_epoch())
        if super_batch:  # Keras 3.16 on, with steps_per_execution > 1: several steps' batches stacked, as its own
            import jax.numpy as jnp

            iterator = keras_private.super_batch_iterator(iterator, super_batch, stack_fn=jnp.stack)
        return cast(Iterator[Any], iterator)

    def get_torch_dataloader(self) -> Any:
        return keras_private.torch_dataloader(self._keras_epoch())

    def get_tf_dataset(self) -> Any:
        import tensorflow as tf

        if self._signature is None:
            # As Keras does for a PyDataset: the signature from the first batches (loaded by the workers).
            count = min(keras_private.SPEC_BATCHES, len(self))
            self._signature = keras_private.tensor_spec([self._standardize(self[i]) for i in range(count)])
        return tf.data.Dataset.from_generator(self._keras_epoch, output_signature=self._signature).prefetch(
            tf.data.AUTOTUNE)

    @property
    def num_batches(self) -> int:
        return len(self)

    @property
    def batch_size(self) -> int | None:
        size = getattr(self.dataset, "batch_size", None)
        return size if isinstance(size, int) else None

    @property
    def has_partial_batch(self) -> bool | None:
        return None  # not known without loading the last batch

    @property
    def partial_batch_size(self) -> int | None:
        return None

    def on_epoch_begin(self) -> None:
        # A Ctrl-C caught before this epoch is not ours to act on.
        self._stream.interrupt_mark = time.monotonic()
        self._stream.interrupted = False
        with self._lock:
            if self._read_token is None:
                self._read_token = interrupt.keras_read_begins(self)
        if topology.size() > 1 and not topology.one_step_for_all():
            if self._order.size == 1:
                keras_reads.count_whole_read()
            elif self.training and not keras_reads.in_training_window() and not self._warned_shard:
                self._warned_shard = True
                warnings.warn(
                    f"A Keras call that kfast's callbacks did not report as fit's training reads a "
                    f"FastLoader(training=True) under {topology.size()} ranks: each rank reads its own shard (rank "
                    f"{topology.rank()} here), so evaluate() and predict() give that shard's result, not the whole "
                    "set's. Evaluate on FastLoader(dataset) (training=False: every rank reads the whole set); fit with "
                    "kfast.distributed.default_callbacks() to silence this.", stacklevel=2)
            elif not self._warned_shard and not self.training:
                self._warned_shard = True
                warnings.warn(
                    f"A Keras call reads a FastLoader over a ShardedDataset under {topology.size()} ranks: each rank "
                    f"reads its own part (rank {topology.rank()} here), so evaluate() and predict() give that part's "
                    "result, not the whole set's. Pass the dataset itself to FastLoader, which every rank then reads "
                    "whole, or sum the metrics with callbacks=[kfast.callbacks.MetricAverage()].", stacklevel=2)

    def on_epoch_end(self) -> None:
        with self._lock:
            if self._read_token is not None:
                interrupt.keras_read_ends(self._read_token)
                self._read_token = None
            ended = self._cursor.keras_ended()
            if ended is not None:
                if ended.done:
                    ended.finish()
            if self._quiet is not None and ended is not None and ended.plan.start:
                with contextlib.suppress(ValueError):
                    cast(list, warnings.filters).remove(self._quiet)
                self._quiet = None
