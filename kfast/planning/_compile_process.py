"""The JAX process that compiles a step for a GPU: `python -m kfast.planning._compile_process JOB RESULT`.

kfast starts it (kfast.planning.gpu_compile) when the user's process cannot compile for the GPU itself: Keras runs
on TensorFlow or PyTorch there, or JAX was imported before its CUDA plugin could register without a GPU. JOB is
JSON: {"recipe": StepRecipe, "device": name, "variants": [StepVariant, ...]}; RESULT gets one entry per variant,
a CompiledStepMemory's dict or {"error": text}. Keras runs on JAX here whatever the user's backend is.
"""

from __future__ import annotations

import json
import os
import sys


def main(job_path: str, result_path: str) -> int:
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the CUDA plugin registers without a GPU only so
    from kfast.planning import gpu_compile
    from kfast.planning.step_variants import StepRecipe
    from kfast.planning.step_variants import StepVariant

    with open(job_path) as f:
        job = json.load(f)
    recipe = StepRecipe(**job["recipe"])
    results = []
    for variant in job["variants"]:
        try:
            step = gpu_compile.compile_recipe(recipe, StepVariant.from_dict(variant), job["device"])
            results.append(step.to_dict())
        except Exception as e:  # one variant failing leaves the others' numbers standing
            results.append({"error": f"{type(e).__name__}: {e}"})
    with open(result_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
