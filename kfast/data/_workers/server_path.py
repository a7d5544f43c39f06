"""Imported only by multiprocessing's fork server, first of its preloads: it gives the server the training
process's `sys.path`.

Python 3.11's fork server is handed the parent's `sys.path` but never applies it (it starts as `python -c`,
whose path is the standard one), so a dataset module found through the script's own directory or a path
added at run time failed to preload, silently: every worker then imported it itself, and with it Keras and
TensorFlow, about 2 s per worker at every loader start. Workers get the parent's path anyway (multiprocessing
sends it with each process), so the server only catches up with them.
"""

import json
import os
import sys

from kfast.data._workers.server_env import PATH_VARIABLE

if __name__ != "__main__":
    _path = os.environ.get(PATH_VARIABLE)
    if _path:
        parent = [p for p in json.loads(_path) if isinstance(p, str)]
        sys.path[:] = parent + [p for p in sys.path if p not in parent]
