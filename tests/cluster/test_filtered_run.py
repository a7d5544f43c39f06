"""kfast.cluster.filtered_run: the launcher's command runs with TensorFlow's start-up lines dropped from its
stderr, each stop signal reaches it once, through kfast's one signal owner, and the signals mean what they
meant before once it ended. Real processes and real signals; no horovodrun."""

import os
import signal
import subprocess
import sys
import textwrap

from helpers import REPO

NOISE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"

# The command: counts the SIGINTs it receives, says it is ready, and after the first one waits a second for a
# second copy before it reports the count.
CHILD = textwrap.dedent(f"""
    import signal, sys, time
    got = []
    signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    print({NOISE!r}, file=sys.stderr, flush=True)
    print("child ready", flush=True)
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    print("child saw", len(got), "SIGINT", flush=True)
    print("a real warning", file=sys.stderr, flush=True)
    sys.exit(3)
""")

LAUNCHER = textwrap.dedent("""
    import signal, sys
    from kfast.cluster import filtered_run
    before = signal.getsignal(signal.SIGINT)
    code = filtered_run.run([sys.executable, "-c", sys.argv[1]])
    print("status", code, "restored", signal.getsignal(signal.SIGINT) is before, flush=True)
""")


def _run_and_signal(launcher, child, signum, timeout):
    """Starts `launcher` (which runs `child` through filtered_run), sends it `signum` once the child is ready,
    and returns (status, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, "-c", launcher, child], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    try:
        assert proc.stdout.readline() == "child ready\n"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def test_a_ctrl_c_reaches_the_command_once_and_start_up_lines_are_dropped():
    status, out, err = _run_and_signal(LAUNCHER, CHILD, signal.SIGINT, 60)
    assert status == 0, err
    assert out.splitlines() == ["child saw 1 SIGINT", "status 3 restored True"], (out, err)
    assert NOISE not in err and "a real warning" in err, err


def test_a_command_that_ignores_the_stop_is_killed_after_the_grace_period():
    launcher = textwrap.dedent("""
        import sys
        from kfast.cluster import filtered_run
        code = filtered_run.run([sys.executable, "-c", sys.argv[1]], stop_grace_s=1)
        print("status", code, flush=True)
    """)
    child = textwrap.dedent("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("child ready", flush=True)
        time.sleep(60)
    """)
    _, out, err = _run_and_signal(launcher, child, signal.SIGTERM, 30)
    assert out.splitlines() == ["status 137"], (out, err)


def test_a_signal_to_the_whole_group_reaches_the_command_again_only_after_its_handler_ended():
    # Slurm's scancel and a terminal's Ctrl-C signal the command as well as the launcher. horovodrun's handler
    # takes a lock that is not re-entrant (threading.Event.set), so a copy arriving while it runs deadlocks
    # it: this command's handler holds its lock for 0.3 s and notes a copy that arrives meanwhile.
    child = textwrap.dedent("""
        import signal, sys, time
        got, nested, busy = [], [], []
        def handler(signum, frame):
            if busy:
                nested.append(signum)
                return
            busy.append(1)
            time.sleep(0.3)
            got.append(signum)
            busy.clear()
        signal.signal(signal.SIGTERM, handler)
        print("child ready", flush=True)
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)
        print("child saw", len(got), "SIGTERM,", len(nested), "during its handler", flush=True)
    """)
    launcher = LAUNCHER.replace("SIGINT", "SIGTERM")
    proc = subprocess.Popen([sys.executable, "-c", launcher, child], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, start_new_session=True)
    try:
        assert proc.stdout.readline() == "child ready\n"
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher and the command at once, as scancel does
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert out.splitlines() == ["child saw 2 SIGTERM, 0 during its handler", "status 0 restored True"], (out, err)
