"""kfast._core.signal_handling, the one owner of kfast's signal handlers: each handler once, the replaced one
chained, a user's own handler or SIG_IGN left alone, nothing done in a forked child on the parent's behalf.

Handlers belong to a whole process, so each test runs its script in a fresh interpreter."""

import ast
import os
import signal
import subprocess
import sys
import textwrap

from helpers import REPO
from test_structure import _modules
from test_structure import _read

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}


def _run(code, timeout=60):
    prelude = "import os, signal, sys, time\n"
    if "sh." in code:  # the tests that must also fail on a kfast without this module use none of it
        prelude += "from kfast._core import signal_handling as sh\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=REPO)


def test_a_catch_takes_the_signal_and_its_release_puts_the_users_handler_back():
    proc = _run("""
        def mine(signum, frame):
            print("user's handler", flush=True)
        signal.signal(signal.SIGUSR1, mine)
        import threading
        caught = []
        catch = sh.catch([signal.SIGUSR1], lambda s: caught.append((s, threading.current_thread().name)))
        signal.raise_signal(signal.SIGUSR1)
        time.sleep(0.2)  # the watch thread tells the catcher too, even when the main thread cannot
        print("caught", set(caught) == {(signal.SIGUSR1, "MainThread"), (signal.SIGUSR1, "kfast-signal-watch")},
              flush=True)
        catch.release()
        print("restored", signal.getsignal(signal.SIGUSR1) is mine, flush=True)
        signal.raise_signal(signal.SIGUSR1)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["caught True", "restored True", "user's handler"], proc.stdout


def test_the_loaders_clean_up_runs_before_sigterm_ends_the_process_as_it_would_have():
    proc = _run("""
        sh.on_termination(lambda: print("cleaned", flush=True))
        sh.on_termination(lambda: print("cleaned", flush=True))  # another function: both run, once each
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("not reached", flush=True)
    """)
    assert proc.returncode == -signal.SIGTERM, proc.stderr  # died of the signal: 143 in a shell
    assert proc.stdout.splitlines() == ["ready", "cleaned", "cleaned"]


def test_a_users_own_handler_or_sig_ign_is_left_alone():
    proc = _run("""
        def mine(signum, frame):
            print("user's handler", flush=True)
        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        sh.watch()
        sh.on_termination(lambda: print("cleaned", flush=True))
        print(signal.getsignal(signal.SIGTERM) is mine, signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, flush=True)
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        # A handler installed after kfast's is in charge from then on.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sh.on_termination(print)
        signal.signal(signal.SIGTERM, mine)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("alive", sh.termination(0) is None, flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["True True", "user's handler", "user's handler", "alive True"]


def test_a_caught_sigterm_is_only_noted_and_after_the_release_the_clean_up_and_the_end_come_back():
    proc = _run("""
        sh.on_termination(lambda: print("cleaned", flush=True))
        caught = []
        catch = sh.catch([signal.SIGTERM], caught.append)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        print("caught", set(caught) == {signal.SIGTERM}, flush=True)  # told once or twice (watch and handler)
        print("alive, and the waiting loader leaves it to the catcher:", sh.termination(0), flush=True)
        catch.release()
        print("the loaders still need the handler:", signal.getsignal(signal.SIGTERM) is sh._handle, flush=True)
        print("now the waiting loader would end it:", sh.termination(0) == signal.SIGTERM, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    """)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert proc.stdout.splitlines() == [
        "caught True", "alive, and the waiting loader leaves it to the catcher: None",
        "the loaders still need the handler: True", "now the waiting loader would end it: True", "cleaned"]


def test_the_last_release_puts_the_default_back_when_nothing_else_needs_the_handler():
    proc = _run("""
        first = sh.catch([signal.SIGUSR2], print)
        second = sh.catch([signal.SIGUSR2], print)
        first.release()
        print(signal.getsignal(signal.SIGUSR2) is sh._handle, flush=True)
        second.release()
        second.release()
        print(signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL, flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["True", "True"]


def test_a_forked_child_stopped_by_sigterm_dies_of_it_leaving_preemption_and_the_parents_clean_up_alone():
    # Keras's own process pool forks the training process and stops its children with SIGTERM. During a fit
    # with preemption, the child inherited the catch: it must die of the signal, not note it for the parent.
    proc = _run("""
        import multiprocessing.util
        from kfast.data import FastLoader
        from kfast.distributed.preemption import PreemptionWatch
        loader = FastLoader([[1], [2]], workers=1)
        print(list(loader), flush=True)
        watch = PreemptionWatch((signal.SIGTERM,), 30, lambda: None, "")
        watch.start()
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child died of SIGTERM:", os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, flush=True)
        time.sleep(0.2)
        print("parent noted:", watch.requested(), flush=True)
        watch.stop(redeliver=False)
        print(list(loader), os.path.isdir(multiprocessing.util.get_temp_dir()), flush=True)
        loader.close()
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[[1], [2]]", "child died of SIGTERM: True", "parent noted: None",
                                        "[[1], [2]] True"]


def test_end_by_cleans_up_and_exits_with_128_plus_the_signal_from_any_thread():
    proc = _run("""
        import threading
        sh.on_termination(lambda: print("cleaned", flush=True))
        threading.Thread(target=sh.end_by, args=(signal.SIGTERM, "stuck")).start()
        time.sleep(5)
    """)
    assert proc.returncode == 128 + signal.SIGTERM and "SIGTERM: stuck" in proc.stderr, proc.stderr
    assert proc.stdout.splitlines() == ["cleaned"]


# Modules that set signal dispositions themselves, each with its reason. Everything else registers with
# kfast._core.signal_handling.
OWN_SIGNALS = {
    "kfast._core.signal_handling": "the owner",
    "kfast.data._workers.worker": "a loader worker process ignores Ctrl-C (the parent stops it); it imports no kfast",
}


def test_only_the_signal_owner_installs_handlers():
    setters = {"signal", "set_wakeup_fd"}
    found = set()
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(_read(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in setters
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "signal"):
                found.add(name)
    assert found == set(OWN_SIGNALS), found


def test_end_does_not_wait_for_ever_for_a_clean_up_that_is_stuck():
    proc = _run("""
        import threading
        sh._END_BOUND_S = 0.5
        sh.on_termination(threading.Event().wait)  # never returns
        sh.end(75, "ending")
    """)
    assert proc.returncode == 75 and proc.stderr.endswith("ending"), proc.stderr


def test_an_interrupt_listener_hears_every_ctrl_c_from_the_watch_thread_also_several_read_at_once():
    proc = _run("""
        import threading
        signal.signal(signal.SIGINT, lambda signum, frame: None)  # the main thread's own handler runs too
        heard = []
        def listener():
            heard.append(threading.current_thread().name)
            if len(heard) == 1:
                time.sleep(0.5)  # the next two signals arrive meanwhile: the watch reads them at once
        sh.watch()
        sh.on_interrupt(listener)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100):
            if len(heard) == 3:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        print(heard, flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(["kfast-signal-watch"] * 3), proc.stdout
