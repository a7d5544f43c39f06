"""kfast.distributed.restore: unbuilt models, broken checkpoints, training state travelling with the weights."""

import json
import os
import zipfile

import keras
import numpy as np
import pytest

from helpers import rewrite_state
import kfast
import kfast.callbacks
from kfast.distributed import checkpoint


def _mnist_like():
    # Horovod's tensorflow2_keras_mnist.py structure: no Input layer, so nothing is built before fit.
    return keras.Sequential([
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(3, activation="softmax"),
    ])


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 8, 8, 1)).astype("float32"), rng.integers(0, 3, size=32)


def _compiled(model):
    model.compile(kfast.DistributedOptimizer(keras.optimizers.Adam(1e-3)), "sparse_categorical_crossentropy",
                  jit_compile=False)
    return model


def _train(tmp_path, epochs=2):
    keras.utils.set_random_seed(0)
    model = _compiled(_mnist_like())
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False,
              callbacks=kfast.distributed.default_callbacks(str(tmp_path), monitor="loss"))
    return model


def _state(model):
    return [np.asarray(v) for v in model.weights] + [np.asarray(v) for v in model.optimizer.variables]


def test_restore_builds_a_model_without_an_input_layer(tmp_path):
    trained = _train(tmp_path)
    fresh = _compiled(_mnist_like())
    assert not fresh.built
    assert kfast.distributed.restore(fresh, str(tmp_path)) == 2
    for got, want in zip(_state(fresh), _state(trained)):
        np.testing.assert_array_equal(got, want)
    x, y = _data()
    fresh.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, verbose=0,
              callbacks=kfast.distributed.default_callbacks(str(tmp_path), monitor="loss"))
    assert checkpoint.list_epochs(str(tmp_path))[-1] == 3


def test_restore_without_checkpoint_leaves_an_unbuilt_model_trainable(tmp_path):
    model = _compiled(_mnist_like())
    assert kfast.distributed.restore(model, str(tmp_path / "none")) == 0
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[kfast.callbacks.BroadcastState()])


def test_truncated_latest_checkpoint_falls_back_to_the_one_before(tmp_path):
    trained = _train(tmp_path, epochs=2)
    first = checkpoint.epoch_path(str(tmp_path), 1)
    expected = keras.saving.load_model(first).get_weights()
    latest = checkpoint.epoch_path(str(tmp_path), 2)
    with open(latest, "r+b") as f:
        f.truncate(os.path.getsize(latest) // 2)
    fresh = _compiled(_mnist_like())
    with pytest.warns(UserWarning, match=r"skipped checkpoint .*epoch-0002\.keras cannot be read"):
        assert kfast.distributed.restore(fresh, str(tmp_path)) == 1
    for got, want in zip(fresh.get_weights(), expected):
        np.testing.assert_array_equal(got, want)
    assert trained is not None


def test_no_readable_checkpoint_names_the_directory(tmp_path):
    for epoch in (1, 2):
        with open(checkpoint.epoch_path(str(tmp_path), epoch), "wb") as f:
            f.write(b"PK\x03\x04 not really a zip")
    fresh = _compiled(_mnist_like())
    with pytest.warns(UserWarning, match="skipped checkpoint"):
        with pytest.raises(ValueError, match=f"No checkpoint in {tmp_path} can be read .*epochs \\[1, 2\\]"):
            kfast.distributed.restore(fresh, str(tmp_path))


def test_checkpoint_state_is_inside_the_keras_file_and_it_still_loads(tmp_path):
    _train(tmp_path, epochs=1)
    path = checkpoint.epoch_path(str(tmp_path), 1)
    assert "kfast-state.json" in zipfile.ZipFile(path).namelist()
    _, state = checkpoint.read_archive(path)
    assert state["base_learning_rate"] == pytest.approx(1e-3)
    assert state["best"]["monitor"] == "loss" and state["best"]["mode"] == "min"
    assert type(keras.saving.load_model(path).optimizer).__name__ == "Adam"


def test_the_state_carries_its_version_and_a_newer_one_is_refused_by_name(tmp_path):
    _train(tmp_path, epochs=1)
    path = checkpoint.epoch_path(str(tmp_path), 1)
    saved = json.loads(zipfile.ZipFile(path).read("kfast-state.json"))
    assert saved["version"] == checkpoint.STATE_VERSION
    # Written before states had a version: the same keys, read as they are.
    rewrite_state(path, {k: v for k, v in saved.items() if k != "version"})
    assert kfast.distributed.restore(_compiled(_mnist_like()), str(tmp_path)) == 1
    rewrite_state(path, {**saved, "version": checkpoint.STATE_VERSION + 1})
    with pytest.raises(ValueError, match=rf"{path} holds kfast training state of format version "
                                         rf"{checkpoint.STATE_VERSION + 1}, and this kfast reads versions up to"):
        kfast.distributed.restore(_compiled(_mnist_like()), str(tmp_path))
