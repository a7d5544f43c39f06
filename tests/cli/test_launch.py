"""`kfast launch` picks its hosts: -H, a host file, or the Slurm allocation it runs in (dry runs; the real
Slurm runs in tests/multihost/test_slurm.py)."""

import os
import subprocess
import sys

import pytest

KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")
PY = sys.executable
# Each `kfast launch --dry-run` is a fresh Python that imports TensorFlow: several seconds per test.
pytestmark = pytest.mark.slow


def launch(*args, cwd, env=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run([KFAST, "launch", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**clean, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})
    return proc


SLURM_JOB = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "gpu[01-02,07]", "SLURM_NTASKS": "5",
             "SLURM_TASKS_PER_NODE": "2(x2),1"}


@pytest.mark.timeout(300)
def test_inside_slurm_the_allocation_gives_hosts_and_np(tmp_path):
    proc = launch("--dry-run", "tabular", "--epochs", "2", cwd=tmp_path, env=SLURM_JOB)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "kfast launch: Slurm job 5: gpu01:2,gpu02:2,gpu07:1 (5 slot(s))"
    assert lines[1].split()[1:] == ["-np", "5", "-H", "gpu01:2,gpu02:2,gpu07:1", PY, "-m", "kfast.cli", "train",
                                    "tabular", "--epochs", "2"]
    # -np and -H still win; a bad Slurm variable says which and what to do.
    proc = launch("--dry-run", "-np", "3", "-H", "a:2,b:2", "my train.py", "--lr", "0.1", cwd=tmp_path, env=SLURM_JOB)
    assert proc.stdout.splitlines()[-1].split()[1:] == ["-np", "3", "-H", "a:2,b:2", PY, "'my", "train.py'", "--lr",
                                                        "0.1"]
    proc = launch("--dry-run", "tabular", cwd=tmp_path, env={**SLURM_JOB, "SLURM_TASKS_PER_NODE": "2(x2)"})
    assert proc.returncode == 2
    assert ("kfast launch: Slurm job 5: SLURM_TASKS_PER_NODE='2(x2)' gives 2 node(s), but the node list "
            "'gpu[01-02,07]' has 3; pass -H host:slots,... to kfast launch instead.") in proc.stderr


@pytest.mark.timeout(300)
def test_a_host_file_and_the_np_it_implies(tmp_path):
    (tmp_path / "hostfile").write_text("# the MPI Operator's form\nworker-0 slots=2\nworker-1 slots=2\n")
    proc = launch("--dry-run", "--hostfile", "hostfile", "tabular", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "kfast launch: host file hostfile: worker-0:2,worker-1:2 (4 slot(s))"
    assert proc.stdout.splitlines()[1].split()[1:5] == ["-np", "4", "-H", "worker-0:2,worker-1:2"]
    (tmp_path / "bad").write_text("worker-0 slots=two\n")
    proc = launch("--dry-run", "--hostfile", "bad", "tabular", cwd=tmp_path)
    assert proc.returncode == 2 and "bad, line 1: 'worker-0 slots=two' is not a host line" in proc.stderr
    proc = launch("--dry-run", "tabular", cwd=tmp_path)  # no hosts, no -np, no Slurm
    assert proc.returncode == 2
    assert "-np is missing: give it, or hosts with -H, --hostfile or a Slurm allocation" in proc.stderr
    # An empty -H (an unset shell variable, `-H "$HOSTS"`) is an error, not a run on this machine.
    proc = launch("-np", "2", "-H", "", "--dry-run", "tabular", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "-H '' names no host; expected host:slots[,host:slots...]" in proc.stderr


@pytest.mark.timeout(300)
def test_print_sbatch_writes_a_script_sbatch_reads(tmp_path):
    proc = launch("--print-sbatch", "--nodes", "4", "--ntasks-per-node", "2", "--gpus-per-node", "2", "tabular",
                  "--save-freq", "500", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --signal=B:USR1@120" in proc.stdout
    assert proc.stdout.splitlines()[-1] == f"exec {PY} -m kfast.cli launch tabular --save-freq 500 --resume"
    proc = launch("--print-sbatch", "--nodes", "0", "tabular", cwd=tmp_path)
    assert proc.returncode == 2 and "--nodes 0" in proc.stderr


def _readme_launch_lines():
    """The `kfast launch ...` lines of README's recipe block, without comments and redirections."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as f:
        readme = f.read()
    block = readme.split("**3. A recipe.**", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#")[0].split(">")[0].split() for line in block.splitlines() if line.startswith("kfast launch")]


@pytest.mark.timeout(300)
def test_readme_recipe_launch_lines_give_the_commands_they_promise(tmp_path):
    lines = _readme_launch_lines()
    assert len(lines) == 3, lines
    for words in lines:
        if "--print-sbatch" in words:
            proc = launch(*words[2:], cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
            assert "#SBATCH --nodes=2" in proc.stdout and "#SBATCH --requeue" in proc.stdout, proc.stdout
            assert proc.stdout.splitlines()[-1].endswith(
                "launch image-classification --data /shared/my_images --resume"), proc.stdout
        else:
            proc = launch("--dry-run", *words[2:], cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
            horovodrun = proc.stdout.splitlines()[-1].split()
            np_, rest = words[words.index("-np") + 1], words[words.index("image-classification"):]
            assert horovodrun[1:3] == ["-np", np_] and horovodrun[-len(rest):] == rest, proc.stdout


@pytest.mark.timeout(300)
def test_keras_on_jax_launches_jax_processes(tmp_path):
    starter = [PY, "-m", "kfast.cluster.jax_processes", "-np", "2", "--", PY, "train.py", "--lr", "0.1"]
    for how in ({"KERAS_BACKEND": "jax"}, {"KERAS_HOME": str(tmp_path)}):  # the variable, or Keras's config file
        (tmp_path / "keras.json").write_text('{"backend": "jax"}')
        proc = launch("--dry-run", "-np", "2", "train.py", "--lr", "0.1", cwd=tmp_path,
                      env={"KERAS_BACKEND": "", **how})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == starter
    # Hosts: the starter lays the processes over them (tests/multihost/test_jax_hosts.py runs it).
    proc = launch("--dry-run", "--engine", "jax", "-H", "a:2,b:2", "train.py", "--lr", "0.1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [*starter[:4], "4", "-H", "a:2,b:2", "--chdir", str(tmp_path), *starter[5:]]
    # Horovod stays the engine of Keras on TensorFlow.
    proc = launch("--dry-run", "--engine", "horovod", "-np", "2", "train.py", cwd=tmp_path, env={"KERAS_BACKEND": "jax"})
    assert proc.stdout.split()[1:4] == ["-np", "2", "-H"]
    for hosts, error in [("a:1,b:1,c", "-H 'a:1,b:1,c' is not a host list; expected host:slots[,host:slots...]"),
                         ("localhost:1,b:1", "name this host as the others know it"),
                         ("a:1", "-H a:1 offers 1 slot(s) for -np 2; add hosts or slots.")]:
        proc = launch("--dry-run", "--engine", "jax", "-np", "2", "-H", hosts, "train.py", cwd=tmp_path)
        assert proc.returncode == 2 and f"kfast launch: " in proc.stderr and error in proc.stderr, proc.stderr
    proc = launch("--dry-run", "--engine", "jax", "--elastic", "-np", "2", "train.py", cwd=tmp_path)
    assert proc.returncode == 2 and "--elastic needs the Horovod engine" in proc.stderr
