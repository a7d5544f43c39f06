import csv
import importlib.util
import math
import time
import warnings

import keras
import numpy as np
import pytest

import datasets
import kfast.callbacks
import tb_events
from kfast._core import callback_order
from kfast._core import gpu_sampling
from kfast.data import FastLoader


_HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


def test_gpu_monitor_summarises_scripted_readings():
    readings = iter([(0.0, 100), (90.0, 300), (0.0, 200), (90.0, 250)])
    cb = kfast.callbacks.GPUMonitor(interval=0.001, sampler=lambda: next(readings))
    cb.set_model(_model())
    cb.on_train_begin()
    deadline = time.monotonic() + 5
    while cb._thread.running and time.monotonic() < deadline:  # the script runs out, ending the thread
        time.sleep(0.01)
    logs = {"loss": 1.0}
    cb.on_epoch_end(0, logs)
    cb.on_train_end()
    assert logs == {"loss": 1.0, "gpu_util_mean": 45.0, "gpu_util_p10": 0.0, "gpu_idle_fraction": 0.5,
                    "gpu_mem_used_max": 300}


def test_gpu_monitor_without_a_gpu_warns_once_and_training_goes_on():
    cb = kfast.callbacks.GPUMonitor()
    with pytest.warns(UserWarning, match="GPUMonitor is off: .*driver"):
        _model().fit(datasets.Features(n=3), epochs=2, verbose=0, callbacks=[cb])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cb.on_train_begin()  # the second run stays quiet


def test_gpu_sampler_stops_when_training_raises():
    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("boom")

    cb = kfast.callbacks.GPUMonitor(interval=0.01, sampler=lambda: (50.0, 1))
    with pytest.raises(RuntimeError, match="boom"):
        _model().fit(datasets.Features(n=3), epochs=2, verbose=0, callbacks=[cb, Boom()])
    thread = cb._thread
    deadline = time.monotonic() + 5
    while thread.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not thread.running


def test_throughput_monitor_values_reach_history_and_csv(tmp_path):
    path = tmp_path / "log.csv"
    with FastLoader(datasets.Features(n=6, delay=0.01), workers=2) as loader:
        history = _model().fit(loader, epochs=2, verbose=0, callbacks=[
            kfast.callbacks.ThroughputMonitor(loader), keras.callbacks.CSVLogger(str(path))])
    h = history.history
    for key in ("steps_per_second", "step_time", "samples_per_second", "input_wait_fraction"):
        assert len(h[key]) == 2 and all(v > 0 for v in h[key]), key
    assert 0 < h["input_wait_fraction"][1] <= 1
    assert h["samples_per_second"][1] == pytest.approx(h["steps_per_second"][1] * 32, rel=0.05)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and float(rows[1]["samples_per_second"]) > 0


def _tf_pipeline(drop_remainder):
    import tensorflow as tf

    x = datasets.Features(n=6).x
    x = np.concatenate([x] * 3)  # 96 samples of 8 features
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(
        16, drop_remainder=drop_remainder)


@pytest.mark.skipif(not _HAS_TENSORFLOW, reason="a tf.data pipeline needs TensorFlow")
def test_throughput_monitor_with_a_tf_data_pipeline_in_fit(tmp_path):
    ds = _tf_pipeline(drop_remainder=True)  # element_spec fixes batches of 16
    monitor = kfast.callbacks.ThroughputMonitor(loader=ds)
    history = _model().fit(ds, epochs=2, verbose=0, shuffle=False,
                           callbacks=[monitor, keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))])
    h = history.history
    assert sorted(k for k in h if k != "loss") == ["samples_per_second", "step_time", "steps_per_second"]
    for key in ("samples_per_second", "step_time", "steps_per_second"):
        assert len(h[key]) == 2 and all(v > 0 for v in h[key]), key
    assert h["samples_per_second"][1] == pytest.approx(h["steps_per_second"][1] * 16, rel=1e-12)
    assert h["step_time"][1] == pytest.approx(1 / h["steps_per_second"][1], rel=1e-12)
    with open(tmp_path / "log.csv") as f:
        assert "input_wait_fraction" not in f.readline()  # not measurable from Python: not logged


@pytest.mark.skipif(not _HAS_TENSORFLOW, reason="a tf.data pipeline needs TensorFlow")
def test_throughput_monitor_takes_samples_from_batch_size_when_the_spec_leaves_it_open():
    ds = _tf_pipeline(drop_remainder=False)  # batch(16): the first dimension is unknown
    open_size = kfast.callbacks.ThroughputMonitor(ds)
    given = kfast.callbacks.ThroughputMonitor(ds, batch_size=16)
    history = _model().fit(ds, epochs=1, verbose=0, shuffle=False, callbacks=[open_size, given])
    h = history.history
    # Both write the same keys into one epoch's logs: the one that knows the batch size adds samples/s.
    assert h["samples_per_second"][0] == pytest.approx(h["steps_per_second"][0] * 16, rel=1e-12)
    assert (open_size.batch_size, given.batch_size, open_size.loader) == (None, 16, None)
    logs = {}
    open_size.on_epoch_begin(0)
    open_size.params = {"steps": 6}
    open_size.on_epoch_end(0, logs)
    assert sorted(logs) == ["step_time", "steps_per_second"]
    with pytest.raises(ValueError, match=r"batch_size=8 with a tf.data.Dataset whose batches hold 16 samples"):
        kfast.callbacks.ThroughputMonitor(_tf_pipeline(drop_remainder=True), batch_size=8)
    with pytest.raises(ValueError, match=r"loader=list; pass a kfast.data.FastLoader or a tf.data.Dataset"):
        kfast.callbacks.ThroughputMonitor([1, 2])


def test_gpu_monitor_logs_the_same_keys_in_an_epoch_without_samples():
    cb = kfast.callbacks.GPUMonitor(interval=60, sampler=lambda: (70.0, 5))
    cb.set_model(_model())
    cb.on_train_begin()
    deadline = time.monotonic() + 5
    while not cb._thread._samples and time.monotonic() < deadline:  # the thread's first reading
        time.sleep(0.01)
    cb.on_epoch_begin(0)  # drops it: the epoch ends before the next one, 60 s later
    logs = {}
    cb.on_epoch_end(0, logs)
    cb.on_train_end()
    assert logs == {"gpu_util_mean": 70.0, "gpu_util_p10": 70.0, "gpu_idle_fraction": 0.0, "gpu_mem_used_max": 5}

    def broken():
        raise OSError("NVML went away")

    cb = kfast.callbacks.GPUMonitor(interval=0.01, sampler=broken)
    cb.set_model(_model())
    cb.on_train_begin()
    logs = {}
    cb.on_epoch_end(0, logs)
    cb.on_train_end()
    assert sorted(logs) == sorted(gpu_sampling.KEYS) and all(math.isnan(v) for v in logs.values())


class _Marked(keras.callbacks.Callback):
    _writes_epoch_logs = True

    def __init__(self, name):
        super().__init__()
        self.name, self.began = name, 0

    def on_train_begin(self, logs=None):
        self.began += 1
        callback_order.run_first(self)


class _Plain(_Marked):
    _writes_epoch_logs = False


def test_run_first_moves_marked_callbacks_ahead_and_keeps_every_order():
    a, b, logger, other = _Marked("a"), _Marked("b"), _Plain("logger"), _Plain("other")
    callbacks = keras.callbacks.CallbackList([logger, a, other, b], add_history=True)
    callbacks.on_train_begin()
    assert [getattr(c, "name", "history") for c in callbacks.callbacks] == ["a", "b", "logger", "other", "history"]
    assert [c.began for c in (a, b, logger, other)] == [1, 1, 1, 1]  # each hook ran once while the list moved
    assert callback_order.run_first(_Marked("alone")) == []  # in no list: nothing to reorder


@pytest.mark.parametrize("monitors_first", [True, False], ids=["monitors-first", "monitors-last"])
def test_monitor_values_reach_tensorboard_csv_and_history_in_either_order(monitors_first, tmp_path):
    keys = ["steps_per_second", "step_time", "samples_per_second", "input_wait_fraction", "gpu_util_mean",
            "gpu_util_p10", "gpu_idle_fraction", "gpu_mem_used_max"]
    with FastLoader(datasets.Features(n=6), workers=1, use_multiprocessing=False) as loader:
        monitors = [kfast.callbacks.ThroughputMonitor(loader),
                    kfast.callbacks.GPUMonitor(interval=0.01, sampler=lambda: (40.0, 3 << 20))]
        loggers = [keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))]
        if _HAS_TENSORFLOW:  # Keras's TensorBoard callback writes through tf.summary, on every backend
            loggers.insert(0, keras.callbacks.TensorBoard(str(tmp_path / "tb"), write_graph=False))
        history = _model().fit(loader, epochs=2, verbose=0,
                               callbacks=monitors + loggers if monitors_first else loggers + monitors)
    h = history.history
    tb = tb_events.scalars(tmp_path / "tb" / "train") if _HAS_TENSORFLOW else {}
    with open(tmp_path / "log.csv") as f:
        rows = list(csv.DictReader(f))
    for key in keys:
        assert len(h[key]) == 2, key
        if _HAS_TENSORFLOW:  # TensorBoard stores float32.
            np.testing.assert_allclose(tb[f"epoch_{key}"], h[key], rtol=1e-6, err_msg=key)
        assert [float(r[key]) for r in rows] == pytest.approx(h[key]), key
    assert h["gpu_util_mean"] == [40.0, 40.0] and h["gpu_mem_used_max"] == [3 << 20, 3 << 20]
    assert all(v > 0 for v in h["steps_per_second"])


def test_summary_of_no_samples_is_empty():
    assert gpu_sampling.summarize([]) == {}


class _ScriptedClock:
    """A clock that real time moves a little and validation batches move a lot."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self):
        return time.perf_counter() + self.offset


class _SlowValidation(keras.utils.PyDataset):
    """Validation batches that each 'take' 100 s on the scripted clock."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.x = clock, datasets.Features(n=1).x

    def __len__(self):
        return 3

    def __getitem__(self, i):
        self.clock.offset += 100.0
        return self.x, self.x.sum(axis=1, keepdims=True)


def test_throughput_monitor_counts_training_steps_only(monkeypatch):
    from kfast._core import epoch_clock

    clock = _ScriptedClock()
    monkeypatch.setattr(epoch_clock, "_clock", clock)
    with FastLoader(datasets.Features(n=4), workers=1, use_multiprocessing=False) as loader:
        history = _model().fit(loader, epochs=2, verbose=0, validation_data=_SlowValidation(clock),
                               callbacks=[kfast.callbacks.ThroughputMonitor(loader)])
    # 300 scripted seconds of validation per epoch; counted, a step would take at least 75 s. (The first
    # epoch is not checked: Keras peeks at validation batches to build its iterator before validating.)
    assert history.history["step_time"][1] < 30
    assert history.history["steps_per_second"][1] > 1 / 30


class _WaitingLoader:
    """Stands in for a FastLoader's counters when AutoTune is driven by hand."""

    dataset, settings, wait_seconds = None, {"workers": 1}, 0.0

    def configure(self, **settings):
        self.settings = settings


def test_auto_tune_ignores_validation_time(monkeypatch):
    from kfast.tuning import search
    from kfast._core import epoch_clock
    from kfast.callbacks import auto_tune

    now = [0.0]
    monkeypatch.setattr(epoch_clock, "_clock", lambda: now[0])
    result = search.TuneResult(2, True, 4, 50.0, [])
    loader = _WaitingLoader()
    monkeypatch.setattr(auto_tune, "_tune", lambda *a, **k: result)
    cb = kfast.callbacks.AutoTune(loader, threshold=0.2, verbose=0)
    cb.on_train_begin()
    cb.on_epoch_begin(0)
    now[0], loader.wait_seconds = 10.0, 5.0  # training: half of 10 s spent waiting for input
    cb.on_test_begin()
    now[0] = 1000.0  # a long validation
    cb.on_test_end()
    cb.on_epoch_end(0, {})
    assert [c["reason"] for c in cb.changes] == ["before training", "epoch 1 waited 50% for input"]
