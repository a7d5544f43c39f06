"""Recipes write TensorBoard logs on rank 0, beside the checkpoints unless told otherwise."""

import os
import subprocess
import sys

import keras
import pytest

import tb_events
from kfast import distributed
from kfast import recipes
from kfast.recipes import _common

KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")


def _args(*argv):
    return _common.parser_for("tabular", recipes.get("tabular")).parse_args(list(argv))


@pytest.mark.timeout(300)
def test_recipe_writes_tensorboard_logs_beside_its_checkpoints(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KFAST_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([KFAST, "train", "tabular", "--epochs", "2", "--samples", "512", "--workers", "1",
                           "--checkpoint-dir", "run/checkpoints"], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "view them with: tensorboard --logdir run/tensorboard" in proc.stdout
    train = tb_events.scalars(tmp_path / "run" / "tensorboard" / "train")
    for tag in ("epoch_loss", "epoch_accuracy", "epoch_learning_rate", "epoch_steps_per_second",
                "epoch_samples_per_second", "epoch_input_wait_fraction"):
        assert len(train.get(tag, [])) == 2, (tag, sorted(train))
    assert len(tb_events.scalars(tmp_path / "run" / "tensorboard" / "validation")["epoch_loss"]) == 2


def test_tensorboard_directory_defaults_beside_checkpoints_and_can_be_switched_off():
    assert _common.tensorboard_dir(_args()) == "tensorboard"
    assert _common.tensorboard_dir(_args("--checkpoint-dir", "out/run/checkpoints/")) == os.path.join("out", "run",
                                                                                                      "tensorboard")
    assert _common.tensorboard_dir(_args("--tensorboard", "logs/tb")) == "logs/tb"
    assert _common.tensorboard_dir(_args("--tensorboard", "none")) is None


def test_without_the_tensorboard_package_the_default_is_off_and_asking_for_it_fails_clearly(monkeypatch, capsys):
    monkeypatch.setattr(_common, "_have_tensorboard", lambda: False)
    assert _common.tensorboard_dir(_args()) is None
    parser = _common.parser_for("tabular", recipes.get("tabular"))
    with pytest.raises(SystemExit):
        _common.check_positive(parser, parser.parse_args(["--tensorboard", "tb"]))
    assert "--tensorboard 'tb' needs the tensorboard package" in capsys.readouterr().err
    _common.check_positive(parser, parser.parse_args(["--tensorboard", "none"]))


def _tensorboards(callbacks):
    return [c.log_dir for c in callbacks if isinstance(c, keras.callbacks.TensorBoard)]


def test_only_rank_0_gets_a_tensorboard_callback(monkeypatch, tmp_path):
    args = _args("--checkpoint-dir", str(tmp_path / "ckpt"))
    assert _tensorboards(_common.standard_callbacks(args, None, "val_loss")) == [str(tmp_path / "tensorboard")]
    assert _tensorboards(_common.standard_callbacks(_args("--tensorboard", "none"), None, "val_loss")) == []
    monkeypatch.setattr(distributed, "is_chief", lambda: False)
    assert _tensorboards(_common.standard_callbacks(args, None, "val_loss")) == []
