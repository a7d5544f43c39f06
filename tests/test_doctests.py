"""Every `>>>` example in kfast's docstrings runs, so the documentation cannot drift from the code.

The few examples that need a cluster, a GPU or Horovod initialised for the whole process are marked
`+SKIP`, and the text before each says why.
"""

import doctest
import importlib
import io

import keras
import numpy as np
import pytest

import kfast
from test_structure import _modules
from test_structure import _read

EXAMPLES = sorted(name for name, path in _modules().items() if ">>>" in _read(path))
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.mark.parametrize("name", EXAMPLES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    # Examples may write files (checkpoints, logs) and tune's cache: keep both out of the checkout and home.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KFAST_CACHE_DIR", str(tmp_path / "cache"))
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder().find(module, extraglobs={"kfast": kfast, "keras": keras, "np": np})
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in tests:
        runner.run(test, out=out.write)
    assert sum(len(test.examples) for test in tests), f"{name} has '>>>' in its source but doctest found none"
    assert runner.summarize(verbose=False).failed == 0, out.getvalue()


def test_only_examples_that_need_a_cluster_or_a_gpu_are_skipped():
    skipped = sorted(name for name, path in _modules().items() if "doctest: +SKIP" in _read(path))
    assert skipped == ["kfast.distributed.collectives", "kfast.env.preflight", "kfast.nvml"], skipped
