"""What every recipe shares: command-line options, the distributed setup, and the training run."""

from __future__ import annotations

import argparse
import importlib.util
import os
from typing import Any

import keras
import numpy as np

from kfast import distributed
from kfast._core import topology
from kfast._core.cpus import usable_cpus


class Recipe:
    """What `model.fit` needs, as a recipe builds it.

    Attributes:
        model: the compiled model.
        train: the training data (a FastLoader, sharded per rank).
        val: validation data or `None`.
        callbacks: the callbacks, in order.
        fit_kwargs: `epochs`, `initial_epoch`, `verbose` and anything else for `fit`.
        datasets: `(train, val)` before they were wrapped in loaders, for an elastic job. Defaults to `None`.
        commit_every: steps between commits of an elastic job; `None` trains with plain `fit`.
    """

    def __init__(self, model, train, val, callbacks, fit_kwargs, datasets=None, commit_every=None):
        self.model, self.train, self.val, self.callbacks, self.fit_kwargs = model, train, val, callbacks, fit_kwargs
        self.datasets, self.commit_every = datasets, commit_every

    def fit(self):
        if self.commit_every is None:
            return self.model.fit(self.train, validation_data=self.val, callbacks=self.callbacks, **self.fit_kwargs)
        # Elastic: each epoch's loaders are built for the ranks of the moment, with the settings tuned here.
        return distributed.elastic_fit(self.model, self.datasets[0], validation_data=self.datasets[1],
                                       callbacks=self.callbacks, commit_every=self.commit_every,
                                       **self.fit_kwargs, **self.train.settings)

    def close(self):
        for loader in (self.train, self.val):
            if hasattr(loader, "close"):
                loader.close()


def add_common_arguments(parser, *, epochs, batch_size, lr):
    parser.add_argument("--data", metavar="PATH", help="data on disk (see the recipe); synthetic data if omitted")
    parser.add_argument("--make-sample", metavar="DIR", help="write a small sample dataset to DIR and exit")
    parser.add_argument("--epochs", type=int, default=epochs, help=f"epochs (default {epochs})")
    parser.add_argument("--batch-size", type=int, default=batch_size, help=f"batch per rank (default {batch_size})")
    parser.add_argument("--lr", type=float, default=lr,
                        help=f"single-process learning rate, scaled by the number of ranks (default {lr})")
    parser.add_argument("--warmup-epochs", type=float, default=1, help="learning-rate warm-up epochs (default 1)")
    parser.add_argument("--checkpoint-dir", default="checkpoints", help="where rank 0 writes checkpoints")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint (inside its epoch, for a step checkpoint)")
    parser.add_argument("--save-freq", type=int, default=None, metavar="STEPS",
                        help="also checkpoint every STEPS batches (default: at epoch ends only)")
    parser.add_argument("--preemption-signal", action="append", default=None, metavar="SIG",
                        help="a signal that stops training with a step checkpoint and exit status 75 (repeat for "
                             "several; default SIGTERM; e.g. SIGUSR1 for Slurm's --signal=B:USR1@120)")
    parser.add_argument("--workers", type=int, default=None, help="loader workers (default: tuned)")
    parser.add_argument("--diagnose", metavar="PNG", help="diagnose the pipeline first and write the plot to PNG")
    parser.add_argument("--tensorboard", metavar="DIR",
                        help="where rank 0 writes TensorBoard logs (default: 'tensorboard' beside --checkpoint-dir; "
                             "'none' writes none)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--elastic", action="store_true",
                        help="train on as the job's ranks leave and join (launch with kfast launch --elastic)")
    parser.add_argument("--commit-every", type=int, default=20, metavar="STEPS",
                        help="with --elastic: steps between in-memory commits (default 20)")


def check_positive(parser, args):
    for name in ("epochs", "batch_size", "commit_every", "save_freq"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.lr <= 0:
        parser.error(f"--lr must be > 0, got {args.lr}")
    if args.data and not os.path.exists(args.data) and not args.data.startswith("s3://"):
        parser.error(f"--data {args.data!r} does not exist; pass a dataset path, or omit --data for synthetic data")
    if args.tensorboard and args.tensorboard.lower() != "none" and not _have_tensorboard():
        parser.error(f"--tensorboard {args.tensorboard!r} needs the tensorboard package: pip install "
                     "'kfast[cpu]' (or [gpu]), or pass --tensorboard none")


def _have_tensorboard():
    return importlib.util.find_spec("tensorboard") is not None


def tensorboard_dir(args):
    """Where rank 0 writes TensorBoard logs: `--tensorboard`, else `tensorboard` beside the checkpoint
    directory (`checkpoints` -> `tensorboard`, `out/run/checkpoints` -> `out/run/tensorboard`); `None` for
    `--tensorboard none`, or when the package is missing and the directory was not asked for."""
    if args.tensorboard:
        return None if args.tensorboard.lower() == "none" else args.tensorboard
    if not _have_tensorboard():
        return None
    return os.path.join(os.path.dirname(os.path.normpath(args.checkpoint_dir)), "tensorboard")


def split_rows(n: int, args: argparse.Namespace, *, fraction: float = 1 / 8,
               ranks: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled `(train_rows, val_rows)` of `n` samples, the same on every rank (seeded by `--seed`).

    `fraction` of the samples validate, but at least one batch per rank, so that every rank has a
    validation batch; training needs one batch per rank too, and too few samples for both is an error
    that says how many are needed.
    """
    ranks = ranks or distributed.size()
    per_step = args.batch_size * ranks
    n_val = max(per_step, int(n * fraction))
    if n - n_val < per_step:
        raise ValueError(f"{n} samples are too few to split into training and validation with --batch-size "
                         f"{args.batch_size} on {ranks} rank(s): each part needs at least {per_step} (a batch per "
                         f"rank). Add data, or pass a smaller --batch-size.")
    if topology.one_step_for_all():
        # JAX's processes evaluate each step together: every process needs the same number of full batches.
        n_val -= n_val % per_step
    order = np.random.default_rng(args.seed).permutation(n)
    return order[n_val:], order[:n_val]


def array_datasets(x: np.ndarray, y: np.ndarray, train_rows: np.ndarray, val_rows: np.ndarray,
                   args: argparse.Namespace) -> tuple[Any, Any]:
    """Training (shuffled per epoch) and validation `ArrayDataset`s over the rows `split_rows` chose."""
    from kfast.data import ArrayDataset

    train = ArrayDataset(x[train_rows], y[train_rows], batch_size=args.batch_size, shuffle=True, seed=args.seed)
    return train, ArrayDataset(x[val_rows], y[val_rows], batch_size=args.batch_size)


def loader_for(dataset, args, *, training=True, like=None):
    """A FastLoader over `dataset` (training data: shuffled, sharded per rank; else read whole on every rank), with
    `--workers`, the settings of loader `like`, or settings tuned on this host."""
    from kfast.data import FastLoader

    if like is not None:
        return FastLoader(dataset, training=training, seed=args.seed, **like.settings)
    if args.workers:
        return FastLoader(dataset, training=training, workers=args.workers, seed=args.seed)
    settings = None
    if distributed.local_rank() == 0:
        from kfast.tuning import tune

        cores = max(1, usable_cpus() // distributed.local_size())
        settings = tune(dataset, budget_s=8, max_workers=max(1, cores)).settings
    # Ranks tune once per job and share the answer: tuning on every rank at once would measure contention.
    settings = distributed.broadcast_object(settings, root_rank=0)
    return FastLoader(dataset, training=training, seed=args.seed, **settings)


def assemble(model, train, val, args, monitor="val_loss"):
    """Compiles a classifier (integer labels, logits out) for either engine and wraps its data in FastLoaders."""
    from kfast.distributed.optimizer import DistributedOptimizer

    optimizer = DistributedOptimizer(keras.optimizers.Adam(args.lr))
    # Horovod's collectives cannot run inside XLA; on JAX the whole step is XLA's.
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  jit_compile=False if keras.backend.backend() == "tensorflow" else "auto")
    train_loader = loader_for(train, args)
    val_loader = loader_for(val, args, training=False, like=train_loader)
    # An elastic job builds its loaders anew at each change: its monitor counts from the batch size instead.
    recipe = finish(model, train_loader, val_loader, args, monitor, counted=None if args.elastic else train_loader)
    if args.elastic:
        recipe.datasets, recipe.commit_every = (train, val), args.commit_every
    return recipe


def standard_callbacks(args, loader, monitor):
    from kfast._core.callback_order import ordered
    from kfast.callbacks.gpu_monitor import GPUMonitor
    from kfast.callbacks.throughput_monitor import ThroughputMonitor

    signals = tuple(args.preemption_signal or ("SIGTERM",))
    callbacks = distributed.default_callbacks(args.checkpoint_dir, warmup_epochs=args.warmup_epochs, monitor=monitor,
                                              save_freq=args.save_freq or "epoch", preemption_signals=signals,
                                              loader=loader) + [
        ThroughputMonitor(loader) if loader is not None else ThroughputMonitor(batch_size=args.batch_size), GPUMonitor()]
    log_dir = tensorboard_dir(args)
    if log_dir and distributed.is_chief():
        callbacks.append(keras.callbacks.TensorBoard(log_dir))
    return ordered(callbacks)  # the monitors ahead of MetricAverage and TensorBoard, which read their values


def finish(model, train, val, args, monitor="val_loss", *, counted):
    """The Recipe around compiled `model`; `counted` is the loader ThroughputMonitor counts samples from."""
    initial_epoch = distributed.restore(model, args.checkpoint_dir, loader=counted) if args.resume else 0
    return Recipe(model, train, val, standard_callbacks(args, counted, monitor),
                  {"epochs": args.epochs, "initial_epoch": initial_epoch, "verbose": 2 if distributed.is_chief() else 0})


def parser_for(name, module):
    parser = argparse.ArgumentParser(prog=f"kfast train {name}", description=module.SUMMARY)
    module.add_arguments(parser)
    return parser


def run(name, argv=None):
    """Runs recipe `name` with command-line arguments `argv`; works alone or under horovodrun.

    Returns:
        The Keras `History` (None when only a sample dataset was written).
    """
    from kfast.recipes import _registry as recipes

    module = recipes.get(name)
    parser = parser_for(name, module)
    args = parser.parse_args(argv)
    check_positive(parser, args)
    if args.make_sample:
        path = module.write_sample(args.make_sample, seed=args.seed)
        print(f"wrote a sample dataset to {path}; train on it with: kfast train {name} --data {path}")
        return None
    distributed.init()
    # Horovod's ranks draw apart (rank 0's weights are broadcast); JAX's processes make one model, whose every
    # value JAX checks is the same on each, so they draw alike.
    keras.utils.set_random_seed(args.seed + (0 if topology.one_step_for_all() else distributed.rank()))
    recipe = module.build(args)
    try:
        if distributed.is_chief():
            source = args.data or "synthetic data"
            print(f"kfast recipe {name}: {distributed.size()} rank(s), {source}, {len(recipe.train)} batches of "
                  f"{args.batch_size} per rank, loader {recipe.train.settings}", flush=True)
            log_dir = tensorboard_dir(args)
            if log_dir:
                print(f"TensorBoard logs in {log_dir}; view them with: tensorboard --logdir {log_dir}", flush=True)
            elif not args.tensorboard:
                print("no TensorBoard logs: the tensorboard package is not installed (pip install 'kfast[cpu]')",
                      flush=True)
        if args.diagnose:
            _diagnose(recipe, args.diagnose)
        return recipe.fit()
    finally:
        recipe.close()


def _diagnose(recipe, png):
    from kfast.diagnosis import diagnose

    # Every rank runs it: its training phases issue the same allreduces on all ranks. Enough steps for a
    # picture worth reading; data with fewer batches is read for several epochs.
    result = diagnose(recipe.model, recipe.train, steps=30, warmup=3)
    if distributed.is_chief():
        print(result, flush=True)
        result.plot(png)
        print(f"diagnosis plot written to {png}", flush=True)
