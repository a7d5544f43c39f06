#!/usr/bin/env bash
# Build Horovod's GPU variant (CUDA + NCCL + Gloo) and prove it loads and works, on any machine, GPU or not.
#
# Usage: scripts/gpu_build_check.sh [VENV]     (`make gpu-build-check`; VENV defaults to .venv-gpu-build)
# Env:   PYTHON=python3.11  the interpreter for a new venv
#
# A compile error in GPU-only code, or a symbol the library needs and TensorFlow no longer exports, would
# otherwise show up only on a GPU host. In a venv of its own (the GPU-capable `tensorflow` wheel at the
# version constraints.txt pins for tensorflow-cpu), this runs `install_horovod.sh --gpu` and then checks,
# without a GPU: the library loads with CUDA and NCCL built in, `horovodrun --check-build` lists NCCL and
# Gloo, and a two-rank Gloo allreduce is exact. The CUDA toolkit always comes from PyPI here, so every
# machine, CI included, checks the same build. The first run compiles for several minutes; later runs
# reuse the cached wheel.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=${1:-.venv-gpu-build}
# Two runs at once (two `make test`s on one machine) would fill the same caches together; take turns.
mkdir -p "$HOME/.cache/kfast"
exec 9>"$HOME/.cache/kfast/gpu-build-check.lock"
if ! flock -n 9; then
  echo "Waiting for another gpu-build-check on this machine to finish..."
  flock 9
fi
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [[ ! -x "$venv/bin/python" ]]; then
  echo "Creating $venv with $PYTHON ($("$PYTHON" --version))"
  "$PYTHON" -m venv "$venv"
fi
py=$venv/bin/python
# horovodrun, started by the checks, must be this venv's.
export PATH="$PWD/$venv/bin:$PATH"

tf_version=$(sed -n 's/^tensorflow-cpu==//p' constraints.txt)
if [[ -z "$tf_version" ]]; then
  echo "gpu_build_check.sh: constraints.txt pins no tensorflow-cpu==VERSION; the GPU wheel takes its version from that pin." >&2
  exit 1
fi
echo "Installing tensorflow==$tf_version into $venv (pinned by constraints.txt)"
"$py" -m pip install -q --upgrade "pip>=24" "setuptools>=69" wheel
# Horovod's run-time requirements too, so install_horovod.sh finds them pinned.
"$py" -m pip install -q -c constraints.txt "tensorflow==$tf_version" cloudpickle psutil pyyaml packaging

KFAST_CUDA_TOOLKIT=pypi PYTHON="$py" bash scripts/install_horovod.sh --gpu

echo "Checking the GPU build in $venv"
"$py" - <<'PY'
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow as hvd

built = {"cuda": hvd.cuda_built(), "nccl": hvd.nccl_built(), "gloo": hvd.gloo_built()}
print("horovod.tensorflow loads:", ", ".join(f"{k}_built()={v}" for k, v in built.items()))
missing = [k for k, v in built.items() if not v]
if missing:
    sys.exit(f"gpu_build_check.sh: Horovod was built without {', '.join(missing)}; rebuild with "
             "`rm -rf ~/.cache/kfast/wheels/horovod-*-gloo-nccl*` and run this again.")
PY

report=$("$venv/bin/horovodrun" --check-build)
echo "$report"
for op in NCCL Gloo; do
  if ! grep -q "\[X\] $op" <<<"$report"; then
    echo "gpu_build_check.sh: \`horovodrun --check-build\` does not list $op as built; see the build log above." >&2
    exit 1
  fi
done

"$py" scripts/check_allreduce.py --launch
echo "GPU build check passed: CUDA + NCCL + Gloo build of Horovod loads, and a 2-rank Gloo allreduce is exact."
