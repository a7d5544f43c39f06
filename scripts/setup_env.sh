#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv) with pinned dependencies and Horovod.
#
# Usage: scripts/setup_env.sh            (the Makefile calls it when .venv is missing or stale)
# Env:   PYTHON=python3.11  the interpreter for a new venv
#        KFAST_GPU=1|0      force the GPU or CPU TensorFlow build (default: GPU if nvidia-smi finds one)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [[ ! -x .venv/bin/python ]]; then
  echo "Creating .venv with $PYTHON ($("$PYTHON" --version))"
  "$PYTHON" -m venv .venv
fi
py=.venv/bin/python

gpu=${KFAST_GPU:-}
if [[ -z "$gpu" ]]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then gpu=1; else gpu=0; fi
fi
# `docs`: MkDocs and mkdocstrings, for `make docs` and the --strict docs build in `make test`. `plan-gpu`: JAX and
# its CUDA plugin, so that a TensorFlow user's step is compiled for a named GPU in a JAX process (tested here).
if [[ "$gpu" == 1 ]]; then extras="gpu,test,docs,plan-gpu,packed,s3"; hvd_flag=--gpu; else extras="cpu,test,docs,plan-gpu,packed,s3"; hvd_flag=; fi

echo "Installing kfast[$extras] (pinned by constraints.txt)"
"$py" -m pip install -q --upgrade "pip>=24" "setuptools>=69" wheel
"$py" -m pip install -q -c constraints.txt -e ".[$extras]"
PYTHON="$py" bash scripts/install_horovod.sh $hvd_flag
