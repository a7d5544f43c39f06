"""`python -m kfast.cli`: how horovodrun starts each rank of `kfast launch`."""

import sys

from kfast.cli import main

sys.exit(main())
