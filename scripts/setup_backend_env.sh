#!/usr/bin/env bash
# Create or update .venv-jax or .venv-torch: kfast on Keras's JAX or PyTorch backend, CPU builds, and no
# TensorFlow, for the backend tests `make test` runs there (see docs/backends.md).
#
# Usage: scripts/setup_backend_env.sh jax|torch     (the Makefile calls it when the venv is missing or stale)
# Env:   PYTHON=python3.11  the interpreter for a new venv
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

backend=${1:-}
case "$backend" in
  jax) framework=(jax jaxlib) ;;
  # `+cpu` in the pin (constraints-backends.txt) keeps pip from taking PyPI's CUDA build instead; where
  # no CPU build is on pip's indexes, pass PyTorch's CPU wheel index with PIP_EXTRA_INDEX_URL.
  torch) framework=(torch) ;;
  *) echo "usage: scripts/setup_backend_env.sh jax|torch (got '${backend}')" >&2; exit 2 ;;
esac
venv=.venv-$backend

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [[ ! -x $venv/bin/python ]]; then
  echo "Creating $venv with $PYTHON ($("$PYTHON" --version))"
  "$PYTHON" -m venv "$venv"
fi
py=$venv/bin/python

echo "Installing kfast with ${framework[*]} into $venv (pinned by constraints.txt and constraints-backends.txt)"
"$py" -m pip install -q --upgrade "pip>=24" "setuptools>=69" wheel
# No extra: kfast's own requirements hold no TensorFlow, and the test extra's notebook tools are not needed here.
"$py" -m pip install -q -c constraints.txt -c constraints-backends.txt -e . pytest pytest-timeout pytest-xdist "${framework[@]}"

# The point of this venv: kfast must work where TensorFlow is absent, so TensorFlow must really be absent.
if "$py" -c "import tensorflow" >/dev/null 2>&1; then
  echo "error: TensorFlow is importable in $venv, so its tests would not show that kfast runs without it;" \
       "remove it: $py -m pip uninstall -y tensorflow tensorflow-cpu" >&2
  exit 1
fi
KERAS_BACKEND=$backend "$py" -c "
import keras, kfast.callbacks, kfast.data
assert keras.backend.backend() == '$backend', keras.backend.backend()
print('$venv ready: keras', keras.__version__, 'on', keras.backend.backend(), '(TensorFlow not installed)')"
