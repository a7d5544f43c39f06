"""TensorFlow's start-up lines are told apart from real output, as TensorFlow and horovodrun print them."""

import io
import os
import subprocess
import sys

from helpers import REPO
from kfast._core import tf_noise

STARTUP = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795988394.179937   24508 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. To turn "
    "them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795988394.277964   24508 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI FMA, in other operations, rebuild TensorFlow "
    "with the appropriate compiler flags.",
]
REAL = [
    "W0000 00:00:1795988394.1   24508 op_level_cost_estimator.cc:699] Error in PredictCost() for the op",
    "E0000 00:00:1795988394.1   24508 cuda_dnn.cc:8579] Unable to register cuDNN factory",
    "I0000 00:00:1795988394.1   24508 port.cc:153] something else",
    "UserWarning: resource_tracker: There appear to be 1 leaked shared_memory objects",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR, and more",
    "Epoch 1/2",
]


def test_startup_lines_match_bare_and_with_horovodrun_prefixes():
    for line in STARTUP:
        for prefix in ("", "[0]<stderr>:", "[12]<stdout>:", "Mon Nov 29 21:44:36 2025[1]<stderr>:"):
            assert tf_noise.is_noise(prefix + line + "\n"), prefix + line
            assert tf_noise.is_noise((prefix + line).encode())


def test_real_warnings_and_errors_pass():
    for line in REAL:
        for prefix in ("", "[0]<stderr>:"):
            assert not tf_noise.is_noise(prefix + line), prefix + line


def test_what_tensorflow_prints_on_import_is_all_startup_noise():
    proc = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and len(lines) >= 3, proc.stderr
    assert [line for line in lines if not tf_noise.is_noise(line)] == []


def test_copy_drops_only_startup_lines_unless_asked(monkeypatch):
    text = "".join(f"[0]<stderr>:{line}\n" for line in STARTUP + REAL).encode()
    out = io.BytesIO()
    tf_noise.copy(io.BytesIO(text), out)
    assert out.getvalue().decode().splitlines() == [f"[0]<stderr>:{line}" for line in REAL]
    monkeypatch.setenv(tf_noise.SHOW_VARIABLE, "1")
    out = io.BytesIO()
    tf_noise.copy(io.BytesIO(text), out)
    assert out.getvalue() == text


def test_filter_runs_as_a_script_without_starting_tensorflow():
    script = os.path.join(REPO, "kfast", "_core", "tf_noise.py")
    feed = "\n".join(STARTUP + ["kept"]) + "\n"
    proc = subprocess.run([sys.executable, "-X", "importtime", script], input=feed, capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout == "kept\n"
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "re" in imported  # -X importtime lists every module imported
    assert not [m for m in imported if m.split(".")[0] in ("kfast", "tensorflow", "keras")]
