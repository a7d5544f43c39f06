"""Hosts and slots from Slurm's variables and from host files (kfast.cluster); the real Slurm runs in
tests/multihost/test_slurm.py."""

import pytest

from kfast import cluster
from kfast.cluster import batch_script, expand_counts, expand_nodelist, read_hostfile


@pytest.mark.parametrize("nodelist, hosts", [
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("node7", ["node7"]),
    ("a[8-10],b", ["a8", "a9", "a10", "b"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("rack[1-2]-gpu[1,3]", ["rack1-gpu1", "rack1-gpu3", "rack2-gpu1", "rack2-gpu3"]),
    ("gpu[01-02].ib,cpu-x[3]", ["gpu01.ib", "gpu02.ib", "cpu-x3"]),
])
def test_node_lists_expand_as_slurm_expands_them(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist, says", [
    ("gpu[01-04", "'gpu[01-04' has 'gpu[01-04', which is not a host name"),
    ("gpu[4-1]", "the range '4-1', which runs backwards; write [1-4]"),
    ("gpu[a-b]", "has 'a-b' inside brackets"),
    ("a,,b", "has '', which is not a host name"),
    ("gpu[1-99999999]", "over 1000000 hosts"),
    ("  ", "the node list is empty"),
])
def test_a_bad_node_list_is_quoted_with_the_expected_form(nodelist, says):
    with pytest.raises(ValueError, match="expected|write|over|empty") as e:
        expand_nodelist(nodelist)
    assert says in str(e.value)


def test_count_lists_expand_repeats():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    assert expand_counts("1,3(x2)") == [1, 3, 3]
    with pytest.raises(ValueError, match=r"'2\(3\)'.*expected Slurm's form, e.g. 2\(x3\),1"):
        expand_counts("2(3)")


def _job(**variables):
    return {"SLURM_JOB_ID": "42", **variables}


def test_an_allocation_gives_each_node_its_tasks():
    found = cluster.allocation(_job(SLURM_JOB_NODELIST="gpu[01-04,07]", SLURM_NTASKS="9",
                                    SLURM_TASKS_PER_NODE="2(x4),1"))
    assert found.host_list == "gpu01:2,gpu02:2,gpu03:2,gpu04:2,gpu07:1"
    assert found.np == 9 and found.source == "Slurm job 42"


def test_gpus_per_node_give_the_slots_when_no_task_count_was_asked_for():
    env = _job(SLURM_JOB_NODELIST="g[1-2]", SLURM_TASKS_PER_NODE="1(x2)", SLURM_GPUS_PER_NODE="a100:4")
    assert cluster.allocation(env).host_list == "g1:4,g2:4"
    # Tasks asked for win: one rank per task.
    env.update(SLURM_NTASKS_PER_NODE="2", SLURM_TASKS_PER_NODE="2(x2)")
    assert cluster.allocation(env).host_list == "g1:2,g2:2"
    # Nothing asked for: one per node, as Slurm lays out.
    assert cluster.allocation(_job(SLURM_NODELIST="c[1-3]")).host_list == "c1:1,c2:1,c3:1"


def test_outside_slurm_there_is_no_allocation():
    assert cluster.allocation({}) is None
    assert cluster.allocation({"SLURM_JOB_NODELIST": "a[1-2]"}) is None  # no job id: a stale variable
    assert not cluster.in_allocation({"SLURM_JOB_ID": "3"})


def test_counts_that_do_not_fit_the_node_list_say_both():
    with pytest.raises(ValueError, match=r"Slurm job 42: SLURM_TASKS_PER_NODE='2\(x2\)' gives 2 node\(s\), but the "
                                         r"node list 'a\[1-3\]' has 3; pass -H"):
        cluster.allocation(_job(SLURM_JOB_NODELIST="a[1-3]", SLURM_NTASKS="4", SLURM_TASKS_PER_NODE="2(x2)"))


def test_host_files_in_the_mpi_operators_and_mpich_forms(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# /etc/mpi/hostfile\nmpijob-worker-0.mpijob-worker.default.svc slots=4\n\n"
                    "mpijob-worker-1.mpijob-worker.default.svc   slots=4 max_slots=4  # the second pod\n"
                    "login:2\nlone\nlogin:1\n")
    found = read_hostfile(str(path))
    assert found.host_list == ("mpijob-worker-0.mpijob-worker.default.svc:4,"
                               "mpijob-worker-1.mpijob-worker.default.svc:4,login:3,lone:1")
    assert found.np == 12


@pytest.mark.parametrize("text, says", [
    ("a slots=2\nb slots=x\n", "line 2: 'b slots=x' is not a host line; expected `host slots=N`"),
    ("a slots=0\n", "line 1: 'a slots=0' offers no slot"),
    ("# nothing\n\n", "names no host"),
])
def test_a_bad_host_file_names_the_line(tmp_path, text, says):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        read_hostfile(str(path))
    assert says in str(e.value) and str(path) in str(e.value)
    with pytest.raises(ValueError, match="cannot read the host file"):
        read_hostfile(str(tmp_path / "missing"))


def test_the_batch_script_keeps_the_lines_that_make_requeue_work():
    text = batch_script("tabular", ["--save-freq", "500"], nodes=4, ntasks_per_node=2, gpus_per_node=2,
                        time="2:00:00", signal_lead=90, python="/venv/bin/python")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for option in ("--nodes=4", "--ntasks-per-node=2", "--gpus-per-node=2", "--time=2:00:00", "--requeue",
                   "--signal=B:USR1@90", "--open-mode=append"):
        assert any(line.startswith(f"#SBATCH {option}") for line in lines), option
    assert lines[-1] == "exec /venv/bin/python -m kfast.cli launch tabular --save-freq 500 --resume"
    script = batch_script("my train.py", ["--lr", "0.1"], python="py")
    assert script.splitlines()[-1] == "exec py -m kfast.cli launch 'my train.py' --lr 0.1"
    assert "gpus-per-node" not in script
    with pytest.raises(ValueError, match="--nodes 0"):
        batch_script("tabular", nodes=0)


def test_the_slurm_guide_shows_what_kfast_prints():
    import os

    from helpers import REPO, code_blocks

    with open(os.path.join(REPO, "docs", "slurm.md")) as f:
        blocks = code_blocks(f.read())
    shown = next(b["code"] for b in blocks if b["code"].startswith("#!/bin/bash"))
    assert shown == batch_script("tabular", ["--data", "/shared/train.csv", "--checkpoint-dir", "/shared/ckpt",
                                             "--save-freq", "500"], nodes=4, ntasks_per_node=4, gpus_per_node=4,
                                 python="/opt/kfast/bin/python")
    line = next(b["code"] for b in blocks if b["lang"] == "text" and "Slurm job 4242" in b["code"]).strip()
    found = cluster.allocation(_job(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu[01-04,07]", SLURM_NTASKS="18",
                                    SLURM_TASKS_PER_NODE="4(x4),2"))
    assert line == f"kfast launch: {found.source}: {found.host_list} ({found.np} slot(s))"


@pytest.mark.parametrize("node, expected", [(0, 2), (1, 2), (2, 1)])
def test_a_jax_process_under_srun_counts_the_tasks_of_its_own_node(monkeypatch, node, expected):
    from kfast.distributed._jax import JaxTopology

    for name in ("KFAST_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2),1")
    monkeypatch.setenv("SLURM_NODEID", str(node))
    assert JaxTopology().local_size() == expected
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "3,3,3")  # the step's own count wins over the job's
    assert JaxTopology().local_size() == 3
