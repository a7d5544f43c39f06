#!/usr/bin/env bash
# Build and install Horovod 0.28.1 against the TensorFlow already in the active Python environment.
#
# Usage: scripts/install_horovod.sh [--gpu [--cuda 13|12]]
#
# Horovod's last release predates TensorFlow 2.16+, so a plain `pip install horovod` fails or silently
# builds without TensorFlow. This script:
#   * builds without pip's build isolation (Horovod must see the installed TensorFlow),
#   * sets HOROVOD_WITH_TENSORFLOW=1 so a broken TensorFlow build fails loudly instead of being skipped,
#   * puts the headers that newer TensorFlow wheels moved (highwayhash, farmhash, XLA's builder) on the
#     compiler's include path,
#   * caches the built wheel under ~/.cache/kfast/wheels keyed by TensorFlow version and build flags, so a
#     second setup takes seconds and never reuses a wheel built for another TensorFlow,
#   * checks the result: the library loads, and a real two-process allreduce on Gloo is exact.
#
# --gpu adds CUDA and NCCL to Gloo. Building and checking it needs no GPU (`make gpu-build-check` does it
# on CPU-only machines):
#   * CUDA toolkit: $CUDA_HOME, else the toolkit whose nvcc is on PATH; with neither, or when --cuda asks
#     for another major version, CUDA 13.0 from PyPI's nvidia-* wheels (about 105 MB, unpacked once into
#     ~/.cache/kfast/cuda13-toolkit). KFAST_CUDA_TOOLKIT=pypi skips the search for an installed one.
#   * NCCL: $HOROVOD_NCCL_HOME if set, else pip's nvidia-nccl-cu12 (the installed one, or $NCCL_VERSION,
#     the version tensorflow[and-cuda] 2.21 resolves to), linked dynamically; the library finds it at run
#     time through an rpath into site-packages.
#   * Kernels for the compute capabilities in HOROVOD_BUILD_CUDA_CC_LIST (default 80,90: A100, H100/H200),
#     plus PTX for the highest, which newer GPUs compile at load time.
#   * The wheel cache key adds the CUDA and NCCL versions and the compute capabilities.
#   * Two source fixes for TensorFlow 2.21, in a header that only xla_mpi_ops.cc includes: the
#     xla::StatusOr alias TensorFlow removed, and a definition of stream_executor::gpu::AsGpuStreamValue,
#     which mpi_ops.cc declares and TensorFlow no longer exports (without it the build links, then the
#     library fails to load, so the closing check imports it rather than trusting the compiler).
#   * The CUDA runtime is linked statically, so a CUDA 13 build needs an R580 or newer driver. For older
#     drivers, build with --cuda 12 and a CUDA 12 toolkit in CUDA_HOME. PyPI ships no CUDA 12 nvcc; one
#     route that worked without installing system packages: unpack Debian 13's nvidia-cuda-toolkit
#     packages (CUDA 12.4) with `dpkg -x`, add the CUDA headers from the nvidia-*-cu12 wheels and
#     libcudart_static.a from nvidia-cuda-runtime-cu12==12.9.79, and point CUDA_HOME at the result.
set -euo pipefail

HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
NCCL_VERSION=${NCCL_VERSION:-2.32.3}
PYTHON=${PYTHON:-python}
# PyPI's CUDA 13.0 toolkit: the compiler, NVVM, headers and the static runtime, nothing else.
PYPI_CUDA_VERSION=13.0
PYPI_CUDA_PINS="nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85"

usage="usage: scripts/install_horovod.sh [--gpu [--cuda 13|12]]"
MODE=cpu
cuda_major=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --gpu) MODE=gpu ;;
    --cuda)
      [[ $# -ge 2 ]] || { echo "install_horovod.sh: --cuda needs a value, 13 or 12; $usage" >&2; exit 2; }
      cuda_major=$2; shift ;;
    --cuda=*) cuda_major=${1#--cuda=} ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "install_horovod.sh: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
  shift
done
if [[ -n "$cuda_major" && "$cuda_major" != 12 && "$cuda_major" != 13 ]]; then
  echo "install_horovod.sh: got --cuda '$cuda_major'; expected 13 (the default) or 12." >&2; exit 2
fi
if [[ -n "$cuda_major" && "$MODE" != gpu ]]; then
  echo "install_horovod.sh: --cuda only applies to a GPU build; add --gpu." >&2; exit 2
fi
toolkit_choice=${KFAST_CUDA_TOOLKIT:-auto}
if [[ "$toolkit_choice" != auto && "$toolkit_choice" != pypi ]]; then
  echo "install_horovod.sh: got KFAST_CUDA_TOOLKIT='$toolkit_choice'; expected 'auto' (an installed CUDA, else PyPI's) or 'pypi'." >&2
  exit 2
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kfast_cache=$HOME/.cache/kfast

tf_version=$("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) || {
  echo "install_horovod.sh: TensorFlow is not importable with $PYTHON; install tensorflow-cpu (or tensorflow) first." >&2
  exit 1
}
tf_include=$("$PYTHON" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)

nvcc_release() {  # "13.0" from `nvcc --version`
  "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p'
}

find_installed_cuda() {
  # nvcc on PATH is often a wrapper or a link (/usr/local/bin/nvcc); nvcc itself knows where it lives.
  if [[ -n "${HOROVOD_CUDA_HOME:-${CUDA_HOME:-}}" ]]; then
    echo "${HOROVOD_CUDA_HOME:-$CUDA_HOME}"
  elif command -v nvcc >/dev/null; then
    local bin
    bin=$(nvcc --dryrun -E -x cu /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -n 1)
    [[ -n "$bin" ]] || bin=$(dirname "$(readlink -f "$(command -v nvcc)")")
    (cd "$bin/.." && pwd)
  else
    return 1
  fi
}

resolve_cuda() {
  # Sets cuda_home and cuda_version; cuda_home stays empty when PyPI's toolkit is to be fetched at build time.
  cuda_home= cuda_version=
  local home found_by="CUDA_HOME"
  [[ -n "${HOROVOD_CUDA_HOME:-${CUDA_HOME:-}}" ]] || found_by="the nvcc on PATH"
  if [[ "$toolkit_choice" == auto ]] && home=$(find_installed_cuda); then
    if [[ ! -x "$home/bin/nvcc" || ! -f "$home/include/cuda_runtime.h" ]]; then
      echo "install_horovod.sh: $found_by points to $home, which has no bin/nvcc or include/cuda_runtime.h; set CUDA_HOME to a full CUDA toolkit, or KFAST_CUDA_TOOLKIT=pypi to use PyPI's CUDA $PYPI_CUDA_VERSION." >&2
      exit 1
    fi
    local version
    version=$(nvcc_release "$home/bin/nvcc")
    if [[ -z "$cuda_major" || "${version%%.*}" == "$cuda_major" ]]; then
      cuda_home=$home cuda_version=$version
      echo "Using CUDA $version from $home ($found_by)."
      return
    fi
    if [[ "$found_by" == CUDA_HOME ]]; then
      echo "install_horovod.sh: CUDA_HOME is CUDA $version ($home) but --cuda $cuda_major was asked for; unset CUDA_HOME or drop --cuda." >&2
      exit 1
    fi
    [[ "$cuda_major" == 12 ]] || echo "The nvcc on PATH is CUDA $version; building for --cuda $cuda_major with PyPI's toolkit instead."
  fi
  if [[ "${cuda_major:-13}" == 12 ]]; then
    echo "install_horovod.sh: --cuda 12 needs a CUDA 12 toolkit (in CUDA_HOME, or its nvcc on PATH) and found none; install one and set CUDA_HOME to it. PyPI ships no CUDA 12 nvcc; this script's header describes a route without root." >&2
    exit 1
  fi
  cuda_version=$PYPI_CUDA_VERSION
  echo "Using PyPI's CUDA $cuda_version (fetched into $kfast_cache/cuda13-toolkit if a build needs it)."
}

fetch_pypi_cuda() {
  local dir=$kfast_cache/cuda13-toolkit
  if [[ "$(cat "$dir/.pins" 2>/dev/null)" != "$PYPI_CUDA_PINS" ]]; then
    echo "Downloading CUDA $PYPI_CUDA_VERSION's compiler from PyPI (about 105 MB) into $dir ..."
    rm -rf "$dir" "$dir.partial"
    # shellcheck disable=SC2086  # the pins are separate words
    "$PYTHON" -m pip install -q --no-deps --no-cache-dir --target "$dir.partial" $PYPI_CUDA_PINS
    # The wheels ship lib/ and only the versioned libcudart; CMake's CUDA detection looks for lib64/ and
    # the unversioned name.
    ln -s lib "$dir.partial/nvidia/cu13/lib64"
    ln -s libcudart.so.13 "$dir.partial/nvidia/cu13/lib/libcudart.so"
    echo "$PYPI_CUDA_PINS" > "$dir.partial/.pins"
    mv "$dir.partial" "$dir"
  fi
  cuda_home=$dir/nvidia/cu13
}

resolve_nccl() {
  # Sets nccl_version: from HOROVOD_NCCL_HOME's header, else pip's nvidia-nccl-cu12, installed or to install.
  if [[ -n "${HOROVOD_NCCL_HOME:-}" ]]; then
    if [[ ! -f "$HOROVOD_NCCL_HOME/include/nccl.h" ]]; then
      echo "install_horovod.sh: HOROVOD_NCCL_HOME=$HOROVOD_NCCL_HOME has no include/nccl.h; point it at an NCCL install, or unset it to use pip's nvidia-nccl-cu12." >&2
      exit 1
    fi
    nccl_version=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $3} END {print v}' \
      "$HOROVOD_NCCL_HOME/include/nccl.h")
  else
    nccl_version=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("nvidia-nccl-cu12"))' 2>/dev/null \
      || echo "$NCCL_VERSION")
  fi
}

pip_nccl_dir() {
  "$PYTHON" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])'
}

export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
if [[ "$MODE" == gpu ]]; then
  resolve_cuda
  resolve_nccl
  cc_list=${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}
  export HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO HOROVOD_GPU=CUDA HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_NCCL_LINK=SHARED HOROVOD_BUILD_CUDA_CC_LIST=$cc_list
  flags="gloo-nccl$nccl_version-cuda$cuda_version-cc${cc_list//,/-}"
  if [[ "${cuda_version%%.*}" -ge 13 ]] && command -v nvidia-smi >/dev/null; then
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
    if [[ "$driver" =~ ^[0-9]+\. && "${driver%%.*}" -lt 580 ]]; then
      echo "install_horovod.sh: warning: driver $driver is older than R580, which CUDA $cuda_version needs; this build will compile but its GPU operations will fail on this host. Use --cuda 12 with a CUDA 12 toolkit (see the script header)." >&2
    fi
  fi
else
  export HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
  flags="gloo-cpu"
fi

py_tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
cache=${KFAST_WHEEL_CACHE:-$kfast_cache/wheels}/horovod-$HOROVOD_VERSION-tf$tf_version-$flags-$py_tag
installed=$("$PYTHON" -c 'import horovod; print(horovod.__version__)' 2>/dev/null || true)

loads() {
  # A CPU build in this environment must not pass for the GPU build the cache holds.
  if [[ "$MODE" == gpu ]]; then
    "$PYTHON" -c 'import horovod.tensorflow as h; import sys; sys.exit(not (h.cuda_built() and h.nccl_built()))'
  else
    "$PYTHON" -c 'import horovod.tensorflow'
  fi
}

check_build() {
  # A horovod whose TensorFlow op library fails to load is worse than none: prove it works.
  "$PYTHON" - "$MODE" <<'PY'
import sys
import horovod.tensorflow as hvd
assert hvd.gloo_built(), "Horovod was built without Gloo"
if sys.argv[1] == "gpu":
    assert hvd.cuda_built(), "Horovod was built without CUDA"
    assert hvd.nccl_built(), "Horovod was built without NCCL"
    print(f"Horovod loads with CUDA and NCCL built in (nccl_built() = {hvd.nccl_built()}).")
PY
  "$PYTHON" "$here/check_allreduce.py" --launch
}

if [[ "$installed" == "$HOROVOD_VERSION" && -f "$cache/.installed-ok" ]] && loads >/dev/null 2>&1; then
  echo "Horovod $HOROVOD_VERSION already built for TensorFlow $tf_version ($flags)."
  exit 0
fi

if [[ "$MODE" == gpu && -z "${HOROVOD_NCCL_HOME:-}" ]]; then
  # The built library loads NCCL from this package at run time, so it is installed even when the wheel is cached.
  "$PYTHON" -m pip install -q "nvidia-nccl-cu12==$nccl_version"
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
  if [[ "$MODE" == gpu ]]; then
    [[ -n "$cuda_home" ]] || fetch_pypi_cuda
    export HOROVOD_CUDA_HOME=$cuda_home
    if [[ -n "${HOROVOD_NCCL_HOME:-}" ]]; then
      export HOROVOD_NCCL_HOME
    else
      # Horovod's CMake wants NCCL_HOME/include and an unversioned lib/libnccl.so; the wheel has neither.
      # CMake also writes NCCL_HOME/lib into the library's RUNPATH, so it lives in the user's cache, not
      # in /tmp, and holds no libnccl.so.2 for the loader to find there.
      nccl_dir=$(pip_nccl_dir)
      nccl_home=$kfast_cache/nccl-home
      rm -rf "$nccl_home"
      mkdir -p "$nccl_home/lib"
      ln -s "$nccl_dir/include" "$nccl_home/include"
      ln -s "$nccl_dir/lib/libnccl.so.2" "$nccl_home/lib/libnccl.so"
      export HOROVOD_NCCL_HOME=$nccl_home
      # A literal $ORIGIN: horovod/tensorflow/mpi_lib*.so finds site-packages/nvidia/nccl/lib from its own place.
      export LDFLAGS="-Wl,-rpath,\$ORIGIN/../../nvidia/nccl/lib${LDFLAGS:+ $LDFLAGS}"
    fi
    # This header is included by xla_mpi_ops.cc alone, so the definition below exists exactly once.
    cat > "$shim/tensorflow/compiler/xla/client/xla_builder.h" <<'EOF'
#pragma once
#include <cuda_runtime.h>
#include "absl/status/statusor.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/stream_executor/stream.h"
// TensorFlow 2.21 dropped this alias; xla_mpi_ops.cc still uses it.
namespace xla {
template <typename T>
using StatusOr = absl::StatusOr<T>;
}  // namespace xla
// mpi_ops.cc declares this (not inline) and TensorFlow 2.21 no longer exports it.
namespace stream_executor {
namespace gpu {
cudaStream_t AsGpuStreamValue(Stream* stream) {
  return static_cast<cudaStream_t>(stream->platform_specific_handle().stream);
}
}  // namespace gpu
}  // namespace stream_executor
EOF
  else
    echo '#include "xla/hlo/builder/xla_builder.h"' > "$shim/tensorflow/compiler/xla/client/xla_builder.h"
  fi
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
