"""Ready-made training recipes (installed as `kfast.recipes`), picked by name.

Each recipe is one module with `SUMMARY`, `add_arguments(parser)` and `build(args) -> Recipe`; `run`
turns any of them into a complete single-process or Horovod training job.

Example:

>>> kfast.recipes.names()
['image-classification', 'tabular', 'text-classification']
"""

from kfast.recipes._common import Recipe
from kfast.recipes._common import run
from kfast.recipes._registry import get
from kfast.recipes._registry import names

__all__ = ["Recipe", "get", "names", "run"]
