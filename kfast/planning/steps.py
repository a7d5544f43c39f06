"""The forward pass as kfast's memory estimate sees it: `Step`s (a layer call, or a composite layer's own code)
holding `Tensor`s, which kfast.planning.activations builds from a model's layers and kfast.planning.backward_pass
replays."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field

import numpy as np


@dataclass(frozen=True)
class Tensor:
    """One traced tensor: `values` at the traced batch, and its kind: "float" (stored in the compute
    dtype), "float32" (float32 whatever the policy), or an integer/bool dtype name.

    Example:

    >>> Tensor(key=1, values=10, kind="float").nbytes(2), Tensor(key=2, values=10, kind="bool").nbytes(2)
    (20, 10)
    """

    key: int
    values: int
    kind: str
    only: str | None = None  # "cpu" or "gpu": held on that compiler's step alone (see the NOTE)

    def nbytes(self, float_bytes: int) -> int:
        if self.kind == "float":
            return self.values * float_bytes
        return self.values * (4 if self.kind == "float32" else np.dtype(self.kind).itemsize)


@dataclass
class Step:
    """One step of the forward pass (a layer call, or a composite layer's own code) and what its backward
    needs: `kept` tensors shared with other steps, `saved` tensors of its own, `temporary` ones.

    Example:

    >>> step = Step("dense", outputs=[Tensor(key=7, values=64, kind="float")])
    >>> step.kept, step.weights
    ([], 0)
    """

    name: str
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[Tensor] = field(default_factory=list)
    kept: list[Tensor] = field(default_factory=list)
    cpu_kept: list[Tensor] = field(default_factory=list)  # kept on XLA's CPU backend alone (see the NOTE)
    saved: list[Tensor] = field(default_factory=list)
    temporary: list[Tensor] = field(default_factory=list)
    weights: int = 0  # trainable values of the layer: its gradients appear at this step of the backward pass
    activation: bool = False  # its backward runs in two phases: the activation's, then the weights'
    scattered: bool = False  # its weights' gradient is scattered into, from the backward pass's start (Embedding)
    gradient: bool = True  # a gradient reaches its outputs, so its backward runs (False: frozen, before any weight)
