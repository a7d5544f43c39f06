import csv
import gc
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


class _Boom(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("boom")


def _stops(thread, seconds=5):
    deadline = time.monotonic() + seconds
    while thread.running and time.monotonic() < deadline:
        time.sleep(0.02)
    return not thread.running


def test_gpu_sampler_of_a_fit_that_raised_stops_once_no_step_begins(monkeypatch):
    from kfast.callbacks import gpu_monitor

    monkeypatch.setattr(gpu_monitor, "_IDLE_S", 0.3)
    cb = kfast.callbacks.GPUMonitor(interval=0.01, sampler=lambda: (50.0, 1))
    model = _model()
    # The traceback is kept, as a notebook keeps the last one: it holds the fit's frames and their callbacks.
    with pytest.raises(RuntimeError, match="boom") as raised:
        model.fit(datasets.Features(n=3), epochs=2, verbose=0, callbacks=[cb, _Boom()])
    thread = cb._thread
    assert _stops(thread) and thread.idle and raised.value
    history = model.fit(datasets.Features(n=3), epochs=2, verbose=0, callbacks=[cb])  # the monitor serves again
    assert history.history["gpu_util_mean"] == [50.0, 50.0] and cb._thread is None


def test_gpu_sampler_of_a_fit_that_raised_stops_when_its_monitor_is_collected():
    cb = kfast.callbacks.GPUMonitor(interval=0.01, sampler=lambda: (50.0, 1))
    with pytest.raises(RuntimeError, match="boom"):
        _model().fit(datasets.Features(n=3), epochs=2, verbose=0, callbacks=[cb, _Boom()])
    thread = cb._thread
    assert thread.running  # no step has begun for a moment only: it goes on until the bound (10 minutes)
    del cb
    gc.collect()
    assert _stops(thread)


def test_gpu_sampler_goes_idle_without_beats_and_a_beat_starts_it_again():
    sampler = gpu_sampling.GpuSampler(lambda: (10.0, 1), interval=0.01, idle_after=0.2).start()
    assert _stops(sampler) and sampler.idle
    sampler.take()
    sampler.beat()
    assert sampler.running and not sampler.idle
    time.sleep(0.1)
    assert sampler.take()  # sampling again
    sampler.stop()
    assert not sampler.running
    sampler.beat()  # after stop() a beat starts nothing
    assert not sampler.running


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


class _Named(keras.callbacks.Callback):
    def __init__(self, name):
        super().__init__()
        self.name = name


class _Writer(_Named):
    _writes_epoch_logs = True


def test_ordered_puts_the_monitors_first_and_keeps_every_other_order():
    a, b, logger, other = _Writer("a"), _Writer("b"), _Named("logger"), _Named("other")
    given = [logger, a, other, b]
    assert [c.name for c in kfast.callbacks.ordered(given)] == ["a", "b", "logger", "other"]
    assert [c.name for c in given] == ["logger", "a", "other", "b"]  # the list passed is left as it was
    assert kfast.callbacks.ordered(kfast.callbacks.ordered(given)) == kfast.callbacks.ordered(given)
    assert kfast.callbacks.ordered(None) == [] and kfast.callbacks.ordered((a,)) == [a]
    monitors = [kfast.callbacks.GPUMonitor(), kfast.callbacks.ThroughputMonitor(batch_size=4)]
    assert kfast.callbacks.ordered([logger] + monitors) == monitors + [logger]
    with pytest.raises(ValueError, match=r"ordered got str among the callbacks; pass keras.callbacks.Callback"):
        kfast.callbacks.ordered([a, "TensorBoard"])


def test_default_callbacks_put_a_monitor_ahead_of_metric_average_and_the_checkpoint(tmp_path):
    callbacks = kfast.distributed.default_callbacks(str(tmp_path / "ckpt"))
    names = [type(c).__name__ for c in kfast.callbacks.ordered(callbacks + [kfast.callbacks.GPUMonitor()])]
    assert names == ["GPUMonitor", "BroadcastState", "LearningRateWarmup", "MetricAverage", "RankZeroCheckpoint"]
    assert kfast.callbacks.ordered(callbacks) == callbacks  # already in the order they must run


@pytest.mark.parametrize("monitors_first", [True, False], ids=["monitors-first", "monitors-last"])
def test_monitor_values_reach_tensorboard_csv_and_history_through_ordered(monitors_first, tmp_path):
    keys = ["steps_per_second", "step_time", "samples_per_second", "input_wait_fraction", "gpu_util_mean",
            "gpu_util_p10", "gpu_idle_fraction", "gpu_mem_used_max"]
    with FastLoader(datasets.Features(n=6), workers=1, use_multiprocessing=False) as loader:
        monitors = [kfast.callbacks.ThroughputMonitor(loader),
                    kfast.callbacks.GPUMonitor(interval=0.01, sampler=lambda: (40.0, 3 << 20))]
        loggers = [keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))]
        if _HAS_TENSORFLOW:  # Keras's TensorBoard callback writes through tf.summary, on every backend
            loggers.insert(0, keras.callbacks.TensorBoard(str(tmp_path / "tb"), write_graph=False))
        callbacks = kfast.callbacks.ordered(monitors + loggers if monitors_first else loggers + monitors)
        history = _model().fit(loader, epochs=2, verbose=0, callbacks=callbacks)
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


def test_a_monitor_after_a_logger_in_a_list_not_ordered_stays_where_keras_puts_it(tmp_path):
    # Keras's order, unchanged by kfast (no callback moves itself): the logger before the monitor writes its
    # line first; History, which Keras puts last, records the values.
    monitor = kfast.callbacks.ThroughputMonitor(batch_size=32)
    given = [keras.callbacks.CSVLogger(str(tmp_path / "log.csv")), monitor]
    history = _model().fit(datasets.Features(n=3), epochs=1, verbose=0, callbacks=given)
    assert given[1] is monitor and len(history.history["steps_per_second"]) == 1
    with open(tmp_path / "log.csv") as f:
        assert f.readline().strip() == "epoch,loss,val_loss"  # CSVLogger's columns, fixed by the first epoch


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


class _CountingLoader:
    """Stands in for a FastLoader's counters when ThroughputMonitor is driven by hand."""

    wait_seconds, samples_served = 0.0, 0


def test_throughput_monitor_logs_the_input_wait_share_of_the_one_step_accounting(monkeypatch):
    from kfast._core import epoch_clock
    from kfast._core.step_shares import StepShares
    from kfast._core.step_shares import input_wait_share

    now = [0.0]
    monkeypatch.setattr(epoch_clock, "_clock", lambda: now[0])
    loader = _CountingLoader()
    monitor = kfast.callbacks.ThroughputMonitor(loader)
    monitor.set_model(_model())
    monitor.set_params({"steps": 10, "epochs": 2})
    monitor.on_train_begin()
    logs = {}
    for epoch, (seconds, waited) in enumerate([(2.0, 0.5), (1.0, 1.5)]):  # the second: a counter past the span
        monitor.on_epoch_begin(epoch)
        now[0] += seconds
        loader.wait_seconds += waited
        loader.samples_served += 320
        logs = {}
        monitor.on_epoch_end(epoch, logs)
        # The name and the definition kfast.diagnose prints: the input wait part of a step, in [0, 1].
        expected = StepShares.split(seconds / 10, compute=0.0, input_wait=waited / 10).fraction("input_wait")
        assert logs["input_wait_fraction"] == pytest.approx(expected) == pytest.approx(input_wait_share(waited,
                                                                                                        seconds))
        assert logs["step_time"] == pytest.approx(seconds / 10)
    assert logs["input_wait_fraction"] == 1.0
