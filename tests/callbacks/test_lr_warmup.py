"""LearningRateWarmup: the rates of a resumed run equal those of an uninterrupted one, in one process.

`multiplier=` stands in for the number of ranks here; tests/distributed/ checks the same on 2 real ranks.
"""

import keras
import numpy as np
import pytest

import kfast
import kfast.callbacks
from helpers import RecordRates

STEPS = 4


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 8, 3)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _model(lr=0.05):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(lr), "mse")
    return model


def _fit(model, ckpt, epochs, initial_epoch=0, multiplier=4, warmup_epochs=3):
    record = RecordRates()
    x, y = _data()
    callbacks = [kfast.callbacks.LearningRateWarmup(warmup_epochs=warmup_epochs, multiplier=multiplier),
                 kfast.callbacks.RankZeroCheckpoint(str(ckpt), monitor="loss"), record]
    model.fit(x, y, batch_size=8, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0,
              callbacks=callbacks)
    return record.rates


def _expected(base, multiplier, warmup_epochs, epochs):
    return [base * (1 + min(1.0, (e + (b + 1) / STEPS) / warmup_epochs) * (multiplier - 1))
            for e in range(epochs) for b in range(STEPS)]


def test_uninterrupted_rates_follow_the_rule(tmp_path):
    rates = _fit(_model(), tmp_path, epochs=5)
    np.testing.assert_allclose(rates, _expected(0.05, 4, 3, 5), rtol=1e-6)


@pytest.mark.parametrize("stop", [1, 2, 3, 4])
def test_resume_at_any_epoch_gives_the_uninterrupted_rates(tmp_path, stop):
    first = _fit(_model(), tmp_path, epochs=stop)
    resumed = _model()  # a new process would build the same model and optimizer again
    initial_epoch = kfast.distributed.restore(resumed, str(tmp_path))
    assert initial_epoch == stop
    rest = _fit(resumed, tmp_path, epochs=5, initial_epoch=initial_epoch)
    np.testing.assert_allclose(first + rest, _expected(0.05, 4, 3, 5), rtol=1e-7)


def test_resume_with_another_rank_count_scales_the_same_base(tmp_path):
    _fit(_model(), tmp_path, epochs=2, multiplier=4)
    resumed = _model()
    kfast.distributed.restore(resumed, str(tmp_path))
    rest = _fit(resumed, tmp_path, epochs=4, initial_epoch=2, multiplier=2)
    # Same base (0.05), the new multiplier, the warm-up position kept.
    np.testing.assert_allclose(rest, _expected(0.05, 2, 3, 4)[2 * STEPS:], rtol=1e-7)


def test_zero_warmup_epochs_scales_from_the_first_batch(tmp_path):
    rates = _fit(_model(), tmp_path, epochs=2, warmup_epochs=0)
    np.testing.assert_allclose(rates, [0.2] * (2 * STEPS), rtol=1e-7)


def test_explicit_initial_lr_wins_over_the_restored_base(tmp_path):
    _fit(_model(), tmp_path, epochs=1)
    resumed = _model()
    kfast.distributed.restore(resumed, str(tmp_path))
    record = RecordRates()
    x, y = _data()
    resumed.fit(x, y, batch_size=8, epochs=2, initial_epoch=1, verbose=0, shuffle=False, callbacks=[
        kfast.callbacks.LearningRateWarmup(initial_lr=0.01, warmup_epochs=0, multiplier=4), record])
    np.testing.assert_allclose(record.rates, [0.04] * STEPS, rtol=1e-7)


def test_a_schedule_gets_a_clear_error():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(schedule)), "mse")
    x, y = _data()
    with pytest.raises(ValueError, match="ExponentialDecay schedule, which it cannot set.*scale the schedule"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[kfast.callbacks.LearningRateWarmup()])


@pytest.mark.parametrize("kwargs, match", [
    ({"warmup_epochs": -1}, "warmup_epochs=-1"),
    ({"warmup_epochs": float("nan")}, "warmup_epochs=nan"),
    ({"initial_lr": 0}, "initial_lr=0; it must be a finite number > 0"),
    ({"multiplier": float("inf")}, "multiplier=inf"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kfast.callbacks.LearningRateWarmup(**kwargs)
