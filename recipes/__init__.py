"""Ready-made training recipes (installed as `kfast.recipes`), picked by name.

Each recipe is one module with `SUMMARY`, `add_arguments(parser)` and `build(args) -> Recipe`; `run`
turns any of them into a complete single-process or Horovod training job.

Example:

>>> kfast.recipes.names()
['image-classification', 'tabular', 'text-classification']
"""

import importlib

from kfast.recipes._common import Recipe
from kfast.recipes._common import run

_MODULES = {
    "image-classification": "kfast.recipes.image_classification",
    "tabular": "kfast.recipes.tabular",
    "text-classification": "kfast.recipes.text_classification",
}

__all__ = ["Recipe", "get", "names", "run"]


def names():
    """Returns the recipe names, sorted."""
    return sorted(_MODULES)


def get(name):
    """Returns the recipe module called `name`.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in _MODULES:
        raise ValueError(f"unknown recipe {name!r}; choose one of: {', '.join(names())} (see `kfast recipes`).")
    return importlib.import_module(_MODULES[name])
