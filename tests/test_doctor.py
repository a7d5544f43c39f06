import json
import os
import subprocess
import sys

from kfast.env import doctor

KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")


def _kfast(*args):
    return subprocess.run([KFAST, *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def test_doctor_json_reports_this_environment():
    proc = _kfast("doctor", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    import keras
    import tensorflow as tf

    assert report["keras"]["version"] == keras.__version__
    assert report["keras"]["backend"] == "tensorflow"
    assert report["tensorflow"]["version"] == tf.__version__
    hvd = report["horovod"]
    assert hvd["installed"] and hvd["version"] == "0.28.1"
    assert hvd["gloo"] is True and hvd["mpi"] is False
    assert hvd["built_for_tensorflow"] == tf.__version__ and hvd["tensorflow_matches"] is True
    assert report["cpus"]["usable"] >= 1
    assert report["nvidia_ml_py"]["version"]
    # CI machines have no NVIDIA driver: the report must say so instead of listing GPUs.
    if not report["gpus"]:
        assert "driver" in report["gpus_reason"] or "NVML" in report["gpus_reason"]
    assert not [p for p in report["problems"] if p["severity"] == "error"]


def test_doctor_text_lists_every_piece():
    proc = _kfast("doctor")
    assert proc.returncode == 0, proc.stderr
    for label in ("python", "keras", "tensorflow", "horovod", "nvidia-ml-py", "cpus"):
        assert f"\n  {label} " in proc.stdout
    assert "built with gloo" in proc.stdout and "(matches)" in proc.stdout


def test_tensorflow_mismatch_is_an_error_with_a_fix():
    report = {"problems": []}
    doctor._check_horovod(report, tf_version="0.0.1")
    assert report["horovod"]["tensorflow_matches"] is False
    assert doctor.has_errors(report)
    (problem,) = report["problems"]
    assert "built for TensorFlow" in problem["problem"] and "0.0.1" in problem["problem"]
    assert "install_horovod.sh" in problem["fix"]


def test_help_lists_commands():
    proc = _kfast("--help")
    assert proc.returncode == 0 and "doctor" in proc.stdout


def test_doctor_says_kfast_needs_linux_elsewhere():
    from kfast.env import doctor

    report = {"problems": []}
    doctor._check_platform(report, system="darwin")
    assert report["problems"][0]["severity"] == "error" and "Linux only" in report["problems"][0]["problem"]
    report = {"problems": []}
    doctor._check_platform(report, system="linux")
    assert report["problems"] == []
