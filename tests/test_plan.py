"""kfast.plan on one machine: the cost model's numbers, what it measures of a model, its advice, its CLI."""

import json
import os
import struct
import subprocess
import sys

import keras
import numpy as np
import pytest

import kfast
from kfast.planning import link_probe
from kfast.planning import planner
from kfast.planning import cost_model

KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")


def _model(width=256, optimizer="sgd"):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(width), keras.layers.Dense(4)], name="m")
    model.compile(optimizer, "mse")
    return model


def test_ring_moves_2_n_minus_1_over_n_of_the_gradients_per_rank():
    s, b = 100e6, 1.25e9  # 100 MB over 10 Gbit/s, no latency
    assert [cost_model.ring_seconds(s, n, b, 0.0) for n in (1, 2, 4)] == [0.0, s / b, 1.5 * s / b]
    # Latency: 2(N-1) messages in a row, per fused buffer.
    assert cost_model.ring_seconds(0, 4, b, 1e-3, messages=2) == pytest.approx(12e-3)


def test_a_parameter_server_link_carries_n_over_k_of_the_gradients():
    s, b = 100e6, 1.25e9
    assert cost_model.server_seconds(s, 8, b, 0.0, servers=1) == pytest.approx(2 * 8 * s / b)
    assert cost_model.server_seconds(s, 8, b, 0.0, servers=8) == pytest.approx(2 * s / b)  # workers' links bind


def test_overlap_hides_the_exchange_behind_the_backward_pass_at_most():
    assert cost_model.step_range(0.03, 0.01) == (pytest.approx(0.03), pytest.approx(0.04))
    assert cost_model.step_range(0.03, 0.05) == (pytest.approx(0.06), pytest.approx(0.08))


@pytest.mark.parametrize("text, value", [("10Gbit", 1.25e9), ("25 Gbit/s", 3.125e9), ("100Mbit", 12.5e6),
                                         ("1.5GB/s", 1.5e9), ("800mbps", 100e6)])
def test_bandwidth_units(text, value):
    assert cost_model.parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["fast", "10", "0Gbit", "-1Gbit", "10 Gbits per second"])
def test_a_bandwidth_without_a_unit_says_what_it_expects(text):
    with pytest.raises(ValueError, match=rf"bandwidth {text!r} is not a rate; expected .*10Gbit"):
        cost_model.parse_bandwidth(text)


def test_a_latency_without_a_unit_says_what_it_expects():
    assert cost_model.parse_latency("250ns") == pytest.approx(2.5e-7)
    with pytest.raises(ValueError, match=r"latency '20' is not a time; expected .*20us"):
        cost_model.parse_latency("20")


def test_the_probe_fit_recovers_latency_and_bandwidth():
    times = {size: 2 * 50e-6 + size / 25e6 for size in (4, 1024, 1 << 20, 1 << 22, 1 << 24)}
    latency, bandwidth = link_probe.fit(times)
    assert latency == pytest.approx(50e-6, rel=0.01) and bandwidth == pytest.approx(25e6, rel=1e-6)
    with pytest.raises(ValueError, match="do not grow with message size"):
        link_probe.fit({4: 1e-3, 1 << 20: 2e-3, 1 << 22: 1e-3})


def test_gradient_bytes_count_trainable_values_and_halve_with_fp16():
    model = _model()
    values = 64 * 256 + 256 + 256 * 4 + 4
    assert planner.gradient_size(model) == (values, 4 * values, "float32")
    assert planner.gradient_size(model, "fp16")[1] == 2 * values
    model.layers[0].trainable = False
    assert planner.gradient_size(model)[0] == 256 * 4 + 4


def test_the_plan_follows_the_model_and_the_link():
    model = _model(width=1024)
    weights = [w.copy() for w in model.get_weights()]
    p = kfast.plan(model, ranks=[1, 2, 16], bandwidth=1e8, latency=1e-4, steps=3)
    assert [w.tolist() for w in model.get_weights()] == [w.tolist() for w in weights]  # put back after measuring
    assert model.optimizer.iterations.numpy() == 0
    one, two, sixteen = p.rows
    assert one["step_s"] == one["step_overlap_s"] == p.compute_s and one["efficiency"] == 1.0
    assert two["exchange_s"] == pytest.approx(2e-4 + p.gradient_bytes / 1e8)
    assert two["step_s"] == pytest.approx(p.compute_s + two["exchange_s"])
    assert sixteen["efficiency"] == pytest.approx(p.compute_s / sixteen["step_s"])
    assert sixteen["samples_per_s"] == pytest.approx(16 * 32 / sixteen["step_s"])
    assert p.batch_size == 32 and p.link_source == "given"
    text = str(p)
    assert "kfast plan: m, 70,660 trainable values" in text and "What to change:" in text
    assert json.loads(p.to_json())["rows"][2]["ranks"] == 16


def test_a_slow_link_gets_advice_with_numbers_and_a_fast_one_none():
    slow = kfast.plan(_model(width=1024), ranks=[1, 8], bandwidth="10Mbit", latency="1ms", steps=3)
    advice = " ".join(slow.advice)
    assert "per-rank batch" in advice and "compression='fp16'" in advice
    assert "backward_passes_per_step=" in advice and "no rank count above 1 reaches 80%" in advice
    fast = kfast.plan(_model(width=8), ranks=[1, 2], bandwidth="1000Gbit", latency="0us", steps=3)
    assert fast.advice[0].startswith("scales well")


def test_the_distributed_optimizers_settings_are_planned_with():
    opt = kfast.DistributedOptimizer(keras.optimizers.SGD(0.1), compression="fp16", backward_passes_per_step=4)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(4)])
    model.compile(opt, "mse", jit_compile=False)
    p = kfast.plan(model, ranks=[1, 4], bandwidth=1e7, latency=0.0, steps=3)
    assert p.compression == "fp16" and p.accumulation == 4 and p.gradient_bytes == 2 * (64 * 4 + 4)
    assert p.rows[1]["exchange_s"] == pytest.approx(1.5 * p.gradient_bytes / 1e7 / 4)


def test_a_dataset_gives_the_batch():
    data = kfast.data.ArrayDataset(np.ones((40, 64), "float32"), np.ones((40, 4), "float32"), batch_size=20)
    assert kfast.plan(_model(), data, ranks=[1, 2], steps=3).batch_size == 20


def test_bad_arguments_say_what_was_wrong():
    with pytest.raises(ValueError, match="which is not compiled; call model.compile"):
        kfast.plan(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    with pytest.raises(ValueError, match=r"ranks=0"):
        kfast.plan(_model(), ranks=[0, 2])
    with pytest.raises(ValueError, match=r"compression='int8'"):
        kfast.plan(_model(), compression="int8")
    with pytest.raises(ValueError, match="no keras.Input"):
        unbuilt = keras.Sequential([keras.layers.Dense(1)])
        unbuilt.compile("sgd", "mse")
        kfast.plan(unbuilt)


def test_the_plot_is_a_png(tmp_path):
    p = kfast.plan(_model(), ranks=[1, 2, 4, 8], bandwidth="1Gbit", steps=3)
    p.measured = {2: p.rows[1]["step_s"] * 1.1}
    path = p.plot(str(tmp_path / "plan.png"))
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1100, 460)


def test_cli_prints_the_table_and_writes_the_plot(tmp_path):
    target = tmp_path / "m.py"
    target.write_text("import keras\n"
                      "def build():\n"
                      "    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128), keras.layers.Dense(4)])\n"
                      "    m.compile('sgd', 'mse')\n"
                      "    return m\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([KFAST, "plan", f"{target}:build", "--bandwidth", "10Gbit", "--latency", "20us", "--ranks",
                           "1,2,4", "--plot", str(tmp_path / "p.png")], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert "link 10 Gbit/s, latency 20 us (given)" in proc.stdout and (tmp_path / "p.png").exists()
    assert [line.split()[0] for line in proc.stdout.splitlines()[5:8]] == ["1", "2", "4"]
    bad = subprocess.run([KFAST, "plan", f"{target}:build", "--latency", "1ms"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert bad.returncode == 2 and "--latency goes with --bandwidth" in bad.stderr
    bad = subprocess.run([KFAST, "plan", f"{target}:build", "--ranks", "1,x"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert bad.returncode == 2 and "--ranks '1,x' is not a list of rank counts" in bad.stderr


def test_the_readme_example_runs_as_written(tmp_path):
    from helpers import readme_snippet

    (tmp_path / "example.py").write_text(readme_snippet("Will it scale? `kfast plan`"))
    proc = subprocess.run([sys.executable, "example.py"], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr
    rows = [line.split()[0] for line in proc.stdout.splitlines() if line[:5].strip().isdigit()]
    assert rows == ["1", "2", "4", "8", "16", "32", "64"] and "What to change:" in proc.stdout
    assert (tmp_path / "plan.png").stat().st_size > 10_000
