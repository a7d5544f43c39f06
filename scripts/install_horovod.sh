#!/usr/bin/env bash
# Build and install Horovod 0.28.1 against the TensorFlow already in the active Python environment.
#
# Usage: scripts/install_horovod.sh [--gpu]
#
# Horovod's last release predates TensorFlow 2.16+, so a plain `pip install horovod` fails or silently
# builds without TensorFlow. This script:
#   * builds without pip's build isolation (Horovod must see the installed TensorFlow),
#   * sets HOROVOD_WITH_TENSORFLOW=1 so a broken TensorFlow build fails loudly instead of being skipped,
#   * puts the headers that newer TensorFlow wheels moved (highwayhash, farmhash, XLA's builder) on the
#     compiler's include path,
#   * caches the built wheel under ~/.cache/kfast/wheels keyed by TensorFlow version and build flags, so a
#     second setup takes seconds and never reuses a wheel built for another TensorFlow,
#   * checks the result: `horovodrun --check-build` and a real two-process allreduce on Gloo.
set -euo pipefail

HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
PYTHON=${PYTHON:-python}
MODE=cpu
if [[ "${1:-}" == "--gpu" ]]; then MODE=gpu; fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

tf_version=$("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) || {
  echo "install_horovod.sh: TensorFlow is not importable with $PYTHON; install tensorflow-cpu (or tensorflow) first." >&2
  exit 1
}
tf_include=$("$PYTHON" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)

export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
if [[ "$MODE" == gpu ]]; then
  export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL}
  flags="gloo-nccl"
else
  export HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
  flags="gloo-cpu"
fi

py_tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
cache=${KFAST_WHEEL_CACHE:-$HOME/.cache/kfast/wheels}/horovod-$HOROVOD_VERSION-tf$tf_version-$flags-$py_tag
installed=$("$PYTHON" -c 'import horovod; print(horovod.__version__)' 2>/dev/null || true)

check_build() {
  # A horovod whose TensorFlow op library fails to load is worse than none: prove it works.
  "$PYTHON" - <<'PY'
import horovod.tensorflow as hvd
assert hvd.gloo_built(), "Horovod was built without Gloo"
PY
  "$PYTHON" "$here/check_allreduce.py" --launch
}

if [[ "$installed" == "$HOROVOD_VERSION" && -f "$cache/.installed-ok" ]] \
   && "$PYTHON" -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  echo "Horovod $HOROVOD_VERSION already built for TensorFlow $tf_version ($flags)."
  exit 0
fi

if ! ls "$cache"/horovod-*.whl >/dev/null 2>&1; then
  echo "Building Horovod $HOROVOD_VERSION for TensorFlow $tf_version ($flags); this takes a few minutes..."
  for tool in cmake g++; do
    command -v "$tool" >/dev/null || { echo "install_horovod.sh: '$tool' is required to build Horovod (apt-get install cmake g++)." >&2; exit 1; }
  done
  shim=$(mktemp -d)
  trap 'rm -rf "$shim"' EXIT
  # TensorFlow >= 2.16 moved XLA's builder header; Horovod 0.28.1 still includes the old path.
  mkdir -p "$shim/tensorflow/compiler/xla/client"
  echo '#include "xla/hlo/builder/xla_builder.h"' > "$shim/tensorflow/compiler/xla/client/xla_builder.h"
  export CPLUS_INCLUDE_PATH="$shim:$tf_include/external/highwayhash:$tf_include/external/farmhash_archive/src${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
  export MAKEFLAGS="-j$(nproc)"
  mkdir -p "$cache"
  "$PYTHON" -m pip wheel --no-build-isolation --no-cache-dir --no-deps -w "$cache" "horovod==$HOROVOD_VERSION"
fi

"$PYTHON" -m pip install --no-cache-dir --force-reinstall --no-deps "$cache"/horovod-*.whl
"$PYTHON" -m pip install "cloudpickle" "psutil" "pyyaml" "packaging"
check_build
touch "$cache/.installed-ok"
echo "Horovod $HOROVOD_VERSION installed for TensorFlow $tf_version ($flags)."
