"""Elastic training on one host: the pieces (resuming mid-epoch shards, commit and roll back, the launch
command) and a real elastic recipe run under `kfast launch --elastic`. The multi-host kill and rejoin
test is tests/multihost/test_elastic.py."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import kfast
from kfast.cli import launch_command
from kfast.distributed import checkpoint
from kfast.distributed import elastic

KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")


@pytest.mark.single_process
@pytest.mark.parametrize("size, start, shards", [
    (3, 4, [[4, 7], [5, 8], [6, 9]]),  # 6 batches left for 3 ranks
    (2, 5, [[5, 7], [6, 8]]),  # 5 left: the trailing one waits for the next epoch (fewer than the ranks)
])
def test_a_shard_can_start_mid_epoch(size, start, shards):
    got = [[s[i] for i in range(len(s))] for s in (kfast.data.shard(list(range(10)), r, size, start=start)
                                                    for r in range(size))]
    assert got == shards


@pytest.mark.single_process
def test_a_shard_past_the_end_says_so():
    with pytest.raises(ValueError, match="the dataset has 1 batches for 2 ranks"):
        kfast.data.shard(list(range(10)), 0, 2, start=9)
    with pytest.raises(ValueError, match="start=-1"):
        kfast.data.shard(list(range(10)), 0, 2, start=-1)


@pytest.mark.single_process
def test_restore_puts_back_the_last_commit():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 2), "float32")
    model.fit(x, y, epochs=1, verbose=0)
    state = elastic.ElasticState(model, epoch=3)
    state.position = 12
    checkpoint.training_state(model)["lr_warmup"] = {"base_lr": 0.1}
    state.save()
    committed = [np.array(v.numpy()) for v in model.weights + model.optimizer.variables]
    model.fit(x, y, epochs=2, verbose=0)  # work after the commit, lost with a rank
    state.epoch, state.position = 4, 30
    checkpoint.training_state(model)["lr_warmup"] = {"base_lr": 0.5}
    state.restore()
    now = [np.array(v.numpy()) for v in model.weights + model.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(now, committed)) and len(now) == len(committed)
    assert (state.epoch, state.position) == (3, 12)
    assert checkpoint.training_state(model)["lr_warmup"] == {"base_lr": 0.1}


@pytest.mark.single_process
@pytest.mark.parametrize("message", [
    "[_Derived_]{{function_node __inference_one_step_on_data_123}} HorovodGroupedAllreduce_kfast.grads_0 failed",
    "Horovod has been shut down. This was caused by an exception on one of the ranks",
])
def test_a_failed_collective_counts_as_a_lost_rank(message):
    assert elastic._is_lost_rank(RuntimeError(message))
    assert not elastic._is_lost_rank(ValueError("Input 0 of layer dense is incompatible with the layer"))


@pytest.mark.single_process
def test_elastic_launch_commands():
    cmd = launch_command(3, "a:2,b:2", None, "tabular", ["--epochs", "2"], python="py",
                         elastic={"min_np": 2, "max_np": 4, "discovery": None})
    assert cmd == ["horovodrun", "-np", "3", "--min-np", "2", "--max-np", "4", "-H", "a:2,b:2", "py", "-m",
                   "kfast.cli", "train", "tabular", "--epochs", "2", "--elastic"]
    cmd = launch_command(2, None, None, "tabular", [], python="py",
                         elastic={"min_np": None, "max_np": 8, "discovery": "./hosts.sh"})
    assert cmd[:8] == ["horovodrun", "-np", "2", "--min-np", "2", "--max-np", "8", "--host-discovery-script"]
    with pytest.raises(ValueError, match="1 <= --min-np <= -np <= --max-np; got --min-np 3, -np 2"):
        launch_command(2, None, None, "tabular", [], elastic={"min_np": 3, "max_np": None, "discovery": None})
    with pytest.raises(ValueError, match="either --host-discovery-script or -H"):
        launch_command(2, "a:2", None, "tabular", [], elastic={"min_np": 1, "max_np": 2, "discovery": "s.sh"})


@pytest.mark.distributed  # kfast launch -np 2 --elastic
@pytest.mark.timeout(300)
def test_an_elastic_recipe_trains_under_kfast_launch(tmp_path):
    proc = subprocess.run([KFAST, "launch", "-np", "2", "--elastic", "--min-np", "1", "tabular", "--epochs", "2",
                           "--samples", "512", "--workers", "1", "--commit-every", "2", "--tensorboard", "none"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KFAST_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--min-np 1 --max-np 2 --network-interface lo --host-discovery-script" in proc.stdout
    assert "2 rank(s)" in proc.stdout and "Epoch 2/2" in proc.stdout
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["best.keras", "epoch-0001.keras", "epoch-0002.keras"]


@pytest.mark.timeout(300)
def test_the_readme_elastic_snippet_runs_on_two_ranks(horovodrun, tmp_path):
    from helpers import README_DATASET, readme_snippet

    script = tmp_path / "train.py"
    script.write_text("import keras\nimport numpy as np\nimport kfast\n" + README_DATASET +
                      "model = keras.Sequential([keras.Input((10, 10, 1)), keras.layers.Flatten(), "
                      "keras.layers.Dense(3)])\nloss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)\n"
                      + readme_snippet("Elastic training: ranks leave and join")
                      + "print('weights', kfast.distributed.rank(), float(sum(np.abs(w).sum() for w in "
                        "model.get_weights())), flush=True)\n")
    out = horovodrun(str(script), np=2, cwd=tmp_path, timeout=240)
    sums = {line.split()[-2]: line.split()[-1] for line in out.splitlines() if "weights " in line}
    assert set(sums) == {"0", "1"} and sums["0"] == sums["1"], out[-3000:]
    assert sorted(os.listdir(tmp_path / "ckpt"))[-1] == "epoch-0010.keras"


_COMMITS = """
import keras, numpy as np, kfast
from kfast.distributed import elastic
seen = []
commit = elastic.ElasticState.commit
elastic.ElasticState.commit = lambda self: (seen.append((self.epoch, self.position)), commit(self))
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
data = kfast.data.ArrayDataset(np.ones((48, 3), "float32"), np.zeros(48, "float32"), batch_size=4)
kfast.distributed.elastic_fit(model, data, epochs=2, commit_every=3, use_multiprocessing=False, verbose=0)
print("COMMITS", seen)
"""


@pytest.mark.single_process  # Horovod in one process, no horovodrun
@pytest.mark.slow
def test_no_commit_at_an_epoch_s_last_step(tmp_path):
    # A reset raised at a commit after an epoch's last batch restored a position with no batch left, and the
    # epoch then counted as done without its on_epoch_end (the multi-host rejoin test saw an epoch missing).
    # Its own process: elastic_fit sets up Horovod for the whole process.
    proc = subprocess.run([sys.executable, "-c", _COMMITS], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("COMMITS"))
    # 12 steps an epoch, a commit every 3: at 3, 6 and 9, then the epoch-end commit (next epoch, position 0).
    assert line == "COMMITS [(0, 3), (0, 6), (0, 9), (1, 0), (1, 3), (1, 6), (1, 9), (2, 0)]"
