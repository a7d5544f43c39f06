"""kfast's one owner of process signals: every handler kfast installs is installed here, once per signal,
chaining the disposition it replaced, and each feature registers what it needs.

- The loaders free their shared memory and the fork server's directory before SIGTERM or SIGHUP ends the
  process (`on_termination`, from `kfast.data._workers.signals`).
- The Ctrl-C watch notes each signal as it arrives, even while the main thread is stuck in the framework,
  and tells who asked of each Ctrl-C (`watch`, `interrupted`, `termination`, `on_interrupt`, from
  `kfast.data._workers.interrupt`).
- Preemption catches its signals during `fit` and starts its timer as one arrives (`catch`, from
  `kfast.distributed.preemption`).
- `kfast launch` passes SIGINT, SIGTERM and SIGHUP on to horovodrun while it waits, and answers a scheduler's
  stop signal itself (`catch`, from `kfast.cluster.filtered_run`).

NOTE [ One handler per signal ]
- kfast's handler is `_handle`, one function for every signal it takes; `_previous` holds, per signal, the
  disposition it replaced. Installing again while `_handle` is in place changes nothing, so handlers never
  stack; a handler the user installs later replaces kfast's and is left in charge.
- What a signal does, in this order. In a process other than the owner (a forked child: Keras's process
  pool, which Keras stops with SIGTERM), what the replaced disposition does. Else, with catchers for it
  (preemption during `fit`), they are told and nothing else happens. Else, for SIGTERM and SIGHUP that
  replaced the default, with clean-ups registered: the clean-ups run and the process dies of the same
  signal (143 in a shell for SIGTERM). Else the replaced disposition: a callable is called, SIG_IGN
  ignores, SIG_DFL acts as the default.
- The loaders take SIGTERM and SIGHUP only where they have the default disposition: a handler of the
  user's own, or SIG_IGN (`nohup`), is left alone. A catcher takes its signals whatever they had; once no
  feature needs kfast's handler for a signal, the replaced disposition is put back.
- Python runs handlers in the main thread between bytecodes, so a main thread stuck in a framework op runs
  none. Python also writes each signal's number to its "wakeup fd" at once, from C: `watch` reads it in a
  thread, notes Ctrl-C and the first SIGTERM/SIGHUP, tells the catchers (who may so hear of one signal
  twice), and passes every byte on to whoever held the fd before (asyncio in a notebook kernel).
- Fork: a forked child forgets the parent's notes, catchers and clean-ups, stops writing to the wakeup
  socket it shares with the parent (a signal sent to the child would read as the parent's own), and owns
  nothing until a feature of its own registers.

It imports nothing of kfast: everything here runs in the main thread's handler or the watch thread.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any
from typing import NoReturn

TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

Catcher = Callable[[int], None]

_lock = threading.Lock()
_owner: int | None = None  # the pid whose features registered here; a forked child is not it
_previous: dict[int, Any] = {}  # signal -> the disposition kfast's handler replaced
_catchers: dict[int, list[Catcher]] = {}
_cleanups: list[Callable[[], None]] = []
_listeners: list[Callable[[], None]] = []  # told of each SIGINT by the watch thread
_ending = False
_watching = False
_last_interrupt = 0.0  # monotonic time of the last SIGINT the watch saw
_answered = 0.0  # monotonic time the main thread last ran the SIGINT handler (it was back in Python code)
_hears_answers = False  # SIGINT goes through `_handle`, which records the main thread's answer
_ANSWER_SLACK_S = 1.0  # the handler can run just before the watch thread notes the same signal
_termination: tuple[int, float] | None = None  # (signal, monotonic time) of the first SIGTERM or SIGHUP
_END_BOUND_S = 10.0  # the longest `end` waits for the clean-ups (the loaders' shutdown takes about a second)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _own() -> None:
    global _owner
    _owner = os.getpid()


# -- the handler --------------------------------------------------------------------------------------

def _handle(signum: int, frame: Any) -> None:
    global _answered
    if signum == signal.SIGINT:
        _answered = time.monotonic()  # Python runs handlers in the main thread, between its bytecodes
    previous = _previous.get(signum, signal.SIG_DFL)
    if os.getpid() != _owner:
        _act_as(previous, signum, frame)
        return
    catchers = list(_catchers.get(signum, ()))
    if catchers:
        for catcher in catchers:
            catcher(signum)
        return
    if _cleans_up(signum):
        ignore_terminations(only_kfast=True)  # a second signal waits for the clean-up, bounded by the loaders'
        try:
            clean_up()
        finally:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            os._exit(128 + signum)  # only reached if the signal is blocked in this thread
    _act_as(previous, signum, frame)


def _cleans_up(signum: int) -> bool:
    return signum in TERMINATING and bool(_cleanups) and _previous.get(signum) == signal.SIG_DFL


def _act_as(previous: Any, signum: int, frame: Any) -> None:
    """Does what `previous`, the disposition kfast replaced, does with `signum`."""
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:  # SIG_DFL, or None (a handler not installed from Python): the default
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
        # Still here: the default ignores the signal (SIGCHLD, SIGWINCH) or stopped and continued the process.
        signal.signal(signum, _handle)


def _install(signum: int, over_anything: bool) -> bool:
    """Puts `_handle` in place for `signum` (main thread only); with `over_anything` False, only where the
    disposition is the default. True when `_handle` is in place."""
    current = signal.getsignal(signum)
    if current is _handle:
        return True
    if not over_anything and current != signal.SIG_DFL:
        return False
    _previous[signum] = current
    signal.signal(signum, _handle)
    return True


def _release(signum: int) -> None:
    """Puts the replaced disposition back when no feature needs kfast's handler for `signum` any more."""
    if _catchers.get(signum) or _cleans_up(signum) or signum not in _previous:
        return
    if signum == signal.SIGINT and _hears_answers:
        return
    previous = _previous.pop(signum)
    if signal.getsignal(signum) is _handle:
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


# -- registration ------------------------------------------------------------------------------------

def on_termination(cleanup: Callable[[], None]) -> None:
    """Has `cleanup()` run before SIGTERM or SIGHUP ends the process, then dies of the signal as before.

    Takes each of the two signals only where its disposition is still the default, and only from the main
    thread (elsewhere `cleanup` is kept, and the signals are taken by the next call from the main thread).
    Registering the same function again changes nothing.

    Args:
        cleanup: frees what the process holds; called once, in the main thread's handler.
    """
    with _lock:
        _own()
        if cleanup not in _cleanups:
            _cleanups.append(cleanup)
        if _main_thread():
            for signum in TERMINATING:
                _install(signum, over_anything=False)


class Catch:
    """What `catch` returns: `release()` ends the catch (a second call does nothing)."""

    def __init__(self, signums: tuple[int, ...], catcher: Catcher) -> None:
        self.signums, self.catcher = signums, catcher

    def release(self) -> None:
        with _lock:
            for signum in self.signums:
                catchers = _catchers.get(signum, [])
                if self.catcher in catchers:
                    catchers.remove(self.catcher)
                if _main_thread():
                    _release(signum)


def catch(signums: Iterable[int], catcher: Catcher) -> Catch | None:
    """Calls `catcher(signum)` when one of `signums` arrives, instead of what the signal did, until released.

    The catcher is told as soon as the signal arrives, from the watch thread (even while the main thread is
    stuck in the framework), and again from the handler in the main thread: it must take a second call for
    the same signal as a no-op. After `release()` the signals mean what they meant before.

    Args:
        signums: the signals to catch (not SIGKILL or SIGSTOP).
        catcher: called with the signal's number, from the watch thread or the main thread.

    Returns:
        The `Catch` to release, or `None` outside the main thread, where no handler can be installed.
    """
    if not _main_thread():
        return None
    watch()
    signums = tuple(dict.fromkeys(signums))
    with _lock:
        _own()
        for signum in signums:
            _install(signum, over_anything=True)
            _catchers.setdefault(signum, []).append(catcher)
    return Catch(signums, catcher)


def on_interrupt(listener: Callable[[], None]) -> None:
    """Calls `listener()` from the watch thread each time Ctrl-C (SIGINT) arrives; the signal keeps doing what
    it did (KeyboardInterrupt in the main thread). Registering the same function again changes nothing.

    Args:
        listener: called with no arguments, outside the main thread; it must return promptly.
    """
    with _lock:
        _own()
        if listener not in _listeners:
            _listeners.append(listener)


def hear_answers() -> None:
    """Has SIGINT pass through kfast's handler (which then does what the previous disposition did), so that
    `answered` can tell whether the main thread got back to Python code after a Ctrl-C. Main thread only;
    elsewhere it does nothing."""
    global _hears_answers
    if not _main_thread():
        return
    with _lock:
        _own()
        if _install(signal.SIGINT, over_anything=True):
            _hears_answers = True


def hears_answers() -> bool:
    """Whether SIGINT still passes through kfast's handler (a handler installed after it takes Ctrl-C over, and
    `answered` then cannot tell)."""
    return _hears_answers and signal.getsignal(signal.SIGINT) is _handle


def answered(arrived: float) -> bool:
    """True when the main thread ran the SIGINT handler for a Ctrl-C the watch noted at monotonic `arrived` (or
    later): it was back in Python code, not stuck inside the framework."""
    return _answered >= arrived - _ANSWER_SLACK_S


def last_interrupt() -> float:
    """Monotonic time of the last Ctrl-C the watch thread noted (0.0 for none)."""
    return _last_interrupt


def ignore_terminations(only_kfast: bool = False) -> None:
    """Ignores SIGTERM and SIGHUP from now on (with `only_kfast`, where kfast's handler had them): the process
    is ending on its own terms, and a signal now (horovodrun's, when a peer exits) must not change how."""
    for signum in TERMINATING:
        if not only_kfast or signal.getsignal(signum) is _handle:
            signal.signal(signum, signal.SIG_IGN)


# -- ending the process ------------------------------------------------------------------------------

def clean_up() -> None:
    """Runs every registered clean-up once, the newest last (the process is ending)."""
    global _ending
    _ending = True
    while _cleanups:
        cleanup = _cleanups.pop(0)
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - the process is going; free what can be freed
            pass


def ending() -> bool:
    """True once `clean_up` began: the process is ending, and what its clean-ups close under a waiting
    thread's feet must not turn into an error of its own (it would race the exit with another status)."""
    return _ending


def end(status: int, message: str, last: Callable[[], object] | None = None) -> NoReturn:
    """Writes `message` to stderr, runs the clean-ups, then `last` (when given), and ends the process at once
    with `status`: no unwinding through the framework, whatever thread this runs in. A clean-up or `last`
    still running after `_END_BOUND_S` seconds (stuck on something another thread holds, a peer that never
    comes) is abandoned: the process ends anyway."""
    watchdog = threading.Timer(_END_BOUND_S, os._exit, (status,))
    watchdog.daemon = True
    watchdog.start()
    try:
        sys.stderr.write(message)
        sys.stderr.flush()
        clean_up()
        if last is not None:
            last()
    finally:
        try:
            sys.stdout.flush()
        finally:
            os._exit(status)


def end_by(signum: int, message: str) -> NoReturn:
    """Ends the process as `signum` would have, with kfast's clean-ups: status 128 + `signum`, as a shell
    reports a death by that signal, and `message` on stderr after the signal's name."""
    end(128 + signum, f"\n{signal.Signals(signum).name}: {message}\n")


# -- the watch ---------------------------------------------------------------------------------------

def watch() -> bool:
    """Starts the watch of arriving signals (once, from the main thread only; elsewhere it does nothing).

    Returns:
        Whether the watch runs.
    """
    global _watching
    with _lock:
        if _watching or not _main_thread():
            return _watching
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            before = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            reader.close()
            writer.close()
            return False
        threading.Thread(target=_watch, args=(reader, writer, before), name="kfast-signal-watch",
                         daemon=True).start()
        _watching = True
        return True


def _watch(reader: socket.socket, writer: socket.socket, before: int) -> None:
    global _last_interrupt, _termination
    while True:
        try:
            data = reader.recv(256)
        except OSError:
            return
        if not data:
            return
        interrupts = data.count(signal.SIGINT)  # one read can hold several
        if interrupts:
            _last_interrupt = time.monotonic()
        for _ in range(interrupts):
            for listener in list(_listeners):
                try:
                    listener()
                except Exception:  # noqa: BLE001 - a listener's failure must not stop the watch
                    pass
        arrived = [s for s in data if s in TERMINATING]
        if arrived and _termination is None:
            _termination = (arrived[0], time.monotonic())
        for signum in data:
            for catcher in list(_catchers.get(signum, ())):
                try:
                    catcher(signum)
                except Exception:  # noqa: BLE001 - a catcher's failure must not stop the watch
                    pass
        if before != -1:
            try:
                os.write(before, data)
            except OSError:
                pass


def interrupted(after: float, grace: float) -> bool:
    """True when Ctrl-C (SIGINT) arrived after monotonic time `after`, at least `grace` seconds ago."""
    return _last_interrupt > after and time.monotonic() - _last_interrupt >= grace


def termination(grace: float) -> int | None:
    """The SIGTERM or SIGHUP that arrived at least `grace` seconds ago and that kfast's handler will answer
    by cleaning up and ending the process, or None. A signal a catcher or a handler of the user's own
    answers does not count: they decide for themselves."""
    noted = _termination
    if noted is None or time.monotonic() - noted[1] < grace:
        return None
    signum = noted[0]
    handled = (os.getpid() == _owner and signal.getsignal(signum) is _handle and not _catchers.get(signum)
               and _cleans_up(signum))
    return signum if handled else None


def _forget_in_child() -> None:
    global _lock, _owner, _ending, _watching, _last_interrupt, _termination
    _lock = threading.Lock()  # another thread may have held it at the fork
    _owner, _ending, _watching, _last_interrupt, _termination = None, False, False, 0.0, None
    _catchers.clear()
    _cleanups.clear()
    _listeners.clear()
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass  # Python has no wakeup fd outside the main thread


os.register_at_fork(after_in_child=_forget_in_child)
