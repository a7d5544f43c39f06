"""RankZeroCheckpoint: Keras's monitor conventions, a best model that survives resumes, early write checks."""

import os

import keras
import numpy as np
import pytest

import kfast
import kfast.callbacks


def _model(metrics=None):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=metrics or [])
    return model


def _set(model, value):
    model.set_weights([np.full((1, 1), value, "float32"), np.zeros(1, "float32")])


def _best_weight(directory):
    return keras.saving.load_model(os.path.join(directory, "best.keras")).get_weights()[0][0, 0]


def test_best_survives_a_resume_with_a_worse_epoch(tmp_path):
    model = _model()
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="val_loss")
    cb.set_model(model)
    cb.on_train_begin()
    _set(model, 1.0)
    cb.on_epoch_end(0, {"val_loss": 0.315})
    # A new process: new model, restore, new callback; its first epoch is worse.
    resumed = _model()
    assert kfast.distributed.restore(resumed, str(tmp_path)) == 1
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="val_loss")
    cb.set_model(resumed)
    cb.on_train_begin()
    _set(resumed, 2.0)
    cb.on_epoch_end(1, {"val_loss": 2.364})
    assert _best_weight(tmp_path) == 1.0
    _set(resumed, 3.0)
    cb.on_epoch_end(2, {"val_loss": 0.2})
    assert _best_weight(tmp_path) == 3.0


@pytest.mark.parametrize("metric, values, best", [
    (keras.metrics.Precision(name="precision"), [0.5, 0.9, 0.7], 2.0),
    (keras.metrics.MeanSquaredError(name="mse"), [0.5, 0.9, 0.7], 1.0),
])
def test_auto_mode_takes_the_direction_keras_gives_the_metric(tmp_path, metric, values, best):
    model = _model([metric])
    model.fit(np.ones((4, 1)), np.ones(4), verbose=0)  # compiled metrics exist once a step ran, as in fit
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor=f"val_{metric.name}")
    cb.set_model(model)
    cb.on_train_begin()
    for epoch, value in enumerate(values):
        _set(model, float(epoch + 1))
        cb.on_epoch_end(epoch, {f"val_{metric.name}": value})
    assert _best_weight(tmp_path) == best


def test_auto_mode_on_an_unknown_metric_asks_for_a_mode(tmp_path):
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="my_score")
    cb.set_model(_model())
    cb.on_train_begin()
    with pytest.raises(ValueError, match="monitor='my_score' with mode='auto'.*pass mode='max' or mode='min'"):
        cb.on_epoch_end(0, {"my_score": 1.0})


def test_initial_value_threshold_must_be_beaten(tmp_path):
    model = _model()
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="loss", initial_value_threshold=0.5)
    cb.set_model(model)
    cb.on_train_begin()
    cb.on_epoch_end(0, {"loss": 0.7})
    assert not (tmp_path / "best.keras").exists()
    cb.on_epoch_end(1, {"loss": 0.4})
    assert (tmp_path / "best.keras").exists()


def test_missing_monitor_warns_once_and_still_saves_epochs(tmp_path):
    x = np.ones((8, 1), "float32")
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path))  # val_loss, but no validation data
    with pytest.warns(UserWarning, match="monitors 'val_loss', which is not in the epoch logs") as caught:
        _model().fit(x, x, epochs=3, verbose=0, callbacks=[cb])
    assert len([w for w in caught if "not in the epoch logs" in str(w.message)]) == 1
    assert sorted(os.listdir(tmp_path)) == ["epoch-0001.keras", "epoch-0002.keras", "epoch-0003.keras"]


def test_unwritable_directory_fails_before_the_first_epoch(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    epochs = []
    count = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: epochs.append(epoch))
    x = np.ones((8, 1), "float32")
    cb = kfast.callbacks.RankZeroCheckpoint(str(blocker / "ckpt"), monitor="loss")
    with pytest.raises(ValueError, match="cannot write to .*a-file/ckpt.*checked before training"):
        _model().fit(x, x, epochs=2, verbose=0, callbacks=[cb, count])
    assert epochs == []


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "up"}, "mode='up'"),
    ({"keep": 0}, "keep=0"),
    ({"initial_value_threshold": float("nan")}, "initial_value_threshold=nan"),
])
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        kfast.callbacks.RankZeroCheckpoint(str(tmp_path), **kwargs)


def test_partial_files_of_a_save_killed_halfway_are_removed_when_training_begins(tmp_path, capsys):
    # What save_atomic leaves when its process is killed between writing and renaming.
    (tmp_path / ".tmp-4242-epoch-0003.keras").write_bytes(b"PK\x03\x04 half an archive")
    (tmp_path / "notes.txt").write_text("not kfast's")
    x = np.ones((8, 1), "float32")
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="loss", verbose=1)
    _model().fit(x, x, epochs=1, verbose=0, callbacks=[cb])
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "epoch-0001.keras", "notes.txt"]
    assert "removed 1 partial file(s) of a save that was killed halfway: .tmp-4242-epoch-0003.keras" in (
        capsys.readouterr().out)
