"""kfast's collectives between JAX processes (tests/distributed/test_jax_engine.py), under `kfast launch -np 2`:
each process prints one REPORT line of what it got, and what evaluate() said of 5 batches over 2 processes."""

import json

import keras
import numpy as np

import kfast

kfast.distributed.init()
rank = kfast.distributed.rank()
d = kfast.distributed
report = {
    "rank": rank, "size": d.size(), "local": [d.local_rank(), d.local_size()], "chief": d.is_chief(),
    "gathered": d.allgather_object({"rank": rank, "text": "x" * (10 + 1000 * rank)}),
    "broadcast": d.broadcast_object(("from", rank, list(range(rank + 2))), root_rank=1),
    "sums": d.allreduce_sum_values([0.1 if rank == 0 else 0.2, 1e-300, 2.0 ** 60 + rank]),
    "means": d.allreduce_mean_values([float(rank), 3.0]),
    "average": np.asarray(d.allreduce_average([np.full((2,), rank, "float32")])[0]).tolist(),
}
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
uneven = kfast.data.FastLoader(kfast.data.ArrayDataset(np.ones((40, 2), "float32"), np.ones(40), batch_size=8))
try:
    model.evaluate(uneven, verbose=0)
except ValueError as e:
    report["uneven"] = str(e)
try:
    model.predict(np.ones((16, 2), "float32"), verbose=0)
except ValueError as e:
    report["predict_arrays"] = str(e)
# Every process gets the whole set's predictions, in order: 6 batches of 8 (3 per process), distinct rows.
model.set_weights([np.array([[1.0], [1000.0]], "float32"), np.array([0.5], "float32")])
rows = np.stack([np.arange(48), np.arange(48) % 7], 1).astype("float32")
report["predicted"] = model.predict(kfast.data.FastLoader(kfast.data.ArrayDataset(rows, batch_size=8)),
                                    verbose=0).ravel().tolist()
try:
    kfast.distributed.elastic_fit(model, kfast.data.ArrayDataset(np.ones((32, 2)), np.ones(32), batch_size=8), epochs=1)
except RuntimeError as e:
    report["elastic"] = str(e)
print("REPORT " + json.dumps(report), flush=True)
