"""Kept so that `python -m kfast.link_probe`, which `kfast plan --hosts` of an earlier kfast starts on
each host, still works; the module is `kfast.planning.link_probe`."""

from kfast.planning.link_probe import _probe

if __name__ == "__main__":
    _probe()
