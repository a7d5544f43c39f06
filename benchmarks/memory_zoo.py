"""Will it fit on the GPU you rent? kfast's analytical memory estimate against XLA's device-less compile of the
training step for an H100 and an A100-40GB, over a zoo of real models (issue 47).

    KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-jax/bin/python benchmarks/memory_zoo.py
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-jax/bin/python benchmarks/memory_zoo.py --models mobilenet_v2,bilstm

Every model is built with `weights=None` and compiled with Keras's own `compile`; nothing trains and no batch is
allocated. For each (model, batch) four numbers, in bytes per device:
- `H100`, `A100-40GB`: `kfast.planning.compiled_step_memory(model, batch, device=...)`, Keras's JAX train step
  compiled by XLA for that GPU without one (JAX's CUDA plugin; `JAX_PLATFORMS=cpu` lets it register here):
  arguments + working memory + outputs not written over the donated state.
- `CPU compile`: the same step compiled for this machine's CPU (`device=None`).
- `kfast analytical`: `kfast.planning.estimate_memory(model, batch, device="H100", method="analytical").peak`,
  kfast's own estimate for an H100, read from the layers without compiling.

The compiles take minutes (tens of minutes for the whole zoo on 2 cores) and do not change when kfast's
estimate does, so each result is kept in a JSON file (`--cache`, keyed by model, batch and target) and a re-run
recompiles nothing: only the analytical column is recomputed. A compile that failed is cached with its error;
`--retry-failed` tries it again. `--budget` bounds the run: past it, what is not cached is skipped.

The GPT-2 models need keras-hub, installed without its dependencies (it would pull TensorFlow) plus the two
packages its tokenizers import:

    .venv-jax/bin/pip install --no-deps keras-hub==0.32.0 && .venv-jax/bin/pip install regex tokenizers

Without it those two models are reported as skipped.
"""

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any
from typing import Callable

import keras
import numpy as np

from kfast.planning import compiled_step_memory
from kfast.planning import estimate_memory

CACHE_VERSION = 1
TARGETS = ("H100", "A100-40GB", "cpu")
SPARSE = dict(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


@dataclass(frozen=True)
class Case:
    """One zoo model: how to build it (compiled), one batch of `n` rows for it, and the batch sizes to plan."""

    name: str
    build: Callable[[], keras.Model]
    batch: Callable[[int], Any]
    batches: tuple[int, int]
    policy: str = "float32"


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _images(size: int, classes: int) -> Callable[[int], Any]:
    def batch(n: int) -> Any:
        rng = _rng()
        return rng.standard_normal((n, size, size, 3)).astype("float32"), rng.integers(0, classes, n).astype("int32")
    return batch


def _tokens(seq: int, vocab: int, classes: int) -> Callable[[int], Any]:
    def batch(n: int) -> Any:
        rng = _rng()
        return rng.integers(0, vocab, (n, seq)).astype("int32"), rng.integers(0, classes, n).astype("int32")
    return batch


def _application(build: Callable[..., keras.Model], optimizer: Any) -> keras.Model:
    """A keras.applications model at 224x224 with 1000 classes, untrained, returning logits."""
    model = build(weights=None, input_shape=(224, 224, 3), classes=1000, classifier_activation=None)
    model.compile(optimizer, **SPARSE)
    return model


def resnet50() -> keras.Model:
    return _application(keras.applications.ResNet50, keras.optimizers.Adam())


def mobilenet_v2() -> keras.Model:
    return _application(keras.applications.MobileNetV2, keras.optimizers.SGD(0.01, momentum=0.9))


def efficientnet_b0() -> keras.Model:
    return _application(keras.applications.EfficientNetB0, keras.optimizers.Adam())


def densenet121() -> keras.Model:
    return _application(keras.applications.DenseNet121, keras.optimizers.Adam())


def resnet50_frozen() -> keras.Model:
    """Transfer learning: a frozen ResNet50 base (batch normalisation in inference mode) under a new head."""
    base = keras.applications.ResNet50(weights=None, include_top=False, input_shape=(224, 224, 3), pooling="avg")
    base.trainable = False
    inputs = keras.Input((224, 224, 3))
    model = keras.Model(inputs, keras.layers.Dense(10)(base(inputs, training=False)))
    model.compile(keras.optimizers.Adam(), **SPARSE)
    return model


def _gpt2(lora: bool) -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=50257, num_layers=4, num_heads=8, hidden_dim=512,
                                             intermediate_dim=2048, max_sequence_length=512, dropout=0.1)
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    if lora:
        model.backbone.enable_lora(rank=8)  # as keras-hub's guides do it: before compile
    model.compile(optimizer=keras.optimizers.AdamW(), **SPARSE)
    return model


def gpt2_batch(n: int) -> Any:
    rng = _rng()
    tokens = rng.integers(0, 50257, (n, 512)).astype("int32")
    return ({"token_ids": tokens, "padding_mask": np.ones((n, 512), "int32")},
            rng.integers(0, 50257, (n, 512)).astype("int32"))


def bilstm() -> keras.Model:
    model = keras.Sequential([
        keras.Input((200,), dtype="int32"), keras.layers.Embedding(20000, 128),
        keras.layers.Bidirectional(keras.layers.LSTM(128, return_sequences=True)),
        keras.layers.Bidirectional(keras.layers.LSTM(64)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.RMSprop(), **SPARSE)
    return model


def multi_input() -> keras.Model:
    """An image branch (three convolutions with pooling) and a tabular branch, joined; a class and a value out."""
    image = keras.Input((64, 64, 3), name="image")
    x = image
    for filters in (32, 64, 128):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    table = keras.Input((32,), name="table")
    t = keras.layers.Dense(64, activation="relu")(table)
    t = keras.layers.Dense(64, activation="relu")(t)
    joined = keras.layers.Dense(128, activation="relu")(keras.layers.Concatenate()([x, t]))
    label = keras.layers.Dense(5, name="label")(joined)
    value = keras.layers.Dense(1, name="value")(joined)
    model = keras.Model({"image": image, "table": table}, {"label": label, "value": value})
    model.compile(keras.optimizers.Adam(),
                  loss={"label": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "value": "mse"})
    return model


def multi_input_batch(n: int) -> Any:
    rng = _rng()
    x = {"image": rng.standard_normal((n, 64, 64, 3)).astype("float32"),
         "table": rng.standard_normal((n, 32)).astype("float32")}
    return x, {"label": rng.integers(0, 5, n).astype("int32"), "value": rng.standard_normal((n, 1)).astype("float32")}


def transformer() -> keras.Model:
    """A small text classifier from plain Keras layers: 2 post-norm blocks of attention and a gelu feed-forward."""
    tokens = keras.Input((256,), dtype="int32")
    x = keras.layers.Embedding(20000, 256)(tokens)
    for _ in range(2):
        attention = keras.layers.MultiHeadAttention(num_heads=4, key_dim=64)(x, x)
        x = keras.layers.LayerNormalization()(x + attention)
        ffn = keras.layers.Dense(256)(keras.layers.Dense(1024, activation="gelu")(x))
        x = keras.layers.LayerNormalization()(x + ffn)
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x))
    model = keras.Model(tokens, outputs)
    model.compile(keras.optimizers.Adam(), **SPARSE)
    return model


CASES = {c.name: c for c in [
    Case("resnet50", resnet50, _images(224, 1000), (8, 32)),
    Case("mobilenet_v2", mobilenet_v2, _images(224, 1000), (8, 32)),
    Case("efficientnet_b0_bf16", efficientnet_b0, _images(224, 1000), (16, 64), policy="mixed_bfloat16"),
    Case("densenet121", densenet121, _images(224, 1000), (8, 32)),
    Case("resnet50_frozen", resnet50_frozen, _images(224, 10), (8, 32)),
    Case("gpt2_lm", lambda: _gpt2(lora=False), gpt2_batch, (2, 8)),
    Case("gpt2_lm_lora8", lambda: _gpt2(lora=True), gpt2_batch, (2, 8)),
    Case("bilstm", bilstm, _tokens(200, 20000, 2), (32, 128)),
    Case("multi_input", multi_input, multi_input_batch, (32, 128)),
    Case("transformer", transformer, _tokens(256, 20000, 2), (16, 64)),
]}


def needs_keras_hub(name: str) -> bool:
    return name.startswith("gpt2")


def build(case: Case) -> keras.Model:
    """Builds `case`'s model in a fresh Keras state under its dtype policy (the global policy is put back)."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(case.policy)
    try:
        return case.build()
    finally:
        keras.config.set_dtype_policy("float32")


class Cache:
    """Compile results keyed by `model|batch|target`, written after each compile; versions checked on load."""

    def __init__(self, path: str):
        import jax

        self.path = path
        self.stamp = {"version": CACHE_VERSION, "jax": jax.__version__, "keras": keras.__version__}
        self.results: dict[str, dict[str, Any]] = {}
        if os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            if {k: saved.get(k) for k in self.stamp} == self.stamp:
                self.results = saved.get("results", {})
            else:
                print(f"{path} was written by {dict((k, saved.get(k)) for k in self.stamp)}, not {self.stamp}: "
                      "starting an empty cache", file=sys.stderr)

    @staticmethod
    def key(name: str, n: int, target: str) -> str:
        return f"{name}|{n}|{target}"

    def get(self, name: str, n: int, target: str) -> dict[str, Any] | None:
        return self.results.get(self.key(name, n, target))

    def put(self, name: str, n: int, target: str, result: dict[str, Any]) -> None:
        self.results[self.key(name, n, target)] = result
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({**self.stamp, "results": self.results}, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def compile_one(model: keras.Model, batch: Any, target: str) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        step = compiled_step_memory(model, batch, device=None if target == "cpu" else target)
    except Exception as e:  # noqa: BLE001 - a failed compile is a result of the zoo, reported with its reason
        message = str(e).strip().splitlines()
        return {"error": f"{type(e).__name__}: {message[0] if message else ''}"[:300],
                "seconds": round(time.perf_counter() - start, 1)}
    return {**step.to_dict(), "seconds": round(time.perf_counter() - start, 1)}


def analytical(model: keras.Model, batch: Any) -> int | str:
    try:
        return int(estimate_memory(model, batch, device="H100", method="analytical").peak)
    except Exception as e:  # noqa: BLE001 - shown in the table; the compiles stay useful
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]


def run(names: list[str], cache: Cache, budget_s: float, retry_failed: bool) -> list[dict[str, Any]]:
    """Every (model, batch) of `names`: the three compiles (from the cache where there) and kfast's estimate."""
    deadline = time.monotonic() + budget_s
    rows = []
    for name in names:
        case = CASES[name]
        for n in case.batches:
            row: dict[str, Any] = {"model": name, "batch": n}
            rows.append(row)
            if needs_keras_hub(name) and not _has_keras_hub():
                row["skipped"] = "keras_hub is not importable (see the module docstring for the install)"
                continue
            model = build(case)
            batch = case.batch(n)
            for target in TARGETS:
                result = cache.get(name, n, target)
                if result is None or ("error" in result and retry_failed):
                    if time.monotonic() > deadline:
                        row[target] = {"error": "skipped: past --budget"}
                        continue
                    print(f"compiling {name} batch {n} for {target} ...", file=sys.stderr, flush=True)
                    result = compile_one(model, batch, target)
                    cache.put(name, n, target, result)
                    done = f"{mb(result['total'])}" if "total" in result else result["error"]
                    print(f"  {name} batch {n} {target}: {done} in {result['seconds']:.1f} s", file=sys.stderr,
                          flush=True)
                row[target] = result
            keras.config.set_dtype_policy(case.policy)  # the estimate reads the model's own policy; keep it alike
            start = time.perf_counter()
            try:
                row["analytical"] = analytical(model, batch)
            finally:
                keras.config.set_dtype_policy("float32")
            print(f"  {name} batch {n} kfast analytical: {_cell(row['analytical'])} in "
                  f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
            del model
    keras.backend.clear_session()
    return rows


def _has_keras_hub() -> bool:
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        return False
    return True


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _cell(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, dict):
        return mb(result["total"]) if "total" in result else f"failed: {result['error']}"
    return mb(result) if isinstance(result, int) else f"failed: {result}"


def ratio(row: dict[str, Any]) -> float | None:
    h100, kfast = row.get("H100"), row.get("analytical")
    if isinstance(h100, dict) and "total" in h100 and isinstance(kfast, int):
        return kfast / h100["total"]
    return None


def report(rows: list[dict[str, Any]]) -> None:
    print("| model | batch | H100 | A100-40GB | CPU compile | kfast analytical | kfast / H100 |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if "skipped" in row:
            print(f"| {row['model']} | {row['batch']} | skipped: {row['skipped']} | | | | |")
            continue
        r = ratio(row)
        print(f"| {row['model']} | {row['batch']} | {_cell(row.get('H100'))} | {_cell(row.get('A100-40GB'))} | "
              f"{_cell(row.get('cpu'))} | {_cell(row.get('analytical'))} | {'' if r is None else f'{r:.2f}'} |")
    print()
    ratios = []
    for name in dict.fromkeys(row["model"] for row in rows):
        mine = [row for row in rows if row["model"] == name]
        parts = []
        for row in mine:
            r = ratio(row)
            h100, cpu = row.get("H100"), row.get("cpu")
            if r is not None:
                ratios.append((r, name, row["batch"]))
                parts.append(f"batch {row['batch']} kfast/H100 {r:.2f}")
            if isinstance(h100, dict) and isinstance(cpu, dict) and "total" in h100 and "total" in cpu:
                parts.append(f"CPU/H100 {cpu['total'] / h100['total']:.2f}")
        print(f"{name}: {', '.join(parts) if parts else 'no comparison (see the table)'}")
    if ratios:
        low, high = min(ratios), max(ratios)
        print(f"\nkfast analytical / XLA for H100 over {len(ratios)} cases: min {low[0]:.2f} ({low[1]} batch "
              f"{low[2]}), max {high[0]:.2f} ({high[1]} batch {high[2]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(CASES), help="comma-separated zoo names; defaults to all: "
                        + ", ".join(CASES))
    parser.add_argument("--cache", default="/tmp/kfast-memory-zoo.json", help="the compile results' JSON file")
    parser.add_argument("--budget", type=float, default=120, help="minutes; past it nothing more is compiled")
    parser.add_argument("--retry-failed", action="store_true", help="compile again what failed before")
    args = parser.parse_args()
    if keras.backend.backend() != "jax":
        raise SystemExit(f"memory_zoo compiles Keras's JAX train step; Keras runs on {keras.backend.backend()!r}. "
                         "Run with KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-jax/bin/python.")
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"--models got {', '.join(unknown)}; known: {', '.join(CASES)}")
    import jax

    start = time.perf_counter()
    rows = run(names, Cache(args.cache), args.budget * 60, args.retry_failed)
    print(f"jax {jax.__version__}, keras {keras.__version__}; bytes per device of one training step "
          f"(MB = 10**6 bytes)\n")
    report(rows)
    print(f"\n{time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
