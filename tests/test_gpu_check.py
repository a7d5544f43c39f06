"""scripts/gpu_check.sh --dry-run: the GPU check's whole flow on CPU, with a scripted sampler for NVML.

`make test` runs it in .venv and again in .venv-jax and .venv-torch, so the flow is exercised on the
backends the real check runs on."""

import importlib.util
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from helpers import REPO

SCRIPTS = os.path.join(REPO, "scripts")
VERDICT = r"(input-bound|compute-bound|balanced|uncertain)"  # uncertain: the ranges allow two


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(SCRIPTS, "gpu_check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_dry_run_reports_doctor_gpu_monitor_and_both_feeds_side_by_side(tmp_path):
    # The tier's own backend (the suite's venv has JAX too, for kfast[plan-gpu], and the script prefers it).
    env = {**os.environ, "PYTHON": sys.executable, "TF_CPP_MIN_LOG_LEVEL": "3", "KFAST_CACHE_DIR": str(tmp_path),
           "GPU_CHECK_TIMEOUT": "240", "KERAS_BACKEND": keras.backend.backend()}
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "gpu_check.sh"), "--dry-run"], capture_output=True,
                          text=True, timeout=280, cwd=tmp_path, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    backend = keras.backend.backend()
    assert "(DRY RUN: CPU, tiny sizes, scripted GPU sampler)" in out and f"on {backend}, kfast" in out
    assert "  |   works here    FastLoader, ArrayDataset, diagnose, tune" in out  # kfast doctor's own report
    assert "NVML: no GPU visible" in out and "a scripted sampler stands in for NVML" in out
    assert f"== GPUMonitor during fit ({backend})" in out
    # The scripted sampler alternates 30% and 70%: an epoch's mean lies between, by how many samples it took.
    assert re.search(r"\[PASS\] GPUMonitor: scripted samples reach the logs \(utilisation ([3-6]\d|70)% > 0", out)
    assert "decoded with Pillow, random crop 40, resize to 32" in out
    assert re.search(r"kfast\.tune: \d+ (thread|process)", out)
    assert re.search(r"\n  loader settings +Keras's default \(1 thread\) +\d+ (thread|process)", out)
    assert re.search(r"\n  steps/s +\d+\.\d +\d+\.\d\n", out)
    means = re.search(r"\n  GPU utilisation \(mean\) +(\d+)% +(\d+)%\n", out)
    assert means and all(30 <= int(m) <= 70 for m in means.groups()), out
    assert re.search(rf"\n  kfast\.diagnose verdict +{VERDICT} +{VERDICT}\n", out)
    assert re.search(r"\nAll checks passed in 0m\d\ds\.$", out.rstrip())


def test_without_pillow_the_workload_does_numpy_work_and_says_so(tmp_path, monkeypatch, capsys):
    gpu_check = _gpu_check_module()
    images = gpu_check.AugmentedImages(None, count=16, batch=4, crop=12, side=8)
    x, y = images[1]
    assert x.shape == (4, 8, 8, 3) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    assert y.tolist() == [4, 5, 6, 7] and np.array_equal(images[1][0], x)
    monkeypatch.setattr(gpu_check, "_pillow", lambda: None)
    monkeypatch.setenv("KFAST_CACHE_DIR", str(tmp_path))
    plain, tuned = gpu_check.compare_feeds(gpu_check.SIZES["dry"], gpu_check.ScriptedSampler(), str(tmp_path))
    assert "Pillow is not installed: 48 images made with numpy work of about a decode's cost" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.jpg"))
    for side in (plain, tuned):
        assert float(side["steps/s"]) > 0 and re.fullmatch(VERDICT, side["kfast.diagnose verdict"])


def test_the_check_venv_sees_the_packages_of_a_python_that_is_itself_a_venv(tmp_path):
    # GPU images keep JAX and PyTorch in a venv (/opt/torch/.venv on the H200 machines here): a venv made from
    # it with --system-site-packages alone saw neither, and Keras fell back to TensorFlow (found on an H200).
    parent = tmp_path / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(parent)], check=True, timeout=120)
    site = subprocess.run([str(parent / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    with open(os.path.join(site, "framework_of_the_image.py"), "w") as f:
        f.write("NAME = 'jax'\n")
    child = tmp_path / "check-venv"
    subprocess.run(["bash", os.path.join(SCRIPTS, "gpu_check_venv.sh"), str(parent / "bin" / "python"), str(child)],
                   check=True, timeout=120, capture_output=True)
    seen = subprocess.run([str(child / "bin" / "python"), "-c", "import framework_of_the_image as m; print(m.NAME)"],
                          capture_output=True, text=True, timeout=60)
    assert seen.returncode == 0 and seen.stdout.strip() == "jax", seen.stderr
