"""kfast's collectives between JAX processes (tests/distributed/test_jax_engine.py), under `kfast launch -np 2`:
each process prints one REPORT line of what it got, and what evaluate() said of 5 batches over 2 processes.

The JAX engine's test seam (`_jax._observer`) records the bytes each host collective returned to this process,
so the report says what a broadcast and a preemption vote moved, not only what they answered."""

import json
import pickle
import signal

import keras
import numpy as np

import kfast
from kfast.distributed import _jax
from kfast.distributed import collectives
from kfast.distributed.preemption import PreemptionWatch

kfast.distributed.init()
rank = kfast.distributed.rank()
d = kfast.distributed
seen = []  # (collective, bytes it returned here) of every host collective of the JAX engine
_jax._observer = lambda name, sent, received: seen.append([name, int(np.asarray(received).nbytes)])


def moved(call):
    """call()'s answer, and the host collectives it took."""
    seen.clear()
    answer = call()
    return answer, list(seen)


# Broadcasts of N bytes (pickled) from each root: every process gets those N bytes, and only one copy of them.
broadcasts = {}
for root, payload in ((0, bytes(range(256)) * 40), (1, b"kfast" * 3001)):
    got, collectives_taken = moved(lambda: d.broadcast_object(payload if rank == root else None, root_rank=root))
    broadcasts[root] = {"exact": got == payload, "pickled": len(pickle.dumps(payload)), "moved": collectives_taken}
maximum = moved(lambda: collectives.allreduce_max_ints([5 * rank, 7 - rank, -rank]))
# The preemption vote: one small collective per step; a signal noted on process 1 stops both at the same vote.
watch = PreemptionWatch((signal.SIGTERM,), 60, lambda: None, "")
watch.start()
votes = [moved(watch.agree)]
if rank == 1:
    # What signal_handling calls as SIGTERM arrives (a real one would also end the loaders' waits below).
    watch._noted(signal.SIGTERM)
votes.append(moved(watch.agree))
watch.stop(redeliver=False)
_jax._observer = None
report = {
    "rank": rank, "size": d.size(), "local": [d.local_rank(), d.local_size()], "chief": d.is_chief(),
    "gathered": d.allgather_object({"rank": rank, "text": "x" * (10 + 1000 * rank)}),
    "broadcast": d.broadcast_object(("from", rank, list(range(rank + 2))), root_rank=1),
    "sums": d.allreduce_sum_values([0.1 if rank == 0 else 0.2, 1e-300, 2.0 ** 60 + rank]),
    "means": d.allreduce_mean_values([float(rank), 3.0]),
    "average": np.asarray(d.allreduce_average([np.full((2,), rank, "float32")])[0]).tolist(),
    "broadcasts": broadcasts, "maximum": maximum, "votes": votes,
}
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
try:
    kfast.data.FastLoader(kfast.data.ArrayDataset(np.ones((40, 2), "float32"), np.ones(40), batch_size=8))
except ValueError as e:
    report["uneven"] = str(e)
try:
    kfast.distributed.predict(model, np.ones((16, 2), "float32"), verbose=0)
except ValueError as e:
    report["predict_arrays"] = str(e)
# Every process gets the whole set's predictions, in order: 6 batches of 8 (3 per process), distinct rows.
model.set_weights([np.array([[1.0], [1000.0]], "float32"), np.array([0.5], "float32")])
rows = np.stack([np.arange(48), np.arange(48) % 7], 1).astype("float32")
report["predicted"] = kfast.distributed.predict(model, kfast.data.FastLoader(kfast.data.ArrayDataset(rows, batch_size=8)),
                                                verbose=0).ravel().tolist()
try:
    kfast.distributed.elastic_fit(model, kfast.data.ArrayDataset(np.ones((32, 2)), np.ones(32), batch_size=8), epochs=1)
except RuntimeError as e:
    report["elastic"] = str(e)
print("REPORT " + json.dumps(report), flush=True)
