"""Hosts for multi-host tests: Linux network namespaces on a bridge, each with its own sshd.

NOTE [ Multi-host harness ]
Each host is a holder process (`sleep`, renamed `kfmh-<run>-<host>`) started with `unshare --net --uts
--mount`; everything else runs in its namespaces through `nsenter --target <holder>`. A host has:
  * its hostname (UTS namespace), its own `/etc/hosts` and ssh client config (`/etc/ssh/ssh_config`),
    private `/tmp`, `/dev/shm` and `/run` (tmpfs), and a private directory seen at `HOST_DIR` on every
    host (bind-mounted from `<base>/<host>/`, so a test reads every host's disk from outside);
  * one interface, `eth0`, with address 127.0.100.N/24 (scope global; `route_localnet=1` lets the kernel
    route loopback-range addresses), wired to a bridge that lives in a namespace of its own (holder
    `kfmh-<run>-bridge`): the root namespace gets no interface and no address. `lo` keeps only
    127.0.0.1/32 and 127.0.1.1/32 (Debian's address for the machine's own name), so the other 127.x
    addresses leave through eth0 instead of looping back;
  * an sshd bound to 127.0.100.N:22 only, key-only, with the run's own host and client keys.
The repository and its `.venv` are visible everywhere (the filesystem is shared), so every host runs the
same Python at the same path, as a real cluster should.

Ownership and shutdown: this process starts the holders and the sshds (their parent-death signal is
SIGKILL, so they die with it); ranks and shells started over ssh live in the hosts' namespaces.
`close()` kills, by pid, every process in each host's network namespace (all started by this harness),
then the bridge, then removes `<base>`. It runs from the fixture's teardown and from `atexit` (so on
Ctrl-C too). A run killed outright leaves `<base>` with its owner in `state.json`; when that owner is
gone, the next harness kills the processes whose mount table holds that run's host directories (so
only that run's) and removes `<base>`.
"""

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from procs import HOST_DIR, PREFIX, clean_leftovers, die_with_parent, is_zombie, kill_all, netns_inode
from procs import pids_in_netns, start_time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUBNET = "127.0.100"
ETC_DIR = "/mnt/kfmh-etc"  # the run's keys and configs, read-only on every host
_HOLD_S = 3600  # holders exit on their own after this, whatever happens to the test process


def unavailable_reason():
    """Why this machine cannot run the harness, or None when it can."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network namespaces, mounts, sshd); run them as root"
    for tool in ("unshare", "nsenter", "ip", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"`{tool}` is missing; run `bash scripts/setup_multihost.sh` as root"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True,
                           timeout=10)
    if probe.returncode != 0:
        return f"cannot create network namespaces here ({probe.stderr.strip()})"
    return None


def sshd_path():
    return shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


class Cluster:
    """N hosts (`hostA`, `hostB`, ...) as namespaces on a bridge; see the NOTE at the top of the module.

    Args:
        names: the host names. Defaults to three hosts.
    """

    def __init__(self, names=("hostA", "hostB", "hostC")):
        self.names = list(names)
        self.address = {name: f"{SUBNET}.{i + 1}" for i, name in enumerate(self.names)}
        self.base = None
        self._holder = {}  # host (or "bridge") -> Popen of its holder
        self._netns = {}  # host (or "bridge") -> network namespace inode
        self._sshd = {}  # host -> Popen of its sshd
        self._binds = {}  # host -> targets that bind() covered
        self._closed = False
        self.setup_s = None

    # -- life cycle -----------------------------------------------------------------------------------

    def start(self):
        start = time.monotonic()
        clean_leftovers()
        self.base = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
        atexit.register(self.close)
        try:
            self._save_state()
            self._write_files()
            for name in ["bridge", *self.names]:
                self._start_holder(name)
            self._wire()
            for name in self.names:
                self._configure_host(name)
            for name in self.names:
                self.start_sshd(name)
            for name in self.names:
                self.wait_for_ssh(name)
        except BaseException:
            self.close()
            raise
        self.setup_s = time.monotonic() - start
        return self

    def close(self):
        if self._closed or self.base is None:
            return
        self._closed = True
        inodes = {ino for ino in self._netns.values() if ino}
        kill_all(pids_in_netns(inodes))
        for p in [*self._sshd.values(), *self._holder.values()]:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)

    def _save_state(self):
        state = {"owner": os.getpid(), "owner_start": start_time(os.getpid())}
        with open(os.path.join(self.base, "state.json"), "w") as f:
            json.dump(state, f)

    def _write_files(self):
        etc = os.path.join(self.base, "etc")
        os.makedirs(etc)
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{PREFIX}{key}",
                            "-f", os.path.join(etc, key)], check=True, timeout=30)
        shutil.copy(os.path.join(etc, "client_key.pub"), os.path.join(etc, "authorized_keys"))
        hosts = "".join(f"{addr} {name}\n" for name, addr in self.address.items())
        self.write_hosts_file("good", hosts)
        with open(os.path.join(etc, "ssh_config"), "w") as f:
            f.write("Host *\n"
                    f"    IdentityFile {ETC_DIR}/client_key\n"
                    "    IdentitiesOnly yes\n"
                    "    StrictHostKeyChecking no\n"
                    "    UserKnownHostsFile /dev/null\n"
                    "    GlobalKnownHostsFile /dev/null\n"
                    "    BatchMode yes\n"
                    "    ConnectTimeout 10\n"
                    "    LogLevel ERROR\n")
        penalties = self._sshd_supports("PerSourcePenalties=no")
        for name, addr in self.address.items():
            with open(os.path.join(etc, f"sshd_config-{name}"), "w") as f:
                f.write(f"ListenAddress {addr}:22\n"
                        f"HostKey {ETC_DIR}/host_key\n"
                        f"AuthorizedKeysFile {ETC_DIR}/authorized_keys\n"
                        "PermitRootLogin prohibit-password\n"
                        "PubkeyAuthentication yes\n"
                        "PasswordAuthentication no\n"
                        "KbdInteractiveAuthentication no\n"
                        "UsePAM no\n"
                        "StrictModes no\n"
                        "PrintMotd no\n"
                        "PidFile /run/sshd.pid\n"
                        "MaxStartups 100\n"
                        "LogLevel ERROR\n"
                        + ("PerSourcePenalties no\n" if penalties else ""))
            os.makedirs(os.path.join(self.base, name, "work"))

    def _sshd_supports(self, option):
        probe = subprocess.run([sshd_path(), "-T", "-f", "/dev/null", "-o", option, "-o", "HostKey=/dev/null"],
                               capture_output=True, text=True, timeout=10)
        return "Bad configuration option" not in probe.stderr and "Unsupported option" not in probe.stderr

    def write_hosts_file(self, label, text):
        """Writes an /etc/hosts variant `hosts-<label>` (with localhost) and returns its path outside."""
        path = os.path.join(self.base, "etc", f"hosts-{label}")
        with open(path, "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n" + text)
        return path

    def _start_holder(self, name):
        tag = f"{PREFIX}{os.getpid()}-{name}"
        flags = ["--net"] if name == "bridge" else ["--net", "--uts", "--mount", "--propagation", "private"]
        p = subprocess.Popen(["unshare", *flags, "--", "bash", "-c", f'exec -a {tag} sleep {_HOLD_S}'],
                             preexec_fn=die_with_parent, stdin=subprocess.DEVNULL)
        self._holder[name] = p
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                    if f.read().startswith(tag.encode()):
                        break
            except OSError:
                pass
            if p.poll() is not None:
                raise RuntimeError(f"the holder of {name} exited with {p.returncode}")
            time.sleep(0.02)
        else:
            raise RuntimeError(f"the holder of {name} did not start within 10 s")
        self._netns[name] = netns_inode(p.pid)

    def _ns(self, name, cwd=None):
        pid = self._holder[name].pid
        flags = ["--net"] if name == "bridge" else ["--net", "--uts", "--mount"]
        # nsenter --wd opens the directory before entering the mount namespace: change it inside instead.
        return ["nsenter", f"--target={pid}", *flags, "--", *(["env", f"--chdir={cwd}"] if cwd else [])]

    def _sh(self, name, script, timeout=30):
        proc = subprocess.run([*self._ns(name), "sh", "-ec", script], capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"setting up {name} failed ({proc.returncode}):\n{script}\n{proc.stderr}")
        return proc.stdout

    def _wire(self):
        self._sh("bridge", "ip link add br0 type bridge; ip link set br0 up")
        bridge = self._holder["bridge"].pid
        for name in self.names:
            subprocess.run(["ip", "link", "add", "eth0", "netns", str(self._holder[name].pid), "type", "veth",
                            "peer", "name", f"v-{name}", "netns", str(bridge)], check=True, timeout=10)
            self._sh("bridge", f"ip link set v-{name} master br0; ip link set v-{name} up")

    def _configure_host(self, name):
        here = os.path.join(self.base, name)
        etc = os.path.join(self.base, "etc")
        home_horovod = os.path.expanduser("~/.horovod")
        os.makedirs(os.path.join(here, ".horovod"))
        os.makedirs(home_horovod, exist_ok=True)
        ssh_dir = os.path.expanduser("~/.ssh")
        hide_ssh = f"mkdir -p {here}/.ssh && mount --bind {here}/.ssh {ssh_dir}" if os.path.isdir(ssh_dir) else "true"
        # Every host gets a private /tmp; a checkout (and its .venv) under /tmp, as a CI clone may be, must stay
        # visible at the same path: it is held at /mnt/kfmh-keep-N and bound back over the new /tmp.
        keep = sorted({p for p in (_REPO, os.path.realpath(sys.prefix)) if p.startswith("/tmp/")})
        keep = [p for p in keep if not any(p != q and p.startswith(q + "/") for q in keep)]
        hold = "; ".join(f"mkdir -p /mnt/kfmh-keep-{i} && mount --bind {p} /mnt/kfmh-keep-{i}"
                         for i, p in enumerate(keep)) or "true"
        restore = "; ".join(f"mkdir -p {p} && mount --bind /mnt/kfmh-keep-{i} {p}"
                            for i, p in enumerate(keep)) or "true"
        self._sh(name, f"""
            hostname {name}
            mount -t tmpfs -o size=16m,mode=755 kfmh-mnt /mnt
            mkdir {HOST_DIR} {ETC_DIR}
            mount --bind {here} {HOST_DIR}
            mount --bind {etc} {ETC_DIR}
            mount -o remount,bind,ro {ETC_DIR}
            mount --bind {etc}/hosts-good /etc/hosts
            mount --bind {etc}/ssh_config /etc/ssh/ssh_config
            mount --bind {here}/.horovod {home_horovod}
            {hide_ssh}
            mount -t tmpfs -o size=512m kfmh-shm /dev/shm
            {hold}
            mount -t tmpfs -o size=512m kfmh-tmp /tmp
            {restore}
            mount -t tmpfs -o size=16m,mode=755 kfmh-run /run
            mkdir -m 755 /run/sshd
            ip link set lo up
            ip addr del 127.0.0.1/8 dev lo
            ip addr add 127.0.0.1/32 dev lo
            ip addr add 127.0.1.1/32 dev lo
            for conf in all default lo eth0; do echo 1 > /proc/sys/net/ipv4/conf/$conf/route_localnet; done
            ip addr add {self.address[name]}/24 dev eth0 scope global
            ip link set eth0 up
        """)

    # -- sshd ----------------------------------------------------------------------------------------

    def start_sshd(self, name):
        log = open(os.path.join(self.base, f"sshd-{name}.log"), "ab")
        with log:
            self._sshd[name] = subprocess.Popen(
                [*self._ns(name), sshd_path(), "-D", "-e", "-f", f"{ETC_DIR}/sshd_config-{name}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=die_with_parent)

    def stop_sshd(self, name):
        p = self._sshd.pop(name)
        p.terminate()
        p.wait(timeout=10)

    def wait_for_ssh(self, name, timeout=20):
        """Waits until `ssh <name> true` works from the first host."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.run(self.names[0], ["ssh", name, "true"], timeout=15)
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ssh to {name} does not work after {timeout} s: {proc.stderr}\n"
                                   f"sshd log: {self.sshd_log(name)}")
            time.sleep(0.1)

    def sshd_log(self, name):
        try:
            with open(os.path.join(self.base, f"sshd-{name}.log")) as f:
                return f.read()
        except OSError:
            return ""

    # -- running things on a host ---------------------------------------------------------------------

    def env(self, extra=None):
        """The environment for commands on the hosts: this one, with the venv first on PATH."""
        venv_bin = os.path.dirname(os.path.abspath(sys.executable))
        env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
               "PYTHONUNBUFFERED": "1"}
        env.pop("PYTEST_CURRENT_TEST", None)
        return {**env, **(extra or {})}

    def popen(self, name, args, cwd=f"{HOST_DIR}/work", env=None, **kwargs):
        """Starts `args` on host `name` (in its own session, so it can be stopped with its children)."""
        return subprocess.Popen([*self._ns(name, cwd), *args], env=self.env(env), start_new_session=True,
                                **kwargs)

    def run(self, name, args, timeout, cwd=f"{HOST_DIR}/work", env=None):
        """Runs `args` on host `name`; returns the CompletedProcess (text), killing it at the timeout."""
        p = self.popen(name, args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_session(p)
            out, err = p.communicate(timeout=10)
            raise subprocess.TimeoutExpired(args, timeout, out, err) from None
        return subprocess.CompletedProcess(args, p.returncode, out, err)

    @staticmethod
    def kill_session(p):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def path(self, name, *parts):
        """The path, outside, of `HOST_DIR/<parts>` on host `name`."""
        return os.path.join(self.base, name, *parts)

    # -- what runs where, and breaking hosts ----------------------------------------------------------

    def processes(self, name):
        """{pid: command line} of the processes on host `name`, but its holder and its sshd listener."""
        keep = {self._holder[name].pid} | ({self._sshd[name].pid} if name in self._sshd else set())
        out = {}
        for pid in pids_in_netns({self._netns[name]}):
            if pid in keep:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if cmd and not is_zombie(pid):
                out[pid] = cmd
        return out

    def kill_processes(self, name):
        """Kills every process on host `name` but its holder (sshd included, as a crash would)."""
        pids = [p for p in pids_in_netns({self._netns[name]}) if p != self._holder[name].pid]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if name in self._sshd:
            self._sshd.pop(name).wait(timeout=10)
        return pids

    def reset(self, name):
        """Brings host `name` back: link up, test binds undone, its own processes stopped, sshd answering."""
        self.link(name, up=True)
        self.unshape(name)
        for target in reversed(self._binds.get(name, [])):
            self.unbind(name, target)
        if name in self._sshd and self._sshd[name].poll() is not None:
            self._sshd.pop(name).wait(timeout=10)
        kill_all(list(self.processes(name)))
        if name not in self._sshd:
            self.start_sshd(name)
        self.wait_for_ssh(name)

    def shape(self, name, rate):
        """Limits what host `name` sends to `rate` (tc units, e.g. "200mbit") with a token bucket on its
        link. tbf rather than netem: netem (added delay) is not in every kernel, tbf is."""
        # A 64 kB bucket lets TCP reach the rate without bursts far above it.
        self._sh(name, f"tc qdisc replace dev eth0 root tbf rate {rate} burst 64kb latency 200ms")

    def unshape(self, name):
        """Takes any shaping off host `name`'s link."""
        self._sh(name, "tc qdisc del dev eth0 root 2>/dev/null || true")

    def link(self, name, up):
        """Connects host `name` to the bridge, or silently cuts it off (packets dropped, no reset)."""
        self._sh("bridge", f"ip link set v-{name} {'up' if up else 'down'}")

    def bind(self, name, source, target):
        """Bind-mounts `source` over `target` on host `name` only.

        `source` is a path outside: a file of the run's own (`write_hosts_file`, `<base>/etc/...`) or one
        in that host's own directory (`path(name, ...)`).
        """
        etc, own = os.path.join(self.base, "etc") + os.sep, self.path(name) + os.sep
        if source.startswith(etc):
            inside = os.path.join(ETC_DIR, source[len(etc):])
        elif source.startswith(own):
            inside = os.path.join(HOST_DIR, source[len(own):])
        else:
            raise ValueError(f"bind() got {source!r}; it must lie under {etc} or {own}")
        self._sh(name, f"mount --bind {inside} {target}")
        self._binds.setdefault(name, []).append(target)

    def unbind(self, name, target):
        self._sh(name, f"umount {target}")
        self._binds[name].remove(target)
