"""Single-process behaviour of the distributed pieces: schedules, checkpoints, sharding, errors."""

import os

import keras
import numpy as np
import pytest

import kfast
import kfast.callbacks
from kfast.distributed import checkpoint
from kfast.data import shard

pytestmark = pytest.mark.single_process  # no horovodrun here: these stay in the fast tier (make check)


def test_warmup_follows_the_linear_scaling_rule_per_batch():
    cb = kfast.callbacks.LearningRateWarmup(initial_lr=0.1, warmup_epochs=2, multiplier=4, steps_per_epoch=5)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    cb.set_model(model)
    cb.on_train_begin()
    rates = []
    for epoch in range(3):
        cb.on_epoch_begin(epoch)
        for batch in range(5):
            cb.on_train_batch_begin(batch)
            rates.append(float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)))
    expected = [0.1 * (1 + 3 * min(1.0, (e + (b + 1) / 5) / 2)) for e in range(3) for b in range(5)]
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    assert rates[0] == pytest.approx(0.13) and rates[9] == pytest.approx(0.4) and rates[-1] == pytest.approx(0.4)


def test_rank_zero_checkpoint_keeps_the_last_n_and_the_best(tmp_path):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    cb = kfast.callbacks.RankZeroCheckpoint(str(tmp_path), monitor="val_loss", keep=2)
    cb.set_model(model)
    cb.on_train_begin()
    for epoch, val in enumerate([3.0, 1.0, 2.0, 1.5]):
        model.set_weights([np.full((1, 1), epoch, "float32"), np.zeros(1, "float32")])
        cb.on_epoch_end(epoch, {"val_loss": val})
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "epoch-0003.keras", "epoch-0004.keras"]
    best = keras.saving.load_model(tmp_path / "best.keras")
    assert best.get_weights()[0][0, 0] == 1.0  # epoch index 1 had the lowest val_loss


def test_restore_without_checkpoint_starts_at_epoch_zero(tmp_path):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    assert kfast.distributed.restore(model, str(tmp_path / "none")) == 0
    checkpoint.save_atomic(model, checkpoint.epoch_path(str(tmp_path), 7))
    assert kfast.distributed.restore(model, str(tmp_path)) == 7
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


def test_shard_gives_every_rank_the_same_count():
    data = list(range(7))
    drop = [[shard(data, r, 2)[i] for i in range(len(shard(data, r, 2)))] for r in range(2)]
    assert drop == [[0, 2, 4], [1, 3, 5]]
    pad = [[shard(data, r, 2, mode="pad")[i] for i in range(4)] for r in range(2)]
    assert pad == [[0, 2, 4, 6], [1, 3, 5, 0]]


@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 0, "size": 0}, "size=0; it must be a positive int"),
    ({"rank": 2, "size": 2}, r"rank=2 with size=2; rank must be in \[0, 2\)"),
    ({"rank": 0, "size": 2, "mode": "wrap"}, r"mode='wrap'; use 'drop', 'pad' \(equal steps for fit\) or 'all'"),
    ({"rank": 0, "size": 9}, "has 7 batches for 9 ranks"),
])
def test_shard_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        shard(list(range(7)), **kwargs)


def test_distributed_optimizer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="compression='int8'; use None or 'fp16'"):
        kfast.DistributedOptimizer(keras.optimizers.SGD(), compression="int8")
    with pytest.raises(ValueError, match="backward_passes_per_step=0"):
        kfast.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)


def test_single_process_fit_with_the_standard_callbacks(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.1), compression="fp16"), "mse")
    history = model.fit(x, x.sum(1), epochs=3, verbose=0, validation_split=0.25,
                        callbacks=kfast.distributed.default_callbacks(str(tmp_path), warmup_epochs=1))
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "epoch-0001.keras", "epoch-0002.keras", "epoch-0003.keras"]


def test_old_callbacks_name_still_works_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=r"kfast.distributed.callbacks\(\) is now kfast.distributed.default_callbacks\(\)"):
        old = kfast.distributed.callbacks("ckpt", warmup_epochs=0)
    assert [type(c).__name__ for c in old] == [type(c).__name__ for c in kfast.distributed.default_callbacks("ckpt")]


def test_a_script_written_for_the_earlier_names_still_trains(tmp_path):
    # kfast.distributed.DistributedOptimizer was the first release's name (Horovod's idiom, hvd.DistributedOptimizer).
    assert kfast.distributed.DistributedOptimizer is kfast.DistributedOptimizer
    x = np.random.default_rng(1).normal(size=(64, 3)).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(kfast.distributed.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    with pytest.warns(DeprecationWarning, match="default_callbacks"):
        callbacks = kfast.distributed.callbacks(str(tmp_path), warmup_epochs=1, monitor="loss")
    history = model.fit(x, x.sum(1), epochs=2, verbose=0, callbacks=callbacks)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "epoch-0001.keras", "epoch-0002.keras"]


def test_from_config_leaves_the_callers_config_as_it_was():
    opt = kfast.DistributedOptimizer(keras.optimizers.SGD(0.1), compression="fp16", backward_passes_per_step=2)
    config = opt.get_config()
    copy = dict(config)
    again = kfast.DistributedOptimizer.from_config(config)
    assert config == copy and again.get_config() == config  # Horovod's own test: cfg == from_config(cfg).get_config()
    assert kfast.DistributedOptimizer.from_config(config).get_config() == config  # a second call works too


def test_fp16_compression_sends_every_floating_type_as_float16():
    opt = kfast.DistributedOptimizer(keras.optimizers.SGD(0.1), compression="fp16")
    grads = [np.full((3,), 1 / 3, "float64"), np.full((2,), 1 / 3, "float32"), np.arange(2, dtype="int32")]
    out = [keras.ops.convert_to_numpy(g) for g in opt._exchange(grads)]
    assert [g.dtype.name for g in out] == ["float64", "float32", "int32"]  # cast back after the exchange
    assert out[0][0] == np.float64(np.float16(1 / 3)) != 1 / 3  # it went as float16
    assert out[1][0] == np.float32(np.float16(1 / 3))
    assert out[2].tolist() == [0, 1]


def test_shard_all_deals_every_batch_once_and_tf_data_shards_alike():
    import tensorflow as tf

    assert [[shard(list(range(7)), r, 3, "all")[i] for i in range(len(shard(list(range(7)), r, 3, "all")))]
            for r in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]
    batches = tf.data.Dataset.range(7)
    for mode in ("drop", "pad", "all"):
        tf_shards = [[int(b) for b in shard(batches, r, 3, mode)] for r in range(3)]
        py_shards = [[x for x in (shard(list(range(7)), r, 3, mode)[i] for i in range(len(shard(list(range(7)), r, 3, mode))))]
                     for r in range(3)]
        assert tf_shards == py_shards, mode
        assert [int(shard(batches, r, 3, mode).cardinality()) for r in range(3)] == [len(s) for s in py_shards]


def test_shard_of_a_tf_dataset_with_no_known_length_says_how_to_give_one():
    import tensorflow as tf

    with pytest.raises(ValueError, match="cannot tell.*assert_cardinality"):
        shard(tf.data.Dataset.range(7).filter(lambda x: x > 0), 0, 2)
    with pytest.raises(ValueError, match="infinite"):
        shard(tf.data.Dataset.range(7).repeat(), 0, 2)
