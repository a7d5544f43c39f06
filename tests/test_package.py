"""The package installs as designed: callbacks/ and recipes/ only as kfast.callbacks / kfast.recipes."""

import os
import subprocess
import sys

from helpers import REPO


def _python(code, cwd, env=None):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_public_api_imports():
    import kfast
    import kfast.callbacks
    import kfast.recipes

    assert kfast.__version__ == "0.1.0"
    assert os.path.samefile(os.path.dirname(kfast.callbacks.__file__), os.path.join(REPO, "callbacks"))


def test_editable_install_maps_subpackages(tmp_path):
    # Run outside the repository so the working directory cannot make `callbacks` importable.
    ok = _python("import kfast.callbacks, kfast.recipes; print('ok')", cwd=tmp_path)
    assert ok.stdout.strip() == "ok", ok.stderr
    for top in ("callbacks", "recipes"):
        bad = _python(f"import {top}", cwd=tmp_path)
        assert bad.returncode != 0 and "No module named" in bad.stderr
