#!/usr/bin/env bash
# The GPU check's venv: PYTHON's packages (JAX or PyTorch) visible, the carried wheels installed over them.
#
# Usage: scripts/gpu_check_venv.sh PYTHON VENV
#
# `python -m venv --system-site-packages` sees the base interpreter's packages only. Where PYTHON is itself a
# venv, as on GPU images that keep JAX and PyTorch in one (/opt/torch/.venv on the H200 machines here), its
# packages would be missing and Keras would fall back to TensorFlow; they are added by a .pth file instead.
set -euo pipefail
python=${1:?usage: gpu_check_venv.sh PYTHON VENV}
venv=${2:?usage: gpu_check_venv.sh PYTHON VENV}
"$python" -m venv --system-site-packages "$venv"
purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$python" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
  > "$purelib/zz_gpu_check_parent.pth"
