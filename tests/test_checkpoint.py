"""kfast.distributed.restore: unbuilt models, broken checkpoints, training state travelling with the weights."""

import json
import os
import subprocess
import sys
import warnings
import zipfile

import h5py
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


# Files plain Keras opens (NOTE [ Files plain Keras opens ] in kfast/distributed/optimizer.py).

def _plain_state(model):
    """Weights, then the variables of the optimizer a DistributedOptimizer wraps (or of a plain one)."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    return [np.asarray(v) for v in model.weights] + [np.asarray(v) for v in optimizer.variables]


class _Record(keras.callbacks.Callback):
    """The state after each batch and each epoch, as the checkpoint callbacks before it saved it."""

    def __init__(self):
        super().__init__()
        self.batches, self.epochs, self._epoch = {}, {}, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.batches[(self._epoch, batch)] = _plain_state(self.model)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs[epoch] = _plain_state(self.model)


# Loads each file with Keras alone (importing kfast or Horovod fails) and writes what it holds.
_PLAIN_LOAD = """
import json, sys
sys.modules["kfast"] = sys.modules["horovod"] = None
import keras, numpy as np
paths, x, out = json.loads(sys.argv[1]), np.load(sys.argv[2]), {}
for name, path in paths.items():
    try:
        m = keras.saving.load_model(path)
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
        continue
    out[name] = {"optimizer": type(m.optimizer).__name__, "iterations": int(m.optimizer.iterations),
                 "state": [np.asarray(v).tolist() for v in m.weights + m.optimizer.variables],
                 "predictions": m.predict(x, verbose=0).tolist()}
json.dump(out, open(sys.argv[3], "w"))
"""


@pytest.mark.slow  # a fresh Python that imports TensorFlow
def test_every_file_of_a_kfast_job_opens_in_plain_keras_with_its_adam_state(tmp_path):
    keras.utils.set_random_seed(0)
    model = _compiled(_mnist_like())
    x, y = _data()
    record = _Record()
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[
        kfast.callbacks.RankZeroCheckpoint(str(tmp_path / "epochs"), monitor="loss", preemption_signals=None),
        kfast.callbacks.RankZeroCheckpoint(str(tmp_path / "steps"), monitor=None, save_freq=3, preemption_signals=None),
        record])
    model.save(str(tmp_path / "final.keras"))  # the user's own last line
    best = int(np.argmin(history.history["loss"]))
    expected = {  # file: (state when it was written, Adam's iterations then)
        "epochs/best.keras": (record.epochs[best], 4 * (best + 1)),
        "epochs/epoch-0001.keras": (record.epochs[0], 4),
        "steps/epoch-0001-batch-0003.keras": (record.batches[(0, 2)], 3),
        "final.keras": (_plain_state(model), 8),
    }
    probe = x[:5]
    np.save(tmp_path / "x.npy", probe)
    proc = subprocess.run(
        [sys.executable, "-c", _PLAIN_LOAD, json.dumps({n: str(tmp_path / n) for n in expected}),
         str(tmp_path / "x.npy"), str(tmp_path / "loaded.json")],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "loaded.json") as f:
        loaded = json.load(f)
    for name, (state, iterations) in expected.items():
        got = loaded[name]
        assert "error" not in got, f"{name}: {got.get('error')}"
        assert (got["optimizer"], got["iterations"]) == ("Adam", iterations), name
        assert len(got["state"]) == len(state), name
        for saved, want in zip(got["state"], state):
            np.testing.assert_array_equal(saved, want, err_msg=name)  # weights, Adam's iterations and moments
        model.set_weights(state[:len(model.weights)])
        np.testing.assert_allclose(got["predictions"], model.predict(probe, verbose=0), rtol=0, atol=1e-6,
                                   err_msg=name)


def test_model_save_names_the_wrapped_optimizer_and_stores_its_state_as_plain_keras_does(tmp_path):
    keras.utils.set_random_seed(0)
    wrapped = _compiled(_mnist_like())
    plain = _mnist_like()
    plain.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", jit_compile=False)
    x, y = _data()
    wrapped.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
        kfast.callbacks.RankZeroCheckpoint(str(tmp_path / "ckpt"), monitor="loss", preemption_signals=None)])
    plain.fit(x, y, batch_size=8, epochs=1, verbose=0)
    for model, name in ((wrapped, "wrapped.keras"), (plain, "plain.keras")):
        model.save(str(tmp_path / name))

    def layout(name):
        with zipfile.ZipFile(tmp_path / name) as z:
            optimizer = json.loads(z.read("config.json"))["compile_config"]["optimizer"]
            with h5py.File(z.open("model.weights.h5")) as f:
                groups = []
                f.visit(lambda member: groups.append(member) if member.startswith("optimizer") else None)
        return optimizer["module"], optimizer["class_name"], optimizer.get("registered_name"), groups

    assert layout("wrapped.keras") == layout("plain.keras")
    assert layout("wrapped.keras")[:2] == ("keras.optimizers", "Adam")
    assert isinstance(wrapped.optimizer, kfast.DistributedOptimizer)  # training itself is unchanged


def test_fit_with_the_standard_callbacks_and_no_checkpoints_still_saves_a_plain_keras_optimizer(tmp_path):
    # default_callbacks() without a directory has no RankZeroCheckpoint: BroadcastState unwraps for saving.
    wrapped = _compiled(_mnist_like())
    x, y = _data()
    wrapped.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=kfast.distributed.default_callbacks())
    assert wrapped.get_compile_config()["optimizer"]["class_name"] == "Adam"
    assert isinstance(wrapped.optimizer, kfast.DistributedOptimizer)


def test_a_plain_keras_adam_checkpoint_restores_into_a_distributed_optimizer_with_its_moments(tmp_path):
    keras.utils.set_random_seed(0)
    plain = _mnist_like()
    plain.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", jit_compile=False)
    x, y = _data()
    plain.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False,
              callbacks=[keras.callbacks.ModelCheckpoint(str(tmp_path / "epoch-{epoch:04d}.keras"))])
    saved = _plain_state(plain)
    fresh = _compiled(_mnist_like())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Skipping variable loading for optimizer ..." would mean state lost
        assert kfast.distributed.restore(fresh, str(tmp_path)) == 2
    assert int(fresh.optimizer.iterations) == 8
    for got, want in zip(_plain_state(fresh), saved, strict=True):
        np.testing.assert_array_equal(got, want)
    # One more epoch under the wrapper takes the steps plain Keras takes from the same moments.
    plain.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, verbose=0, shuffle=False)
    fresh.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, verbose=0, shuffle=False)
    for got, want in zip(_plain_state(fresh), _plain_state(plain), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


def test_load_model_wraps_a_plain_files_optimizer_and_keeps_its_state(tmp_path):
    keras.utils.set_random_seed(0)
    plain = _mnist_like()
    plain.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=False)
    x, y = _data()
    plain.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    plain.save(str(tmp_path / "plain.keras"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = checkpoint.load_model(str(tmp_path / "plain.keras"), backward_passes_per_step=1)
    assert isinstance(model.optimizer, kfast.DistributedOptimizer)
    assert type(model.optimizer.inner_optimizer).__name__ == "Adam"
    assert int(model.optimizer.iterations) == 4
    for got, want in zip(_plain_state(model), _plain_state(plain), strict=True):
        np.testing.assert_array_equal(got, want)
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    plain.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert sorted(history.history) == ["accuracy", "loss"]  # the file's compile settings, metrics too
    for got, want in zip(_plain_state(model), _plain_state(plain), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    model.save(str(tmp_path / "again.keras"))
    config = json.loads(zipfile.ZipFile(tmp_path / "again.keras").read("config.json"))
    assert config["compile_config"]["optimizer"]["class_name"] == "Adam"


def test_load_model_refuses_a_file_without_an_optimizer(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.save(str(tmp_path / "uncompiled.keras"))
    with pytest.raises(ValueError, match=r"uncompiled\.keras'?, which holds no optimizer .*kfast\.DistributedOptimizer"):
        checkpoint.load_model(str(tmp_path / "uncompiled.keras"))


def test_a_checkpoint_holds_the_loaders_own_state_and_restore_hands_it_back_old_format_too(tmp_path):
    # One state format (issue 46): the checkpoint's data position is FastLoader.state_dict()'s versioned form,
    # which restore() hands to load_state_dict(); a file written before it ("order", an EpochOrder) still reads.
    from kfast.data.position import order_of

    x, y = _data()  # 32 rows: 8 batches of 4
    keras.utils.set_random_seed(0)
    model = _compiled(_mnist_like())
    dataset = kfast.data.ArrayDataset(x, y, batch_size=4)
    with kfast.data.FastLoader(dataset, training=True, seed=11, workers=1, use_multiprocessing=False) as loader:
        epoch = [b[1].tolist() for b in loader]  # epoch 0's order, as fit reads it next (a new loader: same seed)
    with kfast.data.FastLoader(dataset, training=True, seed=11, workers=1, use_multiprocessing=False) as loader:
        model.fit(loader, epochs=1, verbose=0, callbacks=[kfast.callbacks.RankZeroCheckpoint(
            str(tmp_path), monitor=None, save_freq=3, preemption_signals=None, loader=loader)])
    for name in os.listdir(tmp_path):  # keep the checkpoint 3 batches into the epoch
        if name != "epoch-0001-batch-0003.keras" and name.endswith(".keras"):
            os.remove(tmp_path / name)
    path = tmp_path / "epoch-0001-batch-0003.keras"
    with zipfile.ZipFile(path) as z:
        state = json.loads(z.read("kfast-state.json"))
    saved = state["data"]["loader"]
    assert saved["version"] == 1 and saved["batches_done"] == 3 and saved["seeds"] == [11]

    def rest():
        fresh = _compiled(_mnist_like())
        with kfast.data.FastLoader(dataset, training=True, seed=99, workers=1, use_multiprocessing=False) as again:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the recorded seed replaces the given one, with a warning
                checkpoint.restore(fresh, str(tmp_path), loader=again)
            return [b[1].tolist() for b in again]

    assert rest() == epoch[3:]
    old = dict(state, data={"order": order_of(saved, 0, 1).as_dict(), "metrics": state["data"]["metrics"]})
    rewrite_state(path, old)
    assert rest() == epoch[3:]


def test_a_packed_datasets_seed_is_saved_with_the_loader_and_restore_resumes_its_permutation(tmp_path):
    # Issue 48: the global permutation is the dataset's (its seed); a checkpoint mid-epoch holds it beside the
    # loader's position, and restore() puts it back into a PackedDataset made with another seed.
    x, y = _data()
    packed = kfast.data.pack((x, y.astype("int64")), str(tmp_path / "pack"), shard_size=10, verbose=0)

    def loader_over(seed):
        data = kfast.data.PackedDataset(packed, batch_size=4, seed=seed)
        return kfast.data.FastLoader(data, training=True, seed=11, workers=1, use_multiprocessing=False)

    with loader_over(7) as loader:
        epoch = [b[1].tolist() for b in loader]
    keras.utils.set_random_seed(0)
    with loader_over(7) as loader:
        _compiled(_mnist_like()).fit(loader, epochs=1, verbose=0, callbacks=[kfast.callbacks.RankZeroCheckpoint(
            str(tmp_path / "ckpt"), monitor=None, save_freq=3, preemption_signals=None, loader=loader)])
    path = tmp_path / "ckpt" / "epoch-0001-batch-0003.keras"
    with zipfile.ZipFile(path) as z:
        saved = json.loads(z.read("kfast-state.json"))["data"]["loader"]
    assert saved["dataset"] == {"seed": 7} and saved["batches_done"] == 3
    for name in os.listdir(tmp_path / "ckpt"):
        if name != path.name and name.endswith(".keras"):
            os.remove(tmp_path / "ckpt" / name)
    with loader_over(99) as again:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the recorded loader seed replaces the given one, with a warning
            checkpoint.restore(_compiled(_mnist_like()), str(tmp_path / "ckpt"), loader=again)
        assert again.dataset.seed == 7
        assert [b[1].tolist() for b in again] == epoch[3:]
