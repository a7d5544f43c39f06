import contextlib
import json
import os
import struct
import subprocess
import sys

import keras
import numpy as np
import pytest

import datasets
import kfast
from helpers import REPO
from kfast.data import FastLoader
from kfast.diagnosis.report import Diagnosis


def _model(width, hidden, layers, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((width,))] + [keras.layers.Dense(hidden, activation="relu")
                                                       for _ in range(layers)] + [keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model


def _scripted(readings):
    it = iter(readings)
    return lambda: next(it)


def test_slow_input_is_diagnosed_input_bound():
    model = _model(8, 8, 1)
    d = kfast.diagnose(model, datasets.Features(n=20, delay=0.02), steps=12, warmup=3,
                       sampler=_scripted([(0.0, 1 << 20), (90.0, 2 << 20)] * 50))
    assert d.verdict == "input-bound"
    assert d.lost_fraction > 0.5
    assert d.input_batches_per_s < d.compute_steps_per_s
    assert "kfast.data.FastLoader" in d.recommendations[0]
    assert d.gpu["input"]["gpu_mem_used_max"] >= 1 << 20


def test_heavy_model_on_cheap_data_is_compute_bound():
    model = _model(512, 1024, 4)
    d = kfast.diagnose(model, datasets.Features(n=20, batch_size=256, width=512), steps=10, warmup=3)
    assert d.verdict == "compute-bound", str(d)
    assert d.input_batches_per_s > d.compute_steps_per_s
    assert "larger batch size" in d.recommendations[-1]


def test_diagnose_leaves_weights_and_optimizer_state_bit_identical():
    model = _model(8, 16, 2)
    model.fit(datasets.Features(n=4), epochs=1, verbose=0)  # an optimizer with real state
    before = [np.array(v) for v in model.get_weights()] + [np.array(v.numpy()) for v in model.optimizer.variables]
    kfast.diagnose(model, datasets.Features(n=10), steps=4, warmup=1)
    after = [np.array(v) for v in model.get_weights()] + [np.array(v.numpy()) for v in model.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after)) and len(before) == len(after)


def test_report_json_and_plot(tmp_path):
    model = _model(8, 8, 1)
    d = kfast.diagnose(model, datasets.Features(n=8), steps=4, warmup=1,
                       sampler=_scripted([(0.0, 1), (90.0, 1)] * 100))
    text = str(d)
    assert d.verdict.upper() in text and "input alone" in text and "What to do:" in text
    data = json.loads(d.to_json())
    assert data["verdict"] == d.verdict and len(data["times"]["compute"]) == 4
    png = d.plot(str(tmp_path / "d.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments():
    model = _model(8, 8, 1)
    with pytest.raises(ValueError, match="steps=0"):
        kfast.diagnose(model, datasets.Features(), steps=0)
    with pytest.raises(ValueError, match="Features with no batches"):
        kfast.diagnose(model, datasets.Features(n=0))
    batches = datasets.Features(n=3)
    with pytest.raises(ValueError, match="yields no batches when iterated again"):  # a one-shot iterator
        kfast.diagnose(model, iter([batches[i] for i in range(3)]), steps=4, warmup=0)
    with pytest.raises(ValueError, match="which is not compiled; call model.compile"):
        kfast.diagnose(keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)]), datasets.Features())
    unbuilt = keras.Sequential([keras.layers.Dense(1)])
    unbuilt.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"diagnose got model .* not built yet"):
        kfast.diagnose(unbuilt, datasets.Features())


@pytest.mark.parametrize("loader", [False, True], ids=["pydataset", "fastloader"])
def test_diagnose_cycles_a_dataset_shorter_than_the_measurement(loader):
    model = _model(8, 8, 1)
    data = datasets.Features(n=10)
    if loader:
        data = FastLoader(data, workers=1, use_multiprocessing=False)
    with data if loader else contextlib.nullcontext():
        d = kfast.diagnose(model, data, steps=30, warmup=2)
    assert [len(d.times[k]) for k in ("input", "compute", "end_to_end")] == [30, 30, 30]
    assert d.epoch_starts == [8, 18, 28]  # steps 10, 20 and 30 counting the 2 warm-up steps
    assert model.optimizer.iterations.numpy() == 0  # the state is put back after three epochs of training


def test_step_breakdown_adds_up_to_each_step():
    d = Diagnosis({"input": [0.030, 0.010, 0.050], "compute": [0.009, 0.010, 0.020],
                   "end_to_end": [0.008, 0.025, 0.060]}, batch_size=4)
    parts = d.step_breakdown()
    # compute: the 10 ms median, or the whole of a faster step; input wait: 30 - 10 ms at most.
    np.testing.assert_allclose(parts["compute"], [0.008, 0.010, 0.010])
    np.testing.assert_allclose(parts["input_wait"], [0.0, 0.015, 0.020])
    np.testing.assert_allclose(parts["other"], [0.0, 0.0, 0.030], atol=1e-12)
    np.testing.assert_allclose(sum(parts.values()), d.times["end_to_end"])


def _png_size(path):
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


def test_plot_leaves_the_matplotlib_backend_alone_and_adds_gpu_time_when_measured(tmp_path):
    import matplotlib

    model = _model(8, 8, 1)
    with_gpu = kfast.diagnose(model, datasets.Features(n=6), steps=8, warmup=1,
                              sampler=_scripted([(0.0, 1), (90.0, 1)] * 200))
    without = kfast.diagnose(model, datasets.Features(n=6), steps=8, warmup=1)
    assert with_gpu.gpu_timeline and not without.gpu_timeline
    assert list(with_gpu.phases) == ["input", "compute", "end_to_end"]
    before = matplotlib.get_backend()
    matplotlib.use("svg")  # what a notebook or script chose; the plot must not switch it to Agg
    try:
        with_gpu.plot(str(tmp_path / "gpu.png"))
        without.plot(str(tmp_path / "cpu.png"))
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    (w1, h1), (w2, h2) = _png_size(tmp_path / "gpu.png"), _png_size(tmp_path / "cpu.png")
    assert w1 == w2 == 1000 and h1 > h2 + 150  # the GPU utilisation panel


def test_cli_prints_the_verdict_for_a_module_function(tmp_path):
    target = tmp_path / "slowtask.py"
    target.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.path.join(REPO, 'tests')!r})\n"
        "import keras, datasets\n"
        "def build():\n"
        "    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])\n"
        "    model.compile('sgd', 'mse')\n"
        "    return model, datasets.Features(n=20, delay=0.02)\n")
    kfast_cli = os.path.join(os.path.dirname(sys.executable), "kfast")
    proc = subprocess.run([kfast_cli, "diagnose", f"{target}:build", "--steps", "8", "--warmup", "2",
                           "--plot", str(tmp_path / "p.png")], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr
    assert "kfast diagnosis: INPUT-BOUND" in proc.stdout
    assert (tmp_path / "p.png").stat().st_size > 1000
    bad = subprocess.run([kfast_cli, "diagnose", "nocolon"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "module:function" in bad.stderr


def test_report_prints_a_phase_without_gpu_samples():
    model = _model(8, 8, 1)
    d = kfast.diagnose(model, datasets.Features(n=8), steps=4, warmup=1,
                       sampler=_scripted([(0.0, 1), (90.0, 1)] * 100))
    d.gpu["compute"] = {}  # what a phase gets when it ends before the sampler's first reading
    assert "GPU compute    no sample" in str(d)
