"""A training step as data, so it can be compiled elsewhere and changed: `StepRecipe` and `StepVariant`.

A `StepRecipe` is what compiling a model's step needs and nothing more: the model's Keras config (no weights:
a compile reads shapes), its `compile()` config and the batch's shapes and dtypes, all JSON. It crosses to a
JAX process when the user trains on TensorFlow or PyTorch (kfast.planning._compile_process), and it is rebuilt
with a `StepVariant`'s changes (another dtype policy, gradient accumulation, rematerialisation) to compile what
a change would hold. A model Keras cannot rebuild from its config (a subclass without `get_config`, a custom
layer not importable by its module) has no recipe: `recipe_of` says why.
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

_ARRAY = "kfast_array"  # marks a leaf of the batch's structure: {"kfast_array": [shape, dtype]}


@dataclass(frozen=True)
class StepVariant:
    """One way to run the step: samples per data-parallel replica, the `(data, model)` mesh, and the changes.

    Attributes:
        batch_size: samples per optimizer step per data-parallel replica.
        mesh: `(data, model)` devices.
        precision: a Keras dtype policy to rebuild the model under, or `None`: the model's own.
        accumulation: micro-batches per optimizer step (the optimizer's `gradient_accumulation_steps`);
            each backward pass sees `batch_size / accumulation` samples.
        remat: a `keras.RematScope` mode to rebuild the model under (`"full"`), or `None`.

    Example:

    >>> StepVariant(64, accumulation=4).label(), StepVariant(64, mesh=(1, 2)).label()
    ('batch 16 x 4 accumulated', 'model axis of 2 devices')
    """

    batch_size: int
    mesh: tuple[int, int] = (1, 1)
    precision: str | None = None
    accumulation: int = 1
    remat: str | None = None

    @property
    def micro_batch(self) -> int:
        return -(-self.batch_size // self.accumulation)

    @property
    def changes_model(self) -> bool:
        """Whether the model must be rebuilt from its config to compile this variant."""
        return self.precision is not None or self.accumulation > 1 or self.remat is not None

    def label(self) -> str:
        parts = []
        if self.precision:
            parts.append(self.precision)
        if self.accumulation > 1:
            parts.append(f"batch {self.micro_batch} x {self.accumulation} accumulated")
        if self.remat:
            parts.append(f"rematerialisation ({self.remat})")
        if self.mesh[1] > 1:
            parts.append(f"model axis of {self.mesh[1]} devices")
        return ", ".join(parts) or "as it is"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mesh": list(self.mesh)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepVariant:
        return cls(**{**d, "mesh": tuple(d["mesh"])})


@dataclass(frozen=True)
class StepRecipe:
    """A model's step as JSON: `model` (Keras's serialized config), `compile` (its compile config, or `None`)
    and `batch` (the batch's structure with `[shape, dtype]` leaves)."""

    model: dict[str, Any]
    compile: dict[str, Any] | None
    batch: Any

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class NoRecipe(ValueError):
    """The model cannot be rebuilt from its config; the message says why."""


def recipe_of(model: keras.Model, batch: Any) -> StepRecipe:
    """The `StepRecipe` of `model` trained on batches like `batch`.

    Raises:
        NoRecipe: when Keras cannot serialize the model, or rebuilding it from the config fails here.

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile("sgd", "mse")
    >>> recipe = recipe_of(model, (np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32")))
    >>> recipe.batch
    [{'kfast_array': [[8, 4], 'float32']}, {'kfast_array': [[8, 2], 'float32']}]
    """
    try:
        config = keras.saving.serialize_keras_object(model)
        _deserialize(copy.deepcopy(config))  # a config that does not rebuild fails here
    except Exception as e:
        raise NoRecipe(f"Keras cannot rebuild model {model.name!r} from its config ({type(e).__name__}: {e}); give "
                       "its custom layers get_config() and keras.saving.register_keras_serializable(), defined in "
                       "an importable module (not __main__).") from e
    if any(s.get("module") == "__main__" for s in _registered(config)):
        raise NoRecipe(f"model {model.name!r} uses layers defined in __main__, which another process cannot import; "
                       "define them in a module.")
    compiled = model.get_compile_config() if getattr(model, "compiled", False) else None
    parts = [_lists(part) for part in keras.utils.unpack_x_y_sample_weight(batch) if part is not None]
    spec = keras.tree.map_structure(
        lambda a: {_ARRAY: [list(np.shape(a)), keras.backend.standardize_dtype(np.asarray(a).dtype)]}, parts)
    return StepRecipe(config, compiled, spec)


def _deserialize(config: dict[str, Any]) -> Any:
    # The config comes from the user's own live model in this run, never from a file: its Lambda layers' code is
    # the user's, so Keras's guard against loading foreign code does not apply.
    return keras.saving.deserialize_keras_object(config, safe_mode=False)


def _lists(structure: Any) -> Any:
    """Tuples as lists (JSON has no tuples), leaves kept."""
    if isinstance(structure, (tuple, list)):
        return [_lists(s) for s in structure]
    if isinstance(structure, dict):
        return {k: _lists(v) for k, v in structure.items()}
    return structure


def _registered(config: Any) -> list[dict[str, Any]]:
    """Every serialized object in `config`."""
    out = []
    if isinstance(config, dict):
        if "class_name" in config:
            out.append(config)
        for value in config.values():
            out += _registered(value)
    elif isinstance(config, list):
        for value in config:
            out += _registered(value)
    return out


def _with_policy(config: Any, policy: str) -> Any:
    """`config` with every float32 dtype policy replaced by `policy` (the model's inputs keep their dtypes)."""
    config = copy.deepcopy(config)
    for obj in _registered(config):
        if obj["class_name"] == "DTypePolicy" and obj.get("config", {}).get("name") == "float32":
            obj["config"]["name"] = policy
    return config


def batch_of(recipe: StepRecipe, batch_size: int | None = None) -> tuple[Any, ...]:
    """Zeros shaped like the recipe's batch (for compiling only), with `batch_size` rows when given."""
    def leaf(spec: Any) -> Any:
        if isinstance(spec, dict) and set(spec) == {_ARRAY}:
            shape, dtype = spec[_ARRAY]
            rows = batch_size if batch_size is not None and shape else None
            return np.zeros(tuple([rows] + shape[1:]) if rows else tuple(shape), dtype)
        if isinstance(spec, dict):
            return {k: leaf(v) for k, v in spec.items()}
        if isinstance(spec, list):
            return [leaf(v) for v in spec]
        return spec
    return tuple(leaf(part) for part in recipe.batch)


def rebuild(recipe: StepRecipe, variant: StepVariant) -> keras.Model:
    """A fresh model from `recipe` with `variant`'s changes, compiled as the original was.

    Raises:
        NoRecipe: when the recipe holds no compile config (an uncompiled model has no training step).

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile("adam", "mse")
    >>> recipe = recipe_of(model, (np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32")))
    >>> again = rebuild(recipe, StepVariant(8, precision="mixed_bfloat16", accumulation=2))
    >>> again.layers[-1].dtype_policy.name, again.optimizer.gradient_accumulation_steps
    ('mixed_bfloat16', 2)
    """
    if recipe.compile is None:
        raise NoRecipe("the model is not compiled; compile it (model.compile(optimizer, loss)) before planning.")
    config = _with_policy(recipe.model, variant.precision) if variant.precision else copy.deepcopy(recipe.model)
    if variant.remat:
        with keras.RematScope(mode=variant.remat):
            model = _deserialize(config)
    else:
        model = _deserialize(config)
    compile_config = copy.deepcopy(recipe.compile)
    if variant.accumulation > 1:
        compile_config["optimizer"]["config"]["gradient_accumulation_steps"] = variant.accumulation
    model.compile_from_config(compile_config)
    return model
