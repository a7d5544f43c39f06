"""XLA's memory for a training step on a GPU this machine need not have, whatever backend Keras runs on here.

`compile_step` compiles the step as it is; `compile_variants` compiles changed versions of it (another precision,
gradient accumulation, rematerialisation, a model axis). Where it runs:
  - the step as it is compiles in this process when Keras runs on JAX and JAX's CUDA plugin is registered: the
    user's own model object, so a model Keras cannot serialize is planned too;
  - otherwise, and for every changed version, in a JAX process of its own (kfast.planning._compile_process) fed
    the model's config (`StepRecipe`): a TensorFlow or PyTorch user gets the GPU's numbers, rebuilding a model
    leaves the user's process (its layer names, its memory) as it was, and one process compiles all variants.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import keras

from kfast.planning import deviceless
from kfast.planning import gpus
from kfast.planning import step_variants
from kfast.planning.step_variants import StepRecipe
from kfast.planning.step_variants import StepVariant
from kfast.planning.xla_memory import CompiledStepMemory
from kfast.planning.xla_memory import compiled_step_memory

# A compile of a large model takes minutes on two cores; past this the JAX process is stopped and said so.
TIMEOUT_S = 1800.0


def compile_recipe(recipe: StepRecipe, variant: StepVariant, device: str) -> CompiledStepMemory:
    """Rebuilds the model of `recipe` with `variant`'s changes and compiles its step for `device` (Keras on JAX).

    Example:

    >>> import numpy as np
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile("sgd", "mse")
    >>> recipe = step_variants.recipe_of(model, (np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32")))
    >>> if keras.backend.backend() == "jax" and deviceless.available():
    ...     print(compile_recipe(recipe, StepVariant(8), "H100").argument)
    ... else:
    ...     print(168)
    168
    """
    model = step_variants.rebuild(recipe, variant)
    batch = step_variants.batch_of(recipe)
    return compiled_step_memory(model, batch, batch_size=variant.micro_batch, device=device, mesh=variant.mesh)


def _here(device: str) -> bool:
    """Whether this process can compile for `device`: Keras on JAX and the CUDA plugin registered.

    Raises:
        GpuCompileUnavailable: when the packages are missing (no other process would have them either).
    """
    deviceless.check_available()
    if keras.backend.backend() != "jax":
        return False
    try:
        deviceless.topology(gpus.gpu_spec(device), 1)
    except deviceless.GpuCompileUnavailable:
        return False  # JAX started before the plugin could register: a process of its own can
    return True


def compile_step(model: keras.Model, batch: Any, variant: StepVariant, device: str) -> CompiledStepMemory:
    """XLA's memory for `model`'s step as `variant` runs it, on `device`: in this process where it can.

    Raises:
        GpuCompileUnavailable: when the GPU compile's packages are missing.
        NoRecipe: when the step must be compiled elsewhere and Keras cannot rebuild the model from its config.
        RuntimeError: when XLA fails to compile the step (the message holds XLA's).
    """
    if not variant.changes_model and _here(device):
        return compiled_step_memory(model, batch, batch_size=variant.batch_size, device=device, mesh=variant.mesh)
    result = compile_variants(model, batch, [variant], device)[0]
    if isinstance(result, str):
        raise RuntimeError(f"the step could not be built and compiled on JAX for {device}: {result}")
    return result


def compile_variants(model: keras.Model, batch: Any, variants: list[StepVariant],
                     device: str) -> list[CompiledStepMemory | str]:
    """XLA's memory for each of `variants` of `model`'s step on `device`, compiled in one JAX process; a variant
    that fails to compile gets its error's text instead.

    Raises:
        GpuCompileUnavailable: when the GPU compile's packages are missing.
        NoRecipe: when Keras cannot rebuild the model from its config.
        RuntimeError: when the JAX process fails or runs past `TIMEOUT_S` (its output's end in the message).
    """
    deviceless.check_available()
    gpus.gpu_spec(device)
    recipe = step_variants.recipe_of(model, batch)
    with tempfile.TemporaryDirectory(prefix="kfast-plan-") as folder:
        job, result = os.path.join(folder, "job.json"), os.path.join(folder, "result.json")
        with open(job, "w") as f:
            json.dump({"recipe": recipe.to_dict(), "device": device, "variants": [v.to_dict() for v in variants]}, f)
        env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
        try:
            done = subprocess.run([sys.executable, "-m", "kfast.planning._compile_process", job, result], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"compiling {len(variants)} step(s) for {device} ran past {TIMEOUT_S:.0f} s and was "
                               "stopped; plan a smaller batch, or method='analytical'.") from e
        if done.returncode != 0 or not os.path.exists(result):
            tail = "\n".join(done.stdout.splitlines()[-15:])
            raise RuntimeError(f"kfast's JAX compile process for {device} ended with status {done.returncode}:\n"
                               f"{tail}")
        with open(result) as f:
            out = json.load(f)
    return [r["error"] if "error" in r else CompiledStepMemory(**{k: v for k, v in r.items() if k != "total"})
            for r in out]
