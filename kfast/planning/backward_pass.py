"""Replaying a training step over its `Step`s (kfast.planning.activations): what is live at each step of the
forward and the backward pass, and the peak. The rules of what each step keeps are in activations.py's NOTE
[ What the backward pass keeps ]; the replay is its last paragraphs.
"""

from __future__ import annotations

import keras  # noqa: F401 - the examples build models

from kfast.planning import activations
from kfast.planning.steps import Step
from kfast.planning.steps import Tensor


def step_bytes(forward: list[Step], float_bytes: int, gradient_bytes: int = 4,
               target: str = "cpu") -> list[tuple[str, int, int]]:
    """What each step of `forward` holds at once, forward pass first (steps named with " (forward)"), then the
    backward pass (see NOTE [ What the backward pass keeps ]): `(step, activation bytes, weight-gradient bytes)`,
    with floating values of `float_bytes` each and weight gradients of `gradient_bytes` per value. Each is linear
    in the batch. The forward pass holds no weight gradients yet; its activations are given less all of them, as
    a breakdown adds the gradients apart. `target` is the compiler, `"cpu"` or `"gpu"`: what one holds and the other
    does not (`Tensor.only`, `Step.cpu_kept`) counts for that one alone.

    Example:

    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="h"), keras.layers.Dense(2, name="o")])
    >>> forward = activations.steps(*activations.trace(model, keras.KerasTensor((16, 8))))
    >>> step_bytes(forward, float_bytes=4)[-2:]  # the backward pass: o's gradients made, then h's
    [('o', 496, 184), ('h', 256, 184)]
    """
    def nbytes(t: Tensor) -> int:
        return 0 if t.only not in (None, target) else t.nbytes(float_bytes)

    needed_by: dict[int, int] = {}
    sizes: dict[int, int] = {}
    carried = {t.key for step in forward if step.gradient for t in step.outputs}  # tensors with a gradient
    produced: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for i, step in enumerate(forward):
        for t in step.kept + (step.cpu_kept if target == "cpu" else []):
            needed_by[t.key] = min(needed_by.get(t.key, i), i)
            sizes[t.key] = t.nbytes(float_bytes)
        for t in step.outputs:
            produced.setdefault(t.key, i)
            if t.kind == "float":
                sizes.setdefault(t.key, t.nbytes(float_bytes))
        for t in step.inputs:
            last_use[t.key] = i
    total = sum(step.weights for step in forward) * gradient_bytes
    out = []
    for i, step in enumerate(forward):  # a tensor lives until its last consumer has run, or its backward
        live = sum(sizes[k] for k, p in produced.items() if k in sizes and p <= i and (
            k in needed_by or last_use.get(k, len(forward)) >= i))
        live += sum(nbytes(t) for s in forward[:i + 1] for t in s.saved)
        out.append((f"{step.name} (forward)", live - total, total))
    # An embedding's gradient is a table-sized buffer its lookups' gradients are scattered into, there from the
    # start of the backward pass (measured: the bidirectional LSTM classifier's 10 MB table).
    weight_gradients = sum(step.weights for step in forward if step.scattered and step.gradient) * gradient_bytes
    for i in range(len(forward) - 1, -1, -1):
        step = forward[i]
        if not step.gradient:
            continue  # its backward does not run
        weight_gradients += 0 if step.scattered else step.weights * gradient_bytes
        # A kept tensor no step made is the model's input (a backend may convert it on the way in): the batch.
        kept = sum(sizes[k] for k, first in needed_by.items() if first <= i and k in produced)
        saved = sum(nbytes(t) for s in forward[:i + 1] for t in s.saved)
        own = sum(sizes[k] for k, p in produced.items() if k in sizes and k in carried and p == i)
        before = [(k, last_use.get(k, -1)) for k, p in produced.items() if k in sizes and k in carried and p < i]
        later = sum(sizes[k] for k, last in before if last > i)  # gradients already begun by later consumers
        inputs = sum(sizes[k] for k, last in before if last == i)  # gradients this step begins
        temporary = sum(nbytes(t) for t in step.temporary)
        live = kept + saved + own + later + inputs + temporary
        if step.activation:  # the activation's backward, then the weights' without the output and its gradient
            kept_own = sum(sizes[k] for k, first in needed_by.items() if first == i and produced.get(k) == i)
            live = max(kept + saved + own + later + temporary, kept - kept_own + saved + later + inputs + temporary)
        # As in the forward pass, what is given is net of the weight gradients not made yet, which a breakdown
        # counts whole: the loss's backward, before any, must not hold them twice.
        out.append((step.name, live - (total - weight_gradients), total))
    return out


def peak_bytes(forward: list[Step], float_bytes: int, gradient_bytes: int = 4,
               target: str = "cpu") -> tuple[int, str]:
    """The activation memory live at the peak of the training step `forward` (see NOTE [ What the backward pass
    keeps ]), with floating values of `float_bytes` each, and the step where it happens: the step of `step_bytes`
    where activations and the weight gradients made so far (`gradient_bytes` per value) hold the most together.

    Example:

    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu", name="h"),
    ...                           keras.layers.Dense(2, name="o")])
    >>> peak_bytes(activations.steps(*activations.trace(model, keras.KerasTensor((16, 8)))), float_bytes=4)  # h's output, 2 gradients
    (768, 'h')
    """
    best, where, most = 0, "none", -1
    for name, live, weight_gradients in step_bytes(forward, float_bytes, gradient_bytes, target):
        if live > most:
            best, where, most = live, name, live
    return best, where
