"""Ready-made training recipes (installed as `kfast.recipes`)."""

__all__ = []
