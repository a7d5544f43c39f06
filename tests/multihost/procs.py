"""Finding and stopping the harness's processes by pid: by network namespace, or by the mounts a run left.

Every process in a host's namespaces was started by the harness (through nsenter, or by that host's
sshd), so these helpers only ever signal the harness's own processes.
"""

import ctypes
import json
import os
import shutil
import signal
import tempfile
import time

PREFIX = "kfmh-"  # the harness's run directories, /tmp/kfmh-<pid>-<random>
HOST_DIR = "/mnt/kfmh"  # each host's private directory, at the same path on every host
_PR_SET_PDEATHSIG = 1


def die_with_parent():
    """A `preexec_fn`: the child gets SIGKILL when this process dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def netns_inode(pid):
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def pids_in_netns(inodes):
    """Pids of the processes whose network namespace is one of `inodes`."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and netns_inode(name) in inodes:
            out.append(int(name))
    return out


def kill_all(pids, grace_s=3.0):
    """SIGTERM, then SIGKILL what is still there after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not is_zombie(p)]
            if not pids:
                return
            time.sleep(0.05)


def is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _pids_seeing(run_dir):
    """Pids of the processes in a host of run `run_dir`: their mount table has its HOST_DIR bind mount.

    The run directory's name is unique, so this finds that run's processes and no others.
    """
    mark = f"/{os.path.basename(run_dir)}/"
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/mountinfo") as f:
                for line in f:
                    fields = line.split()
                    if fields[4] == HOST_DIR and mark in fields[3] + "/":
                        out.append(int(name))
                        break
        except (OSError, IndexError):
            pass
    return out


def clean_leftovers():
    """Kills what killed earlier runs left on their hosts and removes their directories.

    A run is over when the process recorded as its owner is gone (or its pid now names another process).
    """
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        base = os.path.join(tmp, name)
        if not name.startswith(PREFIX) or not os.path.isdir(base):
            continue
        try:
            with open(os.path.join(base, "state.json")) as f:
                state = json.load(f)
            if start_time(state["owner"]) == state["owner_start"]:
                continue  # its harness is still running
        except (OSError, ValueError, KeyError):
            pass
        kill_all(_pids_seeing(base))
        shutil.rmtree(base, ignore_errors=True)


def start_time(pid):
    """The start time of process `pid` (clock ticks since boot): a pid and this name one process."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])
