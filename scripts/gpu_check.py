"""kfast on one NVIDIA GPU with Keras on JAX (or PyTorch) and no TensorFlow; scripts/gpu_check.sh runs it.

Four parts, each printed as it finishes:
1. `kfast doctor`, and the GPU as NVML sees it (name, memory, utilisation).
2. Will it fit: kfast's predicted peak memory of a training step (`kfast.planning.estimate_memory`) against
   the GPU's own peak after training it, and, on JAX, XLA's analysis of the compiled step.
3. A `fit` that keeps the GPU busy, with kfast's GPUMonitor sampling NVML: its samples must be real
   (utilisation above 0 while training, memory in use).
4. An input-bound image workload (JPEG decode and augmentation with Pillow in `__getitem__`, on JPEGs made
   here) trained once from a plain keras.utils.PyDataset and once from a FastLoader that kfast.tune
   configured: steady steps/s, GPU utilisation and kfast.diagnose's verdict, side by side.

`--dry-run` runs the same flow on CPU with tiny sizes and a scripted sampler in place of NVML; `make test`
runs it. The exit status is 1 when a check fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np

import kfast
import kfast.callbacks
from kfast import nvml

# The real run should take 2 to 4 minutes on one GPU with 16 cores (not yet run on one); the dry run takes
# about 15 s on 2 cores.
SIZES = {
    "real": {"images": 2048, "image_side": 256, "crop": 224, "side": 128, "batch": 32, "epochs": 5, "steps": 30,
             "warmup": 5, "budget_s": 40, "max_workers": None, "width": 4096, "rows": 1024, "busy_steps": 500},
    "dry": {"images": 48, "image_side": 48, "crop": 40, "side": 32, "batch": 8, "epochs": 2, "steps": 4,
            "warmup": 1, "budget_s": 2, "max_workers": 2, "width": 32, "rows": 16, "busy_steps": 8},
}


_MARKS = {True: "PASS", False: "FAIL", None: "NOTE"}
# The predicted peak must be within this share of the GPU's measured one: the widest gap kfast's prediction
# showed against XLA's compiled step on CPU (benchmarks/RESULTS.md, "Will it fit?").
MEMORY_BOUND = 0.35


def say(text=""):
    print(text, flush=True)


class ScriptedSampler:
    """Stands in for NVML in a dry run: readings alternate between 30% and 70% busy, 1 GiB in use."""

    def __init__(self):
        self._count = 0

    def __call__(self):
        self._count += 1
        return (30.0 if self._count % 2 else 70.0), 1 << 30


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


def make_jpegs(folder, count, side, seed=0):
    """Writes `count` photo-like JPEGs (smooth colour fields with grain) and returns their paths."""
    Image = _pillow()
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        coarse = Image.fromarray(rng.integers(0, 256, (side // 16 + 2, side // 16 + 2, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize((side, side), Image.Resampling.BICUBIC), dtype=np.int16)
        grain = rng.integers(-10, 11, smooth.shape, dtype=np.int16)
        paths.append(os.path.join(folder, f"{i:05d}.jpg"))
        Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8)).save(paths[-1], quality=90)
    return paths


def decode_like(index, crop, side):
    """Without Pillow: an image made from its index with about a JPEG decode's CPU work (a 2-D transform
    round trip, as the inverse DCT of a decode), cropped and resized by sampling."""
    block = np.random.default_rng(index).random((crop, crop, 3), dtype=np.float32)
    block = np.fft.irfft2(np.fft.rfft2(block, axes=(0, 1)), s=(crop, crop), axes=(0, 1))
    pick = (np.arange(side) * crop / side).astype(int)
    return np.clip(block[pick][:, pick], 0.0, 1.0).astype("float32")


class AugmentedImages:
    """Batches decoded from JPEG files and augmented in `__getitem__`: random crop, flip, resize, brightness.

    With `paths=None` (no Pillow) each image comes from `decode_like` instead. Augmentation draws from
    numpy's global generator, which FastLoader seeds per worker and epoch. Not a PyDataset itself, so that
    FastLoader's workers import numpy and Pillow only (`PlainFeed` hands it to Keras).
    """

    def __init__(self, paths, count, batch, crop, side):
        self.paths, self.count, self.batch, self.crop, self.side = paths, count, batch, crop, side

    def __len__(self):
        return self.count // self.batch

    def __getitem__(self, index):
        first = index * self.batch
        images = np.stack([self._image(i) for i in range(first, first + self.batch)])
        return images, np.arange(first, first + self.batch) % 10

    def _image(self, i):
        if self.paths is None:
            return decode_like(i, self.crop, self.side)
        Image = _pillow()
        with Image.open(self.paths[i]) as image:
            image = image.convert("RGB")
            x, y = (np.random.randint(0, n - self.crop + 1) for n in image.size)
            image = image.crop((x, y, x + self.crop, y + self.crop)).resize((self.side, self.side),
                                                                           Image.Resampling.BILINEAR)
            if np.random.rand() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = np.asarray(image, dtype="float32") / 255.0
        return np.clip(pixels * np.random.uniform(0.8, 1.2), 0.0, 1.0)


class PlainFeed(keras.utils.PyDataset):
    """The plain way to feed `fit`: a keras.utils.PyDataset with Keras's defaults, loading in the training loop."""

    def __init__(self, images):
        super().__init__()
        self.images = images

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return self.images[index]


class Repeated(keras.utils.PyDataset):
    """One in-memory batch, `n` times: training limited by the accelerator alone."""

    def __init__(self, x, y, n):
        super().__init__()
        self.x, self.y, self.n = x, y, n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return self.x, self.y


def _classifier(layers):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(layers)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def show_doctor_and_gpus(dry):
    say("== kfast doctor")
    proc = subprocess.run([sys.executable, "-m", "kfast.cli", "doctor"], capture_output=True, text=True, timeout=180)
    say("\n".join(f"  | {line}" for line in (proc.stdout + proc.stderr).rstrip().splitlines()))
    say()
    try:
        gpus = nvml.list_gpus()
    except nvml.NvmlUnavailable as e:
        say(f"NVML: no GPU visible ({e})" + (" (dry run: a scripted sampler stands in for NVML)" if dry else ""))
        return []
    for gpu in gpus:
        say(f"NVML: gpu {gpu['index']} {gpu['name']}, {gpu['memory_used_mib']} of {gpu['memory_total_mib']} MiB in "
            f"use, {gpu['utilization_percent']}% busy")
    return gpus


def backend_device():
    """Returns (on_gpu, description) for where Keras's backend puts tensors."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return device.platform == "gpu", f"jax {jax.__version__}, {device.device_kind} ({device.platform})"
    if backend == "torch":
        import torch

        on_gpu = torch.cuda.is_available()
        return on_gpu, f"torch {torch.__version__}, " + (torch.cuda.get_device_name(0) if on_gpu else "CPU only")
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return bool(gpus), f"tensorflow {tf.__version__}, {len(gpus)} GPU(s)"


def _device_peak():
    """The accelerator's peak bytes in use since the process started (JAX) or the last reset, or None."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        stats = jax.local_devices()[0].memory_stats() or {}
        return stats.get("peak_bytes_in_use")
    if backend == "torch":
        import torch

        return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    import tensorflow as tf

    return tf.config.experimental.get_memory_info("GPU:0")["peak"] if tf.config.list_physical_devices("GPU") else None


def check_memory(size, dry):
    """kfast's predicted peak for the busy workload's training step, against XLA's compiled step (JAX) and the
    GPU's own peak after training it (a real run); returns (passed or None, text) for the result."""
    from kfast.planning import compiled_step_memory
    from kfast.planning import estimate_memory
    from kfast.planning.cost_model import human_bytes

    width, rows = size["width"], size["rows"]
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(rows, width)).astype("float32"), rng.integers(0, 10, rows)
    model = _classifier([keras.Input((width,))] + [keras.layers.Dense(width, activation="relu") for _ in range(3)]
                        + [keras.layers.Dense(10)])
    predicted = estimate_memory(model, (x, y))
    say(f"kfast predicts {human_bytes(predicted.peak)} at batch {rows}: parameters "
        f"{human_bytes(predicted.parameters)}, gradients {human_bytes(predicted.gradients)}, optimizer "
        f"{human_bytes(predicted.optimizer)}, activations {human_bytes(predicted.activations)}, batch "
        f"{human_bytes(predicted.batch)}")
    if keras.backend.backend() == "jax":
        step = compiled_step_memory(model, (x, y))
        say(f"XLA's compiled step on {step.device}: {human_bytes(step.total)} (kfast "
            f"{predicted.peak / step.total - 1:+.0%})")
    if dry:
        return None, f"memory: predicted {human_bytes(predicted.peak)} (dry run: no GPU peak to compare with)"
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("GPU:0")
    elif backend == "torch":
        import torch

        torch.cuda.reset_peak_memory_stats()
    model.fit(Repeated(x, y, 5), epochs=1, verbose=0)
    measured = _device_peak()
    if not measured:
        return None, f"memory: predicted {human_bytes(predicted.peak)}; the GPU's peak cannot be read here"
    error = predicted.peak / measured - 1
    say(f"the GPU's peak in use after training: {human_bytes(measured)} (kfast {error:+.0%})")
    return abs(error) <= MEMORY_BOUND, (f"memory: kfast's predicted peak {human_bytes(predicted.peak)} within "
                                        f"{MEMORY_BOUND:.0%} of the GPU's {human_bytes(measured)} ({error:+.0%})")


def _steady(history, key):
    """The mean of an epoch log over the epochs after the first (which includes compiling)."""
    values = history.history.get(key, [])
    values = values[1:] if len(values) > 1 else values
    return float(np.mean(values)) if values else float("nan")


def check_gpu_monitor(size, sampler):
    """Trains wide dense layers on one repeated batch with GPUMonitor; returns the last epoch's logs."""
    width, rows = size["width"], size["rows"]
    rng = np.random.default_rng(0)
    data = Repeated(rng.normal(size=(rows, width)).astype("float32"), rng.integers(0, 10, rows), size["busy_steps"])
    model = _classifier([keras.Input((width,))] + [keras.layers.Dense(width, activation="relu") for _ in range(3)]
                        + [keras.layers.Dense(10)])
    monitor = kfast.callbacks.GPUMonitor(interval=0.1, sampler=sampler)
    start = time.monotonic()
    history = model.fit(data, epochs=3, verbose=0, callbacks=[monitor])
    logs = {key: history.history[key][-1] for key in ("gpu_util_mean", "gpu_util_p10", "gpu_mem_used_max")}
    say(f"GPUMonitor over 3 epochs of {size['busy_steps']} steps ({time.monotonic() - start:.1f} s), last epoch: "
        f"utilisation mean {logs['gpu_util_mean']:.0f}%, p10 {logs['gpu_util_p10']:.0f}%, "
        f"memory in use {logs['gpu_mem_used_max'] / 2**30:.2f} GiB")
    return logs


def run_side(name, model, data, size, sampler, loader=None):
    """kfast.diagnose, then `fit`, on one way of feeding the model; returns the numbers for the table."""
    start = time.monotonic()
    diagnosis = kfast.diagnose(model, data, steps=size["steps"], warmup=size["warmup"], sampler=sampler)
    monitors = [kfast.callbacks.GPUMonitor(interval=0.05, sampler=sampler),
                kfast.callbacks.ThroughputMonitor(loader) if loader else
                kfast.callbacks.ThroughputMonitor(batch_size=size["batch"])]
    history = model.fit(data, epochs=size["epochs"], verbose=0, callbacks=monitors)
    say(f"{name}: {time.monotonic() - start:.1f} s (diagnose, then {size['epochs']} epochs of {len(data)} steps)")
    return {"steps/s": f"{_steady(history, 'steps_per_second'):.1f}",
            "GPU utilisation (mean)": f"{_steady(history, 'gpu_util_mean'):.0f}%",
            "GPU idle fraction": f"{_steady(history, 'gpu_idle_fraction'):.2f}",
            "kfast.diagnose verdict": diagnosis.verdict,
            "step time not computing": f"{diagnosis.lost_fraction:.0%}"}


def compare_feeds(size, sampler, folder):
    """The input-bound image workload from a plain PyDataset and from a tuned FastLoader; returns both rows."""
    pillow = _pillow() is not None
    paths = make_jpegs(folder, size["images"], size["image_side"]) if pillow else None
    what = (f"{size['images']} JPEGs ({size['image_side']}x{size['image_side']}) decoded with Pillow" if pillow else
            f"Pillow is not installed: {size['images']} images made with numpy work of about a decode's cost")
    say(f"Workload: {what}, random crop {size['crop']}, resize to {size['side']}, flip and brightness in "
        f"__getitem__; batch {size['batch']}, {size['images'] // size['batch']} steps per epoch")
    dataset = AugmentedImages(paths, size["images"], size["batch"], size["crop"], size["side"])
    side = size["side"]
    model = _classifier([keras.Input((side, side, 3)), keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
                         keras.layers.Conv2D(64, 3, strides=2, activation="relu"),
                         keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    plain = run_side("plain PyDataset", model, PlainFeed(dataset), size, sampler)
    plain["loader settings"] = "Keras's default (1 thread)"
    tuned_at = time.monotonic()
    result = kfast.tune(dataset, budget_s=size["budget_s"], max_workers=size["max_workers"], force=True)
    unit = "process" if result.use_multiprocessing else "thread"
    mode = f"{unit}{'es' if unit == 'process' else 's'}" if result.workers != 1 else unit
    say(f"kfast.tune: {result.workers} {mode}, queue {result.max_queue_size}, {result.batches_per_s:.1f} batches/s "
        f"({time.monotonic() - tuned_at:.1f} s, {len(result.trials)} trials)")
    with result.loader(dataset) as loader:
        tuned = run_side("tuned FastLoader", model, loader, size, sampler, loader=loader)
    tuned["loader settings"] = f"{result.workers} {mode}, queue {result.max_queue_size}"
    return plain, tuned


def print_table(plain, tuned):
    rows = ["loader settings", "steps/s", "GPU utilisation (mean)", "GPU idle fraction", "kfast.diagnose verdict",
            "step time not computing"]
    say(f"  {'':<26}{'plain PyDataset':<28}{'tuned FastLoader'}")
    for row in rows:
        say(f"  {row:<26}{plain[row]:<28}{tuned[row]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU, a scripted sampler for NVML")
    args = parser.parse_args(argv)
    size = SIZES["dry" if args.dry_run else "real"]
    began = time.monotonic()
    checks = []  # (passed or None for "not checked here", text)
    say(f"kfast GPU check{' (DRY RUN: CPU, tiny sizes, scripted GPU sampler)' if args.dry_run else ''}: Python "
        f"{sys.version.split()[0]}, keras {keras.__version__} on {keras.backend.backend()}, kfast {kfast.__version__}")
    gpus = show_doctor_and_gpus(args.dry_run)
    sampler = ScriptedSampler() if args.dry_run else None  # None: GPUMonitor and diagnose read NVML
    if args.dry_run:
        checks.append((None, "GPU through NVML: not checked in a dry run"))
    else:
        checks.append((bool(gpus), f"NVML sees {len(gpus)} GPU(s)" + (f": {gpus[0]['name']}" if gpus else "")))
        if not gpus:
            return _finish(checks, began)
        on_gpu, where = backend_device()
        checks.append((on_gpu, f"Keras's backend trains on the GPU ({where})"))

    say()
    say(f"== Will it fit: predicted memory against the device's ({keras.backend.backend()})")
    checks.append(check_memory(size, args.dry_run))  # first: JAX's peak counts from the start of the process

    say()
    say(f"== GPUMonitor during fit ({keras.backend.backend()})")
    logs = check_gpu_monitor(size, sampler)
    real = "scripted samples reach the logs" if args.dry_run else "NVML samples are real"
    checks.append((logs["gpu_util_mean"] > 0 and logs["gpu_mem_used_max"] > 0,
                   f"GPUMonitor: {real} (utilisation {logs['gpu_util_mean']:.0f}% > 0 while training, "
                   f"{logs['gpu_mem_used_max'] / 2**30:.2f} GiB in use)"))

    say()
    say("== Input-bound image workload: plain keras PyDataset against a FastLoader configured by kfast.tune")
    with tempfile.TemporaryDirectory(prefix="kfast-gpu-check-") as folder:
        os.environ.setdefault("KFAST_CACHE_DIR", folder)  # tune measures afresh and leaves no cache behind
        plain, tuned = compare_feeds(size, sampler, folder)
    say()
    print_table(plain, tuned)
    faster = float(tuned["steps/s"]) / max(float(plain["steps/s"]), 1e-9)
    checks.append((None, f"tuned FastLoader: {faster:.1f}x the plain PyDataset's steps/s (a measurement, not a check)"))
    return _finish(checks, began)


def _finish(checks, began):
    say()
    say("== Result")
    for passed, text in checks:
        say(f"  [{_MARKS[passed]}] {text}")
    failed = sum(passed is False for passed, _ in checks)
    took = time.monotonic() - began
    outcome = f"{failed} check(s) failed" if failed else "All checks passed"
    say(f"{outcome} in {took // 60:.0f}m{took % 60:02.0f}s.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
