"""Kept so that `python -m kfast.preflight DIR`, which a launch host of an earlier kfast runs over ssh,
still works; the module is `kfast.env.preflight`."""

import sys

from kfast.env.preflight import main

if __name__ == "__main__":
    sys.exit(main())
