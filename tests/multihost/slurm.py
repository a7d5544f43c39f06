"""A real Slurm on the harness's hosts: munged and slurmd on every host, slurmctld on the first.

NOTE [ Slurm on the harness ]
Everything runs in the hosts' namespaces, started here and never as a service: each host gets a munged
(socket in its own private /run, the run's one key, made here, read from ETC_DIR), a slurmd that is the
node of its hostname, and the first host a slurmctld. Daemons listen on the hosts' 127.0.100.x addresses
(ports SlurmctldPort/SlurmdPort below) inside their namespaces only. State, spool and logs live in each
host's own directory (HOST_DIR/slurm), so a test reads them from outside with `cluster.path()`.
Settings follow ../shared/notes/slurm-facts.md: munge authentication through the socket named in
AuthInfo, proctrack/linuxproc and task/none (no cgroups), config_overrides so a node may claim more CPUs
than the machine has (the tests ask for up to 4 tasks per node on 2 cores).
Teardown: the harness's `close()` kills every process in the hosts' namespaces, the daemons and their
jobs' processes included; `stop()` does the same for the daemons alone.
"""

import os
import secrets
import shutil
import subprocess
import time

from procs import HOST_DIR

ETC = "/mnt/kfmh-etc"  # harness.ETC_DIR
SOCKET = "/run/munge/munge.socket.2"
SLURMCTLD_PORT, SLURMD_PORT = 16817, 16818
CPUS = 4


def unavailable_reason():
    for tool in ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "squeue"):
        if not (shutil.which(tool) or os.path.exists(f"/usr/sbin/{tool}")):
            return f"`{tool}` is missing; run `bash scripts/setup_multihost.sh` as root (make test does)"
    return None


def _daemon(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


class Slurm:
    """Slurm across `cluster`'s hosts; see the NOTE at the top of the module."""

    def __init__(self, cluster, kill_wait=30, cred_expire=10, sched_interval=2):
        self.cluster = cluster
        # Slurm's defaults are 30 s, 120 s and 60 s. A requeued job waits cred_expire before it may start
        # again (its old credentials must expire), then for the scheduler's next pass: 3 minutes of a test's
        # time with the defaults. KillWait is Slurm's default: users' jobs get 30 s to stop before SIGKILL,
        # and the scancel test bounds the stop itself.
        self.kill_wait, self.cred_expire, self.sched_interval = kill_wait, cred_expire, sched_interval
        self.daemons = []  # Popen of every daemon started
        self.setup_s = None

    @property
    def conf(self):
        return f"{ETC}/slurm.conf"

    def env(self, extra=None):
        return {"SLURM_CONF": self.conf, **(extra or {})}

    def _write_config(self):
        c = self.cluster
        etc = os.path.join(c.base, "etc")
        key = os.path.join(etc, "munge.key")
        with open(key, "wb") as f:
            f.write(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        first = c.names[0]
        nodes = "".join(f"NodeName={n} NodeAddr={c.address[n]} CPUs={CPUS} State=UNKNOWN\n" for n in c.names)
        with open(os.path.join(etc, "slurm.conf"), "w") as f:
            f.write(f"""ClusterName=kfmh
SlurmctldHost={first}({c.address[first]})
SlurmctldPort={SLURMCTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
AuthInfo=socket={SOCKET},cred_expire={self.cred_expire}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={HOST_DIR}/slurm/state
SlurmdSpoolDir={HOST_DIR}/slurm/spool
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile={HOST_DIR}/slurm/slurmctld.log
SlurmdLogFile={HOST_DIR}/slurm/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval={self.sched_interval}
SlurmdParameters=config_overrides
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
JobRequeue=1
KillWait={self.kill_wait}
InactiveLimit=0
MinJobAge=600
{nodes}PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _start(self, host, args):
        log = open(self.cluster.path(host, "slurm", f"{os.path.basename(args[0])}.out"), "ab")
        with log:
            p = self.cluster.popen(host, args, cwd="/", env=self.env(), stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=log)
        self.daemons.append(p)
        return p

    def start(self):
        start = time.monotonic()
        self._write_config()
        for host in self.cluster.names:
            for sub in ("state", "spool"):
                os.makedirs(self.cluster.path(host, "slurm", sub), exist_ok=True)
            self.cluster.run(host, ["mkdir", "-p", "-m", "0755", "/run/munge"], timeout=10)
            self._start(host, [_daemon("munged"), "--foreground", "--force", f"--key-file={ETC}/munge.key",
                               f"--socket={SOCKET}", "--pid-file=/run/munge/munged.pid",
                               f"--log-file={HOST_DIR}/slurm/munged.log", f"--seed-file={HOST_DIR}/slurm/munged.seed"])
        for host in self.cluster.names:
            self._wait(lambda h=host: os.path.exists(self.cluster.path(h, "slurm", "munged.seed")) or
                       self.cluster.run(h, ["test", "-S", SOCKET], timeout=10).returncode == 0,
                       20, f"munged on {host}", host, "munged.log")
        first = self.cluster.names[0]
        self._start(first, [_daemon("slurmctld"), "-D", "-c", "-i", "-f", self.conf])
        for host in self.cluster.names:
            self._start(host, [_daemon("slurmd"), "-D", "-f", self.conf, "-N", host])
        self._wait(self._all_idle, 60, "every node idle in sinfo", first, "slurmctld.log")
        self.setup_s = time.monotonic() - start
        return self

    def _all_idle(self):
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return sorted(states) == sorted(self.cluster.names) and set(states.values()) == {"idle"}

    def _wait(self, ready, timeout, what, host, log):
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p for p in self.daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout} s (daemons that exited: "
                                   f"{[(p.args[-1], p.returncode) for p in dead]})\n{self.log(host, log)}")
            time.sleep(0.2)

    def log(self, host, name):
        text = ""
        for candidate in (name, f"{name.split('.')[0]}.out"):
            try:
                with open(self.cluster.path(host, "slurm", candidate), errors="replace") as f:
                    text += f"--- {candidate} on {host}:\n" + f.read()[-6000:]
            except OSError:
                pass
        return text

    def run(self, args, timeout=30, check=True, env=None, cwd=f"{HOST_DIR}/work", host=None):
        """Runs a Slurm command (sbatch, squeue, ...) on the first host (or `host`)."""
        proc = self.cluster.run(host or self.cluster.names[0], args, timeout=timeout, cwd=cwd,
                                env=self.env(env))
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def sbatch(self, script_path, *options, env=None):
        """Submits a batch script (a path on the first host); returns the job id."""
        out = self.run(["sbatch", "--parsable", *options, script_path], env=env).stdout.strip()
        return out.split(";")[0]

    def job(self, job_id):
        """`scontrol show job`'s fields as a dict ({} once Slurm forgot the job)."""
        proc = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        if proc.returncode != 0:
            return {}
        fields = {}
        for item in proc.stdout.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait_state(self, job_id, states, timeout):
        """Waits until the job is in one of `states` (e.g. {"COMPLETED"}); returns its fields."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is {fields.get('JobState')}, not {sorted(states)}, after "
                                   f"{timeout} s:\n{fields}")
            time.sleep(0.2)

    def stop(self):
        for p in self.daemons:
            if p.poll() is None:
                self.cluster.kill_session(p)
        for p in self.daemons:
            p.wait(timeout=10)
        self.daemons = []
