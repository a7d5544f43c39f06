"""Overhead of kfast's monitoring callbacks on `fit` step time.

    python benchmarks/monitor_overhead.py

Trains the same small model on the same in-memory FastLoader with no callback, with ThroughputMonitor,
and with ThroughputMonitor + GPUMonitor (an injected sampler, as this machine has no GPU), alternating
the three several times and comparing median step times.
"""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kfast  # noqa: E402
import kfast.callbacks  # noqa: E402


def main(rounds=9, steps=300):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 64, 32)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    loader = kfast.data.FastLoader(kfast.data.ArrayDataset(x, y, batch_size=64), training=True, workers=1,
                                   use_multiprocessing=False)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(loader, epochs=1, verbose=0)  # trace and warm up
    setups = {
        "no callback": lambda: [],
        "ThroughputMonitor": lambda: [kfast.callbacks.ThroughputMonitor(loader)],
        "ThroughputMonitor + GPUMonitor": lambda: [kfast.callbacks.ThroughputMonitor(loader),
                                                   kfast.callbacks.GPUMonitor(sampler=lambda: (50.0, 1 << 30))],
    }
    times = {name: [] for name in setups}
    for _ in range(rounds):
        for name, make in setups.items():
            start = time.perf_counter()
            model.fit(loader, epochs=2, verbose=0, callbacks=make())
            times[name].append((time.perf_counter() - start) / (2 * steps))
    # The callbacks' own cost, timed directly: one epoch's hooks, many times over.
    monitor = kfast.callbacks.ThroughputMonitor(loader)
    monitor.set_model(model)
    monitor.set_params({"steps": steps})
    monitor.on_train_begin()
    reps = 20000
    start = time.perf_counter()
    for epoch in range(reps):
        monitor.on_epoch_begin(epoch)
        monitor.on_epoch_end(epoch, {})
    hooks = (time.perf_counter() - start) / reps
    # GPUMonitor's sampling thread: the work of one sample (reading the GPU is NVML's cost, about
    # 10-100 us on real drivers; here a stub), plus the check that training is still running.
    from kfast._core import gpu_sampling
    import threading

    sampler = gpu_sampling.GpuSampler(lambda: (50.0, 1), owner_thread=threading.get_ident())
    start = time.perf_counter()
    for _ in range(reps):
        sampler._owner_left()
    per_sample = (time.perf_counter() - start) / reps
    loader.close()
    base = statistics.median(times["no callback"])
    print(f"GPUMonitor sampling thread: {per_sample * 1e6:.2f} us per sample besides the NVML read; at the "
          f"default 10 samples/s that is {100 * per_sample * 10:.4f}% of one core")
    print(f"ThroughputMonitor hooks: {hooks * 1e6:.2f} us per epoch = {100 * hooks / (base * steps):.4f}% of an "
          f"epoch of {steps} steps at {base * 1e3:.3f} ms/step")
    print(f"{rounds} rounds x 2 epochs x {steps} steps, median step time")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<32} {med * 1e3:7.3f} ms/step  overhead {100 * (med / base - 1):+6.2f}%")


if __name__ == "__main__":
    main()
