"""Keras's own expectations of ModelCheckpoint and BackupAndRestore, held against RankZeroCheckpoint.

Each test names the case it adapts from Keras 3's keras/src/callbacks/model_checkpoint_test.py or
backup_and_restore_test.py. The adaptations follow docs/checkpoints.md: ModelCheckpoint's `filepath` is
`directory` + `filename`; RankZeroCheckpoint writes every save (the newest `keep`) and keeps the best model
beside them in `best.keras`, which is what `save_best_only=True` writes; a run resumes through
`kfast.distributed.restore` rather than inside `fit`, and checkpoints are never deleted after training.
One process: kfast's topology answers rank 0 of 1 without Horovod.
"""

import os

import keras
import numpy as np
import pytest

import kfast
import kfast.callbacks
from kfast.distributed import checkpoint

SAMPLES, FEATURES, CLASSES = 30, 3, 3


def _data():
    rng = np.random.default_rng(42)
    x = rng.normal(size=(2 * SAMPLES, FEATURES)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, CLASSES, 2 * SAMPLES), CLASSES)
    return (x[:SAMPLES], y[:SAMPLES]), (x[SAMPLES:], y[SAMPLES:])


def _classifier(metrics=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(5, activation="relu"),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    model.compile("sgd", "categorical_crossentropy", metrics=metrics or [keras.metrics.Accuracy("acc")])
    return model


def _fit(model, cb, epochs=1, batch_size=5, extra=()):
    (x, y), validation = _data()
    return model.fit(x, y, batch_size=batch_size, validation_data=validation, epochs=epochs, verbose=0,
                     callbacks=[cb, *extra])


def _checkpointer(directory, **kwargs):
    return kfast.callbacks.RankZeroCheckpoint(str(directory), **kwargs)


# --- model_checkpoint_test.py: test_model_checkpoint_options --------------------------------------------

@pytest.mark.parametrize("monitor, mode", [("val_loss", "auto"), ("val_loss", "min"), ("val_acc", "max")])
def test_cases_1_to_3_each_epoch_is_saved_whatever_the_monitor_and_mode(tmp_path, monitor, mode):
    _fit(_classifier(), _checkpointer(tmp_path, monitor=monitor, mode=mode))
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "epoch-0001.keras"]


def test_case_4_the_best_file_is_what_save_best_only_writes(tmp_path):
    model = _classifier()
    cb = _checkpointer(tmp_path, monitor="val_acc", mode="max")
    cb.set_model(model)
    cb.on_train_begin()
    for epoch, (weight, val_acc) in enumerate([(1.0, 0.5), (2.0, 0.7), (3.0, 0.6)]):
        model.set_weights([np.full_like(w, weight) for w in model.get_weights()])
        cb.on_epoch_end(epoch, {"val_acc": val_acc})
    assert keras.saving.load_model(tmp_path / "best.keras").get_weights()[0][0, 0] == 2.0


def test_case_5_a_monitor_missing_from_the_logs_warns_and_the_epoch_is_still_saved(tmp_path):
    with pytest.warns(UserWarning, match="monitors 'unknown', which is not in the epoch logs"):
        _fit(_classifier(), _checkpointer(tmp_path, monitor="unknown", mode="min"))
    assert sorted(os.listdir(tmp_path)) == ["epoch-0001.keras"]


def test_case_6_an_unknown_mode_is_refused(tmp_path):
    # Keras warns and falls back to "auto"; kfast refuses a mode it would have to guess.
    with pytest.raises(ValueError, match="mode='unknown'; use 'auto', 'min' or 'max'"):
        _checkpointer(tmp_path, monitor="val_acc", mode="unknown")


@pytest.mark.parametrize("suffix", [".keras", ".weights.h5"])
def test_case_8_an_int_save_freq_saves_every_n_batches(tmp_path, suffix):
    # 5 batches of 6 per epoch: a save every 15 batches is a save at the end of epochs 3, 6 and 9.
    cb = _checkpointer(tmp_path, monitor=None, save_freq=15, filename="checkpoint.epoch{epoch:02d}" + suffix,
                       save_weights_only=suffix == ".weights.h5")
    _fit(_classifier(), cb, epochs=10, batch_size=6)
    assert sorted(os.listdir(tmp_path)) == [f"checkpoint.epoch{e:02d}{suffix}" for e in (3, 6, 9)]


@pytest.mark.parametrize("save_freq", ["invalid_save_freq", "batch", 0.15])
def test_case_9_save_freq_is_epoch_or_an_int(tmp_path, save_freq):
    with pytest.raises(ValueError, match=f"save_freq={save_freq!r}; it must be a positive int"):
        _checkpointer(tmp_path, save_weights_only=True, save_freq=save_freq)
    for accepted in ("epoch", 3):
        _checkpointer(tmp_path, save_weights_only=True, save_freq=accepted)


@pytest.mark.parametrize("suffix", [".keras", ".weights.h5"])
def test_case_10_the_batch_in_the_filename(tmp_path, suffix):
    cb = _checkpointer(tmp_path, save_freq=1, keep=10, filename="checkpoint.epoch{epoch:02d}batch{batch:02d}" + suffix,
                       save_weights_only=suffix == ".weights.h5", monitor=None)
    _fit(_classifier(), cb, epochs=5, batch_size=15)
    assert sorted(os.listdir(tmp_path)) == sorted(f"checkpoint.epoch{e:02d}batch{b:02d}{suffix}"
                                                  for e in range(1, 6) for b in (1, 2))


@pytest.mark.parametrize("case, monitor, mode, threshold, metric, written", [
    (11, "val_acc", "max", -0.01, None, True),
    (12, "val_loss", "auto", None, None, True),
    (13, "val_loss", "min", 0, None, False),
    (14, "val_loss", "auto", 0, None, False),
    (15, "val_auc", "auto", 1, "auc", False),
])
def test_cases_11_to_15_initial_value_threshold(tmp_path, case, monitor, mode, threshold, metric, written):
    model = _classifier([keras.metrics.AUC()] if metric == "auc" else None)
    _fit(model, _checkpointer(tmp_path, monitor=monitor, mode=mode, initial_value_threshold=threshold))
    assert (tmp_path / "best.keras").exists() is written
    assert (tmp_path / "epoch-0001.keras").exists()


# --- model_checkpoint_test.py: test_model_checkpoint_loading --------------------------------------------

def test_loading_the_best_model_with_keras(tmp_path):
    model = _classifier()
    _fit(model, _checkpointer(tmp_path, monitor="val_loss"))
    loaded = keras.saving.load_model(tmp_path / "best.keras")
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(got, want)


def test_loading_the_best_weights_with_keras(tmp_path):
    model = _classifier()
    _fit(model, _checkpointer(tmp_path, monitor="val_loss", save_weights_only=True))
    fresh = _classifier()
    fresh.optimizer.build(fresh.trainable_variables)
    fresh.load_weights(tmp_path / "best.weights.h5")
    for got, want in zip(fresh.get_weights(), model.get_weights()):
        np.testing.assert_allclose(got, want)


# --- ModelCheckpoint's arguments, as its docstring states them ------------------------------------------

def test_the_suffix_follows_keras_3s_rule(tmp_path):
    with pytest.raises(ValueError, match=r"save_weights_only=True; Keras 3 saves weights to '.weights.h5' files"):
        _checkpointer(tmp_path, save_weights_only=True, filename="checkpoint.keras")
    with pytest.raises(ValueError, match=r"save_weights_only=False; Keras 3 saves whole models to '.keras' files"):
        _checkpointer(tmp_path, filename="checkpoint.weights.h5")


def test_format_specs_fill_the_name_from_epoch_and_logs(tmp_path):
    history = _fit(_classifier(), _checkpointer(tmp_path, filename="{epoch:02d}-{val_loss:.2f}.keras"))
    assert sorted(os.listdir(tmp_path)) == sorted(["best.keras", f"01-{history.history['val_loss'][0]:.2f}.keras"])


def test_verbose_prints_each_save_on_rank_0(tmp_path, capsys):
    history = _fit(_classifier(), _checkpointer(tmp_path, monitor="val_loss", verbose=1), epochs=2)
    first, second = history.history["val_loss"]
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    expected = [f"Epoch 1: saved {tmp_path}/epoch-0001.keras; val_loss improved from None to {first:.5f}, saved "
                "as best.keras too"]
    if second < first:
        expected.append(f"Epoch 2: saved {tmp_path}/epoch-0002.keras; val_loss improved from {first:.5f} to "
                        f"{second:.5f}, saved as best.keras too")
    else:
        expected.append(f"Epoch 2: saved {tmp_path}/epoch-0002.keras; val_loss did not improve from {first:.5f}")
    assert lines == expected
    _fit(_classifier(), _checkpointer(tmp_path / "quiet", monitor="val_loss"))
    assert capsys.readouterr().out == ""


# --- backup_and_restore_test.py ---------------------------------------------------------------------------

class _Interrupt(keras.callbacks.Callback):
    """Stops training with an error at the end of a given epoch or training step (both counted from 1)."""

    def __init__(self, epoch=None, step=None):
        super().__init__()
        self.epoch, self.step, self.steps = epoch, step, 0

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epoch:
            raise RuntimeError("interrupted")

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.step:
            raise RuntimeError("interrupted")


class _Canary(keras.layers.Layer):
    """Counts the training steps it saw in a weight, which a checkpoint saves and restore() brings back."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.counter = self.add_weight(shape=(), initializer="zeros", dtype="float32", trainable=False)

    def call(self, x):
        self.counter.assign_add(1.0)
        return x


def _canary_model():
    model = keras.Sequential([keras.Input((3,)), _Canary(), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mse"])
    return model


def _steps(model):
    return int(model.layers[0].counter.numpy())


def _regression():
    rng = np.random.default_rng(0)
    return rng.random((10, 3)).astype("float32"), rng.random((10, 1)).astype("float32")  # 3 batches of 4


def _interrupted(tmp_path, cb, interrupt):
    x, y = _regression()
    model = _canary_model()
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(x, y, batch_size=4, epochs=6, verbose=0, callbacks=[cb, interrupt])
    return model


def _resumed(tmp_path, epochs=5):
    x, y = _regression()
    model = _canary_model()  # a new process: the same model again, then restore
    initial_epoch = kfast.distributed.restore(model, str(tmp_path))
    steps = _steps(model)
    history = model.fit(x, y, batch_size=4, epochs=epochs, initial_epoch=initial_epoch, verbose=0,
                        callbacks=[_checkpointer(tmp_path, monitor="loss")])
    return initial_epoch, steps, history, model


def test_best_case_epoch(tmp_path):
    model = _interrupted(tmp_path, _checkpointer(tmp_path, monitor="loss"), _Interrupt(epoch=2))
    assert _steps(model) == 6
    initial_epoch, steps, history, resumed = _resumed(tmp_path)
    assert (initial_epoch, steps, history.epoch, _steps(resumed)) == (2, 6, [2, 3, 4], 5 * 3)


def test_best_case_step(tmp_path):
    _interrupted(tmp_path, _checkpointer(tmp_path, monitor="loss", save_freq=1), _Interrupt(step=2))
    # Saved 2 batches into epoch 1: the state of step 2 comes back, and the epoch runs again from its start,
    # as BackupAndRestore does (it records the epoch in progress).
    with pytest.warns(UserWarning, match=r"saved 2 batch\(es\) into epoch 1"):
        initial_epoch, steps, history, resumed = _resumed(tmp_path)
    assert (initial_epoch, steps, history.epoch[-1], _steps(resumed)) == (0, 2, 4, 2 + 5 * 3)


def test_backup_corrupted(tmp_path):
    # double_checkpoint=True keeps the save before the last; keep= (3 by default) keeps that and more.
    _interrupted(tmp_path, _checkpointer(tmp_path, monitor="loss"), _Interrupt(epoch=2))
    with open(checkpoint.epoch_path(str(tmp_path), 2), "w") as f:
        f.write("0")
    with pytest.warns(UserWarning, match=r"skipped checkpoint .*epoch-0002\.keras cannot be read"):
        initial_epoch, steps, history, resumed = _resumed(tmp_path)
    assert (initial_epoch, steps, history.epoch[-1], _steps(resumed)) == (1, 3, 4, 5 * 3)


def test_model_deleted_case_epoch(tmp_path):
    # delete_checkpoint=True does not apply: the checkpoints stay, and a finished run resumes at its end.
    x, y = _regression()
    _canary_model().fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[_checkpointer(tmp_path, monitor="loss")])
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "epoch-0001.keras", "epoch-0002.keras"]
    assert kfast.distributed.restore(_canary_model(), str(tmp_path)) == 2


@pytest.mark.parametrize("directory", ["", None])
def test_backup_dir_empty_or_none_error(directory):
    with pytest.raises(ValueError, match=f"RankZeroCheckpoint got directory={directory!r}; it must be the path"):
        kfast.callbacks.RankZeroCheckpoint(directory)
    with pytest.raises(ValueError, match=f"restore\\(\\) got checkpoint_dir={directory!r}; it must be the path"):
        kfast.distributed.restore(_canary_model(), directory)
