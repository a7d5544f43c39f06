#!/usr/bin/env bash
# `make demo`: the machine report; a model starved by its input, diagnosed, tuned and diagnosed again
# (scripts/demo_starved.py); then the image-classification recipe on synthetic images with two ranks on CPU
# under horovodrun: a diagnosis (verdict + plot), per-epoch metrics and throughput, checkpoints.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PWD/.venv/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=3
out=out/demo
mkdir -p "$out"
# TensorFlow's start-up lines (printed by every process that imports it, before any setting is read)
# are dropped from stderr; warnings and errors pass. stdout goes straight through.
quiet() { { "$@" 2>&1 1>&3 3>&- | python kfast/_core/tf_noise.py >&2 3>&-; } 3>&1; }
quiet kfast doctor
echo
echo "== A starved model: kfast.diagnose, kfast.tune, kfast.diagnose again (pictures in $out/)"
quiet timeout 600 python scripts/demo_starved.py "$out"
echo
echo "== kfast launch -np 2 image-classification (synthetic images, CPU, Gloo); output in $out/"
quiet timeout 900 kfast launch -np 2 image-classification --epochs 3 --samples 1024 \
  --checkpoint-dir "$out/checkpoints" --diagnose "$out/diagnosis.png"
echo
echo "checkpoints: $(ls "$out/checkpoints" | tr '\n' ' ')"
echo "diagnosis plot: $out/diagnosis.png"
