"""RankZeroCheckpoint: Keras's monitor conventions, a best model per directory that survives resumes, early write
checks, Keras's file options (weights only, name templates, save_freq) and clear errors."""

import os
import re

import keras
import numpy as np
import pytest

from helpers import rewrite_state
import kfast
import kfast.callbacks
from kfast.distributed import checkpoint


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


# --- the best so far belongs to a directory, not to the model -------------------------------------------

def _epoch(cb, model, epoch, weight, val_loss):
    _set(model, weight)
    cb.on_epoch_end(epoch, {"val_loss": val_loss})


def _started(directory, model, **kwargs):
    cb = kfast.callbacks.RankZeroCheckpoint(str(directory), monitor="val_loss", **kwargs)
    cb.set_model(model)
    cb.on_train_begin()
    return cb


def test_a_new_directory_starts_from_its_own_threshold(tmp_path):
    model = _model()
    _epoch(_started(tmp_path / "a", model), model, 0, 1.0, 0.2)
    # The same model in memory, a new callback and directory: 0.1 beats the old best, not the threshold 0.
    _epoch(_started(tmp_path / "b", model, initial_value_threshold=0), model, 0, 2.0, 0.1)
    assert sorted(os.listdir(tmp_path / "b")) == ["epoch-0001.keras"]


def test_a_new_directory_gets_its_own_best_file(tmp_path):
    model = _model()
    _epoch(_started(tmp_path / "a", model), model, 0, 1.0, 0.2)
    _epoch(_started(tmp_path / "b", model), model, 0, 2.0, 0.5)  # worse than a's best; b's first
    assert _best_weight(tmp_path / "b") == 2.0 and _best_weight(tmp_path / "a") == 1.0


def test_restoring_one_directory_does_not_carry_its_best_into_another(tmp_path):
    model = _model()
    _epoch(_started(tmp_path / "a", model), model, 0, 1.0, 0.2)
    resumed = _model()
    assert kfast.distributed.restore(resumed, str(tmp_path / "a")) == 1
    assert "best" not in checkpoint.training_state(resumed)  # the directory's, not the model's
    _epoch(_started(tmp_path / "b", resumed), resumed, 1, 2.0, 0.5)
    assert _best_weight(tmp_path / "b") == 2.0
    # Restored from a, a's callback keeps a's best: 0.5 does not replace it.
    _epoch(_started(tmp_path / "a", resumed), resumed, 1, 3.0, 0.5)
    assert _best_weight(tmp_path / "a") == 1.0


def test_one_callback_keeps_its_best_from_one_fit_to_the_next(tmp_path):
    model = _model()
    cb = _started(tmp_path, model)
    _epoch(cb, model, 0, 1.0, 0.2)
    cb.on_train_begin()  # a second fit with the same callback, as Keras's ModelCheckpoint keeps self.best
    _epoch(cb, model, 1, 2.0, 0.5)
    assert _best_weight(tmp_path) == 1.0


def test_the_best_of_a_resumed_directory_comes_from_its_best_file(tmp_path):
    model = _model()
    cb = _started(tmp_path, model)
    _epoch(cb, model, 0, 1.0, 0.5)
    _epoch(cb, model, 1, 2.0, 0.2)
    broken = checkpoint.epoch_path(str(tmp_path), 2)
    with open(broken, "r+b") as f:
        f.truncate(os.path.getsize(broken) // 2)
    resumed = _model()
    with pytest.warns(UserWarning, match="skipped checkpoint .*epoch-0002.keras"):
        assert kfast.distributed.restore(resumed, str(tmp_path)) == 1
    # Epoch 1's file recorded 0.5; best.keras, the model of 0.2, says 0.2: 0.3 must not replace it.
    assert checkpoint.restore_point(resumed).best == {"monitor": "val_loss", "mode": "min", "value": 0.2}
    _epoch(_started(tmp_path, resumed), resumed, 1, 3.0, 0.3)
    assert _best_weight(tmp_path) == 2.0


def test_a_version_1_checkpoint_with_the_best_in_the_model_state_still_resumes(tmp_path):
    model = _model()
    cb = _started(tmp_path, model)
    _epoch(cb, model, 0, 1.0, 0.2)
    _epoch(cb, model, 1, 2.0, 0.4)
    # kfast before this layout: no position (the name gives it), the best inside the training state.
    for name in ("epoch-0001.keras", "epoch-0002.keras", "best.keras"):
        rewrite_state(tmp_path / name, {"version": 1, "best": {"monitor": "val_loss", "mode": "min", "value": 0.2}})
    resumed = _model()
    assert kfast.distributed.restore(resumed, str(tmp_path)) == 2
    assert checkpoint.training_state(resumed) == {}
    _epoch(_started(tmp_path, resumed), resumed, 2, 3.0, 0.3)
    assert _best_weight(tmp_path) == 1.0


# --- Keras's save_weights_only, filename templates and save_freq -----------------------------------------

def _variables(model):
    return [np.asarray(v) for v in model.weights] + [np.asarray(v) for v in model.optimizer.variables]


def _unbuilt():
    model = keras.Sequential([keras.layers.Dense(2), keras.layers.Dense(1)])  # no Input: built by restore
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def _xy(n=16):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def test_save_weights_only_writes_weights_files_that_restore_resumes_from(tmp_path):
    keras.utils.set_random_seed(0)
    model = _unbuilt()
    x, y = _xy()
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="loss", save_weights_only=True)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[cb])
    assert sorted(os.listdir(tmp_path)) == ["best.weights.h5", "epoch-0001.weights.h5", "epoch-0002.weights.h5"]
    fresh = _unbuilt()
    assert kfast.distributed.restore(fresh, str(tmp_path)) == 2
    for got, want in zip(_variables(fresh), _variables(model)):
        np.testing.assert_array_equal(got, want)  # the weights and the optimizer's state (iterations included)
    loaded = _unbuilt()
    loaded.build((None, 3))
    loaded.optimizer.build(loaded.trainable_variables)  # Keras loads an optimizer's state into a built one
    loaded.load_weights(tmp_path / "best.weights.h5")  # plain Keras reads it
    assert int(loaded.optimizer.iterations.numpy()) > 0


def test_a_filename_template_names_the_files_and_restore_finds_the_newest(tmp_path):
    x, y = _xy()
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="loss", keep=2,
                                            filename="model-{epoch:02d}-{loss:.4f}.keras")
    history = _model().fit(x[:, :1], y, batch_size=4, epochs=3, verbose=0, callbacks=[cb])
    names = [f"model-{e + 1:02d}-{loss:.4f}.keras" for e, loss in enumerate(history.history["loss"])]
    assert sorted(os.listdir(tmp_path)) == sorted(["best.keras", *names[1:]])  # keep=2: the first is gone
    resumed = _model()
    assert kfast.distributed.restore(resumed, str(tmp_path)) == 3
    assert checkpoint.restore_point(resumed).path == os.path.join(str(tmp_path), names[2])


def test_save_freq_saves_every_n_batches_and_restore_says_where_in_the_epoch(tmp_path):
    x, y = _xy(24)  # 6 batches of 4 per epoch; a save every 4: after batches 4 and 6+2 and 6+6 of the fit
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="loss", save_freq=4)
    _model().fit(x[:, :1], y, batch_size=4, epochs=2, verbose=0, callbacks=[cb])
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "epoch-0001-batch-0004.keras", "epoch-0002-batch-0002.keras",
                                            "epoch-0002-batch-0006.keras"]
    positions = {name: checkpoint.read_archive(tmp_path / name)[1]["position"] for name in os.listdir(tmp_path)
                 if name != "best.keras"}
    assert positions == {"epoch-0001-batch-0004.keras": {"epoch": 0, "batch": 4},
                         "epoch-0002-batch-0002.keras": {"epoch": 1, "batch": 2},
                         "epoch-0002-batch-0006.keras": {"epoch": 2, "batch": 0}}  # the epoch's last batch: its end
    assert kfast.distributed.restore(_model(), str(tmp_path)) == 2
    os.remove(tmp_path / "epoch-0002-batch-0006.keras")
    resumed = _model()
    # Arrays cannot say where they were: the epoch runs again from its first batch, and restore() says so.
    with pytest.warns(UserWarning, match=r"saved 2 batch\(es\) into epoch 2, but it records no data position \(its "
                                         r"RankZeroCheckpoint had no loader=\): epoch 2 runs again from its first batch"):
        assert kfast.distributed.restore(resumed, str(tmp_path)) == 1
    point = checkpoint.restore_point(resumed)
    assert (point.epoch, point.batch) == (1, 2)
    again = kfast.callbacks.RankZeroCheckpoint(str(tmp_path / "again"), monitor="loss")
    resumed.fit(x[:, :1], y, batch_size=4, epochs=2, initial_epoch=1, verbose=0, callbacks=[again])


def test_epoch_saves_leave_keras_its_asynchronous_batch_hooks(tmp_path):
    # Keras dispatches batch hooks asynchronously unless a callback overrides one.
    assert type(kfast.callbacks.RankZeroCheckpoint(str(tmp_path))).on_train_batch_end is (
        keras.callbacks.Callback.on_train_batch_end)
    # Watching for preemption (SIGTERM, the default) looks at each batch's start, which Keras never defers.
    assert "on_train_batch_end" not in vars(kfast.callbacks.RankZeroCheckpoint(str(tmp_path)))
    assert "on_train_batch_end" in vars(kfast.callbacks.RankZeroCheckpoint(str(tmp_path), save_freq=2))


# --- clear errors for bad paths and arguments -------------------------------------------------------------

@pytest.mark.parametrize("directory", [None, "", 3, b"ckpt"])
def test_a_directory_that_is_no_path_is_refused_clearly(directory):
    with pytest.raises(ValueError, match=rf"RankZeroCheckpoint got directory={re.escape(repr(directory))}; it must "
                                         r"be the path \(a str or os.PathLike\) of a directory"):
        kfast.callbacks.RankZeroCheckpoint(directory)


def test_a_keras_filepath_for_a_directory_gets_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"directory='ckpt/model.keras', a file name; .*pass "
                                         r"RankZeroCheckpoint\('ckpt', filename='model.keras'\)"):
        kfast.callbacks.RankZeroCheckpoint("ckpt/model.keras")


@pytest.mark.parametrize("model, directory, match", [
    ("compiled", None, r"restore\(\) got checkpoint_dir=None; it must be the path \(a str or os.PathLike\)"),
    ("compiled", 7, r"restore\(\) got checkpoint_dir=7; it must be the path"),
    ("compiled", "a-file", r"checkpoint_dir='.*a-file', which is a file; pass the directory"),
    ("not a model", "ckpt", r"restore\(\) got model='not a model' \(str\); it must be the compiled keras.Model"),
])
def test_restore_refuses_bad_arguments_clearly(tmp_path, model, directory, match):
    (tmp_path / "a-file").write_text("x")
    if directory == "a-file":
        directory = str(tmp_path / "a-file")
    with pytest.raises(ValueError, match=match):
        kfast.distributed.restore(_model() if model == "compiled" else model, directory)


@pytest.mark.parametrize("kwargs, match", [
    ({"filename": "model.h5"}, r"filename='model.h5' with save_weights_only=False; Keras 3 saves whole models "
                               r"to '.keras' files"),
    ({"filename": "model.keras", "save_weights_only": True}, r"must end in '.weights.h5' \(or pass "
                                                              r"save_weights_only=False"),
    ({"filename": "sub/model.keras"}, "a plain name inside directory="),
    ({"filename": "epoch-{batch}.keras"}, r"\{batch\} only has a value when saving every N batches"),
    ({"filename": "epoch-{}.keras"}, "positional placeholder"),
    ({"filename": "{epoch:.2q}.keras"}, r"cannot use filename='\{epoch:.2q\}.keras' \(ValueError"),
    ({"filename": "{val_loss:03d}.keras"}, r"cannot use filename="),
    ({"filename": "best.keras"}, "the name of its best model"),
    ({"filename": 3}, "filename=3; it must be a file name"),
    ({"save_freq": "batch"}, "save_freq='batch'; it must be a positive int .*or 'epoch'"),
    ({"save_freq": 0}, "save_freq=0; it must be a positive int"),
    ({"save_freq": True}, "save_freq=True; it must be a positive int"),
    ({"save_weights_only": "yes"}, "save_weights_only='yes'; it must be True"),
    ({"monitor": 3}, "monitor=3; it must be the name of a log value"),
    ({"verbose": -1}, "verbose=-1; it must be an int >= 0"),
    ({"keep": "3"}, "keep='3'; it must be a positive int"),
])
def test_bad_keras_style_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        kfast.callbacks.RankZeroCheckpoint(str(tmp_path), **kwargs)


def test_a_template_key_missing_from_the_logs_is_named(tmp_path):
    x, y = _xy()
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="loss", filename="{epoch}-{val_loss:.2f}.keras")
    with pytest.raises(ValueError, match=r"cannot name the checkpoint of epoch 1 from filename='\{epoch\}-"
                                         r"\{val_loss:.2f\}.keras': the logs have no 'val_loss' "
                                         r"\(they hold \['loss'\]\)"):
        _model().fit(x[:, :1], y, epochs=1, verbose=0, callbacks=[cb])
