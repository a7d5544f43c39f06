"""Will it fit? kfast's memory prediction: the breakdown and how it scales, the optimizer's own slots, the verdict
against a device and the change that makes a step fit, a model-parallel layout, bad input, and the CLI.

XLA's own analysis of the compiled step, on JAX, is in tests/test_plan_memory_xla.py."""

import json

import keras
import numpy as np
import pytest

import kfast
from kfast.cli import main as cli_main
from kfast.planning import estimate_memory
from kfast.planning import parse_memory
from kfast.planning import plan_memory
from kfast.planning import propose_layout_map
from kfast.planning.memory_fit import USABLE_SHARE

GB = 10**9


def _mlp(optimizer="adam", width=512, name="mlp"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(width, activation="relu", name="a"),
                              keras.layers.Dense(width, activation="relu", name="b"),
                              keras.layers.Dense(10, name="c")], name=name)
    model.compile(optimizer, "mse")
    return model


def test_the_breakdown_adds_up_to_the_peak_and_counts_each_part():
    model = _mlp()
    values = model.count_params()
    m = estimate_memory(model, batch_size=64)
    assert m.parameters == m.gradients == 4 * values
    assert m.optimizer == 2 * 4 * values  # Adam's two moments
    assert m.batch == 64 * (256 + 10) * 4  # inputs, and float32 targets shaped like the output
    assert m.peak == m.parameters + m.gradients + m.optimizer + m.activations + m.batch
    assert m.model_states == m.parameters + m.gradients + m.optimizer
    # The peak is in layer a's backward pass, when every weight gradient is made: a's relu output kept, its
    # gradient and its pre-activation's gradient, three (64, 512) float32 tensors (the input is the batch).
    assert (m.activations, m.peak_at) == (3 * 64 * 512 * 4, "a")
    text = str(m)
    for part in ("parameters", "gradients", "optimizer state", "activations", "input batch", "peak"):
        assert part in text
    assert m.to_dict()["peak"] == m.peak


def test_doubling_the_batch_doubles_activations_and_leaves_the_model_states():
    model = _mlp()
    one, two = estimate_memory(model, batch_size=96), estimate_memory(model, batch_size=192)
    assert two.activations == 2 * one.activations and two.batch == 2 * one.batch
    assert (two.parameters, two.gradients, two.optimizer) == (one.parameters, one.gradients, one.optimizer)


def test_adam_holds_twice_the_optimizer_state_of_sgd_with_momentum():
    adam = estimate_memory(_mlp("adam"), batch_size=32)
    momentum = estimate_memory(_mlp(keras.optimizers.SGD(0.1, momentum=0.9)), batch_size=32)
    plain = estimate_memory(_mlp(keras.optimizers.SGD(0.1)), batch_size=32)
    assert adam.optimizer == 2 * momentum.optimizer and momentum.optimizer == momentum.parameters
    assert plain.optimizer == 0
    built = _mlp("adam")
    built.optimizer.build(built.trainable_variables)  # a built optimizer is counted from its own variables
    assert estimate_memory(built, batch_size=32).optimizer == adam.optimizer


def test_mixed_precision_halves_activations_and_keeps_float32_model_states():
    model = _mlp()
    full = estimate_memory(model, batch_size=64)
    mixed = estimate_memory(model, batch_size=64, precision="mixed_bfloat16")
    assert mixed.activations * 2 == full.activations and mixed.precision == "mixed_bfloat16"
    assert mixed.model_states == full.model_states and mixed.batch == full.batch  # the data stays as it is


def test_accumulation_keeps_a_micro_batch_of_activations_and_adds_the_accumulators():
    model = _mlp()
    whole = estimate_memory(model, batch_size=128)
    four = estimate_memory(model, batch_size=128, accumulation=4)
    assert (four.micro_batch, four.accumulation) == (32, 4)
    assert four.activations * 4 == whole.activations and four.batch * 4 == whole.batch
    assert four.optimizer == whole.optimizer + whole.gradients  # one accumulator per trainable value


def test_a_mesh_splits_the_kernels_over_the_model_axis_as_the_proposed_layout_does():
    model = _mlp(width=512)
    layout = propose_layout_map(model, (2, 4))
    assert layout["mlp/a/kernel"].axes == (None, "model") and layout["mlp/a/bias"].axes == ("model",)
    assert layout["mlp/c/kernel"].axes == ("model", None)  # 10 outputs do not divide by 4: split the inputs
    assert layout["mlp/c/bias"] is None  # replicated
    split = estimate_memory(model, batch_size=64, mesh=(2, 4))
    whole = estimate_memory(model, batch_size=64)
    replicated = 10 * 4  # c's bias
    assert split.parameters == (whole.parameters - replicated) // 4 + replicated
    assert split.activations == whole.activations  # the batch is split over the data axis only


def _fits_16_not_8():
    model = _mlp()
    per_sample = estimate_memory(model, batch_size=2).per_sample
    return model, int(10 * GB / per_sample)  # about 10 GB of activations and batch


def test_a_step_that_fits_16gb_but_not_8gb_is_told_so_with_the_change_that_fits():
    model, batch_size = _fits_16_not_8()
    big = plan_memory(model, batch_size=batch_size, device_memory="16GB", compiled=False)
    assert big.fit.fits and big.fit.change is None and "fits:" in str(big)
    small = plan_memory(model, batch_size=batch_size, device_memory="8GB", compiled=False)
    assert not small.fit.fits and small.fit.usable == int(USABLE_SHARE * 8 * GB)
    change = small.fit.change
    assert change.precision == "mixed_bfloat16" and change.accumulation == 1 and change.mesh == (1, 1)
    assert "cheapest change: mixed precision" in str(small)
    # Applied, the change fits by the same prediction.
    applied = estimate_memory(model, batch_size=batch_size, precision=change.precision,
                              accumulation=change.accumulation, mesh=change.mesh)
    assert applied.peak == change.breakdown.peak <= small.fit.usable
    # The largest batch that fits as it is: the edge, by the same prediction.
    edge = small.fit.largest_batch
    assert estimate_memory(model, batch_size=edge).peak <= small.fit.usable
    assert estimate_memory(model, batch_size=edge + 1).peak > small.fit.usable


def test_accumulation_comes_next_and_model_parallel_when_the_model_states_do_not_fit():
    model, batch_size = _fits_16_not_8()
    change = plan_memory(model, batch_size=batch_size, device_memory="4GB", compiled=False).fit.change
    assert (change.precision, change.mesh) == ("float32", (1, 1)) and change.accumulation > 1
    assert batch_size % change.accumulation == 0 and "passes of" in change.what
    states = estimate_memory(model, batch_size=1).model_states
    tight = plan_memory(model, batch_size=1, device_memory=states * 0.7, compiled=False).fit
    assert tight.largest_batch == 0 and tight.change.mesh[1] > 1 and "propose_layout_map" in tight.change.what
    applied = estimate_memory(model, batch_size=1, precision=tight.change.precision, mesh=tight.change.mesh,
                              accumulation=tight.change.accumulation)
    assert applied.peak <= tight.usable


def test_a_gpu_seen_through_nvml_gives_the_device_memory(monkeypatch):
    monkeypatch.setattr(kfast.nvml, "list_gpus", lambda: [{"index": 0, "name": "Test GPU", "memory_total_mib": 16384,
                                                          "memory_used_mib": 0, "utilization_percent": 0}])
    fit = plan_memory(_mlp(), batch_size=32, compiled=False).fit
    assert fit.device_memory == 16 * 2**30 and fit.source == "GPU 0, Test GPU, through NVML" and fit.fits


def test_without_a_gpu_or_device_memory_the_breakdown_stands_alone(monkeypatch):
    def unavailable():
        raise kfast.nvml.NvmlUnavailable("no NVIDIA driver")

    monkeypatch.setattr(kfast.nvml, "list_gpus", unavailable)
    report = plan_memory(_mlp(), batch_size=32, compiled=False)
    assert report.fit is None and "pass device_memory=" in str(report) and report.to_dict()["fit"] is None


@pytest.mark.parametrize("text, value", [("80GB", 80 * GB), ("16GiB", 16 * 2**30), ("512MB", 512 * 10**6),
                                         ("1.5 TB", 1.5e12), (4e9, 4 * GB)])
def test_memory_units(text, value):
    assert parse_memory(text) == value


@pytest.mark.parametrize("text", ["lots", "80", "80Gbit", "0GB", "-1GB", "80 GB of HBM"])
def test_a_memory_it_cannot_read_says_what_it_expects(text):
    with pytest.raises(ValueError, match=rf"device_memory={text!r} is not an amount of memory; expected .*80GB"):
        parse_memory(text)


def test_bad_input_gets_clear_errors():
    fixed = keras.Sequential([keras.Input(batch_shape=(8, 16)), keras.layers.Dense(4)], name="fixed")
    fixed.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"input .* has a fixed batch: shape \(8, 16\).*keras.Input\(shape=\(16,\)\)"):
        estimate_memory(fixed)
    with pytest.raises(ValueError, match=r"shapes \[\(\), \(\)\], which has no common batch dimension"):
        estimate_memory(_mlp(), (np.float32(1.0), np.float32(2.0)))
    with pytest.raises(ValueError, match="precision='float8' is not a Keras dtype policy"):
        estimate_memory(_mlp(), precision="float8")
    with pytest.raises(ValueError, match=r"mesh=\(0, 2\); expected \(data, model\)"):
        estimate_memory(_mlp(), mesh=(0, 2))
    with pytest.raises(ValueError, match="device_memory='eighty' is not an amount of memory"):
        kfast.plan(_mlp(), ranks=[1], device_memory="eighty")  # before anything is measured


class _TwoLayers(keras.Model):
    def __init__(self):
        super().__init__(name="two")
        self.hidden = keras.layers.Dense(512, activation="relu", name="a")
        self.out = keras.layers.Dense(10, name="c")

    def call(self, x):
        return self.out(self.hidden(x))


def test_a_subclassed_model_is_traced_through_its_layers():
    model = _TwoLayers()
    model.compile("adam", "mse")
    batch = (np.zeros((64, 256), "float32"), np.zeros((64, 10), "float32"))
    sub = estimate_memory(model, batch)  # built from the batch, as fit would
    keras.utils.set_random_seed(0)
    same = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512, activation="relu", name="a"),
                             keras.layers.Dense(10, name="c")])
    same.compile("adam", "mse")
    assert sub.batch_size == 64 and sub == estimate_memory(same, batch)


def test_the_plan_reports_memory_in_its_text_dict_and_picture(tmp_path):
    p = kfast.plan(_mlp(), ranks=[1, 2], bandwidth="10Gbit", steps=3, device_memory="8GB")
    assert "memory per device at batch 32 (float32, data parallel):" in str(p) and "fits: " in str(p)
    memory = p.to_dict()["memory"]
    assert memory["fit"]["fits"] and memory["breakdown"]["peak"] == p.memory.breakdown.peak
    assert json.loads(p.to_json())["memory"]["fit"]["device_memory"] == 8 * GB
    path = p.plot(str(tmp_path / "plan.png"))
    assert (tmp_path / "plan.png").stat().st_size > 10_000 and path == str(tmp_path / "plan.png")


def test_cli_device_memory_and_precision(tmp_path, capsys):
    target = tmp_path / "memory_model.py"
    target.write_text("import keras\n"
                      "def build():\n"
                      "    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128), keras.layers.Dense(4)])\n"
                      "    m.compile('adam', 'mse')\n"
                      "    return m\n")
    assert cli_main(["plan", f"{target}:build", "--ranks", "1,2", "--bandwidth", "10Gbit", "--device-memory", "1MB",
                     "--precision", "mixed_bfloat16", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["fit"]["device_memory"] == 10**6 and memory["breakdown"]["precision"] == "mixed_bfloat16"
    assert cli_main(["plan", f"{target}:build", "--device-memory", "lots"]) == 2
    assert "kfast plan: device_memory='lots' is not an amount of memory" in capsys.readouterr().err
