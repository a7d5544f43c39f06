"""DistributedOptimizer: averages gradients across Horovod ranks before the wrapped optimizer applies them.

NOTE [ Files plain Keras opens ]
A model compiled with `DistributedOptimizer(Adam(...))` is saved (by `model.save`, `save_weights` or a kfast
checkpoint) as if it had been compiled with that `Adam`, so that `keras.saving.load_model` opens it where
kfast is not installed, and a plain Keras file loads into a model compiled with the wrapper:
- The optimizer's saved state is the wrapped optimizer's own, in its own layout (`save_own_variables`).
  The wrapper's variables (the preemption flags, gradient sums in flight) are runtime state, not saved.
  Keras's saving walks the optimizer's attributes for nested objects to save; `__dir__` leaves
  `inner_optimizer` out of that walk, or its state would be saved a second time under
  `optimizer/inner_optimizer`, and a plain file (which has no such group) would warn "Skipping variable
  loading" on every load into the wrapper.
- The saved compile settings name the wrapped optimizer (`"Adam"`, its config). Keras names an object by
  its class, whatever its `get_config` returns, so the wrapper itself cannot be written as an `Adam`;
  the model's compile settings can: `unwrap_for_saving(model)` puts the wrapped optimizer there (as Keras
  puts the plain optimizer there under mixed precision, not its `LossScaleOptimizer`). kfast calls it
  wherever it gets the model: `RankZeroCheckpoint` when training begins, `restore()`, every checkpoint
  write. `model.optimizer` stays the wrapper, so training is unchanged.
- The other way, a plain file's optimizer state loads into the wrapped optimizer (`load_own_variables`),
  and `kfast.distributed.checkpoint.load_model` opens a file with its optimizer wrapped, as Horovod's
  `hvd.load_model` does.
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
from keras import ops

from kfast._core import topology
from kfast._core.checks import check_int
from kfast.distributed import collectives

# What `compression=` accepts (kfast.plan too): None sends gradients as they are, "fp16" as float16.
COMPRESSIONS = (None, "fp16")


@keras.saving.register_keras_serializable(package="kfast")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Wraps a Keras 3 optimizer so every rank applies the same, averaged gradients.

    Built by composition, like Keras's own `LossScaleOptimizer`: the wrapped optimizer keeps its class,
    its state and its learning rate; this wrapper only exchanges gradients (one fused allreduce per
    step) and can accumulate them over several backward passes first. Sparse gradients (embeddings) are
    made dense before the exchange. Works inside `model.fit`, also with `steps_per_execution > 1`.
    Horovod ops cannot run under XLA: use it with `jit_compile=False` or the `BroadcastState` callback,
    which turns XLA off.

    Args:
        optimizer: the Keras optimizer to wrap.
        compression: `None` or `"fp16"` (exchange floating gradients, float64 too, as float16: half the
            traffic of float32, a quarter of float64's; cast back before they are applied). Defaults to `None`.
        backward_passes_per_step: apply once every this many batches, with the gradients averaged over
            them (gradient accumulation). The optimizer's `iterations` then counts applied updates, not
            batches, as Keras's own `gradient_accumulation_steps` does (Horovod counts batches): a schedule
            on `iterations` advances once per `backward_passes_per_step` batches. Defaults to `1`.
        name: optimizer name. Defaults to `None`.

    Raises:
        ValueError: for an unknown compression or a non-positive `backward_passes_per_step`.

    Example:

    In a script started by `horovodrun`, after `kfast.distributed.init()`:

    >>> import keras, kfast
    >>> opt = kfast.DistributedOptimizer(keras.optimizers.SGD(0.01 * kfast.distributed.size()))
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(opt, "mse", jit_compile=False)
    >>> type(opt.inner_optimizer).__name__
    'SGD'
    """

    built: bool  # set by Keras; declared for the type checker, which cannot read Keras's classes

    def __init__(self, optimizer: keras.optimizers.Optimizer, *, compression: str | None = None,
                 backward_passes_per_step: int = 1, name: str | None = None) -> None:
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ValueError(f"DistributedOptimizer wraps a keras.optimizers.Optimizer; got {type(optimizer).__name__}.")
        if compression not in COMPRESSIONS:
            raise ValueError(f"DistributedOptimizer got compression={compression!r}; use None or 'fp16'.")
        check_int("DistributedOptimizer", "backward_passes_per_step", backward_passes_per_step,
                  hint="1 applies every batch")
        super().__init__(learning_rate=0.0, name=name or f"distributed_{optimizer.name}")
        self.inner_optimizer = optimizer
        self.compression = compression
        self.backward_passes_per_step = backward_passes_per_step

    def build(self, var_list: list[Any]) -> None:
        if topology.one_step_for_all():
            # NOTE [ One step for the whole job ] (kfast/distributed/_jax.py): XLA averages inside the step.
            if self.compression is not None:
                warnings.warn(f"DistributedOptimizer(compression={self.compression!r}) does not apply on the JAX "
                              "engine: XLA averages the gradients inside the compiled step, in their own dtype. "
                              "Leave compression out (mixed precision halves the traffic there).", stacklevel=2)
            if self.backward_passes_per_step > 1:
                self._pass = self.add_variable((), initializer="zeros", dtype="int", name="backward_pass")
                self._sums = [self.add_variable_from_reference(v, name="grad_sum") for v in var_list]
            self.inner_optimizer.build(var_list)
            super().build(var_list)
            return
        # A preemption note rides along with the gradients (see kfast.distributed.preemption): this rank's
        # flag goes in, every rank's average comes out, so all ranks learn it from the same step's exchange.
        self._stop_flag = self.add_variable((), initializer="zeros", dtype="float32", name="stop_flag")
        self._stop_seen = self.add_variable((), initializer="zeros", dtype="float32", name="stop_seen")
        if self.backward_passes_per_step > 1:
            self._pass = self.add_variable((), initializer="zeros", dtype="int", name="backward_pass")
            self._sums = [self.add_variable_from_reference(v, name="grad_sum") for v in var_list]
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def variables(self) -> list[Any]:
        return self._variables + self.inner_optimizer.variables

    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self.inner_optimizer.learning_rate = value

    @property
    def iterations(self) -> Any:
        return self.inner_optimizer.iterations

    def _exchange(self, grads: list[Any]) -> list[Any]:
        if topology.one_step_for_all():
            return grads  # averaged over the global batch already (NOTE [ One step for the whole job ])
        dense = [None if g is None else ops.convert_to_tensor(g) for g in grads]
        carries = hasattr(self, "_stop_flag")  # built (apply builds it first), and not on the JAX engine
        if carries:
            dense.append(ops.convert_to_tensor(self._stop_flag))
        if self.compression == "fp16":
            dtypes = [None if g is None else g.dtype for g in dense]
            # Every floating type goes as float16, float64 too, as Horovod's Compression.fp16 does.
            sent = [None if g is None else ops.cast(g, "float16") if keras.backend.is_float_dtype(g.dtype) else g
                    for g in dense]
            out = [None if g is None else ops.cast(g, d) for g, d in zip(collectives.allreduce_average(sent), dtypes)]
        else:
            out = collectives.allreduce_average(dense, name="kfast.grads")
        if carries:
            self._stop_seen.assign(out.pop())
        return out

    def carries_stop(self) -> bool:
        """Whether every step's gradient exchange also tells each rank whether any rank noted a preemption."""
        return self.built and self.backward_passes_per_step == 1 and hasattr(self, "_stop_seen")

    def note_stop(self) -> None:
        """Puts this rank's preemption note into the next exchange."""
        self._stop_flag.assign(1.0)

    def stop_agreed(self) -> bool:
        """Whether the last exchange carried a preemption note from any rank (the same answer on every rank)."""
        return float(ops.convert_to_numpy(self._stop_seen)) > 0

    def apply(self, grads: list[Any], trainable_variables: list[Any] | None = None) -> None:
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(list(trainable_variables or []))
            self.built = True
        grads = list(grads)
        if self.backward_passes_per_step == 1:
            self.inner_optimizer.apply(self._exchange(grads), trainable_variables)
            return
        for s, g in zip(self._sums, grads):
            if g is not None:
                s.assign_add(ops.convert_to_tensor(g))
        self._pass.assign_add(1)

        def apply_accumulated():
            n = float(self.backward_passes_per_step)
            averaged = self._exchange([None if g is None else s / n for s, g in zip(self._sums, grads)])
            self.inner_optimizer.apply(averaged, trainable_variables)
            for s in self._sums:
                s.assign(ops.zeros_like(s))
            self._pass.assign(0)

        ops.cond(ops.equal(self._pass, self.backward_passes_per_step), apply_accumulated, lambda: None)

    # Saved state is the wrapped optimizer's own, in its own layout, so a file restores into a plain optimizer
    # of that class and a plain file into this one (NOTE [ Files plain Keras opens ]).
    def __dir__(self) -> list[str]:
        # Keras's saving finds nested objects to save through dir(); the wrapped optimizer's state is saved
        # as this optimizer's own already (NOTE [ Files plain Keras opens ]).
        return [name for name in super().__dir__() if name != "inner_optimizer"]

    def save_own_variables(self, store: dict[str, Any]) -> None:
        self.inner_optimizer.save_own_variables(store)

    def load_own_variables(self, store: dict[str, Any]) -> None:
        self.inner_optimizer.load_own_variables(store)

    def finalize_variable_values(self, var_list: list[Any]) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
                "compression": self.compression, "backward_passes_per_step": self.backward_passes_per_step}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: dict[str, Any] | None = None) -> DistributedOptimizer:
        config = dict(config)  # the caller's dict stays as it was (Keras's from_config never edits it)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        return cls(inner, **config)


def unwrap_for_saving(model: keras.Model) -> None:
    """Makes `model.save` name the optimizer a `DistributedOptimizer` wraps, so plain Keras opens the file.

    Keras writes the optimizer `model.compile` was given into the file's compile settings; after this call
    that is the wrapped optimizer (say `Adam`), whose state the wrapper saves. `model.optimizer` and
    training are unchanged. Does nothing for a model compiled with another optimizer, or not compiled.
    See NOTE [ Files plain Keras opens ].

    Args:
        model: a Keras model, compiled or not.
    """
    # Keras keeps what compile() was given in `_compile_config`, which `get_compile_config()` serializes;
    # there is no public way to change it short of compiling again, which would start new metrics.
    settings = getattr(getattr(model, "_compile_config", None), "config", None)
    if not isinstance(settings, dict):
        return
    while isinstance(settings.get("optimizer"), DistributedOptimizer):
        settings["optimizer"] = settings["optimizer"].inner_optimizer
