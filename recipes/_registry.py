"""The recipes by name: each is one module with `SUMMARY`, `add_arguments(parser)` and `build(args)`."""

from __future__ import annotations

import importlib
from types import ModuleType

_MODULES = {
    "image-classification": "kfast.recipes.image_classification",
    "tabular": "kfast.recipes.tabular",
    "text-classification": "kfast.recipes.text_classification",
}


def names() -> list[str]:
    """Returns the recipe names, sorted."""
    return sorted(_MODULES)


def get(name: str) -> ModuleType:
    """Returns the recipe module called `name`.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in _MODULES:
        raise ValueError(f"unknown recipe {name!r}; choose one of: {', '.join(names())} (see `kfast recipes`).")
    return importlib.import_module(_MODULES[name])
