"""Model parallel over a `(data, model)` mesh: which kernels split, and the `keras.distribution.LayoutMap` for it.

One rule, used both for the memory prediction (`kfast.planning.memory_model`) and for the layout a JAX engine
hands to `keras.distribution.ModelParallel`: a kernel (a trainable variable of two or more dimensions: Dense,
EinsumDense and Conv kernels, Embedding tables) is split over the "model" axis along its last dimension that
the axis divides, the output side first (Megatron's column split: no all-reduce inside the layer); a Dense or
Conv bias follows its kernel's last dimension. Everything else is replicated, and the batch is split over the
"data" axis.
"""

from __future__ import annotations

from typing import Any

import keras

AXES = ("data", "model")


def split_axis(shape: tuple[int, ...], model_axis: int) -> int | None:
    """The dimension of a kernel of `shape` split over a model axis of `model_axis` devices, or `None`
    (replicated): the last one that `model_axis` divides, for kernels of two or more dimensions.

    Example:

    >>> split_axis((512, 1024), 4), split_axis((3, 3, 64, 30), 4), split_axis((10,), 4)
    (1, 2, None)
    """
    if model_axis <= 1 or len(shape) < 2:
        return None
    for axis in range(len(shape) - 1, -1, -1):
        if shape[axis] % model_axis == 0:
            return axis
    return None


def variable_axes(model: keras.Model, model_axis: int) -> dict[str, tuple[str | None, ...]]:
    """{variable path: mesh axis of each dimension} for every variable of `model` that splits over a model axis of
    `model_axis` devices; the rest are replicated.

    Example:

    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="a")], name="s")
    >>> variable_axes(model, 2)
    {'s/a/kernel': (None, 'model'), 's/a/bias': ('model',)}
    """
    out: dict[str, tuple[str | None, ...]] = {}
    owners: dict[str, list[Any]] = {}
    for v in model.trainable_variables:
        owners.setdefault(v.path.rpartition("/")[0], []).append(v)
    for variables in owners.values():
        kernels = [v for v in variables if len(v.shape) >= 2]
        split_last = False
        for v in kernels:
            axis = split_axis(tuple(v.shape), model_axis)
            if axis is not None:
                out[v.path] = tuple("model" if i == axis else None for i in range(len(v.shape)))
                split_last = split_last or axis == len(v.shape) - 1
        biases = [v for v in variables if v.path.rpartition("/")[2] == "bias" and len(v.shape) == 1]
        if split_last and len(kernels) == 1 and len(biases) == 1 and biases[0].shape[0] % model_axis == 0:
            out[biases[0].path] = ("model",)
    return out


def split_paths(model: keras.Model, model_axis: int) -> set[str]:
    """The paths of `model`'s variables that split over a model axis of `model_axis` devices.

    Example:

    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="a"),
    ...                           keras.layers.Dense(3, name="b")], name="s")
    >>> sorted(split_paths(model, 4))
    ['s/a/bias', 's/a/kernel', 's/b/kernel']
    """
    return set(variable_axes(model, model_axis))


def propose_layout_map(model: keras.Model, mesh: keras.distribution.DeviceMesh | tuple[int, int]) -> Any:
    """A `keras.distribution.LayoutMap` that splits `model`'s kernels over the mesh's "model" axis.

    Use it with `keras.distribution.ModelParallel(layout_map=..., batch_dim_name="data")` under Keras on
    JAX. The keys are the variables' exact paths; variables left out are replicated.

    Args:
        model: a built Keras model.
        mesh: a `keras.distribution.DeviceMesh` with axes `("data", "model")`, or its shape `(data, model)`:
            then the mesh is over this machine's devices when there are that many (Keras's
            `list_devices()`), else over placeholders named `device:0`, ... for a layout planned elsewhere.

    Returns:
        The `keras.distribution.LayoutMap`.

    Raises:
        ValueError: for a mesh that is not `(data, model)` positive sizes or lacks those axis names.

    Example:

    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="a"),
    ...                           keras.layers.Dense(3, name="b")], name="s")
    >>> layout = propose_layout_map(model, (2, 4))
    >>> layout["s/a/kernel"].axes, layout["s/a/bias"].axes, layout["s/b/kernel"].axes
    ((None, 'model'), ('model',), ('model', None))
    """
    if not isinstance(mesh, keras.distribution.DeviceMesh):
        shape = tuple(mesh)
        if len(shape) != 2 or not all(isinstance(n, int) and n >= 1 for n in shape):
            raise ValueError(f"propose_layout_map got mesh={mesh!r}; expected a keras.distribution.DeviceMesh or "
                             "its shape (data, model), e.g. (2, 4).")
        try:
            devices = keras.distribution.list_devices()
        except Exception:  # a backend without Keras's distribution support (PyTorch): a layout planned here
            devices = []
        if len(devices) != shape[0] * shape[1]:
            devices = [f"device:{i}" for i in range(shape[0] * shape[1])]
        mesh = keras.distribution.DeviceMesh(shape, list(AXES), devices=devices)
    if "model" not in mesh.axis_names or "data" not in mesh.axis_names:
        raise ValueError(f"propose_layout_map got a mesh with axes {tuple(mesh.axis_names)}; it needs "
                         "('data', 'model').")
    layout_map = keras.distribution.LayoutMap(mesh)
    for path, axes in variable_axes(model, mesh.shape[list(mesh.axis_names).index("model")]).items():
        layout_map[path] = axes
    return layout_map
