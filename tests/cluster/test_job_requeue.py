"""kfast launch's requeue of a Slurm job (kfast.cluster.job.run) with the ranks' command and `scontrol` as
small stand-in programs: Slurm kills the batch script as soon as a requeue works, so what the launcher says
about it must be out before it asks."""

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO

# The ranks' command: signals the launcher as Slurm's --signal=B:USR1 would, then ends the way horovodrun
# does after a resumable stop (status 1, "Exit code: 75" on stderr).
_RANKS = ("import os, signal, sys, time; os.kill(os.getppid(), signal.SIGUSR1); time.sleep(1); "
          "print('Exit code: 75', file=sys.stderr); sys.exit(1)")

_LAUNCHER = textwrap.dedent(f"""
    import signal, sys
    from kfast.cluster import job
    end = job.run([sys.executable, "-c", {_RANKS!r}], [sys.executable, "no-rank-runs-this"], cwd=".",
                  stop_signals=[signal.SIGUSR1], requeue_job="5")
    print("status", end.status, "requeued", end.requeued)
""")


def _launch(tmp_path, scontrol):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\n" + scontrol)
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, "-c", _LAUNCHER], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.timeout(90)
def test_the_requeue_is_announced_before_slurm_kills_the_batch_script(tmp_path):
    # What slurmctld does on `scontrol requeue`: the batch script (the launcher) is killed at once.
    proc = _launch(tmp_path, 'echo "$@" > "$(dirname "$0")/asked"\nkill -9 $PPID\n')
    assert (tmp_path / "bin" / "asked").read_text().split() == ["requeue", "5"]
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert "kfast launch: SIGUSR1 received" in proc.stderr, proc.stderr[-3000:]
    assert ("kfast launch: the ranks stopped with a checkpoint (status 75); requeueing Slurm job 5: it resumes "
            "where it stopped") in proc.stderr, proc.stderr[-3000:]


@pytest.mark.timeout(90)
def test_a_refused_requeue_says_why_and_how_to_resume(tmp_path):
    proc = _launch(tmp_path, 'echo "Requested operation is presently disabled for job 5" >&2\nexit 1\n')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["status", "75", "requeued", "False"]
    assert ("kfast launch: requeueing Slurm job 5 failed (Requested operation is presently disabled for job 5); "
            "resubmit it to resume") in proc.stderr, proc.stderr[-3000:]
