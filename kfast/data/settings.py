"""LoaderSettings: FastLoader's `workers`, `use_multiprocessing` and `max_queue_size`, as one value."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

_FIELDS = ("workers", "use_multiprocessing", "max_queue_size")


@dataclasses.dataclass(frozen=True, eq=False)
class LoaderSettings(Mapping):
    """The three settings that decide how a `FastLoader` makes batches, as Keras names them.

    What `FastLoader.settings` reports, what `kfast.tune` chooses (`TuneResult.settings`) and what its
    cache keeps. It also reads as a mapping, as these settings did before they had a type of their own:
    `FastLoader(dataset, **settings)`, `settings["workers"]` and `settings == {...}` work.

    Args:
        workers: worker processes or threads.
        use_multiprocessing: processes (`True`) or threads (`False`).
        max_queue_size: batches requested ahead of the training loop.

    Example:

    >>> settings = LoaderSettings(workers=2, use_multiprocessing=True, max_queue_size=8)
    >>> settings["workers"], dict(settings) == {"workers": 2, "use_multiprocessing": True, "max_queue_size": 8}
    (2, True)
    >>> settings.replace(workers=4)
    LoaderSettings(workers=4, use_multiprocessing=True, max_queue_size=8)
    """

    workers: int
    use_multiprocessing: bool
    max_queue_size: int

    def replace(self, **changes: Any) -> LoaderSettings:
        """Returns a copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Returns the settings as a plain dict (JSON-serialisable)."""
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> LoaderSettings:
        """Builds settings from a mapping holding (at least) the three keys."""
        return cls(**{name: values[name] for name in _FIELDS})

    def __getitem__(self, key: str) -> Any:
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return self.to_dict() == dict(other.items())

    def __hash__(self) -> int:
        return hash((self.workers, self.use_multiprocessing, self.max_queue_size))
