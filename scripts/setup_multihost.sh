#!/usr/bin/env bash
# Install what the multi-host tests (tests/multihost/) need: OpenSSH's server, iproute2, and Slurm with
# MUNGE (slurm-wlm, munge) for the scheduler tests.
#
# Usage: scripts/setup_multihost.sh     (`make test` runs it; it returns at once when all is installed)
#
# The tests start their own sshd, one per network-namespace host, bound to that host's 127.0.100.x
# address; the system's sshd must never start (it would listen on every interface of this machine). The
# same holds for slurmctld, slurmd and munged: the Slurm tests start their own, one set per host, with
# configs and keys of their own. So the packages are installed under a policy-rc.d that denies service
# starts, and their services are disabled.
# Without root the script only says why it skips: the multi-host tests then report themselves skipped.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" || -x "/sbin/$1" ]]; }

missing=()
have sshd || missing+=(openssh-server)
have ssh || missing+=(openssh-client)
have ip || missing+=(iproute2)
have unshare && have nsenter || missing+=(util-linux)
have slurmctld && have slurmd && have sbatch || missing+=(slurm-wlm)
have munged || missing+=(munge)
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "setup_multihost.sh: ${missing[*]} missing and not root; the multi-host tests will be skipped" \
       "(as root: bash scripts/setup_multihost.sh)." >&2
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "setup_multihost.sh: ${missing[*]} missing and apt-get is not available; install them with your" \
       "package manager (the system sshd must stay stopped)." >&2
  exit 1
fi

# Deny service starts while installing (Debian's invoke-rc.d honours policy-rc.d), then put back what
# was there before.
policy=/usr/sbin/policy-rc.d
saved=
if [[ -e $policy ]]; then
  saved=$(mktemp)
  cp -p "$policy" "$saved"
fi
restore() {
  if [[ -n $saved ]]; then mv -f "$saved" "$policy"; else rm -f "$policy"; fi
}
trap restore EXIT
printf '#!/bin/sh\nexit 101\n' > "$policy"
chmod 755 "$policy"

echo "Installing ${missing[*]} for the multi-host tests (no service is started)"
export DEBIAN_FRONTEND=noninteractive
timeout 600 apt-get update -q >/dev/null
timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
# Keep the system sshd from starting at the next boot as well (no-ops where there is no init system).
if command -v systemctl >/dev/null; then
  systemctl disable ssh.service ssh.socket slurmctld.service slurmd.service munge.service >/dev/null 2>&1 || true
fi
if command -v update-rc.d >/dev/null; then
  for service in ssh slurmctld slurmd munge; do update-rc.d "$service" disable >/dev/null 2>&1 || true; done
fi
have sshd || { echo "setup_multihost.sh: sshd is still missing after installing openssh-server." >&2; exit 1; }
have slurmd && have munged || { echo "setup_multihost.sh: slurmd or munged is still missing after installing" \
  "slurm-wlm and munge." >&2; exit 1; }
