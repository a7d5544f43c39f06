import json
import os
import subprocess
import sys

import pytest

import datasets
import kfast
import kfast.callbacks
from helpers import REPO
from kfast.data import FastLoader


class Clock:
    """Each measurement advances the clock by one second."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def scripted(rates, clock=None):
    calls = []

    def measure(workers, processes, queue):
        calls.append((workers, processes, queue))
        if clock is not None:
            clock.now += 1.0
        return rates.get((workers, processes, queue), rates.get((workers, processes), 0.0))

    return measure, calls


def test_picks_processes_when_threads_plateau():
    rates = {(1, False): 100, (2, False): 102, (1, True): 95, (2, True): 180, (4, True): 300, (8, True): 310}
    measure, calls = scripted(rates)
    result = kfast.tune(None, measure=measure, max_workers=8)
    assert (result.workers, result.use_multiprocessing, result.max_queue_size) == (4, True, 8)
    assert result.batches_per_s == 300
    # threads stopped at the plateau (2 workers), processes at 8 (under 5% better), then a deeper queue
    assert calls == [(1, False, 2), (2, False, 4), (1, True, 2), (2, True, 4), (4, True, 8), (8, True, 16),
                     (4, True, 16)]
    assert len(result.trials) == 7 and "<- chosen" in str(result)


def test_stops_once_the_model_cannot_consume_more():
    measure, calls = scripted({(1, False): 50, (2, False): 120, (4, False): 200})
    result = kfast.tune(None, measure=measure, max_workers=8, target_batches_per_s=110)
    assert calls == [(1, False, 2), (2, False, 4)]
    assert (result.workers, result.use_multiprocessing) == (2, False)


def test_stops_at_the_budget():
    clock = Clock()
    measure, calls = scripted({(w, p): 10 * w for w in (1, 2, 4, 8) for p in (False, True)}, clock)
    kfast.tune(None, measure=measure, max_workers=8, budget_s=2.5, clock=clock)
    assert len(calls) == 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="budget_s=0"):
        kfast.tune(None, budget_s=0, measure=lambda *a: 1)
    with pytest.raises(ValueError, match="max_workers=-1"):
        kfast.tune(None, max_workers=-1, measure=lambda *a: 1)


@pytest.mark.timeout(240)
def test_real_tuning_is_cached_and_a_corrupt_cache_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("KFAST_CACHE_DIR", str(tmp_path))
    data = datasets.Features(n=6, delay=0.004)
    result = kfast.tune(data, budget_s=6, max_workers=2)
    assert not result.from_cache and result.batches_per_s > 0
    assert {(t["workers"], t["use_multiprocessing"]) for t in result.trials} >= {(1, False), (2, False)}
    with open(tmp_path / "tune.json") as f:
        assert len(json.load(f)) == 1
    again = kfast.tune(data, budget_s=6, max_workers=2)
    assert again.from_cache and again.settings == result.settings
    with result.loader(data) as loader:
        assert loader.settings == result.settings and len(list(loader)) == 6
    (tmp_path / "tune.json").write_text("{broken")
    with pytest.warns(UserWarning, match="ignored its tuning cache"):
        fresh = kfast.tune(data, budget_s=3, max_workers=1)
    assert not fresh.from_cache


def test_auto_tune_applies_settings_and_retunes_when_input_waits(monkeypatch):
    results = iter([kfast.TuneResult(1, False, 2, 20.0, []), kfast.TuneResult(3, False, 9, 60.0, [])])
    seen = []

    def tuner(dataset, budget_s, force):
        seen.append(force)
        return next(results)

    loader = FastLoader(datasets.Features(n=20, delay=0.05), workers=1, use_multiprocessing=False)
    cb = kfast.callbacks.AutoTune(loader, threshold=0.3, verbose=0, tuner=tuner)
    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(loader, epochs=1, verbose=0, callbacks=[cb])
    loader.close()
    # One thread on a slow dataset (50 ms a batch, a tiny model) waits most of the epoch, so it re-tunes.
    assert seen == [False, True]
    assert loader.settings == {"workers": 3, "use_multiprocessing": False, "max_queue_size": 9}
    assert cb.changes[0]["after"]["workers"] == 1 and "waited" in cb.changes[1]["reason"]


def test_cli_shows_progress_and_the_table(tmp_path):
    target = tmp_path / "data.py"
    target.write_text(f"import sys\nsys.path.insert(0, {os.path.join(REPO, 'tests')!r})\nimport datasets\n"
                      "def build():\n    return datasets.Features(n=4, delay=0.002)\n")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "kfast"), "tune", f"{target}:build",
                           "--budget", "3", "--max-workers", "1", "--force"], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KFAST_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "tried threads   workers=1" in proc.stdout and "chosen:" in proc.stdout
