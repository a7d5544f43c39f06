"""Starting, stopping and reading FastLoader's worker processes, for `pool.ProcessPool`.

Who owns each process and pipe, and the order of the shutdown, is the NOTE at the top of `pool`: this
module is its machinery. It starts one worker from the fork server with its pipes (`start`), stops them
all (`shutdown`, the pool's finalizer), and reads a stuck worker's Python stack (`read_stack`).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle

from kfast.data._workers import messages
from kfast.data._workers import server_env
from kfast.data._workers import sweep
from kfast.data._workers import worker
from kfast.data.sharding import ShardedDataset

# Workers never fork from the training process: forking a parent whose TensorFlow (or JAX) runtime
# already started threads can deadlock the child. They fork from a fork server instead, a fresh
# interpreter that imported the worker loop and the dataset's module once (importing a module that
# imports Keras costs seconds per worker otherwise), and that never runs framework ops.
START_METHOD = "forkserver"


def dumps(dataset: Any) -> bytes:
    """Pickles `dataset` for the workers. Classes that cannot be imported by name (defined in `__main__`,
    a notebook cell or stdin) travel by value (cloudpickle), so any dataset works in worker processes."""
    return cloudpickle.dumps(dataset, protocol=5)


def context(dataset: Any) -> Any:
    """The fork server's multiprocessing context, preloading the worker loop and `dataset`'s module."""
    ctx = multiprocessing.get_context(START_METHOD)
    # A shard's wrapped dataset is imported too (FastLoader shards every dataset under Horovod).
    parts = [dataset, dataset.dataset] if isinstance(dataset, ShardedDataset) else [dataset]
    modules = [type(part).__module__ for part in parts]
    preload = ["kfast.data._workers.server_path", "kfast.data._workers.janitor", "kfast.data._workers.worker"] + [
        module for module in dict.fromkeys(modules) if module not in ("__main__", "builtins")]
    # Only the first call before the server starts takes effect; later datasets import in the child.
    ctx.set_forkserver_preload(preload)
    return ctx


# The fork server listens on a Unix socket, `<temp dir>/listener-XXXXXXXX`, and Linux holds a socket's path in
# 108 bytes, its NUL included; a longer one fails deep inside multiprocessing with "AF_UNIX path too long".
_SOCKET_PATH_MAX = 107
_LISTENER_NAME = len("/listener-") + 8


def _check_socket_room(temp_dir: str) -> None:
    longest = len(temp_dir) + _LISTENER_NAME
    if longest > _SOCKET_PATH_MAX:
        base = os.path.dirname(temp_dir)
        raise OSError(
            f"FastLoader(use_multiprocessing=True) starts its workers from multiprocessing's fork server, which "
            f"listens on a Unix socket in {temp_dir}; that socket's path would be {longest} characters, and Linux "
            f"allows {_SOCKET_PATH_MAX}. The directory comes from TMPDIR ({base}, {len(base)} characters): set "
            f"TMPDIR to a directory of at most {_SOCKET_PATH_MAX - _LISTENER_NAME - len(temp_dir) + len(base)} "
            "characters (TMPDIR=/tmp), or pass use_multiprocessing=False to use threads.")


@contextlib.contextmanager
def _server_environment() -> Iterator[None]:
    """Tells a fork server started meanwhile what its preloads need: the temporary directory to remove when
    it exits (see the NOTE in `pool`) and this process's sys.path (see _server_path).

    Set only while processes start: other programs this process runs later must not inherit them (a
    Python child that imported `kfast.data._workers.server_path` would take on this process's path).
    """
    temp_dir = multiprocessing.util.get_temp_dir()
    _check_socket_room(temp_dir)
    sweep.mark(temp_dir)  # so that a later loader can remove it if this whole process group is killed
    values = {server_env.TEMP_DIR_VARIABLE: temp_dir, server_env.PATH_VARIABLE: json.dumps(sys.path)}
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Starts processes that do not run the training script again.

    multiprocessing makes each child import the parent's `__main__` (so that classes defined there
    unpickle). A script without an `if __name__ == "__main__":` guard then runs again in every worker;
    under horovodrun that means a second `hvd.init()` in the worker, which aborts it. Datasets travel by
    value when their class lives in `__main__`, so workers never need the script: it is hidden while they
    start.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, Any] = {key: main.__dict__[key] for key in ("__file__", "__spec__") if key in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)


def start(ctx: Any, i: int, lifeline_read: Any, payload: bytes, ring: messages.NewRing, seed: int
          ) -> tuple[Any, Any, Any]:
    """Starts worker `i`; returns `(process, conn, stack_read)`: the process, the training process's end of
    its duplex pipe, and the read end of the pipe its stack dumps arrive on."""
    parent_end, child_end = ctx.Pipe(duplex=True)
    stack_read, stack_write = ctx.Pipe(duplex=False)
    p = ctx.Process(target=worker.run, name=f"kfast-loader-{i}", daemon=True,
                    args=(child_end, lifeline_read, stack_write, payload, ring, seed, i))
    with _main_hidden(), _server_environment():
        p.start()
    child_end.close()  # so a dead worker reads as EOF here, not as silence
    stack_write.close()
    return p, parent_end, stack_read


def shutdown(processes: list[Any], conns: list[Any], state: dict[str, Any]) -> None:
    """Stops the workers and frees what the pool holds, in the NOTE's order (the pool's finalizer)."""
    if "selector" in state:
        state.pop("selector").close()
    for conn in conns:
        try:
            conn.send(messages.Stop())
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 1.0
    for p in processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join(timeout=2)
    for conn in conns + state["stacks"]:
        conn.close()
    if "lifeline" in state:
        state.pop("lifeline").close()
    for ring in state["rings"]:
        ring.release()
    state["rings"].clear()


def read_stack(pid: int, stack_conn: Any, wait_s: float = 1.0) -> str:
    """The Python stack of worker `pid` (faulthandler's dump on SIGUSR1), or a note why there is none."""
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as e:
        return f"(no stack: {e})"
    chunks, deadline = [], time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if stack_conn.poll(0.05):
            chunks.append(os.read(stack_conn.fileno(), 65536))
        elif chunks:
            break
    text = b"".join(chunks).decode(errors="replace").strip()
    return text or "(no stack arrived)"
