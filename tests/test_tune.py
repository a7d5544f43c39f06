import json
import os
import subprocess
import sys

import pytest

import datasets
import kfast
import kfast.callbacks
from helpers import REPO
from kfast.data.settings import LoaderSettings
from kfast.tuning import cache as tune_cache
from kfast.tuning import search
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
    result = search._search(measure, max_workers=8)
    assert (result.workers, result.use_multiprocessing, result.max_queue_size) == (4, True, 8)
    assert result.batches_per_s == 300
    # threads stopped at the plateau (2 workers), processes at 8 (under 5% better), then a deeper queue
    assert calls == [(1, False, 2), (2, False, 4), (1, True, 2), (2, True, 4), (4, True, 8), (8, True, 16),
                     (4, True, 16)]
    assert len(result.trials) == 7 and "<- chosen" in str(result)


def test_stops_once_the_model_cannot_consume_more():
    measure, calls = scripted({(1, False): 50, (2, False): 120, (4, False): 200})
    result = search._search(measure, max_workers=8, target=110)
    assert calls == [(1, False, 2), (2, False, 4)]
    assert (result.workers, result.use_multiprocessing) == (2, False)


def test_stops_at_the_budget():
    clock = Clock()
    measure, calls = scripted({(w, p): 10 * w for w in (1, 2, 4, 8) for p in (False, True)}, clock)
    search._search(measure, max_workers=8, budget_s=2.5, clock=clock)
    assert len(calls) == 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="budget_s=0"):
        kfast.tune(None, budget_s=0)
    with pytest.raises(ValueError, match="max_workers=-1"):
        kfast.tune(None, max_workers=-1)


@pytest.mark.timeout(240)
def test_real_tuning_is_cached_and_a_corrupt_cache_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("KFAST_CACHE_DIR", str(tmp_path))
    data = datasets.Features(n=6, delay=0.004)
    result = kfast.tune(data, budget_s=6, max_workers=2)
    assert not result.from_cache and result.batches_per_s > 0
    assert {(t["workers"], t["use_multiprocessing"]) for t in result.trials} >= {(1, False), (2, False)}
    with open(tmp_path / "tune.json") as f:
        saved = json.load(f)
    assert saved["version"] == tune_cache.VERSION and len(saved["entries"]) == 1
    again = kfast.tune(data, budget_s=6, max_workers=2)
    assert again.from_cache and again.settings == result.settings
    with result.loader(data) as loader:
        assert loader.settings == result.settings and len(list(loader)) == 6
    (tmp_path / "tune.json").write_text("{broken")
    with pytest.warns(UserWarning, match="ignored its tuning cache"):
        fresh = kfast.tune(data, budget_s=3, max_workers=1)
    assert not fresh.from_cache


def test_auto_tune_applies_settings_and_retunes_when_input_waits(monkeypatch):
    from kfast.callbacks import auto_tune

    results = iter([kfast.TuneResult(1, False, 2, 20.0, []), kfast.TuneResult(3, False, 9, 60.0, [])])
    seen = []

    def scripted_tune(dataset, budget_s, force):
        seen.append(force)
        return next(results)

    loader = FastLoader(datasets.Features(n=20, delay=0.05), workers=1, use_multiprocessing=False)
    monkeypatch.setattr(auto_tune, "_tune", scripted_tune)
    cb = kfast.callbacks.AutoTune(loader, threshold=0.3, verbose=0)
    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(loader, epochs=1, verbose=0, callbacks=[cb])
    loader.close()
    # One thread on a slow dataset (50 ms a batch, a tiny model) waits most of the epoch, so it re-tunes.
    assert seen == [False, True]
    assert loader.settings == {"workers": 3, "use_multiprocessing": False, "max_queue_size": 9}
    assert loader.settings == LoaderSettings(workers=3, use_multiprocessing=False, max_queue_size=9)
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


@pytest.mark.parametrize("budget_s", [float("nan"), float("inf"), 0, -1, True, "30"])
def test_budget_must_be_finite_and_positive(budget_s):
    with pytest.raises(ValueError, match=r"budget_s=.*finite number of seconds > 0"):
        kfast.tune(None, budget_s=budget_s)


@pytest.mark.parametrize("max_workers", [0, -1, True, 1.5])
def test_max_workers_is_checked_before_the_default(max_workers):
    with pytest.raises(ValueError, match=rf"max_workers={max_workers!r}; it must be a positive int, or None"):
        kfast.tune(None, max_workers=max_workers)


# A budget under one burst (0.3 s, which 5 ms batches fill) stops the search after a single one-thread
# trial, so these stay fast.
QUICK = {"budget_s": 0.1, "max_workers": 1}


def quick_data():
    return datasets.Features(n=4, delay=0.005)


def test_an_unwritable_cache_warns_once_and_still_returns_the_result(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("not a directory")
    cache_dir = tmp_path / "afile" / "sub"  # makedirs fails even as root
    monkeypatch.setenv("KFAST_CACHE_DIR", str(cache_dir))
    data = quick_data()
    with pytest.warns(UserWarning, match=r"could not save its tuning result to .*afile.*sub.*KFAST_CACHE_DIR") as w:
        result = kfast.tune(data, **QUICK)
    assert len(w) == 1 and str(cache_dir / "tune.json") in str(w[0].message)
    assert not result.from_cache and result.batches_per_s > 0 and len(result.trials) == 1
    again = kfast.tune(data, **QUICK)  # once per path: a second warning would be an error here
    assert not again.from_cache


def _valid_entry():
    trial = {"workers": 1, "use_multiprocessing": False, "max_queue_size": 2, "batches_per_s": 50.0}
    return {**trial, "trials": [dict(trial)]}


def _missing_key():
    entry = _valid_entry()
    del entry["max_queue_size"]
    return entry


def _bad_trial():
    entry = _valid_entry()
    entry["trials"] = [{"workers": 1}]
    return entry


@pytest.mark.parametrize("entry, problem", [
    ({**_valid_entry(), "workers": 100000}, "workers=100000"),
    ("4 workers", "a str, not an object"),
    (_missing_key(), "missing max_queue_size"),
    ({**_valid_entry(), "use_multiprocessing": "yes"}, "use_multiprocessing='yes'"),
    ({**_valid_entry(), "max_queue_size": 0}, "max_queue_size=0"),
    ({**_valid_entry(), "batches_per_s": float("nan")}, "batches_per_s=nan"),
    ({**_valid_entry(), "trials": "none"}, "trials is a str"),
    (_bad_trial(), "trial 0: not an object"),
])
def test_a_malformed_cache_entry_is_measured_again_and_overwritten(tmp_path, monkeypatch, entry, problem):
    monkeypatch.setenv("KFAST_CACHE_DIR", str(tmp_path))
    data = quick_data()
    key = tune_cache.signature(data)
    _write_cache(tmp_path, {key: entry, "other|key": _valid_entry()})
    with pytest.warns(UserWarning, match=r"ignored a malformed entry in its tuning cache .*tune\.json") as w:
        result = kfast.tune(data, **QUICK)
    assert problem in str(w[0].message)
    assert not result.from_cache and result.workers == 1
    with open(tmp_path / "tune.json") as f:
        saved = json.load(f)
    assert saved["entries"][key] == result.to_dict() and saved["entries"]["other|key"] == _valid_entry()
    assert kfast.tune(data, **QUICK).from_cache  # the rewritten entry is trusted


def _write_cache(folder, entries):
    (folder / "tune.json").write_text(json.dumps({"version": tune_cache.VERSION, "entries": entries}))


def test_a_cache_of_the_layout_before_versions_is_read_and_a_newer_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("KFAST_CACHE_DIR", str(tmp_path))
    data = quick_data()
    entry = _valid_entry()
    (tmp_path / "tune.json").write_text(json.dumps({tune_cache.signature(data): entry}))  # no version: entries
    cached = kfast.tune(data, **QUICK)
    assert cached.from_cache and cached.settings == {k: entry[k] for k in ("workers", "use_multiprocessing",
                                                                           "max_queue_size")}
    (tmp_path / "tune.json").write_text(json.dumps({"version": tune_cache.VERSION + 1, "entries": {}}))
    with pytest.warns(UserWarning, match=rf"format version {tune_cache.VERSION + 1}, and this kfast reads version 1"):
        fresh = kfast.tune(data, **QUICK)
    assert not fresh.from_cache
    with open(tmp_path / "tune.json") as f:
        assert json.load(f)["version"] == tune_cache.VERSION  # rewritten in this kfast's layout


def test_a_cached_result_beyond_max_workers_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("KFAST_CACHE_DIR", str(tmp_path))
    data = quick_data()
    entry = {**_valid_entry(), "workers": 2, "max_queue_size": 4}
    entry["trials"] = [{k: entry[k] for k in ("workers", "use_multiprocessing", "max_queue_size", "batches_per_s")}]
    _write_cache(tmp_path, {tune_cache.signature(data): entry})
    assert kfast.tune(data, budget_s=0.1, max_workers=2).from_cache
    result = kfast.tune(data, **QUICK)
    assert not result.from_cache and result.workers == 1


def _twin_models():
    import keras

    def make():
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
        return model

    return make(), make()


def _training_data():
    import numpy as np

    rng = np.random.default_rng(3)
    return kfast.data.ArrayDataset(rng.normal(size=(64, 8)).astype("float32"),
                                   rng.normal(size=(64, 1)).astype("float32"), batch_size=8)


def test_a_fit_burst_trains_the_model_and_keeps_its_history():
    from kfast._core import fit_timing

    model, _ = _twin_models()
    history = model.fit(_training_data(), epochs=1, verbose=0)
    steps = int(model.optimizer.iterations.numpy())
    with FastLoader(_training_data(), workers=1, use_multiprocessing=False) as loader:
        rate = fit_timing.steps_per_s(model, loader, warmup=2, seconds=0.2)
    trained = int(model.optimizer.iterations.numpy()) - steps
    # The burst ran real training steps (warm-up included), and fit's History still is the user's.
    assert rate > 0 and trained >= 2 + 3
    assert model.history is history


def test_tune_with_a_model_measures_training_and_leaves_it_as_if_it_never_ran(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setenv("KFAST_CACHE_DIR", str(tmp_path))
    tuned, untouched = _twin_models()
    data = _training_data()
    seen = []
    result = kfast.tune(data, model=tuned, budget_s=4, max_workers=2, force=True, progress=seen.append)
    assert not result.from_cache and result.batches_per_s > 0 and len(seen) == len(result.trials) >= 2
    # The same fit afterwards trains exactly as on a twin that was never tuned: weights, Adam's moments
    # and step count were all put back.
    # shuffle=False: fit shuffles a PyDataset's batch order from the global RNG, which tuning draws from.
    tuned.fit(data, epochs=2, shuffle=False, verbose=0)
    untouched.fit(data, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(tuned.get_weights(), untouched.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(tuned.optimizer.iterations.numpy()) == int(untouched.optimizer.iterations.numpy()) == 16
    # Training-step results are cached apart from loader-only ones.
    assert kfast.tune(data, model=tuned, budget_s=4, max_workers=2).from_cache
    assert not kfast.tune(data, budget_s=1, max_workers=1).from_cache


def test_tune_rejects_a_model_it_cannot_measure_or_put_back():
    import keras

    data = _training_data()
    with pytest.raises(ValueError, match=r"not compiled; call model.compile"):
        kfast.tune(data, model=keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)]), force=True)
    # A model that is not built yet is built from the first batch, as fit does (tests/test_diagnose.py);
    # one that cannot take that batch says so.
    wrong = keras.Sequential([keras.layers.Dense(1), keras.layers.Reshape((3, 5))])
    wrong.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"tune got model .*, not built yet, and building it from the data's first"):
        kfast.tune(data, model=wrong, force=True, budget_s=1)
