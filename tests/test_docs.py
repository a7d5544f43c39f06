"""The documentation site: every ```python block of every docs/ page runs as users would paste it, and the
site builds with `mkdocs build --strict`.

Each block runs in a fresh interpreter after DOCS_PRELUDE (a small compiled `model`, a seeded `dataset`),
in an empty folder, and must show that it did what it says: a model it trained for two or more epochs
ended with a lower loss, or a file or folder it names was written. A block that needs horovodrun or the
user's own project says so after its language, ```python test="skip: <reason>"`, and the reason names the
test that runs it instead (see docs/contributing.md).
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import DOCS_PRELUDE, REPO, code_blocks, markdown_pages

# After the block: every Keras History it left (its own, or `model.history`) that covers two or more epochs
# must end with a lower loss than it began; the epochs of each are reported on the last line.
POSTLUDE = '''
import json as _json, keras as _keras
_histories = {id(v): v for v in list(globals().values()) if isinstance(v, _keras.callbacks.History)}
if isinstance(globals().get("model"), _keras.Model) and isinstance(getattr(model, "history", None), _keras.callbacks.History):
    _histories[id(model.history)] = model.history
_trained = []
for _h in _histories.values():
    _loss = _h.history.get("loss", [])
    if len(_loss) >= 2:
        assert _loss[-1] < _loss[0], f"the loss did not decrease: {_loss}"
        _trained.append(len(_loss))
print("DOCS-BLOCK-TRAINED", _json.dumps(_trained))
'''

SKIP = re.compile(r"^skip: (?P<reason>.*\S)$")


def _python_blocks():
    for page in markdown_pages():
        if not page.startswith("docs/"):
            continue  # README's blocks: tests/test_readme_quick_start.py
        with open(os.path.join(REPO, page)) as f:
            for block in code_blocks(f.read()):
                if block["lang"] == "python":
                    yield pytest.param(page, block, id=f"{page[len('docs/'):]}:{block['line']}")


BLOCKS = list(_python_blocks())


def _named_paths(code):
    """The string literals of the block's code: the files and folders it may write."""
    return {node.value for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and re.fullmatch(r"[\w.-]+(/[\w.-]+)*", node.value)}


def _written(path):
    return path.is_file() and path.stat().st_size > 0 or path.is_dir() and any(path.iterdir())


def _skip_reason(page, block):
    test = block["attrs"].get("test")
    if test is None:
        return None
    match = SKIP.match(test)
    assert match, f"{page}:{block['line']}: test={test!r}; the only form is test=\"skip: <reason>\""
    reason = match["reason"]
    named = re.findall(r"tests/[\w/]+\.py", reason)
    assert named, f"{page}:{block['line']}: the skip reason {reason!r} must name the test that runs the block"
    for path in named:
        with open(os.path.join(REPO, path)) as f:  # FileNotFoundError: the named test does not exist
            assert "_snippet(" in f.read(), f"{path} does not read a documentation snippet"
    return reason


def test_the_guides_have_python_blocks_to_run_and_few_skipped():
    skipped = [p for p in BLOCKS if p.values[1]["attrs"].get("test")]
    assert len(BLOCKS) >= 8 and len(skipped) <= 3, [p.id for p in skipped]


@pytest.mark.slow  # each block in a fresh Python that imports TensorFlow
@pytest.mark.parametrize(("page", "block"), BLOCKS)
def test_the_block_runs_as_written(page, block, tmp_path):
    reason = _skip_reason(page, block)
    if reason is not None:
        pytest.skip(reason)
    script = tmp_path / "block.py"
    script.write_text(DOCS_PRELUDE + block["code"] + POSTLUDE)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KFAST_CACHE_DIR": str(tmp_path / "cache"),
           "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    where = f"{page}:{block['line']}"
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("DOCS-BLOCK-TRAINED "), proc.stdout[-2000:]
    trained = json.loads(last.split(" ", 1)[1])
    written = sorted(name for name in _named_paths(block["code"]) if _written(tmp_path / name))
    assert trained or written, f"{where} neither trained a model for 2+ epochs nor wrote a file it names"


def test_the_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable))
    if mkdocs is None:
        pytest.skip(f"MkDocs is not installed beside {sys.executable} (the docs extra); make test builds the "
                    "site in .venv")
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, timeout=240, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for page in ("index.html", "loader/index.html", "reference/data/index.html"):
        assert (tmp_path / "site" / page).stat().st_size > 0
    # The API reference was generated from the docstrings, not left empty.
    with open(tmp_path / "site" / "reference" / "data" / "index.html") as f:
        assert 'id="kfast.data.FastLoader"' in f.read()
