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
    # On a machine whose cores other processes share, the model's own step times vary from phase to phase
    # (CI measured compute alone at 38-57 ms a step, then 52-62 ms end to end), and the verdict says so
    # ("uncertain"): compute-bound is always among what it could be, input-bound never.
    assert "compute-bound" in d.could_be and "input-bound" not in d.could_be, str(d)
    assert d.verdict in ("compute-bound", "uncertain")
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
    with pytest.raises(ValueError, match=r"budget_s=0; it must be a finite number of seconds > 0"):
        kfast.diagnose(model, datasets.Features(), budget_s=0)
    with pytest.raises(ValueError, match="Features with no batches"):
        kfast.diagnose(model, datasets.Features(n=0))
    batches = datasets.Features(n=3)
    with pytest.raises(ValueError, match="yields no batches when iterated again"):  # a one-shot iterator
        kfast.diagnose(model, iter([batches[i] for i in range(3)]), steps=4, warmup=0)
    with pytest.raises(ValueError, match="which is not compiled; call model.compile"):
        kfast.diagnose(keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)]), datasets.Features())
    wrong = keras.Sequential([keras.layers.Dense(1), keras.layers.Reshape((3, 5))])  # cannot take its batches
    wrong.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"diagnose got model 'sequential.*', not built yet, and building it "
                                         r"from the data's first batch \(shapes \[\(32, 8\), \(32, 1\)\]\), as fit does, "
                                         r"failed: "):
        kfast.diagnose(wrong, datasets.Features())


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
    times = {"input": [0.030, 0.010, 0.050, 0.030], "compute": [0.009, 0.011, 0.010, 0.010],
             "end_to_end": [0.008, 0.025, 0.060]}
    parts = Diagnosis(times, batch_size=4).step_breakdown()
    # compute: the typical 10 ms, or the whole of a faster step; the next batch loads while the model
    # computes, so input wait is what loading takes beyond a step (the typical 30 ms - 10 ms) at most.
    np.testing.assert_allclose(parts["compute"], [0.008, 0.010, 0.010])
    np.testing.assert_allclose(parts["input_wait"], [0.0, 0.015, 0.020])
    np.testing.assert_allclose(parts["other"], [0.0, 0.0, 0.030], atol=1e-12)
    np.testing.assert_allclose(sum(parts.values()), times["end_to_end"])
    # Read between steps (a one-worker PyDataset on JAX or PyTorch): loading a batch, 30 ms, at most.
    between = Diagnosis(times, batch_size=4, overlapped=False).step_breakdown()
    np.testing.assert_allclose(between["input_wait"], [0.0, 0.015, 0.030])
    np.testing.assert_allclose(between["other"], [0.0, 0.0, 0.020], atol=1e-12)


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


class Net(keras.Model):
    """A subclassed model without keras.Input: layers made in __init__, used in call, no variables until
    it is called."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))


def _net(built_by="nothing"):
    keras.utils.set_random_seed(0)
    net = Net()
    net.compile(keras.optimizers.Adam(1e-2), "mse", metrics=["mae"])
    if built_by == "model.build":  # marks the model built; its Dense layers still have no variables
        with pytest.warns(UserWarning, match=r"does not have a `build\(\)` method"):
            net.build((None, 4))
        assert net.built and not net.weights
    return net


def _trains_as_a_twin_that_only_fit_saw(net, data):
    """`net`, handed back by diagnose/tune/plan, holds the weights it was built with and a fresh optimizer:
    fit afterwards trains it exactly as it trains a twin built by fit itself."""
    twin = _net()
    assert int(net.optimizer.iterations.numpy()) == 0
    net.fit(data, epochs=1, shuffle=False, verbose=0)
    twin.fit(data, epochs=1, shuffle=False, verbose=0)
    assert len(net.get_weights()) == len(twin.get_weights()) == 4
    for a, b in zip(net.get_weights(), twin.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(net.optimizer.iterations.numpy()) == int(twin.optimizer.iterations.numpy()) == len(data)


@pytest.mark.parametrize("built_by", ["nothing", "model.build"])
def test_diagnose_builds_a_subclassed_model_from_the_first_batch(built_by):
    net, data = _net(built_by), datasets.Regression(n=6, batch_size=16)
    d = kfast.diagnose(net, data, steps=6, warmup=1)
    assert d.batch_size == 16 and [len(d.times[k]) for k in ("input", "compute", "end_to_end")] == [6, 6, 6]
    _trains_as_a_twin_that_only_fit_saw(net, data)


@pytest.mark.parametrize("built_by", ["nothing", "model.build"])
def test_tune_with_a_subclassed_model_builds_it_as_fit_does(built_by, tmp_path, monkeypatch):
    monkeypatch.setenv("KFAST_CACHE_DIR", str(tmp_path))
    net, data = _net(built_by), datasets.Regression(n=6, batch_size=16)
    result = kfast.tune(data, model=net, budget_s=1, max_workers=1, force=True)
    assert result.batches_per_s > 0
    _trains_as_a_twin_that_only_fit_saw(net, data)


@pytest.mark.parametrize("built_by", ["nothing", "model.build"])
def test_plan_of_a_subclassed_model_builds_it_from_the_dataset(built_by):
    net, data = _net(built_by), datasets.Regression(n=6, batch_size=16)
    plan = kfast.plan(net, data, ranks=[1, 2], steps=3)
    assert plan.parameters == 4 * 8 + 8 + 8 + 1 and plan.batch_size == 16 and plan.compute_s > 0
    _trains_as_a_twin_that_only_fit_saw(net, data)
