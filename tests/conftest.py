import importlib.util
import os
import pathlib
import shutil
import signal
import tempfile

import pytest

from helpers import horovodrun, horovodrun_module  # noqa: F401 - fixtures, exported to every test

# Tests send SIGINT and SIGHUP to the processes they start and expect a user's defaults there. A signal
# ignored here is ignored in every child too (an ignored disposition survives exec): `nohup make test &`
# ignores both, and three signal tests then failed for a reason of the launcher's, not kfast's.
for _signum, _default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, _default)


# NOTE [ Test tiers ]
# `make check` runs the fast tier: every test without a slow tier's marker (setup.cfg registers them, and
# docs/contributing.md says what each tier costs). The markers a test must not be able to forget are given here,
# by where the test lives and what it uses:
#   - tests/multihost/: `multihost`, or `slurm` where the module says so (test_slurm.py);
#   - tests/distributed/: `distributed`, unless the test says `single_process` (it starts no second rank);
#   - the `horovodrun` and `horovodrun_module` fixtures: `distributed`, wherever the test lives;
#   - BACKEND_MODULES: `backends`, the tests `make test-backends` runs again on JAX and on PyTorch (on
#     TensorFlow most are fast and stay in the fast tier).
#   - TIMING_MODULES and MARKS' `timing`: tests that assert on measured time (a verdict, a speed-up, a bound of a
#     few seconds); `make test` runs the others on two workers and these alone, where nothing else takes the CPU;
#   - tests/multihost/: the xdist group "namespace-hosts", so that under two workers one of them runs the harness.
# Elsewhere a test says it itself: `@pytest.mark.distributed` when it starts ranks another way (`kfast launch
# -np 2`), `@pytest.mark.slow` when it takes more than about 3 s on a 2-core machine (most of those start a
# fresh Python that imports TensorFlow). MARKS gives the same markers to tests whose files do not say them yet.

BACKEND_MODULES = frozenset({
    "tests/test_backends.py", "tests/test_diagnose.py", "tests/test_diagnose_data.py", "tests/test_tune.py",
    "tests/test_gpu_check.py", "tests/data/test_loader.py", "tests/data/test_loader_robustness.py",
    "tests/data/test_fill.py", "tests/data/test_loader_order.py", "tests/callbacks/test_monitors.py",
    "tests/data/test_loader_state.py", "tests/data/test_keras_seam.py",
    "tests/data/test_loader_batch_sizes.py", "tests/data/test_loader_errors.py", "tests/data/packed/test_packed_epochs.py", "tests/test_plan_memory_xla.py", "tests/test_plan_activations_rules.py",
    "tests/test_plan_gpu.py",  # JAX compiles in its own process; PyTorch's venv has no plugin: the refusal
    "tests/callbacks/test_rank_zero_checkpoint.py",  # step checkpoints read the metric state JAX's fit keeps apart
})

# The JAX engine's tests: collected only with Keras on JAX (in .venv-jax, by `make test-backends`), marked
# `backends` as BACKEND_MODULES are; tests/distributed/ gives them `distributed` too.
JAX_MODULES = frozenset({"tests/distributed/test_jax_engine.py"})

# Every test of these modules measures: diagnosis verdicts and shares, the tuner's trials, the demo's verdict.
TIMING_MODULES = frozenset({
    "tests/test_diagnose.py", "tests/test_diagnose_data.py", "tests/test_diagnose_shares.py",
    "tests/test_diagnose_timing.py", "tests/test_demo.py", "tests/test_tune.py", "tests/test_tune_tf_data.py",
    "tests/multihost/test_plan.py",  # measured steps over shaped links against the prediction
})

# {marker: {file: [test function, ...]}}; every parameter of a listed function gets the marker. A name that is
# not (or no longer) a test of its file is an error, so that a renamed test cannot drop back into the fast tier.
MARKS = {
    "timing": {
        "tests/data/test_loader_promises.py": [
            "test_a_slow_first_batch_is_under_timeout",
            "test_sigterm_during_a_stuck_batch_in_fit_ends_the_process_and_leaves_nothing"],
        "tests/data/test_loader_robustness.py": [
            "test_ctrl_c_with_a_stuck_worker_inside_fit_exits_fast_and_leaves_nothing",
            "test_timeout_names_the_batch_the_worker_and_where_it_is_stuck"],
        "tests/distributed/test_preemption.py": [
            "test_sigterm_during_a_stuck_batch_ends_within_the_bound_without_a_checkpoint"],
    },
    "distributed": {
        "tests/recipes/test_recipes.py": ["test_recipe_trains_on_two_ranks"],  # kfast launch -np 2
    },
    "slow": {
        "tests/callbacks/test_monitors.py": ["test_throughput_monitor_values_reach_history_and_csv"],
        "tests/callbacks/test_rank_zero_checkpoint.py": ["test_one_callback_keeps_its_best_from_one_fit_to_the_next"],
        "tests/data/test_fork_server.py": ["test_the_fork_server_preloads_a_module_from_a_path_added_at_run_time"],
        "tests/data/test_loader.py": ["test_ctrl_c_during_fit_leaves_no_processes_or_shared_memory",
                                      "test_workers_do_not_run_an_unguarded_script_again"],
        "tests/data/test_loader_promises.py": [
            "test_a_first_batch_that_crashes_its_process_kills_a_worker_not_the_trainer",
            "test_a_namedtuple_class_of_the_training_script_comes_back_as_itself",
            "test_a_slow_first_batch_is_under_timeout",
            "test_sigterm_during_a_stuck_batch_in_fit_ends_the_process_and_leaves_nothing"],
        "tests/data/test_loader_robustness.py": [
            "test_a_1_mib_dev_shm_works_with_a_warning",
            "test_a_forked_child_stopped_by_sigterm_leaves_the_parents_loaders_alone",
            "test_a_stalled_batch_warns_with_the_same_facts",
            "test_ctrl_c_with_a_stuck_worker_inside_fit_exits_fast_and_leaves_nothing",
            "test_dataset_defined_on_stdin_works_in_worker_processes",
            "test_each_keras_epoch_starts_at_a_boundary_after_a_partial_iteration",
            "test_killed_trainer_leaves_no_workers_segments_or_temp_dirs",
            "test_sighup_frees_the_loaders_and_ends_the_process_by_it_unless_the_user_handles_it",
            "test_threads_close_returns_with_a_stuck_thread_and_exit_is_not_blocked",
            "test_timeout_names_the_batch_the_worker_and_where_it_is_stuck"],
        "tests/data/test_worker_dataset.py": ["test_worker_processes_serve_the_same_batches_without_tensorflow"],
        "tests/recipes/test_data_validation.py": ["test_kfast_train_skip_bad_files_prints_how_many_it_skipped"],
        "tests/recipes/test_recipes.py": ["test_bad_recipe_names_and_flags_fail_clearly",
                                          "test_recipe_on_disk_sample_learns_checkpoints_and_resumes",
                                          "test_recipes_lists_every_recipe"],
        "tests/recipes/test_tensorboard.py": ["test_recipe_writes_tensorboard_logs_beside_its_checkpoints"],
        "tests/test_diagnose.py": ["test_cli_prints_the_verdict_for_a_module_function"],
        "tests/test_diagnose_data.py": ["test_a_short_dataset_is_read_for_the_passes_the_phases_need_and_no_more"],
        "tests/test_diagnose_timing.py": [
            "test_each_phase_stops_at_its_share_of_the_budget_after_the_least_steps",
            "test_five_runs_on_the_same_model_and_data_give_the_same_verdict",
            "test_the_input_wait_share_is_within_5_points_of_the_truth",
            "test_the_readme_quick_start_model_is_diagnosed_within_the_default_budget",
            "test_two_workers_bursts_are_measured_as_training_gets_them"],
        "tests/test_doctor.py": ["test_doctor_json_reports_this_environment", "test_doctor_text_lists_every_piece"],
        "tests/test_gpu_check.py": ["test_dry_run_reports_doctor_gpu_monitor_and_both_feeds_side_by_side",
                                    "test_the_check_venv_sees_the_packages_of_a_python_that_is_itself_a_venv",
                                    "test_without_pillow_the_workload_does_numpy_work_and_says_so"],
        "tests/test_package.py": ["test_editable_install_maps_subpackages"],
        "tests/test_plan.py": ["test_cli_prints_the_table_and_writes_the_plot", "test_the_readme_example_runs_as_written"],
        "tests/test_readme_quick_start.py": [
            "test_feed_the_gpu_snippet_trains",
            "test_quick_start_diagnoses_tunes_with_the_model_and_trains",
            "test_quick_start_tf_data_path_diagnoses_tunes_the_pipeline_and_trains"],
        "tests/test_signal_handling.py": [
            "test_a_forked_child_stopped_by_sigterm_dies_of_it_leaving_preemption_and_the_parents_clean_up_alone"],
        "tests/test_structure.py": ["test_a_loader_worker_imports_numpy_and_the_dataset_only"],
        "tests/test_tf_noise.py": ["test_what_tensorflow_prints_on_import_is_all_startup_noise"],
        "tests/test_tune.py": ["test_cli_shows_progress_and_the_table",
                               "test_real_tuning_is_cached_and_a_corrupt_cache_is_ignored",
                               "test_tune_with_a_model_measures_training_and_leaves_it_as_if_it_never_ran"],
        "tests/test_tune_tf_data.py": ["test_a_deterministic_image_pipeline_is_cached_and_at_least_as_fast",
                                       "test_a_slow_map_is_tuned_through_fit_and_the_model_is_put_back",
                                       "test_cli_tunes_a_tf_data_pipeline_and_shows_each_trial"],
        "tests/test_types.py": ["test_mypy_reports_no_errors"],
    },
}

# .venv-jax and .venv-torch have no TensorFlow, and most test modules cannot be imported there: without it, only
# BACKEND_MODULES are collected.
_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None


def _relative(config, path):
    return os.path.relpath(path, config.rootpath).replace(os.sep, "/")


def pytest_ignore_collect(collection_path, config):
    path = _relative(config, collection_path)
    if path == "." or path.startswith("../"):
        return None
    modules = BACKEND_MODULES | (JAX_MODULES if os.environ.get("KERAS_BACKEND") == "jax" else frozenset())
    if _TENSORFLOW:
        return (path in JAX_MODULES and path not in modules) or None
    if collection_path.is_dir():  # a folder without a backend module: not even its conftest.py is imported
        return not any(module.startswith(path + "/") for module in modules) or None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return path not in modules or None
    return None


def pytest_report_header(config):
    if not _TENSORFLOW:
        return "no TensorFlow here: only the backend modules (marked `backends`) are collected"
    return None


def pytest_collection_modifyitems(config, items):
    listed: dict[tuple[str, str], list[str]] = {}
    for marker, files in MARKS.items():
        for path, names in files.items():
            for name in names:
                listed.setdefault((path, name), []).append(marker)
    modules = {}
    for item in items:
        path = _relative(config, item.path)
        modules.setdefault(path, getattr(item, "module", None))
        if path.startswith("tests/multihost/"):
            if item.get_closest_marker("slurm") is None:
                item.add_marker(pytest.mark.multihost)
            # One harness of namespace hosts per session: under pytest-xdist (`make test`) every test that uses it
            # runs on the same worker (`--dist loadgroup`), while the other worker takes the rest.
            item.add_marker(pytest.mark.xdist_group("namespace-hosts"))
        if path.startswith("tests/distributed/") and item.get_closest_marker("single_process") is None \
                or {"horovodrun", "horovodrun_module"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.distributed)
        if path in BACKEND_MODULES or path in JAX_MODULES:
            item.add_marker(pytest.mark.backends)
        if path in TIMING_MODULES:
            item.add_marker(pytest.mark.timing)
        for marker in listed.get((path, getattr(item, "originalname", item.name)), ()):
            item.add_marker(getattr(pytest.mark, marker))
    # The harness's tests first: under `--dist loadgroup` their worker starts on them at once, the longest unit.
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
    missing = [f"{path}::{name}" for path, name in listed if path in modules
               and not callable(getattr(modules[path], name, None))]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py's MARKS names tests that do not exist: {', '.join(missing)}; "
                                "rename them there (or mark the tests in their files and drop them from MARKS)")


# NOTE [ One fork server for the session ]
# FastLoader's worker processes fork from one multiprocessing fork server per process, which preloads the module of
# the dataset it was started for (kfast/data/_workers/processes.py); a dataset from another module is imported by
# each worker. tests/datasets.py imports Keras, and with it TensorFlow: after a fork server started for a keras-free
# ArrayDataset, every loader of a tests/datasets.py class took about 3.5 s more on 2 cores (41 tests of the fast tier,
# 2.5 minutes), and which test came first decided it. So when the selected tests use tests/datasets.py, the session
# starts the fork server for one of its datasets before the first test.


@pytest.fixture(scope="session", autouse=True)
def _fork_server_preloads_the_test_datasets(request):
    if not any("datasets" in vars(item.module) for item in request.session.items if hasattr(item, "module")):
        return
    import datasets
    from kfast.data import FastLoader

    with FastLoader(datasets.Squares(n=2), workers=1, use_multiprocessing=True) as loader:
        assert len(list(loader)) == 2


@pytest.fixture
def short_tmp_path():
    """A fresh directory with a short path (/tmp/kft-XXXXXXXX), removed afterwards, for a child's TMPDIR.

    multiprocessing's fork server binds a Unix socket under TMPDIR (`pymp-*/listener-*`, 32 characters more),
    and a socket's path holds at most 107: pytest's tmp_path under xdist (`.../pytest-123/popen-gw1/<test>0`)
    came to 108 on a machine whose pytest runs had passed 100.
    """
    path = tempfile.mkdtemp(prefix="kft-")
    try:
        yield pathlib.Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
