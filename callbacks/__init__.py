"""Keras callbacks from kfast (installed as `kfast.callbacks`)."""

__all__ = []
