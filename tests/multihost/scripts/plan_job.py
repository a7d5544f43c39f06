"""Trains plan_model for a few steps on every rank and writes rank 0's median step time: what `kfast plan`
predicts, measured.

    horovodrun -np N -H ... python plan_job.py OUT.json STEPS
"""

import json
import os
import sys
import time

import keras
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_model  # noqa: E402 - beside this script

import kfast  # noqa: E402
import kfast.callbacks  # noqa: E402


class StepTimes(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.stamps = [time.perf_counter()]

    def on_train_batch_end(self, batch, logs=None):
        self.stamps.append(time.perf_counter())


kfast.distributed.init()
out, steps = sys.argv[1], int(sys.argv[2])
model, data = plan_model.build()
clock = StepTimes()
model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0,
          callbacks=[kfast.callbacks.BroadcastState(), clock])
seconds = np.diff(clock.stamps)[2:]  # the first steps trace the graph and open the connections
if kfast.distributed.rank() == 0:
    with open(out, "w") as f:
        json.dump({"ranks": kfast.distributed.size(), "step_s": float(np.median(seconds)),
                   "steps": seconds.tolist()}, f)
print(f"rank {kfast.distributed.rank()} done", flush=True)
