#!/usr/bin/env bash
# kfast's GPU check: one NVIDIA GPU, Keras on JAX (or PyTorch), no TensorFlow, no package registry.
# What it runs and prints: scripts/gpu_check.py. docs/gpu.md, "GPU check", says how to carry it to a GPU machine.
#
# Usage: scripts/gpu_check.sh              the check, stopped after GPU_CHECK_TIMEOUT s (exit status 1: a check failed)
#        scripts/gpu_check.sh --dry-run    the same flow on CPU, tiny sizes, a scripted GPU sampler (make test runs it)
#        scripts/gpu_check.sh --pack DIR   put this script, gpu_check.py and the wheels it installs into DIR
# Env:   PYTHON=python3      the interpreter that has JAX or PyTorch
#        KERAS_BACKEND       default: jax if that Python imports it, else torch
#        GPU_CHECK_TIMEOUT   seconds before the check is stopped (default 470: under 8 minutes)
#        PACK_PYTHONS        Python versions --pack fetches wheels for (default: PYTHON's), e.g. "3.10 3.12"
#
# Beside kfast and Keras wheels (a --pack directory copied to the GPU machine) it installs those wheels with
# pip --no-index into a venv that also sees the system's packages (JAX or PyTorch there); from a checkout
# it runs with PYTHON as it is.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}

pack() {
  local dir repo=$here/.. keras_pin versions
  mkdir -p "$1" && dir=$(cd "$1" && pwd)
  keras_pin=$(grep -E '^keras==' "$repo/constraints.txt")
  versions=${PACK_PYTHONS:-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
  echo "Packing into $dir: the kfast wheel, $keras_pin, and their requirements for Python $versions (manylinux x86_64)"
  rm -f "$dir"/kfast-*.whl
  "$python" -m pip wheel -q --no-deps -w "$dir" "$repo"
  for version in $versions; do
    # pip does not widen a --platform to older manylinux tags by itself: name each one wheels use.
    "$python" -m pip download -q -d "$dir" --only-binary=:all: --python-version "$version" \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 "$dir"/kfast-*.whl "$keras_pin"
  done
  cp "$here/gpu_check.sh" "$here/gpu_check_venv.sh" "$here/gpu_check.py" "$dir/"
  echo "Done ($(du -sh "$dir" | cut -f1)). Copy $dir to the GPU machine and run: bash $(basename "$dir")/gpu_check.sh"
}

case "${1:-}" in
  --pack) pack "${2:?usage: scripts/gpu_check.sh --pack DIR}"; exit 0 ;;
  -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
esac

wheels=("$here"/kfast-*.whl "$here"/keras-*.whl)
if [[ -e ${wheels[0]} && -e ${wheels[1]} ]]; then
  venv=${GPU_CHECK_VENV:-$here/venv}
  [[ -x $venv/bin/python ]] || bash "$here/gpu_check_venv.sh" "$python" "$venv"
  echo "Installing $(basename "${wheels[0]}") and $(basename "${wheels[1]}") into $venv (no index; requirements" \
       "from $here or the system)"
  "$venv/bin/python" -m pip install -q --no-index --find-links "$here" "${wheels[@]}"
  python=$venv/bin/python
fi

if [[ -z ${KERAS_BACKEND:-} ]]; then
  for framework in jax torch; do
    if "$python" -c "import $framework" >/dev/null 2>&1; then export KERAS_BACKEND=$framework; break; fi
  done
fi

limit=${GPU_CHECK_TIMEOUT:-470}
status=0
timeout -k 10 "$limit" "$python" "$here/gpu_check.py" "$@" || status=$?
if [[ $status == 124 || $status == 137 ]]; then
  echo "gpu_check: stopped after $limit s (GPU_CHECK_TIMEOUT); the parts above are what finished." >&2
fi
exit "$status"
