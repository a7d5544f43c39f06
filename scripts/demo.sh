#!/usr/bin/env bash
# `make demo`: the machine report, then a real two-rank Horovod training job on CPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PWD/.venv/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=2
kfast doctor
echo
echo "== 2-rank training on CPU: horovodrun -np 2 -H localhost:2 --gloo"
timeout 600 horovodrun -np 2 -H localhost:2 --gloo python scripts/demo_train.py
