"""Run under horovodrun by tests/distributed/test_training.py: python train_script.py MODE OUTDIR.

Each rank writes OUTDIR/rank<r>.json with what the test compares. Data and initial weights are known
functions of the rank, so every expected value is exact."""

import json
import os
import shutil
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for helpers

import keras
import numpy as np

import kfast
import kfast.callbacks
from helpers import RecordRates
from kfast import distributed

B = 8  # per-rank batch


def global_data(n_batches, batch):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n_batches * batch, 4)).astype("float32")
    return x, (x @ rng.normal(size=(4, 1))).astype("float32")


def make_model(seed, optimizer):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer, "mse", jit_compile=False)
    return model


def rank_data(x, y, per_rank):
    """This rank's rows: global batch j is rank 0's batch j followed by rank 1's batch j, and so on."""
    r, n = distributed.rank(), distributed.size()
    rows = np.arange(len(x)).reshape(-1, n, per_rank)[:, r].reshape(-1)
    return x[rows], y[rows]


def state(model):
    """Weights and the (wrapped) optimizer's variables, as lists."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    return [v.numpy().tolist() for v in model.weights] + [np.asarray(v.numpy()).tolist() for v in optimizer.variables]


def sync(out, wrap):
    x, y = global_data(6, 2 * B)
    xr, yr = x[distributed.rank()::2], y[distributed.rank()::2]  # different data per rank
    opt = keras.optimizers.Adam(0.01)
    model = make_model(seed=distributed.rank(), optimizer=kfast.DistributedOptimizer(opt) if wrap else opt)
    model.fit(xr, yr, batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=[kfast.callbacks.BroadcastState()])
    return {"state": state(model)}


def equivalence(out, steps_per_execution=1, passes=1, compression=None):
    x, y = global_data(8, 2 * B)
    model = make_model(seed=distributed.rank(), optimizer=kfast.DistributedOptimizer(
        keras.optimizers.SGD(0.05), backward_passes_per_step=passes, compression=compression))
    model.compile(model.optimizer, "mse", jit_compile=False, steps_per_execution=steps_per_execution)
    xr, yr = rank_data(x, y, B)
    model.fit(xr, yr, batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=[kfast.callbacks.BroadcastState()])
    result = {"weights": [w.tolist() for w in model.get_weights()]}
    if distributed.is_chief():
        # One process, batch 2B x passes, plain SGD, no collectives: the single-rank reference.
        ref = make_model(seed=0, optimizer=keras.optimizers.SGD(0.05))
        ref.fit(x, y, batch_size=2 * B * passes, epochs=2, shuffle=False, verbose=0)
        result["reference"] = [w.tolist() for w in ref.get_weights()]
    return result


def uneven(out):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import datasets

    loader = kfast.data.FastLoader(datasets.Regression(n=7, batch_size=B), training=True, workers=1, use_multiprocessing=False)
    model = make_model(seed=0, optimizer=kfast.DistributedOptimizer(keras.optimizers.SGD(0.01)))
    steps = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps.append(batch)

    model.fit(loader, epochs=2, verbose=0, callbacks=[kfast.callbacks.BroadcastState(), Count()])
    logs = {"loss": float(distributed.rank()), "val_acc": 10.0 * distributed.rank(), "name": "text"}
    kfast.callbacks.MetricAverage().on_epoch_end(0, logs)
    return {"steps": len(steps), "loader_len": len(loader), "averaged": logs}


def checkpointed(out, epochs, die_after=None, resume=False):
    x, y = global_data(4, 2 * B)
    model = make_model(seed=distributed.rank(), optimizer=kfast.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    ckpt = os.path.join(out, "ckpt")
    initial_epoch = distributed.restore(model, ckpt) if resume else 0

    class Die(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if die_after is not None and epoch + 1 == die_after and distributed.rank() == 1:
                os._exit(17)  # rank 1 dies hard; rank 0 must not hang in the next collective

    xr, yr = rank_data(x, y, B)
    model.fit(xr, yr, batch_size=B, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0,
              callbacks=distributed.default_callbacks(ckpt, warmup_epochs=0, monitor="loss") + [Die()])
    return {"initial_epoch": initial_epoch, "state": state(model), "files": sorted(os.listdir(ckpt))}


def plain_resume(out):
    """Plain Keras Adam for 2 epochs in one process (rank 0, keras.callbacks.ModelCheckpoint), then restore() into
    DistributedOptimizer(Adam) and 1 epoch more on 2 ranks; rank 0 also goes on alone, as the reference, and saves
    the continued model with model.save (test_training loads it without kfast)."""
    x, y = global_data(4, 2 * B)
    ckpt = os.path.join(out, "plain-ckpt")
    result = {}
    if distributed.is_chief():
        os.makedirs(ckpt)
        plain = make_model(seed=0, optimizer=keras.optimizers.Adam(0.01))
        plain.fit(x, y, batch_size=2 * B, epochs=2, shuffle=False, verbose=0,
                  callbacks=[keras.callbacks.ModelCheckpoint(os.path.join(ckpt, "epoch-{epoch:04d}.keras"))])
        result["saved"] = state(plain)
        plain.fit(x, y, batch_size=2 * B, epochs=3, initial_epoch=2, shuffle=False, verbose=0)
        result["reference"] = [w.tolist() for w in plain.get_weights()]
    model = make_model(seed=distributed.rank(), optimizer=kfast.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        initial_epoch = distributed.restore(model, ckpt)  # rank 1 waits here for rank 0's plain run
    result.update(initial_epoch=initial_epoch, warnings=[str(w.message) for w in caught], restored=state(model))
    xr, yr = rank_data(x, y, B)
    model.fit(xr, yr, batch_size=B, epochs=3, initial_epoch=initial_epoch, shuffle=False, verbose=0,
              callbacks=[kfast.callbacks.BroadcastState()])
    result.update(weights=[w.tolist() for w in model.get_weights()], state=state(model))
    if distributed.is_chief():
        model.save(os.path.join(out, "plain-resumed.keras"))  # the user's own last line
    return result


WARMUP_EPOCHS, STEPS = 5, 3


def warmup_fit(ckpt, epochs, resume=False):
    """README's flow: SGD(0.05), restore(), callbacks(ckpt) with 5 warm-up epochs. Returns (initial_epoch, rates)."""
    x, y = global_data(STEPS, 2 * B)
    model = make_model(seed=distributed.rank(), optimizer=kfast.DistributedOptimizer(keras.optimizers.SGD(0.05)))
    initial_epoch = distributed.restore(model, ckpt) if resume else 0
    record = RecordRates()
    xr, yr = (x, y) if distributed.size() == 1 else rank_data(x, y, B)
    model.fit(xr, yr, batch_size=len(xr) // STEPS, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
              verbose=0, callbacks=distributed.default_callbacks(ckpt, warmup_epochs=WARMUP_EPOCHS, monitor="loss") + [record])
    return initial_epoch, record.rates, state(model)


def warmup_resume(out):
    """Uninterrupted 6 epochs, then for every stop in 1..5: stop there and resume with a fresh model."""
    total = WARMUP_EPOCHS + 1
    _, uninterrupted, final = warmup_fit(os.path.join(out, "ckpt-full"), total)
    resumed = {}
    for stop in range(1, total):
        ckpt = os.path.join(out, f"ckpt-{stop}")
        _, first, _ = warmup_fit(ckpt, stop)
        if stop == 2 and distributed.is_chief():
            shutil.copytree(ckpt, ckpt + "-stopped")  # for resume_one_rank
        initial_epoch, rest, end = warmup_fit(ckpt, total, resume=True)
        resumed[stop] = {"initial_epoch": initial_epoch, "rates": first + rest, "state": end}
    return {"uninterrupted": uninterrupted, "final": final, "resumed": resumed}


def resume_one_rank(out):
    """Resumes the 2-rank run stopped after 2 epochs on this single process."""
    initial_epoch, rates, _ = warmup_fit(os.path.join(out, "ckpt-2-stopped"), WARMUP_EPOCHS + 1, resume=True)
    return {"initial_epoch": initial_epoch, "rates": rates}


def main():
    mode, out = sys.argv[1], sys.argv[2]
    distributed.init()
    modes = {
        "sync": lambda: sync(out, wrap=True),
        "nosync": lambda: sync(out, wrap=False),
        "equiv": lambda: equivalence(out),
        "equiv_spe": lambda: equivalence(out, steps_per_execution=2),
        "equiv_accum": lambda: equivalence(out, passes=2),
        "equiv_fp16": lambda: equivalence(out, compression="fp16"),
        "warmup_resume": lambda: warmup_resume(out),
        "resume_one_rank": lambda: resume_one_rank(out),
        "uneven": lambda: uneven(out),
        "plain_resume": lambda: plain_resume(out),
        "full": lambda: checkpointed(out, epochs=4),
        "killed": lambda: checkpointed(out, epochs=4, die_after=2),
        "resumed": lambda: checkpointed(out, epochs=4, resume=True),
    }
    result = modes[mode]()
    with open(os.path.join(out, f"{mode}-rank{distributed.rank()}.json"), "w") as f:
        json.dump(result, f)
    print(f"rank {distributed.rank()} done {mode}", flush=True)


if __name__ == "__main__":
    main()
