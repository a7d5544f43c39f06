"""Checks that the hosts of a multi-host launch can run it, before horovodrun starts anything.

`kfast launch` runs these checks when a host other than this one takes part (`--no-preflight` skips
them); `kfast doctor --hosts` runs them without launching. Each host answers one probe (`python -m
kfast.env.preflight DIR` over ssh, as horovodrun will reach it, with the same Python); every problem found
becomes one line naming the host and the fix:

- the host is reachable with password-less ssh, and has this Python at the same path;
- the working directory exists there (horovodrun runs `cd DIR`, and a rank whose directory is missing
  silently runs in the home directory instead, on other files);
- kfast, Keras, TensorFlow, Horovod and Python have the versions this host has, and Horovod the same
  build (Gloo, MPI, NCCL, CUDA);
- the host's own name resolves to an address of a network interface, not a loopback one (Debian maps it
  to 127.0.1.1): Gloo builds its device from that name, and the job then aborts in `hvd.init()` with
  `connect [127.0.0.1]:N: Connection refused`;
- a network interface name is common to all hosts; Horovod needs one, and Gloo uses it.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

PROBE_TIMEOUT_S = 90  # the probe imports TensorFlow: seconds on a busy machine
SSH_CONNECT_TIMEOUT_S = 10
_MARK = "KFAST-PREFLIGHT "  # the probe's answer line; login scripts may print other lines
# The options horovodrun itself uses, plus: never prompt, never wait long for a connection.
SSH_OPTIONS = ["-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
               "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}"]
_VERSIONS = [("kfast", "kfast"), ("keras", "Keras"), ("tensorflow", "TensorFlow"), ("horovod", "Horovod"),
             ("python", "Python")]
_JAX_VERSIONS = [("kfast", "kfast"), ("keras", "Keras"), ("jax", "JAX"), ("python", "Python")]
ENGINES = ("horovod", "jax")  # kfast launch's engines: what each host must have differs
_SAME_ENV_FIX = ("install the same versions on every host (the same environment at the same path: "
                 "`make setup`, or `pip install -c constraints.txt -e .[cpu]` and `bash scripts/install_horovod.sh`)")
_SAME_JAX_ENV_FIX = ("install the same versions on every host (the same environment at the same path: "
                     "`pip install -c constraints.txt -e .` and `pip install -c constraints.txt jax`)")
# How the checks record a problem: problem(host, text, fix).
_Problem = Callable[[str, str | None, str | None], None]


def host_names(hosts: str | None = None, hostfile: str | None = None) -> list[str]:
    """The host names of `-H host:slots,...` (a host without `:slots` too) or of a host file (`host slots=N` or
    `host:N` lines), in order, each once.

    Raises:
        ValueError: for a host list of another form, or a host file that cannot be read or has a line of
            another form.
    """
    from kfast.cluster.hostfile import read_hostfile
    from kfast.cluster.hosts import parse_host_list

    found = parse_host_list(hosts, slots_optional=True) if hosts else read_hostfile(hostfile) if hostfile else None
    return list(dict.fromkeys(host for host, _ in found.hosts)) if found else []


def _local_addresses() -> set[str]:
    import psutil

    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}


def _resolve(name: str) -> list[str]:
    try:
        # An AF_INET address is an (address, port) pair; str() says so to the type checker.
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None, socket.AF_INET)})
    except OSError:
        return []


def is_local(name: str) -> bool:
    """True when `name` is this host (horovodrun then starts its ranks here, without ssh)."""
    try:
        return socket.gethostbyname(name) in _local_addresses()  # as horovodrun decides
    except OSError:
        return False


def needed(names: Iterable[str]) -> bool:
    """True when a host other than this one takes part: only then can hosts disagree."""
    return any(not is_local(name) for name in names)


# -- the probe, run on each host ---------------------------------------------------------------------


def _interfaces() -> tuple[dict[str, list[str]], list[str]]:
    """({name: [IPv4 addresses]} of the interfaces that are up and not loopback, [loopback addresses])."""
    import psutil

    stats = psutil.net_if_stats()
    network: dict[str, list[str]] = {}
    loopback: list[str] = []
    for name, addrs in psutil.net_if_addrs().items():
        ipv4 = [a.address for a in addrs if a.family == socket.AF_INET]
        st = stats.get(name)
        if name == "lo" or (st is not None and "loopback" in (getattr(st, "flags", "") or "")):
            loopback += ipv4
        elif ipv4 and st is not None and st.isup:
            network[name] = ipv4
    return network, loopback


def probe(directory: str, engine: str = "horovod") -> dict[str, Any]:
    """What the checks need to know about this host (JSON-serialisable), for a job of `engine`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    facts: dict[str, Any] = {"hostname": socket.gethostname(), "directory": directory,
             "directory_exists": os.path.isdir(directory), "executable": sys.executable,
             "versions": {"python": platform.python_version()}}
    facts["hostname_addresses"] = _resolve(facts["hostname"])
    facts["interfaces"], facts["loopback_addresses"] = _interfaces()
    from kfast._version import __version__
    from kfast.env.horovod_build import horovod_build

    facts["versions"]["kfast"] = __version__
    facts["horovod_build"] = []
    if engine == "jax":
        os.environ["KERAS_BACKEND"] = "jax"  # as every JAX process gets it (ssh passes no variables here)
        try:
            import jax
            import keras

            facts["versions"].update(keras=keras.__version__, jax=jax.__version__)
        except Exception as e:  # noqa: BLE001 - reported as a difference, with the reason
            facts["versions"].update(keras=None, jax=None, import_error=f"{type(e).__name__}: {e}")
        return facts
    try:
        import keras
        import tensorflow as tf

        facts["versions"].update(keras=keras.__version__, tensorflow=tf.__version__)
    except Exception as e:  # noqa: BLE001 - reported as a difference, with the reason
        facts["versions"].update(keras=None, tensorflow=None, import_error=f"{type(e).__name__}: {e}")
    info = horovod_build()
    facts["versions"]["horovod"] = info["version"]
    facts["horovod_build"] = sorted(k for k in ("gloo", "mpi", "nccl", "cuda") if info[k])
    return facts


def _probe_command(directory: str, python: str, engine: str = "horovod") -> list[str]:
    return [python, "-m", "kfast.env.preflight", *(["--engine", engine] if engine != "horovod" else []), directory]


def _run_probe(name: str, directory: str, python: str, local: bool,
               engine: str = "horovod") -> tuple[dict[str, Any] | None, str | None, str | None]:
    """Runs the probe on host `name`; returns (facts or None, problem or None, fix or None)."""
    cmd = _probe_command(directory, python, engine)
    if not local:
        remote = " ".join(shlex.quote(c) for c in cmd)
        cmd = ["ssh", *SSH_OPTIONS, name, remote]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    except subprocess.TimeoutExpired:
        return None, f"did not answer within {PROBE_TIMEOUT_S} s", (
            f"check that `ssh {name} {python} -c pass` returns promptly (a login script waiting for input, "
            "or a host too busy to start Python)")
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):]), None, None
    said = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    last = said[-1] if said else f"exit status {proc.returncode}"
    if not local and proc.returncode == 255:
        return None, f"is not reachable over ssh ({last})", (
            f"make `ssh {name} true` work from this host without a password prompt (an ssh key in "
            f"{name}'s ~/.ssh/authorized_keys; see the many-hosts guide, docs/many-hosts.md)")
    if proc.returncode == 127 or "No such file or directory" in last:
        return None, f"has no {python} ({last})", (
            "install the same Python environment at the same path on every host")
    if "No module named" in last:
        return None, f"cannot import kfast with {python} ({last})", (
            "install kfast into that environment on every host, at the same path")
    return None, f"could not run the check ({last})", (
        f"run `{' '.join(_probe_command(directory, python, engine))}` on {name} to see why")


# -- the checks ---------------------------------------------------------------------------------------


def _is_loopback(address: str, facts: dict[str, Any]) -> bool:
    try:
        loop = ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
    on_network = any(address in addrs for addrs in facts["interfaces"].values())
    return not on_network and (loop or address in facts["loopback_addresses"])


def check(names: Sequence[str], directory: str | None = None, python: str | None = None,
          engine: str = "horovod") -> dict[str, Any]:
    """Runs every check on hosts `names` from this one.

    Args:
        names: host names, as `-H` lists them.
        directory: the directory the ranks will run in. Defaults to `None`: the current one.
        python: the interpreter horovodrun will start on each host. Defaults to `None`: this one.
        engine: `"horovod"` (versions of TensorFlow and Horovod, its build, a common network interface) or
            `"jax"` (versions of JAX; JAX's processes need no common interface name).

    Returns:
        A JSON-serialisable dict: `hosts` ({name: what its probe found, or None}), `problems` (each with
        `host`, `problem` and `fix`), `interface` (the network interface Gloo will use, or None) and
        `notes` (lines worth showing even when all is well).

    Example:

    With hosts that answer ssh (so not run as a doctest here):

    >>> result = kfast.env.preflight.check(["host1", "host2"])  # doctest: +SKIP
    >>> print("\\n".join(kfast.env.preflight.problem_lines(result)))  # doctest: +SKIP
    """
    directory = os.path.abspath(directory or os.getcwd())
    python = python or sys.executable
    this = socket.gethostname()
    local = {name: is_local(name) for name in names}
    result: dict[str, Any] = {"this_host": this, "directory": directory, "hosts": {}, "problems": [], "interface": None,
              "notes": []}

    def problem(host: str, text: str | None, fix: str | None) -> None:
        result["problems"].append({"host": host, "problem": text, "fix": fix})

    targets = [None, *[n for n in names if not local[n]]]  # None: this host, probed once
    with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
        answers = dict(zip(targets, pool.map(
            lambda n: _run_probe(n or this, directory, python, local=n is None, engine=engine), targets)))
    mine = answers[None][0]
    if mine is None:
        problem(this, f"(this host) {answers[None][1]}", answers[None][2])
        return result
    for name in names:
        facts, text, fix = answers[None if local[name] else name]
        result["hosts"][name] = facts
        if facts is None:
            problem(name, text, fix)
            continue
        if not facts["directory_exists"]:
            problem(name, f"the working directory {directory} does not exist there (" + (
                              "horovodrun runs each rank in the launching directory; where it is missing the rank "
                              "silently runs in the home directory, on other files)" if engine == "horovod" else
                              "kfast launch runs each process in the launching directory)"),
                    f"create {directory} on {name} with the same files, or pass --chdir DIR with a directory "
                    "every host has")
        for key, label in (_JAX_VERSIONS if engine == "jax" else _VERSIONS):
            theirs, ours = facts["versions"].get(key), mine["versions"].get(key)
            if theirs != ours:
                why = facts["versions"].get("import_error") if theirs is None else None
                problem(name, f"has {label} {theirs or 'missing'}{f' ({why})' if why else ''}, but this host "
                              f"({this}) has {ours or 'none'}", _SAME_ENV_FIX if engine == "horovod" else _SAME_JAX_ENV_FIX)
        if facts["versions"].get("horovod") and facts["horovod_build"] != mine["horovod_build"]:
            problem(name, f"has Horovod built with {', '.join(facts['horovod_build']) or 'nothing'}, but this "
                          f"host ({this}) has it built with {', '.join(mine['horovod_build']) or 'nothing'}",
                    "build it the same way everywhere: bash scripts/install_horovod.sh (add --gpu on GPU hosts)")
    _check_hostnames(result, names, problem, engine)
    if engine == "horovod":
        _check_interfaces(result, names, problem)
    return result


def _check_hostnames(result: dict[str, Any], names: Iterable[str], problem: _Problem, engine: str) -> None:
    # Measured on the namespace hosts: JAX's Gloo fails the same way, after its connect timeout (about 100 s).
    aborts = "Gloo aborts in hvd.init()" if engine == "horovod" else "Gloo fails in kfast.distributed.init()"
    for name in names:
        facts = result["hosts"].get(name)
        if not facts:
            continue
        own, addresses = facts["hostname"], facts["hostname_addresses"]
        network = [f"{a} on {iface}" for iface, addrs in sorted(facts["interfaces"].items()) for a in addrs]
        where = f"its network address ({', '.join(network)})" if network else "its network address"
        if not addresses:
            problem(name, f"its own hostname {own!r} does not resolve there, so Gloo cannot build its device "
                          "from it", f"add `ADDRESS {own}` to /etc/hosts on {name}, with {where}")
        elif any(_is_loopback(a, facts) for a in addresses):
            problem(name, f"its own hostname {own!r} resolves to {', '.join(addresses)}, a loopback address "
                          f"(Debian's `127.0.1.1 <hostname>` line), so {aborts} with "
                          "'connect [127.0.0.1]:N: Connection refused'",
                    f"map {own} to {where} in /etc/hosts on {name} instead")


def _check_interfaces(result: dict[str, Any], names: Sequence[str], problem: _Problem) -> None:
    found = {name: result["hosts"][name]["interfaces"] for name in names if result["hosts"].get(name)}
    if len(found) < len(names) or not found:
        return
    common = sorted(set.intersection(*(set(ifaces) for ifaces in found.values())))
    if not common:
        each = "; ".join(f"{name}: {', '.join(sorted(ifaces)) or 'none'}" for name, ifaces in found.items())
        problem("all hosts", f"no network interface name is common to all hosts ({each}); horovodrun needs "
                             "one, and Gloo runs on it",
                "give the interfaces of the network the hosts share the same name on every host (e.g. with a "
                "udev or systemd .link rule)")
    elif len(common) == 1:
        result["interface"] = common[0]
        result["notes"].append(f"Gloo will use {common[0]}, the one network interface every host has.")
    else:
        result["notes"].append(
            f"every host has {', '.join(common)}; horovodrun keeps those the hosts reach each other on and Gloo "
            f"uses the first (run horovodrun with --network-interface NAME to choose).")


def problem_lines(result: dict[str, Any]) -> list[str]:
    """One line per problem: `host: problem; fix: ...`."""
    return [f"{p['host']}: {p['problem']}; fix: {p['fix']}." for p in result["problems"]]


def host_lines(result: dict[str, Any]) -> list[str]:
    """One line per host saying what its probe found (for `kfast doctor --hosts`)."""
    lines: list[str] = []
    for name, facts in result["hosts"].items():
        if facts is None:
            lines.append(f"{name}: no answer")
            continue
        v = facts["versions"]
        build = ", ".join(facts["horovod_build"]) or "nothing"
        stack = (f"JAX {v.get('jax')}" if "jax" in v else
                 f"TensorFlow {v.get('tensorflow')}, Horovod {v.get('horovod')} ({build})")
        lines.append(f"{name}: kfast {v.get('kfast')}, Keras {v.get('keras')}, {stack}; hostname {facts['hostname']} -> "
                     f"{', '.join(facts['hostname_addresses']) or 'nothing'}; interfaces "
                     f"{', '.join(sorted(facts['interfaces'])) or 'none'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The probe's entry point on a host: prints this host's facts for the launching host to read."""
    argv = list(sys.argv[1:] if argv is None else argv)
    engine = "horovod"
    if argv[:1] == ["--engine"] and len(argv) > 1:
        engine, argv = argv[1], argv[2:]
    print(_MARK + json.dumps(probe(argv[0] if argv else os.getcwd(), engine)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
