"""The harness itself: hosts apart from this machine, and nothing left behind by a run that was killed."""

import os
import subprocess
import sys
import time

import pytest

import harness

KILLED_RUN = '''
import sys
sys.path.insert(0, {here!r})
import harness
c = harness.Cluster(["hostA", "hostB"]).start()
c.popen("hostA", ["ssh", "hostB", "exec -a kfmh-leftover sleep 300"])
print(c.base, flush=True)
sys.stdin.read()
'''


def _pids_named(name):
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[0] == name.encode():
                    out.append(int(pid))
        except OSError:
            pass
    return out


def test_hosts_have_their_own_names_and_addresses_and_nothing_listens_here(cluster):
    for name, address in cluster.address.items():
        proc = cluster.run("hostA", ["ssh", name, "hostname; hostname -i; ls /mnt/kfmh"], timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [name, address, "work"]
        assert address.startswith("127.0.100.")
    # This machine's own network namespace has no interface or address of the harness.
    links = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout
    assert "127.0.100." not in links and "v-host" not in links


@pytest.mark.timeout(120)
def test_a_killed_run_is_cleaned_up_by_the_next(tmp_path):
    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN.format(here=os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        base = run.stdout.readline().strip()
        assert base.startswith(os.path.join("/tmp", harness.PREFIX)), base
        deadline = time.monotonic() + 30
        while not _pids_named("kfmh-leftover") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _pids_named("kfmh-leftover")
    finally:
        run.kill()  # no teardown, no atexit: as if the test process was killed
        run.wait(timeout=10)
        run.stdin.close()
        run.stdout.close()
    assert os.path.isdir(base) and _pids_named("kfmh-leftover")  # the session on hostB outlived its owner

    harness.clean_leftovers()
    assert not os.path.exists(base)
    assert not _pids_named("kfmh-leftover")
