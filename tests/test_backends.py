"""kfast on the Keras backend this run uses. `make test` runs this file in .venv (TensorFlow) and again, with
the loader, diagnosis, tuning and monitor tests, in .venv-jax and .venv-torch, which have no TensorFlow."""

import os
import warnings

import keras
import pytest

from kfast.env import doctor
from kfast import nvml
from kfast._core import topology
from kfast.distributed import collectives

BACKEND = keras.backend.backend()


def test_keras_runs_on_the_backend_this_run_asked_for():
    # A stale ~/.keras/keras.json or a typo must not turn the JAX or PyTorch run into another TensorFlow run.
    assert BACKEND == os.environ.get("KERAS_BACKEND", "tensorflow")


@pytest.fixture
def elsewhere(monkeypatch):
    """kfast.distributed, fresh, with Keras on a backend that has no engine (PyTorch: this one, or pretended)."""
    monkeypatch.setattr(topology, "_current", None)  # init() not run yet (the topology keeps that fact)
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    if BACKEND != "torch":
        monkeypatch.setattr(collectives, "_keras_backend", lambda: "torch")
    return "torch"


def test_distributed_under_horovodrun_needs_the_tensorflow_backend(elsewhere, monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "0")
    with pytest.raises(RuntimeError, match=rf"Horovod on Keras's TensorFlow backend or with Keras's own distribution "
                                           rf"on its JAX backend, but this process runs Keras on {elsewhere}\. Set "
                                           "KERAS_BACKEND=tensorflow"):
        collectives.init()
    assert not collectives.is_initialized()


def test_distributed_without_horovodrun_says_why_it_runs_as_one_process(elsewhere):
    with pytest.warns(UserWarning, match=rf"runs Keras on {elsewhere}\. .*; running as a single process"):
        collectives.init()
    assert (collectives.rank(), collectives.size(), collectives.is_chief()) == (0, 1, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collectives.init()  # a second call is quiet


def test_doctor_says_what_works_on_this_backend():
    report = doctor.collect()
    works = report["keras"]["works"]
    assert report["keras"]["backend"] == BACKEND
    assert set(doctor.EVERY_BACKEND) <= set(works)
    assert ("kfast.distributed" in works) == (BACKEND in ("tensorflow", "jax"))
    text = doctor.format_report(report)
    assert "\n  works here    FastLoader, ArrayDataset, diagnose, tune, AutoTune, ThroughputMonitor, GPUMonitor" in text
    notes = [p for p in report["problems"] if "kfast.distributed needs Keras" in p["problem"]]
    assert not doctor.has_errors(report), report["problems"]
    if BACKEND in ("tensorflow", "jax"):
        assert not notes
    else:
        assert report["keras"]["gpus"] == 0  # CPU builds here
        (note,) = notes
        assert note["severity"] == "warning" and "KERAS_BACKEND=tensorflow" in note["fix"]
        assert "not kfast.distributed (needs Keras on TensorFlow or JAX)" in text
        assert not [p for p in report["problems"] if "Horovod is not installed" in p["problem"]]


def test_doctor_says_whether_memory_planning_for_a_named_gpu_works_here_and_the_fix():
    from kfast.planning import deviceless

    report = doctor.collect()
    text = doctor.format_report(report)
    planning = [p for p in report["problems"] if "kfast plan --device" in p["problem"]]
    if deviceless.available():  # the suite's venv and the JAX tier's: a small compile for an H100 ran
        assert report["plan_gpu"] == {"works": True, "problem": None} and not planning
        assert "plan --device works (compiles for a named GPU without one)" in text
    else:  # the PyTorch tier's venv has no CUDA plugin
        (problem,) = planning
        assert report["plan_gpu"]["works"] is False and "jax-cuda12-plugin" in problem["problem"]
        assert problem["severity"] == "warning" and "pip install 'kfast[plan-gpu]'" in problem["fix"]
        assert "plan --device does not work here (see Problems)" in text


@pytest.mark.parametrize("backend, name, fix", [("tensorflow", "TensorFlow", "kfast[gpu]"),
                                                ("jax", "JAX", "jax[cuda13]"), ("torch", "PyTorch", "CUDA build")])
def test_doctor_warns_when_the_backend_misses_the_gpu_nvml_sees(monkeypatch, backend, name, fix):
    monkeypatch.setattr(nvml, "driver_version", lambda: "580.1")
    monkeypatch.setattr(nvml, "list_gpus", lambda: [{"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771,
                                                     "memory_used_mib": 0, "utilization_percent": 0}])
    report = {"problems": [], "keras": {"backend": backend, "gpus": 0}, "tensorflow": {"gpus": 0}}
    doctor._check_gpus(report)
    (problem,) = report["problems"]
    assert problem["problem"] == f"NVML sees 1 GPU(s) but {name} sees none, so training runs on CPU."
    assert fix in problem["fix"]
