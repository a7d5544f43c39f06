"""`kfast launch`'s preflight and `kfast doctor --hosts`, each check caught on a host broken that way."""

import os
import re

import keras
import pytest

import harness

WORK = f"{harness.HOST_DIR}/work"
THREE = "hostA:1,hostB:1,hostC:1"


def _problem_lines(stderr):
    return sorted(line for line in stderr.splitlines() if re.match(r"kfast launch: host[ABC]: ", line))


def _keras_version_file():
    return os.path.join(os.path.dirname(keras.__file__), "src", "version.py")


@pytest.mark.timeout(120)
def test_launch_preflight_names_an_unreachable_host_and_a_version_mismatch(fresh):
    cluster = fresh
    cluster.stop_sshd("hostB")
    real = _keras_version_file()
    with open(real) as f:
        text = f.read()
    with open(cluster.path("hostC", "version.py"), "w") as f:
        f.write(re.sub(r'__version__ = "[^"]+"', '__version__ = "3.0.0"', text))
    cluster.bind("hostC", cluster.path("hostC", "version.py"), real)
    try:
        proc = cluster.run("hostA", ["kfast", "launch", "-np", "3", "-H", THREE, "tabular"], timeout=100)
    finally:
        cluster.unbind("hostC", real)

    lines = _problem_lines(proc.stderr)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("kfast launch: hostB: is not reachable over ssh (ssh: connect to host hostb port 22: "
                               "Connection refused); fix: make `ssh hostB true` work from this host without a "
                               "password prompt"), lines[0]
    assert lines[1] == (f"kfast launch: hostC: has Keras 3.0.0, but this host (hostA) has {keras.__version__}; fix: "
                        "install the same versions on every host (the same environment at the same path: `make "
                        "setup`, or `pip install -c constraints.txt -e .[cpu]` and `bash scripts/install_horovod.sh`).")
    assert "2 problem(s) found, so horovodrun was not started" in proc.stderr
    assert "[0]<" not in proc.stdout + proc.stderr  # no rank ever started


@pytest.mark.timeout(120)
def test_doctor_hosts_names_a_missing_directory_and_a_loopback_hostname(fresh):
    cluster = fresh
    only_here = f"{WORK}/only-on-a-and-c"
    for name in ("hostA", "hostC"):
        os.makedirs(cluster.path(name, "work", "only-on-a-and-c"))
    loopback = cluster.write_hosts_file("loopback-hostC", "127.0.1.1 hostC\n127.0.100.1 hostA\n127.0.100.2 hostB\n")
    cluster.bind("hostC", loopback, "/etc/hosts")
    proc = cluster.run("hostA", ["kfast", "doctor", "--hosts", "hostA,hostB,hostC"], cwd=only_here, timeout=100)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = re.findall(r"\[error\] (.*)\n +fix: (.*)", proc.stdout)
    assert [e[0].split(":")[0] for e in errors] == ["hostB", "hostC"], proc.stdout
    (b, b_fix), (c, c_fix) = errors
    assert b.startswith(f"hostB: the working directory {only_here} does not exist there"), b
    assert b_fix == f"create {only_here} on hostB with the same files, or pass --chdir DIR with a directory every host has"
    assert c.startswith("hostC: its own hostname 'hostC' resolves to 127.0.1.1, a loopback address"), c
    assert "connect [127.0.0.1]:N: Connection refused" in c
    assert c_fix == "map hostC to its network address (127.0.100.3 on eth0) in /etc/hosts on hostC instead"
    assert "  hostA: kfast 0.1.0, Keras " in proc.stdout and "hostname hostA -> 127.0.100.1; interfaces eth0" in proc.stdout
    assert "Gloo will use eth0, the one network interface every host has." in proc.stdout


@pytest.mark.timeout(150)
def test_loopback_hostname_is_caught_and_without_preflight_gloo_aborts(fresh):
    cluster = fresh
    os.makedirs(cluster.path("hostA", "work", "only-on-a"))
    loopback = cluster.write_hosts_file("loopback-hostB", "127.0.1.1 hostB\n127.0.100.1 hostA\n127.0.100.3 hostC\n")
    cluster.bind("hostB", loopback, "/etc/hosts")
    # From a directory hostB lacks, with --chdir to one it has: only the hostname is wrong.
    launch = ["kfast", "launch", "--chdir", WORK, "-np", "2", "-H", "hostA:1,hostB:1", "tabular", "--epochs", "1",
              "--samples", "256", "--workers", "1"]
    checked = cluster.run("hostA", launch, cwd=f"{WORK}/only-on-a", timeout=100)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    lines = _problem_lines(checked.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        "kfast launch: hostB: its own hostname 'hostB' resolves to 127.0.1.1, a loopback address"), checked.stderr

    unchecked = cluster.run("hostA", [*launch[:2], "--no-preflight", *launch[2:]], cwd=f"{WORK}/only-on-a", timeout=120)
    assert unchecked.returncode != 0
    assert "kfast launch: checking" not in unchecked.stdout
    assert re.search(r"connect \[127\.0\.1\.1\]:\d+: Connection refused", unchecked.stderr), unchecked.stderr
